"""Consumers: a simple request/response consumer and stream consumers for groups.

A topic index addresses a *pack* (one producer batch), not a message. Every call that
reads by index returns the index to continue from (``next_index``), computed from the
pack indexes the broker reports, never from how many messages were decoded, so the
mistake behind Java Luxun's issue #10 (advancing by the message count) cannot happen.

Stream consumers (:class:`StreamConsumer`): one fetcher thread per (topic, broker)
consumes by group with long polls (``maxWaitMs``) into a bounded queue per topic; any
number of :class:`MessageStream` iterators, read from any threads, take messages from
it. The broker moves a group's position when it answers, so a fetched pack must
reach a stream: :meth:`StreamConsumer.close` stops fetching, waits for fetches in
flight, and the streams then hand out everything already fetched before they stop.

Thread-safety: :class:`SimpleConsumer` is for one thread; a :class:`StreamConsumer`
and its streams may be used from many.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from idl import luxun_thrift as T

from .connection import BrokerConnection, parse_broker_list
from .errors import (
    AllMessagesConsumedError,
    BrokerError,
    BrokerUnavailableError,
    ClientClosedError,
    ConsumerTimeoutError,
    TopicIsEmptyError,
    TopicNotExistError,
)
from .messages import decode_pack, get_serde

log = logging.getLogger(__name__)

DEFAULT_FETCH_BYTES = 1 << 20
EARLIEST = -1
LATEST = -2
_NOTHING_YET = (AllMessagesConsumedError, TopicIsEmptyError, TopicNotExistError)


@dataclass(frozen=True)
class Fetched:
    """What one consume call returned.

    Attributes:
        messages: decoded messages, in order.
        next_index: the pack index to read from next (by-index reads; None by group).
        packs: how many packs (queue items) the messages came from.
    """

    messages: list[Any]
    next_index: int | None
    packs: int


class SimpleConsumer:
    """Consumes from one broker by group or by index, decoding message packs.

    Args:
        broker: "host:port".
        decoder: "bytes", "str", "json" or an object with ``decode(bytes)``.
        raw: True to return queue items as they are (topics not written as packs).
        timeout_ms: socket timeout; long polls add their wait to it.
    """

    def __init__(self, broker: str, *, decoder: Any = "bytes", raw: bool = False, timeout_ms: int = 30_000) -> None:
        self.broker = parse_broker_list(broker)[0]
        self._serde = get_serde(decoder)
        self._raw = raw
        self._timeout_ms = timeout_ms
        self._conn = BrokerConnection(self.broker, timeout_ms=None)

    def consume(self, topic: str, group: str, *, max_bytes: int = DEFAULT_FETCH_BYTES, wait_ms: int = 0) -> Fetched:
        """The group's next packs (up to ``max_bytes``; at least one if any is left).
        Returns no messages when the group has read everything (after ``wait_ms``)."""
        return self._consume(T.ConsumeRequest(topic=topic, fanoutId=group, maxFetchSize=max_bytes,
                                              maxWaitMs=wait_ms or None), None)  # fmt: skip

    def consume_by_index(
        self, topic: str, index: int, *, max_bytes: int = DEFAULT_FETCH_BYTES, wait_ms: int = 0
    ) -> Fetched:
        """Packs from ``index`` on; ``next_index`` says where to continue."""
        return self._consume(T.ConsumeRequest(topic=topic, startIndex=index, maxFetchSize=max_bytes,
                                              maxWaitMs=wait_ms or None), index)  # fmt: skip

    def _consume(self, request: Any, index: int | None) -> Fetched:
        try:
            response = self._conn.checked("consume", request)
        except _NOTHING_YET:
            return Fetched([], index, 0)
        items = response.itemList or []
        next_index = None if index is None else (response.lastConsumedIndex + 1 if items else index)
        return Fetched(self._decode(items), next_index, len(items))

    def _decode(self, items: Sequence[bytes]) -> list[Any]:
        decode = self._serde.decode
        if self._raw:
            return [decode(item) for item in items]
        out: list[Any] = []
        for item in items:
            out.extend(map(decode, decode_pack(item)))
        return out

    def find_closest_index(self, topic: str, timestamp_ms: int) -> int:
        """The index closest to ``timestamp_ms``; ``EARLIEST`` (-1) is the tail,
        ``LATEST`` (-2) the head."""
        request = T.FindClosestIndexByTimeRequest(timestamp=timestamp_ms, topic=topic)
        return int(self._conn.checked("findClosestIndexByTime", request).index)

    def size(self, topic: str, group: str | None = None) -> int:
        """Packs retained in the topic, or left for ``group``."""
        return int(self._conn.checked("getSize", T.GetSizeRequest(topic=topic, fanoutId=group)).size)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> SimpleConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _TopicQueue:
    """Bounded FIFO of message chunks shared by one topic's streams."""

    def __init__(self, max_chunks: int) -> None:
        self.max_chunks = max_chunks
        self.chunks: deque[list[Any]] = deque()
        self.cond = threading.Condition(threading.Lock())
        self.finished = False

    def put(self, chunk: list[Any], stop: threading.Event) -> None:
        """Add a chunk; waits while full unless stopping (fetched data is never dropped)."""
        with self.cond:
            while len(self.chunks) >= self.max_chunks and not stop.is_set():
                self.cond.wait(0.1)
            self.chunks.append(chunk)
            self.cond.notify_all()


