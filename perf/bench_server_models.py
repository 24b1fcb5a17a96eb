"""Benchmark the broker's server models: threads, asyncio, several processes.

A program, not a test::

    .venv/bin/python perf/bench_server_models.py            # full run: about 4 min on 2 cores
    .venv/bin/python perf/bench_server_models.py --quick    # smoke run: about 30 s
    .venv/bin/python perf/bench_server_models.py --models threads,asyncio-cy --workloads stall
    .venv/bin/python perf/bench_server_models.py --help

Every model serves the same ``luxun.thrift.service.QueueHandler`` over a
``luxun.topics.TopicManager`` (default page size, no flush, no maintenance thread) on a
temporary data directory, in its own process, started by this file's ``--serve`` entry
point (``--serve MODEL --port P --data-dir D``; ``--port 0`` picks a free port and the
process prints it):

=====================  ==================================================================
``threads``            ``luxun.thrift.server.ThriftServer`` as the broker runs it: a thread per
                       connection, our framing, ``TCyBinaryProtocol``
``asyncio-cy``         one event loop (``asyncio.Protocol``) with ``ThriftServer``'s
                       framing; each frame answered inline on the loop thread by
                       ``ThriftServer._handle`` itself (frame check, ``TCyBinaryProtocol``
                       and ``TProcessor.process_in``, the hand-encoded consume path),
                       writing to the transport; produce frames take
                       ``ThriftServer._read_frames``'s hand-written path (the same
                       parser, reply encoder and ``AsyncProduceBatch``). So it and
                       ``threads`` run the same per-call code and differ only in the
                       server model
``asyncio-thriftpy2``  thriftpy2's own asyncio server (``thriftpy2.contrib.aio``:
                       ``TAsyncServer``, framed transport, its pure-Python async binary
                       protocol) with an async adaptor around the handler
``processes``          two ``threads`` brokers (own data directories and ports); client ``i``
                       uses broker ``i % 2`` (brokers never talk to each other; clients
                       spread their topics)
=====================  ==================================================================

On both asyncio models a long-poll consume (``maxWaitMs``) does not block the loop: the
adaptor calls the handler without the wait, and if there is nothing to return, parks the
call on an asyncio future that a produce to the topic (or the deadline) resolves, then
asks the handler again; the connection reads no further frame meanwhile.

Clients are forked processes with thriftpy2 clients (``idl.luxun_thrift``, Cython binary
protocol, framed transport, TCP_NODELAY), each on its own topic. The table goes to stdout,
progress to stderr, every number to JSON (``perf/results/bench_server_models.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib.metadata
import json
import logging
import multiprocessing as mp
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _common import collect_reports, fmt_rate, load_average, machine_info  # noqa: E402
from thriftpy2.contrib.aio.processor import TAsyncProcessor  # noqa: E402
from thriftpy2.contrib.aio.protocol import TAsyncBinaryProtocolFactory  # noqa: E402
from thriftpy2.contrib.aio.server import TAsyncServer  # noqa: E402
from thriftpy2.contrib.aio.socket import TAsyncServerSocket  # noqa: E402
from thriftpy2.contrib.aio.transport import TAsyncFramedTransportFactory  # noqa: E402
from thriftpy2.protocol import TCyBinaryProtocolFactory  # noqa: E402
from thriftpy2.protocol.cybin import TCyBinaryProtocol  # type: ignore[attr-defined]  # noqa: E402
from thriftpy2.thrift import TClient, TMessageType  # noqa: E402
from thriftpy2.transport import TCyFramedTransportFactory, TSocket  # noqa: E402
from thriftpy2.transport.memory import TCyMemoryBuffer  # noqa: E402

import luxun.thrift.wire  # noqa: E402
from idl import QueueService  # noqa: E402
from idl import luxun_thrift as T  # noqa: E402
from luxun.broker import FRAME_OVERHEAD_BYTES  # noqa: E402
from luxun.config import DEFAULT_DATA_PAGE_SIZE_BYTES, DEFAULT_FLUSH_COUNT, DEFAULT_MAX_MESSAGE_SIZE_BYTES  # noqa: E402
from luxun.metrics import Metrics  # noqa: E402
from luxun.net import send_frame, send_parts  # noqa: E402
from luxun.thrift.server import AsyncProduceBatch, ThriftServer  # noqa: E402
from luxun.thrift.service import MAX_WAIT_MS, QueueHandler  # noqa: E402
from luxun.thrift.wire import encode_consume_reply, parse_produce_call, produce_reply_frame  # noqa: E402
from luxun.topics import TopicManager  # noqa: E402

log = logging.getLogger("bench_server_models")

MIB = 1 << 20
SUCCESS = T.ResultCode.SUCCESS
TRY_LATER = T.ResultCode.TRY_LATER
E = T.ErrorCode
HOST = "127.0.0.1"
#: deleteTopic password of the bench brokers (loopback only, deleted at the end).
PASSWORD = "bench-server-models"

SERVE_MODELS = ("threads", "asyncio-cy", "asyncio-thriftpy2")
MODELS = (*SERVE_MODELS, "processes")
#: Broker processes of each model.
MODEL_PROCESSES = {"threads": 1, "asyncio-cy": 1, "asyncio-thriftpy2": 1, "processes": 2}
WORKLOADS = ("produce", "async_produce", "consume", "stall")
#: workload -> (item bytes, unit of the rate, table label).
WORKLOAD_INFO: dict[str, tuple[int, str, str]] = {
    "produce": (100, "calls/s", "sync produce 100 B"),
    "async_produce": (1000, "items/s", "asyncProduce 1 KB"),
    "consume": (100, "items/s", "consume 100 B, 1 MiB fetch"),
    "stall_idle": (100, "calls/s", "produce, no waiters"),
    "stall_waiting": (100, "calls/s", "produce, N waiting"),
}
FETCH_BYTES = MIB
CONSUME_TOPIC = "consume-c{}"
#: The empty topic the stall test's connections wait on, one per repeat (woken at its end).
WAIT_TOPIC = "stall-wait-r{}"
#: Error codes after which a long-poll consume waits (as QueueHandler.consume).
WAITABLE = frozenset((E.ALL_MESSAGE_CONSUMED, E.TOPIC_IS_EMPTY, E.TOPIC_NOT_EXIST))
#: Oneway calls sent between two reads of the clock.
ASYNC_CHUNK = 64
#: A broker counts as idle after two samples of SETTLE_SAMPLE_S at <= SETTLE_IDLE_CPU of a core.
SETTLE_SAMPLE_S = 0.05
SETTLE_IDLE_CPU = 0.05
BARRIER_TIMEOUT_S = 60.0
SERVER_START_TIMEOUT_S = 30.0
SERVER_STOP_TIMEOUT_S = 30.0
#: Seconds the waiting connections get to reach their wait before the broker's RSS is read.
WAITERS_SETTLE_S = 0.5

#: name -> (full run, --quick run, help) for the budget options (ints: counts, floats: seconds).
BUDGETS: dict[str, tuple[float, float, str]] = {
    "seconds": (3.0, 0.4, "max timed seconds per run"),
    "produce_calls": (30_000, 20_000, "max produce calls per run, all clients together"),
    "async_items": (100_000, 40_000, "max asyncProduce items per run, all clients together"),
    "consume_items": (3_000_000, 400_000, "max items consumed per run, all clients together"),
    "warmup_seconds": (0.1, 0.05, "untimed warm-up per client"),
    "warmup_items": (1_000, 300, "max warm-up items (calls) per client"),
    "prefill_items": (200_000, 20_000, "items of 100 B in each consume topic"),
    "drain_seconds": (20.0, 10.0, "max wait for oneway items to arrive"),
    "settle_max_s": (1.0, 0.3, "max wait for the brokers to be idle before a run"),
    "repeat": (3, 1, "runs per cell; the median is shown"),
}


# -- the server models (run in the --serve process) -----------------------------------------
def make_handler(data_dir: str) -> tuple[TopicManager, QueueHandler]:
    """The broker's handler on ``data_dir``, configured as ``luxun.broker.Broker`` does with
    the default config (no maintenance thread: no model has one)."""
    topics = TopicManager(data_dir, data_page_size_bytes=DEFAULT_DATA_PAGE_SIZE_BYTES, flush_count=DEFAULT_FLUSH_COUNT)
    handler = QueueHandler(
        topics,
        broker_id=0,
        max_message_size_bytes=DEFAULT_MAX_MESSAGE_SIZE_BYTES,
        password_check=lambda given: given == PASSWORD,
        metrics=Metrics(),
    )
    return topics, handler


class LongPoll:
    """Long-poll consume for handlers called on an asyncio loop's thread.

    ``QueueHandler``'s consume waits for items on a ``threading.Condition``, which would
    block the loop. Here the handler is called without the wait; if the answer is "nothing
    yet", the call parks on a future that :meth:`produced` (called after every produce to
    the topic) or the deadline resolves, and the handler is asked again.

    Thread-safety: the loop's thread only.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    def produced(self, topic: str | None) -> None:
        """Wake the calls waiting on ``topic``."""
        futures = self._waiters.pop(topic, None) if topic else None
        if futures:
            for future in futures:
                if not future.done():
                    future.set_result(None)

    @staticmethod
    def consume_now(consume: Callable[[Any], Any], request: Any) -> tuple[Any, float]:
        """``consume(request)`` without waiting, and the monotonic deadline until which the
        call should wait for more (0.0: answer now)."""
        wait_ms = request.maxWaitMs or 0
        if wait_ms > 0:
            request.maxWaitMs = None
        response = consume(request)
        if wait_ms > 0 and response.result.errorCode in WAITABLE:
            return response, time.monotonic() + min(wait_ms, MAX_WAIT_MS) / 1000
        return response, 0.0

    async def consume_later(self, consume: Callable[[Any], Any], request: Any, deadline: float) -> Any:
        """Wait until a produce to the topic or ``deadline``, then ``consume(request)``
        (again, if woken by items that were not this call's)."""
        loop = asyncio.get_running_loop()
        topic = request.topic
        while True:
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(topic, set()).add(future)
            try:
                await asyncio.wait_for(future, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                pass
            finally:
                waiting = self._waiters.get(topic)
                if waiting is not None:
                    waiting.discard(future)
                    if not waiting:
                        del self._waiters[topic]
            response = consume(request)
            if response.result.errorCode not in WAITABLE or time.monotonic() >= deadline:
                return response


class ParkedConsume(Exception):
    """Raised out of ``ThriftServer._handle`` by :class:`LoopHandler` for a long-poll consume
    that has to wait: the connection then waits on the loop (:meth:`LongPoll.consume_later`)."""

    def __init__(self, consume: Callable[[Any], Any], request: Any, deadline: float, wire: bool) -> None:
        super().__init__("consume parked")
        self.consume = consume
        self.request = request
        self.deadline = deadline
        self.wire = wire  # True: consume_for_wire's answer, encoded by encode_consume_reply_parts


class LoopHandler:
    """The handler as the loop models call it: every method of ``handler``, but produces
    wake the long polls of their topic, and a consume that would wait raises
    :class:`ParkedConsume` instead of blocking the loop."""

    def __init__(self, handler: QueueHandler, poll: LongPoll) -> None:
        self.handler = handler
        self.poll = poll

    def produce(self, request: Any) -> Any:
        response = self.handler.produce(request)
        self.poll.produced(request.topic)
        return response

    def asyncProduce(self, request: Any) -> None:
        self.handler.asyncProduce(request)
        self.poll.produced(request.topic)

    def produce_item(self, topic: str | None, item: bytes | None) -> Any:
        answer = self.handler.produce_item(topic, item)  # type: ignore[attr-defined]
        self.poll.produced(topic)
        return answer

    def async_produce_many(self, topic: str | None, items: list[Any]) -> None:
        self.handler.async_produce_many(topic, items)  # type: ignore[attr-defined]
        self.poll.produced(topic)

    def consume(self, request: Any) -> Any:
        return self._consume(self.handler.consume, request, wire=False)

    def _consume(self, consume: Callable[[Any], Any], request: Any, *, wire: bool) -> Any:
        response, deadline = self.poll.consume_now(consume, request)
        if deadline:
            raise ParkedConsume(consume, request, deadline, wire)
        return response

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.handler, name)  # getSize, deleteTopic, ..., consume_for_wire if it has one
        if name == "consume_for_wire":
            return lambda request: self._consume(attr, request, wire=True)
        return attr


