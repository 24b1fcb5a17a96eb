"""The group coordinator driven with kio request objects from several threads: a real
GroupCoordinator over a real TopicManager on a temporary directory (no broker, no mocks).

Sessions here are short (min session timeout lowered to 100 ms) so expiry is quick.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as E
from kio.serial import entity_reader, entity_writer

from luxun.kafka.groups import GroupCoordinator, GroupState
from luxun.kafka.protocol import build
from luxun.topics import TopicManager

pytestmark = pytest.mark.timeout(60)

FIND, JOIN, HEARTBEAT, LEAVE, SYNC, DESCRIBE, LIST = 10, 11, 12, 13, 14, 15, 16
COMMIT, FETCH, DELETE, CGH = 8, 9, 42, 68


@pytest.fixture
def topics(tmp_path: Path) -> Iterator[TopicManager]:
    manager = TopicManager(str(tmp_path / "data"), data_page_size_bytes=1 << 16)
    yield manager
    manager.close()


def make(topics: TopicManager, **options: Any) -> GroupCoordinator:
    options.setdefault("min_session_timeout_ms", 100)
    options.setdefault("initial_rebalance_delay_ms", 0)  # not the default's 3 s: tested on its own
    return GroupCoordinator(topics, node_id=7, host="127.0.0.1", port=19092, **options)


@pytest.fixture
def coord(topics: TopicManager) -> Iterator[GroupCoordinator]:
    with make(topics) as c:
        yield c


def call(coord: GroupCoordinator, api: int, version: int, **values: Any) -> Any:
    """Send ``values`` as a request of ``key``/``version`` through the wire encoding both
    ways (so what the coordinator takes and answers is what a client would see)."""
    request = build(load_request_schema(api, version), **values)
    buf = io.BytesIO()
    entity_writer(type(request))(buf, request)
    request, _ = entity_reader(type(request))(buf.getvalue(), 0)
    response = coord.handle(api, version, request, client_id="test-client", client_host="127.0.0.1")
    rtype = load_response_schema(api, version)
    assert type(response) is rtype
    buf = io.BytesIO()
    entity_writer(rtype)(buf, response)
    return entity_reader(rtype)(buf.getvalue(), 0)[0]


def join(
    coord: GroupCoordinator,
    group: str = "g",
    member: str = "",
    *,
    version: int = 9,
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"meta"),),
    session_ms: int = 1000,
    rebalance_ms: int = 2000,
    instance: str | None = None,
    protocol_type: str = "consumer",
) -> Any:
    return call(
        coord,
        JOIN,
        version,
        group_id=group,
        session_timeout=session_ms,
        rebalance_timeout=rebalance_ms,
        member_id=member,
        group_instance_id=instance,
        protocol_type=protocol_type,
        protocols=[{"name": n, "metadata": m} for n, m in protocols],
    )


def join_new(coord: GroupCoordinator, group: str = "g", **kw: Any) -> Any:
    """A new member's two JoinGroups (v4+: MEMBER_ID_REQUIRED, then with the id)."""
    first = join(coord, group, **kw)
    assert first.error_code == E.member_id_required
    assert first.member_id.startswith("test-client-")
    return join(coord, group, first.member_id, **kw)


def sync(coord: GroupCoordinator, member: str, generation: int, assignments: dict[str, bytes] | None = None,
         group: str = "g", version: int = 5) -> Any:  # fmt: skip
    return call(
        coord,
        SYNC,
        version,
        group_id=group,
        generation_id=generation,
        member_id=member,
        protocol_type="consumer",
        protocol_name="range",
        assignments=[{"member_id": m, "assignment": a} for m, a in (assignments or {}).items()],
    )


def heartbeat(coord: GroupCoordinator, member: str, generation: int, group: str = "g", version: int = 4) -> Any:
    return call(coord, HEARTBEAT, version, group_id=group, generation_id=generation, member_id=member).error_code


