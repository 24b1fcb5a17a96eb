"""The bigarray exception tree.

::

    BigArrayError                 base of everything this package raises
    ├── ArrayClosedError          the array or queue was closed by its owner
    ├── ArrayLockedError          another process (or object) holds the directory
    ├── IndexOutOfRangeError      an index outside [tail, head)
    ├── ArrayEmptyError           a lookup that needs at least one item
    ├── ItemTooLargeError         an item larger than a data page
    ├── InvalidNameError          a bad group (or topic) name
    ├── CorruptArrayError         on-disk state that cannot be recovered automatically
    └── DiskFullError             no space (or file size limit) for a new page or a reservation step

Each error has a ``retriable`` flag: True when trying the same call later can succeed.
"""

from __future__ import annotations


class BigArrayError(Exception):
    """Base class of every error raised by bigarray."""

    retriable = False


class ArrayClosedError(BigArrayError):
    """The array or queue was closed; it cannot be used any more."""


class ArrayLockedError(BigArrayError):
    """The array directory is held by another process or open object."""

    retriable = True


class IndexOutOfRangeError(BigArrayError, IndexError):
    """An index outside the readable range [tail, head)."""

    def __init__(self, index: int, tail: int, head: int) -> None:
        super().__init__(f"index {index} is outside the readable range [{tail}, {head})")
        self.index = index
        self.tail = tail
        self.head = head


class ArrayEmptyError(BigArrayError):
    """The array holds no items, and the call needs at least one."""

    retriable = True


class ItemTooLargeError(BigArrayError, ValueError):
    """An item is larger than a data page (items never span pages)."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"item of {length} bytes is larger than the data page size of {limit} bytes")
        self.length = length
        self.limit = limit


class InvalidNameError(BigArrayError, ValueError):
    """A group or topic name breaks the naming rules."""


class CorruptArrayError(BigArrayError):
    """On-disk state that cannot be repaired automatically."""


class DiskFullError(BigArrayError, OSError):
    """A page file could not be made, or disk space not reserved ahead of the writer:
    the disk (or the file size limit) is full. Raised before any byte lands in
    unreserved space (a write there would be a SIGBUS); the failed append is not
    committed (head does not move).

    Nothing already appended is lost; appends can resume once space is freed.
    """

    retriable = True
