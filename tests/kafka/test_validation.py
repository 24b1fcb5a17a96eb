"""Every produced batch is read record by record before anything of it is stored
(issue 30, item 1): the hostile batches that were once stored with error 0 and then
wedged every consumer of the partition are refused with Kafka's codes, the high
watermark does not move, and Kafka and Thrift consumers read the good records around
them. The compiled reader (luxun/_records.c) and its Python twin give the same answers."""

from __future__ import annotations

import gzip
import struct
import time

import pytest
import zstandard
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from idl import luxun_thrift as T
from idl.pack import decode_pack
from luxun import records as R
from tests._broker import BrokerProcess

from ._kafka import (
    RawClient,
    fetch_request,
    metadata_request,
    produce_partition_response,
    produce_request,
    read_partition,
)

pytestmark = pytest.mark.timeout(180)

T0 = 1_700_000_000_000


def records(
    values: list[bytes | None], *, deltas: list[int] | None = None, keys: list[bytes | None] | None = None
) -> bytes:
    """The record bytes (uncompressed) of ``values``, offset deltas 0.. unless given,
    keys null unless given."""
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30)
    for i, v in enumerate(values):
        b.append(i, timestamp=T0 + i, key=None if keys is None else keys[i], value=v, headers=[])
    body = bytes(b.build())[61:]
    if deltas is None:
        return body
    out = bytearray()  # each record re-written with the offset delta given
    pos = 0
    for d in deltas:
        length, n = _unvarint(body, pos)
        rec = body[pos + n : pos + n + length]
        ts_end = 1 + _unvarint(rec, 1)[1]
        old_len = _unvarint(rec, ts_end)[1]
        new = rec[:ts_end] + _varint(d) + rec[ts_end + old_len :]
        out += _varint(len(new)) + new
        pos += n + length
    return bytes(out)


_varint = R._zigzag_varint  # the broker's own encoder of Kafka's varints


def _unvarint(buf: bytes, pos: int) -> tuple[int, int]:
    n = shift = i = 0
    while True:
        b = buf[pos + i]
        n |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), i
        shift += 7


def batch(body: bytes, count: int, *, codec: int = 0, max_ts: int | None = None) -> bytes:
    """A v2 batch with a valid header and CRC-32C over ``body`` (records, compressed per
    ``codec``), claiming ``count`` records."""
    head = struct.pack(
        ">hiqqqhii", codec, count - 1, T0, T0 + count - 1 if max_ts is None else max_ts, -1, -1, -1, count
    )
    rest = head + body
    return struct.pack(">qiib", 0, len(rest) + 9, 0, 2) + struct.pack(">I", crc32c(rest)) + rest


GOOD = batch(records([b"good-0", b"good-1"]), 2)

