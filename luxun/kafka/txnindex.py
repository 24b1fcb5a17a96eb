"""A partition's transactions: open ones (for the last stable offset) and aborted ones.

Kafka's read_committed consumers read a partition only below its *last stable offset*
(LSO: the first offset of the oldest transaction still open there, else the high
watermark) and drop the records of aborted transactions, which a Fetch answer lists
(producer id, first offset) for the range it returns. :class:`TxnIndex` keeps both for
one partition, in memory and in the file ``kafka.txnindex`` in the partition's directory
(Java Luxun ignores it), a sequence of 25-byte records, big-endian::

    offset size field
       0     1   kind        2 BEGIN (a producer's first transactional batch here since
                             its last marker), 1 COMMIT, 0 ABORT (its marker)
       1     8   producerId
       9     8   firstOffset the offset of that first batch
      17     8   lastOffset  the marker's offset (-1 for BEGIN)

Records are appended (one ``write`` each, no descriptor kept open: a kill -9 loses none that returned) under
the partition's lock right after the batch or marker they describe was appended to the
log, so at most the last one can be missing after a crash: :meth:`TxnIndex.load` drops
a torn record and any record past the log's end (its batch was rolled back), and the
caller replays the log's last batches after the index's last offset
(:meth:`TxnIndex.replay`), which restores a missing one. The file is rewritten with only
what is live (open transactions, aborted ones not yet below the log start) through a
temporary file and a rename when it has grown to more than twice that plus 1024 records,
so it stays bounded by the partition's aborted transactions that retention keeps.

A control batch (a transaction marker, attributes bits 4 and 5) holds one record:
key = version int16 (0) + type int16 (0 ABORT, 1 COMMIT), value = version int16 (0) +
coordinator epoch int32; :func:`control_batch` builds one.

Thread-safety: none; the caller holds the partition's lock.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import struct
from typing import Final

from crc32c import crc32c

__all__ = ["ABORT", "BEGIN", "COMMIT", "TXN_INDEX_FILE", "TxnIndex", "control_batch", "control_type"]

log = logging.getLogger(__name__)

TXN_INDEX_FILE: Final = "kafka.txnindex"
ABORT: Final = 0
COMMIT: Final = 1
BEGIN: Final = 2
_RECORD: Final = struct.Struct(">bqqq")
#: Records beyond twice the live ones (plus this) make the file rewritten.
_SLACK: Final = 1024

# A control batch: header after the crc (attributes .. recordCount), then its one record.
_HEADER_AFTER_CRC: Final = struct.Struct(">hiqqqhii")
_PREFIX: Final = struct.Struct(">qiibI")  # baseOffset, batchLength, leaderEpoch, magic, crc
_CONTROL_ATTRIBUTES: Final = 0x30  # transactional | control
_KEY: Final = struct.Struct(">hh")
_VALUE: Final = struct.Struct(">hi")


def control_batch(producer_id: int, epoch: int, commit: bool, coordinator_epoch: int, now_ms: int) -> bytes:
    """A transaction marker: a control batch of one record, as Kafka's broker writes it."""
    # record: attributes 0, timestampDelta 0, offsetDelta 0, key length 4 (zigzag 8), key,
    # value length 6 (zigzag 12), value, no headers; its length 16 (zigzag 32).
    record = (
        b"\x20\x00\x00\x00\x08"
        + _KEY.pack(0, COMMIT if commit else ABORT)
        + b"\x0c"
        + _VALUE.pack(0, coordinator_epoch)
        + b"\x00"
    )
    body = _HEADER_AFTER_CRC.pack(_CONTROL_ATTRIBUTES, 0, now_ms, now_ms, producer_id, epoch, -1, 1) + record
    return _PREFIX.pack(0, len(body) + 9, 0, 2, crc32c(body)) + body


def control_type(key: bytes | None) -> int | None:
    """ABORT or COMMIT from a control record's key; None for another control record."""
    if key is None or len(key) < _KEY.size:
        return None
    _version, kind = _KEY.unpack_from(key)
    return kind if kind in (ABORT, COMMIT) else None


