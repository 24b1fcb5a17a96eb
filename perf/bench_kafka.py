"""Benchmark the Kafka port: confluent-kafka and kafka-python against our broker, and our Thrift path beside them.

A program, not a test::

    .venv/bin/python perf/bench_kafka.py            # full run (~4-5 min on 2 cores)
    .venv/bin/python perf/bench_kafka.py --quick    # smoke run (~1.5 min)
    .venv/bin/python perf/bench_kafka.py --parts main --clients confluent
    .venv/bin/python perf/bench_kafka.py --help

Every cell starts a fresh broker (``python -m luxun.cli serve --kafka-port N``) on
127.0.0.1 with a new temporary data dir, runs its clients in fresh processes (fork) and
stops the broker with SIGTERM. Parts (``--parts``):

==========  ==========================================================================
main        per record size (100 B, 1 KB) and client: a producer (records/s, MB/s of
            record values) and a consumer reading a pre-filled partition from offset 0
            (``assign``, no group). Clients: confluent-kafka (librdkafka; its defaults:
            batch.size 1 MB, linger.ms 5, acks all; the consumer with
            fetch.queue.backoff.ms 10, see FETCH_QUEUE_BACKOFF_MS), kafka-python (linger_ms 5,
            batch_size 1 MiB), and in the same run our Thrift path with our own clients
            (``clients.producer.Producer``, acknowledged ``produce``, packs of 1000
            messages; ``clients.consumer.StreamConsumer`` by group, 1 MiB fetches), the
            code of perf/bench_clients.py
batch       confluent-kafka producer, 100 B records, ``batch.size`` 195, 1387, 8192, 16384,
            56769 bytes (Table 10.3 of the HMB thesis, ../shared/seeds/003_4ad83c588116fe9a.txt)
size        confluent-kafka producer, records of 10 B .. 100 KB, ``batch.size`` 12800 bytes
            (Table 10.5 of the thesis)
txn         confluent-kafka producer per record size (``--sizes``): plain, idempotent
            (``enable.idempotence``) and transactional (``transactional.id``, a commit
            every ``--txn-records`` records, 1000 by default), side by side
==========  ==========================================================================

The thesis measured TCP throughput with Wireshark (record and request overhead included)
on its own machines (a Xeon E3-1245 v3 broker, a Core i7-2720QM client, 1 Gb Ethernet,
Kafka 0.8.2); its figures are printed beside ours labelled as such, never divided by
ours. Our ``wire MB/s`` is the record-batch bytes the broker stored (``bytes_in`` of
/topics.json: headers and per-record overhead included, request headers not) per
second; ``MB/s`` is record values only. 1 MB = 10^6 bytes.

Bounded: every producer stops at ``--messages`` records, ``--max-mb`` MB of values or
``--seconds`` of sending, whichever comes first (the clock is read between chunks), then
flushes within ``--drain-seconds``; a consumer stops when it has every pre-filled record
or after ``--seconds`` + ``--drain-seconds``. The producer's count is checked against
what the broker stored (``items_in``); the consumer's against the records pre-filled.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import secrets
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import bench_clients as bc  # noqa: E402
from _common import (  # noqa: E402
    BrokerInfo,
    _broker_process,
    _fresh_root,
    collect_reports,
    dist_versions,
    fmt_rate,
    free_port,
    load_average,
    machine_info,
)

MB = 1_000_000
MIB = 1 << 20
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "bench_kafka.json"
PARTS = ("floor", "main", "batch", "size", "txn")
CLIENTS = ("confluent", "kafka-python", "thrift")
SETUP_TIMEOUT_S = 60.0
#: confluent-kafka consumer's fetch.queue.backoff.ms (librdkafka's default: 1000).
FETCH_QUEUE_BACKOFF_MS = 10
#: Records produced between two reads of the clock.
CHUNK = 1000

#: name -> (full run, --quick run).
BUDGETS: dict[str, tuple[float, float]] = {
    "seconds": (4.0, 1.0),
    "messages": (2_000_000, 300_000),
    "max_mb": (400.0, 60.0),
    "warmup_messages": (20_000, 5_000),
    "drain_seconds": (30.0, 20.0),
}

#: The issue's targets (2-core machine), confluent-kafka against our Kafka port.
TARGETS = (
    ("confluent-kafka producer, 100 B records", ("confluent", "producer", 100), "rps", 300_000),
    ("confluent-kafka producer, 1 KB records", ("confluent", "producer", 1000), "mbs", 150.0),
    ("confluent-kafka consumer, 100 B records", ("confluent", "consumer", 100), "rps", 1_000_000),
)

#: The thesis' Table 10.3 (100 B messages, producer batch size in bytes; TCP MB/s on its machines):
#: scenario 1 Kafka producer -> Kafka 0.8.2, scenario 2 Kafka producer -> HMB (its Haskell broker).
SEED_BATCH = {195: (9, 8), 1387: (24, 12), 8192: (68, 54), 16384: (80, 32), 56769: (98, 48)}
#: The thesis' Table 10.5 (batch size 12800 B; message size -> TCP MB/s, same scenarios).
SEED_SIZE = {10: (85, 50), 100: (70, 35), 1000: (80, 75), 10_000: (95, 75), 100_000: (105, 100)}
SEED_BATCH_SIZE_SWEEP = 12800


# -- the broker ---------------------------------------------------------------------------
_SERVING = re.compile(
    r"serving \d+ topics from .* on (\S+):(\d+) \(Kafka protocol on (\S+):(\d+)[^;]*; metrics on (\S+?)\)"
)


@dataclass
class KafkaBroker:
    info: BrokerInfo
    thrift: str  # host:port
    bootstrap: str  # host:port of the Kafka port
    metrics_url: str

    def topic_stats(self, topic: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.metrics_url.rstrip("/") + "/topics.json", timeout=10) as r:
            rows = json.loads(r.read())
        return next((row for row in rows if row["name"] == topic), {})


@contextlib.contextmanager
def kafka_broker(data_parent: Path | None, tree: Path = REPO) -> Iterator[KafkaBroker]:
    """A fresh ``luxun serve`` of the source tree ``tree`` with the Kafka port and
    metrics on, on a new data dir."""
    root = _fresh_root(data_parent, "bench_kafka")
    password = secrets.token_hex(8)
    command = [
        sys.executable, "-m", "luxun.cli", "serve",
        "--data-dir", str(root / "data"), "--host", "127.0.0.1", "--port", "0",
        "--kafka-port", str(free_port()), "--metrics-port", str(free_port()),
        "--password", f"plain:{password}", "--log-level", "INFO",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    found: dict[str, str] = {}

    def ready(text: str) -> tuple[str, int] | None:
        m = _SERVING.search(text)
        if not m:
            return None
        found.update(kafka=f"{m.group(3)}:{m.group(4)}", metrics=m.group(5))
        return m.group(1), int(m.group(2))

    with _broker_process("bench_kafka", root, command, ready, password, None, env=env, cwd=tree) as info:
        yield KafkaBroker(info, f"{info.host}:{info.port}", found["kafka"], found["metrics"])


@contextlib.contextmanager
def source_tree(rev: str) -> Iterator[Path]:
    """The files of git revision ``rev`` of this repository in a temporary folder."""
    root = Path(tempfile.mkdtemp(prefix="bench_kafka-before-"))
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- the floor: the broker's Python cost per request, in process ---------------------------
#: (label, records per batch, record size, requests timed)
FLOOR_PRODUCE = (
    ("produce 1 x 100 B", 1, 100, 3000),
    ("produce 10 x 100 B", 10, 100, 3000),
    ("produce 9000 x 100 B (~1 MB)", 9000, 100, 100),
    ("produce 1000 x 1 KB (~1 MB)", 1000, 1000, 100),
)


def floor_of(tree: Path) -> list[dict[str, Any]]:
    """:func:`floor_rows` of ``tree``'s broker code, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--floor-child", str(tree)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"the floor of {tree} failed:\n{out.stderr[-3000:]}")
    rows: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    for row in rows:
        print(f"bench_kafka: floor {row['what']}: {row['cpu_us']:.1f} us CPU per request ({tree})", file=sys.stderr)
    return rows