class AsyncHandler:
    """The async adaptor ``thriftpy2.contrib.aio`` needs: every call runs the handler inline
    (it never blocks: long polls wait on the loop, see :class:`LongPoll`)."""

    def __init__(self, handler: QueueHandler, poll: LongPoll) -> None:
        self.handler = handler
        self.inline = LoopHandler(handler, poll)
        self.poll = poll

    async def produce(self, request: Any) -> Any:
        return self.inline.produce(request)

    async def asyncProduce(self, request: Any) -> None:
        self.inline.asyncProduce(request)

    async def consume(self, request: Any) -> Any:
        response, deadline = self.poll.consume_now(self.handler.consume, request)
        if deadline:
            response = await self.poll.consume_later(self.handler.consume, request, deadline)
        return response

    async def findClosestIndexByTime(self, request: Any) -> Any:
        return self.handler.findClosestIndexByTime(request)

    async def deleteTopic(self, request: Any) -> Any:
        return self.handler.deleteTopic(request)

    async def getSize(self, request: Any) -> Any:
        return self.handler.getSize(request)


class TransportSocket:
    """The socket methods ``ThriftServer._handle`` and its senders call, on an asyncio
    transport (which buffers what the kernel does not take at once)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def sendall(self, data: Any) -> None:
        self.transport.write(data)

    def sendmsg(self, buffers: list[Any]) -> int:
        # One write per buffer, not writelines: Python 3.11's joins them into a copy.
        # The transport sends at once what the kernel takes and copies only the rest.
        size = 0
        for buffer in buffers:
            self.transport.write(buffer)
            size += len(buffer) if isinstance(buffer, bytes) else memoryview(buffer).nbytes
        return size


class CyConnection(asyncio.Protocol):
    """One connection of the ``asyncio-cy`` model: ``ThriftServer``'s framing, and each frame
    answered by ``ThriftServer._handle`` itself (frame check, Cython decoding, the consume
    path, hand-encoded replies), writing to the transport; produce frames take the
    hand-written path of ``ThriftServer._read_frames`` when it has one. While a long-poll
    consume waits, the connection reads nothing (a Thrift client sends nothing else before
    the reply anyway)."""

    def __init__(self, frames: ThriftServer, handler: LoopHandler, max_frame_bytes: int) -> None:
        self.frames = frames
        self.handler = handler
        self.max_frame = max_frame_bytes
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.sock: TransportSocket | None = None
        self.peer: Any = None
        self.parked = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.sock = TransportSocket(transport)
        self.peer = transport.get_extra_info("peername")

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.parked:
            self._handle_frames()

    def _handle_frames(self) -> None:
        transport, sock = self.transport, self.sock
        assert transport is not None and sock is not None
        handler = self.handler
        buf = self.buf
        pos = 0
        end = len(buf)
        # As ThriftServer._read_frames: consecutive asyncProduce calls to one topic are
        # appended together, flushed before any other call.
        batch = AsyncProduceBatch(handler)
        while end - pos >= 4:
            size = int.from_bytes(buf[pos : pos + 4], "big", signed=True)
            if size <= 0 or size > self.max_frame:
                batch.flush()
                log.warning("closing a connection: frame of %d bytes (limit %d)", size, self.max_frame)
                transport.close()
                return
            if end - pos - 4 < size:
                break
            call = parse_produce_call(buf, pos + 4, pos + 4 + size)
            if call is not None and call[0]:  # asyncProduce
                pos += 4 + size
                batch.add(call[3], call[2])
                continue
            batch.flush()
            if call is not None:  # produce: decoded and answered by hand
                _, seqid, item, topic = call
                pos += 4 + size
                result, index = handler.produce_item(topic, item)
                transport.write(produce_reply_frame(seqid, result, index))
                continue
            frame = bytes(buf[pos + 4 : pos + 4 + size])
            pos += 4 + size
            try:
                ok = self.frames._handle(sock, self.peer, frame)  # type: ignore[arg-type]
            except ParkedConsume as parked:
                _, _, seqid = TCyBinaryProtocol(TCyMemoryBuffer(frame), strict_read=False).read_message_begin()
                self.parked = True
                transport.pause_reading()
                asyncio.get_running_loop().create_task(self._long_poll(seqid, parked))
                break
            if not ok:
                transport.close()
                return
        batch.flush()
        if pos:
            del buf[:pos]

    async def _long_poll(self, seqid: int, parked: ParkedConsume) -> None:
        response = await self.handler.poll.consume_later(parked.consume, parked.request, parked.deadline)
        transport, sock = self.transport, self.sock
        if transport is None or sock is None or transport.is_closing():
            return
        if parked.wire:
            send_parts(sock, luxun.thrift.wire.encode_consume_reply_parts(seqid, response))  # type: ignore
        else:
            send_frame(sock, encode_consume_reply(seqid, response))
        self.parked = False
        transport.resume_reading()
        self._handle_frames()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def announce(model: str, port: int) -> None:
    """The line the benchmark waits for on the serve process's stdout."""
    print(f"serving {model} on {HOST} port {port} pid {os.getpid()}", flush=True)


