"""Broker configuration: Java Luxun's ``server.properties``, validated into a frozen dataclass.

An existing Luxun ``server.properties`` starts this broker as it is::

    config = BrokerConfig.from_file("conf/server.properties", overrides={"port": 9100})

Every key Java Luxun's ``ServerConfig`` reads is accepted (table below). A key that
Java knows but this broker does not use is accepted with one ``INFO`` line on the
``luxun.config`` logger. A key nobody knows is a :class:`~luxun.errors.ConfigError`
naming it (and the closest known key); so is a bad value, naming key and value
(except the password, which is never echoed). Command-line flags come in as
``overrides`` (keyed by field name) and win over the file.

=========================================  ============================  ====================
key                                        field                         default
=========================================  ============================  ====================
``brokerid``                               ``broker_id``                 0 (Java: required)
``port``                                   ``port``                      9092
``log.dir``                                ``data_dir``                  ``./luxun-data``
``log.flush.count``                        ``flush_count``               -1 (never)
``log.default.flush.interval.ms``          ``flush_interval_ms``         the scheduler interval
``log.default.flush.scheduler.interval.ms`` ``flush_scheduler_interval_ms`` -1 (never)
``topic.flush.intervals.ms``               ``topic_flush_intervals_ms``  none
``log.retention.hours``                    ``retention_hours``           168
``topic.log.retention.hours``              ``topic_retention_hours``     none
``log.retention.size``                     ``retention_size_bytes``      -1 (unlimited)
``log.cleanup.interval.mins``              ``cleanup_interval_mins``     10
``password``                               ``password``                  unset (no deleteTopic)
``max.message.size``                       ``max_message_size_bytes``    1 MiB
``log.backfile.page.size``                 ``data_page_size_bytes``      128 MiB
``monitoring.period.secs``                 ``monitoring_period_secs``    600 (unused here)
``host`` (ours)                            ``host``                      127.0.0.1
``metrics.host`` (ours)                    ``metrics_host``              127.0.0.1
``metrics.port`` (ours)                    ``metrics_port``              9093 (0 = off)
``auto.create.topics.enable`` (ours)       ``auto_create_topics``        true
``max.topics`` (ours)                      ``max_topics``                0 (no limit)
``max.open.topics`` (ours)                 ``max_open_topics``           0 (sized from the limits)
``busy.poll.us`` (ours)                    ``busy_poll_us``              200 (0 = never)
``async.batch.us`` (ours)                  ``async_batch_us``            200 (0 = never)
``follow.client.cpu`` (ours)               ``follow_client_cpu``         true
``kafka.sasl.mechanisms`` (ours)           ``kafka_sasl_mechanisms``     none (SASL off)
``kafka.sasl.users.file`` (ours)           ``kafka_sasl_users_file``     none
``kafka.allow.unauthenticated`` (ours)     ``kafka_allow_unauthenticated`` false
``allow.everyone.if.no.acl.found`` (ours)  ``kafka_allow_everyone_if_no_acl_found`` false
``authorizer.class.name`` (ours)           ``kafka_authorizer``          none (ACLs with SASL on only)
=========================================  ============================  ====================

The Kafka port's keys (``kafka.*``, ``num.partitions``, ``delete.topic.enable``...) are
listed in the README. The Kafka port listens on a non-loopback address only with
SASL on (``kafka.sasl.mechanisms``) or ``kafka.allow.unauthenticated=true``: anything
else is a :class:`ConfigError`, so the broker refuses to start before it binds.

Where the Java defaults come from: ``com.leansoft.luxun.server.ServerConfig``,
``log.ILog`` and ``conf/server.properties`` of bulldog2011/luxun, and
``BigArrayImpl`` of bigqueue 0.7.x (data page sizes). Java's ``Properties`` ignores
keys it does not read, so our own three keys do not stop a file from working with
Java Luxun.

Differences from Java Luxun, all deliberate:

* ``brokerid`` and ``log.dir`` are optional (defaults above); Java requires both.
* ``log.backfile.page.size`` may go down to 4 KiB (Java: 32 MiB), for tests.
* ``max.message.size`` may go up to the largest data page (Java: 2 MiB, the 32 MiB
  minimum page / 16). An item must still fit in one data page; bigger ones are
  refused by the storage with ``MESSAGE_SIZE_TOO_LARGE``.
* ``topic.log.retention.hours`` values must be >= 1 (Java did not check).
* No ``password`` means deleteTopic is refused (Java let anyone delete). A value
  without a ``plain:``/``md5:``/``crc32:`` prefix is a plain password, and a plain
  password may contain ``:`` (Java refused both).
* Numbers may be surrounded by whitespace (Java's ``Integer.valueOf`` refused
  trailing spaces). A relative ``log.dir`` is resolved against the working
  directory once, at load time, as Java's ``new File(dir)`` does.

Reading ``.properties`` text is :mod:`luxun.properties`' job and the password
schemes are :mod:`luxun.passwords`'; their public names are re-exported here.

Thread-safety: a :class:`BrokerConfig` is immutable and can be shared freely.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from bigarray import InvalidNameError
from bigarray.format import DEFAULT_DATA_PAGE_SIZE, MAX_DATA_PAGE_SIZE, MIN_DATA_PAGE_SIZE

from .errors import ConfigError  # re-exported: config users catch it from here
from .passwords import PASSWORD_SCHEMES, check_password, parse_password, password_to_send
from .properties import load_properties, parse_properties

log = logging.getLogger("luxun.config")

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

# -- defaults ------------------------------------------------------------------------
#: Where topics live (DESIGN.md section 7). Java Luxun has no default (``log.dir`` is
#: required); its sample ``server.properties`` uses ``./data``.
DEFAULT_DATA_DIR = "./luxun-data"
#: QueueService bind address. Java Luxun bound every interface.
DEFAULT_HOST = "127.0.0.1"
#: QueueService port; Java ``ServerConfig.getPort()`` default.
DEFAULT_PORT = 9092
#: Java requires ``brokerid``; we only name it in logs and error messages.
DEFAULT_BROKER_ID = 0
#: Metrics (HTTP) bind address and port (ours; Java exposed JMX instead).
DEFAULT_METRICS_HOST = "127.0.0.1"
DEFAULT_METRICS_PORT = 9093
#: Flush a topic after this many appends; <= 0: never (Java default -1).
DEFAULT_FLUSH_COUNT = -1
#: How often the flusher looks at topics; <= 0: no flusher (Java default -1).
DEFAULT_FLUSH_SCHEDULER_INTERVAL_MS = -1
#: Flush a topic when its last flush is older than this; <= 0: never. Java's default
#: is the scheduler interval, which is what :meth:`BrokerConfig.from_properties` does.
DEFAULT_FLUSH_INTERVAL_MS = -1
#: Delete data pages older than this (Java default 24 * 7).
DEFAULT_RETENTION_HOURS = 168
#: Prune old pages while a topic's files exceed this; < 0: unlimited (Java default -1;
#: the sample server.properties sets 1 GiB).
DEFAULT_RETENTION_SIZE_BYTES = -1
#: How often retention runs (Java default 10).
DEFAULT_CLEANUP_INTERVAL_MINS = 10
#: Largest item accepted by produce (Java ``ILog.DEFAULT_MESSAGE_SIZE``, 1 MiB).
DEFAULT_MAX_MESSAGE_SIZE_BYTES = 1024 * 1024
#: Data page size of new topics (bigqueue ``DEFAULT_DATA_PAGE_SIZE``, 128 MiB).
DEFAULT_DATA_PAGE_SIZE_BYTES = DEFAULT_DATA_PAGE_SIZE
#: Java's statistics window for JMX (default 600); accepted, unused here.
DEFAULT_MONITORING_PERIOD_SECS = 600

#: Produce to an unknown topic creates it (Java Luxun always did; Kafka's default).
#: When false, such a produce answers TOPIC_NOT_EXIST.
DEFAULT_AUTO_CREATE_TOPICS = True
#: Most topics the broker holds; 0: no limit. One more answers INTERNAL_ERROR naming
#: the limit (the IDL has no better code).
DEFAULT_MAX_TOPICS = 0
#: Topics kept open at once (least recently used ones are closed and reopened on use);
#: 0: as many as the descriptor and mapping limits hold at an open topic's worst cost,
#: at most 1,000 (``luxun.topics.open_topics_limit``): 1,000 under the usual raised
#: descriptor limits, 59 under a 1,024 one. Each Kafka partition is a topic.
DEFAULT_MAX_OPEN_TOPICS = 0
#: Microseconds a lone connection polls for its next call before it sleeps (luxun.thrift.server).
DEFAULT_BUSY_POLL_US = 200
#: Microseconds a lone connection streaming asyncProduce calls waits before its next read.
DEFAULT_ASYNC_BATCH_US = 200
#: A lone Thrift connection's calls are served on the CPU its client sends from (instead
#: of busy polling): luxun.thrift.server, "Following the client's CPU".
DEFAULT_FOLLOW_CLIENT_CPU = True
#: The Kafka-protocol port (0: off, the default: the Thrift port is Kafka's usual 9092).
DEFAULT_KAFKA_PORT = 0
#: Partitions of a topic a Kafka client creates without saying (Kafka's num.partitions).
DEFAULT_NUM_PARTITIONS = 1
#: Kafka DeleteTopics needs this on: the Kafka protocol has no password, and the
#: Thrift deleteTopic needs the broker's password.
DEFAULT_DELETE_TOPIC_ENABLE = False
#: Largest record batch a Kafka producer may send (Kafka's default, 1 MiB + 12).
DEFAULT_KAFKA_MESSAGE_MAX_BYTES = 1048588
#: Largest Kafka request (Kafka's socket.request.max.bytes default, 100 MiB).
DEFAULT_KAFKA_REQUEST_MAX_BYTES = 104857600
#: Most record bytes in one Fetch answer, whatever the request asks (Kafka's broker
#: fetch.max.bytes default, 55 MiB).
DEFAULT_KAFKA_FETCH_MAX_BYTES = 57671680
#: Fetch answer bytes read and not sent yet, all Kafka connections together (at least
#: twice fetch.max.bytes).
DEFAULT_KAFKA_FETCH_BUFFER_BYTES = 256 << 20
#: A new Kafka group's first join waits this long for more members before its first
#: rebalance (Kafka's default; 0: the first member starts at once).
DEFAULT_GROUP_INITIAL_REBALANCE_DELAY_MS = 3000
#: Kafka consumer groups the coordinator keeps in memory at most (ours; Kafka has no
#: such limit): a JoinGroup that would make one more is refused (GROUP_MAX_SIZE_REACHED).
DEFAULT_MAX_GROUPS = 10_000
#: An empty Kafka group's committed offsets are dropped this long after it became
#: empty (Kafka's offsets.retention.minutes default, 7 days).
DEFAULT_OFFSETS_RETENTION_MINUTES = 7 * 24 * 60
#: How often expired offsets are looked for (Kafka's offsets.retention.check.interval.ms).
DEFAULT_OFFSETS_RETENTION_CHECK_INTERVAL_MS = 600_000
#: Kafka transactions (luxun.kafka.transactions): the longest transaction timeout a
#: producer may ask, how long an unused transactional id is kept, how often timed-out
#: transactions are looked for (Kafka's defaults), and the most transactional ids kept
#: (ours; Kafka has no such limit).
DEFAULT_TRANSACTION_MAX_TIMEOUT_MS = 900_000
DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000
DEFAULT_TRANSACTION_ABORT_CHECK_INTERVAL_MS = 10_000
DEFAULT_MAX_TRANSACTIONAL_IDS = 100_000
#: The SASL mechanisms the Kafka port can offer (``kafka.sasl.mechanisms`` names a subset;
#: none: SASL off). luxun.kafka.sasl implements them.
KAFKA_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: Whether the Kafka port may listen on a non-loopback address without SASL.
DEFAULT_KAFKA_ALLOW_UNAUTHENTICATED = False

_NO_OVERRIDES: Mapping[str, Any] = MappingProxyType({})


def _key(key: str, lo: int | None = None, hi: int | None = None, *, ours: bool = False) -> dict[str, Any]:
    """Field metadata: its properties key, integer bounds, and whether the key is ours."""
    return {"key": key, "min": lo, "max": hi, "ours": ours}


@dataclass(frozen=True)
class BrokerConfig:
    """A validated broker configuration. Units are in the field names.

    Construct it directly (every field has a default), with :meth:`from_properties`
    or with :meth:`from_file`. Validation happens in the constructor, so any
    instance is valid: ``data_dir`` is absolute, the topic maps are read-only, the
    password is well formed. Invalid values raise :class:`~luxun.errors.ConfigError`.
    Use :func:`dataclasses.replace` to derive a changed copy (validated again).
    """

    #: Directory holding one sub-directory per topic (absolute after construction).
    data_dir: str = field(default=DEFAULT_DATA_DIR, metadata=_key("log.dir"))
    #: QueueService bind address.
    host: str = field(default=DEFAULT_HOST, metadata=_key("host", ours=True))
    #: QueueService port (0: any free port).
    port: int = field(default=DEFAULT_PORT, metadata=_key("port", 0, 65535))
    #: This broker's id, named in logs and error messages.
    broker_id: int = field(default=DEFAULT_BROKER_ID, metadata=_key("brokerid", INT32_MIN, INT32_MAX))
    #: Metrics bind address.
    metrics_host: str = field(default=DEFAULT_METRICS_HOST, metadata=_key("metrics.host", ours=True))
    #: Metrics port; 0 or None: no metrics server.
    metrics_port: int | None = field(default=DEFAULT_METRICS_PORT, metadata=_key("metrics.port", 0, 65535, ours=True))
    #: Flush (msync) a topic after this many appended items; <= 0: never.
    flush_count: int = field(default=DEFAULT_FLUSH_COUNT, metadata=_key("log.flush.count", INT32_MIN, INT32_MAX))
    #: Flush a topic whose last flush is older than this; <= 0: never (per-topic map wins).
    flush_interval_ms: int = field(
        default=DEFAULT_FLUSH_INTERVAL_MS, metadata=_key("log.default.flush.interval.ms", INT32_MIN, INT32_MAX)
    )
    #: How often flush intervals are checked; <= 0: never.
    flush_scheduler_interval_ms: int = field(
        default=DEFAULT_FLUSH_SCHEDULER_INTERVAL_MS,
        metadata=_key("log.default.flush.scheduler.interval.ms", INT32_MIN, INT32_MAX),
    )
    #: Per-topic ``flush_interval_ms`` (read-only mapping).
    topic_flush_intervals_ms: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({}), metadata=_key("topic.flush.intervals.ms", INT32_MIN, INT32_MAX)
    )
    #: Data pages older than this are deleted.
    retention_hours: int = field(default=DEFAULT_RETENTION_HOURS, metadata=_key("log.retention.hours", 1, INT32_MAX))
    #: Per-topic ``retention_hours`` (read-only mapping).
    topic_retention_hours: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({}), metadata=_key("topic.log.retention.hours", 1, INT32_MAX)
    )
    #: Old pages of a topic are pruned while its files take more than this; < 0: unlimited.
    retention_size_bytes: int = field(
        default=DEFAULT_RETENTION_SIZE_BYTES, metadata=_key("log.retention.size", INT64_MIN, INT64_MAX)
    )
    #: How often retention runs.
    cleanup_interval_mins: int = field(
        default=DEFAULT_CLEANUP_INTERVAL_MINS, metadata=_key("log.cleanup.interval.mins", 1, INT32_MAX)
    )
    #: The deleteTopic password as configured (``plain:``, ``md5:``, ``crc32:`` or bare
    #: plain); "" = unset, deleteTopic is refused. See :func:`check_password`.
    password: str = field(default="", repr=False, metadata=_key("password"))
    #: Largest item produce accepts.
    max_message_size_bytes: int = field(
        default=DEFAULT_MAX_MESSAGE_SIZE_BYTES, metadata=_key("max.message.size", 1, MAX_DATA_PAGE_SIZE)
    )
    #: Data page size for new topics (existing topics keep theirs).
    data_page_size_bytes: int = field(
        default=DEFAULT_DATA_PAGE_SIZE_BYTES,
        metadata=_key("log.backfile.page.size", MIN_DATA_PAGE_SIZE, MAX_DATA_PAGE_SIZE),
    )
    #: Java Luxun's JMX statistics window; accepted and validated, unused here.
    monitoring_period_secs: int = field(
        default=DEFAULT_MONITORING_PERIOD_SECS, metadata=_key("monitoring.period.secs", 1, INT32_MAX)
    )
    #: Create a topic on its first produce; when false that produce answers TOPIC_NOT_EXIST.
    auto_create_topics: bool = field(
        default=DEFAULT_AUTO_CREATE_TOPICS, metadata=_key("auto.create.topics.enable", ours=True)
    )
    #: Most topics this broker holds (0: no limit).
    max_topics: int = field(default=DEFAULT_MAX_TOPICS, metadata=_key("max.topics", 0, INT32_MAX, ours=True))
    #: Topics kept open at once (least recently used ones are closed, reopened on use);
    #: 0: sized from the process's descriptor and mapping limits.
    max_open_topics: int = field(
        default=DEFAULT_MAX_OPEN_TOPICS, metadata=_key("max.open.topics", 0, INT32_MAX, ours=True)
    )
    #: After answering, a connection that has been the only one receiving polls its socket
    #: this long before it sleeps (0: never): see luxun.thrift.server, "Busy polling".
    busy_poll_us: int = field(default=DEFAULT_BUSY_POLL_US, metadata=_key("busy.poll.us", 0, 1_000_000, ours=True))
    #: A lone connection streaming asyncProduce calls, whose last read emptied its
    #: socket, waits this long before reading again (0: never): luxun.thrift.server,
    #: "Batching a lone asyncProduce stream".
    async_batch_us: int = field(default=DEFAULT_ASYNC_BATCH_US, metadata=_key("async.batch.us", 0, 100_000, ours=True))
    #: After answering a connection that has been the only one receiving, move to the CPU
    #: its client sends from and sleep there instead of busy polling (false: poll):
    #: luxun.thrift.server, "Following the client's CPU".
    follow_client_cpu: bool = field(default=DEFAULT_FOLLOW_CLIENT_CPU, metadata=_key("follow.client.cpu", ours=True))
    #: The Kafka-protocol port (0: off).
    kafka_port: int = field(default=DEFAULT_KAFKA_PORT, metadata=_key("kafka.port", 0, 65535, ours=True))
    #: The Kafka port's bind address ("" : the same as ``host``).
    kafka_host: str = field(default="", metadata=_key("kafka.host", ours=True))
    #: Host and port Kafka clients are told to connect to (Metadata); "" / 0: the bound ones.
    kafka_advertised_host: str = field(default="", metadata=_key("kafka.advertised.host", ours=True))
    kafka_advertised_port: int = field(default=0, metadata=_key("kafka.advertised.port", 0, 65535, ours=True))
    #: Partitions of a topic created by a Kafka client that does not say how many.
    num_partitions: int = field(default=DEFAULT_NUM_PARTITIONS, metadata=_key("num.partitions", 1, 10_000, ours=True))
    #: Whether Kafka clients may delete topics (DeleteTopics).
    delete_topic_enable: bool = field(
        default=DEFAULT_DELETE_TOPIC_ENABLE, metadata=_key("delete.topic.enable", ours=True)
    )
    #: Largest record batch a Kafka producer may send.
    kafka_message_max_bytes: int = field(
        default=DEFAULT_KAFKA_MESSAGE_MAX_BYTES, metadata=_key("message.max.bytes", 1, INT32_MAX, ours=True)
    )
    #: Largest Kafka request.
    kafka_request_max_bytes: int = field(
        default=DEFAULT_KAFKA_REQUEST_MAX_BYTES, metadata=_key("socket.request.max.bytes", 1024, INT32_MAX, ours=True)
    )
    #: Most record bytes in one Kafka Fetch answer (KIP-541's broker cap).
    kafka_fetch_max_bytes: int = field(
        default=DEFAULT_KAFKA_FETCH_MAX_BYTES, metadata=_key("fetch.max.bytes", 1024, INT32_MAX, ours=True)
    )
    #: Fetch answers read and not sent yet, all Kafka connections together.
    kafka_fetch_buffer_bytes: int = field(
        default=DEFAULT_KAFKA_FETCH_BUFFER_BYTES,
        metadata=_key("kafka.fetch.buffer.bytes", 1 << 20, 1 << 40, ours=True),
    )
    #: How long the first join of a Kafka consumer group waits for more members.
    group_initial_rebalance_delay_ms: int = field(
        default=DEFAULT_GROUP_INITIAL_REBALANCE_DELAY_MS,
        metadata=_key("group.initial.rebalance.delay.ms", 0, INT32_MAX, ours=True),
    )
    #: Kafka consumer groups kept in memory at most (see docs/groups.md).
    max_groups: int = field(default=DEFAULT_MAX_GROUPS, metadata=_key("max.groups", 1, INT32_MAX, ours=True))
    #: How long an empty Kafka group's committed offsets are kept (see docs/groups.md).
    offsets_retention_minutes: int = field(
        default=DEFAULT_OFFSETS_RETENTION_MINUTES,
        metadata=_key("offsets.retention.minutes", 1, INT32_MAX, ours=True),
    )
    #: How often expired Kafka group offsets are looked for.
    offsets_retention_check_interval_ms: int = field(
        default=DEFAULT_OFFSETS_RETENTION_CHECK_INTERVAL_MS,
        metadata=_key("offsets.retention.check.interval.ms", 1, INT32_MAX, ours=True),
    )
    #: Kafka transactions (see docs/kafka-transactions.md).
    transaction_max_timeout_ms: int = field(
        default=DEFAULT_TRANSACTION_MAX_TIMEOUT_MS,
        metadata=_key("transaction.max.timeout.ms", 1, INT32_MAX, ours=True),
    )
    transactional_id_expiration_ms: int = field(
        default=DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS,
        metadata=_key("transactional.id.expiration.ms", 1, INT32_MAX, ours=True),
    )
    transaction_abort_check_interval_ms: int = field(
        default=DEFAULT_TRANSACTION_ABORT_CHECK_INTERVAL_MS,
        metadata=_key("transaction.abort.timed.out.transaction.cleanup.interval.ms", 1, INT32_MAX, ours=True),
    )
    max_transactional_ids: int = field(
        default=DEFAULT_MAX_TRANSACTIONAL_IDS, metadata=_key("max.transactional.ids", 1, INT32_MAX, ours=True)
    )
    #: The SASL mechanisms the Kafka port offers (of ``KAFKA_SASL_MECHANISMS``); (): SASL off.
    kafka_sasl_mechanisms: tuple[str, ...] = field(default=(), metadata=_key("kafka.sasl.mechanisms", ours=True))
    #: The Kafka port's users and their credentials (luxun.kafka.sasl; ``luxun kafka-user add``).
    kafka_sasl_users_file: str = field(default="", metadata=_key("kafka.sasl.users.file", ours=True))
    #: Let the Kafka port listen on a non-loopback address without SASL (anyone who can
    #: reach it may then produce, read, create and delete topics).
    kafka_allow_unauthenticated: bool = field(
        default=DEFAULT_KAFKA_ALLOW_UNAUTHENTICATED, metadata=_key("kafka.allow.unauthenticated", ours=True)
    )

    #: With SASL on, a resource no ACL matches is open to every user (Kafka's key;
    #: luxun.kafka.acls, docs/kafka-acls.md).
    kafka_allow_everyone_if_no_acl_found: bool = field(
        default=False, metadata=_key("allow.everyone.if.no.acl.found", ours=True)
    )
    #: Kafka's authorizer class: named, ACLs apply with SASL off too (every connection
    #: is User:ANONYMOUS, as on a Kafka PLAINTEXT listener); with SASL on they always do.
    kafka_authorizer: str = field(default="", metadata=_key("authorizer.class.name", ours=True))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            label = _label(f)
            if f.name in _OPTIONAL_STR_FIELDS:
                if not isinstance(value, str):
                    raise ConfigError(f"{label} must be a string, not {type(value).__name__}", key=f.metadata["key"])
            elif f.name in _STR_FIELDS:
                if not isinstance(value, str | os.PathLike):
                    raise ConfigError(f"{label} must be a string, not {type(value).__name__}", key=f.metadata["key"])
                value = os.fspath(value)
                if f.name == "password":
                    parse_password(value, label=label)  # raises on a malformed value
                    continue
                if not value.strip():
                    raise ConfigError(f"{label} must not be empty", key=f.metadata["key"])
                if f.name == "data_dir":
                    # Relative to the working directory, resolved once (Java: new File(dir)).
                    object.__setattr__(self, f.name, os.path.abspath(value))
            elif f.name in _MAP_FIELDS:
                if not isinstance(value, Mapping):
                    raise ConfigError(f"{label} must be a mapping of topic to int", key=f.metadata["key"])
                checked = {
                    _check_topic(f, topic): _check_int(f, value=v, label=f"{label}[{topic!r}]")
                    for topic, v in value.items()
                }
                object.__setattr__(self, f.name, MappingProxyType(checked))
            elif f.name == "metrics_port" and value is None:
                continue
            elif f.name in _MECHANISM_FIELDS:
                if isinstance(value, str):
                    value = _parse_mechanisms(label, value)
                if not isinstance(value, tuple | list) or not all(isinstance(m, str) for m in value):
                    raise ConfigError(f"{label} must be a list of mechanism names", key=f.metadata["key"])
                object.__setattr__(self, f.name, _parse_mechanisms(label, ",".join(value)))
            elif f.name in _BOOL_FIELDS:
                if not isinstance(value, bool):
                    raise ConfigError(f"{label} must be true or false, not {value!r}", key=f.metadata["key"])
            else:
                _check_int(f, value=value, label=label)
        self._check_ports_differ()
        self._check_kafka_security()

    def _check_kafka_security(self) -> None:
        """SASL needs a users file (and the reverse); a Kafka port on an address other
        hosts can reach needs SASL or ``kafka.allow.unauthenticated=true``."""
        if self.kafka_sasl_mechanisms and not self.kafka_sasl_users_file.strip():
            raise ConfigError(
                "kafka.sasl.mechanisms is set but kafka.sasl.users.file is not: SASL needs the users file "
                "(make one with luxun kafka-user add)",
                key="kafka.sasl.users.file",
            )
        if self.kafka_sasl_users_file.strip() and not self.kafka_sasl_mechanisms:
            raise ConfigError(
                "kafka.sasl.users.file is set but kafka.sasl.mechanisms is not: name the mechanisms to offer "
                f"({','.join(KAFKA_SASL_MECHANISMS)}) or drop the users file",
                key="kafka.sasl.mechanisms",
            )
        if self.kafka_authorizer.strip() and self.kafka_authorizer.strip() not in KAFKA_AUTHORIZERS:
            raise ConfigError(
                f"authorizer.class.name={self.kafka_authorizer}: luxun's authorizer behaves as Kafka's "
                f"StandardAuthorizer; name one of {', '.join(sorted(KAFKA_AUTHORIZERS))}, or none",
                key="authorizer.class.name",
            )
        host = self.kafka_host or self.host
        open_to_all = not self.kafka_sasl_mechanisms and not self.kafka_allow_unauthenticated
        if self.kafka_port and open_to_all and not is_loopback(host):
            raise ConfigError(
                f"the Kafka port would listen on {host} without authentication: set kafka.sasl.mechanisms "
                "(with kafka.sasl.users.file), bind it to 127.0.0.1 (kafka.host), or set "
                "kafka.allow.unauthenticated=true to let anyone who reaches it in",
                key="kafka.host",
            )

    def _check_ports_differ(self) -> None:
        """Two of the broker's listeners on one port (and overlapping addresses) cannot
        both listen: the second would fail only once the first already accepts."""
        listeners = [
            ("port", "--port", self.host, self.port),
            ("metrics.port", "--metrics-port", self.metrics_host, self.metrics_port or 0),
            ("kafka.port", "--kafka-port", self.kafka_host or self.host, self.kafka_port),
        ]
        for i, (key_a, flag_a, host_a, port_a) in enumerate(listeners):
            for key_b, flag_b, host_b, port_b in listeners[i + 1 :]:
                if port_a and port_a == port_b and _addresses_overlap(host_a, host_b):
                    raise ConfigError(
                        f"{key_a} ({flag_a}) and {key_b} ({flag_b}) are both {port_a}: "
                        "each listener needs a port of its own",
                        key=key_b,
                    )

    @property
    def metrics_enabled(self) -> bool:
        """True when a metrics server should run (``metrics_port`` not 0 or None)."""
        return bool(self.metrics_port)

    @property
    def password_configured(self) -> bool:
        """True when deleteTopic can succeed (a password is configured)."""
        return bool(self.password.strip())

    def check_password(self, given: str) -> bool:
        """``check_password(self.password, given)``; see :func:`check_password`."""
        return check_password(self.password, given)

    # -- loading -----------------------------------------------------------------------
    @classmethod
    def from_properties(cls, props: Mapping[str, str], *, overrides: Mapping[str, Any] = _NO_OVERRIDES) -> BrokerConfig:
        """Build a config from ``server.properties`` keys, then apply ``overrides``.

        Args:
            props: key to raw value, e.g. from :func:`load_properties`. Values are
                stripped of surrounding whitespace.
            overrides: field name to value (command-line flags); they win over
                ``props``. ``None`` values mean "flag not given" and are skipped (turn
                metrics off with ``metrics_port=0``). String values are parsed like
                the file's.

        Raises:
            ConfigError: an unknown key or override (naming it and the closest known
                one), or a bad value (naming key and value).
        """
        unknown = sorted(k for k in props if k not in _FIELD_BY_KEY)
        if unknown:
            raise ConfigError(
                "; ".join(_unknown_message("configuration key", k, _FIELD_BY_KEY) for k in unknown)
                + f" (known keys: {', '.join(sorted(_FIELD_BY_KEY))})",
                key=unknown[0],
            )
        values: dict[str, Any] = {}
        for key, raw in props.items():
            f = _FIELD_BY_KEY[key]
            values[f.name] = _parse_value(f, raw)
        unused = sorted(k for k in props if k in UNUSED_KEYS)
        if unused:
            log.info(
                "accepted for compatibility with Java Luxun, no effect in this broker: %s",
                ", ".join(f"{k}={props[k].strip()}" for k in unused),
            )
        for name, value in overrides.items():
            if name not in _FIELDS:
                raise ConfigError(_unknown_message("override", name, _FIELDS), key=name)
            if value is None:
                continue
            f = _FIELDS[name]
            values[name] = _parse_value(f, value) if isinstance(value, str) else value
        if "flush_interval_ms" not in values:
            # Java: log.default.flush.interval.ms defaults to the scheduler interval.
            values["flush_interval_ms"] = values.get("flush_scheduler_interval_ms", DEFAULT_FLUSH_SCHEDULER_INTERVAL_MS)
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, overrides: Mapping[str, Any] = _NO_OVERRIDES) -> BrokerConfig:
        """``from_properties(load_properties(path), overrides=overrides)``."""
        return cls.from_properties(load_properties(path), overrides=overrides)


# -- field tables ----------------------------------------------------------------------
_FIELDS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(BrokerConfig)}
_FIELD_BY_KEY: dict[str, dataclasses.Field[Any]] = {f.metadata["key"]: f for f in _FIELDS.values()}
_STR_FIELDS = frozenset({"data_dir", "host", "metrics_host", "password"})
#: String fields that may be empty (meaning: derived from another setting).
_OPTIONAL_STR_FIELDS = frozenset({"kafka_host", "kafka_advertised_host", "kafka_sasl_users_file", "kafka_authorizer"})
#: The authorizer classes of Kafka that ``authorizer.class.name`` may name: luxun's
#: authorizer (luxun.kafka.acls) behaves as they do.
KAFKA_AUTHORIZERS = frozenset(
    {
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "kafka.security.authorizer.AclAuthorizer",
        "kafka.security.auth.SimpleAclAuthorizer",
    }
)
_MAP_FIELDS = frozenset({"topic_flush_intervals_ms", "topic_retention_hours"})
_BOOL_FIELDS = frozenset(
    {
        "auto_create_topics",
        "delete_topic_enable",
        "follow_client_cpu",
        "kafka_allow_unauthenticated",
        "kafka_allow_everyone_if_no_acl_found",
    }
)
_MECHANISM_FIELDS = frozenset({"kafka_sasl_mechanisms"})

#: Every key Java Luxun's ServerConfig reads.
JAVA_KEYS: frozenset[str] = frozenset(k for k, f in _FIELD_BY_KEY.items() if not f.metadata["ours"])
#: Keys this broker adds (Java Luxun ignores them).
OUR_KEYS: frozenset[str] = frozenset(k for k, f in _FIELD_BY_KEY.items() if f.metadata["ours"])
#: Java keys accepted and validated but without effect here (one INFO line when set).
UNUSED_KEYS: frozenset[str] = frozenset({"monitoring.period.secs"})
#: Every key a properties file may hold.
KNOWN_KEYS: frozenset[str] = JAVA_KEYS | OUR_KEYS


_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def is_loopback(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable from this machine only: a
    loopback address (127.0.0.0/8, ::1) or ``localhost``. Other names are not resolved
    and count as reachable from elsewhere."""
    text = host.strip().strip("[]")
    if text.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def _parse_mechanisms(label: str, raw: str) -> tuple[str, ...]:
    """``"PLAIN, scram-sha-256"`` -> ``("PLAIN", "SCRAM-SHA-256")``: upper case, each once,
    in the order given ("" -> (): SASL off)."""
    out: list[str] = []
    for part in raw.split(","):
        name = part.strip().upper()
        if not name:
            continue
        if name not in KAFKA_SASL_MECHANISMS:
            raise ConfigError(
                f"{label}: unknown SASL mechanism {part.strip()!r} (offered: {', '.join(KAFKA_SASL_MECHANISMS)})",
                key="kafka.sasl.mechanisms",
            )
        if name not in out:
            out.append(name)
    return tuple(out)


