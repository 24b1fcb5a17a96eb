"""Opening an array after a crash: its extras, the damaged items at the end, the
writer's position.

What a crash can leave (see :mod:`bigarray.format`): an append copies the data, then
writes the index item, then moves head in the meta page, so items just below head
may be damaged only when the machine (not the process) went down, or a page file was
cut. :class:`ArrayRecovery` checks windows of index items below head (their index and
data pages present and whole, offsets and lengths inside the page, items in order,
timestamps written, end offsets increasing), rolls head back to the last intact item
and writes that head to the meta page; it never rebuilds anything and never touches an
item below the new head. The writer's position is then derived from item head - 1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import NamedTuple

import numpy as np

from . import format as fmt
from .codec import I64, index_item_of, unpack_index_item
from .core import ArrayCore
from .errors import CorruptArrayError
from .format import IndexItem

# the name it always logged under (these lines were in bigarray.array): log settings keep working
log = logging.getLogger("bigarray.array")

#: How many items just below head are checked when an array is opened.
DEFAULT_RECOVERY_CHECK_ITEMS = 4096


class Recovery(NamedTuple):
    """What the recovery at open dropped (as Kafka's ``LogSegment.recover`` reports
    the bytes it truncated): head before and after it rolled back past damaged items."""

    #: Head as the meta page held it when the array was opened.
    head_before: int
    #: Head after recovery: every item below it is intact.
    head_after: int

    @property
    def dropped(self) -> int:
        """Items dropped (``head_before - head_after``)."""
        return self.head_before - self.head_after


class ArrayRecovery(ArrayCore):
    """The opening steps of a :class:`bigarray.BigArray` that read what is on disk:
    the data page size, recovery, the write position."""

    _recovery: Recovery

    @property
    def recovery(self) -> Recovery:
        """What opening the array dropped: damaged items at the end (head rolled back
        from ``recovery.head_before`` to ``recovery.head_after``; ``recovery.dropped``
        items, 0 for an intact array)."""
        return self._recovery

    def _load_extras(self, requested: int) -> int:
        """Return the data page size: stored in our extras file, else inferred from an
        existing (Java-written) data page, else ``requested``; then record it."""
        path = os.path.join(self.path, fmt.EXTRAS_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                extras = json.load(f)
            size = int(extras["data_page_size"])
            if size != requested:
                log.info("array %s keeps its data page size of %d bytes (asked for %d)", self.path, size, requested)
        except FileNotFoundError:
            size = requested
            data_dir = os.path.join(self.path, fmt.DATA_DIR)
            with contextlib.suppress(FileNotFoundError):
                for name in sorted(os.listdir(data_dir)):
                    if fmt.parse_page_file_name(name) is not None:
                        size = os.stat(os.path.join(data_dir, name)).st_size
                        log.info("array %s: data page size %d taken from its existing page %s", self.path, size, name)
                        break
            tmp = path + ".tmp"
            try:
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump({"format_version": fmt.FORMAT_VERSION, "data_page_size": size}, f)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptArrayError(f"cannot read {path}: {exc}") from exc
        if not fmt.MIN_DATA_PAGE_SIZE <= size <= fmt.MAX_DATA_PAGE_SIZE:
            raise ValueError(
                f"data page size {size} is outside [{fmt.MIN_DATA_PAGE_SIZE}, {fmt.MAX_DATA_PAGE_SIZE}] bytes"
            )
        return size

    def _derive_write_position(self) -> tuple[int, int]:
        """The head data page and offset: just after item head - 1, or a fresh page."""
        if self._head > 0:
            try:
                page_no, off, length, ts = self._raw_index_item(self._head - 1)
                if self._data.exists(page_no):
                    self._last_ts = ts
                    return page_no, off + length
            except FileNotFoundError:
                pass
        existing = self._data.page_numbers()
        return (existing[-1] + 1 if existing else 0), 0

    def _raw_index_item(self, index: int) -> IndexItem:
        with self._index.using(fmt.index_page_of(index)) as page:
            return index_item_of(unpack_index_item(page.mm, fmt.index_slot_offset(index)))

    def _recover(self, check_items: int) -> Recovery:
        """Roll head back past damaged items at the end; returns what was dropped.

        Items beyond the last index page file are dropped at once; then windows of
        ``check_items`` items below head are checked, going further back only while a
        whole window is damaged (a truncated page can hold more items than a window).
        """
        head, tail = self._head, self._tail
        if head == tail:
            return Recovery(head, head)
        index_pages = self._index.page_numbers()
        last_page = index_pages[-1] if index_pages else -1
        first_bad = min(head, max(tail, fmt.first_index_of_page(last_page + 1)))
        hi = first_bad
        window = max(check_items, 1)
        while hi > tail:
            start = max(tail, hi - window)
            bad = self._first_bad_item(start, hi)
            if bad is None:
                break
            first_bad = bad
            if bad > start:
                break
            hi = start  # the whole window is damaged: look further back
        if first_bad < head:
            log.warning(
                "array %s: dropped %d damaged item(s) at the end (indexes %d..%d); head rolled back to %d",
                self.path,
                head - first_bad,
                first_bad,
                head - 1,
                first_bad,
            )
            self._head = first_bad
            I64.pack_into(self._meta_page.mm, fmt.META_HEAD_OFFSET, first_bad)
            self._meta_page.flush()
        return Recovery(head, self._head)

    def _first_bad_item(self, start: int, end: int) -> int | None:
        """The first index in [start, end) whose index item is damaged, or None."""
        records = []
        idx = start
        first_bad: int | None = None
        while idx < end:
            page_no = fmt.index_page_of(idx)
            slot = fmt.index_slot(idx)
            m = min(end - idx, fmt.slots_left_in_page(idx))
            if self._index.file_size(page_no) < fmt.INDEX_PAGE_SIZE:
                first_bad = idx
                break
            with self._index.using(page_no) as page:
                assert page.view is not None
                records.append(page.view[slot : slot + m].copy())
            idx += m
        if records:
            rec = np.concatenate(records)
            pages = rec["page"].astype(np.int64)
            offsets = rec["offset"].astype(np.int64)
            lengths = rec["length"].astype(np.int64)
            sizes = {int(p): self._data.file_size(int(p)) for p in np.unique(pages) if p >= 0}
            page_sizes = np.array([sizes.get(int(p), -1) for p in pages], dtype=np.int64)
            stamps = rec["timestamp"].astype(np.int64)
            # Every append writes a timestamp >= 1, so 0 marks a record never written.
            ok = (pages >= 0) & (offsets >= 0) & (lengths >= 0) & (offsets + lengths <= page_sizes) & (stamps > 0)
            # End offsets: at least index + 1 (no item holds fewer than one record) and
            # increasing strictly (an aux of 0 after a counted item is damage too).
            aux = rec["aux"].astype(np.uint64)
            indexes = np.arange(start + 1, start + 1 + len(rec), dtype=np.int64)
            ends = np.where(aux == 0, indexes, (aux & np.uint64(fmt.OFFSET_MASK)).astype(np.int64))
            ok &= ends >= indexes
            ok[1:] &= ends[1:] > ends[:-1]
            # Consecutive items follow each other in a page, or the next starts a later page.
            same_page = pages[1:] == pages[:-1]
            follows = np.where(
                same_page,
                offsets[1:] >= offsets[:-1] + lengths[:-1],  # a failed batch may leave a gap
                (pages[1:] > pages[:-1]) & (offsets[1:] == 0),
            )
            ok[1:] &= follows
            bad = np.flatnonzero(~ok)
            if bad.size:
                return start + int(bad[0])
        return first_bad
