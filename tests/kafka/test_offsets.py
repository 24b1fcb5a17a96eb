"""Offsets: they continue across broker restarts (SIGTERM and SIGKILL), ListOffsets
answers earliest, latest and by time, and a LogAppendTime topic shows the broker's time."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests._broker import BrokerProcess

from ._kafka import read_partition

pytestmark = pytest.mark.timeout(120)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    """Produce one at a time (acks=all); the offsets the broker gave."""
    from confluent_kafka import Producer

    offsets: list[int] = []

    def on_delivery(err: object, msg: object) -> None:
        assert err is None, err
        offsets.append(msg.offset())  # type: ignore[attr-defined]

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=b"%d" % i, on_delivery=on_delivery)
        if i % 7 == 0:
            producer.flush(10)  # several batches of different sizes
    assert producer.flush(15) == 0
    return offsets


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_offsets_continue_across_a_restart(tmp_path: Path, sig: int) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        first = _produce(broker.bootstrap, "restart", [b"a%d" % i for i in range(25)])
        assert first == list(range(25))
        broker.stop(sig)
        broker = BrokerProcess(tmp_path / "data", tmp_path / "broker-2.log", kafka=True).start()
        second = _produce(broker.bootstrap, "restart", [b"b%d" % i for i in range(25)])
        assert second == list(range(25, 50))
        got = read_partition(broker.bootstrap, "restart", 0, 50)
        assert [(m.offset(), m.value()) for m in got] == [(i, b"a%d" % i) for i in range(25)] + [
            (25 + i, b"b%d" % i) for i in range(25)
        ]
    finally:
        broker.stop()


def test_list_offsets_earliest_latest_and_by_time(tmp_path: Path) -> None:
    from confluent_kafka import Consumer, TopicPartition
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        # Three groups of records, appended at known times (the broker's append time is
        # what the lookup uses: about when each group was acknowledged).
        marks: list[int] = []
        for group in range(3):
            time.sleep(0.05)
            marks.append(int(time.time() * 1000))
            time.sleep(0.05)
            _produce(broker.bootstrap, "timed", [b"g%d-%d" % (group, i) for i in range(5)])
        after_all = int(time.time() * 1000) + 50
        time.sleep(0.1)

        kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
        try:
            tp = KTopicPartition("timed", 0)
            assert kc.beginning_offsets([tp]) == {tp: 0}
            assert kc.end_offsets([tp]) == {tp: 15}
            found = [kc.offsets_for_times({tp: mark})[tp] for mark in marks]
            assert [f.offset for f in found] == [0, 5, 10]
            assert all(f.timestamp >= mark for f, mark in zip(found, marks, strict=True))
            assert kc.offsets_for_times({tp: after_all}) == {tp: None}
        finally:
            kc.close()

        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "times", "enable.auto.commit": False})
        try:
            assert consumer.get_watermark_offsets(TopicPartition("timed", 0), timeout=10) == (0, 15)
            # One partition per call (librdkafka merges a partition named twice).
            got = [consumer.offsets_for_times([TopicPartition("timed", 0, m)], timeout=10)[0] for m in marks]
            assert [g.offset for g in got] == [0, 5, 10] and all(g.error is None for g in got)
            (late,) = consumer.offsets_for_times([TopicPartition("timed", 0, after_all)], timeout=10)
            assert late.offset == -1  # OFFSET_END: no record at or after that time
        finally:
            consumer.close()
    finally:
        broker.stop()


def test_log_append_time_topic_shows_the_broker_time(tmp_path: Path) -> None:
    from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        new = [
            NewTopic("appended", 1, 1, config={"message.timestamp.type": "LogAppendTime"}),
            NewTopic("created", 1, 1),
        ]
        for future in admin.create_topics(new, request_timeout=10).values():
            future.result(10)
        old = 1_000_000_000_000  # 2001: a create time far from now
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        before = int(time.time() * 1000)
        for topic in ("appended", "created"):
            for i in range(5):
                producer.produce(topic, value=b"%d" % i, timestamp=old + i)
        assert producer.flush(15) == 0
        after = int(time.time() * 1000)
        appended = read_partition(broker.bootstrap, "appended", 0, 5)
        for m in appended:
            kind, ts = m.timestamp()
            assert kind == TIMESTAMP_LOG_APPEND_TIME and before - 5 <= ts <= after + 5, (kind, ts)
        created = read_partition(broker.bootstrap, "created", 0, 5)
        assert [m.timestamp() for m in created] == [(TIMESTAMP_CREATE_TIME, old + i) for i in range(5)]
    finally:
        broker.stop()


def test_topic_settings_survive_a_restart(tmp_path: Path) -> None:
    """Partitions and message.timestamp.type of created topics, after a SIGKILL."""
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        new = [NewTopic("kept", 4, 1, config={"message.timestamp.type": "LogAppendTime"}), NewTopic("plain", 2, 1)]
        for future in admin.create_topics(new, request_timeout=10).values():
            future.result(10)
        broker.stop(signal.SIGKILL)
        broker = BrokerProcess(tmp_path / "data", tmp_path / "broker-2.log", kafka=True).start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        topics = admin.list_topics(timeout=10).topics
        assert {name: sorted(t.partitions) for name, t in topics.items()} == {"kept": [0, 1, 2, 3], "plain": [0, 1]}
        for name, kind in (("kept", "LogAppendTime"), ("plain", "CreateTime")):
            (future,) = admin.describe_configs([ConfigResource("topic", name)]).values()
            assert future.result(10)["message.timestamp.type"].value == kind
    finally:
        broker.stop()
