"""Benchmark the luxun broker over Thrift (QueueService, framed transport, binary protocol).

A program, not a test::

    .venv/bin/python perf/bench_broker.py            # full run (~5 min on 2 cores)
    .venv/bin/python perf/bench_broker.py --quick    # smoke run (~1 min)
    .venv/bin/python perf/bench_broker.py --workloads produce --sizes 100 --placement split
    .venv/bin/python perf/bench_broker.py --broker 127.0.0.1:9092 --password secret
    .venv/bin/python perf/bench_broker.py --help

It starts its own broker (``python -m luxun.cli serve``) on 127.0.0.1, on a free port,
with a temporary data directory that is removed afterwards, and stops it with SIGTERM;
``--broker host:port`` uses a running broker instead.

Workloads, per item size (``--sizes``) and per number of client processes
(``--clients``; every client is its own process with its own connection):

==============  ======================================================================
produce         sync ``produce``, one item per call
async_produce   oneway ``asyncProduce``; timed until every item has arrived (getSize
                polled from another connection until it reaches the expected count)
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
import socket
import sys
import time
import traceback
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _common import BrokerInfo, collect_reports, external_broker, fmt_rate, load_average, machine_info, own_broker  # noqa: E402
from thriftpy2.protocol import TCyBinaryProtocolFactory  # noqa: E402
from thriftpy2.thrift import TClient  # noqa: E402
from thriftpy2.transport import TCyFramedTransportFactory, TSocket  # noqa: E402

from idl import QueueService  # noqa: E402
from idl import luxun_thrift as T  # noqa: E402

MIB = 1 << 20
MB = 1_000_000
SUCCESS = T.ResultCode.SUCCESS
TRY_LATER = T.ResultCode.TRY_LATER

DEFAULT_SIZES = "100,1000,10000,100000"
DEFAULT_CLIENTS = "1,4"
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
    "async_produce": "oneway asyncProduce; timed until getSize sees every item",
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
}

#: The Java Luxun broker measured earlier on this machine with the same thriftpy2 client and
#: one connection (/work/shared/notes/performance-facts.md). NOT measured by this program:
#: no Java Luxun build is available here. (workload, size, clients) -> (value, unit).
JAVA_LUXUN: dict[tuple[str, int, int], tuple[float, str]] = {
    ("produce", 100, 1): (19e3, "calls/s"),
    ("async_produce", 1000, 1): (87e3, "items/s"),
    ("async_produce", 100_000, 1): (236.0, "MB/s"),
    # The notes say "consume with 1 MiB fetches", not whether by group or by index.
    ("group_fetch", 100, 1): (1.45e6, "items/s"),
    ("group_fetch", 100_000, 1): (730.0, "MB/s"),
    ("index_fetch", 100, 1): (1.45e6, "items/s"),
    ("index_fetch", 100_000, 1): (730.0, "MB/s"),
}
JAVA_LUXUN_SOURCE = (
    "Java Luxun, measured earlier on this machine, same client (thriftpy2, 1 connection); "
    "from /work/shared/notes/performance-facts.md, NOT measured in this run (no Java Luxun build is available here)"
)

#: The issue's targets: (label, workload, size, metric, goal). Judged on 1 client, like the Java figures.
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


def make_step(client: Any, spec: dict[str, Any], worker: int, phase: str) -> Step:
    """One client's unit of work for ``spec["workload"]``: ``step(left)`` does one call (or a
    chunk of oneway calls, at most ``left`` items) and returns (calls, items)."""
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

        def async_step(left: int) -> tuple[int, int]:
            k = min(ASYNC_CHUNK, left)
            for _ in range(k):
                async_produce(request)
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
        client, _ = connect(spec["host"], spec["port"])
        topic = spec["topic"]
        workload = spec["workload"]
        warm_sent = 0
        if spec["warmup_items"] > 0:
            step = make_step(client, spec, worker, "warm")
            _, warm_sent, _ = run_loop(step, spec["warmup_items"], spec["warmup_seconds"], None)
            if workload in ("async_produce", "prefill"):
                topic_size(client, topic)  # a round trip: the broker has handled every oneway call before it
        step = make_step(client, spec, worker, "run")
        latencies = array("q") if workload not in ("async_produce", "prefill") else None
        barrier.wait(BARRIER_TIMEOUT_S)
        cpu0 = time.process_time()
        broker0 = process_cpu_s(spec["broker_pid"])
        t0 = time.perf_counter()
        calls, items, stopped = run_loop(step, spec["count"], spec["seconds"], latencies)
        t1 = time.perf_counter()
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
    calls: int
    items: int
    seconds: float
    stopped_by: str  # "count", "time", "drain-timeout" (async_produce: not every item arrived in time)
    p50_us: float | None = None
    p99_us: float | None = None
    broker_cpu: float | None = None  # broker CPU seconds / wall seconds (1.0 = one core busy)
    client_cpu: float | None = None  # all clients' CPU seconds / wall seconds
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

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "calls_per_s": self.calls_per_s,
            "items_per_s": self.items_per_s,
            "mb_per_s": self.mb_per_s,
            "spread": self.spread,
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
    broker_end = broker_cpu_end if end is not None else last["broker_cpu1"]
    if first["broker_cpu0"] is not None and broker_end is not None and seconds > 0:
        broker_cpu = (broker_end - first["broker_cpu0"]) / seconds
    return Result(
        workload=workload,
        item_size=size,
        clients=clients,
        topics=ctx.args.topics,
        calls=sum(r["calls"] for r in reports),
        items=sum(r["items"] for r in reports),
        seconds=seconds,
        stopped_by="+".join(stops),
        p50_us=percentile(lat, 0.50) / 1000 if lat else None,
        p99_us=percentile(lat, 0.99) / 1000 if lat else None,
        broker_cpu=broker_cpu,
        client_cpu=sum(r["cpu_s"] for r in reports) / seconds if seconds > 0 else None,
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
        expected = dict.fromkeys(topics, 1)  # the item that created the topic
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
            result.items -= arrived_missing
            result.calls -= arrived_missing
        send_s = sent_end - min(r["t0"] for r in reports)
        result.extra = {
            "send_seconds": send_s,
            "send_items_per_s": sum(r["items"] for r in reports) / send_s if send_s > 0 else 0.0,
            "drain_seconds": now - sent_end,
            "missing_items": arrived_missing,
        }
        return result
    finally:
        delete_topics(ctx, topics)


def prefill(ctx: Context, topics: list[str], size: int, item: bytes) -> dict[str, tuple[int, int]]:
    """Fill each topic with asyncProduce (one process per topic, in parallel).
    Returns topic -> (tail, head)."""
    args = ctx.args
    count = max(1, min(int(args.prefill_items), int(args.prefill_mb * MIB) // size))
    specs = []
    for topic in topics:
        spec = base_spec(ctx, "prefill", item, topic)
        spec |= {"count": count, "seconds": args.drain_seconds, "warmup_items": 0, "warmup_seconds": 0}
        specs.append(spec)
    t = time.perf_counter()
    reports = run_clients(specs, BARRIER_TIMEOUT_S + args.drain_seconds + 60)
    elapsed = time.perf_counter() - t
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
    total = sum(r["items"] for r in reports)
    print(
        f"  prefill {len(topics)} topic(s) x {count} items of {size} B: {elapsed:.1f} s "
        f"({total / elapsed / 1e3:.0f} k items/s, {total * size / elapsed / MB:.0f} MB/s incl. process start)",
        file=sys.stderr,
        flush=True,
    )
    return out


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
        f"  {r.workload:<13} {r.item_size:>7} B  {r.clients} client(s)  {r.items:>9} items  {r.seconds:6.2f} s  "
        f"{fmt_rate(r.calls_per_s):>8} calls/s  {fmt_rate(r.items_per_s):>8} items/s  {r.mb_per_s:8.1f} MB/s"
        f"{lat}{cpu}  ({r.stopped_by})",
        file=sys.stderr,
        flush=True,
    )


# -- report ---------------------------------------------------------------------------------
def fmt_java(value: float, unit: str) -> str:
    if unit == "MB/s":
        return f"{value:.0f} MB/s"
    return f"{fmt_rate(value)} {unit.split('/')[0]}/s"


def targets(results: list[Result]) -> list[dict[str, Any]]:
    """The issue's targets, judged on the 1-client runs (the 4-client value shown too)."""
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
        java = JAVA_LUXUN.get((workload, size, 1))
        detail = "; ".join(others + ([f"Java Luxun (earlier, not this run): {fmt_java(*java)}"] if java else []))
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
                "detail": detail,
            }
        )
    return out


