"""Answers to Kafka requests: one method per API, written once for all its versions.

:class:`KafkaHandler` parses a request frame (:mod:`luxun.kafka.protocol`), calls the
method of its API and encodes the answer at the request's version. Which versions
are served is :data:`VERSIONS` (for the group APIs, the coordinator's own table),
what ApiVersions announces. A request of a version outside that table gets, for
ApiVersions, error UNSUPPORTED_VERSION in the v0 layout with our ranges (KIP-511: the
client then retries with a version we have); for any other API the connection is
closed, as Kafka does with a request it cannot parse.

The admin APIs of topics, configs and records (CreatePartitions, DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs, DeleteRecords) are answered by
:class:`~luxun.kafka.admin.KafkaAdmin`; OffsetDelete by the group coordinator.

Produce with ``acks=0`` gets no response at all, as in Kafka. A Fetch waits up to its
``max_wait`` for ``min_bytes`` on a condition every append to one of its partitions
sets (the long-poll machinery of the Thrift consume; a produce completes it at once).

With SASL on (``sasl``, see :mod:`luxun.kafka.sasl`), a connection's frames go to
:meth:`KafkaHandler.handle_auth_frame` until it has logged in, as in Kafka's
``SaslServerAuthenticator``: ApiVersions is answered; SaslHandshake (v0-v1) picks a
mechanism (UNSUPPORTED_SASL_MECHANISM with the enabled ones, then the connection is
closed, for one not enabled); the tokens follow in SaslAuthenticate requests (v0-v2)
after a v1 handshake, or as bare size-prefixed frames after a v0 one; a refused
login answers SASL_AUTHENTICATION_FAILED with Kafka's message and closes; any other
request closes the connection. After it, every request carries the session, and each
API checks its ACLs (:mod:`luxun.kafka.acls`, docs/kafka-acls.md) as Kafka's KafkaApis
does: Produce WRITE, Fetch READ, ListOffsets and Metadata DESCRIBE on each topic, and so
on; the group APIs are checked by :mod:`luxun.kafka.group_acls`. With SASL off
``self.acls`` is None and no check is made. SaslHandshake and
SaslAuthenticate once logged in, or with SASL off, answer ILLEGAL_SASL_STATE (Kafka's
``KafkaApis`` answers).

Thread-safety: one instance serves every connection; each call runs on its
connection's thread.
"""

from __future__ import annotations

import collections
import logging
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

from ..dynamic import DynamicBrokerConfigs
from ..logs import RateLimitedLog
from ..metrics import Metrics
from ..net import DEFAULT_MAX_BUFFERED_BYTES, OutputBudget
from . import protocol as P
from .acl_apis import SecurityApis
from .acls import ALL_OPERATIONS, CLUSTER_NAME, NO_AUTHORIZED_OPERATIONS, Authorizer, Operation, ResourceType, allows
from .admin import KafkaAdmin
from .group_acls import GroupAcls
from .group_configs import GroupConfigStore
from .log import NONE, UNKNOWN_TOPIC_OR_PARTITION, KafkaLog, legal_topic_name
from .responses import FetchPartition, ProducePartition, clean_produce_response, fetch_response, produce_response
from .sasl import AuthenticationFailed, Authenticator, SaslSession, UserStore

__all__ = ["VERSIONS", "KafkaHandler"]

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

PRODUCE: Final = 0
FETCH: Final = 1
LIST_OFFSETS: Final = 2
METADATA: Final = 3
SASL_HANDSHAKE: Final = 17
API_VERSIONS: Final = 18
CREATE_TOPICS: Final = 19
DELETE_TOPICS: Final = 20
INIT_PRODUCER_ID: Final = 22
DESCRIBE_CONFIGS: Final = 32
SASL_AUTHENTICATE: Final = 36
DESCRIBE_ACLS: Final = 29
CREATE_ACLS: Final = 30
DELETE_ACLS: Final = 31
DELETE_GROUPS: Final = 42
DESCRIBE_USER_SCRAM_CREDENTIALS: Final = 50
ALTER_USER_SCRAM_CREDENTIALS: Final = 51
DESCRIBE_CLUSTER: Final = 60
CREATE_PARTITIONS: Final = 37
DELETE_RECORDS: Final = 21
ALTER_CONFIGS: Final = 33
INCREMENTAL_ALTER_CONFIGS: Final = 44

#: The versions served of the APIs this module answers: min, max.
VERSIONS: Final[dict[int, tuple[int, int]]] = {
    PRODUCE: (3, 9),
    FETCH: (4, 12),
    LIST_OFFSETS: (1, 7),
    METADATA: (0, 12),
    API_VERSIONS: (0, 3),
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 6),
    INIT_PRODUCER_ID: (0, 4),
    DESCRIBE_CONFIGS: (1, 4),
    DESCRIBE_CLUSTER: (0, 1),
    SASL_HANDSHAKE: (0, 1),
    SASL_AUTHENTICATE: (0, 2),
    CREATE_PARTITIONS: (0, 3),
    DELETE_RECORDS: (0, 2),
    ALTER_CONFIGS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    DESCRIBE_ACLS: (1, 3),
    CREATE_ACLS: (1, 3),
    DELETE_ACLS: (1, 3),
}
#: Served where SCRAM credentials are kept: the SASL users file, or with SASL off the broker's store.
SCRAM_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
}

