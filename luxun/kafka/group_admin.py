"""Kafka's group APIs outside the membership protocol: DescribeGroups, ListGroups,
DeleteGroups, OffsetDelete, OffsetCommit and OffsetFetch (committed offsets live on the topics, see
:mod:`.offsets`). A mixin of :class:`~luxun.kafka.groups.GroupCoordinator`.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Collection, Iterable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from .membership import GroupRegistry, GroupState, valid_group_id

__all__ = ["GroupAdmin"]

log = logging.getLogger("luxun.kafka.groups")

_E = ErrorCode
_NO_AUTHORIZED_OPERATIONS: Final = -(2**31)
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")


class GroupAdmin(GroupRegistry):
    """DescribeGroups, ListGroups, DeleteGroups, OffsetCommit, OffsetFetch over the registry."""

    def _note_empty(self, group_id: str, now: float) -> None:
        """See :meth:`~luxun.kafka.groups.GroupCoordinator._note_empty`."""
        raise NotImplementedError

    def _forget_empty(self, group_id: str) -> None:
        raise NotImplementedError

    #: The transaction coordinator's pending offsets of a group (its
    #: ``pending_offsets``): OffsetFetch v7+ with ``require_stable`` answers
    #: UNSTABLE_OFFSET_COMMIT for them. None: no transactions.
    pending_offsets: Callable[[str], Collection[tuple[str, int]]] | None = None

    # -- DescribeGroups, ListGroups, DeleteGroups ------------------------------------------------
    def _describe_groups(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        return {"groups": [self._describe_one(g, version) for g in request.groups]}

    def _describe_one(self, group_id: str, version: int) -> dict[str, Any]:
        dead = {
            "error_code": _E.none,
            "group_id": group_id,
            "group_state": GroupState.DEAD.value,
            "protocol_type": "",
            "protocol_data": "",
            "members": [],
            "authorized_operations": _NO_AUTHORIZED_OPERATIONS,
        }
        if not valid_group_id(group_id):
            return dead | {"error_code": _E.invalid_group_id, "error_message": f"invalid group id {group_id!r}"}
        with self._locked(group_id) as group:
            if group is None:
                if self.offsets.has_offsets(group_id):
                    return dead | {"group_state": GroupState.EMPTY.value}
                if version >= 6:
                    return dead | {
                        "error_code": _E.group_id_not_found,
                        "error_message": f"group {group_id!r} not found",
                    }
                return dead
            self._tick(group, self.clock())  # a session ended by now is over, as Kafka's timer
            stable = group.state is GroupState.STABLE
            return {
                "error_code": _E.none,
                "group_id": group_id,
                "group_state": group.state.value,
                "protocol_type": group.protocol_type or "",
                "protocol_data": (group.protocol_name or "") if stable else "",
                "members": [
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.instance_id,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "member_metadata": m.metadata(group.protocol_name) if stable else b"",
                        "member_assignment": m.assignment if stable else b"",
                    }
                    for m in group.members.values()
                ],
                "authorized_operations": _NO_AUTHORIZED_OPERATIONS,
            }

    def _list_groups(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        states = {s.lower() for s in getattr(request, "states_filter", ()) or ()}
        types = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
        rows: dict[str, tuple[str, str]] = {}
        for group in self._all_groups():
            with group.cond:
                if group.state is not GroupState.DEAD:
                    rows[group.group_id] = (group.protocol_type or "", group.state.value)
        for group_id in self.offsets.groups():  # groups known by their committed offsets only
            rows.setdefault(group_id, ("", GroupState.EMPTY.value))
        return {
            "error_code": _E.none,
            "groups": [
                {"group_id": gid, "protocol_type": ptype, "group_state": state, "group_type": "classic"}
                for gid, (ptype, state) in sorted(rows.items())
                if (not states or state.lower() in states) and (not types or "classic" in types)
            ],
        }

    def _delete_groups(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        return {"results": [{"group_id": g, "error_code": self._delete_one(g)} for g in request.groups_names]}

    def _delete_one(self, group_id: str) -> ErrorCode:
        if not valid_group_id(group_id):
            return _E.invalid_group_id
        with self._locked(group_id) as group:
            if group is not None:
                # Sessions whose time is up end now, as Kafka's timers end them at their
                # deadline, not at the background thread's next pass.
                self._tick(group, self.clock())
                if group.state is not GroupState.EMPTY:
                    return _E.non_empty_group
                self._evict(group)
            elif not self.offsets.has_offsets(group_id):
                return _E.group_id_not_found
            # under the group's lock (if it was known): no commit of it runs meanwhile
            self.offsets.delete_group(group_id)
            self._forget_empty(group_id)
        log.info("group %r deleted with its committed offsets", group_id)
        return _E.none

    # -- OffsetDelete ----------------------------------------------------------------------------
    def _offset_delete(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        """As Kafka's coordinator: an Empty group (or one known by its offsets only) loses
        the offsets asked; a consumer group with members keeps those of the topics its
        members subscribe to (GROUP_SUBSCRIBED_TO_TOPIC) and loses the others; another
        group with members: NON_EMPTY_GROUP."""
        group_id = request.group_id
        if not valid_group_id(group_id):
            return {"error_code": _E.invalid_group_id, "topics": []}
        with self._locked(group_id) as group:
            subscribed: set[str] = set()
            if group is not None:
                self._tick(group, self.clock())
            if group is None or group.state is GroupState.DEAD:
                if group is not None or not self.offsets.has_offsets(group_id):
                    return {"error_code": _E.group_id_not_found, "topics": []}
            elif group.state is not GroupState.EMPTY:
                if group.protocol_type != "consumer":
                    return {"error_code": _E.non_empty_group, "topics": []}
                for m in group.members.values():
                    subscribed |= subscribed_topics(m.metadata(group.protocol_name))

            def delete(topic: str, partition: int) -> ErrorCode:
                if topic in subscribed:
                    return _E.group_subscribed_to_topic
                return self.offsets.delete(group_id, topic, partition)

            topics = [
                {
                    "name": t.name,
                    "partitions": [
                        {"partition_index": p.partition_index, "error_code": delete(t.name, p.partition_index)}
                        for p in t.partitions
                    ],
                }
                for t in request.topics
            ]
        log.info("OffsetDelete of group %r: %s", group_id, [(t["name"], t["partitions"]) for t in topics])
        return {"error_code": _E.none, "topics": topics}

    # -- OffsetCommit, OffsetFetch ---------------------------------------------------------------
    def _offset_commit(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        group_id = request.group_id
        generation = request.generation_id_or_member_epoch
        member_id = request.member_id or ""
        instance_id = getattr(request, "group_instance_id", None)
        if not valid_group_id(group_id):
            return self._commit_answers(request, group_id, _E.invalid_group_id)
        with self._locked(group_id, create=generation < 0) as group:
            if group is None:  # no such group and a generation: an old member
                return self._commit_answers(request, group_id, _E.illegal_generation)
            now = self.clock()
            self._tick(group, now)
            error = None
            if group.state is GroupState.DEAD:
                error = _E.coordinator_not_available
            elif group.fenced(member_id, instance_id):
                error = _E.fenced_instance_id
            elif generation < 0 and group.state is GroupState.EMPTY:
                pass  # a consumer that keeps only its offsets in the group
            elif member_id not in group.members:
                error = _E.unknown_member_id
            elif generation != group.generation:
                error = _E.illegal_generation
            elif group.state is GroupState.COMPLETING_REBALANCE:
                error = _E.rebalance_in_progress
            else:
                group.members[member_id].heartbeat_s = now
            if error is None and not group.members:  # a simple consumer's: its retention runs from now
                self._note_empty(group_id, now)
            # stored under the group's lock, as Kafka does: no rebalance in between
            return self._commit_answers(request, group_id, error)

    def check_txn_offset_commit(
        self, group_id: str, member_id: str, instance_id: str | None, generation: int
    ) -> ErrorCode | None:
        """The error of a TxnOffsetCommit v3+ (KIP-447) from a producer acting for a
        member of ``group_id``, as Kafka's coordinator judges it (None: it may commit):
        an unknown group with a generation: ILLEGAL_GENERATION (an unknown group
        without one: a simple consumer's, accepted); a group instance id that is not
        the group's: UNKNOWN_MEMBER_ID, or FENCED_INSTANCE_ID when another member holds
        it; an unknown member: UNKNOWN_MEMBER_ID; another generation: ILLEGAL_GENERATION.
        Unlike OffsetCommit, no generation at all is accepted from a group with members
        (older producers send none) and a group completing a rebalance is no refusal."""
        with self._locked(group_id) as group:
            if group is None:
                return None if generation < 0 else _E.illegal_generation
            self._tick(group, self.clock())
            if group.state is GroupState.DEAD:
                return _E.coordinator_not_available
            if generation < 0 and group.state is GroupState.EMPTY:
                return None
            if generation >= 0 or member_id or instance_id is not None:
                if instance_id is not None:
                    holder = group.static.get(instance_id)
                    if holder is None:
                        return _E.unknown_member_id
                    if holder != member_id:
                        return _E.fenced_instance_id
                elif member_id not in group.members:
                    return _E.unknown_member_id
                if generation != group.generation:
                    return _E.illegal_generation
            return None

    def _commit_answers(self, request: Any, group_id: str, error: ErrorCode | None) -> dict[str, Any]:
        """Store every partition's offset (or answer ``error`` for each)."""

        def store(topic: str, p: Any) -> ErrorCode:
            if error is not None:
                return error
            epoch = getattr(p, "committed_leader_epoch", -1)  # OffsetCommit v6+
            return self.offsets.commit(
                group_id, topic, p.partition_index, p.committed_offset, p.committed_metadata, epoch
            )

        return {
            "topics": [
                {
                    "name": t.name,
                    "partitions": [
                        {"partition_index": p.partition_index, "error_code": store(t.name, p)} for p in t.partitions
                    ],
                }
                for t in request.topics
            ]
        }

    def _offset_fetch(self, request: Any, version: int, client_id: str, client_host: str) -> dict[str, Any]:
        stable = version >= 7 and bool(request.require_stable)
        if version >= 8:
            return {"groups": [self._fetch_group(g.group_id, g.topics, stable) for g in request.groups]}
        answer = self._fetch_group(request.group_id, request.topics, stable)
        if version < 2 and answer["error_code"] != _E.none:  # v1: no top-level code; in every partition
            for t in answer["topics"]:
                for p in t["partitions"]:
                    p["error_code"] = answer["error_code"]
        return answer

    def _fetch_group(self, group_id: str, topics: Iterable[Any] | None, stable: bool = False) -> dict[str, Any]:
        """One group's committed offsets; with ``stable`` (require_stable), a partition
        whose offset an open transaction holds is UNSTABLE_OFFSET_COMMIT, as Kafka
        answers it (the client asks again after the transaction ends)."""
        if not valid_group_id(group_id):
            wanted = [(t.name, list(t.partition_indexes)) for t in topics or ()]
            return {
                "group_id": group_id,
                "error_code": _E.invalid_group_id,
                "topics": [
                    {"name": name, "partitions": [_fetched(p, -1, "", _E.invalid_group_id) for p in parts]}
                    for name, parts in wanted
                ],
            }
        if topics is None:
            by_topic: dict[str, list[int]] = {}
            for name, partition in self.offsets.partitions(group_id):
                by_topic.setdefault(name, []).append(partition)
            wanted = sorted(by_topic.items())
        else:
            wanted = [(t.name, list(t.partition_indexes)) for t in topics]
        out = []
        group_error = _E.none
        unstable = self.pending_offsets(group_id) if stable and self.pending_offsets is not None else ()
        for name, parts in wanted:
            rows = []
            for p in parts:
                if (name, p) in unstable:
                    rows.append(_fetched(p, -1, "", _E.unstable_offset_commit))
                    continue
                offset, metadata, code, epoch = self.offsets.fetch(group_id, name, p)
                rows.append(_fetched(p, offset, metadata, code, epoch))
                if code is _E.group_authorization_failed:  # read by Thrift consumers (docs/groups.md)
                    group_error = code
            out.append({"name": name, "partitions": rows})
        return {"group_id": group_id, "error_code": group_error, "topics": out}


def subscribed_topics(metadata: bytes) -> set[str]:
    """The topics of a consumer's subscription (the ``consumer`` protocol's member
    metadata: version i16, then the topics as an array of strings, in every version);
    none if it does not parse (as Kafka, which then lets their offsets be deleted)."""
    topics: set[str] = set()
    try:
        (count,) = _I32.unpack_from(metadata, 2)
        pos = 6
        for _ in range(count):
            (size,) = _I16.unpack_from(metadata, pos)
            pos += 2
            if size < 0 or pos + size > len(metadata):
                return set()
            topics.add(metadata[pos : pos + size].decode())
            pos += size
    except (struct.error, UnicodeDecodeError):
        return set()
    return topics


def _fetched(partition: int, offset: int, metadata: str, code: ErrorCode, epoch: int = -1) -> dict[str, Any]:
    return {
        "partition_index": partition,
        "committed_offset": offset,
        "committed_leader_epoch": epoch,
        "metadata": metadata,
        "error_code": code,
    }
