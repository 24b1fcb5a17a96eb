"""The read paths of a BigArray: items' bytes, one by one or as a range.

Reads take no lock: head is the read barrier (an item below head is whole, see
:mod:`bigarray.format`), so many threads read while one appends. A page that retention
deleted under a read makes it raise IndexOutOfRangeError; a mapping closed by
``close()`` in another thread, ArrayClosedError (see ``ArrayCore._reading``).

Five paths, by cost: :meth:`ArrayReads.get` (one item; its fast path reuses the index
and data page of the previous read without a reference, safe under the GIL: a closed
mmap raises ValueError before touching memory), and :meth:`~ArrayReads.read_range`,
:meth:`~ArrayReads.read_range_blob`, :meth:`~ArrayReads.read_range_view` for ranges:
a range of at most ``SMALL_READ_ITEMS`` items is read from the index with one struct
call per index page and cut in Python; a larger one through numpy, one slice per index
page and one copy (or none, for a view) per data page.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import mmap
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import format as fmt
from .codec import PAGE_BITS, SLOT_BITS, SLOT_MASK, unpack_item_place
from .core import SMALL_READ_ITEMS, ArrayCore
from .errors import IndexOutOfRangeError
from .page import MappedPage

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


def _back_to_back(offsets: list[int], lengths: list[int]) -> bool:
    """Whether items at ``offsets`` (of one data page) with ``lengths`` lie one right
    after the other."""
    return list(itertools.accumulate(lengths[:-1], initial=offsets[0])) == offsets


def no_release() -> None:
    """What :meth:`BigArray.read_range_view` gives to release a copy: nothing to do."""


class ArrayReads(ArrayCore):
    """get, read_range, read_range_blob and read_range_view of a
    :class:`bigarray.BigArray` (no lock taken)."""

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
