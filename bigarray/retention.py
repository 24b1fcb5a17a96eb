"""Retention: moving tail forward and deleting the page files wholly below it.

Tail is written to the meta page first, then the pages are deleted, so a crash in
between leaves only files that the next open deletes. The index item of tail - 1 is
kept (its end offset is :meth:`first_offset` of tail, see :mod:`bigarray.format`).
Readers never lock: a read whose pages are deleted under it raises
IndexOutOfRangeError, and read_range_view's data stays mapped until it is released.
"""

from __future__ import annotations

import bisect

from . import format as fmt
from .codec import I64
from .core import ArrayCore
from .errors import IndexOutOfRangeError


class ArrayRetention(ArrayCore):
    """remove_before*, limit_back_file_size and the sizes they go by, of a
    :class:`bigarray.BigArray` (under its lock)."""

    def remove_before_index(self, index: int) -> None:
        """Make ``index`` the new tail and delete the pages wholly before it.

        Indexes at or below the current tail are a no-op.

        Raises:
            IndexOutOfRangeError: ``index`` is beyond head.
        """
        with self._lock:
            self._check_open()
            if index > self._head:
                raise IndexOutOfRangeError(index, self._tail, self._head)
            if index <= self._tail:
                return
            self._tail = index
            I64.pack_into(self._meta_page.mm, fmt.META_TAIL_OFFSET, index)
            self._delete_pages_below_tail()

    def remove_before(self, timestamp_ms: int) -> None:
        """Remove every item appended before ``timestamp_ms`` (ms since the epoch)."""
        with self._lock:
            self._check_open()
            tail, head = self._tail, self._head
            first_kept = tail + bisect.bisect_left(range(tail, head), timestamp_ms, key=self.timestamp)
            self.remove_before_index(first_kept)

    def limit_back_file_size(self, max_bytes: int) -> None:
        """Delete the oldest data pages until the page files take at most ``max_bytes``.

        The page being written is never deleted, so the files may stay above a very
        small limit.
        """
        with self._lock:
            self._check_open()
            while self.back_file_size() > max_bytes and self._tail < self._head:
                oldest_page = self._index_item(self._tail).page
                if oldest_page >= self._data_page_no:
                    break
                tail, head = self._tail, self._head
                keep = bisect.bisect_left(range(tail, head), oldest_page + 1, key=lambda i: self._index_item(i).page)
                self.remove_before_index(tail + keep)

    def back_file_size(self) -> int:
        """Bytes of the index and data page files (their sizes, as Java's
        ``getBackFileSize``: a whole page each, however little of it is on disk)."""
        return self._index.total_file_size() + self._data.total_file_size()

    def allocated_size(self) -> int:
        """Disk space the index and data page files take (allocated blocks), in bytes:
        what the array holds plus its reservations ahead of the writer."""
        return self._index.allocated_size() + self._data.allocated_size()

    def _delete_pages_below_tail(self) -> None:
        """Delete the index pages that hold only items below tail - 1 and the data
        pages that hold only items below tail."""
        tail = self._tail
        # the index item of tail - 1 stays: first_offset(tail) is its end offset
        self._index.delete_pages_before(fmt.index_page_of(max(tail - 1, 0)))
        first_data_page = self._index_item(tail).page if tail < self._head else self._data_page_no
        self._data.delete_pages_before(first_data_page)
