"""luxun.records against batches written by kafka-python's own encoder (a client we did not write)."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from clients.pack import decode_pack
from luxun import records as R

pytestmark = pytest.mark.timeout(120)

CODECS = [R.CODEC_NONE, R.CODEC_GZIP, R.CODEC_SNAPPY, R.CODEC_LZ4, R.CODEC_ZSTD]
T0 = 1_700_000_000_000

Headers = list[tuple[str, bytes | None]]
Rec = tuple[bytes | None, bytes | None, Headers, int]  # key, value, headers, timestamp


def build(
    recs: list[Rec],
    codec: int = R.CODEC_NONE,
    *,
    producer: tuple[int, int, int] = (-1, -1, -1),
    transactional: bool = False,
) -> bytes:
    """One v2 batch as kafka-python's producer builds it."""
    pid, epoch, seq = producer
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        batch_size=64 << 20,
    )
    for i, (key, value, headers, ts) in enumerate(recs):
        assert b.append(i, timestamp=ts, key=key, value=value, headers=headers) is not None
    return bytes(b.build())


def sample(n: int = 200) -> list[Rec]:
    """Keys, null keys, null and empty values, headers (one with a null value), varied timestamps."""
    out: list[Rec] = []
    for i in range(n):
        key = None if i % 3 == 0 else b"key-%d" % i
        value = None if i % 7 == 3 else (b"" if i % 11 == 5 else b"value %d " % i * (1 + i % 13))
        headers: Headers = [("trace", b"t%d" % i), ("empty", None)] if i % 2 else []
        out.append((key, value, headers, T0 + i * 37 - (5 if i % 4 == 1 else 0)))
    return out


def reference(data: bytes) -> list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]]:
    """What kafka-python's consumer reads from ``data``."""
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in DefaultRecordBatch(data)]


# -- split_batches -------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_split_reads_the_header_of_each_codec(codec: int) -> None:
    recs = sample()
    data = build(recs, codec, producer=(1234, 5, 17))
    [batch] = R.split_batches(data)
    ref = DefaultRecordBatch(data)
    assert batch.codec == codec == ref.compression_type  # compressible: kafka-python did compress
    assert batch.data.tobytes() == data
    assert batch.size == len(data) == batch.length + 12
    assert (batch.base_offset, batch.magic, batch.record_count, batch.last_offset_delta) == (0, 2, 200, 199)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (1234, 5, 17)
    assert batch.base_timestamp == recs[0][3] and batch.max_timestamp == max(r[3] for r in recs)
    assert batch.crc == ref.crc
    assert not (batch.log_append_time or batch.transactional or batch.control)


def test_split_finds_back_to_back_batches_as_slices() -> None:
    a, b, c = build(sample(5)), build(sample(9), R.CODEC_GZIP), build(sample(1), R.CODEC_ZSTD)
    buf = bytearray(a + b + c)
    found = R.split_batches(memoryview(buf))
    assert [x.record_count for x in found] == [5, 9, 1]
    assert [x.data.tobytes() for x in found] == [a, b, c]
    assert found[1].data.obj is buf  # a view, not a copy
    assert R.split_batches(b"") == []


def test_split_flags_of_a_transactional_batch() -> None:
    [batch] = R.split_batches(build(sample(3), producer=(7, 0, 0), transactional=True))
    assert batch.transactional and not batch.control


def _recrc(data: bytearray) -> bytes:
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


@pytest.mark.parametrize(
    ("mutate", "code", "words"),
    [
        (lambda d: d.__setitem__(-1, d[-1] ^ 1), R.CORRUPT_MESSAGE, "crc"),  # a flipped record bit
        (lambda d: d.__setitem__(22, d[22] ^ 0x40), R.CORRUPT_MESSAGE, "crc"),  # a header bit under the crc
        (lambda d: d.__delitem__(slice(-1, None)), R.CORRUPT_MESSAGE, "truncated"),
        (lambda d: d.__delitem__(slice(40, None)), R.CORRUPT_MESSAGE, "truncated"),
        (lambda d: struct.pack_into(">i", d, 8, 30), R.CORRUPT_MESSAGE, "batchLength 30"),
        (lambda d: struct.pack_into(">i", d, 8, -5), R.CORRUPT_MESSAGE, "batchLength -5"),
        (lambda d: struct.pack_into(">i", d, 8, 0x7FFFFFFF), R.CORRUPT_MESSAGE, "truncated"),
        (lambda d: d.__setitem__(16, 3), R.CORRUPT_MESSAGE, "unknown magic 3"),
    ],
)
def test_split_refuses_corrupt_batches(mutate, code: int, words: str) -> None:  # type: ignore[no-untyped-def]
    data = bytearray(build(sample(20), R.CODEC_LZ4))
    mutate(data)
    with pytest.raises(R.BatchError, match=words) as err:
        R.split_batches(data)
    assert err.value.code == code
    assert "\n" not in str(err.value)


