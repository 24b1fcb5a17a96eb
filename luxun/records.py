"""Kafka record batches (message format v2): validate, re-stamp, convert.

A Kafka producer sends, per partition, a *record batch*: a 61-byte header and then the
records, maybe compressed. All integers big-endian; ``crc`` is a CRC-32C of bytes 21 to
the end of the batch (everything after the crc field)::

    offset size  field                  notes
       0     8   baseOffset             assigned by the broker; NOT covered by the crc
       8     4   batchLength            bytes after this field (total size - 12)
      12     4   partitionLeaderEpoch   NOT covered by the crc
      16     1   magic                  2 (0 and 1 are the legacy message sets)
      17     4   crc                    CRC-32C (Castagnoli) of bytes 21..end, unsigned
      21     2   attributes             bits 0-2 codec (0 none, 1 gzip, 2 snappy, 3 lz4,
                                        4 zstd), bit 3 timestamp type (1 LogAppendTime),
                                        bit 4 transactional, bit 5 control
      23     4   lastOffsetDelta        record count - 1
      27     8   baseTimestamp          the first record's timestamp (ms)
      35     8   maxTimestamp           the largest record timestamp (ms), or the log
                                        append time when bit 3 is set
      43     8   producerId             -1 without an idempotent producer
      51     2   producerEpoch
      53     4   baseSequence
      57     4   recordCount
      61     ... records, compressed as a whole per the codec

    record (uncompressed; varints are zigzag-encoded, as in protobuf)
      varint length (of the rest of the record), int8 attributes (unused, 0),
      varlong timestampDelta, varint offsetDelta, varint keyLength (-1 = null), key,
      varint valueLength (-1 = null), value, varint headerCount, then per header:
      varint keyLength, key (UTF-8), varint valueLength (-1 = null), value

A produced batch is checked whole before anything of it is stored, as Kafka's broker
checks it (``LogValidator``): :func:`split_batches` reads each header and one CRC-32C,
:func:`validate` decompresses the records (bounded) and reads every record, field by
field, in C (``luxun/_records.c``, a few ns per record; a pure-Python twin of the same
rules, ~2 us per record, where the module is not built). The batch is then stored as
sent (one big-array item) and served as stored with only ``baseOffset`` rewritten
(:func:`patch_base_offsets`): the read path never parses records. Only the
cross-protocol paths do: :func:`luxun_items_to_batch` (a Kafka consumer reading items a
Thrift producer wrote) and :func:`batch_to_pack` (a Thrift consumer reading a Kafka
batch; its values are gathered in C too).

Errors are :class:`BatchError`, carrying the Kafka error code a Produce answer gives
for the partition, as Kafka's broker answers it (``LogValidator``, ``ProduceRequest``):

* ``CORRUPT_MESSAGE`` (2): crc mismatch, a length below the header size or past the
  end of the data, an unknown magic, records that do not decompress;
* ``INVALID_RECORD`` (87): a record that does not read (a varint or length running
  past its record or the batch, a negative length, a null header key, fields that do
  not fill the record, an offset delta other than its index; ``BatchError.record`` says
  which, for the Produce answer's ``record_errors``), records that do not fill the
  batch or are fewer than it says, a magic 0/1 message set (Produce >= v3 carries v2
  batches only; Kafka answers INVALID_RECORD, not UNSUPPORTED_FOR_MESSAGE_FORMAT), a
  record count that is not ``lastOffsetDelta + 1`` or not positive, a control batch or a
  negative sequence with a producer id sent by a client;
* ``INVALID_TIMESTAMP`` (32): a client batch that claims LogAppendTime;
* ``UNSUPPORTED_COMPRESSION_TYPE`` (76): codec bits 5-7;
* ``MESSAGE_TOO_LARGE`` (10): luxun's bounds, which Kafka does not have: records that
  inflate past ``max_bytes`` (64 MiB by default; decompression stops there) or more
  than ``max_records`` (1,000,000) in one batch. A Thrift consumer gets each stored
  batch as one pack, so these bound what one item costs to serve.

Thread-safety: every function here is pure (``patch_base_offsets`` writes only the
buffer it is given) and may be called from any number of threads.
"""

from __future__ import annotations

import importlib
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

import lz4.frame  # type: ignore[import-untyped]
import numpy as np
import zstandard
from crc32c import crc32c

from idl.codec import TooLargeError, unsnappy, xerial_compress
from idl.pack import encode_pack, encode_pack_written

