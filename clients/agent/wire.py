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
_I64 = struct.Struct(">q")


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
    """:func:`parse` as a plain tuple: a fast path for valid messages without a Key
    (:func:`parse_runs`); anything else goes through the checks in Dory's order
    (:func:`parse_checked`)."""
    r = parse_runs((data,))[0]
    return r.fields()[0] if isinstance(r, Run) else parse_checked(data)


class Run:
    """Valid messages without a Key, in a row, of one topic and partition key, in the shape
    the agent batches them: ``values`` as a message pack lists them (each value's i32
    length, then its bytes, one after the other), one timestamp per message, and ``size``,
    their bytes as received (Dory sizes)."""

    __slots__ = ("count", "pk", "size", "timestamps", "topic", "values")

    def __init__(self, topic: bytes, pk: int | None, values: bytes, timestamps: list[int], size: int) -> None:
        self.topic = topic
        self.pk = pk
        self.values = values
        self.timestamps = timestamps
        self.count = len(timestamps)
        self.size = size

    def fields(self) -> list[Fields]:
        """The messages one by one."""
        out: list[Fields] = []
        values = self.values
        pos = 0
        for ts in self.timestamps:
            end = pos + 4 + int.from_bytes(values[pos : pos + 4], "big")
            out.append((self.topic, self.pk, ts, b"", values[pos + 4 : end]))
            pos = end
        return out


def parse_runs(messages: Sequence[bytes], max_len: int = 1 << 62) -> list[Run | bytes]:
    """Many messages in one call, with no Python call per message: the valid ones without
    a Key and of at most ``max_len`` bytes (what Dory's clients mostly send) as :class:`Run`
    objects, one per row of them with one topic and partition key; every other message
    as it came (:func:`parse_checked` then reads it, or says why not), in order.

    A message of the same length as the run's last one, with the same bytes up to its
    Timestamp and the same KeySize and ValueSize, passes every check that one passed and
    belongs to the run: it costs two byte comparisons and reading its timestamp."""
    out: list[Run | bytes] = []
    any_head = _ANY_HEAD.unpack_from
    tail = _TAIL_NO_KEY.unpack_from
    ts_at = _I64.unpack_from
    topic: bytes | None = None  # the current run's (None: no run)
    pk: int | None = None
    parts: list[bytes] = []  # its values, each with its ValueSize: as a pack lists them
    stamps: list[int] = []
    add_part = parts.append
    add_stamp = stamps.append
    # The run's last message: its length, its bytes before the Timestamp (which starts at
    # t_end), its KeySize and ValueSize (at t_end + 8). The same offsets hold for the whole
    # run (one topic, one ApiKey), so its bytes received are len(values) + count * (t_end + 12).
    t_n = -1
    t_head = t_kv = b""
    t_end = t_kv_at = t_value_at = 0
    for data in messages:
        n = len(data)
        if n == t_n and data.startswith(t_head) and data.startswith(t_kv, t_kv_at):
            add_stamp(ts_at(data, t_end)[0])
            add_part(data[t_value_at:])
            continue
        if 28 <= n <= max_len:
            msg_size, api_key, version, flags, topic_size = any_head(data)
            if msg_size == n and version == 0 and flags == 0:
                key: int | None = None
                start = 0
                if api_key == ANY_PARTITION:
                    start = 12
                elif api_key == PARTITION_KEY and n >= 32:
                    _, _, _, _, key, topic_size = _KEY_HEAD.unpack_from(data)
                    key &= 0xFFFFFFFF
                    start = 16
                end = start + topic_size
                if start and topic_size > 0 and end + 16 <= n:
                    ts, key_size, value_size = tail(data, end)
                    if key_size == 0 and value_size >= 0 and end + 16 + value_size == n:
                        raw = data[start:end]
                        if raw != topic or key != pk:
                            if stamps:
                                out.append(_take_run(topic, pk, parts, stamps, t_value_at))
                            topic = raw
                            pk = key
                        t_n = n
                        t_head = data[:end]
                        t_kv = data[end + 8 : end + 16]
                        t_end = end
                        t_kv_at = end + 8
                        t_value_at = end + 12
                        add_stamp(ts)
                        add_part(data[t_value_at:])
                        continue
        if stamps:  # off the fast path: the run ends before it
            out.append(_take_run(topic, pk, parts, stamps, t_value_at))
        topic = None
        t_n = -1
        out.append(data)
    if stamps:
        out.append(_take_run(topic, pk, parts, stamps, t_value_at))
    return out


def _take_run(topic: bytes | None, pk: int | None, parts: list[bytes], stamps: list[int], value_at: int) -> Run:
    """The run gathered in ``parts`` and ``stamps``, which are emptied for the next one."""
    values = b"".join(parts)
    run = Run(topic or b"", pk, values, stamps.copy(), len(values) + len(stamps) * value_at)
    parts.clear()
    stamps.clear()
    return run


def parse_checked(data: bytes) -> Fields:
    """Read one message with every check, in Dory's order (what :func:`parse_fields`
    does for a message off :func:`parse_runs`'s fast path).

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
    "Run",
    "UnsupportedApiKey",
    "UnsupportedVersion",
    "encode",
    "parse",
    "parse_checked",
    "parse_fields",
    "parse_runs",
]