def floor_rows(tree: Path) -> list[dict[str, Any]]:
    """CPU time (this thread's) per request of ``KafkaHandler.handle_frame`` of the broker
    code in ``tree``, over real topics in a temporary data dir: frame in, response out,
    no sockets (Produce v9 and Fetch v12, what librdkafka 2.x negotiates)."""
    sys.path.insert(0, str(tree))
    import io as _io

    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.serial import entity_writer

    from luxun.config import BrokerConfig
    from luxun.kafka import protocol as P
    from luxun.kafka.handlers import KafkaHandler
    from luxun.kafka.log import KafkaLog
    from luxun.topics import TopicManager

    def batch(n: int, size: int) -> bytes:
        b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30)
        for i in range(n):
            b.append(i, 1_700_000_000_000, None, b"x" * size, [])
        return bytes(b.build())

    def frame(api_key: int, version: int, **values: Any) -> bytes:
        req = P.build(P.request_schema(api_key, version), **values)
        out = _io.BytesIO()
        out.write(struct.pack(">hhih", api_key, version, 1, 5) + b"bench")
        if P.request_schema(api_key, version).__flexible__:
            out.write(b"\0")
        entity_writer(type(req))(out, req)
        return out.getvalue()

    def produce_frame(records: bytes) -> bytes:
        data = [{"name": "t", "partition_data": [{"index": 0, "records": records}]}]
        return frame(0, 9, acks=-1, timeout=30_000, topic_data=data)

    def fetch_frame(offset: int) -> bytes:
        part = {"partition": 0, "fetch_offset": offset, "log_start_offset": -1, "partition_max_bytes": MIB}
        return frame(
            1, 12, replica_id=-1, max_wait=500, min_bytes=1, max_bytes=50 * MIB, isolation_level=0,
            session_id=0, session_epoch=-1, topics=[{"topic": "f", "partitions": [part]}],
            forgotten_topics_data=[], rack_id="",
        )  # fmt: skip

    rows = []
    root = tempfile.mkdtemp(prefix="bench_kafka-floor-")
    topics = TopicManager(root, data_page_size_bytes=BrokerConfig().data_page_size_bytes)
    try:
        kafka_log = KafkaLog(topics)
        handler = KafkaHandler(kafka_log, node_id=0, host="127.0.0.1", port=9)
        peer = ("127.0.0.1", 1)

        def handle(fr: bytes) -> None:
            out = handler.handle_frame(fr, peer)
            release = getattr(out, "release", None)  # a Fetch answer's output budget, as the server does
            if release is not None:
                release()

        def timed(what: str, fr: bytes, n: int, records: int) -> None:
            handle(fr)
            c0 = time.thread_time()
            for _ in range(n):
                handle(fr)
            cpu = (time.thread_time() - c0) / n
            rows.append({"what": what, "cpu_us": cpu * 1e6, "records_per_cpu_s": records / cpu})

        kafka_log.create("t", 1)
        for what, count, size, n in FLOOR_PRODUCE:
            timed(what, produce_frame(batch(count, size)), n, count)
        kafka_log.create("f", 1)
        records = batch(9000, 100)
        for _ in range(30):
            kafka_log.produce("f", 0, records)
        timed("fetch 1 MiB of 100 B records", fetch_frame(90_000), 200, 9000)
    finally:
        topics.close()
        shutil.rmtree(root, ignore_errors=True)
    return rows


