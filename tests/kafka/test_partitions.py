"""Topics of several partitions: CreateTopics, keyed produce, assign() per partition,
Metadata, and num.partitions for topics a client creates by using them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests._broker import BrokerProcess

from ._kafka import read_partition

pytestmark = pytest.mark.timeout(90)


def test_four_partitions_keyed_produce_and_assign(broker: BrokerProcess) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic("four", num_partitions=4, replication_factor=1)], request_timeout=10)
    futures["four"].result(10)

    metadata = admin.list_topics("four", timeout=10)
    assert metadata.controller_id == metadata.orig_broker_id
    assert [(b.id, b.host, b.port) for b in metadata.brokers.values()] == [
        (metadata.orig_broker_id, "127.0.0.1", broker.kafka_port)
    ]
    topic = metadata.topics["four"]
    assert topic.error is None
    assert sorted(topic.partitions) == [0, 1, 2, 3]
    for p in topic.partitions.values():
        assert (p.leader, p.replicas, p.isrs, p.error) == (
            metadata.orig_broker_id,
            [metadata.orig_broker_id],
            [metadata.orig_broker_id],
            None,
        )

    sent: dict[int, list[tuple[bytes, bytes]]] = {}
    delivered: list[tuple[int, int, bytes, bytes]] = []

    def on_delivery(err: object, msg: object) -> None:
        assert err is None, err
        delivered.append((msg.partition(), msg.offset(), msg.key(), msg.value()))  # type: ignore[attr-defined]

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(400):
        producer.produce("four", key=b"key-%d" % (i % 40), value=b"value-%d" % i, on_delivery=on_delivery)
    assert producer.flush(15) == 0
    assert len(delivered) == 400
    for partition, _offset, key, value in sorted(delivered, key=lambda d: (d[0], d[1])):
        sent.setdefault(partition, []).append((key, value))
    assert sorted(sent) == [0, 1, 2, 3], "librdkafka's partitioner spreads 40 keys over all 4 partitions"
    # Each key in one partition only; per partition, delivery offsets are 0..n-1.
    keys_at = {key: p for p, _, key, _ in delivered}
    assert all(keys_at[key] == p for p, _, key, _ in delivered)
    for p, items in sent.items():
        assert sorted(o for q, o, _, _ in delivered if q == p) == list(range(len(items)))

    for p, items in sent.items():
        got = read_partition(broker.bootstrap, "four", p, len(items))
        assert [(m.offset(), m.key(), m.value()) for m in got] == [
            (i, key, value) for i, (key, value) in enumerate(items)
        ], f"partition {p}"
        # Values of one key come in the order they were produced.
        order = [int(m.value().split(b"-")[1]) for m in got]
        assert order == sorted(order)


def test_num_partitions_for_auto_created_topics(tmp_path: Path) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    config = tmp_path / "server.properties"
    config.write_text("num.partitions=3\n")
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", "--config", str(config), kafka=True).start()
    try:
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(30):
            producer.produce("auto", key=b"%d" % i, value=b"v")
        assert producer.flush(15) == 0
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        deadline = time.monotonic() + 10
        while True:
            topic = admin.list_topics("auto", timeout=10).topics["auto"]
            if topic.error is None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert sorted(topic.partitions) == [0, 1, 2]
        # The Thrift port sees partition 0 as topic "auto" and the others as auto~1, auto~2.
        assert sorted(p.name for p in (tmp_path / "data").iterdir() if p.is_dir()) == ["auto", "auto~1", "auto~2"]
    finally:
        broker.stop()


def test_metadata_names_the_advertised_listener(tmp_path: Path) -> None:
    """kafka.advertised.host: what Metadata tells clients to connect to (they do)."""
    from confluent_kafka.admin import AdminClient

    config = tmp_path / "server.properties"
    config.write_text("kafka.advertised.host=localhost\n")
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", "--config", str(config), kafka=True).start()
    try:
        metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
        assert [(b.host, b.port) for b in metadata.brokers.values()] == [("localhost", broker.kafka_port)]
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": broker.bootstrap})
        producer.produce("advertised", value=b"via localhost")
        assert producer.flush(15) == 0
        assert [m.value() for m in read_partition(broker.bootstrap, "advertised", 0, 1)] == [b"via localhost"]
    finally:
        broker.stop()


def test_thrift_delete_topic_takes_the_kafka_partitions_with_it(broker: BrokerProcess) -> None:
    """A Thrift deleteTopic of a 3-partition Kafka topic deletes T~1 and T~2 too (they would
    otherwise stay behind with no topic to belong to); other topics are untouched."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from idl import luxun_thrift as T
    from tests._broker import PASSWORD

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("gone", 3, 1), NewTopic("gone2", 2, 1)]).values():
        future.result(15)
    client = broker.client()
    try:
        names = {t.name for t in client.listTopics(T.ListTopicsRequest()).topics}
        assert {"gone", "gone~1", "gone~2", "gone2", "gone2~1"} <= names
        r = client.deleteTopic(T.DeleteTopicRequest(topic="gone", password=PASSWORD))
        assert r.result.resultCode == T.ResultCode.SUCCESS, r.result
        names = {t.name for t in client.listTopics(T.ListTopicsRequest()).topics}
    finally:
        client.close()
    assert not {"gone", "gone~1", "gone~2"} & names
    assert {"gone2", "gone2~1"} <= names


def test_a_create_topics_over_max_topics_leaves_nothing_behind(tmp_path: Path) -> None:
    """Each partition is a luxun topic: a 5-partition topic on a broker that may hold 3
    topics is refused (POLICY_VIOLATION) before anything is made, so no partition is left
    on disk, invisible to Kafka clients and counted against the limit; the 3 topics the
    limit allows can then all be made. Before, partitions 4..2 were made, then the
    creation failed, and even a 1-partition topic was refused afterwards."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    props = tmp_path / "limits.properties"
    props.write_text("max.topics=3\n")
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", "--config", str(props), kafka=True).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        futures = admin.create_topics([NewTopic("wide", num_partitions=5, replication_factor=1)], request_timeout=10)
        with pytest.raises(KafkaException) as refused:
            futures["wide"].result(10)
        assert refused.value.args[0].name() == "POLICY_VIOLATION"
        assert "max.topics=3" in refused.value.args[0].str()
        assert [e for e in os.listdir(tmp_path / "data") if not e.startswith(".luxun")] == []
        futures = admin.create_topics([NewTopic("three", num_partitions=3, replication_factor=1)], request_timeout=10)
        futures["three"].result(10)
        assert sorted(e for e in os.listdir(tmp_path / "data") if not e.startswith(".luxun")) == [
            "three",
            "three~1",
            "three~2",
        ]
    finally:
        broker.stop()
