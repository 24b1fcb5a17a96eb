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

from ._kafka import RawClient, fetch_request, produce_partition_response, produce_request, read_partition, record_batch

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning"),  # it is what we test
]

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


def _batch(values: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]], ts: int, codec: int, **ids: int) -> bytes:
    """A record batch (kafka-python's encoder) of (key, value, headers), timestamps ts, ts+1, ..."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        2,
        codec,
        False,
        ids.get("producer_id", -1),
        ids.get("producer_epoch", -1),
        ids.get("base_sequence", -1),
        1 << 24,
    )
    for i, (key, value, headers) in enumerate(values):
        builder.append(i, timestamp=ts + i, key=key, value=value, headers=headers)
    return bytes(builder.build())


def test_compression_type_reencodes_what_is_stored(tmp_path: Path) -> None:
    """compression.type=zstd: gzip and uncompressed batches are stored as zstd (the
    stored batch's attributes, read back raw), and confluent-kafka, kafka-python and a
    Thrift consumer read the same keys, values, headers and timestamps; an idempotent
    retry is still answered with its first offset and not stored again. Changed to
    uncompressed by AlterConfigs, the next batch is stored uncompressed, also after a
    restart; DescribeConfigs shows it as the topic's."""
    from confluent_kafka.admin import ConfigResource
    from kafka import KafkaConsumer, TopicPartition

    from clients.pack import decode_pack
    from idl import luxun_thrift as T

    ts = 1_700_000_000_000
    first = [(b"k%d" % i, b"gzip value %d " % i * 20, [("h", b"%d" % i)]) for i in range(30)]
    second = [(None, b"plain %d" % i, []) for i in range(5)]
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = _admin(broker)
        _create(admin, "z", {"compression.type": "zstd"})
        assert _describe(admin, "z")["compression.type"] == ("zstd", TOPIC_CONFIG)
        ids = {"producer_id": 4242, "producer_epoch": 0}
        with RawClient(broker.kafka_port) as raw:
            assert _produce(raw, "z", _batch(first, ts, 1, **ids, base_sequence=0)).base_offset == 0
            retry = _batch(first, ts, 1, **ids, base_sequence=0)
            assert _produce(raw, "z", retry).base_offset == 0  # deduplicated: same offset
            assert _produce(raw, "z", _batch(second, ts + 100, 0, **ids, base_sequence=30)).base_offset == 30
            assert [(o, n, a & 7) for o, n, a in _stored(raw, "z")] == [(0, 30, 4), (30, 5, 4)]
        want = [(k, v, h, ts + i) for i, (k, v, h) in enumerate(first)]
        want += [(k, v, h, ts + 100 + i) for i, (k, v, h) in enumerate(second)]
        got = [
            (m.key(), m.value(), m.headers() or [], m.timestamp()[1])
            for m in read_partition(broker.bootstrap, "z", 0, 35)
        ]
        assert got == want
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, consumer_timeout_ms=3000, enable_auto_commit=False)
        consumer.assign([TopicPartition("z", 0)])
        consumer.seek(TopicPartition("z", 0), 0)
        got = [(m.key, m.value, list(m.headers), m.timestamp) for m in consumer]
        consumer.close()
        assert got == want
        thrift = broker.client()
        items = thrift.consume(T.ConsumeRequest(topic="z", startIndex=0, maxFetchSize=1 << 20)).itemList
        thrift.close()
        assert [decode_pack(item) for item in items] == [[v for _, v, _ in first], [v for _, v, _ in second]]

        (future,) = admin.alter_configs(
            [ConfigResource("topic", "z", set_config={"compression.type": "uncompressed"})], request_timeout=10
        ).values()
        future.result(10)
        with RawClient(broker.kafka_port) as raw:
            assert _produce(raw, "z", _batch(second, ts + 200, 3)).base_offset == 35  # lz4 in
            assert [a & 7 for _, _, a in _stored(raw, "z")] == [4, 4, 0]
        broker.stop()
        broker.start()
        admin = _admin(broker)
        assert _describe(admin, "z")["compression.type"] == ("uncompressed", TOPIC_CONFIG)
        with RawClient(broker.kafka_port) as raw:
            assert _produce(raw, "z", _batch(second, ts + 300, 2)).base_offset == 40  # snappy in
            assert [a & 7 for _, _, a in _stored(raw, "z")] == [4, 4, 0, 0]
        got = [(m.value(), m.timestamp()[1]) for m in read_partition(broker.bootstrap, "z", 0, 45)[35:]]
        assert got == [(v, ts + 200 + i) for i, (_, v, _) in enumerate(second)] + [
            (v, ts + 300 + i) for i, (_, v, _) in enumerate(second)
        ]
    finally:
        broker.stop()


