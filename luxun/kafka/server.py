"""The Kafka port's server: Kafka's framing over :class:`~luxun.net.TcpServer`.

A Kafka request is a frame: an int32 size, then the request header and body. As in
Kafka, each connection's requests are handled one at a time, in order, and answered
in that order (a Fetch waiting for data holds its connection, as in Kafka: clients
use several connections for that reason). A frame whose size is <= 0 or above
``max_frame_bytes`` (``socket.request.max.bytes`` in Kafka), or that does not parse,
closes only that connection, with one rate-limited log line.

Memory is bounded as on the Thrift port, by the same budget (:mod:`luxun.net`): a
frame larger than the read-ahead buffer is read as its bytes arrive, 1 MiB at a time,
each step's room taken from the broker-wide :class:`~luxun.net.InputBudget` first (a
client announcing 2 GiB and sending nothing holds nothing); a connection that cannot
get budget within ``budget_wait_s`` is closed. Responses go out with
:func:`~luxun.net.send_parts` (a Fetch of many partitions is many buffers).

With SASL on (:mod:`luxun.kafka.sasl`), a connection starts in
:meth:`KafkaServer._authenticate`: frames are read one at a time, at most
``SASL_MAX_RECEIVE_BYTES`` each (Kafka's ``sasl.server.max.receive.size``), for at most
``AUTH_TIMEOUT_S``, and answered by the handler's ``handle_auth_frame`` (ApiVersions,
SaslHandshake, SaslAuthenticate or the legacy bare tokens); anything else is answered
as Kafka answers it, or not, and the connection closed with one log line. Once the
session has a user, the connection goes on in the loop above, unchanged: the only
cost SASL adds to a request is the session passed to the handler.

Thread-safety: ``start``/``stop`` from the main thread; connections run in their own.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from typing import Any, Final, Protocol

from ..logs import RateLimitedLog
from ..net import READ_BUFFER, RECEIVING, TcpServer, send_parts
from .sasl import SaslSession

__all__ = ["FrameHandler", "KafkaServer"]

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log)

_I32 = struct.Struct(">i")
# Bytes read ahead per recv while the input budget has room (it holds all but
# _UNBUDGETED of them, like the Thrift port's buffers); frames larger than that are
# read on their own (KafkaServer._read_large_frame).
_READ_AHEAD = 64 * 1024
_UNBUDGETED = 4096
#: A Fetch answer the client takes no bytes of for this long closes its connection (the
#: output budget it holds goes back; Kafka clients time a request out after 30 s).
FETCH_SEND_TIMEOUT_S = 30.0
# Produce responses held back at most, while more produce requests are buffered.
_PENDING_BYTES = 256 * 1024
# Produce requests already buffered handled as one run at most (FrameHandler.handle_frames).
_RUN_FRAMES = 1024
#: Largest frame before authentication (Kafka's sasl.server.max.receive.size default).
SASL_MAX_RECEIVE_BYTES = 512 * 1024
#: A connection not authenticated this long after it opened is closed.
AUTH_TIMEOUT_S = 30.0
#: Frames a connection may send before it is authenticated (ApiVersions, SaslHandshake
#: and a SCRAM exchange take 4; clients retry ApiVersions at lower versions).
MAX_AUTH_FRAMES = 16


class FrameHandler(Protocol):
    def handle_frame(self, frame: bytes, peer: Any, session: SaslSession | None = None) -> bytes | list[Any] | None:
        """Answer one request frame (size prefix excluded) of a connection whose SASL
        ``session`` (None: SASL off) is authenticated: the response frame (size
        included), as bytes or as buffers to send in order; None: no response (acks=0).

        Raises:
            ValueError: the request cannot be parsed; the connection is closed (after
                sending the ``response`` of a :class:`~luxun.kafka.protocol.CloseConnection`).
        """

    def handle_frames(
        self, frames: list[bytes], peer: Any, session: SaslSession | None = None
    ) -> tuple[list[bytes | list[Any] | None], ValueError | None]:
        """Answer several Produce request frames of a connection that arrived together,
        in order, as :meth:`handle_frame` one after the other would (a handler may store
        them together): ``(answers, refusal)``, an answer per frame up to the first one
        refused, and that refusal (the connection then closes), or None."""

    def new_session(self, peer: Any = None) -> SaslSession | None:
        """A new connection's SASL session (one already logged in: an anonymous one, for
        an authorizer with SASL off); None when there is nothing to check."""

    def handle_auth_frame(self, frame: bytes, peer: Any, session: SaslSession) -> bytes:
        """Answer one frame of a connection not authenticated yet (the response frame).

        Raises:
            ValueError: as :meth:`handle_frame`.
        """


class KafkaServer(TcpServer):
    """Serves the Kafka protocol on ``host:port`` through ``handler``."""

    frame_limit_setting = "socket.request.max.bytes"

    def __init__(self, handler: FrameHandler, host: str, port: int, **options: Any) -> None:
        """``options``: :class:`~luxun.net.TcpServer`'s (``max_frame_bytes``, limits, metrics)."""
        self._handler = handler
        super().__init__(host, port, name="luxun-kafka", **options)

    def _read_frames(self, sock: socket.socket, peer: Any) -> None:
        session = self._handler.new_session(peer)
        if session is not None and session.user is None and not self._authenticate(sock, peer, session):
            return
        held = [0]  # input budget held by the read-ahead buffer
        pending: list[Any] = []  # responses not sent yet
        try:
            self._serve_frames(sock, peer, held, pending, session)
        finally:
            self._budget.give(held[0])
            if pending:  # answered before the connection closes (a bad frame came next)
                with contextlib.suppress(OSError):
                    _send(sock, pending)

    def _read_large_frame(
        self, sock: socket.socket, peer: Any, rest: bytes, size: int, held: list[int]
    ) -> bytes | None:
        """The frame of ``size`` bytes whose first bytes (size prefix included) are ``rest``,
        read as its bytes arrive, in steps of at most ``READ_BUFFER`` whose input budget is
        taken before each (``TcpServer._take_input_budget``, as the Thrift door's buffers;
        added to ``held[0]``, given back by the caller once the request is handled); None
        if the peer closed, the server stops or no budget came in time.

        Into the heap, not a mapping of its own as the Thrift door's frames over 1 MiB
        (``TcpServer._read_big_frame``): measured with perf/bench_kafka.py --before, a
        mapping per frame (page faults on every request) cost the broker 1.3-1.8x the CPU
        per record of confluent-kafka's ~1 MB produce requests (1 KB and 100 KB records)."""
        parts = [rest[4:]]
        need = 4 + size - len(rest)
        while need > 0:
            step = min(READ_BUFFER, need)
            if not self._take_input_budget(peer, size, step):
                return None
            held[0] += step
            chunk = sock.recv(step, socket.MSG_WAITALL)
            RECEIVING.note(threading.get_ident())
            if len(chunk) < step:  # the peer closed (or the server is stopping)
                return None
            parts.append(chunk)
            need -= step
        return b"".join(parts)

    def _authenticate(self, sock: socket.socket, peer: Any, session: SaslSession) -> bool:
        """Serve the connection's frames, one at a time, until ``session`` has a user:
        True; False when the connection is to close (the peer closed, a refused login
        or request, a frame over ``SASL_MAX_RECEIVE_BYTES``, ``AUTH_TIMEOUT_S`` or
        ``MAX_AUTH_FRAMES`` passed, the server stopping). Frames are read exactly, never
        ahead, so nothing read here belongs to the loop that follows."""
        old_timeout = sock.gettimeout()
        deadline = time.monotonic() + AUTH_TIMEOUT_S
        limit = min(SASL_MAX_RECEIVE_BYTES, self.max_frame_bytes)
        try:
            for _ in range(MAX_AUTH_FRAMES):
                if session.user is not None:
                    return True
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                head = _recv_exactly(sock, 4)
                if head is None:
                    return False
                (size,) = _I32.unpack(head)
                if size <= 0 or size > limit:
                    self.metrics.bad_frames += 1
                    _rate_limited.warning(
                        "kafka-sasl-frame",
                        "closing Kafka connection from %s: frame of %d bytes before SASL authentication is "
                        "outside 1..%d (a client not speaking SASL, or a request sent before logging in)",
                        peer,
                        size,
                        limit,
                    )
                    return False
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                frame = _recv_exactly(sock, size)
                if frame is None:
                    return False
                try:
                    out = self._handler.handle_auth_frame(frame, peer, session)
                except ValueError as exc:
                    self._close_after(sock, peer, exc)
                    return False
                sock.sendall(out)
            if session.user is not None:
                return True
            reason = f"{MAX_AUTH_FRAMES} frames without completing SASL authentication"
        except TimeoutError:
            reason = f"not authenticated within {AUTH_TIMEOUT_S:g} s"
        finally:
            with contextlib.suppress(OSError):
                sock.settimeout(old_timeout)
        _rate_limited.warning("kafka-sasl-slow", "closing Kafka connection from %s: %s", peer, reason)
        return False

    def _close_after(self, sock: socket.socket, peer: Any, exc: ValueError) -> None:
        """A request the handler refused with ``exc``: its answer (if any) is sent and the
        connection is to close, with one rate-limited log line."""
        response = getattr(exc, "response", None)
        key = getattr(exc, "log_key", None)
        if key is None:
            self.metrics.bad_frames += 1
        _rate_limited.warning(key or "kafka-bad-request", "closing Kafka connection from %s: %s", peer, exc)
        if response:
            with contextlib.suppress(OSError):
                sock.sendall(response)
                _linger(sock)

    def _serve_frames(
        self, sock: socket.socket, peer: Any, held: list[int], pending: list[Any], session: SaslSession | None
    ) -> None:
        """Read frames ahead (up to _READ_AHEAD bytes a recv, that much taken from the
        input budget while a connection is busy; _UNBUDGETED without it), so pipelined
        requests cost one recv between them, not two. Produce responses whose next
        request is already buffered wait in ``pending`` (at most _PENDING_BYTES) and go
        out in one write with the next ones; anything else is answered at once, and
        everything pending is sent before this thread waits in recv or handles a
        request that may wait (Fetch, JoinGroup...)."""
        max_frame = self.max_frame_bytes
        budget = self._budget
        buf, pos = b"", 0
        pending_bytes = 0
        while not self._stopping.is_set():
            avail = len(buf) - pos
            size = _I32.unpack_from(buf, pos)[0] if avail >= 4 else 0
            if avail >= 4 and (size <= 0 or size > max_frame):
                self._refuse_frame_size(peer, size)
                return
            if avail < 4 or avail - 4 < size:  # need more bytes: answer what is pending first
                if pending:
                    _send(sock, pending)
                    pending.clear()
                    pending_bytes = 0
                rest = buf[pos:]
                if not rest and held[0] and budget.tight:  # idle and others need it: give it back
                    budget.give(held[0])
                    held[0] = 0
                if not held[0] and budget.try_take(_READ_AHEAD - _UNBUDGETED):
                    held[0] = _READ_AHEAD - _UNBUDGETED
                cap = _UNBUDGETED + held[0]
                if avail >= 4 and 4 + size > cap:  # larger than the read-ahead: read the rest, budgeted
                    buf, pos = b"", 0
                    frame_budget = [0]
                    try:
                        frame = self._read_large_frame(sock, peer, rest, size, frame_budget)
                        if frame is None or self._handle(sock, peer, frame, None, session) is None:
                            return
                        del frame
                    finally:
                        budget.give(frame_budget[0])
                    continue
                data = sock.recv(cap - len(rest))
                RECEIVING.note(threading.get_ident())  # a Thrift connection stops busy polling
                if not data:
                    return
                buf, pos = rest + data, 0
                continue
            frame = buf[pos + 4 : pos + 4 + size]
            pos += 4 + size
            produce = frame[:2] == b"\0\0"
            frames = [frame]
            while produce and len(frames) < _RUN_FRAMES:  # the produce requests already here: one run
                nxt = len(buf) - pos
                size = _I32.unpack_from(buf, pos)[0] if nxt >= 6 else 0
                if not 0 < size <= max_frame or nxt - 4 < size or buf[pos + 4 : pos + 6] != b"\0\0":
                    break
                frames.append(buf[pos + 4 : pos + 4 + size])
                pos += 4 + size
            if pending and not produce:
                _send(sock, pending)
                pending.clear()
                pending_bytes = 0
            # Another produce request already here: keep this answer to send with the next.
            nxt = len(buf) - pos
            later = (
                produce
                and pending_bytes < _PENDING_BYTES
                and nxt >= 6
                and nxt - 4 >= _I32.unpack_from(buf, pos)[0]
                and buf[pos + 4 : pos + 6] == b"\0\0"
            )
            if len(frames) > 1:
                out = self._handle_run(sock, peer, frames, pending, session)
            else:
                out = self._handle(sock, peer, frame, pending if later or pending else None, session)
            del frame, frames
            if out is None:
                return
            pending_bytes += out
            if not later and pending:
                _send(sock, pending)
                pending.clear()
                pending_bytes = 0

    def _handle_run(
        self, sock: socket.socket, peer: Any, frames: list[bytes], pending: list[Any], session: SaslSession | None
    ) -> int | None:
        """Answer a run of produce frames (``handle_frames``): the responses are appended
        to ``pending``. Returns the bytes appended, or None if the connection must close
        (after the answers to the frames before the refused one are sent)."""
        answers, refused = self._handler.handle_frames(frames, peer, session)
        added = 0
        for out in answers:
            if out is None:
                continue
            if isinstance(out, bytes):
                pending.append(out)
                added += len(out)
            else:
                pending.extend(out)
                added += sum(len(b) for b in out)
        if refused is not None:
            if pending:
                _send(sock, pending)
                pending.clear()
            self._close_after(sock, peer, refused)
            return None
        return added

    def _handle(
        self, sock: socket.socket, peer: Any, frame: bytes, pending: list[Any] | None, session: SaslSession | None
    ) -> int | None:
        """Answer ``frame``: the response is appended to ``pending`` (if given) or sent.
        Returns the bytes appended, or None if the connection must close."""
        try:
            out = self._handler.handle_frame(frame, peer, session)
        except ValueError as exc:
            if pending:  # answers due before this one's
                _send(sock, pending)
                pending.clear()
            self._close_after(sock, peer, exc)
            return None
        if out is None:
            return 0
        if pending is None:
            release = getattr(out, "release", None)  # a Fetch answer: it holds output budget
            if release is None:
                _send(sock, out)
                return 0
            try:  # a client that does not take its answer in time is let go, and its budget with it
                sock.settimeout(FETCH_SEND_TIMEOUT_S)
                _send(sock, out)
                sock.settimeout(None)
            except TimeoutError:
                _rate_limited.warning(
                    "kafka-send-timeout",
                    "closing Kafka connection from %s: it took no bytes of a %d-byte Fetch answer for %g s",
                    peer,
                    sum(map(len, out)) if isinstance(out, list) else len(out),
                    FETCH_SEND_TIMEOUT_S,
                )
                return None
            finally:
                release()
            return 0
        if isinstance(out, bytes):
            pending.append(out)
            return len(out)
        pending.extend(out)
        return sum(len(b) for b in out)


