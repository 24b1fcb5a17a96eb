"""The ``luxun`` PySpark data source against real broker subprocesses: batch ranges,
topics and brokers, decode modes, data loss, streaming replays, batch and streaming writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clients.messages import decode_pack
from idl import luxun_thrift as T
from tests._broker import free_port
from tests.spark.conftest import Brokers, address, make_packs, produce_packs

pytestmark = pytest.mark.timeout(600)


def read(spark: Any, servers: str, topics: str, **options: Any) -> Any:
    reader = spark.read.format("luxun").option("luxun.servers", servers).option("subscribe", topics)
    for k, v in options.items():
        reader = reader.option(k, v if isinstance(v, str) else json.dumps(v))
    return reader.load()


def rows(df: Any) -> list[tuple[Any, ...]]:
    """(topic, broker, index, position, value) sorted."""
    out = df.select("topic", "broker", "index", "position", "value").collect()
    return sorted((r["topic"], r["broker"], r["index"], r["position"], bytes(r["value"])) for r in out)


def expected(topic: str, broker: str, packs: list[list[bytes]], first: int = 0) -> list[tuple[Any, ...]]:
    return [(topic, broker, first + i, j, m) for i, pack in enumerate(packs[first:]) for j, m in enumerate(pack)]


# -- batch reads ---------------------------------------------------------------------------
def test_schema_and_one_row_per_message(spark: Any, broker: Any, topic: str) -> None:
    packs = make_packs("m", 10, 5)
    assert produce_packs(broker, topic, packs) == list(range(10))
    df = read(spark, address(broker), topic)
    assert df.schema.simpleString() == (
        "struct<value:binary,topic:string,broker:string,index:bigint,position:int,timestamp:timestamp>"
    )
    assert rows(df) == expected(topic, address(broker), packs)
    # timestamp: the pack's append time on the broker, the same for all its messages.
    client = broker.client()
    try:
        reply = client.consume(T.ConsumeRequest(topic=topic, startIndex=0, maxFetchSize=1 << 20, withTimestamps=True))
    finally:
        client.close()
    appended = reply.timestampList
    assert len(appended) == 10 and all(t > 0 for t in appended)
    got = df.selectExpr("index", "CAST(unix_micros(timestamp) AS BIGINT) AS us").collect()
    assert sorted({(r["index"], r["us"]) for r in got}) == [(i, t * 1000) for i, t in enumerate(appended)]
    raw = read(spark, address(broker), topic, decode="raw").selectExpr("index", "unix_micros(timestamp) AS us")
    assert sorted((r["index"], r["us"]) for r in raw.collect()) == [(i, t * 1000) for i, t in enumerate(appended)]


def test_index_ranges_min_partitions_and_small_fetches(spark: Any, broker: Any, topic: str) -> None:
    packs = make_packs("r", 20, 3)
    produce_packs(broker, topic, packs)
    b = address(broker)
    df = read(spark, b, topic, startingIndexes={topic: {b: 3}}, endingIndexes={topic: {b: 17}})
    assert rows(df) == expected(topic, b, packs[:17], first=3)
    # About minPartitions partitions, same rows; a small fetch size forces many consume calls.
    split = read(spark, b, topic, startingIndexes={topic: {b: 3}}, endingIndexes={topic: {b: 17}},
                 minPartitions="4", fetchBytes="100")  # fmt: skip
    assert split.rdd.getNumPartitions() == 4
    assert rows(split) == rows(df)
    # "earliest"/"latest" inside the JSON, and an empty range.
    assert read(spark, b, topic, startingIndexes={topic: {b: "latest"}}).count() == 0
    assert read(spark, b, topic, endingIndexes={topic: {b: "earliest"}}).count() == 0
    assert read(spark, b, topic, startingIndexes="latest").count() == 0


def test_decode_raw_gives_one_row_per_pack(spark: Any, broker: Any, topic: str) -> None:
    packs = make_packs("raw", 4, 7)
    produce_packs(broker, topic, packs)
    got = read(spark, address(broker), topic, decode="raw").orderBy("index").collect()
    assert [r["index"] for r in got] == [0, 1, 2, 3]
    assert {r["position"] for r in got} == {0}
    assert [decode_pack(bytes(r["value"])) for r in got] == packs


def test_multi_topic_two_brokers_and_unknown_topics(spark: Any, shared_brokers: Any, topic: str) -> None:
    one, two = shared_brokers
    a, b = address(one), address(two)
    t1, t2 = f"{topic}-x", f"{topic}-y"
    p1a, p1b, p2a = make_packs("1a", 3, 2), make_packs("1b", 5, 1), make_packs("2a", 2, 4)
    produce_packs(one, t1, p1a)
    produce_packs(two, t1, p1b)
    produce_packs(one, t2, p2a)  # t2 does not exist on the second broker: an empty range there
    df = read(spark, f"{a},{b}", f"{t1},{t2},{topic}-none")
    assert rows(df) == sorted(expected(t1, a, p1a) + expected(t1, b, p1b) + expected(t2, a, p2a))
    counts = {(r["topic"], r["broker"]): r["count"] for r in df.groupBy("topic", "broker").count().collect()}
    assert counts == {(t1, a): 6, (t1, b): 5, (t2, a): 8}
    # Per-broker start indexes; pairs not named start at earliest.
    df = read(spark, f"{a},{b}", f"{t1},{t2}", startingIndexes={t1: {b: 4}})
    assert rows(df) == sorted(expected(t1, a, p1a) + expected(t1, b, p1b, first=4) + expected(t2, a, p2a))


def test_nothing_to_read_gives_an_empty_frame(spark: Any, broker: Any, topic: str) -> None:
    df = read(spark, address(broker), f"{topic}-missing")
    assert df.count() == 0
    assert df.collect() == []


def test_bad_options_are_reported(spark: Any, broker: Any, topic: str) -> None:
    b = address(broker)
    produce_packs(broker, topic, make_packs("o", 2, 1))
    with pytest.raises(Exception, match="subscribe"):
        spark.read.format("luxun").option("luxun.servers", b).load().count()
    with pytest.raises(Exception, match=r"luxun\.servers"):
        spark.read.format("luxun").option("subscribe", topic).load().count()
    with pytest.raises(Exception, match="not subscribed"):
        read(spark, b, topic, startingIndexes={"other": {b: 0}}).count()
    with pytest.raises(Exception, match="beyond the head"):
        read(spark, b, topic, endingIndexes={topic: {b: 99}}).count()
    with pytest.raises(Exception, match="decode"):
        read(spark, b, topic, decode="pickle").count()


# -- data loss -----------------------------------------------------------------------------
def test_fail_on_data_loss_after_retention(spark: Any, brokers: Brokers, topic: str) -> None:
    """Retention by time or size runs at most once a minute in a broker, too slow for a
    test: we stop the broker, drop the oldest items with the storage library exactly as
    retention does (BigArray.remove_before_index), and start it again."""
    from bigarray import BigArray

    first = brokers.start()
    packs = make_packs("loss", 10, 2)
    produce_packs(first, topic, packs)
    first.stop()
    array = BigArray(first.data_dir / topic)
    array.remove_before_index(4)
    array.close()
    broker = brokers.start(data_dir=first.data_dir)
    b = address(broker)

    assert rows(read(spark, b, topic)) == expected(topic, b, packs, first=4)  # earliest = the tail
    with pytest.raises(Exception, match=r"starting index 0 is below the oldest retained index 4"):
        read(spark, b, topic, startingIndexes={topic: {b: 0}}).count()
    lenient = read(spark, b, topic, startingIndexes={topic: {b: 0}}, failOnDataLoss="false")
    assert rows(lenient) == expected(topic, b, packs, first=4)


def _stream_reader(spark: Any, servers: str, topics: str, **options: Any) -> Any:
    reader = spark.readStream.format("luxun").option("luxun.servers", servers).option("subscribe", topics)
    for k, v in options.items():
        reader = reader.option(k, v if isinstance(v, str) else json.dumps(v))
    return reader.load()


def test_streaming_fails_on_data_loss_at_read_time(spark: Any, brokers: Brokers, topic: str, tmp_path: Path) -> None:
    """A checkpointed position that retention passed while the query was down."""
    from bigarray import BigArray

    first = brokers.start()
    packs = make_packs("sl", 6, 1)
    produce_packs(first, topic, packs[:2])
    b = address(first)
    seen: list[tuple[int, list[Any]]] = []

    def sink(df: Any, batch_id: int) -> None:
        seen.append((batch_id, sorted(r["index"] for r in df.collect())))

    def run(servers: str, **options: Any) -> None:
        q = (
            _stream_reader(spark, servers, topic, startingIndexes="earliest", **options)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)

    run(b)
    assert seen == [(0, [0, 1])]
    produce_packs(first, topic, packs[2:])
    first.stop()
    array = BigArray(first.data_dir / topic)
    array.remove_before_index(4)  # items 2 and 3 were never read by the query
    array.close()
    # The same port again, so the checkpointed offsets still name this broker.
    brokers.start(data_dir=first.data_dir, port=first.port)
    with pytest.raises(Exception, match=r"items 2\.\.3 were removed"):
        run(b)
    run(b, failOnDataLoss="false")
    assert seen[-1] == (1, [4, 5])


# -- streaming -----------------------------------------------------------------------------
def test_streaming_replays_the_same_ranges_after_a_failure(spark: Any, broker: Any, topic: str, tmp_path: Path) -> None:
    b = address(broker)
    packs = make_packs("s", 6, 3)
    produce_packs(broker, topic, packs)
    checkpoint = str(tmp_path / "checkpoint")
    attempts: list[tuple[int, list[tuple[Any, ...]]]] = []
    fail_batches = {1}

    def sink(df: Any, batch_id: int) -> None:
        got = rows(df)
        attempts.append((batch_id, got))
        if batch_id in fail_batches:
            fail_batches.discard(batch_id)
            raise RuntimeError(f"injected failure in batch {batch_id}")

    def run() -> Any:
        return (
            _stream_reader(spark, b, topic, startingIndexes="earliest", maxItemsPerTrigger="2")
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    query = run()
    with pytest.raises(Exception, match="injected failure in batch 1"):
        query.awaitTermination(120)
    assert [batch_id for batch_id, _ in attempts] == [0, 1]
    failed_rows = attempts[1][1]
    assert {r[2] for r in failed_rows} == {2, 3}
    # More data arrives before the restart; batch 1 must still replay exactly items 2 and 3.
    more = make_packs("s2", 2, 3)
    produce_packs(broker, topic, more)
    query = run()
    query.awaitTermination(120)
    assert query.exception() is None
    ids = [batch_id for batch_id, _ in attempts]
    assert ids == [0, 1, 1, 2, 3]
    assert attempts[2][1] == failed_rows  # the replay read the same range
    committed = [r for batch_id, got in attempts[:1] + attempts[2:] for r in got]
    assert sorted(committed) == expected(topic, b, packs + more)  # every message exactly once
    # A new run of the finished query finds nothing more.
    query = run()
    query.awaitTermination(120)
    assert [batch_id for batch_id, _ in attempts] == ids


def test_streaming_new_pairs_and_latest_start(spark: Any, shared_brokers: Any, topic: str, tmp_path: Path) -> None:
    """startingIndexes=latest skips what exists; a (topic, broker) pair that appears later
    is read from its first item."""
    one, two = shared_brokers
    a, b = address(one), address(two)
    produce_packs(one, topic, make_packs("old", 3, 1))
    seen: list[tuple[Any, ...]] = []

    def sink(df: Any, batch_id: int) -> None:
        seen.extend(rows(df))

    def run() -> None:
        q = (
            _stream_reader(spark, f"{a},{b}", topic)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        assert q.exception() is None

    run()
    assert seen == []
    new_a, new_b = make_packs("na", 2, 2), make_packs("nb", 3, 1)
    produce_packs(one, topic, new_a)
    produce_packs(two, topic, new_b)
    run()
    assert sorted(seen) == sorted(
        [(topic, a, 3 + i, j, m) for i, p in enumerate(new_a) for j, m in enumerate(p)] + expected(topic, b, new_b)
    )


def test_streaming_keeps_up_with_new_items(spark: Any, broker: Any, topic: str, tmp_path: Path) -> None:
    """A running query (default trigger) picks up items as they arrive, at most
    maxItemsPerTrigger items per micro-batch."""
    b = address(broker)
    produce_packs(broker, topic, make_packs("k0", 3, 2))
    batches: list[list[int]] = []

    def sink(df: Any, batch_id: int) -> None:
        batches.append(sorted({r["index"] for r in df.collect()}))

    query = (
        _stream_reader(spark, b, topic, startingIndexes="earliest", maxItemsPerTrigger="2")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    try:
        query.processAllAvailable()
        produce_packs(broker, topic, make_packs("k1", 3, 2))
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(i for batch in batches for i in batch) == list(range(6))  # each item once
    assert all(len(batch) <= 2 for batch in batches)


# -- writes --------------------------------------------------------------------------------
def test_batch_write_round_trip(spark: Any, broker: Any, topic: str) -> None:
    b = address(broker)
    values = [f"v{i:05d}" for i in range(2500)]
    df = spark.createDataFrame([(v,) for v in values], "value string").coalesce(1)
    df.write.format("luxun").mode("append").option("luxun.servers", b).option("topic", topic).save()
    raw = read(spark, b, topic, decode="raw").orderBy("index").collect()
    assert [len(decode_pack(bytes(r["value"]))) for r in raw] == [1000, 1000, 500]  # packSize 1000
    got = read(spark, b, topic).orderBy("index", "position").collect()
    assert [bytes(r["value"]).decode() for r in got] == values


def test_batch_write_topic_column_binary_values_and_pack_limits(spark: Any, shared_brokers: Any, topic: str) -> None:
    one, two = shared_brokers
    servers = f"{address(one)},{address(two)}"
    data = [(f"{topic}-{'ab'[i % 2]}", bytes([i % 256]) * 10, i) for i in range(300)]
    df = spark.createDataFrame(data, "topic string, value binary, n int").repartition(3)
    df.write.format("luxun").mode("append").option("luxun.servers", servers).option("packSize", "7") \
        .option("packBytes", "50").option("compression", "gzip").save()  # fmt: skip
    got = read(spark, servers, f"{topic}-a,{topic}-b")
    assert sorted((r["topic"], bytes(r["value"])) for r in got.collect()) == sorted((t, v) for t, v, _ in data)
    packs = read(spark, servers, f"{topic}-a,{topic}-b", decode="raw").collect()
    assert all(len(decode_pack(bytes(r["value"]))) <= 5 for r in packs)  # 50 bytes = 5 values of 10 bytes
    assert {r["broker"] for r in packs} == {address(one), address(two)}  # round-robin over the brokers


def test_write_errors(spark: Any, broker: Any, topic: str) -> None:
    b = address(broker)
    df = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match="topic"):
        df.write.format("luxun").mode("append").option("luxun.servers", b).save()
    with pytest.raises(Exception, match="append-only"):
        df.write.format("luxun").mode("overwrite").option("luxun.servers", b).option("topic", topic).save()
    with pytest.raises(Exception, match="value"):
        spark.createDataFrame([(1,)], "v int").write.format("luxun").mode("append") \
            .option("luxun.servers", b).option("topic", topic).save()  # fmt: skip


def test_write_halves_packs_a_broker_refuses_as_too_large(spark: Any, brokers: Brokers, topic: str,
                                                          tmp_path: Path) -> None:  # fmt: skip
    """A broker with max.message.size 4096: packs of 100 rows of 100 bytes (~10 KB) are
    refused as too large and halved until they fit (every row arrives, once, in order; no
    pack over the limit); a single row over the limit fails the write with the broker's
    MESSAGE_SIZE_TOO_LARGE, naming the topic and the broker."""
    props = tmp_path / "small.properties"
    props.write_text("max.message.size=4096\n")
    b = address(brokers.start("--config", str(props)))
    values = [f"{i:05d}".encode() * 20 for i in range(500)]  # 100 bytes each
    df = spark.createDataFrame([(v,) for v in values], "value binary").coalesce(1)
    df.write.format("luxun").mode("append").option("luxun.servers", b).option("topic", topic) \
        .option("packSize", "100").save()  # fmt: skip
    packs = read(spark, b, topic, decode="raw").orderBy("index").collect()
    assert all(len(bytes(r["value"])) <= 4096 for r in packs) and len(packs) >= 16
    got = read(spark, b, topic).orderBy("index", "position").collect()
    assert [bytes(r["value"]) for r in got] == values
    big = spark.createDataFrame([(b"x" * 5000,)], "value binary")
    with pytest.raises(Exception, match=f"MESSAGE_SIZE_TOO_LARGE: produce to topic '{topic}-big' on {b} failed"):
        big.write.format("luxun").mode("append").option("luxun.servers", b).option("topic", f"{topic}-big").save()


def test_write_hands_packs_past_a_broker_that_is_down(spark: Any, broker: Any, topic: str) -> None:
    """The writer sends through the clients' one sender: packs meant for a broker that
    cannot be reached go to the next one (every row arrives once, on the live broker); with
    every broker down the write fails, naming the topic."""
    live, dead = address(broker), f"127.0.0.1:{free_port()}"
    values = [f"w{i:04d}".encode() for i in range(600)]
    df = spark.createDataFrame([(v,) for v in values], "value binary").coalesce(1)
    df.write.format("luxun").mode("append").option("luxun.servers", f"{dead},{live}").option("topic", topic) \
        .option("packSize", "50").option("timeoutMs", "2000").save()  # fmt: skip
    got = read(spark, live, topic).collect()
    assert sorted(bytes(r["value"]) for r in got) == values
    with pytest.raises(Exception, match=f"no luxun broker took a pack for topic '{topic}-none'"):
        df.write.format("luxun").mode("append").option("luxun.servers", dead).option("topic", f"{topic}-none") \
            .option("timeoutMs", "2000").save()  # fmt: skip


def test_streaming_write_round_trip(spark: Any, broker: Any, topic: str, tmp_path: Path) -> None:
    """luxun -> transform -> luxun, as a stream, then read the output back."""
    b = address(broker)
    source, sink = f"{topic}-in", f"{topic}-out"
    packs = make_packs("w", 5, 4)
    produce_packs(broker, source, packs)
    query = (
        _stream_reader(spark, b, source, startingIndexes="earliest", maxItemsPerTrigger="2")
        .selectExpr("upper(CAST(value AS STRING)) AS value")
        .writeStream.format("luxun")
        .option("luxun.servers", b)
        .option("topic", sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    got = sorted(bytes(r["value"]).decode() for r in read(spark, b, sink).collect())
    assert got == sorted(m.decode().upper() for p in packs for m in p)