def _addresses_overlap(host_a: str, host_b: str) -> bool:
    """Whether listeners bound to these hosts can conflict on one port: the same host, or
    either one every address (names are not resolved: two names of one address pass
    here and fail when the broker binds, with an error naming the port)."""
    return host_a == host_b or host_a in _WILDCARD_HOSTS or host_b in _WILDCARD_HOSTS


def _label(f: dataclasses.Field[Any]) -> str:
    """``"log.retention.hours (retention_hours)"``: the file key, then the field name."""
    key = f.metadata["key"]
    return key if key == f.name else f"{key} ({f.name})"


def _unknown_message(what: str, name: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {name!r}{hint}"


def _check_int(f: dataclasses.Field[Any], *, value: Any, label: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{label} must be an integer, not {value!r}", key=f.metadata["key"])
    lo, hi = f.metadata["min"], f.metadata["max"]
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigError(f"{label} = {value} is out of range [{lo}, {hi}]", key=f.metadata["key"])
    return value


def _check_topic(f: dataclasses.Field[Any], topic: object) -> str:
    from .topics import validate_topic  # topics imports config's defaults

    try:
        return validate_topic(topic)
    except InvalidNameError as exc:
        raise ConfigError(f"{_label(f)}: {exc}", key=f.metadata["key"]) from exc


_INT_RE = re.compile(r"[+-]?[0-9]+")


def _parse_int(label: str, raw: str) -> int:
    text = raw.strip()
    if not _INT_RE.fullmatch(text):
        raise ConfigError(f"{label} = {raw!r} is not an integer")
    return int(text)


def _parse_topic_map(label: str, raw: str) -> dict[str, int]:
    """``"topic1:1000, topic2:3000"`` -> ``{"topic1": 1000, "topic2": 3000}`` (last one wins)."""
    result: dict[str, int] = {}
    for entry in raw.split(","):
        entry = entry.strip()
        if not entry:
            continue
        topic, sep, number = entry.rpartition(":")
        if not sep or not topic.strip():
            raise ConfigError(f"{label}: entry {entry!r} is not 'topic:number'")
        result[topic.strip()] = _parse_int(f"{label}[{topic.strip()!r}]", number)
    return result


def _parse_value(f: dataclasses.Field[Any], raw: Any) -> Any:
    """Parse a raw string (or pass a typed override through) for field ``f``."""
    if not isinstance(raw, str):
        return raw
    label = _label(f)
    if f.name in _STR_FIELDS or f.name in _OPTIONAL_STR_FIELDS:
        return raw.strip()
    if f.name in _MAP_FIELDS:
        return _parse_topic_map(label, raw)
    if f.name in _MECHANISM_FIELDS:
        return _parse_mechanisms(label, raw)
    if f.name in _BOOL_FIELDS:
        text = raw.strip().lower()
        if text not in ("true", "false"):
            raise ConfigError(f"{label} = {raw!r} is not true or false", key=f.metadata["key"])
        return text == "true"
    try:
        return _parse_int(label, raw)
    except ConfigError as exc:
        raise ConfigError(str(exc), key=f.metadata["key"]) from None


__all__ = [
    "DEFAULT_ASYNC_BATCH_US",
    "DEFAULT_AUTO_CREATE_TOPICS",
    "DEFAULT_BROKER_ID",
    "DEFAULT_BUSY_POLL_US",
    "DEFAULT_CLEANUP_INTERVAL_MINS",
    "DEFAULT_DATA_DIR",
    "DEFAULT_DATA_PAGE_SIZE_BYTES",
    "DEFAULT_FLUSH_COUNT",
    "DEFAULT_FLUSH_INTERVAL_MS",
    "DEFAULT_FLUSH_SCHEDULER_INTERVAL_MS",
    "DEFAULT_FOLLOW_CLIENT_CPU",
    "DEFAULT_HOST",
    "DEFAULT_KAFKA_ALLOW_UNAUTHENTICATED",
    "DEFAULT_MAX_MESSAGE_SIZE_BYTES",
    "DEFAULT_MAX_GROUPS",
    "DEFAULT_MAX_OPEN_TOPICS",
    "DEFAULT_MAX_TOPICS",
    "DEFAULT_METRICS_HOST",
    "DEFAULT_METRICS_PORT",
    "DEFAULT_MONITORING_PERIOD_SECS",
    "DEFAULT_OFFSETS_RETENTION_CHECK_INTERVAL_MS",
    "DEFAULT_OFFSETS_RETENTION_MINUTES",
    "DEFAULT_PORT",
    "DEFAULT_RETENTION_HOURS",
    "DEFAULT_RETENTION_SIZE_BYTES",
    "DEFAULT_MAX_TRANSACTIONAL_IDS",
    "DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS",
    "DEFAULT_TRANSACTION_ABORT_CHECK_INTERVAL_MS",
    "DEFAULT_TRANSACTION_MAX_TIMEOUT_MS",
    "JAVA_KEYS",
    "KAFKA_SASL_MECHANISMS",
    "KNOWN_KEYS",
    "OUR_KEYS",
    "PASSWORD_SCHEMES",
    "UNUSED_KEYS",
    "BrokerConfig",
    "ConfigError",
    "check_password",
    "is_loopback",
    "load_properties",
    "parse_properties",
    "password_to_send",
]
