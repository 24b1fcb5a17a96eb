"""Benchmark the luxun broker over Thrift (QueueService, framed transport, binary protocol).

A program, not a test::

    .venv/bin/python perf/bench_broker.py            # full run (~5 min on 2 cores)
    .venv/bin/python perf/bench_broker.py --quick    # smoke run (~30 s; with --java --floor ~3-4 min)
    .venv/bin/python perf/bench_broker.py --java .peers/luxun-java --floor   # against Java Luxun, ABBA
    .venv/bin/python perf/bench_broker.py --workloads produce --sizes 100 --placement split
    .venv/bin/python perf/bench_broker.py --broker 127.0.0.1:9092 --password secret
    .venv/bin/python perf/bench_broker.py --help

It starts its own broker (``python -m luxun.cli serve``) on 127.0.0.1, on a free port,
with a temporary data directory that is removed afterwards, and stops it with SIGTERM;
``--broker host:port`` uses a running broker instead.

``--java PATH`` (the Java Luxun 0.6.2 build, ../shared/peers/luxun-java/README.md) runs the
Java broker too, in the same run: per item size, the brokers take turns in ABBA order
(ours, Java, Java, ours; ``--rounds`` repeats it), each started fresh on a new data dir
and warmed up, with the same client code and the same workloads. Each side's figure for a
cell is the median of its passes, with their spread and the broker's CPU per call; the
table shows ours, Java's and the ratios (ours / Java), the JSON every run of both.
``--floor`` adds the floor of a call: the same client, in the one-item-per-call workloads
(produce, group_single, index_single) and in async_produce, against servers with an empty
handler that answer canned replies (a raw socket thread per connection, the same work in
one thread waiting in epoll for all connections, and thriftpy2's threaded server) and only
count oneway calls, in the same turns. With ``--java`` too, each floor's own ratio to Java
is shown: a cell whose floor is under the
target is one that a server doing nothing, the same way, does not reach.

Workloads, per item size (``--sizes``) and per number of client processes
(``--clients``; every client is its own process with its own connection):

==============  ======================================================================
produce         sync ``produce``, one item per call
async_produce   oneway ``asyncProduce``; timed from the first send until every item has
                arrived (getSize polled from another connection until it reaches the
                expected count); then every item is read back and checked (client,
                sequence number, contents), and only the checked ones are counted
group_fetch     ``consume`` by fanout group, ``maxFetchSize`` = 1 MiB
group_single    ``consume`` by fanout group, ``maxFetchSize`` = 0 (one item per call)
index_fetch     ``consume`` by ``startIndex``, ``maxFetchSize`` = 1 MiB
index_single    ``consume`` by ``startIndex``, ``maxFetchSize`` = 0 (one item per call)
==============  ======================================================================

Topics (``--topics``): ``own`` (default) gives every client its own topic, so clients
share nothing but the broker; ``shared`` puts all clients on one topic: producers
append to it, and each consumer reads the whole topic with its own fanout group (or
its own index), as Luxun's fanout consumers do.

Consume workloads read topics pre-filled (with asyncProduce) once per item size and
shared by the four consume workloads, so reads come from the page cache. A consumer
that reaches the end of its topic starts again from the tail: by group with a fresh
group name (a new group starts at the tail), by index by going back to the tail.

Every client warms up (untimed) before a barrier; then every loop stops at an item
count, a byte budget or a number of seconds, whichever comes first. Rates come from
what was done, over the span from the first client's start to the last client's end
(for async_produce: to the moment getSize saw every item).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import multiprocessing as mp
import os
import secrets
import select
import shlex
import socket
import statistics
import struct
import sys
import threading
import time
import traceback
from array import array
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _common import (  # noqa: E402
    BrokerInfo,
    JavaPeer,
    collect_reports,
    default_java_peer,
    external_broker,
    fmt_rate,
    free_port,
    java_broker,
    java_version,
    load_average,
    machine_info,
    own_broker,
    port_answers,
)
from thriftpy2.protocol import TCyBinaryProtocolFactory  # noqa: E402
from thriftpy2.thrift import TApplicationException, TClient, TMessageType, TProcessor  # noqa: E402
from thriftpy2.transport import TCyFramedTransportFactory, TCyMemoryBuffer, TServerSocket, TSocket  # noqa: E402

from idl import QueueService  # noqa: E402
from idl import luxun_thrift as T  # noqa: E402

MIB = 1 << 20
MB = 1_000_000
SUCCESS = T.ResultCode.SUCCESS
TRY_LATER = T.ResultCode.TRY_LATER

DEFAULT_SIZES = "100,1000,10000,100000"
DEFAULT_CLIENTS = "1,4"
QUICK_SIZES = "100,100000"
#: async_produce stamps each item with (client, sequence number) in its first bytes.
STAMP = struct.Struct(">II")
#: From a client socket's TCP_INFO (struct tcp_info, linux/tcp.h; Linux 4.19+): data
#: segments sent (u32 at 156), time its sends waited for the receiver's window (u64 us at
#: 176), bytes sent (u64 at 200).
TCP_SEND_INFO = struct.Struct("=156xI16xQ16xQ")
DEFAULT_FETCH_BYTES = MIB
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "bench_broker.json"
#: Oneway calls sent between two reads of the clock.
ASYNC_CHUNK = 64
#: Before a run the broker counts as idle after two samples of this many seconds in which it
#: used at most this share of a CPU; waiting for it stops after SETTLE_MAX_S anyway.
SETTLE_SAMPLE_S = 0.1
SETTLE_IDLE_CPU = 0.05
SETTLE_MAX_S = 5.0
#: Most consumer groups a client creates before a timed group_* run.
MAX_PRECREATED_GROUPS = 200
#: Seconds a client may take to connect and warm up before the barrier gives up.
BARRIER_TIMEOUT_S = 120.0
#: Seconds allowed for the broker to start and to stop.

WRITE_WORKLOADS = ("produce", "async_produce")
CONSUME_WORKLOADS = ("group_fetch", "group_single", "index_fetch", "index_single")
WORKLOADS = WRITE_WORKLOADS + CONSUME_WORKLOADS
WORKLOAD_TEXT = {
    "produce": "sync produce, one item per call",
    "async_produce": "oneway asyncProduce, end to end: first send -> getSize sees every item; "
    "only the items read back and checked count",
    "group_fetch": "consume by fanout group, maxFetchSize 1 MiB",
    "group_single": "consume by fanout group, maxFetchSize 0 (one item per call)",
    "index_fetch": "consume by startIndex, maxFetchSize 1 MiB",
    "index_single": "consume by startIndex, maxFetchSize 0 (one item per call)",
}

#: name -> (full run, --quick run) for the budget options.
BUDGETS: dict[str, tuple[float, float]] = {
    "seconds": (3.0, 0.5),
    "items": (5_000_000, 300_000),
    "max_mb": (4096, 512),
    "warmup_seconds": (0.5, 0.1),
    "warmup_items": (20_000, 2_000),
    "prefill_items": (200_000, 20_000),
    "prefill_mb": (64, 8),
    "drain_seconds": (30.0, 10.0),
    "repeat": (1, 1),
    "rounds": (1, 1),
    "broker_warmup_seconds": (1.0, 0.2),
}

#: The brokers compared: ours, the Java Luxun build (--java), the empty-handler floors (--floor).
FLOOR_SIDES = ("floor-raw", "floor-epoll", "floor-thriftpy2", "floor-c")
#: The workloads run against the floors: one item per sync call (floor_responses: their replies),
#: and oneway asyncProduce (the floor counts the calls it read per topic; getSize answers that count).
FLOOR_WORKLOADS = ("produce", "async_produce", "group_single", "index_single")
#: floor-c answers sync calls only (its getSize answers the prefill count: no oneway counts).
FLOOR_C_WORKLOADS = ("produce", "group_single", "index_single")
#: Our broker with busy polling off (--no-poll-side): what busy polling buys, and costs in CPU.
NO_POLL_SIDE = "ours-nopoll"
SIDE_TEXT = {
    "ours": "luxun (python -m luxun.cli serve)",
    NO_POLL_SIDE: "luxun with busy.poll.us=0: no busy polling after a reply",
    "java": "Java Luxun 0.6.2 (com.leansoft.luxun.Luxun, thrift TNonblockingServer)",
    "floor-raw": "floor: a Python socket thread per connection that answers each call frame with the canned "
    "reply of its method, the call's seqid copied in (reads type, name and seqid; no other decoding, no handler); "
    "oneway calls are only counted, under the topic of the connection's first one; getSize answers that count",
    "floor-epoll": "floor: floor-raw's work in one Python thread for all connections, waiting in epoll for any "
    "to send (no thread hand-offs)",
    "floor-thriftpy2": "floor: thriftpy2 TThreadedServer (Cython binary protocol, framed, TCP_NODELAY) whose "
    "handler returns a constant response per method; asyncProduce only counts per topic, getSize answers that count",
    "floor-c": "floor: floor-raw's work in C (perf/floor_c.c, cc -O2): a thread per connection, blocking recv, "
    "canned replies with the call's seqid; no interpreter at all, so what is left is the kernel's part of a call; "
    "sync calls only",
}
#: Issue 33's rate target, ours / Java per cell (medians): every 1-connection cell >= 1.0x.
RATIO_TARGETS = {1: 1.0}
#: Issue 33's CPU target: the broker's CPU per call <= Java's, for these workloads at these
#: sizes (a small call), at 1 and 4 clients.
CPU_TARGET_WORKLOADS = ("produce", "group_single", "index_single")
CPU_TARGET_MAX_SIZE = 10_000

#: The earlier absolute targets: (label, workload, size, metric, goal). Judged on 1 client.
TARGETS: list[tuple[str, str, int, str, float]] = [
    ("sync produce 100 B >= 25 k calls/s", "produce", 100, "calls_per_s", 25e3),
    ("asyncProduce 1 KB >= 120 k items/s", "async_produce", 1000, "items_per_s", 120e3),
    ("asyncProduce 100 KB >= 300 MB/s", "async_produce", 100_000, "mb_per_s", 300.0),
    ("consume 100 B, 1 MiB fetches, by group >= 2 M items/s", "group_fetch", 100, "items_per_s", 2e6),
    ("consume 100 B, 1 MiB fetches, by index >= 2 M items/s", "index_fetch", 100, "items_per_s", 2e6),
    ("consume 100 KB, 1 MiB fetches, by group >= 900 MB/s", "group_fetch", 100_000, "mb_per_s", 900.0),
    ("consume 100 KB, 1 MiB fetches, by index >= 900 MB/s", "index_fetch", 100_000, "mb_per_s", 900.0),
]


# -- client --------------------------------------------------------------------------------
def connect(host: str, port: int) -> tuple[Any, socket.socket]:
    """A thriftpy2 QueueService client (Cython binary protocol, framed transport, no timeout),
    with TCP_NODELAY on its socket (thriftpy2 0.7.1 sets it; checked, and set if not)."""
    tsock = TSocket(host, port, socket_timeout=None)
    transport = TCyFramedTransportFactory().get_transport(tsock)
    protocol = TCyBinaryProtocolFactory().get_protocol(transport)
    transport.open()
    sock = tsock.sock
    if not sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return TClient(QueueService, protocol), sock


def tcp_send_counts(sock: socket.socket) -> tuple[int, int, int] | None:
    """(data segments sent, bytes sent, us its sends waited for the receiver's window) of a
    TCP socket, or None where TCP_INFO has no such fields (not Linux, or before 4.19)."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except (OSError, AttributeError):
        return None
    if len(raw) < TCP_SEND_INFO.size:
        return None
    segments, rwnd_limited_us, sent = TCP_SEND_INFO.unpack_from(raw)
    return segments, sent, rwnd_limited_us


def result_text(result: Any) -> str:
    code = T.ResultCode._VALUES_TO_NAMES.get(result.resultCode, result.resultCode)
    error = T.ErrorCode._VALUES_TO_NAMES.get(result.errorCode, result.errorCode)
    return f"{code}/{error}: {result.errorMessage}"


def topic_size(client: Any, topic: str) -> int:
    """Items in ``topic``; 0 if it does not exist (yet)."""
    r = client.getSize(T.GetSizeRequest(topic=topic))
    if r.result.resultCode == SUCCESS:
        return int(r.size)
    if r.result.errorCode == T.ErrorCode.TOPIC_NOT_EXIST:
        return 0
    raise RuntimeError(f"getSize of {topic!r} failed: {result_text(r.result)}")


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads), from /proc."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- one client's loops ---------------------------------------------------------------------
Step = Callable[[int], tuple[int, int]]


