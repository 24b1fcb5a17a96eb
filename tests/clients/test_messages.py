"""Message packs: round trips, byte fixtures written from the format description (what
Java Luxun's producer writes), our output read field by field as Java's reader reads it,
and corruption of every kind ending in PackError."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import struct
import time
import zlib
from typing import Any

import pytest
import snappy  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from thriftpy2.protocol.binary import TBinaryProtocol
from thriftpy2.transport import TMemoryBuffer

from clients import messages
from clients.messages import (
    GZIP,
    MAGIC,
    NO_COMPRESSION,
    SERDES,
    SNAPPY,
    BytesSerde,
    JsonSerde,
    PackError,
    StrSerde,
    compress,
    decode_pack,
    decompress,
    encode_pack,
    get_serde,
    pack_codec,
    snappy_available,
)
from idl import codec as codec_module
from idl import message_thrift as M
from idl import pack as pack_module

pytestmark = pytest.mark.timeout(120)

CODECS = [NO_COMPRESSION, GZIP, SNAPPY]
CODEC_IDS = ["none", "gzip", "snappy"]

# Thrift binary protocol type ids.
T_STOP, T_BOOL, T_BYTE, T_I16, T_I32, T_I64, T_STRING, T_STRUCT, T_LIST = 0, 2, 3, 6, 8, 10, 11, 12, 15

# -- hand-made bytes, from the format description alone (no code under test) --------


def field(ttype: int, fid: int) -> bytes:
    return struct.pack(">bh", ttype, fid)


def binary(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def hand_list(msgs: list[bytes], *, java_empty: bool = False) -> bytes:
    """A TMessageList; Java leaves the (null) list out when there are no messages."""
    if java_empty and not msgs:
        return b"\x00"
    return field(T_LIST, 1) + struct.pack(">bi", T_STRING, len(msgs)) + b"".join(binary(m) for m in msgs) + b"\x00"


def hand_pack(payload: bytes, attribute: int, crc: int = 0, magic: int = 1) -> bytes:
    """A TMessagePack as Java's generated StandardScheme writes it: all four fields in id order."""
    return (
        field(T_BYTE, 1)
        + struct.pack(">b", magic)
        + field(T_BYTE, 2)
        + struct.pack(">b", attribute)
        + field(T_I32, 3)
        + struct.pack(">i", crc)
        + field(T_STRING, 4)
        + binary(payload)
        + b"\x00"
    )


def signed_crc(data: bytes) -> int:
    return struct.unpack(">i", struct.pack(">I", zlib.crc32(data)))[0]


def java_gzip(data: bytes) -> bytes:
    """What java.util.zip.GZIPOutputStream writes: a 10-byte header (no flags, mtime 0,
    XFL 0, OS 0), raw deflate, then CRC-32 and length, little-endian."""
    deflater = zlib.compressobj(6, zlib.DEFLATED, -15)
    body = deflater.compress(data) + deflater.flush()
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x00" + body + struct.pack("<II", zlib.crc32(data), len(data))


XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)


def xerial(data: bytes, block: int = 32 * 1024) -> bytes:
    """snappy-java's SnappyOutputStream: header, then [i32 BE length][raw snappy block]..."""
    out = [XERIAL_HEADER]
    for i in range(0, len(data), block):
        raw = snappy.compress(data[i : i + block])
        out.append(struct.pack(">i", len(raw)) + raw)
    return b"".join(out)


# -- a strict reader of the pack, the way Java's generated code expects it ----------


def read_pack_like_java(item: bytes) -> tuple[int, int, int, bytes]:
    """Field headers and types checked one by one; nothing may follow the STOP."""
    pos = 0
    values: list[Any] = []
    for fid, ttype, fmt in ((1, T_BYTE, ">b"), (2, T_BYTE, ">b"), (3, T_I32, ">i")):
        assert struct.unpack_from(">bh", item, pos) == (ttype, fid)
        pos += 3
        values.append(struct.unpack_from(fmt, item, pos)[0])
        pos += struct.calcsize(fmt)
    assert struct.unpack_from(">bh", item, pos) == (T_STRING, 4)
    pos += 3
    (n,) = struct.unpack_from(">i", item, pos)
    pos += 4
    payload = item[pos : pos + n]
    assert len(payload) == n
    pos += n
    assert item[pos:] == b"\x00"
    return values[0], values[1], values[2], payload


