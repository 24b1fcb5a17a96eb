"""Dory's input message format (version 0), read exactly as Dory reads it.

All integers are signed and big-endian; the same bytes on every transport::

    Size:i32 ApiKey:i16 ApiVersion:i16 Body        Size = the whole message, counting itself
    AnyPartition (ApiKey 256, version 0):
        Flags:i16 TopicSize:i16 Topic Timestamp:i64 KeySize:i32 Key ValueSize:i32 Value
    PartitionKey (ApiKey 257, version 0):
        Flags:i16 PartitionKey:i32 TopicSize:i16 Topic Timestamp:i64 KeySize:i32 Key ValueSize:i32 Value

Fixed overhead: 28 bytes (AnyPartition), 32 bytes (PartitionKey).

Validation order (Dory's ``input_dg_util.cc`` and ``v0_input_dg_reader.cc``); the first
failing check decides:

1. fewer than 8 bytes -> malformed;
2. Size < 0 or Size != the datagram/frame length -> malformed;
3. ApiKey not 256/257 -> unsupported API key;
4. ApiVersion != 0 -> unsupported version;
5. a truncated field, Flags != 0, TopicSize <= 0, KeySize < 0, ValueSize < 0, or bytes left
   after Value -> malformed.

The timestamp is never validated. The PartitionKey is read as int32 and used as uint32.

Thread-safety: pure functions.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

ANY_PARTITION: Final = 256
PARTITION_KEY: Final = 257
API_VERSION: Final = 0
#: Bytes of a message around its topic, key and value.
ANY_PARTITION_OVERHEAD: Final = 28
PARTITION_KEY_OVERHEAD: Final = 32

_HEADER = struct.Struct(">ihh")  # Size, ApiKey, ApiVersion
_ANY_BODY = struct.Struct(">hh")  # Flags, TopicSize
_KEY_BODY = struct.Struct(">hih")  # Flags, PartitionKey, TopicSize
_TS_KEYSIZE = struct.Struct(">qi")  # Timestamp, KeySize
_I32 = struct.Struct(">i")


class Message(NamedTuple):
    """A valid Dory message. ``partition_key`` is the uint32 key, or None (AnyPartition)."""

    topic: bytes
    partition_key: int | None
    timestamp_ms: int
    key: bytes
    value: bytes


class Malformed(ValueError):
    """Dory's "malformed message" discard; the text says which check failed."""


class UnsupportedApiKey(ValueError):
    def __init__(self, api_key: int) -> None:
        super().__init__(f"unsupported API key {api_key}")
        self.api_key = api_key


class UnsupportedVersion(ValueError):
    def __init__(self, api_key: int, version: int) -> None:
        super().__init__(f"unsupported version {version} of API key {api_key}")
        self.api_key = api_key
        self.version = version


_ANY_HEAD = struct.Struct(">ihhhh")  # Size, ApiKey, ApiVersion, Flags, TopicSize
_KEY_HEAD = struct.Struct(">ihhhih")  # Size, ApiKey, ApiVersion, Flags, PartitionKey, TopicSize
_TAIL_NO_KEY = struct.Struct(">qii")  # Timestamp, KeySize, ValueSize (when KeySize is 0)

#: ``(topic, partition_key or None, timestamp_ms, key, value)``
Fields = tuple[bytes, int | None, int, bytes, bytes]


def parse(data: bytes) -> Message:
    """Read one message (a whole datagram or one stream frame).

    Raises:
        Malformed, UnsupportedApiKey, UnsupportedVersion: in Dory's order.
    """
    return Message(*parse_fields(data))


def parse_fields(data: bytes) -> Fields:
    """:func:`parse` as a plain tuple: a fast path for valid messages; anything else goes
    through the checks in Dory's order (:func:`parse_checked`)."""
    f = parse_many((data,))[0]
    return f if f is not None else parse_checked(data)


