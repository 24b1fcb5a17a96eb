"""The group coordinator of the Kafka port: Kafka's classic consumer-group protocol.

Every group's coordinator is this broker (FindCoordinator answers the node, host and
port given to :class:`GroupCoordinator`). A group goes through Kafka's states:

``Empty``
    no members (new, or all left); offsets may still be committed by "simple"
    consumers (generation -1).
``PreparingRebalance``
    a member joined, left, changed its protocols or timed out: every known member must
    (re)send JoinGroup; the JoinGroups wait (block their connection's thread) until
    all members have joined, or until the rebalance timeout (the largest of the
    members') when the ones missing are removed. An empty group waits
    ``initial_rebalance_delay_ms`` more for others (Kafka's
    group.initial.rebalance.delay.ms; 3000 ms by default, as Kafka: a lone consumer
    of a new group starts after it).
``CompletingRebalance``
    the JoinGroups are answered with a new generation; the leader (the first member to
    join) gets every member's metadata for the protocol chosen (one every member
    supports, by their votes: each member's first choice among them), computes the
    assignment and sends it in its SyncGroup; the other members' SyncGroups wait for
    it. Members that do not send SyncGroup within the rebalance timeout are removed
    and the group rebalances again.
``Stable``
    members heartbeat; a member whose session timeout passes without a heartbeat
    is removed and the group rebalances (so its partitions move to the others within
    its session timeout plus one heartbeat interval of theirs).
``Dead``
    unknown: deleted (DeleteGroups, with its offsets) or never seen. An Empty group
    without members is forgotten (from memory; its offsets stay) after
    ``empty_group_ttl_ms`` without requests, so memory holds the groups in use only;
    one that never had a generation (its only JoinGroup got a member id that never
    came back: dropped after that JoinGroup's session timeout) is forgotten at once.

Bounds (docs/groups.md): at most ``max_groups`` groups in memory (a JoinGroup that
would make one more is answered GROUP_MAX_SIZE_REACHED: the one Kafka code that says a
group limit of the coordinator is reached, and clients hand it to the application
rather than retry it for ever); an Empty group's committed offsets are deleted
``offsets_retention_ms`` after it became empty or was last committed to, whichever is
later (Kafka's offsets.retention.minutes), checked every
``offsets_retention_check_interval_ms``. The retention clock runs for the groups the
Kafka door committed to or emptied since the broker started; a group whose committed
page was written since (a Thrift ``commitOffset``: the page's modification time) is
kept, so a group Thrift consumers took over is not expired under them.

A JoinGroup without a member id (v4+) gets a new one with MEMBER_ID_REQUIRED and must
join again with it (KIP-394); members with a ``group.instance.id`` (static members,
KIP-345) get one at once, and one that rejoins under a new member id takes over the
old one's place (the old id is fenced: FENCED_INSTANCE_ID), without a rebalance when
the group is stable and its protocols have not changed.

Error codes are Kafka's, case by case as Kafka's GroupCoordinator answers them.
Committed offsets are kept by :class:`~luxun.kafka.offsets.OffsetStore` on the
topics' committed positions (so they survive a restart); group membership is in
memory (a restarted broker starts every group Empty: the consumers rejoin).
The new consumer protocol (KIP-848, ConsumerGroupHeartbeat) is not in
:attr:`GroupCoordinator.VERSIONS`, so ApiVersions does not announce it and clients use
this one (as with a Kafka broker that has it disabled); a ConsumerGroupHeartbeat
handed to :meth:`GroupCoordinator.handle` anyway is answered UNSUPPORTED_VERSION.

Thread-safety: :meth:`GroupCoordinator.handle` is called from any connection's
thread. Each group has its own lock (a Condition its blocked JoinGroups and SyncGroups
wait on, with a bound); nothing holds a lock another group needs. A background thread
expires sessions and ends rebalances whose time is up; :meth:`GroupCoordinator.close`
stops it and answers every waiting request.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar, Final

from kio.schema.errors import ErrorCode

from ..config import (
    DEFAULT_MAX_GROUPS,
    DEFAULT_OFFSETS_RETENTION_CHECK_INTERVAL_MS,
    DEFAULT_OFFSETS_RETENTION_MINUTES,
)
from ..logs import RateLimitedLog
from ..topics import TopicManager
from .group_admin import GroupAdmin
from .membership import Group, GroupLimitError, GroupState, Member, Waiter, ms_of, set_timeouts, valid_group_id
from .offsets import OffsetStore
from .protocol import build, response_schema

__all__ = ["GroupCoordinator", "GroupState"]

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

#: Kafka's defaults (group.min.session.timeout.ms, group.max.session.timeout.ms).
DEFAULT_MIN_SESSION_TIMEOUT_MS: Final = 6000
DEFAULT_MAX_SESSION_TIMEOUT_MS: Final = 1_800_000
#: group.initial.rebalance.delay.ms (Kafka's default).
DEFAULT_INITIAL_REBALANCE_DELAY_MS: Final = 3000
#: How long an Empty group without members stays in memory after its last request.
DEFAULT_EMPTY_GROUP_TTL_MS: Final = 300_000
#: How often the background thread looks for expired sessions and rebalances (s).
TICK_S: Final = 0.1

# API keys
FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 10, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, OFFSET_COMMIT, OFFSET_FETCH, DELETE_GROUPS = 15, 16, 8, 9, 42
CONSUMER_GROUP_HEARTBEAT = 68
OFFSET_DELETE = 47

_E = ErrorCode


class GroupCoordinator(GroupAdmin):
    """Kafka's group coordinator over a :class:`~luxun.topics.TopicManager`.

    Args:
        topics: the broker's topics (committed offsets live on them).
        node_id, host, port: this broker as FindCoordinator names it (the Kafka port's
            advertised address).
        min_session_timeout_ms, max_session_timeout_ms: the session timeouts a member
            may ask for (INVALID_SESSION_TIMEOUT outside).
        initial_rebalance_delay_ms: how long an empty group's first rebalance waits for
            more members (Kafka's group.initial.rebalance.delay.ms).
        empty_group_ttl_ms: an Empty group without members is forgotten (from memory;
            its committed offsets stay) after this long without a request, so memory
            stays bounded by the groups in use.
        max_groups: the most groups kept in memory (a JoinGroup for one more:
            GROUP_MAX_SIZE_REACHED).
        offsets_retention_ms: an Empty group's committed offsets are deleted this long
            after it became empty (or its last commit, if later).
        offsets_retention_check_interval_ms: how often expired offsets are looked for.
        clock: monotonic seconds (tests may pass their own).
    """

    #: API key -> (min, max) version handled (what ApiVersions may advertise).
    VERSIONS: ClassVar[dict[int, tuple[int, int]]] = {
        OFFSET_COMMIT: (2, 9),  # v10 names topics by id
        OFFSET_FETCH: (1, 9),  # v10 names topics by id
        FIND_COORDINATOR: (0, 6),
        JOIN_GROUP: (0, 9),
        HEARTBEAT: (0, 4),
        LEAVE_GROUP: (0, 5),
        SYNC_GROUP: (0, 5),
        DESCRIBE_GROUPS: (0, 6),
        LIST_GROUPS: (0, 5),
        DELETE_GROUPS: (0, 2),
        OFFSET_DELETE: (0, 0),
    }
    #: API key -> versions :meth:`handle` takes but answers with an error
    #: (UNSUPPORTED_VERSION): not to be advertised by ApiVersions.
    REFUSED_VERSIONS: ClassVar[dict[int, tuple[int, int]]] = {CONSUMER_GROUP_HEARTBEAT: (0, 1)}

    def __init__(
        self,
        topics: TopicManager,
        *,
        node_id: int,
        host: str,
        port: int,
        min_session_timeout_ms: int = DEFAULT_MIN_SESSION_TIMEOUT_MS,
        max_session_timeout_ms: int = DEFAULT_MAX_SESSION_TIMEOUT_MS,
        initial_rebalance_delay_ms: int = DEFAULT_INITIAL_REBALANCE_DELAY_MS,
        empty_group_ttl_ms: int = DEFAULT_EMPTY_GROUP_TTL_MS,
        max_groups: int = DEFAULT_MAX_GROUPS,
        offsets_retention_ms: int = DEFAULT_OFFSETS_RETENTION_MINUTES * 60_000,
        offsets_retention_check_interval_ms: int = DEFAULT_OFFSETS_RETENTION_CHECK_INTERVAL_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.offsets = OffsetStore(topics)
        self.node_id = node_id
        self.host = host
        self.port = port
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.initial_rebalance_delay_s = initial_rebalance_delay_ms / 1000
        self.empty_group_ttl_s = empty_group_ttl_ms / 1000
        self.max_groups = max_groups
        self.offsets_retention_s = offsets_retention_ms / 1000
        self.offsets_retention_check_s = offsets_retention_check_interval_ms / 1000
        self.clock = clock
        self._lock = threading.Lock()  # guards _groups and _empty_since
        self._groups: dict[str, Group] = {}
        #: Group id -> when (clock) it was last seen empty by a commit or a member's
        #: leaving: the groups whose offsets may expire.
        self._empty_since: dict[str, float] = {}
        self._next_retention_check = clock() + self.offsets_retention_check_s
        #: Committed offsets of empty groups deleted by retention, all groups.
        self.expired_total = 0
        self._closed = threading.Event()
        #: Rebalances completed (a new generation), all groups.
        self.rebalances_total = 0
        self._handlers: dict[int, Callable[..., dict[str, Any]]] = {
            FIND_COORDINATOR: self._find_coordinator,
            JOIN_GROUP: self._join_group,
            HEARTBEAT: self._heartbeat,
            LEAVE_GROUP: self._leave_group,
            SYNC_GROUP: self._sync_group,
            DESCRIBE_GROUPS: self._describe_groups,
            LIST_GROUPS: self._list_groups,
            OFFSET_COMMIT: self._offset_commit,
            OFFSET_FETCH: self._offset_fetch,
            DELETE_GROUPS: self._delete_groups,
            OFFSET_DELETE: self._offset_delete,
            CONSUMER_GROUP_HEARTBEAT: self._consumer_group_heartbeat,
        }
        self._reaper = threading.Thread(target=self._reap, name="kafka-group-coordinator", daemon=True)
        self._reaper.start()

    # -- the dispatcher's entry point ------------------------------------------------------
    def handle(self, api_key: int, version: int, request: Any, *, client_id: str | None, client_host: str) -> Any:
        """The response (a kio entity of ``version``) to ``request`` (a kio entity of
        API ``api_key`` at ``version``). JoinGroup and SyncGroup may block up to the
        group's rebalance timeout.

        Raises:
            ValueError: ``api_key`` is not one this coordinator handles.
        """
        values = self.answer(api_key, version, request, client_id=client_id, client_host=client_host)
        return build(response_schema(api_key, version), **values)

    def answer(
        self, api_key: int, version: int, request: Any, *, client_id: str | None, client_host: str
    ) -> dict[str, Any]:
        """:meth:`handle`'s response as plain values (for :func:`~luxun.kafka.protocol.build`),
        so a caller may change them first (the ACL checks of :mod:`luxun.kafka.group_acls`)."""
        handler = self._handlers.get(api_key)
        if handler is None:
            raise ValueError(f"the group coordinator does not handle API key {api_key}")
        if not client_host.startswith("/"):  # as Kafka shows it (InetAddress.toString)
            client_host = "/" + client_host
        return handler(request, version, client_id or "", client_host)

    def close(self) -> None:
        """Stop the background thread and answer every waiting JoinGroup and SyncGroup
        (COORDINATOR_NOT_AVAILABLE: the client looks for the coordinator again).
        Idempotent."""
        self._closed.set()
        for group in self._all_groups():
            with group.cond:
                group.cond.notify_all()
        if self._reaper.is_alive() and self._reaper is not threading.current_thread():
            self._reaper.join(timeout=5)

    def __enter__(self) -> GroupCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the metrics read -------------------------------------------------------------
    def group_states(self) -> dict[str, int]:
        """Groups known in memory, by state (every state listed)."""
        counts = dict.fromkeys((s.value for s in GroupState if s is not GroupState.DEAD), 0)
        for group in self._all_groups():
            counts[group.state.value] = counts.get(group.state.value, 0) + 1
        return counts

    def describe(self, group_id: str) -> tuple[GroupState, int, list[str]]:
        """``(state, generation, member ids)`` of a group (Dead if unknown): for tests
        and status pages."""
        with self._locked(group_id) as group:
            if group is None:
                return GroupState.DEAD, -1, []
            return group.state, group.generation, list(group.members)

    # -- FindCoordinator ---------------------------------------------------------------------
    def _find_coordinator(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        key_type = getattr(request, "key_type", 0)
        keys = getattr(request, "coordinator_keys", None)
        if keys is None:
            keys = (getattr(request, "key", ""),)

        def answer(key: str) -> dict[str, Any]:
            if key_type not in (0, 1):
                return {"key": key, "error_code": _E.invalid_request, "node_id": -1, "host": "", "port": -1,
                        "error_message": f"coordinator key type {key_type} is not supported"}  # fmt: skip
            return {"key": key, "error_code": _E.none, "node_id": self.node_id, "host": self.host, "port": self.port}

        answers = [answer(k) for k in keys]
        if version >= 4:
            return {"coordinators": answers}
        return answers[0]

    # -- JoinGroup -----------------------------------------------------------------------------
    def _join_group(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        values = self._join(request, version, client_id, client_host)
        if values["protocol_name"] is None and version < 7:  # not nullable before v7
            values = values | {"protocol_name": ""}
        return values

    def _join(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        group_id = request.group_id
        member_id = request.member_id or ""
        session_ms = ms_of(request.session_timeout)
        rebalance_ms = ms_of(getattr(request, "rebalance_timeout", None)) if version >= 1 else session_ms
        if rebalance_ms < 0:
            rebalance_ms = session_ms

        def error(code: ErrorCode) -> dict[str, Any]:
            return _join_error(code, member_id)

        if not valid_group_id(group_id):
            return error(_E.invalid_group_id)
        if not self.min_session_timeout_ms <= session_ms <= self.max_session_timeout_ms:
            return error(_E.invalid_session_timeout)
        if self._closed.is_set():
            return error(_E.coordinator_not_available)
        try:
            with self._locked(group_id, create=not member_id, limited=True) as group:
                return self._join_locked(group, request, version, client_id, client_host, session_ms, rebalance_ms)
        except GroupLimitError:
            _limited.warning(
                "max-groups",
                "JoinGroup of new group %r refused: the coordinator holds max.groups = %d groups",
                group_id,
                self.max_groups,
            )
            return error(_E.group_max_size_reached)

    def _join_locked(
        self,
        group: Group | None,
        request: Any,
        version: int,
        client_id: str,
        client_host: str,
        session_ms: int,
        rebalance_ms: int,
    ) -> dict[str, Any]:
        member_id = request.member_id or ""
        instance_id = getattr(request, "group_instance_id", None)
        protocols = [(p.name, bytes(p.metadata)) for p in request.protocols]

        def error(code: ErrorCode, member: str = member_id) -> dict[str, Any]:
            return _join_error(code, member)

        if group is None:
            return error(_E.unknown_member_id)
        now = self.clock()
        if group.state is GroupState.DEAD:
            return error(_E.coordinator_not_available)
        if not member_id:
            if not group.supports(request.protocol_type, protocols):
                return error(_E.inconsistent_group_protocol)
            new_id = f"{instance_id or client_id}-{uuid.uuid4()}"
            if instance_id is not None and instance_id in group.static:
                old = group.members[group.static[instance_id]]
                set_timeouts(old, session_ms, rebalance_ms)
                result = self._join_static_again(group, old, new_id, protocols, now)
                if isinstance(result, dict):
                    return result
                waiter = result
            elif instance_id is None and version >= 4:
                group.pending[new_id] = now + session_ms / 1000
                return error(_E.member_id_required, new_id)
            else:
                member = Member(new_id, instance_id, client_id, client_host)
                set_timeouts(member, session_ms, rebalance_ms)
                waiter = self._add_member(group, member, request.protocol_type, protocols, now)
        elif member_id in group.pending:
            if instance_id is not None:
                return error(_E.invalid_request)
            del group.pending[member_id]
            if not group.supports(request.protocol_type, protocols):
                return error(_E.inconsistent_group_protocol)
            member = Member(member_id, None, client_id, client_host)
            set_timeouts(member, session_ms, rebalance_ms)
            waiter = self._add_member(group, member, request.protocol_type, protocols, now)
        else:
            if group.fenced(member_id, instance_id):
                return error(_E.fenced_instance_id)
            member_or_none = group.members.get(member_id)
            if member_or_none is None or (instance_id is not None and instance_id not in group.static):
                return error(_E.unknown_member_id)
            member = member_or_none
            if not group.supports(request.protocol_type, protocols):
                return error(_E.inconsistent_group_protocol)
            set_timeouts(member, session_ms, rebalance_ms)
            member.heartbeat_s = now
            state = group.state
            if state is GroupState.PREPARING_REBALANCE:
                waiter = self._update_member(group, member, protocols, now)
            elif state is GroupState.COMPLETING_REBALANCE:
                if member.same_protocols(protocols):
                    return self._join_result(group, member)
                waiter = self._update_member(group, member, protocols, now)
            elif state is GroupState.STABLE:
                if group.is_leader(member_id) or not member.same_protocols(protocols):
                    waiter = self._update_member(group, member, protocols, now)
                else:
                    return self._join_result(group, member)
            else:
                return error(_E.unknown_member_id)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group, now)
        return self._wait(group, waiter, _join_error(_E.coordinator_not_available, member_id))

    def _add_member(
        self, group: Group, member: Member, protocol_type: str, protocols: list[tuple[str, bytes]], now: float
    ) -> Waiter:
        member.protocol_type = protocol_type
        member.protocols = protocols
        member.heartbeat_s = now
        member.join = Waiter()
        if not group.members:
            group.protocol_type = protocol_type
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.static[member.instance_id] = member.member_id
        if group.leader is None:
            group.leader = member.member_id
        if group.state is GroupState.PREPARING_REBALANCE and group.initial_delay_until_s:
            group.initial_delay_until_s = min(now + self.initial_rebalance_delay_s, group.initial_delay_limit_s)
        self._maybe_prepare_rebalance(group, now, f"member {member.member_id} joined")
        return member.join

    def _update_member(self, group: Group, member: Member, protocols: list[tuple[str, bytes]], now: float) -> Waiter:
        member.protocols = protocols
        if member.join is not None:  # a JoinGroup of this member still waiting (a retry elsewhere)
            member.join.result = _join_error(_E.rebalance_in_progress, member.member_id)
            group.cond.notify_all()
        member.join = Waiter()
        self._maybe_prepare_rebalance(group, now, f"member {member.member_id} rejoined")
        return member.join

    def _join_static_again(
        self, group: Group, member: Member, new_id: str, protocols: list[tuple[str, bytes]], now: float
    ) -> Waiter | dict[str, Any]:
        """A static member joins under a new member id: it takes the old one's place
        (whatever the old id still waits for is answered FENCED_INSTANCE_ID)."""
        old_id = member.member_id
        old_leader = group.leader
        del group.members[old_id]
        if member.join is not None:
            member.join.result = _join_error(_E.fenced_instance_id, old_id)
        if member.sync is not None:
            member.sync.result = _sync_error(_E.fenced_instance_id)
        member.join = member.sync = None
        group.cond.notify_all()
        member.member_id = new_id
        group.members[new_id] = member
        assert member.instance_id is not None
        group.static[member.instance_id] = new_id
        if group.leader == old_id:
            group.leader = new_id
        if old_id in group.pending_sync:
            group.pending_sync.discard(old_id)
            group.pending_sync.add(new_id)
        member.heartbeat_s = now
        if group.state is GroupState.STABLE and member.same_protocols(protocols):
            # As Kafka: the leader id answered is the old one, so a leader that rejoins does
            # not take itself for the leader and run an assignment nobody would get
            # (v9+ says so with skip_assignment).
            result = self._join_result(group, member)
            result["leader"] = old_leader or ""
            result["skip_assignment"] = group.is_leader(new_id)
            return result
        if group.state is GroupState.EMPTY:
            return _join_error(_E.unknown_member_id, new_id)
        return self._update_member(group, member, protocols, now)

    def _join_result(self, group: Group, member: Member) -> dict[str, Any]:
        leader = group.is_leader(member.member_id)
        members = (
            [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.instance_id,
                    "metadata": m.metadata(group.protocol_name),
                }
                for m in group.members.values()
            ]
            if leader
            else []
        )
        return {
            "error_code": _E.none,
            "generation_id": group.generation,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol_name,
            "leader": group.leader or "",
            "skip_assignment": False,
            "member_id": member.member_id,
            "members": members,
        }

    # -- rebalancing (every method below runs under the group's lock) -------------------------
    def _maybe_prepare_rebalance(self, group: Group, now: float, reason: str) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance(group, now, reason)

    def _prepare_rebalance(self, group: Group, now: float, reason: str) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:  # waiting SyncGroups: rejoin
            for m in group.members.values():
                m.assignment = b""
                if m.sync is not None:
                    m.sync.result = _sync_error(_E.rebalance_in_progress)
                    m.sync = None
            group.cond.notify_all()
        group.pending_sync.clear()
        timeout = group.rebalance_timeout_s()
        if group.state is GroupState.EMPTY and self.initial_rebalance_delay_s > 0:
            group.initial_delay_until_s = now + self.initial_rebalance_delay_s
            group.initial_delay_limit_s = now + max(timeout, self.initial_rebalance_delay_s)
        else:
            group.initial_delay_until_s = 0.0
        group.rebalance_deadline_s = now + timeout
        log.info("group %r: preparing to rebalance (generation %d, %s)", group.group_id, group.generation, reason)
        group.state = GroupState.PREPARING_REBALANCE

    def _maybe_complete_join(self, group: Group, now: float) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        delayed = group.initial_delay_until_s and now < group.initial_delay_until_s
        if (group.all_joined() and not delayed) or now >= group.rebalance_deadline_s:
            self._complete_join(group, now)

    def _complete_join(self, group: Group, now: float) -> None:
        """End the join phase: drop members that did not rejoin, start a generation,
        answer the waiting JoinGroups."""
        for m in [m for m in group.members.values() if m.join is None]:
            log.info("group %r: member %s did not rejoin in time; removed", group.group_id, m.member_id)
            self._remove(group, m)
        group.pending.clear()
        group.initial_delay_until_s = 0.0
        group.generation += 1
        group.rebalances += 1
        self.rebalances_total += 1
        if not group.members:
            group.protocol_name = None
            group.state = GroupState.EMPTY
            self._note_empty(group.group_id, now)
            log.info("group %r: generation %d is empty", group.group_id, group.generation)
            group.cond.notify_all()
            return
        group.protocol_name = group.select_protocol()
        group.state = GroupState.COMPLETING_REBALANCE
        group.pending_sync = set(group.members)
        group.sync_deadline_s = now + group.rebalance_timeout_s()
        log.info(
            "group %r: generation %d with %d members, protocol %s, leader %s",
            group.group_id,
            group.generation,
            len(group.members),
            group.protocol_name,
            group.leader,
        )
        for m in group.members.values():
            assert m.join is not None
            m.join.result = self._join_result(group, m)
            m.join = None
            m.heartbeat_s = now
        group.cond.notify_all()

    def _remove(self, group: Group, member: Member) -> None:
        """Take ``member`` out of ``group`` (its waiting requests get UNKNOWN_MEMBER_ID)."""
        if member.join is not None:
            member.join.result = _join_error(_E.unknown_member_id, member.member_id)
        if member.sync is not None:
            member.sync.result = _sync_error(_E.unknown_member_id)
        member.join = member.sync = None
        group.cond.notify_all()
        del group.members[member.member_id]
        if member.instance_id is not None and group.static.get(member.instance_id) == member.member_id:
            del group.static[member.instance_id]
        group.pending_sync.discard(member.member_id)
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), None)

    def _remove_and_rebalance(self, group: Group, member: Member, now: float, reason: str) -> None:
        self._remove(group, member)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now, reason)
        self._maybe_complete_join(group, now)  # at once when no member is left to wait for

    def _tick(self, group: Group, now: float) -> None:
        """Expire sessions, pending member ids and SyncGroups not sent in time; end a
        join phase whose time is up."""
        for member_id, expiry in list(group.pending.items()):
            if now >= expiry:
                del group.pending[member_id]
        for m in list(group.members.values()):
            expired = m.join is None and m.sync is None and now >= m.heartbeat_s + m.session_timeout_s
            if expired and m.member_id in group.members:
                log.info(
                    "group %r: member %s missed its session timeout (%.0f ms); removed",
                    group.group_id,
                    m.member_id,
                    m.session_timeout_s * 1000,
                )
                self._remove_and_rebalance(group, m, now, f"member {m.member_id} timed out")
        if (
            group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
            and group.pending_sync
            and now >= group.sync_deadline_s
        ):
            late = [group.members[i] for i in group.pending_sync if i in group.members]
            for m in late:
                log.info("group %r: member %s sent no SyncGroup in time; removed", group.group_id, m.member_id)
                self._remove(group, m)
            group.pending_sync.clear()
            self._prepare_rebalance(group, now, "members did not sync in time")
        self._maybe_complete_join(group, now)

    def _next_deadline(self, group: Group) -> float:
        deadlines = [m.heartbeat_s + m.session_timeout_s for m in group.members.values()]
        deadlines.extend(group.pending.values())
        if group.state is GroupState.PREPARING_REBALANCE:
            deadlines.append(group.rebalance_deadline_s)
            if group.initial_delay_until_s:
                deadlines.append(group.initial_delay_until_s)
        elif group.pending_sync:
            deadlines.append(group.sync_deadline_s)
        return min(deadlines, default=float("inf"))

    def _wake_time(self, group: Group) -> float:
        """When the background thread must look at ``group`` next: its next deadline,
        or when it may be forgotten."""
        wake = self._next_deadline(group)
        if group.state is GroupState.EMPTY and not group.members and not group.pending:
            wake = min(wake, group.touched_s + self.empty_group_ttl_s)
        return wake

    # -- retention of committed offsets (Kafka's offsets.retention.minutes) ----------------------
    def _note_empty(self, group_id: str, now: float) -> None:
        """``group_id`` is empty at ``now`` (its last member left, or a commit without
        members): its offsets expire ``offsets_retention_s`` later unless it is used."""
        with self._lock:
            self._empty_since[group_id] = now

    def _forget_empty(self, group_id: str) -> None:
        with self._lock:
            self._empty_since.pop(group_id, None)

    def expire_offsets(self) -> list[str]:
        """Delete the committed offsets of every group empty for ``offsets_retention_s``
        (none of its committed pages written meanwhile, by either door); the groups
        deleted. Called by the background thread every
        ``offsets_retention_check_interval_ms``; tests may call it."""
        now = self.clock()
        with self._lock:
            due = [g for g, since in self._empty_since.items() if now - since >= self.offsets_retention_s]
        expired = []
        for group_id in due:
            with self._locked(group_id, create=True) as group:
                assert group is not None
                if group.members or group.pending:  # in use again: noted when it empties
                    self._forget_empty(group_id)
                    continue
                age = self.offsets.last_commit_age_s(group_id)
                if age is None:  # no offsets left (deleted, or its topics)
                    self._forget_empty(group_id)
                    continue
                if age < self.offsets_retention_s:  # written since (a Thrift commit): counts as use
                    self._note_empty(group_id, now - age)
                    continue
                self.offsets.delete_group(group_id)
                self._forget_empty(group_id)
                if group.state is GroupState.EMPTY:
                    self._evict(group)
            self.expired_total += 1
            expired.append(group_id)
            log.info(
                "group %r: committed offsets deleted, the group was empty for %.0f min (offsets.retention.minutes)",
                group_id,
                self.offsets_retention_s / 60,
            )
        return expired

    def _wait(self, group: Group, waiter: Waiter, closed: dict[str, Any]) -> dict[str, Any]:
        """Wait (the group's lock held, released while waiting) until ``waiter`` is
        answered; ``closed`` when the coordinator closes first."""
        while waiter.result is None:
            if self._closed.is_set():
                return closed
            now = self.clock()
            self._tick(group, now)
            if waiter.result is not None:
                break
            group.cond.wait(timeout=min(max(self._next_deadline(group) - now, 0.01), 1.0))
        return waiter.result

    def _reap(self) -> None:
        while not self._closed.wait(TICK_S):
            now = self.clock()
            if now >= self._next_retention_check:
                self._next_retention_check = now + self.offsets_retention_check_s
                try:
                    self.expire_offsets()
                except Exception:  # never let the thread die
                    _limited.exception("retention", "expiring committed offsets failed")
            for group in self._all_groups():
                if group.wake_s > now:  # nothing due (most groups, most of the time)
                    continue
                try:
                    with group.cond:
                        now = self.clock()
                        self._tick(group, now)
                        idle = group.state is GroupState.EMPTY and not group.members and not group.pending
                        if idle and (group.generation == 0 or now - group.touched_s >= self.empty_group_ttl_s):
                            self._evict(group)
                        group.wake_s = self._wake_time(group)
                except Exception:  # never let the thread die: sessions would stop expiring
                    _limited.exception("reap", "group %r: expiring sessions failed", group.group_id)

    # -- SyncGroup -------------------------------------------------------------------------------
    def _sync_group(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        if not valid_group_id(request.group_id):
            return _sync_error(_E.invalid_group_id)
        member_id = request.member_id
        with self._locked(request.group_id) as group:
            if group is None:
                return _sync_error(_E.unknown_member_id)
            now = self.clock()
            self._tick(group, now)
            error = self._check_member(
                group, member_id, getattr(request, "group_instance_id", None), request.generation_id
            )
            if error is not None:
                return _sync_error(error)
            protocol_type = getattr(request, "protocol_type", None)
            protocol_name = getattr(request, "protocol_name", None)
            if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol_name is not None and protocol_name != group.protocol_name
            ):
                return _sync_error(_E.inconsistent_group_protocol)
            member = group.members[member_id]
            state = group.state
            if state is GroupState.EMPTY:
                return _sync_error(_E.unknown_member_id)
            if state is GroupState.PREPARING_REBALANCE:
                return _sync_error(_E.rebalance_in_progress)
            group.pending_sync.discard(member_id)
            member.heartbeat_s = now
            if state is GroupState.STABLE:
                return self._sync_result(group, member)
            # CompletingRebalance
            if member.sync is not None:
                member.sync.result = _sync_error(_E.rebalance_in_progress)
            waiter = member.sync = Waiter()
            if group.is_leader(member_id):
                given = {a.member_id: bytes(a.assignment) for a in request.assignments}
                for m in group.members.values():
                    m.assignment = given.get(m.member_id, b"")
                group.state = GroupState.STABLE
                log.info("group %r: generation %d is stable", group.group_id, group.generation)
                for m in group.members.values():
                    if m.sync is not None:
                        m.sync.result = self._sync_result(group, m)
                        m.sync = None
                group.cond.notify_all()
            return self._wait(group, waiter, _sync_error(_E.coordinator_not_available))

    @staticmethod
    def _sync_result(group: Group, member: Member) -> dict[str, Any]:
        return {
            "error_code": _E.none,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol_name,
            "assignment": member.assignment,
        }

    def _check_member(self, group: Group, member_id: str, instance_id: str | None, generation: int) -> ErrorCode | None:
        """The error of a request of a member of ``group`` in ``generation`` (Kafka's
        order of checks), None if it may go on."""
        if group.state is GroupState.DEAD:
            return _E.coordinator_not_available
        if group.fenced(member_id, instance_id):
            return _E.fenced_instance_id
        if member_id not in group.members:
            return _E.unknown_member_id
        if generation != group.generation:
            return _E.illegal_generation
        return None

    # -- Heartbeat -------------------------------------------------------------------------------
    def _heartbeat(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        if not valid_group_id(request.group_id):
            return {"error_code": _E.invalid_group_id}
        with self._locked(request.group_id) as group:
            if group is None:
                return {"error_code": _E.unknown_member_id}
            now = self.clock()
            self._tick(group, now)
            if group.state is GroupState.EMPTY:
                return {"error_code": _E.unknown_member_id}
            error = self._check_member(
                group, request.member_id, getattr(request, "group_instance_id", None), request.generation_id
            )
            if error is not None:
                return {"error_code": error}
            group.members[request.member_id].heartbeat_s = now
            if group.state is GroupState.PREPARING_REBALANCE:
                return {"error_code": _E.rebalance_in_progress}
            return {"error_code": _E.none}

    # -- LeaveGroup ------------------------------------------------------------------------------
    def _leave_group(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        leaving = getattr(request, "members", None)
        if leaving is None:
            identities: list[tuple[str, str | None]] = [(request.member_id, None)]
        else:
            identities = [(m.member_id, m.group_instance_id) for m in leaving]
        if not valid_group_id(request.group_id):
            return {"error_code": _E.invalid_group_id, "members": []}
        with self._locked(request.group_id) as group:
            if group is None:
                codes = [_E.unknown_member_id] * len(identities)
            else:
                if group.state is GroupState.DEAD:
                    return {"error_code": _E.coordinator_not_available, "members": []}
                now = self.clock()
                codes = [self._leave(group, mid, iid, now) for mid, iid in identities]
        if version < 3:
            return {"error_code": codes[0]}
        return {
            "error_code": _E.none,
            "members": [
                {"member_id": mid, "group_instance_id": iid, "error_code": code}
                for (mid, iid), code in zip(identities, codes, strict=True)
            ],
        }

    def _leave(self, group: Group, member_id: str, instance_id: str | None, now: float) -> ErrorCode:
        if instance_id is not None:
            current = group.static.get(instance_id)
            if current is None:
                return _E.unknown_member_id
            if member_id and member_id != current:
                return _E.fenced_instance_id
            member_id = current
        if member_id in group.pending:
            del group.pending[member_id]
            self._maybe_complete_join(group, now)
            return _E.none
        member = group.members.get(member_id)
        if member is None:
            return _E.unknown_member_id
        log.info("group %r: member %s left", group.group_id, member_id)
        self._remove_and_rebalance(group, member, now, f"member {member_id} left")
        return _E.none

    # -- ConsumerGroupHeartbeat (KIP-848) --------------------------------------------------------
    def _consumer_group_heartbeat(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        return {
            "error_code": _E.unsupported_version,
            "error_message": "the consumer group protocol (KIP-848) is not supported: use group.protocol=classic",
            "member_id": None,
            "member_epoch": -1,
        }


def _join_error(code: ErrorCode, member_id: str) -> dict[str, Any]:
    return {
        "error_code": code,
        "generation_id": -1,
        "protocol_type": None,
        "protocol_name": None,
        "leader": "",
        "skip_assignment": False,
        "member_id": member_id,
        "members": [],
    }


def _sync_error(code: ErrorCode) -> dict[str, Any]:
    return {"error_code": code, "protocol_type": None, "protocol_name": None, "assignment": b""}