def read_list_like_java(data: bytes) -> list[bytes]:
    if data == b"\x00":
        return []
    assert struct.unpack_from(">bhbi", data, 0)[:3] == (T_LIST, 1, T_STRING)
    (count,) = struct.unpack_from(">i", data, 4)
    pos = 8
    out = []
    for _ in range(count):
        (n,) = struct.unpack_from(">i", data, pos)
        out.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    assert data[pos:] == b"\x00"
    return out


def unxerial(data: bytes) -> tuple[bytes, list[int]]:
    """(content, uncompressed size of each block) of a xerial-framed stream."""
    assert data[:16] == XERIAL_HEADER
    pos, out, sizes = 16, [], []
    while pos < len(data):
        (n,) = struct.unpack_from(">i", data, pos)
        block = snappy.decompress(data[pos + 4 : pos + 4 + n])
        out.append(block)
        sizes.append(len(block))
        pos += 4 + n
    assert pos == len(data)
    return b"".join(out), sizes


SAMPLES = {
    "empty list": [],
    "one": [b"hello"],
    "empty messages": [b"", b"", b""],
    "many": [b"message %d " % i * (i % 7) for i in range(2000)],
    "binary": [bytes(range(256)) * 3, b"\x00" * 5000, b"\xff"],
    "large": [os.urandom(1 << 20), b"x" * (3 << 20)],
}


# -- round trips ---------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
@pytest.mark.parametrize("name", list(SAMPLES))
def test_round_trip(codec: int, name: str) -> None:
    msgs = SAMPLES[name]
    item = encode_pack(msgs, codec)
    assert decode_pack(item) == msgs
    assert pack_codec(item) == codec
    assert decode_pack(bytearray(item)) == msgs  # type: ignore[arg-type]
    assert decode_pack(memoryview(item)) == msgs  # type: ignore[arg-type]


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_many_tiny_messages_and_messages_of_every_small_size(codec: int) -> None:
    tiny = [os.urandom(i % 11) for i in range(100_000)]
    assert decode_pack(encode_pack(tiny, codec)) == tiny
    sizes = [os.urandom(n) for n in range(0, 5000, 7)]
    assert decode_pack(encode_pack(sizes, codec)) == sizes


def test_messages_may_be_any_sequence_of_bytes_like_values() -> None:
    msgs = (b"a", bytearray(b"bc"), memoryview(b"def"))
    assert decode_pack(encode_pack(msgs)) == [b"a", b"bc", b"def"]  # type: ignore[arg-type]
    assert decode_pack(encode_pack(iter([b"x", b"y"]))) == [b"x", b"y"]  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["text", None, 7])
def test_a_message_that_is_not_bytes_is_a_type_error(bad: Any) -> None:
    with pytest.raises(TypeError, match="message 1 is"):
        encode_pack([b"ok", bad])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=300), max_size=60), st.sampled_from(CODECS))
def test_round_trip_property(msgs: list[bytes], codec: int) -> None:
    item = encode_pack(msgs, codec)
    assert decode_pack(item) == msgs
    # the same pack written the Java way (crc32 not set) reads the same
    magic, attribute, _crc, payload = read_pack_like_java(item)
    assert decode_pack(hand_pack(payload, attribute, crc=0, magic=magic)) == msgs


# -- fixtures standing for what Java Luxun's producer writes -------------------------

# MessageList [b"hello", b""], no compression, crc32 0 (as Java wrote it), byte by byte.
JAVA_PLAIN_PACK = bytes.fromhex(
    "03 0001 01"  # magic = 1
    "03 0002 00"  # attribute = NO_COMPRESSION
    "08 0003 00000000"  # crc32 = 0 (never set by Java Luxun)
    "0b 0004 00000016"  # messageList: 22 bytes
    "0f 0001 0b 00000002"  # TMessageList.messages: list<binary>, 2 elements
    "00000005 68656c6c6f"  # "hello"
    "00000000"  # ""
    "00"  # TMessageList STOP
    "00"  # TMessagePack STOP
)


