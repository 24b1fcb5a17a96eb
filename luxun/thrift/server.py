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

Produce calls take a hand-written path (:mod:`luxun.thrift.wire`): a ``produce`` or
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

Batching a lone asyncProduce stream: the opposite case. A client sending oneway calls in
a loop is not waiting for us, and a connection that reads them as soon as they come takes
a few calls a read, each read a wake-up of this thread that the client's ``send`` pays
for. So a connection whose last call was an ``asyncProduce``, that has been the only one
receiving for 50 ms, whose last read emptied its socket and ended with a whole call,
sleeps ``async_batch_us`` (``async.batch.us``, default 200 us) before reading again: the
calls gather in the socket and come in one read. With several busy connections, a client
faster than this thread (its read filled the buffer), or part of a call received, it
reads at once as before. A sync call after the stream waits at most that long. Measured
(one thriftpy2 client in a loop, 3 s, alternately): 100 B 163-170 k -> 219-230 k calls/s,
broker CPU 5.4-5.7 -> 1.6-1.8 us a call; 1 KB 152-160 k -> 162-222 k, 5.9-6.1 -> 2.2-2.8
us; 4 clients unchanged (docs/architecture.md).

Following the client's CPU: where the shared loop serves (the compiled loop, below), a
lone connection (the only one receiving for 50 ms) that got a small reply is not polled:
the loop's thread moves to the CPU its client's bytes came in on (SO_INCOMING_CPU; over
loopback, the CPU the client sent from) and sleeps there. Client and broker then take
turns on one CPU, each waking the other there, where a wake-up across CPUs costs each
call more than all the rest of it (an idle vCPU halts; waking it takes the host). One
thriftpy2 client, sync produce of 100 B, 2 s, alternately: 29.6-30.3 k calls/s at 31.8-32.6
us of broker CPU a call polling, 51.5-57.7 k at 6.3-7.2 us following. Only among the CPUs
the broker may use, two or more; anything else (another connection receiving, a big
reply, several calls at once, ``follow.client.cpu=false``) puts the thread back on all of
them, and polling applies as before (so does it on the connection threads' own loops).
``luxun_cpu_follows_total`` counts the moves.

The compiled loop: where ``luxun._netloop`` is built (the README's set-up builds it; a
machine without a C compiler gets the Python loop alone), a connection that holds no input
waits, receives and answers in C (luxun/_netloop.c): a frame that is exactly one
``produce`` in the canonical layout, or one ``consume`` that ``consume_single`` serves at
once, gets its reply written and sent there, the handler called with the interpreter
(``produce_item``, ``consume_single``), and busy polling done with the interpreter
released; anything else (other calls, several frames or part of one in a read, errors
answered by the generic path) is handed back to this Python loop, which serves it exactly
as before. Replies are byte for byte those of the Python loop (tests/broker/test_compiled_loop.py
compares the two; ``LUXUN_PURE_PYTHON=1`` turns the compiled loop off). Why, and what it
saves per call against ``floor-c`` (a server with no interpreter) and Java Luxun: docs/architecture.md,
"The compiled loop".

Order across connections (``tracks_input``): a connection waits for bytes with ``poll``
and takes them from the kernel only once marked as holding input (:class:`~luxun.net.ConnInput`),
and is idle again once every complete call it took is handled, or while it handles a
consume that is its last call received (a consume may wait: a long poll, or for others'
input), so :meth:`~luxun.net.TcpServer.await_earlier_input` can tell a consume what
other connections received before it (QueueHandler, "Order across connections").

Thread-safety: ``start``/``stop`` from the main thread; connections run in their own.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import struct
import threading
import time
from typing import Any

from thriftpy2.protocol.cybin import TCyBinaryProtocol  # type: ignore[attr-defined]
from thriftpy2.thrift import TApplicationException, TProcessor, TType
from thriftpy2.transport.memory import TCyMemoryBuffer  # type: ignore[attr-defined]

from idl.binary import ThriftBinaryError, skip_message

from ..config import DEFAULT_ASYNC_BATCH_US, DEFAULT_BUSY_POLL_US, DEFAULT_FOLLOW_CLIENT_CPU
from ..errors import LuxunError
from ..logs import RateLimitedLog
from ..net import (
    INITIAL_BUFFER,
    KEEP_BUFFER,
    NETLOOP,
    READ_BUFFER,
    RECEIVING,
    BigFrame,
    ConnInput,
    TcpServer,
    send_frame,
    send_parts,
)
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

_serve_compiled: Any = NETLOOP.serve if NETLOOP is not None else None

#: LUXUN_PURE_PYTHON=1 in the environment: the Python loop serves every call (tests run both).
COMPILED_LOOP = _serve_compiled is not None and os.environ.get("LUXUN_PURE_PYTHON", "") in ("", "0")
#: ... and LUXUN_SHARED_LOOP=0: each connection's thread runs the compiled loop itself, not the
#: shared loop (luxun._netloop.Loop: one thread serving every idle connection's calls in place).
SHARED_LOOP = COMPILED_LOOP and os.environ.get("LUXUN_SHARED_LOOP", "") in ("", "1")

log = logging.getLogger(__name__)
#: Lines a client or a bad environment can repeat, keyed by kind (never by peer).
_rate_limited = RateLimitedLog(log)

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


class ThriftServer(TcpServer):
    """Serves a thriftpy2 service on ``host:port`` (``port=0`` picks a free one).

    Args:
        service: the thriftpy2 service (``luxun_thrift.QueueService``).
        handler: the object implementing it.
        busy_poll_us: after answering, a connection that has been the only one receiving
            (for ``_BUSY_POLL_QUIET_S``) polls its socket this long before it sleeps in
            ``recv`` (0: never); see the module docstring.
        async_batch_us: a connection streaming asyncProduce calls, the only one
            receiving, waits this long before its next read when its last one emptied
            its socket (0: never); see the module docstring.
        follow_client_cpu: the shared loop serves a lone connection on the CPU its client
            sends from, sleeping instead of busy polling; see the module docstring.
        options: :class:`~luxun.net.TcpServer`'s (``max_frame_bytes``, limits, metrics).
    """

    frame_limit_setting = "max.message.size + 1 MiB"
    tracks_input = True  # _read_frames_into follows ConnInput's rules

    def __init__(
        self,
        service: Any,
        handler: Any,
        host: str,
        port: int,
        *,
        busy_poll_us: int = DEFAULT_BUSY_POLL_US,
        async_batch_us: int = DEFAULT_ASYNC_BATCH_US,
        follow_client_cpu: bool = DEFAULT_FOLLOW_CLIENT_CPU,
        **options: Any,
    ) -> None:
        self.busy_poll_us = busy_poll_us
        self.async_batch_us = async_batch_us
        self.follow_client_cpu = follow_client_cpu
        self.compiled_loop = COMPILED_LOOP
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
        # The shared loop and its thread (made by start()), where the compiled loop serves.
        self.shared_loop = self.compiled_loop and SHARED_LOOP and hasattr(handler, "in_place_calls")
        self._loop: Any = None
        self._loop_thread: Any = None
        super().__init__(host, port, **options)

    def start(self) -> None:
        """Start the shared loop's thread (where it serves), then accept connections."""
        if self.shared_loop:
            here = self._handler.in_place_calls()
            self._loop = NETLOOP.Loop(self.busy_poll_us, self.metrics, here, self.follow_client_cpu)
            self._loop_thread = threading.Thread(target=self._run_loop, name="thrift-loop", daemon=True)
            self._loop_thread.start()
        super().start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """:meth:`TcpServer.stop`, then the shared loop (which has given every connection
        back by then: their sockets were shut down)."""
        super().stop(timeout_s)
        if self._loop is not None:
            self._loop.stop()
            self._loop_thread.join(timeout_s)

    def _run_loop(self) -> None:
        try:
            self._loop.run()
        except Exception:  # its connections were handed back: they go on in their threads
            log.exception("the Thrift door's shared loop stopped; each connection's thread serves it now")

    @property
    def loop_text(self) -> str:
        """Which loop serves the small sync calls, for the broker's start-up line."""
        if self.shared_loop:
            return "small sync calls served by the compiled loop (luxun._netloop), in one shared thread"
        if self.compiled_loop:
            return "small sync calls served by the compiled loop (luxun._netloop)"
        why = "LUXUN_PURE_PYTHON is set" if _serve_compiled is not None else "luxun._netloop is not built"
        return f"every call served by the Python loop ({why})"

    def _read_frames(self, sock: socket.socket, peer: Any) -> None:
        """Read and handle frames until the peer closes, a frame is refused, or the
        server stops. The buffer's bytes beyond INITIAL_BUFFER, and a big frame's
        mapping, are taken from the input budget and given back here."""
        buf = bytearray(INITIAL_BUFFER)  # grows as bytes arrive, never ahead of them
        big = BigFrame()
        try:
            self._read_frames_into(sock, peer, buf, big)
        finally:
            # _read_frames_into keeps buf's length and the budget in step; it replaces
            # buf only by shrinking it in place.
            self._budget.give(len(buf) - INITIAL_BUFFER)
            big.release(self._budget)

    def _read_frames_into(self, sock: socket.socket, peer: Any, buf: bytearray, big: BigFrame) -> None:
        start = end = 0
        max_frame = self.max_frame_bytes
        handler = self._handler
        fast_produce = self._fast_produce
        consume_for_wire = self._consume_for_wire
        consume_request = self._consume_request
        fast_consume = consume_for_wire is not None and consume_request is not None
        consume_single = getattr(handler, "consume_single", None) if fast_consume else None
        budget = self._budget
        me = threading.get_ident()
        conn = self.input_of(sock)  # where this connection's input stands (ConnInput)
        # The compiled loop (luxun._netloop.serve), for a connection it can serve: a socket whose
        # input is tracked, with the produce and one-item consume fast paths.
        fast = (
            _serve_compiled
            if conn.poller is not None and fast_produce and consume_single is not None and self.compiled_loop
            else None
        )
        fd = sock.fileno() if fast is not None else -1
        # ... which serves the common produce and consume itself where the handler says
        # how (QueueHandler.in_place_calls: their success paths, in C).
        in_place = getattr(handler, "in_place_calls", None) if fast is not None else None
        here = in_place() if in_place is not None else None
        shared = self._loop if fast is not None else None
        note = functools.partial(RECEIVING.note, me)
        produce_item = handler.produce_item if fast_produce else None
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
        streaming = False  # the last call handled was an asyncProduce: its client is sending
        drained = False  # the last read took less than it had room for: the socket was empty
        batch_s = self.async_batch_us / 1e6
        while True:
            # Handle every complete frame in the buffer. Consecutive asyncProduce calls
            # to one topic are appended together (see AsyncProduceBatch).
            while end - start >= 4:
                (size,) = _I32.unpack_from(frames, start)
                if size <= 0 or size > max_frame:
                    batch.flush()
                    self._refuse_frame_size(peer, size)
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
                        streaming = True
                        continue
                call = parse_produce_call(frames, start + 4, start + 4 + size) if fast_produce else None
                if call is not None and call[0]:  # asyncProduce
                    if frames is buf and buf.startswith(ASYNC_PRODUCE_START, start + 4):
                        async_tail = bytes(buf[start + 4 + ASYNC_ITEM_AT + len(call[2]) : start + 4 + size])
                        async_topic = call[3]
                        async_room = ASYNC_ITEM_AT + len(async_tail)
                    start += 4 + size
                    batch.add(call[3], call[2])
                    streaming = True
                    continue
                batch.flush()
                streaming = False
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
                    # and given back once sent. It may wait (a long poll, or for other
                    # connections' input, see QueueHandler): holding nothing more, this
                    # connection is idle meanwhile, so no other call waits for it.
                    if start == end:
                        conn.idle()
                    response = consume_for_wire(consume_request(**fields), True)
                    try:
                        reply_size = send_parts(sock, encode_consume_reply_parts(seqid, response))
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
                if not self._handle(sock, peer, frame, conn if start == end else None):
                    return
                del frame
            call = None  # the last asyncProduce's item is not held while we wait in recv
            batch.flush()
            conn.idle()  # every complete call received is handled
            if start == end:
                start = end = 0
                if frames is not buf:  # a big frame was handled: unmap it
                    big.release(budget)
                    frames = buf
                if len(buf) > INITIAL_BUFFER and budget.tight:  # others need it: give it all back
                    budget.give(len(buf) - INITIAL_BUFFER)
                    del buf[INITIAL_BUFFER:]
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
                    if 4 + size > KEEP_BUFFER:  # a big frame: into its own mapping
                        with memoryview(buf) as view:
                            if not self._read_big_frame(sock, peer, view[:end], size, big):
                                return
                        assert big.mm is not None
                        big.view = frames = memoryview(big.mm)  # items are views, not copies
                        start, end = 0, 4 + size
                        answered = False
                        continue
                    more = min(max(2 * len(buf), READ_BUFFER), 4 + size) - len(buf)
                    if not self._take_input_budget(peer, size, more):
                        return
                    buf.extend(bytes(more))
            if self._stopping.is_set():
                return
            # Bytes leave the kernel only while this connection holds (see ConnInput): a
            # call on another connection then knows they are there.
            with memoryview(buf) as view:
                n = -1
                parks = shared is not None and start == end and frames is buf  # the shared loop polls
                if poll_s and answered and not parks and receiving.alone(me, _BUSY_POLL_QUIET_S):
                    now = time.monotonic()
                    if not polled_since:
                        polled_since = now
                    if now - polled_since < _BUSY_POLL_RUN_S:
                        conn.hold()
                        n = self._busy_poll(sock, view[end:], poll_s)
                        metrics.busy_polls += 1
                        metrics.busy_poll_hits += n >= 0
                        if n < 0:
                            conn.idle()
                if (
                    n < 0
                    and streaming
                    and drained
                    and start == end
                    and batch_s
                    and receiving.alone(me, _BUSY_POLL_QUIET_S)
                ):
                    # A lone client streaming oneway calls is not waiting for us: let its
                    # calls gather in the socket, then take them in one read (neither
                    # side is woken for every few calls).
                    metrics.async_batch_waits += 1
                    time.sleep(batch_s)
                    conn.hold()
                    try:
                        n = sock.recv_into(view[end:], 0, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        conn.idle()
                if n < 0:
                    polled_since = 0.0
                    if fast is not None and start == end and frames is buf:
                        # Nothing held: the compiled loop waits, receives and serves the
                        # small sync calls until bytes it leaves to this loop come.
                        n = shared.park(fd, buf, me, conn, receiving) if shared is not None else None
                        if n is None:  # no shared loop (or not yet, or no more): this thread's own
                            n = fast(fd, buf, me, self.busy_poll_us, conn.hold, conn.idle, note, metrics,
                                     produce_item, produce_reply_frame, consume_single, here)  # fmt: skip
                    else:
                        conn.wait_readable()
                        conn.hold()
                        n = sock.recv_into(view[end:])
            answered = False
            receiving.note(me)
            if n == 0:
                return
            drained = n < len(buf) - end
            end += n
            if (
                end == len(buf)
                and len(buf) < READ_BUFFER
                and (end - start < 4 or 4 + _I32.unpack_from(buf, start)[0] <= KEEP_BUFFER)
                and budget.try_take(READ_BUFFER - len(buf))
            ):
                # A busy connection (e.g. a stream of asyncProduce): read in bigger
                # chunks. Quiet ones (a waiting consumer) keep the small buffer, and so
                # does one receiving a frame bigger than KEEP_BUFFER (its own mapping).
                buf.extend(bytes(READ_BUFFER - len(buf)))

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

    def _handle(self, sock: socket.socket, peer: Any, frame: bytes, conn: ConnInput | None = None) -> bool:
        """Decode one call frame, call the handler, send its reply; False when the
        connection must be closed (an undecodable frame). ``conn``: the connection's
        input, when it holds no call after this one (a consume then makes it idle while
        it may wait).

        As Java Luxun (its Thrift processor) answers: an unknown method gets a
        TApplicationException UNKNOWN_METHOD ("Invalid method name: 'x'"), a request
        struct with a required field unset gets PROTOCOL_ERROR (Java's text, see
        :func:`~luxun.thrift.wire.missing_required_field`), and a handler that raises gets
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
            if api == "consume" and conn is not None:
                conn.idle()
            if api == "consume" and self._consume_for_wire is not None:
                # The hot read path: the items come as one blob, encoded by hand.
                send_parts(sock, encode_consume_reply_parts(seqid, self._consume_for_wire(*values)))
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
        send_frame(sock, out)
        return True

    def _send_exception(self, sock: socket.socket, api: str, seqid: int, kind: int, message: str) -> None:
        oprot = TCyBinaryProtocol(TCyMemoryBuffer())
        self._processor.send_exception(oprot, api, TApplicationException(kind, message), seqid)
        send_frame(sock, oprot.trans.getvalue())
