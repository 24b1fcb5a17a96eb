"""The Thrift server: framed transport, binary protocol, one thread per connection.

Why this shape (measured on our 2-core machine with perf/bench_server_models.py; figures
in README, "Server model"):
thriftpy2's Cython binary protocol is several times faster than its asyncio server's
pure-Python protocol, so calls are decoded with ``TCyBinaryProtocol``; one thread per
connection keeps a slow or long-polling consumer from stalling anybody (a waiting
consumer is a blocked thread, not a busy one).

We do the framing ourselves instead of using thriftpy2's framed transport, because
that one allocates whatever size a frame header announces. Here a frame is refused
(and the connection closed) when its size is <= 0 or above ``max_frame_bytes``, and
every frame is walked once (:func:`check_frame`) so that no length or count inside it
can point past its end before the Cython decoder sees it. Reads are buffered: many
small frames (oneway produces) are taken from one ``recv``.

Produce calls take a hand-written path (:mod:`luxun.wire`): a ``produce`` or
``asyncProduce`` frame in the canonical layout is parsed in a few slices (about 1 us
instead of about 6 us for checking plus decoding), and the asyncProduce frames
found together in the buffer for one topic are appended with one ``enqueue_many``
(flushed before any other call on the connection, so calls still take effect in
the order they were sent). A ``consume`` in its canonical layout is parsed by hand
too; one that takes a single item and succeeds at once (``QueueHandler.consume_single``:
by group or by index, no fetch size, no extension) is answered with one ``join`` and no
request or response struct (in process, about 22 k instead of 47 k instructions per call).
Anything else takes the generic checked path.

Busy polling: a sync call's round trip is mostly the two wake-ups, the client's and
ours (an idle vCPU of a VM wakes slowly). So after answering, a connection that has been
the only one receiving for 50 ms polls its socket without sleeping (``recv`` with
MSG_DONTWAIT) for up to ``busy_poll_us`` (``busy.poll.us``, default 200 us) before it
waits in ``recv``: a client calling in a loop finds it awake. Only after a reply under
256 KiB: a client sending oneway calls, or decoding a big fetch, is not waiting for us,
and polling would only take CPU from it (one of 100 KB is decoded well within a poll).
While polling, the thread holds the interpreter between ``recv`` calls, so it stops as
soon as another connection of either door receives bytes, and after 2 ms of polls back
to back it waits in ``recv`` once, letting any other thread (a woken long poll, the
maintenance) in. The cost: up to one core while a lone client calls back to back,
nothing when idle.

Bounded input: a connection's receive buffer starts at 4 KiB and grows as bytes
arrive (doubling, up to the frame being received), never to the size a header
announces. Every byte of buffer beyond the first 4 KiB is taken from one broker-wide
:class:`InputBudget` (default 256 MiB). A connection whose frame needs more room than
the budget has left stops reading (TCP pushes back on its client) until other
connections give memory back; if none comes back within ``budget_wait_s`` (10 s), it
is closed with one warning line, so stalled half-sent frames holding the budget cannot
hang every other client for ever. A frame over 1 MiB (a big item) is received into its
own anonymous mapping instead (:class:`_BigFrame`): the kernel backs only the pages
written, so memory still follows the bytes, and the mapping is unmapped once the frame
is handled. Grown in glibc's heap (whose arenas the broker lets keep 16 MiB each, see
``tune_allocator``), such buffers left the heap fragmented: 150 connections sending
2 MiB frames took the broker's peak RSS up to 640 MiB over a 256 MiB budget.

Out of file descriptors (``accept`` failing with EMFILE, ENFILE, ENOBUFS or ENOMEM):
one descriptor is kept in reserve; it is closed to accept the pending connection and
close it at once (its client sees a closed connection instead of hanging), then opened
again. When that is not possible the accept loop sleeps, 10 ms doubling up to 1 s.
Repeated error lines go through :class:`~luxun.logs.RateLimitedLog`.

Thread-safety: ``start``/``stop`` from the main thread; connections run in their own.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import errno
import itertools
import logging
import mmap
import os
import resource
import select
import socket
import struct
import threading
import time
from typing import Any

from thriftpy2.protocol.cybin import TCyBinaryProtocol  # type: ignore[attr-defined]
from thriftpy2.thrift import TApplicationException, TProcessor, TType
from thriftpy2.transport.memory import TCyMemoryBuffer  # type: ignore[attr-defined]

from idl.binary import ThriftBinaryError, skip_message

from .config import DEFAULT_BUSY_POLL_US
from .errors import LuxunError
from .logs import RateLimitedLog
from .metrics import Metrics
from .wire import (
    ASYNC_ITEM_AT,
    ASYNC_ITEM_HEAD,
    ASYNC_ITEM_HEAD_AT,
    ASYNC_ITEM_LEN_AT,
    ASYNC_PRODUCE_START,
    ItemBlob,
    consume_one_reply_frame,
    encode_consume_reply,
    encode_consume_reply_parts,
    missing_required_field,
    parse_consume_call,
    parse_produce_call,
    produce_reply_frame,
    required_fields,
)

log = logging.getLogger(__name__)
#: Lines a client or a bad environment can repeat, keyed by kind (never by peer).
_rate_limited = RateLimitedLog(log)

#: Bytes of receive buffer all connections may hold together beyond their first
#: _INITIAL_BUFFER each (raised to twice the largest frame when that is bigger).
DEFAULT_MAX_BUFFERED_BYTES = 256 << 20
#: How long a connection waits for input budget before it is closed.
DEFAULT_BUDGET_WAIT_S = 10.0
_INITIAL_BUFFER = 4 * 1024
# A connection whose buffer fills (a stream of asyncProduce) reads this much at a time:
# more calls per recv, bigger appends. 64 KiB -> 1 MiB, perf/bench_broker.py
# asyncProduce of 10 KB (3 runs each): 4 clients 20.5-21.6 k -> 34.3-35.7 k items/s,
# broker CPU per item 47-49 -> 28-29 us; 1 client 42-47 -> 36 us per item.
_READ_BUFFER = 1 << 20
# A connection's buffer grows to this at most and is kept between frames (an empty one
# shrinks to _INITIAL_BUFFER while the budget is more than half taken or someone waits
# for it); a bigger frame is received into a mapping of its own (_BigFrame).
_KEEP_BUFFER = 1 << 20
# accept() errors that mean "out of descriptors or memory": shed, back off.
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_BACKOFF_MIN_S = 0.01
_ACCEPT_BACKOFF_MAX_S = 1.0
# What a reserve descriptor made from a refused connection's points to (stderr: always
# open in a broker; if not, the reserve is opened anew).
_RESERVE_SOURCE_FD = 2
_THREAD_STACK_BYTES = 512 * 1024
_MAX_DEPTH = 32
# A batch of received asyncProduce calls is appended at this size at the latest.
_MAX_BATCH_ITEMS = 4096
_MAX_BATCH_BYTES = 8 << 20

_I32 = struct.Struct(">i")

# Busy polling (ThriftServer, busy_poll_us; default DEFAULT_BUSY_POLL_US): a lone
# connection polls ... only after it has been the only connection receiving for this long,
_BUSY_POLL_QUIET_S = 0.05
# ... and only after a reply smaller than this (a client decoding a big fetch, or one
# sending oneway calls, is not waiting for an answer: polling would only take CPU from it;
# one item of 100 KB is decoded well within a poll: with 64 KiB, until 2026-11-27, a lone
# client's one-item consumes of 100 KB got 4.6-4.9 k calls/s, now 7.0-7.4 k; README),
_BUSY_POLL_REPLY_MAX = 256 * 1024
# ... and after polling this long back to back it waits in recv once (others get the GIL).
_BUSY_POLL_RUN_S = 0.002


class _Receiving:
    """The connection thread (of any door of this process) that received bytes last, and
    since when it has been the only one to: busy polling's sign that nobody else needs the
    interpreter. Written without a lock by every connection after each ``recv`` (a hint:
    a stale value only makes one poll longer or shorter)."""

    __slots__ = ("ident", "since")

    def __init__(self) -> None:
        self.ident = 0
        self.since = 0.0

    def note(self, me: int) -> None:
        if self.ident != me:
            self.ident = me
            self.since = time.monotonic()


#: Process-wide: the Thrift and the Kafka door share one interpreter.
RECEIVING = _Receiving()


class BadFrame(ValueError):
    """A frame that is not a well-formed Thrift binary message."""


def check_frame(frame: bytes) -> None:
    """Walk one Thrift binary-protocol message; raise :class:`BadFrame` unless every
    length and element count fits in the bytes that remain.

    Work is bounded by the frame length; values nested deeper than 32 levels are
    refused (:func:`idl.binary.skip_message` does the walk). Only the structure is
    checked; field types are the decoder's business.
    """
    try:
        skip_message(frame, _MAX_DEPTH)
    except ThriftBinaryError as exc:
        raise BadFrame(f"{exc} (frame of {len(frame)} bytes)") from None


class AsyncProduceBatch:
    """Consecutive asyncProduce calls to one topic, handed to the handler's
    ``async_produce_many`` together (one ``enqueue_many``). The caller flushes before
    any other call, so calls still take effect in the order they were sent; a batch
    also goes at ``_MAX_BATCH_ITEMS`` items or ``_MAX_BATCH_BYTES`` bytes."""

    __slots__ = ("handler", "items", "nbytes", "topic")

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.topic: str | None = None
        self.items: list[bytes | bytearray | memoryview | None] = []
        self.nbytes = 0

    def add(self, topic: str, item: bytes | bytearray | memoryview) -> None:
        full = len(self.items) >= _MAX_BATCH_ITEMS or self.nbytes >= _MAX_BATCH_BYTES
        if self.items and (full or topic != self.topic):
            self.flush()
        self.topic = topic
        self.items.append(item)
        self.nbytes += len(item)

    def flush(self) -> None:
        if self.items:
            items, self.items, self.nbytes = self.items, [], 0
            self.handler.async_produce_many(self.topic, items)


class InputBudget:
    """Bytes of receive buffer the connections hold together (beyond their first
    ``_INITIAL_BUFFER`` each), at most ``limit``. Waiters are served first come, first
    served (a big frame is not starved by small ones). ``used`` is also published as
    the ``input_buffer_bytes`` gauge of ``metrics``.

    Thread-safety: every method may be called from any thread.
    """

    def __init__(self, limit: int, metrics: Metrics) -> None:
        self.limit = limit
        self.used = 0
        self._metrics = metrics
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[object] = collections.deque()  # one ticket per waiter

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def tight(self) -> bool:
        """More than half taken, or somebody waiting (read without the lock: a hint)."""
        return bool(self._queue) or self.used > self.limit // 2

    def try_take(self, n: int) -> bool:
        """Take ``n`` bytes if they are free now and nobody waits; False (nothing
        taken) if not."""
        with self._cond:
            if self._queue or self.used + n > self.limit:
                return False
            self.used += n
            self._metrics.input_buffer_bytes = self.used
            return True

    def take(self, n: int, timeout_s: float, stopping: threading.Event) -> bool:
        """Take ``n`` bytes, waiting up to ``timeout_s`` for them (after those who
        waited before); False (nothing taken) if they did not come free in time or the
        server is stopping."""
        with self._cond:
            if self._queue or self.used + n > self.limit:
                ticket = object()
                self._queue.append(ticket)
                self._metrics.input_buffer_waits += 1
                deadline = time.monotonic() + timeout_s
                try:
                    while self._queue[0] is not ticket or self.used + n > self.limit:
                        left = deadline - time.monotonic()
                        if left <= 0 or stopping.is_set():
                            return False
                        self._cond.wait(min(left, 0.5))
                finally:
                    self._queue.remove(ticket)
                    self._cond.notify_all()  # the next in line may go now
            self.used += n
            self._metrics.input_buffer_bytes = self.used
            return True

    def give(self, n: int) -> None:
        """Give back ``n`` bytes taken before."""
        if n <= 0:
            return
        with self._cond:
            self.used -= n
            self._metrics.input_buffer_bytes = self.used
            if self._queue:
                self._cond.notify_all()

    def wake_all(self) -> None:
        with self._cond:
            self._cond.notify_all()


class _BigFrame:
    """A connection's frame over _KEEP_BUFFER while it is received and handled: its own
    anonymous mapping (``mm``) and the input budget taken for it (``taken`` bytes)."""

    __slots__ = ("mm", "taken", "view")

    def __init__(self) -> None:
        self.mm: mmap.mmap | None = None
        self.view: memoryview | None = None  # what the frame is read from once complete
        self.taken = 0

    def release(self, budget: InputBudget) -> None:
        """Unmap the frame (its memory goes back to the system at once) and give its
        budget back. A view of it still referenced (an exception's traceback) keeps the
        mapping until that goes."""
        view, mm = self.view, self.mm
        self.view = self.mm = None
        with contextlib.suppress(BufferError):
            if view is not None:
                view.release()
            if mm is not None:
                mm.close()
        budget.give(self.taken)
        self.taken = 0


class TcpServer:
    """What every luxun door has: a listener on ``host:port``, one thread per
    connection, the broker-wide input budget and the accept loop that survives running
    out of descriptors. A subclass sets ``max_frame_bytes`` and implements
    :meth:`_read_frames` (read and answer one connection's requests until it closes).

    Args:
        max_connections: connections beyond this are closed at once (and counted).
        max_buffered_bytes: the :class:`InputBudget` of all connections' receive
            buffers (default ``DEFAULT_MAX_BUFFERED_BYTES``, at least twice
            ``max_frame_bytes``).
        budget_wait_s: how long a connection waits for input budget before it is closed.
        name: the prefix of the server's thread names.
    """

    max_frame_bytes: int

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_connections: int = 10_000,
        metrics: Metrics | None = None,
        max_buffered_bytes: int | None = None,
        budget_wait_s: float = DEFAULT_BUDGET_WAIT_S,
        name: str = "luxun",
    ) -> None:
        self.max_connections = max_connections
        self.metrics = metrics or Metrics()
        if max_buffered_bytes is None:
            max_buffered_bytes = max(DEFAULT_MAX_BUFFERED_BYTES, 2 * self.max_frame_bytes)
        self._budget = InputBudget(max_buffered_bytes, self.metrics)
        self.budget_wait_s = budget_wait_s
        self._name = name
        self._stopping = threading.Event()
        self._conns: dict[int, tuple[socket.socket, threading.Thread]] = {}
        #: Threads holding received bytes they have not processed yet (see input_pending).
        self._busy: set[int] = set()
        self._conns_lock = threading.Lock()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))  # the port is ours now; it accepts from start()
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        # Closed to make room for accepting (and closing) a connection when out of
        # descriptors; see _accept_on_reserve.
        self._reserve_fd: int | None = _open_reserve_fd()
        self._accept_thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)

    def start(self) -> None:
        """Listen and start accepting connections (returns at once). Until then the port is
        bound but refuses connections, so that a client that got in knows the server is up."""
        self._listener.listen(1024)
        self._accept_thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, let in-flight calls finish and reply, close every connection.

        Frames already received are still processed; nothing new is read.
        """
        if self._stopping.is_set():
            return
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._budget.wake_all()
        if self._accept_thread.ident is not None:  # started (stop() before start() is fine)
            self._accept_thread.join(timeout_s)
        with self._conns_lock:
            conns = list(self._conns.values())
        for sock, _ in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RD)
        for _, thread in conns:
            thread.join(timeout_s)
        if self._reserve_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._reserve_fd)
            self._reserve_fd = None

    # -- accepting ---------------------------------------------------------------------
    def _accept_loop(self) -> None:
        old_stack = threading.stack_size()
        backoff = 0.0
        while not self._stopping.is_set():
            try:
                sock, peer = self._listener.accept()
            except OSError as exc:
                if self._stopping.is_set():
                    return
                self.metrics.accept_failures += 1
                outcome: tuple[socket.socket, Any] | bool = False
                if exc.errno in _RESOURCE_ERRNOS:
                    _rate_limited.error(
                        f"accept-{exc.errno}",
                        "cannot accept connections on %s:%d: %s (open files limit %s); new connections are "
                        "closed at once until descriptors are free",
                        self.address[0],
                        self.address[1],
                        exc,
                        _open_files_limit(),
                    )
                    outcome = self._accept_on_reserve()
                else:
                    _rate_limited.error(
                        "accept-other", "accept on %s:%d failed: %s", self.address[0], self.address[1], exc
                    )
                if outcome is True:  # one pending connection closed: no spin, the next accept waits
                    continue
                if outcome is False:
                    backoff = min(max(2 * backoff, _ACCEPT_BACKOFF_MIN_S), _ACCEPT_BACKOFF_MAX_S)
                    self._stopping.wait(backoff)
                    continue
                sock, peer = outcome
            backoff = 0.0
            self._start_connection(sock, peer, old_stack)

    def _accept_on_reserve(self) -> tuple[socket.socket, Any] | bool:
        """Out of descriptors: close the reserve one and accept the next connection in
        its room (waiting for one if none is pending, so this cannot spin). If the
        reserve cannot be opened again we are still out of descriptors: the connection
        is closed at once (its client sees a closed connection rather than a hang) and
        True returned. If it can, descriptors came back: the connection is returned to
        be served. False if there is no reserve or the accept failed (back off)."""
        if self._reserve_fd is None:
            self._reserve_fd = _open_reserve_fd()
            if self._reserve_fd is None:
                return False
        os.close(self._reserve_fd)
        self._reserve_fd = None
        try:
            sock, peer = self._listener.accept()
        except OSError:
            self._reserve_fd = _open_reserve_fd()
            return False
        self._reserve_fd = _open_reserve_fd()
        if self._reserve_fd is not None:
            return sock, peer
        # Still out of descriptors: close the connection but keep its descriptor as the
        # new reserve (dup2 swaps it in one step: no other thread can take it meanwhile).
        fd = sock.detach()
        try:
            os.dup2(_RESERVE_SOURCE_FD, fd, inheritable=False)
            self._reserve_fd = fd
        except OSError:
            os.close(fd)
            self._reserve_fd = _open_reserve_fd()
        self.metrics.connections_refused += 1
        return True

    def _start_connection(self, sock: socket.socket, peer: Any, old_stack: int) -> None:
        with self._conns_lock:
            too_many = len(self._conns) >= self.max_connections
        if too_many:
            self.metrics.connections_refused += 1
            _rate_limited.warning(
                "too-many-connections",
                "refusing connection from %s: %d connections open already (the limit)",
                peer,
                self.max_connections,
            )
            sock.close()
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # the peer is gone already
            sock.close()
            return
        threading.stack_size(_THREAD_STACK_BYTES)
        try:
            thread = threading.Thread(
                target=self._serve, args=(sock, peer), name=f"{self._name}-conn-{peer}", daemon=True
            )
        finally:
            threading.stack_size(old_stack)
        with self._conns_lock:
            self._conns[sock.fileno()] = (sock, thread)
        self.metrics.connections_total += 1
        self.metrics.connections_open += 1
        try:
            thread.start()
        except RuntimeError as exc:  # can't start new thread: out of memory or a thread limit
            with self._conns_lock:
                self._conns.pop(sock.fileno(), None)
            self.metrics.connections_open -= 1
            self.metrics.connections_refused += 1
            _rate_limited.error(
                "thread-start", "closing connection from %s: cannot start a thread for it (%s)", peer, exc
            )
            sock.close()

    # -- one connection ---------------------------------------------------------------
    def _serve(self, sock: socket.socket, peer: Any) -> None:
        key = sock.fileno()
        try:
            self._read_frames(sock, peer)
        except (ConnectionError, TimeoutError):
            pass
        except OSError as exc:
            log.debug("connection %s: %s", peer, exc)
        except Exception:
            _rate_limited.exception("connection-failed", "connection from %s failed", peer)
        finally:
            with self._conns_lock:
                self._conns.pop(key, None)
            self.metrics.connections_open -= 1
            with contextlib.suppress(OSError):
                sock.close()

    def _read_frames(self, sock: socket.socket, peer: Any) -> None:
        raise NotImplementedError

    def input_pending(self) -> bool:
        """True while another connection holds bytes it has not processed yet: in its
        buffer (from the ``recv`` that returned them until the next one) or still in
        the kernel's receive queue. Cost: a poll over the open connections, so only
        for rare paths (a consume of a topic that does not exist, see QueueHandler).
        """
        me = threading.get_ident()
        if any(ident != me for ident in tuple(self._busy)):
            return True
        with self._conns_lock:
            socks = [sock for sock, thread in self._conns.values() if thread.ident != me]
        poller = select.poll()
        for sock in socks:
            with contextlib.suppress(ValueError, OSError):  # closed meanwhile
                poller.register(sock, select.POLLIN)
        return any(events & select.POLLIN for _, events in poller.poll(0))


