"""FanoutQueue: a BigArray with one persistent read position per consumer group.

Every group sees every item; within a group each item is handed to exactly one caller
of :meth:`FanoutQueue.dequeue` / :meth:`FanoutQueue.dequeue_many`. A group's position
lives in ``front_index_<group>/page-0.dat`` (8 bytes, big-endian next index), as in
bigqueue's FanOutQueueImpl, and is written before the items are returned
(at-most-once: a crash after the write loses the in-flight items for that group, never
hands them out twice).

Committed positions (at-least-once groups): :meth:`FanoutQueue.commit` stores a
group's committed index in ``committed_<group>/page-0.dat`` (32 bytes, big-endian: the
index, the committed record offset + 1 or 0, the committed message position in the
item at the index and the committed leader epoch + 1 or 0, see :mod:`bigarray.format`;
written through an mmap in one copy as the group's position is, so it survives a crash
of the process once the call returns)
and moves the group's position there too (so
:meth:`size`, :meth:`cleanup` and lag reports count from it). A group that has
committed once is an *at-least-once group*: it is read by index from its committed
position (:meth:`committed_start`, then :meth:`read_range`), and :meth:`dequeue` and
its kin refuse it with :class:`CommittedGroupError` (a group never mixes the two ways
silently). :meth:`remove_group` forgets both positions. bigqueue and Java Luxun ignore
the extra directory.

Thread-safety: every method may be called from any thread; calls for one group are
serialised by that group's lock, different groups run in parallel.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from types import TracebackType
from typing import Any, TypeVar, cast

import numpy as np

from . import format as fmt
from .array import BigArray
from .codec import BE_I64, PAGE_BITS, SLOT_BITS, SLOT_MASK, unpack_item_place
from .errors import ArrayClosedError, BigArrayError, IndexOutOfRangeError
from .names import validate_name
from .page import MappedPage, PageFactory
from .read import no_release

log = logging.getLogger(__name__)

_I64 = struct.Struct(">q")
#: The committed page: index, record offset + 1 (0: none), message position in the item.
_COMMITTED = struct.Struct(">qqqq")
_R = TypeVar(
    "_R",
    list[bytes],
    tuple[np.ndarray[Any, Any], bytes],
    tuple[np.ndarray[Any, Any], bytes | memoryview, Callable[[], None]],
)
_S = TypeVar("_S", bound=Sized)

#: Seconds between automatic clean-ups, when enabled.
DEFAULT_CLEANUP_INTERVAL_S = 1.0


class CommittedGroupError(BigArrayError, ValueError):
    """A dequeue for a group that commits its positions (see :meth:`FanoutQueue.commit`)."""

    def __init__(self, path: str, group: str) -> None:
        super().__init__(
            f"queue {path}: group {group!r} commits its positions (at-least-once): read it from its committed "
            "position (committed_start + read_range), not with dequeue"
        )
        self.group = group


class _Group:
    """A consumer group: its lock and its position, kept in memory (``index``) and in
    its page (written by :meth:`move`)."""

    __slots__ = (
        "cell",
        "cfactory",
        "closed",
        "cmm",
        "committed",
        "committed_epoch",
        "committed_message",
        "committed_offset",
        "factory",
        "index",
        "lock",
        "mm",
        "name",
        "page",
    )

    def __init__(self, name: str, folder: str) -> None:
        self.name = name
        self.closed = False
        self.lock = threading.Lock()
        self.factory = PageFactory(folder, fmt.FRONT_PAGE_SIZE, max_cached_pages=1)
        self.page: MappedPage = self.factory.acquire(0, create=True)
        self.mm = self.page.mm  # referenced until close, so never unmapped before
        #: The position in the page as a ctypes big-endian int64 over the mapping: a
        #: store costs a third of struct.pack_into (see bigarray.codec.BE_I64).
        self.cell = BE_I64.from_buffer(self.mm, 0)
        #: The next index the group reads: what its page holds (the only writer is us).
        self.index: int = _I64.unpack_from(self.mm, 0)[0]
        #: The committed index (None: the group never committed) and its page.
        self.committed: int | None = None
        #: The committed record offset (None: the last commit gave none).
        self.committed_offset: int | None = None
        #: Messages of the item at ``committed`` that are committed (0: none).
        self.committed_message = 0
        #: The leader epoch of the last commit (None: it gave none).
        self.committed_epoch: int | None = None
        self.cfactory: PageFactory | None = None
        self.cmm: Any = None
        committed_folder = os.path.join(os.path.dirname(folder), fmt.COMMITTED_DIR_PREFIX + name)
        if os.path.isdir(committed_folder):
            self.open_committed(committed_folder)

    def open_committed(self, folder: str) -> None:
        """Open (create) the committed position's page; a new one holds 0."""
        self.cfactory = PageFactory(folder, fmt.COMMITTED_PAGE_SIZE, max_cached_pages=1)
        self.cmm = self.cfactory.acquire(0, create=True).mm
        index, offset_plus_1, message, epoch_plus_1 = _COMMITTED.unpack_from(self.cmm, fmt.COMMITTED_INDEX_OFFSET)
        self.committed = index
        self.committed_offset = offset_plus_1 - 1 if offset_plus_1 > 0 else None
        self.committed_message = max(message, 0)
        self.committed_epoch = epoch_plus_1 - 1 if epoch_plus_1 > 0 else None

    def commit(self, index: int, offset: int | None = None, message: int = 0, epoch: int | None = None) -> None:
        """Save ``index`` (and ``offset``, or none, ``message`` and ``epoch``, or none) as
        the committed position (one 32-byte copy into the mapped page), then move the
        group's position there too."""
        self.cmm[0 : _COMMITTED.size] = _COMMITTED.pack(
            index, 0 if offset is None else offset + 1, message, 0 if epoch is None else epoch + 1
        )
        self.committed = index
        self.committed_offset = offset
        self.committed_message = message
        self.committed_epoch = epoch
        self.move(index)

    def move(self, index: int) -> None:
        """Set the group's position and save it in its page (the mmap write is the
        persistence: it survives a process crash once it returns)."""
        self.cell.value = index
        self.index = index

    def close(self) -> None:
        self.closed = True
        self.cell = BE_I64()  # no export of the page left: it can be unmapped
        self.factory.close()
        if self.cfactory is not None:
            self.cfactory.close()


