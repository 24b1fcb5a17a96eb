"""The Kafka port's server: Kafka's framing over :class:`~luxun.server.TcpServer`.

A Kafka request is a frame: an int32 size, then the request header and body. As in
Kafka, each connection's requests are handled one at a time, in order, and answered
in that order (a Fetch waiting for data holds its connection, as in Kafka: clients
use several connections for that reason). A frame whose size is <= 0 or above
``max_frame_bytes`` (``socket.request.max.bytes`` in Kafka), or that does not parse,
closes only that connection, with one rate-limited log line.

Memory is bounded as on the Thrift port: a frame is read in chunks as its bytes
arrive, every chunk taken from the broker-wide :class:`~luxun.server.InputBudget`
(a client announcing 2 GiB and sending nothing holds nothing); a connection that
cannot get budget within ``budget_wait_s`` is closed.

Thread-safety: ``start``/``stop`` from the main thread; connections run in their own.
"""

from __future__ import annotations

import logging
import socket
import struct
from typing import Any, Protocol

from ..logs import RateLimitedLog
from ..metrics import Metrics
from ..server import DEFAULT_BUDGET_WAIT_S, TcpServer

__all__ = ["FrameHandler", "KafkaServer"]

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

_I32 = struct.Struct(">i")
# Bytes read per recv while a frame arrives (and taken from the budget per step).
_CHUNK = 1 << 20


class FrameHandler(Protocol):
    def handle_frame(self, frame: bytes, peer: Any) -> bytes | list[Any] | None:
        """Answer one request frame (size prefix excluded): the response frame (size
        included), as bytes or as buffers to send in order; None: no response (acks=0).

        Raises:
            ValueError: the request cannot be parsed; the connection is closed.
        """


class KafkaServer(TcpServer):
    """Serves the Kafka protocol on ``host:port`` through ``handler``."""

    def __init__(
        self,
        handler: FrameHandler,
        host: str,
        port: int,
        *,
        max_frame_bytes: int,
        max_connections: int = 10_000,
        metrics: Metrics | None = None,
        max_buffered_bytes: int | None = None,
        budget_wait_s: float = DEFAULT_BUDGET_WAIT_S,
    ) -> None:
        self._handler = handler
        self.max_frame_bytes = max_frame_bytes
        super().__init__(
            host,
            port,
            max_connections=max_connections,
            metrics=metrics,
            max_buffered_bytes=max_buffered_bytes,
            budget_wait_s=budget_wait_s,
            name="luxun-kafka",
        )

    def _recv_exactly(self, sock: socket.socket, n: int, held: list[int]) -> bytes | None:
        """``n`` bytes from ``sock`` (None when the peer closed first). Each chunk
        beyond 4 KiB is taken from the input budget first and counted in ``held[0]``
        (the caller gives it back once the request is handled)."""
        if n <= 4096:
            data = sock.recv(n, socket.MSG_WAITALL)
            return data if len(data) == n else None
        parts: list[bytes] = []
        got = 0
        while got < n:
            step = min(_CHUNK, n - got)
            if not self._budget.take(step, self.budget_wait_s, self._stopping):
                _limited.warning(
                    "kafka-budget",
                    "closing Kafka connection: no input budget for a %d-byte request within %.0f s",
                    n,
                    self.budget_wait_s,
                )
                return None
            held[0] += step
            chunk = sock.recv(step, socket.MSG_WAITALL)
            if len(chunk) < step:  # the peer closed (or the server is stopping)
                return None
            parts.append(chunk)
            got += step
        return b"".join(parts)

    def _read_frames(self, sock: socket.socket, peer: Any) -> None:
        handler = self._handler
        max_frame = self.max_frame_bytes
        held = [0]
        while not self._stopping.is_set():
            head = sock.recv(4, socket.MSG_WAITALL)
            if len(head) < 4:
                return
            (size,) = _I32.unpack(head)
            if size <= 0 or size > max_frame:
                self.metrics.bad_frames += 1
                _limited.warning(
                    "kafka-frame-size",
                    "closing Kafka connection from %s: request size %d is outside 1..%d (socket.request.max.bytes)",
                    peer,
                    size,
                    max_frame,
                )
                return
            try:
                frame = self._recv_exactly(sock, size, held)
                if frame is None:
                    return
                try:
                    out = handler.handle_frame(frame, peer)
                except ValueError as exc:
                    self.metrics.bad_frames += 1
                    _limited.warning("kafka-bad-request", "closing Kafka connection from %s: %s", peer, exc)
                    return
                del frame
            finally:
                self._budget.give(held[0])
                held[0] = 0
            if out is not None:
                _send(sock, out)


def _send(sock: socket.socket, out: bytes | list[Any]) -> None:
    """Send a response frame: bytes, or buffers with scatter/gather writes (no joined
    copy of a fetch's record batches)."""
    if isinstance(out, bytes):
        sock.sendall(out)
        return
    if sum(len(b) for b in out) < 65536:
        sock.sendall(b"".join(out))
        return
    views = [memoryview(b).cast("B") for b in out]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]
