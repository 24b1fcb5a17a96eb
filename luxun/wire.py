"""Hand-written Thrift binary encoding of the consume reply, the broker's hot path.

A ConsumeResponse carries up to thousands of items; thriftpy2 encodes a
``list<binary>`` at about 1 us per element, this at about 0.12 us, byte-for-byte the
same (strict binary protocol, as thriftpy2 and Apache Thrift write it)::

    i32 0x80010002 (version 1, REPLY) | string "consume" | i32 seqid
    consume_result { 0: struct success = ConsumeResponse {
        1: struct Result { 1: i32 resultCode, [2: i32 errorCode], [3: string errorMessage] }
        2: list<binary> itemList
        3: i64 lastConsumedIndex
        [4: list<i64> timestampList] [5: i64 firstIndex] } }
"""

from __future__ import annotations

import struct
from typing import Any

_I32 = struct.Struct(">i")
_REPLY_HEADER = _I32.pack(-2147418110) + _I32.pack(7) + b"consume"  # 0x80010002, "consume"
_T_STRUCT, _T_I32, _T_I64, _T_STRING, _T_LIST = 12, 8, 10, 11, 15


def encode_consume_reply(seqid: int, response: Any) -> bytes:
    """The whole reply message (without the frame length) for ``response``."""
    result = response.result
    parts = [_REPLY_HEADER, _I32.pack(seqid), b"\x0c\x00\x00", b"\x0c\x00\x01"]
    parts.append(struct.pack(">bhi", _T_I32, 1, result.resultCode))
    if result.errorCode is not None:
        parts.append(struct.pack(">bhi", _T_I32, 2, result.errorCode))
    if result.errorMessage is not None:
        message = result.errorMessage.encode("utf-8")
        parts.append(struct.pack(">bhi", _T_STRING, 3, len(message)))
        parts.append(message)
    parts.append(b"\x00")
    items = response.itemList or []
    parts.append(struct.pack(">bhbi", _T_LIST, 2, _T_STRING, len(items)))
    pack = _I32.pack
    append = parts.append
    for item in items:
        append(pack(len(item)))
        append(item)
    parts.append(struct.pack(">bhq", _T_I64, 3, response.lastConsumedIndex or 0))
    times = response.timestampList
    if times is not None:  # extension fields, only when asked for
        parts.append(struct.pack(f">bhbi{len(times)}q", _T_LIST, 4, _T_I64, len(times), *times))
    if response.firstIndex is not None:
        parts.append(struct.pack(">bhq", _T_I64, 5, response.firstIndex))
    parts.append(b"\x00\x00")  # end of ConsumeResponse, end of consume_result
    return b"".join(parts)