# -- children -----------------------------------------------------------------------------
def cpu_seconds(pid: int | None) -> float | None:
    return bc.cpu_seconds(pid)


def payload(size: int) -> list[bytes]:
    return bc.make_pool(size)


def confluent_producer_config(spec: dict[str, Any]) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": spec["bootstrap"], "queue.buffering.max.kbytes": 1 << 20}
    if spec["client"] == "confluent-idempotent":
        conf["enable.idempotence"] = True
    elif spec["client"] == "confluent-txn":
        conf["transactional.id"] = "bench-txn"
    if spec.get("batch_bytes"):
        conf["batch.size"] = spec["batch_bytes"]
    if spec["size"] > 900_000:
        conf["message.max.bytes"] = 2 * spec["size"]
    return conf


def _produce_confluent(producer: Any, topic: str, pool: list[bytes], count: int, seconds: float) -> tuple[int, str]:
    produce, poll = producer.produce, producer.poll
    npool = len(pool)
    clock = time.perf_counter
    deadline = clock() + seconds
    n = 0
    while n < count:
        if clock() >= deadline:
            return n, "time"
        for i in range(n, min(n + CHUNK, count)):
            while True:
                try:
                    produce(topic, pool[i % npool])
                    break
                except BufferError:  # the client's queue is full: let it send
                    poll(0.005)
        n = min(n + CHUNK, count)
        poll(0)
    return n, "count"


def _transactions_of(records: int, counter: list[int]) -> Any:
    """A confluent-kafka send loop that commits a transaction every ``records`` records
    (``counter[0]`` counts the transactions: each stores one marker)."""

    def loop(producer: Any, topic: str, pool: list[bytes], count: int, seconds: float) -> tuple[int, str]:
        deadline = time.perf_counter() + seconds
        n = 0
        while n < count:
            if time.perf_counter() >= deadline:
                return n, "time"
            producer.begin_transaction()
            sent, _ = _produce_confluent(producer, topic, pool, min(records, count - n), SETUP_TIMEOUT_S)
            producer.commit_transaction(SETUP_TIMEOUT_S)
            counter[0] += 1
            n += sent
        return n, "count"

    return loop


def _produce_kafka_python(producer: Any, topic: str, pool: list[bytes], count: int, seconds: float) -> tuple[int, str]:
    send = producer.send
    npool = len(pool)
    clock = time.perf_counter
    deadline = clock() + seconds
    n = 0
    while n < count:
        if clock() >= deadline:
            return n, "time"
        for i in range(n, min(n + CHUNK, count)):
            send(topic, pool[i % npool])
        n = min(n + CHUNK, count)
    return n, "count"


def producer_main(spec: dict[str, Any], results: Any) -> None:
    """A Kafka producer process: warm up (untimed), send, flush, report."""
    out: dict[str, Any] = {"role": "producer"}
    try:
        pool = payload(spec["size"])
        topic = spec["topic"]
        drain = spec["drain_seconds"]
        transactions = [0]
        if spec["client"].startswith("confluent"):
            from confluent_kafka import Producer

            producer = Producer(confluent_producer_config(spec))
            loop = _produce_confluent
            if spec["client"] == "confluent-txn":
                producer.init_transactions(SETUP_TIMEOUT_S)
                loop = _transactions_of(spec["txn_records"], transactions)

            def flush(timeout: float) -> bool:
                return int(producer.flush(timeout)) == 0

            def close() -> None:
                pass
        else:
            from kafka import KafkaProducer

            producer = KafkaProducer(
                bootstrap_servers=spec["bootstrap"],
                linger_ms=5,
                batch_size=spec.get("batch_bytes") or MIB,
                max_request_size=max(MIB, 2 * spec["size"]),
                request_timeout_ms=int(drain * 1000),
            )
            loop = _produce_kafka_python

            def flush(timeout: float) -> bool:
                producer.flush(timeout)
                return True

            def close() -> None:
                producer.close(10)

        try:
            warm, _ = loop(producer, topic, pool, spec["warmup_messages"], SETUP_TIMEOUT_S)
            if not flush(SETUP_TIMEOUT_S):
                raise RuntimeError("the warm-up records were not delivered in time")
            cpu0, broker0 = time.process_time(), cpu_seconds(spec["broker_pid"])
            t0 = time.perf_counter()
            sent, stopped_by = loop(producer, topic, pool, spec["count"], spec["seconds"])
            t_sent = time.perf_counter()
            flushed = flush(drain)
            t1 = time.perf_counter()
            cpu1, broker1 = time.process_time(), cpu_seconds(spec["broker_pid"])
        finally:
            close()
        out.update(
            warm=warm,
            sent=sent,
            stopped_by=stopped_by if flushed else "flush timeout",
            seconds=t1 - t0,
            send_loop_s=t_sent - t0,
            cpu_s=cpu1 - cpu0,
            broker_cpu_s=None if broker0 is None or broker1 is None else broker1 - broker0,
            transactions=transactions[0],
        )
    except BaseException as exc:
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    results.put(out)


