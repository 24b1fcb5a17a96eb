"""A bounded walker of Thrift binary-protocol values: the one skipper of untrusted input.

``skip_value(data, pos, end, ttype, max_depth)`` walks one value of Thrift type
``ttype`` starting at ``data[pos]`` and returns the position just after it, without
building anything. It never reads at or past ``end``, refuses a string length or a
container count that cannot fit in the bytes left (each element takes at least
:data:`MIN_SIZE` bytes of its type), refuses structs, lists, sets and maps nested more
than ``max_depth`` levels, and refuses unknown type ids, each with a
:class:`ThriftBinaryError` (a ``ValueError``) saying which. Its work is bounded by
``end - pos``: a crafted count of two billion elements fails at once.

:func:`skip_message` walks a whole message (header, then the arguments struct).

Users (each wraps the error in its own):

- the broker's :func:`luxun.thrift.server.check_frame` walks every request frame before the
  Cython decoder sees it (``max_depth`` 32; error: ``BadFrame``);
- the message-pack reader (:mod:`idl.pack`, used by the clients and the broker) skips
  unknown fields of packs it cannot trust (``max_depth`` 64; error: ``PackError``).

The binary protocol's layout (big-endian)::

    bool, byte 1 B; i16 2 B; i32 4 B; i64, double 8 B
    string/binary  i32 length + bytes
    struct         fields (i8 type, i16 id, value) until an i8 STOP (0)
    list, set      i8 element type, i32 count, elements
    map            i8 key type, i8 value type, i32 count, (key, value) pairs

Speed: the broker calls this on every generic request (about 1 us for a consume
request), so the walk is plain functions over positions, no objects per value.

Thread-safety: pure functions.
"""

from __future__ import annotations

import struct
from typing import Final

#: Thrift binary-protocol type ids, as they appear on the wire.
T_STOP: Final = 0
T_BOOL: Final = 2
T_BYTE: Final = 3
T_DOUBLE: Final = 4
T_I16: Final = 6
T_I32: Final = 8
T_I64: Final = 10
T_STRING: Final = 11  # also ``binary``
T_STRUCT: Final = 12
T_MAP: Final = 13
T_SET: Final = 14
T_LIST: Final = 15

#: Bytes taken by one value of each fixed-size type.
FIXED_SIZE: Final[dict[int, int]] = {T_BOOL: 1, T_BYTE: 1, T_DOUBLE: 8, T_I16: 2, T_I32: 4, T_I64: 8}
#: The fewest bytes one value of each type takes (bounds container counts).
MIN_SIZE: Final[dict[int, int]] = {**FIXED_SIZE, T_STRING: 4, T_STRUCT: 1, T_MAP: 6, T_SET: 5, T_LIST: 5}

_I32 = struct.Struct(">i")
_MAP_HEADER = struct.Struct(">bbi")
_LIST_HEADER = struct.Struct(">bi")


class ThriftBinaryError(ValueError):
    """Bytes that are not a well-formed Thrift binary value within the bounds given."""


class _TooDeep(Exception):
    """Raised inside the walk; the public function names the limit."""


def skip_value(data: bytes, pos: int, end: int, ttype: int, max_depth: int) -> int:
    """The position just after the value of type ``ttype`` at ``data[pos]``.

    Raises:
        ThriftBinaryError: a length or count that does not fit before ``end``, a value
            cut off by ``end``, nesting deeper than ``max_depth``, an unknown type id.
    """
    try:
        pos = _skip(data, pos, end, ttype, max_depth)
    except _TooDeep:
        raise ThriftBinaryError(f"values nested deeper than {max_depth}") from None
    except struct.error as exc:  # a header cut off by the end of the buffer
        raise ThriftBinaryError(f"value cut off: {exc}") from None
    if pos > end:
        raise ThriftBinaryError("a value runs past the end")
    return pos


