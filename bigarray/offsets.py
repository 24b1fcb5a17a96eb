"""Record offsets, kinds and timestamps: what an item's index item says besides where
its bytes are.

An item holds one or more records numbered across the array (see
:mod:`bigarray.format`, record offsets): its end offset and kind are in the aux field
of its index item (0 for a plain one-record item, bigqueue's bytes), its append time
in the timestamp field. :class:`ArrayOffsets` reads them (one item, a span as whole
index slices, a binary search by offset or by time) and derives the next offset when
the array is opened; it writes nothing (the writer stores them, :mod:`bigarray.write`).
The next offset is set before head by the writer, so a reader that loads head first
never sees an item below head holding a record at or past the next offset it loads.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from . import format as fmt
from .codec import AUX_OFFSET, PAGE_BITS, SLOT_BITS, SLOT_MASK, unpack_u64
from .core import SMALL_READ_ITEMS, ArrayCore
from .errors import ArrayEmptyError, CorruptArrayError, IndexOutOfRangeError

#: Structs that read the aux field of n consecutive index items, by n (offset_fields).
_INDEX_AUXES = [struct.Struct(">" + f"{fmt.INDEX_AUX_OFFSET}xQ" * n) for n in range(SMALL_READ_ITEMS + 1)]
assert _INDEX_AUXES[1].size == fmt.INDEX_ITEM_SIZE


class ArrayOffsets(ArrayCore):
    """Record offsets (:attr:`next_offset`, :meth:`end_offset`, :meth:`find_offset`...),
    kinds and timestamps of a :class:`bigarray.BigArray`'s items."""

    @property
    def next_offset(self) -> int:
        """The record offset the next appended record gets: ``head`` for an array whose
        items all hold one record (see :mod:`bigarray.format`, record offsets)."""
        return self._next_offset

    @property
    def log_start_offset(self) -> int:
        """The first readable record offset: :meth:`first_offset` of tail
        (:attr:`next_offset` when the array is empty)."""
        while True:
            self._check_open()
            tail = self._tail
            try:
                return self._first_offset(tail)
            except FileNotFoundError:
                if self._tail == tail:
                    raise CorruptArrayError(f"array {self.path}: the index page of tail {tail} is missing") from None
                # retention moved tail meanwhile: read the new one

    def end_offset(self, index: int) -> int:
        """The record offset after the last record of the item at ``index``.

        Raises:
            IndexOutOfRangeError: ``index`` is outside [tail, head).
        """
        return fmt.end_offset_of(index, self._readable_aux(index))

    def first_offset(self, index: int) -> int:
        """The record offset of the first record of the item at ``index`` (the end
        offset of the item before it, which may be tail - 1; 0 for index 0).

        Raises:
            IndexOutOfRangeError: ``index`` is outside [tail, head).
        """
        return self._read_checked(index, self._first_offset)

    def item_kind(self, index: int) -> int:
        """The kind (0..255) the item at ``index`` was appended with.

        Raises:
            IndexOutOfRangeError: ``index`` is outside [tail, head).
        """
        return fmt.kind_of(self._readable_aux(index))

    def offset_fields(self, start: int, count: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """End offsets (int64) and kinds (uint8) of the ``count`` items from ``start``,
        read as whole index slices (one numpy pass per index page). The first record
        offset of item ``start + k`` is ``ends[k - 1]`` (for k = 0: :meth:`first_offset`).

        Raises:
            IndexOutOfRangeError: [start, start + count) is not inside [tail, head).
        """
        if count <= 0:
            self._check_open()
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint8)
        if count <= SMALL_READ_ITEMS:  # without numpy's set-up, as reads of a few items
            self._check_span(start, count)
            with self._reading(start):
                auxes = self._unpack_index_items(start, start + count, _INDEX_AUXES)
            plain_or_counted = [a & fmt.OFFSET_MASK if a else i for i, a in enumerate(auxes, start + 1)]
            kind_list = [a >> fmt.OFFSET_BITS for a in auxes]
            return np.array(plain_or_counted, dtype=np.int64), np.array(kind_list, dtype=np.uint8)
        aux = self._index_column(start, count, "aux").astype(np.uint64)
        plain = np.arange(start + 1, start + count + 1, dtype=np.int64)
        ends = np.where(aux == 0, plain, (aux & np.uint64(fmt.OFFSET_MASK)).astype(np.int64))
        kinds = (aux >> np.uint64(fmt.OFFSET_BITS)).astype(np.uint8)
        return ends, kinds

    def find_offset(self, offset: int) -> int:
        """The index of the item holding record ``offset``: the smallest index i in
        [tail, head) with ``end_offset(i) > offset``; head when ``offset >=
        next_offset``; tail when ``offset`` is below :attr:`log_start_offset`.

        A binary search: O(log(head - tail)) index reads (none for an array whose
        items all hold one record).
        """
        while True:
            self._check_open()
            # head before next offset: the writer sets next offset first, so an item
            # below this head never holds a record at or past the next offset read here
            head = self._head
            nxt = self._next_offset
            if offset >= nxt:
                return head
            tail = self._tail
            if tail >= head:
                return head
            if nxt == head:
                return max(tail, offset)  # every item holds one record: end_offset(i) = i + 1
            try:
                return tail + bisect.bisect_right(range(tail, head), offset, key=self._end_offset_raw)
            except FileNotFoundError:
                if self._tail == tail:
                    raise
                # retention moved tail (and deleted its pages) meanwhile: search again

    def _end_offset_raw(self, index: int) -> int:
        return fmt.end_offset_of(index, self._aux(index))

    def _first_offset(self, index: int) -> int:
        """:meth:`first_offset` of an index in [tail, head] (head: the next offset),
        unchecked. Raises FileNotFoundError when the item before is gone and index is
        not tail (or the array has no item there to fall back on)."""
        if index == 0:
            return 0
        try:
            return fmt.end_offset_of(index - 1, self._aux(index - 1))
        except FileNotFoundError:
            if index != self._tail:
                raise
        # item tail - 1 is gone (an array trimmed by Java, which writes one record per item)
        if index < self._head:
            return fmt.end_offset_of(index, self._aux(index)) - 1
        return self._next_offset

    def _readable_aux(self, index: int) -> int:
        """aux of a readable index (in [tail, head))."""
        return self._read_checked(index, self._aux)

    def _read_checked(self, index: int, read: Callable[[int], int]) -> int:
        """``read(index)`` for an index in [tail, head) of an open array; a page
        retention deleted meanwhile is an index out of range."""
        self._check_open()
        if not self._tail <= index < self._head:
            raise IndexOutOfRangeError(index, self._tail, self._head)
        try:
            return read(index)
        except FileNotFoundError:
            raise IndexOutOfRangeError(index, self._tail, self._head) from None

    def _aux(self, index: int) -> int:
        """aux of index item ``index``, unchecked (any index whose index page exists).

        Raises:
            FileNotFoundError: its index page is gone.
        """
        ipage = self._read_index_page  # the fast path of get(): see there
        if ipage.page_no == index >> PAGE_BITS:
            try:
                fast: int = unpack_u64(ipage.mm, ((index & SLOT_MASK) << SLOT_BITS) + AUX_OFFSET)[0]
                return fast
            except ValueError:
                pass
        self._check_open()
        aux: int = self._unpack_index_slot(index, unpack_u64, AUX_OFFSET)[0]
        return aux

    def timestamps(self, start: int, count: int) -> list[int]:
        """Append times (ms) of the ``count`` items from ``start``, read as whole index
        slices (a consume reply carrying thousands of items pays one numpy copy per
        index page, not one lookup per item).

        Raises:
            IndexOutOfRangeError: [start, start + count) is not inside [tail, head).
        """
        if count <= 0:
            self._check_open()
            return []
        out: list[int] = self._index_column(start, count, "timestamp").tolist()
        return out

    def find_closest_index(self, timestamp_ms: int) -> int:
        """Index whose append time is closest to ``timestamp_ms`` (ties: the earlier).

        ``EARLIEST`` (-1) gives tail and ``LATEST`` (-2) gives head.

        Raises:
            ArrayEmptyError: a real timestamp was given and the array is empty.
        """
        self._check_open()
        if timestamp_ms == self.EARLIEST:
            return self._tail
        if timestamp_ms == self.LATEST:
            return self._head
        tail, head = self._tail, self._head
        if tail == head:
            raise ArrayEmptyError(f"array {self.path} is empty: no index is close to {timestamp_ms}")
        pos = tail + bisect.bisect_left(range(tail, head), timestamp_ms, key=self.timestamp)
        if pos == tail:
            return tail
        if pos == head:
            return head - 1
        before, after = self.timestamp(pos - 1), self.timestamp(pos)
        return pos - 1 if timestamp_ms - before <= after - timestamp_ms else pos

    def _derive_next_offset(self) -> int:
        """The next record offset: the end offset of item head - 1 (head when that
        index item is gone: an array emptied and trimmed by Java, whose items all hold
        one record)."""
        head = self._head
        if head == 0:
            return 0
        try:
            with self._index.using(fmt.index_page_of(head - 1)) as page:
                aux: int = unpack_u64(page.mm, fmt.index_slot_offset(head - 1) + AUX_OFFSET)[0]
        except FileNotFoundError:
            return head
        return fmt.end_offset_of(head - 1, aux)