__all__ = [
    "CODEC_GZIP",
    "CODEC_LZ4",
    "CODEC_NAMES",
    "CODEC_NONE",
    "CODEC_SNAPPY",
    "CODEC_ZSTD",
    "CORRUPT_MESSAGE",
    "DEFAULT_MAX_BYTES",
    "HEADER_SIZE",
    "MAGIC_OFFSET",
    "MAX_TIMESTAMP_OFFSET",
    "INVALID_RECORD",
    "INVALID_TIMESTAMP",
    "LOG_OVERHEAD",
    "MAGIC",
    "UNSUPPORTED_COMPRESSION_TYPE",
    "Batch",
    "BatchError",
    "KeylessRecords",
    "Record",
    "batch_records",
    "batch_to_pack",
    "encode_pack",
    "luxun_items_to_batch",
    "patch_base_offsets",
    "split_batches",
    "with_log_append_time",
]

# -- the format ------------------------------------------------------------------

#: Size of a v2 record batch header (what precedes the records).
HEADER_SIZE: Final = 61
#: baseOffset (8) + batchLength (4): the part of a batch that batchLength does not count.
LOG_OVERHEAD: Final = 12
MAGIC: Final = 2

_CRC_OFFSET: Final = 17
_ATTRIBUTES_OFFSET: Final = 21  # the crc covers the batch from here on
_MAX_TIMESTAMP_OFFSET: Final = 35
MAGIC_OFFSET: Final = 16
#: Where maxTimestamp is in a batch (the time index reads it from stored batches).
MAX_TIMESTAMP_OFFSET: Final = _MAX_TIMESTAMP_OFFSET

_I64: Final = struct.Struct(">q")
# A batch's header from its first byte, in Batch's order: base offset, batchLength,
# partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta, baseTimestamp,
# maxTimestamp, producerId, producerEpoch, baseSequence, recordCount.
_BATCH_HEAD: Final = struct.Struct(">qiibIhiqqqhii")
_new_tuple: Final = tuple.__new__
_I32: Final = struct.Struct(">i")
_U32: Final = struct.Struct(">I")
_I16: Final = struct.Struct(">h")

CODEC_NONE: Final = 0
CODEC_GZIP: Final = 1
CODEC_SNAPPY: Final = 2
CODEC_LZ4: Final = 3
CODEC_ZSTD: Final = 4
CODEC_NAMES: Final = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_CODEC_MASK: Final = 0x07
_TIMESTAMP_TYPE_BIT: Final = 0x08
_TRANSACTIONAL_BIT: Final = 0x10
_CONTROL_BIT: Final = 0x20

# The smallest record: length, attributes, timestamp delta, offset delta, key length,
# value length, header count, one byte each.
_MIN_RECORD_SIZE: Final = 7

#: Decompressed records larger than this are refused (bytes).
DEFAULT_MAX_BYTES: Final = 64 << 20
#: Batches of more records than this are refused at produce (librdkafka's largest
#: batch.num.messages; a Thrift consumer gets a batch as one pack of its records).
DEFAULT_MAX_RECORDS: Final = 1_000_000

# Kafka's error codes (org.apache.kafka.common.protocol.Errors) that this module answers.
CORRUPT_MESSAGE: Final = 2
MESSAGE_TOO_LARGE: Final = 10
INVALID_TIMESTAMP: Final = 32
UNSUPPORTED_COMPRESSION_TYPE: Final = 76
INVALID_RECORD: Final = 87


