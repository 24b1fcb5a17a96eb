"""The pure parts of the ``luxun`` data source (no Spark session, no broker): option
parsing, range splitting, the per-trigger share of a read limit, packing of writes."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from clients.spark import options as O
from clients.spark import planning as P
from clients.spark import write as W

pytestmark = pytest.mark.timeout(60)


def parse(**options: str) -> Any:
    return O.ReadOptions.parse({"luxun.servers": "h:1,h:2", "subscribe": "a,b", **options}, streaming=False)


def test_options_defaults_and_json_specs() -> None:
    opts = parse()
    assert opts.servers == ("h:1", "h:2") and opts.topics == ("a", "b")
    assert (opts.starting_default, opts.ending_default, opts.starting, opts.ending) == ("earliest", "latest", {}, {})
    assert (opts.decode, opts.fail_on_data_loss, opts.min_partitions) == ("messages", True, None)
    opts = parse(startingIndexes='{"a": {"h:2": 5, "h:1": "latest"}}', failOnDataLoss="FALSE", decode="raw")
    assert opts.starting == {("a", "h:2"): 5, ("a", "h:1"): "latest"}
    assert not opts.fail_on_data_loss and opts.decode == "raw"
    stream = O.ReadOptions.parse({"luxun.servers": "h", "subscribe": "a"}, streaming=True)
    assert stream.servers == ("h:9092",) and stream.starting_default == "latest"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingIndexes": '{"a": {"h:1": -1}}'}, "index >= 0"),
        ({"startingIndexes": '{"a": {"h:1": true}}'}, "index >= 0"),
        ({"startingIndexes": '{"a": {"h:9": 0}}'}, "not in luxun.servers"),
        ({"startingIndexes": '{"c": {"h:1": 0}}'}, "not subscribed"),
        ({"startingIndexes": "[1]"}, "JSON must be an object"),
        ({"endingIndexes": "soon"}, "earliest, latest or JSON"),
        ({"minPartitions": "0"}, "must be >= 1"),
        ({"failOnDataLoss": "yes"}, "true or false"),
        ({"decode": "json"}, "'messages' or 'raw'"),
    ],
)
def test_bad_read_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(**options)


def test_streaming_refuses_ending_indexes() -> None:
    with pytest.raises(ValueError, match="batch queries only"):
        O.ReadOptions.parse({"luxun.servers": "h", "subscribe": "a", "endingIndexes": "latest"}, streaming=True)


def test_split_in_proportion_to_size() -> None:
    Part = P.LuxunPartition
    ranges = [Part("a", "h:1", 0, 900), Part("a", "h:2", 10, 110), Part("b", "h:1", 5, 5)]
    assert P.split(ranges, None) == ranges[:2]  # empty ranges dropped
    parts = P.split(ranges, 10)
    assert [(p.broker, p.start, p.end) for p in parts if p.broker == "h:2"] == [("h:2", 10, 110)]
    big = [(p.start, p.end) for p in parts if p.broker == "h:1"]
    assert len(big) == 9 and big[0][0] == 0 and big[-1][1] == 900
    assert all(a[1] == b[0] for a, b in itertools.pairwise(big))  # contiguous, no gaps or overlaps
    tiny = P.split([Part("a", "h:1", 0, 3, lenient=True)], 8)
    assert [(p.start, p.end) for p in tiny] == [(0, 1), (1, 2), (2, 3)] and all(p.lenient for p in tiny)


def test_apportion_shares_the_limit() -> None:
    avail = {("a", "h:1"): 1000, ("a", "h:2"): 10, ("b", "h:1"): 90}
    assert P.apportion(avail, None) == avail
    assert P.apportion(avail, 5000) == avail
    take = P.apportion(avail, 100)
    assert sum(take.values()) == 100 and take[("a", "h:1")] >= 90
    assert all(0 <= take[k] <= avail[k] for k in avail)
    assert sum(P.apportion(avail, 1).values()) == 1  # always progress


class _RecordingSender(W.Sender):
    def __init__(self, pack_size: int, pack_bytes: int) -> None:
        self.opts = O.WriteOptions(("h:1",), "t", pack_size, pack_bytes, 0, 1000)
        self.pending = {}
        self.sent: list[list[bytes]] = []

    def _send(self, topic: str, messages: list[bytes]) -> None:
        self.sent.append(list(messages))


def test_packing_keeps_order_and_limits() -> None:
    rng = random.Random(7)
    for _ in range(500):
        pack_size, pack_bytes = rng.randint(1, 20), rng.randint(1, 200)
        sender = _RecordingSender(pack_size, pack_bytes)
        values: list[bytes] = []
        for _ in range(rng.randint(0, 5)):
            chunk = [b"x" * rng.randint(0, 60) for _ in range(rng.randint(0, 50))]
            values += chunk
            sender.add("t", chunk)
        sender.flush()
        assert [v for pack in sender.sent for v in pack] == values
        for pack in sender.sent:  # within limits; a value bigger than packBytes goes alone
            assert pack and len(pack) <= pack_size and (len(pack) == 1 or sum(map(len, pack)) <= pack_bytes)
        for pack, after in itertools.pairwise(sender.sent):  # full: the next value did not fit
            assert len(pack) == pack_size or sum(map(len, pack)) + len(after[0]) > pack_bytes


def test_write_options_need_value_and_topic() -> None:
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    value = StructField("value", StringType())
    with pytest.raises(ValueError, match="'value' column"):
        O.WriteOptions.parse({"luxun.servers": "h"}, StructType([StructField("value", IntegerType())]))
    with pytest.raises(ValueError, match="'topic' option or a 'topic' column"):
        O.WriteOptions.parse({"luxun.servers": "h"}, StructType([value]))
    opts = O.WriteOptions.parse(
        {"luxun.servers": "h", "topic": "t", "compression": "gzip", "packSize": "10"}, StructType([value])
    )
    assert (opts.topic, opts.codec, opts.pack_size, opts.pack_bytes) == ("t", 1, 10, O.DEFAULT_PACK_BYTES)
    assert O.WriteOptions.parse({"luxun.servers": "h"}, StructType([value, StructField("topic", StringType())]))