def in_thread(fn: Callable[..., Any], *args: Any, **kw: Any) -> Future[Any]:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn, *args, **kw)
    pool.shutdown(wait=False)
    return future


def wait_state(coord: GroupCoordinator, group: str, state: GroupState, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while coord.describe(group)[0] is not state:
        assert time.monotonic() < deadline, f"group {group!r} stayed {coord.describe(group)[0]}, not {state}"
        time.sleep(0.01)


def stable_pair(coord: GroupCoordinator) -> tuple[str, str, int]:
    """Two members of group ``g`` in a stable generation: (leader, follower, generation)."""
    a = join_new(coord)
    assert a.error_code == E.none and a.generation_id == 1
    assert sync(coord, a.member_id, 1, {a.member_id: b"all"}).assignment == b"all"
    first = join(coord)  # the second member: its id
    b_join = in_thread(join, coord, member=first.member_id)
    wait_state(coord, "g", GroupState.PREPARING_REBALANCE)
    assert heartbeat(coord, a.member_id, 1) == E.rebalance_in_progress
    a2 = join(coord, member=a.member_id)
    b2 = b_join.result(timeout=5)
    assert a2.error_code == b2.error_code == E.none
    assert a2.generation_id == b2.generation_id == 2
    assert a2.leader == b2.leader == a.member_id
    assert {m.member_id for m in a2.members} == {a.member_id, b2.member_id} and b2.members == ()
    b_sync = in_thread(sync, coord, b2.member_id, 2)
    leader = sync(coord, a.member_id, 2, {a.member_id: b"p0,p1", b2.member_id: b"p2,p3"})
    assert leader.assignment == b"p0,p1"
    assert b_sync.result(timeout=5).assignment == b"p2,p3"
    return a.member_id, b2.member_id, 2


# -- FindCoordinator ------------------------------------------------------------------------------
@pytest.mark.parametrize("version", range(0, 7))
def test_find_coordinator_answers_this_broker(coord: GroupCoordinator, version: int) -> None:
    if version < 4:
        r = call(coord, FIND, version, key="g", key_type=0)
        assert (r.error_code, r.node_id, r.host, r.port) == (E.none, 7, "127.0.0.1", 19092)
    else:
        r = call(coord, FIND, version, key_type=0, coordinator_keys=["a", "b"])
        assert [(c.key, c.error_code, c.node_id, c.host, c.port) for c in r.coordinators] == [
            ("a", E.none, 7, "127.0.0.1", 19092),
            ("b", E.none, 7, "127.0.0.1", 19092),
        ]


# -- JoinGroup / SyncGroup / Heartbeat --------------------------------------------------------------
def test_one_member_joins_syncs_and_heartbeats(coord: GroupCoordinator) -> None:
    r = join_new(coord)
    assert (r.error_code, r.generation_id, r.protocol_type, r.protocol_name) == (E.none, 1, "consumer", "range")
    assert r.leader == r.member_id and [(m.member_id, m.metadata) for m in r.members] == [(r.member_id, b"meta")]
    assert coord.describe("g")[0] is GroupState.COMPLETING_REBALANCE
    assert heartbeat(coord, r.member_id, 1) == E.none  # allowed while completing
    s = sync(coord, r.member_id, 1, {r.member_id: b"assignment"})
    assert (s.error_code, s.assignment, s.protocol_name) == (E.none, b"assignment", "range")
    assert coord.describe("g")[:2] == (GroupState.STABLE, 1)
    assert heartbeat(coord, r.member_id, 1) == E.none
    # a follower's JoinGroup again with the same metadata in Stable: the current generation
    assert sync(coord, r.member_id, 1).assignment == b"assignment"  # SyncGroup in Stable: the current one


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_old_join_versions_get_a_member_id_at_once(coord: GroupCoordinator, version: int) -> None:
    r = join(coord, version=version)
    assert r.error_code == E.none and r.member_id and r.generation_id == 1


def test_two_members_split_and_a_dead_one_is_expired(coord: GroupCoordinator) -> None:
    a, b, gen = stable_pair(coord)
    # b stops heartbeating; a goes on every 100 ms: b is removed within its session timeout (1 s)
    t0 = time.monotonic()
    while (code := heartbeat(coord, a, gen)) == E.none:
        assert time.monotonic() - t0 < 3.0, "the silent member was never expired"
        time.sleep(0.1)
    elapsed = time.monotonic() - t0
    assert code == E.rebalance_in_progress and 0.8 < elapsed < 1.6
    r = join(coord, member=a)
    assert (r.error_code, r.generation_id, [m.member_id for m in r.members]) == (E.none, gen + 1, [a])
    assert sync(coord, a, gen + 1, {a: b"everything"}).assignment == b"everything"
    assert heartbeat(coord, b, gen) == E.unknown_member_id


def test_member_not_rejoining_is_dropped_after_the_rebalance_timeout(coord: GroupCoordinator) -> None:
    a, b, gen = stable_pair(coord)
    # a long session for b, but it does not rejoin: the join ends at the rebalance timeout (2 s)
    t0 = time.monotonic()
    call(coord, LEAVE, 0, group_id="g", member_id="nobody")  # no effect
    r_future = in_thread(join, coord, member=a, protocols=(("range", b"changed"),))  # a's metadata changed
    # b keeps its session alive with heartbeats but never rejoins
    while not r_future.done():
        error = heartbeat(coord, b, gen)
        if error == E.unknown_member_id:
            # b was dropped just now: the join is ending; that it ended at the timeout, with
            # b gone, is checked below (a clean-clone CI run heartbeated in that instant)
            break
        assert error in (E.none, E.rebalance_in_progress)
        assert time.monotonic() - t0 < 5
        time.sleep(0.1)
    r = r_future.result(timeout=5)
    assert r.error_code == E.none and [m.member_id for m in r.members] == [a]
    assert 1.8 < time.monotonic() - t0 < 3.5
    assert heartbeat(coord, b, gen) == E.unknown_member_id


def test_errors_are_kafkas(coord: GroupCoordinator) -> None:
    assert join(coord, session_ms=50).error_code == E.invalid_session_timeout
    assert join(coord, session_ms=2_000_000).error_code == E.invalid_session_timeout
    assert join(coord, group="").error_code == E.invalid_group_id
    assert join(coord, group="a/b").error_code == E.invalid_group_id
    assert join(coord, member="made-up").error_code == E.unknown_member_id  # no such group
    assert heartbeat(coord, "x", 1, group="nope") == E.unknown_member_id
    assert sync(coord, "x", 1, group="nope").error_code == E.unknown_member_id
    assert join(coord, protocols=()).error_code == E.inconsistent_group_protocol
    a = join_new(coord)
    assert join(coord, protocol_type="connect").error_code == E.inconsistent_group_protocol
    assert join(coord, protocols=(("sticky", b""),)).error_code == E.inconsistent_group_protocol
    assert heartbeat(coord, "stranger", 1) == E.unknown_member_id
    assert heartbeat(coord, a.member_id, 0) == E.illegal_generation
    assert sync(coord, a.member_id, 5).error_code == E.illegal_generation
    s = call(coord, SYNC, 5, group_id="g", generation_id=1, member_id=a.member_id, protocol_type="consumer",
             protocol_name="roundrobin", assignments=[])  # fmt: skip
    assert s.error_code == E.inconsistent_group_protocol
    assert join(coord, member="not-a-member").error_code == E.unknown_member_id
    r = call(coord, CGH, 0, group_id="g", member_id="", member_epoch=0, rebalance_timeout=1000,
             subscribed_topic_names=["t"], topic_partitions=[])  # fmt: skip
    assert r.error_code == E.unsupported_version and "classic" in r.error_message


def test_sync_during_a_rebalance_and_the_waiting_follower_told_to_rejoin(coord: GroupCoordinator) -> None:
    a, b, gen = stable_pair(coord)
    c_id = join(coord).member_id
    c_join = in_thread(join, coord, member=c_id)
    wait_state(coord, "g", GroupState.PREPARING_REBALANCE)
    assert sync(coord, b, gen).error_code == E.rebalance_in_progress
    ja, jb = in_thread(join, coord, member=a), in_thread(join, coord, member=b)
    rc, ra, rb = c_join.result(5), ja.result(5), jb.result(5)
    assert ra.generation_id == rb.generation_id == rc.generation_id == gen + 1
    # b waits in SyncGroup; c leaves before the leader syncs: b is told to rejoin
    b_sync = in_thread(sync, coord, b, gen + 1)
    time.sleep(0.2)
    assert not b_sync.done()
    r = call(coord, LEAVE, 5, group_id="g", members=[{"member_id": c_id, "group_instance_id": None},
                                                      {"member_id": "ghost", "group_instance_id": None}])  # fmt: skip
    assert r.error_code == E.none
    assert [(m.member_id, m.error_code) for m in r.members] == [(c_id, E.none), ("ghost", E.unknown_member_id)]
    assert b_sync.result(5).error_code == E.rebalance_in_progress


def test_protocol_chosen_by_vote_among_those_all_support(coord: GroupCoordinator) -> None:
    both = (("roundrobin", b"rr"), ("range", b"rg"))
    a = join_new(coord, protocols=(("sticky", b"s"), *both))
    sync(coord, a.member_id, 1, {})
    b_id = join(coord, protocols=(("range", b"rg2"), ("roundrobin", b"rr2"))).member_id
    fb = in_thread(join, coord, member=b_id, protocols=(("range", b"rg2"), ("roundrobin", b"rr2")))
    wait_state(coord, "g", GroupState.PREPARING_REBALANCE)
    c_id = join(coord, protocols=(("range", b"rg3"), *both)).member_id
    fc = in_thread(join, coord, member=c_id, protocols=(("range", b"rg3"), *both))
    time.sleep(0.1)
    ra = join(coord, member=a.member_id, protocols=(("sticky", b"s"), *both))
    # a votes roundrobin (sticky is not common), b and c vote range
    assert ra.protocol_name == fb.result(5).protocol_name == fc.result(5).protocol_name == "range"
    assert {m.member_id: m.metadata for m in ra.members} == {a.member_id: b"rg", b_id: b"rg2", c_id: b"rg3"}


def test_leave_group_v0_and_group_goes_empty(coord: GroupCoordinator) -> None:
    a = join_new(coord)
    sync(coord, a.member_id, 1, {a.member_id: b"x"})
    assert call(coord, LEAVE, 0, group_id="g", member_id="ghost").error_code == E.unknown_member_id
    assert call(coord, LEAVE, 2, group_id="g", member_id=a.member_id).error_code == E.none
    assert coord.describe("g")[:2] == (GroupState.EMPTY, 2)  # at once; an empty generation, as Kafka counts
    assert call(coord, LEAVE, 0, group_id="unknown", member_id="m").error_code == E.unknown_member_id


def test_initial_rebalance_delay_gathers_members_into_one_generation(topics: TopicManager) -> None:
    with make(topics, initial_rebalance_delay_ms=400) as coord:
        ids = [join(coord).member_id for _ in range(3)]
        t0 = time.monotonic()
        futures = [in_thread(join, coord, member=m) for m in ids]
        results = [f.result(5) for f in futures]
        assert {r.generation_id for r in results} == {1}
        assert sum(1 for r in results if r.members) == 1  # one leader
        assert 0.35 < time.monotonic() - t0 < 2.0


def test_close_answers_blocked_requests(topics: TopicManager) -> None:
    coord = make(topics)
    a = join_new(coord, rebalance_ms=30_000)
    b_id = join(coord).member_id
    waiting = in_thread(join, coord, member=b_id, rebalance_ms=30_000)  # waits for a to rejoin
    wait_state(coord, "g", GroupState.PREPARING_REBALANCE)
    time.sleep(0.1)
    t0 = time.monotonic()
    coord.close()
    assert waiting.result(5).error_code == E.coordinator_not_available
    assert time.monotonic() - t0 < 2
    coord.close()  # twice is fine
    assert a.error_code == E.none


def test_static_member_rejoining_takes_its_place_without_a_rebalance(coord: GroupCoordinator) -> None:
    first = join(coord, instance="consumer-1", version=5)  # static members get an id at once
    assert first.error_code == E.none and first.member_id.startswith("consumer-1-")
    sync(coord, first.member_id, 1, {first.member_id: b"mine"}, version=3)
    again = join(coord, instance="consumer-1")  # restarted: no member id
    assert again.error_code == E.none and again.member_id != first.member_id
    assert again.generation_id == 1 and again.skip_assignment  # same generation, no rebalance
    assert again.leader == first.member_id  # the old id: the client does not run an assignment
    assert coord.describe("g")[0] is GroupState.STABLE
    assert sync(coord, again.member_id, 1, version=3).assignment == b"mine"
    hb = call(coord, HEARTBEAT, 4, group_id="g", generation_id=1, member_id=first.member_id,
              group_instance_id="consumer-1")  # fmt: skip
    assert hb.error_code == E.fenced_instance_id


# -- DescribeGroups, ListGroups, DeleteGroups ------------------------------------------------------
def test_describe_list_and_delete(coord: GroupCoordinator) -> None:
    a = join_new(coord, group="g1")
    sync(coord, a.member_id, 1, {a.member_id: b"asg"}, group="g1")
    join_new(coord, group="g2")  # completing (no SyncGroup)
    d = call(coord, DESCRIBE, 5, groups=["g1", "g2", "none"], include_authorized_operations=False)
    g1, g2, none = d.groups
    assert (g1.error_code, g1.group_state, g1.protocol_type, g1.protocol_data) == (
        E.none,
        "Stable",
        "consumer",
        "range",
    )
    assert [(m.member_id, m.client_id, m.client_host, m.member_metadata, m.member_assignment) for m in g1.members] == [
        (a.member_id, "test-client", "/127.0.0.1", b"meta", b"asg")
    ]
    assert g2.group_state == "CompletingRebalance" and g2.members[0].member_assignment == b""
    assert (none.error_code, none.group_state) == (E.none, "Dead")
    assert call(coord, DESCRIBE, 6, groups=["none"]).groups[0].error_code == E.group_id_not_found
    listed = call(coord, LIST, 5, states_filter=[], types_filter=[])
    assert [(g.group_id, g.group_state, g.group_type) for g in listed.groups] == [
        ("g1", "Stable", "classic"),
        ("g2", "CompletingRebalance", "classic"),
    ]
    assert [g.group_id for g in call(coord, LIST, 4, states_filter=["stable"]).groups] == ["g1"]
    assert [g.group_id for g in call(coord, LIST, 0).groups] == ["g1", "g2"]
    r = call(coord, DELETE, 2, groups_names=["g1", "none"])
    assert [(x.group_id, x.error_code) for x in r.results] == [
        ("g1", E.non_empty_group),
        ("none", E.group_id_not_found),
    ]
    assert call(coord, LEAVE, 4, group_id="g1", members=[{"member_id": a.member_id}]).error_code == E.none
    wait_state(coord, "g1", GroupState.EMPTY)
    assert call(coord, DELETE, 0, groups_names=["g1"]).results[0].error_code == E.none
    assert coord.describe("g1")[0] is GroupState.DEAD
    assert coord.group_states() == {"Empty": 0, "PreparingRebalance": 0, "CompletingRebalance": 1, "Stable": 0}


def test_many_groups_in_parallel_do_not_wait_for_each_other(coord: GroupCoordinator) -> None:
    """A JoinGroup blocked in one group does not hold up another group's requests."""
    a, b, _gen = stable_pair(coord)
    c_id = join(coord).member_id
    blocked = in_thread(join, coord, member=c_id)  # waits for a and b
    wait_state(coord, "g", GroupState.PREPARING_REBALANCE)
    t0 = time.monotonic()
    results = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(join_new(coord, group=f"other{i}"))) for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(results) == 8 and all(r.error_code == E.none for r in results)
    assert time.monotonic() - t0 < 1.0 and not blocked.done()
    join(coord, member=a), join(coord, member=b)  # let it finish (a's join completes it)
    assert blocked.result(5).error_code == E.none


