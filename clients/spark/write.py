"""Writing: rows packed into message packs per topic, each produced with the acknowledged
``produce``, round-robin over the brokers (at-least-once)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from ..connection import BrokerConnection
from ..errors import BrokerError, BrokerUnavailableError, MessageSizeTooLargeError
from ..sender import Batch, pack_parts
from .options import WriteOptions


@dataclass
class LuxunCommitMessage(WriterCommitMessage):
    """What one write task produced: counts and the indexes of its packs."""

    messages: int = 0
    packs: int = 0
    #: "topic@host:port" -> [first, last] pack index written by this task.
    indexes: dict[str, list[int]] = field(default_factory=dict)


class Sender:
    """Packs messages per topic (the clients' :class:`~clients.sender.Batch`, encoded by
    :func:`~clients.sender.pack_parts`) and produces each pack from the task's thread,
    round-robin over the brokers: a broker that cannot be reached is skipped for the next;
    a pack over a broker's ``max.message.size`` is halved; any other refusal fails the task."""

    def __init__(self, opts: WriteOptions, first_broker: int) -> None:
        self.opts = opts
        self.conns = [BrokerConnection(b, timeout_ms=opts.timeout_ms) for b in opts.servers]
        self.next = first_broker % len(self.conns)
        self.pending: dict[str, Batch] = {}
        self.commit = LuxunCommitMessage()

    def add(self, topic: str, values: list[bytes]) -> None:
        """Queue ``values`` for ``topic``; send every pack that fills up (``packSize``
        messages, or ``packBytes`` of values: a value that would pass it starts a new pack)."""
        pack_size, pack_bytes = self.opts.pack_size, self.opts.pack_bytes
        batch = self.pending.get(topic)
        if batch is None:
            batch = self.pending[topic] = Batch(topic, 0.0)
        i, n = 0, len(values)
        while i < n:
            chunk = values[i : i + pack_size - batch.count]  # what fits by count
            chunk_bytes = sum(map(len, chunk))
            if batch.value_bytes + chunk_bytes <= pack_bytes:  # fits by bytes too (the usual case)
                batch.extend(chunk)
                i += len(chunk)
            else:  # the byte limit cuts the chunk: one value at a time
                for value in chunk:
                    if batch.count and batch.value_bytes + len(value) > pack_bytes:
                        break
                    batch.add(value)
                    i += 1
                self._send(batch)
                batch = self.pending[topic] = Batch(topic, 0.0)
                continue
            if batch.count >= pack_size:
                self._send(batch)
                batch = self.pending[topic] = Batch(topic, 0.0)

    def flush(self) -> None:
        pending, self.pending = self.pending, {}
        for batch in pending.values():
            if batch.count:
                self._send(batch)

    def _send(self, batch: Batch) -> None:
        topic = batch.topic
        item = pack_parts(batch, self.opts.codec)
        errors = []
        for _ in range(len(self.conns)):
            conn = self.conns[self.next]
            self.next = (self.next + 1) % len(self.conns)
            try:
                response = conn.produce(item, topic)  # sent from the pack itself, not copied
            except BrokerUnavailableError as exc:  # a failed broker is skipped
                errors.append(str(exc))
                continue
            except BrokerError as exc:
                if isinstance(exc, MessageSizeTooLargeError) and batch.count > 1:
                    first, last = batch.halves()  # over the broker's max.message.size: halve the pack
                    self._send(first)
                    self._send(last)
                    return
                where = f"produce to topic {topic!r} on {conn.where} failed"
                raise type(exc)(exc.code, f"{where}: {exc.broker_message}", retriable=exc.retriable) from None
            commit = self.commit
            commit.messages += batch.count
            commit.packs += 1
            span = commit.indexes.setdefault(f"{topic}@{conn.where}", [response.index, response.index])
            span[0] = min(span[0], response.index)
            span[1] = max(span[1], response.index)
            return
        raise BrokerUnavailableError(f"no luxun broker took a pack for topic {topic!r}: {'; '.join(errors)}")

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


def _partition_id() -> int:
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return ctx.partitionId() if ctx is not None else 0
    except Exception:  # outside a task
        return 0


def write(opts: WriteOptions, batches: Iterator[pa.RecordBatch]) -> LuxunCommitMessage:
    sender = Sender(opts, _partition_id())
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

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every pack was acknowledged in write(); nothing more to do."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Packs already produced stay (at-least-once); a retry produces them again."""


class LuxunStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer (at-least-once: a replayed micro-batch is produced again)."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every pack was acknowledged in write(); nothing more to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Packs already produced stay (at-least-once)."""