def make_step(client: Any, spec: dict[str, Any], worker: int, phase: str, sent: list[int] | None = None) -> Step:
    """One client's unit of work for ``spec["workload"]``: ``step(left)`` does one call (or a
    chunk of oneway calls, at most ``left`` items) and returns (calls, items).

    async_produce stamps every item with (``worker``, sequence number) in its first 8 bytes;
    ``sent[0]`` is the next sequence number, kept across the warm-up and the timed run."""
    workload = spec["workload"]
    topic = spec["topic"]
    if workload in ("produce", "async_produce", "prefill"):
        request = T.ProduceRequest(item=spec["item"], topic=topic)
        if workload == "produce":
            produce = client.produce

            def produce_step(left: int) -> tuple[int, int]:
                r = produce(request)
                if r.result.resultCode != SUCCESS:
                    raise RuntimeError(f"produce to {topic!r} failed: {result_text(r.result)}")
                return 1, 1

            return produce_step
        async_produce = client.asyncProduce
        if workload == "prefill":

            def prefill_step(left: int) -> tuple[int, int]:
                k = min(ASYNC_CHUNK, left)
                for _ in range(k):
                    async_produce(request)
                return k, k

            return prefill_step
        stamped = bytearray(spec["item"])  # written into the frame before each call returns
        request.item = stamped
        stamp = STAMP.pack_into
        seq = sent if sent is not None else [0]

        def async_step(left: int) -> tuple[int, int]:
            k = min(ASYNC_CHUNK, left)
            first = seq[0]
            for i in range(first, first + k):
                stamp(stamped, 0, worker, i)
                async_produce(request)
            seq[0] = first + k
            return k, k

        return async_step

    consume = client.consume
    fetch = spec["fetch_bytes"]
    tail, head = spec["tail"], spec["head"]
    empty_in_a_row = 0
    if workload.startswith("group"):
        # A group that has read the whole topic is replaced by a new one (a new group starts
        # at the tail). Creating a group costs the broker a directory and a file (~0.5 ms), so
        # the timed run's groups are created before the barrier: each by taking one item.
        prefix = f"{spec['group_prefix']}-w{worker}-{phase}"
        ready: list[str] = []
        if phase == "run" and head - tail >= 2:
            want = min(MAX_PRECREATED_GROUPS, spec["count"] // (head - tail - 1) + 2)
            first = T.ConsumeRequest(topic=topic, maxFetchSize=0)
            for i in range(want):
                first.fanoutId = f"{prefix}-pre{i}"
                r = consume(first)
                if r.result.resultCode != SUCCESS or len(r.itemList) != 1:
                    raise RuntimeError(f"creating group {first.fanoutId!r} of {topic!r}: {result_text(r.result)}")
                ready.append(first.fanoutId)
            ready.reverse()
        passes = 0
        in_pass = 0
        pass_len = 0
        request = T.ConsumeRequest(topic=topic, maxFetchSize=fetch)

        def next_group() -> None:
            nonlocal passes, in_pass, pass_len
            passes += 1
            in_pass = 0
            if ready:
                request.fanoutId = ready.pop()
                pass_len = head - tail - 1
            else:
                request.fanoutId = f"{prefix}-{passes}"
                pass_len = head - tail

        next_group()

        def group_step(left: int) -> tuple[int, int]:
            nonlocal in_pass, empty_in_a_row
            r = consume(request)
            code = r.result.resultCode
            if code == SUCCESS:
                n = len(r.itemList)
                in_pass += n
                empty_in_a_row = 0
            elif code == TRY_LATER:
                n = 0
                empty_in_a_row += 1
                if empty_in_a_row > 2:
                    raise RuntimeError(f"group {request.fanoutId!r} of {topic!r} gets nothing: {result_text(r.result)}")
            else:
                raise RuntimeError(f"consume from {topic!r} failed: {result_text(r.result)}")
            if n == 0 or in_pass >= pass_len:  # the whole topic read: go on with another group
                next_group()
            return 1, n

        return group_step

    request = T.ConsumeRequest(topic=topic, startIndex=tail, maxFetchSize=fetch)

    def index_step(left: int) -> tuple[int, int]:
        nonlocal empty_in_a_row
        r = consume(request)
        code = r.result.resultCode
        if code == SUCCESS:
            n = len(r.itemList)
            nxt = r.lastConsumedIndex + 1
            request.startIndex = tail if nxt >= head else nxt
            empty_in_a_row = 0
            return 1, n
        if code == TRY_LATER:
            empty_in_a_row += 1
            if empty_in_a_row > 2:
                raise RuntimeError(f"index {request.startIndex} of {topic!r} gets nothing: {result_text(r.result)}")
            request.startIndex = tail
            return 1, 0
        raise RuntimeError(f"consume from {topic!r} at {request.startIndex} failed: {result_text(r.result)}")

    return index_step


def run_loop(step: Step, count: int, seconds: float, latencies: array | None) -> tuple[int, int, str]:
    """Call ``step`` until ``count`` items are done or ``seconds`` have passed (the clock is
    read after every step). Returns (calls, items, what stopped the loop)."""
    now = time.perf_counter_ns
    deadline = now() + int(seconds * 1e9)
    calls = items = 0
    while items < count:
        a = now()
        c, n = step(count - items)
        b = now()
        if latencies is not None:
            latencies.append(b - a)
        calls += c
        items += n
        if b >= deadline and items < count:
            return calls, items, "time"
    return calls, items, "count"


def client_main(spec: dict[str, Any], worker: int, barrier: Any, results: Any) -> None:
    """One client process: connect, warm up, wait for the others, run the timed loop, report."""
    try:
        if spec["client_cpus"]:
            os.sched_setaffinity(0, spec["client_cpus"])
        client, sock = connect(spec["host"], spec["port"])
        topic = spec["topic"]
        workload = spec["workload"]
        warm_sent = 0
        sent = [0]  # async_produce's next sequence number
        if spec["warmup_items"] > 0:
            step = make_step(client, spec, worker, "warm", sent)
            _, warm_sent, _ = run_loop(step, spec["warmup_items"], spec["warmup_seconds"], None)
            if workload in ("async_produce", "prefill"):
                topic_size(client, topic)  # a round trip: the broker has handled every oneway call before it
        step = make_step(client, spec, worker, "run", sent)
        latencies = array("q") if workload not in ("async_produce", "prefill") else None
        barrier.wait(BARRIER_TIMEOUT_S)
        cpu0 = time.process_time()
        broker0 = process_cpu_s(spec["broker_pid"])
        tcp0 = tcp_send_counts(sock)
        t0 = time.perf_counter()
        calls, items, stopped = run_loop(step, spec["count"], spec["seconds"], latencies)
        t1 = time.perf_counter()
        tcp1 = tcp_send_counts(sock)
        out = {
            "worker": worker,
            "topic": topic,
            "warmup_items": warm_sent if workload in ("async_produce", "prefill", "produce") else 0,
            "calls": calls,
            "items": items,
            "stopped_by": stopped,
            "t0": t0,
            "t1": t1,
            "cpu_s": time.process_time() - cpu0,
            "broker_cpu0": broker0,
            "broker_cpu1": process_cpu_s(spec["broker_pid"]),
            "latencies": latencies.tobytes() if latencies is not None else b"",
            "tcp_sent": [b - a for a, b in zip(tcp0, tcp1, strict=True)] if tcp0 and tcp1 else None,
        }
        if workload == "prefill":
            out["size_after"] = topic_size(client, topic)
        results.put(out)
    except BaseException:
        with contextlib.suppress(Exception):
            barrier.abort()
        results.put({"worker": worker, "error": traceback.format_exc()})


# -- one run: k clients, one workload, one size ---------------------------------------------
@dataclass
class Result:
    """One timed run of ``clients`` client processes."""

    workload: str
    item_size: int
    clients: int
    topics: str  # "own" or "shared"
    side: str  # "ours", "java", or one of FLOOR_SIDES
    calls: int
    items: int
    seconds: float
    stopped_by: str  # "count", "time", "drain-timeout" (async_produce: not every item arrived in time)
    p50_us: float | None = None
    p99_us: float | None = None
    broker_cpu: float | None = None  # broker CPU seconds / wall seconds (1.0 = one core busy)
    client_cpu: float | None = None  # all clients' CPU seconds / wall seconds
    #: The clients' sockets while the clients ran: bytes per TCP segment sent, and the share
    #: of that time their sends waited for the broker's receive window (see tcp_send_counts).
    client_segment_bytes: float | None = None
    client_window_limited: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: items/s of every repeat (--repeat); this Result is the median one.
    runs: list[float] = field(default_factory=list)

    @property
    def spread(self) -> float:
        """(max - min) / median of the repeats' items/s; 0 for a single run."""
        return (max(self.runs) - min(self.runs)) / self.items_per_s if len(self.runs) > 1 and self.items else 0.0

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.items_per_s * self.item_size / MB

    @property
    def cpu_us_per_call(self) -> float | None:
        """The broker's CPU (user + system, every thread, busy polling included) per call, in us."""
        if self.broker_cpu is None or not self.calls:
            return None
        return self.broker_cpu * self.seconds / self.calls * 1e6

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "calls_per_s": self.calls_per_s,
            "items_per_s": self.items_per_s,
            "mb_per_s": self.mb_per_s,
            "spread": self.spread,
            "cpu_us_per_call": self.cpu_us_per_call,
        }