def serve(model: str, host: str, port: int, data_dir: str) -> int:
    """Serve ``model`` until SIGTERM or SIGINT; then close every topic."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    topics, handler = make_handler(data_dir)
    max_frame = DEFAULT_MAX_MESSAGE_SIZE_BYTES + FRAME_OVERHEAD_BYTES
    try:
        if model == "threads":
            done = threading.Event()
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: done.set())
            server = ThriftServer(QueueService, handler, host, port, max_frame_bytes=max_frame)
            server.start()
            announce(model, server.address[1])
            while not done.wait(1.0):
                pass
            topics.wake_all()
            server.stop()
        elif model == "asyncio-cy":
            asyncio.run(_serve_asyncio_cy(handler, host, port, max_frame))
        elif model == "asyncio-thriftpy2":
            _serve_asyncio_thriftpy2(handler, host, port)
        else:
            raise SystemExit(f"unknown model {model!r}; one of {', '.join(SERVE_MODELS)}")
    finally:
        topics.close()
    return 0


async def _serve_asyncio_cy(handler: QueueHandler, host: str, port: int, max_frame: int) -> None:
    loop = asyncio.get_running_loop()
    inline = LoopHandler(handler, LongPoll())
    # A ThriftServer only for its per-frame code (_handle and its senders); its own
    # listener is closed at once and it is never started.
    frames = ThriftServer(QueueService, inline, host, 0, max_frame_bytes=max_frame)
    frames._listener.close()
    server = await loop.create_server(lambda: CyConnection(frames, inline, max_frame), host, port, backlog=1024)
    done = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, done.set)
    announce("asyncio-cy", server.sockets[0].getsockname()[1])
    await done.wait()
    server.close()


def _serve_asyncio_thriftpy2(handler: QueueHandler, host: str, port: int) -> None:
    # What thriftpy2.rpc.make_aio_server builds, made here because make_aio_server refuses
    # port 0 and has no backlog argument (128 would drop the stall test's 200 connects).
    # client_timeout=None: the default (3 s) bounds a connection's whole life, not a read.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    poll = LongPoll()
    server = TAsyncServer(
        TAsyncProcessor(QueueService, AsyncHandler(handler, poll)),
        TAsyncServerSocket(host=host, port=port, client_timeout=None, backlog=1024),
        iprot_factory=TAsyncBinaryProtocolFactory(),
        itrans_factory=TAsyncFramedTransportFactory(),
        loop=loop,
    )
    server.init_server()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, loop.stop)
    announce("asyncio-thriftpy2", server.trans.raw_sock.getsockname()[1])
    try:
        loop.run_forever()
    finally:
        loop.run_until_complete(server.close())
        tasks = asyncio.all_tasks(loop)  # the connections' handlers
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()


# -- clients (forked processes) ---------------------------------------------------------------
def connect(host: str, port: int) -> Any:
    """A thriftpy2 QueueService client (Cython binary protocol, framed transport, no
    timeout) with TCP_NODELAY on its socket."""
    tsock = TSocket(host, port, socket_timeout=None)
    transport = TCyFramedTransportFactory().get_transport(tsock)
    protocol = TCyBinaryProtocolFactory().get_protocol(transport)
    transport.open()
    tsock.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return TClient(QueueService, protocol)


def result_text(result: Any) -> str:
    code = T.ResultCode._VALUES_TO_NAMES.get(result.resultCode, result.resultCode)
    error = T.ErrorCode._VALUES_TO_NAMES.get(result.errorCode, result.errorCode)
    return f"{code}/{error}: {result.errorMessage}"


def topic_size(client: Any, topic: str) -> int:
    """Items in ``topic``; 0 if it does not exist (yet)."""
    r = client.getSize(T.GetSizeRequest(topic=topic))
    if r.result.resultCode == SUCCESS:
        return int(r.size)
    if r.result.errorCode == E.TOPIC_NOT_EXIST:
        return 0
    raise RuntimeError(f"getSize of {topic!r} failed: {result_text(r.result)}")


Step = Callable[[int], tuple[int, int]]


def make_step(client: Any, spec: dict[str, Any], worker: int, phase: str) -> Step:
    """``step(left)`` does one call (or a chunk of oneway calls, at most ``left`` items) of
    ``spec["workload"]`` and returns (calls, items)."""
    workload = spec["workload"]
    topic = spec["topic"]
    if workload in ("produce", "stall_idle", "stall_waiting"):
        request = T.ProduceRequest(item=spec["item"], topic=topic)
        produce = client.produce

        def produce_step(left: int) -> tuple[int, int]:
            r = produce(request)
            if r.result.resultCode != SUCCESS:
                raise RuntimeError(f"produce to {topic!r} failed: {result_text(r.result)}")
            return 1, 1

        return produce_step
    if workload == "async_produce":
        request = T.ProduceRequest(item=spec["item"], topic=topic)
        async_produce = client.asyncProduce

        def async_step(left: int) -> tuple[int, int]:
            k = min(ASYNC_CHUNK, left)
            for _ in range(k):
                async_produce(request)
            return k, k

        return async_step
    # consume by fanout group; a group that has read the whole topic is replaced by a new one.
    consume = client.consume
    pass_len = spec["topic_items"]
    request = T.ConsumeRequest(topic=topic, maxFetchSize=FETCH_BYTES)
    state = {"passes": 0, "in_pass": 0, "empty": 0}

    def next_group() -> None:
        state["passes"] += 1
        state["in_pass"] = 0
        request.fanoutId = f"{spec['tag']}-{phase}-w{worker}-g{state['passes']}"

    next_group()

    def consume_step(left: int) -> tuple[int, int]:
        r = consume(request)
        code = r.result.resultCode
        if code == SUCCESS:
            n = len(r.itemList)
            state["in_pass"] += n
            state["empty"] = 0
            if state["in_pass"] >= pass_len:
                next_group()
            return 1, n
        if code == TRY_LATER:
            state["empty"] += 1
            if state["empty"] > 2:
                raise RuntimeError(f"group {request.fanoutId!r} of {topic!r} gets nothing: {result_text(r.result)}")
            next_group()
            return 1, 0
        raise RuntimeError(f"consume from {topic!r} failed: {result_text(r.result)}")

    return consume_step


def run_loop(step: Step, count: int, seconds: float) -> tuple[int, int, str]:
    """Call ``step`` until ``count`` items are done or ``seconds`` have passed (the clock is
    read after every step). Returns (calls, items, what stopped the loop)."""
    now = time.perf_counter
    deadline = now() + seconds
    calls = items = 0
    while items < count:
        c, n = step(count - items)
        calls += c
        items += n
        if now() >= deadline and items < count:
            return calls, items, "time"
    return calls, items, "count"


def client_main(spec: dict[str, Any], worker: int, barrier: Any, results: Any) -> None:
    """One client process: connect, warm up, wait for the others, run the timed loop, report."""
    try:
        if spec["cpus"]:
            os.sched_setaffinity(0, spec["cpus"])
        client = connect(spec["host"], spec["port"])
        warm = 0
        if spec["warmup_items"] > 0:
            step = make_step(client, spec, worker, "warm")
            _, warm, _ = run_loop(step, spec["warmup_items"], spec["warmup_seconds"])
            topic_size(client, spec["topic"])  # a round trip: every oneway call was handled before it
        step = make_step(client, spec, worker, "run")
        barrier.wait(BARRIER_TIMEOUT_S)
        t0 = time.perf_counter()
        calls, items, stopped = run_loop(step, spec["count"], spec["seconds"])
        t1 = time.perf_counter()
        results.put(
            {
                "worker": worker,
                "topic": spec["topic"],
                "warmup_items": warm,
                "calls": calls,
                "items": items,
                "stopped_by": stopped,
                "t0": t0,
                "t1": t1,
            }
        )
    except BaseException:
        with contextlib.suppress(Exception):
            barrier.abort()
        results.put({"worker": worker, "error": traceback.format_exc()})


def call_frame(api: str, args: Any, seqid: int = 1) -> bytes:
    """One framed Thrift call message (what a TClient sends for ``api(args)``)."""
    proto = TCyBinaryProtocol(TCyMemoryBuffer())
    proto.write_message_begin(api, TMessageType.CALL, seqid)
    args.write(proto)
    proto.write_message_end()
    body = proto.trans.getvalue()
    return len(body).to_bytes(4, "big") + body


def waiter_main(
    addresses: list[tuple[str, int]],
    topic: str,
    wait_ms: int,
    cpus: list[int] | None,
    ready: Any,
    stop: Any,
    replies: Any,
    results: Any,
) -> None:
    """Open one connection per address, send a long-poll consume on each (``maxWaitMs``,
    index 0 of the empty ``topic``), and send it again whenever a reply comes back,
    until ``stop``. ``replies`` counts the replies, live."""
    socks: list[socket.socket] = []
    try:
        if cpus:
            os.sched_setaffinity(0, cpus)
        request = T.ConsumeRequest(topic=topic, startIndex=0, maxWaitMs=wait_ms)
        frame = call_frame("consume", QueueService.consume_args(consumeRequest=request))
        for address in addresses:
            sock = socket.create_connection(address, timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks.append(sock)
        sel = selectors.DefaultSelector()
        for sock in socks:
            sock.sendall(frame)
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ, bytearray())
        ready.set()
        while not stop.is_set():
            for key, _ in sel.select(0.05):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                buf = key.data
                data = conn.recv(65536)
                if not data:
                    raise RuntimeError("the broker closed a waiting connection")
                buf += data
                while len(buf) >= 4 and len(buf) - 4 >= int.from_bytes(buf[:4], "big"):
                    del buf[: 4 + int.from_bytes(buf[:4], "big")]
                    with replies.get_lock():
                        replies.value += 1
                    conn.setblocking(True)
                    conn.sendall(frame)
                    conn.setblocking(False)
        results.put({"connections": len(socks)})
    except BaseException:
        results.put({"error": traceback.format_exc()})
        ready.set()
    finally:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()


# -- the brokers (subprocesses of this file's --serve) ------------------------------------------
@dataclass
class ServerProcess:
    """One ``--serve`` process."""

    model: str
    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_server(model: str, data_dir: Path, log_path: Path, cpus: list[int] | None) -> ServerProcess:
    """Start ``--serve model`` on a free loopback port (on ``cpus`` if given); wait for its
    announcement."""
    command = [sys.executable, str(Path(__file__).resolve()), "--serve", model, "--port", "0"]
    command += ["--data-dir", str(data_dir)]

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_file, preexec_fn=pin
        )
    assert proc.stdout is not None
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    line = b""
    while not line.endswith(b"\n"):
        if time.monotonic() > deadline or not sel.select(max(0.0, deadline - time.monotonic())):
            proc.kill()
            raise RuntimeError(f"{model} server did not start in {SERVER_START_TIMEOUT_S:.0f} s: {log_text(log_path)}")
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            proc.wait(10)
            raise RuntimeError(f"{model} server exited with {proc.returncode}: {log_text(log_path)}")
        line += chunk
    sel.close()
    words = line.decode().split()
    return ServerProcess(model, proc, int(words[words.index("port") + 1]), data_dir, log_path)


def stop_server(server: ServerProcess) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"  {server.model} server (pid {server.pid}) did not stop; killed", file=sys.stderr)
            server.proc.kill()
            server.proc.wait()
    if server.proc.stdout is not None:
        server.proc.stdout.close()


def log_text(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-4000:]
    return ""


def placement_cpus(placement: str) -> list[int] | None:
    """The CPUs every broker and client process is pinned to: ``same``: the first usable
    one; ``free``: None (the OS places them)."""
    return [min(os.sched_getaffinity(0))] if placement == "same" else None


def source_digests() -> dict[str, str]:
    """SHA-1 (12 hex digits) of the luxun modules every model runs: the work tree may hold
    uncommitted changes (``git describe --dirty`` does not say which)."""
    out = {}
    for name in ("server.py", "service.py", "wire.py", "topics.py"):
        path = REPO / "luxun" / name
        with contextlib.suppress(OSError):
            out[f"luxun/{name}"] = hashlib.sha1(path.read_bytes()).hexdigest()[:12]
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of the processes (all their threads), from /proc."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def memory_bytes(pids: list[int]) -> tuple[int, int]:
    """(VmRSS, RssAnon) of the processes together, from /proc/PID/status. RssAnon leaves
    out the mapped topic pages (file-backed), which come and go with the page cache."""
    rss = anon = 0
    for pid in pids:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) * 1024
                elif line.startswith("RssAnon:"):
                    anon += int(line.split()[1]) * 1024
    return rss, anon


def prefill(data_dir: Path, topics: list[str], items: int, empty_topics: list[str]) -> None:
    """Write ``items`` items of 100 B to each of ``topics`` and create ``empty_topics`` with
    a TopicManager, before the broker starts on ``data_dir``."""
    manager = TopicManager(str(data_dir), data_page_size_bytes=DEFAULT_DATA_PAGE_SIZE_BYTES)
    try:
        item = b"c" * WORKLOAD_INFO["consume"][0]
        for topic in topics:
            queue = manager.get_or_create(topic).queue
            left = items
            while left:
                k = min(left, 10_000)
                queue.enqueue_many([item] * k)
                left -= k
        for topic in empty_topics:
            manager.get_or_create(topic)
    finally:
        manager.close()


@dataclass
class Deployment:
    """One model's broker processes; topic or connection ``i`` goes to broker ``i % len``."""

    model: str
    servers: list[ServerProcess]
    monitors: list[Any] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.servers]

    def server_for(self, i: int) -> ServerProcess:
        return self.servers[i % len(self.servers)]

    def monitor_for(self, i: int) -> Any:
        return self.monitors[i % len(self.monitors)]