def test_split_refuses_a_count_that_disagrees_with_the_last_offset_delta() -> None:
    data = bytearray(build(sample(20)))
    struct.pack_into(">i", data, 57, 21)  # recordCount 21, lastOffsetDelta 19
    with pytest.raises(R.BatchError, match="recordCount 21 and lastOffsetDelta 19") as err:
        R.split_batches(_recrc(data))
    assert err.value.code == R.INVALID_RECORD  # what Kafka's LogValidator answers
    struct.pack_into(">ii", data, 23, -1, 0)  # both say "no records"
    with pytest.raises(R.BatchError) as err:
        R.split_batches(_recrc(data))
    assert err.value.code == R.INVALID_RECORD


def test_split_refuses_an_uncompressed_count_with_no_room_for_its_records() -> None:
    data = bytearray(build(sample(3)))
    struct.pack_into(">i", data, 23, 1_000_000 - 1)
    struct.pack_into(">i", data, 57, 1_000_000)
    with pytest.raises(R.BatchError, match="claims 1000000 records") as err:
        R.split_batches(_recrc(data))
    assert err.value.code == R.INVALID_RECORD  # Kafka: records that are not there do not read


@pytest.mark.parametrize("magic", [0, 1])
def test_split_refuses_legacy_message_sets(magic: int) -> None:
    b = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    for i in range(3):
        b.append(i, timestamp=T0 if magic else None, key=b"k", value=b"legacy %d" % i)
    data = bytes(b.build())
    with pytest.raises(R.BatchError, match=f"magic {magic}") as err:
        R.split_batches(data)
    assert err.value.code == R.INVALID_RECORD  # Kafka: Produce >= v3 carries magic 2 only


def test_split_refuses_from_clients_what_kafka_refuses() -> None:
    data = bytearray(build(sample(2)))
    data[22] |= 0x20  # control
    with pytest.raises(R.BatchError, match="control") as err:
        R.split_batches(_recrc(data))
    assert err.value.code == R.INVALID_RECORD
    assert R.split_batches(data, from_client=False)[0].control  # as stored by the broker: fine
    data = bytearray(build(sample(2)))
    data[22] |= 0x08  # LogAppendTime
    with pytest.raises(R.BatchError) as err:
        R.split_batches(_recrc(data))
    assert err.value.code == R.INVALID_TIMESTAMP
    data = bytearray(build(sample(2), producer=(9, 0, 0)))
    struct.pack_into(">i", data, 53, -1)  # producer id without a sequence
    with pytest.raises(R.BatchError, match="sequence -1") as err:
        R.split_batches(_recrc(data))
    assert err.value.code == R.INVALID_RECORD
    data = bytearray(build(sample(2)))
    data[22] |= 0x07  # codec 7
    with pytest.raises(R.BatchError, match="codec 7") as err:
        R.split_batches(_recrc(data))
    assert err.value.code == R.UNSUPPORTED_COMPRESSION_TYPE


def test_split_refuses_a_good_batch_followed_by_garbage() -> None:
    good = build(sample(4))
    for tail in (b"\x00", b"\x00" * 16, b"\x00" * 16 + b"\x02", good[:70]):
        with pytest.raises(R.BatchError) as err:
            R.split_batches(good + tail)
        assert err.value.code == R.CORRUPT_MESSAGE, tail


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.integers(0, 400))
def test_split_on_arbitrary_bytes_only_raises_batch_error(noise: bytes, cut: int) -> None:
    good = build(sample(3))
    for data in (noise, good[:cut] + noise, good + noise, bytes(good[: min(cut, 60)]) + good[60:]):
        try:
            found = R.split_batches(data)
        except R.BatchError as err:
            assert err.code in (R.CORRUPT_MESSAGE, R.INVALID_RECORD, R.INVALID_TIMESTAMP, 76)
        else:
            assert sum(b.size for b in found) == len(data)


