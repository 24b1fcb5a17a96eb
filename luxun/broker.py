"""A whole broker: topics, the QueueService server, metrics and maintenance.

Lifecycle: ``Broker(config)`` checks that its ports are free and that the data
directory is not a file (:class:`StartupError`, before anything is created on disk),
reads the Kafka port's users file when SASL is on (a ConfigError naming a bad line),
opens the data directory (refused if another broker holds it) and binds the ports;
``start()`` serves; ``stop()`` stops accepting,
lets in-flight calls finish, wakes waiting consumers, flushes and closes every topic.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import gc
import logging
import os
import resource
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

from idl import QueueService

from .config import BrokerConfig, check_password
from .dynamic import DynamicBrokerConfigs
from .kafka.acls import ACL_FILE, Authorizer
from .kafka.group_configs import GroupConfigStore
from .kafka.groups import GroupCoordinator
from .kafka.handlers import KafkaHandler
from .kafka.log import KafkaLog, remove_interrupted_creations
from .kafka.sasl import SCRAM_STORE, Authenticator, UserStore
from .kafka.server import KafkaServer
from .kafka.topic_configs import BROKER_CONFIGS
from .kafka.transactions import TransactionCoordinator
from .metrics import Metrics, MetricsServer
from .net import OutputBudget, TcpServer
from .retention import Maintenance
from .thrift.server import ThriftServer
from .thrift.service import QueueHandler
from .topics import AUTO_MAX_OPEN_TOPICS, FDS_PER_OPEN_TOPIC_WORST, FDS_RESERVED, TopicManager

log = logging.getLogger(__name__)

#: Bytes a frame may carry beyond max.message.size (topic name, headers). Items a bit
#: over the limit still get a MESSAGE_SIZE_TOO_LARGE answer; far bigger frames close
#: the connection.
FRAME_OVERHEAD_BYTES = 1 << 20


#: glibc malloc settings for a broker process (see :func:`tune_allocator`).
MMAP_THRESHOLD_BYTES = 16 << 20
TRIM_THRESHOLD_BYTES = 16 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (malloc.h)
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def tune_allocator() -> bool:
    """Let glibc reuse freed memory for the broker's per-call buffers; True if done.

    A 1 MiB fetch builds buffers of about 1 MiB (the items read from a page, the framed
    reply). glibc's default serves those with fresh ``mmap`` mappings and hands them
    back on ``free``, so every call page-faults its buffers in again. Measured with
    perf/bench_broker.py (1 MiB fetches of 100 B items): one client 2.5 M -> 4.1 M
    items/s, four clients 4.3 M -> 9.0 M, broker CPU per item halved. The cost: each
    malloc arena may keep up to 16 MiB freed at its top. Skipped when the process's
    environment sets malloc parameters itself, and on a C library without ``mallopt``.
    """
    if any(name in os.environ for name in _MALLOC_ENV):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


class StartupError(OSError):
    """The broker cannot start: a port in use, a data directory that is a file. The
    message names the address or path and the setting to change; ``errno`` is kept."""

    def __str__(self) -> str:
        return str(self.strerror)


def _check_port_free(host: str, port: int, setting: str) -> None:
    """Raise :class:`StartupError` when ``host:port`` cannot be bound (0: any port, not checked).

    The probe binds the way the servers do (``SO_REUSEADDR``) and lets go at once, so a
    broker that cannot listen fails before it creates its data directory.
    """
    if not port:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            in_use = exc.errno == errno.EADDRINUSE
            what = "is in use by another program" if in_use else f"cannot be used: {exc.strerror}"
            raise StartupError(exc.errno or errno.EADDRINUSE, f"{host}:{port} ({setting}) {what}") from exc


def _listen(server: TcpServer, setting: str) -> None:
    """``server.start()``, a failure to listen raised as :class:`StartupError` naming the
    address and setting (the port was free when checked but another program, or another
    name of the same address, took it since)."""
    try:
        server.start()
    except OSError as exc:
        host, port = server.address[:2]
        raise StartupError(
            exc.errno or errno.EADDRINUSE, f"{host}:{port} ({setting}) cannot listen: {exc.strerror or exc}"
        ) from exc


def _check_data_dir(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise StartupError(errno.ENOTDIR, f"data directory {path} (log.dir, --data-dir) is not a directory")


def _password_check(config: BrokerConfig) -> Callable[[str], bool]:
    """deleteTopic's check; with no password configured it raises PermissionError,
    which the handler answers as AUTHENTICATION_FAILURE with that explanation."""

    def check(given: str) -> bool:
        if not config.password_configured:
            raise PermissionError(
                "deletion is disabled on this broker: it has no password "
                "(set password= in server.properties or luxun serve --password)"
            )
        return check_password(config.password, given)

    return check


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft limit of open file descriptors to the hard limit (logged);
    ``(old soft, new soft)``. Topics, mapped pages and connections each take one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or (hard == resource.RLIM_INFINITY and soft >= 1 << 20):
        log.info("file descriptor limit: %d", soft)
        return soft, soft
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("file descriptor limit stays at %d (cannot raise it to %d: %s)", soft, target, exc)
        return soft, soft
    log.info("file descriptor limit raised from %d to the hard limit %d", soft, target)
    return soft, target


class Broker:
    """One luxun broker process's worth of state."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        _check_port_free(config.host, config.port, "port, --port")
        if config.metrics_port:
            _check_port_free(config.metrics_host, config.metrics_port, "metrics.port, --metrics-port; 0 turns it off")
        if config.kafka_port:
            _check_port_free(
                config.kafka_host or config.host, config.kafka_port, "kafka.port, --kafka-port; 0 turns it off"
            )
        _check_data_dir(config.data_dir)
        self.sasl: Authenticator | None = None
        if config.kafka_port and config.kafka_sasl_mechanisms:
            self.sasl = Authenticator(config.kafka_sasl_mechanisms, UserStore(config.kafka_sasl_users_file))
        #: The Kafka port's ACLs: with SASL on, or off with authorizer.class.name (else nothing is checked).
        self.kafka_acls: Authorizer | None = None
        if self.sasl is not None or config.kafka_authorizer.strip():
            self.kafka_acls = Authorizer(
                os.path.join(config.data_dir, ACL_FILE),
                allow_everyone_if_no_acl_found=config.kafka_allow_everyone_if_no_acl_found,
            )
        self.metrics = Metrics()
        _, fd_limit = raise_fd_limit()
        if config.max_open_topics:
            worst = config.max_open_topics * FDS_PER_OPEN_TOPIC_WORST + FDS_RESERVED
            if worst > fd_limit:
                log.warning(
                    "max.open.topics=%d: open topics may need up to %d file descriptors (%d each at most, "
                    "about 5 usually) plus connections, over the limit of %d; lower max.open.topics (or "
                    "leave it unset: sized from the limit) if calls fail with 'Too many open files'",
                    config.max_open_topics,
                    config.max_open_topics * FDS_PER_OPEN_TOPIC_WORST,
                    FDS_PER_OPEN_TOPIC_WORST,
                    fd_limit,
                )
        self.topics = TopicManager(
            config.data_dir,
            data_page_size_bytes=config.data_page_size_bytes,
            max_open_topics=config.max_open_topics,
            max_topics=config.max_topics,
            auto_create=config.auto_create_topics,
            flush_count=config.flush_count,
            repair=remove_interrupted_creations,  # whether or not the Kafka port is on
        )
        self.metrics.topic_manager = self.topics
        if not config.max_open_topics:
            log.info(
                "max.open.topics: %d (sized from the file descriptor limit %d and vm.max_map_count, "
                "at most %d; each Kafka partition is a topic)",
                self.topics.max_open_topics,
                fd_limit,
                AUTO_MAX_OPEN_TOPICS,
            )
        try:
            self.handler = QueueHandler(
                self.topics,
                broker_id=config.broker_id,
                max_message_size_bytes=config.max_message_size_bytes,
                password_check=_password_check(config),
                metrics=self.metrics,
            )
            self.server = ThriftServer(
                QueueService,
                self.handler,
                config.host,
                config.port,
                max_frame_bytes=config.max_message_size_bytes + FRAME_OVERHEAD_BYTES,
                metrics=self.metrics,
                busy_poll_us=config.busy_poll_us,
                async_batch_us=config.async_batch_us,
                follow_client_cpu=config.follow_client_cpu,
            )
            self.handler.await_earlier_input = self.server.await_earlier_input
            log.info("Thrift door: %s", self.server.loop_text)
            self.kafka_server: KafkaServer | None = None
            if config.kafka_port:
                self.kafka_server = self._kafka_door(config)
            self.metrics_server: MetricsServer | None = None
            if config.metrics_port:
                self.metrics_server = MetricsServer(
                    config.metrics_host,
                    config.metrics_port,
                    self.metrics,
                    self.topics.views,
                    title=f"luxun broker {config.broker_id} on {config.host}:{self.server.address[1]}",
                )
            # Wake for flushes at the scheduler rate (Java's log.default.flush.scheduler.interval.ms),
            # else once a second; cleanups run on their own interval within those ticks.
            scheduler_s = config.flush_scheduler_interval_ms / 1000 if config.flush_scheduler_interval_ms > 0 else 1.0
            tick_s = min(config.cleanup_interval_mins * 60, scheduler_s)
            self.maintenance = Maintenance(
                self.topics,
                retention_hours=config.retention_hours,
                topic_retention_hours=config.topic_retention_hours,
                retention_size_bytes=config.retention_size_bytes,
                cleanup_interval_s=config.cleanup_interval_mins * 60,
                flush_interval_ms=config.flush_interval_ms,
                topic_flush_intervals_ms=config.topic_flush_intervals_ms,
                tick_s=tick_s,
                # A Kafka topic's retention.ms/retention.bytes, for each of its partitions.
                topic_overrides=None if self.kafka_server is None else self.kafka_handler.log.retention_overrides,
                # log.retention.ms/bytes set by Kafka clients at run time (AlterConfigs).
                broker_overrides=None if self.kafka_server is None else self._broker_retention(),
                # A Kafka topic's flush.ms, for each of its partitions.
                flush_overrides=None if self.kafka_server is None else self.kafka_handler.log.flush_override,
            )
        except BaseException:
            groups = getattr(self, "kafka_groups", None)
            if groups is not None:
                groups.close()
            transactions = getattr(self, "kafka_transactions", None)
            if transactions is not None:
                transactions.close()
            self.topics.close()
            raise
        self._stopped = threading.Event()

    def _broker_retention(self) -> Callable[[], tuple[int | None, int | None]] | None:
        """The retention Kafka clients set at run time (AlterConfigs of the broker)."""
        configs = self.kafka_handler.broker_configs
        return None if configs is None else configs.retention

    def _kafka_door(self, config: BrokerConfig) -> KafkaServer:
        """The Kafka-protocol port over the same topics (see :mod:`luxun.kafka`)."""
        host = config.kafka_host or config.host
        broker_configs = DynamicBrokerConfigs(
            config.data_dir,
            retention_ms=config.retention_hours * 3_600_000 if config.retention_hours > 0 else -1,
            retention_bytes=config.retention_size_bytes,
            known=BROKER_CONFIGS,
        )
        kafka_log = KafkaLog(
            self.topics,
            num_partitions=config.num_partitions,
            delete_enable=config.delete_topic_enable,
            max_message_bytes=config.kafka_message_max_bytes,
            broker_configs=broker_configs,
        )
        self.kafka_groups = GroupCoordinator(
            self.topics,
            node_id=config.broker_id,
            host=host,
            port=config.kafka_port,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            max_groups=config.max_groups,
            offsets_retention_ms=config.offsets_retention_minutes * 60_000,
            offsets_retention_check_interval_ms=config.offsets_retention_check_interval_ms,
        )
        self.metrics.kafka_groups = self.kafka_groups
        self.kafka_transactions = TransactionCoordinator(
            kafka_log,
            self.kafka_groups.offsets,
            self.topics.data_dir,
            max_timeout_ms=config.transaction_max_timeout_ms,
            id_expiration_ms=config.transactional_id_expiration_ms,
            abort_check_interval_ms=config.transaction_abort_check_interval_ms,
            max_transactional_ids=config.max_transactional_ids,
            acls=self.kafka_acls,
            groups=self.kafka_groups,
        )
        self.kafka_groups.pending_offsets = self.kafka_transactions.pending_offsets
        self.kafka_transactions.recover()  # finishes what a crash interrupted
        scram_users = None
        if self.sasl is None:  # the credential APIs keep SCRAM credentials in the data dir
            scram_users = UserStore(os.path.join(config.data_dir, SCRAM_STORE), missing_ok=True)
        self.kafka_handler = KafkaHandler(
            kafka_log,
            node_id=config.broker_id,
            host=host,
            port=config.kafka_port,
            groups=self.kafka_groups,
            metrics=self.metrics,
            fetch_max_bytes=config.kafka_fetch_max_bytes,
            output_budget=OutputBudget(
                max(config.kafka_fetch_buffer_bytes, 2 * config.kafka_fetch_max_bytes), self.metrics
            ),
            sasl=self.sasl,
            acls=self.kafka_acls,
            scram_users=scram_users,
            transactions=self.kafka_transactions,
            broker_configs=broker_configs,
            group_configs=GroupConfigStore(config.data_dir),
        )
        server = KafkaServer(
            self.kafka_handler,
            host,
            config.kafka_port,
            max_frame_bytes=config.kafka_request_max_bytes,
            metrics=self.metrics,
        )
        self.kafka_handler.host = config.kafka_advertised_host or host
        self.kafka_handler.port = config.kafka_advertised_port or server.address[1]
        self.kafka_groups.host, self.kafka_groups.port = self.kafka_handler.host, self.kafka_handler.port
        return server

    @property
    def port(self) -> int:
        """The QueueService port actually bound."""
        return self.server.address[1]

    def start(self) -> None:
        """Serve. The QueueService port is opened last: a client that can connect to it
        finds the metrics and Kafka ports open too."""
        if self.metrics_server is not None:
            self.metrics_server.start()
        try:
            if self.kafka_server is not None:
                _listen(self.kafka_server, "kafka.port, --kafka-port")
            _listen(self.server, "port, --port")
        except StartupError:
            self.stop()  # closes the listeners already open, flushes nothing yet written
            raise
        self.maintenance.start()
        metrics = (
            f"metrics on http://{self.config.metrics_host}:{self.metrics_server.address[1]}/"
            if self.metrics_server is not None
            else "metrics off"
        )
        kafka = (
            f"Kafka protocol on {self.kafka_server.address[0]}:{self.kafka_server.address[1]}"
            if self.kafka_server is not None
            else "Kafka port off"
        )
        if self.kafka_server is not None:
            kafka += (
                f" with SASL {','.join(self.sasl.mechanisms)} for {len(self.sasl.users)} users"
                if self.sasl is not None
                else " without authentication"
            )
        log.info(
            "luxun broker %d serving %d topics from %s on %s:%d (%s; %s)",
            self.config.broker_id,
            self.topics.count(),
            self.topics.data_dir,
            self.config.host,
            self.port,
            kafka,
            metrics,
        )

    def stop(self) -> None:
        """Finish in-flight calls, flush and close. Calling it twice is fine."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        log.info("stopping: finishing in-flight calls")
        self.topics.wake_all()
        self.server.stop()
        if self.kafka_server is not None:
            self.kafka_groups.close()  # answers the JoinGroups and SyncGroups waiting
            self.kafka_server.stop()
            self.kafka_transactions.close()
        self.maintenance.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self.topics.flush()
        self.topics.close()
        log.info("stopped; every topic flushed and closed")

    def serve_forever(self) -> None:
        """Start, then block until SIGTERM or SIGINT; then stop cleanly."""
        done = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("received %s", signal.Signals(signum).name)
            done.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        # What the broker holds from its start (modules, classes, kio's schemas, config,
        # open topics) lives as long as it does: kept out of the cyclic collector's full
        # passes, which walked all of it each time (under pipelined one-record Kafka
        # Produce requests, about one full pass every quarter second at 25 ms each: 14 %
        # of the broker's CPU). Metrics: luxun_gc_frozen_objects, python_gc_*.
        gc.collect()
        gc.freeze()
        try:
            while not done.wait(1.0):
                pass
        finally:
            self.stop()
