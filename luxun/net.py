"""The TCP floor under every door: listener, connections, input budget, framed reads
and scatter/gather sends. The Thrift door (:mod:`luxun.thrift.server`) and the Kafka
door (:mod:`luxun.kafka.server`) are subclasses of :class:`TcpServer`; both speak
frames of an int32 size and that many bytes, and both get their listener, connection
threads, frame-size refusal, input budget and sends from here (and the Thrift door its
frames over 1 MiB, :class:`BigFrame`; the Kafka door reads those into the heap, budgeted
step by step: see ``KafkaServer._read_large_frame`` for the measurement).

One thread per connection: a slow or long-polling client is a blocked thread, not a
busy one (perf/bench_server_models.py measured the models).

Bounded input: a connection's receive buffer starts at 4 KiB and grows as bytes
arrive (doubling, up to the frame being received), never to the size a header
announces. Every byte of buffer beyond the first 4 KiB is taken from one broker-wide
:class:`InputBudget` (default 256 MiB). A connection whose frame needs more room than
the budget has left stops reading (TCP pushes back on its client) until other
connections give memory back; if none comes back within ``budget_wait_s`` (10 s), it
is closed with one warning line, so stalled half-sent frames holding the budget cannot
hang every other client for ever. A frame over 1 MiB (a big item) is received into its
own anonymous mapping instead (:class:`BigFrame`): the kernel backs only the pages
written, so memory still follows the bytes, and the mapping is unmapped once the frame
is handled. Grown in glibc's heap (whose arenas the broker lets keep 16 MiB each, see
``tune_allocator``), such buffers left the heap fragmented: 150 connections sending
2 MiB frames took the broker's peak RSS up to 640 MiB over a 256 MiB budget.

Out of file descriptors (``accept`` failing with EMFILE, ENFILE, ENOBUFS or ENOMEM):
one descriptor is kept in reserve; it is closed to accept the pending connection and
close it at once (its client sees a closed connection instead of hanging), then opened
again. When that is not possible the accept loop sleeps, 10 ms doubling up to 1 s.
Repeated error lines go through :class:`~luxun.logs.RateLimitedLog`.

Order across connections (a server with ``tracks_input``, the Thrift door): each
connection's :class:`ConnInput` says whether it holds input it has not handled, and the
server keeps its sockets in one epoll set, so :meth:`TcpServer.await_earlier_input` can
wait until what other connections had received is handled (Java Luxun serves every
connection from one thread, in order).

Sending: :func:`send_parts` sends one reply made of several buffers with
scatter/gather writes (``sendmsg``), at most ``IOV_MAX`` buffers per call (the kernel
refuses more with EMSGSIZE: a Kafka Fetch of 600 partitions has over 1,200), finishing
what a call took only in part. A send that fails is logged (the peer, the error, the
reply's size) before the connection is closed.

Thread-safety: ``start``/``stop`` from the main thread; connections run in their own.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import errno
import importlib
import itertools
import logging
import mmap
import os
import resource
import select
import socket
import threading
import time
from typing import Any

from .logs import RateLimitedLog
from .metrics import Metrics

#: luxun._netloop (luxun/_netloop.c), the compiled parts of a connection's loop; None where
#: it was not built (no C compiler at install): every loop is then Python.
NETLOOP: Any = None
with contextlib.suppress(ImportError):  # by name: import-linter sees no .py for it (it would take the package)
    NETLOOP = importlib.import_module("luxun._netloop")

__all__ = [
    "DEFAULT_BUDGET_WAIT_S",
    "DEFAULT_MAX_BUFFERED_BYTES",
    "INITIAL_BUFFER",
    "IOV_MAX",
    "KEEP_BUFFER",
    "NETLOOP",
    "READ_BUFFER",
    "RECEIVING",
    "BigFrame",
    "ConnInput",
    "InputBudget",
    "OutputBudget",
    "TcpServer",
    "send_frame",
    "send_parts",
]

log = logging.getLogger(__name__)
#: Lines a client or a bad environment can repeat, keyed by kind (never by peer).
_rate_limited = RateLimitedLog(log)

#: Bytes of receive buffer all connections may hold together beyond their first
#: INITIAL_BUFFER each (raised to twice the largest frame when that is bigger).
DEFAULT_MAX_BUFFERED_BYTES = 256 << 20
#: How long a connection waits for input budget before it is closed.
DEFAULT_BUDGET_WAIT_S = 10.0
INITIAL_BUFFER = 4 * 1024
# A connection whose buffer fills (a stream of asyncProduce) reads this much at a time:
# more calls per recv, bigger appends. 64 KiB -> 1 MiB, perf/bench_broker.py
# asyncProduce of 10 KB (3 runs each): 4 clients 20.5-21.6 k -> 34.3-35.7 k items/s,
# broker CPU per item 47-49 -> 28-29 us; 1 client 42-47 -> 36 us per item.
READ_BUFFER = 1 << 20
# A connection's buffer grows to this at most and is kept between frames (an empty one
# shrinks to INITIAL_BUFFER while the budget is more than half taken or someone waits
# for it); a bigger frame is received into a mapping of its own (BigFrame).
KEEP_BUFFER = 1 << 20
# accept() errors that mean "out of descriptors or memory": shed, back off.
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_BACKOFF_MIN_S = 0.01
_ACCEPT_BACKOFF_MAX_S = 1.0
# What a reserve descriptor made from a refused connection's points to (stderr: always
# open in a broker; if not, the reserve is opened anew).
_RESERVE_SOURCE_FD = 2
_THREAD_STACK_BYTES = 512 * 1024


class _Receiving:
    """The connection thread (of any door of this process) that received bytes last, and
    since when it has been the only one to: busy polling's sign that nobody else needs the
    interpreter. Written without a lock by every connection after each ``recv`` (a hint:
    a stale value only makes one poll longer or shorter)."""

    __slots__ = ("ident", "since")

    def __init__(self) -> None:
        self.ident = 0
        self.since = 0.0

    def alone(self, me: int, seconds: float) -> bool:
        """Thread ``me`` has been the only one receiving for more than ``seconds``."""
        return self.ident == me and time.monotonic() - self.since > seconds

    def note(self, me: int) -> None:
        # luxun/_netloop.c's receiving_note is its twin: keep them in step.
        if self.ident != me:
            self.ident = me
            self.since = time.monotonic()
            if NETLOOP is not None:  # the compiled loop's busy polls read it there
                NETLOOP.note(me)


#: Process-wide: the Thrift and the Kafka door share one interpreter.
RECEIVING = _Receiving()


class ConnInput:
    """Where one connection's received input stands, for :meth:`TcpServer.await_earlier_input`
    (on a server with ``tracks_input``). Written only by the connection's own thread.

    ``phase`` is odd while the thread holds bytes it took from the kernel and has not
    processed yet (it is then in the server's ``_busy``), even while it holds none (it
    waits for more, or handles a call that waits, such as a consume). The thread goes
    odd *before* taking bytes from the kernel (:meth:`hold`, then ``recv``) and waits
    for bytes with ``poll``, which leaves them in the kernel: so at every moment the
    connection's unprocessed input is in the kernel's queue (which the server's epoll
    set sees) or the connection is odd, even while its thread waits for the interpreter
    after a ``recv`` returned.
    """

    __slots__ = ("busy", "closed", "fd", "ident", "phase", "poller")

    def __init__(self, sock: socket.socket | None, busy: dict[int, ConnInput]) -> None:
        """``sock`` None: a connection nobody looks at (:meth:`TcpServer.input_of`)."""
        self.fd = -1 if sock is None else sock.fileno()
        self.ident = 0  # the connection's thread, once it runs
        self.phase = 0
        self.closed = False
        self.busy = busy
        self.poller: Any = None
        if sock is not None:
            self.poller = select.poll()
            self.poller.register(sock, select.POLLIN)

    def hold(self) -> None:
        """About to take bytes from the kernel (or to handle more of those taken). (The
        shared loop of luxun/_netloop.c has its C twin, conn_hold, and idle's, conn_idle.)"""
        if not self.phase & 1:
            self.phase += 1
            self.busy[self.ident] = self

    def idle(self) -> None:
        """Every complete call taken from the kernel is handled (or a waiting call starts)."""
        if self.phase & 1:
            self.busy.pop(self.ident, None)
            self.phase += 1

    def wait_readable(self) -> None:
        """Block until the socket has bytes (or is closed): they stay in the kernel."""
        if self.poller is not None:
            self.poller.poll()


class InputBudget:
    """Bytes of receive buffer the connections hold together (beyond their first
    ``INITIAL_BUFFER`` each), at most ``limit``. Waiters are served first come, first
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


class OutputBudget:
    """Bytes of replies read from storage and not sent yet, all connections of a door
    together: at most ``limit``, but for the one batch a Kafka Fetch answer may hold past
    what it was granted (KIP-74), so clients that ask and never read hold at most that
    together. A reply is granted at most half of what is free (with the budget at least
    twice fetch.max.bytes, a lone consumer gets all it asks), and at least 1 byte, which
    lets it hold its first batch: however many connections hold answers their clients do
    not read, the next one still progresses, and all of them hold at most ``limit`` plus
    a batch each. ``used`` is published as the ``output_buffer_bytes`` gauge.

    Thread-safety: every method may be called from any thread.
    """

    def __init__(self, limit: int, metrics: Metrics) -> None:
        self.limit = limit
        self.used = 0
        self._metrics = metrics
        self._lock = threading.Lock()

    def grant(self, want: int) -> int:
        """Take up to ``want`` bytes: half of what is free now, at least 1 (see above)."""
        with self._lock:
            n = min(want, max(self.limit - self.used, 0) // 2)
            if n < 1 and want > 0:
                n = 1
            self.used += n
            self._metrics.output_buffer_bytes = self.used
        if n < want:
            self._metrics.output_buffer_short += 1
        return n

    def settle(self, granted: int, used: int) -> None:
        """A reply granted ``granted`` bytes holds ``used``: the rest given back (or the
        one batch over the grant taken)."""
        if used != granted:
            with self._lock:
                self.used += used - granted
                self._metrics.output_buffer_bytes = self.used

    def give(self, n: int) -> None:
        """Give back ``n`` bytes held (the reply was sent, or dropped)."""
        if n > 0:
            with self._lock:
                self.used -= n
                self._metrics.output_buffer_bytes = self.used


class BigFrame:
    """A connection's frame over KEEP_BUFFER while it is received and handled: its own
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
    """What every luxun door has: a listener on ``host:port`` (``port=0`` picks a free
    one), one thread per connection, the broker-wide input budget and the accept loop
    that survives running out of descriptors. A subclass implements :meth:`_read_frames`
    (read and answer one connection's requests until it closes) and passes these
    keyword arguments on (``**options``).

    Args:
        max_frame_bytes: largest frame accepted; bigger ones close the connection.
        max_connections: connections beyond this are closed at once (and counted).
        metrics: where connection counts, refusals and the input budget go.
        max_buffered_bytes: the :class:`InputBudget` of all connections' receive
            buffers (default ``DEFAULT_MAX_BUFFERED_BYTES``, at least twice
            ``max_frame_bytes``).
        budget_wait_s: how long a connection waits for input budget before it is closed.
        name: the prefix of the server's thread names.
    """

    #: The setting that makes ``max_frame_bytes``, named when a frame is refused.
    frame_limit_setting = "the frame limit"
    #: Whether connections keep a :class:`ConnInput` (the subclass's reads then follow its
    #: rules), so that :meth:`await_earlier_input` can tell what is pending.
    tracks_input = False

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_frame_bytes: int,
        max_connections: int = 10_000,
        metrics: Metrics | None = None,
        max_buffered_bytes: int | None = None,
        budget_wait_s: float = DEFAULT_BUDGET_WAIT_S,
        name: str = "luxun",
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        self.metrics = metrics or Metrics()
        if max_buffered_bytes is None:
            max_buffered_bytes = max(DEFAULT_MAX_BUFFERED_BYTES, 2 * self.max_frame_bytes)
        self._budget = InputBudget(max_buffered_bytes, self.metrics)
        self.budget_wait_s = budget_wait_s
        self._name = name
        self._stopping = threading.Event()
        self._conns: dict[int, tuple[socket.socket, threading.Thread]] = {}
        #: Threads holding received bytes they have not processed yet, and where each
        #: connection's input stands (see ConnInput; only with ``tracks_input``).
        self._busy: dict[int, ConnInput] = {}
        self._inputs: dict[int, ConnInput] = {}
        self._epoll = select.epoll() if self.tracks_input else None
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
        if self._epoll is not None:
            self._epoll.close()  # a connection still running finds it closed: nothing waits for it

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
        if self._epoll is not None:
            self._inputs[sock.fileno()] = ConnInput(sock, self._busy)
            self._epoll.register(sock.fileno(), select.EPOLLIN)
        self.metrics.connections_total += 1
        self.metrics.connections_open += 1
        try:
            thread.start()
        except RuntimeError as exc:  # can't start new thread: out of memory or a thread limit
            with self._conns_lock:
                self._conns.pop(sock.fileno(), None)
            self._forget_input(sock.fileno())
            self.metrics.connections_open -= 1
            self.metrics.connections_refused += 1
            _rate_limited.error(
                "thread-start", "closing connection from %s: cannot start a thread for it (%s)", peer, exc
            )
            sock.close()

    # -- one connection ---------------------------------------------------------------
    def _serve(self, sock: socket.socket, peer: Any) -> None:
        key = sock.fileno()
        conn = self._inputs.get(key)
        if conn is not None:
            conn.ident = threading.get_ident()
            conn.hold()  # until it has handled what it has (nothing yet) and waits
        try:
            self._read_frames(sock, peer)
        except (ConnectionError, TimeoutError):
            pass
        except OSError as exc:
            log.debug("connection %s: %s", peer, exc)
        except Exception:
            _rate_limited.exception("connection-failed", "connection from %s failed", peer)
        finally:
            self._busy.pop(threading.get_ident(), None)
            self._forget_input(key)
            with self._conns_lock:
                self._conns.pop(key, None)
            self.metrics.connections_open -= 1
            with contextlib.suppress(OSError):
                sock.close()

    def _read_frames(self, sock: socket.socket, peer: Any) -> None:
        raise NotImplementedError

    def input_of(self, sock: Any) -> ConnInput:
        """The :class:`ConnInput` of a connection this server accepted; for anything
        else (a stream handed to ``_read_frames`` directly) one that nobody looks at."""
        conn = self._inputs.get(sock.fileno()) if isinstance(sock, socket.socket) else None
        return conn if conn is not None else ConnInput(None, {})

    def _forget_input(self, fd: int) -> None:
        """A connection closes: nobody waits for its input any more."""
        conn = self._inputs.pop(fd, None)
        if conn is not None:
            conn.closed = True
            if self._epoll is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(fd)

    def _refuse_frame_size(self, peer: Any, size: int) -> None:
        """Count and log (rate-limited) a frame whose size is <= 0 or over
        ``max_frame_bytes``; the caller closes the connection."""
        self.metrics.bad_frames += 1
        _rate_limited.warning(
            f"frame-size-{self._name}",
            "closing connection from %s: frame of %d bytes is outside 1..%d (%s)",
            peer,
            size,
            self.max_frame_bytes,
            self.frame_limit_setting,
        )

    def await_earlier_input(self, timeout_s: float) -> bool:
        """Wait until the input that other connections held when this was called (complete
        calls in their buffers, bytes in their kernel queues) has been handled, at most
        ``timeout_s``; True if there was any (the caller then looks again), False at once
        when there was none. Java Luxun handles every connection's calls in one thread, in
        the order they came; this gives a call on one connection the same view.

        Cost when nothing is pending: a ``len``, one ``epoll_wait`` that returns at once
        (about 0.3 us), and a dict scan of the connections holding input (none). Needs
        ``tracks_input`` (else False). Waits by sleeping 0.2 ms at a time: it never holds
        the interpreter from the connections it waits for.
        """
        epoll = self._epoll
        if epoll is None or len(self._inputs) <= 1:
            return False
        me = threading.get_ident()
        inputs = self._inputs
        try:
            ready = {fd for fd, _ in epoll.poll(0)}
        except ValueError:  # closed: the server stopped
            return False
        # Per connection: its phase now, and a phase by which what it holds now is handled
        # for sure. A connection holding input (odd) may have more on its way into its
        # kernel queue (bytes that came while its thread was in recv wait in the socket's
        # backlog, out of epoll's sight until that recv ends): it is done once it has
        # handled what it holds and finds its queue empty, or has handled one more read.
        waits: dict[ConnInput, tuple[int, int]] = {}
        for ident, conn in list(self._busy.items()):
            if ident != me:
                waits[conn] = (conn.phase, conn.phase + 3)
        for fd in ready:
            other = inputs.get(fd)
            if other is not None and other.ident != me and other not in waits:
                phase = other.phase  # even: it waits, and its bytes are in the kernel
                waits[other] = (phase, phase + (3 if phase & 1 else 2))
        if not waits:
            return False
        deadline = time.monotonic() + timeout_s
        while waits and time.monotonic() < deadline:
            time.sleep(0.0002)
            try:
                ready = {fd for fd, _ in epoll.poll(0)}
            except ValueError:
                return True
            for conn, (before, target) in list(waits.items()):
                phase = conn.phase
                # Done: closed, past the target, or moved on and now holding nothing at all.
                if conn.closed or phase >= target or (phase > before and not phase & 1 and conn.fd not in ready):
                    del waits[conn]
        return True

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

    def _read_big_frame(self, sock: socket.socket, peer: Any, head: memoryview, size: int, big: BigFrame) -> bool:
        """Receive a frame of ``size`` bytes over KEEP_BUFFER, whose first bytes are
        ``head``, into ``big``'s own mapping; False if the peer closed, the server stops
        or no budget came in time (the connection is then closed). Budget is taken as
        bytes arrive (doubling, as for the buffer); the kernel backs only pages written."""
        total = 4 + size
        conn = self.input_of(sock)
        big.mm = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        have = 0
        with memoryview(big.mm) as view:
            while have < total:
                if have == big.taken:  # the budgeted part is full: double it
                    more = min(max(2 * have, 2 * len(head), READ_BUFFER), total) - have
                    if not self._take_input_budget(peer, size, more):
                        return False
                    big.taken += more
                    if not have:
                        view[: len(head)] = head
                        have = len(head)
                        continue
                if self._stopping.is_set():
                    return False
                conn.idle()  # a partial frame is no input yet (see ConnInput)
                conn.wait_readable()
                conn.hold()
                n = sock.recv_into(view[have : big.taken])
                RECEIVING.note(threading.get_ident())
                if n == 0:
                    return False
                have += n
        return True


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


def _iov_max() -> int:
    try:
        n = os.sysconf("SC_IOV_MAX")
    except (ValueError, OSError):
        n = -1
    return n if n > 0 else 1024


#: Buffers one ``sendmsg`` may take (Linux: 1024).
IOV_MAX = _iov_max()


def _nbytes(part: Any) -> int:
    kind = type(part)
    return len(part) if kind is bytes or kind is bytearray else int(part.nbytes)


def send_parts(sock: socket.socket, parts: list[Any], *, header: bool = True) -> int:
    """Send one reply made of buffers (bytes, bytearrays, memoryviews, C-contiguous
    arrays) with scatter/gather writes: no joined copy of a big reply. ``header``:
    prefix the frame's int32 size (a Kafka response carries its own). Returns the size
    of ``parts``.

    At most :data:`IOV_MAX` buffers go to one ``sendmsg``; a call the kernel took in
    part is finished from where it stopped. A send that fails for another reason than a
    closed connection is logged (rate-limited: the peer, the error, the size and the
    buffer count) and raised: the caller closes the connection.
    """
    ends = list(itertools.accumulate([_nbytes(p) for p in parts]))
    size = ends[-1] if ends else 0
    if header:
        parts = [size.to_bytes(4, "big"), *parts]
        ends = [4, *[e + 4 for e in ends]]
    total = ends[-1] if ends else 0
    try:
        if total < 65536:
            sock.sendall(b"".join(parts))
            return size
        done = 0
        while done < total:
            i = bisect.bisect_right(ends, done)  # the first buffer not sent whole
            batch = parts[i : i + IOV_MAX]
            off = done - (ends[i - 1] if i else 0)
            if off:
                batch[0] = memoryview(batch[0]).cast("B")[off:]
            done += sock.sendmsg(batch)  # a blocking socket takes it all, unless a signal came
    except OSError as exc:
        _log_send_failure(sock, exc, total, len(parts))
        raise
    return size


def send_frame(sock: socket.socket, out: bytes) -> None:
    """Send one reply frame: ``out`` after its int32 size (see :func:`send_parts`)."""
    if len(out) >= 65536:
        send_parts(sock, [out])
        return
    try:
        sock.sendall(len(out).to_bytes(4, "big") + out)
    except OSError as exc:
        _log_send_failure(sock, exc, 4 + len(out), 1)
        raise


def _log_send_failure(sock: socket.socket, exc: OSError, size: int, buffers: int) -> None:
    """One rate-limited line for a send that failed other than by the peer going away."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return
    try:
        peer = str(sock.getpeername())
    except OSError:
        peer = "a closed connection"
    _rate_limited.warning(
        "send-failed", "sending a reply of %d bytes in %d buffers to %s failed: %s", size, buffers, peer, exc
    )