def test_fixture_java_plain_pack() -> None:
    assert decode_pack(JAVA_PLAIN_PACK) == [b"hello", b""]
    assert pack_codec(JAVA_PLAIN_PACK) == NO_COMPRESSION
    assert hand_pack(hand_list([b"hello", b""]), NO_COMPRESSION) == JAVA_PLAIN_PACK


@pytest.mark.parametrize("crc_set", [False, True], ids=["crc0", "crc"])
@pytest.mark.parametrize("name", list(SAMPLES))
def test_fixture_plain(name: str, crc_set: bool) -> None:
    payload = hand_list(SAMPLES[name])
    assert decode_pack(hand_pack(payload, 0, signed_crc(payload) if crc_set else 0)) == SAMPLES[name]


def test_fixture_java_empty_list_omits_the_field() -> None:
    for codec, payload in ((0, b"\x00"), (1, java_gzip(b"\x00")), (2, xerial(b"\x00"))):
        assert decode_pack(hand_pack(payload, codec)) == []


@pytest.mark.parametrize("name", list(SAMPLES))
def test_fixture_gzip_from_python_gzip_module(name: str) -> None:
    payload = gzip.compress(hand_list(SAMPLES[name]))
    assert decode_pack(hand_pack(payload, GZIP)) == SAMPLES[name]
    assert decode_pack(hand_pack(payload, GZIP, signed_crc(payload))) == SAMPLES[name]


@pytest.mark.parametrize("name", list(SAMPLES))
def test_fixture_gzip_as_java_gzip_output_stream_writes_it(name: str) -> None:
    payload = java_gzip(hand_list(SAMPLES[name]))
    assert decode_pack(hand_pack(payload, GZIP)) == SAMPLES[name]


def test_fixture_gzip_with_several_members_reads_them_all() -> None:
    data = hand_list([b"a" * 1000, b"b" * 1000])
    payload = gzip.compress(data[:700]) + java_gzip(data[700:])
    assert decode_pack(hand_pack(payload, GZIP)) == [b"a" * 1000, b"b" * 1000]


@pytest.mark.parametrize("name", list(SAMPLES))
def test_fixture_xerial_snappy(name: str) -> None:
    payload = xerial(hand_list(SAMPLES[name]))
    assert decode_pack(hand_pack(payload, SNAPPY)) == SAMPLES[name]
    assert decode_pack(hand_pack(payload, SNAPPY, signed_crc(payload))) == SAMPLES[name]


def test_fixture_xerial_snappy_byte_by_byte() -> None:
    data = hand_list([b"foobar"])
    block = snappy.compress(data)
    payload = bytes.fromhex("82 534e415050 59 00 00000001 00000001") + struct.pack(">i", len(block)) + block
    assert decode_pack(hand_pack(payload, SNAPPY)) == [b"foobar"]


def test_fixture_xerial_snappy_odd_block_sizes_and_concatenated_streams() -> None:
    msgs = [os.urandom(50) + b"z" * 200 for _ in range(500)]
    data = hand_list(msgs)
    assert decode_pack(hand_pack(xerial(data, block=1000), SNAPPY)) == msgs
    concatenated = xerial(data[:10_000]) + xerial(data[10_000:])
    assert decode_pack(hand_pack(concatenated, SNAPPY)) == msgs


@pytest.mark.parametrize("crc_set", [False, True], ids=["crc0", "crc"])
def test_fixture_raw_snappy_block_is_accepted(crc_set: bool) -> None:
    msgs = [b"raw block %d" % i for i in range(300)]
    payload = snappy.compress(hand_list(msgs))
    assert not payload.startswith(b"\x82SNAPPY")
    assert decode_pack(hand_pack(payload, SNAPPY, signed_crc(payload) if crc_set else 0)) == msgs


def test_a_pack_written_by_thriftpy2_from_the_idl_decodes() -> None:
    """thriftpy2 leaves unset fields out (here attribute and crc32): they take their defaults."""
    payload = hand_list([b"x", b"yz"])
    trans = TMemoryBuffer()
    M.TMessagePack(messageList=payload).write(TBinaryProtocol(trans))
    item = trans.getvalue()
    assert item == field(T_BYTE, 1) + b"\x01" + field(T_STRING, 4) + binary(payload) + b"\x00"
    assert decode_pack(item) == [b"x", b"yz"]
    assert pack_codec(item) == NO_COMPRESSION


