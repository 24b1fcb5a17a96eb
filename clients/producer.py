"""The high-level producer: batching, compression, partitioning, rate limits, futures.

``send(topic, value, key=None)`` puts the encoded message into an accumulator for the
(broker, topic) it is partitioned to and returns a :class:`concurrent.futures.Future`
(shared by the messages of one pack: they are sent, or dropped, together).
One sender thread per broker (the clients' one sender, :class:`clients.sender.BrokerSender`,
which the agent runs too) turns accumulated messages into message packs (one queue
item each, see :mod:`clients.messages`) when a batch is full (``batch_size`` messages
or ``batch_bytes``), old (``linger_ms``) or flushed, and sends them:

- sync mode (``producer.type=sync``): acknowledged ``produce``; the future resolves to
  the pack's index on the broker;
- async mode: oneway ``asyncProduce``; the future resolves to None once sent.

Compression per topic with two safeguards (from Dory): packs whose serialised
messages are below ``min_compress_bytes`` are not compressed, and a pack whose
compressed/original ratio is above ``max_compression_ratio`` is sent uncompressed.

Nothing is lost silently: a message refused by a per-topic rate limit, a buffer that
stayed full, a broker that stays down through every retry, or a close that timed out
fails its future with :class:`MessageDroppedError` and is counted per topic and reason
in :meth:`Producer.metrics`. Retries reconnect with bounded exponential back-off and
resend the same pack before any later one, so per-topic order is kept.

Thread-safety: ``send``, ``flush``, ``close`` and ``metrics`` may be called from any
thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .connection import parse_broker_list
from .errors import (
    BrokerError,
    BrokerUnavailableError,
    BufferFullError,
    ClientClosedError,
    LuxunClientError,
    MessageDroppedError,
)
from .messages import GZIP, NO_COMPRESSION, SNAPPY, get_serde
from .sender import Batch, BrokerSender, RateLimiter, pack_parts

log = logging.getLogger(__name__)

#: Drop reasons counted in the metrics.
DROP_RATE_LIMIT = "rate_limit"
DROP_BUFFER_FULL = "buffer_full"
DROP_BROKER_DOWN = "broker_down"
DROP_REJECTED = "rejected"
DROP_CLOSED = "closed"

Partitioner = Callable[[bytes | None, int], int]

_CODECS = {"none": NO_COMPRESSION, "0": NO_COMPRESSION, "gzip": GZIP, "1": GZIP, "snappy": SNAPPY, "2": SNAPPY}


def hash_partitioner(key: bytes | None, n: int) -> int:
    """Random broker without a key; a stable hash (crc32) of the key otherwise."""
    if key is None:
        return random.randrange(n)
    return zlib.crc32(key) % n


@dataclass(frozen=True)
class ProducerConfig:
    """Producer settings; units are in the names.

    :meth:`from_properties` accepts Java Luxun's producer property names.
    """

    brokers: tuple[str, ...] = ("127.0.0.1:9092",)
    #: True: acknowledged ``produce``; False: oneway ``asyncProduce``.
    sync: bool = True
    #: Messages per pack at most (``batch.size``).
    batch_size: int = 200
    #: Serialised message bytes per pack at most.
    batch_bytes: int = 512 * 1024
    #: How long a partial batch waits for more messages (``queue.time``), ms.
    linger_ms: int = 5
    #: Messages buffered in total before ``send`` blocks or raises (``queue.size``).
    buffer_messages: int = 100_000
    #: When the buffer is full: wait up to this long, then drop (0: raise at once).
    block_on_full_ms: int = 10_000
    #: Codec for compressed topics (``compression.codec``: 0 none, 1 gzip, 2 snappy).
    compression_codec: int = NO_COMPRESSION
    #: Topics to compress (``compressed.topics``); empty: all topics.
    compressed_topics: frozenset[str] = frozenset()
    #: Packs smaller than this are not compressed.
    min_compress_bytes: int = 1024
    #: A pack compressed worse than this ratio is sent uncompressed.
    max_compression_ratio: float = 0.9
    #: Per-topic rate limits: topic -> (max messages, per interval in ms).
    rate_limits: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: Resends of a pack after a broker failure (``num.retries``).
    num_retries: int = 3
    #: First back-off between retries, doubled each time up to ``max_backoff_ms``.
    retry_backoff_ms: int = 100
    max_backoff_ms: int = 5_000
    #: Socket timeout of a call, ms.
    request_timeout_ms: int = 30_000
    #: Value encoder: "bytes", "str", "json" or an object with ``encode``.
    serializer: Any = "bytes"
    #: ``partitioner(key, n_brokers) -> broker number``.
    partitioner: Partitioner = hash_partitioner

    def __post_init__(self) -> None:
        if not self.brokers:
            raise ValueError("at least one broker is needed")
        for name in ("batch_size", "batch_bytes", "buffer_messages"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("linger_ms", "block_on_full_ms", "num_retries", "retry_backoff_ms", "min_compress_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.compression_codec not in (NO_COMPRESSION, GZIP, SNAPPY):
            raise ValueError(f"compression_codec {self.compression_codec} is not 0 (none), 1 (gzip) or 2 (snappy)")
        for topic, (count, interval) in self.rate_limits.items():
            if count < 1 or interval < 1:
                raise ValueError(f"rate limit of {topic!r} must be >= 1 message per >= 1 ms, got {count}/{interval}")

    @classmethod
    def from_properties(cls, props: Mapping[str, str], **overrides: Any) -> ProducerConfig:
        """Build from Java Luxun producer properties (``broker.list``, ``producer.type``,
        ``batch.size``, ``queue.time``, ``queue.size``, ``compression.codec``,
        ``compressed.topics``, ``num.retries``, ...). Unknown keys are an error."""
        known: dict[str, tuple[str, Callable[[str], Any]]] = {
            "broker.list": ("brokers", lambda v: tuple(parse_broker_list(v))),
            "producer.type": ("sync", lambda v: _producer_type(v)),
            "batch.size": ("batch_size", int),
            "queue.time": ("linger_ms", int),
            "queue.size": ("buffer_messages", int),
            "compression.codec": ("compression_codec", lambda v: _codec(v)),
            "compressed.topics": ("compressed_topics", lambda v: frozenset(t.strip() for t in v.split(",") if t)),
            "num.retries": ("num_retries", int),
            "connect.timeout.ms": ("request_timeout_ms", int),
            "socket.timeout.ms": ("request_timeout_ms", int),
        }
        ignored = {"serializer.class", "partitioner.class", "zk.connect", "reconnect.interval", "max.message.size"}
        values: dict[str, Any] = {}
        for key, raw in props.items():
            if key in ignored:
                log.info("producer property %s is accepted but not used (use the Python argument instead)", key)
                continue
            if key not in known:
                raise ValueError(f"unknown producer property {key!r}; known: {', '.join(sorted(known))}")
            name, parse = known[key]
            try:
                values[name] = parse(raw)
            except ValueError as exc:
                raise ValueError(f"producer property {key}={raw!r}: {exc}") from exc
        values.update(overrides)
        return cls(**values)

    def with_(self, **changes: Any) -> ProducerConfig:
        """A copy with some settings changed."""
        return replace(self, **changes)


def _producer_type(value: str) -> bool:
    if value not in ("sync", "async"):
        raise ValueError("producer.type must be sync or async")
    return value == "sync"


def _codec(value: str) -> int:
    try:
        return _CODECS[value.strip().lower()]
    except KeyError:
        raise ValueError("compression.codec must be 0/none, 1/gzip or 2/snappy") from None


class _Batch(Batch):
    """Messages bound for one pack. They share one future: a pack is sent (and gets its
    index) or dropped as a whole, and one Future per message would cost more than the
    send itself. ``send`` appends to ``messages`` (under the producer's lock: a list append
    costs the caller less than writing the pack's bytes); the sender writes them into the
    batch when it first packs it."""

    __slots__ = ("future", "messages", "size")

    def __init__(self, topic: str) -> None:
        super().__init__(topic, time.monotonic())
        self.future: Future[int | None] = Future()
        self.messages: list[bytes] = []
        self.size = 0  # bytes of the messages


class Producer:
    """Sends messages to topics spread over brokers.

    Args:
        brokers: "host:port,..." (or ``id:host:port`` as in Luxun's ``broker.list``),
            a sequence of addresses, or None to take them from ``config``.
        config: a :class:`ProducerConfig`; keyword arguments override its fields.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, brokers: str | Sequence[str] | None = None, *, config: ProducerConfig | None = None,
                 **settings: Any) -> None:  # fmt: skip
        cfg = config or ProducerConfig()
        if brokers is not None:
            settings["brokers"] = tuple(parse_broker_list(brokers if isinstance(brokers, str) else list(brokers)))
        unknown = set(settings) - {f.name for f in fields(ProducerConfig)}
        if unknown:
            raise TypeError(f"unknown producer setting(s): {', '.join(sorted(unknown))}")
        self.config = cfg.with_(**settings) if settings else cfg
        self._serde = get_serde(self.config.serializer)
        self._cond = threading.Condition(threading.Lock())
        self._buffered = 0
        self._flushing = 0  # flush() calls waiting: a batch goes to its sender at once
        self._closing = False
        self._closed = False
        self._abandon = threading.Event()
        self._linger_s = self.config.linger_ms / 1000
        self._limits = {t: RateLimiter(n, ms) for t, (n, ms) in self.config.rate_limits.items()}
        self._sent: dict[str, int] = {}
        self._dropped: dict[tuple[str, str], int] = {}
        cfg = self.config
        #: per broker: topic -> the batch being filled
        self._open: list[dict[str, _Batch]] = [{} for _ in cfg.brokers]
        # One pack at a time per broker (depth 1): a failed pack is sent again before any
        # later one, to the same broker (a key's broker is fixed), so per-topic order is kept.
        self._senders = [self._sender(i, address) for i, address in enumerate(cfg.brokers)]
        for sender in self._senders:
            sender.start()

    def _sender(self, index: int, address: str) -> BrokerSender[_Batch]:
        cfg = self.config
        return BrokerSender(self, index, address, name=f"luxun-producer-{address}", timeout_ms=cfg.request_timeout_ms,
                            retry_backoff_s=cfg.retry_backoff_ms / 1000, max_backoff_s=cfg.max_backoff_ms / 1000,
                            oneway=not cfg.sync)  # fmt: skip

    # -- sending -----------------------------------------------------------------------
    def send(self, topic: str, value: Any, key: bytes | str | None = None) -> Future[int | None]:
        """Queue one message; return a future of the pack index (sync) or None (async).

        A message dropped at once (rate limit, buffer still full after
        ``block_on_full_ms``) gets a future failed with :class:`MessageDroppedError`.

        Raises:
            ClientClosedError: the producer is closed.
            BufferFullError: the buffer is full and ``block_on_full_ms`` is 0.
        """
        data = self._serde.encode(value)
        if isinstance(key, str):
            key = key.encode()
        with self._cond:
            outcome = self._enqueue(topic, data, key)
        if isinstance(outcome, Future):
            return outcome  # the future of the pack the message went into
        failed: Future[int | None] = Future()
        failed.set_exception(outcome)  # outside the lock: callbacks may call send()
        return failed

    def _enqueue(self, topic: str, data: bytes, key: bytes | None) -> Future[int | None] | Exception:
        cfg = self.config
        if self._closing:
            raise ClientClosedError("the producer is closed")
        limit = self._limits.get(topic)
        if limit is not None and not limit.allow(time.monotonic()):
            return self._count_drop(topic, 1, DROP_RATE_LIMIT, "over the topic's rate limit")
        if self._buffered >= cfg.buffer_messages:
            if cfg.block_on_full_ms == 0:
                raise BufferFullError(
                    f"producer buffer full ({cfg.buffer_messages} message{'' if cfg.buffer_messages == 1 else 's'})"
                )
            deadline = time.monotonic() + cfg.block_on_full_ms / 1000
            while self._buffered >= cfg.buffer_messages and not self._closing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return self._count_drop(topic, 1, DROP_BUFFER_FULL, "buffer stayed full")
                self._cond.wait(remaining)
            if self._closing:
                raise ClientClosedError("the producer is closed")
        n = len(self._senders)
        i = cfg.partitioner(key, n) % n if n > 1 else 0
        accumulating = self._open[i]
        batch = accumulating.get(topic)
        if batch is None:
            batch = accumulating[topic] = _Batch(topic)
            self._senders[i].poke()  # the sender now waits for the linger time
        batch.messages.append(data)
        batch.size += len(data)
        self._buffered += 1
        if len(batch.messages) >= cfg.batch_size or batch.size >= cfg.batch_bytes or self._flushing:
            del accumulating[topic]
            self._senders[i].put(batch)
        return batch.future

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything buffered now; wait until it is sent (or dropped).

        Returns False if ``timeout`` seconds passed first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flushing += 1
            try:
                self._close_open_batches()
                while self._buffered > 0:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return True
            finally:
                self._flushing -= 1

    def _close_open_batches(self) -> None:
        """Hand every batch being filled to its sender (lock held)."""
        for accumulating, sender in zip(self._open, self._senders, strict=True):
            for batch in accumulating.values():
                sender.put(batch)
            accumulating.clear()

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` seconds), then stop. Messages still unsent after the
        timeout are dropped with reason "closed" (counted, futures failed).
        Closing twice is fine."""
        if self._closed:
            return
        self.flush(timeout)
        with self._cond:
            self._closing = True
            self._close_open_batches()
            self._cond.notify_all()
        self._abandon.set()  # no more retries: each pack left is tried once
        for sender in self._senders:
            sender.finish(abandon=False)
        for sender in self._senders:
            sender.join(timeout if timeout is not None else None)
        leftovers: list[_Batch] = []
        with self._cond:
            for sender in self._senders:
                with sender.cond:
                    leftovers += sender.queue
                    sender.queue.clear()
            for batch in leftovers:
                self._buffered -= len(batch.messages)
            self._cond.notify_all()
        for batch in leftovers:
            self._drop(batch.topic, batch.future, len(batch.messages), DROP_CLOSED, "producer closed before sending")
        for sender in self._senders:
            sender.conn.close()
        self._closed = True

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- metrics -----------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        """``{"sent": {topic: messages}, "dropped": {topic: {reason: messages}}, "buffered": n}``."""
        with self._cond:
            dropped: dict[str, dict[str, int]] = {}
            for (topic, reason), n in self._dropped.items():
                dropped.setdefault(topic, {})[reason] = n
            return {"sent": dict(self._sent), "dropped": dropped, "buffered": self._buffered}

    # -- internals ---------------------------------------------------------------------
    # -- what the senders' outcomes mean (SendOwner) -------------------------------------
    def pack(self, batch: _Batch) -> list[bytes | bytearray]:
        if not batch.count:  # written once, on the sender's thread
            batch.extend(batch.messages)
        cfg = self.config
        codec = cfg.compression_codec
        if codec != NO_COMPRESSION and (not cfg.compressed_topics or batch.topic in cfg.compressed_topics):
            return pack_parts(batch, codec, cfg.min_compress_bytes, cfg.max_compression_ratio * 100)
        return pack_parts(batch, NO_COMPRESSION)

    def poll(self, sender: BrokerSender[_Batch]) -> float | None:
        """Hand the sender its batches that lingered ``linger_ms``; the time until the next."""
        linger_s = self._linger_s
        with self._cond:
            accumulating = self._open[sender.index]
            if not accumulating:
                return None
            now = time.monotonic()
            oldest = None
            for topic, batch in list(accumulating.items()):
                if now - batch.created >= linger_s:
                    del accumulating[topic]
                    sender.put(batch)
                elif oldest is None or batch.created < oldest:
                    oldest = batch.created
            return None if oldest is None else max(0.0, oldest + linger_s - now)

    def round_trip(self, sender: BrokerSender[_Batch]) -> None:
        pass

    def delivered(self, sender: BrokerSender[_Batch], batch: _Batch, index: int | None) -> None:
        self._count_sent(batch.topic, len(batch.messages))
        batch.future.set_result(index)
        self._settled(batch)

    def refused(self, sender: BrokerSender[_Batch], batch: _Batch, exc: BrokerError, size: int) -> None:
        self._drop(batch.topic, batch.future, len(batch.messages), DROP_REJECTED, str(exc))
        self._settled(batch)

    def failed(self, sender: BrokerSender[_Batch], exc: LuxunClientError) -> None:
        pass

    def give_up(self, sender: BrokerSender[_Batch], batch: _Batch, exc: LuxunClientError) -> bool:
        cfg = self.config
        if batch.attempts <= cfg.num_retries and not self._abandon.is_set():
            if isinstance(exc, BrokerUnavailableError):
                log.warning("broker %s failed (%s); retry %d of %d in %.2fs", sender.address, exc, batch.attempts,
                            cfg.num_retries, sender.down_until - time.monotonic())  # fmt: skip
            return False
        reason = DROP_BROKER_DOWN if isinstance(exc, BrokerUnavailableError) else DROP_REJECTED
        self._drop(batch.topic, batch.future, len(batch.messages), reason, str(exc))
        self._settled(batch)
        sender.reset_backoff()  # the back-off is per pack: the next one is sent at once
        return True

    def reroute(self, sender: BrokerSender[_Batch], batches: list[_Batch]) -> None:
        raise AssertionError("the producer's senders do not fail over")  # failover=False

    def abandoned(self, sender: BrokerSender[_Batch], batch: _Batch) -> None:
        raise AssertionError("the producer's senders are never abandoned")  # finish(abandon=False)

    def _settled(self, batch: _Batch) -> None:
        with self._cond:
            self._buffered -= len(batch.messages)
            self._cond.notify_all()

    def _count_sent(self, topic: str, n: int) -> None:
        with self._cond:
            self._sent[topic] = self._sent.get(topic, 0) + n

    def _count_drop(self, topic: str, n: int, reason: str, detail: str) -> MessageDroppedError:
        """Count ``n`` dropped messages (lock held); return the error for their futures."""
        key = (topic, reason)
        self._dropped[key] = self._dropped.get(key, 0) + n
        if reason != DROP_RATE_LIMIT:
            log.warning(
                "dropped %d %s for topic %r: %s (%s)", n, "message" if n == 1 else "messages", topic, reason, detail
            )
        return MessageDroppedError(topic, reason, detail)

    def _drop(self, topic: str, future: Future[int | None], count: int, reason: str, detail: str) -> None:
        with self._cond:
            error = self._count_drop(topic, count, reason, detail)
        future.set_exception(error)


__all__ = ["Producer", "ProducerConfig", "hash_partitioner"]
