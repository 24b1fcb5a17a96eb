"""Benchmark the Python clients end to end: Producer -> broker -> StreamConsumer.

A program, not a test::

    .venv/bin/python perf/bench_clients.py            # full run (~3-4 min on 2 cores)
    .venv/bin/python perf/bench_clients.py --quick    # smoke run (~40 s)
    .venv/bin/python perf/bench_clients.py --sweeps batch --seconds 5
    .venv/bin/python perf/bench_clients.py --broker 127.0.0.1:9092 --password secret
    .venv/bin/python perf/bench_clients.py --profile  # one cProfiled end-to-end run instead
    .venv/bin/python perf/bench_clients.py --help

It starts its own broker (``python -m luxun.cli serve``) on 127.0.0.1, on a free port,
with a temporary data directory that is removed afterwards; ``--broker host:port`` uses
a running broker instead.

Each configuration (message size, producer batch size, codec) is measured three ways,
each in fresh processes (fork) and on fresh topics:

==============  ======================================================================
end_to_end      a producer process (``Producer.send`` in a loop, then ``flush``) and a
                stream-consumer process (``StreamConsumer``, one stream, counting
                messages) run at the same time; timed from the producer's first send
                to the consumer's last message (both read CLOCK_MONOTONIC)
producer        the producer process alone: ``send`` loop + ``flush``
consumer        the consumer process alone, reading the topic the ``producer`` run
                filled, pass after pass, each with a new group (a new StreamConsumer);
                each pass timed from creating the streams to its last message
==============  ======================================================================

Sweeps (``--sweeps``): ``batch`` = producer batch sizes 1, 10, 100, 1000 for 100 B
messages without compression (the shape of Table 10.3 of the HMB thesis in
../shared/seeds/003_4ad83c588116fe9a.txt); ``size`` = 100 B, 1 KB, 10 KB messages with
batches of 100 (packs of about 10 KB, 100 KB, 1 MB; the shape of Table 10.5);
``codec`` = none, gzip, snappy for 100 B and 1 KB messages in batches of 1000;
``commits`` = the consumer-with-commits cell: 100 B messages in batches of 1000, the
pre-filled topic read alone by ``StreamConsumer(auto_commit=False)`` (one stream, a new
group per pass) calling ``commit()`` every 1,000 and every 10,000 messages, and once per
pass only (the baseline), beside the ``auto_commit=True`` consumer alone of the same
configuration; it shows what precise commits cost (Issue 31). A configuration shared
by two sweeps is measured once.

Before/after a change to commits: ``--sweeps commits`` on each tree, in the same hour.
The cell uses only ``commit()``, so this file runs against older code too: e.g.
``git worktree add /tmp/before <old commit>``, copy this file into
``/tmp/before/perf/``, and run it there and here.

Every loop is bounded: the producer stops at a message count, a byte budget or a number
of seconds, whichever comes first (the clock is read between chunks of at most 1000
messages); the end-to-end consumer stops when it has every message the producer sent,
or at a deadline (``--seconds`` + ``--drain-seconds``); the consumer alone stops after
``--seconds`` of reading or ``--messages`` messages. Rates come from what was done.

``--profile`` runs, instead of the sweeps, one end-to-end run and one consumer-alone run
of ``--profile-config`` with every thread of both processes under cProfile, and writes
the top functions per thread to ``perf/results/bench_clients_profile.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import multiprocessing as mp
import os
import pstats
import random
import secrets
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _common import (  # noqa: E402
    BrokerInfo,
    collect_reports,
    dist_versions,
    external_broker,
    fmt_rate,
    load_average,
    machine_info,
    own_broker,
)

from clients.connection import BrokerConnection  # noqa: E402
from clients.consumer import StreamConsumer  # noqa: E402
from clients.errors import ConsumerTimeoutError  # noqa: E402
from clients.messages import GZIP, NO_COMPRESSION, SNAPPY, encode_pack, snappy_available  # noqa: E402
from clients.producer import Producer, ProducerConfig  # noqa: E402
from idl import luxun_thrift as T  # noqa: E402

MIB = 1 << 20
MB = 1_000_000
CODECS = {"none": NO_COMPRESSION, "gzip": GZIP, "snappy": SNAPPY}
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "bench_clients.json"
DEFAULT_PROFILE = Path(__file__).resolve().parent / "results" / "bench_clients_profile.txt"
SWEEPS = ("batch", "size", "codec", "commits")
#: The consumer-with-commits cell: one configuration, commit() every this many messages
#: (None: once, at the end of each pass).
COMMIT_EVERY: tuple[int | None, ...] = (None, 10_000, 1_000)
#: Messages sent between two reads of the clock (fewer for big messages: at most 1 MiB).
CHUNK_MAX_MESSAGES = 1000
#: Messages a consumer takes from its stream between two checks of the target and the clock.
CONSUMER_CHUNK = 1024
#: How long a stream waits for a message before the consumer loop looks at the clock.
CONSUMER_POLL_MS = 50
#: Most passes of the consumer-alone run over its pre-filled topic.
MAX_PASSES = 50
#: A pack may hold at most this many message bytes: the broker refuses items over 1 MiB.
MAX_BATCH_BYTES = 1_000_000
#: Seconds allowed for a child to connect and warm up.
SETUP_TIMEOUT_S = 60.0

#: name -> (full run, --quick run) for the budget options.
BUDGETS: dict[str, tuple[float, float]] = {
    "seconds": (4.0, 0.5),
    "messages": (5_000_000, 500_000),
    "max_mb": (1024, 128),
    "warmup_seconds": (0.3, 0.1),
    "warmup_messages": (20_000, 2_000),
    "drain_seconds": (30.0, 15.0),
}

MODE_TEXT = {"sync": "acknowledged produce", "async": "oneway asyncProduce"}
#: The issue's targets, end to end: 100 B messages/s with batching (best row with batch > 1),
#: and MB/s with 10 KB messages.
TARGET_MSGS = 500_000
TARGET_MBS = 150.0


@dataclass(frozen=True, order=True)
class Config:
    size: int
    batch: int
    codec: str

    @property
    def key(self) -> str:
        return f"{self.size}B/batch{self.batch}/{self.codec}"


COMMITS_CONFIG = Config(100, 1000, "none")


def sweep_configs(sweeps: list[str], codecs: list[str]) -> dict[str, list[Config]]:
    out: dict[str, list[Config]] = {}
    if "batch" in sweeps:
        out["batch"] = [Config(100, b, "none") for b in (1, 10, 100, 1000)]
    if "size" in sweeps:
        out["size"] = [Config(s, 100, "none") for s in (100, 1000, 10_000)]
    if "codec" in sweeps:
        out["codec"] = [Config(s, 1000, c) for s in (100, 1000) for c in codecs]
    if "commits" in sweeps:
        out["commits"] = [COMMITS_CONFIG]
    return out


# -- payloads -------------------------------------------------------------------------------
_WORDS = (
    "queue",
    "broker",
    "topic",
    "message",
    "producer",
    "consumer",
    "group",
    "index",
    "pack",
    "batch",
    "fanout",
    "stream",
    "thrift",
    "luxun",
    "kafka",
    "page",
    "file",
    "offset",
    "append",
    "read",
    "write",
    "commit",
    "retry",
    "timeout",
    "error",
    "level",
    "info",
    "debug",
    "warn",
    "user",
    "order",
    "item",
    "price",
    "amount",
    "status",
    "created",
    "updated",
    "id",
    "name",
    "value",
    "key",
    "event",
    "time",
    "date",
    "host",
    "port",
)


def make_pool(size: int, seed: int = 7) -> list[bytes]:
    """Distinct text-like messages of ``size`` bytes (log lines: words and numbers), enough
    of them (>= 256 KiB in all) that a codec's 32 KiB window never sees a message twice, so
    gzip/snappy compress them as they would real text (gzip to ~35%, snappy to ~55%), not as repeats."""
    rng = random.Random(seed)
    count = min(4096, max(64, -(-256 * 1024 // size)))
    pool = []
    for i in range(count):
        parts = [f"{i:08d} "]
        n = len(parts[0])
        while n < size:
            word = rng.choice(_WORDS) if rng.random() < 0.7 else str(rng.randrange(10**6))
            parts.append(word + (" " if rng.random() < 0.9 else ",\n"))
            n += len(parts[-1])
        pool.append("".join(parts).encode()[:size])
    return pool


# -- child processes ------------------------------------------------------------------------
def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads), from /proc."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ThreadProfiles:
    """cProfile every thread started after :meth:`start` (and the calling one)."""

    def __init__(self) -> None:
        self.profiles: list[tuple[str, cProfile.Profile]] = []
        self.main = cProfile.Profile()

    def start(self) -> None:
        def boot(frame: Any, event: str, arg: Any) -> None:
            prof = cProfile.Profile()
            self.profiles.append((threading.current_thread().name, prof))
            sys.setprofile(None)
            prof.enable()

        threading.setprofile(boot)
        self.main.enable()

    def stop(self) -> None:
        self.main.disable()
        threading.setprofile(None)  # type: ignore[arg-type]

    def report(self, title: str, top: int) -> str:
        out = io.StringIO()
        for name, prof in [("main thread (the application's loop)", self.main), *self.profiles]:
            stats = pstats.Stats(prof, stream=out)
            if not stats.stats:  # type: ignore[attr-defined]
                continue
            out.write(f"==== {title}: {name} ====\n")
            stats.sort_stats("tottime").print_stats(top)
        return out.getvalue()


def producer_settings(spec: dict[str, Any]) -> dict[str, Any]:
    size, batch = spec["size"], spec["batch"]
    return {
        "sync": spec["sync"],
        "batch_size": batch,
        "batch_bytes": max(ProducerConfig.batch_bytes, min(MAX_BATCH_BYTES, batch * size)),
        "linger_ms": spec["linger_ms"],
        "buffer_messages": max(2 * batch, min(ProducerConfig.buffer_messages, spec["buffer_mb"] * MIB // size)),
        "compression_codec": CODECS[spec["codec"]],
        "request_timeout_ms": int(spec["drain_seconds"] * 1000) + 30_000,
    }


def send_loop(producer: Producer, topic: str, pool: list[bytes], count: int, seconds: float) -> tuple[int, str]:
    """Send up to ``count`` messages for up to ``seconds``; return (sent, stopped_by)."""
    send = producer.send
    npool = len(pool)
    chunk = max(1, min(CHUNK_MAX_MESSAGES, MIB // len(pool[0])))
    clock = time.perf_counter
    deadline = clock() + seconds
    n = 0
    while n < count:
        if clock() >= deadline:
            return n, "time"
        k = min(chunk, count - n)
        for i in range(n, n + k):
            send(topic, pool[i % npool])
        n += k
    return n, "count"


def producer_main(spec: dict[str, Any], shared: dict[str, Any], results: Any) -> None:
    """One producer process: warm up, (meet the consumer), send, flush, report."""
    out: dict[str, Any] = {"role": "producer"}
    prof = ThreadProfiles() if spec.get("profile") else None
    try:
        pool = make_pool(spec["size"])
        topic = spec["topic"]
        if prof:
            prof.start()
        producer = Producer(spec["broker"], **producer_settings(spec))
        try:
            warm, _ = send_loop(producer, topic, pool, spec["warmup_messages"], spec["warmup_seconds"])
            if not producer.flush(SETUP_TIMEOUT_S):
                raise RuntimeError("the warm-up messages were not sent in time")
            warm_ok = producer.metrics()["sent"].get(topic, 0)
            if warm_ok != warm:
                raise RuntimeError(
                    f"warm-up: sent {warm}, the producer reports {warm_ok} (dropped: {producer.metrics()})"
                )
            shared["warm"].value = warm
            shared["warm_sent"].set()
            if shared.get("barrier") is not None:
                shared["barrier"].wait(SETUP_TIMEOUT_S)
            cpu0, broker0 = time.process_time(), cpu_seconds(spec["broker_pid"])
            t0 = time.perf_counter()
            sent, stopped_by = send_loop(producer, topic, pool, spec["count"], spec["seconds"])
            t_sent = time.perf_counter()
            shared["target"].value = sent  # the consumer now knows how many to wait for
            flushed = producer.flush(spec["drain_seconds"])
            t_flushed = time.perf_counter()
            cpu1, broker1 = time.process_time(), cpu_seconds(spec["broker_pid"])
            metrics = producer.metrics()
        finally:
            producer.close(10.0)
        if prof:
            prof.stop()
        dropped = sum(sum(d.values()) for d in metrics["dropped"].values())
        if dropped:
            shared["target"].value = sent - dropped
        out.update(
            warm=warm,
            sent=sent,
            delivered=metrics["sent"].get(topic, 0) - warm,
            dropped=dropped,
            dropped_detail=metrics["dropped"],
            flushed=flushed,
            stopped_by=stopped_by if flushed else "flush timeout",
            t0=t0,
            t_sent=t_sent,
            t_flushed=t_flushed,
            cpu_s=cpu1 - cpu0,
            broker_cpu_s=None if broker0 is None or broker1 is None else broker1 - broker0,
            settings={k: v for k, v in producer_settings(spec).items() if k != "request_timeout_ms"},
        )
        if prof:
            out["profile"] = prof.report("producer", spec["profile_top"])
    except BaseException as exc:  # reported to the parent, which fails the run
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        shared["warm_sent"].set()
        if shared.get("barrier") is not None:
            shared["barrier"].abort()
    results.put(out)


def consume_count(
    stream: Any, count: int | None, target: Any, deadline: float, size: int
) -> tuple[int, float, str, int]:
    """Take messages from ``stream`` until ``count`` (or ``target.value`` once it is > 0) or
    ``deadline``; return (messages, time of the last one, stopped_by, messages of a wrong size)."""
    clock = time.perf_counter
    poll_s = CONSUMER_POLL_MS / 1000
    n = bad = 0
    t_last = clock()
    while True:
        goal = count if count is not None else (target.value or None)
        if goal is not None and n >= goal:
            return n, t_last, "count", bad
        if clock() >= deadline:
            return n, t_last, "time", bad
        k = CONSUMER_CHUNK if goal is None else min(CONSUMER_CHUNK, goal - n)
        before = n
        m = b""
        try:
            for m in islice(stream, k):  # noqa: B007 - the last one is checked below
                n += 1
            t_last = clock()
        except ConsumerTimeoutError:
            # The stream waited CONSUMER_POLL_MS after the last message it handed out.
            if n > before:
                t_last = clock() - poll_s
        if n > before and len(m) != size:
            bad += 1


def open_stream(spec: dict[str, Any], group: str, auto_commit: bool = True) -> tuple[StreamConsumer, Any]:
    consumer = StreamConsumer(
        spec["broker"],
        group,
        consumer_timeout_ms=CONSUMER_POLL_MS,
        wait_ms=spec["wait_ms"],
        fetch_bytes=spec["fetch_bytes"],
        auto_commit=auto_commit,
    )
    return consumer, consumer.create_message_streams({spec["topic"]: 1})[spec["topic"]][0]


def consumer_main(spec: dict[str, Any], shared: dict[str, Any], results: Any) -> None:
    """The end-to-end stream consumer: warm up, meet the producer, count until the producer's
    total (``shared["target"]``, known once it has sent everything) or the deadline."""
    out: dict[str, Any] = {"role": "consumer"}
    prof = ThreadProfiles() if spec.get("profile") else None
    consumer = None
    try:
        if prof:
            prof.start()
        consumer, stream = open_stream(spec, spec["group"])
        if not shared["warm_sent"].wait(SETUP_TIMEOUT_S):
            raise RuntimeError("the producer did not finish its warm-up")
        want = shared["warm"].value
        warm, _, why, _ = consume_count(stream, want, None, time.perf_counter() + SETUP_TIMEOUT_S, spec["size"])
        if warm != want:
            raise RuntimeError(f"warm-up: received {warm} of {want} messages ({why})")
        shared["barrier"].wait(SETUP_TIMEOUT_S)
        cpu0, broker0 = time.process_time(), cpu_seconds(spec["broker_pid"])
        t_start = time.perf_counter()
        deadline = t_start + spec["seconds"] + spec["drain_seconds"]
        n, t_last, stopped_by, bad = consume_count(stream, None, shared["target"], deadline, spec["size"])
        cpu1, broker1 = time.process_time(), cpu_seconds(spec["broker_pid"])
        consumer.close(10.0)
        extra = sum(1 for _ in islice(stream, 1_000_000))  # fetched but beyond the target: must be none
        if prof:
            prof.stop()
        out.update(
            warm=warm,
            received=n,
            extra=extra,
            wrong_size=bad,
            stopped_by=stopped_by,
            t_start=t_start,
            t_last=t_last,
            cpu_s=cpu1 - cpu0,
            broker_cpu_s=None if broker0 is None or broker1 is None else broker1 - broker0,
        )
        if prof:
            out["profile"] = prof.report("consumer", spec["profile_top"])
    except BaseException as exc:
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        if shared.get("barrier") is not None:
            shared["barrier"].abort()
        if consumer is not None:
            consumer.close(5.0)
    results.put(out)


def consumer_alone_main(spec: dict[str, Any], shared: dict[str, Any], results: Any) -> None:
    """The consumer alone: read a pre-filled topic of ``spec["count"]`` messages, pass after
    pass, each pass with a new group (a new StreamConsumer, which starts at the oldest pack),
    until ``seconds`` of timed reading or ``max_messages``; each pass is timed from creating
    the streams to its last message."""
    out: dict[str, Any] = {"role": "consumer"}
    prof = ThreadProfiles() if spec.get("profile") else None
    try:
        if prof:
            prof.start()
        count, size = spec["count"], spec["size"]
        total = bad = passes = 0
        timed = 0.0
        cpu0, broker0 = time.process_time(), cpu_seconds(spec["broker_pid"])
        t_begin = time.perf_counter()
        while True:
            t_create = time.perf_counter()
            consumer, stream = open_stream(spec, f"{spec['group']}-{passes}")
            deadline = t_create + spec["seconds"] + spec["drain_seconds"]
            n, t_last, why, wrong = consume_count(stream, count, None, deadline, size)
            # Not waiting for the fetcher's long poll to end: it has nothing left to fetch.
            consumer.close(0)
            timed += t_last - t_create
            total += n
            bad += wrong
            passes += 1
            if why != "count":
                stopped_by = f"{why} (pass {passes} incomplete: {n} of {count})"
                break
            if timed >= spec["seconds"] or prof:
                stopped_by = "time"
                break
            if total + count > spec["max_messages"] or passes >= MAX_PASSES:
                stopped_by = "count"
                break
        wall = time.perf_counter() - t_begin
        cpu1, broker1 = time.process_time(), cpu_seconds(spec["broker_pid"])
        if prof:
            prof.stop()
        out.update(
            received=total,
            passes=passes,
            wrong_size=bad,
            stopped_by=stopped_by,
            timed_s=timed,
            wall_s=wall,
            cpu_s=cpu1 - cpu0,
            broker_cpu_s=None if broker0 is None or broker1 is None else broker1 - broker0,
        )
        if prof:
            out["profile"] = prof.report("consumer", spec["profile_top"])
    except BaseException as exc:
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    results.put(out)


def consumer_commits_main(spec: dict[str, Any], shared: dict[str, Any], results: Any) -> None:
    """The consumer-with-commits cell: :func:`consumer_alone_main` with
    ``auto_commit=False``, calling ``commit()`` every ``spec["every"]`` messages (None:
    only at the end of each pass); the commits are inside the timed pass."""
    out: dict[str, Any] = {"role": "consumer"}
    try:
        count, every = spec["count"], spec["every"]
        clock = time.perf_counter
        total = passes = commits = 0
        timed = commit_s = 0.0
        cpu0, broker0 = time.process_time(), cpu_seconds(spec["broker_pid"])
        t_begin = clock()
        stopped_by = "count"
        while True:
            t_create = clock()
            consumer, stream = open_stream(spec, f"{spec['group']}-{passes}", auto_commit=False)
            deadline = t_create + spec["seconds"] + spec["drain_seconds"]
            n = since = 0
            while n < count and clock() < deadline:
                k = min(CONSUMER_CHUNK, count - n, (every - since) if every else CONSUMER_CHUNK)
                before = n
                with contextlib.suppress(ConsumerTimeoutError):
                    for _ in islice(stream, k):
                        n += 1
                since += n - before
                if every and since >= every:
                    t0 = clock()
                    consumer.commit()
                    commit_s += clock() - t0
                    commits += 1
                    since = 0
            t0 = clock()
            consumer.commit()  # what the pass read: the last commit, as an application's close
            t_last = clock()
            commit_s += t_last - t0
            commits += 1
            consumer.close(0, commit=False)
            timed += t_last - t_create
            total += n
            passes += 1
            if n < count:
                stopped_by = f"time (pass {passes} incomplete: {n} of {count})"
                break
            if timed >= spec["seconds"]:
                stopped_by = "time"
                break
            if total + count > spec["max_messages"] or passes >= MAX_PASSES:
                break
        wall = clock() - t_begin
        cpu1, broker1 = time.process_time(), cpu_seconds(spec["broker_pid"])
        out.update(
            received=total,
            passes=passes,
            commits=commits,
            commit_s=commit_s,
            stopped_by=stopped_by,
            timed_s=timed,
            wall_s=wall,
            cpu_s=cpu1 - cpu0,
            broker_cpu_s=None if broker0 is None or broker1 is None else broker1 - broker0,
        )
    except BaseException as exc:
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    results.put(out)


# -- the parent's side of a run ---------------------------------------------------------------
@dataclass
class Measure:
    """One timed run: ``kind`` is end_to_end, producer or consumer."""

    kind: str
    messages: int
    seconds: float
    msgs_per_s: float
    mb_per_s: float
    stopped_by: str
    producer_cpu: float | None = None  # CPU seconds per wall second
    consumer_cpu: float | None = None
    broker_cpu: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    config: Config
    pack_bytes: int  # one full pack as sent, after compression
    raw_pack_bytes: int  # the same pack uncompressed
    end_to_end: Measure | None = None
    producer: Measure | None = None
    consumer: Measure | None = None
    #: the consumer-with-commits cell: commit every N messages ("end": once per pass) -> measure
    commits: dict[str, Measure] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.config.size,
            "batch": self.config.batch,
            "codec": self.config.codec,
            "pack_bytes": self.pack_bytes,
            "raw_pack_bytes": self.raw_pack_bytes,
            "end_to_end": asdict(self.end_to_end) if self.end_to_end else None,
            "producer": asdict(self.producer) if self.producer else None,
            "consumer": asdict(self.consumer) if self.consumer else None,
            "consumer_commits": {k: asdict(m) for k, m in self.commits.items()},
            "bottleneck": bottleneck(self),
        }


@dataclass
class Context:
    broker: str
    broker_pid: int | None
    password: str | None
    monitor: BrokerConnection
    args: argparse.Namespace
    tag: str
    runs: int = 0
    profiles: list[str] = field(default_factory=list)


def base_spec(ctx: Context, cfg: Config, topic: str) -> dict[str, Any]:
    a = ctx.args
    return {
        "broker": ctx.broker,
        "broker_pid": ctx.broker_pid,
        "topic": topic,
        "size": cfg.size,
        "batch": cfg.batch,
        "codec": cfg.codec,
        "sync": a.mode == "sync",
        "linger_ms": a.linger_ms,
        "buffer_mb": a.buffer_mb,
        "wait_ms": a.wait_ms,
        "fetch_bytes": a.fetch_bytes,
        "seconds": a.seconds,
        "count": min(a.messages, int(a.max_mb * MIB) // cfg.size),
        "warmup_seconds": a.warmup_seconds,
        "warmup_messages": a.warmup_messages,
        "drain_seconds": a.drain_seconds,
        "profile": False,
        "profile_top": a.profile_top,
    }


def run_children(targets: list[tuple[Any, dict[str, Any]]], shared: dict[str, Any], timeout_s: float) -> list[dict]:
    """Fork one process per (function, spec); collect one result dict from each."""
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=fn, args=(spec, shared, results), daemon=True) for fn, spec in targets]
    for p in procs:
        p.start()
    return collect_reports(procs, results, timeout_s)


def new_shared(with_barrier: bool) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    return {
        "warm": ctx.Value("q", 0),
        "target": ctx.Value("q", 0),
        "warm_sent": ctx.Event(),
        "barrier": ctx.Barrier(2) if with_barrier else None,
    }


def run_timeout(args: argparse.Namespace) -> float:
    return 2 * SETUP_TIMEOUT_S + args.warmup_seconds + args.seconds + 2 * args.drain_seconds + 30


def rate(cfg: Config, kind: str, n: int, seconds: float, stopped_by: str, **extra: Any) -> Measure:
    seconds = max(seconds, 1e-9)
    return Measure(kind, n, round(seconds, 4), n / seconds, n * cfg.size / seconds / MB, stopped_by, **extra)


def per_s(cpu: float | None, seconds: float) -> float | None:
    return None if cpu is None else round(cpu / max(seconds, 1e-9), 2)


def run_producer_alone(ctx: Context, cfg: Config, topic: str) -> tuple[Measure, int]:
    spec = base_spec(ctx, cfg, topic)
    (p,) = run_children([(producer_main, spec)], new_shared(False), run_timeout(ctx.args))
    secs = p["t_flushed"] - p["t0"]
    m = rate(
        cfg,
        "producer",
        p["delivered"],
        secs,
        p["stopped_by"],
        producer_cpu=per_s(p["cpu_s"], secs),
        broker_cpu=per_s(p["broker_cpu_s"], secs),
        details={k: p[k] for k in ("sent", "dropped", "dropped_detail", "settings")}
        | {"send_loop_s": round(p["t_sent"] - p["t0"], 4), "flush_s": round(p["t_flushed"] - p["t_sent"], 4)},
    )
    return m, p["warm"] + p["delivered"]


def run_consumer_alone(ctx: Context, cfg: Config, topic: str, count: int, profile: bool = False) -> Measure:
    spec = base_spec(ctx, cfg, topic) | {
        "count": count,
        "max_messages": ctx.args.messages,
        "group": f"alone-{secrets.token_hex(3)}",
        "profile": profile,
    }
    (c,) = run_children([(consumer_alone_main, spec)], new_shared(False), run_timeout(ctx.args))
    if "profile" in c:
        ctx.profiles.append(c["profile"])
    return rate(
        cfg,
        "consumer",
        c["received"],
        c["timed_s"],
        c["stopped_by"],
        consumer_cpu=per_s(c["cpu_s"], c["wall_s"]),
        broker_cpu=per_s(c["broker_cpu_s"], c["wall_s"]),
        details={"messages_in_topic": count, "passes": c["passes"], "wrong_size": c["wrong_size"]},
    )


def run_consumer_commits(ctx: Context, cfg: Config, topic: str, count: int, every: int | None) -> Measure:
    spec = base_spec(ctx, cfg, topic) | {
        "count": count,
        "max_messages": ctx.args.messages,
        "group": f"commits-{secrets.token_hex(3)}",
        "every": every,
    }
    (c,) = run_children([(consumer_commits_main, spec)], new_shared(False), run_timeout(ctx.args))
    return rate(
        cfg,
        "consumer_commits",
        c["received"],
        c["timed_s"],
        c["stopped_by"],
        consumer_cpu=per_s(c["cpu_s"], c["wall_s"]),
        broker_cpu=per_s(c["broker_cpu_s"], c["wall_s"]),
        details={
            "commit_every": every,
            "messages_in_topic": count,
            "passes": c["passes"],
            "commits": c["commits"],
            "commit_ms_mean": round(1000 * c["commit_s"] / max(c["commits"], 1), 3),
        },
    )


def run_end_to_end(ctx: Context, cfg: Config, topic: str, profile: bool = False) -> tuple[Measure, list[str]]:
    spec = base_spec(ctx, cfg, topic) | {"group": f"e2e-{secrets.token_hex(3)}", "profile": profile}
    shared = new_shared(True)
    out = run_children([(consumer_main, spec | {"count": None}), (producer_main, spec)], shared, run_timeout(ctx.args))
    p = next(r for r in out if r["role"] == "producer")
    c = next(r for r in out if r["role"] == "consumer")
    secs = c["t_last"] - p["t0"]
    expected = p["delivered"]
    stopped = c["stopped_by"] if c["received"] >= expected else f"{c['stopped_by']} (drain: missing messages)"
    m = rate(
        cfg,
        "end_to_end",
        c["received"],
        secs,
        stopped,
        producer_cpu=per_s(p["cpu_s"], p["t_flushed"] - p["t0"]),
        consumer_cpu=per_s(c["cpu_s"], c["t_last"] - c["t_start"]),
        broker_cpu=per_s(c["broker_cpu_s"], c["t_last"] - c["t_start"]),
        details={
            "warm": p["warm"],
            "sent": p["sent"],
            "delivered": expected,
            "dropped": p["dropped"],
            "received": c["received"],
            "extra": c["extra"],
            "wrong_size": c["wrong_size"],
            "producer_stopped_by": p["stopped_by"],
            "send_loop_s": round(p["t_sent"] - p["t0"], 4),
            "producer_done_s": round(p["t_flushed"] - p["t0"], 4),
            "consumer_lag_after_flush_s": round(c["t_last"] - p["t_flushed"], 4),
        },
    )
    profiles = [r["profile"] for r in (p, c) if "profile" in r]
    return m, profiles


def delete_topic(ctx: Context, topic: str) -> None:
    if ctx.password is None:
        return
    with contextlib.suppress(Exception):
        ctx.monitor.call("deleteTopic", T.DeleteTopicRequest(topic=topic, password=ctx.password))


def quiet(ctx: Context) -> None:
    """Untimed: write back what earlier runs wrote, so a timed run does not pay for it."""
    os.sync()


def measure_config(ctx: Context, cfg: Config) -> Row:
    pool = make_pool(cfg.size)
    msgs = [pool[i % len(pool)] for i in range(cfg.batch)]
    row = Row(cfg, len(encode_pack(msgs, CODECS[cfg.codec])), len(encode_pack(msgs, NO_COMPRESSION)))
    ctx.runs += 1
    filled = f"{ctx.tag}-{ctx.runs}-fill"
    e2e = f"{ctx.tag}-{ctx.runs}-e2e"
    try:
        quiet(ctx)
        row.producer, in_topic = run_producer_alone(ctx, cfg, filled)
        log_measure(cfg, row.producer)
        quiet(ctx)
        row.consumer = run_consumer_alone(ctx, cfg, filled, in_topic)
        log_measure(cfg, row.consumer)
        if cfg == COMMITS_CONFIG and "commits" in ctx.args.sweeps:
            for every in COMMIT_EVERY:
                quiet(ctx)
                m = run_consumer_commits(ctx, cfg, filled, in_topic, every)
                row.commits["end" if every is None else str(every)] = m
                log_measure(cfg, m)
        delete_topic(ctx, filled)
        quiet(ctx)
        row.end_to_end, _ = run_end_to_end(ctx, cfg, e2e)
        log_measure(cfg, row.end_to_end)
    finally:
        delete_topic(ctx, filled)
        delete_topic(ctx, e2e)
    return row


def log_measure(cfg: Config, m: Measure) -> None:
    cpu = ", ".join(
        f"{who} CPU {v:.2f}"
        for who, v in (("producer", m.producer_cpu), ("consumer", m.consumer_cpu), ("broker", m.broker_cpu))
        if v is not None
    )
    print(
        f"bench_clients: {cfg.key:<22} {m.kind:<10} {m.messages:>9} msgs in {m.seconds:6.2f} s: "
        f"{fmt_rate(m.msgs_per_s):>8} msgs/s {m.mb_per_s:7.1f} MB/s ({m.stopped_by}; {cpu})",
        file=sys.stderr,
        flush=True,
    )


# -- report ---------------------------------------------------------------------------------
def fmt_size(n: int) -> str:
    return f"{n // 1000} KB" if n >= 1000 and n % 1000 == 0 else f"{n} B"


def bottleneck(row: Row) -> str | None:
    """The slower side alone, and what share of it end to end reached."""
    if not (row.producer and row.consumer and row.end_to_end):
        return None
    p, c = row.producer.msgs_per_s, row.consumer.msgs_per_s
    side = "producer" if p <= c else "consumer"
    return f"{side} ({row.end_to_end.msgs_per_s / min(p, c):.0%})"


def table(title: str, variable: str, rows: list[tuple[str, Row]], codec_cols: bool = False) -> list[str]:
    """A table shaped like the thesis' Tables 10.3 and 10.5: the benchmark variable down the
    side, throughput per scenario across (here: end to end, producer alone, consumer alone)."""
    head1 = f"{'':<26}{'end to end':^22}{'producer alone':^22}{'consumer alone':^22}"
    head2 = (
        f"{variable:<26}"
        + f"{'msgs/s':>10}{'MB/s':>10}  " * 3
        + f"{'CPU p/c/b':>16}  "
        + ("ratio  " if codec_cols else "")
        + "limit (e2e share)"
    )
    lines = [title, head1, head2, "-" * len(head2)]
    for label, r in rows:
        cells = ""
        for m in (r.end_to_end, r.producer, r.consumer):
            cells += f"{fmt_rate(m.msgs_per_s):>10}{m.mb_per_s:>10.1f}  " if m else f"{'-':>10}{'-':>10}  "
        e = r.end_to_end
        cpu = (
            "/".join("-" if v is None else f"{v:.1f}" for v in (e.producer_cpu, e.consumer_cpu, e.broker_cpu))
            if e
            else "-"
        )
        ratio = f"{r.pack_bytes / r.raw_pack_bytes:>5.2f}  " if codec_cols else ""
        lines.append(f"{label:<26}{cells}{cpu:>16}  {ratio}{bottleneck(r) or '-'}")
    return lines


def commits_table(r: Row) -> list[str]:
    """The consumer-with-commits cell: the consumer alone with auto_commit=True, then
    auto_commit=False committing once per pass, every 10,000 and every 1,000 messages."""
    head = f"{'Consumer (commit every)':<34}{'msgs/s':>10}{'MB/s':>10}{'commits':>10}{'ms/commit':>11}{'CPU c/b':>12}"
    lines = [f"Consumer with commits: {r.config.key}, the pre-filled topic read alone", head, "-" * len(head)]
    cells: list[tuple[str, Measure | None]] = [("auto_commit=True (no commits)", r.consumer)]
    cells += [(f"auto_commit=False, {'once per pass' if k == 'end' else f'{int(k):,} msgs'}", m)
              for k, m in r.commits.items()]  # fmt: skip
    for label, m in cells:
        if m is None:
            continue
        cpu = "/".join("-" if v is None else f"{v:.1f}" for v in (m.consumer_cpu, m.broker_cpu))
        n = m.details.get("commits")
        per = m.details.get("commit_ms_mean")
        lines.append(
            f"{label:<34}{fmt_rate(m.msgs_per_s):>10}{m.mb_per_s:>10.1f}{'-' if n is None else n:>10}"
            f"{'-' if per is None else per:>11}{cpu:>12}"
        )
    return lines


def batch_label(r: Row) -> str:
    msgs = f"{r.config.batch} msg" + ("s" if r.config.batch > 1 else "")
    return f"{r.pack_bytes:,} ({msgs})"


def targets(rows: dict[Config, Row]) -> list[dict[str, Any]]:
    out = []
    batched = [r for c, r in rows.items() if c.size == 100 and c.batch > 1 and r.end_to_end]
    best = max(batched, key=lambda r: r.end_to_end.msgs_per_s, default=None)  # type: ignore[union-attr]
    value = best.end_to_end.msgs_per_s if best and best.end_to_end else None
    out.append(
        {
            "target": f">= {TARGET_MSGS // 1000} k messages/s of 100 B end to end with batching",
            "goal": TARGET_MSGS,
            "value": value,
            "row": best.config.key if best else None,
            "reached": None if value is None else value >= TARGET_MSGS,
            "shown": "not measured"
            if value is None
            else f"{fmt_rate(value)} msgs/s (best batched row: {best.config.key})",  # type: ignore[union-attr]
        }
    )
    ten = [r for c, r in rows.items() if c.size == 10_000 and r.end_to_end]
    top = max(ten, key=lambda r: r.end_to_end.mb_per_s, default=None)  # type: ignore[union-attr]
    value = top.end_to_end.mb_per_s if top and top.end_to_end else None
    out.append(
        {
            "target": f">= {TARGET_MBS:.0f} MB/s end to end with 10 KB messages",
            "goal": TARGET_MBS,
            "value": value,
            "row": top.config.key if top else None,
            "reached": None if value is None else value >= TARGET_MBS,
            "shown": "not measured" if value is None else f"{value:.1f} MB/s ({top.config.key})",  # type: ignore[union-attr]
        }
    )
    return out


def render(machine: dict[str, Any], config: dict[str, Any], broker: BrokerInfo, sweeps: dict[str, list[Config]],
           rows: dict[Config, Row], goals: list[dict[str, Any]]) -> str:  # fmt: skip
    v = machine["versions"]
    lines = [
        "luxun Python clients benchmark: Producer -> broker -> StreamConsumer, end to end",
        f"machine: {machine['cpu']}, {machine['cores']} cores ({machine['cores_usable']} usable), "
        f"{machine['ram_gib']} GiB RAM; {machine['os']}, Linux {machine['kernel']}",
        f"python {machine['python']}, thriftpy2 {v.get('thriftpy2', '?')}, "
        f"python-snappy {v.get('python-snappy', '-')}; git {machine['git_commit']}",
        f"load average (1, 5, 15 min) at start {machine['load_average_start']}, at end {machine['load_average_end']}",
        f"broker: {'own, pid ' + str(broker.pid) if broker.pid else 'external'} on {broker.host}:{broker.port}; "
        f"data dir {machine['data_dir']} ({machine['data_dir_filesystem']})",
        f"producer: {config['mode']} ({MODE_TEXT[config['mode']]}), "
        f"linger {config['linger_ms']} ms, buffer min(100000 msgs, {config['buffer_mb']} MiB); "
        f"consumer: one stream, {config['fetch_bytes'] // 1024} KiB fetches, {config['wait_ms']} ms long polls; "
        "each in its own process",
        f"budget per run: {config['seconds']} s / {config['messages']:,} msgs / {config['max_mb']} MiB of sending "
        f"after a warm-up of {config['warmup_seconds']} s / {config['warmup_messages']:,} msgs; "
        f"up to {config['drain_seconds']} s more for the consumer to catch up; the consumer alone reads for up to "
        f"{config['seconds']} s / {config['messages']:,} msgs",
        "end to end: first send -> last message received; producer alone: first send -> flush returned; "
        "consumer alone: the pre-filled topic read pass after pass with new groups, each pass timed from "
        "creating the streams to its last message",
        "MB = 10^6 bytes of message values; CPU p/c/b = producer/consumer/broker CPU seconds per wall second "
        "during the end-to-end run; limit = the slower side alone, and the share of it end to end reached",
        "",
    ]
    if "batch" in sweeps:
        rs = [(batch_label(rows[c]), rows[c]) for c in sweeps["batch"]]
        lines += table("Effect of producer batch size (cf. Table 10.3): 100 B messages, no compression",
                       "Batch size [B] (msgs)", rs)  # fmt: skip
        lines.append("")
    if "size" in sweeps:
        rs = [(f"{fmt_size(c.size)} (pack {rows[c].pack_bytes / 1000:,.0f} KB)", rows[c]) for c in sweeps["size"]]
        lines += table("Effect of message size (cf. Table 10.5): batches of 100 messages, no compression",
                       "Message size", rs)  # fmt: skip
        lines.append("")
    if "commits" in sweeps:
        lines += commits_table(rows[COMMITS_CONFIG])
        lines.append("")
    if "codec" in sweeps:
        rs = [(f"{fmt_size(c.size)}, {c.codec}", rows[c]) for c in sweeps["codec"]]
        lines += table("Effect of compression: batches of 1000 messages (ratio = pack bytes compressed / raw)",
                       "Message size, codec", rs, codec_cols=True)  # fmt: skip
        lines.append("")
    lines.append("targets (end to end):")
    for g in goals:
        mark = {True: "reached    ", False: "NOT reached", None: "n/a        "}[g["reached"]]
        lines.append(f"  [{mark}] {g['target']}: {g['shown']}")
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------
def fmt_budget(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sweeps", default=",".join(SWEEPS), help="comma-separated subset of " + ",".join(SWEEPS))
    p.add_argument("--codecs", default="none,gzip,snappy", help="codecs of the codec sweep (default none,gzip,snappy)")
    p.add_argument(
        "--mode",
        choices=("async", "sync"),
        default="async",
        help="producer mode: async = oneway asyncProduce (default);\nsync = acknowledged produce",
    )
    budget_help = {
        "seconds": "max seconds of sending per run, and of timed reading for the consumer alone",
        "messages": "max messages sent per run, and read by the consumer alone",
        "max_mb": "max MiB of message values sent per run",
        "warmup_seconds": "untimed warm-up (sending) per run",
        "warmup_messages": "max warm-up messages per run",
        "drain_seconds": "max extra wait for flush and for the consumer to catch up",
    }
    for name, (full, quick) in BUDGETS.items():
        p.add_argument(
            f"--{name.replace('_', '-')}",
            type=type(full),
            help=f"{budget_help[name]} (default {fmt_budget(full)}; --quick {fmt_budget(quick)})",
        )
    p.add_argument("--linger-ms", type=int, default=ProducerConfig.linger_ms, help="producer linger (default 5)")
    p.add_argument(
        "--buffer-mb", type=int, default=64, help="producer buffer: min(100000 messages, this many MiB) (default 64)"
    )
    p.add_argument("--wait-ms", type=int, default=1000, help="consumer long-poll wait (default 1000)")
    p.add_argument("--fetch-bytes", type=int, default=MIB, help="consumer maxFetchSize (default 1 MiB)")
    p.add_argument("--broker", help="host:port of a running broker to use instead of starting one")
    p.add_argument("--password", help="with --broker: the deleteTopic password, so the bench topics are deleted")
    p.add_argument("--data-dir", type=Path, help="where the broker's temporary data dir goes (default: /tmp)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    p.add_argument(
        "--profile",
        action="store_true",
        help="instead of the sweeps: one end-to-end run of --profile-config under cProfile\n"
        "(every thread of both processes); rates under the profiler mean nothing",
    )
    p.add_argument("--profile-config", default="100:1000:none", help="size:batch:codec (default 100:1000:none)")
    p.add_argument("--profile-top", type=int, default=25, help="functions per thread in the profile (default 25)")
    p.add_argument(
        "--profile-out", type=Path, default=DEFAULT_PROFILE, help=f"profile text (default {DEFAULT_PROFILE})"
    )
    p.add_argument("--quick", action="store_true", help="short smoke run: small budgets")
    args = p.parse_args(argv)
    for name, (full, quick) in BUDGETS.items():
        if getattr(args, name) is None:
            setattr(args, name, type(full)(quick if args.quick else full))
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    names = [s.strip() for s in args.sweeps.split(",") if s.strip()]
    if not names or set(names) - set(SWEEPS):
        p.error(f"--sweeps takes a subset of {','.join(SWEEPS)}")
    args.sweeps = [s for s in SWEEPS if s in names]
    args.codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    if not args.codecs or set(args.codecs) - set(CODECS):
        p.error(f"--codecs takes a subset of {','.join(CODECS)}")
    if "snappy" in args.codecs and not snappy_available():
        print("bench_clients: python-snappy is not installed; the snappy rows are skipped", file=sys.stderr)
        args.codecs.remove("snappy")
    try:
        size, batch, codec = args.profile_config.split(":")
        args.profile_config = Config(int(size), int(batch), codec)
    except ValueError:
        p.error("--profile-config is size:batch:codec, e.g. 100:1000:none")
    if args.profile_config.codec not in CODECS:
        p.error(f"--profile-config codec must be one of {','.join(CODECS)}")
    return args


def profile_run(ctx: Context, cfg: Config) -> int:
    """cProfile every thread of an end-to-end run, then of a consumer reading that topic alone."""
    topic = f"{ctx.tag}-profile"
    try:
        m, profiles = run_end_to_end(ctx, cfg, topic, profile=True)
        alone = run_consumer_alone(ctx, cfg, topic, m.details["warm"] + m.details["delivered"], profile=True)
    finally:
        delete_topic(ctx, topic)
    text = (
        f"cProfile of one end-to-end run, {cfg.key}, producer {ctx.args.mode}: {m.messages} messages in "
        f"{m.seconds:.2f} s under the profiler ({fmt_rate(m.msgs_per_s)} msgs/s), then of a consumer reading the "
        f"same topic alone with a new group ({alone.messages} messages in {alone.seconds:.2f} s, "
        f"{fmt_rate(alone.msgs_per_s)} msgs/s). The profiler slows everything down: look at the shares.\n\n"
        + "\n".join(profiles)
        + "\n==== consumer alone (pre-filled topic) ====\n\n"
        + "\n".join(ctx.profiles)
    )
    ctx.args.profile_out.parent.mkdir(parents=True, exist_ok=True)
    ctx.args.profile_out.write_text(text, encoding="utf-8")
    print(text)
    print(f"profile written to {ctx.args.profile_out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    machine = machine_info(args.data_dir, versions=dist_versions(("thriftpy2", "python-snappy", "cramjam")))
    sweeps = sweep_configs(args.sweeps, args.codecs)
    unique = sorted(
        {c for cs in sweeps.values() for c in cs},
        key=lambda c: (c.codec != "none", c.size, c.batch, list(CODECS).index(c.codec)),
    )
    rows: dict[Config, Row] = {}
    broker_cm = (
        external_broker(args.broker, args.password) if args.broker else own_broker(args.data_dir, "bench_clients")
    )
    with broker_cm as broker:
        monitor = BrokerConnection(f"{broker.host}:{broker.port}", timeout_ms=None)
        ctx = Context(f"{broker.host}:{broker.port}", broker.pid, broker.password, monitor, args,
                      f"bench-clients-{secrets.token_hex(3)}")  # fmt: skip
        if ctx.password is None:
            print("bench_clients: no --password: the bench topics stay on the broker", file=sys.stderr)
        try:
            if args.profile:
                return profile_run(ctx, args.profile_config)
            for cfg in unique:
                rows[cfg] = measure_config(ctx, cfg)
        finally:
            monitor.close()
    machine["load_average_end"] = load_average()
    config = {k: getattr(args, k) for k in BUDGETS} | {
        "sweeps": args.sweeps,
        "codecs": args.codecs,
        "mode": args.mode,
        "linger_ms": args.linger_ms,
        "buffer_mb": args.buffer_mb,
        "wait_ms": args.wait_ms,
        "fetch_bytes": args.fetch_bytes,
        "quick": args.quick,
    }
    goals = targets(rows)
    print(render(machine, config, broker, sweeps, rows, goals))
    report = {
        "benchmark": "bench_clients",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": machine,
        "config": config,
        "broker": {
            "own": broker.pid is not None,
            "host": broker.host,
            "port": broker.port,
            "exit_code": broker.exit_code,
        },
        "sweeps": {name: [c.key for c in cs] for name, cs in sweeps.items()},
        "results": [rows[c].to_json() for c in unique],
        "targets": [{k: v for k, v in g.items() if k != "shown"} for g in goals],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nresults written to {args.json} ({report['duration_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
