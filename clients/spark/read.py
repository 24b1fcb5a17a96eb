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
from ..errors import LuxunClientError, broker_error
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
#: Arrow's binary column holds at most this many bytes (int32 offsets): a batch ends before.
_ARROW_BINARY_BYTES = 2**31 - 1
#: Bytes of packs a micro-batch planner reads per (topic, broker) pair to count the
#: messages of the packs it is about to hand out (maxRowsPerTrigger).
SAMPLE_BYTES = 256 << 10
#: getDefaultReadLimit's "no bound on items" while other limits are set.
_NO_ITEM_LIMIT = 2**62

_SUCCESS = T.ResultCode.SUCCESS
_E = T.ErrorCode
_GONE = (_E.INDEX_OUT_OF_BOUNDS, _E.TOPIC_NOT_EXIST, _E.TOPIC_IS_EMPTY, _E.ALL_MESSAGE_CONSUMED)


def consume(conn: BrokerConnection, topic: str, start: int, max_bytes: int, as_blob: bool = False) -> Any:
    """Items from ``start`` on, with their append times (a failed Result is returned);
    ``as_blob``: asked for as one buffer (see :func:`fetched`)."""
    request = consume_request(topic, index=start, max_bytes=max_bytes, with_timestamps=True, items_as_blob=as_blob)
    return conn.call("consume", request)


class Blob:
    """Items as one buffer and their lengths (a reply's ``itemBlob`` and ``itemLengths``),
    with no Python object per item: the ``value`` column of ``decode=raw`` is made of
    them without a copy (:func:`binary_column`)."""

    __slots__ = ("data", "lengths")

    def __init__(self, data: bytes | memoryview, lengths: np.ndarray[Any, Any]) -> None:
        self.data = data
        self.lengths = lengths  # int32

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def head(self, n: int) -> Blob:
        """The first ``n`` items."""
        if n >= len(self.lengths):
            return self
        return Blob(memoryview(self.data)[: int(self.lengths[:n].sum(dtype=np.int64))], self.lengths[:n])

    def to_list(self) -> list[bytes]:
        """One ``bytes`` per item (for the paths that need them: decoding packs)."""
        data = self.data
        ends = np.cumsum(self.lengths, dtype=np.int64).tolist()
        return [bytes(data[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]

    @staticmethod
    def join(blobs: Sequence[Blob]) -> Blob:
        """One blob of ``blobs``' items, in order (one copy of their bytes, when several)."""
        if len(blobs) == 1:
            return blobs[0]
        return Blob(b"".join([b.data for b in blobs]), np.concatenate([b.lengths for b in blobs]))


def fetched(response: Any, where: str) -> list[bytes] | Blob:
    """The items of a consume reply: a :class:`Blob` when the broker sent ``itemBlob``
    (it knows ``itemsAsBlob`` and was asked), else ``itemList`` (Java Luxun, an older
    luxun, or not asked), as a list of ``bytes``."""
    data = response.itemBlob
    if data is None:
        return response.itemList or []
    raw = response.itemLengths or b""
    lengths = np.frombuffer(raw, dtype=">i4", count=len(raw) // 4).astype(np.int32)
    if len(raw) % 4 or (len(lengths) and int(lengths.min()) < 0) or int(lengths.sum(dtype=np.int64)) != len(data):
        raise LuxunClientError(
            f"broker {where} sent {len(data)} bytes of items and {len(raw)} bytes of lengths that do not add up"
        )
    return Blob(data, lengths)


def binary_column(blob: Blob) -> pa.Array:
    """``blob``'s items as an Arrow binary array over its buffer (not copied): the offsets
    are the lengths' running sum (int32: ``blob`` holds under 2 GiB)."""
    n = len(blob)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(blob.lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(blob.data)])


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
    items: Sequence[bytes] | Blob, times_ms: Sequence[int], topic: str, broker: str, first: int, decode: str
) -> pa.RecordBatch:
    """One RecordBatch of the items ``first``.. with their append times (0: unknown)."""
    times = np.asarray(times_ms, dtype=np.int64)
    value: pa.Array | None = None
    values: list[bytes] = []
    if decode == "raw":
        if isinstance(items, Blob):
            value = binary_column(items)
        else:
            values = list(items)
        index = pa.array(np.arange(first, first + len(items), dtype=np.int64))
        position = pa.repeat(pa.scalar(0, pa.int32()), len(items))
    else:
        if isinstance(items, Blob):
            items = items.to_list()
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
    if value is None:
        value = pa.array(values, pa.binary())
    n = len(value)
    return pa.RecordBatch.from_arrays(
        [
            value,
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(broker, pa.string()), n),
            index,
            position,
            pa.array(times * 1000, type=_TS_TYPE, mask=times <= 0),
        ],
        schema=ARROW_SCHEMA,
    )


def _gathered(chunks: list[list[bytes] | Blob]) -> list[bytes] | Blob:
    """The items of several fetches, in order: one :class:`Blob` when every fetch came
    as one, else a list of ``bytes``."""
    if all(isinstance(c, Blob) for c in chunks):
        return Blob.join(chunks)  # type: ignore[arg-type]
    out: list[bytes] = []
    for c in chunks:
        out.extend(c.to_list() if isinstance(c, Blob) else c)
    return out


def read_range(opts: ReadOptions, part: LuxunPartition) -> Iterator[pa.RecordBatch]:
    """The rows of ``part``: consume-by-index calls of ``fetch_bytes``, gathered into
    RecordBatches of about ``_BATCH_BYTES`` of items (fewer, bigger batches are cheaper
    for Spark; smaller fetches are cheaper for Thrift). With ``items_as_blob`` the
    fetches ask for their items as one buffer (see :func:`fetched`)."""
    topic, broker = part.topic, part.broker
    pending: list[list[bytes] | Blob] = []  # the fetches of items first..index-1, not yet in a batch
    pending_times: list[int] = []  # their append times in ms (0: the broker did not say)
    pending_bytes = 0
    first = index = part.start
    with connect(broker, opts) as conn:
        while index < part.end:
            response = consume(conn, topic, index, opts.fetch_bytes, opts.items_as_blob)
            result = response.result
            items = fetched(response, broker)
            if result.resultCode == _SUCCESS and len(items):
                items = items.head(part.end - index) if isinstance(items, Blob) else items[: part.end - index]
                size = items.nbytes if isinstance(items, Blob) else sum(map(len, items))
                if pending and pending_bytes + size > _ARROW_BINARY_BYTES:  # Arrow's int32 offsets
                    yield record_batch(_gathered(pending), pending_times, topic, broker, first, opts.decode)
                    pending, pending_times, pending_bytes, first = [], [], 0, index
                times = response.timestampList
                if times is None or len(times) < len(items):
                    times = [0] * len(items)
                pending.append(items)
                pending_times.extend(times[: len(items)])
                pending_bytes += size
                index += len(items)
                if pending_bytes >= _BATCH_BYTES:
                    yield record_batch(_gathered(pending), pending_times, topic, broker, first, opts.decode)
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
                    yield record_batch(_gathered(pending), pending_times, topic, broker, first, opts.decode)
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
            yield record_batch(_gathered(pending), pending_times, topic, broker, first, opts.decode)


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
                    response = consume(
                        conn, topic, base[key], min(SAMPLE_BYTES, self.opts.fetch_bytes), self.opts.items_as_blob
                    )
                    items: list[bytes] = []
                    if response.result.resultCode == _SUCCESS:
                        got = fetched(response, broker)
                        items = (got.to_list() if isinstance(got, Blob) else got)[: take[key]]
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
