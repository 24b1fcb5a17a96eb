"""The one sender of ``clients/``: what the producer, the agent and the Spark writer share
to turn messages into packs and packs into acknowledged queue items.

- :class:`RateLimiter`: a topic's limit, ``limit`` messages per ``interval_ms`` (the
  producer's ``rate_limits``, the agent's ``topicRateLimiting``).
- :class:`Batch`: the messages of one pack of one topic, written as the pack lists them
  (i32 length, bytes) into one ``bytearray``: no object per message, no copy to make the
  pack (an uncompressed pack is sent from the batch's own buffer).
- :func:`pack_parts`: a batch's pack, compressed with the codec unless the pack is small
  or does not compress well (Dory's two safeguards).
- :class:`PipelinedConnection` and :class:`BrokerSender`: one thread per broker that sends
  the batches queued for it, several produce calls in one round trip, and settles each by
  the broker's answer (its result code): delivered, refused (given back to the owner), or
  failed (a broken connection, a refusal that trying again may cure: the broker is backed
  off, doubling from ``retry_backoff_s`` to ``max_backoff_s``; the batch is tried again
  first on this broker, or, ``failover``, handed back to be routed to another; its
  ``attempts`` counted and the owner asked whether to give up). What a batch's outcome
  means (futures, counters, discards, pool bytes) is the owner's: a :class:`SendOwner`.

The producer (:mod:`clients.producer`), the agent (:mod:`clients.agent.core`) and the
Spark writer (:mod:`clients.spark.write`) each run a :class:`BrokerSender` per broker.
"""

from __future__ import annotations

import struct
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from idl import luxun_thrift as T

from .connection import CALL_ERRORS, BrokerConnection, produce_call_parts, send_parts
from .errors import BrokerError, LuxunClientError, MessageSizeTooLargeError, broker_error
from .messages import NO_COMPRESSION
from .pack import encode_pack_written, pack_written_parts

_I32 = struct.Struct(">i").pack
#: Bytes of an uncompressed pack beyond its written values (22 before the list, its 8-byte
#: head, the list's and the pack's STOP).
PACK_EXTRA_BYTES = 32
_SUCCESS = T.ResultCode.SUCCESS


class RateLimiter:
    """At most ``limit`` messages (None: no limit) per window of ``interval_ms``; a window
    starts with the first message after the last one ended."""

    __slots__ = ("count", "interval_s", "limit", "start")

    def __init__(self, limit: int | None, interval_ms: int) -> None:
        self.limit = limit
        self.interval_s = interval_ms / 1000
        self.start = time.monotonic()
        self.count = 0

    def allow(self, now: float) -> bool:
        if now - self.start >= self.interval_s:
            self.start = now
            self.count = 0
        self.count += 1
        return self.limit is None or self.count <= self.limit