def fmt_metric(value: float, metric: str) -> str:
    if metric == "mb_per_s":
        return f"{value:.0f} MB/s"
    return f"{fmt_rate(value)} {'calls' if metric == 'calls_per_s' else 'items'}/s"


def render(
    machine: dict[str, Any],
    config: dict[str, Any],
    broker: BrokerInfo,
    results: list[Result],
    goals: list[dict[str, Any]],
) -> str:
    lines = [
        "luxun broker benchmark (Thrift QueueService, thriftpy2 clients)",
        f"machine: {machine['cpu']}, {machine['cores']} cores ({machine['cores_usable']} usable), "
        f"{machine['ram_gib']} GiB RAM; {machine['os']}, Linux {machine['kernel']}",
        f"python {machine['python']}, thriftpy2 {machine['thriftpy2']} (Cython binary protocol, framed transport, "
        f"TCP_NODELAY); git {machine['git_commit']}",
        f"load average (1, 5, 15 min) at start {machine['load_average_start']}, at end {machine['load_average_end']}",
        f"broker: {'own, pid ' + str(broker.pid) if broker.pid else 'external'} on {broker.host}:{broker.port}; "
        f"data dir {machine['data_dir']} ({machine['data_dir_filesystem']}); placement: {config['placement']}",
        f"clients: separate processes, one connection each; topics: {config['topics']} "
        f"({'one per client' if config['topics'] == 'own' else 'one for all; each consumer its own group/index'})",
        f"budget per run: {config['seconds']} s / {config['items']} items / {config['max_mb']} MiB (split over the "
        f"clients), after a warm-up of {config['warmup_seconds']} s / {config['warmup_items']} items per client; "
        f"consume topics pre-filled with min({config['prefill_items']} items, {config['prefill_mb']} MiB) each",
        "rates over the span first client start -> last client end (async_produce: -> getSize saw every item); "
        "MB = 10^6 bytes; p50/p99: per sync call",
        "CPU: broker / all clients, CPU seconds per wall second (2.00 = two cores busy)"
        + (
            f"; every row is the median of {config['repeat']} runs, spread = (max - min) / median items/s"
            if config["repeat"] > 1
            else "; one run per row"
        ),
        "",
    ]
    repeats = config["repeat"] > 1
    head = (
        f"{'workload':<14}{'size B':>7}{'cli':>4}{'calls/s':>10}{'items/s':>10}{'MB/s':>9}"
        + (f"{'spread':>7}" if repeats else "")
        + f"{'p50 us':>9}{'p99 us':>9}{'brk CPU':>8}{'cli CPU':>8}  {'Java Luxun*':<16}{'stopped by'}"
    )
    lines += [head, "-" * len(head)]
    order = {w: i for i, w in enumerate(WORKLOADS)}
    for r in sorted(results, key=lambda r: (order[r.workload], r.item_size, r.clients)):
        java = JAVA_LUXUN.get((r.workload, r.item_size, r.clients))
        lat = f"{r.p50_us:>9.0f}{r.p99_us:>9.0f}" if r.p50_us is not None else f"{'-':>9}{'-':>9}"
        cpu = "".join(f"{x:>8.2f}" if x is not None else f"{'-':>8}" for x in (r.broker_cpu, r.client_cpu))
        lines.append(
            f"{r.workload:<14}{r.item_size:>7}{r.clients:>4}{fmt_rate(r.calls_per_s):>10}"
            f"{fmt_rate(r.items_per_s):>10}{r.mb_per_s:>9.1f}"
            + (f"{r.spread:>7.0%}" if repeats else "")
            + f"{lat}{cpu}  "
            f"{fmt_java(*java) if java else '':<16}{r.stopped_by}"
        )
    lines += [
        f"* {JAVA_LUXUN_SOURCE}.",
        "  The notes give one 'consume with 1 MiB fetches' figure; it is shown for both group_fetch and index_fetch.",
        "",
        "workloads:",
        *(f"  {w:<14}{WORKLOAD_TEXT[w]}" for w in WORKLOADS),
        "",
        "targets (judged on 1 client, as the Java figures; other client counts shown for information):",
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
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"item sizes in bytes (default {DEFAULT_SIZES})")
    p.add_argument("--clients", default=DEFAULT_CLIENTS, help=f"client process counts (default {DEFAULT_CLIENTS})")
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
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        args.clients = sorted({int(s) for s in args.clients.split(",") if s.strip()})
    except ValueError:
        p.error("--sizes and --clients take integers, e.g. 100,1000")
    if not args.sizes or min(args.sizes) <= 0:
        p.error("--sizes must be positive")
    if not args.clients or min(args.clients) <= 0:
        p.error("--clients must be positive")
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown or not names:
        p.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    args.workloads = [w for w in WORKLOADS if w in names]
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
    machine = machine_info(args.data_dir, thriftpy2=importlib.metadata.version("thriftpy2"))
    broker_cpus, client_cpus = placement_cpus(args.placement)
    results: list[Result] = []
    broker_cm = (
        external_broker(args.broker, args.password)
        if args.broker
        else own_broker(args.data_dir, "bench_broker", broker_cpus)
    )
    with broker_cm as broker:
        monitor, _ = connect(broker.host, broker.port)
        ctx = Context(
            host=broker.host,
            port=broker.port,
            broker_pid=broker.pid,
            password=broker.password,
            client_cpus=client_cpus,
            monitor=monitor,
            args=args,
            tag=f"bench-{secrets.token_hex(3)}",
        )
        if ctx.password is None:
            print("bench_broker: no --password: the bench topics stay on the broker", file=sys.stderr)
        for size in args.sizes:
            item = os.urandom(size)
            for workload in (w for w in args.workloads if w in WRITE_WORKLOADS):
                for clients in args.clients:
                    runs = [run_write(ctx, workload, size, clients, item, i) for i in range(args.repeat)]
                    results.append(median_result(runs))
            consume = [w for w in args.workloads if w in CONSUME_WORKLOADS]
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
                            runs = [
                                run_consume(ctx, workload, size, clients, filled, pool, i) for i in range(args.repeat)
                            ]
                            results.append(median_result(runs))
                finally:
                    delete_topics(ctx, pool)
        monitor._iprot.trans.close()
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
    }
    goals = targets(results)
    print(render(machine, config, broker, results, goals))
    report = {
        "benchmark": "bench_broker",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": machine,
        "config": config,
        "broker": {
            "own": broker.pid is not None,
            "host": broker.host,
            "port": broker.port,
            "command": [("plain:<random>" if a.startswith("plain:") else a) for a in broker.command],
            "exit_code": broker.exit_code,
            "stop_seconds": broker.stop_seconds,
        },
        "workloads": WORKLOAD_TEXT,
        "results": [r.to_json() for r in results],
        "java_luxun": {
            "source": JAVA_LUXUN_SOURCE,
            "measured_in_this_run": False,
            "figures": [
                {"workload": w, "item_size": s, "clients": c, "value": v, "unit": u}
                for (w, s, c), (v, u) in JAVA_LUXUN.items()
            ],
        },
        "targets": [{k: v for k, v in g.items() if k != "shown"} for g in goals],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nresults written to {args.json} ({report['duration_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
