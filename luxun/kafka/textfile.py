"""Small text files that several writers edit (the users file, the ACL file): a lock
every writer holds while it reads, changes and writes, and a crash-safe replace.

A writer holds an exclusive ``flock`` on ``<path>.lock`` (:func:`writers_lock`) from
reading the file to renaming the new one over it, so two writers (the broker answering
an API, a ``luxun`` command) never lose each other's change. :func:`replace_text`
writes a temporary file in the same directory, fsyncs it, renames it over ``path`` and
fsyncs the directory: a crash leaves the old file or the new one, never half of one.

Thread-safety: the lock is per open file description, so threads of one process must
also serialise among themselves (the callers do, with their own lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator

__all__ = ["replace_text", "writers_lock"]


@contextlib.contextmanager
def writers_lock(path: str) -> Iterator[None]:
    """Hold the writers' lock of ``path`` (an ``flock`` on ``<path>.lock``, made if missing)."""
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def replace_text(path: str, text: str, *, mode: int = 0o600) -> None:
    """Make ``text`` (UTF-8) the content of ``path``, crash-safely, with permissions ``mode``.

    Raises:
        OSError: it cannot be written (``path`` is then as it was).
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + "-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself is durable once the directory is
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
