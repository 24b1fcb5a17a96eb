"""Background pre-population of page files the writer is about to use.

Writing through a mapping into a page the kernel has not yet brought into its page
cache costs a slow fault per 4 KiB (about 350 MB/s on our 2-core machine), and that
cost is paid with the array's lock held. Reading the page with ``pread`` instead
brings it into the page cache *clean* (nothing extra is written to disk), and it
releases the GIL, so a daemon thread does it on another core while the writer goes
on; the writer's later faults are then minor (3-12 GB/s measured).

The prefetcher reads, and for a page file that does not exist yet it creates it as the
writer would: sparse at full size, with only its first reservation step allocated (see
:mod:`bigarray.page`), so a read-ahead page of a quiet topic costs one step of disk, not
a whole page. Reading the rest of a sparse page brings zeroed pages into the page cache
and allocates nothing on disk. A page it is still reading can be written at the same
time without harm, so nobody ever waits for it. If allocation fails (full disk) it
gives up quietly: the writer's own reservation then raises ``DiskFullError`` as usual.

Where the kernel has ``MADV_POPULATE_WRITE`` (Linux 5.14+), data pages are not read at
all: the writer asks for each step of its mapping it has just reserved on disk, and the
thread faults that range in, writable, with one ``madvise`` per 4 MiB (:meth:`populate`),
so the writer's copies take no fault at all. Measured here per 128 MiB page written in
10 KB copies (CPU ms, background + writer): no read-ahead 0 + 75-147, ``pread`` of the
page 88-140 + 48-51, ``MADV_POPULATE_WRITE`` 56-61 + 15.5. The ``pread`` copies every
byte out to a buffer nobody reads: with a broker taking 250 MB/s that thread used half a
core of our two. Only reserved bytes are populated, so a full disk is still met by the
writer's reservation and never by a fault.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_POPULATE_CHUNK = 4 << 20
_MAX_PENDING = 64
_MADV_POPULATE_WRITE = 23  # <linux/mman.h>, Linux 5.14+


def _find_madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise`` through ctypes (which lets go of the GIL during the call) if
    it accepts MADV_POPULATE_WRITE here, else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        anchor = ctypes.c_char.from_buffer(probe)
        ok = madvise(ctypes.addressof(anchor), mmap.PAGESIZE, _MADV_POPULATE_WRITE) == 0
        del anchor
    finally:
        probe.close()
    return madvise if ok else None


class Prefetcher:
    """One daemon thread that creates, allocates and reads ahead page files, and
    faults in the reserved steps of the pages being written."""

    def __init__(self) -> None:
        #: (path, size or end, start, reserve, mapping): a read job has no mapping
        self._jobs: queue.Queue[tuple[str, int, int, int | None, mmap.mmap | None]] = queue.Queue(maxsize=_MAX_PENDING)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._buf = bytearray(_CHUNK)
        self._idle = threading.Condition(threading.Lock())
        self._current: str | None = None
        self._forgotten: set[str] = set()
        self._cancel = False
        self._madvise = _find_madvise()

    @property
    def populates(self) -> bool:
        """True when :meth:`populate` works here (else writers read ahead with
        :meth:`prefetch`, as on kernels before 5.14)."""
        return self._madvise is not None

    def forget(self, folder: str) -> None:
        """Drop queued work under ``folder`` and wait for the running job there to end.

        Called when an array closes, so no page file appears in it afterwards, not even
        once a new array opens at the same path (a topic deleted and re-created).
        """
        self._forget(folder.rstrip(os.sep) + os.sep)

    def forget_file(self, path: str) -> None:
        """Drop queued work on the page file ``path`` and wait for a running job on it
        to end. Called before the file is deleted (retention), so that a job queued
        while the writer passed that page, and run late on a busy machine, does not
        create it again behind the array's tail."""
        self._forget(path)

    def _forget(self, prefix: str) -> None:
        if self._thread is None:  # nothing was ever asked: nothing to forget (and no set to grow)
            return
        with self._idle:
            self._forgotten.add(prefix)  # cleared when the queue next runs empty
            with self._jobs.mutex:  # queued jobs go now: a later remember() must not revive them
                kept = [job for job in self._jobs.queue if not job[0].startswith(prefix)]
                if len(kept) < len(self._jobs.queue):
                    self._jobs.queue.clear()
                    self._jobs.queue.extend(kept)
                    self._jobs.not_full.notify_all()
            while self._current is not None and self._current.startswith(prefix):
                self._cancel = True  # the running read stops at its next chunk
                self._idle.wait(0.1)

    def remember(self, folder: str) -> None:
        """Accept work under ``folder`` again (an array opened there)."""
        prefix = folder.rstrip(os.sep) + os.sep
        with self._idle:
            self._forgotten = {p for p in self._forgotten if not p.startswith(prefix)}

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no job is queued or running; False if that took over ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._current is not None or not self._jobs.empty():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.1))
        return True

    def prefetch(self, path: str, size: int, start: int = 0, *, reserve: int | None = None, read: bool = True) -> None:
        """Ask for ``path`` (``size`` bytes) to be read from ``start`` (with ``read``
        False: not read at all, only created as below).

        With ``reserve`` (bytes), a missing or short file is first created sparse at
        ``size`` bytes and its first ``reserve`` bytes are allocated (posix_fallocate).
        Without it, a missing file is left missing. Never blocks: when too many requests
        are pending, this one is dropped.
        """
        self._queue((path, size, start if read else size, reserve, None))

    def populate(self, path: str, mapping: mmap.mmap, start: int, end: int) -> None:
        """Ask for bytes [``start``, ``end``) of ``mapping`` (the writable shared mapping
        of page file ``path``) to be faulted in for writing, so that the writer's later
        copies there take no page fault. Only for bytes already allocated on disk (a
        fault into a hole of a full file system would fail, or be a SIGBUS for the
        writer); ``start`` is rounded up to a whole memory page. The job keeps the
        mapping until it ends, so a page closed meanwhile is unmapped after it. Does
        nothing where :attr:`populates` is False; never blocks, as :meth:`prefetch`."""
        start = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        if self._madvise is not None and start < end:
            self._queue((path, end, start, None, mapping))

    def _queue(self, job: tuple[str, int, int, int | None, mmap.mmap | None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="bigarray-prefetch", daemon=True)
                self._thread.start()
        with contextlib.suppress(queue.Full):
            self._jobs.put_nowait(job)

    def _run(self) -> None:
        while True:
            path, size, start, reserve, mapping = self._jobs.get()
            with self._idle:
                if any(path.startswith(prefix) for prefix in self._forgotten):
                    mapping = None
                    continue
                self._current = path
            try:
                if mapping is None:
                    self._read_ahead(path, size, start, reserve)
                else:
                    self._populate_mapping(mapping, start, size)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                    log.debug("prefetch of %s failed: %s", path, exc)
            finally:
                del mapping  # not kept while waiting for the next job
                with self._idle:
                    self._current = None
                    self._cancel = False
                    if self._jobs.empty():
                        self._forgotten.clear()  # no queued job can refer to them any more
                    self._idle.notify_all()

    def _read_ahead(self, path: str, size: int, start: int, reserve: int | None) -> None:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if reserve is not None else 0), 0o644)
        try:
            if reserve is not None and os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
                if reserve:
                    os.posix_fallocate(fd, 0, min(reserve, size))
            buf = [self._buf]
            off = start - start % 4096
            while off < size and not self._cancel:
                if os.preadv(fd, buf, off) <= 0:
                    break
                off += _CHUNK
        finally:
            os.close(fd)

    def _populate_mapping(self, mapping: mmap.mmap, start: int, end: int) -> None:
        assert self._madvise is not None
        try:
            # Pins the mapping: its close() raises BufferError (MappedPage.close leaves
            # it to be unmapped when the last reference goes) until the anchor is gone.
            anchor = ctypes.c_char.from_buffer(mapping)
        except (ValueError, TypeError):  # closed already
            return
        try:
            base = ctypes.addressof(anchor)
            off = start
            while off < end and not self._cancel:
                n = min(_POPULATE_CHUNK, end - off)
                if self._madvise(base + off, n, _MADV_POPULATE_WRITE) != 0:
                    err = ctypes.get_errno()
                    log.debug("populating bytes %d..%d failed: %s", off, off + n, os.strerror(err))
                    return
                off += n
        finally:
            del anchor


#: The process-wide prefetcher shared by all arrays.
PREFETCHER = Prefetcher()
