"""OffsetCommit / OffsetFetch on the topics' committed positions: a real GroupCoordinator
over a real TopicManager on a temporary directory, reopened to check what survives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode as E

from luxun.kafka.groups import GroupCoordinator
from luxun.partitions import KIND_KAFKA_BATCH
from luxun.topics import TopicManager

from .test_groups import COMMIT, DELETE, DESCRIBE, FETCH, LIST, call, join_new, make, sync

pytestmark = pytest.mark.timeout(60)


def open_topics(data: Path) -> TopicManager:
    return TopicManager(str(data), data_page_size_bytes=1 << 16)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """Topic ``t`` with partitions 0 and 1; partition 0 holds 3 plain items (offsets 0-2),
    a batch of 5 records (index 3, offsets 3-7) and a plain item (index 4, offset 8)."""
    topics = open_topics(tmp_path / "data")
    t, _ = topics.create_and_append("t", [b"a", b"b", b"c"])
    assert t.queue.enqueue(b"batch", count=5, kind=KIND_KAFKA_BATCH) == 3
    t.queue.enqueue(b"d")
    assert t.queue.array.next_offset == 9
    topics.create_and_append("t~1", [b"x"])
    topics.close()
    return tmp_path / "data"


@pytest.fixture
def topics(data: Path) -> Iterator[TopicManager]:
    manager = open_topics(data)
    yield manager
    manager.close()


@pytest.fixture
def coord(topics: TopicManager) -> Iterator[GroupCoordinator]:
    with make(topics) as c:
        yield c


def commit(coord: GroupCoordinator, offsets: dict[tuple[str, int], int], group: str = "g", generation: int = -1,
           member: str = "", metadata: str | None = "", version: int = 9) -> dict[tuple[str, int], int]:  # fmt: skip
    by_topic: dict[str, list[dict[str, object]]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append(
            {"partition_index": partition, "committed_offset": offset, "committed_metadata": metadata}
        )
    r = call(coord, COMMIT, version, group_id=group, generation_id_or_member_epoch=generation, member_id=member,
             topics=[{"name": t, "partitions": p} for t, p in by_topic.items()])  # fmt: skip
    return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}


def fetch(coord: GroupCoordinator, wanted: dict[str, list[int]] | None, group: str = "g",
          version: int = 7) -> dict[tuple[str, int], tuple[int, str, int]]:  # fmt: skip
    topics = None if wanted is None else [{"name": t, "partition_indexes": p} for t, p in wanted.items()]
    if version >= 8:
        r = call(coord, FETCH, version, groups=[{"group_id": group, "topics": topics}])
        (g,) = r.groups
        assert g.error_code == E.none
        answer = g.topics
    else:
        r = call(coord, FETCH, version, group_id=group, topics=topics)
        if version >= 2:
            assert r.error_code == E.none
        answer = r.topics
    return {
        (t.name, p.partition_index): (p.committed_offset, p.metadata, p.error_code)
        for t in answer
        for p in t.partitions
    }


def test_commit_inside_a_batch_keeps_the_exact_offset_and_the_item_index(coord: GroupCoordinator,
                                                                          topics: TopicManager) -> None:  # fmt: skip
    assert commit(coord, {("t", 0): 5, ("t", 1): 1}, metadata="m1") == {("t", 0): E.none, ("t", 1): E.none}
    assert fetch(coord, {"t": [0, 1, 2]}) == {("t", 0): (5, "m1", E.none), ("t", 1): (1, "m1", E.none),
                                              ("t", 2): (-1, "", E.none)}  # fmt: skip
    queue = topics.open("t").queue  # type: ignore[union-attr]
    assert queue.committed("g") == 3  # the batch item: what a Thrift client's getCommitted answers
    assert queue.committed_offset("g") == 5
    assert commit(coord, {("t", 0): 9}) == {("t", 0): E.none}  # the end: next_offset
    assert queue.committed("g") == queue.head == 5
    assert fetch(coord, {"t": [0]}) == {("t", 0): (9, "", E.none)}


def test_a_thrift_commit_reads_as_the_first_offset_of_its_item(coord: GroupCoordinator,
                                                                topics: TopicManager) -> None:  # fmt: skip
    topics.open("t").queue.commit("thrift-group", 4)  # type: ignore[union-attr]  # as commitOffset does
    assert fetch(coord, {"t": [0]}, group="thrift-group") == {("t", 0): (8, "", E.none)}
    topics.open("t").queue.commit("thrift-group", 3)  # type: ignore[union-attr]
    assert fetch(coord, {"t": [0]}, group="thrift-group") == {("t", 0): (3, "", E.none)}


def test_unknown_topics_and_partitions(coord: GroupCoordinator, topics: TopicManager) -> None:
    assert commit(coord, {("nope", 0): 1, ("t", 2): 0, ("t", -1): 0}) == {
        ("nope", 0): E.unknown_topic_or_partition,
        ("t", 2): E.unknown_topic_or_partition,
        ("t", -1): E.unknown_topic_or_partition,
    }
    assert "nope" not in topics.names() and "t~2" not in topics.names()  # nothing created
    assert fetch(coord, {"nope": [0], "t": [2]}) == {("nope", 0): (-1, "", E.none), ("t", 2): (-1, "", E.none)}
    assert commit(coord, {("t", 0): 1}, metadata="x" * 5000) == {("t", 0): E.offset_metadata_too_large}
    assert commit(coord, {("t", 0): 1}, group="") == {("t", 0): E.invalid_group_id}
    assert commit(coord, {("t", 0): -1}) == {("t", 0): E.invalid_request}


def test_commits_survive_a_restart(data: Path) -> None:
    topics = open_topics(data)
    with make(topics) as coord:
        assert commit(coord, {("t", 0): 6, ("t", 1): 1}, metadata="kept in memory") == {("t", 0): 0, ("t", 1): 0}
    topics.close()
    topics = open_topics(data)
    try:
        with make(topics) as coord:
            # the metadata string is kept in memory only
            assert fetch(coord, {"t": [0, 1]}) == {("t", 0): (6, "", E.none), ("t", 1): (1, "", E.none)}
            assert fetch(coord, None) == {("t", 0): (6, "", E.none), ("t", 1): (1, "", E.none)}  # all topics
            # a group known only by its offsets: listed Empty, described Empty, deletable
            assert [(g.group_id, g.group_state) for g in call(coord, LIST, 4).groups] == [("g", "Empty")]
            assert call(coord, DESCRIBE, 6, groups=["g"]).groups[0].group_state == "Empty"
            assert call(coord, DELETE, 2, groups_names=["g"]).results[0].error_code == E.none
            assert fetch(coord, {"t": [0, 1]}) == {("t", 0): (-1, "", E.none), ("t", 1): (-1, "", E.none)}
            assert call(coord, LIST, 4).groups == ()
    finally:
        topics.close()


def test_commits_of_group_members_are_checked_as_kafka_does(coord: GroupCoordinator) -> None:
    assert commit(coord, {("t", 0): 1}, group="members", generation=1, member="m") == {
        ("t", 0): E.illegal_generation  # no such group and a generation: an old member
    }
    a = join_new(coord, group="members")
    # completing the rebalance: the member knows its generation but has no assignment
    assert commit(coord, {("t", 0): 1}, group="members", generation=1, member=a.member_id) == {
        ("t", 0): E.rebalance_in_progress
    }
    sync(coord, a.member_id, 1, {a.member_id: b""}, group="members")
    assert commit(coord, {("t", 0): 2}, group="members", generation=1, member=a.member_id) == {("t", 0): E.none}
    assert commit(coord, {("t", 0): 3}, group="members", generation=0, member=a.member_id) == {
        ("t", 0): E.illegal_generation
    }
    assert commit(coord, {("t", 0): 3}, group="members", generation=1, member="other") == {
        ("t", 0): E.unknown_member_id
    }
    assert commit(coord, {("t", 0): 3}, group="members") == {("t", 0): E.unknown_member_id}  # not Empty
    assert fetch(coord, {"t": [0]}, group="members") == {("t", 0): (2, "", E.none)}


@pytest.mark.parametrize("version", range(2, 10))
def test_every_offset_commit_version(coord: GroupCoordinator, version: int) -> None:
    assert commit(coord, {("t", 0): version - 1}, version=version) == {("t", 0): E.none}
    assert fetch(coord, {"t": [0]}, version=7)[("t", 0)][0] == version - 1


@pytest.mark.parametrize("version", range(1, 10))
def test_every_offset_fetch_version(coord: GroupCoordinator, version: int) -> None:
    commit(coord, {("t", 0): 4, ("t", 1): 1}, metadata="meta")
    assert fetch(coord, {"t": [0, 1]}, version=version) == {
        ("t", 0): (4, "meta", E.none),
        ("t", 1): (1, "meta", E.none),
    }
    if version >= 2:
        assert fetch(coord, None, version=version) == {("t", 0): (4, "meta", E.none), ("t", 1): (1, "meta", E.none)}


def test_offset_fetch_of_several_groups_at_once(coord: GroupCoordinator) -> None:
    commit(coord, {("t", 0): 4}, group="g1")
    commit(coord, {("t", 0): 7}, group="g2")
    one = [{"name": "t", "partition_indexes": [0]}]
    r = call(coord, FETCH, 9, groups=[{"group_id": "g1", "member_id": None, "member_epoch": -1, "topics": None},
                                      {"group_id": "g2", "topics": one}, {"group_id": "", "topics": one}])  # fmt: skip
    got = {g.group_id: (g.error_code, [(p.committed_offset, p.error_code) for t in g.topics for p in t.partitions])
           for g in r.groups}  # fmt: skip
    assert got == {"g1": (E.none, [(4, E.none)]), "g2": (E.none, [(7, E.none)]),
                   "": (E.invalid_group_id, [(-1, E.invalid_group_id)])}  # fmt: skip
