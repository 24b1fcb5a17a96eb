"""The high-level producer: batching, compression, partitioning, rate limits, futures.

``send(topic, value, key=None)`` puts the encoded message into an accumulator for the
(broker, topic) it is partitioned to and returns a :class:`concurrent.futures.Future`
(shared by the messages of one pack: they are sent, or dropped, together).
One sender thread per broker turns accumulated messages into message packs (one queue
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
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .connection import BrokerConnection, parse_broker_list
from .errors import (
    BrokerError,
    BrokerUnavailableError,
    BufferFullError,
    ClientClosedError,
    MessageDroppedError,
)
from .messages import GZIP, NO_COMPRESSION, SNAPPY, encode_pack, get_serde

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


class _Batch:
    """Messages bound for one pack. They share one future: a pack is sent (and gets its
    index) or dropped as a whole, and one Future per message would cost more than the
    send itself."""

    __slots__ = ("created", "future", "messages", "size", "topic")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.messages: list[bytes] = []
        self.future: Future[int | None] = Future()
        self.size = 0
        self.created = time.monotonic()


class _RateLimit:
    __slots__ = ("count", "interval_s", "limit", "window_start")

    def __init__(self, limit: int, interval_ms: int) -> None:
        self.limit = limit
        self.interval_s = interval_ms / 1000
        self.window_start = time.monotonic()
        self.count = 0

    def allow(self, now: float) -> bool:
        if now - self.window_start >= self.interval_s:
            self.window_start = now
            self.count = 0
        if self.count >= self.limit:
            return False
        self.count += 1
        return True


class _Sender(threading.Thread):
    """Owns one broker's accumulators and sends its packs in order."""

    def __init__(self, producer: Producer, address: str) -> None:
        super().__init__(name=f"luxun-producer-{address}", daemon=True)
        self.producer = producer
        self.address = address
        self.conn = BrokerConnection(address, timeout_ms=producer.config.request_timeout_ms)
        self.open: dict[str, _Batch] = {}  # topic -> batch being filled
        self.ready: deque[_Batch] = deque()  # full batches, in order
        self.in_flight = 0

    def run(self) -> None:
        p = self.producer
        cond = p._cond
        linger_s = p.config.linger_ms / 1000
        while True:
            with cond:
                while True:
                    now = time.monotonic()
                    for topic, batch in list(self.open.items()):
                        if p._flushing or p._closing or now - batch.created >= linger_s:
                            self.ready.append(batch)
                            del self.open[topic]
                    if self.ready:
                        batch = self.ready.popleft()
                        self.in_flight += 1
                        break
                    if p._closing:
                        return
                    oldest = min((b.created for b in self.open.values()), default=None)
                    cond.wait(None if oldest is None else max(0.0, oldest + linger_s - now))
            try:
                self._send(batch)
            finally:
                with cond:
                    self.in_flight -= 1
                    p._buffered -= len(batch.messages)
                    cond.notify_all()

    def _send(self, batch: _Batch) -> None:
        p = self.producer
        cfg = p.config
        payload = p._pack(batch.topic, batch.messages)
        backoff_s = cfg.retry_backoff_ms / 1000
        attempt = 0
        while True:
            try:
                if cfg.sync:
                    index = self.conn.produce(payload, batch.topic).index
                else:
                    self.conn.produce(payload, batch.topic, oneway=True)
                    index = None
                p._count_sent(batch.topic, len(batch.messages))
                batch.future.set_result(index)
                return
            except BrokerUnavailableError as exc:
                attempt += 1
                if attempt > cfg.num_retries or p._abandon.is_set():
                    p._drop(batch.topic, batch.future, len(batch.messages), DROP_BROKER_DOWN, str(exc))
                    return
                log.warning("broker %s failed (%s); retry %d of %d in %.2fs", self.address, exc, attempt,
                            cfg.num_retries, backoff_s)  # fmt: skip
                p._abandon.wait(backoff_s)
                backoff_s = min(backoff_s * 2, cfg.max_backoff_ms / 1000)
            except BrokerError as exc:
                if exc.retriable and attempt < cfg.num_retries:
                    attempt += 1
                    p._abandon.wait(backoff_s)
                    continue
                p._drop(batch.topic, batch.future, len(batch.messages), DROP_REJECTED, str(exc))
                return


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
        self._flushing = 0
        self._closing = False
        self._closed = False
        self._abandon = threading.Event()
        self._limits = {t: _RateLimit(n, ms) for t, (n, ms) in self.config.rate_limits.items()}
        self._sent: dict[str, int] = {}
        self._dropped: dict[tuple[str, str], int] = {}
        self._senders = [_Sender(self, address) for address in self.config.brokers]
        for sender in self._senders:
            sender.start()

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
                raise BufferFullError(f"producer buffer full ({cfg.buffer_messages} messages)")
            deadline = time.monotonic() + cfg.block_on_full_ms / 1000
            while self._buffered >= cfg.buffer_messages and not self._closing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return self._count_drop(topic, 1, DROP_BUFFER_FULL, "buffer stayed full")
                self._cond.wait(remaining)
            if self._closing:
                raise ClientClosedError("the producer is closed")
        n = len(self._senders)
        sender = self._senders[cfg.partitioner(key, n) % n if n > 1 else 0]
        batch = sender.open.get(topic)
        if batch is None:
            batch = sender.open[topic] = _Batch(topic)
            self._cond.notify_all()  # the sender now waits for the linger time
        batch.messages.append(data)
        batch.size += len(data)
        self._buffered += 1
        if len(batch.messages) >= cfg.batch_size or batch.size >= cfg.batch_bytes:
            sender.ready.append(batch)
            del sender.open[topic]
            self._cond.notify_all()
        return batch.future

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything buffered now; wait until it is sent (or dropped).

        Returns False if ``timeout`` seconds passed first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                while self._buffered > 0:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return True
            finally:
                self._flushing -= 1

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` seconds), then stop. Messages still unsent after the
        timeout are dropped with reason "closed" (counted, futures failed).
        Closing twice is fine."""
        if self._closed:
            return
        self.flush(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._abandon.set()
        for sender in self._senders:
            sender.join(timeout if timeout is not None else None)
        leftovers: list[_Batch] = []
        with self._cond:
            for sender in self._senders:
                leftovers += list(sender.ready) + list(sender.open.values())
                sender.ready.clear()
                sender.open.clear()
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
    def _pack(self, topic: str, messages: list[bytes]) -> bytes:
        cfg = self.config
        codec = cfg.compression_codec
        if codec != NO_COMPRESSION and (not cfg.compressed_topics or topic in cfg.compressed_topics):
            raw = encode_pack(messages, NO_COMPRESSION)
            if len(raw) < cfg.min_compress_bytes:
                return raw
            packed = encode_pack(messages, codec)
            if len(packed) > cfg.max_compression_ratio * len(raw):
                return raw
            return packed
        return encode_pack(messages, NO_COMPRESSION)

    def _count_sent(self, topic: str, n: int) -> None:
        with self._cond:
            self._sent[topic] = self._sent.get(topic, 0) + n

    def _count_drop(self, topic: str, n: int, reason: str, detail: str) -> MessageDroppedError:
        """Count ``n`` dropped messages (lock held); return the error for their futures."""
        key = (topic, reason)
        self._dropped[key] = self._dropped.get(key, 0) + n
        if reason != DROP_RATE_LIMIT:
            log.warning("dropped %d message(s) for topic %r: %s (%s)", n, topic, reason, detail)
        return MessageDroppedError(topic, reason, detail)

    def _drop(self, topic: str, future: Future[int | None], count: int, reason: str, detail: str) -> None:
        with self._cond:
            error = self._count_drop(topic, count, reason, detail)
        future.set_exception(error)


__all__ = ["Producer", "ProducerConfig", "hash_partitioner"]
