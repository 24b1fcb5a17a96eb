"""The state every part of a BigArray shares, and its lookups of single index items.

:class:`ArrayCore` declares the attributes a :class:`bigarray.BigArray` holds (the
head, tail and meta page; the index and data page factories; the writer's position and
reserved room; the readers' last pages) and the few methods every other part reads
through: whether the array is open, the index item of one readable index (with get()'s
fast path over the last index page read), and whole index slices of a span. It writes
nothing. The parts built on it, each a mixin that :class:`bigarray.BigArray` composes
(no call is added by that: a method is found on the class as before), are
:mod:`bigarray.write` (appends), :mod:`bigarray.read` (items' bytes),
:mod:`bigarray.offsets` (record offsets and timestamps), :mod:`bigarray.recovery`
(opening after a crash) and :mod:`bigarray.retention` (moving tail, deleting pages).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from . import format as fmt
from .codec import PAGE_BITS, SLOT_BITS, SLOT_MASK, index_item_of, unpack_index_item
from .errors import ArrayClosedError, IndexOutOfRangeError
from .format import IndexItem
from .page import MappedPage, PageFactory

#: errno values of a full disk (or file size limit): raised as DiskFullError.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def now_ms() -> int:
    """Wall-clock time in milliseconds since the epoch (the default clock)."""
    return time.time_ns() // 1_000_000


def _no_page() -> MappedPage:
    """A stand-in for "no page yet" in the readers' last-page slots: its number matches
    no index or data page and its (closed) mapping raises ValueError when used."""
    mm = mmap.mmap(-1, mmap.PAGESIZE)
    mm.close()
    return MappedPage(-(1 << 62), "", mm, None, 0)


NO_PAGE = _no_page()

#: A read that can return at most this many items (head or max_items that near, or a byte
#: budget holding fewer of items the size of the first) reads their index items with one
#: struct call per index page and cuts the items in Python (BigArray._small_fields), not
#: with numpy, whose fixed cost per read (some 15 calls) a live consumer, reading the few
#: items that came since its last read, paid on every fetch.
#: In process, read_range_view of the last 1 / 4 / 16 / 32 items of 100 B: 17-26 / 18-32 /
#: 18-20 / 17-27 us through numpy, 5.5-10 / 6-11 / 7.6-13 / 10 us so (their index items
#: read with one struct call per index page: _INDEX_PLACES).
SMALL_READ_ITEMS = 32


class _Reading:
    """See :meth:`ArrayCore._reading` (a class: a generator's context manager cost
    1.5 us a read, some 15 % of a read of a few items)."""

    __slots__ = ("array", "start")

    def __init__(self, array: ArrayCore, start: int) -> None:
        self.array = array
        self.start = start

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            return
        array = self.array
        if issubclass(kind, FileNotFoundError):
            raise IndexOutOfRangeError(self.start, array._tail, array._head) from None
        if issubclass(kind, ValueError) and array._closed:
            raise array._closed_error() from None


class ArrayCore:
    """The shared state of a :class:`bigarray.BigArray` (set by its ``__init__``) and
    the lookups of index items its parts share. Not used on its own."""

    #: ``find_closest_index`` argument for the first readable index (tail).
    EARLIEST = -1
    #: ``find_closest_index`` argument for the next index to be appended (head).
    LATEST = -2

    path: str
    data_page_size: int
    _prefetch: bool
    _clock: Callable[[], int]
    _lock: threading.RLock
    _closed: bool
    _dir_fd: int
    # the meta page and head / tail (head is the commit point and the readers' barrier)
    _meta: PageFactory
    _meta_page: MappedPage
    _head_cell: ctypes.c_int64
    _head: int
    _tail: int
    _next_offset: int
    _index: PageFactory
    _data: PageFactory
    # the writer: its head pages, position and reserved room (see bigarray.write)
    _data_page: MappedPage | None
    _data_page_no: int
    _data_off: int
    _data_room: int
    _data_populated: int
    _data_reserved_at: float
    _prefetch_next_at: int
    _index_page: MappedPage | None
    _index_room: int
    _last_ts: int
    _data_fast_end: int
    _index_fast_end: int
    _counted_data_fast_end: int
    _counted_index_fast_end: int
    _data_mm: mmap.mmap
    _index_mm: mmap.mmap
    _write_fd: int
    _write_fd_page: int
    _writes_file: bool
    # the index and data page the last read went to, not referenced (see get())
    _read_index_page: MappedPage
    _read_data_page: MappedPage

    @property
    def head(self) -> int:
        """The next index to be appended."""
        return self._head

    @property
    def tail(self) -> int:
        """The first readable index."""
        return self._tail

    @property
    def size(self) -> int:
        """Number of readable items (head - tail)."""
        return self._head - self._tail

    @property
    def is_empty(self) -> bool:
        """True when no item is readable."""
        return self._head == self._tail

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def item_length(self, index: int) -> int:
        """Length in bytes of the item at ``index``."""
        return self._index_record(index)[2]  # IndexItem.length

    def timestamp(self, index: int) -> int:
        """Append time of the item at ``index``, in ms since the epoch."""
        return self._index_record(index)[3]  # IndexItem.timestamp

    def _closed_error(self) -> ArrayClosedError:
        return ArrayClosedError(f"array {self.path} is closed")

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _index_item(self, index: int) -> IndexItem:
        """The index item (data page, offset, length, timestamp) of a readable index."""
        return index_item_of(self._index_record(index))

    def _index_record(self, index: int) -> tuple[int, int, int, int]:
        """:meth:`_index_item` as the plain tuple the struct unpacks (building an
        IndexItem costs about 150 ns: timestamp() and item_length() skip it)."""
        ipage = self._read_index_page  # the fast path of get(): see there
        if ipage.page_no == index >> PAGE_BITS and self._tail <= index < self._head:
            try:
                fast: tuple[int, int, int, int] = unpack_index_item(ipage.mm, (index & SLOT_MASK) << SLOT_BITS)
                return fast
            except ValueError:
                pass
        self._check_open()
        if not self._tail <= index < self._head:
            raise IndexOutOfRangeError(index, self._tail, self._head)
        try:
            item: tuple[int, int, int, int] = self._unpack_index_slot(index, unpack_index_item, 0)
        except FileNotFoundError:
            raise IndexOutOfRangeError(index, self._tail, self._head) from None
        return item

    def _unpack_index_slot(self, index: int, unpack: Callable[[Any, int], Any], at: int) -> Any:
        """``unpack(mapping, at + slot offset of index)`` of index ``index``'s page, mapped
        through the page factory (the slow path of _index_record and _aux: no call is
        added to their fast paths); remembers the page for those fast paths.

        Raises:
            FileNotFoundError: the index page is gone.
        """
        page = self._index.acquire(fmt.index_page_of(index))
        try:
            value = unpack(page.mm, fmt.index_slot_offset(index) + at)
        except ValueError:
            raise self._closed_error() from None
        finally:
            self._index.release(page)
        if not self._closed:
            self._read_index_page = page
        return value

    def _check_span(self, start: int, count: int) -> None:
        """Raise unless the array is open and [start, start + count) inside [tail, head)."""
        self._check_open()
        if start < self._tail or start + count > self._head:
            raise IndexOutOfRangeError(start if start < self._tail else start + count - 1, self._tail, self._head)

    def _index_column(self, start: int, count: int, field: str) -> np.ndarray[Any, Any]:
        """One field of the ``count`` (> 0) index items from ``start``, copied out of the
        index pages (one numpy slice per page).

        Raises:
            IndexOutOfRangeError: [start, start + count) is not inside [tail, head).
        """
        self._check_span(start, count)
        parts: list[np.ndarray[Any, Any]] = []
        idx, end = start, start + count
        try:
            while idx < end:
                slot = fmt.index_slot(idx)
                m = min(end - idx, fmt.slots_left_in_page(idx))
                ipage = self._index.acquire(fmt.index_page_of(idx))
                try:
                    if ipage.view is None:  # unmapped by close() in another thread
                        raise self._closed_error()
                    parts.append(ipage.view[slot : slot + m][field].copy())
                finally:
                    self._index.release(ipage)
                idx += m
        except FileNotFoundError:
            raise IndexOutOfRangeError(start, self._tail, self._head) from None
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _unpack_index_items(self, start: int, stop: int, structs: list[struct.Struct]) -> tuple[Any, ...]:
        """What ``structs[n]`` (a Struct reading n index items) reads of index items
        [start, stop), with one call per index page, joined.

        Raises:
            FileNotFoundError: an index page is gone (retention).
        """
        out: tuple[Any, ...] = ()
        idx = start
        while idx < stop:
            page_no = idx >> PAGE_BITS
            m = min(stop, (page_no + 1) << PAGE_BITS) - idx
            ipage = self._index.acquire(page_no)
            try:
                out += structs[m].unpack_from(ipage.mm, (idx & SLOT_MASK) << SLOT_BITS)
            finally:
                self._index.release(ipage)
            idx += m
        return out

    def _reading(self, start: int) -> _Reading:
        """Errors of a read from ``start`` as the API promises them: pages that
        retention deleted under us are an index out of range; a mapping closed by
        ``close()`` in another thread is a closed array (a ``with`` block)."""
        return _Reading(self, start)
