"""A Spark pipeline on luxun topics: produce JSON events, aggregate them by index range, publish the results.

Needs a running broker (``scripts/run.sh`` in another terminal: 127.0.0.1:9092) and
pyspark (``scripts/bootstrap.sh spark``). Then, from the repository root::

    .venv/bin/python examples/spark_pipeline.py
    .venv/bin/python examples/spark_pipeline.py --servers 127.0.0.1:9092 --events 50000

Steps:

1. produce ``--events`` sample JSON events (``{"user", "action", "amount", "ts"}``) to
   the topic ``--topic`` with ``df.write.format("luxun")`` (packs of 500 messages);
2. read exactly the index range just written (``startingIndexes``/``endingIndexes``,
   found with :func:`clients.spark.indexes` before and after), parse the JSON and
   aggregate per action: events, distinct users, total and mean amount;
3. write one JSON result per action to ``--out-topic`` and read it back to print it.

Running it again appends new events and aggregates only those: every run reads its
own index range.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clients.spark import indexes, register

ACTIONS = ("view", "click", "cart", "purchase")


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("luxun-spark-pipeline")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)  # spark.read/write.format("luxun") from here on
    return spark


def heads(servers: str, topic: str) -> dict[str, int]:
    """The next index to be written on each broker (0 where the topic does not exist yet)."""
    ends = indexes(servers, topic)
    brokers = [s.strip() if ":" in s else f"{s.strip()}:9092" for s in servers.split(",") if s.strip()]
    return {b: ends[b][1] if b in ends else 0 for b in brokers}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", default="127.0.0.1:9092", help="broker list host:port,... (default 127.0.0.1:9092)")
    p.add_argument("--topic", default="events", help="topic of the raw events (default events)")
    p.add_argument("--out-topic", default="event-stats", help="topic of the results (default event-stats)")
    p.add_argument("--events", type=int, default=20_000, help="events to produce (default 20000)")
    args = p.parse_args(argv)

    spark = spark_session()
    from pyspark.sql import functions as F

    try:
        # 1. Produce: a DataFrame of JSON strings, written as message packs.
        before = heads(args.servers, args.topic)
        events = spark.range(args.events).select(
            F.to_json(
                F.struct(
                    F.concat(F.lit("user-"), (F.col("id") * 7919 % 97).cast("string")).alias("user"),
                    F.element_at(F.array(*[F.lit(a) for a in ACTIONS]), (F.col("id") % 4 + 1).cast("int")).alias(
                        "action"
                    ),
                    F.round((F.col("id") * 37 % 1000) / 10, 2).alias("amount"),
                    F.current_timestamp().alias("ts"),
                )
            ).alias("value")
        )
        events.write.format("luxun").mode("append").option("luxun.servers", args.servers).option(
            "topic", args.topic
        ).option("packSize", "500").save()
        after = heads(args.servers, args.topic)
        print(f"produced {args.events} events to {args.topic!r}: index ranges {_ranges(before, after)}")

        # 2. Read exactly that index range, parse, aggregate.
        raw = (
            spark.read.format("luxun")
            .option("luxun.servers", args.servers)
            .option("subscribe", args.topic)
            .option("startingIndexes", json.dumps({args.topic: before}))
            .option("endingIndexes", json.dumps({args.topic: after}))
            .load()
        )
        schema = "user string, action string, amount double, ts timestamp"
        parsed = raw.select(F.from_json(F.col("value").cast("string"), schema).alias("e"), "index").select("e.*")
        stats = parsed.groupBy("action").agg(
            F.count("*").alias("events"),
            F.countDistinct("user").alias("users"),
            F.round(F.sum("amount"), 2).alias("total_amount"),
            F.round(F.avg("amount"), 2).alias("mean_amount"),
        )

        # 3. Publish one JSON document per action to the output topic, then read it back.
        out_before = heads(args.servers, args.out_topic)
        stats.select(F.to_json(F.struct("*")).alias("value")).write.format("luxun").mode("append").option(
            "luxun.servers", args.servers
        ).option("topic", args.out_topic).save()
        out_after = heads(args.servers, args.out_topic)
        results = (
            spark.read.format("luxun")
            .option("luxun.servers", args.servers)
            .option("subscribe", args.out_topic)
            .option("startingIndexes", json.dumps({args.out_topic: out_before}))
            .option("endingIndexes", json.dumps({args.out_topic: out_after}))
            .load()
            .select(F.col("value").cast("string").alias("json"), "broker", "index", "position")
            .collect()
        )
        print(f"wrote {len(results)} results to {args.out_topic!r}: index ranges {_ranges(out_before, out_after)}")
        print(f"\n{'action':<10}{'events':>8}{'users':>7}{'total':>12}{'mean':>8}")
        for doc in sorted((json.loads(r["json"]) for r in results), key=lambda d: d["action"]):
            print(f"{doc['action']:<10}{doc['events']:>8}{doc['users']:>7}{doc['total_amount']:>12.2f}"
                  f"{doc['mean_amount']:>8.2f}")  # fmt: skip
        total = sum(json.loads(r["json"])["events"] for r in results)
        if total != args.events:
            print(f"error: aggregated {total} events, produced {args.events}", file=sys.stderr)
            return 1
        return 0
    finally:
        spark.stop()


def _ranges(before: dict[str, int], after: dict[str, int]) -> str:
    return ", ".join(f"{b} [{before[b]}, {after[b]})" for b in after if after[b] > before[b]) or "none"


if __name__ == "__main__":
    sys.exit(main())