class BatchError(ValueError):
    """A record batch refused or unreadable; ``code`` is the Kafka error code to answer.

    ``str(error)`` is a one-line message naming what is wrong (and where, as a byte
    offset in the data given); ``record`` is the index in its batch of the record at
    fault (a Produce answer's ``record_errors``, KIP-467), None for the batch as a whole.
    """

    def __init__(self, code: int, message: str, record: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.record = record


class KeylessRecords(BatchError):
    """Records without a key in a batch whose topic requires one (``cleanup.policy``
    compact): ``records`` are their indexes (Kafka answers INVALID_RECORD with one
    ``record_errors`` entry each)."""

    def __init__(self, records: tuple[int, ...]) -> None:
        shown = ", ".join(map(str, records[:10])) + (", ..." if len(records) > 10 else "")
        super().__init__(INVALID_RECORD, f"{len(records)} records without a key (records {shown})", records[0])
        self.records = records


class Batch(NamedTuple):
    """One validated v2 record batch: its bytes (a slice of the data given) and header."""

    data: memoryview
    base_offset: int
    length: int  # batchLength: len(data) - 12
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def codec(self) -> int:
        """Compression codec (``CODEC_NONE`` .. ``CODEC_ZSTD``)."""
        return self.attributes & _CODEC_MASK

    @property
    def log_append_time(self) -> bool:
        """Whether the timestamp type is LogAppendTime (else CreateTime)."""
        return bool(self.attributes & _TIMESTAMP_TYPE_BIT)

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def size(self) -> int:
        """Bytes of the whole batch (``length + 12``)."""
        return self.length + LOG_OVERHEAD


class Record(NamedTuple):
    """One record as a consumer sees it (offset and timestamp resolved)."""

    offset: int
    timestamp: int  # ms; the batch's maxTimestamp for LogAppendTime batches
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


# -- validating what a producer sends ----------------------------------------------


def split_batches(records: bytes | bytearray | memoryview, *, from_client: bool = True) -> list[Batch]:
    """The record batches in ``records`` (a Produce request's records field), validated.

    Each batch is checked from its header and one CRC-32C over its bytes, never by
    reading its records: lengths, magic, crc, ``recordCount == lastOffsetDelta + 1``,
    the codec, and (an uncompressed batch) room for ``recordCount`` records. With
    ``from_client`` (what a producer sent) also what Kafka refuses from clients:
    control batches, LogAppendTime, a producer id with a negative sequence.

    Returns the batches in order (``data`` are slices of ``records``, not copies); an
    empty ``records`` gives ``[]``. Raises :class:`BatchError` for the first bad one.
    Never reads past ``records``; every length is checked before it is used.
    """
    view = records if isinstance(records, memoryview) else memoryview(records)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    total = len(view)
    batches: list[Batch] = []
    pos = 0
    unpack = _BATCH_HEAD.unpack_from
    while pos < total:
        left = total - pos
        if left > MAGIC_OFFSET:
            magic = view[pos + MAGIC_OFFSET]
            if magic in (0, 1):
                raise BatchError(
                    INVALID_RECORD,
                    f"message set of magic {magic} at byte {pos}: only record batches of magic 2 are accepted "
                    "(Produce v3 and later)",
                )
            if magic != MAGIC:
                raise BatchError(CORRUPT_MESSAGE, f"record batch at byte {pos} has unknown magic {magic}")
        if left < HEADER_SIZE:
            raise BatchError(
                CORRUPT_MESSAGE, f"record batch at byte {pos} is truncated: {left} bytes, a header needs {HEADER_SIZE}"
            )
        head = unpack(view, pos)
        (_, length, _, magic, crc, attributes, last_delta, _, _, pid, _, base_seq, count) = head
        if length < HEADER_SIZE - LOG_OVERHEAD:
            raise BatchError(
                CORRUPT_MESSAGE,
                f"record batch at byte {pos} claims batchLength {length}, less than a header's "
                f"{HEADER_SIZE - LOG_OVERHEAD}",
            )
        end = pos + LOG_OVERHEAD + length
        if end > total:
            raise BatchError(
                CORRUPT_MESSAGE,
                f"record batch at byte {pos} claims {length + LOG_OVERHEAD} bytes, only {left} are left (truncated)",
            )
        actual = crc32c(view[pos + _ATTRIBUTES_OFFSET : end])
        if actual != crc:
            raise BatchError(
                CORRUPT_MESSAGE, f"record batch at byte {pos} is corrupt: stored crc {crc}, computed crc {actual}"
            )
        if count <= 0 or count != last_delta + 1:
            raise BatchError(
                INVALID_RECORD,
                f"record batch at byte {pos} has recordCount {count} and lastOffsetDelta {last_delta} "
                "(the count must be lastOffsetDelta + 1, and positive)",
            )
        codec = attributes & _CODEC_MASK
        if codec > CODEC_ZSTD:
            raise BatchError(
                UNSUPPORTED_COMPRESSION_TYPE, f"record batch at byte {pos} has unknown compression codec {codec}"
            )
        if codec == CODEC_NONE and count > (length - HEADER_SIZE + LOG_OVERHEAD) // _MIN_RECORD_SIZE:
            raise BatchError(
                INVALID_RECORD,
                f"record batch at byte {pos} claims {count} records in {length - HEADER_SIZE + LOG_OVERHEAD} bytes",
            )
        if from_client:
            if attributes & _CONTROL_BIT:
                raise BatchError(INVALID_RECORD, f"record batch at byte {pos}: clients may not write control batches")
            if attributes & _TIMESTAMP_TYPE_BIT:
                raise BatchError(
                    INVALID_TIMESTAMP,
                    f"record batch at byte {pos} has timestamp type LogAppendTime: producers may not set it",
                )
            if pid >= 0 and base_seq < 0:
                raise BatchError(
                    INVALID_RECORD, f"record batch at byte {pos}: invalid sequence {base_seq} with producer id {pid}"
                )
        batches.append(_new_tuple(Batch, (view[pos:end], *head)))  # Batch(...) without its __new__'s call
        pos = end
    return batches


def validate(
    batch: Batch,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_records: int = DEFAULT_MAX_RECORDS,
    codec: int | None = None,
    keys: bool = False,
) -> Batch:
    """``batch`` (from :func:`split_batches`) checked record by record, as Kafka's broker
    checks a produced batch before storing it (``LogValidator``).

    Its records are decompressed (at most ``max_bytes``) and read field by field, every
    length inside its record and the batch: the records fill the batch exactly,
    ``recordCount`` of them, offset deltas 0, 1, ... Returns the batch to store: ``batch``
    itself, or a copy whose maxTimestamp is the largest record timestamp where the
    producer's header said otherwise (Kafka's broker corrects it the same way; the time
    index and consumers trust it). Raises :class:`BatchError`: ``INVALID_RECORD`` with
    the record at fault, ``CORRUPT_MESSAGE`` for records that do not decompress,
    ``MESSAGE_TOO_LARGE`` for more than ``max_records`` records or records inflating past
    ``max_bytes`` (luxun's bounds; Kafka has none, and a Thrift consumer of the topic gets
    each batch as one pack).

    ``codec``: the topic's ``compression.type`` (None: ``producer``, the batch kept as
    sent). A batch of another codec is returned re-encoded with ``codec`` from the records
    just read (:func:`_recompressed`), as Kafka's ``LogValidator`` does.

    ``keys``: every record needs a key (a compacted topic's): records whose key is null,
    found in the same reading, raise :class:`KeylessRecords` naming each. A control
    batch (a transaction marker) is not asked: its records are the broker's.
    """
    count = batch.record_count
    if count > max_records:
        raise BatchError(
            MESSAGE_TOO_LARGE, f"record batch of {count} records: at most {max_records} records per batch are accepted"
        )
    if batch.attributes & _CODEC_MASK == CODEC_NONE:  # the records as they are, read in place
        body = batch.data[HEADER_SIZE:]
        source, start = batch.data, HEADER_SIZE
    else:
        body = _open_batch(batch, max_bytes)[1]
        source, start = body, 0
    if keys and not batch.control:
        checked = _check(source, count, start, True)
        if len(checked) == 3:
            raise _record_error(checked, count)
        checked, keyless = checked
        if keyless:
            raise KeylessRecords(keyless)
    else:
        checked = _check(source, count, start)
        if isinstance(checked, tuple):
            raise _record_error(checked, count)
    top = batch.base_timestamp + checked
    if codec is not None and codec != batch.codec and not batch.control:
        return _recompressed(batch, body, codec, batch.max_timestamp if batch.log_append_time else top)
    if batch.max_timestamp == top or batch.log_append_time:
        return batch
    data = bytearray(batch.data)
    _I64.pack_into(data, _MAX_TIMESTAMP_OFFSET, top)
    crc = crc32c(memoryview(data)[_ATTRIBUTES_OFFSET:])
    _U32.pack_into(data, _CRC_OFFSET, crc)
    return batch._replace(data=memoryview(data), max_timestamp=top, crc=crc)


def _recompressed(batch: Batch, body: memoryview, codec: int, max_timestamp: int) -> Batch:
    """``batch`` with its records ``body`` (uncompressed) encoded with ``codec``: the
    header kept but for the attributes' codec bits, batchLength, maxTimestamp and the
    crc, so producer id, epoch, sequence, timestamps and offset deltas are unchanged."""
    records = _COMPRESS[codec](body) if codec != CODEC_NONE else body
    data = bytearray(batch.data[:HEADER_SIZE])
    data += records
    attributes = (batch.attributes & ~_CODEC_MASK) | codec
    _I32.pack_into(data, 8, len(data) - LOG_OVERHEAD)
    _I16.pack_into(data, _ATTRIBUTES_OFFSET, attributes)
    _I64.pack_into(data, _MAX_TIMESTAMP_OFFSET, max_timestamp)
    crc = crc32c(memoryview(data)[_ATTRIBUTES_OFFSET:])
    _U32.pack_into(data, _CRC_OFFSET, crc)
    return batch._replace(
        data=memoryview(data),
        length=len(data) - LOG_OVERHEAD,
        crc=crc,
        attributes=attributes,
        max_timestamp=max_timestamp,
    )


def _gzip(body: memoryview) -> bytes:
    c = zlib.compressobj(wbits=31)  # a gzip member, as Java's GZIPOutputStream writes
    return c.compress(body) + c.flush()


def _lz4(body: memoryview) -> bytes:
    # As Kafka's KafkaLZ4BlockOutputStream writes: independent 64 KiB blocks, no
    # content size or checksum (its reader refuses linked blocks).
    return bytes(
        lz4.frame.compress(
            body,
            block_size=lz4.frame.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=False,
            store_size=False,
        )
    )


def _zstd(body: memoryview) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(body)  # Kafka's default level


#: Encoders of re-compressed batches (snappy: xerial-framed, as the Java client writes).
_COMPRESS: Final[dict[int, Callable[[memoryview], bytes]]] = {
    CODEC_GZIP: _gzip,
    CODEC_SNAPPY: xerial_compress,
    CODEC_LZ4: _lz4,
    CODEC_ZSTD: _zstd,
}


def _record_error(fault: tuple[int, int | None, str], count: int) -> BatchError:
    """The BatchError of a (code, record, message) from :func:`luxun._records.check`."""
    code, record, message = fault
    return BatchError(code, message, record if record is not None and record < count else None)


def with_log_append_time(batch: bytes | bytearray | memoryview, now_ms: int) -> bytes:
    """``batch`` re-stamped for a topic whose ``message.timestamp.type`` is LogAppendTime.

    As Kafka's broker does (``setMaxTimestamp(LOG_APPEND_TIME, now)``): the timestamp
    type bit is set and maxTimestamp becomes ``now_ms``, the crc recomputed; records
    are untouched (a consumer takes every record's timestamp from maxTimestamp).
    ``batch`` must be one whole batch (as :func:`split_batches` gives it).
    """
    out = bytearray(batch)
    if len(out) < HEADER_SIZE:
        raise BatchError(CORRUPT_MESSAGE, f"record batch of {len(out)} bytes is shorter than a header ({HEADER_SIZE})")
    attributes = _I16.unpack_from(out, _ATTRIBUTES_OFFSET)[0] | _TIMESTAMP_TYPE_BIT
    _I16.pack_into(out, _ATTRIBUTES_OFFSET, attributes)
    _I64.pack_into(out, _MAX_TIMESTAMP_OFFSET, now_ms)
    _U32.pack_into(out, _CRC_OFFSET, crc32c(memoryview(out)[_ATTRIBUTES_OFFSET:]))
    return bytes(out)


# -- serving what is stored --------------------------------------------------------


def patch_base_offsets(
    buf: bytearray | memoryview,
    starts: Sequence[int] | np.ndarray[Any, Any],
    base_offsets: Sequence[int] | np.ndarray[Any, Any],
) -> None:
    """Write ``base_offsets[i]`` as the baseOffset of the batch at ``buf[starts[i]:]``.

    A fetch answer is stored batches back to back; each one's baseOffset (bytes 0..8,
    outside the crc) becomes the offset of its first record. One ``pack_into`` per
    batch (about 0.2 us; the loop is per batch, never per record). ``starts`` and
    ``base_offsets`` may be lists or numpy integer arrays. Raises ``ValueError`` if they
    differ in length or a start leaves no room for 8 bytes.
    """
    if len(starts) != len(base_offsets):
        raise ValueError(f"{len(starts)} batch starts but {len(base_offsets)} base offsets")
    if isinstance(starts, np.ndarray):
        starts = starts.tolist()
    if isinstance(base_offsets, np.ndarray):
        base_offsets = base_offsets.tolist()
    limit = len(buf) - 8
    pack_into = _I64.pack_into
    for start, offset in zip(starts, base_offsets, strict=True):
        if not 0 <= start <= limit:
            raise ValueError(f"batch start {start} is outside the {len(buf)}-byte buffer")
        pack_into(buf, start, offset)


# -- Thrift-written items as one Kafka batch ---------------------------------------


def _zigzag_varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


# Zigzag varints of 0 .. _VARINT_TABLE_SIZE - 1 (offset deltas, lengths, small time deltas).
_VARINT_TABLE_SIZE: Final = 1 << 14
_VARINT: Final = tuple(_zigzag_varint(n) for n in range(_VARINT_TABLE_SIZE))


def luxun_items_to_batch(
    items: Sequence[bytes | bytearray | memoryview], base_offset: int, timestamps_ms: Sequence[int]
) -> bytes:
    """Consecutive Thrift-written items as ONE uncompressed v2 record batch.

    Record i is item i: key null, value the item's bytes exactly, no headers, timestamp
    ``timestamps_ms[i]`` (the item's append time), offset ``base_offset + i``. The batch
    says CreateTime, producer id -1 (no idempotence), partitionLeaderEpoch 0. Raises
    ``ValueError`` for no items or a length mismatch.

    Python runs once per item here (a Kafka consumer of a Thrift-written topic goes
    through it), so the loop is kept short: table lookups for the varints.
    """
    count = len(items)
    if count == 0:
        raise ValueError("no items to make a record batch of")
    if len(timestamps_ms) != count:
        raise ValueError(f"{count} items but {len(timestamps_ms)} timestamps")
    table = _VARINT
    table_size = _VARINT_TABLE_SIZE
    base_ts = timestamps_ms[0]
    parts: list[bytes | bytearray | memoryview] = [b""]
    append = parts.append
    # Per record: length, attributes 0, timestamp delta, offset delta, key -1 (zigzag 1),
    # value length, value, header count 0.
    for i in range(count):
        value = items[i]
        n = len(value)
        delta = timestamps_ms[i] - base_ts
        head = b"".join(
            (
                b"\x00",
                table[delta] if 0 <= delta < table_size else _zigzag_varint(delta),
                table[i] if i < table_size else _zigzag_varint(i),
                b"\x01",
                table[n] if n < table_size else _zigzag_varint(n),
            )
        )
        size = len(head) + n + 1
        append(table[size] if size < table_size else _zigzag_varint(size))
        append(head)
        append(value)
        append(b"\x00")
    parts[0] = _HEADER_AFTER_CRC.pack(0, count - 1, base_ts, max(timestamps_ms), -1, -1, -1, count)
    body = b"".join(parts)
    crc = crc32c(body)
    return _I64.pack(base_offset) + _PREFIX.pack(len(body) + 9, 0, MAGIC, crc) + body


# attributes .. recordCount (what the crc covers, before the records)
_HEADER_AFTER_CRC: Final = struct.Struct(">hiqqqhii")
# batchLength, partitionLeaderEpoch, magic, crc
_PREFIX: Final = struct.Struct(">iibI")


# -- reading records ---------------------------------------------------------------


def batch_records(batch: bytes | bytearray | memoryview, *, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Record]:
    """The records of one v2 batch, decompressed (at most ``max_bytes`` of records).

    For tests, the CLI and the cross-protocol path; the batch is checked as by
    :func:`split_batches` (``from_client=False``) first. A control batch's records are
    returned as they are (keys and values are the control record bytes).
    Raises :class:`BatchError` (``CORRUPT_MESSAGE``) for records that do not parse.
    """
    head, body = _open(batch, max_bytes)
    base_offset = head.base_offset
    base_ts = head.base_timestamp
    append_time = head.max_timestamp if head.log_append_time else None
    records: list[Record] = []
    for ts_delta, offset_delta, key, value, headers in _read_records(body, head.record_count, offsets=True):
        ts = append_time if append_time is not None else base_ts + ts_delta
        records.append(Record(base_offset + offset_delta, ts, key, value, headers))
    return records


def batch_to_pack(batch: bytes | bytearray | memoryview, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """What a Thrift consumer gets for a stored Kafka batch: one Luxun message pack.

    The pack (:mod:`idl.pack`'s format, codec none, crc32 set) holds the records'
    values in order, a null value as an empty message. Keys, headers, timestamps and
    offsets have no place in a Luxun pack and are left out. A control batch (transaction
    markers) gives a pack with no messages. Decompresses gzip, snappy (xerial-framed or
    raw), lz4 and zstd, at most ``max_bytes``; raises :class:`BatchError` otherwise.
    """
    head, body = _open(batch, max_bytes, control_body=False)
    if head.control:
        return encode_pack([])
    written = _values(body, head.record_count)
    if isinstance(written, tuple):
        raise _record_error(written, head.record_count)
    return encode_pack_written(head.record_count, written)


def _open(
    batch: bytes | bytearray | memoryview, max_bytes: int, *, control_body: bool = True
) -> tuple[Batch, memoryview]:
    """The header of exactly one batch and its records, decompressed."""
    found = split_batches(batch, from_client=False)
    if len(found) != 1:
        raise BatchError(CORRUPT_MESSAGE, f"expected one record batch, found {len(found)}")
    return _open_batch(found[0], max_bytes, control_body=control_body)


def _open_batch(head: Batch, max_bytes: int, *, control_body: bool = True) -> tuple[Batch, memoryview]:
    """``head`` and its records, decompressed (at most ``max_bytes``)."""
    raw = head.data[HEADER_SIZE:]
    if head.control and not control_body:
        return head, raw
    codec = head.codec
    if codec == CODEC_NONE:
        return head, raw
    try:
        body = _DECOMPRESS[codec](raw, max_bytes)
    except BatchError:
        raise
    except Exception as exc:  # each codec library raises its own error types
        raise BatchError(
            CORRUPT_MESSAGE,
            f"{CODEC_NAMES[codec]} records of the batch do not decompress: {type(exc).__name__}: {exc}",
        ) from exc
    return head, memoryview(body)


def _too_big(codec: str, max_bytes: int) -> BatchError:
    return BatchError(MESSAGE_TOO_LARGE, f"{codec} records inflate past the {max_bytes}-byte limit")


def _gunzip(data: memoryview, max_bytes: int) -> bytes:
    out: list[bytes] = []
    total = 0
    rest: bytes | memoryview = data
    while rest:
        d = zlib.decompressobj(wbits=47)  # gzip or zlib header
        chunk = d.decompress(rest, max_bytes - total + 1)
        total += len(chunk)
        if total > max_bytes:
            raise _too_big("gzip", max_bytes)
        out.append(chunk)
        if not d.eof:
            if d.unconsumed_tail:
                raise _too_big("gzip", max_bytes)
            raise BatchError(CORRUPT_MESSAGE, "gzip records are truncated")
        rest = d.unused_data  # another gzip member
    return b"".join(out)


def _unsnappy(data: memoryview, max_bytes: int) -> bytes:
    """snappy records, xerial-framed (as the Java client and librdkafka write them) or
    one raw block: :func:`idl.codec.unsnappy`, which refuses output past ``max_bytes``
    from each block's declared length, before decompressing it. Its other errors
    (``CodecError``) are told by :func:`_open` as any codec's are."""
    try:
        return unsnappy(data, max_bytes)
    except TooLargeError:
        raise _too_big("snappy", max_bytes) from None


def _unlz4(data: memoryview, max_bytes: int) -> bytes:
    d = lz4.frame.LZ4FrameDecompressor()
    out = d.decompress(bytes(data), max_length=max_bytes + 1)
    if len(out) > max_bytes:
        raise _too_big("lz4", max_bytes)
    if not d.eof:
        raise BatchError(CORRUPT_MESSAGE, "lz4 records are truncated")
    return bytes(out)


_ZSTD_MAGIC: Final = 0xFD2FB528


def _unzstd(data: memoryview, max_bytes: int) -> bytes:
    """zstd records: frames one after the other (skippable frames skipped), each fed to
    the decompressor one block at a time (a block makes at most 128 KiB), so inflating
    stops within a block of ``max_bytes``, and a frame whose blocks are cut short is told
    as truncated (zstandard's readers end such input without a word)."""
    buf = bytes(data)
    size = len(buf)
    out: list[bytes] = []
    total = 0
    pos = 0
    while pos < size:
        if size - pos < 8:
            raise BatchError(CORRUPT_MESSAGE, "zstd records are truncated")
        magic = int.from_bytes(buf[pos : pos + 4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame: size, then that many bytes
            pos += 8 + int.from_bytes(buf[pos + 4 : pos + 8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            raise BatchError(CORRUPT_MESSAGE, f"zstd records hold a frame of unknown magic {magic:#x}")
        params = zstandard.get_frame_parameters(buf[pos : pos + 18])
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        fed = pos
        p = pos + zstandard.frame_header_size(buf[pos : pos + 18])
        while True:
            if p + 3 > size:
                raise BatchError(CORRUPT_MESSAGE, "zstd records are truncated")
            block = int.from_bytes(buf[p : p + 3], "little")
            kind = (block >> 1) & 3
            if kind == 3:
                raise BatchError(CORRUPT_MESSAGE, "zstd records hold a block of reserved type 3")
            p += 3 + (1 if kind == 1 else block >> 3)  # an RLE block stores its one byte
            last = block & 1
            if last and params.has_checksum:
                p += 4
            if p > size:
                raise BatchError(CORRUPT_MESSAGE, "zstd records are truncated")
            chunk = decompressor.decompress(buf[fed:p])
            fed = p
            total += len(chunk)
            if total > max_bytes:
                raise _too_big("zstd", max_bytes)
            out.append(chunk)
            if last:
                break
        if not decompressor.eof:
            raise BatchError(CORRUPT_MESSAGE, "zstd records are truncated")
        pos = p
    if pos != size:
        raise BatchError(CORRUPT_MESSAGE, "zstd records are truncated")
    return b"".join(out)


_DECOMPRESS: Final = {CODEC_GZIP: _gunzip, CODEC_SNAPPY: _unsnappy, CODEC_LZ4: _unlz4, CODEC_ZSTD: _unzstd}


_RawRecord = tuple[int, int, "bytes | None", "bytes | None", tuple[tuple[str, "bytes | None"], ...]]


class _Corrupt(Exception):
    """Raised inside the record reader; _read_records turns it into a BatchError."""


def _varint(buf: bytes, pos: int, limit: int, what: str, size: int = 5) -> tuple[int, int]:
    """The zigzag varint at ``buf[pos:]`` (not reading at or past ``limit``) and the
    position after it: at most ``size`` bytes (5: Kafka's int fields, 10: its longs)."""
    n = shift = 0
    for _ in range(size):
        if pos >= limit:
            raise _Corrupt(f"the {what} runs past its record")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            if size == 5:
                if n > 0xFFFFFFFF:
                    break
                return ((n >> 1) ^ -(n & 1)), pos
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
    raise _Corrupt(f"the {what} is a varint longer than {size} bytes")


def _blob(buf: bytes, pos: int, limit: int, what: str, null: bool = True) -> tuple[bytes | None, int]:
    """A length-prefixed (-1 = null where ``null``) byte string at ``buf[pos:]`` and the
    position after it."""
    n, pos = _varint(buf, pos, limit, f"{what} length")
    if n < 0:
        if n != -1 or not null:
            raise _Corrupt(f"{what} length {n}")
        return None, pos
    end = pos + n
    if end > limit:
        raise _Corrupt(f"{what} length {n} runs past its record")
    return buf[pos:end], end


def _read_records(body: bytes | memoryview, count: int, *, offsets: bool = False) -> list[_RawRecord]:
    """``count`` records from ``body`` (which they must fill exactly), bounds-checked as
    Kafka's broker reads them (``DefaultRecord.readFrom``), field by field in the order
    of :mod:`luxun._records`, which does the same in C. With ``offsets`` the offset
    deltas must be 0, 1, ... (what a produced batch must hold).

    Each entry: (timestamp delta, offset delta, key, value, headers). Raises
    :class:`BatchError` (``INVALID_RECORD``, the index of the record at fault).
    """
    buf = bytes(body)
    size = len(buf)
    out: list[_RawRecord] = []
    append = out.append
    pos = 0
    try:
        for i in range(count):
            if pos >= size:
                raise _Corrupt(f"the batch says {count} records, its bytes end after {i}")
            length, pos = _varint(buf, pos, size, "record length")
            end = pos + length
            if length < _MIN_RECORD_SIZE - 1 or end > size:
                raise _Corrupt(f"record length {length} with {size - pos} bytes left")
            # attributes (1 byte, unused), then the timestamp and offset deltas
            ts_delta, pos = _varint(buf, pos + 1, end, "timestamp delta", 10)
            offset_delta, pos = _varint(buf, pos, end, "offset delta")
            if offsets and offset_delta != i:
                raise _Corrupt(f"offset delta {offset_delta}, expected {i}")
            key, pos = _blob(buf, pos, end, "key")
            value, pos = _blob(buf, pos, end, "value")
            headers: list[tuple[str, bytes | None]] = []
            n_headers, pos = _varint(buf, pos, end, "header count")
            if n_headers < 0 or n_headers > end - pos:
                raise _Corrupt(f"header count {n_headers}")
            for _ in range(n_headers):
                hkey, pos = _blob(buf, pos, end, "header key", null=False)
                hvalue, pos = _blob(buf, pos, end, "header value")
                headers.append(((hkey or b"").decode("utf-8", "replace"), hvalue))
            if pos != end:
                raise _Corrupt(f"the record's fields end {end - pos} bytes before its length says")
            append((ts_delta, offset_delta, key, value, tuple(headers)))
    except _Corrupt as exc:
        n = len(out)
        raise BatchError(INVALID_RECORD, f"record {n}: {exc} (byte {pos} of the records)", n) from None
    if pos != size:
        raise BatchError(
            INVALID_RECORD,
            f"record {count}: {size - pos} bytes follow the batch's {count} records (byte {pos} of the records)",
        )
    return out


def _check_py(
    body: bytes | memoryview, count: int, start: int = 0, keys: bool = False
) -> int | tuple[int, tuple[int, ...]] | tuple[int, int | None, str]:
    """:func:`luxun._records.check` in Python (where the C module is not built): the
    largest timestamp delta (with ``keys``: and the indexes of the records whose key is
    null), or ``(code, record, message)``."""
    try:
        read = _read_records(memoryview(body)[start:], count, offsets=True)
    except BatchError as exc:
        return exc.code, exc.record, str(exc)
    top = max(r[0] for r in read)
    if keys:
        return top, tuple(i for i, r in enumerate(read) if r[2] is None)
    return top


def _values_py(body: bytes | memoryview, count: int, start: int = 0) -> bytes | tuple[int, int | None, str]:
    """:func:`luxun._records.values` in Python (where the C module is not built)."""
    try:
        values = [r[3] or b"" for r in _read_records(memoryview(body)[start:], count, offsets=True)]
    except BatchError as exc:
        return exc.code, exc.record, str(exc)
    return b"".join(b for v in values for b in (_I32.pack(len(v)), v))


_check: Any = _check_py
_values: Any = _values_py
#: Whether the records are checked and read by the compiled luxun._records.
COMPILED = False
try:  # by name: import-linter sees no .py for it and would take it for the package luxun
    _compiled = importlib.import_module("luxun._records")
except ImportError:  # not built (no C compiler where luxun was installed): the Python twins
    pass
else:
    _check, _values, COMPILED = _compiled.check, _compiled.values, True