# -- every version of every response encodes ---------------------------------------------------------
@pytest.mark.parametrize("key", sorted(GroupCoordinator.VERSIONS))
def test_every_supported_version_has_kio_schemas(key: int) -> None:
    low, high = GroupCoordinator.VERSIONS[key]
    for v in range(low, high + 1):
        load_request_schema(key, v), load_response_schema(key, v)


@pytest.mark.parametrize("version", range(0, 10))
def test_join_and_sync_every_version(coord: GroupCoordinator, version: int) -> None:
    r = join(coord, group=f"v{version}", version=version)
    if r.error_code == E.member_id_required:
        r = join(coord, group=f"v{version}", member=r.member_id, version=version)
    assert r.error_code == E.none and r.generation_id == 1
    s = sync(coord, r.member_id, 1, {r.member_id: b"a"}, group=f"v{version}", version=min(version, 5))
    assert s.assignment == b"a"
    assert heartbeat(coord, r.member_id, 1, group=f"v{version}", version=min(version, 4)) == E.none
    for v in range(0, 7):
        call(coord, DESCRIBE, v, groups=[f"v{version}"])
    for v in range(0, 6):
        call(coord, LIST, v)


def test_metrics_carry_group_states_and_rebalances(coord: GroupCoordinator) -> None:
    from luxun.metrics import Metrics, status_page

    metrics = Metrics()
    assert "luxun_kafka_groups" not in metrics.render([])
    metrics.kafka_groups = coord
    a = join_new(coord)
    sync(coord, a.member_id, 1, {})
    join_new(coord, group="other")
    text = metrics.render([])
    assert 'luxun_kafka_groups{state="Stable"} 1' in text
    assert 'luxun_kafka_groups{state="CompletingRebalance"} 1' in text
    assert "luxun_kafka_group_rebalances_total 2" in text
    page = status_page([], metrics, "test")
    assert "Kafka consumer groups: 0 Empty, 0 PreparingRebalance, 1 CompletingRebalance, 1 Stable; 2 rebalances" in page


