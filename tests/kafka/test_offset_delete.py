"""OffsetDelete (API 47) with kafka-python's KafkaAdminClient: an Empty group's
committed offsets go for the partitions asked (and stay gone after a restart), a
consumer group with members keeps those of the topics it subscribes to
(GROUP_SUBSCRIBED_TO_TOPIC), unknown groups and partitions get Kafka's errors.
Issue 32, item 4."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests._broker import BrokerProcess

from ._kafka import RawClient, request

pytestmark = pytest.mark.timeout(120)

GROUP_ID_NOT_FOUND = 69
UNKNOWN_TOPIC_OR_PARTITION = 3
GROUP_SUBSCRIBED_TO_TOPIC = 86


def _setup(broker: BrokerProcess, group: str, commits: dict[tuple[str, int], int]) -> Any:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for topic in sorted({t for t, _ in commits}):
        admin.create_topics([NewTopic(topic, 2, 1)], request_timeout=10)[topic].result(10)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in commits.items()], asynchronous=False)
    finally:
        consumer.close()
    return admin


def _committed(broker: BrokerProcess, group: str, parts: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = consumer.committed([TopicPartition(t, p) for t, p in parts], timeout=10)
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): tp.offset for tp in got}


def _delete(broker: BrokerProcess, group: str, parts: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """kafka-python's delete_group_offsets (confluent-kafka's Python binding lacks it):
    each partition's error name."""
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = admin.delete_group_offsets(group, [TopicPartition(t, p) for t, p in parts])
    finally:
        admin.close()
    return {(tp.topic, tp.partition): error.__name__ for tp, error in result.items()}


def test_offsets_of_an_empty_group_are_deleted_and_stay_deleted(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    parts = [("a", 0), ("a", 1), ("b", 0)]
    try:
        _setup(broker, "quiet", {("a", 0): 5, ("a", 1): 6, ("b", 0): 7})
        assert _committed(broker, "quiet", parts) == {("a", 0): 5, ("a", 1): 6, ("b", 0): 7}
        errors = _delete(broker, "quiet", [("a", 0), ("b", 0)])
        assert errors == {("a", 0): "NoError", ("b", 0): "NoError"}
        assert _committed(broker, "quiet", parts) == {("a", 0): -1001, ("a", 1): 6, ("b", 0): -1001}
    finally:
        broker.stop()
    broker.start()
    try:
        assert _committed(broker, "quiet", parts) == {("a", 0): -1001, ("a", 1): 6, ("b", 0): -1001}
    finally:
        broker.stop()


def test_a_group_with_members_keeps_the_offsets_of_its_subscribed_topics(broker: BrokerProcess) -> None:
    from confluent_kafka import Consumer

    _setup(broker, "busy", {("sub", 0): 3, ("other", 0): 4})
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "busy",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    assigned: list[Any] = []
    consumer.subscribe(["sub"], on_assign=lambda c, ps: assigned.append(ps))
    try:
        deadline = time.monotonic() + 30
        while not assigned and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert assigned
        errors = _delete(broker, "busy", [("sub", 0), ("other", 0)])
        assert errors == {("other", 0): "NoError", ("sub", 0): "GroupSubscribedToTopicError"}
    finally:
        consumer.close()
    assert _committed(broker, "busy", [("sub", 0), ("other", 0)]) == {("sub", 0): 3, ("other", 0): -1001}


def test_unknown_groups_and_partitions(broker: BrokerProcess) -> None:
    _setup(broker, "known", {("t", 0): 1})
    module = __import__("kio.schema.offset_delete.v0.request", fromlist=["x"])

    def raw(group: str, topic: str, partition: int) -> Any:
        body = module.OffsetDeleteRequest(
            group_id=group,
            topics=(
                module.OffsetDeleteRequestTopic(
                    name=topic, partitions=(module.OffsetDeleteRequestPartition(partition_index=partition),)
                ),
            ),
        )
        with RawClient(broker.kafka_port) as client:
            return client.call(body)

    assert raw("never", "t", 0).error_code == GROUP_ID_NOT_FOUND
    answer = raw("known", "nowhere", 0)
    assert answer.error_code == 0
    assert answer.topics[0].partitions[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
    answer = raw("known", "t", 9)
    assert answer.topics[0].partitions[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert _committed(broker, "known", [("t", 0)]) == {("t", 0): 1}
    with RawClient(broker.kafka_port) as client:
        versions = {k.api_key: (k.min_version, k.max_version) for k in client.call(request(18, 2)).api_keys}
    assert versions[47] == (0, 0)
