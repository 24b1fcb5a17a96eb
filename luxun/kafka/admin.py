"""Answers to Kafka's admin requests on topics and their records: CreatePartitions
(API 37), the config APIs (DescribeConfigs 32, AlterConfigs 33,
IncrementalAlterConfigs 44: of topics, the broker and groups) and DeleteRecords (API
21), for a cluster of one broker (this one, leader of every partition). See
docs/kafka-admin.md.

Each answers per topic (or resource) as Kafka's broker does: a topic named twice in
one request gets INVALID_REQUEST (one result for it); the others are judged and
changed on their own. With SASL on, each is checked against the ACLs
(:mod:`.acls`, docs/kafka-acls.md) as Kafka's KafkaApis checks it: CreatePartitions
ALTER on the topic, DeleteRecords DELETE on the topic, DescribeConfigs DESCRIBE_CONFIGS
and the two alter APIs ALTER_CONFIGS on the topic, the group or the cluster (for the
broker's configs); a refusal is TOPIC_AUTHORIZATION_FAILED (GROUP_AUTHORIZATION_FAILED,
CLUSTER_AUTHORIZATION_FAILED) for that resource.

Thread-safety: one instance serves every connection; changes to a topic's settings
are serialised in :class:`~luxun.kafka.log.KafkaLog`.
"""

from __future__ import annotations

import collections
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from ..dynamic import DynamicBrokerConfigs
from ..metrics import Metrics
from . import protocol as P
from .acls import CLUSTER_NAME, Authorizer, Operation, ResourceType, allows
from .group_configs import GROUP_CONFIGS, GroupConfigStore, check_group_configs
from .log import INVALID_CONFIG, KAFKA_STORAGE_ERROR, NONE, UNKNOWN_TOPIC_OR_PARTITION, KafkaLog, TopicInfo
from .sasl import SaslSession
from .topic_configs import BROKER_CONFIGS, TOPIC_CONFIGS, ConfigProblem, altered, check_broker_configs

__all__ = ["KafkaAdmin"]

log = logging.getLogger(__name__)

INVALID_REPLICA_ASSIGNMENT: Final = 39
INVALID_REQUEST: Final = 42
TOPIC_AUTHORIZATION_FAILED: Final = 29
GROUP_AUTHORIZATION_FAILED: Final = 30
CLUSTER_AUTHORIZATION_FAILED: Final = 31


def duplicates(names: Iterable[str]) -> set[str]:
    """The names given more than once."""
    return {n for n, k in collections.Counter(names).items() if k > 1}


