"""Reading: consume-by-index calls turned into Arrow RecordBatches, the batch reader and
the micro-batch reader (offsets, per-trigger limits)."""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from idl import luxun_thrift as T

from ..connection import BrokerConnection, consume_request
from ..errors import broker_error
from ..messages import PackError, decode_pack
from .options import Key, ReadOptions
from .planning import (
    LuxunDataLossError,
    LuxunPartition,
    all_ends,
    apportion,
    connect,
    flat,
    items_for_rows,
    keys_by_broker,
    offsets,
    resolve,
    split,
    topic_ends,
)

#: The DDL schema of the source.
SCHEMA = "value binary, topic string, broker string, index bigint, position int, timestamp timestamp"
_TS_TYPE = pa.timestamp("us", tz="UTC")
#: The Arrow schema of every RecordBatch read() yields (Spark checks it exactly).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("broker", pa.string()),
        pa.field("index", pa.int64()),
        pa.field("position", pa.int32()),
        pa.field("timestamp", _TS_TYPE),
    ]
)

#: Items gathered into one RecordBatch (several fetches).
_BATCH_BYTES = 4 << 20
#: Bytes of packs a micro-batch planner reads per (topic, broker) pair to count the
#: messages of the packs it is about to hand out (maxRowsPerTrigger).
SAMPLE_BYTES = 256 << 10
#: getDefaultReadLimit's "no bound on items" while other limits are set.
_NO_ITEM_LIMIT = 2**62

_SUCCESS = T.ResultCode.SUCCESS
_E = T.ErrorCode
_GONE = (_E.INDEX_OUT_OF_BOUNDS, _E.TOPIC_NOT_EXIST, _E.TOPIC_IS_EMPTY, _E.ALL_MESSAGE_CONSUMED)


def consume(conn: BrokerConnection, topic: str, start: int, max_bytes: int) -> Any:
    """Items from ``start`` on, with their append times (a failed Result is returned)."""
    return conn.call("consume", consume_request(topic, index=start, max_bytes=max_bytes, with_timestamps=True))


# -- rows ------------------------------------------------------------------------------
_POSITIONS: dict[int, array[int]] = {}


def _positions(n: int) -> array[int]:
    p = _POSITIONS.get(n)
    if p is None:
        p = array("i", range(n))
        if len(_POSITIONS) < 64:
            _POSITIONS[n] = p
    return p


def _decode(item: bytes, index: int, topic: str, broker: str) -> list[bytes]:
    try:
        return decode_pack(item)
    except ValueError as exc:
        raise PackError(f"item {index} of topic {topic!r} on {broker} is not a message pack: {exc}") from exc


def record_batch(
    items: Sequence[bytes], times_ms: Sequence[int], topic: str, broker: str, first: int, decode: str
) -> pa.RecordBatch:
    """One RecordBatch of the items ``first``.. with their append times (0: unknown)."""
    times = np.asarray(times_ms, dtype=np.int64)
    if decode == "raw":
        values: list[bytes] = list(items)
        index = pa.array(range(first, first + len(items)), pa.int64())
        position = pa.repeat(pa.scalar(0, pa.int32()), len(items))
    else:
        values = []
        counts = array("q")
        pos = array("i")
        for k, item in enumerate(items):
            messages = _decode(item, first + k, topic, broker)
            values.extend(messages)
            counts.append(len(messages))
            pos.extend(_positions(len(messages)))
        repeats = np.frombuffer(counts, dtype=np.int64)
        index = pa.array(np.repeat(np.arange(first, first + len(items), dtype=np.int64), repeats))
        position = pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(pos)])
        times = np.repeat(times, repeats)
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(values, pa.binary()),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(broker, pa.string()), n),
            index,
            position,
            pa.array(times * 1000, type=_TS_TYPE, mask=times <= 0),
        ],
        schema=ARROW_SCHEMA,
    )