# -- records and packs ---------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_records_and_pack_of_each_codec_match_kafka_python(codec: int) -> None:
    data = build(sample(), codec)
    ref = reference(data)
    assert [tuple(r) for r in R.batch_records(data)] == ref
    assert decode_pack(R.batch_to_pack(data)) == [value or b"" for _, _, _, value, _ in ref]


def test_records_of_a_big_batch() -> None:
    recs: list[Rec] = [(None, b"%08d" % i + bytes(90), [], T0 + i) for i in range(20_000)]
    for codec in (R.CODEC_NONE, R.CODEC_ZSTD):
        data = build(recs, codec)
        assert len(R.batch_records(data)) == 20_000
        assert decode_pack(R.batch_to_pack(data)) == [r[1] for r in recs]


def test_snappy_raw_block_and_xerial_stream_both_read() -> None:
    import snappy  # type: ignore[import-untyped]

    data = build(sample(50), R.CODEC_SNAPPY)
    assert data[61:69] == b"\x82SNAPPY\x00"  # kafka-python frames like the Java client
    body = build(sample(50))[61:]
    raw = bytearray(data[:61]) + snappy.compress(body)
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    raw_batch = _recrc(raw)
    assert [tuple(r) for r in R.batch_records(raw_batch)] == reference(data)


def test_pack_of_a_control_batch_has_no_messages() -> None:
    data = bytearray(build(sample(1)))
    data[22] |= 0x20
    assert decode_pack(R.batch_to_pack(_recrc(data))) == []


def test_decompression_is_bounded() -> None:
    recs: list[Rec] = [(None, bytes(1000), [], T0)] * 2000  # ~2 MB of zeros, tiny compressed
    for codec in CODECS[1:]:
        data = build(recs, codec)
        assert len(data) < 200_000
        with pytest.raises(R.BatchError, match="1000000-byte limit") as err:
            R.batch_to_pack(data, max_bytes=1_000_000)
        assert err.value.code == R.MESSAGE_TOO_LARGE  # luxun's bound (Kafka has none): a producer splits such batches
        assert len(R.batch_records(data, max_bytes=3_000_000)) == 2000


@pytest.mark.parametrize("codec", CODECS[1:])
def test_corrupt_compressed_records_are_a_batch_error(codec: int) -> None:
    data = bytearray(build(sample(), codec))
    for cut in (len(data) - 1, 80):
        bad = bytearray(data[:cut])
        struct.pack_into(">i", bad, 8, cut - 12)
        with pytest.raises(R.BatchError) as err:
            R.batch_records(_recrc(bad))
        assert err.value.code == R.CORRUPT_MESSAGE
    bad = bytearray(data)
    for i in range(70, len(bad), 7):
        bad[i] ^= 0x55
    with pytest.raises(R.BatchError) as err:
        R.batch_to_pack(_recrc(bad))
    assert err.value.code == R.CORRUPT_MESSAGE


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200), st.integers(61, 2000))
def test_records_of_garbage_under_a_valid_crc_only_raise_batch_error(noise: bytes, cut: int) -> None:
    data = bytearray(build(sample(10)))
    body = bytearray(data[61:cut]) + noise
    bad = bytearray(data[:61]) + body
    struct.pack_into(">i", bad, 8, len(bad) - 12)
    batch = _recrc(bad)
    try:
        recs = R.batch_records(batch)
    except R.BatchError as err:
        assert err.code in (R.CORRUPT_MESSAGE, R.INVALID_RECORD)
        recs = None
    else:
        assert len(recs) == 10
    try:  # the values-only reader agrees with the full one
        values = decode_pack(R.batch_to_pack(batch))
    except R.BatchError as err:
        assert err.code in (R.CORRUPT_MESSAGE, R.INVALID_RECORD)
        # the full reader also checks the headers: it refuses at least what this one does
        assert recs is None
    else:
        if recs is not None:
            assert values == [r.value or b"" for r in recs]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.none() | st.binary(max_size=40),
            st.none() | st.binary(max_size=300),
            st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3),
            st.integers(T0 - 10**9, T0 + 10**9),
        ),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from(CODECS),
)
def test_any_batch_kafka_python_writes_reads_the_same(recs: list[Rec], codec: int) -> None:
    data = build(recs, codec)
    [batch] = R.split_batches(data)
    assert batch.record_count == len(recs)
    assert [tuple(r) for r in R.batch_records(data)] == reference(data)
    assert decode_pack(R.batch_to_pack(data)) == [r[1] or b"" for r in recs]