# name: (batch, Kafka error code, record at fault (None: the batch as a whole), words of the message)
HOSTILE: dict[str, tuple[bytes, int, int | None, str]] = {
    "gzip batch whose body is not gzip": (
        batch(b"this is not gzip at all" * 4, 1, codec=R.CODEC_GZIP),
        R.CORRUPT_MESSAGE,
        None,
        "do not decompress",
    ),
    "one record claiming 2^31-1 records": (
        batch(gzip.compress(records([b"x"])), 2**31 - 1, codec=R.CODEC_GZIP),
        R.MESSAGE_TOO_LARGE,
        None,
        "2147483647 records",
    ),
    "uncompressed batch claiming 10 records holding 1": (
        batch(records([b"only one"]), 10),
        R.INVALID_RECORD,
        None,
        "claims 10 records",
    ),
    "gzip batch claiming 10 records holding 1": (
        batch(gzip.compress(records([b"only one"])), 10, codec=R.CODEC_GZIP),
        R.INVALID_RECORD,
        1,
        "record 1",
    ),
    "zstd batch of 256 MiB of zeros": (
        batch(zstandard.ZstdCompressor().compress(bytes(256 << 20)), 1, codec=R.CODEC_ZSTD),
        R.MESSAGE_TOO_LARGE,
        None,
        "inflate past",
    ),
    "zstd batch of 9 M empty records": (
        batch(zstandard.ZstdCompressor().compress(bytes([12, 0, 0, 0, 1, 1, 0]) * 9_000_000), 9_000_000, codec=4),
        R.MESSAGE_TOO_LARGE,
        None,
        "9000000 records",
    ),
    "offset deltas 0, 0": (
        batch(records([b"a", b"b"], deltas=[0, 0]), 2),
        R.INVALID_RECORD,
        1,
        "offset delta 0, expected 1",
    ),
    "a value length past its record": (
        batch(records([b"fine", b"abc"])[:-5] + b"\x7e" + records([b"fine", b"abc"])[-4:], 2),
        R.INVALID_RECORD,
        1,
        "value length",
    ),
    "a null header key": (
        batch(bytes([18, 0, 0, 0, 1, 2, 0x61, 2, 1, 0]), 1),
        R.INVALID_RECORD,
        0,
        "header key length -1",
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_batch_is_refused_and_nothing_of_it_is_stored(broker: BrokerProcess, name: str) -> None:
    bad, code, record, words = HOSTILE[name]
    topic = "hostile"
    thrift = broker.client()
    with RawClient(broker.kafka_port) as raw:
        assert raw.call(metadata_request(topic)).topics[0].error_code == 0
        part = produce_partition_response(raw.call(produce_request(topic, 0, GOOD, version=8)))
        assert (part.error_code, part.base_offset) == (0, 0)
        part = produce_partition_response(raw.call(produce_request(topic, 0, bad, version=8)))
        assert part.error_code == code, part
        assert words in (part.error_message or ""), part
        if record is None:
            assert part.record_errors == (), part
        else:  # KIP-467: the record at fault, for the client to report
            assert [e.batch_index for e in part.record_errors] == [record], part
            assert words in (part.record_errors[0].batch_index_error_message or "")
        # Nothing stored: the next good batch lands right after the first.
        part = produce_partition_response(raw.call(produce_request(topic, 0, GOOD, version=8)))
        assert (part.error_code, part.base_offset) == (0, 2), part
    # Kafka consumers (librdkafka, kafka-python) read the good records and nothing else.
    got = read_partition(broker.bootstrap, topic, 0, 4)
    assert [(m.offset(), m.value()) for m in got] == [(0, b"good-0"), (1, b"good-1"), (2, b"good-0"), (3, b"good-1")]
    assert _kafka_python_values(broker.bootstrap, topic, 4) == [b"good-0", b"good-1"] * 2
    # A Thrift consumer gets Luxun packs, one per stored batch.
    response = thrift.consume(T.ConsumeRequest(topic=topic, startIndex=0, maxFetchSize=1 << 20))
    assert response.result.resultCode == 0
    assert [decode_pack(item) for item in response.itemList] == [[b"good-0", b"good-1"]] * 2
    thrift.close()
    assert "Traceback" not in broker.log()


def _kafka_python_values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek(TopicPartition(topic, 0), 0)
        out: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(out) < count and time.monotonic() < deadline:
            for records_ in consumer.poll(timeout_ms=500).values():
                out.extend(r.value for r in records_)
        return out
    finally:
        consumer.close()


def test_a_wrong_max_timestamp_is_corrected_as_kafka_does(broker: BrokerProcess) -> None:
    """A producer's header says maxTimestamp T0-1000; the records say T0+1: the stored
    batch says T0+1 (Kafka's broker rewrites it; the time index and consumers trust it)."""
    lying = batch(records([b"a", b"b"]), 2, max_ts=T0 - 1000)
    with RawClient(broker.kafka_port) as raw:
        raw.call(metadata_request("stamps"))
        part = produce_partition_response(raw.call(produce_request("stamps", 0, lying, version=8)))
        assert part.error_code == 0, part
    got = read_partition(broker.bootstrap, "stamps", 0, 2)
    assert [m.timestamp()[1] for m in got] == [T0, T0 + 1]
    [stored] = R.split_batches(_fetch_records(broker, "stamps"), from_client=False)
    assert stored.max_timestamp == T0 + 1


def _fetch_records(broker: BrokerProcess, topic: str) -> bytes:
    with RawClient(broker.kafka_port) as raw:
        response = raw.call(fetch_request([(topic, 0)], 1 << 20))
    return bytes(response.responses[0].partitions[0].records)


# -- the compiled reader and its Python twin ----------------------------------------


def test_the_compiled_reader_is_built() -> None:
    """scripts/bootstrap.sh builds luxun/_records.c; without it produce costs ~100x more
    per record (the Python twin), so a set-up that lost it must not pass unnoticed."""
    assert R.COMPILED


@pytest.mark.skipif(not R.COMPILED, reason="luxun._records is not built")
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    st.integers(-2, 2),
    st.integers(0, 4),
    st.lists(st.one_of(st.none(), st.binary(max_size=3)), min_size=6, max_size=6),
)
def test_compiled_and_python_readers_agree(
    values: list[bytes | None], changes: list[tuple[int, int]], count_change: int, cut: int, keys: list[bytes | None]
) -> None:
    body = bytearray(records(values, keys=keys[: len(values)]))
    for at, value in changes:
        body[at % len(body)] = value
    data = bytes(body[: len(body) - cut])
    count = max(1, len(values) + count_change)
    compiled = R._check(data, count)
    python = R._check_py(data, count)
    if isinstance(python, tuple):
        assert isinstance(compiled, tuple), (compiled, python)
        assert compiled[:2] == (python[0], count if python[1] is None else python[1])
    else:
        assert compiled == python
    compiled_keys = R._check(data, count, 0, True)  # the same, and the records without a key
    python_keys = R._check_py(data, count, 0, True)
    if len(python_keys) == 3:
        assert compiled_keys[:2] == (python_keys[0], count if python_keys[1] is None else python_keys[1])
    else:
        assert compiled_keys == python_keys
        assert python_keys[0] == python
    compiled_values = R._values(data, count)
    python_values = R._values_py(data, count)
    if isinstance(python_values, tuple):
        assert isinstance(compiled_values, tuple)
    else:
        assert compiled_values == python_values


@pytest.mark.parametrize("twin", ["compiled", "python"])
@pytest.mark.parametrize("codec", [R.CODEC_NONE, R.CODEC_GZIP, R.CODEC_ZSTD])
def test_validation_names_the_records_without_a_key_in_the_one_reading(
    twin: str, codec: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """validate(keys=True), what a compacted topic's produce asks: the records whose key
    is null (an empty key is a key) are named in the reading that checks them, the
    records decompressed once; a batch whose records all have keys passes and is kept."""
    if twin == "compiled" and not R.COMPILED:
        pytest.skip("luxun._records is not built")
    if twin == "python":
        monkeypatch.setattr(R, "_check", R._check_py)
    opened = []
    real_open = R._open_batch
    monkeypatch.setattr(R, "_open_batch", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    compress = {R.CODEC_NONE: bytes, R.CODEC_GZIP: gzip.compress, R.CODEC_ZSTD: zstandard.compress}[codec]
    body = records([b"a", b"b", b"c", b"d", b"e"], keys=[b"k", None, b"", None, b"k"])
    [keyless] = R.split_batches(batch(compress(body), 5, codec=codec))
    with pytest.raises(R.KeylessRecords) as refused:
        R.validate(keyless, keys=True)
    assert (refused.value.code, refused.value.records, refused.value.record) == (R.INVALID_RECORD, (1, 3), 1)
    assert len(opened) == (0 if codec == R.CODEC_NONE else 1)
    assert R.validate(keyless) is keyless  # not asked: no refusal
    keyed = records([b"a", b"b"], keys=[b"k", b""])
    [good] = R.split_batches(batch(compress(keyed), 2, codec=codec))
    assert R.validate(good, keys=True) is good
    with pytest.raises(R.BatchError) as broken:  # a record that does not read: still that error
        R.validate(R.split_batches(batch(compress(body[:-1]), 5, codec=codec))[0], keys=True)
    assert broken.value.code == R.INVALID_RECORD and not isinstance(broken.value, R.KeylessRecords)
