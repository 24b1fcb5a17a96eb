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
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import threading
import time

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_MAX_PENDING = 64


class Prefetcher:
    """One daemon thread that creates, allocates and reads ahead page files."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[str, int, int, int | None]] = queue.Queue(maxsize=_MAX_PENDING)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._buf = bytearray(_CHUNK)
        self._idle = threading.Condition(threading.Lock())
        self._current: str | None = None
        self._forgotten: set[str] = set()
        self._cancel = False

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

    def prefetch(self, path: str, size: int, start: int = 0, *, reserve: int | None = None) -> None:
        """Ask for ``path`` (``size`` bytes) to be read from ``start``.

        With ``reserve`` (bytes), a missing or short file is first created sparse at
        ``size`` bytes and its first ``reserve`` bytes are allocated (posix_fallocate).
        Without it, a missing file is left missing. Never blocks: when too many requests
        are pending, this one is dropped.
        """
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="bigarray-prefetch", daemon=True)
                self._thread.start()
        with contextlib.suppress(queue.Full):
            self._jobs.put_nowait((path, size, start, reserve))

    def _run(self) -> None:
        while True:
            path, size, start, reserve = self._jobs.get()
            with self._idle:
                if any(path.startswith(prefix) for prefix in self._forgotten):
                    continue
                self._current = path
            try:
                self._populate(path, size, start, reserve)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                    log.debug("prefetch of %s failed: %s", path, exc)
            finally:
                with self._idle:
                    self._current = None
                    self._cancel = False
                    if self._jobs.empty():
                        self._forgotten.clear()  # no queued job can refer to them any more
                    self._idle.notify_all()

    def _populate(self, path: str, size: int, start: int, reserve: int | None) -> None:
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


#: The process-wide prefetcher shared by all arrays.
PREFETCHER = Prefetcher()
