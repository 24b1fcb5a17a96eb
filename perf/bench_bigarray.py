"""Benchmark bigarray against persistent-queue peers, in one run, on this machine.

A program, not a test::

    .venv/bin/python perf/bench_bigarray.py            # full run (~3 min on 2 cores)
    .venv/bin/python perf/bench_bigarray.py --quick    # smoke run (~20 s)
    .venv/bin/python perf/bench_bigarray.py --java .peers/luxun-java   # and Java bigqueue, same run
    .venv/bin/python perf/bench_bigarray.py --help

Workloads, per item size (each one warmed up first, then timed; every loop is bounded by an
item count, a byte budget and a number of seconds, and rates come from what was done):

==============  =====================================================================
append          ``BigArray.append`` one item per call
append_many     ``BigArray.append_many`` in batches of 1000 items or 1 MiB, the smaller
get             ``BigArray.get(i)`` for consecutive indexes
dequeue         ``FanoutQueue.dequeue(group)`` one item per call
read_range      ``BigArray.read_range(i, max_bytes=1 MiB)``
dequeue_many    ``FanoutQueue.dequeue_many(group, max_bytes=1 MiB)``
read_blob       ``BigArray.read_range_blob(i, max_bytes=1 MiB)``: the same items as one
                ``bytes`` and their lengths (no object per item)
read_view       ``BigArray.read_range_view(i, max_bytes=1 MiB)``: a view of the page's
                mapping and the lengths (no copy when the items lie back to back), then
                ``release()``; what the broker's consume replies are made from
==============  =====================================================================

The reads read what ``append_many`` wrote a moment before, so they come from the page
cache (the usual case for a queue whose consumers keep up). No workload calls ``flush``
(msync): a returned append already survives ``kill -9`` of the process.

Peers do the same work in the same run. None has a batch API, so for batch workloads
each runs its best loop (see ``PEER_METHODS``): persist-queue acknowledges a batch with
one state save, diskcache wraps a batch in one SQLite transaction, queuelib has nothing
better than its plain loop. Peers are much slower, so they run with their own, smaller
budget (``--peer-items``, ``--peer-mb``, ``--peer-seconds``).

``--java PATH`` (the Java Luxun build, ../shared/peers/luxun-java/README.md) runs its
BigQueueBench in the same run, at the sizes of ``--java-sizes``: Java bigqueue 0.7.2's
``FanOutQueueImpl`` (what Luxun's Log wraps) and ``BigQueueImpl``, enqueue then dequeue,
one item per call (bigqueue has no batch API), as many items as bigarray's workloads. Its
repeats alternate with bigarray's (ABAB... per size: bigarray first in even repeats, Java
first in odd ones); the table shows each side's median, the ratio bigarray / Java
FanOutQueueImpl per workload, and issue 10's targets.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import (
    JavaPeer,
    default_java_peer,
    dist_versions,
    filesystem_of,
    fmt_rate,
    git_commit,
    java_version,
    load_average,
    machine_base,
    os_pretty_name,
)

from bigarray import BigArray, FanoutQueue

MIB = 1 << 20
MB = 1_000_000
BATCH_MAX_ITEMS = 1000
BATCH_MAX_BYTES = MIB
READ_MAX_BYTES = MIB
#: Items per timed chunk of a per-item loop: the clock is read between chunks.
CHUNK_MAX_ITEMS = 1000
#: bigarray warm-up: at most this many items, this many bytes, a twentieth of the run.
WARMUP_MAX_ITEMS = 10_000
WARMUP_MAX_BYTES = 8 * MIB
PEER_WARMUP_ITEMS = 20

DEFAULT_SIZES = "100,1000,10000,100000"
DEFAULT_JAVA_SIZES = "100,1000"
#: Seconds one BigQueueBench process may take (it bounds each phase to 50 s itself).
JAVA_TIMEOUT_S = 600.0
#: A line of BigQueueBench: "FanOutQueue  size=100    enqueue  items=1000000 secs=0.370 ...".
JAVA_LINE = re.compile(r"^(BigQueue|FanOutQueue)\s+size=(\d+)\s+(enqueue|dequeue)\s+items=(\d+)\s+secs=([\d.]+)", re.M)
#: bigarray workload -> the Java bigqueue loop it is compared with (one item per call: no batch API).
JAVA_WORKLOAD = {
    "append": "enqueue",
    "append_many": "enqueue",
    "get": "dequeue",
    "dequeue": "dequeue",
    "read_range": "dequeue",
    "dequeue_many": "dequeue",
    "read_blob": "dequeue",
    "read_view": "dequeue",
}
#: Issue 10: bigarray / Java FanOutQueueImpl >= 0.5 per item, >= 3 for the batch calls.
JAVA_GOALS = {
    "append": 0.5,
    "get": 0.5,
    "dequeue": 0.5,
    "append_many": 3.0,
    "read_range": 3.0,
    "dequeue_many": 3.0,
    "read_blob": 3.0,
    "read_view": 3.0,
}
JAVA_LIBRARIES = {"FanOutQueue": "java-fanout", "BigQueue": "java-bigqueue"}
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "bench_bigarray.json"
ALL_PEERS = ("persist-queue", "queuelib", "diskcache")
#: Peers whose acknowledged items survive kill -9 (queuelib saves its state only on close).
DURABLE_PEERS = ("persist-queue", "diskcache")

#: name -> (full run, --quick run) for the budget options.
BUDGETS: dict[str, tuple[float, float]] = {
    "items": (1_000_000, 20_000),
    "max_mb": (512, 16),
    "seconds": (3.0, 0.5),
    "repeat": (3, 1),
    "peer_items": (100_000, 2_000),
    "peer_mb": (256, 8),
    "peer_seconds": (2.0, 0.3),
}

WORKLOADS = ("append", "append_many", "get", "dequeue", "read_range", "dequeue_many", "read_blob", "read_view")
#: bigarray workload -> the peer workload it is compared with.
PEER_WORKLOAD = {
    "append": "put",
    "append_many": "put_batch",
    "get": "get",
    "dequeue": "get",
    "read_range": "get_batch",
    "dequeue_many": "get_batch",
    "read_blob": "get_batch",
    "read_view": "get_batch",
}
PEER_METHODS = {
    "persist-queue": {
        "class": "persistqueue.Queue(path, autosave=False, tempdir=<same filesystem>)",
        "put": "put(item); every put saves the queue state (temp file + rename)",
        "put_batch": "put(item) loop (no batch API, no way to save the state once per batch)",
        "get": "get(block=False); task_done() per item: the state is saved per item",
        "get_batch": "get(block=False) x batch, then task_done() x batch: the state is saved once per batch",
    },
    "queuelib": {
        "class": "queuelib.FifoDiskQueue(path); its head/tail state is saved only by close(): not crash-safe",
        "put": "push(item)",
        "put_batch": "push(item) loop (no batch API)",
        "get": "pop()",
        "get_batch": "pop() loop (no batch API)",
    },
    "diskcache": {
        "class": "diskcache.Deque(directory=path)",
        "put": "append(item); one SQLite transaction per item",
        "put_batch": "append(item) x batch inside one `with deque.transact():`",
        "get": "popleft(); one SQLite transaction per item",
        "get_batch": "popleft() x batch inside one `with deque.transact():`",
    },
}


# -- measurements ---------------------------------------------------------------------------
@dataclass
class Result:
    """One timed loop: ``items`` items of ``item_size`` bytes in ``seconds``."""

    library: str
    workload: str
    item_size: int
    items: int
    seconds: float
    stopped_by: str  # "count", "time" or "empty" (nothing left to read)
    #: items/s of every repeat when this is the median of several runs.
    runs: list[float] = field(default_factory=list)

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.items_per_s * self.item_size / MB

    @property
    def spread(self) -> float:
        """(max - min) / median of the repeats' items/s; 0 for a single run."""
        return (max(self.runs) - min(self.runs)) / self.items_per_s if len(self.runs) > 1 and self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "items_per_s": self.items_per_s, "mb_per_s": self.mb_per_s}


