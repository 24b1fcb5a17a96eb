"""The source's fetches as one buffer plus lengths (``itemsAsBlob``): the ``value`` column
of ``decode=raw`` is made of the reply's buffer, the rows are the same as with
``itemList``, and a broker that answers ``itemList`` (Java Luxun) is read as before."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from clients.connection import BrokerConnection
from clients.messages import decode_pack, encode_pack
from clients.spark.read import Blob, consume, fetched, record_batch
from idl import luxun_thrift as T
from tests._broker import java_luxun
from tests.spark.conftest import Brokers, address, make_packs

pytestmark = pytest.mark.timeout(600)

PAGE = 65536  # the broker's data pages: a fetch of big items spans several


def read(spark: Any, servers: str, topics: str, stream: bool = False, **options: Any) -> Any:
    reader = (spark.readStream if stream else spark.read).format("luxun")
    reader = reader.option("luxun.servers", servers).option("subscribe", topics)
    for k, v in options.items():
        reader = reader.option(k, v if isinstance(v, str) else json.dumps(v))
    return reader.load()


def produce_items(where: str, topic: str, items: list[bytes]) -> None:
    """Produce each item (asyncProduce, then wait until all are in)."""
    with BrokerConnection(where) as conn:
        for item in items:
            conn.produce(item, topic, oneway=True)
        deadline = time.monotonic() + 60
        while conn.checked("getSize", T.GetSizeRequest(topic=topic)).size < len(items):
            assert time.monotonic() < deadline
            time.sleep(0.05)


# 0-byte items; big ones (several per 64 KiB page, so fetches span pages); 1 KB items
# past _BATCH_BYTES (more than one RecordBatch); many small ones.
ITEMS = (
    [b"", b"", b"z"]
    + [bytes([65 + i % 26]) * (9_000 + 1_777 * i) for i in range(20)]
    + [b"%04d" % i * 250 for i in range(4500)]
    + [b""]
    + [b"s%d" % i for i in range(8000)]
    + [b""]
)


@pytest.fixture(scope="module")
def blob_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("blob-broker")
    config = root / "server.properties"
    config.write_text(f"log.backfile.page.size={PAGE}\n")
    brokers = Brokers(root)
    broker = brokers.start("--config", str(config))
    produce_items(address(broker), "items", ITEMS)
    yield broker
    brokers.stop_all()


def test_a_fetch_comes_as_one_buffer_and_the_column_is_made_of_it(blob_broker: Any) -> None:
    """In the worker's code: asked, the broker sends a blob; the value column's data is
    the reply's buffer itself (no copy), and holds the items."""
    where = address(blob_broker)
    with BrokerConnection(where) as conn:
        for start in (0, 3, 30, len(ITEMS) - 2):
            as_list = fetched(consume(conn, "items", start, 1 << 20), where)
            got = fetched(consume(conn, "items", start, 1 << 20, as_blob=True), where)
            assert isinstance(as_list, list) and isinstance(got, Blob)
            assert got.to_list() == as_list == ITEMS[start : start + len(as_list)]
            batch = record_batch(got, [0] * len(got), "items", where, start, "raw")
            value = batch.column(0)
            assert value.to_pylist() == as_list
            assert value.buffers()[2].address == pa.py_buffer(got.data).address  # the reply's bytes
            assert batch.column(3).to_pylist() == list(range(start, start + len(got)))
            head = got.head(2)
            assert head.to_list() == as_list[:2] and len(head) == 2


def test_a_reply_whose_lengths_do_not_add_up_is_refused(blob_broker: Any) -> None:
    where = address(blob_broker)
    with BrokerConnection(where) as conn:
        reply = consume(conn, "items", 3, 1 << 20, as_blob=True)
    reply.itemLengths = reply.itemLengths[:-4]
    with pytest.raises(Exception, match="do not add up"):
        fetched(reply, where)


