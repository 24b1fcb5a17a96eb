"""Memory-mapped page files and the page factory that maps them on demand.

A :class:`PageFactory` owns one folder of ``page-<N>.dat`` files of one size. Pages
are mapped when first used and kept in a bounded LRU cache with an idle time-to-live
(``cachetools.TTLCache``). Every user holds a reference while it touches a page, so a
page in use is never unmapped: a page the cache evicts while in use is unmapped when
its last user releases it. The number of mapped pages is therefore at most
``max_cached_pages`` plus the pages in use at that moment.

Thread-safety: all methods may be called from any thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from cachetools import TTLCache

from .errors import ArrayClosedError, DiskFullError
from .format import page_file_name, parse_page_file_name

log = logging.getLogger(__name__)

#: Default number of idle pages kept mapped per folder.
DEFAULT_MAX_CACHED_PAGES = 8
#: Default idle time after which a page is unmapped, in seconds.
DEFAULT_PAGE_TTL_S = 10.0


class MappedPage:
    """One mapped page file. ``mm`` is the mapping; ``view`` an optional numpy view.

    Only a :class:`PageFactory` creates and closes pages; users hold a reference
    (``PageFactory.acquire``/``release``) while they use ``mm`` or ``view``.
    """

    __slots__ = ("cached", "mm", "page_no", "path", "refs", "touched", "view")

    def __init__(self, page_no: int, path: str, mm: mmap.mmap, view: np.ndarray[Any, Any] | None) -> None:
        self.page_no = page_no
        self.path = path
        self.mm = mm
        self.view = view
        self.refs = 0
        self.cached = False
        self.touched = 0.0

    def flush(self) -> None:
        """Write the page's dirty memory back to its file (msync)."""
        if not self.mm.closed:
            self.mm.flush()

    def close(self) -> None:
        """Unmap the page. The numpy view is dropped first so the mapping can close."""
        self.view = None
        if not self.mm.closed:
            try:
                self.mm.close()
            except BufferError:
                # A numpy view of the page is still alive somewhere (a bug in a caller):
                # the mapping goes when that view is garbage collected.
                log.warning("page %s is still referenced; it will be unmapped when released", self.path)


class _PageCache(TTLCache):  # type: ignore[type-arg]
    """A TTLCache that tells its owner about every page it drops (LRU or idle)."""

    def __init__(self, maxsize: int, ttl: float, on_evict: Callable[[MappedPage], None]) -> None:
        super().__init__(maxsize=maxsize, ttl=ttl, timer=time.monotonic)
        self._on_evict = on_evict

    def popitem(self) -> tuple[int, MappedPage]:
        key, page = super().popitem()
        self._on_evict(page)
        return key, page

    def expire(self, time: float | None = None) -> list[tuple[int, MappedPage]]:
        expired: list[tuple[int, MappedPage]] = super().expire(time)
        for _, page in expired:
            self._on_evict(page)
        return expired


