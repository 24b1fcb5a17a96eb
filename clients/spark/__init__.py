"""The ``luxun`` PySpark data source: read topics by index or time ranges, write DataFrames
into topics.

Needs pyspark >= 4.2 and pyarrow. Register it once per SparkSession::

    from clients.spark import register

    register(spark)  # = spark.dataSource.register(LuxunDataSource)

    df = (spark.read.format("luxun")
          .option("luxun.servers", "127.0.0.1:9092,127.0.0.1:9094")
          .option("subscribe", "events,clicks")
          .load())
    df.selectExpr("CAST(value AS STRING)").show()

    out.write.format("luxun").mode("append").option("luxun.servers", "127.0.0.1:9092").option("topic", "results").save()

Modules: :mod:`.options` (parsing), :mod:`.planning` (positions, ranges, shares),
:mod:`.read` (batch and micro-batch readers), :mod:`.write` (writers). Spark pickles
readers and writers by reference: workers import them from this installed package.

Columns (:data:`SCHEMA`)::

    value binary, topic string, broker string, index bigint, position int, timestamp timestamp

``index`` is the queue index of the item (one message pack) on ``broker``;
``position`` is the message's number within that pack (0 with ``decode=raw``).
(topic, broker, index, position) names a message exactly and never changes: the key to
trace or deduplicate rows. ``timestamp`` is the item's append time on the broker (every
message of a pack shares it), asked for with the ``ConsumeRequest.withTimestamps``
extension; it is NULL when the broker does not send it (an original Java Luxun broker).
There is no ``key`` column: a Luxun message pack holds values only (``idl/message.thrift``),
the producer's key only chooses the broker and is not stored.

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
``startingTimestamp`` / ``endingTimestamp``
    a time in ms since the epoch for every pair: the position is the first index whose
    append time is >= it (the head when every item is older), as Kafka's
    ``startingTimestamp``; so ``endingTimestamp`` reads items appended before it. Not
    combinable with the two options below (which would it be?).
``startingIndexesByTimestamp`` / ``endingIndexesByTimestamp``
    JSON ``{"topic": {"host:port": ms}}``, the same rule per pair (Kafka's
    ``startingOffsetsByTimestamp``); pairs not named take ``startingIndexes`` /
    ``endingIndexes``, a pair may not be named in both.
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
``maxRowsPerTrigger``
    streaming: about this many rows (messages) per micro-batch at most. Packs are never
    split: the planner reads the first packs of each pair that will be handed out (one
    consume of up to 256 KiB per pair and trigger) and counts their messages exactly;
    a cut beyond those packs is estimated from the mean messages per pack seen on that
    pair. A micro-batch holds at least one pack, even one of more rows than the limit.
    With ``decode=raw`` a row is a pack, and the limit is exact.
``minItemsPerTrigger`` / ``maxTriggerDelay``
    streaming, as Kafka's ``minOffsetsPerTrigger``/``maxTriggerDelay``: no micro-batch
    until at least ``minItemsPerTrigger`` new items (packs) are waiting, or
    ``maxTriggerDelay`` (default ``15m``; ``500ms``, ``10s``, ``15m``, ``1h``, a bare
    number is ms) has passed since the last micro-batch (or the query's start).
    ``Trigger.AvailableNow`` ignores the minimum (it would end without reading).
``fetchBytes`` (default 1 MiB), ``timeoutMs`` (default 30000)
    byte limit of one consume call; connect and socket timeout of broker calls.
``itemsAsBlob``
    ``true`` (default): ask for each fetch's items as one buffer and their lengths (the
    ``itemsAsBlob`` extension of ``ConsumeRequest``), so that with ``decode=raw`` the
    ``value`` column is made of that buffer without a Python object per item; a broker
    that does not know the extension (Java Luxun, an older luxun) answers with
    ``itemList``, read as before. ``false``: always ask for ``itemList``.

Streaming offsets are ``{"topic": {"host:port": next index}}``. A micro-batch reads the
fixed range [start, end) of each pair by index, so a replay after a failure reads the
same items again (exactly-once ranges; make the sink idempotent per batch id for
exactly-once output). A micro-batch never splits a pack, so its end offset is a message
boundary: a restarted query starts at the first message after the last committed
micro-batch, the rule ``StreamConsumer.commit()`` follows (docs/commits.md).
``Trigger.AvailableNow`` is supported (with the per-trigger maximums). A pair that
appears after the query started is read from its oldest item.

Write options: ``luxun.servers``; ``topic`` (else a ``topic`` column, the option wins);
``packSize`` (messages per pack, default 1000); ``packBytes`` (payload bytes per pack,
default 512 KiB, keep it under the broker's ``max.message.size``); ``compression``
(``none``, ``gzip``, ``snappy``); ``timeoutMs``. The ``value`` column is binary or
string (UTF-8); other columns are ignored. Rows are packed into message packs per
topic, in order, and each pack is sent with the acknowledged ``produce``, round-robin
over the brokers (a failed broker is skipped). At-least-once, like Spark's Kafka sink:
a retried task or micro-batch produces its rows again. Topics are append-only:
``mode("overwrite")`` is refused; use ``mode("append")``.

:func:`indexes` gives ``{"host:port": (tail, head)}`` of a topic, to build exact
``startingIndexes``/``endingIndexes`` (see ``examples/spark_pipeline.py``).

Readers and writers hold only plain options; their broker connections
(:class:`clients.connection.BrokerConnection`) are opened inside planning calls,
``read()`` and ``write()``, and closed when those finish. Errors are the client tree
(:mod:`clients.errors`); :class:`LuxunDataLossError` joins it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from ..errors import LuxunClientError
from .options import DEFAULT_PACK_BYTES, DEFAULT_TIMEOUT_MS, ReadOptions, WriteOptions
from .planning import LuxunDataLossError, LuxunPartition, all_ends
from .read import ARROW_SCHEMA, SCHEMA, LuxunReader, LuxunStreamReader
from .write import LuxunCommitMessage, LuxunStreamWriter, LuxunWriter

__all__ = [
    "ARROW_SCHEMA",
    "DEFAULT_PACK_BYTES",
    "SCHEMA",
    "LuxunCommitMessage",
    "LuxunDataLossError",
    "LuxunDataSource",
    "LuxunError",
    "LuxunPartition",
    "indexes",
    "register",
]

#: The old name of the base error (now the client tree's base, :mod:`clients.errors`).
LuxunError = LuxunClientError


def register(spark: Any) -> None:
    """Register the ``luxun`` data source with ``spark`` (a SparkSession)."""
    spark.dataSource.register(LuxunDataSource)


def indexes(servers: str, topic: str, *, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> dict[str, tuple[int, int]]:
    """``{"host:port": (tail, head)}`` of ``topic`` on each broker that has it: the oldest
    retained index and the next index to be written. Handy to build ``startingIndexes`` /
    ``endingIndexes`` JSON for an exact range (runs in the calling process)."""
    opts = {"luxun.servers": servers, "subscribe": topic}
    parsed = dataclasses.replace(ReadOptions.parse(opts, streaming=False), timeout_ms=timeout_ms)
    return {b: ends for (_, b), ends in all_ends(parsed).items()}


_SCHEMA_STRING = "struct<" + ",".join(f"{n}:{t}" for n, t in (f.split() for f in SCHEMA.split(", "))) + ">"


def _check_schema(schema: StructType) -> None:
    if schema.simpleString() != _SCHEMA_STRING:
        raise ValueError(f"the luxun source has the fixed schema {SCHEMA!r}; do not set another")


class LuxunDataSource(DataSource):
    """``spark.read/readStream/write/writeStream.format("luxun")``; see the package doc."""

    @classmethod
    def name(cls) -> str:
        return "luxun"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return LuxunReader(ReadOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return LuxunStreamReader(ReadOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> LuxunWriter:
        if overwrite:
            raise ValueError("luxun topics are append-only: use mode('append')")
        return LuxunWriter(WriteOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> LuxunStreamWriter:
        return LuxunStreamWriter(WriteOptions.parse(self.options, schema))