def read_range(opts: ReadOptions, part: LuxunPartition) -> Iterator[pa.RecordBatch]:
    """The rows of ``part``: consume-by-index calls of ``fetch_bytes``, gathered into
    RecordBatches of about ``_BATCH_BYTES`` of items (fewer, bigger batches are cheaper
    for Spark; smaller fetches are cheaper for Thrift)."""
    topic, broker = part.topic, part.broker
    pending: list[bytes] = []  # items first..index-1, not yet in a batch
    pending_times: list[int] = []  # their append times in ms (0: the broker did not say)
    pending_bytes = 0
    first = index = part.start
    with connect(broker, opts) as conn:
        while index < part.end:
            response = consume(conn, topic, index, opts.fetch_bytes)
            result = response.result
            items = response.itemList or []
            if result.resultCode == _SUCCESS and items:
                items = items[: part.end - index]
                times = response.timestampList
                if times is None or len(times) < len(items):
                    times = [0] * len(items)
                pending.extend(items)
                pending_times.extend(times[: len(items)])
                pending_bytes += sum(map(len, items))
                index += len(items)
                if pending_bytes >= _BATCH_BYTES:
                    yield record_batch(pending, pending_times, topic, broker, first, opts.decode)
                    pending, pending_times, pending_bytes, first = [], [], 0, index
                continue
            if result.errorCode not in _GONE:
                raise broker_error(result.resultCode, result.errorCode, f"consume of topic {topic!r} at index "
                                   f"{index} on {broker}: {result.errorMessage}")  # fmt: skip
            # Items of the range are gone: retention passed them, or the topic was
            # deleted or recreated with fewer items.
            ends = topic_ends(conn, topic)
            if ends is not None and index < ends[0]:
                tail = ends[0]
                if opts.fail_on_data_loss and not part.lenient:
                    raise LuxunDataLossError(
                        f"topic {topic!r} on {broker}: items {index}..{min(tail, part.end) - 1} were removed "
                        f"(oldest retained index is {tail}); set failOnDataLoss=false to skip them"
                    )
                if pending:
                    yield record_batch(pending, pending_times, topic, broker, first, opts.decode)
                    pending, pending_times, pending_bytes = [], [], 0
                first = index = tail
                continue
            if opts.fail_on_data_loss:
                state = "does not exist" if ends is None else f"holds indexes [{ends[0]}, {ends[1]})"
                raise LuxunDataLossError(
                    f"topic {topic!r} on {broker} {state}; items {index}..{part.end - 1} are gone "
                    "(deleted or recreated topic); set failOnDataLoss=false to skip them"
                )
            break
        if pending:
            yield record_batch(pending, pending_times, topic, broker, first, opts.decode)