def test_fields_in_another_order_and_unknown_fields_are_read() -> None:
    """A later writer may add fields (Thrift evolution): they are skipped, in both structs."""
    msgs = [b"one", b"two"]
    extra = (
        field(T_I64, 9)
        + struct.pack(">q", -1)
        + field(T_STRUCT, 10)
        + field(T_LIST, 1)
        + struct.pack(">bi", T_I32, 2)
        + struct.pack(">ii", 5, 6)
        + field(T_BOOL, 2)
        + b"\x01"
        + b"\x00"
        + field(T_I16, 11)
        + struct.pack(">h", 3)
    )
    payload = extra + hand_list(msgs)[:-1] + extra + b"\x00"
    for crc in (0, signed_crc(payload)):
        item = (
            extra
            + field(T_STRING, 4)
            + binary(payload)
            + field(T_I32, 3)
            + struct.pack(">i", crc)
            + field(T_BYTE, 2)
            + b"\x00"
            + field(T_BYTE, 1)
            + b"\x01"
            + b"\x00"
        )
        assert decode_pack(item) == msgs
    # a known id with an unexpected type is skipped, as Java's reader does: magic stays 1
    item = field(T_I32, 1) + struct.pack(">i", 99) + field(T_STRING, 4) + binary(hand_list(msgs)) + b"\x00"
    assert decode_pack(item) == msgs


