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

At-least-once groups (``StreamConsumer(..., auto_commit=False)``): the broker keeps
a *committed position* per (topic, group) and broker, and nothing moves it but a
commit. The consumer reads from it (``fromCommitted``), hands messages out, and
:meth:`StreamConsumer.commit` commits, per topic and broker, the position just after
the last message handed out to the application (Kafka's rule after ``poll``). A
*position* is a mapping ``{broker: Position(index, message)}`` ("host:port" to the
next message that broker's part of the topic is read from: message ``message`` of the
pack at ``index``). Commits name a message: a pack (one queue item, many messages)
handed out in part is committed at the message after the last one handed out
(``CommitOffsetRequest.message``), and a consumer that resumes there skips the pack's
committed messages itself (the broker says how many: ``ConsumeResponse.firstMessage``;
see docs/commits.md for why on the client). After a crash a new consumer of the group
starts at the first message after the last one committed, per broker: every message
is processed at least once, and the duplicates are only messages handed out after the
last commit. See :class:`StreamConsumer` for threads and members.

Thread-safety: :class:`SimpleConsumer` is for one thread; a :class:`StreamConsumer`
and its streams may be used from many.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from idl import luxun_thrift as T

from .connection import BrokerConnection, consume_request, parse_broker_list
from .errors import (
    AllMessagesConsumedError,
    BrokerError,
    BrokerUnavailableError,
    ClientClosedError,
    ConsumerTimeoutError,
    IndexOutOfBoundsError,
    TopicIsEmptyError,
    TopicNotExistError,
)
from .messages import decode_pack, get_serde
from .pack import pack_rest

log = logging.getLogger(__name__)

DEFAULT_FETCH_BYTES = 1 << 20
EARLIEST = -1
LATEST = -2
_NOTHING_YET = (AllMessagesConsumedError, TopicIsEmptyError, TopicNotExistError)
_NONE = object()


class Position(NamedTuple):
    """A message-exact position on one broker: the next message to read is message
    ``message`` (0-based) of the pack (queue item) at ``index``. Just after a whole
    pack is ``(index + 1, 0)``; a plain int ``i`` given where a position is expected
    means ``(i, 0)``. Positions compare as tuples (pack, then message)."""

    index: int  # type: ignore[assignment]  # shadows tuple.index: the name Message and the wire use
    message: int = 0


def as_position(value: int | tuple[int, int] | Position) -> Position:
    """``value`` as a :class:`Position` (an int is the start of that pack)."""
    if isinstance(value, tuple):
        index, message = value
        return Position(int(index), int(message))
    return Position(int(value), 0)


def after(index: int, offset: int, count: int) -> Position:
    """The position just after message ``offset`` of the pack at ``index`` holding
    ``count`` messages."""
    return Position(index + 1, 0) if offset + 1 >= count else Position(index, offset + 1)


class Message:
    """A message with where it came from (``StreamConsumer(with_metadata=True)``).

    Attributes:
        value: the decoded message.
        topic: its topic.
        broker: "host:port" of the broker it was read from.
        index: the index of its pack (queue item) on that broker.
        offset: its position in the pack (0-based).
        count: how many messages the pack holds.
    """

    __slots__ = ("broker", "count", "index", "offset", "topic", "value")

    def __init__(self, value: Any, topic: str, broker: str, index: int, offset: int, count: int) -> None:
        self.value = value
        self.topic = topic
        self.broker = broker
        self.index = index
        self.offset = offset
        self.count = count

    def _key(self) -> tuple[Any, ...]:
        return (self.value, self.topic, self.broker, self.index, self.offset, self.count)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash((self.topic, self.broker, self.index, self.offset))

    def __repr__(self) -> str:
        return (f"Message(value={self.value!r}, topic={self.topic!r}, broker={self.broker!r}, "
                f"index={self.index}, offset={self.offset}, count={self.count})")  # fmt: skip


@dataclass(frozen=True)
class Fetched:
    """What one consume call returned.

    Attributes:
        messages: decoded messages, in order.
        next_index: the pack index to read from next (by-index reads; None by group).
        packs: how many packs (queue items) the messages came from.
        start: where ``messages[0]`` is (:meth:`SimpleConsumer.consume_committed`;
            None elsewhere): its message position is over 0 when the first pack was
            committed in part and its committed messages were skipped.
    """

    messages: list[Any]
    next_index: int | None
    packs: int
    start: Position | None = None


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
        return self._consume(consume_request(topic, group=group, max_bytes=max_bytes, wait_ms=wait_ms), None)

    def consume_by_index(
        self, topic: str, index: int, *, max_bytes: int = DEFAULT_FETCH_BYTES, wait_ms: int = 0
    ) -> Fetched:
        """Packs from ``index`` on; ``next_index`` says where to continue."""
        return self._consume(consume_request(topic, index=index, max_bytes=max_bytes, wait_ms=wait_ms), index)

    def _consume(self, request: Any, index: int | None) -> Fetched:
        try:
            response = self._conn.checked("consume", request)
        except _NOTHING_YET:
            return Fetched([], index, 0)
        items = response.itemList or []
        next_index = None if index is None else (response.lastConsumedIndex + 1 if items else index)
        return Fetched(self._decode(items), next_index, len(items))

    def _decode(self, items: Sequence[bytes], skip: int = 0) -> list[Any]:
        """The messages of ``items``, without the first ``skip`` of the first one
        (committed; a raw item that is a pack is handed out as a pack of the rest)."""
        decode = self._serde.decode
        if self._raw:
            if skip and items:
                items = [_raw_rest(items[0], skip), *items[1:]]
            return [decode(item) for item in items]
        out: list[Any] = []
        for k, item in enumerate(items):
            messages = decode_pack(item)
            out.extend(map(decode, messages[skip:] if k == 0 and skip else messages))
        return out

    # -- committed positions (at-least-once groups; see the module docstring) -----------
    def commit(self, topic: str, group: str, index: int | tuple[int, int] | Position, message: int = 0) -> None:
        """Commit the position ``(index, message)`` (tail <= index <= head; the next
        message the group reads is message ``message`` of the pack at ``index``; a
        :class:`Position` may be given as ``index``) as the group's committed position
        on this broker. From then on the group is an at-least-once group:
        :meth:`consume` of it is refused, read it with :meth:`consume_committed`.
        Durable (survives a broker kill -9) once it returns."""
        position = as_position(index) if isinstance(index, tuple) else Position(index, message)
        request = T.CommitOffsetRequest(
            topic=topic, fanoutId=group, index=position.index, message=position.message or None
        )
        self._conn.checked("commitOffset", request)

    def committed(self, topic: str, group: str) -> Position | None:
        """The group's committed position on this broker, or None if it never committed."""
        response = self._conn.checked("getCommitted", T.GetCommittedRequest(topic=topic, fanoutId=group))
        return Position(int(response.index), int(response.message or 0)) if response.committed else None

    def consume_committed(
        self,
        topic: str,
        group: str,
        *,
        start: int | tuple[int, int] | Position | None = None,
        max_bytes: int = DEFAULT_FETCH_BYTES,
        wait_ms: int = 0,
    ) -> Fetched:
        """Messages of the group from its committed position (or from ``start``, a
        pack index or a :class:`Position`), moving no position: the messages of a pack
        committed in part before the position are skipped; ``start`` says where
        the messages begin and ``next_index`` where the packs end. A group that never
        committed reads from where it stands (a new group: the tail)."""
        begin = None if start is None else as_position(start)
        request = consume_request(
            topic,
            group=group,
            index=None if begin is None else begin.index,
            max_bytes=max_bytes,
            wait_ms=wait_ms,
            from_committed=True,
        )
        try:
            response = self._conn.checked("consume", request)
        except _NOTHING_YET:
            if begin is not None:
                return Fetched([], begin.index, 0, begin)
            got = self._conn.checked("getCommitted", T.GetCommittedRequest(topic=topic, fanoutId=group))
            return Fetched([], int(got.index), 0, Position(int(got.index), int(got.message or 0)))
        items = response.itemList or []
        first = response.lastConsumedIndex - len(items) + 1
        skip = (response.firstMessage or 0) if begin is None else begin.message if begin.index == first else 0
        return Fetched(self._decode(items, skip), response.lastConsumedIndex + 1, len(items), Position(first, skip))

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

    def __init__(self, max_chunks: int, cond: threading.Condition | None = None) -> None:
        self.max_chunks = max_chunks
        self.chunks: deque[Any] = deque()
        self.cond = cond or threading.Condition(threading.Lock())
        self.finished = False

    def put(self, chunk: Any, stop: threading.Event) -> None:
        """Add a chunk; waits while full unless stopping (fetched data is never dropped)."""
        with self.cond:
            while len(self.chunks) >= self.max_chunks and not stop.is_set():
                self.cond.wait(0.1)
            self.chunks.append(chunk)
            self.cond.notify_all()

    def take(self, timeout_s: float | None, topic: str, record: Callable[[Any], None] | None = None) -> Any:
        """The next chunk, waiting up to ``timeout_s`` (None: no limit) for one; with
        ``record``, ``record(chunk)`` runs under the queue's lock (so chunks are recorded
        in the order they are taken).

        Raises:
            StopIteration: the consumer closed and every chunk was taken.
            ConsumerTimeoutError: no chunk within ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.cond:
            while not self.chunks:
                if self.finished:
                    raise StopIteration
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise ConsumerTimeoutError(f"no message on topic {topic!r} for {timeout_s}s")
                self.cond.wait(remaining)
            chunk = self.chunks.popleft()
            if record is not None:
                record(chunk)
            self.cond.notify_all()
        return chunk


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
        self._current = iter(self._queue.take(self._timeout_s, self.topic))
        return next(self._current)

    def _poll(self, max_messages: int) -> list[Any]:
        """Up to ``max_messages`` messages without waiting."""
        out: list[Any] = []
        q = self._queue
        while len(out) < max_messages:
            for message in self._current:
                out.append(message)
                if len(out) == max_messages:
                    return out
            with q.cond:
                if not q.chunks:
                    break
                chunk = q.chunks.popleft()
                q.cond.notify_all()
            self._current = iter(chunk)
        return out


class _BrokerPosition:
    """What a topic's streams took from one broker (``auto_commit=False``).

    ``fetch_next`` is the index the fetcher reads next (None: from the committed
    position), ``fetch_skip`` the messages of that pack to skip (a seek inside a pack);
    ``high`` is just after the last pack taken by a stream (None: unknown until the
    first read); ``gen`` changes on a seek or a lost hold, and chunks of an older
    ``gen`` are dropped.
    """

    __slots__ = ("committed", "fetch_next", "fetch_skip", "gen", "high")

    def __init__(self) -> None:
        self.gen = 0
        self.fetch_next: int | None = None
        self.fetch_skip = 0
        self.high: Position | None = None
        self.committed: Position | None = None

    def reset(self, position: Position | None) -> None:
        self.gen += 1
        self.high = position
        self.fetch_next = None if position is None else position.index
        self.fetch_skip = 0 if position is None else position.message


class _Tracker:
    """The :class:`_BrokerPosition` of each broker of one topic and the streams that
    hand its messages out, under one lock."""

    def __init__(self, brokers: Sequence[str]) -> None:
        self.lock = threading.Lock()
        self.brokers = {broker: _BrokerPosition() for broker in brokers}
        self.streams: list[_TrackedStream] = []

    def position(self, broker: str) -> Position | None:
        """Just after the last message handed out from ``broker``: in the lowest pack
        a stream holds and has not handed out whole, the message after the last one it
        handed out; else just after the last pack taken. Called with the lock held."""
        state = self.brokers[broker]
        lowest: Position | None = None
        for stream in self.streams:
            chunk = stream._chunk
            if (
                chunk is not None
                and chunk[0] == broker
                and chunk[1] == state.gen
                and stream._next < len(chunk[3])
                and (lowest is None or chunk[2] < lowest.index)
            ):
                lowest = Position(chunk[2], stream._next)
        return state.high if lowest is None else lowest


class _TrackedStream(MessageStream):
    """A stream of an at-least-once consumer: its tracker sees what it hands out.

    A chunk is ``(broker, gen, pack index, values, skip)`` (``skip``: the pack's first
    messages, committed, not to hand out); taking one is recorded under the queue's
    and the tracker's locks, handing a message out only moves ``_next``.
    """

    def __init__(
        self, topic: str, queue: _TopicQueue, timeout_ms: int | None, tracker: _Tracker, metadata: bool
    ) -> None:
        super().__init__(topic, queue, timeout_ms)
        self._tracker = tracker
        self._metadata = metadata
        self._chunk: tuple[str, int, int, list[Any], int] | None = None
        self._state: _BrokerPosition | None = None
        self._next = 0
        with tracker.lock:
            tracker.streams.append(self)

    def __next__(self) -> Any:
        while True:
            message = self._hand_out()
            if message is not _NONE:
                return message
            self._wait_chunk()

    def _hand_out(self) -> Any:
        """The current chunk's next message, or _NONE (none left, or dropped by a
        seek or a lost hold)."""
        chunk = self._chunk
        if chunk is None:
            return _NONE
        values = chunk[3]
        i = self._next
        if i >= len(values) or self._state.gen != chunk[1]:  # type: ignore[union-attr]
            return _NONE
        self._next = i + 1
        if self._metadata:
            return Message(values[i], self.topic, chunk[0], chunk[2], i, len(values))
        return values[i]

    def _wait_chunk(self) -> None:
        """Take the next chunk of the topic's queue, waiting as :meth:`MessageStream.__next__`;
        taken and recorded under the queue's lock, so packs are recorded in order."""
        self._queue.take(self._timeout_s, self.topic, self._take)

    def _take(self, chunk: tuple[str, int, int, list[Any], int]) -> None:
        broker, gen, index, _, skip = chunk
        tracker = self._tracker
        with tracker.lock:
            state = tracker.brokers[broker]
            if state.gen != gen:
                return
            state.high = Position(index + 1, 0)
            self._chunk, self._state, self._next = chunk, state, skip

    def _poll(self, max_messages: int) -> list[Any]:
        """Up to ``max_messages`` messages without waiting."""
        out: list[Any] = []
        q = self._queue
        while len(out) < max_messages:
            message = self._hand_out()
            if message is not _NONE:
                out.append(message)
                continue
            with q.cond:
                if not q.chunks:
                    break
                self._take(q.chunks.popleft())
                q.cond.notify_all()
        return out


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
        auto_commit: True (the default, as Java Luxun): the broker moves the
            group's position when it hands packs out (at-most-once: a crash loses
            what was fetched and not processed). False: at-least-once, see below.
        with_metadata: True to hand out :class:`Message` objects (``.value`` and
            where it came from) instead of plain values.
        member_id: this member's id with ``auto_commit=False`` (default: random).

    With ``auto_commit=False`` the consumer reads each (topic, broker) from the
    group's committed position and never moves it but by :meth:`commit` (message by
    message, see the module docstring); :meth:`close` commits what was handed
    out unless ``close(commit=False)``. :meth:`commit` covers every message handed
    out, by any stream: with several stream threads, a message handed to another
    thread and not processed yet is covered too. Multi-threaded code that must
    commit only what it finished uses ``with_metadata=True`` and
    ``commit(messages)``: per topic and broker, it commits the position just after
    the last of the given messages (``Position(index, offset + 1)``, or the next
    pack's start after a pack's last message), trusting the caller that every earlier message of that
    (topic, broker) was processed, and never moves a commit backwards.

    Members: several consumers of one group (processes, machines) share its
    committed position. On each broker one member at a time reads a (topic, group):
    the first to ask holds it while it keeps fetching; the others wait (their
    fetches get nothing). When that member is killed or stops fetching for the
    broker's lease time (5 s; also when its buffer stays full because the
    application does not take messages), another member takes over from the
    committed position: the killed member's uncommitted messages reach a survivor
    within seconds, and a commit of the member that lost its hold is refused. A
    member that closes gives its hold up: another one takes over at once. A
    broker is the unit of parallelism (as a partition in Kafka): with several
    brokers, members share the brokers of a topic.
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
        auto_commit: bool = True,
        with_metadata: bool = False,
        member_id: str | None = None,
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
        self.auto_commit = auto_commit
        self.with_metadata = with_metadata
        self.member_id = member_id or uuid.uuid4().hex
        self._cond = threading.Condition(threading.Lock())  # shared by the topic queues (poll waits on it)
        self._trackers: dict[str, _Tracker] = {}
        self._poll_streams: dict[str, MessageStream] = {}
        self._admin: dict[str, BrokerConnection] = {}
        self._commit_lock = threading.Lock()

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
            queue = self._queues[topic] = _TopicQueue(self._queue_chunks, self._cond)
            if self.auto_commit:
                streams[topic] = [MessageStream(topic, queue, self._timeout_ms) for _ in range(count)]
                self._poll_streams[topic] = MessageStream(topic, queue, 0)
                fetch: Any = self._fetch
            else:
                tracker = self._trackers[topic] = _Tracker(self.brokers)
                meta = self.with_metadata
                streams[topic] = [_TrackedStream(topic, queue, self._timeout_ms, tracker, meta) for _ in range(count)]
                self._poll_streams[topic] = _TrackedStream(topic, queue, 0, tracker, meta)
                fetch = self._fetch_committed
            for broker in self.brokers:
                thread = threading.Thread(
                    target=fetch, args=(topic, broker, queue), name=f"luxun-fetch-{topic}@{broker}", daemon=True
                )
                self._fetchers.append(thread)
                thread.start()
        return streams

    def _fetch(self, topic: str, broker: str, queue: _TopicQueue) -> None:
        conn = BrokerConnection(broker, timeout_ms=None)
        request = consume_request(
            topic,
            group=self.group,
            max_bytes=self._fetch_bytes,
            wait_ms=self._wait_ms,
            with_timestamps=self.with_metadata,
        )
        decode = self._serde.decode
        try:
            while not self._stop.is_set():
                try:
                    response = self._consume(conn, request, topic, broker, _NOTHING_YET)
                except _NOTHING_YET as exc:
                    self._wait_for_more(exc)  # empty or unknown topic
                    continue
                if response is None:
                    continue
                for k, item in enumerate(response.itemList or []):
                    if self._raw:
                        chunk = [decode(item)]
                    else:
                        try:
                            chunk = [decode(m) for m in decode_pack(item)]
                        except ValueError as exc:
                            log.error("skipping an undecodable pack on %r from %s: %s", topic, broker, exc)
                            continue
                    if chunk:
                        if self.with_metadata:
                            index, n = response.firstIndex + k, len(chunk)
                            chunk = [Message(v, topic, broker, index, i, n) for i, v in enumerate(chunk)]
                        queue.put(chunk, self._stop)
        finally:
            conn.close()

    # -- at-least-once groups (auto_commit=False) ----------------------------------------
    def _fetch_committed(self, topic: str, broker: str, queue: _TopicQueue) -> None:
        """The fetcher of an at-least-once consumer: reads (topic, broker) by index
        from the group's committed position, as the group's member ``member_id``."""
        conn = BrokerConnection(broker, timeout_ms=None)
        request = consume_request(
            topic,
            group=self.group,
            max_bytes=self._fetch_bytes,
            wait_ms=self._wait_ms,
            from_committed=True,
            member_id=self.member_id,
        )
        tracker = self._trackers[topic]
        state = tracker.brokers[broker]
        decode = self._serde.decode
        try:
            while not self._stop.is_set():
                with tracker.lock:
                    gen = state.gen
                    request.startIndex = state.fetch_next
                    skip = state.fetch_skip
                try:
                    response = self._consume(conn, request, topic, broker, (*_NOTHING_YET, IndexOutOfBoundsError))
                except _NOTHING_YET as exc:
                    if getattr(exc.response, "heldBy", None):  # another member holds the group
                        with tracker.lock:
                            if state.gen == gen and state.fetch_next is not None:
                                log.warning("%s; reading %r from %s again from the committed position once it can",
                                            exc, topic, broker)  # fmt: skip
                                state.reset(None)
                    self._wait_for_more(exc)
                    continue
                except IndexOutOfBoundsError as exc:  # retention removed what we were to read
                    log.warning("fetching %r from %s: %s; reading from the committed position", topic, broker, exc)
                    with tracker.lock:
                        if state.gen == gen:
                            state.reset(None)
                    continue
                if response is None:
                    continue
                items = response.itemList or []
                first = response.lastConsumedIndex - len(items) + 1
                with tracker.lock:
                    if state.gen != gen:
                        continue  # a seek meanwhile
                    if state.fetch_next is None:  # read from the committed position: where we stand
                        skip = response.firstMessage or 0  # the first pack's committed messages
                        state.high = Position(first, skip)
                    elif state.fetch_next != first:
                        skip = 0
                    state.fetch_next = response.lastConsumedIndex + 1
                    state.fetch_skip = 0
                for k, item in enumerate(items):
                    index = first + k
                    if self._raw:
                        values = [decode(_raw_rest(item, skip) if k == 0 and skip else item)]
                        chunk_skip = 0
                    else:
                        try:
                            values = [decode(m) for m in decode_pack(item)]
                        except ValueError as exc:
                            log.error("skipping an undecodable pack %d on %r from %s: %s", index, topic, broker, exc)
                            values = []
                        chunk_skip = skip if k == 0 else 0
                    queue.put((broker, gen, index, values, chunk_skip), self._stop)
        finally:
            conn.close()

    def _consume(
        self, conn: BrokerConnection, request: Any, topic: str, broker: str, passed_on: tuple[type[BrokerError], ...]
    ) -> Any:
        """One ``consume`` of a fetch loop: its reply, or None after a failure waited out
        here (a broker gone: retried after the back-off; any other refusal but those in
        ``passed_on``, which are raised: logged, then the back-off)."""
        try:
            return conn.checked("consume", request)
        except passed_on:
            raise
        except BrokerUnavailableError as exc:
            log.warning("fetching %r from %s: %s; retrying", topic, broker, exc)
        except BrokerError as exc:
            log.error("fetching %r from %s failed: %s", topic, broker, exc)
        self._stop.wait(self._backoff_s)
        return None

    def _wait_for_more(self, exc: BrokerError) -> None:
        """After a consume that found nothing: a moment's pause, unless the broker's long
        poll (``wait_ms``) already waited."""
        if not isinstance(exc, AllMessagesConsumedError) or self._wait_ms <= 0:
            self._stop.wait(min(self._wait_ms / 1000, 0.2) or 0.05)

    def _tracker(self, topic: str) -> _Tracker:
        if self.auto_commit:
            raise ValueError("this StreamConsumer has auto_commit=True: the broker moves the group as it fetches; "
                             "commits, positions and seeks need StreamConsumer(..., auto_commit=False)")  # fmt: skip
        tracker = self._trackers.get(topic)
        if tracker is None:
            raise ValueError(f"topic {topic!r} is not consumed here (create_message_streams or subscribe first)")
        return tracker

    def _conn(self, broker: str) -> BrokerConnection:
        conn = self._admin.get(broker)
        if conn is None:
            conn = self._admin[broker] = BrokerConnection(broker, timeout_ms=30_000)
        return conn

    def commit(self, messages: Iterable[Message] | None = None) -> None:
        """Commit, per topic and broker, the position just after the last message
        handed out (or, given ``messages``, after the last of them; see the class
        docstring). Durable when it returns (the broker wrote it to its committed
        page). Raises the BrokerError of a refused commit (e.g. this member lost its
        hold on the group: its messages go to another member) after trying the others.
        """
        if self.auto_commit:
            self._tracker("")
        targets: dict[tuple[str, str], Position] = {}
        if messages is None:
            for topic, tracker in self._trackers.items():
                with tracker.lock:
                    for broker, state in tracker.brokers.items():
                        position = tracker.position(broker)
                        if position is not None and position != state.committed:
                            targets[topic, broker] = position
        else:
            last: dict[tuple[str, str], Message] = {}
            for m in messages:
                key = (m.topic, m.broker)
                seen = last.get(key)
                if seen is None or (m.index, m.offset) > (seen.index, seen.offset):
                    last[key] = m
            for (topic, broker), m in last.items():
                state = self._tracker(topic).brokers[broker]
                position = after(m.index, m.offset, m.count)
                if state.committed is None or position > state.committed:
                    targets[topic, broker] = position
        error: BaseException | None = None
        with self._commit_lock:
            for (topic, broker), position in targets.items():
                request = T.CommitOffsetRequest(topic=topic, fanoutId=self.group, index=position.index,
                                                message=position.message or None, memberId=self.member_id)  # fmt: skip
                try:
                    self._conn(broker).checked("commitOffset", request)
                except (BrokerError, BrokerUnavailableError) as exc:
                    error = error or exc
                    continue
                state = self._trackers[topic].brokers[broker]
                state.committed = position
        if error is not None:
            raise error

    def _release(self) -> None:
        """Give up this member's hold on its groups (best effort, at close): another
        member takes over at once instead of after the broker's lease time."""
        for topic in self._trackers:
            for broker in self.brokers:
                request = T.CommitOffsetRequest(topic=topic, fanoutId=self.group, index=-1, memberId=self.member_id,
                                                release=True)  # fmt: skip
                try:
                    self._conn(broker).checked("commitOffset", request)
                except (BrokerError, BrokerUnavailableError) as exc:
                    log.info("releasing group %r of %r on %s: %s", self.group, topic, broker, exc)

    def committed(self, topic: str) -> dict[str, Position | None]:
        """The group's committed position of ``topic``: ``{broker: Position}``, None
        for a broker where the group never committed."""
        out: dict[str, Position | None] = {}
        with self._commit_lock:
            for broker in self.brokers:
                response = self._conn(broker).checked(
                    "getCommitted", T.GetCommittedRequest(topic=topic, fanoutId=self.group)
                )
                out[broker] = Position(int(response.index), int(response.message or 0)) if response.committed else None
        return out

    def position(self, topic: str) -> dict[str, Position]:
        """Where :meth:`commit` would commit ``topic``: ``{broker: Position}``, just
        after the last message handed out; the committed position (or where the group
        would start) for a broker nothing was read from yet."""
        tracker = self._tracker(topic)
        with tracker.lock:
            known = {broker: tracker.position(broker) for broker in tracker.brokers}
        out: dict[str, Position] = {}
        for broker, position in known.items():
            if position is None:
                with self._commit_lock:
                    response = self._conn(broker).checked(
                        "getCommitted", T.GetCommittedRequest(topic=topic, fanoutId=self.group)
                    )
                position = Position(int(response.index), int(response.message or 0))
            out[broker] = position
        return out

    def seek(self, topic: str, position: Mapping[str, int | tuple[int, int] | Position]) -> None:
        """Read ``topic`` from ``position`` (``{broker: Position}``, or a pack index
        for the start of that pack; brokers left out are not moved): messages fetched
        and not handed out for those brokers are dropped, the next ones handed out
        start there. Commits nothing (:meth:`commit` does)."""
        tracker = self._tracker(topic)
        with tracker.lock:
            for broker, where in position.items():
                state = tracker.brokers.get(broker)
                if state is None:
                    raise ValueError(f"broker {broker!r} is not one of this consumer's {self.brokers}")
                state.reset(as_position(where))

    def subscribe(self, topics: Iterable[str]) -> None:
        """Start fetching ``topics`` for :meth:`poll` (one stream each, kept inside)."""
        self.create_message_streams(dict.fromkeys(topics, 1))

    def poll(self, timeout_ms: int = 0, max_messages: int = 500) -> list[Any]:
        """Up to ``max_messages`` messages of the consumed topics, waiting up to
        ``timeout_ms`` for the first one; [] when none came. Works after
        :meth:`subscribe` or :meth:`create_message_streams` (the streams share them)."""
        if not self._poll_streams:
            raise ValueError("nothing to poll: subscribe(topics) or create_message_streams first")
        deadline = time.monotonic() + timeout_ms / 1000
        streams = list(self._poll_streams.values())
        while True:
            out: list[Any] = []
            for stream in streams:
                out.extend(stream._poll(max_messages - len(out)))
                if len(out) >= max_messages:
                    return out
            if out:
                return out
            with self._cond:
                if any(s._queue.chunks for s in streams):
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0 or all(s._queue.finished for s in streams):
                    return out
                self._cond.wait(remaining)

    def close(self, timeout: float | None = 30.0, *, commit: bool = True) -> None:
        """Stop fetching; messages already fetched are still handed out by the streams,
        which then stop. Closing twice is fine.

        With ``auto_commit=False``: commits what was handed out (unless
        ``commit=False``), and drops what was fetched and not handed out (the
        group's next reader gets it from the committed position).
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for thread in self._fetchers:
            thread.join(timeout)
        try:
            if commit and not self.auto_commit and self._trackers:
                self.commit()
        finally:
            for queue in self._queues.values():
                with queue.cond:
                    queue.finished = True
                    if not self.auto_commit:
                        queue.chunks.clear()
                    queue.cond.notify_all()
            if not self.auto_commit:
                self._release()
            for conn in self._admin.values():
                conn.close()

    def __enter__(self) -> StreamConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _raw_rest(item: bytes, skip: int) -> bytes:
    """A raw reader's item whose first ``skip`` messages are committed: the rest as a
    pack, or the item whole when it is not a pack (a raw item is one message)."""
    try:
        return pack_rest(item, skip)
    except ValueError:
        return item


def create_message_streams(
    brokers: str | Sequence[str], topics: Mapping[str, int], *, group: str, **options: Any
) -> tuple[StreamConsumer, dict[str, list[MessageStream]]]:
    """Convenience: a :class:`StreamConsumer` and its streams in one call."""
    consumer = StreamConsumer(brokers, group, **options)
    return consumer, consumer.create_message_streams(topics)