UNSUPPORTED_VERSION: Final = 35
INVALID_REQUEST: Final = 42
TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Final = 53
INVALID_REPLICATION_FACTOR: Final = 38
TOPIC_AUTHORIZATION_FAILED: Final = 29
GROUP_AUTHORIZATION_FAILED: Final = 30
CLUSTER_AUTHORIZATION_FAILED: Final = 31
UNSUPPORTED_SASL_MECHANISM: Final = 33
ILLEGAL_SASL_STATE: Final = 34
SASL_AUTHENTICATION_FAILED: Final = 58
INVALID_REPLICA_ASSIGNMENT: Final = 39
CLUSTER_ID: Final = "luxun-" + uuid.uuid5(uuid.NAMESPACE_DNS, "luxun").hex[:16]
#: Fetch waits at most this long whatever the client asks (Kafka clients ask 500 ms).
MAX_FETCH_WAIT_S: Final = 30.0
_I32: Final = struct.Struct(">i")
_READ, _WRITE, _DESCRIBE_CONFIGS = Operation.READ, Operation.WRITE, Operation.DESCRIBE_CONFIGS
_TOPIC, _CLUSTER = ResourceType.TOPIC, ResourceType.CLUSTER


class HeldReply(list[Any]):
    """A Fetch answer's buffers that hold ``held`` bytes of the output budget until
    :meth:`release` (the server calls it once the answer is sent, or dropped)."""

    def __init__(self, parts: list[Any], budget: OutputBudget, held: int) -> None:
        super().__init__(parts)
        self._budget = budget
        self._held = held

    def release(self) -> None:
        held, self._held = self._held, 0
        self._budget.give(held)


