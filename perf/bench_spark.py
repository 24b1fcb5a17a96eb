"""Benchmark the ``luxun`` PySpark data source: rows/s reading and writing, on this machine.

A program, not a test::

    .venv/bin/python perf/bench_spark.py            # full run: 1 M messages of 100 B (~2 min on 2 cores)
    .venv/bin/python perf/bench_spark.py --quick    # smoke run: 100 k messages
    .venv/bin/python perf/bench_spark.py --help

It starts its own broker (``python -m luxun.cli serve`` on a free loopback port, data
in a temporary directory) and a local SparkSession, produces ``--messages`` messages of
``--size`` bytes in packs of ``--pack`` messages (one queue item each), then times:

=================  ====================================================================
read messages      ``spark.read.format("luxun")`` (decode=messages: one row per message)
                   into Spark's ``noop`` sink, so every row is built and handed to the
                   JVM but nothing else is done with it
read raw           the same with decode=raw: one row per pack
write              ``df.write.format("luxun")`` of a JVM-generated DataFrame of the same
                   messages, packed by the source (packSize = ``--pack``) and produced
                   with acknowledged ``produce``
jvm baseline       generating that DataFrame into ``noop``, with no Python in the path
raw items          (``--item-sizes``) topics of plain items of each size (``--item-mb``
                   of them), read with decode=raw two ways in the same run, taking
                   turns: ``itemsAsBlob`` on (each fetch one buffer plus lengths, the
                   ``value`` column made of it) and off (``itemList``: one ``bytes`` per
                   item, as from a Java Luxun broker); once into Spark's ``noop`` sink
                   ("spark"), once by the partition reader alone in this process
                   ("reader": ``read_range``, no Spark), with its CPU per item
=================  ====================================================================

``--items-only`` runs just the raw-items rows.

Each workload runs once to warm up (Python workers start, pages are cached), then
``--repeat`` times; the table shows the median rate, the best one (the machine is
shared: the best run is the least disturbed) and the spread ((max - min) / median).
The table goes to stdout, progress to stderr, every number to JSON
(``perf/results/bench_spark.json`` by default).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import BrokerInfo, dist_versions, load_average, machine_base, own_broker  # noqa: E402

from clients.connection import BrokerConnection  # noqa: E402
from clients.messages import encode_pack  # noqa: E402
from idl import luxun_thrift as T  # noqa: E402

DEFAULT_JSON = ROOT / "perf" / "results" / "bench_spark.json"
TARGET_READ_ROWS_S = 1_000_000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- broker ---------------------------------------------------------------------------------
def connect(broker: BrokerInfo) -> BrokerConnection:
    """A connection to ``broker`` (clients.connection: framed, Cython protocol, TCP_NODELAY)."""
    return BrokerConnection(f"{broker.host}:{broker.port}", timeout_ms=60_000)


def produce(broker: BrokerInfo, topic: str, messages: int, size: int, pack: int) -> float:
    """Produce the read workload's packs; return the seconds it took."""
    t0 = time.perf_counter()
    with connect(broker) as conn:
        for start in range(0, messages, pack):
            batch = [b"%0*d" % (size, i) for i in range(start, min(start + pack, messages))]
            conn.checked("produce", T.ProduceRequest(item=encode_pack(batch), topic=topic))
    return time.perf_counter() - t0


def produce_items(broker: BrokerInfo, topic: str, count: int, size: int) -> None:
    """``count`` plain items of ``size`` bytes (asyncProduce, then wait until all are in)."""
    item = b"i" * size
    with connect(broker) as conn:
        for _ in range(count):
            conn.produce(item, topic, oneway=True)
        while topic_size(broker, topic) < count:
            time.sleep(0.05)


