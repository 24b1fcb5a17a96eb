"""Helpers of the transaction tests: readers by isolation level, a broker with short
transaction timers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._broker import BrokerProcess


def txn_broker(tmp_path: Path, *extra: str) -> BrokerProcess:
    """A broker that looks for timed-out transactions every 200 ms (Kafka: 10 s)."""
    config = tmp_path / "server.properties"
    config.write_text("transaction.abort.timed.out.transaction.cleanup.interval.ms=200\n")
    return BrokerProcess(tmp_path / "data", tmp_path / "broker.log", "--config", str(config), *extra, kafka=True)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A :func:`txn_broker`, started, stopped after the test (import it into a test module)."""
    b = txn_broker(tmp_path).start()
    try:
        yield b
    finally:
        b.stop()


def read_all(
    bootstrap: str, topic: str, *, committed: bool, partitions: int = 1, timeout_s: float = 20.0
) -> list[tuple[int, int, bytes | None]]:
    """Every record of ``topic`` to its end as a reader of that isolation level sees it:
    (partition, offset, value), in order per partition. The end is the partition EOF the
    client reports (for read_committed: the last stable offset)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "txn-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[tuple[int, int, bytes | None]] = []
        ended: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(ended) < partitions:
            assert time.monotonic() < deadline, f"no EOF on {topic} within {timeout_s}s; got {got}"
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                ended.add(m.partition())
                continue
            ended.discard(m.partition())
            got.append((m.partition(), m.offset(), m.value()))
        return got
    finally:
        consumer.close()


def values(records: list[tuple[int, int, bytes | None]]) -> list[bytes | None]:
    return [v for _p, _o, v in records]


def transactional_producer(bootstrap: str, tid: str, **config: Any) -> Any:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5, **config})
    producer.init_transactions(20)
    return producer
