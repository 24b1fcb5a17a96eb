"""Writing: rows packed into message packs per topic, each produced with the acknowledged
``produce`` through the clients' one sender, round-robin over the brokers (at-least-once:
a task returns its commit message only once every pack is acknowledged)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from ..errors import BrokerError, BrokerUnavailableError, LuxunClientError, MessageSizeTooLargeError
from ..sender import Batch, BrokerSender, pack_parts
from .options import WriteOptions

#: Packs per broker handed over and not acknowledged yet, at most (then add() waits).
_IN_FLIGHT_PER_BROKER = 4
#: A broker that failed is tried again after this (doubling up to _MAX_BACKOFF_S).
_RETRY_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 1.0


@dataclass
class LuxunCommitMessage(WriterCommitMessage):
    """What one write task produced: counts and the indexes of its packs."""

    messages: int = 0
    packs: int = 0
    #: "topic@host:port" -> [first, last] pack index written by this task.
    indexes: dict[str, list[int]] = field(default_factory=dict)


class Packer:
    """A write task's rows as message packs per topic (the clients'
    :class:`~clients.sender.Batch`): a pack is handed to :meth:`_send` when it holds
    ``packSize`` messages, or when the next value would take it past ``packBytes``."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        self.pending: dict[str, Batch] = {}

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
        """Hand over every pack still being filled."""
        pending, self.pending = self.pending, {}
        for batch in pending.values():
            if batch.count:
                self._send(batch)

    def _send(self, batch: Batch) -> None:
        raise NotImplementedError


class Sender(Packer):
    """Packs messages per topic (:class:`Packer`, each pack encoded by
    :func:`~clients.sender.pack_parts`) and hands each full pack to the clients' one sender
    (a :class:`~clients.sender.BrokerSender` per broker, one call at a time each),
    round-robin over the brokers: a broker that cannot be reached hands its packs on to
    the next (each pack tried once per broker); a pack over a broker's
    ``max.message.size`` is halved, the halves sent first; any other refusal fails the task
    (at the next hand-off or at :meth:`flush`). At most ``_IN_FLIGHT_PER_BROKER`` packs per
    broker wait unacknowledged: a task's memory does not grow with its partition."""

    def __init__(self, opts: WriteOptions, first_broker: int) -> None:
        super().__init__(opts)
        self.commit = LuxunCommitMessage()
        n = len(opts.servers)
        self.next = first_broker % n
        self._cond = threading.Condition(threading.Lock())
        self._unsettled = 0  # packs handed over and not yet delivered or failed
        self._error: LuxunClientError | None = None
        #: the last failure of each broker's round trips, for the error when none takes a pack
        self._unreachable: collections.deque[str] = collections.deque(maxlen=len(opts.servers))
        self._senders = [self._sender(i, address) for i, address in enumerate(opts.servers)]
        for sender in self._senders:
            sender.start()

    def _sender(self, index: int, address: str) -> BrokerSender[Batch]:
        return BrokerSender(self, index, address, name=f"luxun-spark-writer-{address}", timeout_ms=self.opts.timeout_ms,
                            retry_backoff_s=_RETRY_BACKOFF_S, max_backoff_s=_MAX_BACKOFF_S, failover=True)  # fmt: skip

    def flush(self) -> None:
        """Send every pack still being filled and wait until each is acknowledged; raise
        the first failure."""
        super().flush()
        with self._cond:
            while self._unsettled and self._error is None:
                self._cond.wait(1.0)
            self._raise_failure()

    def _send(self, batch: Batch) -> None:
        """Hand ``batch`` to the next broker's sender (waiting while too many are in flight)."""
        limit = _IN_FLIGHT_PER_BROKER * len(self._senders)
        with self._cond:
            while self._unsettled >= limit and self._error is None:
                self._cond.wait(1.0)
            self._raise_failure()
            self._unsettled += 1
        self._next_sender().put(batch)

    def _next_sender(self, skip: BrokerSender[Batch] | None = None) -> BrokerSender[Batch]:
        senders = self._senders
        sender = senders[self.next]
        self.next = (self.next + 1) % len(senders)
        if sender is skip and len(senders) > 1:
            return self._next_sender()
        return sender

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def _settle(self, error: LuxunClientError | None = None) -> None:
        with self._cond:
            self._unsettled -= 1
            if error is not None and self._error is None:
                self._error = error
            self._cond.notify_all()

    # -- the sender's owner (clients.sender.SendOwner) -----------------------------------
    def pack(self, batch: Batch) -> list[bytes | bytearray]:
        return pack_parts(batch, self.opts.codec)

    def poll(self, sender: BrokerSender[Batch]) -> float | None:
        return None

    def round_trip(self, sender: BrokerSender[Batch]) -> None:
        pass

    def delivered(self, sender: BrokerSender[Batch], batch: Batch, index: int | None) -> None:
        assert index is not None  # acknowledged produce
        with self._cond:
            commit = self.commit
            commit.messages += batch.count
            commit.packs += 1
            span = commit.indexes.setdefault(f"{batch.topic}@{sender.conn.where}", [index, index])
            span[0] = min(span[0], index)
            span[1] = max(span[1], index)
        self._settle()

    def refused(self, sender: BrokerSender[Batch], batch: Batch, exc: BrokerError, size: int) -> None:
        if isinstance(exc, MessageSizeTooLargeError) and batch.count > 1:
            with self._cond:
                self._unsettled += 1  # two halves for one pack
            sender.put_first(list(batch.halves()))  # over the broker's max.message.size
            return
        where = f"produce to topic {batch.topic!r} on {sender.conn.where} failed"
        self._settle(type(exc)(exc.code, f"{where}: {exc.broker_message}", retriable=exc.retriable))

    def failed(self, sender: BrokerSender[Batch], exc: LuxunClientError) -> None:
        with self._cond:
            self._unreachable.append(str(exc))

    def give_up(self, sender: BrokerSender[Batch], batch: Batch, exc: LuxunClientError) -> bool:
        if batch.attempts < len(self._senders):
            return False
        with self._cond:
            reasons = "; ".join(self._unreachable)
        self._settle(BrokerUnavailableError(f"no luxun broker took a pack for topic {batch.topic!r}: {reasons}"))
        return True

    def reroute(self, sender: BrokerSender[Batch], batches: list[Batch]) -> None:
        for batch in batches:  # to the next broker (an unreachable one is skipped)
            self._next_sender(skip=sender).put(batch)

    def abandoned(self, sender: BrokerSender[Batch], batch: Batch) -> None:
        self._settle(BrokerUnavailableError(f"the write stopped with a pack for topic {batch.topic!r} unsent"))

    def close(self) -> None:
        for sender in self._senders:
            sender.finish(abandon=True)
        for sender in self._senders:
            sender.join(10)
            sender.conn.close()


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