def parse_many(messages: Sequence[bytes]) -> list[Fields | None]:
    """The fields of each message that is valid and has no Key (what Dory's clients
    mostly send), None for any other (:func:`parse_fields` then reads it, or says why
    not): the fast path of many messages in one call, with no Python call per message."""
    out: list[Fields | None] = []
    append = out.append
    any_head = _ANY_HEAD.unpack_from
    tail = _TAIL_NO_KEY.unpack_from
    for data in messages:
        n = len(data)
        if n >= 28:
            size, api_key, version, flags, topic_size = any_head(data)
            if size == n and version == 0 and flags == 0:
                if api_key == ANY_PARTITION:
                    pk = None
                    start = 12
                elif api_key == PARTITION_KEY and n >= 32:
                    _, _, _, _, pk, topic_size = _KEY_HEAD.unpack_from(data)
                    pk &= 0xFFFFFFFF
                    start = 16
                else:
                    append(None)
                    continue
                end = start + topic_size
                if topic_size > 0 and end + 16 <= n:
                    ts, key_size, value_size = tail(data, end)
                    if key_size == 0 and value_size >= 0 and end + 16 + value_size == n:
                        append((data[start:end], pk, ts, b"", data[end + 16 :]))
                        continue
        append(None)
    return out


def parse_checked(data: bytes) -> Fields:
    """Read one message with every check, in Dory's order (what :func:`parse_fields`
    does for a message off :func:`parse_many`'s fast path).

    Raises:
        Malformed, UnsupportedApiKey, UnsupportedVersion: in Dory's order.
    """
    n = len(data)
    if n < 8:
        raise Malformed(f"{n} bytes, fewer than the 8 of Size, ApiKey and ApiVersion")
    size, api_key, version = _HEADER.unpack_from(data, 0)
    if size < 0 or size != n:
        raise Malformed(f"Size field {size} != message length {n}")
    partition_key: int | None
    if api_key == ANY_PARTITION:
        if version != API_VERSION:
            raise UnsupportedVersion(api_key, version)
        if n < 12:
            raise Malformed("truncated before the topic size")
        flags, topic_size = _ANY_BODY.unpack_from(data, 8)
        partition_key = None
        pos = 12
    elif api_key == PARTITION_KEY:
        if version != API_VERSION:
            raise UnsupportedVersion(api_key, version)
        if n < 16:
            raise Malformed("truncated before the topic size")
        flags, partition_key, topic_size = _KEY_BODY.unpack_from(data, 8)
        partition_key &= 0xFFFFFFFF
        pos = 16
    else:
        raise UnsupportedApiKey(api_key)
    if flags != 0:
        raise Malformed(f"Flags {flags} != 0")
    if topic_size <= 0:
        raise Malformed(f"TopicSize {topic_size} (an empty topic)")
    topic_end = pos + topic_size
    if topic_end + 12 > n:
        raise Malformed("truncated in the topic, timestamp or key size")
    timestamp, key_size = _TS_KEYSIZE.unpack_from(data, topic_end)
    if key_size < 0:
        raise Malformed(f"KeySize {key_size} < 0")
    key_start = topic_end + 12
    key_end = key_start + key_size
    if key_end + 4 > n:
        raise Malformed("truncated in the key or value size")
    (value_size,) = _I32.unpack_from(data, key_end)
    if value_size < 0:
        raise Malformed(f"ValueSize {value_size} < 0")
    value_start = key_end + 4
    if value_start + value_size != n:
        what = "truncated in the value" if value_start + value_size > n else "bytes left after the value"
        raise Malformed(what)
    return data[pos:topic_end], partition_key, timestamp, data[key_start:key_end], data[value_start:]


def encode(topic: bytes, value: bytes, *, partition_key: int | None = None, timestamp_ms: int = 0,
           key: bytes = b"") -> bytes:  # fmt: skip
    """Build a message as Dory's clients do (tests and benchmarks send these)."""
    if partition_key is None:
        head = struct.pack(">ihhhh", ANY_PARTITION_OVERHEAD + len(topic) + len(key) + len(value), ANY_PARTITION,
                           API_VERSION, 0, len(topic))  # fmt: skip
    else:
        head = struct.pack(">ihhhih", PARTITION_KEY_OVERHEAD + len(topic) + len(key) + len(value), PARTITION_KEY,
                           API_VERSION, 0, _signed32(partition_key), len(topic))  # fmt: skip
    return b"".join((head, topic, _TS_KEYSIZE.pack(timestamp_ms, len(key)), key, _I32.pack(len(value)), value))


def _signed32(n: int) -> int:
    n &= 0xFFFFFFFF
    return n - (1 << 32) if n >= 1 << 31 else n


__all__ = [
    "ANY_PARTITION",
    "API_VERSION",
    "PARTITION_KEY",
    "Malformed",
    "Message",
    "UnsupportedApiKey",
    "UnsupportedVersion",
    "encode",
    "parse",
    "parse_checked",
    "parse_fields",
    "parse_many",
]
