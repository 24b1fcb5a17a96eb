"""idl.binary: the one bounded walker of Thrift binary values (the broker's check_frame
and the clients' pack reader both use it)."""

from __future__ import annotations

import struct
import time

import pytest
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.thrift import TMessageType
from thriftpy2.transport import TMemoryBuffer

from idl import luxun_thrift as T
from idl import message_thrift as M
from idl.binary import T_LIST, T_MAP, T_STRING, T_STRUCT, ThriftBinaryError, skip_message, skip_value


def _serialise(obj: object, message: str | None = None) -> bytes:
    buf = TMemoryBuffer()
    proto = TBinaryProtocolFactory().get_protocol(buf)
    if message is not None:
        proto.write_message_begin(message, TMessageType.CALL, 7)
    obj.write(proto)  # type: ignore[attr-defined]
    if message is not None:
        proto.write_message_end()
    return bytes(buf.getvalue())


VALUES = [
    T.ConsumeRequest(topic="logs", fanoutId="g", startIndex=5, maxFetchSize=1 << 20, maxWaitMs=10),
    T.ConsumeResponse(result=T.Result(resultCode=0), itemList=[b"a", b"", b"x" * 300], lastConsumedIndex=3),
    T.ListTopicsResponse(
        result=T.Result(resultCode=0), topics=[T.TopicInfo(name="a", size=1, tailIndex=0, headIndex=1)]
    ),
    M.TMessageList(messages=[b"one", b"two"]),
    M.TMessagePack(magic=1, attribute=0, crc32=0, messageList=b"\x00"),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_walks_real_values_to_their_end_and_not_beyond(value: object) -> None:
    data = _serialise(value)
    assert skip_value(data, 0, len(data), T_STRUCT, 32) == len(data)
    # Inside a bigger buffer: the same end; cut short: refused, never read past ``end``.
    padded = b"\x01\x02" + data + b"\x00" * 64
    assert skip_value(padded, 2, 2 + len(data), T_STRUCT, 32) == 2 + len(data)
    for cut in range(len(data)):
        with pytest.raises(ThriftBinaryError):
            skip_value(padded, 2, 2 + cut, T_STRUCT, 32)


def test_walks_whole_messages_strict_and_old_style() -> None:
    frame = _serialise(T.QueueService.consume_args(consumeRequest=VALUES[0]), message="consume")
    assert skip_message(frame, 32) == len(frame)
    old_style = struct.pack(">i", 7) + b"consume" + b"\x01" + struct.pack(">i", 7) + _serialise(VALUES[0])
    assert skip_message(old_style, 32) == len(old_style)
    with pytest.raises(ThriftBinaryError, match="unknown protocol version"):
        skip_message(struct.pack(">i", -2147352575) + b"\x00" * 20, 32)
    with pytest.raises(ThriftBinaryError, match="cut off"):
        skip_message(b"\x80\x01", 32)


@pytest.mark.parametrize(
    ("data", "ttype", "match"),
    [
        (struct.pack(">i", 2**31 - 1) + b"x", T_STRING, "string of 2147483647 bytes announced with 1 bytes left"),
        (struct.pack(">i", -1), T_STRING, "string of -1 bytes"),
        (struct.pack(">bi", T_STRING, 2**31 - 1) + b"a", T_LIST, "cannot fit"),
        (struct.pack(">bi", 10, 2) + b"\x00" * 15, T_LIST, "cannot fit"),  # two i64 in 15 bytes
        (struct.pack(">bbi", 2, 2, 2**31 - 1), T_MAP, "cannot fit"),
        (struct.pack(">bi", 25, 1) + b"\x00", T_LIST, "unknown Thrift type id 25"),
        (b"\x11\x00\x01abc", T_STRUCT, "unknown Thrift type id 17"),
        (b"\x0c\x00\x01" * 40 + b"\x00" * 41, T_STRUCT, "nested deeper than 32"),
        (b"\x0b\x00\x01\x00\x00\x00\x05ab", T_STRUCT, "announced with 2 bytes left"),
        (b"\x08\x00\x01\x00\x00\x00\x01", T_STRUCT, "struct not terminated"),
    ],
)
def test_refuses_what_cannot_fit(data: bytes, ttype: int, match: str) -> None:
    started = time.monotonic()
    with pytest.raises(ThriftBinaryError, match=match):
        skip_value(data, 0, len(data), ttype, 32)
    assert time.monotonic() - started < 0.5


def test_depth_limit_is_the_callers() -> None:
    nested = b"\x0c\x00\x01" * 40 + b"\x00" * 41
    assert skip_value(nested, 0, len(nested), T_STRUCT, 64) == len(nested)
    with pytest.raises(ThriftBinaryError, match="deeper than 39"):
        skip_value(nested, 0, len(nested), T_STRUCT, 39)