# -- our output, read the way Java Luxun reads it -------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_encoded_pack_parses_field_by_field_as_java_expects(codec: int) -> None:
    msgs = [b"alpha", b"", b"\x00\xff" * 40_000, b"omega"]
    magic, attribute, crc, payload = read_pack_like_java(encode_pack(msgs, codec))
    assert (magic, attribute) == (1, codec)
    assert crc == signed_crc(payload) and crc != 0
    if codec == GZIP:
        assert payload[:3] == b"\x1f\x8b\x08"  # a gzip stream, deflate
        data = gzip.GzipFile(fileobj=io.BytesIO(payload)).read()  # what GZIPInputStream does
    elif codec == SNAPPY:
        data, sizes = unxerial(payload)
        assert all(size <= 32 * 1024 for size in sizes) and len(sizes) == -(-len(data) // (32 * 1024))
    else:
        data = payload
    assert read_list_like_java(data) == msgs
    assert data == hand_list(msgs)


def test_encoded_pack_is_exactly_the_hand_made_bytes() -> None:
    payload = hand_list([b"hello", b""])
    assert encode_pack([b"hello", b""]) == hand_pack(payload, NO_COMPRESSION, signed_crc(payload))
    assert encode_pack([]) == hand_pack(hand_list([]), NO_COMPRESSION, signed_crc(hand_list([])))


def test_encoded_pack_reads_back_with_thriftpy2_pure_python_protocol() -> None:
    msgs = [b"a", b"bb", b"c" * 1000]
    for codec in CODECS:
        pack = M.TMessagePack()
        pack.read(TBinaryProtocol(TMemoryBuffer(encode_pack(msgs, codec)), decode_response=False))
        assert (pack.magic, pack.attribute) == (1, codec)
        assert pack.crc32 == signed_crc(pack.messageList)
        inner = M.TMessageList()
        data = decompress(pack.messageList, codec)
        inner.read(TBinaryProtocol(TMemoryBuffer(data), decode_response=False))
        assert inner.messages == msgs


def test_codec_constants_and_pack_layout_match_the_idl() -> None:
    assert (NO_COMPRESSION, GZIP, SNAPPY) == (
        M.CompressionCodec.NO_COMPRESSION,
        M.CompressionCodec.GZIP,
        M.CompressionCodec.SNAPPY,
    )
    assert M.TMessagePack().magic == MAGIC == 1
    spec = M.TMessagePack.thrift_spec
    assert [(fid, spec[fid][0], spec[fid][1]) for fid in sorted(spec)] == [
        (1, T_BYTE, "magic"),
        (2, T_BYTE, "attribute"),
        (3, T_I32, "crc32"),
        (4, 18, "messageList"),  # thriftpy2's BINARY, a string (11) on the wire
    ]
    assert M.TMessageList.thrift_spec[1][:3] == (T_LIST, "messages", 18)


# -- crc, magic, codec ---------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_a_flipped_payload_byte_fails_the_crc(codec: int) -> None:
    item = bytearray(encode_pack([b"payload %d" % i for i in range(100)], codec))
    for pos in (22, 22 + 7, len(item) // 2, len(item) - 2):  # the payload is item[22:-1]
        bad = bytearray(item)
        bad[pos] ^= 0x10
        with pytest.raises(PackError, match="crc32 mismatch"):
            decode_pack(bytes(bad))


def test_crc_zero_means_not_set() -> None:
    payload = hand_list([b"a", b"b"])
    assert decode_pack(hand_pack(payload, 0, crc=0)) == [b"a", b"b"]
    with pytest.raises(PackError, match=r"crc32 mismatch: the pack says 12345"):
        decode_pack(hand_pack(payload, 0, crc=12345))


@pytest.mark.parametrize("magic", [0, 2, -1, 127])
def test_magic_other_than_1_is_refused(magic: int) -> None:
    item = hand_pack(hand_list([b"a"]), 0, magic=magic)
    with pytest.raises(PackError, match=f"magic {magic}"):
        decode_pack(item)
    with pytest.raises(PackError, match="magic"):
        pack_codec(item)


@pytest.mark.parametrize("codec", [3, 4, 100, -1, -128])
def test_unknown_codec_is_refused(codec: int) -> None:
    payload = hand_list([b"a"])
    for crc in (0, signed_crc(payload)):
        with pytest.raises(PackError, match=f"unknown compression codec {codec}"):
            decode_pack(hand_pack(payload, codec, crc))
    with pytest.raises(PackError, match="unknown compression codec"):
        encode_pack([b"a"], codec)
    with pytest.raises(PackError, match="unknown compression codec"):
        compress(b"x", codec)
    with pytest.raises(PackError, match="unknown compression codec"):
        decompress(b"x", codec)
    assert pack_codec(hand_pack(payload, codec)) == codec  # reported, not interpreted


# -- corruption of every kind: PackError, never anything else, never a hang ----------


def expect_pack_error_or(item: bytes, allowed: list[bytes] | None = None) -> None:
    try:
        result = decode_pack(item)
    except PackError:
        return
    if allowed is not None:
        assert result == allowed


@pytest.mark.parametrize("crc_set", [False, True], ids=["crc0", "crc"])
@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_every_single_bit_flip_is_pack_error_or_harmless(codec: int, crc_set: bool) -> None:
    msgs = [b"m%d" % i * 3 for i in range(20)]
    item = encode_pack(msgs, codec)
    if not crc_set:
        item = item[:9] + b"\x00\x00\x00\x00" + item[13:]
    for pos in range(len(item)):
        for bit in (0x01, 0x80):
            bad = bytearray(item)
            bad[pos] ^= bit
            if crc_set and 22 <= pos < len(item) - 1:
                with pytest.raises(PackError):
                    decode_pack(bytes(bad))
            else:
                expect_pack_error_or(bytes(bad))


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_every_truncation_and_any_trailing_byte_is_pack_error(codec: int) -> None:
    item = encode_pack([b"abc", b"", b"defgh" * 20], codec)
    for n in range(len(item)):
        with pytest.raises(PackError):
            decode_pack(item[:n])
    for tail in (b"\x00", b"\x01", b"garbage"):
        with pytest.raises(PackError):
            decode_pack(item + tail)


def test_empty_item_and_a_pack_without_message_list() -> None:
    with pytest.raises(PackError, match="empty item"):
        decode_pack(b"")
    with pytest.raises(PackError, match="no messageList"):
        decode_pack(field(T_BYTE, 1) + b"\x01" + b"\x00")


def crafted(list_bytes: bytes) -> bytes:
    return hand_pack(list_bytes, NO_COMPRESSION)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(field(T_LIST, 1) + struct.pack(">bi", T_STRING, 2**31 - 1) + b"\x00", id="huge count"),
        pytest.param(field(T_LIST, 1) + struct.pack(">bi", T_STRING, -1) + b"\x00", id="negative count"),
        pytest.param(field(T_LIST, 1) + struct.pack(">bii", T_STRING, 1, -5) + b"\x00", id="negative length"),
        pytest.param(field(T_LIST, 1) + struct.pack(">bii", T_STRING, 1, 2**31 - 1) + b"\x00", id="huge length"),
        pytest.param(field(T_LIST, 1) + struct.pack(">bi", T_I32, 1) + b"\x00\x00\x00\x01\x00", id="wrong elements"),
        pytest.param(field(T_LIST, 9) + struct.pack(">bi", 0, 2**31 - 1) + b"\x00", id="list of stops"),
        pytest.param(field(T_LIST, 9) + struct.pack(">bi", 25, 2**31 - 1) + b"\x00", id="unknown element type"),
        pytest.param(field(13, 9) + struct.pack(">bbi", T_BOOL, T_BOOL, 2**31 - 1) + b"\x00", id="huge map"),
        pytest.param(field(T_STRUCT, 9) * 200 + b"\x00" * 201, id="deep nesting"),
        pytest.param(field(20, 9) + b"\x00", id="unknown type"),
        pytest.param(hand_list([b"a"])[:-1], id="no stop"),
        pytest.param(b"", id="empty payload"),
    ],
)
def test_crafted_message_lists_fail_fast(payload: bytes) -> None:
    started = time.monotonic()
    for item in (crafted(payload), hand_pack(payload, 0, signed_crc(payload))):
        with pytest.raises(PackError):
            decode_pack(item)
    assert time.monotonic() - started < 1.0


