"""A partition's log start offset as DeleteRecords moves it, when it falls inside a
stored batch.

Retention and DeleteRecords both drop whole items (:meth:`bigarray.BigArray.
remove_before_index`: tail moves, whole pages are deleted), and an item is a whole
record batch; so after a DeleteRecords to an offset inside a batch, the array's own
log start (the first offset of tail) is below the one Kafka clients were promised.
That offset is kept in ``kafka-log-start`` in the partition's directory: 8 bytes, the
offset as a big-endian i64, replaced crash-safely (:func:`luxun.files.replace_file`).
A partition's log start is the larger of the two. Java Luxun ignores the file; it
goes with the partition's directory when the topic is deleted.

A DeleteRecords writes the file first, then moves tail: after a crash in between,
the file is read when the partition is next used and the move is made again
(:meth:`KafkaLog.log_start`), so the space is reclaimed then.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import os
import struct
import threading
from typing import Final

from ..files import replace_file

__all__ = ["LOG_START_FILE", "LogStarts"]

LOG_START_FILE: Final = "kafka-log-start"
_I64: Final = struct.Struct(">q")


class LogStarts:
    """The kept log start offsets of the partitions (luxun topics) in ``data_dir``, by
    name (0: none kept)."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self._known: dict[str, int] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> int:
        """The offset kept for partition ``name``; 0 if none (or unreadable)."""
        known = self._known.get(name)
        if known is not None:
            return known
        try:
            with open(os.path.join(self.data_dir, name, LOG_START_FILE), "rb") as f:
                data = f.read(_I64.size)
            value = _I64.unpack(data)[0] if len(data) == _I64.size else 0
        except FileNotFoundError:
            value = 0
        with self._lock:
            return self._known.setdefault(name, max(0, value))

    def set(self, name: str, offset: int) -> None:
        """Keep ``offset`` (durably, before returning).

        Raises:
            OSError: the disk refused (nothing changed).
        """
        with self._lock:
            replace_file(os.path.join(self.data_dir, name, LOG_START_FILE), _I64.pack(offset))
            self._known[name] = offset

    def forget(self, name: str) -> None:
        """The partition was deleted."""
        with self._lock:
            self._known.pop(name, None)
