"""Committed positions over the wire (EXTENSION): commitOffset, getCommitted, consume
fromCommitted, the refusal of auto-moving consumes of a committing group, member
leases, and commits that survive a kill -9 of the broker."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from thriftpy2.protocol import TCyBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.transport import TCyFramedTransportFactory

from idl import QueueService
from idl import luxun_thrift as T
from luxun.thrift.service import GROUP_LEASE_S
from tests._broker import java_luxun

pytestmark = pytest.mark.timeout(60)

E = T.ErrorCode
R = T.ResultCode


def produce(client: Any, topic: str, n: int) -> None:
    for i in range(n):
        assert client.produce(T.ProduceRequest(item=b"m%d" % i, topic=topic)).result.resultCode == R.SUCCESS


def commit(client: Any, topic: str, group: str, index: int, member: str | None = None) -> Any:
    return client.commitOffset(T.CommitOffsetRequest(topic=topic, fanoutId=group, index=index, memberId=member)).result


def committed(client: Any, topic: str, group: str) -> tuple[int, bool]:
    response = client.getCommitted(T.GetCommittedRequest(topic=topic, fanoutId=group))
    assert response.result.resultCode == R.SUCCESS, response.result
    return response.index, response.committed


def from_committed(client: Any, topic: str, group: str, **fields: Any) -> Any:
    return client.consume(
        T.ConsumeRequest(topic=topic, fanoutId=group, maxFetchSize=1 << 20, fromCommitted=True, **fields)
    )


def test_commit_read_and_consume_from_committed(broker: Any, client: Any) -> None:
    produce(client, "t", 5)
    assert committed(client, "t", "g") == (0, False)  # a new group: tail, nothing committed
    response = from_committed(client, "t", "g")
    assert response.itemList == [b"m0", b"m1", b"m2", b"m3", b"m4"] and response.lastConsumedIndex == 4
    # reading from the committed position moves nothing
    assert from_committed(client, "t", "g").itemList == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert commit(client, "t", "g", 3).resultCode == R.SUCCESS
    assert committed(client, "t", "g") == (3, True)
    assert from_committed(client, "t", "g").itemList == [b"m3", b"m4"]
    assert from_committed(client, "t", "g", startIndex=4).itemList == [b"m4"]
    assert client.getSize(T.GetSizeRequest(topic="t", fanoutId="g")).size == 2  # lag counts from the commit
    assert commit(client, "t", "g", 5).resultCode == R.SUCCESS
    empty = from_committed(client, "t", "g")
    assert (empty.result.resultCode, empty.result.errorCode) == (R.TRY_LATER, E.ALL_MESSAGE_CONSUMED)
    # a long poll wakes up on a produce
    t0 = time.monotonic()
    produce(client, "t", 0)
    assert from_committed(client, "t", "g", maxWaitMs=200).result.errorCode == E.ALL_MESSAGE_CONSUMED
    assert time.monotonic() - t0 >= 0.15


def test_commit_outside_tail_head_and_bad_names_are_refused(broker: Any, client: Any) -> None:
    produce(client, "t", 3)
    result = commit(client, "t", "g", 4)
    assert (result.resultCode, result.errorCode) == (R.FAILURE, E.INDEX_OUT_OF_BOUNDS)
    assert "commit of index 4 for group 'g' of topic 't' refused: outside [tail, head] = [0, 3]" in result.errorMessage
    assert commit(client, "t", "g", -1).errorCode == E.INDEX_OUT_OF_BOUNDS
    assert commit(client, "nope", "g", 0).errorCode == E.TOPIC_NOT_EXIST
    assert commit(client, "a/b", "g", 0).errorCode == E.INVALID_TOPIC
    bad_group = commit(client, "t", "a/b", 0)
    assert bad_group.errorCode == E.INTERNAL_ERROR and "invalid fanout identifier" in bad_group.errorMessage
    assert committed(client, "t", "g") == (0, False)


def test_a_committing_group_refuses_auto_consumes(broker: Any, client: Any) -> None:
    produce(client, "t", 3)
    auto = client.consume(T.ConsumeRequest(topic="t", fanoutId="g", maxFetchSize=0))
    assert auto.itemList == [b"m0"]
    # an at-most-once group that starts committing reads on from where it stood
    assert committed(client, "t", "g") == (1, False)
    assert commit(client, "t", "g", 1).resultCode == R.SUCCESS
    for fetch in (0, 1 << 20):
        refused = client.consume(T.ConsumeRequest(topic="t", fanoutId="g", maxFetchSize=fetch))
        assert (refused.result.resultCode, refused.result.errorCode) == (R.FAILURE, E.INTERNAL_ERROR)
        assert "group 'g' of topic 't' commits its positions (at-least-once)" in refused.result.errorMessage
        assert refused.itemList is None
    assert from_committed(client, "t", "g").itemList == [b"m1", b"m2"]
    # other groups and reads by index are not concerned
    assert client.consume(T.ConsumeRequest(topic="t", fanoutId="other")).itemList == [b"m0"]
    assert client.consume(T.ConsumeRequest(topic="t", startIndex=2)).itemList == [b"m2"]


def test_one_member_at_a_time_reads_a_group(broker: Any, client: Any) -> None:
    produce(client, "t", 2)
    first = from_committed(client, "t", "g", memberId="a")
    assert first.itemList == [b"m0", b"m1"] and first.heldBy is None
    held = from_committed(client, "t", "g", memberId="b")
    assert (held.result.resultCode, held.result.errorCode) == (R.TRY_LATER, E.ALL_MESSAGE_CONSUMED)
    assert "read by member 'a'" in held.result.errorMessage
    assert held.heldBy == "a"  # the field clients act on (StreamConsumer), never the text
    refused = commit(client, "t", "g", 2, member="b")
    assert refused.resultCode == R.FAILURE and "member 'a' holds the group" in refused.errorMessage
    assert commit(client, "t", "g", 1, member="a").resultCode == R.SUCCESS
    # a waiting non-member does not spin: its long poll waits
    t0 = time.monotonic()
    assert from_committed(client, "t", "g", memberId="b", maxWaitMs=300).result.errorCode == E.ALL_MESSAGE_CONSUMED
    assert time.monotonic() - t0 >= 0.25
    # once a's lease runs out (it stopped reading), b reads from the committed index
    time.sleep(GROUP_LEASE_S + 0.2)
    assert from_committed(client, "t", "g", memberId="b").itemList == [b"m1"]
    assert commit(client, "t", "g", 2, member="a").resultCode == R.FAILURE
    assert commit(client, "t", "g", 2, member="b").resultCode == R.SUCCESS


def test_a_member_that_releases_hands_over_at_once(broker: Any, client: Any) -> None:
    produce(client, "t", 3)
    assert from_committed(client, "t", "g", memberId="a").itemList == [b"m0", b"m1", b"m2"]
    assert from_committed(client, "t", "g", memberId="b").result.errorCode == E.ALL_MESSAGE_CONSUMED
    release = T.CommitOffsetRequest(topic="t", fanoutId="g", index=1, memberId="a", release=True)
    assert client.commitOffset(release).result.resultCode == R.SUCCESS  # commit, then release
    assert from_committed(client, "t", "g", memberId="b").itemList == [b"m1", b"m2"]
    # release only (index -1) by a member that does not hold the group: nothing changes
    other = T.CommitOffsetRequest(topic="t", fanoutId="g", index=-1, memberId="a", release=True)
    assert client.commitOffset(other).result.resultCode == R.SUCCESS
    assert from_committed(client, "t", "g", memberId="a").result.errorCode == E.ALL_MESSAGE_CONSUMED
    assert committed(client, "t", "g") == (1, True)
    mine = T.CommitOffsetRequest(topic="t", fanoutId="g", index=-1, memberId="b", release=True)
    assert client.commitOffset(mine).result.resultCode == R.SUCCESS
    assert from_committed(client, "t", "g", memberId="a").itemList == [b"m1", b"m2"]


def test_commits_survive_kill_9_of_the_broker(broker_factory: Any, tmp_path: Any) -> None:
    data = tmp_path / "data"
    broker = broker_factory(data_dir=data)
    client = broker.client()
    produce(client, "t", 50)
    for index in range(1, 41):
        assert commit(client, "t", "g", index).resultCode == R.SUCCESS
    client.close()
    broker.stop(signal.SIGKILL)
    assert (data / "t" / "committed_g" / "page-0.dat").exists()
    again = broker_factory(data_dir=data)
    client = again.client()
    try:
        assert committed(client, "t", "g") == (40, True)
        assert from_committed(client, "t", "g").itemList == [b"m%d" % i for i in range(40, 50)]
    finally:
        client.close()


# -- message positions (Issue 31, part 1) ---------------------------------------------------------
def test_a_commit_names_a_message_and_a_read_from_it_says_how_many_to_skip(broker: Any, client: Any) -> None:
    produce(client, "t", 5)
    request = T.CommitOffsetRequest(topic="t", fanoutId="g", index=2, message=3)
    assert client.commitOffset(request).result.resultCode == R.SUCCESS
    got = client.getCommitted(T.GetCommittedRequest(topic="t", fanoutId="g"))
    assert (got.index, got.committed, got.message) == (2, True, 3)
    response = from_committed(client, "t", "g")  # the general path and the hand-written encoder
    assert (response.itemList, response.firstMessage) == ([b"m2", b"m3", b"m4"], 3)
    one = client.consume(T.ConsumeRequest(topic="t", fanoutId="g", fromCommitted=True, withTimestamps=True))
    assert (one.itemList, one.firstIndex, one.firstMessage) == ([b"m2"], 2, 3)
    # a read from a given index skips nothing: the reader knows where it is
    assert from_committed(client, "t", "g", startIndex=2).firstMessage is None
    # a commit without the field (an older client) names a whole item, as before
    assert commit(client, "t", "g", 3).resultCode == R.SUCCESS
    got = client.getCommitted(T.GetCommittedRequest(topic="t", fanoutId="g"))
    assert (got.index, got.message) == (3, 0)
    assert from_committed(client, "t", "g").firstMessage is None
    # a message inside the item at head (none yet) or a negative one is refused, naming it
    for index, message, text in ((5, 1, "no item at index 5 (head)"), (2, -1, "a message position is 0 or more")):
        bad = client.commitOffset(T.CommitOffsetRequest(topic="t", fanoutId="g", index=index, message=message))
        assert (bad.result.resultCode, bad.result.errorCode) == (R.FAILURE, E.INDEX_OUT_OF_BOUNDS)
        assert text in bad.result.errorMessage
    assert committed(client, "t", "g") == (3, True)


def test_a_message_position_survives_kill_9_of_the_broker(broker_factory: Any, tmp_path: Any) -> None:
    data = tmp_path / "data"
    broker = broker_factory(data_dir=data)
    client = broker.client()
    produce(client, "t", 10)
    for index in range(1, 9):
        request = T.CommitOffsetRequest(topic="t", fanoutId="g", index=index, message=index + 1)
        assert client.commitOffset(request).result.resultCode == R.SUCCESS
    client.close()
    broker.stop(signal.SIGKILL)
    client = broker_factory(data_dir=data).client()
    try:
        got = client.getCommitted(T.GetCommittedRequest(topic="t", fanoutId="g"))
        assert (got.index, got.committed, got.message) == (8, True, 9)
        assert from_committed(client, "t", "g").firstMessage == 9
    finally:
        client.close()


# -- Java Luxun opens a topic directory that holds committed positions (skipped without its build) --
@pytest.mark.timeout(120)
def test_java_luxun_opens_a_topic_with_committed_positions(broker_factory: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    ours = broker_factory(data_dir=data)
    client = ours.client()
    produce(client, "t", 5)
    assert client.consume(T.ConsumeRequest(topic="t", fanoutId="a")).itemList == [b"m0"]
    assert commit(client, "t", "g", 2).resultCode == R.SUCCESS
    client.close()
    ours.stop()
    assert (data / "t" / "committed_g" / "page-0.dat").is_file()
    with java_luxun(tmp_path, data) as address:
        java = make_client(QueueService, "127.0.0.1", int(address.rsplit(":", 1)[1]),
                           proto_factory=TCyBinaryProtocolFactory(), trans_factory=TCyFramedTransportFactory(),
                           timeout=20_000)  # fmt: skip
        # the at-most-once group goes on where it was; the committed group's position is the commit
        assert java.consume(T.ConsumeRequest(topic="t", fanoutId="a")).itemList == [b"m1"]
        assert java.getSize(T.GetSizeRequest(topic="t", fanoutId="g")).size == 3
        assert java.produce(T.ProduceRequest(item=b"m5", topic="t")).result.resultCode == R.SUCCESS
        java.close()
    again = broker_factory(data_dir=data)
    client = again.client()
    try:
        assert committed(client, "t", "g") == (2, True)
        assert from_committed(client, "t", "g").itemList == [b"m2", b"m3", b"m4", b"m5"]
    finally:
        client.close()
