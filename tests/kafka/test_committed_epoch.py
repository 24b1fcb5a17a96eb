"""The committed leader epoch: OffsetCommit v6+ carries it, OffsetFetch v5+ answers it
(before, always -1), kept in the committed page with the offset so it survives a
restart. Our leader epoch is 0 everywhere (Metadata says so), so confluent-kafka
commits 0. Issue 32, item 5."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests._broker import BrokerProcess

from ._kafka import RawClient, produce_request, record_batch, request

pytestmark = pytest.mark.timeout(120)


def _commit(broker: BrokerProcess, version: int, offset: int, epoch: int) -> int:
    """A raw OffsetCommit of t-0 by group "raw" (no generation): the partition's error."""
    import importlib

    m = importlib.import_module(f"kio.schema.offset_commit.v{version}.request")
    fields = {"partition_index": 0, "committed_offset": offset, "committed_metadata": None}
    if version >= 6:
        fields["committed_leader_epoch"] = epoch
    topic = m.OffsetCommitRequestTopic(name="t", partitions=(m.OffsetCommitRequestPartition(**fields),))
    body = {"group_id": "raw", "generation_id_or_member_epoch": -1, "member_id": "", "topics": (topic,)}
    if version >= 7:
        body["group_instance_id"] = None
    if 2 <= version <= 4:
        body["retention_time_ms"] = -1
    with RawClient(broker.kafka_port) as raw:
        answer = raw.call(m.OffsetCommitRequest(**body))
    return int(answer.topics[0].partitions[0].error_code)


def _fetch(broker: BrokerProcess, version: int) -> tuple[int, int]:
    """A raw OffsetFetch of t-0 by group "raw": (offset, leader epoch or None before v5)."""
    import importlib

    m = importlib.import_module(f"kio.schema.offset_fetch.v{version}.request")
    body = {"group_id": "raw", "topics": (m.OffsetFetchRequestTopic(name="t", partition_indexes=(0,)),)}
    if version >= 7:
        body["require_stable"] = False
    with RawClient(broker.kafka_port) as raw:
        (p,) = raw.call(m.OffsetFetchRequest(**body)).topics[0].partitions
    return int(p.committed_offset), getattr(p, "committed_leader_epoch", None)


def test_confluent_kafka_commits_leader_epoch_0_and_it_survives_a_restart(tmp_path: Path) -> None:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("t", 1, 1)], request_timeout=10)["t"].result(10)
        with RawClient(broker.kafka_port) as raw:
            raw.call(produce_request("t", 0, record_batch([b"a", b"b"])))
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "epochs", "enable.auto.commit": False})
        consumer.assign([TopicPartition("t", 0, 0)])
        deadline = time.monotonic() + 20
        m = None
        while m is None and time.monotonic() < deadline:
            m = consumer.poll(0.5)
        assert m is not None and m.error() is None
        assert m.leader_epoch() == 0
        consumer.commit(message=m, asynchronous=False)
        consumer.close()
        assert _commit(broker, 8, 1, 5) == 0  # another group, raw: any epoch a client gives is kept
    finally:
        broker.stop()
    broker.start()
    try:
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "epochs", "enable.auto.commit": False})
        (committed,) = consumer.committed([TopicPartition("t", 0)], timeout=10)
        consumer.close()
        assert (committed.offset, committed.leader_epoch) == (1, 0)
        assert _fetch(broker, 7) == (1, 5)
    finally:
        broker.stop()


def test_each_version_carries_the_epoch_it_has(broker: BrokerProcess) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("t", 1, 1)], request_timeout=10)["t"].result(10)
    assert _commit(broker, 8, 0, 5) == 0
    assert _fetch(broker, 7) == (0, 5)
    assert _fetch(broker, 4) == (0, None)  # no such field before v5
    assert _commit(broker, 5, 0, -1) == 0  # v5 has no epoch: the commit clears it
    assert _fetch(broker, 5) == (0, -1)
    assert _commit(broker, 6, 0, -1) == 0
    assert _fetch(broker, 6) == (0, -1)
    with RawClient(broker.kafka_port) as raw:
        versions = {k.api_key: (k.min_version, k.max_version) for k in raw.call(request(18, 2)).api_keys}
    assert versions[8][1] >= 6 and versions[9][1] >= 5
