"""Transactions and consumer groups (KIP-447): a TxnOffsetCommit v3 carries the
consumer's generation, member id and group instance id, and the coordinator refuses a
stale one (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID) as OffsetCommit
does; OffsetFetch with ``require_stable`` (v7+) answers UNSTABLE_OFFSET_COMMIT for a
partition whose offset an open transaction holds, so a read_committed consumer starts
from the transaction's outcome, never from an offset it may drop. With confluent-kafka's
transactional producer and consumers, and raw requests for the exact codes."""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest
from kio.schema.errors import ErrorCode as E

from luxun.kafka.protocol import build, request_schema
from tests._broker import BrokerProcess

from ._kafka import RawClient, metadata_request, produce_request, record_batch
from ._txn import broker, transactional_producer

__all__ = ["broker"]  # the fixture

pytestmark = pytest.mark.timeout(120)


def _call(raw: RawClient, api_key: int, version: int, **fields: Any) -> Any:
    return raw.call(build(request_schema(api_key, version), **fields))


def _topic(broker: BrokerProcess, name: str, records: int) -> None:
    with RawClient(broker.kafka_port) as raw:
        assert raw.call(metadata_request(name)).topics[0].error_code == 0  # made by auto-creation
        response = raw.call(produce_request(name, 0, record_batch([b"r%d" % i for i in range(records)])))
        assert response.responses[0].partition_responses[0].error_code == 0


def _consumer(broker: BrokerProcess, group: str, **config: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **config,
        }
    )


def _poll_until(consumers: list[Any], done: Any, timeout_s: float = 30.0) -> None:
    """Poll every consumer (serving their rebalances) until ``done()``, bounded in time."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the group did not settle in time"
        for c in consumers:
            c.poll(0.1)


# -- TxnOffsetCommit v3: the group member's generation (KIP-447) ---------------------------------
def test_offsets_sent_with_a_stale_generation_are_refused_and_the_transaction_aborts(
    broker: BrokerProcess,
) -> None:
    """A consume-transform-produce worker whose consumer was rebalanced away (a second
    member joined: a new generation) sends its offsets with the old generation: the
    coordinator refuses them (ILLEGAL_GENERATION), the producer must abort, nothing is
    committed; with the consumer's current metadata they commit with the transaction."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    _topic(broker, "gen-in", 4)
    first = _consumer(broker, "gen-g")
    second = _consumer(broker, "gen-g")
    producer = transactional_producer(broker.bootstrap, "gen-tx")
    try:
        first.subscribe(["gen-in"])
        _poll_until([first], lambda: bool(first.assignment()))
        stale = first.consumer_group_metadata()
        second.subscribe(["gen-in"])  # generation 2: one of them gets the only partition
        _poll_until([first, second], lambda: _stable(broker, "gen-g", members=2))
        producer.begin_transaction()
        with pytest.raises(KafkaException) as refused:
            producer.send_offsets_to_transaction([TopicPartition("gen-in", 0, 2)], stale, 20)
        error = refused.value.args[0]
        assert error.code() == KafkaError.ILLEGAL_GENERATION and error.txn_requires_abort(), error
        producer.abort_transaction(20)
        owner = first if first.assignment() else second
        producer.begin_transaction()
        producer.send_offsets_to_transaction([TopicPartition("gen-in", 0, 3)], owner.consumer_group_metadata(), 20)
        producer.commit_transaction(20)
        (committed,) = owner.committed([TopicPartition("gen-in", 0)], 10)
        assert committed.offset == 3
    finally:
        first.close()
        second.close()


def _stable(broker: BrokerProcess, group: str, *, members: int) -> bool:
    """``group`` is Stable with ``members`` members (DescribeGroups)."""
    with RawClient(broker.kafka_port) as raw:
        (described,) = _call(raw, 15, 5, groups=[group], include_authorized_operations=False).groups
    return described.group_state == "Stable" and len(described.members) == members


def test_txn_offset_commit_v3_answers_as_offset_commit_for_the_member(broker: BrokerProcess) -> None:
    """The exact codes, by raw requests: members joined by JoinGroup/SyncGroup (one of
    them static), offsets sent by a transactional id; a refusal stores nothing pending
    (OffsetFetch with require_stable still answers the committed offset). v2 carries no
    member and is not checked."""
    with RawClient(broker.kafka_port) as raw:
        member, generation = _join(raw, "raw-g", instance="worker-1")
        init = _call(raw, 22, 4, transactional_id="raw-gen", transaction_timeout=datetime.timedelta(seconds=60),
                     producer_id=-1, producer_epoch=-1)  # fmt: skip
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        for group in ("raw-g", "no-such-group"):
            added = _call(raw, 25, 3, transactional_id="raw-gen", producer_id=pid, producer_epoch=epoch,
                          group_id=group)  # fmt: skip
            assert added.error_code == 0

        def commit(group: str, member_id: str, instance: str | None, gen: int, version: int = 3) -> E:
            fields: dict[str, Any] = {"generation_id": gen, "member_id": member_id, "group_instance_id": instance}
            response = _call(
                raw, 28, version, transactional_id="raw-gen", group_id=group, producer_id=pid, producer_epoch=epoch,
                topics=[{"name": "raw-in", "partitions": [
                    {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                     "committed_metadata": None}]}],
                **(fields if version >= 3 else {}),
            )  # fmt: skip
            return E(response.topics[0].partitions[0].error_code)

        _produce_one(raw, "raw-in")
        assert commit("raw-g", member, "worker-1", generation + 1) == E.illegal_generation
        assert commit("raw-g", "someone-else", None, generation) == E.unknown_member_id
        assert commit("raw-g", "someone-else", "worker-1", generation) == E.fenced_instance_id
        assert commit("raw-g", member, "worker-2", generation) == E.unknown_member_id
        assert commit("no-such-group", "m", None, 3) == E.illegal_generation
        assert _fetch_stable(raw, "raw-g") == (E.none, -1)  # nothing pending after refusals
        assert commit("no-such-group", "", None, -1) == E.none  # a consumer without group management
        assert commit("raw-g", member, "worker-1", generation) == E.none
        assert _fetch_stable(raw, "raw-g") == (E.unstable_offset_commit, -1)
        assert commit("raw-g", "anyone", None, 99, version=2) == E.none  # no member fields to check
        ended = _call(raw, 26, 3, transactional_id="raw-gen", producer_id=pid, producer_epoch=epoch, committed=True)
        assert ended.error_code == 0
        assert _fetch_stable(raw, "raw-g") == (E.none, 1)


