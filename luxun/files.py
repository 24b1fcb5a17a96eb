"""Small files replaced crash-safely: after a crash a reader finds the old content or
the new, whole, never a mix or nothing.

:func:`replace_file` writes the new content to ``<path>.new`` (never ``.tmp``: the
Kafka door's ``kafka.json.tmp`` means "creation under way"), fsyncs it, renames it over
``path`` and fsyncs the directory, so the rename itself survives a power cut. A
``.new`` left by a crash is garbage: the next write replaces it.

Thread-safety: callers serialise writes to one path.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["replace_file"]


def replace_file(path: str, data: bytes) -> None:
    """Make ``data`` the content of ``path``, crash-safely (see the module).

    Raises:
        OSError: the disk refused; ``path`` keeps its old content.
    """
    tmp = path + ".new"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