class PageFactory:
    """Maps the page files of one folder on demand, with an LRU + idle-TTL cache.

    Args:
        folder: directory of the page files; created if missing.
        page_size: size of every page file in bytes.
        max_cached_pages: idle pages kept mapped (the LRU bound).
        ttl_s: a page not used for this long is unmapped.
        dtype: if given, every page also gets a numpy view of this dtype.
        preallocate: create new page files at full size with ``posix_fallocate``
            (so a full disk fails here, never as SIGBUS on a later write).
    """

    def __init__(
        self,
        folder: str,
        page_size: int,
        *,
        max_cached_pages: int = DEFAULT_MAX_CACHED_PAGES,
        ttl_s: float = DEFAULT_PAGE_TTL_S,
        dtype: np.dtype[Any] | None = None,
        preallocate: bool = True,
    ) -> None:
        if max_cached_pages < 1:
            raise ValueError(f"max_cached_pages must be >= 1, got {max_cached_pages}")
        self.folder = folder
        self.page_size = page_size
        self._dtype = dtype
        self._preallocate = preallocate
        self._lock = threading.Lock()
        self._mapped: dict[int, MappedPage] = {}
        self._closed = False
        self._cache = _PageCache(max_cached_pages, ttl_s, self._evicted)
        self._touch_interval_s = min(ttl_s / 8, 0.05)
        os.makedirs(folder, exist_ok=True)

    # -- paths and files -------------------------------------------------------------
    def page_path(self, page_no: int) -> str:
        """Path of page ``page_no``'s file."""
        return os.path.join(self.folder, page_file_name(page_no))

    def page_numbers(self) -> list[int]:
        """Sorted numbers of the page files present in the folder."""
        numbers = []
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.folder):
                n = parse_page_file_name(name)
                if n is not None:
                    numbers.append(n)
        numbers.sort()
        return numbers

    def exists(self, page_no: int) -> bool:
        """True if page ``page_no``'s file exists."""
        return os.path.exists(self.page_path(page_no))

    def file_size(self, page_no: int) -> int:
        """Size in bytes of page ``page_no``'s file, or -1 when it does not exist."""
        try:
            return os.stat(self.page_path(page_no)).st_size
        except FileNotFoundError:
            return -1

    def total_file_size(self) -> int:
        """Summed size of all page files in the folder, in bytes."""
        total = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self.folder) as it:
            for entry in it:
                if parse_page_file_name(entry.name) is not None:
                    with contextlib.suppress(FileNotFoundError):
                        total += entry.stat().st_size
        return total

    # -- mapping -----------------------------------------------------------------------
    def acquire(self, page_no: int, *, create: bool = False) -> MappedPage:
        """Map page ``page_no`` (or reuse its mapping) and take a reference to it.

        Raises:
            FileNotFoundError: the page file does not exist and ``create`` is False.
            ArrayClosedError: the factory was closed.
            DiskFullError: a new page file could not be allocated.
        """
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise ArrayClosedError(f"pages in {self.folder} are closed")
            page = self._mapped.get(page_no)
            if page is None:
                page = self._map(page_no, create)
                self._mapped[page_no] = page
            page.refs += 1
            # (Re)inserting refreshes both the LRU order and the idle deadline; for a
            # page used moments ago that is skipped, which keeps hot reads cheap.
            if not page.cached or now - page.touched > self._touch_interval_s:
                self._cache[page_no] = page
                page.cached = True
                page.touched = now
            return page

    def release(self, page: MappedPage) -> None:
        """Give back a reference taken by :meth:`acquire`."""
        with self._lock:
            page.refs -= 1
            if page.refs == 0 and not page.cached:
                self._unmap(page)

    @contextlib.contextmanager
    def using(self, page_no: int) -> Iterator[MappedPage]:
        """``with factory.using(n) as page:`` acquire and release an existing page."""
        page = self.acquire(page_no)
        try:
            yield page
        finally:
            self.release(page)

    def mapped_count(self) -> int:
        """Number of pages currently mapped (cached or in use)."""
        with self._lock:
            return len(self._mapped)

    def expire_idle(self) -> None:
        """Unmap pages idle for longer than the TTL now (the cache also does it lazily)."""
        with self._lock:
            self._cache.expire()

    def flush(self) -> None:
        """msync every mapped page."""
        with self._lock:
            pages = list(self._mapped.values())
        for page in pages:
            page.flush()

    def delete_pages_before(self, page_no: int) -> int:
        """Unmap and delete every page file numbered below ``page_no``; return how many.

        A page still in use by a reader stays mapped until it is released; its file is
        unlinked now and the kernel frees the space once the mapping goes.
        """
        deleted = 0
        for n in self.page_numbers():
            if n >= page_no:
                break
            self.delete_page(n)
            deleted += 1
        return deleted

    def delete_page(self, page_no: int) -> None:
        """Unmap (unless in use) and delete one page file."""
        with self._lock:
            page = self._mapped.get(page_no)
            if page is not None:
                self._cache.pop(page_no, None)
                page.cached = False
                if page.refs == 0:
                    self._unmap(page)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.page_path(page_no))

    def close(self) -> None:
        """Flush and unmap every page, in use or not."""
        with self._lock:
            self._closed = True
            self._cache.clear()
            for page in list(self._mapped.values()):
                page.flush()
                page.close()
            self._mapped.clear()

    # -- internals (called with the lock held) -------------------------------------
    def _evicted(self, page: MappedPage) -> None:
        page.cached = False
        if page.refs == 0:
            self._unmap(page)

    def _unmap(self, page: MappedPage) -> None:
        # No msync: unmapping a shared mapping keeps its dirty pages in the kernel's
        # page cache, so a process crash loses nothing; flush() is for machine crashes.
        if self._mapped.get(page.page_no) is page:
            del self._mapped[page.page_no]
        page.close()

    def _map(self, page_no: int, create: bool) -> MappedPage:
        path = self.page_path(page_no)
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size < self.page_size:
                if not create:
                    log.warning("page file %s is %d bytes, shorter than %d: extending", path, size, self.page_size)
                self._allocate(fd, path, size)
            mm = mmap.mmap(fd, self.page_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        view = np.frombuffer(mm, dtype=self._dtype) if self._dtype is not None else None
        return MappedPage(page_no, path, mm, view)

    def _allocate(self, fd: int, path: str, size: int) -> None:
        try:
            if self._preallocate:
                try:
                    os.posix_fallocate(fd, size, self.page_size - size)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    os.ftruncate(fd, self.page_size)  # file system without fallocate
            else:
                os.ftruncate(fd, self.page_size)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                # Leave no half-allocated page behind: a new file is removed again.
                if size == 0:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                raise DiskFullError(
                    exc.errno, f"cannot allocate page file {path} of {self.page_size} bytes: {exc.strerror}"
                ) from exc
            raise
