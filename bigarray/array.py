"""BigArray: an append-only, memory-mapped array of byte items, persisted on disk.

See :mod:`bigarray.format` for the bytes on disk and the crash guarantees.

Thread-safety: every method may be called from any thread. Appends, retention and
close are serialised by one lock; reads take no array lock (head is the read barrier),
so many threads read while one appends.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import functools
import itertools
import mmap
import operator
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any

import numpy as np

from . import format as fmt
from .codec import (
    BE_I64,
    HEAD_TAIL,
    OFFSET_MASK,
    PAGE_BITS,
    SLOT_BITS,
    SLOT_MASK,
    pack_index_item,
    pack_plain_index_item,
    unpack_item_place,
)
from .core import DISK_FULL_ERRNOS, NO_PAGE, SMALL_READ_ITEMS, _Reading, now_ms
from .errors import (
    ArrayLockedError,
    CorruptArrayError,
    DiskFullError,
    IndexOutOfRangeError,
    ItemTooLargeError,
)
from .offsets import ArrayOffsets
from .page import DEFAULT_MAX_CACHED_PAGES, DEFAULT_PAGE_TTL_S, DEFAULT_RESERVE_STEP, MappedPage, PageFactory
from .prefetch import PREFETCHER
from .recovery import DEFAULT_RECOVERY_CHECK_ITEMS, ArrayRecovery, Recovery
from .retention import ArrayRetention

__all__ = ["DEFAULT_RECOVERY_CHECK_ITEMS", "BigArray", "Recovery", "now_ms"]

_time_ns = time.time_ns


def _slice_run(
    mm: mmap.mmap, offsets: np.ndarray[Any, Any], lengths: np.ndarray[Any, Any], page_size: int, out: list[bytes]
) -> None:
    """Append to ``out`` the items at ``offsets`` / ``lengths`` (int64, at least one)
    of mapping ``mm``, a data page of ``page_size`` bytes (see
    :meth:`BigArray._slice_items`). A closed mapping raises ValueError."""
    m = len(offsets)
    first = int(offsets[0])
    size = int(lengths[0])
    if (
        m > 1
        and size > 0
        and first >= 0
        and first + m * size <= page_size
        and bool((lengths == size).all())
        and bool((np.diff(offsets) == size).all())
    ):
        view = np.frombuffer(mm, dtype=np.dtype((np.void, size)), count=m, offset=first)
        try:
            out.extend(view.tolist())
        finally:
            del view  # no export of the mapping left behind: it can be closed
        return
    end = int(offsets[-1] + lengths[-1])
    blob = mm[first:end]
    starts = offsets - first
    out.extend([blob[x:y] for x, y in zip(starts.tolist(), (starts + lengths).tolist(), strict=True)])


def _page_spans(pages: np.ndarray[Any, Any]) -> list[tuple[int, int]]:
    """The runs of equal values in ``pages`` (the data pages of consecutive index items):
    (start, end) of each, in order; none for no items."""
    n = len(pages)
    if n == 0:
        return []
    if pages[0] == pages[-1]:  # pages only grow along the index: all on one page
        return [(0, n)]
    cuts = (np.flatnonzero(pages[1:] != pages[:-1]) + 1).tolist()
    return list(zip([0, *cuts], [*cuts, n], strict=True))


#: Index items examined per step of read_range (bounds the work beyond max_bytes).
_READ_CHUNK_ITEMS = 16384
#: Fewest index items a read with max_bytes converts at once (see _index_fields).
_BUDGET_PROBE_ITEMS = 64
#: Index items such a read looks at when a byte budget holds few items the size of the
#: first (smaller ones may follow: if all of these fit, _range_fields reads instead).
_SMALL_READ_WINDOW = 2 * SMALL_READ_ITEMS
#: Structs that read (data page, offset, length) of n consecutive index items, by n
#: (each item: page i8, offset i4, length i4, then its timestamp and aux: fmt.INDEX_DTYPE).
_INDEX_PLACES = [struct.Struct(">" + "qii16x" * n) for n in range(_SMALL_READ_WINDOW + 1)]
assert _INDEX_PLACES[1].size == fmt.INDEX_ITEM_SIZE


def _back_to_back(offsets: list[int], lengths: list[int]) -> bool:
    """Whether items at ``offsets`` (of one data page) with ``lengths`` lie one right
    after the other."""
    return list(itertools.accumulate(lengths[:-1], initial=offsets[0])) == offsets


def no_release() -> None:
    """What :meth:`BigArray.read_range_view` gives to release a copy: nothing to do."""


#: Index slot whose append starts the read-ahead of the next index page (half way).
_INDEX_PREFETCH_SLOT = fmt.INDEX_ITEMS_PER_PAGE // 2
#: How far ahead of the writer reserved data page bytes are faulted in (see _room_for),
#: for a writer that needed more room again within _POPULATE_WITHIN_S seconds.
_POPULATE_AHEAD = 2 << 20
_POPULATE_WITHIN_S = 1.0
#: Batches whose items average this many bytes or more are written with pwritev
#: (BigArray._write_through_file), item by item ...
_WRITE_THROUGH_FILE_MIN_ITEM = 2048
#: ... those averaging this many or more joined first and written with one pwrite (the
#: join is the copy the mapping's way makes too; pages the write fills are not zeroed
#: first, which the populate job or the writer's faults did: in a broker taking 1 KB
#: asyncProduce from 4 clients, 39 % of its CPU was that zeroing). Old/new alternately,
#: 3 rounds: 1 client 113-120 -> 121-128 k items/s, 4 clients 198-224 -> 196-240 k with
#: 3.2-3.9 -> 2.5-3.3 us of broker CPU per item. Smaller items stay in the mapping
#: (100 B joined and written lost in process: append_many 8.6-9.3 -> 7.6-8.1 M items/s),
#: and so do batches that append's inlined path takes (_append_small_batch: a few items,
#: where numpy's fixed cost would be more than the zeroing saved).
_WRITE_JOINED_MIN_ITEM = 512
#: Single items (append) of this many bytes or more are written with pwrite too. Measured
#: in a broker (sync produce, old/new alternately, 3 rounds): 100 KB 1 client 4.7-4.9 ->
#: 6.7-6.9 k items/s, broker CPU 232-247 -> 143-150 us per item; 70 KB a smaller gain;
#: 20-50 KB with 4 clients no gain or a loss (the write lets go of the GIL).
_WRITE_THROUGH_FILE_MIN_SINGLE = 64 << 10
_IOV_MAX = 1024  # buffers per pwritev (Linux's UIO_MAXIOV)
#: append_many of at most this many items takes append's inlined path for each when they
#: fit its room (BigArray._append_small_batch). In process, 100 B / 1 KB items, us per item
#: through numpy's path: 22.9 / 27.8 (1 item), 3.7 / 5.1 (8), 0.85 / 1.18 (32), 0.54 / 0.84 (64).
_SMALL_BATCH_ITEMS = 32


class BigArray(ArrayOffsets, ArrayRetention, ArrayRecovery):
    """An append-only array of byte items in memory-mapped page files.

    Args:
        path: the array's own directory (created if missing).
        data_page_size: bytes per data page; an item may not be larger. An existing
            array keeps the size it was created with.
        max_cached_pages: idle pages kept mapped per folder (index and data).
        page_ttl_s: an idle page is unmapped after this many seconds.
        clock: returns the append time in ms; stored timestamps never go backwards and
            are at least 1.
        recovery_check_items: items below head checked on open.
        prefetch: prepare the pages the writer is about to use in a background
            thread (see :mod:`bigarray.prefetch`): create the next page files, and
            fault in each reserved step of the data page before the writer gets there
            (or, on kernels before 5.14, read the next pages into the page cache).
        reserve_step: largest step, in bytes (a multiple of 4096), by which disk space
            is reserved ahead of the writer in index and data pages (see
            :mod:`bigarray.page`); page files are sparse until reserved. With
            ``prefetch``, a data page's next step is reserved half a step early, so
            up to 1.5 steps may be reserved beyond what was written.

    Raises:
        ArrayLockedError: another process or object has the directory open.
        CorruptArrayError: the meta page is inconsistent (tail > head).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        data_page_size: int = fmt.DEFAULT_DATA_PAGE_SIZE,
        max_cached_pages: int = DEFAULT_MAX_CACHED_PAGES,
        page_ttl_s: float = DEFAULT_PAGE_TTL_S,
        clock: Callable[[], int] = now_ms,
        recovery_check_items: int = DEFAULT_RECOVERY_CHECK_ITEMS,
        prefetch: bool = True,
        reserve_step: int = DEFAULT_RESERVE_STEP,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self._prefetch = prefetch
        if prefetch:
            PREFETCHER.remember(self.path)
        self._clock = clock
        self._lock = threading.RLock()
        self._closed = True
        # Bounds of append's inlined path (see _arm_fast_append); -1: not yet.
        self._data_fast_end = -1
        self._index_fast_end = -1
        self._data_mm = self._index_mm = NO_PAGE.mm
        self._head_cell = BE_I64()
        # The index and data page the last read went to, not referenced (see get()).
        self._read_index_page = NO_PAGE
        self._read_data_page = NO_PAGE
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            if exc.errno in DISK_FULL_ERRNOS:
                raise DiskFullError(exc.errno, f"cannot create array {self.path}: {exc.strerror}") from exc
            raise
        self._dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        #: The head data page's file, open for _write_through_file (-1: none).
        self._write_fd = self._write_fd_page = -1
        self._writes_file = False  # the last write (batch or big item) went through _write_through_file
        try:
            fcntl.flock(self._dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._dir_fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ArrayLockedError(
                    f"array directory {self.path} is already open in another process or object"
                ) from exc
            raise
        try:
            self.data_page_size = self._load_extras(data_page_size)
            self._index = PageFactory(
                os.path.join(self.path, fmt.INDEX_DIR),
                fmt.INDEX_PAGE_SIZE,
                max_cached_pages=max_cached_pages,
                ttl_s=page_ttl_s,
                dtype=fmt.INDEX_DTYPE,
                reserve_step=reserve_step,
            )
            self._data = PageFactory(
                os.path.join(self.path, fmt.DATA_DIR),
                self.data_page_size,
                max_cached_pages=max_cached_pages,
                ttl_s=page_ttl_s,
                reserve_step=reserve_step,
            )
            self._meta = PageFactory(os.path.join(self.path, fmt.META_DIR), fmt.META_PAGE_SIZE, max_cached_pages=1)
            self._meta_page = self._meta.acquire(0, create=True)
            self._head_cell = BE_I64.from_buffer(self._meta_page.mm, fmt.META_HEAD_OFFSET)
            head, tail = HEAD_TAIL.unpack_from(self._meta_page.mm, 0)
            if tail < 0 or head < tail:
                raise CorruptArrayError(
                    f"meta page of {self.path} holds head {head}, tail {tail}: tail must be in [0, head]"
                )
            self._head: int = head
            self._tail: int = tail
            self._closed = False
            # Writer state: pinned head pages (mapped lazily on the first append), and
            # how far each is reserved on disk (data: bytes; index: slots).
            self._data_page: MappedPage | None = None
            self._data_room = 0
            self._data_populated = 0  # data page bytes handed to PREFETCHER.populate
            self._data_reserved_at = float("-inf")  # when _room_for last ran
            self._prefetch_next_at = fmt.MAX_DATA_PAGE_SIZE
            self._index_page: MappedPage | None = None
            self._index_room = 0
            self._last_ts = 1  # timestamps are >= 1: a zero index record was never written
            #: The offset the next appended record gets (see :attr:`next_offset`).
            self._next_offset: int = head
            self._recovery = self._recover(recovery_check_items)
            self._data_page_no, self._data_off = self._derive_write_position()
            self._next_offset = self._derive_next_offset()
            self._delete_pages_below_tail()
        except BaseException as exc:
            self._closed = False
            self._close_files()
            if isinstance(exc, OSError) and not isinstance(exc, DiskFullError) and exc.errno in DISK_FULL_ERRNOS:
                raise DiskFullError(exc.errno, f"cannot create array {self.path}: {exc.strerror}") from exc
            raise

    # -- appending ---------------------------------------------------------------------
    def append(self, item: bytes | bytearray | memoryview, count: int = 1, kind: int = 0) -> int:
        """Append one item and return its index (an item of 64 KiB or more is written into
        the page file with ``pwrite``, a smaller one copied into the mapping).

        ``count`` is how many records the item holds (they get the record offsets
        [next_offset, next_offset + count)); ``kind`` a tag (0..255) stored with it,
        read back by :meth:`item_kind`. See :mod:`bigarray.format`, record offsets.

        Raises:
            ValueError: ``count`` < 1, ``kind`` outside 0..255, or the record offsets
                would pass 2**56 - 1 (nothing appended).
            ItemTooLargeError: the item is larger than a data page.
            DiskFullError: a new page file could not be allocated (nothing appended).
            ArrayClosedError: the array was closed.
        """
        n = len(item)
        lock = self._lock
        lock.acquire()  # not ``with``: 140 ns against 66 here, on a call of about 1 us
        try:
            # The inlined path: a plain item (aux 0, bigqueue's bytes) that fits in the
            # room armed for it (see _arm_fast_append). Everything else, including the
            # checks that room implies (open, item size, page, reserved disk, read-ahead
            # points, default clock, no counted item so far), is in _append_slowly.
            off = self._data_off
            end = off + n
            idx = self._head
            if (
                end > self._data_fast_end
                or idx >= self._index_fast_end
                or count != 1
                or kind
                or n >= _WRITE_THROUGH_FILE_MIN_SINGLE  # into the file (see _append_slowly)
            ):
                return self._append_slowly(item, count, kind)
            self._data_mm[off:end] = item
            ts = _time_ns() // 1_000_000  # now_ms(), inlined
            if ts < self._last_ts:
                ts = self._last_ts
            else:
                self._last_ts = ts
            pack_plain_index_item(self._index_mm, (idx & SLOT_MASK) << SLOT_BITS, self._data_page_no, off, n, ts)
            self._data_off = end
            idx_1 = idx + 1
            self._next_offset = idx_1  # before head: see find_offset
            self._head = idx_1
            self._head_cell.value = idx_1  # the commit point
            return idx
        finally:
            lock.release()

    def _append_slowly(self, item: bytes | bytearray | memoryview, count: int, kind: int) -> int:
        """:meth:`append` with every step and check its inlined path leaves out: the
        first append after open, a new page or more reserved disk (data or index), the
        read-ahead points, a closed array, an item too large, another clock than
        :func:`now_ms`, and items that carry their aux (a count, a kind, or an array
        that held a counted item before). Arms the inlined path again afterwards."""
        n = len(item)
        with self._lock:
            try:
                self._check_open()
                if n > self.data_page_size:
                    raise ItemTooLargeError(n, self.data_page_size)
                idx = self._head
                if count == 1 and kind == 0 and self._next_offset == idx:
                    aux, nxt = 0, idx + 1  # a plain item: aux stays 0 (bigqueue's bytes)
                else:
                    aux = self._aux_for(count, kind)
                    nxt = aux & OFFSET_MASK
                page = self._data_page
                big = n >= _WRITE_THROUGH_FILE_MIN_SINGLE
                if page is None or self._data_off + n > self._data_room:
                    # items through the mapping: populate it ahead; big ones go to the file
                    self._writes_file = big
                    page = self._room_for(n)  # a new page, or more reserved disk space
                off = self._data_off
                if not big or not self._write_through_file(page, (item,), off, n):
                    self._writes_file = False
                    page.mm[off : off + n] = item
                slot = fmt.index_slot(idx)
                ipage = self._index_page
                if ipage is None or ipage.page_no != fmt.index_page_of(idx) or slot >= self._index_room:
                    ipage = self._index_room_for(idx, 1)
                ts = max(self._clock(), self._last_ts)
                self._last_ts = ts
                pack_index_item(ipage.mm, fmt.index_slot_offset(idx), page.page_no, off, n, ts, aux)
                if slot == _INDEX_PREFETCH_SLOT and self._prefetch:
                    self._prefetch_index_page(ipage.page_no + 1)
                self._data_off = off + n
                if self._data_off > self._prefetch_next_at:
                    self._prefetch_next_page()
                self._next_offset = nxt  # before head: see find_offset
                self._head = idx + 1
                self._head_cell.value = idx + 1
                return idx
            finally:
                self._arm_fast_append()

    def _arm_fast_append(self) -> None:
        """Set the room of append's inlined path from the writer's state (lock held):
        it may copy data up to offset ``_data_fast_end`` of the head data page (what is
        reserved on disk, and not past the point where the next page is read ahead)
        and write index items below index ``_index_fast_end`` (in the head index page,
        reserved, and not at the slot where the next one is read ahead). -1 sends every
        append to :meth:`_append_slowly`: closed, no head pages mapped yet, another
        clock, or an array whose items carry record offsets. Called after every write
        through the general paths, whether it succeeded or not."""
        dpage, ipage = self._data_page, self._index_page
        if (
            self._closed
            or dpage is None
            or ipage is None
            or self._next_offset != self._head
            or self._clock is not now_ms
        ):
            self._data_fast_end = self._index_fast_end = -1
            return
        self._data_mm = dpage.mm
        self._index_mm = ipage.mm
        self._data_fast_end = min(self._data_room, self._prefetch_next_at)
        first = ipage.page_no << PAGE_BITS
        end = first + self._index_room
        if self._prefetch and self._head <= first + _INDEX_PREFETCH_SLOT:
            end = min(end, first + _INDEX_PREFETCH_SLOT)
        self._index_fast_end = end

    def _aux_for(self, count: int, kind: int) -> int:
        """The aux of an item of ``count`` records and kind ``kind`` appended now, when
        it is not 0 (see append); checks both."""
        try:
            count = operator.index(count)
            kind = operator.index(kind)
        except TypeError as exc:
            raise ValueError(f"array {self.path}: count and kind must be integers ({exc})") from None
        if count < 1:
            raise ValueError(f"array {self.path}: an item holds at least 1 record, got count {count}")
        if not 0 <= kind <= fmt.MAX_KIND:
            raise ValueError(f"array {self.path}: item kind {kind} is outside 0..{fmt.MAX_KIND}")
        end = self._next_offset + count
        if end > fmt.MAX_END_OFFSET:
            raise ValueError(
                f"array {self.path}: record offsets would pass {fmt.MAX_END_OFFSET} (next offset {self._next_offset}, "
                f"count {count})"
            )
        return fmt.pack_aux(kind, end)

    def append_many(
        self,
        items: Iterable[bytes | bytearray | memoryview],
        counts: Sequence[int] | np.ndarray[Any, Any] | None = None,
        kind: int = 0,
    ) -> int:
        """Append items in order, atomically (all or none), and return the first index.

        One lock, one write per data page (items of 2 KiB or more on average go into
        the page file with one ``pwritev``, of 512 B or more joined and with one
        ``pwrite``, smaller ones joined and copied into the mapping), index items
        written in one numpy pass.
        Returns ``head`` unchanged when ``items`` is empty. ``counts``: how many records
        each item holds (ints >= 1, one per item; None: 1 each); ``kind``: the tag
        (0..255) of every item of the call (see :meth:`append`).

        Raises:
            ValueError: a count < 1, ``counts`` not as long as ``items``, ``kind``
                outside 0..255, or record offsets past 2**56 - 1 (nothing appended).
            ItemTooLargeError: some item is larger than a data page (nothing appended).
            DiskFullError: a page could not be allocated (nothing appended).
        """
        batch = items if isinstance(items, (list, tuple)) else list(items)
        count = len(batch)
        with self._lock:
            if self._closed:
                raise self._closed_error()
            first = self._head
            if (
                count <= _SMALL_BATCH_ITEMS
                and counts is None
                and kind == 0
                and first + count <= self._index_fast_end
                and self._append_small_batch(batch, first)
            ):
                return first
            aux, end = self._batch_aux(first, count, counts, kind)
            if count == 0:
                return first
            lengths = np.fromiter(map(len, batch), dtype=np.int64, count=count)
            longest = int(lengths.max())
            if longest > self.data_page_size:
                raise ItemTooLargeError(longest, self.data_page_size)
            ends = np.cumsum(lengths)
            records = np.zeros(count, dtype=fmt.INDEX_DTYPE)
            saved_position = (self._data_page_no, self._data_off)
            try:
                self._place_batch(batch, lengths, ends, records)
                records["length"] = lengths
                ts = self._clock()
                if ts < self._last_ts:
                    ts = self._last_ts
                self._last_ts = ts
                records["timestamp"] = ts
                if aux is not None:
                    records["aux"] = aux
                idx, k = first, 0
                while k < count:
                    page_no = fmt.index_page_of(idx)
                    slot = fmt.index_slot(idx)
                    m = min(count - k, fmt.slots_left_in_page(idx))
                    ipage = self._index_page
                    if ipage is None or ipage.page_no != page_no or slot + m > self._index_room:
                        ipage = self._index_room_for(idx, m)
                    assert ipage.view is not None
                    ipage.view[slot : slot + m] = records[k : k + m]
                    if slot <= _INDEX_PREFETCH_SLOT < slot + m and self._prefetch:
                        self._prefetch_index_page(page_no + 1)
                    k += m
                    idx += m
            except BaseException:
                # Nothing is committed (head did not move); leave no gap behind either.
                self._restore_write_position(*saved_position)
                raise
            finally:
                self._arm_fast_append()
            self._next_offset = end  # before head: see find_offset
            self._head = first + count
            self._head_cell.value = first + count
            self._arm_fast_append()  # a counted batch sends append to its general path
            return first

    def _append_small_batch(self, batch: list[Any] | tuple[Any, ...], first: int) -> bool:
        """:meth:`append_many` of a few plain items that fit the room armed for
        :meth:`append`'s inlined path (so every check that room implies holds), lock held:
        each copied into the mapping and its index item packed as ``append`` does, with
        no numpy (whose fixed cost, ~20 us a call, is that of 20-30 appends); head moves
        once, after the last. False, nothing written, when they do not fit that room or
        average 2 KiB or more (those go into the file with ``pwritev``)."""
        off = self._data_off
        lengths = [len(item) for item in batch]
        total = sum(lengths)
        if off + total > self._data_fast_end or total >= _WRITE_THROUGH_FILE_MIN_ITEM * len(batch):
            return False
        mm, imm, page_no = self._data_mm, self._index_mm, self._data_page_no
        ts = _time_ns() // 1_000_000  # now_ms(), inlined (the armed room implies that clock)
        if ts < self._last_ts:
            ts = self._last_ts
        else:
            self._last_ts = ts
        idx = first
        for item, n in zip(batch, lengths, strict=True):
            end = off + n
            mm[off:end] = item
            pack_plain_index_item(imm, (idx & SLOT_MASK) << SLOT_BITS, page_no, off, n, ts)
            off = end
            idx += 1
        self._data_off = off
        self._next_offset = idx  # before head: see find_offset
        self._head = idx
        self._head_cell.value = idx  # the commit point
        return True

    def _batch_aux(
        self, first: int, n: int, counts: Sequence[int] | np.ndarray[Any, Any] | None, kind: int
    ) -> tuple[np.ndarray[Any, Any] | None, int]:
        """The aux of each of ``n`` items appended from index ``first`` (None: all 0)
        and the next offset after them; checks ``counts`` and ``kind``."""
        nxt = self._next_offset
        if counts is None and kind == 0 and nxt == first:
            return None, first + n
        try:
            kind = operator.index(kind)
        except TypeError as exc:
            raise ValueError(f"array {self.path}: kind must be an integer ({exc})") from None
        if not 0 <= kind <= fmt.MAX_KIND:
            raise ValueError(f"array {self.path}: item kind {kind} is outside 0..{fmt.MAX_KIND}")
        if counts is None:
            c = np.ones(n, dtype=np.int64)
        else:
            c = np.asarray(counts)
            if c.ndim != 1 or len(c) != n:
                raise ValueError(f"array {self.path}: {len(c) if c.ndim == 1 else c.shape} counts for {n} items")
            if n and c.dtype.kind not in "iu":
                raise ValueError(f"array {self.path}: counts must be integers, got {c.dtype}")
            if n and int(c.min()) < 1:
                raise ValueError(f"array {self.path}: an item holds at least 1 record, got count {int(c.min())}")
        if n == 0:
            return None, nxt
        # the sum in Python ints first when an int64 cumsum could overflow
        total = int(c.sum()) if int(c.max()) <= (1 << 62) // n else sum(c.tolist())
        if nxt + total > fmt.MAX_END_OFFSET:
            raise ValueError(
                f"array {self.path}: record offsets would pass {fmt.MAX_END_OFFSET} (next offset {nxt}, "
                f"{n} items of {total} records)"
            )
        c = c.astype(np.int64)
        ends = nxt + np.cumsum(c)
        aux = ends.astype(np.uint64) | np.uint64(kind << fmt.OFFSET_BITS)
        if kind == 0 and nxt == first:
            # the leading one-record items before the first counted one stay plain (aux 0)
            bigger = np.flatnonzero(c != 1)
            if not bigger.size:
                return None, nxt + n
            aux[: int(bigger[0])] = 0
        return aux, nxt + total

    def _place_batch(
        self,
        batch: list[Any] | tuple[Any, ...],
        lengths: np.ndarray[Any, Any],
        ends: np.ndarray[Any, Any],
        records: np.ndarray[Any, Any],
    ) -> None:
        """Copy a batch into data pages (one copy per page) and fill in the page and
        offset of each index record. Called with the lock held."""
        count = len(batch)
        i = 0
        while i < count:
            base = int(ends[i - 1]) if i else 0
            page = self._data_page if self._data_page is not None else self._room_for(0)
            room = self.data_page_size - self._data_off
            j = int(np.searchsorted(ends, base + room, side="right"))
            if j == i:
                self._room_for(int(lengths[i]))
                continue
            off = self._data_off
            chunk = int(ends[j - 1]) - base
            if off + chunk > self._data_room:
                page = self._room_for(chunk)  # reserves disk space for the whole chunk
            items = batch if (i == 0 and j == count) else batch[i:j]
            if chunk >= _WRITE_THROUGH_FILE_MIN_ITEM * (j - i):
                written = self._write_through_file(page, items, off, chunk)
            elif chunk >= _WRITE_JOINED_MIN_ITEM * (j - i):
                joined = b"".join(items)
                # not if some item's len() is not its size (a memoryview of wider elements):
                # the mapping's copy below refuses those, as before
                written = len(joined) == chunk and self._write_through_file(page, (joined,), off, chunk)
            else:
                written = False
            if not written:
                self._writes_file = False
                page.mm[off : off + chunk] = b"".join(items)
            records["page"][i:j] = page.page_no
            records["offset"][i:j] = ends[i:j] - lengths[i:j] + (off - base)
            self._data_off = off + chunk
            if self._data_off > self._prefetch_next_at:
                self._prefetch_next_page()
            i = j

    def _write_through_file(self, page: MappedPage, items: list[Any] | tuple[Any, ...], off: int, size: int) -> bool:
        """Write ``items`` (``size`` bytes together) at ``off`` of ``page``'s file with
        ``pwritev``, False (nothing written) if the file cannot be opened.

        Why not through the mapping: a page the writer's copy faults in is first zeroed
        by the kernel (a sparse page file reads as zeros), which cost more than the copy
        itself, and the items were joined into one buffer first. ``pwritev`` copies
        each item once, from where it is, into the page cache, and a page it fills
        whole is never zeroed; the mapping sees the bytes at once (one page cache).
        Measured in process, 512 MB of 10 KB items in batches of 100: 76-106 k ->
        237-248 k items/s, CPU 0.6-0.9 -> 0.22 s. For small items the many buffers
        cost more than they save (see _WRITE_THROUGH_FILE_MIN_ITEM): items of 512 B to
        2 KiB come here joined, as one buffer (see _WRITE_JOINED_MIN_ITEM).

        A short write, or one that fails (``RLIMIT_FSIZE`` binds ``write`` and not a
        mapping), is finished through the mapping: the bytes are reserved on disk.
        """
        if not all(type(item) is bytes or type(item) is bytearray for item in items):
            with contextlib.ExitStack() as views:  # len() of a memoryview counts its elements
                if sum(views.enter_context(memoryview(item)).nbytes for item in items) != size:
                    return False  # the mapping's copy refuses them (IndexError), nothing written
        fd = self._write_fd
        if self._write_fd_page != page.page_no:
            self._close_write_fd()
            try:
                fd = os.open(page.path, os.O_WRONLY | os.O_CLOEXEC)
            except OSError:  # e.g. out of descriptors: the mapping will do
                return False
            self._write_fd, self._write_fd_page = fd, page.page_no
        self._writes_file = True
        n = len(items)
        for k in range(0, n, _IOV_MAX):
            group = items[k : k + _IOV_MAX] if n > _IOV_MAX else items
            want = sum(map(len, group)) if n > _IOV_MAX else size
            try:
                done = os.pwritev(fd, group, off)
            except OSError:
                done = 0
            if done < want:
                page.mm[off + done : off + want] = b"".join(group)[done:]
            off += want
        return True

    def _close_write_fd(self) -> None:
        if self._write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._write_fd)
        self._write_fd = self._write_fd_page = -1

    def _restore_write_position(self, page_no: int, offset: int) -> None:
        """Put the writer back where a failed batch started, so no gap is left."""
        if self._data_page is not None and self._data_page.page_no != page_no:
            self._close_write_fd()
            self._data.release(self._data_page)
            self._data_page = None
            self._data_room = 0
        self._data_page_no, self._data_off = page_no, offset

    # -- reading -----------------------------------------------------------------------
    def get(self, index: int) -> bytes:
        """Return the item at ``index``.

        Raises:
            IndexOutOfRangeError: ``index`` is outside [tail, head).
        """
        # Fast path: the index and data page of the previous read, used without taking
        # a reference. That is safe under the GIL: a page unmapped meanwhile (evicted,
        # deleted by retention, closed) has a closed mmap, whose every use raises
        # ValueError before touching memory, and the slow path then maps it properly.
        ipage = self._read_index_page
        if ipage.page_no == index >> PAGE_BITS and self._tail <= index < self._head:
            try:
                page_no, off, length = unpack_item_place(ipage.mm, (index & SLOT_MASK) << SLOT_BITS)
                dpage = self._read_data_page
                if dpage.page_no == page_no:
                    item: bytes = dpage.mm[off : off + length]
                    return item
            except ValueError:
                pass
        return self._get_mapped(index)

    def _get_mapped(self, index: int) -> bytes:
        """:meth:`get` through the page factories (which map pages as needed); remembers
        the pages for the next call's fast path."""
        page_no, off, length, _ = self._index_record(index)
        try:
            page = self._data.acquire(page_no)
        except FileNotFoundError:
            raise IndexOutOfRangeError(index, self._tail, self._head) from None
        try:
            item = page.mm[off : off + length]
        except ValueError:  # the mapping was closed by close() in another thread
            raise self._closed_error() from None
        finally:
            self._data.release(page)
        if not self._closed:
            self._read_data_page = page
        return item

    def read_range(self, start: int, *, max_items: int | None = None, max_bytes: int | None = None) -> list[bytes]:
        """Read consecutive items from ``start``.

        Returns at most ``max_items`` items whose summed length is at most
        ``max_bytes``, but always at least one item when ``start`` is readable (so an
        item larger than ``max_bytes`` never blocks a reader). Returns ``[]`` when
        ``start == head``.

        Raises:
            IndexOutOfRangeError: ``start`` is outside [tail, head].
        """
        out: list[bytes] = []
        with self._reading(start):
            small = self._small_fields(start, max_items, max_bytes)
            if small is not None:
                for mm, offs, lens, _ in self._small_runs(*small):
                    out.extend([mm[off : off + length] for off, length in zip(offs, lens, strict=True)])
                return out
            for pages, offsets, lengths in self._range_fields(start, max_items, max_bytes):
                self._slice_items(pages, offsets, lengths, out)
        return out

    def read_range_blob(
        self, start: int, *, max_items: int | None = None, max_bytes: int | None = None
    ) -> tuple[np.ndarray[Any, Any], bytes]:
        """The items :meth:`read_range` would return, as ``(lengths, data)``: their
        lengths (int64) and their bytes concatenated. No ``bytes`` object per item:
        for small items this is several times cheaper, and it is what a reply that
        frames the items itself needs.

        Raises:
            IndexOutOfRangeError: ``start`` is outside [tail, head].
        """
        blobs: list[bytes] = []
        all_lengths: list[np.ndarray[Any, Any]] = []
        with self._reading(start):
            small = self._small_fields(start, max_items, max_bytes)
            if small is not None:
                for mm, offs, lens, contiguous in self._small_runs(*small):
                    if contiguous:
                        blobs.append(mm[offs[0] : offs[-1] + lens[-1]])
                    else:
                        blobs.append(b"".join([mm[off : off + n] for off, n in zip(offs, lens, strict=True)]))
                return np.array(small[2], dtype=np.int64), b"".join(blobs)
            for pages, offsets, lengths in self._range_fields(start, max_items, max_bytes):
                self._join_items(pages, offsets, lengths, blobs)
                all_lengths.append(lengths)
        if not all_lengths:
            return np.zeros(0, dtype=np.int64), b""
        lengths = all_lengths[0] if len(all_lengths) == 1 else np.concatenate(all_lengths)
        return lengths, blobs[0] if len(blobs) == 1 else b"".join(blobs)

    def read_range_view(
        self, start: int, *, max_items: int | None = None, max_bytes: int | None = None
    ) -> tuple[np.ndarray[Any, Any], bytes | memoryview, Callable[[], None]]:
        """:meth:`read_range_blob` without copying the items when they lie back to back
        on one data page (as this array writes them): ``(lengths, data, release)``,
        ``data`` then a read-only view of the page's mapping, which stays mapped (even if
        retention deletes the page) until ``release()`` is called. Call it exactly once,
        when done with ``data`` (then ``data`` may no longer be used); elsewhere ``data``
        is ``bytes`` and ``release`` does nothing.

        Raises:
            IndexOutOfRangeError: ``start`` is outside [tail, head].
        """
        with self._reading(start):
            small = self._small_fields(start, max_items, max_bytes)
            if small is not None:
                on, offs, lens = small  # data pages, offsets, lengths
                if not on:
                    return np.zeros(0, dtype=np.int64), b"", no_release
                if on[0] == on[-1] and _back_to_back(offs, lens):
                    return (np.array(lens, dtype=np.int64), *self._page_view(on[0], offs[0], offs[-1] + lens[-1]))
                lengths, data = self.read_range_blob(start, max_items=max_items, max_bytes=max_bytes)
                return lengths, data, no_release
            chunks = self._range_fields(start, max_items, max_bytes)
            if len(chunks) == 1:
                pages, offsets, lengths = chunks[0]
                first_off = int(offsets[0])
                end_off = int(offsets[-1] + lengths[-1])
                if bool((pages == pages[0]).all()) and np.array_equal(
                    offsets[1:] - first_off, np.cumsum(lengths[:-1])
                ):  # one page, back to back
                    return (lengths, *self._page_view(int(pages[0]), first_off, end_off))
        lengths, data = self.read_range_blob(start, max_items=max_items, max_bytes=max_bytes)
        return lengths, data, no_release

    def _page_view(self, page_no: int, begin: int, end: int) -> tuple[memoryview, Callable[[], None]]:
        """A read-only view of bytes [begin, end) of data page ``page_no`` and the call
        that lets it go (see :meth:`read_range_view`)."""
        dpage = self._data.acquire(page_no)  # FileNotFoundError: see _reading
        try:
            view = memoryview(dpage.mm).toreadonly()[begin:end]
        except BaseException:
            self._data.release(dpage)
            raise
        return view, functools.partial(self._release_view, view, dpage)

    def _release_view(self, view: memoryview, page: MappedPage) -> None:
        view.release()
        self._data.release(page)

    def _reading(self, start: int) -> _Reading:
        """Errors of a read from ``start`` as the API promises them: pages that
        retention deleted under us are an index out of range; a mapping closed by
        ``close()`` in another thread is a closed array (a ``with`` block)."""
        return _Reading(self, start)

    def _readable_from(self, start: int, head: int) -> bool:
        """Whether a read from ``start`` has items (False: ``start`` is head).

        Raises:
            ArrayClosedError: the array was closed.
            IndexOutOfRangeError: ``start`` is outside [tail, head].
        """
        self._check_open()
        if start == head and start >= self._tail:
            return False
        if start < self._tail or start > head:
            raise IndexOutOfRangeError(start, self._tail, head)
        return True

    def _small_fields(
        self, start: int, max_items: int | None, max_bytes: int | None
    ) -> tuple[list[int], list[int], list[int]] | None:
        """Data pages, offsets and lengths of the items a read from ``start`` returns, read
        from the index with one struct call per index page, when it can return at most
        ``SMALL_READ_ITEMS`` items; None when it can return more (then
        :meth:`_range_fields` reads them). Checks ``start`` as :meth:`_range_fields` does;
        call it within :meth:`_reading`."""
        head = self._head
        end = head if max_items is None else min(head, start + max(1, max_items))
        stop = end
        if end - start > SMALL_READ_ITEMS:
            # More are there: a byte budget may still take few (judged by the first item).
            if max_bytes is None or not self._tail <= start < head:
                return None
            if max_bytes // max(1, self._index_record(start)[2]) >= SMALL_READ_ITEMS:
                return None
            stop = min(end, start + _SMALL_READ_WINDOW)  # smaller items after it: see below
        if not self._readable_from(start, head):
            return [], [], []
        places = self._unpack_index_items(start, stop, _INDEX_PLACES)
        pages, offsets, lengths = list(places[0::3]), list(places[1::3]), list(places[2::3])
        if max_bytes is not None:
            # As many as sum to max_bytes or less, and always one (even one larger).
            k = bisect.bisect_right(list(itertools.accumulate(lengths)), max_bytes) or 1
            if k == len(lengths) and stop < end:
                return None  # room left after them: _range_fields reads on
            del pages[k:], offsets[k:], lengths[k:]
        return pages, offsets, lengths

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

    def _small_runs(
        self, pages: list[int], offsets: list[int], lengths: list[int]
    ) -> Iterator[tuple[mmap.mmap, list[int], list[int], bool]]:
        """Per run of :meth:`_small_fields` items on one data page: (its mapping, held
        while the caller reads it, the items' offsets and lengths, whether the items lie
        back to back there)."""
        a = 0
        n = len(pages)
        while a < n:
            page_no = pages[a]
            b = n if pages[-1] == page_no else a + 1
            while b < n and pages[b] == page_no:
                b += 1
            offs, lens = offsets[a:b], lengths[a:b]
            dpage = self._data.acquire(page_no)  # FileNotFoundError: see _reading
            try:
                yield dpage.mm, offs, lens, _back_to_back(offs, lens)
            finally:
                self._data.release(dpage)
            a = b

    def _range_fields(
        self, start: int, max_items: int | None, max_bytes: int | None
    ) -> list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        """Index fields (pages, offsets, lengths) of the items a read from ``start``
        returns, in chunks within one index page each (see :meth:`read_range`)."""
        head = self._head
        if not self._readable_from(start, head):
            return []
        end = head if max_items is None else min(head, start + max(1, max_items))
        budget = -1 if max_bytes is None else max_bytes
        chunks: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []
        idx = start
        while idx < end:
            m = min(end - idx, fmt.slots_left_in_page(idx), _READ_CHUNK_ITEMS)
            pages, offsets, lengths = self._index_fields(idx, m, budget)
            if budget >= 0:
                ends = np.cumsum(lengths)
                k = int(np.searchsorted(ends, budget, side="right"))
                forced = k == 0 and not chunks
                if forced:
                    k = 1  # always at least one item, even one larger than the budget
                if k < m or forced:
                    if k:
                        chunks.append((pages[:k], offsets[:k], lengths[:k]))
                    break
                budget -= int(ends[-1])
            chunks.append((pages, offsets, lengths))
            idx += m
        return chunks

    def _index_fields(
        self, start: int, m: int, budget: int = -1
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Native copies of the page, offset and length fields of ``m`` index items
        within one index page; with a ``budget`` (bytes, >= 0), of fewer when fewer
        already hold more than it: a 1 MiB read of 10 KB items converts about 100 index
        items, not ``m``. No view of the mapping outlives the page reference."""
        ipage = self._index.acquire(fmt.index_page_of(start))
        try:
            if ipage.view is None:  # unmapped by close() in another thread
                raise self._closed_error()
            slot = fmt.index_slot(start)
            view = ipage.view[slot : slot + m]
            if budget >= 0 and m > _BUDGET_PROBE_ITEMS:
                # As many as the first item's length says fit, and one more; fourfold
                # while they do not reach past the budget (items of varying sizes).
                lens = view["length"]
                w = max(_BUDGET_PROBE_ITEMS, budget // max(1, int(lens[0])) + 1)
                while w < m and int(lens[:w].sum(dtype=np.int64)) <= budget:
                    w *= 4
                del lens
                if w < m:
                    view = view[:w]
            fields = (view["page"].astype(np.int64), view["offset"].astype(np.int64), view["length"].astype(np.int64))
            del view
            return fields
        finally:
            self._index.release(ipage)

    def _slice_items(
        self,
        pages: np.ndarray[Any, Any],
        offsets: np.ndarray[Any, Any],
        lengths: np.ndarray[Any, Any],
        out: list[bytes],
    ) -> None:
        """Append the items described by index fields to ``out``, one ``bytes`` each.

        A run of items of one length laid out back to back on a data page (what
        append_many writes for items of one size) is cut straight from the mapping in
        one numpy pass (void items ``tolist`` as ``bytes``): no Python step per item and
        no copy of the run first. That copy doubled what a read allocates: at 1 KB items
        glibc then handed the heap back after each call and faulted it in again on the
        next (225 k page faults for 400 k items, 1.5 us of system time per item). Other
        runs are copied once, then sliced: copying many small pieces straight from the
        mapping with a Python step between them is slower (324 against 240 ns per 1 KB
        item: the bulk copy streams, the slices then come from the cache).
        """
        for a, b in _page_spans(pages):
            dpage = self._data.acquire(int(pages[a]))  # FileNotFoundError: see _reading
            try:
                _slice_run(dpage.mm, offsets[a:b], lengths[a:b], self.data_page_size, out)
            finally:
                self._data.release(dpage)

    def _join_items(
        self,
        pages: np.ndarray[Any, Any],
        offsets: np.ndarray[Any, Any],
        lengths: np.ndarray[Any, Any],
        out: list[bytes],
    ) -> None:
        """Append the bytes of the items described by index fields to ``out``, items
        back to back: the page's bytes as they are when the items are contiguous
        there (they always are when we wrote them), else joined item by item."""
        for blob, starts, lens in self._page_runs(pages, offsets, lengths):
            if np.array_equal(starts[1:], np.cumsum(lens[:-1])):
                out.append(blob)
            else:
                bounds = zip(starts.tolist(), (starts + lens).tolist(), strict=True)
                out.append(b"".join([blob[x:y] for x, y in bounds]))

    def _page_runs(
        self, pages: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any], lengths: np.ndarray[Any, Any]
    ) -> Iterator[tuple[bytes, np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        """Per run of items on one data page: (the bytes from the run's first item to
        the end of its last, each item's start within them, the items' lengths)."""
        for a, b in _page_spans(pages):
            first_off = int(offsets[a])
            end_off = int(offsets[b - 1] + lengths[b - 1])
            dpage = self._data.acquire(int(pages[a]))  # FileNotFoundError: see _reading
            try:
                blob = dpage.mm[first_off:end_off]
            finally:
                self._data.release(dpage)
            yield blob, offsets[a:b] - first_off, lengths[a:b]

    # -- lifecycle ---------------------------------------------------------------------
    def flush(self) -> None:
        """Write every mapped page back to disk (msync). Appends survive a process
        crash without it; flush protects against a machine crash."""
        with self._lock:
            self._check_open()
            self._data.flush()
            self._index.flush()
            self._meta_page.flush()

    def expire_idle_pages(self) -> None:
        """Unmap pages that have been idle longer than the TTL."""
        with self._lock:
            if not self._closed:
                self._index.expire_idle()
                self._data.expire_idle()

    def mapped_page_count(self) -> int:
        """Index and data pages mapped right now (cached or in use)."""
        return self._index.mapped_count() + self._data.mapped_count()

    def close(self) -> None:
        """Flush, unmap everything and release the directory. Closing twice is fine."""
        with self._lock:
            if self._closed:
                return
            self._close_files()

    def __enter__(self) -> BigArray:
        self._check_open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"tail={self._tail} head={self._head}"
        return f"<BigArray {self.path!r} {state}>"

    # -- internals ---------------------------------------------------------------------
    def _close_files(self) -> None:
        self._closed = True
        self._data_fast_end = self._index_fast_end = -1
        self._head_cell = BE_I64()  # no export of the meta page left: it can be unmapped
        if self._prefetch:
            PREFETCHER.forget(self.path)
        for name in ("_index", "_data", "_meta"):
            factory = getattr(self, name, None)
            if factory is not None:
                factory.close()
        self._data_page = self._index_page = None
        self._close_write_fd()
        self._data_mm = self._index_mm = NO_PAGE.mm
        self._read_index_page = self._read_data_page = NO_PAGE
        with contextlib.suppress(OSError):
            fcntl.flock(self._dir_fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(self._dir_fd)

    def _room_for(self, n: int) -> MappedPage:
        """Make the head data page one with ``n`` free bytes reserved on disk at the
        write position, rolling to a new page when the current one has no room.

        Raises:
            DiskFullError: the space could not be reserved (nothing was written).
        """
        self._data_room = 0  # until reserved below: a failure leaves no stale room
        if self._data_page is None:
            self._data_page = self._data.acquire(self._data_page_no, create=True, reserve=self._data_off + n)
            self._data_populated = 0
            if self._prefetch and not PREFETCHER.populates:
                PREFETCHER.prefetch(self._data.page_path(self._data_page_no), self.data_page_size, self._data_off)
            self._prefetch_next_at = self._prefetch_threshold()
        if self._data_off + n > self.data_page_size:
            new_page = self._data.acquire(self._data_page_no + 1, create=True, reserve=n)
            self._close_write_fd()  # a full page's file is not kept open (retention deletes it some day)
            self._data.release(self._data_page)
            self._data_page = new_page
            self._data_page_no += 1
            self._data_off = 0
            self._data_populated = 0
            self._prefetch_next_at = self._prefetch_threshold()
        page = self._data_page
        end = self._data_off + n
        self._data.reserve(page, end)
        room = page.reserved
        now = time.monotonic()
        fast = now - self._data_reserved_at < _POPULATE_WITHIN_S
        self._data_reserved_at = now
        if fast and self._prefetch and PREFETCHER.populates and room < self.data_page_size and not self._writes_file:
            # A fast writer (back here within _POPULATE_WITHIN_S): reserve the next step
            # while it is still `ahead` bytes short of the reserved end, and have that
            # step faulted in (see bigarray.prefetch), so it finds the step mapped. Half
            # a step, at most _POPULATE_AHEAD and half the reserved bytes: a page holding
            # a few items still takes only its first step of disk, and a page at most
            # 1.5 steps beyond what was written. A slow writer faults its own pages
            # (cheap at its rate), and its page cache holds no zeros written ahead.
            ahead = min(_POPULATE_AHEAD, room // 2, self._data.reserve_step // 2)
            if end + ahead > room:
                try:
                    self._data.reserve(page, end + ahead)
                except DiskFullError:
                    ahead = 0  # no room to look ahead: the writer's own reservation decides
            room = max(end, page.reserved - ahead) if page.reserved < self.data_page_size else page.reserved
            if page.reserved > self._data_populated:
                start = max(self._data_populated, end)
                PREFETCHER.populate(page.path, page.mm, start, page.reserved)
                self._data_populated = page.reserved
        self._data_room = room
        return page

    def _index_room_for(self, idx: int, m: int) -> MappedPage:
        """Make the head index page the one of ``idx``, with its slots up to
        ``idx + m`` (in that page) reserved on disk."""
        page_no = fmt.index_page_of(idx)
        end = fmt.index_slot_offset(idx) + m * fmt.INDEX_ITEM_SIZE
        self._index_room = 0  # until reserved below: a failure leaves no stale room
        ipage = self._index_page
        if ipage is None or ipage.page_no != page_no:
            ipage = self._switch_index_page(page_no, end)
        self._index.reserve(ipage, end)
        self._index_room = ipage.reserved // fmt.INDEX_ITEM_SIZE
        return ipage

    def _prefetch_index_page(self, page_no: int) -> None:
        """The writer passed half of its index page: create the next (sparse, its
        first step reserved) and read it ahead."""
        PREFETCHER.prefetch(self._index.page_path(page_no), fmt.INDEX_PAGE_SIZE, reserve=self._index.first_step)

    def _prefetch_threshold(self) -> int:
        """Offset in a data page past which the next page is read ahead: an eighth of
        the page, so a fast writer does not overtake the read-ahead (about 300 MB/s here)
        while a topic that never fills that much holds only one page of disk."""
        return self.data_page_size // 8 if self._prefetch else self.data_page_size

    def _prefetch_next_page(self) -> None:
        """The writer passed the threshold of its page: create the next (sparse, its
        first step reserved) and read it ahead."""
        self._prefetch_next_at = self.data_page_size
        PREFETCHER.prefetch(
            self._data.page_path(self._data_page_no + 1),
            self.data_page_size,
            reserve=self._data.first_step,
            read=not PREFETCHER.populates,  # populated step by step once it is written (see _room_for)
        )

    def _switch_index_page(self, page_no: int, reserve: int) -> MappedPage:
        new_page = self._index.acquire(page_no, create=True, reserve=reserve)
        if self._index_page is not None:
            self._index.release(self._index_page)
        else:
            if self._prefetch:
                start = fmt.index_slot_offset(self._head)
                PREFETCHER.prefetch(self._index.page_path(page_no), fmt.INDEX_PAGE_SIZE, start)
        self._index_page = new_page
        return new_page