def _first_batch(take: Any, size: Any) -> Any:
    """Call ``take()`` until it returns records (``size(batch) > 0``): the connection,
    metadata and first fetch are not timed; the clock starts once records flow."""
    deadline = time.perf_counter() + SETUP_TIMEOUT_S
    while time.perf_counter() < deadline:
        batch = take()
        if size(batch):
            return batch
    raise RuntimeError(f"no record within {SETUP_TIMEOUT_S:.0f} s")


def consumer_main(spec: dict[str, Any], results: Any) -> None:
    """A Kafka consumer process: read partition 0 of the pre-filled topic from offset 0
    (timed from the first records received; those are not counted)."""
    out: dict[str, Any] = {"role": "consumer"}
    try:
        topic, want, size = spec["topic"], spec["count"], spec["size"]
        clock = time.perf_counter
        bad = 0
        if spec["client"] == "confluent":
            from confluent_kafka import Consumer, TopicPartition

            consumer = Consumer(
                {
                    "bootstrap.servers": spec["bootstrap"],
                    "group.id": "bench-" + secrets.token_hex(3),
                    "enable.auto.commit": False,
                    "fetch.message.max.bytes": max(MIB, 2 * size),
                    # librdkafka >= 2.1 postpones the next fetch by 1 s once it holds
                    # queued.min.messages (100000) unconsumed: a fetcher faster than the
                    # application stalls 1 s in every few (measured: 275 k records/s of 100 B
                    # with the default, 632 k with 10 ms). Kafka clients tune it the same way.
                    "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
                }
            )
            consumer.assign([TopicPartition(topic, 0, 0)])
            consume = consumer.consume
            first = _first_batch(lambda: consume(10_000, 0.1), len)
            n = untimed = len(first)
            cpu0, broker0 = time.process_time(), cpu_seconds(spec["broker_pid"])
            t0 = clock()
            deadline = t0 + spec["seconds"] + spec["drain_seconds"]
            while n < want and clock() < deadline:
                msgs = consume(10_000, 0.1)
                if msgs:
                    last = msgs[-1]
                    if last.error() is not None:
                        raise RuntimeError(f"consumer error: {last.error()}")
                    if len(last.value()) != size:
                        bad += 1
                    n += len(msgs)
            t1 = clock()
            cpu1, broker1 = time.process_time(), cpu_seconds(spec["broker_pid"])
            consumer.close()
        else:
            from kafka import KafkaConsumer
            from kafka import TopicPartition as KTP

            consumer = KafkaConsumer(
                bootstrap_servers=spec["bootstrap"],
                enable_auto_commit=False,
                group_id=None,
                max_partition_fetch_bytes=max(MIB, 2 * size),
                fetch_max_bytes=50 * MIB,
            )
            tp = KTP(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)

            def count(polled: dict[Any, list[Any]]) -> int:
                return sum(len(records) for records in polled.values())

            n = untimed = count(_first_batch(lambda: consumer.poll(timeout_ms=100, max_records=10_000), count))
            cpu0, broker0 = time.process_time(), cpu_seconds(spec["broker_pid"])
            t0 = clock()
            deadline = t0 + spec["seconds"] + spec["drain_seconds"]
            while n < want and clock() < deadline:
                for records in consumer.poll(timeout_ms=100, max_records=10_000).values():
                    if records and len(records[-1].value) != size:
                        bad += 1
                    n += len(records)
            t1 = clock()
            cpu1, broker1 = time.process_time(), cpu_seconds(spec["broker_pid"])
            consumer.close()
        out.update(
            received=n - untimed,
            untimed=untimed,
            wrong_size=bad,
            stopped_by="count" if n >= want else "time",
            seconds=t1 - t0,
            cpu_s=cpu1 - cpu0,
            broker_cpu_s=None if broker0 is None or broker1 is None else broker1 - broker0,
        )
    except BaseException as exc:
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    results.put(out)


def run_child(fn: Any, spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    proc = ctx.Process(target=fn, args=(spec, results), daemon=True)
    proc.start()
    (out,) = collect_reports([proc], results, timeout_s, "bench_kafka")
    return out


# -- cells --------------------------------------------------------------------------------
@dataclass
class Cell:
    part: str
    client: str
    role: str
    size: int
    batch_bytes: int | None = None
    records: int = 0
    seconds: float = 0.0
    records_per_s: float = 0.0
    mb_per_s: float = 0.0
    wire_mb_per_s: float | None = None
    client_cpu: float | None = None  # CPU seconds per wall second
    broker_cpu: float | None = None
    stopped_by: str = ""
    broker: str = "this tree"
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def broker_us_per_record(self) -> float | None:
        """Broker CPU microseconds per record (robust to a busy machine, unlike rates)."""
        if self.broker_cpu is None or not self.records_per_s:
            return None
        return self.broker_cpu / self.records_per_s * 1e6

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.part, self.client, self.role, self.size, self.batch_bytes)


