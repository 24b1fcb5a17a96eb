"""The ``luxun`` PySpark data source: read topics by index ranges, write DataFrames into topics.

Needs pyspark >= 4.2 and pyarrow. Register it once per SparkSession::

    from clients.spark import register

    register(spark)  # = spark.dataSource.register(LuxunDataSource)

    df = (spark.read.format("luxun")
          .option("luxun.servers", "127.0.0.1:9092,127.0.0.1:9094")
          .option("subscribe", "events,clicks")
          .load())
    df.selectExpr("CAST(value AS STRING)").show()

    out.write.format("luxun").mode("append").option("luxun.servers", "127.0.0.1:9092").option("topic", "results").save()

Columns (:data:`SCHEMA`)::

    value binary, topic string, broker string, index bigint, position int, timestamp timestamp

``index`` is the queue index of the item (one message pack) on ``broker``;
``position`` is the message's number within that pack (0 with ``decode=raw``).
``timestamp`` is the item's append time on the broker (every message of a pack shares
it), asked for with the ``ConsumeRequest.withTimestamps`` extension; it is NULL when
the broker does not send it (an original Java Luxun broker).

Read options (names follow Spark's Kafka source where they fit):

``luxun.servers``
    required; ``host:port,host:port``. Every topic is read from every broker.
``subscribe``
    required; ``topic1,topic2``.
``startingIndexes`` / ``endingIndexes``
    ``earliest``, ``latest`` or JSON ``{"topic": {"host:port": index}}`` whose values
    may also be ``"earliest"``/``"latest"``. Indexes are the first index to read and
    the first index NOT to read (end exclusive). (topic, broker) pairs missing from
    the JSON take the default. Batch defaults: ``earliest`` .. ``latest``; streaming
    starts at ``latest`` by default and has no ending. A topic unknown to a broker is
    an empty range there.
``minPartitions``
    split the (topic, broker) ranges into about this many input partitions
    (default: one per non-empty range).
``failOnDataLoss``
    ``true`` (default): fail when a range starts below the oldest retained index
    (retention removed it) or items vanished; ``false``: skip what is gone. As with
    Spark's Kafka source, a topic that was deleted and recreated is noticed only when
    its head is below the next index to read: recreated and grown past that index
    between two micro-batches, it goes unnoticed and is read from that index.
``decode``
    ``messages`` (default): one row per message of each pack; ``raw``: one row per
    queue item (the pack bytes as stored), ``position`` 0.
``maxItemsPerTrigger``
    streaming: at most this many queue items (packs, not messages) per micro-batch,
    shared between (topic, broker) pairs in proportion to what they have waiting.
``fetchBytes`` (default 1 MiB), ``timeoutMs`` (default 30000)
    byte limit of one consume call; Thrift socket timeout.

Streaming offsets are ``{"topic": {"host:port": next index}}``. A micro-batch reads the
fixed range [start, end) of each pair by index, so a replay after a failure reads the
same items again (exactly-once ranges; make the sink idempotent per batch id for
exactly-once output). ``Trigger.AvailableNow`` is supported. A pair that appears after
the query started is read from its oldest retained item.

Write options: ``luxun.servers``; ``topic`` (else a ``topic`` column, the option wins);
``packSize`` (messages per pack, default 1000); ``packBytes`` (payload bytes per pack,
default 512 KiB, keep it under the broker's ``max.message.size``); ``compression``
(``none``, ``gzip``, ``snappy``). The ``value`` column is binary or string (UTF-8);
other columns are ignored. Rows are packed into message packs per topic, in order,
and each pack is sent with the acknowledged ``produce``, round-robin over the brokers
(a failed broker is skipped). At-least-once, like Spark's Kafka sink: a retried task
or micro-batch produces its rows again. Topics are append-only: ``mode("overwrite")``
is refused; use ``mode("append")``.

:func:`indexes` gives ``{"host:port": (tail, head)}`` of a topic, to build exact
``startingIndexes``/``endingIndexes`` (see ``examples/spark_pipeline.py``).

Readers and writers hold only plain options; their Thrift connections are opened
inside ``read()``/``write()`` and closed when those finish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import time
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, StringType, StructType
from thriftpy2.protocol import TCyBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TCyFramedTransportFactory, TTransportException

from idl import QueueService
from idl import luxun_thrift as T

from .messages import decode_pack, encode_pack

__all__ = [
    "ARROW_SCHEMA",
    "SCHEMA",
    "LuxunCommitMessage",
    "LuxunDataLossError",
    "LuxunDataSource",
    "LuxunError",
    "LuxunPartition",
    "indexes",
    "register",
]

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

DEFAULT_PORT = 9092
#: Bytes per consume call. Measured here: 256 KiB-1 MiB replies move ~1.2 GB/s, 2-4 MiB
#: ones 4-5x less (thriftpy2's framed transport copies big frames over and over).
DEFAULT_FETCH_BYTES = 1 << 20
#: Items gathered into one RecordBatch (several fetches).
_BATCH_BYTES = 4 << 20
DEFAULT_TIMEOUT_MS = 30_000
DEFAULT_PACK_SIZE = 1000
DEFAULT_PACK_BYTES = 512 << 10
_CODECS = {"none": 0, "gzip": 1, "snappy": 2}

_SUCCESS = T.ResultCode.SUCCESS
_E = T.ErrorCode
_TRANSPORT_ERRORS = (TTransportException, OSError, TApplicationException, EOFError)

Key = tuple[str, str]  # (topic, broker)


class LuxunError(RuntimeError):
    """A broker refused a call or could not be reached."""


class LuxunDataLossError(LuxunError):
    """Items a query must read are gone (retention, a deleted or recreated topic)."""


def register(spark: Any) -> None:
    """Register the ``luxun`` data source with ``spark`` (a SparkSession)."""
    spark.dataSource.register(LuxunDataSource)


def indexes(servers: str, topic: str, *, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> dict[str, tuple[int, int]]:
    """``{"host:port": (tail, head)}`` of ``topic`` on each broker that has it: the oldest
    retained index and the next index to be written. Handy to build ``startingIndexes`` /
    ``endingIndexes`` JSON for an exact range (runs in the calling process)."""
    opts = {"luxun.servers": servers, "subscribe": topic}
    parsed = dataclasses.replace(_ReadOptions.parse(opts, streaming=False), timeout_ms=timeout_ms)
    return {b: ends for (_, b), ends in _all_ends(parsed).items()}


# -- options ---------------------------------------------------------------------------
def _broker(address: str) -> str:
    """``host:port`` or ``host`` -> normalised ``host:port``."""
    host, sep, port = address.strip().rpartition(":")
    if not sep:
        host, port = port, str(DEFAULT_PORT)
    if not port.isdigit() or not host:
        raise ValueError(f"broker address {address!r} is not host:port")
    return f"{host}:{int(port)}"


def _servers(options: Any) -> tuple[str, ...]:
    raw = options.get("luxun.servers")
    if not raw:
        raise ValueError("option 'luxun.servers' is required (host:port,host:port)")
    servers = tuple(dict.fromkeys(_broker(s) for s in raw.split(",") if s.strip()))
    if not servers:
        raise ValueError("option 'luxun.servers' names no broker")
    return servers


def _int(options: Any, name: str, default: int | None, minimum: int) -> int | None:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name!r} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise ValueError(f"option {name!r} must be >= {minimum}, not {value}")
    return value


def _bool(options: Any, name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {name!r} must be true or false, not {raw!r}")
    return value == "true"


# A position spec: an index, or "earliest"/"latest".
Spec = int | str


@dataclass(frozen=True)
class _ReadOptions:
    """Everything a reader needs: plain, picklable values."""

    servers: tuple[str, ...]
    topics: tuple[str, ...]
    starting: dict[Key, Spec]
    starting_default: str
    ending: dict[Key, Spec]
    ending_default: str
    min_partitions: int | None
    fail_on_data_loss: bool
    decode: str
    fetch_bytes: int
    timeout_ms: int
    max_items_per_trigger: int | None

    @classmethod
    def parse(cls, options: Any, *, streaming: bool) -> _ReadOptions:
        servers = _servers(options)
        raw_topics = options.get("subscribe")
        if not raw_topics:
            raise ValueError("option 'subscribe' is required (topic1,topic2)")
        topics = tuple(dict.fromkeys(t.strip() for t in raw_topics.split(",") if t.strip()))
        if not topics:
            raise ValueError("option 'subscribe' names no topic")
        start_default, starting = _parse_spec(
            options.get("startingIndexes"), "startingIndexes", "latest" if streaming else "earliest", topics, servers
        )
        if streaming and options.get("endingIndexes") is not None:
            raise ValueError("option 'endingIndexes' is for batch queries only")
        end_default, ending = _parse_spec(options.get("endingIndexes"), "endingIndexes", "latest", topics, servers)
        decode = str(options.get("decode") or "messages").strip().lower()
        if decode not in ("messages", "raw"):
            raise ValueError(f"option 'decode' must be 'messages' or 'raw', not {decode!r}")
        return cls(
            servers=servers,
            topics=topics,
            starting=starting,
            starting_default=start_default,
            ending=ending,
            ending_default=end_default,
            min_partitions=_int(options, "minPartitions", None, 1),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            decode=decode,
            fetch_bytes=_int(options, "fetchBytes", DEFAULT_FETCH_BYTES, 1) or DEFAULT_FETCH_BYTES,
            timeout_ms=_int(options, "timeoutMs", DEFAULT_TIMEOUT_MS, 1) or DEFAULT_TIMEOUT_MS,
            max_items_per_trigger=_int(options, "maxItemsPerTrigger", None, 1),
        )

    def keys(self) -> list[Key]:
        return [(t, b) for t in self.topics for b in self.servers]


def _parse_spec(
    raw: str | None, name: str, default: str, topics: Sequence[str], servers: Sequence[str]
) -> tuple[str, dict[Key, Spec]]:
    """-> (default for pairs not named, {(topic, broker): index or earliest/latest})."""
    if raw is None or raw.strip() == "":
        return default, {}
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower(), {}
    try:
        spec = json.loads(text)
    except ValueError:
        raise ValueError(f"option {name!r} must be earliest, latest or JSON {{topic: {{host:port: index}}}}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"option {name!r}: JSON must be an object {{topic: {{host:port: index}}}}")
    out: dict[Key, Spec] = {}
    for topic, per_broker in spec.items():
        if topic not in topics:
            raise ValueError(f"option {name!r} names topic {topic!r}, which is not subscribed")
        if not isinstance(per_broker, dict):
            raise ValueError(f"option {name!r}: topic {topic!r} must map to {{host:port: index}}")
        for address, index in per_broker.items():
            broker = _broker(address)
            if broker not in servers:
                raise ValueError(f"option {name!r} names broker {address!r}, which is not in luxun.servers")
            if isinstance(index, str) and index.lower() in ("earliest", "latest"):
                out[(topic, broker)] = index.lower()
            elif isinstance(index, int) and not isinstance(index, bool) and index >= 0:
                out[(topic, broker)] = index
            else:
                raise ValueError(
                    f"option {name!r}: {topic}/{broker} must be an index >= 0, 'earliest' or 'latest', not {index!r}"
                )
    return default, out


def _resolve(spec: Spec, tail: int, head: int) -> int:
    if spec == "earliest":
        return tail
    if spec == "latest":
        return head
    assert isinstance(spec, int)
    return spec


# -- broker calls ----------------------------------------------------------------------
class _Client:
    """One lazily opened Thrift connection to one broker. Not thread-safe, not picklable."""

    def __init__(self, address: str, timeout_ms: int) -> None:
        self.address = address
        self.timeout_ms = timeout_ms
        self._client: Any = None

    def _call(self, method: str, request: Any) -> Any:
        if self._client is None:
            host, _, port = self.address.rpartition(":")
            try:
                self._client = make_client(
                    QueueService,
                    host,
                    int(port),
                    proto_factory=TCyBinaryProtocolFactory(),
                    trans_factory=TCyFramedTransportFactory(),
                    timeout=self.timeout_ms,
                )
            except _TRANSPORT_ERRORS as exc:
                raise LuxunError(f"cannot connect to luxun broker {self.address}: {exc}") from exc
            # thriftpy2 leaves Nagle on: replies over a few KiB would wait for delayed ACKs.
            sock = getattr(getattr(self._client._iprot.trans, "trans", None), "sock", None)
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            return getattr(self._client, method)(request)
        except _TRANSPORT_ERRORS as exc:
            self.close()
            raise LuxunError(f"luxun broker {self.address} failed during {method}: {exc}") from exc

    def ends(self, topic: str) -> tuple[int, int] | None:
        """(tail, head) of ``topic``, or None when the broker does not have it."""
        for _ in range(10):
            out = []
            for when in (T.EARLIEST_TIME, T.LATEST_TIME):
                r = self._call("findClosestIndexByTime", T.FindClosestIndexByTimeRequest(timestamp=when, topic=topic))
                res = r.result
                if res.resultCode == _SUCCESS:
                    out.append(r.index)
                elif res.errorCode == _E.TOPIC_NOT_EXIST:
                    return None
                elif res.resultCode == T.ResultCode.TRY_LATER:
                    break  # the topic changed during the lookup
                else:
                    raise LuxunError(f"findClosestIndexByTime({topic!r}) on {self.address}: {res.errorMessage}")
            if len(out) == 2:
                return out[0], max(out[0], out[1])
            time.sleep(0.05)
        raise LuxunError(f"topic {topic!r} on {self.address} kept changing during index lookups")

    def consume(self, topic: str, start: int, fetch_bytes: int) -> Any:
        request = T.ConsumeRequest(topic=topic, startIndex=start, maxFetchSize=fetch_bytes, withTimestamps=True)
        return self._call("consume", request)

    def produce(self, topic: str, item: bytes) -> Any:
        return self._call("produce", T.ProduceRequest(item=item, topic=topic))

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # already broken
                client.close()


def _all_ends(opts: _ReadOptions, keys: Sequence[Key] | None = None) -> dict[Key, tuple[int, int]]:
    """(tail, head) of every (topic, broker) pair that exists."""
    out: dict[Key, tuple[int, int]] = {}
    wanted = keys if keys is not None else opts.keys()
    for broker in opts.servers:
        client = _Client(broker, opts.timeout_ms)
        try:
            for topic, b in wanted:
                if b == broker:
                    ends = client.ends(topic)
                    if ends is not None:
                        out[(topic, broker)] = ends
        finally:
            client.close()
    return out


# -- partitions ------------------------------------------------------------------------
@dataclass
class LuxunPartition(InputPartition):
    """Items [start, end) of ``topic`` on ``broker``. ``lenient``: items below the tail
    are skipped silently (a range planned from 0 for a pair new to a streaming query)."""

    topic: str
    broker: str
    start: int
    end: int
    lenient: bool = False


def _split(ranges: Sequence[LuxunPartition], min_partitions: int | None) -> list[LuxunPartition]:
    """Split non-empty ranges into about ``min_partitions`` parts (in proportion to size)."""
    ranges = [r for r in ranges if r.end > r.start]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    out: list[LuxunPartition] = []
    for r in ranges:
        size = r.end - r.start
        parts = max(1, min(size, round(size * min_partitions / total)))
        for i in range(parts):
            lo = r.start + size * i // parts
            hi = r.start + size * (i + 1) // parts
            out.append(LuxunPartition(r.topic, r.broker, lo, hi, r.lenient))
    return out


# -- reading ---------------------------------------------------------------------------
_POSITIONS: dict[int, array[int]] = {}


def _positions(n: int) -> array[int]:
    p = _POSITIONS.get(n)
    if p is None:
        p = array("i", range(n))
        if len(_POSITIONS) < 64:
            _POSITIONS[n] = p
    return p


def _record_batch(
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
            try:
                messages = decode_pack(item)
            except ValueError as exc:
                where = f"item {first + k} of topic {topic!r} on {broker}"
                raise LuxunError(f"{where} is not a message pack: {exc}") from exc
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


def _read_range(opts: _ReadOptions, part: LuxunPartition) -> Iterator[pa.RecordBatch]:
    """The rows of ``part``: consume-by-index calls of ``fetch_bytes``, gathered into
    RecordBatches of about ``_BATCH_BYTES`` of items (fewer, bigger batches are cheaper
    for Spark; smaller fetches are cheaper for Thrift)."""
    topic, broker = part.topic, part.broker
    client = _Client(broker, opts.timeout_ms)
    pending: list[bytes] = []  # items first..index-1, not yet in a batch
    pending_times: list[int] = []  # their append times in ms (0: the broker did not say)
    pending_bytes = 0
    first = index = part.start
    try:
        while index < part.end:
            response = client.consume(topic, index, opts.fetch_bytes)
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
                    yield _record_batch(pending, pending_times, topic, broker, first, opts.decode)
                    pending, pending_times, pending_bytes, first = [], [], 0, index
                continue
            if result.errorCode not in (
                _E.INDEX_OUT_OF_BOUNDS,
                _E.TOPIC_NOT_EXIST,
                _E.TOPIC_IS_EMPTY,
                _E.ALL_MESSAGE_CONSUMED,
            ):
                raise LuxunError(f"consume of topic {topic!r} at index {index} on {broker}: {result.errorMessage}")
            # Items of the range are gone: retention passed them, or the topic was
            # deleted or recreated with fewer items.
            ends = client.ends(topic)
            if ends is not None and index < ends[0]:
                tail = ends[0]
                if opts.fail_on_data_loss and not part.lenient:
                    raise LuxunDataLossError(
                        f"topic {topic!r} on {broker}: items {index}..{min(tail, part.end) - 1} were removed "
                        f"(oldest retained index is {tail}); set failOnDataLoss=false to skip them"
                    )
                if pending:
                    yield _record_batch(pending, pending_times, topic, broker, first, opts.decode)
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
            yield _record_batch(pending, pending_times, topic, broker, first, opts.decode)
    finally:
        client.close()


class LuxunReader(DataSourceReader):
    """Batch reader: plans (topic, broker) index ranges, reads them with consume-by-index."""

    def __init__(self, opts: _ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        ranges = []
        for key, (tail, head) in _all_ends(opts).items():
            topic, broker = key
            start = _resolve(opts.starting.get(key, opts.starting_default), tail, head)
            end = _resolve(opts.ending.get(key, opts.ending_default), tail, head)
            if end > head:
                raise ValueError(f"endingIndexes: {end} is beyond the head {head} of topic {topic!r} on {broker}")
            if start > end:
                raise ValueError(f"startingIndexes {start} is after endingIndexes {end} for {topic!r} on {broker}")
            if start < tail:
                if opts.fail_on_data_loss:
                    raise LuxunDataLossError(
                        f"topic {topic!r} on {broker}: starting index {start} is below the oldest retained "
                        f"index {tail} (retention removed items); set failOnDataLoss=false to start at {tail}"
                    )
                start = min(tail, end)
            ranges.append(LuxunPartition(topic, broker, start, end))
        return _split(ranges, opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, LuxunPartition):  # Spark plans InputPartition(None) when there is none
            yield from _read_range(self.opts, partition)


def _apportion(avail: dict[Key, int], limit: int | None) -> dict[Key, int]:
    """Share ``limit`` items between pairs in proportion to what each has waiting."""
    total = sum(avail.values())
    if limit is None or total <= limit:
        return dict(avail)
    take = {k: a * limit // total for k, a in avail.items()}
    left = limit - sum(take.values())
    for k in sorted(avail):
        if left <= 0:
            break
        if take[k] < avail[k]:
            take[k] += 1
            left -= 1
    return take


def _offsets(flat: dict[Key, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for topic, broker in sorted(flat):
        out.setdefault(topic, {})[broker] = flat[(topic, broker)]
    return out


def _flat(offsets: dict[str, Any]) -> dict[Key, int]:
    return {(t, b): int(i) for t, per in offsets.items() for b, i in per.items()}


class LuxunStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader; offsets are ``{"topic": {"host:port": next index}}``."""

    def __init__(self, opts: _ReadOptions) -> None:
        self.opts = opts
        self._target: dict[Key, int] | None = None

    def initialOffset(self) -> dict[str, Any]:
        opts = self.opts
        flat = {
            key: _resolve(opts.starting.get(key, opts.starting_default), tail, head)
            for key, (tail, head) in _all_ends(opts).items()
        }
        return _offsets(flat)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_items_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {key: head for key, (_, head) in _all_ends(self.opts).items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        opts = self.opts
        begin = _flat(start)
        ends = _all_ends(opts)
        avail: dict[Key, int] = {}
        base: dict[Key, int] = {}
        for key, (tail, head) in ends.items():
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
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        flat = dict(begin)
        for key, n in _apportion(avail, max_rows).items():
            if n > 0:
                flat[key] = base[key] + n
        if flat == begin:
            return start
        return _offsets(flat)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = _flat(start)
        ranges = []
        for key, e in sorted(_flat(end).items()):
            s = begin.get(key)
            if s is None or s > e:  # new pair, or a reset topic: from its oldest item
                ranges.append(LuxunPartition(key[0], key[1], 0, e, lenient=True))
            elif e > s:
                ranges.append(LuxunPartition(key[0], key[1], s, e))
        return _split(ranges, self.opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, LuxunPartition):
            yield from _read_range(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: positions live in Spark's checkpoint, not on the brokers."""

    def stop(self) -> None:
        """Nothing to release: connections live only inside planning calls and read()."""


# -- writing ---------------------------------------------------------------------------
@dataclass
class LuxunCommitMessage(WriterCommitMessage):
    """What one write task produced: counts and the indexes of its packs."""

    messages: int = 0
    packs: int = 0
    #: (topic, broker) -> [first, last] pack index written by this task.
    indexes: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class _WriteOptions:
    servers: tuple[str, ...]
    topic: str | None
    pack_size: int
    pack_bytes: int
    codec: int
    timeout_ms: int

    @classmethod
    def parse(cls, options: Any, schema: StructType) -> _WriteOptions:
        names = {f.name: f for f in schema.fields}
        value = names.get("value")
        if value is None or not isinstance(value.dataType, BinaryType | StringType):
            raise ValueError("luxun writes need a 'value' column of type binary or string")
        topic = (options.get("topic") or "").strip() or None
        if topic is None:
            column = names.get("topic")
            if column is None:
                raise ValueError("luxun writes need a 'topic' option or a 'topic' column")
            if not isinstance(column.dataType, StringType):
                raise ValueError("the 'topic' column must be of type string")
        codec = str(options.get("compression") or "none").strip().lower()
        if codec not in _CODECS:
            raise ValueError(f"option 'compression' must be one of {sorted(_CODECS)}, not {codec!r}")
        return cls(
            servers=_servers(options),
            topic=topic,
            pack_size=_int(options, "packSize", DEFAULT_PACK_SIZE, 1) or DEFAULT_PACK_SIZE,
            pack_bytes=_int(options, "packBytes", DEFAULT_PACK_BYTES, 1) or DEFAULT_PACK_BYTES,
            codec=_CODECS[codec],
            timeout_ms=_int(options, "timeoutMs", DEFAULT_TIMEOUT_MS, 1) or DEFAULT_TIMEOUT_MS,
        )


class _Sender:
    """Packs messages per topic and produces the packs, round-robin over the brokers."""

    def __init__(self, opts: _WriteOptions, first_broker: int) -> None:
        self.opts = opts
        self.clients = [_Client(b, opts.timeout_ms) for b in opts.servers]
        self.next = first_broker % len(self.clients)
        self.pending: dict[str, tuple[list[bytes], list[int]]] = {}
        self.commit = LuxunCommitMessage()

    def add(self, topic: str, values: list[bytes]) -> None:
        """Queue ``values`` for ``topic``; send every pack that fills up."""
        pack_size, pack_bytes = self.opts.pack_size, self.opts.pack_bytes
        buf, size = self.pending.setdefault(topic, ([], [0]))
        i, n = 0, len(values)
        while i < n:
            chunk = values[i : i + pack_size - len(buf)]  # what fits by count
            chunk_bytes = sum(map(len, chunk))
            if size[0] + chunk_bytes <= pack_bytes:  # fits by bytes too (the usual case)
                buf.extend(chunk)
                size[0] += chunk_bytes
                i += len(chunk)
            else:  # the byte limit cuts the chunk: one value at a time
                for value in chunk:
                    if buf and size[0] + len(value) > pack_bytes:
                        break
                    buf.append(value)
                    size[0] += len(value)
                    i += 1
                self._send(topic, buf)
                buf.clear()
                size[0] = 0
                continue
            if len(buf) >= pack_size:
                self._send(topic, buf)
                buf.clear()
                size[0] = 0

    def flush(self) -> None:
        for topic, (buf, size) in self.pending.items():
            if buf:
                self._send(topic, buf)
                buf.clear()
                size[0] = 0

    def _send(self, topic: str, messages: list[bytes]) -> None:
        item = encode_pack(messages, self.opts.codec)
        errors = []
        for _ in range(len(self.clients)):
            client = self.clients[self.next]
            self.next = (self.next + 1) % len(self.clients)
            try:
                response = client.produce(topic, item)
            except LuxunError as exc:
                errors.append(str(exc))
                continue
            result = response.result
            if result.resultCode != _SUCCESS:
                if result.errorCode == _E.MESSAGE_SIZE_TOO_LARGE and len(messages) > 1:
                    half = len(messages) // 2
                    self._send(topic, messages[:half])
                    self._send(topic, messages[half:])
                    return
                raise LuxunError(f"produce to topic {topic!r} on {client.address} failed: {result.errorMessage}")
            commit = self.commit
            commit.messages += len(messages)
            commit.packs += 1
            span = commit.indexes.setdefault(f"{topic}@{client.address}", [response.index, response.index])
            span[0] = min(span[0], response.index)
            span[1] = max(span[1], response.index)
            return
        raise LuxunError(f"no luxun broker took a pack for topic {topic!r}: {'; '.join(errors)}")

    def close(self) -> None:
        for client in self.clients:
            client.close()


def _partition_id() -> int:
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return ctx.partitionId() if ctx is not None else 0
    except Exception:  # outside a task
        return 0


def _write(opts: _WriteOptions, batches: Iterator[pa.RecordBatch]) -> LuxunCommitMessage:
    sender = _Sender(opts, _partition_id())
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            value = batch.column("value")
            if value.null_count:
                raise ValueError("luxun cannot write a NULL value")
            if not pa.types.is_binary(value.type):
                value = value.cast(pa.binary())
            values = value.to_pylist()
            if opts.topic is not None:
                sender.add(opts.topic, values)
                continue
            topics = batch.column("topic")
            if topics.null_count:
                raise ValueError("luxun cannot write a row whose topic is NULL (set the 'topic' option?)")
            names = topics.to_pylist()
            first = names[0]
            if all(n == first for n in names):
                sender.add(first, values)
                continue
            grouped: dict[str, list[bytes]] = {}
            for name, v in zip(names, values, strict=True):
                grouped.setdefault(name, []).append(v)
            for name, vs in grouped.items():
                sender.add(name, vs)
        sender.flush()
        return sender.commit
    finally:
        sender.close()


class LuxunWriter(DataSourceArrowWriter):
    """Batch writer (at-least-once)."""

    def __init__(self, opts: _WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every pack was acknowledged in write(); nothing more to do."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Packs already produced stay (at-least-once); a retry produces them again."""


class LuxunStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer (at-least-once: a replayed micro-batch is produced again)."""

    def __init__(self, opts: _WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every pack was acknowledged in write(); nothing more to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Packs already produced stay (at-least-once)."""


# -- the data source -------------------------------------------------------------------
_SCHEMA_STRING = "struct<" + ",".join(f"{n}:{t}" for n, t in (f.split() for f in SCHEMA.split(", "))) + ">"


def _check_schema(schema: StructType) -> None:
    if schema.simpleString() != _SCHEMA_STRING:
        raise ValueError(f"the luxun source has the fixed schema {SCHEMA!r}; do not set another")


class LuxunDataSource(DataSource):
    """``spark.read/readStream/write/writeStream.format("luxun")``; see the module doc."""

    @classmethod
    def name(cls) -> str:
        return "luxun"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return LuxunReader(_ReadOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return LuxunStreamReader(_ReadOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> LuxunWriter:
        if overwrite:
            raise ValueError("luxun topics are append-only: use mode('append')")
        return LuxunWriter(_WriteOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> LuxunStreamWriter:
        return LuxunStreamWriter(_WriteOptions.parse(self.options, schema))