class KafkaAdmin:
    """The admin APIs over ``kafka_log`` (see the module).

    Args:
        kafka_log: the topics.
        node_id: this broker's id (the only valid replica).
        metrics: errors are counted per code.
        broker_configs: the broker's dynamic configs (None: none may be set).
        acls: the authorizer (None: nothing is checked).
        group_configs: where groups' configs are kept (None: a GROUP resource is
            INVALID_REQUEST, as a Kafka broker before 4.0 answers).
    """

    def __init__(
        self,
        kafka_log: KafkaLog,
        *,
        node_id: int,
        metrics: Metrics,
        broker_configs: DynamicBrokerConfigs | None = None,
        acls: Authorizer | None = None,
        group_configs: GroupConfigStore | None = None,
    ) -> None:
        #: With SASL on, the ACLs; None: nothing is checked.
        self.acls = acls
        self.group_configs = group_configs
        self.log = kafka_log
        self.broker_configs = broker_configs
        self.node_id = node_id
        self.metrics = metrics

    def refused(self, session: SaslSession | None, op: Operation, rtype: ResourceType, name: str) -> str | None:
        """Why ``session``'s user may not do ``op`` on the resource (None: it may)."""
        if allows(self.acls, session, op, rtype, name):
            return None
        user = session.user.name if session is not None and session.user is not None else "?"
        return f"user {user!r} has no {op.name} ACL on {rtype.name} {name!r}"

    def _response(self, header: P.RequestHeader, **values: Any) -> Any:
        return P.build(P.response_schema(header.api_key, header.api_version), **values)

    def _counted(self, code: int) -> int:
        if code != NONE:
            self.metrics.count_kafka_error(code)
        return code

    # -- CreatePartitions --------------------------------------------------------------
    def create_partitions(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        """Each topic grown on its own (:meth:`KafkaLog.add_partitions`); ``validate_only``
        answers the same and makes nothing."""
        twice = duplicates(t.name for t in request.topics)
        results = []
        reserved = 0
        for t in request.topics:
            why = self.refused(session, Operation.ALTER, ResourceType.TOPIC, t.name)
            if why is not None and t.name not in twice:
                code = self._counted(TOPIC_AUTHORIZATION_FAILED)
                results.append({"name": t.name, "error_code": code, "error_message": why})
                continue
            if t.name in twice:
                if all(r["name"] != t.name for r in results):
                    results.append(
                        {"name": t.name, "error_code": self._counted(INVALID_REQUEST),
                         "error_message": "Duplicate topic in request."}
                    )  # fmt: skip
                continue
            code, message = self._check_assignments(t)
            if code == NONE:
                code, message = self.log.add_partitions(
                    t.name, t.count, validate_only=request.validate_only, reserved=reserved
                )
            if code == NONE and request.validate_only:
                info = self.log.describe(t.name)
                reserved += t.count - (info.partitions if info else 0)
            results.append({"name": t.name, "error_code": self._counted(code), "error_message": message})
        return self._response(header, results=results)

    def _check_assignments(self, t: Any) -> tuple[int, str | None]:
        """A CreatePartitions topic's assignments (one per new partition), as Kafka's
        broker checks them against a cluster of this one broker."""
        if t.assignments is None:
            return NONE, None
        info = self.log.describe(t.name)
        if info is None or t.count <= info.partitions:
            return NONE, None  # answered by add_partitions
        added = t.count - info.partitions
        if len(t.assignments) != added:
            return INVALID_REPLICA_ASSIGNMENT, (
                f"Increasing the number of partitions by {added} but {len(t.assignments)} assignments provided."
            )
        for i, a in enumerate(t.assignments):
            unknown = sorted(set(a.broker_ids) - {self.node_id})
            if unknown:
                return INVALID_REPLICA_ASSIGNMENT, (
                    f"Unknown broker(s) in replica assignment: {', '.join(map(str, unknown))}."
                )
            if list(a.broker_ids) != [self.node_id]:
                return INVALID_REPLICA_ASSIGNMENT, (
                    f"Inconsistent replication factor between partitions, partition 0 has 1 while partitions "
                    f"[{info.partitions + i}] have replication factors [{len(a.broker_ids)}], respectively."
                )
        return NONE, None

    # -- DeleteRecords -----------------------------------------------------------------
    def delete_records(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        """Each partition's log start moved on its own (:meth:`KafkaLog.delete_records`)."""
        topics = []
        for t in request.topics:
            why = self.refused(session, Operation.DELETE, ResourceType.TOPIC, t.name)
            parts = []
            for p in t.partitions:
                message: str | None
                if why is not None:
                    code, low, message = TOPIC_AUTHORIZATION_FAILED, -1, why
                else:
                    code, low, message = self.log.delete_records(t.name, p.partition_index, p.offset)
                if self._counted(code) != NONE and message:
                    log.debug("DeleteRecords of %s-%d: %s", t.name, p.partition_index, message)
                parts.append({"partition_index": p.partition_index, "low_watermark": low, "error_code": code})
            topics.append({"name": t.name, "partitions": parts})
        return self._response(header, topics=topics)

    # -- configs -----------------------------------------------------------------------
    def _resource_error(self, r: Any, code: int, message: str | None) -> dict[str, Any]:
        return {
            "error_code": self._counted(code),
            "error_message": message,
            "resource_type": r.resource_type,
            "resource_name": r.resource_name,
        }

    def _kind(self, r: Any) -> tuple[str | None, str | None]:
        """``("topic" | "broker" | "group", None)``, or ``(None, why)`` for a resource
        whose configs luxun does not have (INVALID_REQUEST, as Kafka answers a type it
        lacks)."""
        kind = int(r.resource_type)
        if kind == TOPIC:
            return "topic", None
        if kind == GROUP and self.group_configs is not None:
            if not r.resource_name:
                return None, "Group name must not be empty"
            return "group", None
        if kind == BROKER:
            if r.resource_name not in ("", str(self.node_id)):
                return (
                    None,
                    f"Unexpected broker id, expected {self.node_id} or empty string, but received {r.resource_name}",
                )
            return "broker", None
        return None, f"Unsupported resource type: {_RESOURCE_NAMES.get(kind, 'UNKNOWN')}"

    def _config_refusal(self, session: SaslSession | None, op: Operation, kind: str, r: Any) -> tuple[int, str] | None:
        """``op`` (DESCRIBE_CONFIGS or ALTER_CONFIGS) on a topic's, a group's or the
        broker's (the cluster's) configs: None if allowed, else the error code and message."""
        if kind == "topic":
            why = self.refused(session, op, ResourceType.TOPIC, r.resource_name)
            return None if why is None else (TOPIC_AUTHORIZATION_FAILED, why)
        if kind == "group":
            why = self.refused(session, op, ResourceType.GROUP, r.resource_name)
            return None if why is None else (GROUP_AUTHORIZATION_FAILED, why)
        why = self.refused(session, op, ResourceType.CLUSTER, CLUSTER_NAME)
        return None if why is None else (CLUSTER_AUTHORIZATION_FAILED, why)

    def describe_configs(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        """A topic's configs (:meth:`topic_configs`), the broker's
        (:meth:`broker_configs_shown`) or a group's (:meth:`group_configs_shown`, whether
        the group exists or not, as Kafka 4.0); UNKNOWN_TOPIC_OR_PARTITION for a topic that
        does not exist; INVALID_REQUEST for any other resource type."""
        results = []
        for r in request.resources:
            kind, why = self._kind(r)
            keys = r.configuration_keys or ()
            answer = self._resource_error(r, NONE, None)
            configs: list[dict[str, Any]] = []
            refusal = None if kind is None else self._config_refusal(session, Operation.DESCRIBE_CONFIGS, kind, r)
            if kind is None:
                answer = self._resource_error(r, INVALID_REQUEST, why)
            elif refusal is not None:
                answer = self._resource_error(r, refusal[0], refusal[1])
            elif kind == "broker":
                configs = self.broker_configs_shown(r.resource_name, keys)
            elif kind == "group":
                configs = self.group_configs_shown(r.resource_name, keys)
            else:
                info = self.log.describe(r.resource_name)
                if info is None:
                    answer = self._resource_error(
                        r, UNKNOWN_TOPIC_OR_PARTITION, f"Topic {r.resource_name} does not exist"
                    )
                    configs = []
                else:
                    configs = self.topic_configs(info, keys)
            results.append(answer | {"configs": configs})
        return self._response(header, results=results)

    def topic_configs(self, info: TopicInfo, keys: Iterable[str] = ()) -> list[dict[str, Any]]:
        """A topic's configs for DescribeConfigs (only ``keys``, if any) and CreateTopics:
        every key of :data:`TOPIC_CONFIGS`, the ones set on the topic (source
        TOPIC_CONFIG) or else the broker's value (its retention, ``message.max.bytes``:
        DYNAMIC_DEFAULT_BROKER_CONFIG if set at run time, else STATIC_BROKER_CONFIG) or
        Kafka's default (DEFAULT_CONFIG)."""
        wanted = set(keys)
        dynamic = self.broker_configs.values() if self.broker_configs is not None else {}
        static = self.broker_configs.static if self.broker_configs is not None else {}
        out = []
        for name, key in TOPIC_CONFIGS.items():
            if wanted and name not in wanted:
                continue
            value, source = key.default, _DEFAULT_CONFIG
            broker_key = _TOPIC_SYNONYMS.get(name)
            if name in info.configs:
                value, source = info.configs[name], _TOPIC_CONFIG
            elif name == "message.timestamp.type":
                value = info.timestamp_type
            elif name == "max.message.bytes":
                value, source = str(self.log.max_message_bytes), _STATIC_BROKER_CONFIG
            elif broker_key in dynamic:
                value, source = dynamic[broker_key], _DYNAMIC_DEFAULT_BROKER_CONFIG
            elif broker_key in static:
                value, source = static[broker_key], _STATIC_BROKER_CONFIG
            out.append(_entry(name, value, source, key.kind))
        return out

    def broker_configs_shown(self, name: str, keys: Iterable[str] = ()) -> list[dict[str, Any]]:
        """The broker's configs for DescribeConfigs: the ones Kafka clients may set
        (:data:`BROKER_CONFIGS`: set at run time, source DYNAMIC_BROKER_CONFIG, or
        DYNAMIC_DEFAULT_BROKER_CONFIG for the cluster default, the empty name; else the
        file's, STATIC_BROKER_CONFIG), then read-only ones."""
        wanted = set(keys)
        dynamic = self.broker_configs.values() if self.broker_configs is not None else {}
        static = self.broker_configs.static if self.broker_configs is not None else {}
        out = []
        for key, config in BROKER_CONFIGS.items():
            if key in dynamic:
                source = _DYNAMIC_DEFAULT_BROKER_CONFIG if name == "" else _DYNAMIC_BROKER_CONFIG
                out.append(_entry(key, dynamic[key], source, config.kind))
            else:
                out.append(_entry(key, static.get(key, config.default), _STATIC_BROKER_CONFIG, config.kind))
        for key, value, kind in (
            ("broker.id", str(self.node_id), "int"),
            ("message.max.bytes", str(self.log.max_message_bytes), "int"),
            ("num.partitions", str(self.log.num_partitions), "int"),
            ("auto.create.topics.enable", str(self.log.topics.auto_create).lower(), "boolean"),
            ("delete.topic.enable", str(self.log.delete_enable).lower(), "boolean"),
        ):
            out.append(_entry(key, value, _STATIC_BROKER_CONFIG, kind, read_only=True))
        return [e for e in out if not wanted or e["name"] in wanted]

    def group_configs_shown(self, group: str, keys: Iterable[str] = ()) -> list[dict[str, Any]]:
        """A group's configs for DescribeConfigs: every key of :data:`GROUP_CONFIGS`, the
        group's own (source GROUP_CONFIG) or Kafka's default (DEFAULT_CONFIG: luxun's
        broker sets none of Kafka's ``group.consumer.*`` / ``group.share.*`` defaults)."""
        wanted = set(keys)
        own = self.group_configs.get(group) if self.group_configs is not None else {}
        out = []
        for name, key in GROUP_CONFIGS.items():
            if wanted and name not in wanted:
                continue
            if name in own:
                out.append(_entry(name, own[name], _GROUP_CONFIG, key.kind))
            else:
                out.append(_entry(name, key.default, _DEFAULT_CONFIG, key.kind))
        return out

    def alter_configs(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        """AlterConfigs: each resource's configs replaced by the ones given (Kafka's
        semantics: a key left out goes back to its default)."""
        return self._alter(request, header, session, lambda r, now: [(c.name, c.value) for c in r.configs])

    def incremental_alter_configs(
        self, request: Any, header: P.RequestHeader, session: SaslSession | None = None
    ) -> Any:
        """IncrementalAlterConfigs: each resource's configs changed by SET, DELETE,
        APPEND and SUBTRACT (:func:`~luxun.kafka.topic_configs.altered`); a key named
        twice in one resource is INVALID_REQUEST, as Kafka."""

        def change(r: Any, now: Mapping[str, str]) -> list[tuple[str, str | None]]:
            table = {TOPIC: TOPIC_CONFIGS, GROUP: GROUP_CONFIGS}.get(int(r.resource_type), BROKER_CONFIGS)
            return altered(now, [(c.name, int(c.config_operation), c.value) for c in r.configs], table)

        return self._alter(request, header, session, change)

    def _alter(
        self,
        request: Any,
        header: P.RequestHeader,
        session: SaslSession | None,
        change: Callable[[Any, Mapping[str, str]], list[tuple[str, str | None]]],
    ) -> Any:
        answers = []
        twice = duplicates(f"{int(r.resource_type)}:{r.resource_name}" for r in request.resources)
        for r in request.resources:
            kind, why = self._kind(r)
            if kind is None:
                answers.append(self._resource_error(r, INVALID_REQUEST, why))
                continue
            refusal = self._config_refusal(session, Operation.ALTER_CONFIGS, kind, r)  # both APIs' one check
            if refusal is not None:
                answers.append(self._resource_error(r, *refusal))
                continue
            if f"{int(r.resource_type)}:{r.resource_name}" in twice:
                answers.append(self._resource_error(r, INVALID_REQUEST, "Duplicate resource in request."))
                continue
            names = [c.name for c in r.configs]
            if len(set(names)) != len(names):
                answers.append(self._resource_error(r, INVALID_REQUEST, "Error due to duplicate config keys"))
                continue
            if kind == "topic":
                try:
                    code, message = self.log.alter_configs(
                        r.resource_name, functools.partial(change, r), validate_only=request.validate_only
                    )
                except ConfigProblem as exc:
                    code, message = INVALID_CONFIG, str(exc)
            elif kind == "group":
                code, message = self._alter_group(r, change, request.validate_only)
            else:
                code, message = self._alter_broker(r, change, request.validate_only)
            answers.append(self._resource_error(r, code, message))
        return self._response(header, responses=answers)

    def _alter_broker(
        self, r: Any, change: Callable[[Any, Mapping[str, str]], list[tuple[str, str | None]]], validate_only: bool
    ) -> tuple[int, str | None]:
        store = self.broker_configs
        if store is None:
            return INVALID_REQUEST, "this broker keeps no dynamic broker configs"
        try:
            kept = check_broker_configs(change(r, store.values()))
        except ConfigProblem as exc:
            return INVALID_CONFIG, str(exc)
        if validate_only:
            return NONE, None
        try:
            store.replace(kept)
        except OSError as exc:
            log.warning("cannot keep the dynamic broker configs: %s", exc)
            return KAFKA_STORAGE_ERROR, f"cannot keep the broker configs: {exc}"
        return NONE, None

    def _alter_group(
        self, r: Any, change: Callable[[Any, Mapping[str, str]], list[tuple[str, str | None]]], validate_only: bool
    ) -> tuple[int, str | None]:
        store = self.group_configs
        assert store is not None  # else _kind refused the resource
        try:
            kept = check_group_configs(change(r, store.get(r.resource_name)))
        except ConfigProblem as exc:
            return INVALID_CONFIG, str(exc)
        if validate_only:
            return NONE, None
        try:
            store.replace(r.resource_name, kept)
        except OSError as exc:
            log.warning("cannot keep the configs of group %r: %s", r.resource_name, exc)
            return KAFKA_STORAGE_ERROR, f"cannot keep the group configs: {exc}"
        return NONE, None


#: A topic key's broker-wide synonym, where luxun's broker has one.
_TOPIC_SYNONYMS: Final = {
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "cleanup.policy": "log.cleanup.policy",
}

#: DescribeConfigs' config sources and Kafka's resource types.
_TOPIC_CONFIG: Final = 1
_DYNAMIC_BROKER_CONFIG: Final = 2
_DYNAMIC_DEFAULT_BROKER_CONFIG: Final = 3
_STATIC_BROKER_CONFIG: Final = 4
_DEFAULT_CONFIG: Final = 5
_GROUP_CONFIG: Final = 8
TOPIC: Final = 2
BROKER: Final = 4
GROUP: Final = 32
_RESOURCE_NAMES: Final = {
    0: "UNKNOWN",
    1: "ANY",
    2: "TOPIC",
    4: "BROKER",
    8: "BROKER_LOGGER",
    16: "CLIENT_METRICS",
    32: "GROUP",
}
#: DescribeConfigs v3+ config types, by TopicConfig.kind.
_CONFIG_TYPES: Final = {"boolean": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7}


def _entry(name: str, value: str, source: int, kind: str, *, read_only: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "read_only": read_only,
        "config_source": source,
        "is_sensitive": False,
        "synonyms": [],
        "config_type": _CONFIG_TYPES.get(kind, 0),
        "documentation": None,
    }
