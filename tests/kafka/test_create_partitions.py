"""CreatePartitions (API 37): a topic grows with confluent-kafka's and kafka-python's
admin clients; the new partitions are in Metadata, take records, survive a restart and
a consumer group rebalances onto them; bad requests get Kafka's errors and change
nothing; an interrupted growth leaves nothing at the next start. Issue 32, item 1."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest

from tests._broker import BrokerProcess

from ._kafka import RawClient, metadata_request

pytestmark = pytest.mark.timeout(120)

UNKNOWN_TOPIC_OR_PARTITION = 3
TOPIC_AUTHORIZATION_FAILED = 29
INVALID_PARTITIONS = 37
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_REQUEST = 42
POLICY_VIOLATION = 44


def _admin(broker: BrokerProcess) -> object:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": broker.bootstrap})


def _partitions(broker: BrokerProcess, topic: str) -> int:
    with RawClient(broker.kafka_port) as raw:
        response = raw.call(metadata_request(topic))
    (t,) = response.topics
    assert t.error_code == 0, t
    return len(t.partitions)


def _grow(broker: BrokerProcess, *topics: tuple[str, int, object], validate_only: bool = False) -> dict[str, object]:
    """A raw CreatePartitions v3: (topic, count, assignments or None) each."""
    import kio.schema.create_partitions.v3.request as schema

    body = schema.CreatePartitionsRequest(
        topics=tuple(
            schema.CreatePartitionsTopic(
                name=name,
                count=count,
                assignments=None
                if assignments is None
                else tuple(schema.CreatePartitionsAssignment(broker_ids=tuple(a)) for a in assignments),
            )
            for name, count, assignments in topics
        ),
        timeout=datetime.timedelta(seconds=10),
        validate_only=validate_only,
    )
    with RawClient(broker.kafka_port) as raw:
        response = raw.call(body)
    return {r.name: r for r in response.results}


def test_partitions_added_take_records_and_survive_a_restart(tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import NewPartitions, NewTopic

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = _admin(broker)
        admin.create_topics([NewTopic("grows", 2, 1)], request_timeout=10)["grows"].result(10)  # type: ignore[attr-defined]
        admin.create_partitions([NewPartitions("grows", 4)], request_timeout=10)["grows"].result(10)  # type: ignore[attr-defined]
        assert _partitions(broker, "grows") == 4
        producer = Producer({"bootstrap.servers": broker.bootstrap, "topic.metadata.refresh.interval.ms": 200})
        for p in range(4):
            producer.produce("grows", f"to {p}".encode(), partition=p)
        assert producer.flush(20) == 0
    finally:
        broker.stop()
    broker.start()
    try:
        assert _partitions(broker, "grows") == 4
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "reader", "enable.auto.commit": False})
        consumer.assign([TopicPartition("grows", p, 0) for p in range(4)])
        got: dict[int, bytes] = {}
        deadline = time.monotonic() + 30
        while len(got) < 4 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got[m.partition()] = m.value()
        consumer.close()
        assert got == {p: f"to {p}".encode() for p in range(4)}
    finally:
        broker.stop()


def test_kafka_python_grows_a_topic(broker: BrokerProcess) -> None:
    from kafka.admin import KafkaAdminClient, NewPartitions, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic("kp", 1, 1)])
        admin.create_partitions({"kp": NewPartitions(3)})
        assert _partitions(broker, "kp") == 3
    finally:
        admin.close()


def test_bad_requests_get_kafkas_errors_and_change_nothing(broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewPartitions, NewTopic

    admin = _admin(broker)
    admin.create_topics([NewTopic("three", 3, 1)], request_timeout=10)["three"].result(10)  # type: ignore[attr-defined]
    for name, count, code in (
        ("missing", 5, KafkaError.UNKNOWN_TOPIC_OR_PART),
        ("three", 2, KafkaError.INVALID_PARTITIONS),
        ("three", 3, KafkaError.INVALID_PARTITIONS),
    ):
        future = admin.create_partitions([NewPartitions(name, count)], request_timeout=10)[name]  # type: ignore[attr-defined]
        with pytest.raises(KafkaException) as info:
            future.result(10)
        assert info.value.args[0].code() == code, (name, count, info.value)
    results = _grow(
        broker,
        ("three", 5, [[0]]),  # two new partitions, one assignment
        validate_only=True,
    )
    assert results["three"].error_code == INVALID_REPLICA_ASSIGNMENT
    assert "by 2 but 1 assignments" in results["three"].error_message
    results = _grow(broker, ("three", 4, [[7]]))
    assert results["three"].error_code == INVALID_REPLICA_ASSIGNMENT
    assert results["three"].error_message == "Unknown broker(s) in replica assignment: 7."
    results = _grow(broker, ("three", 4, [[0, 0]]))
    assert results["three"].error_code == INVALID_REPLICA_ASSIGNMENT
    results = _grow(broker, ("three", 4, None), ("three", 5, None))
    assert list(results) == ["three"] and results["three"].error_code == INVALID_REQUEST
    # validate_only answers as the change would and makes nothing
    results = _grow(broker, ("three", 6, [[0], [0], [0]]), validate_only=True)
    assert results["three"].error_code == 0
    assert _partitions(broker, "three") == 3
    assert not (broker.data_dir / "three~3").exists()
    # with an assignment for broker 0 it is made
    assert _grow(broker, ("three", 5, [[0], [0]]))["three"].error_code == 0
    assert _partitions(broker, "three") == 5


def test_max_topics_counts_the_new_partitions(tmp_path: Path) -> None:
    from confluent_kafka.admin import NewTopic

    props = tmp_path / "limits.properties"
    props.write_text("max.topics=4\n")
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", "--config", str(props), kafka=True).start()
    try:
        admin = _admin(broker)  # kept: a destroyed client fails its futures
        admin.create_topics([NewTopic("small", 2, 1)], request_timeout=10)["small"].result(10)  # type: ignore[attr-defined]
        results = _grow(broker, ("small", 5, None))
        assert results["small"].error_code == POLICY_VIOLATION, results
        assert "max.topics=4" in results["small"].error_message
        assert _partitions(broker, "small") == 2
        assert _grow(broker, ("small", 4, None))["small"].error_code == 0
    finally:
        broker.stop()


def test_a_consumer_group_rebalances_onto_new_partitions(broker: BrokerProcess) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import NewPartitions, NewTopic

    admin = _admin(broker)
    admin.create_topics([NewTopic("spread", 1, 1)], request_timeout=10)["spread"].result(10)  # type: ignore[attr-defined]
    assigned: list[set[int]] = []
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "spreaders",
            "topic.metadata.refresh.interval.ms": 300,
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe(["spread"], on_assign=lambda c, ps: assigned.append({p.partition for p in ps}))
    try:
        deadline = time.monotonic() + 30
        while not assigned and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert assigned and assigned[-1] == {0}
        admin.create_partitions([NewPartitions("spread", 3)], request_timeout=10)["spread"].result(10)  # type: ignore[attr-defined]
        deadline = time.monotonic() + 30
        while assigned[-1] != {0, 1, 2} and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert assigned[-1] == {0, 1, 2}
    finally:
        consumer.close()


def test_leftovers_of_an_interrupted_growth_are_removed_at_start(tmp_path: Path) -> None:
    """Killed after making the new partitions and before kafka.json took the count: the
    empty partitions beyond it go at the next start, one log line each; a Thrift-written
    one stays (it holds items)."""
    from confluent_kafka.admin import NewTopic

    from idl import luxun_thrift as T
    from luxun.config import DEFAULT_DATA_PAGE_SIZE_BYTES
    from luxun.topics import TopicManager

    data = tmp_path / "data"
    broker = BrokerProcess(data, tmp_path / "broker.log", kafka=True).start()
    try:
        admin = _admin(broker)
        admin.create_topics([NewTopic("cut", 2, 1)], request_timeout=10)["cut"].result(10)  # type: ignore[attr-defined]
        thrift = broker.client()
        assert thrift.produce(T.ProduceRequest(item=b"kept", topic="cut~5")).result.resultCode == 0
        thrift.close()
    finally:
        broker.stop()
    manager = TopicManager(str(data), data_page_size_bytes=DEFAULT_DATA_PAGE_SIZE_BYTES)
    try:
        manager.get_or_create("cut~2")
        manager.get_or_create("cut~3")
    finally:
        manager.close()
    broker.start()
    try:
        assert _partitions(broker, "cut") == 2
        assert not (data / "cut~2").exists() and not (data / "cut~3").exists()
        assert (data / "cut~5").exists()
        assert "beyond its 2 partitions" in broker.log()
        _grow(broker, ("cut", 4, None))
        assert _partitions(broker, "cut") == 4
    finally:
        broker.stop()
