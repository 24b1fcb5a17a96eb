"""Answers to Kafka's admin requests on topics and their records: CreatePartitions
(API 37), the config APIs (DescribeConfigs 32, AlterConfigs 33,
IncrementalAlterConfigs 44) and DeleteRecords (API 21), for a cluster of one broker
(this one, leader of every partition). See docs/kafka-admin.md.

Each answers per topic (or resource) as Kafka's broker does: a topic named twice in
one request gets INVALID_REQUEST (one result for it); the others are judged and
changed on their own. With SASL on, a user who is not an admin gets
TOPIC_AUTHORIZATION_FAILED (CLUSTER_AUTHORIZATION_FAILED for the broker's configs)
for each, from one check per API (:func:`refused`), where an authorizer may take over.

Thread-safety: one instance serves every connection; changes to a topic's settings
are serialised in :class:`~luxun.kafka.log.KafkaLog`.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable
from typing import Any, Final

from ..metrics import Metrics
from . import protocol as P
from .log import NONE, KafkaLog
from .sasl import SaslSession

__all__ = ["KafkaAdmin"]

log = logging.getLogger(__name__)

INVALID_REPLICA_ASSIGNMENT: Final = 39
INVALID_REQUEST: Final = 42
TOPIC_AUTHORIZATION_FAILED: Final = 29
GROUP_AUTHORIZATION_FAILED: Final = 30


def refused(session: SaslSession | None, what: str) -> str | None:
    """Why ``session``'s user may not ``what`` (None: it may): only admins may, with SASL on."""
    if session is None or session.admin:
        return None
    name = session.user.name if session.user is not None else "?"
    return f"user {name!r} may not {what}: only users with the admin role in kafka.sasl.users.file may"


def duplicates(names: Iterable[str]) -> set[str]:
    """The names given more than once."""
    return {n for n, k in collections.Counter(names).items() if k > 1}


class KafkaAdmin:
    """The admin APIs over ``kafka_log`` (see the module).

    Args:
        kafka_log: the topics.
        node_id: this broker's id (the only valid replica).
        metrics: errors are counted per code.
    """

    def __init__(self, kafka_log: KafkaLog, *, node_id: int, metrics: Metrics) -> None:
        self.log = kafka_log
        self.node_id = node_id
        self.metrics = metrics

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
        why = refused(session, "alter topics")
        if why is not None:
            code = self._counted(TOPIC_AUTHORIZATION_FAILED)
            results = [{"name": t.name, "error_code": code, "error_message": why} for t in request.topics]
            return self._response(header, results=results)
        twice = duplicates(t.name for t in request.topics)
        results = []
        reserved = 0
        for t in request.topics:
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
        why = refused(session, "delete records")
        topics = []
        for t in request.topics:
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

    # -- OffsetDelete (answered by the group coordinator) -----------------------------
    def refuse_offset_delete(self, request: Any, header: P.RequestHeader, session: SaslSession | None) -> Any:
        """An OffsetDelete of a user who may not (as DeleteGroups): GROUP_AUTHORIZATION_FAILED;
        None: the coordinator answers it."""
        if refused(session, "delete group offsets") is None:
            return None
        return self._response(header, error_code=self._counted(GROUP_AUTHORIZATION_FAILED), topics=[])