class Batch:
    """Messages bound for one pack of ``topic``: ``count`` of them, their values written
    one after the other as the pack lists them (``written``: i32 length, bytes; ``bytes``
    its length); ``attempts``: failed sends so far."""

    __slots__ = ("attempts", "bytes", "count", "created", "topic", "written")

    def __init__(self, topic: str, now: float) -> None:
        self.topic = topic
        self.written = bytearray()
        self.count = 0
        self.bytes = 0
        self.created = now
        self.attempts = 0

    @property
    def value_bytes(self) -> int:
        """The values' bytes (without their lengths)."""
        return self.bytes - 4 * self.count

    def add(self, value: bytes | bytearray) -> None:
        written = self.written
        written += _I32(len(value))
        written += value
        self.count += 1
        self.bytes += len(value) + 4

    def extend(self, values: list[bytes]) -> None:
        written = self.written
        for v in values:
            written += _I32(len(v))
            written += v
        self.count += len(values)
        self.bytes = len(written)

    def halves(self) -> tuple[Batch, Batch]:
        """Two batches of the first and the last messages (count // 2 in the first)."""
        view = memoryview(self.written)
        pos = 0
        for _ in range(self.count // 2):
            pos += 4 + int.from_bytes(view[pos : pos + 4], "big")
        first, last = Batch(self.topic, self.created), Batch(self.topic, self.created)
        first.written[:] = view[:pos]
        last.written[:] = view[pos:]
        view.release()
        first.count, last.count = self.count // 2, self.count - self.count // 2
        first.bytes, last.bytes = len(first.written), len(last.written)
        return first, last


def pack_parts(
    batch: Batch, codec: int, min_bytes: int = 0, max_percent: float = float("inf")
) -> list[bytes | bytearray]:
    """The batch's pack, as the buffers it is made of (an uncompressed one is the batch's
    own buffer between a head and a tail: not copied). Compressed with ``codec`` unless the
    uncompressed pack is below ``min_bytes`` or the compressed one is over ``max_percent``
    of it."""
    raw_size = len(batch.written) + PACK_EXTRA_BYTES  # the pack's bytes uncompressed
    if codec == NO_COMPRESSION or raw_size < min_bytes:
        return pack_written_parts(batch.count, batch.written)
    packed = encode_pack_written(batch.count, batch.written, codec)
    if len(packed) * 100 > max_percent * raw_size:
        return pack_written_parts(batch.count, batch.written)
    return [packed]


class PipelinedConnection(BrokerConnection):
    """A broker connection that sends several produce calls before reading their answers.

    The Luxun API has no call that stores packs of several topics at once (``produce``
    takes one item of one topic), so the batches queued for a broker go as a pipeline: all
    their requests written on the connection, then the answers read in order (the broker
    serves a connection's calls one after the other): one round trip for them all.
    """

    def produce_all(
        self, calls: Iterable[list[bytes | bytearray]], n: int, *, oneway: bool = False
    ) -> tuple[list[Any], LuxunClientError | None]:
        """Send the ``n`` produce calls (each as the buffers of
        :func:`~clients.connection.produce_call_parts`, made one at a time, so that at most
        one compressed pack at a time is in memory); return the answers read, in order
        (``oneway``: None for each call sent), and what stopped the pipeline (None: all
        answered). Calls past the answers read may or may not have been carried out."""
        answers: list[Any] = []
        try:
            client = self._connect()
        except LuxunClientError as exc:
            return answers, exc
        method = "asyncProduce" if oneway else "produce"
        try:
            sock = client._oprot.trans.sock  # written to directly: the transport buffers nothing
            for parts in calls:
                send_parts(sock, parts)
                if oneway:
                    answers.append(None)
            if not oneway:
                for _ in range(n):
                    answers.append(client._recv("produce"))
        except CALL_ERRORS as exc:
            return answers, self._lost(exc, method)
        self._answered = True
        return answers, None


B = TypeVar("B", bound=Batch)


class SendOwner(Protocol[B]):
    """What a :class:`BrokerSender`'s batches mean to the client that made them."""

    def pack(self, batch: B) -> list[bytes | bytearray]:
        """The batch's pack (see :func:`pack_parts`)."""

    def poll(self, sender: BrokerSender[B]) -> float | None:
        """Called before the sender waits: put batches now due on it (``sender.put``);
        return how long until the next is due (None: none is waiting)."""

    def round_trip(self, sender: BrokerSender[B]) -> None:
        """A pipeline of calls went out (answered or not)."""

    def delivered(self, sender: BrokerSender[B], batch: B, index: int | None) -> None:
        """The broker stored the pack at ``index`` (None: sent oneway)."""

    def refused(self, sender: BrokerSender[B], batch: B, exc: BrokerError, size: int) -> None:
        """The broker refused the ``size``-byte pack for good (trying again would not help)."""

    def failed(self, sender: BrokerSender[B], exc: LuxunClientError) -> None:
        """A round trip failed (a broken connection or a retriable refusal); the broker is
        now backed off for ``sender.backoff_s`` (doubled for the next time after this)."""

    def give_up(self, sender: BrokerSender[B], batch: B, exc: LuxunClientError) -> bool:
        """After a failed attempt (``batch.attempts`` counts it): True when the owner settled
        the batch as not delivered; False to try again."""

    def reroute(self, sender: BrokerSender[B], batches: list[B]) -> None:
        """Route ``batches`` again (``failover`` senders, after a broken connection)."""

    def abandoned(self, sender: BrokerSender[B], batch: B) -> None:
        """The sender stopped with ``batch`` unsent (see :meth:`BrokerSender.finish`)."""


class BrokerSender(threading.Thread, Generic[B]):
    """Sends the batches put on it to one broker, in order, up to ``depth`` of them (and
    ``depth_bytes``) in one round trip; see the module's docstring for what becomes of a
    batch. ``oneway``: ``asyncProduce`` (no answers: a batch sent is delivered).

    ``queue``, ``in_flight``, ``down_until``, ``ok`` and ``failed`` may be read from any
    thread (``queue`` and ``down_until`` change under ``cond``)."""

    def __init__(self, owner: SendOwner[B], index: int, address: str, *, name: str, timeout_ms: int | None,
                 connect_timeout_ms: int | None = None, retry_backoff_s: float, max_backoff_s: float,
                 depth: int = 1, depth_bytes: int = 0, oneway: bool = False,
                 failover: bool = False) -> None:  # fmt: skip
        super().__init__(name=name, daemon=True)
        self.owner = owner
        self.index = index
        self.address = address
        self.conn = PipelinedConnection(address, timeout_ms=timeout_ms, connect_timeout_ms=connect_timeout_ms)
        self.cond = threading.Condition(threading.Lock())
        self.queue: deque[B] = deque()
        self.in_flight: list[B] = []
        self.down_until = 0.0
        self.retry_backoff_s = retry_backoff_s
        self.max_backoff_s = max_backoff_s
        self.backoff_s = retry_backoff_s
        self.depth = depth
        self.depth_bytes = depth_bytes
        self.oneway = oneway
        self.failover = failover
        self.ok = 0
        self.failed = 0
        self._poked = False
        self._stopping = False  # send what is queued, then end
        self._abandon = False  # end at once, the queue abandoned

    def put(self, batch: B) -> None:
        with self.cond:
            self.queue.append(batch)
            self.cond.notify()

    def put_first(self, batches: list[B]) -> None:
        """Put ``batches`` before everything queued (e.g. the halves of a refused pack)."""
        with self.cond:
            self.queue.extendleft(reversed(batches))
            self.cond.notify()

    def poke(self) -> None:
        """Make the sender ask its owner's :meth:`~SendOwner.poll` again now."""
        with self.cond:
            self._poked = True
            self.cond.notify()

    def finish(self, *, abandon: bool) -> None:
        """End the thread: once the queue is sent (no back-off waits any more), or at once
        (``abandon``: every queued batch goes to the owner's ``abandoned``)."""
        with self.cond:
            self._stopping = True
            self._abandon = self._abandon or abandon
            self.down_until = 0.0
            self.cond.notify_all()

    def reset_backoff(self) -> None:
        """The broker is up again as far as the owner knows (no wait, first back-off)."""
        with self.cond:
            self.down_until = 0.0
            self.backoff_s = self.retry_backoff_s

    def run(self) -> None:
        owner = self.owner
        while True:
            timer = owner.poll(self)
            leftovers: list[B] | None = None
            with self.cond:
                if self._abandon:
                    leftovers = list(self.queue)
                    self.queue.clear()
                else:
                    now = time.monotonic()
                    if self.queue and now >= self.down_until:
                        batches = [self.queue.popleft()]
                        size = batches[0].bytes
                        while self.queue and len(batches) < self.depth and size < self.depth_bytes:
                            batches.append(self.queue.popleft())
                            size += batches[-1].bytes
                        self.in_flight = batches
                    elif self._stopping and not self.queue:
                        return
                    else:
                        wait = max(0.001, self.down_until - now) if self.queue else 0.5
                        if timer is not None and timer < wait:
                            wait = timer
                        if not self._poked:
                            self.cond.wait(wait)
                        self._poked = False
                        continue
            if leftovers is not None:
                for b in leftovers:
                    owner.abandoned(self, b)
                return
            try:
                self._send(batches)
            finally:
                self.in_flight = []

    def _send(self, batches: list[B]) -> None:
        owner = self.owner
        oneway = self.oneway
        sizes: list[int] = []

        def calls() -> Iterator[list[bytes | bytearray]]:
            for b in batches:
                item = owner.pack(b)
                size = sum(map(len, item))
                sizes.append(size)
                yield produce_call_parts(item, size, b.topic, oneway=oneway)

        answers, broken = self.conn.produce_all(calls(), len(batches), oneway=oneway)
        owner.round_trip(self)
        retry: list[B] = []
        last_refusal: BrokerError | None = None
        for batch, size, answer in zip(batches, sizes, answers, strict=False):
            if answer is None:  # oneway
                self.ok += 1
                self.backoff_s = self.retry_backoff_s
                owner.delivered(self, batch, None)
                continue
            result = answer.result
            if result.resultCode == _SUCCESS:
                self.ok += 1
                self.backoff_s = self.retry_backoff_s
                owner.delivered(self, batch, answer.index)
                continue
            exc = broker_error(result.resultCode, result.errorCode, result.errorMessage)
            if exc.retriable and not isinstance(exc, MessageSizeTooLargeError):
                retry.append(batch)
                last_refusal = exc
            else:
                owner.refused(self, batch, exc, size)
        if broken is not None:  # the unanswered ones are tried again, before the queue
            self._failed(retry + batches[len(answers) :], broken, reroute=self.failover)
        elif retry:
            assert last_refusal is not None
            self._failed(retry, last_refusal, reroute=False)

    def _failed(self, batches: list[B], exc: LuxunClientError, *, reroute: bool) -> None:
        owner = self.owner
        self.failed += 1
        owner.failed(self, exc)
        with self.cond:
            self.down_until = time.monotonic() + self.backoff_s
            self.backoff_s = min(self.backoff_s * 2, self.max_backoff_s)
            moved = list(self.queue) if reroute else []
            if reroute:
                self.queue.clear()
        again: list[B] = []
        for batch in batches:
            batch.attempts += 1
            if not owner.give_up(self, batch, exc):
                again.append(batch)
        if reroute:
            if again or moved:
                owner.reroute(self, again + moved)
        elif again:
            with self.cond:
                self.queue.extendleft(reversed(again))


__all__ = ["Batch", "BrokerSender", "PipelinedConnection", "RateLimiter", "SendOwner", "pack_parts"]
