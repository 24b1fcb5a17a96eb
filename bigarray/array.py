"""BigArray: an append-only, memory-mapped array of byte items, persisted on disk.

See :mod:`bigarray.format` for the bytes on disk and the crash guarantees.

Thread-safety: every method may be called from any thread. Appends, retention and
close are serialised by one lock; reads take no array lock (head is the read barrier),
so many threads read while one appends.

This module opens and closes an array; what it does in between is in the parts
:class:`BigArray` is composed of (mixins on :class:`bigarray.core.ArrayCore`, whose
methods are found on the class as before: no call added): :mod:`bigarray.write`
(append, append_many), :mod:`bigarray.read` (get, read_range*),
:mod:`bigarray.offsets` (record offsets, kinds, timestamps), :mod:`bigarray.recovery`
(the checks at open after a crash) and :mod:`bigarray.retention` (remove_before*,
limit_back_file_size).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Callable
from types import TracebackType

from . import format as fmt
from .codec import BE_I64, HEAD_TAIL
from .core import DISK_FULL_ERRNOS, NO_PAGE, now_ms
from .errors import ArrayLockedError, CorruptArrayError, DiskFullError
from .offsets import ArrayOffsets
from .page import DEFAULT_MAX_CACHED_PAGES, DEFAULT_PAGE_TTL_S, DEFAULT_RESERVE_STEP, MappedPage, PageFactory
from .prefetch import PREFETCHER
from .read import ArrayReads
from .recovery import DEFAULT_RECOVERY_CHECK_ITEMS, ArrayRecovery, Recovery
from .retention import ArrayRetention
from .write import ArrayWrites

__all__ = ["DEFAULT_RECOVERY_CHECK_ITEMS", "BigArray", "Recovery", "now_ms"]


class BigArray(ArrayWrites, ArrayReads, ArrayOffsets, ArrayRetention, ArrayRecovery):
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
        self._counted_data_fast_end = -1
        self._counted_index_fast_end = -1
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
        self._counted_data_fast_end = self._counted_index_fast_end = -1
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
