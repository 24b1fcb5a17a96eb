"""The agent: inputs -> router -> one sender per broker, over a bounded memory pool.

Threads (as in Dory):

- **inputs**: one thread for the UNIX datagram socket; one listener per stream socket (UNIX
  stream, TCP on 127.0.0.1) and one thread per connection. They only read, validate the
  wire format (:mod:`clients.agent.wire`), take the message's bytes from the pool and
  append it to the router's queue: a datagram socket is drained without a system call more
  than ``recv`` per message while messages are waiting. Messages of one topic and partition
  key in a row travel as one :class:`~clients.agent.wire.Run` (their values as a pack lists
  them), which the router writes into its batch at once.
- **router**: checks the topic name (and, ``topicAutocreate`` off, that a broker lists it),
  the size and the topic's rate limit; batches per topic (and per broker for PartitionKey
  messages) until the topic's time, count or byte limit; hands a closed batch to a sender.
  PartitionKey: broker ``key % n`` in the ``--broker`` order, the next one up when it is down.
  AnyPartition: round robin over the brokers that are up.
- **senders**: one per broker (the clients' one sender, :class:`clients.sender.BrokerSender`,
  the agent's outcomes in :class:`_Outcomes`); each batch becomes one message pack (one queue item,
  compressed per topic) sent with acknowledged ``produce``; the batches queued for a broker
  (up to _PIPELINE_DEPTH, _PIPELINE_BYTES) go in one round trip, pipelined (Luxun's produce
  takes one pack of one topic: there is no call to merge them into). A broker that cannot
  be reached is marked down for a back-off (doubling from ``retry_backoff_ms`` up to
  ``max_retry_backoff_ms``) and its batches go back to the router to be routed again; each
  batch counts its failed attempts and is discarded (``broker_failure``) after
  ``maxFailedDeliveryAttempts``. A refusal by the broker that trying again may cure (TRY_LATER)
  is an attempt too; any other refusal discards the batch at once (``too_large`` for
  MESSAGE_SIZE_TOO_LARGE, else ``broker_failure``), with a rate-limited log line.

Dory's Key (a Kafka message key) has no place in a luxun pack: the agent **drops it** and
counts the messages that had one (``AgentKeyDropped``) and its bytes
(``AgentKeyDroppedBytes``); the value is delivered unchanged.

Memory: each message takes ``len(message) + MSG_OVERHEAD_BYTES`` of the pool
(``max_buffer_bytes``) from its arrival until the router writes it into its batch, then
what it holds there (its value, 4 bytes, 1/8 for the buffer's growth and 16) until the
batch is delivered or discarded; a message that does not fit is discarded (``no_memory``),
so the buffered data is bounded. A batch is one ``bytearray`` of the values as the pack
lists them, not an object per message. Inputs wait while the messages queued for the router
hold more than an eighth of the pool or _TRANSIT_MAX_BYTES, and the router calls
``malloc_trim`` (at most once a second, after the pool held a quarter of its bytes) so that
freed memory leaves the process.

Delivery is at-least-once: a batch is settled by the broker's answer; when a connection
breaks after the broker stored a pack but before its answer was read (with a pipeline, for
every unanswered pack of it), the pack is sent again and stored twice. Luxun's produce has
no producer id or sequence a broker could deduplicate by, so this is documented, not fixed.

Counting: every message read is delivered or counted once as a discard; bytes left by a
stream client that closed in the middle of a message are counted apart (unclean
disconnects). At shutdown a batch still in a ``produce`` call when ``shutdownMaxDelay`` ran
out is counted as a shutdown discard although the broker may have stored it. What senders
already handed to the kernel is not dropped at shutdown: the inputs ``shutdown(SHUT_RD)``
their sockets, so that later sends fail with EPIPE (datagrams, UNIX stream connections; a
UNIX listener refuses connects), then read what is queued (datagrams, connections not yet
accepted, each connection to its end) and hand it to the router like any message. TCP
cannot refuse bytes: a connection is read until its queue is empty, then closed (see
:meth:`Agent.stop`).

Thread-safety: :meth:`Agent.start`, :meth:`Agent.stop` from one thread; the ``*_json``
views from any thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import socket
import stat
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from idl import luxun_thrift as T
from idl.names import topic_name_problem

from ..connection import BrokerConnection
from ..errors import BrokerError, LuxunClientError, MessageSizeTooLargeError
from ..messages import snappy_available
from ..sender import Batch, BrokerSender, RateLimiter, pack_parts
from . import discardlog as D
from . import stats as S
from .config import CODECS, AgentConfig
from .discardlog import DiscardLog, values_of
from .inputs import (
    MSG_OVERHEAD_BYTES,
    PACK_OVERHEAD_BYTES,
    STREAM,
    TCP,
    TRANSPORTS,
    AgentInputs,
    charge_of,
    messages_of,
)
from .wire import Fields, Run

log = logging.getLogger("luxun.agent")

VERSION = "luxun-agent 1"
_FORWARD_COUNTERS = ("UnixDgInputAgentForwardMsg", "UnixStreamInputAgentForwardMsg", "TcpInputAgentForwardMsg")
_TOPIC_CACHE_MAX = 10_000
_I32 = struct.Struct(">i").pack
#: At stop, the inputs read what the kernel had taken from senders for this long at most
#: (only a TCP peer can keep adding to it: see Agent.stop).
_INPUT_DRAIN_S = 2.0
#: Batches a sender writes to its broker before reading the answers, at most (and bytes).
_PIPELINE_DEPTH = 16
_PIPELINE_BYTES = 1024 * 1024
#: The discard log's reason for a batch discarded after routing (see discardlog).
_DISCARD_LOG_INFO = {S.BROKER_FAILURE: D.DELIVERY_ATTEMPT_LIMIT, S.SHUTDOWN: D.SHUTDOWN, S.TOO_LARGE: D.LONG_MSG}
#: How often, at most, the router gives the allocator's free memory back (see _trim_if_buffered).
_TRIM_INTERVAL_S = 1.0


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (another libc)."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _find_malloc_trim()


class Pool:
    """A byte budget: :meth:`alloc` fails when it would go over ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self.recent_peak = 0  # since the router last looked (Agent._trim_if_buffered)
        self._lock = threading.Lock()

    def alloc(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.capacity:
                return False
            self.used += n
            if self.used > self.recent_peak:
                self.recent_peak = self.used
                if self.used > self.peak:
                    self.peak = self.used
            return True

    def reserve(self, want: int, at_least: int) -> int:
        """Take up to ``want`` bytes, at least ``at_least``; 0 when not even that is free."""
        with self._lock:
            free = self.capacity - self.used
            if free < at_least:
                return 0
            n = min(max(want, at_least), free)
            self.used += n
            if self.used > self.recent_peak:
                self.recent_peak = self.used
                if self.used > self.peak:
                    self.peak = self.used
            return n

    def free(self, n: int) -> None:
        with self._lock:
            self.used -= n


class _Batch(Batch):
    """The shared batch (:class:`clients.sender.Batch`), written to by the router: the
    values as a pack lists them, written as they come: one buffer per batch rather than
    an object per message, so that memory freed by a delivered batch is whole blocks the
    allocator reuses or returns (objects of many small messages spread over pymalloc arenas
    kept RSS up after they were freed)."""

    __slots__ = ("charge", "group", "linger_s", "max_ts", "min_ts", "preferred", "settled")

    def __init__(self, topic: str, group: int, preferred: int | None, now: float, linger_s: float) -> None:
        super().__init__(topic, now)
        self.linger_s = linger_s
        self.group = group  # -1: AnyPartition, else the preferred broker
        self.preferred = preferred
        self.charge = 0
        self.min_ts = 1 << 62
        self.max_ts = -(1 << 62)
        self.settled = False


class _TopicState:
    """What the router needs per topic, looked up once per message."""

    __slots__ = ("limiter", "linger_s", "max_bytes", "max_messages", "name")

    def __init__(self, name: str, cfg: AgentConfig) -> None:
        self.name = name
        rule = cfg.rate_limit(name)
        self.limiter = RateLimiter(rule.max_count, rule.interval_ms) if rule is not None else None
        b = cfg.batching(name)
        self.linger_s = (b.time_ms if b.time_ms is not None else 1 << 30) / 1000
        self.max_messages = 1 if b.time_ms == 0 else (b.messages if b.messages is not None else 1 << 62)
        self.max_bytes = b.bytes if b.bytes is not None else 1 << 62


class _Outcomes:
    """What a sender's outcomes mean to the agent (the senders' :class:`SendOwner`):
    delivered and discarded batches settled (pool bytes, counters, the discard log); after a
    broken connection, batches routed again; a batch discarded after
    ``maxFailedDeliveryAttempts``."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def pack(self, batch: _Batch) -> list[bytes | bytearray]:
        cfg = self.agent.config
        comp = cfg.compression(batch.topic)
        return pack_parts(batch, CODECS[comp.codec], comp.min_size_bytes, cfg.compression_size_threshold_percent)

    def poll(self, sender: BrokerSender[_Batch]) -> float | None:
        return None  # the router hands batches over when they are due

    def round_trip(self, sender: BrokerSender[_Batch]) -> None:
        self.agent.stats.incr("SendProduceRoundTrip")

    def delivered(self, sender: BrokerSender[_Batch], batch: _Batch, index: int | None) -> None:
        self.agent.stats.incr("SendProduceRequestOk")
        self.agent._settle(batch, None)

    def refused(self, sender: BrokerSender[_Batch], batch: _Batch, exc: BrokerError, size: int) -> None:
        if isinstance(exc, MessageSizeTooLargeError):
            self.agent._refused(batch, S.TOO_LARGE, f"broker {sender.address} refused a {size}-byte pack: {exc}",
                                D.LONG_MSG)  # fmt: skip
        else:
            self.agent._refused(batch, S.BROKER_FAILURE, f"broker {sender.address} refused a pack: {exc}",
                                D.ERROR_ACK)  # fmt: skip

    def failed(self, sender: BrokerSender[_Batch], exc: LuxunClientError) -> None:
        agent = self.agent
        agent.stats.incr("SendProduceRequestFail")
        agent._log_limited(f"down:{sender.address}", f"broker {sender.address}: {exc}; backing off "
                           f"{sender.backoff_s:.1f} s")  # fmt: skip

    def give_up(self, sender: BrokerSender[_Batch], batch: _Batch, exc: LuxunClientError) -> bool:
        if batch.attempts >= self.agent.config.max_failed_delivery_attempts:
            self.agent._settle(batch, S.BROKER_FAILURE)
            return True
        return False

    def reroute(self, sender: BrokerSender[_Batch], batches: list[_Batch]) -> None:
        self.agent._reroute(batches)

    def abandoned(self, sender: BrokerSender[_Batch], batch: _Batch) -> None:
        self.agent._settle(batch, S.SHUTDOWN)


class Agent(AgentInputs):
    """A Dory-compatible local agent in front of luxun brokers.

    Args:
        config: the settings; ``config.brokers`` must not be empty.
    """

    def __init__(self, config: AgentConfig) -> None:
        if not config.brokers:
            raise ValueError("the agent needs at least one broker (--broker host:port)")
        for c in [config.default_compression, *config.topic_compression.values()]:
            if c.codec == "snappy" and not snappy_available():
                raise ValueError("snappy compression is configured but python-snappy is not installed")
        self.config = config
        self.pid = os.getpid()
        self.stats = S.Stats(config.discard_report_interval_s, config.bad_msg_prefix_bytes)
        self.pool = Pool(config.max_buffer_bytes)
        self._inq: deque[tuple[int, list[Fields | Run], int, int]] = deque()  # (transport, chunk, charge, count)
        self._transit = 0  # pool bytes of the messages in _inq
        self._transit_lock = threading.Lock()
        self._reroutes: deque[_Batch] = deque()
        self._wake_router = threading.Event()
        self._stopping = False  # inputs stop reading
        self._draining = False  # the router sends every batch at once
        self._abandon = False
        self._router_done = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._threads: list[threading.Thread] = []
        self._sockets: list[tuple[socket.socket, str | None]] = []
        #: open stream connections and their reader threads
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._conns_lock = threading.Lock()
        self._conns_shut = False  # stop shut the connections down: a later one is at once
        self._input_deadline = 0.0  # at stop: inputs stop reading what was queued then
        outcomes = _Outcomes(self)
        self.senders = [
            BrokerSender(outcomes, i, a, name=f"luxun-agent-send-{a}", timeout_ms=config.broker_timeout_ms,
                         connect_timeout_ms=min(config.broker_timeout_ms, 2_000),
                         retry_backoff_s=config.retry_backoff_ms / 1000,
                         max_backoff_s=config.max_retry_backoff_ms / 1000, depth=_PIPELINE_DEPTH,
                         depth_bytes=_PIPELINE_BYTES, failover=True)
            for i, a in enumerate(config.brokers)
        ]  # fmt: skip
        self._batches: dict[tuple[str, int], _Batch] = {}
        self._topics: dict[bytes, _TopicState | None] = {}
        self._topics_epoch = self._seen_epoch = 0
        self._known_topics: frozenset[str] | None = None
        self._metadata_event = threading.Event()
        self.metadata_updated_ms = 0
        self._rr = 0
        self.received = [0, 0, 0]
        self.keys_dropped = 0
        self.keys_dropped_bytes = 0
        self.handovers = 0  # chunks of messages the router took from the inputs
        self.discard_log: DiscardLog | None = None
        self._log_times: dict[str, float] = {}
        self._log_lock = threading.Lock()
        self.tcp_port: int | None = None

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> Agent:
        """Bind the inputs (replacing old socket files), start every thread.

        Raises:
            OSError: a socket cannot be bound (the message names the path or port).
        """
        cfg = self.config
        if cfg.discard_log_path:
            self.discard_log = DiscardLog(cfg.discard_log_path, cfg.discard_log_max_file_bytes,
                                          cfg.discard_log_max_archive_bytes,
                                          cfg.discard_log_max_prefix_bytes)  # fmt: skip
        try:
            if cfg.dgram_path:
                s = self._unix_socket(cfg.dgram_path, socket.SOCK_DGRAM, cfg.dgram_mode)
                s.setblocking(False)
                self._spawn(self._read_datagrams, "dgram", s)
            if cfg.stream_path:
                s = self._unix_socket(cfg.stream_path, socket.SOCK_STREAM, cfg.stream_mode)
                s.listen(128)
                self._spawn(self._accept_loop, "stream-accept", s, STREAM)
            if cfg.tcp_port is not None:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", cfg.tcp_port))
                except OSError as exc:
                    s.close()
                    raise OSError(exc.errno, f"cannot listen on TCP 127.0.0.1:{cfg.tcp_port}: {exc.strerror}") from exc
                s.listen(128)
                self.tcp_port = s.getsockname()[1]
                self._sockets.append((s, None))
                self._spawn(self._accept_loop, "tcp-accept", s, TCP)
        except OSError:
            self._close_sockets()
            if self.discard_log is not None:
                self.discard_log.close()
            raise
        for sender in self.senders:
            sender.start()
        router = threading.Thread(target=self._route_loop, name="luxun-agent-router", daemon=True)
        router.start()
        self._router = router
        if not cfg.topic_autocreate:
            self._refresh_topics()
            threading.Thread(target=self._metadata_loop, name="luxun-agent-metadata", daemon=True).start()
        return self

    def _unix_socket(self, path: str, kind: int, mode: int | None) -> socket.socket:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise OSError(17, f"{path} exists and is not a socket; not replacing it")
            os.unlink(path)
        s = socket.socket(socket.AF_UNIX, kind)
        try:
            s.bind(path)
            if mode is not None:
                os.chmod(path, mode)
        except OSError as exc:
            s.close()
            raise OSError(exc.errno, f"cannot bind {path}: {exc.strerror}") from exc
        self._sockets.append((s, path))
        return s

    def _spawn(self, target: Callable[..., None], name: str, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, name=f"luxun-agent-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, max_delay_ms: int | None = None) -> dict[str, Any]:
        """Stop reading; deliver what is buffered within ``max_delay_ms`` (default
        ``shutdownMaxDelay``); discard the rest (``shutdown``). Returns a summary.

        What senders already handed to the kernel is read first, new data refused
        (``shutdown(SHUT_RD)``, after which a sender's ``send`` fails with EPIPE): the
        datagram socket's queue, the connections a listener had not accepted yet and every
        connection's bytes up to its end (a message cut there is an unclean disconnect).
        TCP cannot refuse: a peer's bytes are still taken after SHUT_RD, so a connection is
        read until its queue is empty, then closed (later bytes are answered by a reset; a
        sender that keeps its queue full is cut at _INPUT_DRAIN_S, the bytes still queued
        then counted as an unclean disconnect). Messages read so are routed and delivered
        within the delay like any other."""
        delay_s = (self.config.shutdown_max_delay_ms if max_delay_ms is None else max_delay_ms) / 1000
        now = time.monotonic()
        deadline = now + delay_s
        self._input_deadline = now + _INPUT_DRAIN_S
        self._stopping = True
        os.write(self._wake_w, b"x")
        # The datagram reader and the listeners refuse new data, read what is queued, end.
        for t in self._threads:
            t.join(max(0.0, self._input_deadline - time.monotonic()) + 1.0)
        with self._conns_lock:  # each reader reads its connection to the end, then closes it
            self._conns_shut = True
            conns = dict(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RD)
        for t in conns.values():
            t.join(max(0.0, self._input_deadline - time.monotonic()) + 1.0)
        self._close_sockets()
        self._draining = True
        self._wake_router.set()
        while time.monotonic() < deadline and (self.pool.used > 0 or self._inq):
            time.sleep(0.01)
        self._abandon = True
        self._wake_router.set()
        for sender in self.senders:
            sender.finish(abandon=True)
        self._router.join(2.0)
        for sender in self.senders:
            sender.join(max(0.5, min(2.0, self.config.broker_timeout_ms / 1000)))
            for batch in list(sender.in_flight):
                self._settle(batch, S.SHUTDOWN)
            sender.conn.close()
        self._metadata_event.set()
        os.close(self._wake_r)
        os.close(self._wake_w)
        if self.discard_log is not None:
            self.discard_log.close()
        return self.summary()

    def _close_sockets(self) -> None:
        for s, path in self._sockets:
            with contextlib.suppress(OSError):
                s.close()
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        self._sockets.clear()

    def summary(self) -> dict[str, Any]:
        d = self.stats.discards_json()["totals"]
        return {
            "received": dict(zip(TRANSPORTS, self.received, strict=True)),
            "delivered": sum(self.stats.delivered.values()),
            "discarded": d["by_reason"],
            "unclean_disconnect_bytes": d["unclean_disconnect_bytes"],
            "buffered_bytes": self.pool.used,
        }

    # -- router -------------------------------------------------------------------------
    def _route_loop(self) -> None:
        inq = self._inq
        reroutes = self._reroutes
        route = self._route_chunk
        batches = self._batches
        wake = self._wake_router
        next_trim = 0.0
        try:
            while True:
                wake.clear()
                if self._abandon:
                    self._abandon_router()
                    return
                while reroutes:
                    self._dispatch(reroutes.popleft())
                n = 0
                while inq and n < 64:
                    transport, chunk, charge, count = inq.popleft()
                    self.received[transport] += count
                    self.handovers += 1
                    route(chunk)
                    with self._transit_lock:
                        self._transit -= charge
                    n += 1
                now = time.monotonic()
                if now >= next_trim:
                    next_trim = now + _TRIM_INTERVAL_S
                    self._trim_if_buffered()
                next_due = now + 0.2
                for key, b in list(batches.items()):
                    due = b.created + b.linger_s
                    if self._draining or due <= now:
                        del batches[key]
                        self._dispatch(b)
                    elif due < next_due:
                        next_due = due
                if inq or reroutes:
                    continue
                wake.wait(max(0.0005, next_due - now))
        finally:
            self._router_done.set()

    def _trim_if_buffered(self) -> None:
        """After the pool held a quarter of its bytes or more: ``malloc_trim``, so that the
        memory messages in transit took from glibc's heap (freed once they are written into
        batches, which live in their own mappings) goes back to the system instead of
        staying resident beside the batches. Costs up to ~20 ms (without the GIL) with a
        full 64 MiB pool, at most once per _TRIM_INTERVAL_S."""
        pool = self.pool
        with pool._lock:
            peak, pool.recent_peak = pool.recent_peak, pool.used
        if peak >= pool.capacity // 4 and _malloc_trim is not None:
            _malloc_trim(0)

    def _abandon_router(self) -> None:
        for b in list(self._batches.values()) + list(self._reroutes):
            self._settle(b, S.SHUTDOWN)
        self._batches.clear()
        self._reroutes.clear()
        while self._inq:
            _, chunk, charge, _ = self._inq.popleft()
            with self._transit_lock:
                self._transit -= charge
            for f in messages_of(chunk):
                self.pool.free(charge_of(f))
                self.stats.discard(S.SHUTDOWN, f[0].decode(errors="replace"), ts_min=f[2], ts_max=f[2])
                if self.discard_log is not None:
                    self.discard_log.write(D.SHUTDOWN, f[0], f[2], f[3], f[4])

    def _topic_state(self, raw: bytes) -> _TopicState | None:
        """The router's view of a topic, or None for a bad topic (cached)."""
        if self._topics_epoch != self._seen_epoch:
            self._topics.clear()
            self._seen_epoch = self._topics_epoch
        try:
            return self._topics[raw]
        except KeyError:
            pass
        state: _TopicState | None = None
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            name = None
        known = self._known_topics
        if name is not None and topic_name_problem(name) is None and (known is None or name in known):
            state = _TopicState(name, self.config)
        if len(self._topics) >= _TOPIC_CACHE_MAX:
            self._topics.clear()
        self._topics[raw] = state
        return state

    def _route_chunk(self, chunk: list[Fields] | list[Fields | Run]) -> None:
        room = self.config.message_max_bytes - PACK_OVERHEAD_BYTES  # a pack's bytes of values
        n_senders = len(self.senders)
        batches = self._batches
        topics = self._topics if self._topics_epoch == self._seen_epoch else {}
        stats = self.stats
        now = time.monotonic()
        refund = 0  # pool bytes of the chunk's messages beyond what their batches now hold
        # Messages come in runs of one topic and partition key: the run's topic state,
        # batch key and batch (None once dispatched) are looked up once per run.
        run_raw: bytes | None = None
        run_pk: int | None = None
        st: _TopicState  # set before its first use: no message's topic is None
        bkey: tuple[str, int] = ("", 0)
        b: _Batch | None = None
        for f in chunk:
            if isinstance(f, Run):
                raw, pk = f.topic, f.pk
            else:
                raw, pk, ts, key, value = f
                if key:
                    self.keys_dropped += 1
                    self.keys_dropped_bytes += len(key)
            if raw != run_raw or pk != run_pk:
                found = topics.get(raw)
                if found is None:
                    found = self._topic_state(raw)
                    topics = self._topics
                    if found is None:
                        run_raw = None
                        if isinstance(f, Run):  # each of its messages counted, as below
                            self._route_chunk(f.fields())
                            continue
                        self.pool.free(charge_of(f))
                        stats.discard(S.BAD_TOPIC, None, sample=raw)
                        if self.discard_log is not None:
                            self.discard_log.write(D.BAD_TOPIC, raw, ts, key, value)
                        continue
                st = found
                run_raw = raw
                run_pk = pk
                bkey = (st.name, -1 if pk is None else pk % n_senders)
                b = batches.get(bkey)
            if isinstance(f, Run):
                nbytes = len(f.values)
                used = b.bytes if b is not None else 0
                if (st.limiter is None and used + nbytes <= room
                        and (b.count if b is not None else 0) + f.count < st.max_messages
                        and used + nbytes < st.max_bytes):  # fmt: skip
                    # the whole run goes into the batch: what the code below does for each
                    # of its messages, at once
                    if b is None:
                        group = bkey[1]
                        b = batches[bkey] = _Batch(st.name, group, None if group < 0 else group, now, st.linger_s)
                    b.written += f.values
                    b.count += f.count
                    b.bytes += nbytes
                    charge = f.size + f.count * MSG_OVERHEAD_BYTES
                    held = min(charge, nbytes + (nbytes >> 3) + 16 * f.count)
                    refund += charge - held
                    b.charge += held
                    ts = min(f.timestamps)
                    if ts < b.min_ts:
                        b.min_ts = ts
                    ts = max(f.timestamps)
                    if ts > b.max_ts:
                        b.max_ts = ts
                    continue
                # a rate limit, or a batch it does not fit: message by message
                self._route_chunk(f.fields())
                run_raw = None  # the batch may have been dispatched
                continue
            size = len(value) + 4
            if size > room:
                self.pool.free(charge_of(f))
                stats.discard(S.TOO_LARGE, st.name, sample=raw + b" " + value[:64], ts_min=ts, ts_max=ts)
                if self.discard_log is not None:
                    self.discard_log.write(D.LONG_MSG, raw, ts, key, value)
                continue
            if st.limiter is not None and not st.limiter.allow(now):
                self.pool.free(charge_of(f))
                stats.discard(S.RATE_LIMITED, st.name, ts_min=ts, ts_max=ts)
                if self.discard_log is not None:
                    self.discard_log.write(D.RATE_LIMIT, raw, ts, key, value)
                continue
            if b is not None and b.bytes + size > room:
                del batches[bkey]
                self._dispatch(b)
                b = None
            if b is None:
                group = bkey[1]
                b = batches[bkey] = _Batch(st.name, group, None if group < 0 else group, now, st.linger_s)
            written = b.written
            written += _I32(size - 4)
            written += value
            b.count += 1
            b.bytes += size
            # charge_of(f), inline (this loop runs once per message), and what the message
            # holds once written: its bytes plus the buffer's growth (1/8) and a margin
            charge = (28 if pk is None else 32) + len(raw) + len(key) + size + (MSG_OVERHEAD_BYTES - 4)
            held = min(charge, size + (size >> 3) + 16)
            refund += charge - held
            b.charge += held
            if ts < b.min_ts:
                b.min_ts = ts
            if ts > b.max_ts:
                b.max_ts = ts
            if b.count >= st.max_messages or b.bytes >= st.max_bytes:
                del batches[bkey]
                self._dispatch(b)
                b = None
        if refund:
            self.pool.free(refund)

    def _dispatch(self, batch: _Batch) -> None:
        senders = self.senders
        n = len(senders)
        now = time.monotonic()
        if batch.preferred is not None:
            start = batch.preferred
        else:
            start = self._rr % n
            self._rr += 1
        for i in range(n):
            s = senders[(start + i) % n]
            if s.down_until <= now:
                s.put(batch)
                return
        min(senders, key=lambda s: s.down_until).put(batch)

    def _reroute(self, batches: list[_Batch]) -> None:
        self._reroutes.extend(batches)
        self._wake_router.set()

    # -- delivery outcomes --------------------------------------------------------------
    def _settle(self, batch: _Batch, reason: str | None, log_info: str | None = None) -> None:
        """Delivered (``reason`` None) or discarded; once per batch. ``log_info``: the
        discard log's reason when it is not the one that follows from ``reason``."""
        with self.stats.lock:
            if batch.settled:
                return
            batch.settled = True
        self.pool.free(batch.charge)
        if reason is None:
            self.stats.count_delivered(batch.topic, batch.count)
            return
        self.stats.discard(reason, batch.topic, batch.count, ts_min=batch.min_ts, ts_max=batch.max_ts)
        if self.discard_log is not None:
            info = log_info or _DISCARD_LOG_INFO.get(reason, D.DELIVERY_ATTEMPT_LIMIT)
            self.discard_log.write_many(info, batch.topic, batch.min_ts, b"", values_of(batch.written))

    def _refused(self, batch: _Batch, reason: str, detail: str, log_info: str) -> None:
        messages = "message" if batch.count == 1 else "messages"
        self._log_limited(f"refused:{batch.topic}", f"discarding {batch.count} {messages} of {batch.topic!r}: {detail}")
        self._settle(batch, reason, log_info)

    def _log_limited(self, key: str, message: str, interval_s: float = 5.0) -> None:
        now = time.monotonic()
        with self._log_lock:
            if now - self._log_times.get(key, -1e9) < interval_s:
                return
            self._log_times[key] = now
        log.warning("%s", message)

    # -- topics known to brokers (topicAutocreate off) ----------------------------------
    def _refresh_topics(self) -> None:
        names: set[str] = set()
        for address in self.config.brokers:
            try:
                with BrokerConnection(address, timeout_ms=self.config.broker_timeout_ms,
                                      connect_timeout_ms=2_000) as conn:  # fmt: skip
                    response = conn.checked("listTopics", T.ListTopicsRequest())
                names.update(str(t.name) for t in response.topics or [])
            except LuxunClientError as exc:
                log.warning("listTopics on %s failed: %s", address, exc)
        self._known_topics = frozenset(names)
        self._topics_epoch += 1  # the router forgets what it knew of topics
        self.metadata_updated_ms = int(time.time() * 1000)
        self.stats.incr("MetadataUpdated")

    def request_metadata_update(self) -> None:
        """What POST /metadata_update does: read the topic lists again (autocreate off)."""
        self.stats.incr("MetadataUpdateRequest")
        self._metadata_event.set()

    def _metadata_loop(self) -> None:
        while not self._stopping:
            self._metadata_event.wait(self.config.metadata_refresh_ms / 1000)
            self._metadata_event.clear()
            if self._stopping:
                return
            self._refresh_topics()

    # -- views --------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        with self.stats.lock:
            out = dict(self.stats.counters)
        for name, n in zip(_FORWARD_COUNTERS, self.received, strict=True):
            out[name] = n
        out["AgentKeyDropped"] = self.keys_dropped
        out["AgentKeyDroppedBytes"] = self.keys_dropped_bytes
        out["AgentInputHandovers"] = self.handovers
        out["MsgDelivered"] = sum(self.stats.delivered.values())
        out["PoolBytesUsed"] = self.pool.used
        out["PoolBytesPeak"] = self.pool.peak
        out["PoolBytesMax"] = self.pool.capacity
        return out

    def queues(self) -> dict[str, dict[str, int]]:
        """topic -> {"batch", "send_wait", "ack_wait"} messages; plus "new" under ""."""
        out: dict[str, dict[str, int]] = {}

        def add(topic: str, what: str, n: int) -> None:
            row = out.setdefault(topic, {"batch": 0, "send_wait": 0, "ack_wait": 0})
            row[what] += n

        for _ in range(5):
            try:
                out.clear()
                for b in list(self._batches.values()):
                    add(b.topic, "batch", b.count)
                for s in self.senders:
                    for b in list(s.queue):
                        add(b.topic, "send_wait", b.count)
                    for f in list(s.in_flight):
                        add(f.topic, "ack_wait", f.count)
                for b in list(self._reroutes):
                    add(b.topic, "send_wait", b.count)
                break
            except RuntimeError:  # changed while copied
                continue
        return out

    def brokers(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [{"broker": s.address, "up": s.down_until <= now, "produce_ok": s.ok, "produce_failed": s.failed}
                for s in self.senders]  # fmt: skip


__all__ = ["MSG_OVERHEAD_BYTES", "Agent", "Pool", "topic_name_problem"]
