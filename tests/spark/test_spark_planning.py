"""The pure parts of the ``luxun`` data source (no Spark session, no broker): option
parsing, range splitting, the per-trigger share of a read limit, packing of writes."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from clients.messages import NO_COMPRESSION, decode_pack
from clients.sender import Batch, pack_parts
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


class _RecordingSender(W.Packer):
    def __init__(self, pack_size: int, pack_bytes: int) -> None:
        self.opts = O.WriteOptions(("h:1",), "t", pack_size, pack_bytes, 0, 1000)
        self.pending = {}
        self.sent: list[list[bytes]] = []

    def _send(self, batch: Batch) -> None:
        self.sent.append(decode_pack(b"".join(pack_parts(batch, NO_COMPRESSION))))


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


def test_time_options() -> None:
    opts = parse(startingTimestamp="1700000000000", endingIndexesByTimestamp='{"a": {"h:2": 5}}')
    assert (opts.starting_default, opts.starting) == (O.AtTime(1700000000000), {})
    assert (opts.ending_default, opts.ending) == ("latest", {("a", "h:2"): O.AtTime(5)})
    mixed = parse(startingIndexes='{"a": {"h:1": 3}}', startingIndexesByTimestamp='{"a": {"h:2": 7}, "b": {"h:1": 0}}')
    assert mixed.starting == {("a", "h:1"): 3, ("a", "h:2"): O.AtTime(7), ("b", "h:1"): O.AtTime(0)}
    stream = O.ReadOptions.parse({"luxun.servers": "h", "subscribe": "a", "startingTimestamp": "9"}, streaming=True)
    assert stream.starting_default == O.AtTime(9)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingTimestamp": "5", "startingIndexes": "earliest"}, "exclude each other"),
        ({"endingTimestamp": "5", "endingIndexesByTimestamp": '{"a": {"h:1": 1}}'}, "exclude each other"),
        ({"startingTimestamp": "-3"}, "must be >= 0"),
        ({"startingTimestamp": "yesterday"}, "must be an integer"),
        ({"startingIndexesByTimestamp": '{"a": {"h:1": "earliest"}}'}, "time in ms >= 0"),
        ({"startingIndexesByTimestamp": '{"a": {"h:9": 1}}'}, "not in luxun.servers"),
        ({"startingIndexesByTimestamp": "5"}, "JSON must be an object"),
        (
            {"startingIndexes": '{"a": {"h:1": 1}}', "startingIndexesByTimestamp": '{"a": {"h:1": 1}}'},
            "named in both",
        ),
        ({"maxRowsPerTrigger": "0"}, "must be >= 1"),
        ({"minItemsPerTrigger": "x"}, "must be an integer"),
        ({"maxTriggerDelay": "10s"}, "needs 'minItemsPerTrigger'"),
        ({"minItemsPerTrigger": "2", "maxTriggerDelay": "soon"}, "duration like"),
    ],
)
def test_bad_time_and_trigger_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(**options)


@pytest.mark.parametrize("name", ["endingTimestamp", "endingIndexesByTimestamp"])
def test_streaming_refuses_ending_by_time(name: str) -> None:
    with pytest.raises(ValueError, match="batch queries only"):
        O.ReadOptions.parse({"luxun.servers": "h", "subscribe": "a", name: "5"}, streaming=True)


def test_trigger_options_and_durations() -> None:
    opts = parse(maxRowsPerTrigger="500", minItemsPerTrigger="3")
    assert (opts.max_rows_per_trigger, opts.min_items_per_trigger) == (500, 3)
    assert opts.max_trigger_delay_ms == 15 * 60 * 1000 and opts.limited and not parse().limited
    for text, ms in [("250", 250), ("250ms", 250), ("10s", 10_000), ("2m", 120_000), ("1 h", 3_600_000)]:
        assert parse(minItemsPerTrigger="1", maxTriggerDelay=text).max_trigger_delay_ms == ms


def test_items_for_rows() -> None:
    f = P.items_for_rows
    assert f([10, 10, 10], 10.0, 25, 3) == 2  # exact while the counts are known
    assert f([10, 10, 10], 10.0, 30, 3) == 3
    assert f([40], 40.0, 25, 5) == 0  # a first pack over the limit: none (the caller ensures progress)
    assert f([5], 10.0, 45, 9) == 5  # 5 known, then 40 rows at a mean of 10
    assert f([5], 10.0, 45, 3) == 3  # never more than are waiting
    assert f([], 4.0, 10, 100) == 2