def timeout_of(args: argparse.Namespace) -> float:
    return 2 * SETUP_TIMEOUT_S + args.seconds + 2 * args.drain_seconds + 60


def count_for(args: argparse.Namespace, size: int) -> int:
    return max(1, min(args.messages, int(args.max_mb * MB) // size))


def finish(cell: Cell, n: int, seconds: float, cpu: float | None, broker_cpu: float | None, stopped: str) -> Cell:
    seconds = max(seconds, 1e-9)
    cell.records, cell.seconds, cell.stopped_by = n, round(seconds, 4), stopped
    cell.records_per_s = n / seconds
    cell.mb_per_s = n * cell.size / seconds / MB
    cell.client_cpu = None if cpu is None else round(cpu / seconds, 2)
    cell.broker_cpu = None if broker_cpu is None else round(broker_cpu / seconds, 2)
    return cell


def kafka_spec(args: argparse.Namespace, b: KafkaBroker, client: str, size: int, topic: str) -> dict[str, Any]:
    return {
        "client": client,
        "bootstrap": b.bootstrap,
        "broker_pid": b.info.pid,
        "topic": topic,
        "size": size,
        "count": count_for(args, size),
        "seconds": args.seconds,
        "warmup_messages": min(args.warmup_messages, count_for(args, size)),
        "drain_seconds": args.drain_seconds,
    }


def kafka_producer_cell(
    args: argparse.Namespace, part: str, client: str, size: int, batch_bytes: int | None, tree: tuple[str, Path]
) -> Cell:
    cell = Cell(part, client, "producer", size, batch_bytes, broker=tree[0])
    with kafka_broker(args.data_dir, tree[1]) as b:
        topic = f"bench-{size}"
        spec = kafka_spec(args, b, client, size, topic) | {"batch_bytes": batch_bytes, "txn_records": args.txn_records}
        p = run_child(producer_main, spec, timeout_of(args))
        stats = b.topic_stats(topic)
    stored = stats.get("items_in", 0) - p["warm"] - p["transactions"]  # each transaction adds its marker
    stopped = p["stopped_by"]
    if stored != p["sent"]:
        stopped += f" (broker stored {stored} of {p['sent']})"
    finish(cell, min(stored, p["sent"]), p["seconds"], p["cpu_s"], p["broker_cpu_s"], stopped)
    # The stored batches of the timed records: all bytes in, less the warm-up's share.
    total_in = stats.get("bytes_in", 0)
    items_in = max(1, stats.get("items_in", 1))
    cell.wire_mb_per_s = total_in * (stored / items_in) / cell.seconds / MB
    cell.details = {"sent": p["sent"], "warm": p["warm"], "send_loop_s": round(p["send_loop_s"], 4)}
    return cell


def prefill(args: argparse.Namespace, b: KafkaBroker, size: int, topic: str) -> int:
    """Fill partition 0 of ``topic`` with confluent-kafka (untimed); the records stored."""
    spec = kafka_spec(args, b, "confluent", size, topic) | {"seconds": 10 * args.seconds + 30, "warmup_messages": 0}
    run_child(producer_main, spec, timeout_of(args) + 10 * args.seconds)
    return int(b.topic_stats(topic).get("items_in", 0))


def kafka_consumer_cell(args: argparse.Namespace, client: str, size: int, tree: tuple[str, Path]) -> Cell:
    cell = Cell("main", client, "consumer", size, broker=tree[0])
    with kafka_broker(args.data_dir, tree[1]) as b:
        topic = f"bench-{size}"
        stored = prefill(args, b, size, topic)
        os.sync()
        spec = kafka_spec(args, b, client, size, topic) | {"count": stored}
        c = run_child(consumer_main, spec, timeout_of(args))
    got = c["received"] + c["untimed"]
    stopped = c["stopped_by"] + (f" ({got} of {stored})" if got < stored else "")
    if c["wrong_size"]:
        stopped += f" ({c['wrong_size']} records of a wrong size)"
    finish(cell, c["received"], c["seconds"], c["cpu_s"], c["broker_cpu_s"], stopped)
    cell.details = {"prefilled": stored, "untimed_first_records": c["untimed"]}
    return cell


def thrift_spec(args: argparse.Namespace, b: KafkaBroker, size: int, topic: str) -> dict[str, Any]:
    return {
        "broker": b.thrift,
        "broker_pid": b.info.pid,
        "topic": topic,
        "size": size,
        "batch": 1000,
        "codec": "none",
        "sync": True,
        "linger_ms": 5,
        "buffer_mb": 64,
        "wait_ms": 1000,
        "fetch_bytes": MIB,
        "seconds": args.seconds,
        "count": count_for(args, size),
        "warmup_seconds": 5.0,
        "warmup_messages": min(args.warmup_messages, count_for(args, size)),
        "drain_seconds": args.drain_seconds,
        "profile": False,
        "profile_top": 0,
    }


def thrift_producer_cell(args: argparse.Namespace, size: int, tree: tuple[str, Path]) -> Cell:
    cell = Cell("main", "thrift", "producer", size, 1000, broker=tree[0])
    with kafka_broker(args.data_dir, tree[1]) as b:
        topic = f"bench-{size}"
        spec = thrift_spec(args, b, size, topic)
        (p,) = bc.run_children([(bc.producer_main, spec)], bc.new_shared(False), timeout_of(args))
        stats = b.topic_stats(topic)
    secs = p["t_flushed"] - p["t0"]
    finish(cell, p["delivered"], secs, p["cpu_s"], p["broker_cpu_s"], p["stopped_by"])
    items = max(1, stats.get("items_in", 1))  # packs: the timed share of the bytes stored
    cell.wire_mb_per_s = stats.get("bytes_in", 0) * (p["delivered"] / (p["delivered"] + p["warm"])) / secs / MB
    cell.details = {"sent": p["sent"], "warm": p["warm"], "packs_stored": items, "dropped": p["dropped"]}
    return cell


def thrift_consumer_cell(args: argparse.Namespace, size: int, tree: tuple[str, Path]) -> Cell:
    cell = Cell("main", "thrift", "consumer", size, broker=tree[0])
    with kafka_broker(args.data_dir, tree[1]) as b:
        topic = f"bench-{size}"
        spec = thrift_spec(args, b, size, topic) | {"seconds": 10 * args.seconds + 30, "warmup_messages": 1}
        (p,) = bc.run_children([(bc.producer_main, spec)], bc.new_shared(False), timeout_of(args) + 10 * args.seconds)
        stored = p["warm"] + p["delivered"]
        os.sync()
        spec = thrift_spec(args, b, size, topic) | {
            "count": stored,
            "max_messages": stored,
            "group": "alone-" + secrets.token_hex(3),
        }
        (c,) = bc.run_children([(bc.consumer_alone_main, spec)], bc.new_shared(False), timeout_of(args))
    stopped = c["stopped_by"] + (f" ({c['wrong_size']} wrong size)" if c["wrong_size"] else "")
    finish(cell, c["received"], c["timed_s"], c["cpu_s"], c["broker_cpu_s"], stopped)
    cell.client_cpu = None if c["cpu_s"] is None else round(c["cpu_s"] / max(c["wall_s"], 1e-9), 2)
    cell.broker_cpu = None if c["broker_cpu_s"] is None else round(c["broker_cpu_s"] / max(c["wall_s"], 1e-9), 2)
    cell.details = {"prefilled": stored}
    return cell


def log_cell(c: Cell) -> None:
    batch = f" batch.size {c.batch_bytes}" if c.batch_bytes and c.client != "thrift" else ""
    print(
        f"bench_kafka: [{c.broker}] {c.part:5} {c.client:12} {c.role:8} {c.size:>6} B{batch}: "
        f"{fmt_rate(c.records_per_s)} rec/s, "
        f"{c.mb_per_s:.1f} MB/s ({c.records} in {c.seconds:.2f} s; {c.stopped_by}; load {load_average()[0]})",
        file=sys.stderr,
    )


# -- the report ---------------------------------------------------------------------------
CLIENT_NAMES = {
    "confluent": "confluent-kafka",
    "confluent-idempotent": "confluent idemp.",
    "confluent-txn": "confluent txn",
    "kafka-python": "kafka-python",
    "thrift": "luxun Thrift",
}


def fmt_cpu(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def fmt_size(n: int) -> str:
    return f"{n // 1000} KB" if n >= 1000 else f"{n} B"


def fmt_us(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def render(machine: dict[str, Any], args: argparse.Namespace, cells: list[Cell], floors: list[dict[str, Any]]) -> str:
    two = bool(args.before)
    lines = [
        "bench_kafka: the Kafka port (confluent-kafka, kafka-python) and the Thrift path (our clients), same run",
        f"machine: {machine['cpu']}, {machine['cores']} cores ({machine['cores_usable']} usable), "
        f"{machine['ram_gib']} GiB, {machine['os']}, kernel {machine['kernel']}, Python {machine['python']}",
        f"versions: {machine.get('versions')}; commit {machine['git_commit']}",
        f"load average at start {machine['load_average_start']}, at end {machine.get('load_average_end')} "
        "(the machine is shared: interference only slows a cell down; broker us/rec is CPU time, less affected)",
        f"budgets per cell: {args.messages} records, {args.max_mb:g} MB of values, {args.seconds:g} s; "
        "a fresh broker and data dir per cell; MB = 10^6 B",
        "",
    ]
    if two:
        lines[-1:-1] = [f"brokers: this tree and git revision {args.before}, taking turns cell by cell (AB BA ...)"]
    broker_col = (lambda c: f"{c.broker:>{width}} ") if two else (lambda c: "")
    width = max([len(c.broker) for c in cells] + [len(str(f.get("broker", ""))) for f in floors] + [6])
    broker_head = f"{'broker':>{width}} " if two else ""
    if floors:
        lines += [
            "floor: the broker's CPU per request in process (KafkaHandler.handle_frame: parse, append or read, "
            "response; no socket), Produce v9 / Fetch v12",
            f"{broker_head}{'request':32} {'CPU us/request':>15} {'records/CPU-s':>14}",
        ]
        for f in floors:
            b = f"{f['broker']:>{width}} " if two else ""
            lines.append(f"{b}{f['what']:32} {f['cpu_us']:15.1f} {fmt_rate(f['records_per_cpu_s']):>14}")
        lines.append("")
    main = [c for c in cells if c.part == "main"]

    def main_row(c: Cell) -> str:
        wire = "-" if c.wire_mb_per_s is None else f"{c.wire_mb_per_s:.1f}"
        return (
            f"{broker_col(c)}{CLIENT_NAMES[c.client]:16} {c.role:9} {fmt_size(c.size):>6} "
            f"{fmt_rate(c.records_per_s):>11} {c.mb_per_s:8.1f} {wire:>10} {fmt_cpu(c.client_cpu):>10} "
            f"{fmt_cpu(c.broker_cpu):>10} {fmt_us(c.broker_us_per_record):>13}  {c.stopped_by}"
        )

    main_head = (
        f"{broker_head}{'client':16} {'role':9} {'size':>6} {'records/s':>11} {'MB/s':>8} {'wire MB/s':>10} "
        f"{'client CPU':>10} {'broker CPU':>10} {'broker us/rec':>13}  stopped by"
    )
    if main:
        lines += [
            "main: records of 100 B and 1 KB (client CPU, broker CPU: CPU seconds per wall second; "
            "broker us/rec: broker CPU microseconds per record)",
            main_head,
        ]
        lines += [main_row(c) for c in main]
        lines += [
            "  confluent-kafka: librdkafka defaults (batch.size 1 MB, linger.ms 5, acks all; the consumer with "
            f"fetch.queue.backoff.ms {FETCH_QUEUE_BACKOFF_MS}, not 1000); kafka-python: "
            "linger_ms 5, batch_size 1 MiB; luxun Thrift: clients.producer.Producer (acknowledged produce, "
            "packs of 1000) and StreamConsumer (1 MiB fetches), perf/bench_clients.py's code",
            "",
        ]
    txn = [c for c in cells if c.part == "txn"]
    if txn:
        lines += [
            f"txn: confluent-kafka producer plain, idempotent, transactional (a commit every {args.txn_records} "
            "records; records/s counts data records, not the markers)",
            main_head,
        ]
        lines += [main_row(c) for c in txn]
        lines.append("")
    for part, seed, variable, title in (
        ("batch", SEED_BATCH, "batch_bytes", "batch-size sweep: confluent-kafka producer, 100 B records (Table 10.3)"),
        (
            "size",
            SEED_SIZE,
            "size",
            f"message-size sweep: confluent-kafka producer, batch.size {SEED_BATCH_SIZE_SWEEP} B (Table 10.5)",
        ),
    ):
        rows = [c for c in cells if c.part == part]
        if not rows:
            continue
        lines += [
            title,
            f"{broker_head}{'batch.size' if part == 'batch' else 'record':>10} {'records/s':>11} {'MB/s':>8} "
            f"{'wire MB/s':>10} {'broker CPU':>10} {'broker us/rec':>13} | {'thesis: Kafka->Kafka':>20} "
            f"{'Kafka->HMB':>11}",
        ]
        for c in rows:
            key = getattr(c, variable)
            s1, s2 = seed.get(key, (None, None))
            label = f"{key} B" if part == "batch" else fmt_size(key)
            wire = "-" if c.wire_mb_per_s is None else f"{c.wire_mb_per_s:.1f}"
            lines.append(
                f"{broker_col(c)}{label:>10} {fmt_rate(c.records_per_s):>11} {c.mb_per_s:8.1f} {wire:>10} "
                f"{fmt_cpu(c.broker_cpu):>10} {fmt_us(c.broker_us_per_record):>13} | "
                f"{s1 if s1 is not None else '-':>20} {s2 if s2 is not None else '-':>11}"
            )
        lines += [
            "  the thesis' columns: TCP MB/s (overhead included) measured with Wireshark on the thesis' machines "
            "(Xeon E3-1245 v3 broker, i7-2720QM client, 1 Gb Ethernet, Kafka 0.8.2), NOT this machine",
            "",
        ]
    if two:
        lines += render_before_after(cells, args.before)
    ours = [c for c in main if c.broker == "this tree"]
    lines.append("targets (issue 13, 2-core machine; this tree's broker):")
    for text, key, unit, goal in TARGETS:
        cell = next((c for c in ours if (c.client, c.role, c.size) == key), None)
        if cell is None:
            lines.append(f"  {text}: not measured in this run")
            continue
        value = cell.records_per_s if unit == "rps" else cell.mb_per_s
        shown = f"{fmt_rate(value)} records/s" if unit == "rps" else f"{value:.1f} MB/s"
        want = f"{fmt_rate(goal)} records/s" if unit == "rps" else f"{goal:g} MB/s"
        lines.append(f"  {text}: {shown} (target >= {want}): {'reached' if value >= goal else 'NOT reached'}")
    return "\n".join(lines)


def render_before_after(cells: list[Cell], rev: str) -> list[str]:
    """Per cell: this tree's figure / the ``--before`` revision's (above 1: faster now)."""
    lines = [
        f"this tree / {rev}: records/s and broker CPU per record (below 1: less CPU now)",
        f"{'cell':48} {'records/s':>10} {'broker us/rec':>14}",
    ]
    by_key: dict[tuple[Any, ...], dict[str, Cell]] = {}
    for c in cells:
        by_key.setdefault(c.key, {})["after" if c.broker == "this tree" else "before"] = c
    for key, pair in by_key.items():
        a, b = pair.get("after"), pair.get("before")
        if a is None or b is None:
            continue
        part, client, role, size, batch = key
        name = f"{part} {CLIENT_NAMES[client]} {role} {fmt_size(size)}" + (
            f" batch.size {batch}" if batch and client != "thrift" else ""
        )
        rate = a.records_per_s / b.records_per_s if b.records_per_s else float("nan")
        au, bu = a.broker_us_per_record, b.broker_us_per_record
        cpu = f"{au / bu:.2f}" if au is not None and bu else "-"
        lines.append(f"{name:48} {rate:10.2f} {cpu:>14}")
    lines.append("")
    return lines


# -- main ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS))
    p.add_argument("--clients", default=",".join(CLIENTS), help="main part's clients: " + ",".join(CLIENTS))
    p.add_argument("--sizes", default="100,1000", help="main part's record sizes (default 100,1000)")
    for name, (full, quick) in BUDGETS.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(full), help=f"default {full:g}; --quick {quick:g}")
    p.add_argument("--txn-records", type=int, default=1000, help="txn part: records per transaction (default 1000)")
    p.add_argument("--data-dir", type=Path, help="where the brokers' temporary data dirs go (default: /tmp)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    p.add_argument("--quick", action="store_true", help="short smoke run: small budgets")
    p.add_argument(
        "--before",
        metavar="REV",
        help="also run every cell against the broker of git revision REV (git archive into a temp dir), "
        "taking turns with this tree's: before/after in one run",
    )
    p.add_argument("--floor-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, (full, quick) in BUDGETS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.parts = [x for x in args.parts.split(",") if x]
    args.clients = [x for x in args.clients.split(",") if x]
    args.sizes = [int(x) for x in args.sizes.split(",") if x]
    for x in args.parts:
        if x not in PARTS:
            p.error(f"--parts: unknown part {x!r} (known: {', '.join(PARTS)})")
    for x in args.clients:
        if x not in CLIENTS:
            p.error(f"--clients: unknown client {x!r} (known: {', '.join(CLIENTS)})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.floor_child:
        print(json.dumps(floor_rows(Path(args.floor_child))))
        return 0
    started = time.perf_counter()
    machine = machine_info(
        args.data_dir,
        versions=dist_versions(["confluent-kafka", "kafka-python", "kio", "crc32c", "thriftpy2"])
        | {"librdkafka": __import__("confluent_kafka").libversion()[0]},
    )
    cells: list[Cell] = []
    floors: list[dict[str, Any]] = []

    def add(cell: Cell) -> None:
        log_cell(cell)
        cells.append(cell)

    trees = [("this tree", REPO)]
    with contextlib.ExitStack() as stack:
        if args.before:
            trees.append((f"before ({args.before})", stack.enter_context(source_tree(args.before))))
        turn = 0

        def each_tree(run: Any) -> None:
            # Trees take turns, the first one alternating: AB, BA, AB...
            nonlocal turn
            order = trees if turn % 2 == 0 else trees[::-1]
            turn += 1
            for tree in order:
                add(run(tree))

        if "floor" in args.parts:
            for label, path in trees:
                floors.extend(dict(row, broker=label) for row in floor_of(path))
        if "main" in args.parts:
            for size in args.sizes:
                for client in args.clients:
                    if client == "thrift":
                        each_tree(lambda t, size=size: thrift_producer_cell(args, size, t))
                        each_tree(lambda t, size=size: thrift_consumer_cell(args, size, t))
                    else:
                        each_tree(lambda t, size=size, c=client: kafka_producer_cell(args, "main", c, size, None, t))
                        each_tree(lambda t, size=size, c=client: kafka_consumer_cell(args, c, size, t))
        if "batch" in args.parts:
            for batch in SEED_BATCH:
                each_tree(lambda t, batch=batch: kafka_producer_cell(args, "batch", "confluent", 100, batch, t))
        if "txn" in args.parts:
            for size in args.sizes:
                for client in ("confluent", "confluent-idempotent", "confluent-txn"):
                    each_tree(lambda t, size=size, c=client: kafka_producer_cell(args, "txn", c, size, None, t))
        if "size" in args.parts:
            for size in SEED_SIZE:
                each_tree(
                    lambda t, size=size: kafka_producer_cell(args, "size", "confluent", size, SEED_BATCH_SIZE_SWEEP, t)
                )
    machine["load_average_end"] = load_average()
    print(render(machine, args, cells, floors))
    report = {
        "benchmark": "bench_kafka",
        "machine": machine,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "seed": {"batch": SEED_BATCH, "size": SEED_SIZE, "machine": "the HMB thesis' (not this one)"},
        "duration_s": round(time.perf_counter() - started, 1),
        "floor": floors,
        "cells": [asdict(c) | {"broker_us_per_record": c.broker_us_per_record} for c in cells],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nresults written to {args.json} ({report['duration_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