def median_results(repeats: list[list[Result]]) -> list[Result]:
    """Per workload, the run with the median items/s (the lower middle one for an even count),
    carrying every run's rate in ``runs``."""
    out = []
    for same in zip(*repeats, strict=True):
        ranked = sorted(same, key=lambda r: r.items_per_s)
        out.append(replace(ranked[(len(ranked) - 1) // 2], runs=[r.items_per_s for r in same]))
    return out


Step = Callable[[int], int]


def run_bounded(step: Step, count: int, seconds: float, chunk: int) -> tuple[int, float, str]:
    """Call ``step(k)`` (does up to ``k`` items, returns how many) until ``count`` items are
    done, ``seconds`` have passed (checked between steps) or a step does nothing.

    Returns (items done, elapsed seconds, what stopped the loop).
    """
    done = 0
    stopped = "count"
    start = time.perf_counter()
    deadline = start + seconds
    while done < count:
        k = step(min(chunk, count - done))
        done += k
        if k == 0:
            stopped = "empty"
            break
        if done < count and time.perf_counter() >= deadline:
            stopped = "time"
            break
    return done, time.perf_counter() - start, stopped


def measure(
    library: str, workload: str, size: int, step: Step, *, warmup: int, count: int, seconds: float, chunk: int
) -> Result:
    """Warm up with ``warmup`` items (untimed, bounded by ``seconds``), then time ``count`` items."""
    if warmup:
        run_bounded(step, warmup, seconds, chunk)
    done, elapsed, stopped = run_bounded(step, count, seconds, chunk)
    return log_result(Result(library, workload, size, done, elapsed, stopped))


def log_result(r: Result) -> Result:
    """Print ``r`` as a progress line on stderr; return it."""
    print(
        f"  {r.library:<13} {r.workload:<12} {r.item_size:>7} B  {r.items:>9} items  {r.seconds:6.2f} s  "
        f"{fmt_rate(r.items_per_s):>8}/s  {r.mb_per_s:9.1f} MB/s  ({r.stopped_by})",
        file=sys.stderr,
        flush=True,
    )
    return r


def make_pool(size: int, count: int, vary_pct: int = 0) -> list[bytes]:
    """``count`` distinct random items of ``size`` bytes, or with ``vary_pct`` of sizes
    drawn evenly from ``size`` +- that percentage (the same sizes in every run)."""
    spread = size * vary_pct // 100
    rng = random.Random(size)
    sizes = [size + rng.randint(-spread, spread) if spread else size for _ in range(count)]
    buf = os.urandom(max(sizes) + count)
    return [buf[i : i + n] for i, n in enumerate(sizes)]


def batch_items(size: int) -> int:
    return max(1, min(BATCH_MAX_ITEMS, BATCH_MAX_BYTES // size))


def chunk_items(size: int) -> int:
    return max(1, min(CHUNK_MAX_ITEMS, BATCH_MAX_BYTES // size))


# -- bigarray -------------------------------------------------------------------------------
def bench_bigarray(size: int, root: Path, args: argparse.Namespace) -> list[Result]:
    count = max(1, min(int(args.items), int(args.max_mb * MIB) // size))
    warm = max(1, min(WARMUP_MAX_ITEMS, WARMUP_MAX_BYTES // size, count // 20))
    chunk, batch = chunk_items(size), batch_items(size)
    pool = make_pool(size, max(chunk, batch), args.vary)
    known = set(pool)
    opts = {"data_page_size": args.data_page_mb * MIB}
    results: list[Result] = []

    def timed(workload: str, step: Step, chunk: int) -> Result:
        result = measure("bigarray", workload, size, step, warmup=warm, count=count, seconds=args.seconds, chunk=chunk)
        results.append(result)
        return result

    # append: a BigArray of its own, deleted right after (its dirty pages are dropped unwritten).
    with BigArray(root / "append", **opts) as arr:
        append = arr.append

        def append_step(k: int) -> int:
            for item in pool[:k]:
                append(item)
            return k

        timed("append", append_step, chunk)
        check(arr.head == results[-1].items + warm, "append: head does not match the items appended")
        check(arr.get(arr.head - 1) in known, "append: last item is not one that was appended")
    remove_tree(root / "append")

    # append_many writes the queue the four read workloads then read.
    with FanoutQueue(root / "queue", **opts) as q:
        arr = q.array
        append_many = arr.append_many

        def append_many_step(k: int) -> int:
            append_many(pool[:k])
            return k

        timed("append_many", append_many_step, batch)
        head = arr.head
        check(head == results[-1].items + warm, "append_many: head does not match the items appended")

        get, read_range = arr.get, arr.read_range
        pos = 0

        def get_step(k: int) -> int:
            nonlocal pos
            k = min(k, head - pos)
            for i in range(pos, pos + k):
                get(i)
            pos += k
            return k

        def read_range_step(k: int) -> int:
            nonlocal pos
            if pos >= head:
                return 0
            n = len(read_range(pos, max_items=k, max_bytes=READ_MAX_BYTES))
            pos += n
            return n

        dequeue, dequeue_many = q.dequeue, q.dequeue_many

        def dequeue_step(k: int) -> int:
            for i in range(k):
                if dequeue("one") is None:
                    return i
            return k

        def dequeue_many_step(k: int) -> int:
            return len(dequeue_many("many", max_items=k, max_bytes=READ_MAX_BYTES))

        timed("get", get_step, chunk)
        pos = 0
        timed("read_range", read_range_step, count)
        timed("dequeue", dequeue_step, chunk)
        timed("dequeue_many", dequeue_many_step, count)
        read_blob, read_view = arr.read_range_blob, arr.read_range_view

        def read_blob_step(k: int) -> int:
            nonlocal pos
            if pos >= head:
                return 0
            lengths, _ = read_blob(pos, max_items=k, max_bytes=READ_MAX_BYTES)
            pos += len(lengths)
            return len(lengths)

        def read_view_step(k: int) -> int:
            nonlocal pos
            if pos >= head:
                return 0
            lengths, _, release = read_view(pos, max_items=k, max_bytes=READ_MAX_BYTES)
            release()
            pos += len(lengths)
            return len(lengths)

        pos = 0
        timed("read_blob", read_blob_step, count)
        pos = 0
        timed("read_view", read_view_step, count)
        lengths, blob = arr.read_range_blob(0, max_items=100)
        offsets = [0, *itertools.accumulate(int(n) for n in lengths)]
        check(
            all(blob[offsets[i] : offsets[i + 1]] in known for i in range(len(lengths))),
            "read_range_blob: an item that was not appended",
        )
        for group in ("one", "many"):
            index = q.group_index(group)
            check(index > 0 and q.get(index - 1) in known, f"{group}: last item read is not one that was appended")
        check(all(b in known for b in arr.read_range(0, max_items=100)), "read_range: an item that was not appended")
    remove_tree(root / "queue")
    order = {w: i for i, w in enumerate(WORKLOADS)}
    return sorted(results, key=lambda r: order[r.workload])


def remove_tree(path: Path, timeout_s: float = 10.0) -> None:
    """Remove a directory tree, retrying for up to ``timeout_s``.

    bigarray's background prefetcher may still be creating the next page file of an
    array that was just closed, so one ``rmtree`` can meet a file that appeared after it
    listed the folder.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def check(ok: bool, message: str) -> None:
    if not ok:
        raise SystemExit(f"bench_bigarray: sanity check failed: {message}")


# -- Java bigqueue (the library Java Luxun embeds) -----------------------------------------
def bench_java(peer: JavaPeer, size: int, root: Path, args: argparse.Namespace) -> list[Result]:
    """One BigQueueBench process on a fresh folder: BigQueueImpl and FanOutQueueImpl, each
    enqueue then dequeue of as many items of ``size`` bytes as bigarray's workloads do."""
    count = max(1, min(int(args.items), int(args.max_mb * MIB) // size))
    work = root / "java"
    work.mkdir()
    command = [
        "java", *args.java_opts, "-cp", f"{peer.bench_classes}{os.pathsep}{peer.classpath}",
        "BigQueueBench", str(work), str(count), str(size),
    ]  # fmt: skip
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=JAVA_TIMEOUT_S)
    finally:
        remove_tree(work)
    found = JAVA_LINE.findall(out.stdout)
    if out.returncode != 0 or len(found) != 4:
        raise SystemExit(
            f"bench_bigarray: BigQueueBench {size} B exited with {out.returncode} and {len(found)} of 4 results:\n"
            + (out.stdout + out.stderr)[-2000:]
        )
    return [
        log_result(
            Result(
                JAVA_LIBRARIES[impl], phase, int(item_size), int(n), float(secs), "count" if int(n) >= count else "time"
            )
        )
        for impl, item_size, phase, n, secs in found
    ]


def java_cells(results: list[Result], java: list[Result]) -> list[dict[str, Any]]:
    """Per bigarray row with a Java FanOutQueueImpl figure at its size: both rates, the ratio, the goal."""
    fanout = {(r.workload, r.item_size): r for r in java if r.library == "java-fanout"}
    out = []
    for r in results:
        j = fanout.get((JAVA_WORKLOAD[r.workload], r.item_size))
        if j is None:
            continue
        ratio = r.items_per_s / j.items_per_s if j.items_per_s else None
        goal = JAVA_GOALS[r.workload]
        out.append(
            {
                "workload": r.workload,
                "item_size": r.item_size,
                "bigarray_items_per_s": r.items_per_s,
                "java_workload": f"FanOutQueueImpl {j.workload}",
                "java_items_per_s": j.items_per_s,
                "java_runs": j.runs,
                "ratio": ratio,
                "goal": goal,
                "reached": None if ratio is None else ratio >= goal,
            }
        )
    return out


# -- peers ----------------------------------------------------------------------------------
class Peer:
    """A peer queue, seen through four loops: put, put_batch, get, get_batch.

    Each loop does up to ``len(items)`` (puts) or ``k`` (gets) items and returns how many.
    """

    name = ""

    def put(self, items: list[bytes]) -> int:
        raise NotImplementedError

    def put_batch(self, items: list[bytes]) -> int:
        return self.put(items)

    def get(self, k: int) -> int:
        raise NotImplementedError

    def get_batch(self, k: int) -> int:
        return self.get(k)

    def close(self) -> None:
        raise NotImplementedError


class PersistQueuePeer(Peer):
    name = "persist-queue"

    def __init__(self, path: Path) -> None:
        import persistqueue

        self._empty = persistqueue.Empty
        tmp = path.parent / (path.name + "-tmp")
        tmp.mkdir()
        self.q = persistqueue.Queue(str(path), autosave=False, tempdir=str(tmp))

    def put(self, items: list[bytes]) -> int:
        put = self.q.put
        for item in items:
            put(item)
        return len(items)

    def get(self, k: int) -> int:
        get, task_done = self.q.get, self.q.task_done
        for i in range(k):
            try:
                get(block=False)
            except self._empty:
                return i
            task_done()
        return k

    def get_batch(self, k: int) -> int:
        get, task_done = self.q.get, self.q.task_done
        n = 0
        with contextlib.suppress(self._empty):
            for _ in range(k):
                get(block=False)
                n += 1
        for _ in range(n):
            task_done()  # the first call saves the state, the others find nothing to save
        return n

    def close(self) -> None:
        self.q.headf.close()
        self.q.tailf.close()


class QueuelibPeer(Peer):
    name = "queuelib"

    def __init__(self, path: Path) -> None:
        from queuelib import FifoDiskQueue

        self.q = FifoDiskQueue(str(path))

    def put(self, items: list[bytes]) -> int:
        push = self.q.push
        for item in items:
            push(item)
        return len(items)

    def get(self, k: int) -> int:
        pop = self.q.pop
        for i in range(k):
            if pop() is None:
                return i
        return k

    def close(self) -> None:
        self.q.close()


class DiskcachePeer(Peer):
    name = "diskcache"

    def __init__(self, path: Path) -> None:
        from diskcache import Deque

        self.q = Deque(directory=str(path))

    def put(self, items: list[bytes]) -> int:
        append = self.q.append
        for item in items:
            append(item)
        return len(items)

    def put_batch(self, items: list[bytes]) -> int:
        with self.q.transact():
            return self.put(items)

    def get(self, k: int) -> int:
        popleft = self.q.popleft
        for i in range(k):
            try:
                popleft()
            except IndexError:
                return i
        return k

    def get_batch(self, k: int) -> int:
        with self.q.transact():
            return self.get(k)

    def close(self) -> None:
        self.q._cache.close()  # Deque has no close() of its own


PEER_CLASSES: dict[str, Callable[[Path], Peer]] = {
    "persist-queue": PersistQueuePeer,
    "queuelib": QueuelibPeer,
    "diskcache": DiskcachePeer,
}


def bench_peer(name: str, size: int, root: Path, args: argparse.Namespace) -> list[Result]:
    """put, put_batch, then get and get_batch (which share out what the puts wrote)."""
    count = max(1, min(int(args.peer_items), int(args.peer_mb * MIB) // size))
    chunk, batch = chunk_items(size), batch_items(size)
    pool = make_pool(size, max(chunk, batch))
    path = root / name
    peer = PEER_CLASSES[name](path)
    results = []
    try:
        written = 0
        for workload, loop, step_items in (("put", peer.put, chunk), ("put_batch", peer.put_batch, batch)):

            def put_step(k: int, loop: Callable[[list[bytes]], int] = loop) -> int:
                return loop(pool[:k])

            r = measure(
                name,
                workload,
                size,
                put_step,
                warmup=PEER_WARMUP_ITEMS,
                count=count,
                seconds=args.peer_seconds,
                chunk=step_items,
            )
            results.append(r)
            written += PEER_WARMUP_ITEMS + r.items
        # Reads: each warms up on PEER_WARMUP_ITEMS, get takes half of the rest, get_batch the remainder.
        left = written - 2 * PEER_WARMUP_ITEMS
        for workload, get_loop, step_items, share in (
            ("get", peer.get, chunk, left // 2),
            ("get_batch", peer.get_batch, batch, left),
        ):
            r = measure(
                name,
                workload,
                size,
                get_loop,
                warmup=PEER_WARMUP_ITEMS,
                count=max(1, share),
                seconds=args.peer_seconds,
                chunk=step_items,
            )
            results.append(r)
            left -= r.items
    finally:
        peer.close()
        remove_tree(path)
        remove_tree(path.parent / (path.name + "-tmp"))
    return results


# -- machine --------------------------------------------------------------------------------
def machine_info(data_dir: Path) -> dict[str, Any]:
    os_name = os_pretty_name()
    return {
        **machine_base(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "os": f"{os_name} (Linux {platform.release()})" if os_name else platform.platform(),
        "load_average_start": load_average(),
        "data_dir": str(data_dir),
        "data_dir_filesystem": filesystem_of(data_dir),
        "git_commit": git_commit(),
        "peer_versions": dist_versions(("persist-queue", "queuelib", "diskcache")),
    }


# -- report ---------------------------------------------------------------------------------
def best_peer(peers: dict[tuple[str, str, int], Result], names: list[str], workload: str, size: int) -> float:
    return max((peers[(n, PEER_WORKLOAD[workload], size)].items_per_s for n in names), default=0.0)


def targets(
    ours: dict[tuple[str, int], Result], peers: dict[tuple[str, str, int], Result], names: list[str]
) -> list[dict[str, Any]]:
    """The issue's targets, each with its measured value and reached / not reached."""

    def rate(workload: str, size: int) -> float | None:
        r = ours.get((workload, size))
        return None if r is None else r.items_per_s

    def mbps(workload: str, size: int) -> float | None:
        r = ours.get((workload, size))
        return None if r is None else r.mb_per_s

    out = []

    def target(name: str, value: float | None, goal: float, shown: str, detail: str = "") -> None:
        reached = None if value is None else value >= goal
        shown = "not measured" if value is None else shown
        out.append({"target": name, "value": value, "goal": goal, "reached": reached, "shown": shown, "detail": detail})

    for name, workload, size, goal in (
        ("batch append 100 B >= 3 M items/s (append_many)", "append_many", 100, 3e6),
        ("batch read 100 B >= 5 M items/s (read_range)", "read_range", 100, 5e6),
        ("batch read 100 B >= 5 M items/s (dequeue_many)", "dequeue_many", 100, 5e6),
        ("per-item append 100 B >= 300 k items/s (append)", "append", 100, 3e5),
    ):
        value = rate(workload, size)
        target(name, value, goal, f"{fmt_rate(value or 0)} items/s")
    for workload in ("append_many", "read_range", "dequeue_many"):
        value = mbps(workload, 100_000)
        target(f"100 KB items >= 1 GB/s ({workload})", value, 1000.0, f"{(value or 0) / 1000:.2f} GB/s")
    if names and ours:
        ratios = {key: r.items_per_s / max(best_peer(peers, names, *key), 1e-9) for key, r in ours.items()}
        ranked = sorted(ratios.items(), key=lambda kv: kv[1])
        (worst_workload, worst_size), worst = ranked[0]
        misses = [f"{w} {s} B {x:.1f}x" for (w, s), x in ranked if x < 10]
        detail = f"{len(misses)} of {len(ratios)} rows below 10x: " + ", ".join(misses) if misses else ""
        name = f"every workload >= 10x the best peer (lowest: {worst_workload} {worst_size} B)"
        target(name, worst, 10.0, f"{worst:.1f}x", detail)
    else:
        target("every workload >= 10x the best peer", None, 10.0, "", "no peers run")
    return out


def render(
    machine: dict[str, Any],
    config: dict[str, Any],
    results: list[Result],
    peer_results: list[Result],
    names: list[str],
    goals: list[dict[str, Any]],
    java: list[dict[str, Any]],
) -> str:
    peers = {(r.library, r.workload, r.item_size): r for r in peer_results}
    lines = [
        "bigarray benchmark",
        f"machine: {machine['cpu']}, {machine['cores']} cores ({machine['cores_usable']} usable), "
        f"{machine['ram_gib']} GiB RAM; {machine['os']}",
        f"python {machine['python']}, numpy {machine['numpy']}; git {machine['git_commit']}; "
        f"load average (1, 5, 15 min) at start {machine['load_average_start']}, "
        f"at end {machine['load_average_end']}",
        f"data dir: {machine['data_dir']} ({machine['data_dir_filesystem']}); "
        f"data page {config['data_page_mb']} MiB; peers: "
        + (", ".join(f"{n} {machine['peer_versions'].get(n, '?')}" for n in names) or "none"),
        f"budget per workload: bigarray {config['items']} items / {config['max_mb']} MiB / {config['seconds']} s; "
        f"peers {config['peer_items']} items / {config['peer_mb']} MiB / {config['peer_seconds']} s",
        "rates: items (or MB = 10^6 bytes) per second over what each loop did; one thread; reads hit the page cache",
        "bigarray items: "
        + (
            f"sizes drawn from size +- {config['vary_pct']}% (MB/s counts the nominal size)"
            if config["vary_pct"]
            else "all of one size"
        ),
        "",
    ]
    durable = [n for n in names if n in DURABLE_PEERS]
    head = f"{'workload':<13}{'size B':>7}{'items':>9}{'bigarray/s':>11}{'spread':>7}{'MB/s':>9}"
    head += "".join(f"{n + '/s':>16}" for n in names) + f"{'x best peer':>12}{'x durable':>10}"
    lines += [head, "-" * len(head)]
    for r in results:
        row = f"{r.workload:<13}{r.item_size:>7}{r.items:>9}{fmt_rate(r.items_per_s):>11}"
        row += f"{r.spread:>6.0%} {r.mb_per_s:>9.1f}" if r.runs else f"{'-':>7}{r.mb_per_s:>9.1f}"
        for n in names:
            row += f"{fmt_rate(peers[(n, PEER_WORKLOAD[r.workload], r.item_size)].items_per_s):>16}"
        for width, group in ((12, names), (10, durable)):
            best = best_peer(peers, group, r.workload, r.item_size)
            row += f"{r.items_per_s / best:>{width - 1}.1f}x" if best else f"{'-':>{width}}"
        lines.append(row)
    lines.append(
        f"bigarray/s: median of {config['repeat']} run(s); spread: (max - min) / median over the runs; "
        "x durable: vs the best crash-safe peer (not queuelib)"
    )
    if java:
        head = f"{'workload':<13}{'size B':>7}{'bigarray/s':>11}{'Java/s':>10}  {'Java loop':<26}{'ratio':>7}  target"
        lines += [
            "",
            f"bigarray against Java bigqueue 0.7.2 FanOutQueueImpl, same run ({machine.get('java', 'java')}); "
            "Java: its one-item loops (no batch API); ratio = bigarray / Java",
            head,
            "-" * len(head),
        ]
        for c in java:
            ratio = f"{c['ratio']:.2f}" if c["ratio"] is not None else "-"
            mark = f">={c['goal']}x " + ("ok" if c["reached"] else "MISS")
            lines.append(
                f"{c['workload']:<13}{c['item_size']:>7}{fmt_rate(c['bigarray_items_per_s']):>11}"
                f"{fmt_rate(c['java_items_per_s']):>10}  {c['java_workload']:<26}{ratio:>7}  {mark}"
            )
        lines.append(f"rows at their target: {sum(bool(c['reached']) for c in java)} of {len(java)}")
    else:
        lines += ["", "Java bigqueue: no ratio was measured in this run (give --java PATH to the Java Luxun build)."]
    lines += ["", "targets:"]
    for g in goals:
        mark = {True: "reached    ", False: "NOT reached", None: "n/a        "}[g["reached"]]
        lines.append(f"  [{mark}] {g['target']}: {g['shown']}")
        if g["detail"]:
            lines.append(f"                {g['detail']}")
    if names:
        lines += ["", "peer loops (no peer has a batch API; batch rows use each one's best loop):"]
        for n in names:
            m = PEER_METHODS[n]
            lines.append(f"  {n}: {m['class']}")
            for w in ("put", "put_batch", "get", "get_batch"):
                lines.append(f"    {w:<10} {m[w]}")
        lines.append(
            "  compared: append->put, append_many->put_batch, get/dequeue->get, read_range/dequeue_many->get_batch"
        )
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"item sizes in bytes, comma-separated (default {DEFAULT_SIZES})"
    )
    p.add_argument("--items", type=int, help="bigarray: max items per workload (default 1000000; --quick 20000)")
    p.add_argument("--max-mb", type=float, help="bigarray: max MiB per workload (default 512; --quick 16)")
    p.add_argument("--seconds", type=float, help="bigarray: max timed seconds per workload (default 3; --quick 0.5)")
    p.add_argument(
        "--repeat", type=int, help="bigarray: runs per workload, the median is reported (default 3; --quick 1)"
    )
    p.add_argument("--peer-items", type=int, help="peers: max items per workload (default 100000; --quick 2000)")
    p.add_argument("--peer-mb", type=float, help="peers: max MiB per workload (default 256; --quick 8)")
    p.add_argument("--peer-seconds", type=float, help="peers: max timed seconds per workload (default 2; --quick 0.3)")
    p.add_argument(
        "--peers", default=",".join(ALL_PEERS), help=f"comma-separated subset of {','.join(ALL_PEERS)}, or 'none'"
    )
    p.add_argument(
        "--java",
        nargs="?",
        type=Path,
        const=default_java_peer(),
        help="the Java Luxun build: run its BigQueueBench (Java bigqueue 0.7.2) in the same run\n"
        f"(default PATH: ${{LUXUN_JAVA_PEER}} or {default_java_peer()})",
    )
    p.add_argument(
        "--java-sizes", default=DEFAULT_JAVA_SIZES, help=f"item sizes Java runs at (default {DEFAULT_JAVA_SIZES})"
    )
    p.add_argument("--java-opts", default="", help="JVM options for BigQueueBench (default none)")
    p.add_argument(
        "--vary",
        type=int,
        default=0,
        help="bigarray: item sizes drawn from size +- this percentage (default 0: all of one size;\n"
        "a run of items of one size is read in one numpy pass, items of varying sizes one by one)",
    )
    p.add_argument("--data-page-mb", type=int, default=128, help="BigArray data page size in MiB (default 128)")
    p.add_argument(
        "--data-dir", type=Path, help="where a temporary working dir is made and removed afterwards (default: /tmp)"
    )
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    p.add_argument("--quick", action="store_true", help="short smoke run: small budgets")
    args = p.parse_args(argv)
    for name, (full, quick) in BUDGETS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error("--sizes takes integers, e.g. 100,1000")
    if not 0 <= args.vary < 100:
        p.error("--vary is a percentage in [0, 100)")
    if not args.sizes or min(args.sizes) <= 0 or max(args.sizes) * (100 + args.vary) // 100 > args.data_page_mb * MIB:
        p.error("--sizes must be positive and at most the data page size")
    names = [] if args.peers.strip() == "none" else [n.strip() for n in args.peers.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ALL_PEERS))
    if unknown:
        p.error(f"unknown peer(s) {unknown}; choose from {list(ALL_PEERS)}")
    args.peers = [n for n in ALL_PEERS if n in names]
    args.java_opts = shlex.split(args.java_opts)
    args.java_peer = None
    if args.java is not None:
        try:
            args.java_peer = JavaPeer.at(args.java)
            args.java_sizes = [int(s) for s in args.java_sizes.split(",") if s.strip()]
        except FileNotFoundError as e:
            p.error(str(e))
        except ValueError:
            p.error("--java-sizes takes integers, e.g. 100,1000")
    return args


@contextlib.contextmanager
def work_dir(parent: Path | None) -> Iterator[Path]:
    """A fresh directory under ``parent`` (or the system temp dir), removed at the end."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="bench_bigarray-", dir=parent))
    try:
        yield path
    finally:
        remove_tree(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    results: list[Result] = []
    peer_results: list[Result] = []
    java_results: list[Result] = []
    with work_dir(args.data_dir) as root:
        machine = machine_info(root)
        if args.java_peer:
            machine["java"] = java_version()
        print(f"bench_bigarray: working in {root}", file=sys.stderr, flush=True)
        for size in args.sizes:
            size_dir = root / f"size-{size}"
            size_dir.mkdir()
            repeats, java_repeats = [], []
            with_java = args.java_peer is not None and size in args.java_sizes
            for i in range(args.repeat):
                for side in ("bigarray", "java") if i % 2 == 0 else ("java", "bigarray"):
                    if side == "java" and not with_java:
                        continue
                    run_dir = size_dir / f"run-{i}-{side}"
                    run_dir.mkdir()
                    os.sync()  # start each run with no write-back of earlier runs pending
                    if side == "java":
                        java_repeats.append(bench_java(args.java_peer, size, run_dir, args))
                    else:
                        repeats.append(bench_bigarray(size, run_dir, args))
                    remove_tree(run_dir)
            results += median_results(repeats)
            if java_repeats:
                java_results += median_results(java_repeats)
            for name in args.peers:
                os.sync()
                peer_results += bench_peer(name, size, size_dir, args)
            remove_tree(size_dir)
        machine["load_average_end"] = load_average()
    config = {k: getattr(args, k) for k in BUDGETS} | {
        "sizes": args.sizes,
        "vary_pct": args.vary,
        "peers": args.peers,
        "data_page_mb": args.data_page_mb,
        "quick": args.quick,
        "batch": f"min({BATCH_MAX_ITEMS} items, {BATCH_MAX_BYTES} bytes)",
        "read_max_bytes": READ_MAX_BYTES,
        "java_build": str(args.java_peer.root) if args.java_peer else None,
        "java_sizes": args.java_sizes if args.java_peer else [],
        "java_opts": args.java_opts,
    }
    ours = {(r.workload, r.item_size): r for r in results}
    peers = {(r.library, r.workload, r.item_size): r for r in peer_results}
    cells = java_cells(results, java_results)
    goals = targets(ours, peers, args.peers)
    print(render(machine, config, results, peer_results, args.peers, goals, cells))
    report = {
        "benchmark": "bench_bigarray",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": machine,
        "config": config,
        "bigarray": [r.to_json() for r in results],
        "peers": [r.to_json() for r in peer_results],
        "peer_methods": {n: PEER_METHODS[n] for n in args.peers},
        "compared_with": PEER_WORKLOAD,
        "speedup_vs_best_peer": {
            f"{r.workload}/{r.item_size}": r.items_per_s / best
            for r in results
            if (best := best_peer(peers, args.peers, r.workload, r.item_size))
        },
        "speedup_vs_best_durable_peer": {
            f"{r.workload}/{r.item_size}": r.items_per_s / best
            for r in results
            if (best := best_peer(peers, [n for n in args.peers if n in DURABLE_PEERS], r.workload, r.item_size))
        },
        "targets": [{k: v for k, v in g.items() if k != "shown"} for g in goals],
        "java_bigqueue": {
            "measured_in_this_run": bool(java_results),
            "what": "BigQueueBench: Java bigqueue 0.7.2 FanOutQueueImpl and BigQueueImpl, enqueue then dequeue, "
            "one item per call; the ratio is bigarray / FanOutQueueImpl, median of each side's repeats",
            "compared_with": JAVA_WORKLOAD,
            "goals": JAVA_GOALS,
            "results": [r.to_json() for r in java_results],
            "cells": cells,
        },
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nresults written to {args.json} ({report['duration_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