class MessageStream:
    """An iterator over one topic's messages for a group; many may share a topic.

    ``next()`` blocks until a message arrives, raises :class:`ConsumerTimeoutError`
    after ``consumer_timeout_ms`` without one (if set), and stops once the consumer is
    closed and every fetched message was handed out.
    """

    def __init__(self, topic: str, queue: _TopicQueue, timeout_ms: int | None) -> None:
        self.topic = topic
        self._queue = queue
        self._timeout_s = None if timeout_ms is None else timeout_ms / 1000
        self._current: Iterator[Any] = iter(())

    def __iter__(self) -> MessageStream:
        return self

    def __next__(self) -> Any:
        for message in self._current:
            return message
        q = self._queue
        deadline = None if self._timeout_s is None else time.monotonic() + self._timeout_s
        with q.cond:
            while not q.chunks:
                if q.finished:
                    raise StopIteration
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise ConsumerTimeoutError(f"no message on topic {self.topic!r} for {self._timeout_s}s")
                q.cond.wait(remaining)
            chunk = q.chunks.popleft()
            q.cond.notify_all()
        self._current = iter(chunk)
        return next(self._current)


class StreamConsumer:
    """Consumer-group streams over topics spread across brokers.

    Args:
        brokers: "host:port,..." (every broker the topics live on).
        group: the consumer group (fanout id); each message reaches one stream of it.
        decoder: "bytes", "str", "json" or an object with ``decode(bytes)``.
        queue_chunks: packs buffered per topic between fetchers and streams.
        fetch_bytes: ``maxFetchSize`` of each consume.
        wait_ms: long-poll wait of each consume.
        consumer_timeout_ms: streams raise ConsumerTimeoutError after this long
            without a message (None: wait forever).
    """

    def __init__(
        self,
        brokers: str | Sequence[str],
        group: str,
        *,
        decoder: Any = "bytes",
        raw: bool = False,
        queue_chunks: int = 64,
        fetch_bytes: int = DEFAULT_FETCH_BYTES,
        wait_ms: int = 1000,
        consumer_timeout_ms: int | None = None,
        retry_backoff_ms: int = 200,
    ) -> None:
        self.brokers = parse_broker_list(brokers if isinstance(brokers, str) else list(brokers))
        self.group = group
        self._serde = get_serde(decoder)
        self._raw = raw
        self._queue_chunks = queue_chunks
        self._fetch_bytes = fetch_bytes
        self._wait_ms = wait_ms
        self._timeout_ms = consumer_timeout_ms
        self._backoff_s = retry_backoff_ms / 1000
        self._stop = threading.Event()
        self._fetchers: list[threading.Thread] = []
        self._queues: dict[str, _TopicQueue] = {}
        self._closed = False

    def create_message_streams(self, topics: Mapping[str, int]) -> dict[str, list[MessageStream]]:
        """Start fetching ``{topic: number of streams}``; return the streams per topic."""
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        streams: dict[str, list[MessageStream]] = {}
        for topic, count in topics.items():
            if count < 1:
                raise ValueError(f"topic {topic!r} needs at least one stream, got {count}")
            if topic in self._queues:
                raise ValueError(f"streams for topic {topic!r} were created already")
            queue = self._queues[topic] = _TopicQueue(self._queue_chunks)
            streams[topic] = [MessageStream(topic, queue, self._timeout_ms) for _ in range(count)]
            for broker in self.brokers:
                thread = threading.Thread(
                    target=self._fetch, args=(topic, broker, queue), name=f"luxun-fetch-{topic}@{broker}", daemon=True
                )
                self._fetchers.append(thread)
                thread.start()
        return streams

    def _fetch(self, topic: str, broker: str, queue: _TopicQueue) -> None:
        conn = BrokerConnection(broker, timeout_ms=None)
        request = T.ConsumeRequest(topic=topic, fanoutId=self.group, maxFetchSize=self._fetch_bytes,
                                   maxWaitMs=self._wait_ms)  # fmt: skip
        decode = self._serde.decode
        try:
            while not self._stop.is_set():
                try:
                    response = conn.checked("consume", request)
                except _NOTHING_YET as exc:
                    if not isinstance(exc, AllMessagesConsumedError) or self._wait_ms <= 0:
                        self._stop.wait(min(self._wait_ms / 1000, 0.2) or 0.05)  # empty or unknown topic
                    continue
                except BrokerUnavailableError as exc:
                    log.warning("fetching %r from %s: %s; retrying", topic, broker, exc)
                    self._stop.wait(self._backoff_s)
                    continue
                except BrokerError as exc:
                    log.error("fetching %r from %s failed: %s", topic, broker, exc)
                    self._stop.wait(self._backoff_s)
                    continue
                for item in response.itemList or []:
                    if self._raw:
                        chunk = [decode(item)]
                    else:
                        try:
                            chunk = [decode(m) for m in decode_pack(item)]
                        except ValueError as exc:
                            log.error("skipping an undecodable pack on %r from %s: %s", topic, broker, exc)
                            continue
                    if chunk:
                        queue.put(chunk, self._stop)
        finally:
            conn.close()

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop fetching; messages already fetched are still handed out by the streams,
        which then stop. Closing twice is fine."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for thread in self._fetchers:
            thread.join(timeout)
        for queue in self._queues.values():
            with queue.cond:
                queue.finished = True
                queue.cond.notify_all()

    def __enter__(self) -> StreamConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create_message_streams(
    brokers: str | Sequence[str], topics: Mapping[str, int], *, group: str, **options: Any
) -> tuple[StreamConsumer, dict[str, list[MessageStream]]]:
    """Convenience: a :class:`StreamConsumer` and its streams in one call."""
    consumer = StreamConsumer(brokers, group, **options)
    return consumer, consumer.create_message_streams(topics)