class TxnIndex:
    """Open and aborted transactions of one partition (see the module docstring).

    Args:
        directory: the partition's directory (the luxun topic's).
    """

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, TXN_INDEX_FILE)
        #: producer id -> first offset of its open transaction here.
        self.open: dict[int, int] = {}
        #: (last offset, producer id, first offset) of aborted transactions, by last offset.
        self.aborted: list[tuple[int, int, int]] = []
        #: The largest offset a record of the file names (replay starts after it).
        self.last_offset = -1
        self._records = 0

    # -- loading ---------------------------------------------------------------------------
    def load(self, log_start: int, log_end: int) -> None:
        """Read the file (a missing one is empty); records past ``log_end`` (their batch
        was rolled back) and a torn last record are dropped; aborted transactions that
        end below ``log_start`` are forgotten. Then the file is rewritten compact."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        usable = len(data) - len(data) % _RECORD.size
        if usable != len(data):
            log.info("%s: dropped a torn record at its end (%d bytes)", self.path, len(data) - usable)
        dropped = 0
        for kind, pid, first, last in _RECORD.iter_unpack(data[:usable]):
            if max(first, last) >= log_end:
                dropped += 1
                continue
            self._apply(kind, pid, first, last)
        if dropped:
            log.info("%s: dropped %d records past the log's end %d", self.path, dropped, log_end)
        self.trim(log_start)
        self._rewrite()

    def _apply(self, kind: int, pid: int, first: int, last: int) -> None:
        self.last_offset = max(self.last_offset, first, last)
        if pid < 0:  # the rewritten file's note of last_offset
            return
        if kind == BEGIN:
            self.open.setdefault(pid, first)
        elif self.open.pop(pid, None) is not None and kind == ABORT:
            bisect.insort(self.aborted, (last, pid, first))

    def replay(self, offset: int, producer_id: int, transactional: bool, control: int | None) -> None:
        """A batch of the log at ``offset`` after :attr:`last_offset` (after a crash, its
        record may be missing): recorded as :meth:`begin` or :meth:`end` would have."""
        if offset <= self.last_offset or not transactional or producer_id < 0:
            return
        if control is None:
            self.begin(producer_id, offset)
        else:
            self.end(producer_id, offset, control == COMMIT)

    # -- changes (under the partition's lock, right after the log append) ------------------
    def begin(self, producer_id: int, offset: int) -> None:
        """A transactional batch of ``producer_id`` stored at ``offset``."""
        if producer_id in self.open:
            return
        self.open[producer_id] = offset
        self._write(BEGIN, producer_id, offset, -1)

    def end(self, producer_id: int, offset: int, commit: bool) -> None:
        """``producer_id``'s marker stored at ``offset``."""
        first = self.open.pop(producer_id, None)
        if first is None:  # no data of this transaction here: nothing to record
            self.last_offset = max(self.last_offset, offset)
            return
        if not commit:
            bisect.insort(self.aborted, (offset, producer_id, first))
        self._write(COMMIT if commit else ABORT, producer_id, first, offset)

    def trim(self, log_start: int) -> None:
        """Forget aborted transactions that end below ``log_start`` (retention took them)."""
        cut = bisect.bisect_left(self.aborted, (log_start, -(1 << 63), 0))
        if cut:
            del self.aborted[:cut]

    # -- reading -----------------------------------------------------------------------------
    def last_stable_offset(self, high_watermark: int) -> int:
        return min(self.open.values()) if self.open else high_watermark

    def aborted_between(self, start: int, end: int) -> list[tuple[int, int]]:
        """``(producer id, first offset)`` of the aborted transactions that overlap the
        offsets ``[start, end)``, by first offset (a Fetch answer's aborted_transactions)."""
        i = bisect.bisect_left(self.aborted, (start, -(1 << 63), 0))
        found = [(pid, first) for _last, pid, first in self.aborted[i:] if first < end]
        found.sort(key=lambda a: a[1])
        return found

    # -- the file ------------------------------------------------------------------------------
    def _write(self, kind: int, pid: int, first: int, last: int) -> None:
        self.last_offset = max(self.last_offset, first, last)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # none kept open per partition
        try:
            os.write(fd, _RECORD.pack(kind, pid, first, last))
        finally:
            os.close(fd)
        self._records += 1
        if self._records > 2 * (len(self.open) + len(self.aborted)) + _SLACK:
            self._rewrite()

    def _rewrite(self) -> None:
        """The file holding only what is live, through a temporary file and a rename."""
        live = [_RECORD.pack(BEGIN, pid, first, -1) for pid, first in self.open.items()]
        live += [_RECORD.pack(ABORT, pid, first, last) for last, pid, first in self.aborted]
        live += [_RECORD.pack(BEGIN, -1, self.last_offset, -1)] if self.last_offset >= 0 else []
        if not live:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
            self._records = 0
            return
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"".join(live))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._records = len(live)
