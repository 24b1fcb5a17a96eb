"""One group name, two doors (Issue 31, part 2; docs/groups.md): a real broker, our
Thrift client and raw Kafka frames. Whatever one door asks of a group the other door
uses is either done as the model says or refused on the door that asked, with a clear
code; the other door's consumers go on as before."""

from __future__ import annotations

from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode as E

from idl import luxun_thrift as T
from luxun.kafka.protocol import build
from tests._broker import BrokerProcess

from ._kafka import RawClient

pytestmark = pytest.mark.timeout(90)

COMMIT, FETCH, DELETE = 8, 9, 42


def kafka_commit(kafka: RawClient, group: str, topic: str, offset: int) -> int:
    """A simple consumer's OffsetCommit (generation -1) of partition 0; its error code."""
    r = kafka.call(
        build(
            load_request_schema(COMMIT, 8),
            group_id=group,
            generation_id_or_member_epoch=-1,
            member_id="",
            group_instance_id=None,
            topics=[{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": offset,
                                                    "committed_metadata": ""}]}],
        )
    )  # fmt: skip
    return int(r.topics[0].partitions[0].error_code)


def kafka_fetch(kafka: RawClient, group: str, topic: str) -> tuple[int, int, int]:
    """OffsetFetch v7 of partition 0: (group error, partition error, committed offset)."""
    r = kafka.call(
        build(load_request_schema(FETCH, 7), group_id=group, topics=[{"name": topic, "partition_indexes": [0]}])
    )
    p = r.topics[0].partitions[0]
    return int(r.error_code), int(p.error_code), int(p.committed_offset)


def kafka_delete(kafka: RawClient, group: str) -> int:
    r = kafka.call(build(load_request_schema(DELETE, 2), groups_names=[group]))
    return int(r.results[0].error_code)


def by_group(thrift: Any, topic: str, group: str) -> Any:
    return thrift.consume(T.ConsumeRequest(topic=topic, fanoutId=group))


def test_a_kafka_commit_on_a_group_thrift_reads_is_refused_and_thrift_reads_on(broker: BrokerProcess) -> None:
    """Before: the commit was taken and every later Thrift consume of the group failed
    with INTERNAL_ERROR "commits its positions"."""
    thrift = broker.client()
    for i in range(10):
        thrift.produce(T.ProduceRequest(item=b"item-%d" % i, topic="shared"))
    for i in range(3):
        assert list(by_group(thrift, "shared", "reports").itemList) == [b"item-%d" % i]
    with RawClient(broker.kafka_port) as kafka:
        assert kafka_commit(kafka, "reports", "shared", 8) == E.group_authorization_failed
        # OffsetFetch says the same (the group is the Thrift consumers'), not "no offset"
        assert kafka_fetch(kafka, "reports", "shared")[:2] == (E.group_authorization_failed,) * 2
    r = by_group(thrift, "shared", "reports")
    assert r.result.resultCode == T.ResultCode.SUCCESS, r.result
    assert list(r.itemList) == [b"item-3"]
    thrift.close()
    assert "Thrift consumers read that group by group" in broker.log()


def test_commit_then_delete_groups_does_not_rewind_a_thrift_group(broker: BrokerProcess) -> None:
    """Before: OffsetCommit then DeleteGroups rewound the Thrift group to the tail (its
    consumer read the first 5 items again)."""
    thrift = broker.client()
    for i in range(10):
        thrift.produce(T.ProduceRequest(item=b"item-%d" % i, topic="shared"))
    for i in range(5):
        assert list(by_group(thrift, "shared", "audit").itemList) == [b"item-%d" % i]
    with RawClient(broker.kafka_port) as kafka:
        codes = kafka_commit(kafka, "audit", "shared", 1), kafka_delete(kafka, "audit")
    assert [bytes(by_group(thrift, "shared", "audit").itemList[0]) for _ in range(5)] == [
        b"item-%d" % i for i in range(5, 10)
    ]
    thrift.close()
    # the commit refused (the group is the Thrift consumers'), so nothing to delete
    assert codes == (E.group_authorization_failed, E.group_id_not_found)


def test_the_mixes_of_one_group_across_doors(broker: BrokerProcess) -> None:
    """The model's table (docs/groups.md), each door's answer:

    * a group that Kafka commits is one position both doors state: Thrift reads it from
      its committed position (fromCommitted), and a Thrift commit is what Kafka fetches;
    * Thrift's auto-moving consume of that group is refused on the Thrift door (FAILURE,
      naming the group and both ways to read it), never on a third party's;
    * the same group name read by Thrift by group on another topic is the Thrift
      consumers' there, and Kafka's on the first: neither door disturbs the other;
    * DeleteGroups deletes the committed group (both doors' view of it) and leaves the
      Thrift group on the other topic where it was.
    """
    thrift = broker.client()
    for i in range(6):
        thrift.produce(T.ProduceRequest(item=b"a-%d" % i, topic="kafka-side"))
        thrift.produce(T.ProduceRequest(item=b"b-%d" % i, topic="thrift-side"))
    assert list(by_group(thrift, "thrift-side", "billing").itemList) == [b"b-0"]
    with RawClient(broker.kafka_port) as kafka:
        assert kafka_commit(kafka, "billing", "kafka-side", 2) == E.none
        assert kafka_fetch(kafka, "billing", "kafka-side") == (E.none, E.none, 2)
        assert kafka_fetch(kafka, "billing", "thrift-side")[:2] == (E.group_authorization_failed,) * 2

        # Thrift reads Kafka's commit: from index 2 (one item per offset here), moving nothing
        r = thrift.consume(T.ConsumeRequest(topic="kafka-side", fanoutId="billing", fromCommitted=True,
                                            maxFetchSize=1 << 20))  # fmt: skip
        assert list(r.itemList) == [b"a-%d" % i for i in range(2, 6)]
        # and its auto-moving consume is refused there, with the group named
        r = by_group(thrift, "kafka-side", "billing")
        assert r.result.resultCode == T.ResultCode.FAILURE
        assert "'billing'" in r.result.errorMessage and "Kafka" in r.result.errorMessage
        # a Thrift commit is the group's one position: Kafka fetches it
        assert (
            thrift.commitOffset(
                T.CommitOffsetRequest(topic="kafka-side", fanoutId="billing", index=4)
            ).result.resultCode
            == 0
        )
        assert kafka_fetch(kafka, "billing", "kafka-side") == (E.none, E.none, 4)
        # the Thrift group on the other topic is untouched by all this
        assert list(by_group(thrift, "thrift-side", "billing").itemList) == [b"b-1"]

        assert kafka_delete(kafka, "billing") == E.none
        assert kafka_fetch(kafka, "billing", "kafka-side") == (E.none, E.none, -1)
    assert list(by_group(thrift, "thrift-side", "billing").itemList) == [b"b-2"]
    thrift.close()