@pytest.mark.parametrize("fetch", ["1048576", "3000"])
def test_raw_reads_give_the_same_rows_as_blobs_and_as_lists(spark: Any, blob_broker: Any, fetch: str) -> None:
    b = address(blob_broker)
    want = [(i, item) for i, item in enumerate(ITEMS)]
    for as_blob in ("true", "false"):
        df = read(spark, b, "items", decode="raw", itemsAsBlob=as_blob, fetchBytes=fetch, minPartitions="3")
        got = sorted((r["index"], bytes(r["value"])) for r in df.select("index", "value").collect())
        assert got == want, f"itemsAsBlob={as_blob}"


def test_packs_are_decoded_from_blobs(spark: Any, brokers: Brokers, topic: str, tmp_path: Path) -> None:
    """decode=messages and a streaming query (maxRowsPerTrigger counts the messages of
    blobs' packs) read the same messages both ways."""
    broker = brokers.start()
    b = address(broker)
    packs = [*make_packs("p", 30, 7), [b""], [b"", b"x"]]
    produce_items(b, topic, [encode_pack(p) for p in packs])
    want = sorted((i, j, m) for i, p in enumerate(packs) for j, m in enumerate(p))
    for as_blob in ("true", "false"):
        df = read(spark, b, topic, itemsAsBlob=as_blob, fetchBytes="500")
        assert sorted((r["index"], r["position"], bytes(r["value"])) for r in df.collect()) == want
        seen: list[tuple[int, int, bytes]] = []
        sizes: list[int] = []

        def sink(df: Any, batch_id: int, seen: list[Any] = seen, sizes: list[int] = sizes) -> None:
            rows = [(r["index"], r["position"], bytes(r["value"])) for r in df.collect()]
            seen.extend(rows)
            sizes.append(len(rows))

        query = (
            read(spark, b, topic, stream=True, startingIndexes="earliest", maxRowsPerTrigger="50", itemsAsBlob=as_blob)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / f"ckpt-{as_blob}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert sorted(seen) == want and max(sizes) <= 50, f"itemsAsBlob={as_blob}"


def test_streaming_raw_reads_blobs(spark: Any, blob_broker: Any, tmp_path: Path) -> None:
    b = address(blob_broker)
    seen: list[tuple[int, bytes]] = []

    def sink(df: Any, batch_id: int) -> None:
        seen.extend((r["index"], bytes(r["value"])) for r in df.select("index", "value").collect())

    query = (
        read(spark, b, "items", stream=True, startingIndexes="earliest", decode="raw", maxItemsPerTrigger="5000")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert sorted(seen) == list(enumerate(ITEMS))


def test_a_java_luxun_broker_answers_item_lists(spark: Any, tmp_path: Path) -> None:
    """Java Luxun skips itemsAsBlob and answers itemList: read as before, both decodes."""
    with java_luxun(tmp_path) as where:
        packs = [*make_packs("j", 6, 3), [b""]]
        items = [encode_pack(p) for p in packs] + [b""]
        with BrokerConnection(where) as conn:
            for item in items:
                conn.produce(item, "java")
            reply = consume(conn, "java", 0, 1 << 20, as_blob=True)
            assert reply.itemBlob is None and isinstance(fetched(reply, where), list)
        raw = read(spark, where, "java", decode="raw", endingIndexes={"java": {where: len(packs)}})
        assert sorted((r["index"], bytes(r["value"])) for r in raw.collect()) == list(enumerate(items[:-1]))
        df = read(spark, where, "java", endingIndexes={"java": {where: len(packs)}})
        got = sorted((r["index"], r["position"], bytes(r["value"])) for r in df.collect())
        assert got == sorted((i, j, m) for i, p in enumerate(packs) for j, m in enumerate(p))
        assert [decode_pack(x) for x in items[:-1]] == packs
        assert np.all(np.array([r["timestamp"] is None for r in raw.collect()]))  # Java sends no times