class ThriftServer(TcpServer):
    """Serves a thriftpy2 service on ``host:port`` (``port=0`` picks a free one).

    Args:
        service: the thriftpy2 service (``luxun_thrift.QueueService``).
        handler: the object implementing it.
        max_frame_bytes: largest frame accepted; bigger ones close the connection.
        max_connections: connections beyond this are closed at once (and counted).
        max_buffered_bytes: the :class:`InputBudget` of all connections' receive
            buffers (default ``DEFAULT_MAX_BUFFERED_BYTES``, at least twice
            ``max_frame_bytes``).
        budget_wait_s: how long a connection waits for input budget before it is closed.
        busy_poll_us: after answering, a connection that has been the only one receiving
            (for ``_BUSY_POLL_QUIET_S``) polls its socket this long before it sleeps in
            ``recv`` (0: never); see the module docstring.
        on_stop: called after the last connection finished, before ``stop`` returns.
    """

    def __init__(
        self,
        service: Any,
        handler: Any,
        host: str,
        port: int,
        *,
        max_frame_bytes: int,
        max_connections: int = 10_000,
        metrics: Metrics | None = None,
        max_buffered_bytes: int | None = None,
        budget_wait_s: float = DEFAULT_BUDGET_WAIT_S,
        busy_poll_us: int = DEFAULT_BUSY_POLL_US,
    ) -> None:
        self.busy_poll_us = busy_poll_us
        self._processor = TProcessor(service, handler)
        self._handler = handler
        # Per method: args class, result class, oneway, argument names, required fields.
        self._methods: dict[str, tuple[Any, Any, bool, tuple[str, ...], Any]] = {}
        for api in service.thrift_services:
            args_cls, result_cls = getattr(service, api + "_args"), getattr(service, api + "_result")
            names = tuple(entry[1] for entry in args_cls.thrift_spec.values())
            oneway = bool(getattr(result_cls, "oneway", False))
            self._methods[api] = (args_cls, result_cls, oneway, names, required_fields(args_cls))
        # The consume fast path, when the service has ``consume`` and the handler
        # ``consume_for_wire`` (QueueService and QueueHandler do).
        self._consume_args: Any = getattr(service, "consume_args", None)
        self._consume_for_wire: Any = getattr(handler, "consume_for_wire", None) if self._consume_args else None
        # ... and its request struct, built from the fields a canonical consume frame
        # carries (wire.parse_consume_call): no check_frame walk, no generic decoding.
        spec = getattr(self._consume_args, "thrift_spec", {}).get(1) if self._consume_args else None
        self._consume_request: Any = spec[2] if spec and len(spec) > 2 and isinstance(spec[2], type) else None
        # The produce fast path, when the handler has the batch-aware entry points.
        self._fast_produce = hasattr(handler, "produce_item") and hasattr(handler, "async_produce_many")
        self.max_frame_bytes = max_frame_bytes
        super().__init__(
            host,
            port,
            max_connections=max_connections,
            metrics=metrics,
            max_buffered_bytes=max_buffered_bytes,
            budget_wait_s=budget_wait_s,
        )

    def _read_frames(self, sock: socket.socket, peer: Any) -> None:
        """Read and handle frames until the peer closes, a frame is refused, or the
        server stops. The buffer's bytes beyond _INITIAL_BUFFER, and a big frame's
        mapping, are taken from the input budget and given back here."""
        buf = bytearray(_INITIAL_BUFFER)  # grows as bytes arrive, never ahead of them
        big = _BigFrame()
        try:
            self._read_frames_into(sock, peer, buf, big)
        finally:
            self._busy.discard(threading.get_ident())
            # _read_frames_into keeps buf's length and the budget in step; it replaces
            # buf only by shrinking it in place.
            self._budget.give(len(buf) - _INITIAL_BUFFER)
            big.release(self._budget)

    def _take_input_budget(self, peer: Any, size: int, more: int) -> bool:
        """Take ``more`` bytes of input budget for a frame of ``size`` bytes, waiting up to
        ``budget_wait_s``; False (counted, one warning line) if they did not come."""
        budget = self._budget
        if budget.take(more, self.budget_wait_s, self._stopping):
            return True
        if not self._stopping.is_set():
            self.metrics.input_buffer_closed += 1
            _rate_limited.warning(
                "input-budget",
                "closing connection from %s: its frame of %d bytes needs %d more bytes of buffer "
                "and all connections' input buffers have held %d of %d bytes for %g s",
                peer,
                size,
                more,
                budget.used,
                budget.limit,
                self.budget_wait_s,
            )
        return False

    def _read_big_frame(self, sock: socket.socket, peer: Any, head: memoryview, size: int, big: _BigFrame) -> bool:
        """Receive a frame of ``size`` bytes over _KEEP_BUFFER, whose first bytes are
        ``head``, into ``big``'s own mapping; False if the peer closed, the server stops
        or no budget came in time (the connection is then closed). Budget is taken as
        bytes arrive (doubling, as for the buffer); the kernel backs only pages written."""
        total = 4 + size
        busy, me = self._busy, threading.get_ident()
        big.mm = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        have = 0
        with memoryview(big.mm) as view:
            while have < total:
                if have == big.taken:  # the budgeted part is full: double it
                    more = min(max(2 * have, 2 * len(head), _READ_BUFFER), total) - have
                    if not self._take_input_budget(peer, size, more):
                        return False
                    big.taken += more
                    if not have:
                        view[: len(head)] = head
                        have = len(head)
                        continue
                if self._stopping.is_set():
                    return False
                busy.discard(me)
                n = sock.recv_into(view[have : big.taken])
                RECEIVING.note(me)
                busy.add(me)
                if n == 0:
                    return False
                have += n
        return True

    def _read_frames_into(self, sock: socket.socket, peer: Any, buf: bytearray, big: _BigFrame) -> None:
        start = end = 0
        max_frame = self.max_frame_bytes
        handler = self._handler
        fast_produce = self._fast_produce
        consume_for_wire = self._consume_for_wire
        consume_request = self._consume_request
        fast_consume = consume_for_wire is not None and consume_request is not None
        consume_single = getattr(handler, "consume_single", None) if fast_consume else None
        budget = self._budget
        busy, me = self._busy, threading.get_ident()
        batch = AsyncProduceBatch(handler)
        poll_s = self.busy_poll_us / 1e6
        receiving = RECEIVING
        polled_since = 0.0  # when this run of busy polls began (0: the last read waited)
        answered = False  # a small reply went out since the last read: its client calls again soon
        metrics = self.metrics
        frames: bytearray | memoryview = buf  # big.view while a big frame is handled
        # The tail (topic field, topic, STOP STOP) of the last asyncProduce call parsed from
        # buf, the topic it names, and the bytes of such a call other than its item.
        async_tail: bytes | None = None
        async_topic = ""
        async_room = 0
        while True:
            # Handle every complete frame in the buffer. Consecutive asyncProduce calls
            # to one topic are appended together (see AsyncProduceBatch).
            while end - start >= 4:
                (size,) = _I32.unpack_from(frames, start)
                if size <= 0 or size > max_frame:
                    batch.flush()
                    self.metrics.bad_frames += 1
                    _rate_limited.warning(
                        "frame-size", "closing connection from %s: frame of %d bytes (limit %d)", peer, size, max_frame
                    )
                    return
                if end - start - 4 < size:
                    if start + 4 + size > len(buf) and start:  # move the partial frame to the front
                        buf[: end - start] = buf[start:end]
                        end -= start
                        start = 0
                    break
                if async_tail is not None and frames is buf:
                    # Another asyncProduce to the last one's topic (the same tail): four
                    # comparisons instead of parsing it again (its seqid is not read).
                    at = start + 4
                    n = size - async_room
                    if (
                        n >= 0
                        and buf.startswith(ASYNC_PRODUCE_START, at)
                        and buf.startswith(ASYNC_ITEM_HEAD, at + ASYNC_ITEM_HEAD_AT)
                        and _I32.unpack_from(buf, at + ASYNC_ITEM_LEN_AT)[0] == n
                        and buf.startswith(async_tail, at + ASYNC_ITEM_AT + n)
                    ):
                        batch.add(async_topic, buf[at + ASYNC_ITEM_AT : at + ASYNC_ITEM_AT + n])
                        start = at + size
                        continue
                call = parse_produce_call(frames, start + 4, start + 4 + size) if fast_produce else None
                if call is not None and call[0]:  # asyncProduce
                    if frames is buf and buf.startswith(ASYNC_PRODUCE_START, start + 4):
                        async_tail = bytes(buf[start + 4 + ASYNC_ITEM_AT + len(call[2]) : start + 4 + size])
                        async_topic = call[3]
                        async_room = ASYNC_ITEM_AT + len(async_tail)
                    start += 4 + size
                    batch.add(call[3], call[2])
                    continue
                batch.flush()
                if call is not None:  # produce: decoded and answered by hand
                    _, seqid, item, topic = call
                    start += 4 + size
                    result, index = handler.produce_item(topic, item)
                    del call, item  # not held while this thread waits in send or recv
                    if frames is not buf:
                        # A big frame (one frame in its own mapping) is unmapped before
                        # its reply goes: a client that has its answer finds the memory back.
                        big.release(budget)
                        frames = buf
                        start = end = 0
                    sock.sendall(produce_reply_frame(seqid, result, index))
                    answered = True
                    continue
                consume = parse_consume_call(frames, start + 4, start + 4 + size) if fast_consume else None
                if consume is not None:  # consume: decoded by hand, answered with the wire encoder
                    start += 4 + size
                    seqid, fields = consume
                    one = consume_single(fields) if consume_single is not None else None
                    if one is not None:  # one item at once: no request or response struct
                        sock.sendall(consume_one_reply_frame(seqid, *one))
                        answered = len(one[0]) < _BUSY_POLL_REPLY_MAX
                        del consume, fields, one  # not held while this thread waits in send or recv
                        continue
                    # Items read as views of the storage pages are sent from there (no copy)
                    # and given back once sent.
                    response = consume_for_wire(consume_request(**fields), True)
                    try:
                        reply_size = self._send_parts(sock, encode_consume_reply_parts(seqid, response))
                    finally:
                        if isinstance(response.itemList, ItemBlob):
                            response.itemList.release()
                    answered = reply_size < _BUSY_POLL_REPLY_MAX
                    del consume, fields, response  # not held while this thread waits in send or recv
                    continue
                with memoryview(frames) as view:
                    frame = bytes(view[start + 4 : start + 4 + size])
                start += 4 + size
                answered = True
                if not self._handle(sock, peer, frame):
                    return
                del frame
            call = None  # the last asyncProduce's item is not held while we wait in recv
            batch.flush()
            if start == end:
                start = end = 0
                if frames is not buf:  # a big frame was handled: unmap it
                    big.release(budget)
                    frames = buf
                if len(buf) > _INITIAL_BUFFER and budget.tight:  # others need it: give it all back
                    budget.give(len(buf) - _INITIAL_BUFFER)
                    del buf[_INITIAL_BUFFER:]
            elif end == len(buf):
                if start:
                    # The buffer ends inside a frame header: move what is left to the
                    # front (a recv into no room would read as end of stream).
                    buf[: end - start] = buf[start:end]
                    end -= start
                    start = 0
                else:
                    # Full of one partial frame: grow, doubling but never past the frame,
                    # so memory follows the bytes received, not the size announced.
                    (size,) = _I32.unpack_from(buf, 0)
                    if 4 + size > _KEEP_BUFFER:  # a big frame: into its own mapping
                        with memoryview(buf) as view:
                            if not self._read_big_frame(sock, peer, view[:end], size, big):
                                return
                        assert big.mm is not None
                        big.view = frames = memoryview(big.mm)  # items are views, not copies
                        start, end = 0, 4 + size
                        answered = False
                        continue
                    more = min(max(2 * len(buf), _READ_BUFFER), 4 + size) - len(buf)
                    if not self._take_input_budget(peer, size, more):
                        return
                    buf.extend(bytes(more))
            if self._stopping.is_set():
                return
            busy.discard(me)
            with memoryview(buf) as view:
                n = -1
                if poll_s and answered and receiving.ident == me:
                    now = time.monotonic()
                    if now - receiving.since > _BUSY_POLL_QUIET_S:
                        if not polled_since:
                            polled_since = now
                        if now - polled_since < _BUSY_POLL_RUN_S:
                            n = self._busy_poll(sock, view[end:], poll_s)
                            metrics.busy_polls += 1
                            metrics.busy_poll_hits += n >= 0
                if n < 0:
                    polled_since = 0.0
                    n = sock.recv_into(view[end:])
            answered = False
            receiving.note(me)
            busy.add(me)
            if n == 0:
                return
            end += n
            if (
                end == len(buf)
                and len(buf) < _READ_BUFFER
                and (end - start < 4 or 4 + _I32.unpack_from(buf, start)[0] <= _KEEP_BUFFER)
                and budget.try_take(_READ_BUFFER - len(buf))
            ):
                # A busy connection (e.g. a stream of asyncProduce): read in bigger
                # chunks. Quiet ones (a waiting consumer) keep the small buffer, and so
                # does one receiving a frame bigger than _KEEP_BUFFER (its own mapping).
                buf.extend(bytes(_READ_BUFFER - len(buf)))

    @staticmethod
    def _busy_poll(sock: socket.socket, view: memoryview, poll_s: float) -> int:
        """Read into ``view`` without sleeping for up to ``poll_s``: the bytes read (0:
        the peer closed), or -1 if none came (then wait in ``recv`` as usual)."""
        deadline = time.perf_counter() + poll_s
        while True:
            try:
                return sock.recv_into(view, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if time.perf_counter() > deadline:
                    return -1

    def _handle(self, sock: socket.socket, peer: Any, frame: bytes) -> bool:
        """Decode one call frame, call the handler, send its reply; False when the
        connection must be closed (an undecodable frame).

        As Java Luxun (its Thrift processor) answers: an unknown method gets a
        TApplicationException UNKNOWN_METHOD ("Invalid method name: 'x'"), a request
        struct with a required field unset gets PROTOCOL_ERROR (Java's text, see
        :func:`~luxun.wire.missing_required_field`), and a handler that raises gets
        INTERNAL_ERROR ("Internal error processing <call>"); oneway calls never get
        a reply. The connection stays open in each case.
        """
        try:
            check_frame(frame)
            iprot = TCyBinaryProtocol(TCyMemoryBuffer(frame), strict_read=False)
            api, _, seqid = iprot.read_message_begin()
            method = self._methods.get(api)
            if method is None:
                iprot.skip(TType.STRUCT)
            else:
                args = method[0]()
                args.read(iprot)
            iprot.read_message_end()
        except Exception as exc:
            self.metrics.bad_frames += 1
            _rate_limited.warning("undecodable", "closing connection from %s: undecodable request (%s)", peer, exc)
            return False
        if method is None:
            unknown = TApplicationException.UNKNOWN_METHOD
            self._send_exception(sock, api, seqid, unknown, f"Invalid method name: '{api}'")  # Java's text
            return True
        _, result_cls, oneway, names, required = method
        values = [getattr(args, name) for name in names]
        for name, fields in required:
            request = getattr(args, name)
            if request is not None and any(getattr(request, f) is None for f in fields):
                missing = missing_required_field(args) or ""
                self.metrics.observe(api, 0.0, 0)  # counted as INTERNAL_ERROR
                _rate_limited.warning(f"protocol-{api}", "%s from %s refused: %s", api, peer, missing)
                if not oneway:
                    self._send_exception(sock, api, seqid, TApplicationException.PROTOCOL_ERROR, missing)
                return True
        try:
            if api == "consume" and self._consume_for_wire is not None:
                # The hot read path: the items come as one blob, encoded by hand.
                self._send_parts(sock, encode_consume_reply_parts(seqid, self._consume_for_wire(*values)))
                return True
            value = getattr(self._handler, api)(*values)
        except OSError:  # the connection (sending the reply): closed by _serve
            raise
        except Exception as exc:
            if isinstance(exc, LuxunError):
                _rate_limited.warning(f"failed-{api}", "%s from %s failed: %s", api, peer, exc)
            else:
                _rate_limited.exception(f"failed-{api}", "%s from %s failed", api, peer)
            if not oneway:
                self._send_exception(sock, api, seqid, TApplicationException.INTERNAL_ERROR,
                                     f"Internal error processing {api}")  # fmt: skip
            return True
        if oneway:
            return True
        if api == "consume":
            out = encode_consume_reply(seqid, value)  # encoded by hand
        else:
            result = result_cls(success=value)  # our handlers answer errors in Result, never raise
            oprot = TCyBinaryProtocol(TCyMemoryBuffer())
            self._processor.send_result(oprot, api, result, seqid)
            out = oprot.trans.getvalue()
        self._send(sock, out)
        return True

    def _send_exception(self, sock: socket.socket, api: str, seqid: int, kind: int, message: str) -> None:
        oprot = TCyBinaryProtocol(TCyMemoryBuffer())
        self._processor.send_exception(oprot, api, TApplicationException(kind, message), seqid)
        self._send(sock, oprot.trans.getvalue())

    @staticmethod
    def _send_parts(sock: socket.socket, parts: list[Any]) -> int:
        """Send one reply frame made of a few buffers (bytes, memoryviews, C-contiguous
        arrays) with scatter/gather writes: no joined copy of a big reply, and no object
        made per buffer (a 1 MiB reply of 10 KB items has some 200). Returns its size
        (without the 4-byte length)."""
        ends = list(itertools.accumulate([len(p) if type(p) is bytes else p.nbytes for p in parts]))
        size = ends[-1] if ends else 0
        header = size.to_bytes(4, "big")
        if size < 65536:
            sock.sendall(b"".join([header, *parts]))
            return size
        done = sock.sendmsg([header, *parts])  # a blocking socket takes it all, unless a signal came
        while done < 4 + size:
            if done < 4:
                rest = [header[done:], *parts]
            else:
                i = bisect.bisect_right(ends, done - 4)  # the first buffer not sent whole
                off = done - 4 - (ends[i - 1] if i else 0)
                rest = [memoryview(parts[i]).cast("B")[off:], *parts[i + 1 :]] if off else parts[i:]
            done += sock.sendmsg(rest)
        return size

    @staticmethod
    def _send(sock: socket.socket, out: bytes) -> None:
        """Send one reply frame."""
        header = len(out).to_bytes(4, "big")
        if len(out) < 65536:
            sock.sendall(header + out)
        else:  # no copy of a big reply; finish with sendall if the kernel took only part
            sent = sock.sendmsg([header, out])
            if sent < 4:
                sock.sendall(header[sent:])
                sent = 4
            if sent < 4 + len(out):
                sock.sendall(memoryview(out)[sent - 4 :])


def _open_reserve_fd() -> int | None:
    """A descriptor kept open to be closed when we run out (see _accept_on_reserve)."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _open_files_limit() -> str:
    try:
        return str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (OSError, ValueError):
        return "unknown"
