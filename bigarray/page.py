"""Memory-mapped page files and the page factory that maps them on demand.

A :class:`PageFactory` owns one folder of ``page-<N>.dat`` files of one size. Pages
are mapped when first used and kept in a bounded LRU cache with an idle time-to-live
(``cachetools.TTLCache``). Every user holds a reference while it touches a page, so a
page in use is never unmapped: a page the cache evicts while in use is unmapped when
its last user releases it. The number of mapped pages is therefore at most
``max_cached_pages`` plus the pages in use at that moment. (One user goes without a
reference: ``BigArray.get`` rereads the pages of its previous call directly, and falls
back to ``acquire`` when one was unmapped meanwhile: a closed ``mmap`` raises
ValueError, under the GIL, before any memory is touched.)

Disk space. A factory made with ``reserve_step`` (the index and data pages of an
array) creates each page file *sparse* at its full size (``ftruncate``): every mapping,
ours or Java bigqueue's, sees the whole page, but the file takes no disk blocks yet.
Space is then reserved with ``posix_fallocate`` in steps ahead of the writer
(:meth:`PageFactory.reserve`): the writer asks for room before it copies a byte, the
reservation grows geometrically (the first step is ``FIRST_RESERVE_STEP``, each next
one doubles what the page holds, up to ``reserve_step``), and a step that cannot be
allocated raises :class:`DiskFullError` before anything lands in it. Writing through a
mapping into a hole of a full file system would be a SIGBUS; into a reserved range it
never is. A factory without ``reserve_step`` (the tiny meta and group pages) allocates
each new page whole when it creates it.

Thread-safety: all methods may be called from any thread; :meth:`PageFactory.reserve`
of one page by one writer at a time (the array's lock).
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
from .prefetch import PREFETCHER

log = logging.getLogger(__name__)

#: Default number of idle pages kept mapped per folder.
DEFAULT_MAX_CACHED_PAGES = 8
#: Default idle time after which a page is unmapped, in seconds.
DEFAULT_PAGE_TTL_S = 10.0
#: Default largest reservation step (posix_fallocate) of index and data pages. Measured
#: on ext4 here: 7.7 us per call for 1 MiB steps, 10 us for 4 MiB ones, so at 4 MiB the
#: reservations cost ~2.6 us per MiB written (well under 1% of copying it).
DEFAULT_RESERVE_STEP = 4 * 1024 * 1024
#: The first reservation of a page (capped by ``reserve_step``): what a page holding a
#: few small items takes on disk.
FIRST_RESERVE_STEP = 256 * 1024
#: Reservations are whole multiples of this (the usual file system block and memory page).
RESERVE_ALIGN = 4096
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_NO_FALLOCATE_ERRNOS = (errno.EOPNOTSUPP, errno.EINVAL)


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


class MappedPage:
    """One mapped page file. ``mm`` is the mapping; ``view`` an optional numpy view.

    Only a :class:`PageFactory` creates and closes pages; users hold a reference
    (``PageFactory.acquire``/``release``) while they use ``mm`` or ``view``.
    """

    __slots__ = ("cached", "mm", "page_no", "path", "refs", "reserved", "touched", "view")

    def __init__(
        self, page_no: int, path: str, mm: mmap.mmap, view: np.ndarray[Any, Any] | None, reserved: int
    ) -> None:
        self.page_no = page_no
        #: Bytes from the start of the page known to be allocated on disk (see reserve).
        self.reserved = reserved
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
                # A view of the page is still alive (a reply being sent from it, see
                # BigArray.read_range_view, or the prefetch thread faulting in a step, see
                # Prefetcher.populate): the mapping goes when that view is released.
                log.debug("page %s is still referenced; it will be unmapped when released", self.path)


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
        reserve_step: None: a new page file is allocated whole (``posix_fallocate``)
            when it is created. A number of bytes: new page files are created sparse at
            full size and space is reserved in steps of at most this many bytes by
            :meth:`reserve` (a multiple of 4096).
    """

    def __init__(
        self,
        folder: str,
        page_size: int,
        *,
        max_cached_pages: int = DEFAULT_MAX_CACHED_PAGES,
        ttl_s: float = DEFAULT_PAGE_TTL_S,
        dtype: np.dtype[Any] | None = None,
        reserve_step: int | None = None,
    ) -> None:
        if max_cached_pages < 1:
            raise ValueError(f"max_cached_pages must be >= 1, got {max_cached_pages}")
        if reserve_step is not None and (reserve_step < RESERVE_ALIGN or reserve_step % RESERVE_ALIGN):
            raise ValueError(f"reserve_step must be a positive multiple of {RESERVE_ALIGN}, got {reserve_step}")
        self.folder = folder
        self.page_size = page_size
        self._dtype = dtype
        self._step = reserve_step
        self._first_step = min(reserve_step or page_size, FIRST_RESERVE_STEP)
        self._lock = threading.Lock()
        self._mapped: dict[int, MappedPage] = {}
        self._closed = False
        self._cache = _PageCache(max_cached_pages, ttl_s, self._evicted)
        self._touch_interval_s = min(ttl_s / 8, 0.05)
        os.makedirs(folder, exist_ok=True)

    @property
    def first_step(self) -> int:
        """Bytes a page's first reservation takes (what a new, nearly empty page holds
        on disk)."""
        return self._first_step

    @property
    def reserve_step(self) -> int:
        """The largest step a reservation takes (the page size for factories that
        allocate whole pages)."""
        return self._step or self.page_size

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

    def allocated_size(self) -> int:
        """Disk space taken by the page files in the folder (``st_blocks``), in bytes."""
        total = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self.folder) as it:
            for entry in it:
                if parse_page_file_name(entry.name) is not None:
                    with contextlib.suppress(FileNotFoundError):
                        total += entry.stat().st_blocks * 512
        return total

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
    def acquire(self, page_no: int, *, create: bool = False, reserve: int = 0) -> MappedPage:
        """Map page ``page_no`` (or reuse its mapping) and take a reference to it.

        With ``reserve``, the first ``reserve`` bytes of a page file this call creates
        are reserved on disk (see :meth:`reserve`) before it is mapped; if that fails,
        the new file is removed again. (For a page that exists, call :meth:`reserve`.)

        Raises:
            FileNotFoundError: the page file does not exist and ``create`` is False.
            ArrayClosedError: the factory was closed.
            DiskFullError: a new page file could not be made or reserved.
        """
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise ArrayClosedError(f"pages in {self.folder} are closed")
            page = self._mapped.get(page_no)
            if page is None:
                page = self._map(page_no, create, reserve)
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

    def reserve(self, page: MappedPage, end: int) -> None:
        """Make sure bytes [0, ``end``) of ``page`` are allocated on disk before anyone
        writes them. Beyond ``end`` one more step is reserved: the step is what the page
        already holds (doubling it), at least FIRST_RESERVE_STEP and at most
        ``reserve_step``, rounded to 4096 and capped by the page size. A no-op (one
        comparison) when ``end`` is already reserved, and for factories that allocate
        whole pages.

        Called by the page's only writer (the array's lock held), not with the factory
        lock: other threads keep mapping pages while the file system allocates.

        Raises:
            DiskFullError: the file system (or the file size limit) has no room; the
                page is left as it was, its reserved bytes still usable.
        """
        if end <= page.reserved:
            return
        fd = os.open(page.path, os.O_RDWR)
        try:
            self._reserve_fd(page, fd, end)
        finally:
            os.close(fd)

    def _reserve_target(self, reserved: int, end: int) -> int:
        assert self._step is not None
        ahead = min(max(reserved, self._first_step), self._step)
        return min(self.page_size, _round_up(max(end, reserved + ahead), RESERVE_ALIGN))

    def _reserve_fd(self, page: MappedPage, fd: int, end: int) -> None:
        page.reserved = self._reserve_range(fd, page.path, page.reserved, end)

    def _reserve_range(self, fd: int, path: str, start: int, end: int) -> int:
        """Allocate from ``start`` (reserved so far) to past ``end``; the new reserved end."""
        target = self._reserve_target(start, end)
        try:
            os.posix_fallocate(fd, start, target - start)
        except OSError as exc:
            if exc.errno in _NO_FALLOCATE_ERRNOS:
                return self.page_size  # a file system without fallocate: nothing to reserve with
            if exc.errno in _DISK_FULL_ERRNOS:
                raise DiskFullError(
                    exc.errno, f"cannot reserve bytes {start}..{target} of page file {path}: {exc.strerror}"
                ) from exc
            raise
        return target

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
        """Unmap (unless in use) and delete one page file (and any read-ahead of it
        still queued: see :meth:`Prefetcher.forget_file`)."""
        PREFETCHER.forget_file(self.page_path(page_no))
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

    def _map(self, page_no: int, create: bool, reserve: int) -> MappedPage:
        path = self.page_path(page_no)
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o644)
        try:
            size = os.fstat(fd).st_size
            reserved = self.page_size if self._step is None else 0
            if size < self.page_size:
                if not create:
                    log.warning("page file %s is %d bytes, shorter than %d: extending", path, size, self.page_size)
                self._extend(fd, path, size)
            if reserve and self._step is not None:
                try:
                    reserved = self._reserve_range(fd, path, 0, reserve)
                except BaseException:
                    if size == 0:  # leave no page file behind that this call made
                        with contextlib.suppress(OSError):
                            os.unlink(path)
                    raise
            mm = mmap.mmap(fd, self.page_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        view = np.frombuffer(mm, dtype=self._dtype) if self._dtype is not None else None
        return MappedPage(page_no, path, mm, view, reserved)

    def _extend(self, fd: int, path: str, size: int) -> None:
        """Bring a page file to its full size: sparse (stepped factories; the space
        comes from reserve) or allocated whole."""
        try:
            if self._step is None:
                try:
                    os.posix_fallocate(fd, size, self.page_size - size)
                except OSError as exc:
                    if exc.errno not in _NO_FALLOCATE_ERRNOS:
                        raise
                    os.ftruncate(fd, self.page_size)  # file system without fallocate
            else:
                os.ftruncate(fd, self.page_size)
        except OSError as exc:
            if exc.errno in _DISK_FULL_ERRNOS:
                # Leave no half-made page behind: a new file is removed again.
                if size == 0:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                raise DiskFullError(
                    exc.errno, f"cannot allocate page file {path} of {self.page_size} bytes: {exc.strerror}"
                ) from exc
            raise
