"""Kafka consumer groups in memory: their states, members and waiting requests, and the
registry that finds a group and holds its lock (:class:`GroupRegistry`), below the
membership protocol (:mod:`.groups`) and the group admin and offset APIs
(:mod:`.group_admin`).

Thread-safety: a :class:`Group` is read and changed under its own ``cond``; the registry's
map under its ``_lock`` (taken after a group's, never before).
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from bigarray import InvalidNameError, validate_name

from .offsets import OffsetStore

__all__ = [
    "Group",
    "GroupLimitError",
    "GroupRegistry",
    "GroupState",
    "Member",
    "Waiter",
    "ms_of",
    "set_timeouts",
    "valid_group_id",
]


class GroupLimitError(Exception):
    """A new group was asked for while the registry holds ``max_groups`` groups."""


class GroupState(enum.StrEnum):
    """A group's state (the names DescribeGroups and ListGroups answer)."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class Waiter:
    """A blocked JoinGroup or SyncGroup: ``result`` is set (under the group's lock) when
    it is answered."""

    __slots__ = ("result",)

    def __init__(self) -> None:
        self.result: dict[str, Any] | None = None


class Member:
    __slots__ = (
        "assignment",
        "client_host",
        "client_id",
        "heartbeat_s",
        "instance_id",
        "join",
        "member_id",
        "protocol_type",
        "protocols",
        "rebalance_timeout_s",
        "session_timeout_s",
        "sync",
    )

    def __init__(self, member_id: str, instance_id: str | None, client_id: str, client_host: str) -> None:
        self.member_id = member_id
        self.instance_id = instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.session_timeout_s = 10.0
        self.rebalance_timeout_s = 10.0
        self.protocol_type = ""
        self.protocols: list[tuple[str, bytes]] = []
        self.assignment = b""
        self.heartbeat_s = 0.0  # the last heartbeat, on the coordinator's clock
        self.join: Waiter | None = None  # a JoinGroup waiting for the rebalance
        self.sync: Waiter | None = None  # a SyncGroup waiting for the leader's

    def metadata(self, protocol: str | None) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        return b""

    def same_protocols(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols


class Group:
    """One group's state; every field is guarded by ``cond``'s lock."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.cond = threading.Condition(threading.Lock())
        self.state = GroupState.EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self.static: dict[str, str] = {}  # group.instance.id -> member id
        self.pending: dict[str, float] = {}  # member ids given out (MEMBER_ID_REQUIRED) -> expiry
        self.pending_sync: set[str] = set()
        self.rebalance_deadline_s = 0.0  # PreparingRebalance: when the join ends regardless
        self.initial_delay_until_s = 0.0  # the initial rebalance delay (an Empty group's first join)
        self.initial_delay_limit_s = 0.0
        self.sync_deadline_s = 0.0  # CompletingRebalance / Stable: when members that did not sync are removed
        self.rebalances = 0
        self.touched_s = 0.0  # the last request for it (clock of the coordinator)
        self.evicted = False  # taken out of the coordinator's map: look it up again
        #: When the background thread next has something to do here (read without the
        #: lock: a float; written under it after every request and tick).
        self.wake_s = 0.0

    def is_leader(self, member_id: str) -> bool:
        return self.leader == member_id

    def blank(self) -> bool:
        """Nothing worth remembering: Empty, never a generation, no member, no member id
        given out (a group made by a JoinGroup whose member never came back, or by a
        simple consumer's commit)."""
        return self.state is GroupState.EMPTY and self.generation == 0 and not self.members and not self.pending

    def rebalance_timeout_s(self) -> float:
        return max((m.rebalance_timeout_s for m in self.members.values()), default=0.0)

    def all_joined(self) -> bool:
        return not self.pending and all(m.join is not None for m in self.members.values())

    def candidate_protocols(self) -> set[str]:
        """The protocols every member supports."""
        members = list(self.members.values())
        if not members:
            return set()
        common = {name for name, _ in members[0].protocols}
        for m in members[1:]:
            common &= {name for name, _ in m.protocols}
        return common

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Kafka's GroupMetadata.supportsProtocols."""
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        candidates = self.candidate_protocols()
        return protocol_type == self.protocol_type and any(name in candidates for name, _ in protocols)

    def select_protocol(self) -> str | None:
        """The protocol most members name first among those every member supports
        (ties: the first such in the leader's order)."""
        candidates = self.candidate_protocols()
        if not candidates:
            return None
        votes: Counter[str] = Counter()
        for m in self.members.values():
            votes[next(name for name, _ in m.protocols if name in candidates)] += 1
        leader = self.members.get(self.leader or "") or next(iter(self.members.values()))
        order = [name for name, _ in leader.protocols if name in candidates]
        return max(order, key=lambda name: (votes[name], -order.index(name)))

    def fenced(self, member_id: str, instance_id: str | None) -> bool:
        """A static member's old id (another member took its group.instance.id)."""
        if instance_id is None:
            return False
        current = self.static.get(instance_id)
        return current is not None and current != member_id


class GroupRegistry:
    """The groups in memory, found by id with their lock held. The coordinator
    (:class:`~luxun.kafka.groups.GroupCoordinator`) sets the attributes and implements the
    two rebalancing hooks."""

    offsets: OffsetStore
    clock: Callable[[], float]
    max_groups: int
    _lock: threading.Lock
    _groups: dict[str, Group]

    def _tick(self, group: Group, now: float) -> None:
        """Expire sessions and finish rebalances that are due (the group's lock held)."""
        raise NotImplementedError

    def _wake_time(self, group: Group) -> float:
        """When the group next needs :meth:`_tick` (the group's lock held)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def _locked(self, group_id: str, *, create: bool = False, limited: bool = False) -> Iterator[Group | None]:
        """The group called ``group_id`` (created if ``create``; None if unknown) with
        its lock held. Order of locks: a group's, then the coordinator's map lock. A
        group left :meth:`Group.blank` is forgotten at once.

        Raises:
            GroupLimitError: ``limited`` and the group would be one more than
                ``max_groups``.
        """
        while True:
            group = self._group(group_id, create=create, limited=limited)
            if group is None:
                yield None
                return
            with group.cond:
                if group.evicted:  # forgotten meanwhile: look it up again
                    continue
                group.touched_s = self.clock()
                try:
                    yield group
                finally:
                    if group.blank() and not group.evicted:
                        self._evict(group)
                    group.wake_s = self._wake_time(group)
                return

    def _evict(self, group: Group) -> None:
        """Forget ``group`` (its lock held): Dead to whoever still holds it."""
        group.state = GroupState.DEAD
        group.evicted = True
        group.cond.notify_all()
        with self._lock:
            if self._groups.get(group.group_id) is group:
                del self._groups[group.group_id]

    def _group(self, group_id: str, *, create: bool = False, limited: bool = False) -> Group | None:
        with self._lock:
            group = self._groups.get(group_id)
            if group is None and create:
                if limited and len(self._groups) >= self.max_groups:
                    raise GroupLimitError(group_id)
                group = self._groups[group_id] = Group(group_id)
            return group

    def _all_groups(self) -> list[Group]:
        with self._lock:
            return list(self._groups.values())


def valid_group_id(group_id: Any) -> bool:
    """A group id we can keep offsets for: a valid fanout group name."""
    if not isinstance(group_id, str) or not group_id:
        return False
    try:
        validate_name(group_id, what="group")
    except (InvalidNameError, ValueError):
        return False
    return True


def ms_of(value: Any) -> int:
    if value is None:
        return -1
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)


def set_timeouts(member: Member, session_ms: int, rebalance_ms: int) -> None:
    member.session_timeout_s = session_ms / 1000
    member.rebalance_timeout_s = rebalance_ms / 1000