def test_empty_groups_are_forgotten_after_their_ttl(topics: TopicManager) -> None:
    with make(topics, empty_group_ttl_ms=300) as coord:
        a = join_new(coord)
        sync(coord, a.member_id, 1, {})
        assert call(coord, LEAVE, 0, group_id="g", member_id=a.member_id).error_code == E.none
        wait_state(coord, "g", GroupState.EMPTY)
        t0 = time.monotonic()
        while coord.group_states()["Empty"]:
            assert time.monotonic() - t0 < 3, "the empty group stayed in memory"
            time.sleep(0.05)
        assert time.monotonic() - t0 > 0.2
        assert coord.describe("g")[0] is GroupState.DEAD
        assert join_new(coord).generation_id == 1  # a new group under the same name


def test_many_members_joining_and_leaving_at_once(topics: TopicManager) -> None:
    """8 threads run the whole member cycle (join, sync, heartbeats, commit, leave) over
    and over in 2 groups for 3 s: every request is answered within its bound, every
    answer is one a member may get, and the groups end Empty."""
    import random

    topics.create_and_append("stress", [b"x"] * 10)
    allowed_join = {E.none, E.member_id_required, E.rebalance_in_progress, E.unknown_member_id}
    allowed_sync = {E.none, E.rebalance_in_progress, E.illegal_generation, E.unknown_member_id}
    allowed_heartbeat = {E.none, E.rebalance_in_progress, E.illegal_generation, E.unknown_member_id}
    errors: list[str] = []
    cycles = [0] * 8

    with make(topics) as coord:

        def member(i: int) -> None:
            rnd = random.Random(i)
            group = f"sg{i % 2}"
            stop = time.monotonic() + 3.0
            while time.monotonic() < stop:
                t0 = time.monotonic()
                r = join(coord, group, session_ms=500, rebalance_ms=1000)
                member_id = r.member_id
                if r.error_code == E.member_id_required:
                    r = join(coord, group, member_id, session_ms=500, rebalance_ms=1000)
                if time.monotonic() - t0 > 2.5:
                    errors.append(f"join took {time.monotonic() - t0:.1f} s")
                if r.error_code not in allowed_join:
                    errors.append(f"join: {r.error_code!r}")
                if r.error_code != E.none:
                    continue
                generation = r.generation_id
                assignments = {m.member_id: b"%d" % k for k, m in enumerate(r.members)}
                t0 = time.monotonic()
                s = sync(coord, member_id, generation, assignments, group=group)
                if time.monotonic() - t0 > 2.5:
                    errors.append(f"sync took {time.monotonic() - t0:.1f} s")
                if s.error_code not in allowed_sync:
                    errors.append(f"sync: {s.error_code!r}")
                for _ in range(rnd.randrange(4)):
                    code = heartbeat(coord, member_id, generation, group=group)
                    if code not in allowed_heartbeat:
                        errors.append(f"heartbeat: {code!r}")
                    if code != E.none:
                        break
                    time.sleep(rnd.random() * 0.05)
                c = call(coord, COMMIT, 8, group_id=group, generation_id_or_member_epoch=generation,
                         member_id=member_id, topics=[{"name": "stress", "partitions": [
                             {"partition_index": 0, "committed_offset": rnd.randrange(10)}]}])  # fmt: skip
                code = c.topics[0].partitions[0].error_code
                if code not in allowed_sync:
                    errors.append(f"commit: {code!r}")
                if rnd.random() < 0.7:
                    left = call(coord, LEAVE, 0, group_id=group, member_id=member_id).error_code
                    if left not in (E.none, E.unknown_member_id):
                        errors.append(f"leave: {left!r}")
                cycles[i] += 1

        threads = [threading.Thread(target=member, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert not any(t.is_alive() for t in threads), "a member thread hung"
        assert errors == []
        assert all(n > 0 for n in cycles), cycles
        print("member cycles per thread:", cycles)
        # members that did not leave time out (500 ms sessions); the groups end Empty
        for g in ("sg0", "sg1"):
            wait_state(coord, g, GroupState.EMPTY, timeout_s=5)


def test_a_session_over_by_now_is_over_for_describe_delete_and_offset_delete(topics: TopicManager) -> None:
    """A member whose session ended (no heartbeat for its session timeout) is gone for
    the next DescribeGroups, DeleteGroups or OffsetDelete, as Kafka's timer removes it at
    its deadline, not at the background thread's next pass (every 0.1 s). librdkafka's
    0081 closes static members and deletes their groups exactly one session later."""
    now = [1000.0]
    with make(topics, clock=lambda: now[0]) as coord:
        for group in ("described", "deleted", "offsets"):
            a = join(coord, group, session_ms=1000, instance=f"{group}-1")  # static: an id at once
            assert a.error_code == E.none and a.generation_id == 1
            assert sync(coord, a.member_id, 1, {a.member_id: b"all"}, group=group).error_code == E.none
        now[0] += 1.001  # the thread's pass is up to 0.1 s (real time) away: not waited for
        described = call(coord, DESCRIBE, 5, groups=["described"], include_authorized_operations=False).groups[0]
        assert (described.group_state, described.members) == ("Empty", ())
        assert call(coord, DELETE, 2, groups_names=["deleted"]).results[0].error_code == E.none
        deleted = call(coord, 47, 0, group_id="offsets", topics=[])
        assert deleted.error_code == E.none