# -- log append time, base offsets -------------------------------------------------


def test_log_append_time_restamps_as_kafka_does() -> None:
    data = build(sample(30), R.CODEC_GZIP)
    stamped = R.with_log_append_time(data, T0 + 99_999)
    [batch] = R.split_batches(stamped, from_client=False)  # the crc is right
    assert batch.log_append_time and batch.max_timestamp == T0 + 99_999
    assert stamped[61:] == data[61:]  # records untouched
    ref = DefaultRecordBatch(stamped)
    assert ref.validate_crc() and ref.timestamp_type == 1
    assert {r.timestamp for r in ref} == {T0 + 99_999}  # what a consumer sees
    assert {r.timestamp for r in R.batch_records(stamped)} == {T0 + 99_999}


def test_patch_base_offsets_of_a_fetched_blob() -> None:
    parts = [build(sample(n), codec) for n, codec in ((3, 0), (5, 1), (1, 4))]
    blob = bytearray(b"".join(parts))
    starts = [0, len(parts[0]), len(parts[0]) + len(parts[1])]
    R.patch_base_offsets(blob, starts, [100, 103, 2**40])
    got = MemoryRecords(bytes(blob))
    offsets = []
    while got.has_next():
        batch = got.next_batch()
        assert batch.validate_crc()  # baseOffset is outside the crc
        offsets += [r.offset for r in batch]
    assert offsets == [100, 101, 102, *range(103, 108), 2**40]
    R.patch_base_offsets(blob, np.array(starts), np.array([7, 8, 9], dtype=np.int64))  # numpy arrays too
    assert [struct.unpack_from(">q", blob, s)[0] for s in starts] == [7, 8, 9]
    with pytest.raises(ValueError, match="outside"):
        R.patch_base_offsets(blob, [len(blob) - 7], [1])
    with pytest.raises(ValueError, match="2 batch starts but 1"):
        R.patch_base_offsets(blob, [0, 1], [1])


# -- Thrift-written items as a batch -------------------------------------------------


def test_items_to_batch_reads_back_in_kafka_python() -> None:
    items = [b"pack %d" % i * (i % 50) for i in range(300)] + [bytes(20_000), b""]
    stamps = [T0 + i // 3 for i in range(len(items))]
    stamps[5] = T0 - 1  # a clock step back: a negative delta
    data = R.luxun_items_to_batch(items, 12345, stamps)
    ref = DefaultRecordBatch(data)
    assert ref.validate_crc() and ref.compression_type == 0 and ref.timestamp_type == 0
    assert ref.producer_id == -1
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in ref]
    assert got == [(12345 + i, stamps[i], None, items[i], []) for i in range(len(items))]
    [batch] = R.split_batches(data)
    assert (batch.base_offset, batch.record_count, batch.max_timestamp) == (12345, len(items), max(stamps))


def test_items_to_batch_of_many_items_and_views() -> None:
    items = [memoryview(b"%d" % i) for i in range(20_000)]  # offset deltas past the varint table
    data = R.luxun_items_to_batch(items, 0, [T0 + i * 1000 for i in range(20_000)])
    assert [r.value for r in DefaultRecordBatch(data)] == [bytes(v) for v in items]
    with pytest.raises(ValueError, match="no items"):
        R.luxun_items_to_batch([], 0, [])
    with pytest.raises(ValueError, match="2 items but 1 timestamps"):
        R.luxun_items_to_batch([b"a", b"b"], 0, [T0])


def test_pack_of_items_batch_round_trips() -> None:
    items = [b"m%d" % i for i in range(10)]
    data = R.luxun_items_to_batch(items, 0, [T0] * 10)
    assert decode_pack(R.batch_to_pack(data)) == items
    pack = R.encode_pack(items)
    assert struct.unpack_from(">i", pack, 11)[0] == _signed(zlib.crc32(pack[22:-1]))


def _signed(crc: int) -> int:
    return crc - (1 << 32) if crc & 0x8000_0000 else crc


def _rewrap(data: bytes, codec: int, body: bytes) -> bytes:
    out = bytearray(data[:61]) + body
    struct.pack_into(">i", out, 8, len(out) - 12)
    out[22] = (out[22] & ~0x07) | codec
    return _recrc(out)