# -- runs ----------------------------------------------------------------------------------------
@dataclass
class Run:
    """One timed run of one workload on one model."""

    model: str
    workload: str
    clients: int
    calls: int
    items: int
    seconds: float
    stopped_by: str  # "count", "time", "drain-timeout" (async_produce: not every item arrived)
    broker_cpu_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ops(self) -> int:
        """What the rate counts: calls for the produce workloads, items for the others."""
        return self.items if WORKLOAD_INFO[self.workload][1] == "items/s" else self.calls

    @property
    def rate(self) -> float:
        """calls/s for the produce workloads, items/s for the others."""
        return self.ops / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Row:
    """The median run of a (model, workload, clients) cell over the repeats."""

    model: str
    workload: str
    clients: int
    rate: float
    unit: str
    spread: float
    broker_cpu_s: float
    median_run: dict[str, Any]
    rates: list[float]
    #: Median over the repeats of the brokers' CPU microseconds per call (produce rows) or item.
    cpu_us_per_op: float
    #: stall_waiting: the first repeat's memory figures (bytes) and replies to the waiters
    #: (later repeats reuse a heap the other workloads grew, hiding small per-connection
    #: costs), plus ``long_poll_waits``: every repeat's waiters waited;
    #: replies the waiting connections got; None for the other workloads.
    memory: dict[str, float] | None = None


