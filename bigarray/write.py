"""The write paths of a BigArray: append and append_many, and the room they write in.

What an append guarantees (see :mod:`bigarray.format`): it copies the item's bytes
into its data page, then writes its whole 32-byte index item, then stores head in
the meta page (the commit point, one ctypes store); a returned append survives
``kill -9``. A batch is all or none: on an error head has not moved and the writer's
position is put back. Before a byte lands past a page's reserved end, the page is
reserved on disk further (DiskFullError then, never a SIGBUS).

Four ways bytes reach a data page, by item size: copied into the mapping (append's
inlined path, and batches of a few small items, _append_small_batch, with no numpy);
joined and copied into the mapping (batches of small items, one copy per data page);
joined and written with one ``pwrite`` (512 B to 2 KiB on average); and written item
by item with ``pwritev`` (2 KiB or more on average, and single items of 32 KiB or
more), see :meth:`ArrayWrites._write_through_file`. Appends, like retention and
close, run under the array's lock.
"""

from __future__ import annotations

import contextlib
import operator
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from . import format as fmt
from .codec import OFFSET_MASK, PAGE_BITS, SLOT_BITS, SLOT_MASK, pack_index_item, pack_plain_index_item
from .core import ArrayCore, now_ms
from .errors import DiskFullError, ItemTooLargeError
from .page import MappedPage
from .prefetch import PREFETCHER

_time_ns = time.time_ns
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
#: 20-50 KB with 4 clients no gain or a loss (2026-11-26: the Thrift door's thread per
#: connection, the write letting go of the GIL). The Kafka door's batches of 40-56 KB
#: (2026-11-29, confluent-kafka, 100 B records, 6 s, alternately): 0.32-0.33 -> 0.19-0.20
#: us of broker CPU a record with 1 producer (batch.size 56769), 0.36-0.38 -> 0.25-0.26
#: with 3 (40000): the mapping's copies faulted in pages the kernel zeroed first, half
#: of the broker's CPU. 16 KB and 8 KB batches: no change either way, hence 32 KiB.
#: bigarray._fastpath (luxun's compiled Thrift path) keeps the mapping up to 64 KiB.
_WRITE_THROUGH_FILE_MIN_SINGLE = 32 << 10
_IOV_MAX = 1024  # buffers per pwritev (Linux's UIO_MAXIOV)
#: append_many of at most this many items takes append's inlined path for each when they
#: fit its room (BigArray._append_small_batch). In process, 100 B / 1 KB items, us per item
#: through numpy's path: 22.9 / 27.8 (1 item), 3.7 / 5.1 (8), 0.85 / 1.18 (32), 0.54 / 0.84 (64).
_SMALL_BATCH_ITEMS = 32


class ArrayWrites(ArrayCore):
    """append and append_many of a :class:`bigarray.BigArray`, and the writer's
    head pages, reserved room and read-ahead."""

    def append(self, item: bytes | bytearray | memoryview, count: int = 1, kind: int = 0) -> int:
        """Append one item and return its index (an item of 32 KiB or more is written into
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
            # The inlined paths: an item that fits in the room armed for it (see
            # _arm_fast_append), either plain (aux 0, bigqueue's bytes) while every record
            # offset is its item's index, or any other (its aux: its kind and end offset).
            # Everything else, including the checks that room implies (open, item size,
            # page, reserved disk, read-ahead points, default clock), is in _append_slowly.
            off = self._data_off
            end = off + n
            idx = self._head
            if (
                end <= self._data_fast_end
                and idx < self._index_fast_end
                and count == 1
                and not kind
                and n < _WRITE_THROUGH_FILE_MIN_SINGLE  # else into the file (see _append_slowly)
            ):
                aux = 0
                nxt = idx + 1
            elif (
                end <= self._counted_data_fast_end
                and idx < self._counted_index_fast_end
                and n < _WRITE_THROUGH_FILE_MIN_SINGLE
                and type(count) is int
                and type(kind) is int
                and count >= 1
                and 0 <= kind <= fmt.MAX_KIND
                and self._next_offset + count <= fmt.MAX_END_OFFSET
            ):
                nxt = self._next_offset + count
                aux = (kind << fmt.OFFSET_BITS) | nxt
                if nxt != idx + 1:  # offsets and indexes part: plain items need an aux now
                    self._data_fast_end = self._index_fast_end = -1
            else:
                return self._append_slowly(item, count, kind)
            self._data_mm[off:end] = item
            ts = _time_ns() // 1_000_000  # now_ms(), inlined
            if ts < self._last_ts:
                ts = self._last_ts
            else:
                self._last_ts = ts
            pack_index_item(self._index_mm, (idx & SLOT_MASK) << SLOT_BITS, self._data_page_no, off, n, ts, aux)
            self._data_off = end
            self._next_offset = nxt  # before head: see find_offset
            idx_1 = idx + 1
            self._head = idx_1
            self._head_cell.value = idx_1  # the commit point
            return idx
        finally:
            lock.release()

    def _append_slowly(self, item: bytes | bytearray | memoryview, count: int, kind: int) -> int:
        """:meth:`append` with every step and check its inlined paths leave out: the
        first append after open, a new page or more reserved disk (data or index), the
        read-ahead points, a closed array, an item too large, another clock than
        :func:`now_ms`, and a count or kind that is not a plain int in range. Arms the
        inlined paths again afterwards."""
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
        """Set the room of append's inlined paths from the writer's state (lock held):
        they may copy data up to offset ``_data_fast_end`` of the head data page (what is
        reserved on disk, and not past the point where the next page is read ahead)
        and write index items below index ``_index_fast_end`` (in the head index page,
        reserved, and not at the slot where the next one is read ahead). That room is
        ``_counted_data_fast_end`` / ``_counted_index_fast_end`` for items with an aux
        (a count or a kind), and the plain ones' only while every record offset so far
        is its item's index (else -1: a plain item needs an aux too). -1 sends every
        append to :meth:`_append_slowly`: closed, no head pages mapped yet, another
        clock. Called after every write through the general paths, whether it succeeded
        or not."""
        dpage, ipage = self._data_page, self._index_page
        self._data_fast_end = self._index_fast_end = -1
        self._counted_data_fast_end = self._counted_index_fast_end = -1
        if self._closed or dpage is None or ipage is None or self._clock is not now_ms:
            return
        self._data_mm = dpage.mm
        self._index_mm = ipage.mm
        data_end = min(self._data_room, self._prefetch_next_at)
        first = ipage.page_no << PAGE_BITS
        end = first + self._index_room
        if self._prefetch and self._head <= first + _INDEX_PREFETCH_SLOT:
            end = min(end, first + _INDEX_PREFETCH_SLOT)
        self._counted_data_fast_end, self._counted_index_fast_end = data_end, end
        if self._next_offset == self._head:
            self._data_fast_end, self._index_fast_end = data_end, end

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