def median_result(runs: list[Result]) -> Result:
    """The run with the median items/s (the lower middle one for an even count), carrying
    every run's items/s in ``runs``."""
    for r in runs:
        log_result(r)
    ranked = sorted(runs, key=lambda r: r.items_per_s)
    return replace(ranked[(len(ranked) - 1) // 2], runs=[r.items_per_s for r in runs])


def percentile(sorted_values: list[int], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return float(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))])


def run_clients(specs: list[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
    """Run one client process per spec (forked), all released together by a barrier."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(specs))
    results = ctx.Queue()
    sys.stdout.flush()
    sys.stderr.flush()
    procs = [ctx.Process(target=client_main, args=(s, i, barrier, results), daemon=True) for i, s in enumerate(specs)]
    for p in procs:
        p.start()
    out = collect_reports(procs, results, timeout_s, "client")
    return sorted(out, key=lambda r: r["worker"])


# -- the floor of a sync call: servers with an empty handler --------------------------------
def floor_responses(item_size: int) -> dict[str, Any]:
    """What the floor servers answer, per sync method of the floor workloads (constants, no
    storage): ``produce`` SUCCESS at index 0; ``consume`` (by group or by index alike) SUCCESS
    with one item of ``item_size`` zero bytes and lastConsumedIndex 0 (an index loop then goes
    on at 1, a group loop counts one item); ``findClosestIndexByTime`` index 0 (the tail);
    ``deleteTopic`` SUCCESS. asyncProduce (oneway) gets no reply: the floors count those calls
    per topic, and getSize answers from that count (:class:`OnewayCounts`)."""
    ok = T.Result(resultCode=SUCCESS)
    return {
        "produce": T.ProduceResponse(result=ok, index=0),
        "consume": T.ConsumeResponse(result=ok, itemList=[bytes(item_size)], lastConsumedIndex=0),
        "findClosestIndexByTime": T.FindClosestIndexByTimeResponse(result=ok, index=0),
        "deleteTopic": T.DeleteTopicResponse(result=ok),
    }


def thrift_frame(name: str, mtype: int, payload: Any) -> bytes:
    """One framed message (length, strict binary protocol, seqid 0) as thriftpy2 writes it;
    ``payload`` is a ``<method>_result`` struct or a TApplicationException."""
    buf = TCyMemoryBuffer()
    proto = TCyBinaryProtocolFactory().get_protocol(buf)
    proto.write_message_begin(name, mtype, 0)
    payload.write(proto)
    proto.write_message_end()
    body = buf.getvalue()
    return len(body).to_bytes(4, "big") + body


#: A framed reply cut around its i32 seqid: (what comes before it, what comes after it).
SplitReply = tuple[bytes, bytes]


def split_at_seqid(frame: bytes) -> SplitReply:
    """``frame`` (i32 length, i32 version | type, i32 name length, name, i32 seqid, ...) without its seqid."""
    at = 12 + int.from_bytes(frame[8:12], "big")
    return frame[:at], frame[at + 4 :]


def canned_replies(responses: dict[str, Any]) -> dict[bytes, SplitReply]:
    """Method name -> its framed REPLY carrying ``responses[name]``, split at the seqid."""
    return {
        name.encode(): split_at_seqid(
            thrift_frame(name, TMessageType.REPLY, getattr(QueueService, name + "_result")(success=response))
        )
        for name, response in responses.items()
    }


def unknown_method_reply(name: bytes) -> SplitReply:
    """The EXCEPTION reply (UNKNOWN_METHOD) to a call the floor has no canned reply for."""
    text = name.decode("utf-8", "replace")
    error = TApplicationException(TApplicationException.UNKNOWN_METHOD, f"the floor server has no reply for {text}")
    return split_at_seqid(thrift_frame(text, TMessageType.EXCEPTION, error))


def call_args(frame: bytes | bytearray, name: str) -> Any:
    """The ``<name>_args`` struct of one call ``frame`` (without its length), decoded by thriftpy2."""
    proto = TCyBinaryProtocolFactory().get_protocol(TCyMemoryBuffer(bytes(frame)))
    proto.read_message_begin()
    args = getattr(QueueService, name + "_args")()
    args.read(proto)
    return args


class OnewayCounts:
    """The floors' only state: oneway asyncProduce calls read, per topic, so that the bench's
    getSize sees them arrive (a floor stores nothing). Topics never produced to answer
    ``topic_items`` (the prefill count, so a consume run sees the topic it would see on a
    broker)."""

    def __init__(self, topic_items: int) -> None:
        self.topic_items = topic_items
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, topic: str, n: int) -> None:
        with self._lock:
            self._counts[topic] = self._counts.get(topic, 0) + n

    def get_size(self, topic: str) -> Any:
        """The GetSizeResponse of ``topic``."""
        with self._lock:
            size = self._counts.get(topic, self.topic_items)
        return T.GetSizeResponse(result=T.Result(resultCode=SUCCESS), size=size)


def raw_get_size_reply(frame: bytes | bytearray, counts: OnewayCounts) -> SplitReply:
    """The raw floors' reply to a getSize call ``frame`` (the bench's monitor; rare): ``counts``' size."""
    response = counts.get_size(call_args(frame, "getSize").getSizeRequest.topic)
    return split_at_seqid(thrift_frame("getSize", TMessageType.REPLY, QueueService.getSize_result(success=response)))


class RawFloorConnection:
    """floor-raw's and floor-epoll's work on one connection: per complete call frame read,
    the message type, the method name and the seqid, nothing else, and the canned reply of
    that method with the call's seqid copied in; but oneway frames get no reply and are
    counted, under the topic of the connection's first oneway call (decoded once), and
    getSize answers from ``counts``."""

    def __init__(self, conn: socket.socket, replies: dict[bytes, SplitReply], counts: OnewayCounts) -> None:
        self.conn, self.replies, self.counts = conn, replies, counts
        self.buf = bytearray()
        self.topic: str | None = None

    def received(self, data: bytes) -> None:
        """Answer (``sendall``) every complete call frame ``data`` completes."""
        buf = self.buf
        buf += data
        pos = oneway = 0
        out: list[bytes | bytearray] = []
        while len(buf) - pos >= 8:
            n = int.from_bytes(buf[pos : pos + 4], "big")
            if len(buf) - pos - 4 < n:
                break
            if buf[pos + 7] == TMessageType.ONEWAY:  # strict binary protocol: i32 version | type
                if self.topic is None:
                    self.topic = call_args(buf[pos + 4 : pos + 4 + n], "asyncProduce").produceRequest.topic
                oneway += 1
            else:
                at = pos + 12 + int.from_bytes(buf[pos + 8 : pos + 12], "big")  # i32 name length, name
                name = bytes(buf[pos + 12 : at])
                if name == b"getSize":
                    head, tail = raw_get_size_reply(buf[pos + 4 : pos + 4 + n], self.counts)
                else:
                    head, tail = self.replies.get(name) or unknown_method_reply(name)
                out += (head, buf[at : at + 4], tail)  # the reply's seqid = the call's
            pos += 4 + n
        del buf[:pos]
        if oneway and self.topic is not None:
            self.counts.add(self.topic, oneway)
        if out:
            self.conn.sendall(b"".join(out))


def serve_raw_connection(conn: socket.socket, replies: dict[bytes, SplitReply], counts: OnewayCounts) -> None:
    """floor-raw: a thread per connection, in a blocking ``recv`` until its client sends."""
    floor = RawFloorConnection(conn, replies, counts)
    with conn:
        while data := conn.recv(1 << 20):
            floor.received(data)


def accept_no_delay(srv: socket.socket) -> socket.socket:
    """The next connection of ``srv``, with TCP_NODELAY (as the brokers set it)."""
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def serve_epoll(srv: socket.socket, replies: dict[bytes, SplitReply], counts: OnewayCounts) -> None:
    """floor-epoll: one thread for every connection, waiting in ``epoll`` for any to send,
    then reading each ready one (the sockets stay blocking: a ready socket's ``recv`` does
    not wait, and a reply is sent whole before the next socket is read)."""
    poll = select.epoll()
    poll.register(srv.fileno(), select.EPOLLIN)
    floors: dict[int, RawFloorConnection] = {}
    while True:
        for fd, _ in poll.poll():
            if fd == srv.fileno():
                conn = accept_no_delay(srv)
                floors[conn.fileno()] = RawFloorConnection(conn, replies, counts)
                poll.register(conn.fileno(), select.EPOLLIN)
                continue
            floor = floors[fd]
            data = floor.conn.recv(1 << 20)
            if data:
                floor.received(data)
            else:
                poll.unregister(fd)
                floor.conn.close()
                del floors[fd]


class NoDelayServerSocket(TServerSocket):  # type: ignore[misc]
    """thriftpy2's server socket, with TCP_NODELAY on every accepted connection (as our broker)."""

    def accept(self) -> TSocket:
        client = super().accept()
        client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return client


def constant(response: Any) -> Callable[[Any], Any]:
    """A handler method that answers every request with ``response``."""
    return lambda request: response


def floor_main(kind: str, port: int, cpus: list[int] | None, item_size: int, topic_items: int) -> None:
    """A floor server process on 127.0.0.1:``port``, serving until SIGTERM, with the replies of
    :func:`floor_responses` (``item_size``: the consumed item's size) and getSize from
    :class:`OnewayCounts` (``topic_items``: a topic's size before any asyncProduce)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    responses = floor_responses(item_size)
    counts = OnewayCounts(topic_items)
    if kind == "floor-c":
        exec_floor_c(port, responses, counts)
    if kind in ("floor-raw", "floor-epoll"):
        replies = canned_replies(responses)
        with socket.create_server(("127.0.0.1", port)) as srv:
            if kind == "floor-epoll":
                serve_epoll(srv, replies, counts)
            else:
                while True:
                    conn = accept_no_delay(srv)
                    threading.Thread(target=serve_raw_connection, args=(conn, replies, counts), daemon=True).start()
    handler = SimpleNamespace(**{name: constant(r) for name, r in responses.items()})
    handler.asyncProduce = lambda request: counts.add(request.topic, 1)
    handler.getSize = lambda request: counts.get_size(request.topic)

    from thriftpy2.server import TThreadedServer

    TThreadedServer(
        TProcessor(QueueService, handler),
        NoDelayServerSocket(host="127.0.0.1", port=port, client_timeout=None),
        iprot_factory=TCyBinaryProtocolFactory(),
        itrans_factory=TCyFramedTransportFactory(),
        daemon=True,
    ).serve()


FLOOR_C_SOURCE = Path(__file__).with_name("floor_c.c")


def floor_c_binary() -> Path:
    """perf/floor_c.c compiled (``cc -O2 -pthread``) into the temporary directory, once per source."""
    import hashlib
    import subprocess
    import tempfile

    digest = hashlib.sha256(FLOOR_C_SOURCE.read_bytes()).hexdigest()[:12]
    binary = Path(tempfile.gettempdir()) / f"luxun-floor-c-{digest}"
    if not binary.exists():
        partial = binary.with_suffix(f".{os.getpid()}")
        subprocess.run(["cc", "-O2", "-pthread", "-o", str(partial), str(FLOOR_C_SOURCE)], check=True)
        partial.replace(binary)
    return binary


def exec_floor_c(port: int, responses: dict[str, Any], counts: OnewayCounts) -> None:
    """Become floor-c (same pid: its CPU is read as any floor's): the canned replies, getSize's
    with the prefill count and UNKNOWN_METHOD's for the rest, written where it reads them."""
    binary = floor_c_binary()
    replies = canned_replies(responses)
    replies[b"getSize"] = split_at_seqid(
        thrift_frame("getSize", TMessageType.REPLY, QueueService.getSize_result(success=counts.get_size("")))
    )
    replies[b""] = unknown_method_reply(b"(not canned)")
    path = binary.with_name(f"{binary.name}-replies-{os.getpid()}")
    with open(path, "wb") as f:
        for name, (head, tail) in replies.items():
            for part in (name, head, tail):
                f.write(len(part).to_bytes(4, "big") + part)
    os.execv(binary, [str(binary), str(port), str(path)])


@contextlib.contextmanager
def floor_server(kind: str, cpus: list[int] | None, item_size: int, topic_items: int) -> Iterator[BrokerInfo]:
    """Run :func:`floor_main` in a forked process until its port answers; SIGTERM it at the end."""
    port = free_port()
    info: BrokerInfo | None = None
    proc = mp.get_context("fork").Process(
        target=floor_main, args=(kind, port, cpus, item_size, topic_items), daemon=True
    )
    proc.start()
    try:
        deadline = time.monotonic() + 30
        while not port_answers("127.0.0.1", port):
            if not proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the {kind} server did not start on port {port} (exit code {proc.exitcode})")
            time.sleep(0.02)
        info = BrokerInfo("127.0.0.1", port, proc.pid, None, [kind], None)
        yield info
    finally:
        t = time.perf_counter()
        proc.terminate()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        if info is not None:
            info.exit_code, info.stop_seconds = proc.exitcode, round(time.perf_counter() - t, 2)


def side_broker(side: str, args: argparse.Namespace, broker_cpus: list[int] | None, sizes: list[int]) -> Any:
    """The broker of ``side`` (a context manager giving its BrokerInfo), for a block of ``sizes``
    (a floor server cans replies for one item size: its block has one)."""
    if side == "java":
        return java_broker(args.java_peer, args.data_dir, "bench_broker", broker_cpus, tuple(args.java_opts))
    if side in FLOOR_SIDES:
        (size,) = sizes
        return floor_server(side, broker_cpus, size, prefill_count(args, size))
    if args.broker:
        return external_broker(args.broker, args.password)
    properties = {"busy.poll.us": "0"} if side == NO_POLL_SIDE else None
    return own_broker(args.data_dir, "bench_broker", broker_cpus, properties)


def warm_broker(ctx: Context, item: bytes) -> None:
    """Untimed, bounded by ``--broker-warmup-seconds``: sync produce, asyncProduce and the
    four kinds of consume on a topic of its own, so a fresh broker (a JVM's JIT above all)
    has run every path before the first timed run. The topic is deleted afterwards."""
    topic = f"{ctx.tag}-warm-{len(item)}"
    client = ctx.monitor
    deadline = time.perf_counter() + ctx.args.broker_warmup_seconds
    produced = 0
    while time.perf_counter() < deadline and produced < 100_000:
        for _ in range(64):
            client.asyncProduce(T.ProduceRequest(item=item, topic=topic))
        r = client.produce(T.ProduceRequest(item=item, topic=topic))
        if r.result.resultCode != SUCCESS:
            raise RuntimeError(f"warm-up produce to {topic!r}: {result_text(r.result)}")
        produced += 65
        for fetch in (ctx.args.fetch_bytes, 0):
            client.consume(T.ConsumeRequest(topic=topic, fanoutId=f"warm-{fetch}", maxFetchSize=fetch))
            client.consume(T.ConsumeRequest(topic=topic, startIndex=produced // 2, maxFetchSize=fetch))
    delete_topics(ctx, [topic])


@dataclass
class Context:
    """What every run needs: where the broker is and the budgets."""

    host: str
    port: int
    broker_pid: int | None
    password: str | None
    client_cpus: list[int] | None
    monitor: Any  # a client for getSize / deleteTopic, on its own connection
    args: argparse.Namespace
    tag: str  # unique per bench run: topic and group names start with it
    side: str = "ours"  # which broker: "ours", "java", or one of FLOOR_SIDES


def base_spec(ctx: Context, workload: str, item: bytes, topic: str) -> dict[str, Any]:
    return {
        "host": ctx.host,
        "port": ctx.port,
        "broker_pid": ctx.broker_pid,
        "client_cpus": ctx.client_cpus,
        "workload": workload,
        "topic": topic,
        "item": item,
        "fetch_bytes": 0,
        "tail": 0,
        "head": 0,
        "group_prefix": "",
    }


def budget_items(args: argparse.Namespace, size: int, clients: int) -> int:
    """Items per client: the run's item budget and byte budget, split over the clients."""
    total = min(int(args.items), int(args.max_mb * MIB) // size)
    return max(1, total // clients)


def warmup_items(args: argparse.Namespace, size: int) -> int:
    return max(1, min(int(args.warmup_items), int(args.max_mb * MIB / 10) // size))


def summarize(
    workload: str,
    size: int,
    clients: int,
    ctx: Context,
    reports: list[dict[str, Any]],
    end: float | None = None,
    broker_cpu_end: float | None = None,
) -> Result:
    """One Result from the clients' reports; ``end`` (and the broker's CPU seconds then)
    replace the last client's end when the run ends later (async_produce)."""
    start = min(r["t0"] for r in reports)
    stop = end if end is not None else max(r["t1"] for r in reports)
    seconds = stop - start
    lat = sorted(v for r in reports for v in array("q", r["latencies"]))
    stops = sorted({r["stopped_by"] for r in reports})
    first = min(reports, key=lambda r: r["t0"])
    last = max(reports, key=lambda r: r["t1"])
    broker_cpu = None
    segment_bytes = window_limited = None
    if all(r.get("tcp_sent") for r in reports):
        segments, sent, waited_us = (sum(x) for x in zip(*(r["tcp_sent"] for r in reports), strict=True))
        segment_bytes = sent / segments if segments else None
        window_limited = waited_us / 1e6 / sum(r["t1"] - r["t0"] for r in reports)
    broker_end = broker_cpu_end if end is not None else last["broker_cpu1"]
    if first["broker_cpu0"] is not None and broker_end is not None and seconds > 0:
        broker_cpu = (broker_end - first["broker_cpu0"]) / seconds
    return Result(
        workload=workload,
        item_size=size,
        clients=clients,
        topics=ctx.args.topics,
        side=ctx.side,
        calls=sum(r["calls"] for r in reports),
        items=sum(r["items"] for r in reports),
        seconds=seconds,
        stopped_by="+".join(stops),
        p50_us=percentile(lat, 0.50) / 1000 if lat else None,
        p99_us=percentile(lat, 0.99) / 1000 if lat else None,
        broker_cpu=broker_cpu,
        client_cpu=sum(r["cpu_s"] for r in reports) / seconds if seconds > 0 else None,
        client_segment_bytes=segment_bytes,
        client_window_limited=window_limited,
    )


def topics_for(ctx: Context, name: str, clients: int) -> list[str]:
    """The topic of each client: its own, or one shared by all."""
    if ctx.args.topics == "shared":
        return [f"{ctx.tag}-{name}"] * clients
    return [f"{ctx.tag}-{name}-c{i}" for i in range(clients)]


def settle(ctx: Context) -> float:
    """Wait (bounded) until our broker is idle: creating a topic or a prefill leaves
    background work behind (page allocation, read-ahead of the next page) that must not
    land in the next timed run. Returns the seconds waited. An external broker: no wait."""
    if ctx.broker_pid is None:
        return 0.0
    start = time.perf_counter()
    deadline = start + SETTLE_MAX_S
    quiet = 0
    before = process_cpu_s(ctx.broker_pid)
    while quiet < 2 and time.perf_counter() < deadline and before is not None:
        time.sleep(SETTLE_SAMPLE_S)
        now = process_cpu_s(ctx.broker_pid)
        if now is None:
            break
        quiet = quiet + 1 if now - before <= SETTLE_IDLE_CPU * SETTLE_SAMPLE_S else 0
        before = now
    return time.perf_counter() - start


def delete_topics(ctx: Context, topics: list[str]) -> None:
    if ctx.password is None:
        return
    for topic in sorted(set(topics)):
        r = ctx.monitor.deleteTopic(T.DeleteTopicRequest(topic=topic, password=ctx.password))
        if r.result.resultCode != SUCCESS:
            print(f"  (could not delete topic {topic!r}: {result_text(r.result)})", file=sys.stderr)


def run_write(ctx: Context, workload: str, size: int, clients: int, item: bytes, run: int) -> Result:
    """produce or async_produce by ``clients`` processes into fresh topics, deleted afterwards."""
    args = ctx.args
    topics = topics_for(ctx, f"{workload}-{size}-{clients}-r{run}", clients)
    specs = []
    for topic in topics:
        spec = base_spec(ctx, workload, item, topic)
        spec |= {
            "count": budget_items(args, size, clients),
            "seconds": args.seconds,
            "warmup_items": warmup_items(args, size),
            "warmup_seconds": args.warmup_seconds,
        }
        specs.append(spec)
    try:
        # Create the topics first and let the broker finish allocating their pages.
        for topic in sorted(set(topics)):
            r = ctx.monitor.produce(T.ProduceRequest(item=item, topic=topic))
            if r.result.resultCode != SUCCESS:
                raise RuntimeError(f"produce to {topic!r} failed: {result_text(r.result)}")
        os.sync()  # no write-back of earlier runs pending during this one
        settle(ctx)
        reports = run_clients(specs, BARRIER_TIMEOUT_S + args.warmup_seconds + args.seconds + 60)
        if workload != "async_produce":
            return summarize(workload, size, clients, ctx, reports)
        # Every item sent; now wait (bounded) until getSize shows them all.
        floor = ctx.side in FLOOR_SIDES  # counts the oneway calls it read; stores nothing
        expected = dict.fromkeys(topics, 0 if floor else 1)  # 1: the item that created the topic
        for r in reports:
            expected[r["topic"]] += r["warmup_items"] + r["items"]
        sent_end = max(r["t1"] for r in reports)
        deadline = time.perf_counter() + args.drain_seconds
        stopped = None
        while True:
            sizes = {t: topic_size(ctx.monitor, t) for t in expected}
            now = time.perf_counter()
            if all(sizes[t] >= n for t, n in expected.items()):
                break
            if now >= deadline:
                stopped = "drain-timeout"
                break
            time.sleep(0.0005)
        result = summarize(workload, size, clients, ctx, reports, end=now, broker_cpu_end=process_cpu_s(ctx.broker_pid))
        arrived_missing = sum(max(0, n - sizes[t]) for t, n in expected.items())
        if stopped:
            result.stopped_by = stopped
        t = time.perf_counter()
        if floor:  # nothing to read back: the timed calls count if every call arrived
            timed = sum(r["items"] for r in reports)
            check = {"checked_items": 0 if arrived_missing else timed, "bad_items": 0, "missing_items": arrived_missing}
        else:
            check = check_async(ctx, reports, item)
        # Only the timed items that arrived, in order and intact, count.
        result.items = result.calls = check["checked_items"]
        if check["bad_items"] or check["missing_items"]:
            result.stopped_by += "+check-failed"
        send_s = sent_end - min(r["t0"] for r in reports)
        result.extra = {
            "send_seconds": send_s,
            "send_items_per_s": sum(r["items"] for r in reports) / send_s if send_s > 0 else 0.0,
            "drain_seconds": now - sent_end,
            "missing_at_drain_end": arrived_missing,
            **check,
            "check_seconds": time.perf_counter() - t,
        }
        return result
    finally:
        delete_topics(ctx, topics)


def read_topic(ctx: Context, topic: str, fetch_bytes: int) -> Iterator[bytes]:
    """Every item of ``topic`` from its tail to its head (as the broker knows them now),
    read by index through the monitor connection."""
    r = ctx.monitor.findClosestIndexByTime(T.FindClosestIndexByTimeRequest(timestamp=T.EARLIEST_TIME, topic=topic))
    if r.result.resultCode != SUCCESS:
        raise RuntimeError(f"the tail of topic {topic!r}: {result_text(r.result)}")
    index = r.index
    head = index + topic_size(ctx.monitor, topic)
    request = T.ConsumeRequest(topic=topic, maxFetchSize=fetch_bytes)
    while index < head:
        request.startIndex = index
        r = ctx.monitor.consume(request)
        if r.result.resultCode != SUCCESS or not r.itemList:
            raise RuntimeError(f"reading {topic!r} back at index {index} of {head}: {result_text(r.result)}")
        yield from r.itemList
        index += len(r.itemList)


def check_async(ctx: Context, reports: list[dict[str, Any]], item: bytes) -> dict[str, int]:
    """Read every async_produce topic back and check it: first the item that created the
    topic, then each client's stamped items in the order it sent them (sequence numbers 0,
    1, ... across its warm-up and its timed run), each the right size with the right bytes
    after the stamp. Returns the timed items that passed (``checked_items``), the items that
    did not (``bad_items``: wrong size or bytes, a sequence number out of order, a stranger)
    and the sent items never read (``missing_items``)."""
    tail_bytes = item[STAMP.size :]
    sent = {r["worker"]: r["warmup_items"] + r["items"] for r in reports}
    warm = {r["worker"]: r["warmup_items"] for r in reports}
    by_topic: dict[str, list[int]] = {}
    for r in reports:
        by_topic.setdefault(r["topic"], []).append(r["worker"])
    checked = bad = missing = 0
    unpack = STAMP.unpack_from
    for topic, workers in by_topic.items():
        expect = dict.fromkeys(workers, 0)
        items = read_topic(ctx, topic, max(MIB, 4 * len(item)))
        if next(items, None) != item:  # the item that created the topic
            bad += 1
        for got in items:
            worker, seq = unpack(got) if len(got) == len(item) else (-1, -1)
            if worker in expect and seq == expect[worker] and got.endswith(tail_bytes):
                checked += seq >= warm[worker]
            else:
                bad += 1
            if worker in expect and seq >= expect[worker]:
                expect[worker] = seq + 1
        missing += sum(sent[w] - expect[w] for w in workers)
    return {"checked_items": checked, "bad_items": bad, "missing_items": missing}


def prefill_count(args: argparse.Namespace, size: int) -> int:
    """Items per consume topic: --prefill-items, at most --prefill-mb of ``size``-byte items."""
    return max(1, min(int(args.prefill_items), int(args.prefill_mb * MIB) // size))


def prefill(ctx: Context, topics: list[str], size: int, item: bytes) -> dict[str, tuple[int, int]]:
    """Fill each topic with asyncProduce (one process per topic, in parallel); not on a floor
    server, which stores nothing (it would only drop the frames) and whose getSize answers the
    prefill count anyway. Returns topic -> (tail, head), as the server reports them."""
    if ctx.side not in FLOOR_SIDES:
        send_prefill(ctx, topics, size, item)
    out = {}
    for topic in topics:
        r = ctx.monitor.findClosestIndexByTime(T.FindClosestIndexByTimeRequest(timestamp=T.EARLIEST_TIME, topic=topic))
        if r.result.resultCode != SUCCESS:
            raise RuntimeError(f"prefilled topic {topic!r}: {result_text(r.result)}")
        tail = r.index
        head = tail + topic_size(ctx.monitor, topic)
        if head <= tail:
            raise RuntimeError(f"prefilled topic {topic!r} is empty")
        out[topic] = (tail, head)
    return out


def send_prefill(ctx: Context, topics: list[str], size: int, item: bytes) -> None:
    """:func:`prefill_count` items of ``item`` into each topic by asyncProduce, one client process a topic."""
    args = ctx.args
    count = prefill_count(args, size)
    specs = []
    for topic in topics:
        spec = base_spec(ctx, "prefill", item, topic)
        spec |= {"count": count, "seconds": args.drain_seconds, "warmup_items": 0, "warmup_seconds": 0}
        specs.append(spec)
    t = time.perf_counter()
    reports = run_clients(specs, BARRIER_TIMEOUT_S + args.drain_seconds + 60)
    elapsed = time.perf_counter() - t
    total = sum(r["items"] for r in reports)
    print(
        f"  prefill {len(topics)} topic(s) x {count} items of {size} B: {elapsed:.1f} s "
        f"({total / elapsed / 1e3:.0f} k items/s, {total * size / elapsed / MB:.0f} MB/s incl. process start)",
        file=sys.stderr,
        flush=True,
    )


def run_consume(
    ctx: Context,
    workload: str,
    size: int,
    clients: int,
    filled: dict[str, tuple[int, int]],
    pool: list[str],
    run: int,
) -> Result:
    args = ctx.args
    topics = [pool[0]] * clients if args.topics == "shared" else pool[:clients]
    fetch = args.fetch_bytes if workload.endswith("_fetch") else 0
    specs = []
    for topic in topics:
        tail, head = filled[topic]
        spec = base_spec(ctx, workload, b"", topic)
        spec |= {
            "count": budget_items(args, size, clients),
            "seconds": args.seconds,
            "warmup_items": warmup_items(args, size),
            "warmup_seconds": args.warmup_seconds,
            "fetch_bytes": fetch,
            "tail": tail,
            "head": head,
            "group_prefix": f"{ctx.tag}-{workload}-{clients}-r{run}",
        }
        specs.append(spec)
    reports = run_clients(specs, BARRIER_TIMEOUT_S + args.warmup_seconds + args.seconds + 60)
    return summarize(workload, size, clients, ctx, reports)


def log_result(r: Result) -> None:
    lat = f"  p50 {r.p50_us:8.1f} us  p99 {r.p99_us:8.1f} us" if r.p50_us is not None else ""
    cpu = f"  broker CPU {r.broker_cpu:4.2f}" if r.broker_cpu is not None else ""
    print(
        f"  {r.side:<15} {r.workload:<13} {r.item_size:>7} B  {r.clients} client(s)  {r.items:>9} items  "
        f"{r.seconds:6.2f} s  "
        f"{fmt_rate(r.calls_per_s):>8} calls/s  {fmt_rate(r.items_per_s):>8} items/s  {r.mb_per_s:8.1f} MB/s"
        f"{lat}{cpu}  ({r.stopped_by})",
        file=sys.stderr,
        flush=True,
    )


# -- report ---------------------------------------------------------------------------------
def targets(results: list[Result]) -> list[dict[str, Any]]:
    """The absolute targets, judged on the 1-client runs (the other client counts shown too)."""
    by_key = {(r.workload, r.item_size, r.clients): r for r in results}
    out = []
    for label, workload, size, metric, goal in TARGETS:
        one = by_key.get((workload, size, 1))
        value = None if one is None else getattr(one, metric)
        shown = "not measured" if value is None else fmt_metric(value, metric)
        others = [
            f"{r.clients} clients: {fmt_metric(getattr(r, metric), metric)}"
            for (w, s, c), r in sorted(by_key.items())
            if w == workload and s == size and c != 1
        ]
        out.append(
            {
                "target": label,
                "workload": workload,
                "item_size": size,
                "metric": metric,
                "goal": goal,
                "value_1_client": value,
                "reached": None if value is None else value >= goal,
                "shown": shown,
                "detail": "; ".join(others),
            }
        )
    return out


def fmt_metric(value: float, metric: str) -> str:
    if metric == "mb_per_s":
        return f"{value:.0f} MB/s"
    return f"{fmt_rate(value)} {'calls' if metric == 'calls_per_s' else 'items'}/s"


Cell = tuple[str, int, int]  # (workload, item size, clients)


def best_runs(runs: dict[str, dict[Cell, list[Result]]], side: str) -> dict[Cell, Result]:
    """Each cell's best pass (highest items/s) of ``side``."""
    return {cell: max(rs, key=lambda r: r.items_per_s) for cell, rs in runs.get(side, {}).items()}


def side_figures(passes: list[Result]) -> dict[str, Any]:
    """One side's figures for a cell over its passes: the median items/s, its spread
    ((max - min) / median), the best, and the median broker CPU per call."""
    rates = [r.items_per_s for r in passes]
    median = statistics.median(rates)
    cpu = [r.cpu_us_per_call for r in passes if r.cpu_us_per_call is not None]
    return {
        "items_per_s": median,
        "spread": (max(rates) - min(rates)) / median if median > 0 else 0.0,
        "best_items_per_s": max(rates),
        "cpu_us_per_call": statistics.median(cpu) if cpu else None,
    }


def compare(runs: dict[str, dict[Cell, list[Result]]], other: str) -> list[dict[str, Any]]:
    """Per cell that both ours and ``other`` ran: each side's median over its passes (so one
    lucky pass cannot decide a cell) with its spread and median CPU per call, the ratio
    ours / other of the medians, and the ratio of each pair of passes (the first pass of
    each side, then the second...)."""
    ours, theirs = runs.get("ours", {}), runs.get(other, {})
    out = []
    for cell in sorted(set(ours) & set(theirs), key=cell_order):
        a, b = side_figures(ours[cell]), side_figures(theirs[cell])
        pairs = [x.items_per_s / y.items_per_s for x, y in zip(ours[cell], theirs[cell], strict=False) if y.items]
        goal = RATIO_TARGETS.get(cell[2]) if other == "java" else None
        ratio = a["items_per_s"] / b["items_per_s"] if b["items_per_s"] > 0 else None
        cpu_ratio = (
            a["cpu_us_per_call"] / b["cpu_us_per_call"]
            if a["cpu_us_per_call"] is not None and b["cpu_us_per_call"]
            else None
        )
        out.append(
            {
                "workload": cell[0],
                "item_size": cell[1],
                "clients": cell[2],
                "ours_items_per_s": a["items_per_s"],
                f"{other}_items_per_s": b["items_per_s"],
                "ours_spread": a["spread"],
                f"{other}_spread": b["spread"],
                "ours_best_items_per_s": a["best_items_per_s"],
                f"{other}_best_items_per_s": b["best_items_per_s"],
                "ours_cpu_us_per_call": a["cpu_us_per_call"],
                f"{other}_cpu_us_per_call": b["cpu_us_per_call"],
                "cpu_ratio": cpu_ratio,
                "ratio": ratio,
                "pair_ratios": pairs,
                "goal": goal,
                "reached": None if goal is None or ratio is None else ratio >= goal,
                "cpu_reached": (
                    cpu_ratio <= 1.0
                    if other == "java"
                    and cpu_ratio is not None
                    and cell[0] in CPU_TARGET_WORKLOADS
                    and cell[1] <= CPU_TARGET_MAX_SIZE
                    else None
                ),
                "ours_runs": [r.to_json() for r in ours[cell]],
                f"{other}_runs": [r.to_json() for r in theirs[cell]],
            }
        )
    return out


def cell_order(cell: Cell) -> tuple[int, int, int]:
    return WORKLOADS.index(cell[0]), cell[1], cell[2]


def render_comparison(rows: list[dict[str, Any]], other: str, title: str) -> list[str]:
    """The table of ``compare``'s rows: each side's median items/s with its spread and its
    broker CPU per call, the ratios ours / other of both, and each pass pair's ratio; for a
    floor measured with Java, the floor's own ratio to Java against the target."""
    floor_vs_java = any("floor_over_java" in c for c in rows)
    pairs = [" ".join(f"{x:.2f}" for x in c["pair_ratios"]) for c in rows]
    width = max([16, *map(len, pairs)]) + 2
    head = (
        f"{'workload':<14}{'size B':>7}{'cli':>4}{'ours items/s':>14}{'+-':>5}{other + ' items/s':>24}{'+-':>5}"
        f"{'ratio':>7}{'ours us/call':>14}{other[:10] + ' us/call':>19}{'cpu ratio':>10}"
        f"  {'pass pairs':<{width}}" + ("floor / Java (target)" if floor_vs_java else "target")
    )
    lines = ["", title, head, "-" * len(head)]

    def num(value: float | None, fmt: str, width: int) -> str:
        return f"{value:>{width}{fmt}}" if value is not None else f"{'-':>{width}}"

    for c, pair_text in zip(rows, pairs, strict=True):
        mark = "" if c["goal"] is None else f">={c['goal']}x " + ("ok" if c["reached"] else "MISS")
        if c.get("cpu_reached") is not None:
            mark += ("; " if mark else "") + "CPU <= Java " + ("ok" if c["cpu_reached"] else "MISS")
        if c.get("floor_over_java") is not None:
            goal = RATIO_TARGETS.get(c["clients"])
            mark = f"{c['floor_over_java']:.2f}"
            if goal is not None:  # the targets name 1 and 4 clients only
                mark += f" (>={goal}x: " + ("floor above" if c["floor_over_java"] >= goal else "FLOOR UNDER") + ")"
        lines.append(
            f"{c['workload']:<14}{c['item_size']:>7}{c['clients']:>4}{fmt_rate(c['ours_items_per_s']):>14}"
            f"{c['ours_spread']:>5.0%}{fmt_rate(c[other + '_items_per_s']):>24}{c[other + '_spread']:>5.0%}"
            f"{num(c['ratio'], '.2f', 7)}{num(c['ours_cpu_us_per_call'], '.1f', 14)}"
            f"{num(c[other + '_cpu_us_per_call'], '.1f', 19)}{num(c['cpu_ratio'], '.2f', 10)}  "
            f"{pair_text:<{width}}{mark}"
        )
    return lines


def render_send_sockets(rows: list[dict[str, Any]], other: str) -> list[str]:
    """For the async_produce cells of ``compare``'s rows: how the clients' sends left their
    sockets with each broker (its best pass): bytes per TCP segment, share of the time waiting
    for the broker's receive window."""
    cells = [c for c in rows if c["workload"] == "async_produce"]
    if not cells:
        return []
    head = (
        f"{'size B':>7}{'cli':>4}{'ours B/segment':>16}{'window-bound':>14}"
        f"{other + ' B/segment':>16}{'window-bound':>14}"
    )
    lines = [
        "",
        "asyncProduce, the clients' sockets (best pass of each side): bytes per TCP segment sent and the share of "
        "the run their sends waited for the broker's receive window.",
        "A broker that falls behind fills its window; the client's calls then leave in big segments, at less "
        "client CPU per call (README, Benchmarks).",
        head,
        "-" * len(head),
    ]
    for c in cells:
        row = f"{c['item_size']:>7}{c['clients']:>4}"
        for side in ("ours", other):
            best = max(c[f"{side}_runs"], key=lambda r: r["items_per_s"])
            size, bound = best.get("client_segment_bytes"), best.get("client_window_limited")
            row += f"{size:>16,.0f}" if size is not None else f"{'-':>16}"
            row += f"{bound:>14.0%}" if bound is not None else f"{'-':>14}"
        lines.append(row)
    return lines


def render(
    machine: dict[str, Any],
    config: dict[str, Any],
    brokers: list[dict[str, Any]],
    results: list[Result],
    goals: list[dict[str, Any]],
    comparisons: dict[str, list[dict[str, Any]]],
) -> str:
    ours_broker = next(b for b in brokers if b["side"] == "ours")
    passes = config["passes"]
    lines = [
        "luxun broker benchmark (Thrift QueueService, thriftpy2 clients)",
        f"machine: {machine['cpu']}, {machine['cores']} cores ({machine['cores_usable']} usable), "
        f"{machine['ram_gib']} GiB RAM; {machine['os']}, Linux {machine['kernel']}",
        f"python {machine['python']}, thriftpy2 {machine['thriftpy2']} (Cython binary protocol, framed transport, "
        f"TCP_NODELAY); git {machine['git_commit']}" + (f"; {machine['java']}" if "java" in machine else ""),
        f"load average (1, 5, 15 min) at start {machine['load_average_start']}, at end {machine['load_average_end']}",
        ("broker: own" if ours_broker["own"] else f"broker: external, {ours_broker['host']}:{ours_broker['port']}")
        + f"; data dir {machine['data_dir']} ({machine['data_dir_filesystem']}); placement: {config['placement']}",
        f"brokers in turn, per item size: {' '.join(passes)}"
        + (
            " (each started fresh, new data dir, warmed up); each side's figure is the median of its passes"
            if len(passes) > 1
            else ""
        ),
        f"clients: separate processes, one connection each; topics: {config['topics']} "
        f"({'one per client' if config['topics'] == 'own' else 'one for all; each consumer its own group/index'})",
        f"budget per run: {config['seconds']} s / {config['items']} items / {config['max_mb']} MiB (split over the "
        f"clients), after a warm-up of {config['warmup_seconds']} s / {config['warmup_items']} items per client; "
        f"consume topics pre-filled with min({config['prefill_items']} items, {config['prefill_mb']} MiB) each",
        "rates over the span first client start -> last client end (async_produce: first send -> getSize saw every "
        "item; only items read back and checked count); MB = 10^6 bytes; p50/p99: per sync call",
        "CPU: broker / all clients, CPU seconds per wall second (2.00 = two cores busy)"
        + (
            f"; every run is the median of {config['repeat']} runs, spread = (max - min) / median items/s"
            if config["repeat"] > 1
            else ""
        ),
        "",
    ]
    repeats = config["repeat"] > 1
    head = (
        f"{'workload':<14}{'size B':>7}{'cli':>4}{'calls/s':>10}{'items/s':>10}{'MB/s':>9}"
        + (f"{'spread':>7}" if repeats else "")
        + f"{'p50 us':>9}{'p99 us':>9}{'brk CPU':>8}{'cli CPU':>8}  {'stopped by'}"
    )
    lines += ["ours:", head, "-" * len(head)]
    for r in sorted(results, key=lambda r: cell_order((r.workload, r.item_size, r.clients))):
        lat = f"{r.p50_us:>9.0f}{r.p99_us:>9.0f}" if r.p50_us is not None else f"{'-':>9}{'-':>9}"
        cpu = "".join(f"{x:>8.2f}" if x is not None else f"{'-':>8}" for x in (r.broker_cpu, r.client_cpu))
        lines.append(
            f"{r.workload:<14}{r.item_size:>7}{r.clients:>4}{fmt_rate(r.calls_per_s):>10}"
            f"{fmt_rate(r.items_per_s):>10}{r.mb_per_s:>9.1f}"
            + (f"{r.spread:>7.0%}" if repeats else "")
            + f"{lat}{cpu}  {r.stopped_by}"
        )
    if "java" in comparisons:
        lines += render_comparison(
            comparisons["java"],
            "java",
            "ours against Java Luxun, same run (items/s: the median of each side's passes, +- their spread; "
            "us/call: the broker's CPU per call, median; ratio and cpu ratio = ours / Java; pass pairs: "
            "the ratio of each ABBA pair)",
        )
        judged = [c for c in comparisons["java"] if c["reached"] is not None]
        lines.append(f"1-client cells at >= 1.0x Java: {sum(c['reached'] for c in judged)} of {len(judged)}")
        cpu = [c for c in comparisons["java"] if c.get("cpu_reached") is not None]
        lines.append(
            f"small-call cells (produce, one item per call, <= 10 KB) with CPU per call <= Java's: "
            f"{sum(c['cpu_reached'] for c in cpu)} of {len(cpu)}"
        )
        lines += render_send_sockets(comparisons["java"], "java")
    else:
        lines += ["", "Java Luxun: no ratio was measured in this run (give --java PATH to the Java Luxun build)."]
    if NO_POLL_SIDE in comparisons:
        lines += render_comparison(
            comparisons[NO_POLL_SIDE],
            NO_POLL_SIDE,
            f"ours (busy.poll.us 200, the default) against {NO_POLL_SIDE} (busy.poll.us=0), same turns: what busy "
            "polling gains in rate (ratio) and costs in broker CPU per call (cpu ratio)",
        )
    for side in FLOOR_SIDES:
        if side in comparisons:
            measured = ", ".join(dict.fromkeys(c["workload"] for c in comparisons[side])) or "nothing"
            lines += render_comparison(
                comparisons[side],
                side,
                f"ours against the {side} ({measured}; canned replies, oneway calls counted; medians of the "
                "passes; ratio = ours / floor: the share of the floor we reach; us/call: each server's CPU per call)",
            )
    lines += [
        "",
        "brokers:",
        *(f"  {side:<16}{SIDE_TEXT[side]}" for side in dict.fromkeys(passes)),
        "workloads:",
        *(f"  {w:<14}{WORKLOAD_TEXT[w]}" for w in WORKLOADS),
        "",
        "targets (ours, judged on 1 client; other client counts shown for information):",
    ]
    for g in goals:
        mark = {True: "reached    ", False: "NOT reached", None: "n/a        "}[g["reached"]]
        lines.append(f"  [{mark}] {g['target']}: {g['shown']}")
        if g["detail"]:
            lines.append(f"                {g['detail']}")
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", help=f"item sizes in bytes, at least 8 (default {DEFAULT_SIZES}; --quick {QUICK_SIZES})")
    p.add_argument("--clients", default=DEFAULT_CLIENTS, help=f"client process counts (default {DEFAULT_CLIENTS})")
    p.add_argument(
        "--java",
        nargs="?",
        type=Path,
        const=default_java_peer(),
        help="the Java Luxun build to run against ours, in ABBA turns per item size\n"
        f"(default PATH: ${{LUXUN_JAVA_PEER}} or {default_java_peer()})",
    )
    p.add_argument("--java-opts", default="", help="JVM options for the Java broker, e.g. '-Xmx2g' (default none)")
    p.add_argument(
        "--floor",
        action="store_true",
        help="also run " + ", ".join(FLOOR_WORKLOADS) + " against servers with an empty handler\n"
        "that answer canned replies and count oneway calls (raw socket threads, one epoll thread,\n"
        "thriftpy2);\n"
        "with --java, each floor's ratio to Java is shown",
    )
    p.add_argument(
        "--floors",
        default=",".join(FLOOR_SIDES),
        help="with --floor: which floor servers (default all: " + ",".join(FLOOR_SIDES) + ")",
    )
    p.add_argument(
        "--no-poll-side",
        action="store_true",
        help=f"also run our broker with busy.poll.us=0 ({NO_POLL_SIDE}) in the same turns: busy polling's gain and CPU",
    )
    p.add_argument("--rounds", type=int, help="ABBA turns per item size with --java/--floor (default 1)")
    p.add_argument(
        "--broker-warmup-seconds",
        type=float,
        help="untimed calls of every kind after each broker start (default 1; --quick 0.2)",
    )
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of " + ",".join(WORKLOADS))
    p.add_argument(
        "--topics",
        choices=("own", "shared"),
        default="own",
        help="own: a topic per client (default); shared: one topic, each consumer its own group/index",
    )
    p.add_argument("--seconds", type=float, help="max timed seconds per run (default 3; --quick 0.5)")
    p.add_argument(
        "--items", type=int, help="max items per run, all clients together (default 5000000; --quick 300000)"
    )
    p.add_argument("--max-mb", type=float, help="max MiB per run, all clients together (default 4096; --quick 512)")
    p.add_argument("--warmup-seconds", type=float, help="warm-up per client, untimed (default 0.5; --quick 0.1)")
    p.add_argument("--warmup-items", type=int, help="max warm-up items per client (default 20000; --quick 2000)")
    p.add_argument("--prefill-items", type=int, help="items per consume topic (default 200000; --quick 20000)")
    p.add_argument("--prefill-mb", type=float, help="max MiB per consume topic (default 64; --quick 8)")
    p.add_argument(
        "--drain-seconds", type=float, help="max wait for oneway items to arrive, and for a prefill (default 30)"
    )
    p.add_argument(
        "--fetch-bytes", type=int, default=DEFAULT_FETCH_BYTES, help="maxFetchSize of *_fetch (default 1 MiB)"
    )
    p.add_argument(
        "--placement",
        choices=("free", "same", "split"),
        default="free",
        help="free: the OS places processes (default); same: broker and clients on the first CPU;\n"
        "split: broker on the first CPU, clients on the others (own broker only)",
    )
    p.add_argument("--broker", help="host:port of a running broker to use instead of starting one")
    p.add_argument(
        "--password",
        help="with --broker: the deleteTopic password to send (as a client sends it),\nso the bench topics are deleted",
    )
    p.add_argument("--data-dir", type=Path, help="where the broker's temporary data dir goes (default: /tmp)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    p.add_argument(
        "--repeat", type=int, help="runs per workload, size and client count; the median is shown (default 1)"
    )
    p.add_argument("--quick", action="store_true", help="short smoke run: small budgets")
    args = p.parse_args(argv)
    for name, (full, quick) in BUDGETS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    try:
        args.sizes = [int(s) for s in (args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)).split(",") if s]
        args.clients = sorted({int(s) for s in args.clients.split(",") if s.strip()})
    except ValueError:
        p.error("--sizes and --clients take integers, e.g. 100,1000")
    if not args.sizes or min(args.sizes) < STAMP.size:
        p.error(f"--sizes must be at least {STAMP.size} (async_produce stamps each item)")
    if not args.clients or min(args.clients) <= 0:
        p.error("--clients must be positive")
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown or not names:
        p.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    args.workloads = [w for w in WORKLOADS if w in names]
    args.java_opts = shlex.split(args.java_opts)
    args.java_peer = None
    if args.java is not None:
        if args.broker:
            p.error("--java starts its own brokers (not with --broker)")
        try:
            args.java_peer = JavaPeer.at(args.java)
        except FileNotFoundError as e:
            p.error(str(e))
    args.floors = [f.strip() for f in args.floors.split(",") if f.strip()]
    if not args.floors or set(args.floors) - set(FLOOR_SIDES):
        p.error(f"--floors: choose from {list(FLOOR_SIDES)}")
    args.floors = [f for f in FLOOR_SIDES if f in args.floors]
    if args.no_poll_side and args.broker:
        p.error("--no-poll-side starts its own brokers (not with --broker)")
    if args.floor and args.broker:
        p.error("--floor starts its own servers (not with --broker)")
    if args.placement != "free":
        if args.broker:
            p.error("--placement needs the broker this program starts (not --broker)")
        if args.placement == "split" and len(os.sched_getaffinity(0)) < 2:
            p.error("--placement split needs at least 2 usable CPUs")
    return args


def placement_cpus(placement: str) -> tuple[list[int] | None, list[int] | None]:
    """(broker CPUs, client CPUs) for ``--placement``; None: leave it to the OS."""
    cpus = sorted(os.sched_getaffinity(0))
    if placement == "same":
        return cpus[:1], cpus[:1]
    if placement == "split":
        return cpus[:1], cpus[1:]
    return None, None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    extra = {"thriftpy2": importlib.metadata.version("thriftpy2")}
    if args.java_peer:
        extra["java"] = java_version()
    machine = machine_info(args.data_dir, **extra)
    broker_cpus, client_cpus = placement_cpus(args.placement)
    sides = (
        ["ours"]
        + (["java"] if args.java_peer else [])
        + ([NO_POLL_SIDE] if args.no_poll_side else [])
        + (args.floors if args.floor else [])
    )
    passes = (sides + sides[::-1]) * args.rounds if len(sides) > 1 else sides
    # One broker for all sizes when ours runs alone (as before); else fresh brokers per size, in turns.
    blocks = (
        [(args.sizes, side) for side in passes]
        if len(sides) == 1
        else [([size], side) for size in args.sizes for side in passes]
    )
    runs: dict[str, dict[Cell, list[Result]]] = {}
    brokers: list[dict[str, Any]] = []
    tag = f"bench-{secrets.token_hex(3)}"
    for sizes, side in blocks:
        served = FLOOR_C_WORKLOADS if side == "floor-c" else FLOOR_WORKLOADS
        workloads = [w for w in args.workloads if w in served] if side in FLOOR_SIDES else args.workloads
        if not workloads:
            continue
        with side_broker(side, args, broker_cpus, sizes) as broker:
            monitor, _ = connect(broker.host, broker.port)
            ctx = Context(
                host=broker.host,
                port=broker.port,
                broker_pid=broker.pid,
                password=broker.password,
                client_cpus=client_cpus,
                monitor=monitor,
                args=args,
                tag=tag,
                side=side,
            )
            if ctx.password is None and side not in FLOOR_SIDES:
                print("bench_broker: no --password: the bench topics stay on the broker", file=sys.stderr)
            for result in run_block(ctx, sizes, workloads):
                runs.setdefault(side, {}).setdefault((result.workload, result.item_size, result.clients), []).append(
                    result
                )
            monitor._iprot.trans.close()
        brokers.append({"side": side, "sizes": sizes, **broker_json(broker)})
    machine["load_average_end"] = load_average()
    config = {k: getattr(args, k) for k in BUDGETS} | {
        "sizes": args.sizes,
        "clients": args.clients,
        "workloads": args.workloads,
        "topics": args.topics,
        "fetch_bytes": args.fetch_bytes,
        "placement": args.placement,
        "broker_cpus": broker_cpus,
        "client_cpus": client_cpus,
        "quick": args.quick,
        "sides": sides,
        "passes": passes,
        "java_build": str(args.java_peer.root) if args.java_peer else None,
        "java_opts": args.java_opts,
    }
    results = list(best_runs(runs, "ours").values())
    goals = targets(results)
    comparisons = {side: compare(runs, side) for side in sides[1:]}
    java_median = {
        (c["workload"], c["item_size"], c["clients"]): c["java_items_per_s"] for c in comparisons.get("java", [])
    }
    for side in FLOOR_SIDES:
        for row in comparisons.get(side, []):
            java = java_median.get((row["workload"], row["item_size"], row["clients"]))
            if java:
                row["floor_over_java"] = row[f"{side}_items_per_s"] / java
    print(render(machine, config, brokers, results, goals, comparisons))
    report = {
        "benchmark": "bench_broker",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": machine,
        "config": config,
        "brokers": brokers,
        "sides": {side: SIDE_TEXT[side] for side in sides},
        "workloads": WORKLOAD_TEXT,
        "results": [r.to_json() for r in results],
        "java_luxun": {
            "measured_in_this_run": bool(args.java_peer),
            "ratio": "ours items/s / Java items/s, the median of each side's passes",
            "goals": {f"{c} client(s)": g for c, g in RATIO_TARGETS.items()},
            "cells": comparisons.get("java", []),
        },
        "floor": {side: comparisons[side] for side in FLOOR_SIDES if side in comparisons},
        "targets": [{k: v for k, v in g.items() if k != "shown"} for g in goals],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nresults written to {args.json} ({report['duration_s']} s)")
    return 0


def broker_json(broker: BrokerInfo) -> dict[str, Any]:
    return {
        "own": broker.pid is not None,
        "host": broker.host,
        "port": broker.port,
        "command": [("plain:<random>" if a.startswith("plain:") else a) for a in broker.command],
        "exit_code": broker.exit_code,
        "stop_seconds": broker.stop_seconds,
    }


def run_block(ctx: Context, sizes: list[int], workloads: list[str]) -> list[Result]:
    """Every run of ``workloads`` at ``sizes`` on the broker of ``ctx``, each the median of --repeat."""
    args = ctx.args
    results = []
    for size in sizes:
        item = os.urandom(size)
        if ctx.side in ("ours", NO_POLL_SIDE, "java"):
            warm_broker(ctx, item)
        for workload in (w for w in workloads if w in WRITE_WORKLOADS):
            for clients in args.clients:
                runs = [run_write(ctx, workload, size, clients, item, i) for i in range(args.repeat)]
                results.append(median_result(runs))
        consume = [w for w in workloads if w in CONSUME_WORKLOADS]
        if consume:
            pool = topics_for(ctx, f"consume-{size}", max(args.clients))
            pool = list(dict.fromkeys(pool))
            try:
                os.sync()
                filled = prefill(ctx, pool, size, item)
                os.sync()  # the prefill's write-back is not left to the timed reads
                settle(ctx)
                for workload in consume:
                    for clients in args.clients:
                        runs = [run_consume(ctx, workload, size, clients, filled, pool, i) for i in range(args.repeat)]
                        results.append(median_result(runs))
            finally:
                delete_topics(ctx, pool)
    return results


if __name__ == "__main__":
    sys.exit(main())
