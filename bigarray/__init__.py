"""bigarray: a fast, big, persistent queue on memory-mapped files.

A standalone library (it imports nothing from luxun): :class:`BigArray` is an
append-only array of byte items; :class:`FanoutQueue` adds one persistent read
position per consumer group. The on-disk format is bigqueue 0.7.2's (Java Luxun's
storage), described in :mod:`bigarray.format`.

Example::

    from bigarray import FanoutQueue

    with FanoutQueue("/tmp/q") as q:
        q.enqueue_many([b"a", b"b"])
        q.dequeue("analytics")   # b"a"
"""

from .array import BigArray, Recovery, now_ms
from .errors import (
    ArrayClosedError,
    ArrayEmptyError,
    ArrayLockedError,
    BigArrayError,
    CorruptArrayError,
    DiskFullError,
    IndexOutOfRangeError,
    InvalidNameError,
    ItemTooLargeError,
)
from .fanout import FanoutQueue
from .format import DEFAULT_DATA_PAGE_SIZE
from .names import validate_name

EARLIEST = BigArray.EARLIEST
LATEST = BigArray.LATEST

__all__ = [
    "DEFAULT_DATA_PAGE_SIZE",
    "EARLIEST",
    "LATEST",
    "ArrayClosedError",
    "ArrayEmptyError",
    "ArrayLockedError",
    "BigArray",
    "BigArrayError",
    "CorruptArrayError",
    "DiskFullError",
    "FanoutQueue",
    "IndexOutOfRangeError",
    "InvalidNameError",
    "ItemTooLargeError",
    "Recovery",
    "now_ms",
    "validate_name",
]