def raw_items(broker: BrokerInfo, spark: Any, args: Any, partitions: int) -> list[dict[str, Any]]:
    """The raw-items rows: per item size, itemsAsBlob on and off taking turns (ABBA...)."""
    from clients.spark.options import ReadOptions
    from clients.spark.planning import LuxunPartition
    from clients.spark.read import read_range

    address = f"{broker.host}:{broker.port}"
    out: list[dict[str, Any]] = []
    for size in args.item_sizes:
        topic, count = f"bench-items-{size}", max(1, args.item_mb * 1_000_000 // size)
        log(f"raw items of {size} B: producing {count:,} ...")
        produce_items(broker, topic, count, size)
        times: dict[tuple[str, bool], list[float]] = {}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for blob in (True, False):  # warm-up (pages cached, imports done)
            opts = ReadOptions.parse(
                {"luxun.servers": address, "subscribe": topic, "decode": "raw", "itemsAsBlob": str(blob).lower()},
                streaming=False,
            )
            sum(b.num_rows for b in read_range(opts, LuxunPartition(topic, address, 0, count)))
            spark.read.format("luxun").option("luxun.servers", address).option("subscribe", topic).option(
                "decode", "raw"
            ).option("itemsAsBlob", str(blob).lower()).load().write.format("noop").mode("overwrite").save()
        for rnd in range(args.repeat):
            for blob in (True, False) if rnd % 2 == 0 else (False, True):
                flag = str(blob).lower()
                opts = ReadOptions.parse(
                    {"luxun.servers": address, "subscribe": topic, "decode": "raw", "itemsAsBlob": flag},
                    streaming=False,
                )
                t0, c0 = time.perf_counter(), time.process_time()
                rows = sum(b.num_rows for b in read_range(opts, LuxunPartition(topic, address, 0, count)))
                times.setdefault(("reader", blob), []).append(time.perf_counter() - t0)
                cpu[blob].append((time.process_time() - c0) / count * 1e6)
                assert rows == count, (rows, count)
                df = (
                    spark.read.format("luxun").option("luxun.servers", address).option("subscribe", topic)
                    .option("decode", "raw").option("itemsAsBlob", flag).option("minPartitions", str(partitions))
                    .load()
                )  # fmt: skip
                t0 = time.perf_counter()
                df.write.format("noop").mode("overwrite").save()
                times.setdefault(("spark", blob), []).append(time.perf_counter() - t0)
        for (where, blob), runs in sorted(times.items(), key=lambda kv: (kv[0][0] != "reader", not kv[0][1])):
            name = f"raw {size} B {where}, {'blob' if blob else 'list'}"
            extra: dict[str, Any] = {"row_bytes": size}
            if where == "reader":
                extra["cpu_us_per_item"] = round(statistics.median(cpu[blob]), 3)
            out.append(summarise(name, count, runs, **extra))
    return out


def topic_size(broker: BrokerInfo, topic: str) -> int:
    with connect(broker) as conn:
        return int(conn.checked("getSize", T.GetSizeRequest(topic=topic)).size)


# -- spark ----------------------------------------------------------------------------------
LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def spark_session(work: Path, cores: int) -> Any:
    from pyspark.sql import SparkSession

    from clients.spark import register

    log4j = work / "log4j2.properties"
    log4j.write_text(LOG4J2)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("luxun-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.sql.warehouse.dir", str(work / "warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def timed(fn: Any, repeat: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def summarise(name: str, rows: int, times: list[float], **extra: Any) -> dict[str, Any]:
    rates = [rows / t for t in times]
    median = statistics.median(rates)
    return {
        "workload": name,
        "rows": rows,
        "seconds": [round(t, 4) for t in times],
        "rows_per_s": round(median),
        "best_rows_per_s": round(max(rates)),
        "mb_per_s": round(median * extra.pop("row_bytes", 0) / 1e6, 1),
        "spread": round((max(rates) - min(rates)) / median, 3),
        **extra,
    }


# -- machine --------------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    java = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        java = (out.stderr or out.stdout).splitlines()[0].strip()
    commit = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, timeout=10
        ).stdout.strip()
    return {
        **machine_base(),
        "python": platform.python_version(),
        "java": java,
        "os": platform.platform(),
        "load_average_start": load_average(),
        "versions": dist_versions(("pyspark", "pyarrow", "thriftpy2")),
        "git_commit": commit,
    }


# -- main -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=int, default=1_000_000, help="messages per workload (default 1,000,000)")
    p.add_argument("--size", type=int, default=100, help="message bytes (default 100)")
    p.add_argument("--pack", type=int, default=1000, help="messages per pack (default 1000)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per workload after a warm-up (default 3)")
    p.add_argument("--cores", type=int, default=0, help="local[N] Spark (default: all usable cores)")
    p.add_argument("--partitions", type=int, default=0, help="minPartitions of the reads (default: --cores)")
    p.add_argument("--quick", action="store_true", help="smoke run: 100,000 messages, 1 repeat")
    p.add_argument(
        "--item-sizes",
        type=lambda v: [int(x) for x in v.split(",") if x],
        default=[100, 1000],
        help="raw items rows: item bytes (default 100,1000; empty: none)",
    )
    p.add_argument("--item-mb", type=int, default=20, help="raw items rows: MB of items per size (default 20)")
    p.add_argument("--items-only", action="store_true", help="only the raw items rows")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    args = p.parse_args(argv)
    if args.quick:
        args.messages, args.repeat = 100_000, 1
    cores = args.cores or len(os.sched_getaffinity(0))
    partitions = args.partitions or cores
    started = time.perf_counter()
    machine = machine_info()
    work = Path(tempfile.mkdtemp(prefix="luxun-bench-spark-"))
    results: list[dict[str, Any]] = []
    try:
        with own_broker(work, "bench_spark") as broker:
            address = f"{broker.host}:{broker.port}"
            produce_s = 0.0
            if not args.items_only:
                log(f"broker on {address}; producing {args.messages:,} messages of {args.size} B ...")
                produce_s = produce(broker, "bench-read", args.messages, args.size, args.pack)
                log(f"  produced in {produce_s:.1f} s")
            log(f"starting Spark local[{cores}] ...")
            spark = spark_session(work, cores)
            try:
                if args.items_only:
                    results.extend(raw_items(broker, spark, args, partitions))
                    return report(args, cores, partitions, machine, produce_s, results, started)
                base = (
                    spark.read.format("luxun")
                    .option("luxun.servers", address)
                    .option("subscribe", "bench-read")
                    .option("minPartitions", str(partitions))
                )
                packs = -(-args.messages // args.pack)

                log("read messages ...")
                df = base.load()
                times = timed(lambda: df.write.format("noop").mode("overwrite").save(), args.repeat)
                results.append(summarise("read messages", args.messages, times, row_bytes=args.size))
                log("read raw ...")
                raw = base.option("decode", "raw").load()
                times = timed(lambda: raw.write.format("noop").mode("overwrite").save(), args.repeat)
                results.append(
                    summarise("read raw (packs)", packs, times, row_bytes=args.size * args.messages // packs)
                )

                values = spark.range(args.messages, numPartitions=partitions).selectExpr(
                    f"CAST(lpad(CAST(id AS STRING), {args.size}, '0') AS BINARY) AS value"
                )
                log("jvm baseline ...")
                times = timed(lambda: values.write.format("noop").mode("overwrite").save(), args.repeat)
                results.append(summarise("jvm baseline (noop)", args.messages, times, row_bytes=args.size))
                log("write ...")
                runs = [0]

                def write() -> None:
                    runs[0] += 1
                    values.write.format("luxun").mode("append").option("luxun.servers", address).option(
                        "topic", f"bench-write-{runs[0]}"
                    ).option("packSize", str(args.pack)).save()

                times = timed(write, args.repeat)
                written = topic_size(broker, f"bench-write-{runs[0]}")
                results.append(summarise("write", args.messages, times, row_bytes=args.size, packs_written=written))
                results.extend(raw_items(broker, spark, args, partitions))
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report(args, cores, partitions, machine, produce_s, results, started)


def report(
    args: Any,
    cores: int,
    partitions: int,
    machine: dict[str, Any],
    produce_s: float,
    results: list[dict[str, Any]],
    started: float,
) -> int:
    """Print the table, write the JSON."""
    read_rate = results[0]["rows_per_s"] if not args.items_only else 0
    what = (
        "raw items only" if args.items_only else f"{args.messages:,} messages of {args.size} B in packs of {args.pack}"
    )
    print(f"\nluxun Spark data source: {what}, local[{cores}], minPartitions {partitions}, median of {args.repeat}")
    print(
        f"machine: {machine['cpu']}, {machine['cores']} cores ({machine['cores_usable']} usable), "
        f"{machine['ram_gib']} GiB, Python {machine['python']}, {machine['java']}, "
        f"pyspark {machine['versions'].get('pyspark')}, pyarrow {machine['versions'].get('pyarrow')}"
    )
    print(
        f"\n{'workload':<30}{'rows':>12}{'rows/s':>14}{'best rows/s':>14}{'MB/s':>10}{'spread':>9}{'us CPU/item':>13}"
    )
    for r in results:
        cpu = r.get("cpu_us_per_item")
        print(
            f"{r['workload']:<30}{r['rows']:>12,}{r['rows_per_s']:>14,}{r['best_rows_per_s']:>14,}"
            f"{r['mb_per_s']:>10}{r['spread']:>9.0%}{'' if cpu is None else cpu:>13}"
        )
    if not args.items_only:
        verdict = "meets" if read_rate >= TARGET_READ_ROWS_S else "MISSES"
        print(f"\nread target >= {TARGET_READ_ROWS_S:,} rows/s: {verdict} ({read_rate:,} rows/s)")
    data = {
        "benchmark": "bench_spark",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "cores": cores,
        "partitions": partitions,
        "machine": machine,
        "produce_s": round(produce_s, 3),
        "results": results,
        "target_read_rows_per_s": TARGET_READ_ROWS_S,
        "read_target_met": read_rate >= TARGET_READ_ROWS_S,
        "duration_s": round(time.perf_counter() - started, 1),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(f"\nresults written to {args.json} ({data['duration_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
