"""API versions and refusals: ApiVersions of a version we lack (KIP-511), an
unsupported Produce version, DeleteTopics off by default, replication factors and
topic names Kafka refuses."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from luxun.kafka.handlers import VERSIONS
from tests._broker import BrokerProcess

from ._kafka import RawClient, decode_response, read_frame, read_partition, request

pytestmark = pytest.mark.timeout(90)

UNSUPPORTED_VERSION = 35
INVALID_TOPIC_EXCEPTION = 17
INVALID_REPLICATION_FACTOR = 38
TOPIC_DELETION_DISABLED = 73


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        yield b
    finally:
        b.stop()


def _produce_and_read(broker: BrokerProcess, topic: str) -> None:
    """Another client is served: a kafka-python producer and a confluent consumer."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    producer.send(topic, b"still-served").get(10)
    producer.close(5)
    assert [m.value() for m in read_partition(broker.bootstrap, topic, 0, 1)] == [b"still-served"]


def test_api_versions_v4_gets_error_35_in_the_v0_layout_with_our_ranges(broker: BrokerProcess) -> None:
    with RawClient(broker.kafka_port) as raw:
        entity = request(18, 4, client_software_name="raw-test", client_software_version="1.0")
        cid = raw.send(entity)
        frame = read_frame(raw.sock)
        assert frame is not None
        got_cid, response = decode_response(frame, 18, 0)  # the v0 layout, whatever was asked
        assert got_cid == cid
        assert response.error_code == UNSUPPORTED_VERSION
        ranges = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}
        assert ranges[18] == VERSIONS[18] and ranges[0] == VERSIONS[0] and ranges[1] == VERSIONS[1]
        # The client retries at a version we have, on the same connection (KIP-511).
        again = raw.call(request(18, 3, client_software_name="raw-test", client_software_version="1.0"))
        assert again.error_code == 0
        assert {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in again.api_keys} == ranges


def test_kafka_python_negotiates_through_the_fallback(broker: BrokerProcess) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    try:
        assert admin.describe_cluster()["controller_id"] >= 0
    finally:
        admin.close()


def test_an_unsupported_produce_version_closes_only_that_connection(broker: BrokerProcess) -> None:
    with RawClient(broker.kafka_port) as raw, RawClient(broker.kafka_port) as other:
        assert other.call(request(18, 3, client_software_name="a", client_software_version="1")).error_code == 0
        client_id = b"old-client"
        body = struct.pack(">hhih", 0, 2, 7, len(client_id)) + client_id
        body += struct.pack(">hi", 1, 1000) + struct.pack(">i", 0)  # acks, timeout, no topics (Produce v2)
        raw.sock.sendall(struct.pack(">i", len(body)) + body)
        assert raw.closed_by_broker(), "Produce v2 must close the connection"
        # The other connection is still open and answered.
        assert other.call(request(18, 3, client_software_name="a", client_software_version="1")).error_code == 0
    _produce_and_read(broker, "after-v2")


def test_confluent_lists_every_topic(broker: BrokerProcess) -> None:
    """AdminClient.list_topics() with no topic: librdkafka's Metadata v12 for all topics
    (it sends bytes after the body, which Kafka ignores)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("one", 1, 1), NewTopic("two", 2, 1)], request_timeout=10).values():
        future.result(10)
    topics = admin.list_topics(timeout=10).topics
    assert {name: sorted(t.partitions) for name, t in topics.items()} == {"one": [0], "two": [0, 1]}


def test_delete_topics_is_refused_by_default(broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("kept", 2, 1)], request_timeout=10)["kept"].result(10)
    with pytest.raises(KafkaException) as info:
        admin.delete_topics(["kept"], request_timeout=10)["kept"].result(10)
    error = info.value.args[0]
    assert error.code() == TOPIC_DELETION_DISABLED, error
    assert sorted(admin.list_topics("kept", timeout=10).topics["kept"].partitions) == [0, 1]


def test_delete_topics_works_with_delete_topic_enable(tmp_path: Path) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    config = tmp_path / "server.properties"
    config.write_text("delete.topic.enable=true\nauto.create.topics.enable=false\n")
    data = tmp_path / "data"
    broker = BrokerProcess(data, tmp_path / "broker.log", "--config", str(config), kafka=True).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("gone", 3, 1)], request_timeout=10)["gone"].result(10)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(9):
            producer.produce("gone", key=b"%d" % i, value=b"x")
        assert producer.flush(10) == 0
        assert sorted(p.name for p in data.iterdir() if p.is_dir()) == ["gone", "gone~1", "gone~2"]
        admin.delete_topics(["gone"], request_timeout=10)["gone"].result(10)
        assert "gone" not in admin.list_topics(timeout=10).topics
        assert sorted(p.name for p in data.iterdir() if p.is_dir() and p.name.startswith("gone")) == []
    finally:
        broker.stop()


def test_create_topics_refuses_replication_factor_3_and_bad_names(broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    refused = {
        "replicated": (NewTopic("replicated", 1, 3), INVALID_REPLICATION_FACTOR),
        "bad name!": (NewTopic("bad name!", 1, 1), INVALID_TOPIC_EXCEPTION),
        "x" * 250: (NewTopic("x" * 250, 1, 1), INVALID_TOPIC_EXCEPTION),
        "..": (NewTopic("..", 1, 1), INVALID_TOPIC_EXCEPTION),
        "part~1": (NewTopic("part~1", 1, 1), INVALID_TOPIC_EXCEPTION),  # '~' names partitions on disk
    }
    futures = admin.create_topics([new for new, _ in refused.values()], request_timeout=10)
    for name, (_, code) in refused.items():
        with pytest.raises(KafkaException) as info:
            futures[name].result(10)
        assert info.value.args[0].code() == code, (name[:20], info.value.args[0])
    assert refused.keys().isdisjoint(admin.list_topics(timeout=10).topics)
    assert sorted(p.name for p in broker.data_dir.iterdir() if p.is_dir()) == []
    _produce_and_read(broker, "after-refusals")
