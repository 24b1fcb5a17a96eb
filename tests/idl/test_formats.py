"""idl's shared formats: the message-pack layout (idl.pack) and the payload codecs with
snappy-java's framing (idl.codec), used by both the clients and the broker; the clients'
and the broker's error types are translations of idl's, with the same messages."""

from __future__ import annotations

import os
import struct
from typing import Any

import pytest
import snappy  # type: ignore[import-untyped]

import clients.codec
import clients.pack
from clients.errors import LuxunClientError
from clients.messages import PackError as ClientPackError
from idl import codec, pack

XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)


def xerial(*blocks: bytes) -> bytes:
    """A xerial stream of one raw snappy block per item of ``blocks``."""
    out = [XERIAL_HEADER]
    for data in blocks:
        block = snappy.compress(data)
        out += [struct.pack(">i", len(block)), block]
    return b"".join(out)


class CountingSnappy:
    """python-snappy, counting the blocks decompressed."""

    def __init__(self) -> None:
        self.calls = 0

    def compress(self, data: Any) -> bytes:
        return bytes(snappy.compress(data))

    def decompress(self, data: Any) -> bytes:
        self.calls += 1
        return bytes(snappy.decompress(data))


def test_pack_round_trip_and_the_broker_writes_the_same_bytes() -> None:
    from luxun import records

    msgs = [os.urandom(30), b"", b"x" * 5000]
    item = pack.encode_pack(msgs)
    assert pack.decode_pack(item) == msgs == clients.pack.decode_pack(item)
    assert clients.pack.encode_pack(msgs) == item
    assert records.encode_pack is pack.encode_pack  # batch_to_pack writes packs with idl's encoder
    for codec_id in (codec.NO_COMPRESSION, codec.GZIP, codec.SNAPPY):
        assert pack.decode_pack(pack.encode_pack(msgs, codec_id)) == msgs


def test_idl_raises_its_errors_and_the_clients_theirs_with_the_same_message() -> None:
    item = bytearray(pack.encode_pack([b"abc"]))
    item[-3] ^= 1  # a payload byte: crc32 mismatch
    with pytest.raises(pack.PackError, match="crc32 mismatch") as idl_err:
        pack.decode_pack(bytes(item))
    assert not isinstance(idl_err.value, LuxunClientError)
    with pytest.raises(ClientPackError) as client_err:
        clients.pack.decode_pack(bytes(item))
    assert str(client_err.value) == str(idl_err.value)
    # a codec's error: CodecError in idl.codec, idl's PackError in idl.pack, the clients' in clients
    with pytest.raises(codec.CodecError, match="unknown compression codec 7"):
        codec.compress(b"x", 7)
    with pytest.raises(pack.PackError, match="unknown compression codec 7"):
        pack.encode_pack([b"x"], 7)
    with pytest.raises(ClientPackError, match="unknown compression codec 7"):
        clients.pack.encode_pack([b"x"], 7)
    with pytest.raises(ClientPackError, match="unknown compression codec 7"):
        clients.pack.encode_pack_written(1, b"\x00\x00\x00\x01x", 7)
    with pytest.raises(ClientPackError, match="corrupt gzip payload") as gz:
        clients.codec.decompress(b"not gzip", codec.GZIP)
    assert type(gz.value.__cause__).__name__ == "error"  # zlib.error, the original cause, kept


def test_unsnappy_reads_raw_blocks_xerial_streams_and_concatenated_streams() -> None:
    a, b = os.urandom(100) * 50, b"b" * 40_000
    assert codec.unsnappy(snappy.compress(a)) == a
    assert codec.unsnappy(xerial(a, b)) == a + b
    assert codec.unsnappy(xerial(a) + xerial(b)) == a + b
    assert codec.unsnappy(memoryview(xerial(a, b)), max_bytes=len(a) + len(b)) == a + b
    assert codec.unsnappy(XERIAL_HEADER, max_bytes=0) == b""
    assert codec.unsnappy(codec.xerial_compress(a + b)) == a + b


@pytest.mark.parametrize("concatenated", [False, True], ids=["one-stream", "two-streams"])
def test_unsnappy_refuses_past_max_bytes_before_decompressing(
    monkeypatch: pytest.MonkeyPatch, concatenated: bool
) -> None:
    lib = CountingSnappy()
    monkeypatch.setattr(codec, "_snappy", lib)
    first, second = b"1" * 1000, b"2" * 1000
    data = xerial(first) + xerial(second) if concatenated else xerial(first, second)
    with pytest.raises(codec.TooLargeError, match="1500-byte limit") as err:
        codec.unsnappy(data, max_bytes=1500)
    assert err.value.limit == 1500
    assert lib.calls == 1  # the first block only: the second declares 1000 bytes, 500 were left
    lib.calls = 0
    with pytest.raises(codec.TooLargeError):
        codec.unsnappy(snappy.compress(first), max_bytes=999)
    assert lib.calls == 0  # a raw block: refused from its preamble alone
    assert codec.unsnappy(data, max_bytes=2000) == first + second


def test_a_block_without_a_length_preamble_is_corrupt_when_bounded() -> None:
    for payload, what in ((b"\xff" * 5, "raw snappy payload"), (XERIAL_HEADER + b"\x00\x00\x00\x02\xff\xff", "block")):
        with pytest.raises(codec.CodecError, match=f"corrupt .*{what}.*no valid length preamble"):
            codec.unsnappy(payload, max_bytes=1 << 20)


def test_clients_may_bound_snappy_too() -> None:
    data = codec.xerial_compress(b"z" * 100_000)
    assert clients.codec.decompress(data, codec.SNAPPY, max_bytes=100_000) == b"z" * 100_000
    with pytest.raises(ClientPackError, match="99999-byte limit"):
        clients.codec.decompress(data, codec.SNAPPY, max_bytes=99_999)


def test_the_broker_reads_kafka_snappy_with_idls_bounded_unsnappy(monkeypatch: pytest.MonkeyPatch) -> None:
    from luxun import records as R
    from tests.kafka.test_records import build

    recs = [(None, bytes(1000), [], 1_700_000_000_000)] * 100  # 100 kB of records, in 4 xerial blocks
    data = build(recs, R.CODEC_SNAPPY)
    lib = CountingSnappy()
    monkeypatch.setattr(codec, "_snappy", lib)
    assert len(R.batch_records(data)) == 100
    assert lib.calls >= 2
    lib.calls = 0
    with pytest.raises(R.BatchError, match="snappy records inflate past the 50000-byte limit") as err:
        R.batch_to_pack(data, max_bytes=50_000)
    assert err.value.code == R.MESSAGE_TOO_LARGE  # luxun's bound on inflated records (Kafka has none)
    assert lib.calls == 1  # refused at the second block, from its declared length