def test_producer_clients_on_a_recompressing_topic(tmp_path: Path) -> None:
    """confluent-kafka (idempotent, lz4) and kafka-python (gzip) producing to a topic with
    compression.type=snappy: every stored batch is snappy and reads back whole."""
    from confluent_kafka import Producer
    from kafka import KafkaProducer

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        _create(_admin(broker), "s", {"compression.type": "snappy"})
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "enable.idempotence": True,
                "compression.type": "lz4",
                "linger.ms": 20,
            }
        )
        for i in range(20):
            producer.produce("s", value=b"cf %d" % i, key=b"c", headers=[("n", b"%d" % i)], timestamp=1000 + i)
        assert producer.flush(10) == 0
        kp = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="gzip", linger_ms=20)
        for i in range(20):
            kp.send("s", value=b"kp %d" % i, key=b"p", headers=[("n", b"%d" % i)], timestamp_ms=2000 + i)
        kp.flush(10)
        kp.close()
        with RawClient(broker.kafka_port) as raw:
            assert {a & 7 for _, _, a in _stored(raw, "s")} == {2}
        got = [
            (m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in read_partition(broker.bootstrap, "s", 0, 40)
        ]
        assert got == [(b"c", b"cf %d" % i, [("n", b"%d" % i)], 1000 + i) for i in range(20)] + [
            (b"p", b"kp %d" % i, [("n", b"%d" % i)], 2000 + i) for i in range(20)
        ]
    finally:
        broker.stop()


def test_a_compacted_topic_refuses_records_without_a_key_and_keeps_every_value(tmp_path: Path) -> None:
    """cleanup.policy=compact (set by IncrementalAlterConfigs APPEND, as librdkafka's 0011
    does): a batch with keyless records is refused whole with INVALID_RECORD naming each of
    them (KIP-467), nothing stored; keyed batches land; confluent-kafka's producer sees the
    refusal per record; and retention never deletes from a topic that is compact alone."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = _admin(broker)
        _create(admin, "kv", {"retention.ms": "1000"})
        entry = ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)
        (future,) = admin.incremental_alter_configs(
            [ConfigResource("topic", "kv", incremental_configs=[entry])], request_timeout=10
        ).values()
        future.result(10)
        assert _describe(admin, "kv")["cleanup.policy"] == ("delete,compact", TOPIC_CONFIG)
        with RawClient(broker.kafka_port) as raw:
            keyless = _batch([(b"k0", b"v0", []), (None, b"v1", []), (b"k2", b"v2", []), (None, b"v3", [])], 1, 0)
            refused = _produce(raw, "kv", keyless)
            assert refused.error_code == 87  # INVALID_RECORD
            assert [e.batch_index for e in refused.record_errors] == [1, 3]
            assert "without key" in refused.error_message
            assert _produce(raw, "kv", _batch([(b"k0", b"v0", []), (b"k1", b"v1", [])], 1, 0)).error_code == 0
            assert len(_stored(raw, "kv")) == 1  # only the keyed batch
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50})
        errors: list[str | None] = []
        for i in range(6):
            key = None if i % 3 == 0 else f"k{i}".encode()
            producer.produce("kv", b"v%d" % i, key=key, on_delivery=lambda err, msg: errors.append(err and err.name()))
        producer.flush(15)
        assert errors.count("INVALID_RECORD") == 2
        # compact alone: the retention.ms given before no longer deletes anything
        (future,) = admin.alter_configs(
            [ConfigResource("topic", "kv", set_config={"cleanup.policy": "compact", "retention.ms": "1000"})],
            request_timeout=10,
        ).values()
        future.result(10)
    finally:
        broker.stop()
    from luxun.kafka.log import KafkaLog
    from luxun.topics import TopicManager

    topics = TopicManager(str(tmp_path / "data"), data_page_size_bytes=1 << 20)
    try:
        kafka = KafkaLog(topics)
        assert kafka.retention_overrides("kv") == (-1, -1)
    finally:
        topics.close()