#: After a refusal's answer, how long the connection waits for its peer to close.
_LINGER_S: Final = 1.0


def _linger(sock: socket.socket) -> None:
    """Close gently after a refusal's answer (a failed SASL login; Kafka's broker, too,
    waits before it closes): what the peer still sends is read and dropped until it
    closes or ``_LINGER_S`` pass (at most 64 KiB), then the caller closes. A close at
    once (a FIN or, with its bytes unread, a reset right behind the answer) lets
    kafka-python see a broken connection before it reads the answer, and report that
    instead of the failed login."""
    sock.settimeout(_LINGER_S)
    deadline = time.monotonic() + _LINGER_S
    left = 1 << 16
    with contextlib.suppress(OSError):
        while left > 0 and time.monotonic() < deadline:
            chunk = sock.recv(min(left, 4096))
            if not chunk:
                return
            left -= len(chunk)


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    """``n`` bytes from ``sock``; None if the peer closed first."""
    data = sock.recv(n, socket.MSG_WAITALL)
    while len(data) < n:
        more = sock.recv(n - len(data), socket.MSG_WAITALL)
        if not more:
            return None
        data += more
    return data


def _send(sock: socket.socket, out: bytes | list[Any]) -> None:
    """Send response frames (each carries its size): bytes, or buffers with
    scatter/gather writes (no joined copy of a fetch's record batches)."""
    if isinstance(out, bytes):
        sock.sendall(out)
    else:
        send_parts(sock, out, header=False)