class FanoutQueue:
    """A persistent queue that every consumer group reads in full, at its own pace.

    Args:
        path: the queue's directory (the BigArray's directory).
        auto_cleanup: if True, pages every group has passed are deleted as groups
            read on (at most every ``cleanup_interval_s`` seconds). Only enable it
            when nobody reads by index below the slowest group.
        cleanup_interval_s: seconds between automatic clean-ups.
        **array_options: passed to :class:`BigArray` (``data_page_size``, ...).
    """

    EARLIEST = BigArray.EARLIEST
    LATEST = BigArray.LATEST

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        auto_cleanup: bool = False,
        cleanup_interval_s: float = DEFAULT_CLEANUP_INTERVAL_S,
        **array_options: Any,
    ) -> None:
        self.array = BigArray(path, **array_options)
        self.path = self.array.path
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}
        self._auto_cleanup = auto_cleanup
        self._cleanup_interval_s = cleanup_interval_s
        self._next_cleanup = 0.0
        try:
            for entry in sorted(os.listdir(self.path)):
                if not entry.startswith(fmt.FRONT_DIR_PREFIX):
                    continue
                name = entry[len(fmt.FRONT_DIR_PREFIX) :]
                folder = os.path.join(self.path, entry)
                if not os.path.isdir(folder):
                    continue
                try:
                    validate_name(name, what="group", prefix=fmt.FRONT_DIR_PREFIX)
                except ValueError as exc:
                    log.warning("queue %s: ignoring group folder %r: %s", self.path, entry, exc)
                    continue
                group = _Group(name, folder)
                if group.index > self.array.head:
                    log.warning(
                        "queue %s: group %r was at index %d, beyond head %d (items lost in a crash); moving it to head",
                        self.path,
                        name,
                        group.index,
                        self.array.head,
                    )
                    group.move(self.array.head)
                if group.committed is not None and group.committed > self.array.head:
                    # the item of a committed message position is gone too: message 0
                    offset = group.committed_offset
                    group.commit(self.array.head, None if offset is None else min(offset, self.array.next_offset))
                elif group.committed is not None and group.committed_message and group.committed == self.array.head:
                    group.commit(group.committed, group.committed_offset)  # the item was lost in a crash
                self._groups[name] = group
        except BaseException:
            self.close()
            raise

    # -- appending and array passthrough ------------------------------------------------
    def enqueue(self, item: bytes | bytearray | memoryview, count: int = 1, kind: int = 0) -> int:
        """Append one item; return its index. See :meth:`BigArray.append`."""
        return self.array.append(item, count, kind)

    def enqueue_many(
        self,
        items: Iterable[bytes | bytearray | memoryview],
        counts: Sequence[int] | np.ndarray[Any, Any] | None = None,
        kind: int = 0,
    ) -> int:
        """Append items atomically; return the first index. See :meth:`BigArray.append_many`."""
        return self.array.append_many(items, counts, kind)

    @property
    def head(self) -> int:
        """The next index to be appended."""
        return self.array.head

    @property
    def tail(self) -> int:
        """The first readable index."""
        return self.array.tail

    @property
    def is_empty(self) -> bool:
        """True when the underlying array holds no readable item."""
        return self.array.is_empty

    def get(self, index: int) -> bytes:
        """The item at ``index`` (reading by index does not move any group)."""
        return self.array.get(index)

    def read_range(self, start: int, *, max_items: int | None = None, max_bytes: int | None = None) -> list[bytes]:
        """See :meth:`BigArray.read_range`."""
        return self.array.read_range(start, max_items=max_items, max_bytes=max_bytes)

    def read_range_blob(
        self, start: int, *, max_items: int | None = None, max_bytes: int | None = None
    ) -> tuple[np.ndarray[Any, Any], bytes]:
        """See :meth:`BigArray.read_range_blob`."""
        return self.array.read_range_blob(start, max_items=max_items, max_bytes=max_bytes)

    def read_range_view(
        self, start: int, *, max_items: int | None = None, max_bytes: int | None = None
    ) -> tuple[np.ndarray[Any, Any], bytes | memoryview, Callable[[], None]]:
        """See :meth:`BigArray.read_range_view` (call ``release()`` once done)."""
        return self.array.read_range_view(start, max_items=max_items, max_bytes=max_bytes)

    def find_closest_index(self, timestamp_ms: int) -> int:
        """See :meth:`BigArray.find_closest_index`."""
        return self.array.find_closest_index(timestamp_ms)

    def timestamp(self, index: int) -> int:
        """Append time of the item at ``index`` in ms."""
        return self.array.timestamp(index)

    def timestamps(self, start: int, count: int) -> list[int]:
        """See :meth:`BigArray.timestamps`."""
        return self.array.timestamps(start, count)

    # -- record offsets (see bigarray.format) ----------------------------------------------
    @property
    def next_offset(self) -> int:
        """See :attr:`BigArray.next_offset`."""
        return self.array.next_offset

    @property
    def log_start_offset(self) -> int:
        """See :attr:`BigArray.log_start_offset`."""
        return self.array.log_start_offset

    def end_offset(self, index: int) -> int:
        """See :meth:`BigArray.end_offset`."""
        return self.array.end_offset(index)

    def first_offset(self, index: int) -> int:
        """See :meth:`BigArray.first_offset`."""
        return self.array.first_offset(index)

    def item_kind(self, index: int) -> int:
        """See :meth:`BigArray.item_kind`."""
        return self.array.item_kind(index)

    def offset_fields(self, start: int, count: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """See :meth:`BigArray.offset_fields`."""
        return self.array.offset_fields(start, count)

    def find_offset(self, offset: int) -> int:
        """See :meth:`BigArray.find_offset`."""
        return self.array.find_offset(offset)

    # -- groups ------------------------------------------------------------------------
    def dequeue(self, group: str) -> bytes | None:
        """Take the group's next item, or None when the group has read everything.

        The group's new position is saved before the item is returned.
        """
        # Fast path: a known group, and an item in [tail, head), read as BigArray.get's
        # own fast path does (inlined: a call costs about a sixth of a dequeue). (The
        # lock is taken without ``with``, which costs twice as much here: 140 ns
        # against 66.)
        g = self._groups.get(group)
        if g is None:
            return self._dequeue_slowly(group)
        array = self.array
        lock = g.lock
        lock.acquire()
        try:
            if g.closed:
                item = None
            elif g.committed is not None:
                raise CommittedGroupError(self.path, group)
            else:
                index = g.index
                if index >= array._head:
                    return None
                item = None
                ipage = array._read_index_page
                if ipage.page_no == index >> PAGE_BITS and array._tail <= index:
                    try:
                        page_no, off, length = unpack_item_place(ipage.mm, (index & SLOT_MASK) << SLOT_BITS)
                        dpage = array._read_data_page
                        if dpage.page_no == page_no:
                            item = dpage.mm[off : off + length]
                    except ValueError:
                        pass  # a page unmapped meanwhile: get() maps it again
                if item is None:
                    try:
                        item = array.get(index)
                    except IndexOutOfRangeError:
                        item = None  # below tail: retention overtook the group
                if item is not None:
                    g.cell.value = index + 1  # g.move(index + 1), inlined
                    g.index = index + 1
        finally:
            lock.release()
        if item is None:
            return self._dequeue_slowly(group)
        if self._auto_cleanup:
            self._maybe_cleanup()
        return item

    def _dequeue_slowly(self, group: str) -> bytes | None:
        """:meth:`dequeue` for a group that is new, being removed, or overtaken by
        retention."""
        with self._locked_group(group) as g:
            if g.committed is not None:
                raise CommittedGroupError(self.path, group)
            while True:
                index = self._front(g)
                if index >= self.array.head:
                    return None
                try:
                    item = self.array.get(index)
                except IndexOutOfRangeError:
                    if self.array.closed:
                        raise
                    continue  # retention moved the tail under us: start again from it
                g.move(index + 1)
                break
        if self._auto_cleanup:
            self._maybe_cleanup()
        return item

    def dequeue_many(self, group: str, *, max_items: int | None = None, max_bytes: int | None = None) -> list[bytes]:
        """Take the group's next items (at least one if any is left; see read_range).

        The group's new position is saved before the items are returned.
        """
        return self.dequeue_indexed(group, max_items=max_items, max_bytes=max_bytes)[1]

    def dequeue_indexed(
        self, group: str, *, max_items: int | None = None, max_bytes: int | None = None
    ) -> tuple[int, list[bytes]]:
        """:meth:`dequeue_many` that also says where the items are: ``(index of the
        first item, items)``. With no items the index is where the group stands.
        """
        start, items = self._take(
            group, lambda i: self.array.read_range(i, max_items=max_items, max_bytes=max_bytes), []
        )
        return start, items

    def dequeue_blob(
        self, group: str, *, max_items: int | None = None, max_bytes: int | None = None
    ) -> tuple[int, np.ndarray[Any, Any], bytes]:
        """:meth:`dequeue_indexed` with the items as :meth:`BigArray.read_range_blob`
        gives them: ``(index of the first item, lengths, data)``."""
        start, (lengths, data) = self._take(
            group,
            lambda i: self.array.read_range_blob(i, max_items=max_items, max_bytes=max_bytes),
            (np.zeros(0, dtype=np.int64), b""),
        )
        return start, lengths, data

    def dequeue_view(
        self, group: str, *, max_items: int | None = None, max_bytes: int | None = None
    ) -> tuple[int, np.ndarray[Any, Any], bytes | memoryview, Callable[[], None]]:
        """:meth:`dequeue_blob` as :meth:`BigArray.read_range_view` reads: ``(index of
        the first item, lengths, data, release)``; call ``release()`` once done with
        ``data``."""
        start, (lengths, data, release) = self._take(
            group,
            lambda i: self.array.read_range_view(i, max_items=max_items, max_bytes=max_bytes),
            (np.zeros(0, dtype=np.int64), b"", no_release),
        )
        return start, lengths, data, release

    def dequeue_read(self, group: str, read: Callable[[int], _S], empty: _S) -> tuple[int, _S]:
        """Take the group's next items as ``read(index)`` returns them (anything with a
        length: the items it took from ``index`` on, maybe fewer than it read) and move
        the group past as many as that; ``(where the group stands, empty)`` when it has
        read everything. ``read`` runs under the group's lock: other readers of the group
        wait for it (a reader that changes what it read, e.g. converts it within a bound,
        takes only what it returns). It may raise ``IndexOutOfRangeError`` (retention
        moved the tail): it is called again from the new tail."""
        start, got = self._take(group, cast(Any, read), cast(Any, empty))  # counted by len(), as _take does
        return start, cast(_S, got)

    def _take(self, group: str, read: Callable[[int], _R], empty: _R) -> tuple[int, _R]:
        """Read from the group's position with ``read(index)`` (a list of items or
        ``(lengths, data)``) and move the group past what it returned; ``empty`` when
        the group has read everything."""
        g = self._lock_group(group)
        try:
            if g.committed is not None:
                raise CommittedGroupError(self.path, group)
            while True:
                start = self._front(g)
                if start >= self.array.head:
                    got = empty
                    break
                try:
                    got = read(start)
                except IndexOutOfRangeError:
                    if self.array.closed:
                        raise
                    continue  # retention moved the tail under us: start again from it
                g.move(start + len(got[0]) if isinstance(got, tuple) else start + len(got))
                break
        finally:
            g.lock.release()
        count = len(got[0]) if isinstance(got, tuple) else len(got)
        if self._auto_cleanup and count:
            self._maybe_cleanup()
        return start, got

    def peek(self, group: str) -> bytes | None:
        """The group's next item without taking it, or None."""
        index = self.group_index(group)
        if index >= self.array.head:
            return None
        try:
            return self.array.get(index)
        except IndexOutOfRangeError:
            return self.peek(group)

    def size(self, group: str | None = None) -> int:
        """Items in the array (no group), or items the group has still to read.

        An unknown group is not created: its size is what a new group would see.
        """
        if group is None:
            return self.array.size
        return self.array.head - self.group_index(group)

    def group_index(self, group: str) -> int:
        """The next index the group will read (tail for a new group)."""
        self._check_open()
        validate_name(group, what="group", prefix=fmt.FRONT_DIR_PREFIX)
        g = self._groups.get(group)
        tail = self.array.tail
        if g is None:
            return tail
        return max(g.index, tail)

    def reset_group(self, group: str, index: int) -> None:
        """Move the group to ``index`` (tail <= index <= head); creates the group."""
        with self._locked_group(group) as g:
            tail, head = self.array.tail, self.array.head
            if not tail <= index <= head:
                raise IndexOutOfRangeError(index, tail, head + 1)
            g.move(index)

    def groups(self) -> list[str]:
        """Names of the groups that exist, sorted."""
        with self._lock:
            return sorted(self._groups)

    def remove_group(self, group: str) -> None:
        """Forget a group and delete its position file. Unknown groups are a no-op."""
        validate_name(group, what="group", prefix=fmt.FRONT_DIR_PREFIX)
        with self._lock:  # held throughout, so the group cannot be re-created half-way
            self._check_open()
            g = self._groups.pop(group, None)
            if g is not None:
                with g.lock:
                    g.close()  # readers that hold it look the group up again
                shutil.rmtree(os.path.join(self.path, fmt.FRONT_DIR_PREFIX + group), ignore_errors=True)
                shutil.rmtree(os.path.join(self.path, fmt.COMMITTED_DIR_PREFIX + group), ignore_errors=True)

    # -- committed positions (at-least-once groups) --------------------------------------
    def commit(
        self, group: str, index: int, offset: int | None = None, *, message: int = 0, leader_epoch: int | None = None
    ) -> None:
        """Commit ``index`` (tail <= index <= head) as the group's position: the next
        index it will read from its committed position. Creates the group if needed;
        from then on the group is an at-least-once group (see the module docstring).
        ``offset``: the exact record offset committed (a Kafka commit may point inside
        an item), kept beside the index for :meth:`committed_offset`; a commit without
        one clears it. ``message``: how many messages of the item at ``index`` are
        committed too (a reader that splits items into messages reads on from that
        one; 0: the whole item is still to read; over 0 needs index < head), kept for
        :meth:`committed_message`. ``leader_epoch``: the Kafka leader epoch of the
        committed record (None: none), kept for :meth:`committed_leader_epoch`. All four
        are saved in the group's committed page, in one copy, before the call returns
        (survives a crash of the process).

        Raises:
            IndexOutOfRangeError: ``index`` is below tail or beyond head, or ``message``
                is over 0 and ``index`` is head.
            ValueError: ``offset`` is negative or past 2**63 - 2, ``message`` is
                negative or past 2**31 - 1, or ``leader_epoch`` is negative or past 2**31 - 1.
        """
        if leader_epoch is not None and not 0 <= leader_epoch < 1 << 31:
            raise ValueError(f"queue {self.path}: leader epoch {leader_epoch} of group {group!r} is out of range")
        if offset is not None and not 0 <= offset < (1 << 63) - 1:
            raise ValueError(f"queue {self.path}: committed offset {offset} of group {group!r} is out of range")
        if not 0 <= message < 1 << 31:
            raise ValueError(f"queue {self.path}: committed message {message} of group {group!r} is out of range")
        with self._locked_group(group) as g:
            tail, head = self.array.tail, self.array.head
            if not tail <= index <= head:
                raise IndexOutOfRangeError(index, tail, head + 1)
            if message and index == head:
                raise IndexOutOfRangeError(index, tail, head)
            if g.cmm is None:
                g.open_committed(os.path.join(self.path, fmt.COMMITTED_DIR_PREFIX + group))
            g.commit(index, offset, message, leader_epoch)

    def committed(self, group: str) -> int | None:
        """The group's committed index, or None if it never committed."""
        self._check_open()
        validate_name(group, what="group", prefix=fmt.FRONT_DIR_PREFIX)
        g = self._groups.get(group)
        return None if g is None else g.committed

    def committed_message(self, group: str) -> int:
        """How many messages of the item at the group's committed index are committed
        (see :meth:`commit`); 0 if it never committed or its last commit named a whole
        item."""
        self._check_open()
        validate_name(group, what="group", prefix=fmt.FRONT_DIR_PREFIX)
        g = self._groups.get(group)
        return 0 if g is None else g.committed_message

    def committed_position(self, group: str) -> tuple[int, int]:
        """Where the group reads from its committed position, message-exact:
        ``(committed_start, messages of that item to skip)``. The messages are the
        committed message position when the start is the committed index itself, else
        0 (a group that never committed; retention overtook the commit)."""
        self._check_open()
        validate_name(group, what="group", prefix=fmt.FRONT_DIR_PREFIX)
        g = self._groups.get(group)
        if g is None or g.committed is None:
            return self.group_index(group), 0
        with g.lock:  # a consistent pair
            committed, message = g.committed, g.committed_message
        if committed is None:
            return self.group_index(group), 0
        start = max(committed, self.array.tail)
        return start, message if start == committed else 0

    def committed_leader_epoch(self, group: str) -> int | None:
        """The leader epoch of the group's last commit, or None if it gave none."""
        self._check_open()
        validate_name(group, what="group", prefix=fmt.FRONT_DIR_PREFIX)
        g = self._groups.get(group)
        return None if g is None else g.committed_epoch

    def committed_offset(self, group: str) -> int | None:
        """The record offset of the group's last commit, or None if it never
        committed, or its last commit gave no offset."""
        self._check_open()
        validate_name(group, what="group", prefix=fmt.FRONT_DIR_PREFIX)
        g = self._groups.get(group)
        return None if g is None else g.committed_offset

    def committed_start(self, group: str) -> int:
        """Where the group reads from its committed position: the committed index,
        or for a group that never committed where it stands (:meth:`group_index`:
        tail for a new group); moved up to tail if retention overtook it. Creates
        nothing."""
        committed = self.committed(group)
        if committed is None:
            return self.group_index(group)
        return max(committed, self.array.tail)

    # -- retention ---------------------------------------------------------------------
    def remove_before_index(self, index: int) -> None:
        """See :meth:`BigArray.remove_before_index`."""
        self.array.remove_before_index(index)

    def remove_before(self, timestamp_ms: int) -> None:
        """See :meth:`BigArray.remove_before`."""
        self.array.remove_before(timestamp_ms)

    def limit_back_file_size(self, max_bytes: int) -> None:
        """See :meth:`BigArray.limit_back_file_size`."""
        self.array.limit_back_file_size(max_bytes)

    def back_file_size(self) -> int:
        """See :meth:`BigArray.back_file_size`."""
        return self.array.back_file_size()

    def allocated_size(self) -> int:
        """See :meth:`BigArray.allocated_size`."""
        return self.array.allocated_size()

    def cleanup(self) -> None:
        """Delete what every group has read: move tail to the slowest group's position.

        Does nothing when there is no group.
        """
        with self._lock:
            self._check_open()
            groups = list(self._groups.values())
        if groups:
            slowest = min(g.index for g in groups)
            if slowest > self.array.tail:
                self.array.remove_before_index(min(slowest, self.array.head))

    # -- lifecycle ---------------------------------------------------------------------
    def flush(self) -> None:
        """msync the array and every group position."""
        self.array.flush()
        with self._lock:
            for g in self._groups.values():
                g.page.flush()

    def close(self) -> None:
        """Flush and close the array and the groups. Closing twice is fine."""
        with self._lock:
            groups = list(self._groups.values())
            self._groups.clear()
        for g in groups:
            with g.lock:
                g.close()
        self.array.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self.array.closed

    def __enter__(self) -> FanoutQueue:
        self._check_open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<FanoutQueue {self.path!r} groups={self.groups()!r} array={self.array!r}>"

    # -- internals ---------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.array.closed:
            raise ArrayClosedError(f"queue {self.path} is closed")

    def _group(self, group: str) -> _Group:
        g = self._groups.get(group)
        if g is not None:
            return g
        validate_name(group, what="group", prefix=fmt.FRONT_DIR_PREFIX)
        with self._lock:
            self._check_open()
            g = self._groups.get(group)
            if g is None:
                folder = os.path.join(self.path, fmt.FRONT_DIR_PREFIX + group)
                try:
                    g = _Group(group, folder)
                except BaseException:
                    shutil.rmtree(folder, ignore_errors=True)  # e.g. a full disk: leave nothing behind
                    raise
                g.move(max(g.index, self.array.tail))
                self._groups[group] = g
            return g

    @contextlib.contextmanager
    def _locked_group(self, group: str) -> Iterator[_Group]:
        """The group, created if needed, with its lock held; never one being removed."""
        g = self._lock_group(group)
        try:
            yield g
        finally:
            g.lock.release()

    def _lock_group(self, group: str) -> _Group:
        """The group, created if needed, with its lock taken (the caller releases it);
        never one being removed. (:meth:`_take` calls it without a context manager,
        which cost 1.5 us a read.)"""
        while True:
            g = self._group(group)
            g.lock.acquire()
            if not g.closed:
                return g
            g.lock.release()
            self._check_open()

    def _front(self, g: _Group) -> int:
        """The group's position, moved up to tail (logged) if retention overtook it."""
        index = g.index
        tail = self.array.tail
        if index < tail:
            log.warning(
                "queue %s: group %r skipped %d item(s) removed by retention before it read them (index %d -> %d)",
                self.path,
                g.name,
                tail - index,
                index,
                tail,
            )
            g.move(tail)
            return tail
        return index

    def _maybe_cleanup(self) -> None:
        now = time.monotonic()
        if now >= self._next_cleanup:
            self._next_cleanup = now + self._cleanup_interval_s
            with contextlib.suppress(ArrayClosedError):
                self.cleanup()