class KafkaHandler:
    """Answers Kafka requests over ``kafka_log``.

    Args:
        kafka_log: the topics (shared with the Thrift port).
        node_id: this broker's id in Metadata (``brokerid``).
        host, port: what Metadata announces (the advertised listener).
        groups: the group coordinator (``handle(api_key, version, request, ...)`` and
            ``VERSIONS``), or None: group APIs are not announced.
        metrics: counters of requests per API and version and errors per code.
        sasl: the mechanisms and users when SASL is on; None: off.
        acls: the authorizer (:mod:`luxun.kafka.acls`): with SASL on, or off with
            ``authorizer.class.name`` (connections are then User:ANONYMOUS); None:
            nothing is checked, as a Kafka broker without an authorizer.
        scram_users: with SASL off, where the SCRAM credential APIs keep credentials
            (None: those APIs are not served then).
        transactions: the transaction coordinator (:mod:`luxun.kafka.transactions`), or
            None: transactional producers are refused (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
        broker_configs: the broker configs Kafka clients may change (the admin APIs,
            :mod:`luxun.kafka.admin`); None: none.
        group_configs: where groups' configs are kept (Kafka 4.0's group configs,
            :mod:`luxun.kafka.group_configs`); None: a GROUP resource is INVALID_REQUEST.
    """

    def __init__(
        self,
        kafka_log: KafkaLog,
        *,
        node_id: int,
        host: str,
        port: int,
        groups: Any = None,
        metrics: Metrics | None = None,
        fetch_max_bytes: int = 57671680,
        sasl: Authenticator | None = None,
        output_budget: OutputBudget | None = None,
        acls: Authorizer | None = None,
        scram_users: UserStore | None = None,
        transactions: Any = None,
        broker_configs: DynamicBrokerConfigs | None = None,
        group_configs: GroupConfigStore | None = None,
    ) -> None:
        self.log = kafka_log
        self.metrics = metrics or Metrics()
        #: Most record bytes in one Fetch answer, whatever the request asks (fetch.max.bytes).
        self.fetch_max_bytes = fetch_max_bytes
        #: Fetch answers read and not sent yet, all connections together.
        self.output_budget = output_budget or OutputBudget(
            max(DEFAULT_MAX_BUFFERED_BYTES, 2 * fetch_max_bytes), self.metrics
        )
        self.node_id = node_id
        self.host = host
        self.port = port
        self.groups = groups
        self.sasl = sasl
        #: None without an authorizer (SASL off and no authorizer.class.name): no check
        #: is made (Produce and Fetch call nothing).
        self.acls = acls
        #: SCRAM credentials: the SASL users file, or with SASL off the broker's own
        #: store of them (as Kafka keeps them whatever its listeners); None: not served.
        credentials = sasl.users if sasl is not None else scram_users
        self.security = SecurityApis(self.acls, credentials)
        self.group_acls = GroupAcls(groups, self.acls)
        self.versions: dict[int, tuple[int, int]] = dict(VERSIONS)
        if credentials is not None:
            self.versions.update(SCRAM_VERSIONS)
        if groups is not None:
            self.versions.update(groups.VERSIONS)
        self.transactions = transactions
        if transactions is not None:
            self.versions.update(transactions.VERSIONS)
        self._methods: dict[int, Callable[[Any, P.RequestHeader, SaslSession | None], Any]] = {
            PRODUCE: self.produce,
            FETCH: self.fetch,
            LIST_OFFSETS: self.list_offsets,
            METADATA: self.metadata,
            API_VERSIONS: self.api_versions,
            CREATE_TOPICS: self.create_topics,
            DELETE_TOPICS: self.delete_topics,
            INIT_PRODUCER_ID: self.init_producer_id,
            DESCRIBE_CLUSTER: self.describe_cluster,
            SASL_HANDSHAKE: self.sasl_handshake,
            SASL_AUTHENTICATE: self.sasl_authenticate,
            CREATE_ACLS: self._security(self.security.create_acls),
            DESCRIBE_ACLS: self._security(self.security.describe_acls),
            DELETE_ACLS: self._security(self.security.delete_acls),
            DESCRIBE_USER_SCRAM_CREDENTIALS: self._security(self.security.describe_user_scram_credentials),
            ALTER_USER_SCRAM_CREDENTIALS: self._security(self.security.alter_user_scram_credentials),
        }
        #: The broker configs Kafka clients may change (AlterConfigs); None: none.
        self.broker_configs = broker_configs
        self.admin = KafkaAdmin(
            kafka_log,
            node_id=node_id,
            metrics=self.metrics,
            broker_configs=broker_configs,
            acls=self.acls,
            group_configs=group_configs,
        )
        self._methods[CREATE_PARTITIONS] = self.admin.create_partitions
        self._methods[DELETE_RECORDS] = self.admin.delete_records
        self._methods[DESCRIBE_CONFIGS] = self.admin.describe_configs
        self._methods[ALTER_CONFIGS] = self.admin.alter_configs
        self._methods[INCREMENTAL_ALTER_CONFIGS] = self.admin.incremental_alter_configs
        self._flexible: dict[tuple[int, int], bool] = {}

    # -- frames ------------------------------------------------------------------------
    def _is_flexible(self, api_key: int, version: int) -> bool:
        key = (api_key, version)
        flexible = self._flexible.get(key)
        if flexible is None:
            served = self.versions.get(api_key)
            if served is None or not served[0] <= version <= served[1]:
                # Unknown to us: ApiVersions v3+ has a v2 header, but we do not read it.
                return False
            flexible = self._flexible[key] = bool(P.request_schema(api_key, version).__flexible__)
        return flexible

    def handle_frame(self, frame: bytes, peer: Any, session: SaslSession | None = None) -> bytes | list[Any] | None:
        """See :class:`~luxun.kafka.server.FrameHandler`."""
        header, request = self._read(frame)
        if request is None:
            return self._api_versions_fallback(header)
        return self._answer(header, request, peer, session)

    def handle_frames(
        self, frames: list[bytes], peer: Any, session: SaslSession | None = None
    ) -> tuple[list[bytes | list[Any] | None], ValueError | None]:
        """See :class:`~luxun.kafka.server.FrameHandler`. Consecutive requests for one
        partition of one topic (no transactional id, no ACLs to ask) are stored with
        :meth:`KafkaLog.produce_many`; everything else as :meth:`handle_frame` does."""
        answers: list[bytes | list[Any] | None] = []
        run: list[tuple[P.RequestHeader, Any]] = []  # requests for the same partition, not yet stored
        run_of: tuple[str, int] | None = None
        counted: dict[tuple[int, int], int] = {}
        try:
            for frame in frames:
                header, request = self._read(frame, counted)
                one = self._one_partition(header, request, session)
                if run and one != run_of:
                    self._produce_run(run, answers)
                if one is not None:
                    run.append((header, request))
                    run_of = one
                elif request is None:
                    answers.append(self._api_versions_fallback(header))
                else:
                    answers.append(self._answer(header, request, peer, session))
        except ValueError as exc:
            self._produce_run(run, answers)  # the requests before it, as if handled one by one
            return answers, exc
        finally:
            self.metrics.count_kafka_requests(counted)
        self._produce_run(run, answers)
        return answers, None

    def _one_partition(
        self, header: P.RequestHeader, request: Any, session: SaslSession | None
    ) -> tuple[str, int] | None:
        """(topic, partition) of a Produce that writes one partition, with no
        transactional id, from a connection no ACL is asked for; else None."""
        if header.api_key != PRODUCE or request is None or request.transactional_id is not None:
            return None
        if self.acls is not None and session is not None:  # produce() asks them
            return None
        topics = request.topic_data
        if len(topics) != 1 or len(topics[0].partition_data) != 1:
            return None
        return topics[0].name, topics[0].partition_data[0].index

    def _produce_run(self, run: list[tuple[P.RequestHeader, Any]], answers: list[bytes | list[Any] | None]) -> None:
        """Store a run of Produce requests for one partition (see :meth:`handle_frames`),
        append their answers, and empty ``run``."""
        if not run:
            return
        t = run[0][1].topic_data[0]
        name, index = t.name, t.partition_data[0].index
        results = self.log.produce_many(name, index, [r.topic_data[0].partition_data[0].records for _, r in run])
        for (header, request), r in zip(run, results, strict=True):
            if r.error == NONE and r.message is None and not r.record_errors:
                body = clean_produce_response(
                    header.api_version, name, index, r.base_offset, r.log_append_time, r.log_start_offset
                )
            else:
                body = produce_response(header.api_version, [(name, [self._produce_answer(name, index, r)])])
            answers.append(None if request.acks == 0 else self._frame(header, body))
        run.clear()

    def _read(self, frame: bytes, counted: dict[tuple[int, int], int] | None = None) -> tuple[P.RequestHeader, Any]:
        """A request frame's header and request (counted in the metrics, or in
        ``counted`` for the caller to add); request None: an ApiVersions of a version not
        served (answered by :meth:`_api_versions_fallback`).

        Raises:
            ProtocolError: the frame does not parse, or its API version is not served.
        """
        header = P.parse_request_header(frame, self._is_flexible)
        key, version = header.api_key, header.api_version
        served = self.versions.get(key)
        if counted is None:
            self.metrics.count_kafka_request(key, version)
        else:
            counted[key, version] = counted.get((key, version), 0) + 1
        if served is None or not served[0] <= version <= served[1]:
            if key == API_VERSIONS:
                return header, None
            self.metrics.count_kafka_error(UNSUPPORTED_VERSION)
            raise P.ProtocolError(
                f"API {key} v{version} is not supported"
                + (f" (this broker serves v{served[0]}..v{served[1]})" if served else "")
            )
        return header, P.read_request(header, frame)

    def _answer(
        self, header: P.RequestHeader, request: Any, peer: Any, session: SaslSession | None
    ) -> bytes | list[Any] | None:
        """The response frame to a request read by :meth:`_read` (None: none)."""
        key, version = header.api_key, header.api_version
        method = self._methods.get(key)
        if method is not None:
            response = method(request, header, session)
        elif self.transactions is not None and key in self.transactions.VERSIONS:
            response = self.transactions.handle(key, version, request, session)
        else:
            response = self.group_acls.handle(
                key, version, request, session, client_id=header.client_id, client_host=peer[0]
            )
        if response is None:
            return None
        if isinstance(response, (bytes, list)):  # laid out by hand (luxun.kafka.responses)
            return self._frame(header, response)
        return P.encode_response(header, response)

    def _frame(self, header: P.RequestHeader, body: bytes | list[Any]) -> bytes | list[Any]:
        """A response frame around a body laid out by hand: bytes, or buffers to send in order."""
        head = _I32.pack(header.correlation_id)
        if self._is_flexible(header.api_key, header.api_version):
            head += b"\0"  # response header v1: no tagged fields
        if isinstance(body, bytes):
            return _I32.pack(len(head) + len(body)) + head + body
        size = len(head) + sum(len(b) for b in body)
        if isinstance(body, HeldReply):  # keeps its hold on the output budget until sent
            body.insert(0, _I32.pack(size) + head)
            return body
        return [_I32.pack(size) + head, *body]

    def _response(self, header: P.RequestHeader, **values: Any) -> Any:
        return P.build(P.response_schema(header.api_key, header.api_version), **values)

    def _security(self, api: Callable[[Any, SaslSession | None], dict[str, Any]]) -> Callable[..., Any]:
        """An API of :class:`~luxun.kafka.acl_apis.SecurityApis` as a method of ``_methods``."""

        def method(request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
            values = api(request, session)
            for code in _error_codes(values):
                self.metrics.count_kafka_error(code)
            return self._response(header, **values)

        return method

    # -- ACL checks (SASL on only: with it off, self.acls is None and none is made) --------
    def _may(self, session: SaslSession | None, op: Operation, rtype: ResourceType, name: str) -> bool:
        """Whether ``session`` may do ``op`` on the resource (always with SASL off)."""
        return allows(self.acls, session, op, rtype, name)

    def _operations(self, session: SaslSession | None, rtype: ResourceType, name: str, asked: bool) -> int:
        """KIP-430's authorized operations, or the marker of "not asked"."""
        if not asked:
            return NO_AUTHORIZED_OPERATIONS
        if session is None or self.acls is None:
            return ALL_OPERATIONS[rtype]
        return self.acls.authorized_operations(session, rtype, name)

    # -- ApiVersions -------------------------------------------------------------------
    def _api_keys(self) -> list[dict[str, int]]:
        return [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(self.versions.items())]

    def api_versions(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        return self._response(header, error_code=NONE, api_keys=self._api_keys())

    def _api_versions_fallback(self, header: P.RequestHeader) -> bytes:
        """KIP-511: an ApiVersions of a version we lack, answered in the v0 layout."""
        self.metrics.count_kafka_error(UNSUPPORTED_VERSION)
        v0 = P.RequestHeader(header.api_key, 0, header.correlation_id, header.client_id, header.body_offset)
        response = P.build(
            P.response_schema(API_VERSIONS, 0), error_code=UNSUPPORTED_VERSION, api_keys=self._api_keys()
        )
        return P.encode_response(v0, response)

    # -- Metadata ----------------------------------------------------------------------
    def _brokers(self) -> list[dict[str, Any]]:
        return [{"node_id": self.node_id, "broker_id": self.node_id, "host": self.host, "port": self.port}]

    def _topic_metadata(
        self, name: str, create: bool, may_create: bool = True, operations: int = NO_AUTHORIZED_OPERATIONS
    ) -> dict[str, Any]:
        """``create``: the request allows auto-creation; ``may_create``: the session's
        user may create topics (else, where creation would happen, TOPIC_AUTHORIZATION_FAILED,
        as Kafka answers a user without CREATE)."""
        info = self.log.describe(name)
        if info is None and create and legal_topic_name(name) is None:
            if not may_create and self.log.topics.auto_create:
                self.metrics.count_kafka_error(TOPIC_AUTHORIZATION_FAILED)
                return {"error_code": TOPIC_AUTHORIZATION_FAILED, "name": name, "partitions": []}
            code, message = self.log.auto_create(name)
            if code != NONE:
                log.debug("auto-creating topic %r: %s", name, message)
            info = self.log.describe(name)
        if info is None:
            bad = legal_topic_name(name) is not None
            return {"error_code": 17 if bad else UNKNOWN_TOPIC_OR_PARTITION, "name": name, "partitions": []}
        partitions = [
            {
                "error_code": NONE,
                "partition_index": p,
                "leader_id": self.node_id,
                "leader_epoch": 0,
                "replica_nodes": [self.node_id],
                "isr_nodes": [self.node_id],
                "offline_replicas": [],
            }
            for p in range(info.partitions)
        ]
        return {
            "error_code": NONE,
            "name": name,
            "topic_id": info.topic_id,
            "is_internal": False,
            "partitions": partitions,
            "topic_authorized_operations": operations,
        }

    def metadata(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        """With SASL on: a topic asked for without DESCRIBE is answered
        TOPIC_AUTHORIZATION_FAILED (whether it exists or not), one to auto-create without
        CREATE on the cluster or the topic too; asked for all topics, those without
        DESCRIBE are left out (Kafka's KafkaApis)."""
        ops = getattr(request, "include_topic_authorized_operations", False)
        if request.topics is None or (header.api_version == 0 and not request.topics):
            names = [info.name for info in self.log.list_topics()]
            if self.acls is not None and session is not None:
                names = self.acls.allowed_names(session, Operation.DESCRIBE, ResourceType.TOPIC, names)
            topics = [self._topic_metadata(n, False, operations=self._operations(session, ResourceType.TOPIC, n, ops))
                      for n in names]  # fmt: skip
        else:
            create = getattr(request, "allow_auto_topic_creation", True)
            may_cluster = self._may(session, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME)
            topics = []
            for t in request.topics:
                name = t.name
                if name is None:
                    continue
                if not self._may(session, Operation.DESCRIBE, ResourceType.TOPIC, name):
                    self.metrics.count_kafka_error(TOPIC_AUTHORIZATION_FAILED)
                    topics.append({"error_code": TOPIC_AUTHORIZATION_FAILED, "name": name, "partitions": [],
                                   "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS})  # fmt: skip
                    continue
                may = may_cluster or self._may(session, Operation.CREATE, ResourceType.TOPIC, name)
                operations = self._operations(session, ResourceType.TOPIC, name, ops)
                topics.append(self._topic_metadata(name, create, may, operations))
        cluster_ops = getattr(request, "include_cluster_authorized_operations", False)
        return self._response(
            header,
            brokers=self._brokers(),
            cluster_id=CLUSTER_ID,
            controller_id=self.node_id,
            topics=topics,
            cluster_authorized_operations=self._operations(session, ResourceType.CLUSTER, CLUSTER_NAME, cluster_ops),
        )

    def describe_cluster(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        ops = request.include_cluster_authorized_operations
        return self._response(
            header,
            error_code=NONE,
            cluster_id=CLUSTER_ID,
            controller_id=self.node_id,
            brokers=self._brokers(),
            cluster_authorized_operations=self._operations(session, ResourceType.CLUSTER, CLUSTER_NAME, ops),
        )

    # -- Produce -----------------------------------------------------------------------
    def produce(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        tid = request.transactional_id
        if tid is not None and (
            self.transactions is None or not self._may(session, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid)
        ):
            err = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            refused = [
                (t.name, [ProducePartition(p.index, err, -1, -1, -1, None) for p in t.partition_data])
                for t in request.topic_data
            ]
            self.metrics.count_kafka_error(err)
            return None if request.acks == 0 else produce_response(header.api_version, refused)
        responses = []
        acls = self.acls
        for t in request.topic_data:
            parts = []
            if acls is not None and session is not None and not acls.authorize(session, _WRITE, _TOPIC, t.name):
                self.metrics.count_kafka_error(TOPIC_AUTHORIZATION_FAILED)
                err = TOPIC_AUTHORIZATION_FAILED
                responses.append((t.name, [ProducePartition(p.index, err, -1, -1, -1, None) for p in t.partition_data]))
                continue
            for p in t.partition_data:
                parts.append(self._produce_answer(t.name, p.index, self.log.produce(t.name, p.index, p.records)))
            responses.append((t.name, parts))
        if request.acks == 0:
            return None
        return produce_response(header.api_version, responses)

    def _produce_answer(self, topic: str, partition: int, result: Any) -> ProducePartition:
        """A partition's answer to a Produce (its refusal counted and logged)."""
        if result.error != NONE:
            self.metrics.count_kafka_error(result.error)
            if result.message:
                _limited.warning(
                    f"kafka-produce-{result.error}", "produce to %s-%d refused: %s", topic, partition, result.message
                )
        return ProducePartition(
            partition,
            result.error,
            result.base_offset,
            result.log_append_time,
            result.log_start_offset,
            result.message,
            result.record_errors,
        )

    # -- Fetch -------------------------------------------------------------------------
    def fetch(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        # A partition named twice is answered once, as the last naming asks (Kafka keeps
        # a Fetch's partitions in a map); the answer keeps the order of first naming.
        named: dict[tuple[str, int], Any] = {}
        for t in request.topics:
            for p in t.partitions:
                named[(t.topic, p.partition)] = p
        wanted = [(topic, p) for (topic, _), p in named.items()]
        refused: list[tuple[str, Any]] = []
        acls = self.acls
        if acls is not None and session is not None:
            allowed = set(acls.allowed_names(session, _READ, _TOPIC, {topic for topic, _ in wanted}))
            refused = [(topic, p) for topic, p in wanted if topic not in allowed]
            wanted = [(topic, p) for topic, p in wanted if topic in allowed]
        # fetch.max.bytes caps every answer (KIP-541), v0-v2 (no max_bytes) included.
        asked = request.max_bytes if header.api_version >= 3 else self.fetch_max_bytes
        max_bytes = max(0, min(asked, self.fetch_max_bytes))
        min_bytes = request.min_bytes
        wait_s = min(request.max_wait.total_seconds(), MAX_FETCH_WAIT_S)
        budget = self.output_budget
        isolation = request.isolation_level
        results, held = self._fetch_granted(wanted, max_bytes, isolation)
        try:
            if wait_s > 0 and held < min_bytes and wanted and not self._has_error(results):
                until = time.monotonic() + wait_s

                def enough() -> bool:
                    nonlocal results, held
                    budget.give(held)  # the answer read before is dropped
                    held = 0
                    results, held = self._fetch_granted(wanted, max_bytes, isolation)
                    return held >= min_bytes or self._has_error(results)

                self.log.wait([(topic, p.partition) for topic, p in wanted], until, enough)
            return HeldReply(self._fetch_answer(header, wanted, results, refused), budget, held)
        except BaseException:
            budget.give(held)
            raise

    def _fetch_granted(
        self, wanted: list[tuple[str, Any]], max_bytes: int, isolation: int = 0
    ) -> tuple[list[Any], int]:
        """:meth:`_fetch_once` within what the output budget grants now, and the bytes it
        read (held in the budget until the answer is sent: :class:`HeldReply`). With
        little granted (clients that do not read hold the rest) the answer holds its first
        batch (KIP-74), so every consumer progresses."""
        budget = self.output_budget
        granted = budget.grant(max_bytes)
        try:
            results = self._fetch_once(wanted, granted, progress=granted > 0 or max_bytes == 0, isolation=isolation)
        except BaseException:
            budget.give(granted)
            raise
        held = self._fetched_bytes(results)
        budget.settle(granted, held)
        return results, held

    def _fetch_answer(
        self, header: P.RequestHeader, wanted: list[tuple[str, Any]], results: list[Any], refused: list[Any]
    ) -> list[Any]:
        """The Fetch answer; the ``refused`` partitions (no READ on their topic) get
        TOPIC_AUTHORIZATION_FAILED."""
        responses: dict[str, list[FetchPartition]] = {}
        for topic, p in refused:
            self.metrics.count_kafka_error(TOPIC_AUTHORIZATION_FAILED)
            responses.setdefault(topic, []).append(
                FetchPartition(p.partition, TOPIC_AUTHORIZATION_FAILED, -1, -1, -1, b"")
            )
        for (topic, p), result in zip(wanted, results, strict=True):
            if result.error != NONE:
                self.metrics.count_kafka_error(result.error)
            responses.setdefault(topic, []).append(
                FetchPartition(
                    p.partition,
                    result.error,
                    result.high_watermark,
                    result.high_watermark if result.last_stable_offset < 0 else result.last_stable_offset,
                    result.log_start_offset,
                    # Empty, never null, on errors: as Kafka; librdkafka rejects a null
                    # record set ("invalid MessageSetSize -1") and never sees the error.
                    result.records if result.records is not None else b"",
                    result.aborted,
                )
            )
        return fetch_response(header.api_version, list(responses.items()))

    def _fetch_once(
        self, wanted: list[tuple[str, Any]], max_bytes: int, *, progress: bool = True, isolation: int = 0
    ) -> list[Any]:
        """Each wanted partition's records within the request's ``max_bytes`` and the
        partition's ``partition_max_bytes``, by KIP-74's rule: only the first batch of the
        first partition with data may go over them (so a consumer always progresses);
        every later partition gets only whole batches that fit in what is left, none once
        the budget is spent. So an answer is at most ``max_bytes`` plus one batch, however
        many partitions (or repeats of one partition) a Fetch names. Without ``progress``
        nothing goes over ``max_bytes``."""
        results = []
        left = max_bytes
        served = not progress  # a partition with data answered already (or none may go over)
        for topic, p in wanted:
            limit = min(p.partition_max_bytes, left)
            result = self.log.fetch(
                topic, p.partition, p.fetch_offset, limit, at_least_one=not served, isolation=isolation
            )
            if result.records:
                served = True
                left = max(0, left - len(result.records))
            results.append(result)
        return results

    @staticmethod
    def _fetched_bytes(results: list[Any]) -> int:
        return sum(len(r.records) for r in results if r.records)

    @staticmethod
    def _has_error(results: list[Any]) -> bool:
        return any(r.error != NONE for r in results)

    # -- ListOffsets -------------------------------------------------------------------
    def list_offsets(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        topics = []
        isolation = getattr(request, "isolation_level", 0)
        for t in request.topics:
            parts = []
            may = self._may(session, Operation.DESCRIBE, ResourceType.TOPIC, t.name)
            for p in t.partitions:
                code, offset, ts = (
                    self.log.list_offset(t.name, p.partition_index, p.timestamp, isolation)
                    if may
                    else (TOPIC_AUTHORIZATION_FAILED, -1, -1)
                )
                if code != NONE:
                    self.metrics.count_kafka_error(code)
                parts.append(
                    {
                        "partition_index": p.partition_index,
                        "error_code": code,
                        "timestamp": ts,
                        "offset": offset,
                        "old_style_offsets": [] if offset < 0 else [offset],
                        "leader_epoch": 0 if code == NONE else -1,
                    }
                )
            topics.append({"name": t.name, "partitions": parts})
        return self._response(header, topics=topics)

    # -- topics ------------------------------------------------------------------------
    def create_topics(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        """Each topic checked and created on its own (per-topic errors, as Kafka): a
        name given twice in one request is refused (INVALID_REQUEST, one result for
        it), then replication factor and replica assignments, then, in
        :meth:`KafkaLog.create`, name, existence, partitions, configs and max.topics;
        ``validate_only`` answers the same and makes nothing."""
        may_cluster = self._may(session, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME)
        names = collections.Counter(t.name for t in request.topics)
        results = []
        reserved = 0  # luxun topics the earlier topics of a validate-only request would take
        for t in request.topics:
            if names[t.name] > 1:
                names[t.name] = 0  # one result per duplicated name
                results.append(self._created(t.name, INVALID_REQUEST, "Duplicate topic name.", 0))
                continue
            if names[t.name] == 0:
                continue
            if not may_cluster and not self._may(session, Operation.CREATE, ResourceType.TOPIC, t.name):
                results.append(self._created(t.name, TOPIC_AUTHORIZATION_FAILED, "Authorization failed.", 0))
                continue
            partitions = len(t.assignments) if t.assignments else t.num_partitions
            if partitions == -1:
                partitions = self.log.num_partitions
            code, message = self._check_replicas(t)
            if code == NONE:
                code, message = self.log.create(
                    t.name,
                    partitions,
                    configs=[(c.name, c.value) for c in t.configs],
                    validate_only=request.validate_only,
                    reserved=reserved,
                )
            if code == NONE and request.validate_only:
                reserved += partitions
            results.append(self._created(t.name, code, message, partitions))
        return self._response(header, topics=results)

    def _check_replicas(self, t: Any) -> tuple[int, str | None]:
        """Replication factor and replica assignments of one CreateTopics topic, as a
        Kafka cluster of this one broker judges them."""
        if t.assignments:
            if t.replication_factor != -1 or t.num_partitions != -1:
                return INVALID_REQUEST, (
                    "Both numPartitions or replicationFactor and replicasAssignments were set. "
                    "Both cannot be used at the same time."
                )
            for expected, a in enumerate(sorted(t.assignments, key=lambda a: a.partition_index)):
                if a.partition_index != expected:
                    return INVALID_REPLICA_ASSIGNMENT, (
                        "partitions should be a consecutive 0-based integer sequence, "
                        f"not {sorted(a.partition_index for a in t.assignments)}"
                    )
                if list(a.broker_ids) != [self.node_id]:
                    return INVALID_REPLICA_ASSIGNMENT, (
                        f"partition {a.partition_index} is assigned to brokers {list(a.broker_ids)}: this "
                        f"cluster is one broker, {self.node_id}, so each partition's replicas must be "
                        f"[{self.node_id}]"
                    )
            return NONE, None
        if t.replication_factor not in (-1, 1):
            return INVALID_REPLICATION_FACTOR, (
                f"replication factor {t.replication_factor}: this broker is a cluster of one (use 1 or -1)"
            )
        return NONE, None

    def _created(self, name: str, code: int, message: str | None, partitions: int) -> dict[str, Any]:
        """One topic's CreateTopics result; on success its configs, as DescribeConfigs
        would show them (none yet for a validate-only request: the topic does not exist)."""
        if code != NONE:
            self.metrics.count_kafka_error(code)
            return {
                "name": name,
                "topic_id": uuid.UUID(int=0),
                "error_code": code,
                "error_message": message,
                "num_partitions": -1,
                "replication_factor": -1,
                "configs": None,
            }
        info = self.log.describe(name)
        return {
            "name": name,
            "topic_id": info.topic_id if info else uuid.UUID(int=0),
            "error_code": NONE,
            "error_message": None,
            "num_partitions": partitions,
            "replication_factor": 1,
            "configs": [] if info is None else self.admin.topic_configs(info),
        }

    def delete_topics(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        names = getattr(request, "topic_names", None)
        if names is None:
            names = [t.name for t in request.topics]
        responses = []
        for name in names:
            message: str | None
            if name is not None and not self._may(session, Operation.DELETE, ResourceType.TOPIC, name):
                code, message = TOPIC_AUTHORIZATION_FAILED, "Authorization failed."
            elif name is not None:
                code, message = self.log.delete(name)
            else:
                code, message = UNKNOWN_TOPIC_OR_PARTITION, None
            if code != NONE:
                self.metrics.count_kafka_error(code)
            responses.append({"name": name, "error_code": code, "error_message": message})
        return self._response(header, responses=responses)

    # -- producers ---------------------------------------------------------------------
    def init_producer_id(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        if request.transactional_id is not None and self.transactions is not None:
            return self.transactions.handle(INIT_PRODUCER_ID, header.api_version, request, session)
        if request.transactional_id is not None:
            self.metrics.count_kafka_error(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            return self._response(
                header, error_code=TRANSACTIONAL_ID_AUTHORIZATION_FAILED, producer_id=-1, producer_epoch=-1
            )
        acls = self.acls
        if (
            acls is not None
            and session is not None
            and not acls.authorize(session, Operation.IDEMPOTENT_WRITE, _CLUSTER, CLUSTER_NAME)
            and not acls.authorize_any(session, _WRITE, _TOPIC)  # KIP-679
        ):
            self.metrics.count_kafka_error(CLUSTER_AUTHORIZATION_FAILED)
            return self._response(header, error_code=CLUSTER_AUTHORIZATION_FAILED, producer_id=-1, producer_epoch=-1)
        return self._response(header, error_code=NONE, producer_id=self.log.next_producer_id(), producer_epoch=0)

    # -- SASL --------------------------------------------------------------------------
    def new_session(self, peer: Any = None) -> SaslSession | None:
        """See :class:`~luxun.kafka.server.FrameHandler`: with SASL off and an authorizer,
        an anonymous session (User:ANONYMOUS, already logged in)."""
        if self.sasl is not None:
            return self.sasl.session()
        if self.acls is not None:
            return SaslSession.anonymous(str(peer[0]) if peer else "")
        return None

    def sasl_handshake(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        """A SaslHandshake with SASL off, or once logged in (no re-authentication): as Kafka."""
        self.metrics.count_kafka_error(ILLEGAL_SASL_STATE)
        mechanisms = list(self.sasl.mechanisms) if self.sasl is not None else []
        return self._response(header, error_code=ILLEGAL_SASL_STATE, mechanisms=mechanisms)

    def sasl_authenticate(self, request: Any, header: P.RequestHeader, session: SaslSession | None = None) -> Any:
        """A SaslAuthenticate with SASL off, or once logged in: as Kafka."""
        self.metrics.count_kafka_error(ILLEGAL_SASL_STATE)
        message = (
            "SaslAuthenticate request received after successful authentication"
            if self.sasl is not None
            else "SASL is not enabled on this broker's Kafka port (kafka.sasl.mechanisms)"
        )
        return self._response(header, error_code=ILLEGAL_SASL_STATE, error_message=message, auth_bytes=b"")

    def handle_auth_frame(self, frame: bytes, peer: Any, session: SaslSession) -> bytes:
        """See :class:`~luxun.kafka.server.FrameHandler`: a frame of a connection not logged in."""
        if session.raw:  # after SaslHandshake v0: a bare token, answered by a bare token
            try:
                token = session.step(frame)
            except AuthenticationFailed as exc:
                self.metrics.count_kafka_error(SASL_AUTHENTICATION_FAILED)
                raise P.CloseConnection(
                    f"SASL {session.mechanism} login refused (v0 handshake): {exc}", log_key="kafka-sasl-refused"
                ) from None
            self._logged_in(session, peer)
            return _I32.pack(len(token)) + token
        header = P.parse_request_header(frame, self._is_flexible)
        key, version = header.api_key, header.api_version
        if key == API_VERSIONS and session.mechanism is None:
            out = self.handle_frame(frame, peer, None)
            assert isinstance(out, bytes)
            return out
        self.metrics.count_kafka_request(key, version)
        name = _api_name(key, version)
        served = self.versions.get(key)
        if key not in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
            raise P.CloseConnection(
                f"{name} before SASL authentication (only ApiVersions, SaslHandshake and SaslAuthenticate are "
                "answered until the client logs in)",
                log_key=f"kafka-sasl-early-{key}",
            )
        assert served is not None
        if not served[0] <= version <= served[1]:
            self.metrics.count_kafka_error(UNSUPPORTED_VERSION)
            raise P.ProtocolError(f"{name} v{version} is not supported (this broker serves v{served[0]}..v{served[1]})")
        request = P.read_request(header, frame)
        if key == SASL_HANDSHAKE:
            if session.mechanism is not None:
                self.metrics.count_kafka_error(ILLEGAL_SASL_STATE)
                response = self._response(header, error_code=ILLEGAL_SASL_STATE, mechanisms=list(session.mechanisms))
                raise P.CloseConnection(
                    "a second SaslHandshake during SASL authentication", P.encode_response(header, response)
                )
            if not session.handshake(request.mechanism, version):
                self.metrics.count_kafka_error(UNSUPPORTED_SASL_MECHANISM)
                response = self._response(
                    header, error_code=UNSUPPORTED_SASL_MECHANISM, mechanisms=list(session.mechanisms)
                )
                raise P.CloseConnection(
                    f"SASL mechanism {request.mechanism!r} is not enabled (kafka.sasl.mechanisms: "
                    f"{','.join(session.mechanisms)})",
                    P.encode_response(header, response),
                )
            response = self._response(header, error_code=NONE, mechanisms=list(session.mechanisms))
            return P.encode_response(header, response)
        if session.mechanism is None:
            self.metrics.count_kafka_error(ILLEGAL_SASL_STATE)
            message = "SaslAuthenticate before SaslHandshake: send a SaslHandshake naming the mechanism first"
            response = self._response(header, error_code=ILLEGAL_SASL_STATE, error_message=message, auth_bytes=b"")
            raise P.CloseConnection(message, P.encode_response(header, response))
        try:
            token = session.step(request.auth_bytes)
        except AuthenticationFailed as exc:
            self.metrics.count_kafka_error(SASL_AUTHENTICATION_FAILED)
            response = self._response(
                header, error_code=SASL_AUTHENTICATION_FAILED, error_message=str(exc), auth_bytes=b""
            )
            raise P.CloseConnection(
                f"SASL {session.mechanism} login refused: {exc}",
                P.encode_response(header, response),
                log_key="kafka-sasl-refused",
            ) from None
        if session.user is not None:
            self._logged_in(session, peer)
        response = self._response(header, error_code=NONE, auth_bytes=token, session_lifetime=0)
        return P.encode_response(header, response)

    @staticmethod
    def _logged_in(session: SaslSession, peer: Any) -> None:
        assert session.user is not None
        session.host = str(peer[0]) if peer else ""
        log.debug("Kafka connection from %s logged in as %r with %s", peer, session.user.name, session.mechanism)


def _error_codes(values: Any) -> list[int]:
    """The non-zero ``error_code`` values anywhere in a response's values (for the metrics)."""
    if isinstance(values, dict):
        own = [values["error_code"]] if values.get("error_code") else []
        return own + [c for k, v in values.items() if isinstance(v, list) for item in v for c in _error_codes(item)]
    return []


def _api_name(key: int, version: int) -> str:
    """``"Produce (API 0)"``: the API's name, from kio's schema where it has one."""
    try:
        name = P.request_schema(key, version).__name__.removesuffix("Request")
    except P.ProtocolError:
        return f"API {key}"
    return f"{name} (API {key})"