def _join(raw: RawClient, group: str, *, instance: str) -> tuple[str, int]:
    """A static member of ``group`` in a stable generation: (member id, generation)."""
    joined = _call(
        raw, 11, 5, group_id=group, session_timeout=datetime.timedelta(seconds=30),
        rebalance_timeout=datetime.timedelta(seconds=30), member_id="", group_instance_id=instance,
        protocol_type="consumer", protocols=[{"name": "range", "metadata": b"\x00\x00\x00\x00\x00\x00"}],
    )  # fmt: skip
    assert joined.error_code == 0, joined
    synced = _call(
        raw, 14, 3, group_id=group, generation_id=joined.generation_id, member_id=joined.member_id,
        group_instance_id=instance, assignments=[{"member_id": joined.member_id, "assignment": b""}],
    )  # fmt: skip
    assert synced.error_code == 0, synced
    return joined.member_id, joined.generation_id


def _produce_one(raw: RawClient, topic: str) -> None:
    assert raw.call(metadata_request(topic)).topics[0].error_code == 0
    response = raw.call(produce_request(topic, 0, record_batch([b"x", b"y"])))
    assert response.responses[0].partition_responses[0].error_code == 0


def _fetch_stable(raw: RawClient, group: str, topic: str = "raw-in", version: int = 7) -> tuple[E, int]:
    """OffsetFetch with require_stable of partition 0: (its error, its offset)."""
    topics = [{"name": topic, "partition_indexes": [0]}]
    if version >= 8:
        response = _call(raw, 9, version, groups=[{"group_id": group, "topics": topics}], require_stable=True)
        (part,) = response.groups[0].topics[0].partitions
    else:
        response = _call(raw, 9, version, group_id=group, topics=topics, require_stable=True)
        (part,) = response.topics[0].partitions
    return E(part.error_code), int(part.committed_offset)


# -- OffsetFetch require_stable: UNSTABLE_OFFSET_COMMIT while a transaction holds the offset -------
def test_a_read_committed_consumer_waits_for_the_transactions_offsets(broker: BrokerProcess) -> None:
    """While a transaction holds group ``stable-g``'s offset of a partition, a
    read_committed consumer's committed() (OffsetFetch require_stable) gets no answer
    (UNSTABLE_OFFSET_COMMIT, retried until its timeout), a read_uncommitted one gets the
    committed offset at once; after the commit both get the transaction's offset; an
    aborted transaction's offset is dropped and the committed one stays."""
    from confluent_kafka import KafkaException, TopicPartition

    _topic(broker, "stable-in", 6)
    worker = _consumer(broker, "stable-g")
    producer = transactional_producer(broker.bootstrap, "stable-tx")
    committed_reader = _consumer(broker, "stable-g", **{"isolation.level": "read_committed"})
    uncommitted_reader = _consumer(broker, "stable-g", **{"isolation.level": "read_uncommitted"})
    tp = TopicPartition("stable-in", 0)
    try:
        worker.subscribe(["stable-in"])
        _poll_until([worker], lambda: bool(worker.assignment()))
        producer.begin_transaction()
        producer.send_offsets_to_transaction([TopicPartition("stable-in", 0, 4)], worker.consumer_group_metadata(), 20)
        with RawClient(broker.kafka_port) as raw:
            assert _fetch_stable(raw, "stable-g", "stable-in") == (E.unstable_offset_commit, -1)
            assert _fetch_stable(raw, "stable-g", "stable-in", version=8) == (E.unstable_offset_commit, -1)
        started = time.monotonic()
        with pytest.raises(KafkaException):
            committed_reader.committed([tp], 2)
        assert time.monotonic() - started >= 1.5  # it kept asking
        (seen,) = uncommitted_reader.committed([tp], 10)
        assert seen.offset < 0  # nothing committed yet
        producer.commit_transaction(20)
        assert committed_reader.committed([tp], 10)[0].offset == 4
        assert uncommitted_reader.committed([tp], 10)[0].offset == 4
        producer.begin_transaction()
        producer.send_offsets_to_transaction([TopicPartition("stable-in", 0, 6)], worker.consumer_group_metadata(), 20)
        producer.abort_transaction(20)
        assert committed_reader.committed([tp], 10)[0].offset == 4
    finally:
        for c in (worker, committed_reader, uncommitted_reader):
            c.close()
