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
the order they were sent). Anything else takes the generic checked path.

Thread-safety: ``start``/``stop`` from the main thread; connections run in their own.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from typing import Any

from thriftpy2.protocol.cybin import TCyBinaryProtocol  # type: ignore[attr-defined]
from thriftpy2.thrift import TApplicationException, TProcessor, TType
from thriftpy2.transport.memory import TCyMemoryBuffer

from .errors import LuxunError
from .logs import RateLimitedLog
from .metrics import Metrics
from .wire import (
    encode_consume_reply,
    encode_consume_reply_parts,
    missing_required_field,
    parse_produce_call,
    produce_reply_frame,
    required_fields,
)

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log)

_INITIAL_BUFFER = 4 * 1024
_READ_BUFFER = 64 * 1024
_THREAD_STACK_BYTES = 512 * 1024
_MAX_DEPTH = 32
# A batch of received asyncProduce calls is appended at this size at the latest.
_MAX_BATCH_ITEMS = 4096
_MAX_BATCH_BYTES = 8 << 20

# Thrift binary protocol type ids and the fixed sizes of the scalar ones.
_T_STOP, _T_STRUCT, _T_MAP, _T_SET, _T_LIST, _T_STRING = 0, 12, 13, 14, 15, 11
_FIXED = {2: 1, 3: 1, 4: 8, 6: 2, 8: 4, 10: 8}
_I32 = struct.Struct(">i")
_FIELD = struct.Struct(">bh")
_MAP_HEADER = struct.Struct(">bbi")
_LIST_HEADER = struct.Struct(">bi")


class BadFrame(ValueError):
    """A frame that is not a well-formed Thrift binary message."""


def check_frame(frame: bytes) -> None:
    """Walk one Thrift binary-protocol message; raise :class:`BadFrame` unless every
    length and element count fits in the bytes that remain.

    Work is bounded by the frame length. Only the structure is checked; field types
    are the decoder's business.
    """
    end = len(frame)
    try:
        (first,) = _I32.unpack_from(frame, 0)
        if first < 0:  # strict: version | type, name, seqid
            if first & 0xFFFF0000 != 0x80010000:
                raise BadFrame(f"unknown protocol version {first & 0xFFFF0000:#x}")
            pos = _skip_string(frame, 4, end)
        else:  # old style: name, type byte
            pos = _skip_string(frame, 0, end) + 1
        pos += 4  # seqid
        pos = _skip_value(frame, pos, end, _T_STRUCT, 0)
    except struct.error as exc:
        raise BadFrame(f"frame ends inside a value: {exc}") from None
    if pos > end:
        raise BadFrame("frame ends inside a value")


def _skip_string(frame: bytes, pos: int, end: int) -> int:
    (size,) = _I32.unpack_from(frame, pos)
    pos += 4
    if size < 0 or size > end - pos:
        raise BadFrame(f"string of {size} bytes announced with {end - pos} bytes left in the frame")
    return pos + size


def _skip_value(frame: bytes, pos: int, end: int, ttype: int, depth: int) -> int:
    fixed = _FIXED.get(ttype)
    if fixed is not None:
        return pos + fixed
    if ttype == _T_STRING:
        return _skip_string(frame, pos, end)
    if depth > _MAX_DEPTH:
        raise BadFrame(f"values nested deeper than {_MAX_DEPTH}")
    if ttype == _T_STRUCT:
        while True:
            if pos >= end:
                raise BadFrame("struct not terminated")
            ftype = frame[pos]
            if ftype == _T_STOP:
                return pos + 1
            pos += 3  # type byte, i16 field id
            if pos > end:
                raise BadFrame("field header cut off")
            pos = _skip_value(frame, pos, end, ftype, depth + 1)
    if ttype == _T_MAP:
        ktype, vtype, count = _MAP_HEADER.unpack_from(frame, pos)
        pos += 6
        _check_count(count, end - pos)
        for _ in range(count):
            pos = _skip_value(frame, pos, end, ktype, depth + 1)
            pos = _skip_value(frame, pos, end, vtype, depth + 1)
            if pos > end:
                raise BadFrame("map runs past the frame")
        return pos
    if ttype in (_T_LIST, _T_SET):
        etype, count = _LIST_HEADER.unpack_from(frame, pos)
        pos += 5
        _check_count(count, end - pos)
        size = _FIXED.get(etype)
        if size is not None:
            return pos + size * count
        for _ in range(count):
            pos = _skip_value(frame, pos, end, etype, depth + 1)
            if pos > end:
                raise BadFrame("list runs past the frame")
        return pos
    raise BadFrame(f"unknown Thrift type id {ttype}")


def _check_count(count: int, left: int) -> None:
    if count < 0 or count > left:
        raise BadFrame(f"container of {count} elements announced with {left} bytes left in the frame")


class AsyncProduceBatch:
    """Consecutive asyncProduce calls to one topic, handed to the handler's
    ``async_produce_many`` together (one ``enqueue_many``). The caller flushes before
    any other call, so calls still take effect in the order they were sent; a batch
    also goes at ``_MAX_BATCH_ITEMS`` items or ``_MAX_BATCH_BYTES`` bytes."""

    __slots__ = ("handler", "items", "nbytes", "topic")

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.topic: str | None = None
        self.items: list[bytes | None] = []
        self.nbytes = 0

    def add(self, topic: str, item: bytes) -> None:
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


