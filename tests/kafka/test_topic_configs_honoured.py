"""Topic configs honoured on produce (issue 32): ``max.message.bytes`` refuses a larger
batch with MESSAGE_TOO_LARGE and stores nothing of it; ``compression.type`` re-encodes a
batch of another codec before it is stored. Both set at creation or by the alter APIs,
in force at the next produce, and kept across a restart."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from tests._broker import BrokerProcess

from ._kafka import RawClient, fetch_request, produce_partition_response, produce_request, record_batch

pytestmark = pytest.mark.timeout(120)

MESSAGE_TOO_LARGE = 10
INVALID_CONFIG = 40
TOPIC_CONFIG = 1


def _admin(broker: BrokerProcess) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": broker.bootstrap})


def _create(admin: Any, topic: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic(topic, 1, 1, config=configs)], request_timeout=10)[topic].result(10)


def _describe(admin: Any, topic: str) -> dict[str, tuple[str, int]]:
    from confluent_kafka.admin import ConfigResource

    (future,) = admin.describe_configs([ConfigResource("topic", topic)], request_timeout=10).values()
    return {k: (e.value, e.source) for k, e in future.result(10).items()}


def _incremental(admin: Any, topic: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
    (future,) = admin.incremental_alter_configs(
        [ConfigResource("topic", topic, incremental_configs=entries)], request_timeout=10
    ).values()
    future.result(10)


def _produce(raw: RawClient, topic: str, batch: bytes) -> Any:
    return produce_partition_response(raw.call(produce_request(topic, 0, batch, version=8)))


def _stored(raw: RawClient, topic: str) -> list[tuple[int, int, int]]:
    """(base offset, record count, attributes) of each batch stored in ``topic``-0."""
    from luxun import records as rec

    (answer,) = raw.call(fetch_request([(topic, 0)], 1 << 24, partition_max_bytes=1 << 24)).responses
    (part,) = answer.partitions
    assert part.error_code == 0
    return [(b.base_offset, b.record_count, b.attributes) for b in rec.split_batches(part.records or b"")]


def _noise(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)  # incompressible: the batch is about this big


def test_max_message_bytes_per_topic(tmp_path: Path) -> None:
    """max.message.bytes=10000: a 20 KB batch is MESSAGE_TOO_LARGE and stores nothing, a
    5 KB one is stored; raised by IncrementalAlterConfigs, the 20 KB one goes in at the
    next produce, and the setting survives a restart; a value above what one stored item
    holds is INVALID_CONFIG naming the limit."""
    from confluent_kafka import KafkaException

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = _admin(broker)
        _create(admin, "small", {"max.message.bytes": "10000"})
        assert _describe(admin, "small")["max.message.bytes"] == ("10000", TOPIC_CONFIG)
        big, fits = record_batch([_noise(20_000, 1)]), record_batch([_noise(5_000, 2)])
        with RawClient(broker.kafka_port) as raw:
            refused = _produce(raw, "small", big)
            assert refused.error_code == MESSAGE_TOO_LARGE
            assert f"record batch of {len(big)} bytes is larger than max.message.bytes=10000" in refused.error_message
            assert _produce(raw, "small", fits).error_code == 0
            assert _stored(raw, "small") == [(0, 1, 0)]
            _incremental(admin, "small", {"max.message.bytes": "30000"})
            assert _produce(raw, "small", big).error_code == 0
            assert _stored(raw, "small") == [(0, 1, 0), (1, 1, 0)]
        with pytest.raises(KafkaException) as info:
            _incremental(admin, "small", {"max.message.bytes": "200000000"})
        error = info.value.args[0]
        assert error.name() == "INVALID_CONFIG"
        assert "at most the data page size (log.backfile.page.size=134217728)" in error.str()
        broker.stop()
        broker.start()
        admin = _admin(broker)
        assert _describe(admin, "small")["max.message.bytes"] == ("30000", TOPIC_CONFIG)
        with RawClient(broker.kafka_port) as raw:
            refused = _produce(raw, "small", record_batch([_noise(40_000, 3)]))
            assert refused.error_code == MESSAGE_TOO_LARGE
            assert _stored(raw, "small") == [(0, 1, 0), (1, 1, 0)]
    finally:
        broker.stop()