class Bench:
    """Runs the workloads on the deployments."""

    def __init__(self, args: argparse.Namespace, deployments: dict[str, Deployment]) -> None:
        self.args = args
        self.deployments = deployments
        self.rep = 0  # the repeat being run (names topics and groups)

    def settle(self, dep: Deployment) -> None:
        """Wait (bounded) until the brokers are idle: creating a topic leaves page allocation
        and read-ahead behind that must not land in the timed run."""
        deadline = time.perf_counter() + self.args.settle_max_s
        quiet = 0
        before = cpu_seconds(dep.pids)
        while quiet < 2 and time.perf_counter() < deadline:
            time.sleep(SETTLE_SAMPLE_S)
            now = cpu_seconds(dep.pids)
            quiet = quiet + 1 if now - before <= SETTLE_IDLE_CPU * SETTLE_SAMPLE_S * len(dep.pids) else 0
            before = now

    def run_clients(self, dep: Deployment, specs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float, float]:
        """Run one forked client per spec, released together by a barrier. Returns the
        reports, and the brokers' CPU seconds and the time when the barrier opened."""
        ctx = mp.get_context("fork")
        barrier = ctx.Barrier(len(specs) + 1)
        results = ctx.Queue()
        sys.stdout.flush()
        sys.stderr.flush()
        procs = [
            ctx.Process(target=client_main, args=(s, i, barrier, results), daemon=True) for i, s in enumerate(specs)
        ]
        for p in procs:
            p.start()
        timeout_s = BARRIER_TIMEOUT_S + self.args.warmup_seconds + self.args.seconds + 60
        try:
            barrier.wait(BARRIER_TIMEOUT_S)
            cpu0 = cpu_seconds(dep.pids)
            t0 = time.perf_counter()
        except Exception:
            cpu0 = t0 = 0.0  # a client failed before the barrier: its report says why
        out = collect_reports(procs, results, timeout_s, "client")
        return sorted(out, key=lambda r: r["worker"]), cpu0, t0

    def spec(self, dep: Deployment, i: int, clients: int, workload: str, topic: str, count: int) -> dict[str, Any]:
        server = dep.server_for(i)
        args = self.args
        return {
            "host": HOST,
            "port": server.port,
            "workload": workload,
            "topic": topic,
            "item": b"p" * WORKLOAD_INFO[workload][0],
            "count": count,
            "seconds": args.seconds,
            "warmup_items": args.warmup_items,
            "warmup_seconds": args.warmup_seconds,
            "topic_items": args.prefill_items,
            "tag": f"r{self.rep}-{workload}-x{clients}",
            "cpus": placement_cpus(args.placement),
        }

    def create_topics(self, dep: Deployment, topics: list[tuple[int, str]], item: bytes) -> None:
        for i, topic in topics:
            r = dep.monitor_for(i).produce(T.ProduceRequest(item=item, topic=topic))
            if r.result.resultCode != SUCCESS:
                raise RuntimeError(f"creating topic {topic!r} failed: {result_text(r.result)}")

    def delete_topics(self, dep: Deployment, topics: list[tuple[int, str]]) -> None:
        for i, topic in topics:
            r = dep.monitor_for(i).deleteTopic(T.DeleteTopicRequest(topic=topic, password=PASSWORD))
            if r.result.resultCode != SUCCESS:
                print(f"  (could not delete topic {topic!r}: {result_text(r.result)})", file=sys.stderr)

    def write_run(self, dep: Deployment, workload: str, clients: int) -> Run:
        """produce / async_produce / stall_* by ``clients`` processes into fresh topics,
        deleted afterwards."""
        args = self.args
        topics = [(i, f"{workload}-r{self.rep}-c{i}") for i in range(clients)]
        item = b"p" * WORKLOAD_INFO[workload][0]
        total = args.async_items if workload == "async_produce" else args.produce_calls
        specs = [self.spec(dep, i, clients, workload, topic, max(1, int(total) // clients)) for i, topic in topics]
        try:
            self.create_topics(dep, topics, item)
            os.sync()
            self.settle(dep)
            reports, cpu0, _ = self.run_clients(dep, specs)
            start = min(r["t0"] for r in reports)
            end = max(r["t1"] for r in reports)
            stopped = "time" if any(r["stopped_by"] == "time" for r in reports) else "count"
            calls = sum(r["calls"] for r in reports)
            items = sum(r["items"] for r in reports)
            extra: dict[str, Any] = {}
            if workload == "async_produce":
                # Every item sent; the run ends when getSize shows them all (bounded).
                expected = {topic: 1 for _, topic in topics}
                for r in reports:
                    expected[r["topic"]] += r["warmup_items"] + r["items"]
                send_end = end
                deadline = time.perf_counter() + args.drain_seconds
                while True:
                    sizes = {t: topic_size(dep.monitor_for(i), t) for i, t in topics}
                    end = time.perf_counter()
                    if all(sizes[t] >= n for t, n in expected.items()):
                        break
                    if end >= deadline:
                        stopped = "drain-timeout"
                        missing = sum(max(0, n - sizes[t]) for t, n in expected.items())
                        items -= missing
                        calls -= missing
                        extra["missing_items"] = missing
                        break
                    time.sleep(0.001)
                extra["send_seconds"] = send_end - start
                extra["drain_seconds"] = end - send_end
            cpu = cpu_seconds(dep.pids) - cpu0
            return Run(dep.model, workload, clients, calls, items, end - start, stopped, cpu, extra)
        finally:
            self.delete_topics(dep, topics)

    def consume_run(self, dep: Deployment, clients: int) -> Run:
        """consume by fanout group, 1 MiB fetches, from the prefilled topics (new groups)."""
        specs = [
            self.spec(dep, i, clients, "consume", CONSUME_TOPIC.format(i), max(1, self.args.consume_items // clients))
            for i in range(clients)
        ]
        self.settle(dep)
        reports, cpu0, _ = self.run_clients(dep, specs)
        start = min(r["t0"] for r in reports)
        end = max(r["t1"] for r in reports)
        return Run(
            dep.model,
            "consume",
            clients,
            sum(r["calls"] for r in reports),
            sum(r["items"] for r in reports),
            end - start,
            "time" if any(r["stopped_by"] == "time" for r in reports) else "count",
            cpu_seconds(dep.pids) - cpu0,
        )

    def stall_runs(self, dep: Deployment) -> list[Run]:
        """One producer alone, then the same with ``--waiters`` connections blocked in a
        long-poll consume of another topic; the brokers' RSS before and with the waiters."""
        args = self.args
        idle = self.write_run(dep, "stall_idle", 1)
        rss_idle, anon_idle = memory_bytes(dep.pids)
        ctx = mp.get_context("fork")
        ready, stop = ctx.Event(), ctx.Event()
        replies = ctx.Value("l", 0)
        results = ctx.Queue()
        addresses = [(HOST, dep.server_for(j).port) for j in range(args.waiters)]
        wait_topic = WAIT_TOPIC.format(self.rep)
        waiter = ctx.Process(
            target=waiter_main,
            args=(addresses, wait_topic, args.wait_ms, placement_cpus(args.placement), ready, stop, replies, results),
        )
        waiter.daemon = True
        t_open = time.perf_counter()
        waiter.start()
        try:
            if not ready.wait(BARRIER_TIMEOUT_S):
                raise RuntimeError(f"{args.waiters} waiting connections not open in {BARRIER_TIMEOUT_S:.0f} s")
            time.sleep(WAITERS_SETTLE_S)
            replies_at_rss = replies.value
            rss_waiting, anon_waiting = memory_bytes(dep.pids)
            waiting = self.write_run(dep, "stall_waiting", 1)
            replies_total = replies.value
            elapsed = time.perf_counter() - t_open
        finally:
            stop.set()
            waiter.join(10)
            if waiter.is_alive():
                waiter.kill()
                waiter.join()
            # The connections are closed; end their parked calls now (an item wakes them),
            # rather than at their deadline, in the middle of the next run.
            for b in range(len(dep.servers)):
                dep.monitor_for(b).produce(T.ProduceRequest(item=b"w", topic=wait_topic))
            self.settle(dep)
        try:
            report = results.get(timeout=10)
        except Exception:  # queue.Empty
            report = {"error": "the waiter process did not report"}
        if "error" in report:
            raise RuntimeError("the waiting connections failed:\n" + report["error"])
        waited = replies_at_rss == 0
        waiting.extra |= {
            "waiters": args.waiters,
            "wait_ms": args.wait_ms,
            "rss_idle_bytes": rss_idle,
            "rss_waiting_bytes": rss_waiting,
            "rss_per_waiter_bytes": (rss_waiting - rss_idle) / args.waiters,
            "anon_idle_bytes": anon_idle,
            "anon_waiting_bytes": anon_waiting,
            "anon_per_waiter_bytes": (anon_waiting - anon_idle) / args.waiters,
            # Replies to the waiting consumes: none is expected before wait_ms; any within
            # WAITERS_SETTLE_S means the model answers long polls at once (does not wait).
            "waiter_replies_before_rss": replies_at_rss,
            "waiter_replies_during_run": replies_total - replies_at_rss,
            "waiters_open_seconds": elapsed,
            "long_poll_waits": waited,
        }
        return [idle, waiting]


def median_row(runs: list[Run]) -> Row:
    ranked = sorted(runs, key=lambda r: r.rate)
    mid = ranked[(len(ranked) - 1) // 2]
    rates = [r.rate for r in runs]
    memory = None
    if mid.workload == "stall_waiting":
        first = runs[0].extra
        memory = {k: v for k, v in first.items() if k.endswith("_bytes") or k.startswith("waiter_replies")}
        memory["long_poll_waits"] = all(r.extra["long_poll_waits"] for r in runs)
    return Row(
        model=mid.model,
        workload=mid.workload,
        clients=mid.clients,
        rate=mid.rate,
        unit=WORKLOAD_INFO[mid.workload][1],
        spread=(max(rates) - min(rates)) / mid.rate if len(rates) > 1 and mid.rate > 0 else 0.0,
        broker_cpu_s=mid.broker_cpu_s,
        median_run={**asdict(mid), "rate": mid.rate},
        rates=rates,
        cpu_us_per_op=sorted(r.broker_cpu_s / r.ops * 1e6 if r.ops else 0.0 for r in runs)[(len(runs) - 1) // 2],
        memory=memory,
    )


def log_run(r: Run, rep: int) -> None:
    unit = WORKLOAD_INFO[r.workload][1]
    more = ""
    if "rss_waiting_bytes" in r.extra:
        x = r.extra
        more = (
            f", VmRSS {x['rss_idle_bytes'] / MIB:.1f} -> {x['rss_waiting_bytes'] / MIB:.1f} MiB (anon "
            f"{x['anon_idle_bytes'] / MIB:.1f} -> {x['anon_waiting_bytes'] / MIB:.1f}) with {x['waiters']} "
            f"waiting ({x['waiter_replies_before_rss']} early replies)"
        )
    print(
        f"  [{rep + 1}] {r.model:<18} {r.workload:<14} x{r.clients}: {fmt_rate(r.rate)} {unit} "
        f"({r.items} items, {r.seconds:.2f} s, stopped by {r.stopped_by}, broker CPU {r.broker_cpu_s:.2f} s){more}",
        file=sys.stderr,
        flush=True,
    )


# -- report --------------------------------------------------------------------------------------
def table_rows(args: argparse.Namespace) -> list[tuple[str, int]]:
    rows: list[tuple[str, int]] = []
    for workload in args.workloads:
        if workload == "stall":
            rows += [("stall_idle", 1), ("stall_waiting", 1)]
        else:
            rows += [(workload, c) for c in args.clients]
    return rows


def render(machine: dict[str, Any], args: argparse.Namespace, rows: dict[tuple[str, str, int], Row]) -> str:
    models = args.models
    width = max(19, *(len(m) + 1 for m in models))
    out = [
        "== broker server models: the same QueueHandler/TopicManager, clients in separate processes ==",
        f"machine: {machine['cpu']}, {machine['cores']} cores ({machine['cores_usable']} usable), "
        f"{machine['ram_gib']} GiB RAM; {machine['os']}, Linux {machine['kernel']}",
        f"python {machine['python']}, thriftpy2 {machine['thriftpy2']}; git {machine['git_commit']} ("
        + ", ".join(f"{k} {v}" for k, v in machine["luxun_sources"].items())
        + ")",
        f"load average (1, 5, 15 min) at start {machine['load_average_start']}, at end {machine['load_average_end']}",
        f"data dir {machine['data_dir']} ({machine['data_dir_filesystem']}); placement: {args.placement}",
        "calls: threads, processes and asyncio-cy run ThriftServer's per-frame code (with its hand-written "
        "produce path); asyncio-thriftpy2 decodes every call with its pure-Python protocol",
        f"each cell: median of {args.repeat} run(s), +-spread = (max - min) / median; a run stops at its item "
        f"count or after {args.seconds:g} s",
        "broker CPU: the median run's CPU seconds (all broker processes, all threads) and the median CPU "
        "microseconds per op (a call for produce rows, an item for the others)",
        "",
    ]
    label_w = 36

    def header(title: str) -> None:
        out.append(f"{title:<{label_w}} {'clients':>7} " + " ".join(f"{m:>{width}}" for m in models))

    header("workload (rate)")
    for workload, clients in table_rows(args):
        label = f"{WORKLOAD_INFO[workload][2]} ({WORKLOAD_INFO[workload][1]})"
        if workload == "stall_waiting":
            label = label.replace("N waiting", f"{args.waiters} waiting")
        cells = []
        for m in models:
            row = rows.get((m, workload, clients))
            if row is None:
                cells.append("-")
            elif row.memory is not None and not row.memory["long_poll_waits"]:
                cells.append("n/a (no wait)")
            else:
                spread = f" +-{row.spread * 100:.0f}%" if len(row.rates) > 1 else ""
                cells.append(f"{fmt_rate(row.rate)}{spread}")
        out.append(f"{label:<{label_w}} {clients:>7} " + " ".join(f"{c:>{width}}" for c in cells))
    out.append("")
    header("broker CPU: s per run, us per op")
    for workload, clients in table_rows(args):
        cells = []
        for m in models:
            row = rows.get((m, workload, clients))
            if row is None:
                cells.append("-")
            else:
                us = row.cpu_us_per_op
                cells.append(f"{row.broker_cpu_s:.2f} s, {us:.{1 if us < 10 else 0}f} us")
        label = WORKLOAD_INFO[workload][2].replace("N waiting", f"{args.waiters} waiting")
        out.append(f"{label:<{label_w}} {clients:>7} " + " ".join(f"{c:>{width}}" for c in cells))
    if "stall" in args.workloads:
        out.append("")
        header(f"memory, {args.waiters} waiting (1st repeat)")
        lines: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
            ("broker VmRSS, no waiters (MiB)", lambda x: f"{x['rss_idle_bytes'] / MIB:.1f}"),
            (f"broker VmRSS, {args.waiters} waiting (MiB)", lambda x: f"{x['rss_waiting_bytes'] / MIB:.1f}"),
            (
                "per waiting conn: VmRSS/anon (KiB)",
                lambda x: f"{x['rss_per_waiter_bytes'] / 1024:.1f} / {x['anon_per_waiter_bytes'] / 1024:.1f}",
            ),
            (
                "replies to waiters (early/in run)",
                lambda x: f"{x['waiter_replies_before_rss']:.0f}/{x['waiter_replies_during_run']:.0f}",
            ),
        ]
        for label, fmt in lines:
            cells = []
            for m in models:
                row = rows.get((m, "stall_waiting", 1))
                cells.append("-" if row is None or row.memory is None else fmt(row.memory))
            out.append(f"{label:<{label_w}} {1:>7} " + " ".join(f"{c:>{width}}" for c in cells))
    if "processes" in models:
        out.append("")
        out.append(
            "processes: two threads brokers, client i on broker i % 2 (1 client uses one broker); its CPU and RSS are "
            "both brokers' sums"
        )
    return "\n".join(out)


# -- main ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default {','.join(MODELS)})")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated (default {','.join(WORKLOADS)})")
    p.add_argument(
        "--clients", default="1,4", help="client process counts of produce, async_produce, consume (default 1,4)"
    )
    p.add_argument("--waiters", type=int, default=200, help="stall: connections blocked in a long poll (default 200)")
    p.add_argument("--wait-ms", type=int, default=5000, help="stall: their ConsumeRequest.maxWaitMs (default 5000)")
    for name, (full, quick, text) in BUDGETS.items():
        fmt = "g" if isinstance(full, float) else ","
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=type(full),
            default=None,
            help=f"{text} (default {full:{fmt}}; --quick {quick:{fmt}})",
        )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="bench: a temporary folder is made inside it (default: the system temp dir) and removed at the end;\n"
        "--serve: the broker's data directory",
    )
    p.add_argument(
        "--json", type=Path, default=REPO / "perf" / "results" / "bench_server_models.json", help="results file"
    )
    p.add_argument(
        "--placement",
        choices=("free", "same"),
        default="free",
        help="free: the OS places brokers and clients (default); same: all on the first CPU (sync calls\n"
        "then cost ~35 us instead of ~110-130 us across vCPUs, and processes cannot use a second core)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: small budgets, 1 repeat")
    p.add_argument("--serve", choices=SERVE_MODELS, help="run one server model until SIGTERM (used by the bench)")
    p.add_argument("--port", type=int, default=0, help="--serve: port on 127.0.0.1 (0: a free one, printed)")
    args = p.parse_args(argv)
    for name, (full, quick, _) in BUDGETS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.models = [m for m in args.models.split(",") if m]
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.clients = [int(c) for c in args.clients.split(",") if c]
    for m in args.models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; one of {', '.join(MODELS)}")
    for w in args.workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}; one of {', '.join(WORKLOADS)}")
    if args.seconds <= 0 or args.repeat < 1 or args.waiters < 1 or not args.clients or min(args.clients) < 1:
        p.error("--seconds, --repeat, --waiters and --clients must be positive")
    return args


@contextlib.contextmanager
def deployments(args: argparse.Namespace, root: Path) -> Iterator[dict[str, Deployment]]:
    """Prefill each model's data directories and start its broker processes; stop them all
    at the end."""
    out: dict[str, Deployment] = {}
    consume_topics = max(args.clients) if "consume" in args.workloads else 0
    try:
        t = time.perf_counter()
        for model in args.models:
            n = MODEL_PROCESSES[model]
            dep = Deployment(model, [])
            out[model] = dep
            for b in range(n):
                data_dir = root / f"{model}-{b}"
                consume = [CONSUME_TOPIC.format(i) for i in range(b, consume_topics, n)]
                prefill(data_dir, consume, args.prefill_items, [WAIT_TOPIC.format(r) for r in range(args.repeat)])
                serve_model = "threads" if model == "processes" else model
                log_path = root / f"{model}-{b}.log"
                dep.servers.append(start_server(serve_model, data_dir, log_path, placement_cpus(args.placement)))
                dep.monitors.append(connect(HOST, dep.servers[-1].port))
        print(
            f"  prefilled {consume_topics} consume topic(s) x {args.prefill_items:,} items per model and started "
            f"{sum(len(d.servers) for d in out.values())} broker processes in {time.perf_counter() - t:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        yield out
    finally:
        for dep in out.values():
            for monitor in dep.monitors:
                with contextlib.suppress(Exception):
                    monitor.close()
            for server in dep.servers:
                stop_server(server)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        if args.data_dir is None:
            raise SystemExit("--serve needs --data-dir")
        return serve(args.serve, HOST, args.port, str(args.data_dir))
    started = time.perf_counter()
    machine = machine_info(
        args.data_dir,
        thriftpy2=importlib.metadata.version("thriftpy2"),
        luxun_sources=source_digests(),
    )
    root = Path(tempfile.mkdtemp(prefix="bench_server_models-", dir=args.data_dir))
    runs: dict[tuple[str, str, int], list[Run]] = {}
    try:
        with deployments(args, root) as deps:
            bench = Bench(args, deps)
            for rep in range(args.repeat):
                bench.rep = rep
                # The stall test first: its memory figures then start from a heap that the
                # other workloads' big buffers have not grown yet (in the first repeat).
                for workload in sorted(args.workloads, key=lambda w: w != "stall"):
                    for clients in [1] if workload == "stall" else args.clients:
                        for model in args.models:
                            dep = deps[model]
                            if workload == "consume":
                                got = [bench.consume_run(dep, clients)]
                            elif workload == "stall":
                                got = bench.stall_runs(dep)
                            else:
                                got = [bench.write_run(dep, workload, clients)]
                            for r in got:
                                log_run(r, rep)
                                runs.setdefault((model, r.workload, r.clients), []).append(r)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    machine["load_average_end"] = load_average()
    rows = {key: median_row(rs) for key, rs in runs.items()}
    print(render(machine, args, rows))
    elapsed = time.perf_counter() - started
    print(f"\n(total {elapsed:.0f} s)", file=sys.stderr)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("serve", "port")}
    doc = {
        "machine": machine,
        "config": config,
        "elapsed_seconds": elapsed,
        "workloads": {k: {"item_bytes": v[0], "unit": v[1], "label": v[2]} for k, v in WORKLOAD_INFO.items()},
        "rows": [asdict(r) for r in rows.values()],
        "runs": [{**asdict(r), "rate": r.rate} for rs in runs.values() for r in rs],
    }
    args.json.write_text(json.dumps(doc, indent=1))
    print(f"(JSON: {args.json})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
