"""The ``luxun`` source's positions by time and per-trigger limits, on the suite's local
Spark session against real broker subprocesses: startingTimestamp/endingTimestamp and
the per-pair JSON, maxRowsPerTrigger, minItemsPerTrigger/maxTriggerDelay, and the origin
columns as a deduplication key."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from idl import luxun_thrift as T
from tests.spark.conftest import address, make_packs, produce_packs

pytestmark = pytest.mark.timeout(600)


def read(spark: Any, servers: str, topics: str, **options: Any) -> Any:
    reader = spark.read.format("luxun").option("luxun.servers", servers).option("subscribe", topics)
    for k, v in options.items():
        reader = reader.option(k, v if isinstance(v, str) else json.dumps(v))
    return reader.load()


def stream(spark: Any, servers: str, topics: str, **options: Any) -> Any:
    reader = spark.readStream.format("luxun").option("luxun.servers", servers).option("subscribe", topics)
    for k, v in options.items():
        reader = reader.option(k, v if isinstance(v, str) else json.dumps(v))
    return reader.load()


def indexes_of(df: Any) -> list[tuple[str, int]]:
    return sorted({(r["broker"], r["index"]) for r in df.select("broker", "index").collect()})


def append_times(broker: Any, topic: str) -> list[int]:
    """The append time (ms) of every item of ``topic``, by index from 0."""
    client = broker.client()
    try:
        request = T.ConsumeRequest(topic=topic, startIndex=0, maxFetchSize=1 << 20, withTimestamps=True)
        return list(client.consume(request).timestampList)
    finally:
        client.close()


def produce_in_steps(broker: Any, topic: str, steps: int, per_step: int) -> list[int]:
    """``steps`` groups of packs, each group in a later millisecond than the one before;
    returns the append times by index."""
    for s in range(steps):
        produce_packs(broker, topic, make_packs(f"t{s}", per_step, 2))
        time.sleep(0.03)
    times = append_times(broker, topic)
    assert len(times) == steps * per_step and times == sorted(times)
    return times


# -- by time -----------------------------------------------------------------------------
def test_batch_by_time(spark: Any, shared_brokers: Any, topic: str) -> None:
    one, two = sorted(shared_brokers, key=address)  # a < b, as the sorted results list them
    a, b = address(one), address(two)
    ta = produce_in_steps(one, topic, 3, 3)  # indexes 0-2, 3-5, 6-8
    tb = produce_in_steps(two, topic, 2, 2)  # indexes 0-1, 2-3
    both = f"{a},{b}"
    all_a, all_b = [(a, i) for i in range(9)], [(b, i) for i in range(4)]

    def got(**options: Any) -> list[tuple[str, int]]:
        return indexes_of(read(spark, both, topic, **options))

    # The first index whose append time is >= the time, on every broker.
    assert got(startingTimestamp=str(ta[3])) == [(a, i) for i in range(3, 9)] + [
        (b, i) for i in range(4) if tb[i] >= ta[3]
    ]
    # One ms after the last item of a step: that item's time is the closest, yet it is older.
    assert got(startingTimestamp=str(ta[2] + 1), endingTimestamp=str(ta[6])) == [(a, i) for i in range(3, 6)] + [
        (b, i) for i in range(4) if ta[2] + 1 <= tb[i] < ta[6]
    ]
    assert got(startingTimestamp="1") == all_a + all_b  # before everything: from the oldest item
    assert got(startingTimestamp=str(max(ta + tb) + 60_000)) == []  # after everything: the head
    assert got(endingTimestamp="1") == []
    # Per pair; pairs not named take startingIndexes/endingIndexes.
    assert got(startingIndexesByTimestamp={topic: {a: ta[6]}}) == [(a, i) for i in range(6, 9)] + all_b
    assert got(
        startingIndexesByTimestamp={topic: {b: tb[2]}},
        startingIndexes={topic: {a: 4}},
        endingIndexesByTimestamp={topic: {a: ta[6]}},
    ) == [(a, 4), (a, 5), (b, 2), (b, 3)]
    # An unknown topic by time is an empty range, as by index.
    assert read(spark, both, f"{topic}-none", startingTimestamp="1").count() == 0
    with pytest.raises(Exception, match="exclude each other"):
        read(spark, both, topic, startingTimestamp="1", startingIndexes="earliest").count()


def test_streaming_starts_at_a_time(spark: Any, broker: Any, topic: str, tmp_path: Path) -> None:
    b = address(broker)
    times = produce_in_steps(broker, topic, 2, 3)
    seen: list[int] = []

    def sink(df: Any, batch_id: int) -> None:
        seen.extend(r["index"] for r in df.collect())

    query = (
        stream(spark, b, topic, startingTimestamp=str(times[3]))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted(set(seen)) == [3, 4, 5]


# -- per-trigger limits ---------------------------------------------------------------------
def test_max_rows_per_trigger(spark: Any, shared_brokers: Any, topic: str, tmp_path: Path) -> None:
    """Micro-batches of at most maxRowsPerTrigger rows, shared between two brokers; a
    pack bigger than the limit goes alone; every message exactly once. Then with one-pack
    samples (fetchBytes=1) the estimate from the mean pack size keeps the limit too."""
    one, two = sorted(shared_brokers, key=address)  # a < b, as the sorted results list them
    a, b = address(one), address(two)
    sizes_a = [10] * 6 + [40] + [3] * 10
    produce_packs(one, topic, [[f"a{i}-{j}".encode() for j in range(n)] for i, n in enumerate(sizes_a)])
    produce_packs(two, topic, make_packs("b", 5, 10))
    total = sum(sizes_a) + 50

    def run(name: str, **options: Any) -> list[list[tuple[str, int, int]]]:
        batches: list[list[tuple[str, int, int]]] = []

        def sink(df: Any, batch_id: int) -> None:
            batches.append([(r["broker"], r["index"], r["position"]) for r in df.collect()])

        query = (
            stream(spark, f"{a},{b}", topic, startingIndexes="earliest", maxRowsPerTrigger="25", **options)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / name))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert query.exception() is None
        return batches

    for name, options in [("exact", {}), ("estimated", {"fetchBytes": "1"})]:
        batches = run(name, **options)
        flat = [r for batch in batches for r in batch]
        assert len(flat) == total and len(set(flat)) == total, name  # each message once
        for batch in batches:
            packs = {(broker, index) for broker, index, _ in batch}
            assert len(batch) <= 25 or packs == {(a, 6)}, (name, len(batch), packs)  # the 40-message pack alone
        assert len(batches) <= 2 * (total // 25 + 1) + 1, (name, [len(x) for x in batches])  # not one pack each


def test_min_items_and_max_trigger_delay(spark: Any, broker: Any, topic: str, tmp_path: Path) -> None:
    """No micro-batch while fewer than minItemsPerTrigger items are new, until
    maxTriggerDelay has passed since the last one."""
    b = address(broker)
    produce_packs(broker, topic, make_packs("m", 2, 1))
    batches: list[tuple[float, list[int]]] = []
    lock = threading.Lock()

    def sink(df: Any, batch_id: int) -> None:
        got = sorted(r["index"] for r in df.collect())
        if got:  # Spark runs a first, empty micro-batch at the initial offset
            with lock:
                batches.append((time.monotonic(), got))

    query = (
        stream(spark, b, topic, startingIndexes="earliest", minItemsPerTrigger="4", maxTriggerDelay="12s")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        time.sleep(4)
        assert batches == []  # 2 items waiting, 4 wanted, 12 s not passed
        produce_packs(broker, topic, make_packs("n", 2, 1))
        deadline = time.monotonic() + 60
        while not batches and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [got for _, got in batches] == [[0, 1, 2, 3]]  # the minimum was reached
        first_at = batches[0][0]
        produce_packs(broker, topic, make_packs("o", 1, 1))  # 1 of 4: waits for the delay
        deadline = time.monotonic() + 90
        while len(batches) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [got for _, got in batches] == [[0, 1, 2, 3], [4]]
        assert batches[1][0] - first_at >= 10, batches  # 12 s after the last trigger (less the batch's run)
    finally:
        query.stop()


# -- origin columns --------------------------------------------------------------------------
def test_origin_columns_deduplicate_a_replayed_copy(spark: Any, shared_brokers: Any, topic: str) -> None:
    """(topic, broker, index, position) names each message: reading a range twice and
    deduplicating on them gives every message once, equal values in one pack included."""
    one, two = shared_brokers
    servers = f"{address(one)},{address(two)}"
    produce_packs(one, topic, [[b"same"] * 3, [b"x", b"same"]])
    produce_packs(two, topic, [[b"same"] * 2])
    df = read(spark, servers, topic)
    twice = df.unionByName(read(spark, servers, topic))
    keys = ["topic", "broker", "index", "position"]
    assert twice.count() == 14
    assert twice.dropDuplicates(keys).count() == 7
    assert sorted(bytes(r["value"]) for r in twice.dropDuplicates(keys).collect()) == [b"same"] * 6 + [b"x"]
