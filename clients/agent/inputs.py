"""The agent's inputs: the threads that read Dory's clients (UNIX datagram and stream
sockets, TCP), parse and check their messages (:mod:`.wire`), charge them to the pool and
hand them to the router in chunks (:class:`Intake`). A mixin of
:class:`~clients.agent.core.Agent`, with the constants both share.

Thread-safety: one :class:`Intake` per input thread; the hand-over queue under the
agent's ``_transit_lock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import socket
import struct
import termios
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, cast

from . import discardlog as D
from . import stats as S
from .config import AgentConfig
from .discardlog import DiscardLog
from .mmsg import batch_receiver
from .wire import Fields, Malformed, Run, UnsupportedApiKey, UnsupportedVersion, parse_checked, parse_runs

if TYPE_CHECKING:
    from .core import Agent, Pool

#: Pool bytes a message takes beyond its own size (its Python objects, roughly).
MSG_OVERHEAD_BYTES = 192
#: Bytes of a pack around its messages (22 + 1 for the pack, a list header, 4 per message).
PACK_OVERHEAD_BYTES = 64
DGRAM, STREAM, TCP = 0, 1, 2
TRANSPORTS = ("unix_dgram", "unix_stream", "tcp")
_STREAM_PREFIX = {STREAM: "UnixStreamInput", TCP: "TcpInput"}
#: Pool bytes an input thread takes at a time (what it does not use goes back when idle).
_CREDIT_BYTES = 64 * 1024
#: Messages an input thread hands to the router at a time, at most.
_HANDOVER_MESSAGES = 512
#: The datagram input hands its messages to the router this long after it first found its
#: socket empty with messages read, at the latest.
_DGRAM_HANDOVER_S = 0.002
#: The datagram input parses what it read in one go once this many bytes came (or its
#: socket was empty).
_DGRAM_GATHER_BYTES = 64 * 1024
#: Stream frames parsed per call at most: each is a copy until parsed, not charged to the
#: pool (a whole 256 KiB read of them alive at once raised the agent's peak RSS 1-2 MiB).
_STREAM_FRAMES_PER_CALL = 32
#: Pool bytes of the messages queued for the router at most (and 1/8 of the pool).
_TRANSIT_MAX_BYTES = 4 * 1024 * 1024


class Intake:
    """One input thread's side of the pool and the router queue: it takes pool bytes in
    blocks of up to ``_CREDIT_BYTES`` (so the pool lock is taken once per block, not per
    message) and hands messages to the router in chunks."""

    __slots__ = ("agent", "credit", "fast_max", "pending", "pending_charge", "pending_count", "transport")

    def __init__(self, agent: Agent, transport: int) -> None:
        self.agent = agent
        self.transport = transport
        self.credit = 0
        self.pending: list[Fields | Run] = []
        self.pending_charge = 0
        self.pending_count = 0
        #: a message of at most this many bytes fits a pack (longer ones go one by one,
        #: to be discarded as too large by the router)
        self.fast_max = agent.config.message_max_bytes - PACK_OVERHEAD_BYTES

    def accept_all(self, messages: Sequence[bytes]) -> None:
        """Take each message (a datagram or a stream frame): parsed (the common case in
        runs, without a Python call per message, see :func:`~clients.agent.wire.parse_runs`),
        charged to the pool and queued for the router, or counted as discarded."""
        for item in parse_runs(messages, self.fast_max):
            if isinstance(item, Run):
                charge = item.size + item.count * MSG_OVERHEAD_BYTES
                if self._take(charge):
                    self._queue(item, charge, item.count)
                    continue
                fields = item.fields()  # the pool is short: message by message
            else:
                f = self._parse_or_discard(item)
                if f is None:
                    continue
                fields = [f]
            for f in fields:
                charge = charge_of(f)
                if self._take(charge):
                    self._queue(f, charge, 1)
                    continue
                self.agent.stats.discard(S.NO_MEMORY, f[0].decode(errors="replace"), ts_min=f[2], ts_max=f[2])
                if self.agent.discard_log is not None:
                    self.agent.discard_log.write(D.NO_MEM, f[0], f[2], f[3], f[4])

    def _take(self, charge: int) -> bool:
        """Take ``charge`` pool bytes from the credit (topped up from the pool as needed);
        False, nothing taken, when the pool cannot give them."""
        if charge > self.credit:
            self.credit += self.agent.pool.reserve(_CREDIT_BYTES, charge - self.credit)
            if charge > self.credit:
                return False
        self.credit -= charge
        return True

    def _queue(self, item: Fields | Run, charge: int, count: int) -> None:
        self.pending_charge += charge
        self.pending_count += count
        self.pending.append(item)
        if self.pending_count >= _HANDOVER_MESSAGES:
            self.flush(idle=False)

    def _parse_or_discard(self, data: bytes) -> Fields | None:
        """A message off parse_runs's fast path: its fields (a valid message with a Key),
        or None when it is counted as a discard (malformed, unsupported API key or
        version: Dory's checks, in its order); the fast path is not tried again."""
        try:
            return parse_checked(data)
        except Malformed:
            self.agent.stats.discard(S.MALFORMED, None, sample=data)
            if self.agent.discard_log is not None:
                self.agent.discard_log.write(D.MALFORMED, b"", None, b"", data)
        except UnsupportedApiKey as exc:
            self.agent.stats.discard(S.UNSUPPORTED_API_KEY, None, sample=data)
            if self.agent.discard_log is not None:
                self.agent.discard_log.write(f"API_KEY({exc.api_key})", b"", None, b"", data)
        except UnsupportedVersion as exc:
            self.agent.stats.discard(S.UNSUPPORTED_VERSION, None, sample=data, version=exc.version)
            if self.agent.discard_log is not None:
                self.agent.discard_log.write(f"VERSION({exc.version})", b"", None, b"", data)
        return None

    def flush(self, *, idle: bool) -> None:
        """Hand pending messages to the router; ``idle``: give back unused pool credit."""
        if self.pending:
            self.agent._push(self.transport, self.pending, self.pending_charge, self.pending_count)
            self.pending = []
            self.pending_charge = 0
            self.pending_count = 0
        if idle and self.credit:
            self.agent.pool.free(self.credit)
            self.credit = 0


def bytes_queued(conn: socket.socket) -> int:
    """Bytes waiting in a stream socket's receive queue (SIOCINQ), 0 when unknown."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0])
    except (OSError, ValueError):
        return 0


def messages_of(chunk: list[Fields | Run]) -> Iterator[Fields]:
    for f in chunk:
        if isinstance(f, Run):
            yield from f.fields()
        else:
            yield f


def charge_of(f: Fields) -> int:
    """Pool bytes of a message: its Dory size plus MSG_OVERHEAD_BYTES."""
    return (28 if f[1] is None else 32) + len(f[0]) + len(f[3]) + len(f[4]) + MSG_OVERHEAD_BYTES


class AgentInputs:
    """The input side of :class:`~clients.agent.core.Agent` (which sets these attributes)."""

    config: AgentConfig
    stats: S.Stats
    pool: Pool
    discard_log: DiscardLog | None
    _inq: deque[tuple[int, list[Fields | Run], int, int]]
    _transit: int
    _transit_lock: threading.Lock
    _wake_router: threading.Event
    _wake_r: int
    _stopping: bool
    _abandon: bool
    _conns: dict[socket.socket, threading.Thread]
    _conns_lock: threading.Lock
    _conns_shut: bool
    _input_deadline: float

    def _intake(self, transport: int) -> Intake:
        return Intake(cast("Agent", self), transport)  # an AgentInputs is always an Agent

    def _push(self, transport: int, chunk: list[Fields | Run], charge: int, count: int) -> None:
        """Queue a chunk for the router; while the messages waiting for it hold more than
        an eighth of the pool or _TRANSIT_MAX_BYTES, wait (the router is behind: reading on
        would only pile up per-message objects, whose memory Python's allocator keeps after
        they are freed; they take about twice their charge in RSS)."""
        with self._transit_lock:
            self._transit += charge
            self._inq.append((transport, chunk, charge, count))
        if not self._wake_router.is_set():
            self._wake_router.set()
        limit = min(self.pool.capacity // 8, _TRANSIT_MAX_BYTES)
        while self._transit > limit and not self._stopping and not self._abandon:
            time.sleep(0.0005)

    def _wait_readable(self, s: socket.socket, timeout_s: float | None = None) -> bool | None:
        """Block until ``s`` is readable (True), ``timeout_s`` passed (None) or the agent
        stops (False)."""
        try:
            ready, _, _ = select.select([s.fileno(), self._wake_r], [], [], timeout_s)
        except (OSError, ValueError):
            return False
        if self._stopping:
            return False
        return True if ready else None

    def _read_datagrams(self, s: socket.socket) -> None:
        size = self.config.max_datagram_bytes
        intake = self._intake(DGRAM)
        accept_all = intake.accept_all
        rx = batch_receiver(s, size) if os.environ.get("LUXUN_AGENT_RECVMMSG", "1") != "0" else None
        receive = rx.receive if rx is not None else (lambda: [s.recv(size)])
        handover_at = 0.0  # when the messages read so far go to the router at the latest
        # Datagrams read while more keep coming are parsed together (longer runs, fewer
        # calls per message), up to _DGRAM_GATHER_BYTES received.
        got: list[bytes] = []
        got_bytes = 0
        batch: list[bytes] | None
        try:
            while not self._stopping:
                try:
                    batch = receive()
                except BlockingIOError:
                    batch = None  # the socket is empty: parse what was read, else wait
                except OSError:
                    break
                if batch:
                    got += batch
                    got_bytes += sum(map(len, batch))
                    if got_bytes < _DGRAM_GATHER_BYTES:
                        continue
                if got:
                    accept_all(got)
                    got = []
                    got_bytes = 0
                    continue  # read on: more may have come meanwhile
                # Senders are held after net.unix.max_dgram_qlen datagrams, so the queue
                # is empty every few messages: handing each few to the router would wake
                # it (a context switch and a GIL hand-over) thousands of times a second.
                # Messages wait here at most _DGRAM_HANDOVER_S (or until 512 came).
                ready = None
                if intake.pending:
                    now = time.monotonic()
                    if not handover_at:
                        handover_at = now + _DGRAM_HANDOVER_S
                    if now < handover_at:
                        ready = self._wait_readable(s, handover_at - now)
                if ready is None:
                    intake.flush(idle=True)  # hand over what was read before sleeping
                    handover_at = 0.0
                    ready = self._wait_readable(s)
                if not ready:
                    break
            if got:
                accept_all(got)
            if self._stopping:
                self._drain_datagrams(s, receive, accept_all)
        finally:
            intake.flush(idle=True)

    def _drain_datagrams(self, s: socket.socket, receive: Callable[[], list[bytes]],
                         accept_all: Callable[[list[bytes]], None]) -> None:  # fmt: skip
        """At stop: refuse new datagrams (after ``SHUT_RD`` a sender's ``send``/``sendto``
        fails with EPIPE on Linux; one blocked on a full queue gets it when woken), then read
        the ones the kernel queued (net.unix.max_dgram_qlen + 1 at most) like any other."""
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RD)
        while time.monotonic() < self._input_deadline:
            try:
                batch = receive()
            except OSError:  # BlockingIOError: nothing is left
                return
            if not batch:
                return
            accept_all(batch)

    def _accept_loop(self, s: socket.socket, transport: int) -> None:
        s.setblocking(False)
        while not self._stopping:
            try:
                conn, _ = s.accept()
            except BlockingIOError:
                if not self._wait_readable(s):
                    break
                continue
            except OSError:
                break
            self._serve(conn, transport)
        if not self._stopping:
            return
        # At stop: a client whose connect succeeded may have written already; its
        # connection waits in the backlog. A UNIX listener refuses new ones after SHUT_RD
        # (ECONNREFUSED) and still hands out those waiting; on TCP, SHUT_RD would reset
        # them, so they are taken until none is left (one that comes after is reset by the close).
        if transport == STREAM:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RD)
        while time.monotonic() < self._input_deadline:
            try:
                conn, _ = s.accept()
            except OSError:  # BlockingIOError: none is left
                return
            self._serve(conn, transport)

    def _serve(self, conn: socket.socket, transport: int) -> None:
        """Start a reader for a new connection."""
        self.stats.incr(f"{_STREAM_PREFIX[transport]}AcceptConnection")
        t = threading.Thread(target=self._read_stream, args=(conn, transport), daemon=True,
                             name=f"luxun-agent-{TRANSPORTS[transport]}-conn")  # fmt: skip
        with self._conns_lock:  # started under the lock: Agent.stop joins what it finds here
            self._conns[conn] = t
            if self._conns_shut:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RD)
            t.start()

    def _read_stream(self, conn: socket.socket, transport: int) -> None:
        prefix = _STREAM_PREFIX[transport]
        limit = self.config.max_stream_msg_bytes
        rest = b""
        intake = self._intake(transport)
        accept_all = intake.accept_all
        try:
            conn.setblocking(True)
            # Until the end of the stream: at stop, Agent.stop shuts the connection down
            # (SHUT_RD), so what the peer wrote is read and then recv returns b"".
            while True:
                unread = 0
                if self._stopping and time.monotonic() >= self._input_deadline:
                    unread = bytes_queued(conn)  # a TCP peer kept writing: cut here
                    chunk = b""
                else:
                    try:
                        chunk = conn.recv(256 * 1024)
                    except OSError:
                        break
                if not chunk:
                    if rest or unread:
                        self.stats.unclean_disconnect(TRANSPORTS[transport], len(rest) + unread,
                                                      f"{prefix}UncleanDisconnect")  # fmt: skip
                        if self.discard_log is not None:
                            info = "UNCLEAN_T" if transport == TCP else "UNCLEAN_U"
                            self.discard_log.write(info, b"", None, b"", rest)
                    break
                data = rest + chunk if rest else chunk
                n = len(data)
                pos = 0
                frames: list[bytes] = []
                size = 4
                while n - pos >= 4:
                    size = int.from_bytes(data[pos : pos + 4], "big", signed=True)
                    if size < 4 or size - 4 > limit or n - pos < size:
                        break
                    frames.append(data[pos : pos + size])
                    pos += size
                    if len(frames) >= _STREAM_FRAMES_PER_CALL:
                        accept_all(frames)
                        frames.clear()
                accept_all(frames)  # the frames before a bad Size count, as they come first
                if size < 4:
                    self.stats.incr(f"{prefix}InvalidSizeField")
                    self.stats.discard(S.MALFORMED, None, sample=data[pos : pos + 4])
                    if self.discard_log is not None:
                        self.discard_log.write(D.MALFORMED, b"", None, b"", data[pos:])
                    return
                if size - 4 > limit:
                    self.stats.incr(f"{prefix}MsgBodyTooLarge")
                    self.stats.discard(S.MALFORMED, None, sample=data[pos : pos + 64])
                    if self.discard_log is not None:
                        self.discard_log.write(D.MALFORMED, b"", None, b"", data[pos:])
                    return
                rest = data[pos:]
                intake.flush(idle=False)
        finally:
            intake.flush(idle=True)
            with self._conns_lock:
                self._conns.pop(conn, None)
            conn.close()
