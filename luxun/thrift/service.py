"""The QueueService handler: Java Luxun's semantics on our topics.

Every call answers with ``Result{resultCode, errorCode, errorMessage}``; nothing is
raised to Thrift. Result codes follow Java Luxun's LogManager:

============================  ==========  ======================
case                          resultCode  errorCode
============================  ==========  ======================
unknown topic                 FAILURE     TOPIC_NOT_EXIST
topic without items           FAILURE     TOPIC_IS_EMPTY
group or index at the end     TRY_LATER   ALL_MESSAGE_CONSUMED
index outside [tail, head)    FAILURE     INDEX_OUT_OF_BOUNDS
bad topic name                FAILURE     INVALID_TOPIC
bad group (fanout id) name    FAILURE     INTERNAL_ERROR ("invalid fanout identifier", as Java)
item over max.message.size    FAILURE     MESSAGE_SIZE_TOO_LARGE
wrong deleteTopic password    FAILURE     AUTHENTICATION_FAILURE
anything else (disk full...)  FAILURE     INTERNAL_ERROR
============================  ==========  ======================

Produce to an unknown topic creates it, unless ``auto.create.topics.enable`` is false
(then TOPIC_NOT_EXIST) or the broker holds ``max.topics`` topics (then INTERNAL_ERROR,
the message naming the limit: the IDL has no better code).

Order across connections, as Java Luxun's: it handles every connection's calls in one
thread in the order they came, so its own tests (LazyInitProducerTest) send a oneway
``asyncProduce`` on one connection and at once consume on another. Here each connection
has its thread, so a consume whose answer input received before it could extend (no
topic: TOPIC_NOT_EXIST; nothing to read: TOPIC_IS_EMPTY, ALL_MESSAGE_CONSUMED; a fetch
that read up to the head) is answered only after the input that other connections held
when it came has been handled (``TcpServer.await_earlier_input``; at most
``ORDER_WAIT_S``, 0.5 s), then read again. A one-item read that finds its item (the
fast path) cannot change so and never waits; nor does a broker where no other
connection holds input (the check is an ``epoll_wait`` that returns at once); a long
poll (``maxWaitMs``) is woken by the produce anyway. A topic being created is waited for.

Error replies of consume leave ``itemList`` unset, as Java Luxun's do (its
``LogManager.consume`` sets it only on SUCCESS: Java clients that read ``getItemList()``
of a TOPIC_NOT_EXIST reply get a NullPointerException from either broker); replies are
compared byte for byte with the Java broker's in ``tests/broker/test_java_replies.py``,
whose table lists every difference. Fixed flaws of the original: a first item larger
than ``maxFetchSize`` is returned anyway (a group can never get stuck); an invalid
topic name is INVALID_TOPIC for every call (Java: TOPIC_NOT_EXIST unless it creates the
topic); a refused produce creates no topic; ``getSize`` of an unknown group does not
create it; payloads are never logged. A call without its request struct: produce and
consume raise (the server answers TApplicationException INTERNAL_ERROR), the others
answer INTERNAL_ERROR in their Result, both as Java Luxun.

Extensions: ``ConsumeRequest.maxWaitMs`` (field 5). With nothing to return, the call
waits up to that long for an item instead of answering at once; a produce to the
topic wakes it. ``ConsumeRequest.withTimestamps`` (field 6): the reply also carries
``timestampList`` (each item's append time, ms) and ``firstIndex`` (the first item's
index, by group too).

Extensions for at-least-once groups (committed positions): ``commitOffset`` stores a
group's committed index (the next index it reads; tail <= index <= head, else
FAILURE/INDEX_OUT_OF_BOUNDS) crash-safe beside its position
(``committed_<group>/page-0.dat``), and ``getCommitted`` reads it. A consume with
``fromCommitted`` (field 7) reads the group's items by index, from ``startIndex`` when
set (>= 0), else from the committed index (a group that never committed: from where
it stands, tail for a new group), and moves no position. How the two modes relate,
the one rule: **a group that has committed is an at-least-once group for good**:
consumes of it without ``fromCommitted`` (the auto-moving, at-most-once mode) are
refused with FAILURE/INTERNAL_ERROR naming the group, never mixed silently; a commit
also moves the group's position, so ``getSize``, lag and clean-up count from the
committed index; an at-most-once group that starts committing reads on from where it
stood. Going back means deleting the group (a new group name). Members: a consume
with ``fromCommitted`` and a ``memberId`` (field 8) leases the (topic, group) on this
broker to that member until it makes no such call for ``group_lease_s`` (5 s) or
gives it up (``commitOffset`` with ``release``, as a closing member does); other
members get TRY_LATER/ALL_MESSAGE_CONSUMED meanwhile, with the holder's id in
``ConsumeResponse.heldBy`` (field 6; clients act on it, never on the message), and a
commit carrying another member's id is refused. So one member at a time reads a (topic, group) per broker (a
broker is the unit of parallelism, as a partition in Kafka), and a killed member's
uncommitted items go to a surviving member, from the committed index, once its
lease runs out. A committed position may name a message inside an item
(``CommitOffsetRequest.message``, field 6: how many of the item's pack messages are
processed; over 0 needs an item at the index): it is stored beside the index in the
same write, ``getCommitted`` answers it (field 4), and a ``fromCommitted`` consume that
starts at the committed index says it in ``ConsumeResponse.firstMessage`` (field 7):
the reader skips those messages (items stay opaque here; see docs/commits.md). A
commit without the field names a whole item, as before.

Thread-safety: one handler serves every connection thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np

from bigarray import (
    ArrayClosedError,
    IndexOutOfRangeError,
    InvalidNameError,
    ItemTooLargeError,
)
from bigarray.fanout import CommittedGroupError
from idl import luxun_thrift as T

from ..errors import (
    AllMessageConsumed,
    AuthenticationFailure,
    IndexOutOfBounds,
    InternalError,
    InvalidTopic,
    LuxunError,
    MessageSizeTooLarge,
    TopicIsEmpty,
    TopicNotExist,
)
from ..logs import RateLimitedLog
from ..metrics import LATENCY_BUCKETS_S, Metrics
from ..partitions import KIND_KAFKA_BATCH
from ..records import HEADER_SIZE as BATCH_HEADER_SIZE
from ..records import MAGIC as BATCH_MAGIC
from ..records import MAGIC_OFFSET as BATCH_MAGIC_OFFSET
from ..records import BatchError, batch_to_pack
from ..topics import (
    Topic,
    TopicAutoCreateDisabledError,
    TopicLimitError,
    TopicManager,
    TopicStorageError,
    is_fd_exhaustion,
    validate_topic,
)
from .wire import ItemBlob

log = logging.getLogger(__name__)
#: Per-call error lines (a full disk, too many open files...): one per key per 10 s.
_limited = RateLimitedLog(log)

SUCCESS = T.ResultCode.SUCCESS
FAILURE = T.ResultCode.FAILURE
TRY_LATER = T.ResultCode.TRY_LATER
E = T.ErrorCode

#: Longest long-poll wait honoured, in ms (a client asking more gets this).
MAX_WAIT_MS = 60_000
#: Longest a consume waits for the input other connections held when it came (see the
#: module docstring, "Order across connections"), in s.
ORDER_WAIT_S = 0.5
#: Failed oneway produces are logged at most this often (they are all counted).
_WARN_EVERY_S = 10.0
#: A member's lease on a (topic, group) read from its committed position, in s.
GROUP_LEASE_S = 5.0

_OK = T.Result(resultCode=SUCCESS)
#: The ConsumeRequest fields QueueHandler.consume_single serves (others: the general path).
_SINGLE_FIELDS: Final = frozenset({"topic", "fanoutId", "startIndex", "maxFetchSize", "maxWaitMs"})

# Up to this many items, _may_hold_batches looks at each in Python (cheaper than numpy's set-up).
_SNIFF_IN_PYTHON: Final = 64


def _may_be_batch(item: bytes) -> bool:
    """Whether ``item`` could be a Kafka record batch: at least a batch header long, with 2
    (magic v2) at byte 16. Luxun packs never are (0 there)."""
    return len(item) >= BATCH_HEADER_SIZE and item[BATCH_MAGIC_OFFSET] == BATCH_MAGIC


def _may_hold_batches(items: ItemBlob) -> bool:
    """Whether an item of the blob could be a Kafka record batch: at least a batch
    header long, with 2 (magic v2) at byte 16. Luxun packs never are (0 there)."""
    lengths = items.lengths
    data = items.data
    if len(lengths) <= _SNIFF_IN_PYTHON:
        pos = 0
        for n in lengths.tolist():
            if n >= BATCH_HEADER_SIZE and data[pos + BATCH_MAGIC_OFFSET] == BATCH_MAGIC:
                return True
            pos += n
        return False
    starts = np.cumsum(lengths) - lengths
    at = starts[lengths >= BATCH_HEADER_SIZE] + BATCH_MAGIC_OFFSET
    return bool((np.frombuffer(data, dtype=np.uint8)[at] == BATCH_MAGIC).any())


class _GroupHeld(AllMessageConsumed):
    """A ``fromCommitted`` consume by a member while another member holds the group:
    TRY_LATER/ALL_MESSAGE_CONSUMED, with the holder in ``ConsumeResponse.heldBy``."""

    def __init__(self, name: str, group: str, holder: str, broker_id: int) -> None:
        super().__init__(name, fanout_id=group)
        self.holder = holder
        self.args = (
            f"group {group!r} of topic {name!r} is read by member {holder!r} on broker {broker_id}; "
            "try later (its lease runs out after it stops reading)",
        )


def _result(code: int, error: int, message: str) -> Any:
    return T.Result(resultCode=code, errorCode=error, errorMessage=message)


def _invalid_fanout(exc: InvalidNameError) -> Any:
    """An invalid group name: FAILURE/INTERNAL_ERROR starting with Java Luxun's text
    (bigqueue's IllegalArgumentException "invalid fanout identifier"), then why."""
    return InternalError(f"invalid fanout identifier: {exc}").to_result()


class QueueHandler:
    """Implements QueueService on a :class:`TopicManager`.

    Args:
        topics: the topic manager.
        broker_id: named in error messages, as Java Luxun does.
        max_message_size_bytes: largest item accepted by produce.
        password_check: ``password_check(given) -> bool`` for deleteTopic.
        metrics: where call counts, errors and latencies go.
    """

    def __init__(
        self,
        topics: TopicManager,
        *,
        broker_id: int,
        max_message_size_bytes: int,
        password_check: Any,
        metrics: Metrics,
    ) -> None:
        self.topics = topics
        self.broker_id = broker_id
        self.max_message_size = max_message_size_bytes
        self.password_check = password_check
        self.metrics = metrics
        self._last_async_warning = -_WARN_EVERY_S
        #: (topic, group) -> (member id, lease end on the monotonic clock); see commitOffset.
        self.group_lease_s = GROUP_LEASE_S
        self._leases: dict[tuple[str, str], tuple[str, float]] = {}
        self._leases_lock = threading.Lock()
        topics.add_delete_listener(self._forget_leases)
        #: ``await_earlier_input(timeout_s) -> bool``: wait until the input other
        #: connections held has been handled; True if there was any. The server sets it
        #: (TcpServer.await_earlier_input). In process: there never is any.
        self.await_earlier_input: Callable[[float], bool] = lambda timeout_s: False

    # -- produce -----------------------------------------------------------------------
    def produce(self, request: Any) -> Any:
        if request is None:  # no ProduceRequest at all: Java Luxun fails the call (see _no_request)
            raise self._no_request("produce", "ProduceRequest")
        result, index = self.produce_item(request.topic, request.item)
        return T.ProduceResponse(result=result, index=index)

    def asyncProduce(self, request: Any) -> None:
        if request is None:
            raise self._no_request("asyncProduce", "ProduceRequest")
        self.async_produce_many(request.topic, [request.item])

    def _no_request(self, call: str, struct: str) -> InternalError:
        """A call whose argument struct is missing: counted as INTERNAL_ERROR; the
        error is raised for produce and consume (the server answers a
        TApplicationException INTERNAL_ERROR, as Java Luxun does) and put in the
        Result of the other calls (as Java Luxun does too)."""
        self.metrics.observe(call, 0.0, E.INTERNAL_ERROR)
        return InternalError(f"{call} needs a {struct}; the call had none")

    def produce_item(self, name: str | None, item: bytes | bytearray | memoryview | None) -> tuple[Any, int]:
        """One acknowledged produce: ``(Result, index)``."""
        t0 = time.perf_counter()
        if item is None or name is None:
            result, index = InternalError("ProduceRequest needs both item and topic").to_result(), 0
        else:
            result, index = self._append(name, [item], "produce")
        self.metrics.observe("produce", time.perf_counter() - t0, result.errorCode)
        return result, index

    def in_place_calls(self) -> tuple[Any, ...]:
        """What the compiled loop (luxun._netloop) needs to serve the common calls itself,
        in C, without calling :meth:`produce_item` or :meth:`consume_single`: the open
        topics by name, the topic manager (its ``flush_count``), this handler (its
        ``max_message_size``), ``metrics.observe``, :meth:`_batches_as_packs`, what
        :func:`_may_be_batch` compares, and the metrics with their latency buckets (the C
        twin of ``Metrics.observe`` counts the calls there when their lock is free).

        It appends a produce's item there only when it is within ``max_message_size``, to
        an open topic, while ``flush_count`` is off, through bigarray's inlined append
        (``bigarray._fastpath``), then does what :meth:`TopicManager.append
        <luxun.topics.TopicManager.append>` does after an append (``used``, the topic's
        stats, waking its waiters) and observes the call as ``produce``; it reads a
        one-item consume's item there only from an open topic, by index or by group, when
        bigarray's fast read takes it, and then does what :meth:`consume_single` does
        after its read. Anything else comes here. Keep them in step."""
        return (
            self.topics.open_topics,
            self.topics,
            self,
            self.metrics.observe,
            self._batches_as_packs,
            BATCH_HEADER_SIZE,
            BATCH_MAGIC_OFFSET,
            BATCH_MAGIC,
            self.metrics,
            LATENCY_BUCKETS_S,
        )

    def async_produce_many(self, name: str | None, items: list[bytes | bytearray | memoryview | None]) -> None:
        """``len(items)`` consecutive oneway produces to one topic, appended with one
        ``enqueue_many`` (the server batches the asyncProduce frames it has already
        received). Each item is judged on its own, as if produced alone: an oversized
        one is refused and counted, the others are appended in order."""
        t0 = time.perf_counter()
        limit = self.max_message_size
        good = [item for item in items if item is not None and len(item) <= limit]
        refused = len(items) - len(good)
        if refused:
            first_bad = next(item for item in items if item is None or len(item) > limit)
            error = (
                InternalError("ProduceRequest needs both item and topic")
                if first_bad is None
                else MessageSizeTooLarge(name or "", len(first_bad), limit)
            ).to_result()
            self._warn_async(f"asyncProduce to topic {name!r}: {refused} item(s) refused: {error.errorMessage}")
            self.metrics.observe("asyncProduce", 0.0, error.errorCode, count=refused)
        if not good:
            return
        if name is None:
            result = InternalError("ProduceRequest needs both item and topic").to_result()
        else:
            result, _ = self._append(name, good, "asyncProduce")
            if result.errorCode == E.MESSAGE_SIZE_TOO_LARGE and len(good) > 1:
                # Some item is larger than this topic's data page (a topic made with
                # smaller pages): the batch was refused whole, so judge each alone.
                for item in good:
                    self.async_produce_many(name, [item])
                return
        if result.errorCode is not None:
            self._warn_async(f"asyncProduce of {len(good)} item(s) to topic {name!r} failed: {result.errorMessage}")
        n = len(good)
        self.metrics.observe("asyncProduce", (time.perf_counter() - t0) / n, result.errorCode, count=n)

    def _warn_async(self, message: str) -> None:
        """Log a failed oneway produce (nobody gets its Result), at most once per
        ``_WARN_EVERY_S``; every failure is counted in the metrics by error code."""
        now = time.monotonic()
        if now - self._last_async_warning >= _WARN_EVERY_S:
            self._last_async_warning = now
            log.warning("%s (oneway: the client is not told; similar failures are logged at most every %.0f s)",
                        message, _WARN_EVERY_S)  # fmt: skip

    def _append(self, name: str, items: Sequence[bytes | bytearray | memoryview], call: str) -> tuple[Any, int]:
        """Append ``items`` (each within the size limit unless alone) to topic ``name``
        through the topic manager's one append; its errors as Java Luxun's Results."""
        try:
            if len(items) == 1:
                size = len(items[0])
                if size > self.max_message_size:
                    return MessageSizeTooLarge(name, size, self.max_message_size).to_result(), 0
            return _OK, self.topics.append(name, items, call=call)[1]
        except InvalidNameError as exc:
            return InvalidTopic(name, str(exc)).to_result(), 0
        except ItemTooLargeError as exc:
            return MessageSizeTooLarge(name, exc.length, exc.limit).to_result(), 0
        except TopicAutoCreateDisabledError as exc:
            return _result(FAILURE, E.TOPIC_NOT_EXIST, f"{exc} (broker {self.broker_id})"), 0
        except TopicLimitError as exc:
            return InternalError(f"broker {self.broker_id}: {exc}").to_result(), 0
        except ArrayClosedError:
            return self._not_exist(name), 0
        except TopicStorageError as exc:  # logged by the topic manager
            return InternalError(f"broker {self.broker_id}: {exc}").to_result(), 0
        except Exception as exc:
            _limited.exception("append-" + call, "%s to topic %r failed", call, name)
            return self._internal(exc), 0

    def _not_exist(self, name: str) -> Any:
        return TopicNotExist(name, broker_id=self.broker_id).to_result()

    def _internal(self, exc: Exception) -> Any:
        return InternalError(f"internal error on broker {self.broker_id}: {exc}").to_result()

    # -- consume -----------------------------------------------------------------------
    def consume(self, request: Any) -> Any:
        """QueueService.consume with ``itemList`` a list of ``bytes``, or, when the
        request set ``itemsAsBlob``, ``itemBlob`` and ``itemLengths`` as ``bytes`` (for
        callers in process and thriftpy2's generic encoder)."""
        response = self.consume_for_wire(request)
        items = response.itemList
        if isinstance(items, ItemBlob):
            if items.as_blob:  # EXTENSION itemsAsBlob: the items in fields 8 and 9
                response.itemList = None
                response.itemBlob = bytes(items.data)
                response.itemLengths = items.lengths_field()
            else:
                response.itemList = items.to_list()
            items.release()
        return response

    def consume_for_wire(self, request: Any, views: bool = False) -> Any:
        """:meth:`consume` for :func:`luxun.thrift.wire.encode_consume_reply`: a fetch's
        ``itemList`` may be an :class:`~luxun.thrift.wire.ItemBlob` (lengths + one bytes
        object) instead of a list, which saves a ``bytes`` object per item (flagged
        ``as_blob`` when the request set ``itemsAsBlob``: sent as fields 8 and 9).

        ``views``: the blob's data may be a view of the storage page, not a copy
        (:meth:`bigarray.BigArray.read_range_view`); the caller must then call the
        blob's ``release()`` once the reply is sent."""
        t0 = time.perf_counter()
        if request is None:
            raise self._no_request("consume", "ConsumeRequest")
        try:
            response = self._consume_once(request, views=views)
            wait_ms = getattr(request, "maxWaitMs", None) or 0
            if wait_ms > 0 and response.result.errorCode in (
                E.ALL_MESSAGE_CONSUMED,
                E.TOPIC_IS_EMPTY,
                E.TOPIC_NOT_EXIST,
            ):
                self.topics.wait_for(request.topic, self._ready_check(request), min(wait_ms, MAX_WAIT_MS) / 1000)
                response = self._consume_once(request, views=views)
        except Exception as exc:
            if is_fd_exhaustion(exc):
                _limited.error("fd-limit", "consume from topic %r failed: %s", request.topic, exc)
            else:
                _limited.exception("consume", "consume from topic %r failed", request.topic)
            response = T.ConsumeResponse(result=self._internal(exc), lastConsumedIndex=0)
        self.metrics.observe("consume", time.perf_counter() - t0, response.result.errorCode)
        return response

    def consume_single(self, fields: dict[str, Any]) -> tuple[bytes, int] | None:
        """The common one-item ``consume`` without building request and response
        structs: ``(item, lastConsumedIndex)`` when the call succeeds at once (an open
        topic; by group, an item for the group; by index, ``startIndex`` in [tail,
        head)), else None, and nothing was read or moved: then :meth:`consume_for_wire`
        answers it (errors, long polls, fetches, the extensions).

        ``fields``: the request's fields as :func:`luxun.thrift.wire.parse_consume_call` gives
        them. The reply is :meth:`consume_for_wire`'s for the same call, byte for byte,
        and the call is counted in the same metrics.
        """
        if not fields.keys() <= _SINGLE_FIELDS or (fields.get("maxFetchSize") or 0) > 0:
            return None  # a fetch, or withTimestamps: the general path
        t0 = time.perf_counter()
        name = fields["topic"]
        topic = self.topics.get(name)
        if topic is None:
            return None
        queue = topic.queue
        group = fields.get("fanoutId")
        if group:
            try:
                item = queue.dequeue(group)
            except Exception:  # an invalid or committed group, a closed queue: nothing moved
                return None
            if item is None:
                return None
            last = 0
        else:
            last = fields.get("startIndex") or 0
            try:
                item = queue.get(last)
            except Exception:  # out of range, or closed: answered (or waited for) there
                return None
        if _may_be_batch(item):
            packs = self._batches_as_packs(name, queue, None if group else last, [item], group)
            assert isinstance(packs, list)  # a list in, a list out
            item = packs[0]
        stats = topic.stats
        stats.items_out += 1
        stats.bytes_out += len(item)
        self.metrics.observe("consume", time.perf_counter() - t0, None)
        return item, last

    def _ready_check(self, request: Any) -> Any:
        group = request.fanoutId
        start = request.startIndex or 0
        if group and request.fromCommitted:
            return self._committed_ready(request)

        def ready(topic: Topic | None) -> bool:
            if topic is None:
                return False
            if group:
                try:
                    return topic.queue.size(group) > 0
                except InvalidNameError:
                    return True  # answered at once (invalid fanout identifier)
            return topic.queue.head > start

        return ready

    def _consume_once(self, request: Any, retry: bool = True, views: bool = False, in_order: bool = True) -> Any:
        """One attempt at a consume; ``in_order``: an answer with nothing to read is given
        only after the input other connections held has been handled (see the module
        docstring), else read again."""
        name = request.topic
        group = request.fanoutId
        max_fetch = request.maxFetchSize or 0
        max_bytes = max_fetch if max_fetch > 0 else None  # None: one item
        with_times = bool(request.withTimestamps)
        as_blob = bool(getattr(request, "itemsAsBlob", None))
        last_index = first = 0
        skip = 0  # fromCommitted: committed messages of the first item (firstMessage)
        queue: Any = None

        def reply(result: Any, items: list[bytes] | ItemBlob | None = None) -> Any:
            # Error replies leave itemList unset, as Java Luxun's do.
            response = T.ConsumeResponse(result=result, itemList=items, lastConsumedIndex=last_index)
            if with_times:
                response.firstIndex = first
                response.timestampList = self._timestamps(queue, first, len(items)) if items else []
            if skip and items:
                response.firstMessage = skip
            if as_blob and items:  # EXTENSION: sent as itemBlob and itemLengths (see wire)
                response.itemList = blob = ItemBlob.of(items)
                blob.as_blob = True
            return response

        topic = self.topics.get(name)  # an open topic's name is valid: checked when it was made
        if topic is None:
            try:
                validate_topic(name)
            except InvalidNameError as exc:
                return reply(InvalidTopic(name, str(exc)).to_result())
        try:
            if topic is None:
                topic = self.topics.open(name)
            if topic is None and retry:
                topic = self._await_creation(name)
            if topic is None:
                return reply(self._not_exist(name))
            queue = topic.queue
            head = queue.head
            if queue.is_empty:
                if in_order and self._changed_in_order(queue, head, request):
                    return self._consume_once(request, retry, views, in_order=False)
                return reply(TopicIsEmpty(name, broker_id=self.broker_id).to_result())
            start = first = request.startIndex or 0
            items: list[bytes] | ItemBlob
            if group and request.fromCommitted:  # EXTENSION: by index from the committed position
                start, skip = self._committed_start(queue, name, group, request)
                first = start
                group = None
            if group:
                if max_bytes is None and not with_times:  # one item: the cheaper single-item path
                    item = queue.dequeue(group)
                    items = [] if item is None else [item]
                elif max_bytes is None:
                    first, items = queue.dequeue_indexed(group, max_items=1)
                else:  # the group moves past only what _read_packs returns
                    first, items = queue.dequeue_read(
                        group, lambda index: self._read_packs_in_order(name, queue, index, max_bytes, views), []
                    )
            elif start == queue.head:
                items = []
            else:
                if max_bytes is None:
                    items = [queue.get(start)]
                else:
                    items = self._read_packs_in_order(name, queue, start, max_bytes, views)
                last_index = start + len(items) - 1
            if not len(items):
                if in_order and self._changed_in_order(queue, head, request):
                    return self._consume_once(request, retry, views, in_order=False)
                return reply(AllMessageConsumed(name, fanout_id=group, index=None if group else start).to_result())
            if max_bytes is None:  # one item, maybe a Kafka batch: a pack (the group's dequeue does not say where)
                items = self._batches_as_packs(name, queue, None if group and not with_times else first, items, group)
            stats = topic.stats
            stats.items_out += len(items)
            stats.bytes_out += items.nbytes if isinstance(items, ItemBlob) else sum(map(len, items))
            return reply(_OK, items)
        except InvalidNameError as exc:  # the group's name: the topic's was checked above
            return reply(_invalid_fanout(exc))
        except _GroupHeld as exc:  # from _committed_start: the holder in its own field
            response = reply(exc.to_result())
            response.heldBy = exc.holder
            return response
        except LuxunError as exc:
            return reply(exc.to_result())
        except CommittedGroupError:
            return reply(self._committed_group(name, group))
        except IndexOutOfRangeError as exc:
            if retry and queue is not None and queue.closed:
                return self._consume_once(request, retry=False)
            return reply(IndexOutOfBounds(name, exc.index, exc.tail, exc.head).to_result())
        except ArrayClosedError:
            if retry:  # closed to make room (nothing was read or moved): once more, reopened
                return self._consume_once(request, retry=False)
            return reply(self._not_exist(name))

    def _read_packs_in_order(
        self, name: str, queue: Any, start: int, max_bytes: int, views: bool
    ) -> list[bytes] | ItemBlob:
        """:meth:`_read_packs`, read again once other connections' earlier input is in if
        the read took everything up to the head (that input could extend it; see the
        module docstring). Under a group's lock when a group reads."""
        head = queue.head
        items = self._read_packs(name, queue, start, max_bytes, views)
        if start + len(items) >= head and self._changed_in_order(queue, head, None):
            if isinstance(items, ItemBlob):
                items.release()
            items = self._read_packs(name, queue, start, max_bytes, views)
        return items

    def _changed_in_order(self, queue: Any, head: int, request: Any) -> bool:
        """Whether a read that found nothing more than up to ``head`` must be done again:
        True if other connections held input when asked (waited for, at most
        ``ORDER_WAIT_S``) or the topic grew since ``head`` was read (input received
        before may have been handled meanwhile). A long poll (``request.maxWaitMs``)
        does not ask: a produce wakes it anyway."""
        if request is not None and (request.maxWaitMs or 0) > 0:
            return False
        waited = self.await_earlier_input(ORDER_WAIT_S)
        try:
            return waited or queue.head != head
        except ArrayClosedError:
            return True

    def _read_packs(self, name: str, queue: Any, start: int, max_bytes: int, views: bool) -> list[bytes] | ItemBlob:
        """Items from ``start`` on, about ``max_bytes``, as a Thrift consumer gets them:
        Kafka batches made packs, one by one, until the packs pass ``max_bytes`` (a pack
        can be many times its stored batch); the item that passes it is left for the next
        read, unless it is the first. So a reply holds at most ``max_bytes`` or one item."""
        read = ItemBlob(*(queue.read_range_view if views else queue.read_range_blob)(start, max_bytes=max_bytes))
        try:
            items = self._batches_as_packs(name, queue, start, read, None, max_bytes)
        except BaseException:
            read.release()
            raise
        if items is not read:  # the packs are copies: let the view go
            read.release()
        return items

    def _batches_as_packs(
        self,
        name: str,
        queue: Any,
        first: int | None,
        items: list[bytes] | ItemBlob,
        group: str | None,
        max_bytes: int | None = None,
    ) -> list[bytes] | ItemBlob:
        """What a Thrift consumer gets of Kafka record batches (items of kind
        ``KIND_KAFKA_BATCH``): each becomes one Luxun message pack of its records' values
        (:func:`luxun.records.batch_to_pack`); every other item passes untouched. With
        ``max_bytes``, the items that follow the first whose packs pass it are left out.

        ``items`` start at index ``first`` (None: one item taken by a group's dequeue).
        Only an item whose byte 16 is 2 (a batch's magic; a Luxun pack has 0 there) can
        be a batch, and only then are kinds read from the index: a plain topic's reply
        costs that look (0.2 us for one item, 4 us for 64, one numpy pass beyond) and
        keeps its blob.
        """
        if isinstance(items, ItemBlob):
            assert first is not None
            if not _may_hold_batches(items):
                return items
            try:
                kinds = queue.offset_fields(first, len(items))[1]
            except (IndexOutOfRangeError, ArrayClosedError):  # retention or a close since the read (rare)
                return items  # as read: the group has moved past them already
            if not kinds.any():
                return items
            out = items.to_list()
            total = 0
            for k, kind in enumerate(kinds.tolist()):
                if kind == KIND_KAFKA_BATCH:
                    out[k] = self._batch_as_pack(name, first + k, out[k])
                total += len(out[k])
                if max_bytes is not None and total > max_bytes and k:
                    return out[:k]
            return out
        item = items[0]  # the list paths read one item
        if not _may_be_batch(item):
            return items
        if first is None:  # where the group's dequeue read it: just behind the group, unless another
            assert group is not None  # consumer of the group took an item since; then judge by content
            try:
                index = queue.group_index(group) - 1
                first = index if queue.get(index) == item else None
            except (IndexOutOfRangeError, ArrayClosedError):
                first = None
        if first is not None:
            try:
                if queue.item_kind(first) != KIND_KAFKA_BATCH:
                    return items
            except (IndexOutOfRangeError, ArrayClosedError):
                first = None
        return [self._batch_as_pack(name, first, item)]

    def _batch_as_pack(self, name: str, index: int | None, item: bytes) -> bytes:
        """One stored Kafka batch as a Luxun pack; a batch that does not read (corrupt,
        or over batch_to_pack's size limit) is handed over as stored, and logged."""
        try:
            return batch_to_pack(item)
        except BatchError as exc:
            if index is not None:
                _limited.error(
                    "kafka-batch",
                    "topic %r item %d: Kafka batch sent to a Thrift consumer as stored: %s",
                    name,
                    index,
                    exc,
                )
            return item

    def _await_creation(self, name: str) -> Topic | None:
        """The topic ``name`` once the input other connections held has been handled (at
        most ``ORDER_WAIT_S``); None if it still does not exist.

        Its first produce may have been sent, on another connection, before this consume:
        Java's async Producer connects for its first batch a few ms before its user's
        consumer connects, and each connection has its own thread. Answering
        TOPIC_NOT_EXIST only after what was received earlier is handled keeps "sent
        before, seen after" across connections; an idle broker answers at once.
        """
        self.await_earlier_input(ORDER_WAIT_S)  # then look again: it may have come meanwhile
        return self.topics.get(name) or self.topics.open(name)

    @staticmethod
    def _timestamps(queue: Any, first: int, count: int) -> list[int]:
        """Append times of the items just read; 0 ("unknown") for all of them in the
        rare case retention removed their index page between the read and now."""
        try:
            return queue.timestamps(first, count)  # type: ignore[no-any-return]
        except (IndexOutOfRangeError, ArrayClosedError):
            return [0] * count

    # -- the rest ----------------------------------------------------------------------
    def findClosestIndexByTime(self, request: Any) -> Any:
        if request is None:
            error = self._no_request("findClosestIndexByTime", "FindClosestIndexByTimeRequest")
            return T.FindClosestIndexByTimeResponse(result=error.to_result(), index=0, timestampOfIndex=0)
        t0 = time.perf_counter()
        name = request.topic
        timestamp = request.timestamp
        index = ts = 0
        try:
            validate_topic(name)
            topic = self.topics.get(name) or self.topics.open(name)
            if topic is None:
                result = self._not_exist(name)
            else:
                queue = topic.queue
                if timestamp == T.EARLIEST_TIME:
                    index = queue.tail
                    ts = queue.timestamp(index) if not queue.is_empty else 0
                    result = _OK
                elif timestamp == T.LATEST_TIME:
                    index = queue.head
                    ts = queue.timestamp(index - 1) if not queue.is_empty else 0
                    result = _OK
                elif queue.is_empty:
                    result = TopicIsEmpty(name, broker_id=self.broker_id).to_result()
                else:
                    index = queue.find_closest_index(timestamp)
                    ts = queue.timestamp(index)
                    result = _OK
        except InvalidNameError as exc:
            result = InvalidTopic(name, str(exc)).to_result()
        except (ArrayClosedError, IndexOutOfRangeError):
            result = (
                self._not_exist(name)
                if name not in self.topics.names()
                else _result(TRY_LATER, E.INDEX_OUT_OF_BOUNDS, f"topic {name!r} changed during the lookup, try again")
            )
            index = ts = 0
        except Exception as exc:
            _limited.exception("findClosestIndexByTime", "findClosestIndexByTime on topic %r failed", name)
            result = self._internal(exc)
        self.metrics.observe("findClosestIndexByTime", time.perf_counter() - t0, result.errorCode)
        return T.FindClosestIndexByTimeResponse(result=result, index=index, timestampOfIndex=ts)

    def deleteTopic(self, request: Any) -> Any:
        if request is None:
            return T.DeleteTopicResponse(result=self._no_request("deleteTopic", "DeleteTopicRequest").to_result())
        t0 = time.perf_counter()
        name = request.topic
        try:
            if not self.password_check(request.password or ""):
                log.warning("deleteTopic of %r refused: authentication failed", name)
                result = AuthenticationFailure(name, "authentication failed").to_result()
            else:
                validate_topic(name)
                self.topics.delete(name)  # with its Kafka partitions, whichever door made them
                result = _OK
        except InvalidNameError as exc:
            result = InvalidTopic(name, str(exc)).to_result()
        except PermissionError as exc:  # the password check's "no password: deletion is disabled"
            result = AuthenticationFailure(name, str(exc)).to_result()
        except Exception as exc:
            _limited.exception("deleteTopic", "deleteTopic of %r failed", name)
            result = self._internal(exc)
        self.metrics.observe("deleteTopic", time.perf_counter() - t0, result.errorCode)
        return T.DeleteTopicResponse(result=result)

    def getSize(self, request: Any) -> Any:
        if request is None:
            return T.GetSizeResponse(result=self._no_request("getSize", "GetSizeRequest").to_result(), size=0)
        t0 = time.perf_counter()
        name = request.topic
        group = request.fanoutId
        size = 0

        def read(topic: Topic) -> Any:
            nonlocal size
            size = topic.queue.size(group) if group else topic.queue.size()
            return _OK

        result = self._answer_on_topic("getSize", name, read, t0)
        return T.GetSizeResponse(result=result, size=size)

    # -- extensions for tools (listTopics) ---------------------------------------------
    def listTopics(self, request: Any) -> Any:
        """Every topic with its size, indexes, disk use and group lag (EXTENSION)."""
        t0 = time.perf_counter()
        infos = []
        try:
            for topic in self.topics.views():  # closed topics too, without opening them
                queue = topic.queue
                try:
                    lag = {group: queue.size(group) for group in queue.groups()}
                    info = T.TopicInfo(
                        name=topic.name,
                        size=queue.size(),
                        tailIndex=queue.tail,
                        headIndex=queue.head,
                        diskBytes=queue.allocated_size(),
                        groupLag=lag,
                    )
                except (ArrayClosedError, OSError):  # deleted (or closed) while we looked
                    continue
                infos.append(info)
            result = _OK
        except Exception as exc:
            log.exception("listTopics failed")
            result, infos = self._internal(exc), []
        self.metrics.observe("listTopics", time.perf_counter() - t0, result.errorCode)
        return T.ListTopicsResponse(result=result, topics=infos)

    # -- extensions: committed positions (at-least-once groups) -------------------------
    def commitOffset(self, request: Any) -> Any:
        """Commit a group's position (EXTENSION; see the module docstring)."""
        if request is None:
            return T.CommitOffsetResponse(result=self._no_request("commitOffset", "CommitOffsetRequest").to_result())
        t0 = time.perf_counter()
        name, group, index = request.topic, request.fanoutId, request.index
        message = request.message or 0

        def commit(topic: Topic) -> Any:
            holder = self._take_lease(name, group, request.memberId) if request.memberId else None
            if request.release and request.memberId and index == -1:  # release only
                if holder is None:
                    self._release_lease(name, group, request.memberId)
                return _OK
            if holder is not None:
                return InternalError(
                    f"commit of group {group!r} on topic {name!r} by member {request.memberId!r} refused: "
                    f"member {holder!r} holds the group on broker {self.broker_id} (this member's lease ran out)"
                ).to_result()
            if message < 0:
                return _result(
                    FAILURE,
                    E.INDEX_OUT_OF_BOUNDS,
                    f"commit of message {message} of index {index} for group {group!r} of topic {name!r} refused: "
                    f"a message position is 0 or more (broker {self.broker_id})",
                )
            try:
                topic.queue.commit(group, index, message=message)
            except IndexOutOfRangeError as exc:
                if message and index == topic.queue.head:  # a message inside the item at head: not there yet
                    return _result(
                        FAILURE,
                        E.INDEX_OUT_OF_BOUNDS,
                        f"commit of message {message} of index {index} for group {group!r} of topic {name!r} "
                        f"refused: no item at index {index} (head) on broker {self.broker_id}",
                    )
                return _result(
                    FAILURE,
                    E.INDEX_OUT_OF_BOUNDS,
                    f"commit of index {index} for group {group!r} of topic {name!r} refused: outside "
                    f"[tail, head] = [{exc.tail}, {exc.head - 1}] on broker {self.broker_id}",
                )
            if request.release and request.memberId:
                self._release_lease(name, group, request.memberId)
            return _OK

        result = self._answer_on_topic("commitOffset", name, commit, t0)
        return T.CommitOffsetResponse(result=result)

    def getCommitted(self, request: Any) -> Any:
        """A group's committed index (EXTENSION; see the module docstring)."""
        if request is None:
            error = self._no_request("getCommitted", "GetCommittedRequest")
            return T.GetCommittedResponse(result=error.to_result(), index=0, committed=False)
        t0 = time.perf_counter()
        name, group = request.topic, request.fanoutId
        index, committed, message = 0, False, 0

        def read(topic: Topic) -> Any:
            nonlocal index, committed, message
            value = topic.queue.committed(group)
            index = topic.queue.committed_start(group) if value is None else value
            committed = value is not None
            message = topic.queue.committed_message(group) if committed else 0
            return _OK

        result = self._answer_on_topic("getCommitted", name, read, t0)
        return T.GetCommittedResponse(result=result, index=index, committed=committed, message=message)

    def _answer_on_topic(self, api: str, name: Any, action: Callable[[Topic], Any], t0: float) -> Any:
        """The Result of ``api`` doing ``action`` on topic ``name``: the name checked
        (INVALID_TOPIC), :meth:`_on_topic`, any other failure logged (rate-limited) and
        answered INTERNAL_ERROR; the call counted in the metrics from ``t0``."""
        try:
            validate_topic(name)
            result = self._on_topic(name, action)
        except InvalidNameError as exc:
            result = InvalidTopic(name, str(exc)).to_result()
        except Exception as exc:
            _limited.exception(api, "%s on %r failed", api, name)
            result = self._internal(exc)
        self.metrics.observe(api, time.perf_counter() - t0, result.errorCode)
        return result

    def _on_topic(self, name: str, action: Callable[[Topic], Any]) -> Any:
        """``action(topic)``'s Result on topic ``name`` (opened if needed): once more if
        the topic was closed under it to make room (``ArrayClosedError``: nothing was
        done yet), TOPIC_NOT_EXIST when there is no such topic, and Java's "invalid
        fanout identifier" for a bad group name. ``name`` is already validated."""
        for _ in range(2):
            topic = self.topics.get(name) or self.topics.open(name)
            if topic is None:
                break
            try:
                return action(topic)
            except ArrayClosedError:
                continue
            except InvalidNameError as exc:  # the group's name
                return _invalid_fanout(exc)
        return self._not_exist(name)

    def _take_lease(self, name: str, group: str, member: str) -> str | None:
        """Give (or renew) ``member`` the lease on (topic, group); the holder's id when
        another member holds it."""
        now = time.monotonic()
        key = (name, group)
        with self._leases_lock:
            held = self._leases.get(key)
            if held is not None and held[0] != member and held[1] > now:
                return held[0]
            self._leases[key] = (member, now + self.group_lease_s)
            if len(self._leases) > 4096:  # forget expired leases now and then
                self._leases = {k: v for k, v in self._leases.items() if v[1] > now}
            return None

    def _forget_leases(self, name: str) -> None:
        """Topic ``name`` was deleted (by either door): its groups' member leases go too."""
        with self._leases_lock:
            for key in [k for k in self._leases if k[0] == name]:
                del self._leases[key]

    def _release_lease(self, name: str, group: str, member: str) -> None:
        """Drop ``member``'s lease on (topic, group), if it holds it."""
        with self._leases_lock:
            held = self._leases.get((name, group))
            if held is not None and held[0] == member:
                del self._leases[name, group]

    def _committed_start(self, queue: Any, name: str, group: str, request: Any) -> tuple[int, int]:
        """Where a ``fromCommitted`` consume reads: ``(startIndex, 0)`` if it is set
        (>= 0), else the committed position (index, committed messages of that item:
        ``firstMessage``); raises a LuxunError (TRY_LATER) when another member holds the
        group."""
        member = request.memberId
        if member:
            holder = self._take_lease(name, group, member)
            if holder is not None:
                raise _GroupHeld(name, group, holder, self.broker_id)
        start = request.startIndex
        if start is not None and start >= 0:
            return int(start), 0
        index, message = queue.committed_position(group)
        return int(index), int(message)

    def _committed_ready(self, request: Any) -> Any:
        """The long-poll check of a ``fromCommitted`` consume: items to read, and the
        group not held by another member."""
        name, group, member = request.topic, request.fanoutId, request.memberId

        def ready(topic: Topic | None) -> bool:
            if topic is None:
                return False
            if member:
                with self._leases_lock:
                    held = self._leases.get((name, group))
                if held is not None and held[0] != member and held[1] > time.monotonic():
                    return False
            start = request.startIndex
            try:
                if start is None or start < 0:
                    start = topic.queue.committed_start(group)
            except InvalidNameError:
                return True  # answered at once
            return topic.queue.head > start  # type: ignore[no-any-return]

        return ready

    def _committed_group(self, name: str, group: str) -> Any:
        """The refusal of an auto-moving consume of an at-least-once group (committed by
        a Thrift commitOffset or a Kafka OffsetCommit: one group for both doors, see
        docs/groups.md). Refused here, on the door that asked; the IDL has no better code."""
        return InternalError(
            f"group {group!r} of topic {name!r} commits its positions (at-least-once): a Thrift commitOffset or "
            "a Kafka consumer group committed it; consume it with fromCommitted (StreamConsumer(auto_commit=False), "
            "luxun consume --commit) or from Kafka, not by group"
        ).to_result()
