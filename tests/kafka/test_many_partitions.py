"""A topic of more partitions than fit the open-topic bound's old default (100): each
partition is a luxun topic, and a Fetch over all of them used to close and reopen them
on every request (issue 30, item 3). Measured through the broker's counters
(``luxun_topic_opens_total``, ``luxun_topic_lru_closes_total``), never by time: a
steady consumer reopens nothing, under the usual descriptor limit and under a 1,024
one; running out of descriptors anyway fails the partitions, not the connection."""

from __future__ import annotations

import datetime
import importlib
import os
import re
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema

from luxun.topics import AUTO_MAX_OPEN_TOPICS, open_topics_limit
from tests._broker import BrokerProcess

from ._kafka import RawClient, record_batch, request

pytestmark = pytest.mark.timeout(180)

TOPIC = "many"
PARTITIONS = 600
RECORDS = 3
KAFKA_STORAGE_ERROR = 56
_METRIC = re.compile(r"^(luxun_[a-z_]+)(\{[^}]*\})? (\S+)$", re.M)


def nofile(n: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return apply


def start(tmp_path: Path, *lines: str, fds: int, name: str = "broker") -> BrokerProcess:
    conf = tmp_path / f"{name}.properties"
    conf.write_text("\n".join(["log.backfile.page.size=65536", *lines]) + "\n")
    return BrokerProcess(
        tmp_path / "data",
        tmp_path / f"{name}.log",
        "--config",
        str(conf),
        kafka=True,
        metrics=True,
        preexec_fn=nofile(fds),
    ).start()


@pytest.fixture
def stopped() -> Iterator[list[BrokerProcess]]:
    """Brokers the test started, stopped at its end."""
    brokers: list[BrokerProcess] = []
    yield brokers
    for broker in brokers:
        if broker.proc is not None:
            broker.stop()


def metrics(broker: BrokerProcess) -> dict[str, float]:
    """The broker's unlabelled metrics, plus its Fetch requests as ``fetches``."""
    text = broker.metrics_page()
    out = {"fetches": 0.0}
    for name, labels, value in _METRIC.findall(text):
        if not labels:
            out[name] = float(value)
        elif name == "luxun_kafka_requests_total" and 'api_key="1"' in labels:
            out["fetches"] += float(value)
    return out


def fill(broker: BrokerProcess) -> None:
    """CreateTopics of TOPIC with PARTITIONS partitions, then one Produce of RECORDS
    records to each partition."""
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=60_000)
    try:
        admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)])
    finally:
        admin.close()
    schema = load_request_schema(0, 7)
    module = importlib.import_module(schema.__module__)
    partitions = tuple(
        module.PartitionProduceData(index=p, records=record_batch([b"p%d-r%d" % (p, i) for i in range(RECORDS)]))
        for p in range(PARTITIONS)
    )
    produce = schema(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=60),
        topic_data=(module.TopicProduceData(name=TOPIC, partition_data=partitions),),
    )
    with RawClient(broker.kafka_port, timeout_s=60) as raw:
        (topic,) = raw.call(produce).responses
    assert [p.error_code for p in topic.partition_responses] == [0] * PARTITIONS


def expected() -> set[bytes]:
    return {b"p%d-r%d" % (p, i) for p in range(PARTITIONS) for i in range(RECORDS)}


def read_all(poll: Callable[[], list[bytes]], timeout_s: float = 60.0) -> set[bytes]:
    """Poll until every record is in (at most ``timeout_s``); the records polled."""
    got: set[bytes] = set()
    deadline = time.monotonic() + timeout_s
    while got != expected() and time.monotonic() < deadline:
        got.update(poll())
    return got


def steady(poll: Callable[[], list[bytes]], broker: BrokerProcess, fetches: int = 5) -> tuple[dict[str, float], int]:
    """Poll a caught-up consumer until the broker answered ``fetches`` more Fetch requests
    (at most 30 s); the metrics before, and the records polled meanwhile."""
    before = metrics(broker)
    polled = 0
    deadline = time.monotonic() + 30
    while metrics(broker)["fetches"] < before["fetches"] + fetches and time.monotonic() < deadline:
        polled += len(poll())
    return before, polled


def kafka_python_reader(broker: BrokerProcess) -> tuple[Any, Callable[[], list[bytes]]]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=200)
    consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    consumer.seek_to_beginning()

    def poll() -> list[bytes]:
        return [r.value for rs in consumer.poll(timeout_ms=200).values() for r in rs]

    return consumer, poll


def confluent_reader(broker: BrokerProcess) -> tuple[Any, Callable[[], list[bytes]]]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "many",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 200,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])

    def poll() -> list[bytes]:
        got = []
        for m in consumer.consume(1000, timeout=0.2):
            assert m.error() is None, m.error()
            got.append(m.value())
        return got

    return consumer, poll


def test_the_default_bound_is_sized_from_the_descriptor_and_mapping_limits() -> None:
    assert open_topics_limit(1024, 65530) == (1024 - 256) // 13 == 59
    assert open_topics_limit(20_000, 65530) == AUTO_MAX_OPEN_TOPICS == 1000
    assert open_topics_limit(1 << 20, 16_384) == (16_384 - 8192) // 13 == 630  # vm.max_map_count binds
    assert open_topics_limit(100, 65530) == 1
    assert open_topics_limit(-1, 65530) == AUTO_MAX_OPEN_TOPICS  # RLIM_INFINITY