def skip_message(data: bytes, max_depth: int) -> int:
    """The end of the Thrift binary message (call or reply: name, type, seqid, then the
    arguments struct) at the start of ``data``; old-style (non-strict) headers too.

    Raises:
        ThriftBinaryError: as :func:`skip_value`, or an unknown protocol version.
    """
    end = len(data)
    try:
        if end < 4:
            raise ThriftBinaryError("message header cut off")
        (first,) = _I32.unpack_from(data, 0)
        if first < 0:  # strict: version | type, name, seqid
            if first & 0xFFFF0000 != 0x80010000:
                raise ThriftBinaryError(f"unknown protocol version {first & 0xFFFF0000:#x}")
            pos = _skip_string(data, 4, end) + 4
        else:  # old style: name, type byte, seqid
            pos = _skip_string(data, 0, end) + 5
        pos = _skip(data, pos, end, T_STRUCT, max_depth)
    except _TooDeep:
        raise ThriftBinaryError(f"values nested deeper than {max_depth}") from None
    except struct.error as exc:
        raise ThriftBinaryError(f"value cut off: {exc}") from None
    if pos > end:
        raise ThriftBinaryError("a value runs past the end")
    return pos


def _skip_string(data: bytes, pos: int, end: int) -> int:
    if pos + 4 > end:
        raise ThriftBinaryError("string length cut off")
    size: int
    (size,) = _I32.unpack_from(data, pos)
    pos += 4
    if size < 0 or size > end - pos:
        raise ThriftBinaryError(f"string of {size} bytes announced with {end - pos} bytes left")
    return pos + size


def _skip(data: bytes, pos: int, end: int, ttype: int, depth_left: int) -> int:
    # The hot path of check_frame: keep it free of extra calls and lookups.
    size: int  # what the struct unpacks (annotations only: no cost at run time)
    count: int
    fixed = FIXED_SIZE.get(ttype)
    if fixed is not None:
        return pos + fixed  # callers check against end (the struct loop, the counts, skip_value)
    if ttype == T_STRING:  # _skip_string, inlined
        if pos + 4 > end:
            raise ThriftBinaryError("string length cut off")
        (size,) = _I32.unpack_from(data, pos)
        pos += 4
        if size < 0 or size > end - pos:
            raise ThriftBinaryError(f"string of {size} bytes announced with {end - pos} bytes left")
        return pos + size
    if depth_left < 0:
        raise _TooDeep
    if ttype == T_STRUCT:
        while True:
            if pos >= end:
                raise ThriftBinaryError("struct not terminated")
            ftype = data[pos]
            if ftype == T_STOP:
                return pos + 1
            pos += 3  # type byte, i16 field id
            if pos > end:
                raise ThriftBinaryError("field header cut off")
            pos = _skip(data, pos, end, ftype, depth_left - 1)
    if ttype == T_MAP:
        if pos + 6 > end:
            raise ThriftBinaryError("map header cut off")
        ktype, vtype, count = _MAP_HEADER.unpack_from(data, pos)
        pos += 6
        _check_count(count, _min_size(ktype) + _min_size(vtype), end - pos)
        for _ in range(count):
            pos = _skip(data, pos, end, ktype, depth_left - 1)
            pos = _skip(data, pos, end, vtype, depth_left - 1)
            if pos > end:
                raise ThriftBinaryError("map runs past the end")
        return pos
    if ttype in (T_LIST, T_SET):
        if pos + 5 > end:
            raise ThriftBinaryError("list header cut off")
        etype, count = _LIST_HEADER.unpack_from(data, pos)
        pos += 5
        size = _min_size(etype)
        _check_count(count, size, end - pos)
        if etype in FIXED_SIZE:
            return pos + size * count  # fits: checked just above
        for _ in range(count):
            pos = _skip(data, pos, end, etype, depth_left - 1)
            if pos > end:
                raise ThriftBinaryError("list runs past the end")
        return pos
    raise ThriftBinaryError(f"unknown Thrift type id {ttype}")


def _min_size(ttype: int) -> int:
    size = MIN_SIZE.get(ttype)
    if size is None:
        raise ThriftBinaryError(f"unknown Thrift type id {ttype}")
    return size


def _check_count(count: int, min_size: int, left: int) -> None:
    if count < 0 or count * min_size > left:
        raise ThriftBinaryError(f"container of {count} elements announced with {left} bytes left: cannot fit")


__all__ = [
    "FIXED_SIZE",
    "MIN_SIZE",
    "T_BOOL",
    "T_BYTE",
    "T_DOUBLE",
    "T_I16",
    "T_I32",
    "T_I64",
    "T_LIST",
    "T_MAP",
    "T_SET",
    "T_STOP",
    "T_STRING",
    "T_STRUCT",
    "ThriftBinaryError",
    "skip_message",
    "skip_value",
]
