"""A partition's time index: ListOffsets by time without a scan, as Kafka's time index.

Kafka answers ListOffsets for a time T with the first offset whose *record* timestamp is
at or after T (``LogSegment.findOffsetByTimestamp``). Records keep the timestamps their
producer gave (CreateTime), so they need not grow with offsets; the big array's index
holds only each item's append time (bigqueue's format, which Java Luxun reads: it is not
changed). This index maps record time to items, per partition.

An item's *timestamp* here is the largest record timestamp it holds: a Kafka batch's
``maxTimestamp`` (for a topic with ``message.timestamp.type=LogAppendTime`` the append
time, which :func:`luxun.records.with_log_append_time` wrote there at produce), and for
an item a Thrift client wrote (one record, kind not ``KIND_KAFKA_BATCH``) its append time.

File ``kafka.timeindex`` in the partition's directory (the luxun topic's, beside the big
array's own files; bigqueue and Java Luxun never look at it), a sequence of 16-byte
entries, big-endian::

    timestamp ms i64 | item index i64

Items are grouped in *segments* of :data:`SEGMENT_ITEMS` consecutive indexes (index >>
:data:`SEGMENT_BITS`), as Kafka keeps a time index per log segment, so that one record
far in the future, or records trimmed by retention, mislead lookups in one segment only.
Per segment there is an entry for the first of its items the index saw and one for each
later item whose timestamp is larger than every earlier one's in the segment (the
running maximum grows). So entries are in item order, each segment's entries have
strictly increasing timestamps, and its last entry holds its largest timestamp; items
between entries raise nothing. With CreateTime from one producer the index has about
one entry per batch (16 bytes per batch; the big array's index takes 32 per item).

Lookup of T (:meth:`TimeIndex.find`): the item is in the first segment whose largest
timestamp is >= T, at that segment's first entry with a timestamp >= T: every item
before it is below T. Segments below tail's (retention) are ignored; in tail's segment,
when that entry is below tail, the segment's live items are read (at most
:data:`SEGMENT_ITEMS`). Only the segments' largest timestamps and where their entries
start are kept in memory (24 bytes per segment); a lookup reads one segment's entries.

Writing: the Kafka produce path adds its batches' entries under the partition lock,
after the batches are stored (:meth:`TimeIndex.add`): it knows their timestamps from
the headers it validated, so it reads nothing. Entries are buffered and appended to the
file 256 at a time (one ``write``) or before a lookup reads the file, so a produce
makes no system call for the index. Items a Thrift
client appended in between are read then (their append times: one numpy copy of the
index column). Nothing is fsynced: the file is derived data.

What survives a crash, what is rebuilt (:meth:`TimeIndex.load`, on the partition's
first produce or lookup after the broker starts): a torn entry is cut; so are entries
out of order (zeros written by a power loss) and entries at or past head (items a
crash took back); the last entry is checked against its item (re-read). Then the items
after the last entry are read from the array (their batch headers): after a ``kill -9``
those of the buffered entries (at most 256) and the rest of their segment. A missing
file is rebuilt from tail. When retention has left more dead entries (segments below
tail's) than live ones, and at least :data:`COMPACT_MIN_ENTRIES`, the live ones are
copied to a new file that replaces the old (fsynced, then renamed). The file goes with
the partition's directory when the topic is deleted.

Thread-safety: none; the Kafka log calls every method under the partition's lock.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from array import array
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from bigarray import IndexOutOfRangeError

from .. import records as rec
from ..partitions import KIND_KAFKA_BATCH

__all__ = ["COMPACT_MIN_ENTRIES", "SEGMENT_BITS", "SEGMENT_ITEMS", "TIME_INDEX_FILE", "TimeIndex", "item_timestamps"]

log = logging.getLogger(__name__)

#: The time index's file, in the partition's directory.
TIME_INDEX_FILE: Final = "kafka.timeindex"
#: log2 of the items per segment.
SEGMENT_BITS: Final = 10
#: Items per segment (entries restart their running maximum at each segment).
SEGMENT_ITEMS: Final = 1 << SEGMENT_BITS
#: Fewest dead entries worth a compaction (1 MiB of file).
COMPACT_MIN_ENTRIES: Final = 1 << 16

_ENTRY: Final = struct.Struct(">qq")
ENTRY_SIZE: Final = _ENTRY.size
_ENTRY_DTYPE: Final = np.dtype([("ts", ">i8"), ("idx", ">i8")])
_I64: Final = struct.Struct(">q")
#: Entries read at once when loading or copying the file.
_CHUNK_ENTRIES: Final = 1 << 16
#: Bytes of items read at once when reading batch headers.
_READ_BYTES: Final = 8 << 20
#: Entries buffered before they are written (4 KiB).
_BUFFER_ENTRIES: Final = 256
#: Attempts at reading items while retention moves tail past them.
_RETRIES: Final = 100
_NO_TIMESTAMP: Final = -(1 << 63)


def item_timestamps(queue: Any, start: int, count: int) -> list[int]:
    """The timestamp of each of the ``count`` items of ``queue`` (a FanoutQueue) from
    ``start``: a Kafka batch's maxTimestamp (read from its header, without copying the
    batch), another item's append time.

    Raises:
        IndexOutOfRangeError: the items are not all in [tail, head) (retention).
    """
    _, kinds = queue.offset_fields(start, count)
    out: list[int] = queue.timestamps(start, count)
    batches = np.flatnonzero(kinds == KIND_KAFKA_BATCH)
    if not len(batches):
        return out
    is_batch = (kinds == KIND_KAFKA_BATCH).tolist()
    at_least = rec.MAX_TIMESTAMP_OFFSET + 8
    k = int(batches[0])
    while k < count:
        lengths, data, release = queue.read_range_view(start + k, max_items=count - k, max_bytes=_READ_BYTES)
        try:
            pos = 0
            for n in lengths.tolist():
                if is_batch[k] and n >= at_least:
                    out[k] = _I64.unpack_from(data, pos + rec.MAX_TIMESTAMP_OFFSET)[0]
                pos += n
                k += 1
        finally:
            release()
    return out


class TimeIndex:
    """The time index of one partition (see the module docstring).

    Args:
        directory: the partition's directory (its queue's ``path``).
    """

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, TIME_INDEX_FILE)
        self.loaded = False
        self._reset()

    def _reset(self) -> None:
        #: Entries in the index: in the file, then in ``_buffer``.
        self._count = 0
        #: Entries not written to the file yet.
        self._buffer: list[tuple[int, int]] = []
        #: Items below this index were looked at (entries written for them if needed).
        self._covered = 0
        #: Per segment with entries, in order: its number, its largest timestamp, the
        #: number of its first entry in the file.
        self._segments = array("q")
        self._maxima = array("q")
        self._starts = array("q")
        self._next_compact_check = 0

    def invalidate(self) -> None:
        """Forget what is in memory: the next use loads the file again (after a write
        failed, or the queue was closed under us)."""
        self.loaded = False
        self._reset()

    # -- writing ---------------------------------------------------------------------
    def add(self, queue: Any, first: int, timestamps: Sequence[int]) -> None:
        """Items [first, first + len(timestamps)) of ``queue`` were just appended with
        these timestamps: write their entries (and those of items appended by others
        since the last call). Loads the index first if needed (which reads the new
        items from the array)."""
        if not self.loaded:
            self.load(queue)
            return
        pending: list[tuple[int, int]] = []
        if self._covered < first:
            self._cover(queue, first, pending)
        segments, maxima = self._segments, self._maxima
        for k, ts in enumerate(timestamps):
            idx = first + k
            # (most items raise nothing: in the last segment, not above its maximum)
            if idx >= self._covered and not (segments and segments[-1] == idx >> SEGMENT_BITS and ts <= maxima[-1]):
                self._note(idx, ts, pending)
        end = first + len(timestamps)
        if end > self._covered:
            self._covered = end
        if pending:
            self._write(pending)
        if self._count >= self._next_compact_check:
            self._maybe_compact(queue.tail)

    def catch_up(self, queue: Any) -> None:
        """Cover every item below ``queue``'s head (loading the index if needed)."""
        if not self.loaded:
            self.load(queue)
            return
        if self._covered < queue.head:
            pending: list[tuple[int, int]] = []
            self._cover(queue, queue.head, pending)
            self._write(pending)

    def _note(self, idx: int, ts: int, pending: list[tuple[int, int]]) -> None:
        """Item ``idx`` (after every item noted so far) has timestamp ``ts``."""
        segment = idx >> SEGMENT_BITS
        segments = self._segments
        if not segments or segments[-1] != segment:
            segments.append(segment)
            self._maxima.append(ts)
            self._starts.append(self._count + len(pending))
            pending.append((ts, idx))
        elif ts > self._maxima[-1]:
            self._maxima[-1] = ts
            pending.append((ts, idx))

    def _cover(self, queue: Any, stop: int, pending: list[tuple[int, int]]) -> None:
        """Note the items [covered, stop) from the array (items retention removed
        meanwhile are skipped). Writes ``pending`` out as it grows past a chunk."""
        for _ in range(_RETRIES):
            start = max(self._covered, queue.tail)
            try:
                while start < stop:
                    n = min(stop - start, SEGMENT_ITEMS - (start & (SEGMENT_ITEMS - 1)))
                    for k, ts in enumerate(item_timestamps(queue, start, n)):
                        self._note(start + k, ts, pending)
                    start += n
                    self._covered = start
                    if len(pending) >= _CHUNK_ENTRIES:
                        self._write(pending)
                        pending.clear()
                return
            except IndexOutOfRangeError:
                if queue.tail <= start:
                    raise
                # retention moved tail past start: go on from the new tail
        raise IndexOutOfRangeError(self._covered, queue.tail, queue.head)

    def _write(self, pending: list[tuple[int, int]]) -> None:
        """Add ``pending`` entries: buffered, and appended to the file (one write) once
        :data:`_BUFFER_ENTRIES` wait or before anything reads the file (:meth:`flush`),
        so a produce costs no system call. Entries a crash loses are rebuilt by
        :meth:`load` from the items after the last entry written, as a torn tail is."""
        if pending:
            self._buffer.extend(pending)
            self._count += len(pending)
            if len(self._buffer) >= _BUFFER_ENTRIES:
                self.flush()

    def flush(self) -> None:
        """Append the buffered entries to the file (one write). The file must exist: a
        missing one is rebuilt by :meth:`load`, not started again half-way."""
        pending = self._buffer
        if not pending:
            return
        self._buffer = []
        data = b"".join([_ENTRY.pack(ts, idx) for ts, idx in pending])
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            written = os.write(fd, data)
        finally:
            os.close(fd)
        if written != len(data):
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")

    # -- loading ---------------------------------------------------------------------
    def load(self, queue: Any) -> None:
        """Read the file (creating it if missing), cut what a crash left wrong (see the
        module docstring), then cover the items up to head from the array."""
        self._reset()
        tmp = self.path + ".tmp"
        if os.path.exists(tmp):  # a compaction interrupted by a crash
            os.unlink(tmp)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            head, tail = queue.head, queue.tail
            valid = self._read_segments(fd, size // ENTRY_SIZE, head)
            kept = valid
            while kept > 0:  # the last entries must say what their items say
                ts, idx = self._entry(fd, kept - 1)
                if idx < tail or item_timestamps(queue, idx, 1)[0] == ts:
                    break
                kept -= 1
            if kept != valid:
                self._reset()
                self._read_segments(fd, kept, head)
            if kept * ENTRY_SIZE != size:
                os.ftruncate(fd, kept * ENTRY_SIZE)
                log.warning(
                    "time index %s: cut %d bytes after its %d good entries (a crash or damage); "
                    "the items after them are read again",
                    self.path,
                    size - kept * ENTRY_SIZE,
                    kept,
                )
            self._covered = self._entry(fd, kept - 1)[1] + 1 if kept else 0
        finally:
            os.close(fd)
        self.loaded = True
        try:
            before = max(self._covered, tail)
            pending: list[tuple[int, int]] = []
            self._cover(queue, queue.head, pending)
            self._write(pending)
            if self._covered - before > SEGMENT_ITEMS:
                log.info("time index %s: read %d items to index them", self.path, self._covered - before)
            self._maybe_compact(queue.tail)
        except BaseException:
            self.invalidate()
            raise

    def _entry(self, fd: int, number: int) -> tuple[int, int]:
        ts, idx = _ENTRY.unpack(os.pread(fd, ENTRY_SIZE, number * ENTRY_SIZE))
        return int(ts), int(idx)

    def _read_segments(self, fd: int, limit: int, head: int) -> int:
        """Read the first ``limit`` entries into the segment table; stop at the first
        that breaks the file's order or names an item at or past ``head``. Returns how
        many are good."""
        count = 0
        last_idx = -1
        last_ts = _NO_TIMESTAMP
        while count < limit:
            n = min(_CHUNK_ENTRIES, limit - count)
            raw = os.pread(fd, n * ENTRY_SIZE, count * ENTRY_SIZE)
            n = len(raw) // ENTRY_SIZE
            if n == 0:
                break
            entries = np.frombuffer(raw, dtype=_ENTRY_DTYPE, count=n)
            ts = entries["ts"].astype(np.int64)
            idx = entries["idx"].astype(np.int64)
            segment = idx >> SEGMENT_BITS
            prev_idx = np.concatenate(([last_idx], idx[:-1]))
            prev_ts = np.concatenate(([last_ts], ts[:-1]))
            prev_segment = prev_idx >> SEGMENT_BITS  # -1 for the file's first entry
            starts = segment != prev_segment
            good = (idx > prev_idx) & (idx < head) & (starts | (ts > prev_ts))
            bad = np.flatnonzero(~good)
            if len(bad):
                n = int(bad[0])
                ts, idx, segment, starts = ts[:n], idx[:n], segment[:n], starts[:n]
            if n:
                firsts = np.flatnonzero(starts)
                lasts = np.concatenate((firsts[1:], [n]))[: len(firsts)] - 1
                if len(firsts) == 0 or firsts[0] > 0:  # the chunk goes on with the last segment
                    self._maxima[-1] = int(ts[(firsts[0] if len(firsts) else n) - 1])
                self._segments.extend(segment[firsts].tolist())
                self._maxima.extend(ts[lasts].tolist())
                self._starts.extend((firsts + count).tolist())
                last_idx, last_ts = int(idx[-1]), int(ts[-1])
                count += n
            if len(bad):
                break
        self._count = count
        return count

    # -- lookups ---------------------------------------------------------------------
    def find(self, queue: Any, target: int) -> int | None:
        """The index of the first item at or after tail whose timestamp is >= ``target``
        (None: none). The index must cover head (:meth:`catch_up`)."""
        tail = int(queue.tail)
        j = bisect.bisect_left(self._segments, tail >> SEGMENT_BITS)
        maxima = np.frombuffer(self._maxima[j:], dtype=np.int64)  # of a copy: the table may grow later
        for k in (np.flatnonzero(maxima >= target)[:2] + j).tolist():
            entries = self._segment_entries(k)
            at = int(np.searchsorted(entries["ts"].astype(np.int64), target, side="left"))
            idx = int(entries["idx"][at])
            if idx >= tail:
                return idx
            # tail's segment, whose items up to `idx` are gone: read its live ones
            for i, ts in enumerate(self._live_timestamps(queue, tail)):
                if ts >= target:
                    return tail + i
        return None

    def max_timestamp(self, queue: Any) -> int | None:
        """The largest timestamp of the items in [tail, head) (None: no items). The index
        must cover head (:meth:`catch_up`)."""
        tail = int(queue.tail)
        j = bisect.bisect_left(self._segments, tail >> SEGMENT_BITS)
        if j == len(self._segments):
            return None
        found: list[int] = []
        if self._segments[j] != tail >> SEGMENT_BITS or int(self._segment_entries(j)["idx"][-1]) >= tail:
            found.append(self._maxima[j])
        else:  # the segment's largest timestamp left with retention: read its live items
            live = self._live_timestamps(queue, tail)
            if live:
                found.append(max(live))
        if len(self._segments) > j + 1:
            found.append(max(self._maxima[j + 1 :]))
        return max(found) if found else None

    def _segment_entries(self, k: int) -> np.ndarray[Any, Any]:
        """The entries of the k-th segment of the table (``ts``, ``idx`` fields)."""
        begin = self._starts[k]
        end = self._starts[k + 1] if k + 1 < len(self._starts) else self._count
        self.flush()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            raw = os.pread(fd, (end - begin) * ENTRY_SIZE, begin * ENTRY_SIZE)
        finally:
            os.close(fd)
        if len(raw) != (end - begin) * ENTRY_SIZE:
            raise OSError(f"time index {self.path} is shorter than its {self._count} entries")
        return np.frombuffer(raw, dtype=_ENTRY_DTYPE)

    def _live_timestamps(self, queue: Any, tail: int) -> list[int]:
        """The timestamps of the items of tail's segment from tail on (up to what the
        index covers): at most :data:`SEGMENT_ITEMS` items read."""
        stop = min(((tail >> SEGMENT_BITS) + 1) << SEGMENT_BITS, self._covered)
        return item_timestamps(queue, tail, stop - tail) if tail < stop else []

    # -- compaction ------------------------------------------------------------------
    def _maybe_compact(self, tail: int) -> None:
        """Drop the entries of segments below tail's when they are most of the file."""
        self._next_compact_check = self._count + COMPACT_MIN_ENTRIES // 4
        j = bisect.bisect_left(self._segments, tail >> SEGMENT_BITS)
        dead = self._starts[j] if j < len(self._starts) else self._count
        if dead < COMPACT_MIN_ENTRIES or dead < self._count - dead:
            return
        self.flush()
        tmp = self.path + ".tmp"
        src = os.open(self.path, os.O_RDONLY)
        try:
            dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                at = dead
                while at < self._count:
                    n = min(_CHUNK_ENTRIES, self._count - at)
                    raw = os.pread(src, n * ENTRY_SIZE, at * ENTRY_SIZE)
                    if len(raw) != n * ENTRY_SIZE:
                        raise OSError(f"time index {self.path} is shorter than its {self._count} entries")
                    os.write(dst, raw)
                    at += n
                os.fsync(dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        os.replace(tmp, self.path)
        self._segments = self._segments[j:]
        self._maxima = self._maxima[j:]
        self._starts = array("q", [s - dead for s in self._starts[j:]])
        self._count -= dead
        self._next_compact_check = self._count + COMPACT_MIN_ENTRIES // 4
        log.info("time index %s: dropped %d entries below tail %d", self.path, dead, tail)