def test_a_steady_consumer_of_600_partitions_reopens_none(tmp_path: Path, stopped: list[BrokerProcess]) -> None:
    """kafka-python, then confluent-kafka, assign all 600 partitions and read every record;
    then, caught up, their Fetches (each waits on all 600 partitions) close and reopen
    nothing. Before, max.open.topics=100 closed and reopened about 600 partitions a Fetch."""
    fds = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 16384)
    if fds < 256 + 13 * PARTITIONS:
        pytest.skip(f"the hard descriptor limit {fds} holds fewer than {PARTITIONS} topics at their worst")
    broker = start(tmp_path, fds=fds)
    stopped.append(broker)
    fill(broker)
    for reader in (kafka_python_reader, confluent_reader):
        consumer, poll = reader(broker)
        try:
            assert read_all(poll) == expected(), reader.__name__
            before, polled = steady(poll, broker)
            after = metrics(broker)
        finally:
            consumer.close()
        assert polled == 0
        assert after["fetches"] >= before["fetches"] + 5, "the consumer stopped fetching"
        assert after["luxun_topic_opens_total"] == before["luxun_topic_opens_total"], (reader.__name__, before, after)
        assert after["luxun_topic_lru_closes_total"] == 0, after
        assert after["luxun_topics_open"] == PARTITIONS
        assert after["luxun_topics_open_limit"] >= PARTITIONS
    # Each partition was opened once, when CreateTopics made it.
    assert metrics(broker)["luxun_topic_opens_total"] == PARTITIONS
    assert "Traceback" not in broker.log()


def test_600_partitions_under_a_1024_descriptor_limit(tmp_path: Path, stopped: list[BrokerProcess]) -> None:
    """Under a 1,024 descriptor limit the bound is 59 open topics: a consumer of 600
    partitions still gets every record (its first reads reopen partitions: they hold
    data), the broker stays under the limit with no "Too many open files", and once the
    consumer is caught up its Fetches reopen nothing (a partition closed to make room
    answers a read at its end from the offsets kept when it was closed). Before, a
    waiting Fetch held every partition open: the broker ran out of descriptors and
    closed the consumer's connection, and every Fetch reopened the partitions."""
    broker = start(tmp_path, fds=1024)
    stopped.append(broker)
    fill(broker)
    consumer, poll = kafka_python_reader(broker)
    most_fds = 0
    try:

        def sampled() -> list[bytes]:
            nonlocal most_fds
            most_fds = max(most_fds, len(os.listdir(f"/proc/{broker.proc.pid}/fd")))  # type: ignore[union-attr]
            return poll()

        assert read_all(sampled) == expected()
        before, polled = steady(sampled, broker)
        after = metrics(broker)
    finally:
        consumer.close()
    assert polled == 0
    assert after["fetches"] >= before["fetches"] + 5
    assert after["luxun_topic_opens_total"] == before["luxun_topic_opens_total"], (before, after)
    log = broker.log()
    assert "Too many open files" not in log
    assert "Traceback" not in log
    assert after["luxun_topics_open_limit"] == 59
    assert after["luxun_topics_open"] <= 59
    assert most_fds < 1024
    print(f"most descriptors open in the broker: {most_fds} (limit 1024)")


def test_out_of_descriptors_a_fetch_answers_a_storage_error_per_partition(
    tmp_path: Path, stopped: list[BrokerProcess]
) -> None:
    """max.open.topics set far above what 200 descriptors hold: one Fetch of all 600
    partitions runs out of them. The partitions it could open are answered with their
    records, the others with KAFKA_STORAGE_ERROR (retriable), the error is logged
    (rate-limited), and the connection and the broker carry on. Before, the Fetch's
    OSError closed the connection without an answer."""
    filler = start(tmp_path, fds=4096, name="filler")
    stopped.append(filler)
    fill(filler)
    assert filler.stop() == 0
    broker = start(tmp_path, "max.open.topics=100000", fds=200)
    stopped.append(broker)
    schema = load_request_schema(1, 4)
    module = importlib.import_module(schema.__module__)
    fetch = schema(
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=0),
        min_bytes=0,
        max_bytes=50 << 20,
        isolation_level=0,
        topics=(
            module.FetchTopic(
                topic=TOPIC,
                partitions=tuple(
                    module.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 20)
                    for p in range(PARTITIONS)
                ),
            ),
        ),
    )
    with RawClient(broker.kafka_port, timeout_s=60) as raw:
        (topic,) = raw.call(fetch).responses
        codes = [p.error_code for p in topic.partitions]
        assert set(codes) == {0, KAFKA_STORAGE_ERROR}, sorted(set(codes))
        served = [p for p in topic.partitions if p.error_code == 0]
        assert all(p.records and p.high_watermark == RECORDS for p in served)
        assert raw.call(request(18, 0)).error_code == 0  # ApiVersions: the connection is alive
    log = broker.log()
    assert "Too many open files" in log
    assert log.count("Too many open files") < 10  # rate-limited, not one line per partition
    assert "Traceback" not in log
    assert broker.proc is not None and broker.proc.poll() is None