class ThriftServer:
    """Serves a thriftpy2 service on ``host:port`` (``port=0`` picks a free one).

    Args:
        service: the thriftpy2 service (``luxun_thrift.QueueService``).
        handler: the object implementing it.
        max_frame_bytes: largest frame accepted; bigger ones close the connection.
        max_connections: connections beyond this are closed at once (and counted).
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
    ) -> None:
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
        # The produce fast path, when the handler has the batch-aware entry points.
        self._fast_produce = hasattr(handler, "produce_item") and hasattr(handler, "async_produce_many")
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        self.metrics = metrics or Metrics()
        self._stopping = threading.Event()
        self._conns: dict[int, tuple[socket.socket, threading.Thread]] = {}
        self._conns_lock = threading.Lock()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(1024)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._accept_thread = threading.Thread(target=self._accept_loop, name="luxun-accept", daemon=True)

    def start(self) -> None:
        """Start accepting connections (returns at once)."""
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
        self._accept_thread.join(timeout_s)
        with self._conns_lock:
            conns = list(self._conns.values())
        for sock, _ in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RD)
        for _, thread in conns:
            thread.join(timeout_s)

    # -- accepting ---------------------------------------------------------------------
    def _accept_loop(self) -> None:
        old_stack = threading.stack_size()
        while not self._stopping.is_set():
            try:
                sock, peer = self._listener.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                log.exception("accept failed")
                continue
            with self._conns_lock:
                too_many = len(self._conns) >= self.max_connections
            if too_many:
                self.metrics.connections_refused += 1
                log.warning("refusing connection from %s: %d connections open already", peer, self.max_connections)
                sock.close()
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.stack_size(_THREAD_STACK_BYTES)
            try:
                thread = threading.Thread(target=self._serve, args=(sock, peer), name=f"luxun-conn-{peer}", daemon=True)
            finally:
                threading.stack_size(old_stack)
            with self._conns_lock:
                self._conns[sock.fileno()] = (sock, thread)
            self.metrics.connections_total += 1
            self.metrics.connections_open += 1
            thread.start()

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
            log.exception("connection %s failed", peer)
        finally:
            with self._conns_lock:
                self._conns.pop(key, None)
            self.metrics.connections_open -= 1
            with contextlib.suppress(OSError):
                sock.close()

    def _read_frames(self, sock: socket.socket, peer: Any) -> None:
        buf = bytearray(_INITIAL_BUFFER)  # grows to _READ_BUFFER when reads fill it
        start = end = 0
        max_frame = self.max_frame_bytes
        handler = self._handler
        fast_produce = self._fast_produce
        batch = AsyncProduceBatch(handler)
        while True:
            # Handle every complete frame in the buffer. Consecutive asyncProduce calls
            # to one topic are appended together (see AsyncProduceBatch).
            while end - start >= 4:
                (size,) = _I32.unpack_from(buf, start)
                if size <= 0 or size > max_frame:
                    batch.flush()
                    self.metrics.bad_frames += 1
                    log.warning("closing connection from %s: frame of %d bytes (limit %d)", peer, size, max_frame)
                    return
                if end - start - 4 < size:
                    if start + 4 + size > len(buf):  # make room for the whole frame
                        buf[: end - start] = buf[start:end]
                        end -= start
                        start = 0
                        if 4 + size > len(buf):
                            buf.extend(bytes(4 + size - len(buf)))
                    break
                call = parse_produce_call(buf, start + 4, start + 4 + size) if fast_produce else None
                if call is not None and call[0]:  # asyncProduce
                    start += 4 + size
                    batch.add(call[3], call[2])
                    continue
                batch.flush()
                if call is not None:  # produce: decoded and answered by hand
                    _, seqid, item, topic = call
                    start += 4 + size
                    result, index = handler.produce_item(topic, item)
                    sock.sendall(produce_reply_frame(seqid, result, index))
                    continue
                frame = bytes(buf[start + 4 : start + 4 + size])
                start += 4 + size
                if not self._handle(sock, peer, frame):
                    return
            batch.flush()
            if start == end:
                start = end = 0
                if len(buf) > 1 << 20:  # give back what one big frame needed
                    buf = bytearray(_READ_BUFFER)
            elif end == len(buf):
                # The buffer ends inside a frame header: move what is left to the front
                # (a recv into no room would read as end of stream).
                buf[: end - start] = buf[start:end]
                end -= start
                start = 0
            if self._stopping.is_set():
                return
            with memoryview(buf) as view:
                n = sock.recv_into(view[end:])
            if n == 0:
                return
            end += n
            if end == len(buf) and len(buf) < _READ_BUFFER:
                # A busy connection (e.g. a stream of asyncProduce): read in bigger
                # chunks. Quiet ones (a waiting consumer) keep the small buffer.
                buf.extend(bytes(_READ_BUFFER - len(buf)))

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
            log.warning("closing connection from %s: undecodable request (%s)", peer, exc)
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
    def _send_parts(sock: socket.socket, parts: list[Any]) -> None:
        """Send one reply frame made of a few buffers (bytes, memoryviews, uint8
        arrays) with scatter/gather writes: no joined copy of a big reply."""
        views = [memoryview(p).cast("B") for p in parts]
        size = sum(v.nbytes for v in views)
        views.insert(0, memoryview(size.to_bytes(4, "big")))
        if size < 65536:
            sock.sendall(b"".join(views))
            return
        while views:
            sent = sock.sendmsg(views)
            while views and sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            if views and sent:
                views[0] = views[0][sent:]

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