def test_java_packs_are_read_by_the_bounded_reader() -> None:
    """Without a crc32 (Java packs, none or snappy) a valid list followed by a crafted
    field is refused at once, not skipped element by element."""
    payload = hand_list([b"a"])[:-1] + field(T_LIST, 9) + struct.pack(">bi", T_STOP, 2**31 - 1) + b"\x00"
    started = time.monotonic()
    for item in (crafted(payload), hand_pack(xerial(payload), SNAPPY)):
        with pytest.raises(PackError, match=r"cannot fit|unknown Thrift"):
            decode_pack(item)
    assert time.monotonic() - started < 1.0
    with pytest.raises(PackError):
        pack_codec(b"\x01\x02\x03")


@pytest.mark.parametrize(
    ("codec", "payload", "match"),
    [
        (GZIP, b"not gzip at all", "corrupt gzip"),
        (GZIP, gzip.compress(b"x" * 1000)[:-3], "truncated|corrupt"),
        (GZIP, gzip.compress(hand_list([b"a"])) + b"junk", "corrupt gzip"),
        (GZIP, b"", "truncated"),
        (GZIP, gzip.compress(hand_list([b"a"]))[:-8] + b"\x00\x00\x00\x00\x05\x00\x00\x00", "incorrect data check"),
        (SNAPPY, XERIAL_HEADER[:12], "truncated"),
        (SNAPPY, XERIAL_HEADER + b"\x00\x00", "truncated"),
        (SNAPPY, XERIAL_HEADER + struct.pack(">i", 100) + b"short", "claims 100 bytes"),
        (SNAPPY, XERIAL_HEADER + struct.pack(">i", -3), "claims -3 bytes"),
        (SNAPPY, XERIAL_HEADER + struct.pack(">i", 5) + b"\xff\xff\xff\xff\xff", "corrupt snappy block"),
        (SNAPPY, b"\x82SNAPPY\x00" + struct.pack(">ii", 0, 0), "version 0"),
        (SNAPPY, b"\xff\xff\xff\xff\x0f garbage", "corrupt raw snappy"),
        (SNAPPY, b"", "corrupt raw snappy"),
    ],
)
def test_corrupt_compressed_payloads(codec: int, payload: bytes, match: str) -> None:
    with pytest.raises(PackError, match=match):
        decode_pack(hand_pack(payload, codec))
    with pytest.raises(PackError, match=match):
        decompress(payload, codec)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.sampled_from(CODECS), st.booleans())
def test_garbage_payloads_give_pack_error_or_messages(payload: bytes, codec: int, crc_set: bool) -> None:
    item = hand_pack(payload, codec, signed_crc(payload) if crc_set else 0)
    try:
        result = decode_pack(item)
    except PackError:
        return
    assert isinstance(result, list) and all(type(m) is bytes for m in result)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_garbage_items_give_pack_error_or_messages(item: bytes) -> None:
    try:
        result = decode_pack(item)
    except PackError:
        return
    assert all(type(m) is bytes for m in result)


