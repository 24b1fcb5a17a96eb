"""ACL checks of the group APIs, around the group coordinator, as Kafka's KafkaApis
makes them (docs/kafka-acls.md has the table):

=====================  =====================================================================
FindCoordinator        DESCRIBE on the group (GROUP_AUTHORIZATION_FAILED) or transactional id
                       (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
JoinGroup, SyncGroup,  READ on the group, else GROUP_AUTHORIZATION_FAILED
Heartbeat, LeaveGroup
OffsetCommit           READ on the group (every partition GROUP_AUTHORIZATION_FAILED), then
                       READ on each topic (its partitions TOPIC_AUTHORIZATION_FAILED)
OffsetFetch            READ on the group, then DESCRIBE on each topic named (its partitions
                       TOPIC_AUTHORIZATION_FAILED); asked for all, the others are left out
DescribeGroups         DESCRIBE on each group (GROUP_AUTHORIZATION_FAILED for that group)
ListGroups             DESCRIBE on the cluster: every group; else those with DESCRIBE
DeleteGroups           DELETE on each group (GROUP_AUTHORIZATION_FAILED for that group)
OffsetDelete           DELETE on the group (GROUP_AUTHORIZATION_FAILED), then READ on each
                       topic (its partitions TOPIC_AUTHORIZATION_FAILED)
=====================  =====================================================================

The coordinator itself knows nothing of sessions: :class:`GroupAcls` checks before
calling it (with a request narrowed to what is allowed, a kio entity rebuilt by
:func:`dataclasses.replace`) and merges the refusals into its answer. DescribeGroups
asked for authorized operations (KIP-430) gets them here too, SASL on or off.

Thread-safety: as the coordinator's and the authorizer's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from .acls import ALL_OPERATIONS, CLUSTER_NAME, NO_AUTHORIZED_OPERATIONS, Authorizer, Operation, ResourceType, allows
from .protocol import build, response_schema
from .sasl import SaslSession

__all__ = ["GroupAcls"]

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 10, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS, OFFSET_DELETE = 15, 16, 42, 47
TOPIC_AUTHORIZATION_FAILED: Final = 29
GROUP_AUTHORIZATION_FAILED: Final = 30
TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Final = 53
_READ, _DESCRIBE, _DELETE = Operation.READ, Operation.DESCRIBE, Operation.DELETE
_GROUP, _TOPIC = ResourceType.GROUP, ResourceType.TOPIC
#: The answers to a member API of a user without READ on its group.
_MEMBER_REFUSALS: Final[dict[int, dict[str, Any]]] = {
    JOIN_GROUP: {"error_code": GROUP_AUTHORIZATION_FAILED, "generation_id": -1, "protocol_type": None,
                 "protocol_name": None, "leader": "", "members": []},
    SYNC_GROUP: {"error_code": GROUP_AUTHORIZATION_FAILED, "protocol_type": None, "protocol_name": None,
                 "assignment": b""},
    HEARTBEAT: {"error_code": GROUP_AUTHORIZATION_FAILED},
    LEAVE_GROUP: {"error_code": GROUP_AUTHORIZATION_FAILED, "members": []},
}  # fmt: skip


def _deleted_refusal(partition: int) -> dict[str, Any]:
    return {"partition_index": partition, "error_code": TOPIC_AUTHORIZATION_FAILED}


def _fetched_refusal(partition: int, code: int) -> dict[str, Any]:
    return {"partition_index": partition, "committed_offset": -1, "committed_leader_epoch": -1, "metadata": "",
            "error_code": code}  # fmt: skip


class GroupAcls:
    """The group coordinator ``groups`` behind the checks of ``authorizer``."""

    def __init__(self, groups: Any, authorizer: Authorizer | None) -> None:
        self.groups = groups
        self.authorizer = authorizer

    def handle(self, key: int, version: int, request: Any, session: SaslSession | None, *, client_id: str | None,
               client_host: str) -> Any:  # fmt: skip
        """The response entity to a group API request of ``session`` (None: SASL off)."""
        authorizer = self.authorizer
        if (session is None or authorizer is None) and (
            key != DESCRIBE_GROUPS or not getattr(request, "include_authorized_operations", False)
        ):
            return self.groups.handle(key, version, request, client_id=client_id, client_host=client_host)
        kw = {"client_id": client_id, "client_host": client_host}
        values = self._answer(key, version, request, session, kw)
        return build(response_schema(key, version), **values)

    def _may(self, session: SaslSession | None, op: Operation, rtype: ResourceType, name: str) -> bool:
        return allows(self.authorizer, session, op, rtype, name)

    def _answer(self, key: int, version: int, request: Any, session: SaslSession | None,
                kw: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        answer = self.groups.answer
        if key in _MEMBER_REFUSALS:
            if not self._may(session, _READ, _GROUP, request.group_id):
                member_id = getattr(request, "member_id", "")
                return _MEMBER_REFUSALS[key] | ({"member_id": member_id} if key == JOIN_GROUP else {})
            return dict(answer(key, version, request, **kw))
        if key == FIND_COORDINATOR:
            return self._find_coordinator(version, request, session, kw)
        if key == OFFSET_COMMIT:
            return self._offset_commit(version, request, session, kw)
        if key == OFFSET_FETCH:
            if version >= 8:
                return {"groups": [self._fetch_group(version, request, g, g.group_id, g.topics, session, kw)
                                   for g in request.groups]}  # fmt: skip
            return self._fetch_group(version, request, None, request.group_id, request.topics, session, kw)
        if key == DESCRIBE_GROUPS:
            return self._describe_groups(version, request, session, kw)
        if key == LIST_GROUPS:
            values = answer(key, version, request, **kw)
            if not self._may(session, _DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
                values["groups"] = [g for g in values["groups"] if self._may(session, _DESCRIBE, _GROUP, g["group_id"])]
            return dict(values)
        if key == DELETE_GROUPS:
            allowed = [g for g in request.groups_names if self._may(session, _DELETE, _GROUP, g)]
            results = answer(key, version, dataclasses.replace(request, groups_names=tuple(allowed)), **kw)["results"]
            done = {r["group_id"]: r for r in results}
            refused = {"error_code": GROUP_AUTHORIZATION_FAILED}
            return {"results": [done.get(g) or {"group_id": g} | refused for g in request.groups_names]}
        if key == OFFSET_DELETE:
            return self._offset_delete(version, request, session, kw)
        return dict(answer(key, version, request, **kw))

    def _offset_delete(self, version: int, request: Any, session: SaslSession | None,
                       kw: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        if not self._may(session, _DELETE, _GROUP, request.group_id):
            return {"error_code": GROUP_AUTHORIZATION_FAILED, "topics": []}
        allowed = [t for t in request.topics if self._may(session, _READ, _TOPIC, t.name)]
        values = dict(
            self.groups.answer(OFFSET_DELETE, version, dataclasses.replace(request, topics=tuple(allowed)), **kw)
        )
        refused = [
            {"name": t.name, "partitions": [_deleted_refusal(p.partition_index) for p in t.partitions]}
            for t in request.topics
            if t not in allowed
        ]
        if refused and values.get("error_code", 0) == 0:
            values["topics"] = [*values.get("topics", []), *refused]
        return values

    def _find_coordinator(self, version: int, request: Any, session: SaslSession | None,
                          kw: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        key_type = getattr(request, "key_type", 0)
        rtype, code = (
            (ResourceType.TRANSACTIONAL_ID, TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            if key_type == 1
            else (_GROUP, GROUP_AUTHORIZATION_FAILED)
        )
        refusal = {"error_code": code, "node_id": -1, "host": "", "port": -1, "error_message": None}
        if version < 4:
            if key_type in (0, 1) and not self._may(session, _DESCRIBE, rtype, request.key):
                return refusal
            return dict(self.groups.answer(FIND_COORDINATOR, version, request, **kw))
        keys = list(request.coordinator_keys)
        allowed = [k for k in keys if key_type not in (0, 1) or self._may(session, _DESCRIBE, rtype, k)]
        narrowed = dataclasses.replace(request, coordinator_keys=tuple(allowed))
        found = {c["key"]: c for c in self.groups.answer(FIND_COORDINATOR, version, narrowed, **kw)["coordinators"]}
        return {"coordinators": [found.get(k) or {"key": k} | refusal for k in keys]}

    def _offset_commit(self, version: int, request: Any, session: SaslSession | None,
                       kw: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        def refuse(t: Any, code: int) -> dict[str, Any]:
            return {"name": t.name, "partitions": [{"partition_index": p.partition_index, "error_code": code}
                                                   for p in t.partitions]}  # fmt: skip

        if not self._may(session, _READ, _GROUP, request.group_id):
            return {"topics": [refuse(t, GROUP_AUTHORIZATION_FAILED) for t in request.topics]}
        allowed = [t for t in request.topics if self._may(session, _READ, _TOPIC, t.name)]
        if len(allowed) == len(request.topics):
            return dict(self.groups.answer(OFFSET_COMMIT, version, request, **kw))
        narrowed = dataclasses.replace(request, topics=tuple(allowed))
        done = iter(self.groups.answer(OFFSET_COMMIT, version, narrowed, **kw)["topics"])
        allowed_ids = {id(t) for t in allowed}
        return {
            "topics": [
                next(done) if id(t) in allowed_ids else refuse(t, TOPIC_AUTHORIZATION_FAILED) for t in request.topics
            ]
        }

    def _fetch_group(self, version: int, request: Any, group: Any, group_id: str, topics: Any,
                     session: SaslSession | None, kw: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        """One group's OffsetFetch answer (``group``: its entry of a v8+ request; the
        whole answer before v8)."""
        if not self._may(session, _READ, _GROUP, group_id):
            if version < 2:  # no top-level code: in every partition
                return {"error_code": GROUP_AUTHORIZATION_FAILED, "topics": [
                    {"name": t.name, "partitions": [_fetched_refusal(p, GROUP_AUTHORIZATION_FAILED)
                                                    for p in t.partition_indexes]}
                    for t in topics or ()]}  # fmt: skip
            return {"group_id": group_id, "error_code": GROUP_AUTHORIZATION_FAILED, "topics": []}
        narrowed = None if topics is None else tuple(t for t in topics if self._may(session, _DESCRIBE, _TOPIC, t.name))
        if group is not None:
            one = dataclasses.replace(request, groups=(dataclasses.replace(group, topics=narrowed),))
            values = dict(self.groups.answer(OFFSET_FETCH, version, one, **kw)["groups"][0])
        else:
            values = dict(
                self.groups.answer(OFFSET_FETCH, version, dataclasses.replace(request, topics=narrowed), **kw)
            )
        if topics is None:  # all the group's topics: those not allowed are left out
            values["topics"] = [t for t in values["topics"] if self._may(session, _DESCRIBE, _TOPIC, t["name"])]
            return values
        done = {t["name"]: t for t in values["topics"]}
        values["topics"] = [
            done.get(t.name) or {"name": t.name, "partitions": [_fetched_refusal(p, TOPIC_AUTHORIZATION_FAILED)
                                                               for p in t.partition_indexes]}
            for t in topics
        ]  # fmt: skip
        return values

    def _describe_groups(self, version: int, request: Any, session: SaslSession | None,
                         kw: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        allowed = [g for g in request.groups if self._may(session, _DESCRIBE, _GROUP, g)]
        narrowed = dataclasses.replace(request, groups=tuple(allowed))
        done = {g["group_id"]: g for g in self.groups.answer(DESCRIBE_GROUPS, version, narrowed, **kw)["groups"]}
        ops = getattr(request, "include_authorized_operations", False)
        out = []
        for g in request.groups:
            described = done.get(g)
            if described is None:
                out.append({"error_code": GROUP_AUTHORIZATION_FAILED, "group_id": g, "group_state": "",
                            "protocol_type": "", "protocol_data": "", "members": [],
                            "authorized_operations": NO_AUTHORIZED_OPERATIONS})  # fmt: skip
                continue
            if ops:
                described = described | {"authorized_operations": self._group_operations(session, g)}
            out.append(described)
        return {"groups": out}

    def _group_operations(self, session: SaslSession | None, group_id: str) -> int:
        if self.authorizer is None:
            return ALL_OPERATIONS[_GROUP]
        return self.authorizer.authorized_operations(session, _GROUP, group_id)