# -- batch -----------------------------------------------------------------------------
class LuxunReader(DataSourceReader):
    """Batch reader: plans (topic, broker) index ranges, reads them with consume-by-index."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        ends = all_ends(opts)
        starts = resolve(opts, ends, opts.starting, opts.starting_default)
        stops = resolve(opts, ends, opts.ending, opts.ending_default)
        ranges = []
        for key, (tail, head) in ends.items():
            topic, broker = key
            start, end = starts[key], stops[key]
            if end > head:
                raise ValueError(f"endingIndexes: {end} is beyond the head {head} of topic {topic!r} on {broker}")
            if start > end:
                raise ValueError(f"the start {start} is after the end {end} for topic {topic!r} on {broker}")
            if start < tail:
                if opts.fail_on_data_loss:
                    raise LuxunDataLossError(
                        f"topic {topic!r} on {broker}: starting index {start} is below the oldest retained "
                        f"index {tail} (retention removed items); set failOnDataLoss=false to start at {tail}"
                    )
                start = min(tail, end)
            ranges.append(LuxunPartition(topic, broker, start, end))
        return split(ranges, opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, LuxunPartition):  # Spark plans InputPartition(None) when there is none
            yield from read_range(self.opts, partition)


# -- streaming -------------------------------------------------------------------------
class LuxunStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader; offsets are ``{"topic": {"host:port": next index}}``.

    Lives in one driver-side process for the whole query, so it keeps the time of the
    last micro-batch (minItemsPerTrigger/maxTriggerDelay) and the mean messages per pack
    of each pair (maxRowsPerTrigger) between calls.
    """

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._target: dict[Key, int] | None = None
        self._last_trigger = time.monotonic()  # the delay counts from the query's start
        self._packs_seen: dict[Key, tuple[int, int]] = {}  # pair -> (packs, messages) counted
        self._counted_to: dict[Key, int] = {}  # pair -> the index after the last pack counted

    def initialOffset(self) -> dict[str, Any]:
        opts = self.opts
        ends = all_ends(opts)
        return offsets(resolve(opts, ends, opts.starting, opts.starting_default))

    def getDefaultReadLimit(self) -> ReadLimit:
        if not self.opts.limited:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_items_per_trigger or _NO_ITEM_LIMIT)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {key: head for key, (_, head) in all_ends(self.opts).items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        opts = self.opts
        begin = flat(start)
        avail: dict[Key, int] = {}
        base: dict[Key, int] = {}
        for key, (tail, head) in all_ends(opts).items():
            s = begin.get(key)
            if s is not None and s > head:
                if opts.fail_on_data_loss:
                    topic, broker = key
                    raise LuxunDataLossError(
                        f"topic {topic!r} on {broker} was reset: its head {head} is below the next index {s} "
                        "(deleted and recreated?); set failOnDataLoss=false to read it from its oldest item"
                    )
                s = None
            if self._target is not None:  # Trigger.AvailableNow: nothing beyond the target
                if key not in self._target:
                    continue
                head = min(head, self._target[key])
            b = tail if s is None else max(s, tail)
            if head > b:
                avail[key] = head - b
                base[key] = b
        # ReadAllAvailable while limits are set: Spark asks for everything (Trigger.Once).
        limited = not isinstance(limit, ReadAllAvailable)
        if limited and self._wait_for_more(sum(avail.values())):
            return start
        max_items = limit.max_rows if isinstance(limit, ReadMaxRows) and limit.max_rows < _NO_ITEM_LIMIT else None
        take = apportion(avail, max_items)
        if limited and opts.max_rows_per_trigger and any(take.values()):
            take = self._limit_rows(take, base, opts.max_rows_per_trigger)
        end = dict(begin)
        for key, n in take.items():
            if n > 0:
                end[key] = base[key] + n
        if end == begin:
            return start
        self._last_trigger = time.monotonic()
        return offsets(end)

    def _wait_for_more(self, new_items: int) -> bool:
        """minItemsPerTrigger/maxTriggerDelay, as Kafka's minOffsetsPerTrigger: wait while
        fewer items are new and the delay since the last micro-batch has not passed.
        Trigger.AvailableNow does not wait (it would end without reading them)."""
        wanted = self.opts.min_items_per_trigger
        if not wanted or self._target is not None or new_items == 0 or new_items >= wanted:
            return False
        return (time.monotonic() - self._last_trigger) * 1000 < self.opts.max_trigger_delay_ms

    def _limit_rows(self, take: dict[Key, int], base: dict[Key, int], max_rows: int) -> dict[Key, int]:
        """Cut ``take`` (items per pair) down to about ``max_rows`` rows (see the package doc)."""
        if self.opts.decode == "raw":  # one row per item
            return apportion(take, max_rows)
        counts = self._count_messages({k: n for k, n in take.items() if n > 0}, base)
        means = {}
        for key in counts:
            packs, messages = self._packs_seen.get(key, (0, 0))
            means[key] = messages / packs if packs else 1.0
        est = {k: sum(counts[k][: take[k]]) + max(0, take[k] - len(counts[k])) * means[k] for k in counts}
        shares = apportion({k: max(1, round(v)) for k, v in est.items()}, max_rows)
        out = {k: 0 for k in take}
        for key in counts:
            out[key] = items_for_rows(counts[key], means[key], shares[key], take[key])
        if not any(out.values()):  # always progress: one pack, even one over the limit
            key = max(counts, key=lambda k: (take[k], k))
            out[key] = 1
        return out

    def _count_messages(self, take: dict[Key, int], base: dict[Key, int]) -> dict[Key, list[int]]:
        """Messages in each of the first packs of every pair (one fetch of up to
        SAMPLE_BYTES per pair); folds them into the pair's running mean."""
        out: dict[Key, list[int]] = {}
        for broker, topics in keys_by_broker(take).items():
            with connect(broker, self.opts) as conn:
                for topic in topics:
                    key = (topic, broker)
                    response = consume(conn, topic, base[key], min(SAMPLE_BYTES, self.opts.fetch_bytes))
                    items = (response.itemList or [])[: take[key]] if response.result.resultCode == _SUCCESS else []
                    counts = [len(_decode(item, base[key] + i, topic, broker)) for i, item in enumerate(items)]
                    out[key] = counts
                    fresh = counts[max(0, self._counted_to.get(key, 0) - base[key]) :]  # not yet in the mean
                    if fresh:
                        packs, messages = self._packs_seen.get(key, (0, 0))
                        self._packs_seen[key] = (packs + len(fresh), messages + sum(fresh))
                        self._counted_to[key] = base[key] + len(counts)
        return out

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = flat(start)
        ranges = []
        for key, e in sorted(flat(end).items()):
            s = begin.get(key)
            if s is None or s > e:  # new pair, or a reset topic: from its oldest item
                ranges.append(LuxunPartition(key[0], key[1], 0, e, lenient=True))
            elif e > s:
                ranges.append(LuxunPartition(key[0], key[1], s, e))
        return split(ranges, self.opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, LuxunPartition):
            yield from read_range(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: positions live in Spark's checkpoint, not on the brokers."""

    def stop(self) -> None:
        """Nothing to release: connections live only inside planning calls and read()."""