def test_streamed_frames_as_other_clients_write_them() -> None:
    import lz4.frame  # type: ignore[import-untyped]
    import zstandard

    plain = build(sample(300))
    body = plain[61:]
    # zstd streamed (no content size in the frame header) and split in two frames
    z = zstandard.ZstdCompressor(write_content_size=False)
    half = len(body) // 2
    obj = z.compressobj()
    zbody = obj.compress(body[:half]) + obj.flush() + z.compress(body[half:])
    # lz4 with small linked blocks and a content checksum
    lbody = lz4.frame.compress(body, block_size=lz4.frame.BLOCKSIZE_MAX64KB, content_checksum=True)
    want = reference(plain)
    for codec, packed in ((R.CODEC_ZSTD, zbody), (R.CODEC_LZ4, lbody)):
        batch = _rewrap(plain, codec, packed)
        assert [tuple(r) for r in R.batch_records(batch)] == want
    # gzip with two members, as a concatenating writer would produce
    gz = zlib.compressobj(wbits=31)
    g1 = gz.compress(body[:half]) + gz.flush()
    gz = zlib.compressobj(wbits=31)
    g2 = gz.compress(body[half:]) + gz.flush()
    assert [tuple(r) for r in R.batch_records(_rewrap(plain, R.CODEC_GZIP, g1 + g2))] == want


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=3))
def test_records_with_bytes_changed_under_a_valid_crc_only_raise_batch_error(changes: list[tuple[int, int]]) -> None:
    data = bytearray(build(sample(10)))
    for at, value in changes:
        data[61 + at % (len(data) - 61)] = value
    batch = _recrc(data)
    full: list[bytes] | None
    try:
        full = [r.value or b"" for r in R.batch_records(batch)]
    except R.BatchError as err:
        assert err.code == R.INVALID_RECORD  # a record that does not read, as Kafka's LogValidator answers
        full = None
    try:
        values = decode_pack(R.batch_to_pack(batch))
    except R.BatchError as err:
        assert err.code == R.INVALID_RECORD
        assert full is None  # both readers apply the same rules
    else:
        assert values == full


def _with_body(body: bytes, count: int) -> bytes:
    """A valid header (crc, length, count) over ``body`` as the records."""
    data = bytearray(build(sample(1))[:61]) + body
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">i", data, 23, count - 1)
    struct.pack_into(">i", data, 57, count)
    return _recrc(data)


def test_a_record_cut_short_in_any_field_is_refused() -> None:
    record = build([(b"key", b"value", [("h", b"x")], T0)])[61:]
    assert record[0] < 0x80  # a one-byte length
    fields = record[1:]
    bodies = [bytes([k << 1]) + fields[:k] + bytes(6) for k in range(len(fields))]  # 6 bytes of slack
    bodies += [bytes([k << 1]) + fields[:k] for k in range(6, len(fields))]
    # the timestamp delta's varint runs to the very end of the records
    bodies.append(b"\x0c\x00\x80\x80\x80\x80\x01")
    for body in bodies:
        batch = _with_body(body, 1)
        with pytest.raises(R.BatchError) as err:
            R.batch_records(batch)
        assert (err.value.code, err.value.record) == (R.INVALID_RECORD, 0), body  # as Kafka's LogValidator
        with pytest.raises(R.BatchError) as err:  # the values reader reads headers too
            R.batch_to_pack(batch)
        assert (err.value.code, err.value.record) == (R.INVALID_RECORD, 0), body
        with pytest.raises(R.BatchError) as err:
            R.validate(R.split_batches(batch)[0])
        assert (err.value.code, err.value.record) == (R.INVALID_RECORD, 0), body
    assert R.batch_records(_with_body(record, 1))[0].value == b"value"


@pytest.mark.parametrize("codec", CODECS)
def test_batches_of_aiokafkas_c_encoder(codec: int) -> None:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioBuilder

    b = AioBuilder(
        magic=2, compression_type=codec, is_transactional=0, producer_id=77, producer_epoch=1, base_sequence=0,
        batch_size=64 << 20,
    )  # fmt: skip
    recs = sample(150)
    for i, (key, value, headers, ts) in enumerate(recs):
        assert b.append(i, timestamp=ts, key=key, value=value, headers=headers) is not None
    data = bytes(b.build())
    [batch] = R.split_batches(data)
    assert (batch.codec, batch.record_count, batch.producer_id) == (codec, 150, 77)
    assert [tuple(r) for r in R.batch_records(data)] == reference(data)
    assert decode_pack(R.batch_to_pack(data)) == [r[1] or b"" for r in recs]