def test_fast_and_checked_readers_agree() -> None:
    for msgs in SAMPLES.values():
        data = hand_list(msgs)
        checked = pack_module._read_message_list_checked(data, 0, len(data))
        assert checked == msgs
        if msgs:
            assert pack_module._read_message_list_cython(data, 0, len(data)) == msgs
        assert pack_module._read_message_list(data, 0, len(data), trusted=True) == msgs


# -- codecs and availability -----------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_compress_decompress_round_trip(codec: int) -> None:
    for data in (b"", b"a", os.urandom(100_000), b"abc" * 100_000):
        assert decompress(compress(data, codec), codec) == data


def test_snappy_compress_writes_xerial_framing() -> None:
    data = b"0123456789" * 10_000
    framed = compress(data, SNAPPY)
    assert framed[:16] == XERIAL_HEADER
    content, sizes = unxerial(framed)
    assert content == data and sizes == [32768, 32768, 32768, 1696]
    assert compress(b"", SNAPPY) == XERIAL_HEADER  # SnappyOutputStream writes the header even for nothing


def test_snappy_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    item = encode_pack([b"a"], SNAPPY)
    assert snappy_available()
    monkeypatch.setattr(codec_module, "_snappy", None)
    assert not snappy_available()
    with pytest.raises(PackError, match="python-snappy is not installed"):
        encode_pack([b"a"], SNAPPY)
    with pytest.raises(PackError, match="python-snappy is not installed"):
        decode_pack(item)
    assert decode_pack(encode_pack([b"a"], GZIP)) == [b"a"]
    assert pack_codec(item) == SNAPPY


# -- serdes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("serde", "values"),
    [
        (BytesSerde(), [b"", b"\x00\xff", b"abc"]),
        (StrSerde(), ["", "héllo", "日本語", "\U0001f600"]),
        (StrSerde("latin-1"), ["café"]),
        (JsonSerde(), [None, 1, 2.5, "é", [1, "a"], {"k": {"n": [True, False]}}]),
        (JsonSerde(sort_keys=True, indent=1), [{"b": 1, "a": 2}]),
    ],
)
def test_serdes_round_trip(serde: Any, values: list[Any]) -> None:
    for value in values:
        data = serde.encode(value)
        assert type(data) is bytes
        assert serde.decode(data) == value
    assert pickle.loads(pickle.dumps(serde)).decode(serde.encode(values[0])) == values[0]
    assert repr(serde).startswith(type(serde).__name__)


def test_serde_details() -> None:
    assert BytesSerde().encode(bytearray(b"ab")) == b"ab"
    assert BytesSerde().encode(memoryview(b"cd")) == b"cd"
    with pytest.raises(TypeError, match="bytes serde"):
        BytesSerde().encode("text")
    with pytest.raises(TypeError, match="str serde"):
        StrSerde().encode(b"bytes")
    assert StrSerde("latin-1").encode("é") == b"\xe9"
    with pytest.raises(LookupError):
        StrSerde("no-such-encoding")
    assert JsonSerde().encode({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()
    assert JsonSerde(sort_keys=True).encode({"b": 1, "a": 2}) == b'{"a":2,"b":1}'
    assert JsonSerde(separators=(", ", ": ")).encode([1, 2]) == b"[1, 2]"


def test_get_serde() -> None:
    assert set(SERDES) == {"bytes", "str", "json"}
    assert get_serde("bytes") is SERDES["bytes"]
    assert isinstance(get_serde("JSON"), JsonSerde)
    assert isinstance(get_serde("str"), StrSerde)
    custom = StrSerde("utf-16")
    assert get_serde(custom) is custom

    class DecodeOnly:
        def decode(self, data: bytes) -> int:
            return len(data)

    decoder = DecodeOnly()
    assert get_serde(decoder) is decoder
    with pytest.raises(ValueError, match="unknown serde 'yaml'"):
        get_serde("yaml")
    with pytest.raises(TypeError, match="instance"):
        get_serde(JsonSerde)
    with pytest.raises(TypeError, match="a serde is"):
        get_serde(42)


def test_public_names() -> None:
    for name in messages.__all__:
        assert hasattr(messages, name), name
    assert issubclass(PackError, ValueError)
