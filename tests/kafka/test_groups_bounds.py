"""Group state is bounded (Issue 31, part 2; docs/groups.md): in count (``max.groups``),
in time (a member id never used is dropped after its session timeout, and its group
with it) and on disk (an empty group's committed offsets expire after
``offsets.retention``). A real GroupCoordinator over a real TopicManager, with short
sessions and retention."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode as E

from luxun.kafka.groups import GroupCoordinator, GroupState
from luxun.kafka.protocol import build
from luxun.topics import TopicManager

from .test_groups import DESCRIBE, LEAVE, LIST, call, heartbeat, join, join_new, make, sync
from .test_groups_offsets import commit, fetch

pytestmark = pytest.mark.timeout(120)

JOIN = 11


@pytest.fixture
def topics(tmp_path: Path) -> Iterator[TopicManager]:
    manager = TopicManager(str(tmp_path / "data"), data_page_size_bytes=1 << 16)
    manager.create_and_append("t", [b"a", b"b", b"c", b"d"])
    yield manager
    manager.close()


def groups_in_memory(coord: GroupCoordinator) -> int:
    return sum(coord.group_states().values())


def wait_until(predicate: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_50000_join_groups_without_member_ids_stay_bounded(topics: TopicManager) -> None:
    """Before: every one kept a group (55,004 of them, +82 MiB) for the session timeout
    plus 5 minutes. Now: at most max.groups, the rest refused (GROUP_MAX_SIZE_REACHED),
    all of them gone once their member ids' session timeout (300 ms here) has passed."""
    with make(topics, max_groups=1000) as coord:
        schema = load_request_schema(JOIN, 9)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            answers: dict[int, int] = {}
            highest = 0
            for i in range(50_000):
                request = build(schema, group_id=f"flood-{i}", session_timeout=300, rebalance_timeout=300,
                                member_id="", group_instance_id=None, protocol_type="consumer", reason=None,
                                protocols=[{"name": "range", "metadata": b""}])  # fmt: skip
                code = coord.handle(JOIN, 9, request, client_id="flood", client_host="127.0.0.1").error_code
                answers[code] = answers.get(code, 0) + 1
                if i % 1000 == 999:
                    highest = max(highest, groups_in_memory(coord))
            grown = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        assert set(answers) <= {E.member_id_required, E.group_max_size_reached}, answers
        assert answers.get(E.group_max_size_reached, 0) > 0
        assert highest <= 1000
        assert grown < 16 << 20, f"{grown / 2**20:.1f} MiB held after 50,000 JoinGroups"
        # bounded in time: the member ids expire with their session timeout, their groups at once
        wait_until(lambda: groups_in_memory(coord) == 0, "the flood's groups stayed in memory")
        assert join_new(coord, "after-the-flood").error_code == E.none


def test_max_groups_refuses_a_new_group_not_the_ones_it_holds(topics: TopicManager) -> None:
    with make(topics, max_groups=2, empty_group_ttl_ms=300) as coord:
        a = join_new(coord, "one")
        b = join_new(coord, "two")
        assert (a.error_code, b.error_code) == (E.none, E.none)
        refused = join(coord, "three")
        assert refused.error_code == E.group_max_size_reached
        assert coord.describe("three")[0] is GroupState.DEAD
        # the groups it holds go on: a member rejoins, a second member joins
        assert sync(coord, a.member_id, 1, {a.member_id: b"p"}, group="one").error_code == E.none
        assert heartbeat(coord, a.member_id, 1, group="one") == E.none
        assert join(coord, "two").error_code == E.member_id_required
        # a simple consumer's commit to a new group is not a group kept in memory: taken
        assert commit(coord, {("t", 0): 1}, group="simple") == {("t", 0): E.none}
        assert groups_in_memory(coord) == 2
        # once a group is gone, a new one may come
        call(coord, LEAVE, 0, group_id="one", member_id=a.member_id)
        call(coord, LEAVE, 0, group_id="two", member_id=b.member_id)
        wait_until(lambda: groups_in_memory(coord) == 0, "the empty groups stayed in memory")
        assert join_new(coord, "three").error_code == E.none


def test_an_empty_groups_offsets_expire_after_the_retention(topics: TopicManager) -> None:
    """Kafka's offsets.retention.minutes (here 0.5 s): an empty group's offsets go that
    long after it became empty; a group with a member keeps them; a simple consumer's
    go that long after its last commit."""
    with make(topics, offsets_retention_ms=500, offsets_retention_check_interval_ms=100) as coord:
        gone = join_new(coord, "gone")
        sync(coord, gone.member_id, 1, {}, group="gone")
        assert commit(coord, {("t", 0): 3}, group="gone", generation=1, member=gone.member_id) == {("t", 0): E.none}
        call(coord, LEAVE, 0, group_id="gone", member_id=gone.member_id)
        assert commit(coord, {("t", 0): 2}, group="simple") == {("t", 0): E.none}
        kept = join_new(coord, "kept")
        sync(coord, kept.member_id, 1, {}, group="kept")
        assert commit(coord, {("t", 0): 1}, group="kept", generation=1, member=kept.member_id) == {("t", 0): E.none}
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.5:  # "kept" heartbeats through three retentions
            assert heartbeat(coord, kept.member_id, 1, group="kept") == E.none
            time.sleep(0.1)
        assert fetch(coord, {"t": [0]}, group="gone") == {("t", 0): (-1, "", E.none)}
        assert fetch(coord, {"t": [0]}, group="simple") == {("t", 0): (-1, "", E.none)}
        assert fetch(coord, {"t": [0]}, group="kept") == {("t", 0): (1, "", E.none)}
        listed = {g.group_id for g in call(coord, LIST, 4, states_filter=[]).groups}
        assert listed == {"kept"}
        assert (
            call(coord, DESCRIBE, 5, groups=["gone"], include_authorized_operations=False).groups[0].group_state
            == "Dead"
        )
        assert coord.expired_total == 2
        assert topics.get("t").queue.groups() == ["kept"]  # no position left behind on disk
