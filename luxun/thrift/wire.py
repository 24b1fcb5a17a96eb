"""Hand-written Thrift binary encoding for the broker's hot paths.

A ConsumeResponse carries up to thousands of items; thriftpy2 encodes a
``list<binary>`` at about 1 us per element, this at about 0.12 us, byte-for-byte the
same (strict binary protocol, as thriftpy2 and Apache Thrift write it)::

    i32 0x80010002 (version 1, REPLY) | string "consume" | i32 seqid
    consume_result { 0: struct success = ConsumeResponse {
        1: struct Result { 1: i32 resultCode, [2: i32 errorCode], [3: string errorMessage] }
        [2: list<binary> itemList]   (unset in error replies, as Java Luxun's)
        3: i64 lastConsumedIndex
        [4: list<i64> timestampList] [5: i64 firstIndex] [6: string heldBy]
        [7: i32 firstMessage] [8: binary itemBlob, 9: binary itemLengths] } }

A fetch's items may come as an :class:`ItemBlob` (lengths and one bytes object, as
the storage reads them); their length prefixes are then interleaved with numpy. When
the request set ``itemsAsBlob`` (an extension), its bytes go out as they are, as
``itemBlob``, with ``itemLengths`` beside them: no framing per item, no copy.

Produce and single-item consume calls are small and many, so they skip the generic
decoder too: :func:`parse_consume_call` reads a ``consume`` call in the canonical
layout, and :func:`parse_produce_call` reads a ``produce``/``asyncProduce`` call written the way
every Thrift generator writes it (strict header, fields in id order) and returns None
for anything else, which then takes the generic path (checked, then decoded by
thriftpy2). :func:`encode_produce_reply` writes the ProduceResponse reply.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from idl.calls import ARGS_ITEM, ASYNC_PRODUCE_NAME, CALL, ONEWAY, PRODUCE_NAME, REPLY, TOPIC_FIELD

_I32 = struct.Struct(">i")
_CONSUME = b"\x00\x00\x00\x07consume"  # the method name with its length
_REPLY_HEADER = _I32.pack(REPLY) + _CONSUME
_PRODUCE_REPLY_HEADER = _I32.pack(REPLY) + PRODUCE_NAME
_T_STRUCT, _T_I32, _T_I64, _T_STRING, _T_LIST = 12, 8, 10, 11, 15
_MAX_PARTS = 512  # buffers per reply from encode_consume_reply_parts (IOV_MAX is 1024)

# Calls (their layout: idl.calls).
_HEAD_I32 = struct.Struct(">i")
# message type, method name (with its length), seqid, the two field headers, item length
_PRODUCE_HEAD = struct.Struct(f">i{len(PRODUCE_NAME)}si{len(ARGS_ITEM)}si")
_ASYNC_PRODUCE_HEAD = struct.Struct(f">i{len(ASYNC_PRODUCE_NAME)}si{len(ARGS_ITEM)}si")
_TOPIC_HEAD = struct.Struct(f">{len(TOPIC_FIELD)}si")
#: An asyncProduce call in the canonical layout (see parse_produce_call) starts with
#: ASYNC_PRODUCE_START (ONEWAY and the name); its seqid follows, then ASYNC_ITEM_HEAD at
#: ASYNC_ITEM_HEAD_AT, the item's length at ASYNC_ITEM_LEN_AT and the item at ASYNC_ITEM_AT;
#: after the item, the call's tail: the topic field, the topic and STOP STOP. Two calls
#: with the same tail go to the same topic (a server compares instead of parsing again).
ASYNC_PRODUCE_START = _I32.pack(ONEWAY) + ASYNC_PRODUCE_NAME
ASYNC_ITEM_HEAD = ARGS_ITEM
ASYNC_ITEM_HEAD_AT = len(ASYNC_PRODUCE_START) + 4
ASYNC_ITEM_LEN_AT = ASYNC_ITEM_HEAD_AT + len(ASYNC_ITEM_HEAD)
ASYNC_ITEM_AT = _ASYNC_PRODUCE_HEAD.size


def _no_release() -> None:
    """An :class:`ItemBlob` of bytes: nothing to give back."""


class ItemBlob:
    """Items as their lengths and their bytes back to back (what
    :meth:`bigarray.BigArray.read_range_blob` returns): a consume reply made from it
    needs no ``bytes`` object per item. Sized like the list it stands for."""

    __slots__ = ("as_blob", "data", "lengths", "release")

    def __init__(
        self, lengths: np.ndarray[Any, Any], data: bytes | memoryview, release: Callable[[], None] = _no_release
    ) -> None:
        self.lengths = lengths
        self.data = data
        #: Called once the reply made from it is sent: ``data`` may be a view of a
        #: storage page (see :meth:`bigarray.BigArray.read_range_view`).
        self.release = release
        #: Sent as ConsumeResponse's ``itemBlob`` and ``itemLengths`` (the request set
        #: ``itemsAsBlob``), not as ``itemList``.
        self.as_blob = False

    @classmethod
    def of(cls, items: list[bytes] | ItemBlob) -> ItemBlob:
        """``items`` as an :class:`ItemBlob` (itself if it is one; a list is joined)."""
        if isinstance(items, ItemBlob):
            return items
        return cls(np.fromiter(map(len, items), dtype=np.int64, count=len(items)), b"".join(items))

    def lengths_field(self) -> bytes:
        """``itemLengths``: each item's length as a big-endian i32, in order."""
        return self.lengths.astype(">i4").tobytes()

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def to_list(self) -> list[bytes]:
        """The items as a list of ``bytes`` (for code that wants one)."""
        data = bytes(self.data) if isinstance(self.data, memoryview) else self.data  # copies outlive a view
        ends = np.cumsum(self.lengths)
        return [data[a:b] for a, b in zip((ends - self.lengths).tolist(), ends.tolist(), strict=True)]


#: Up to this many items (under 512 B on average), _framed_items frames them in Python:
#: encode_consume_reply_parts of 1 / 4 / 16 / 32 items of 100 B took 5.8-9.7 / 6.2-8.3 /
#: 6.3-10 / 6.2-12.2 us through numpy, 1.7-2.7 / 2.2-3.7 / 4.4-7.3 / 7.4-10.1 us so (32: a
#: tie, so not beyond 16).
_FRAME_IN_PYTHON = 16


def _framed_items(items: ItemBlob) -> np.ndarray[Any, Any] | list[Any]:
    """The elements of a ``list<binary>`` made from an :class:`ItemBlob`, each an i32
    length then its bytes: as one uint8 array, or as a list of buffers.

    Measured on 1 MiB of items (2 cores): items few and big enough to be sent as they
    are (512 B and more, at most ``_MAX_PARTS`` buffers) become memoryview slices, not
    copied at all (25 us for 104 items of 10 KB, against 70 us as rows); items of one
    size (the usual case) are otherwise written as rows of a 2-D array (0.2 ms for
    10 000 items of 100 B, against 1 ms packing them one by one; 51 us for 1 048 items
    of 1 KB, against 300 us as slices joined); mixed sizes as slices joined (512 B and
    more) or with ``numpy.insert`` (smaller: about 0.7 ms).
    """
    lengths = items.lengths
    n = len(lengths)
    if n == 0:
        return []
    data = items.data
    big = len(data) >= 512 * n
    if big and 2 * n <= _MAX_PARTS - 2:  # few, big items: sent as they are
        return _item_slices(data, lengths)
    if n <= _FRAME_IN_PYTHON:  # a few small items: joined in Python (numpy's set-up costs more)
        return [b"".join(_item_slices(data, lengths))]
    prefixes = lengths.astype(">i4")
    first = int(lengths[0])
    if bool((lengths == first).all()):
        rows = np.empty((n, first + 4), dtype=np.uint8)
        rows[:, :4] = prefixes.view(np.uint8).reshape(n, 4)
        rows[:, 4:] = np.frombuffer(data, dtype=np.uint8).reshape(n, first)
        return rows
    if big:  # joined by the caller
        return _item_slices(data, lengths)
    starts = np.cumsum(lengths) - lengths
    framed: np.ndarray[Any, Any] = np.insert(
        np.frombuffer(data, dtype=np.uint8), np.repeat(starts, 4), prefixes.view(np.uint8)
    )
    return framed


def _item_slices(data: bytes | memoryview, lengths: np.ndarray[Any, Any]) -> list[Any]:
    """Each item's i32 length and a memoryview slice of it, in order."""
    view = memoryview(data)
    parts: list[Any] = []
    begin = 0
    for length in lengths.tolist():  # (numpy's cumsum costs more for the few items sent so)
        parts.append(_I32.pack(length))
        parts.append(view[begin : begin + length])
        begin += length
    return parts


def _result_parts(result: Any, parts: list[bytes]) -> None:
    """``Result`` as a struct value (fields and STOP), appended to ``parts``."""
    parts.append(struct.pack(">bhi", _T_I32, 1, result.resultCode))
    if result.errorCode is not None:
        parts.append(struct.pack(">bhi", _T_I32, 2, result.errorCode))
    if result.errorMessage is not None:
        message = result.errorMessage.encode("utf-8")
        parts.append(struct.pack(">bhi", _T_STRING, 3, len(message)))
        parts.append(message)
    parts.append(b"\x00")


def _extension_parts(response: Any, parts: list[Any], end: bool = True) -> None:
    """ConsumeResponse's extension fields 4-7 (only when asked for), then (``end``) the
    STOPs that end ConsumeResponse and consume_result."""
    times = response.timestampList
    if times is not None:
        parts.append(struct.pack(f">bhbi{len(times)}q", _T_LIST, 4, _T_I64, len(times), *times))
    if response.firstIndex is not None:
        parts.append(struct.pack(">bhq", _T_I64, 5, response.firstIndex))
    held_by = response.heldBy
    if held_by is not None:
        raw = held_by.encode()
        parts.append(struct.pack(">bhi", _T_STRING, 6, len(raw)) + raw)
    first_message = response.firstMessage
    if first_message is not None:
        parts.append(struct.pack(">bhi", _T_I32, 7, first_message))
    if end:
        parts.append(b"\x00\x00")


def encode_consume_reply(seqid: int, response: Any) -> bytes:
    """The whole reply message (without the frame length) for ``response``."""
    return b"".join(encode_consume_reply_parts(seqid, response))


def encode_consume_reply_parts(seqid: int, response: Any) -> list[Any]:
    """The reply message as a few buffers to send in order (at most
    ``_MAX_PARTS``): the items of an :class:`ItemBlob` are not copied once more
    into one ``bytes``."""
    parts: list[Any] = [_REPLY_HEADER, _I32.pack(seqid), b"\x0c\x00\x00", b"\x0c\x00\x01"]
    _result_parts(response.result, parts)
    items = response.itemList
    if items is None:  # unset (error replies, as Java Luxun leaves them): no field 2
        parts.append(struct.pack(">bhq", _T_I64, 3, response.lastConsumedIndex or 0))
        _extension_parts(response, parts)
        return [b"".join(parts)]
    if isinstance(items, ItemBlob) and items.as_blob:  # EXTENSION: fields 8 and 9, no field 2
        parts.append(struct.pack(">bhq", _T_I64, 3, response.lastConsumedIndex or 0))
        _extension_parts(response, parts, end=False)
        parts.append(struct.pack(">bhi", _T_STRING, 8, len(items.data)))
        lengths = struct.pack(">bhi", _T_STRING, 9, 4 * len(items)) + items.lengths_field() + b"\x00\x00"
        return [b"".join(parts), items.data, lengths]  # the data as read: a page's view is not copied
    parts.append(struct.pack(">bhbi", _T_LIST, 2, _T_STRING, len(items)))
    if isinstance(items, ItemBlob):
        out: list[Any] = [b"".join(parts)]
        framed = _framed_items(items)
        if not isinstance(framed, list):
            out.append(framed)
        elif len(framed) <= _MAX_PARTS - 2:
            out.extend(framed)
        else:
            out.append(b"".join(framed))
        parts = out
    else:
        pack = _I32.pack
        append = parts.append
        for item in items:
            append(pack(len(item)))
            append(item)
    tail = [struct.pack(">bhq", _T_I64, 3, response.lastConsumedIndex or 0)]
    _extension_parts(response, tail)
    if isinstance(items, ItemBlob):
        parts.append(b"".join(tail))
        return parts
    parts.extend(tail)
    return [b"".join(parts)]


# A successful one-item consume reply around its item: length | header | seqid |
# success { Result { 1: i32 0 } STOP, 2: list<binary> [size, item] ... then
# 3: i64 lastConsumedIndex } STOP STOP.
_CONSUME_ONE_HEAD = struct.Struct(f">i{len(_REPLY_HEADER)}si22si")
_CONSUME_ONE_TAIL = struct.Struct(">3sq2s")
_CONSUME_ONE_FIXED = _CONSUME_ONE_HEAD.size - 4 + _CONSUME_ONE_TAIL.size  # the body without the item


def consume_one_reply_frame(seqid: int, item: bytes, last_index: int) -> bytes:
    """The framed reply (with its 4-byte length) of a successful ``consume`` that
    returns the single ``item``: byte for byte what :func:`encode_consume_reply`
    writes for ``ConsumeResponse(result=Result(0), itemList=[item],
    lastConsumedIndex=last_index)``, in one join."""
    return b"".join(
        (
            _CONSUME_ONE_HEAD.pack(
                _CONSUME_ONE_FIXED + len(item),
                _REPLY_HEADER,
                seqid,
                b"\x0c\x00\x00\x0c\x00\x01\x08\x00\x01\x00\x00\x00\x00\x00\x0f\x00\x02\x0b\x00\x00\x00\x01",
                len(item),
            ),
            item,
            _CONSUME_ONE_TAIL.pack(b"\x0a\x00\x03", last_index, b"\x00\x00"),
        )
    )


def encode_produce_reply(seqid: int, result: Any, index: int) -> bytes:
    """The reply message of ``produce`` (without the frame length)::

    i32 0x80010002 | "produce" | seqid | produce_result { 0: ProduceResponse {
        1: Result, 2: i64 index } }
    """
    parts = [_PRODUCE_REPLY_HEADER, _I32.pack(seqid), b"\x0c\x00\x00", b"\x0c\x00\x01"]
    _result_parts(result, parts)
    parts.append(struct.pack(">bhq", _T_I64, 2, index))
    parts.append(b"\x00\x00")
    return b"".join(parts)


# A successful produce reply with its frame length: length | header | seqid |
# success { Result { 1: i32 0 } STOP, 2: i64 index } STOP STOP.
_PRODUCE_OK = struct.Struct(f">i{len(_PRODUCE_REPLY_HEADER)}si6s8s3sq2s")
_PRODUCE_OK_BODY = _PRODUCE_OK.size - 4


def produce_reply_frame(seqid: int, result: Any, index: int) -> bytes:
    """:func:`encode_produce_reply` with its 4-byte frame length in front; a success
    (the usual case) is one ``struct.pack``."""
    if result.resultCode == 0 and result.errorCode is None and result.errorMessage is None:
        return _PRODUCE_OK.pack(
            _PRODUCE_OK_BODY,
            _PRODUCE_REPLY_HEADER,
            seqid,
            b"\x0c\x00\x00\x0c\x00\x01",
            b"\x08\x00\x01\x00\x00\x00\x00\x00",
            b"\x0a\x00\x02",
            index,
            b"\x00\x00",
        )
    body = encode_produce_reply(seqid, result, index)
    return len(body).to_bytes(4, "big") + body


def parse_produce_call(
    buf: bytes | bytearray | memoryview, start: int, end: int
) -> tuple[bool, int, bytes | bytearray | memoryview, str] | None:
    """``(oneway, seqid, item, topic)`` when ``buf[start:end]`` is exactly one
    ``produce`` or ``asyncProduce`` call in the canonical layout::

        i32 0x80010001 (CALL) or 0x80010004 (ONEWAY) | string name | i32 seqid
        args { 1: ProduceRequest { 1: binary item, 2: string topic } } STOP STOP

    None for anything else (other methods, other field orders, extra fields, a topic
    that is not UTF-8, lengths that do not fit): the caller takes the generic path.
    The item is a copy of the same type as ``buf`` (a ``bytearray`` from the server's
    receive buffer), except from a ``memoryview``: then it is a view into ``buf`` (a big
    frame's own mapping, see luxun.thrift.server, is not copied again).
    """
    # The head, up to the item's length, in one unpack: which method it can be is told by
    # the length of its name (byte 7); the name is compared whole (in process, 1 KB items:
    # 2.1-2.2 -> 1.6 us a call; 100 B: 1.9-2.1 -> 1.3).
    try:
        if buf[start + 7] == 12:
            kind, name, seqid, args, size = _ASYNC_PRODUCE_HEAD.unpack_from(buf, start)
            if name != ASYNC_PRODUCE_NAME:
                return None
            oneway = True
            pos = start + _ASYNC_PRODUCE_HEAD.size
        else:
            kind, name, seqid, args, size = _PRODUCE_HEAD.unpack_from(buf, start)
            if name != PRODUCE_NAME:
                return None
            oneway = False
            pos = start + _PRODUCE_HEAD.size
        if (kind != CALL and kind != ONEWAY) or args != ARGS_ITEM or size < 0 or pos + size + 7 > end:
            return None
        item = buf[pos : pos + size]  # one copy (a view of a memoryview); bytes(...) of it was a second
        pos += size
        field, size = _TOPIC_HEAD.unpack_from(buf, pos)
        pos += 7
        if field != TOPIC_FIELD or size < 0 or pos + size + 2 != end or buf[end - 2] or buf[end - 1]:
            return None
        topic = str(buf[pos : pos + size], "utf-8")
    except (struct.error, IndexError, UnicodeDecodeError):
        return None
    return oneway, seqid, item, topic


#: ConsumeRequest's fields the fast parser knows: id -> (Thrift type, attribute).
_CONSUME_FIELDS = {
    1: (_T_STRING, "topic"),
    2: (_T_STRING, "fanoutId"),
    3: (_T_I64, "startIndex"),
    4: (_T_I32, "maxFetchSize"),
    5: (_T_I32, "maxWaitMs"),
    6: (2, "withTimestamps"),
    9: (2, "itemsAsBlob"),
}
_FIELD_HEAD = struct.Struct(">bh")
_I64 = struct.Struct(">q")


def parse_consume_call(buf: bytes | bytearray | memoryview, start: int, end: int) -> tuple[int, dict[str, Any]] | None:
    """``(seqid, fields)`` when ``buf[start:end]`` is exactly one ``consume`` call in
    the canonical layout::

        i32 0x80010001 (CALL) | string "consume" | i32 seqid
        args { 1: ConsumeRequest { fields 1..6 and 9 of the known types, in id order } } STOP STOP

    ``fields`` maps ConsumeRequest's attribute names to the values sent (topic
    included). None for anything else (unknown or repeated fields, other types, no
    topic, a string that is not UTF-8, lengths that do not fit the frame): the caller
    takes the generic path, which checks and decodes it with thriftpy2.
    """
    try:
        (kind,) = _HEAD_I32.unpack_from(buf, start)
        if kind != CALL or buf[start + 4 : start + 15] != _CONSUME:
            return None
        (seqid,) = _HEAD_I32.unpack_from(buf, start + 15)
        if buf[start + 19 : start + 22] != b"\x0c\x00\x01":  # args field 1: struct
            return None
        pos = start + 22
        fields: dict[str, Any] = {}
        last_id = 0
        while True:
            ftype = buf[pos]
            if ftype == 0:  # end of ConsumeRequest, then end of the args struct
                if pos + 2 != end or buf[pos + 1] != 0 or "topic" not in fields:
                    return None
                return seqid, fields
            ftype, fid = _FIELD_HEAD.unpack_from(buf, pos)
            known = _CONSUME_FIELDS.get(fid)
            if known is None or known[0] != ftype or fid <= last_id:
                return None
            last_id = fid
            pos += 3
            if ftype == _T_STRING:
                (size,) = _HEAD_I32.unpack_from(buf, pos)
                pos += 4
                if size < 0 or pos + size > end:
                    return None
                fields[known[1]] = bytes(buf[pos : pos + size]).decode("utf-8")
                pos += size
            elif ftype == _T_I64:
                fields[known[1]] = _I64.unpack_from(buf, pos)[0]
                pos += 8
            elif ftype == _T_I32:
                fields[known[1]] = _HEAD_I32.unpack_from(buf, pos)[0]
                pos += 4
            else:  # bool
                fields[known[1]] = buf[pos] != 0
                pos += 1
    except (struct.error, UnicodeDecodeError, IndexError):
        return None


# -- requests with a required field missing ---------------------------------------------------
#: Optional fields (our IDL extensions): Java's generated toString shows them only when
#: set; thriftpy2's spec does not tell optional from default requiredness.
_OPTIONAL_FIELDS = frozenset(
    {"maxWaitMs", "withTimestamps", "fromCommitted", "memberId", "itemsAsBlob", "release", "message"}
)
_T_BOOL, _T_BINARY = 2, 18
_JAVA_BINARY_SHOWN = 128  # bytes of a binary field TBaseHelper.toString shows


def _java_value(ttype: int, value: Any) -> str:
    if ttype == _T_BINARY and isinstance(value, bytes | bytearray):
        shown = " ".join(f"{b:02X}" for b in value[:_JAVA_BINARY_SHOWN])
        return shown + ("..." if len(value) > _JAVA_BINARY_SHOWN else "")
    if ttype == _T_STRUCT and hasattr(value, "thrift_spec"):
        return java_struct_text(value)
    if ttype == _T_BOOL:
        return "true" if value else "false"
    return str(value)


def java_struct_text(obj: Any) -> str:
    """``obj`` as Java's generated ``toString`` writes it: ``Name(field:value, ...)``;
    unset fields show as ``null`` (objects) or their zero value (numbers), binary
    as at most 128 hex bytes."""
    parts = []
    for ttype, name, *_ in (obj.thrift_spec[fid] for fid in sorted(obj.thrift_spec)):
        value = getattr(obj, name)
        if value is None:
            if name in _OPTIONAL_FIELDS:
                continue
            text = "false" if ttype == _T_BOOL else "0" if ttype in (3, _T_I32, _T_I64, 6, 4) else "null"
        else:
            text = _java_value(ttype, value)
        parts.append(f"{name}:{text}")
    return f"{type(obj).__name__}({', '.join(parts)})"


def required_fields(args_cls: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """For a call's args struct class: ``(argument name, its struct's required field
    names)`` for each struct argument that has some (computed once per method, so that
    the check on each call is a few ``getattr``)."""
    out = []
    for entry in args_cls.thrift_spec.values():
        spec = getattr(entry[2], "thrift_spec", None) if len(entry) > 3 else None
        if spec:
            names = tuple(spec[fid][1] for fid in sorted(spec) if spec[fid][-1] is True)
            if names:
                out.append((entry[1], names))
    return tuple(out)


def missing_required_field(args: Any) -> str | None:
    """For a decoded call's args struct: None when every required field of it and
    of the structs it carries is set; else Java's message for the first one
    missing (the text of its ``TProtocolException``, sent back as a
    ``TApplicationException`` PROTOCOL_ERROR)::

        Required field 'item' is unset! Struct:ProduceRequest(item:null, topic:t)
    """
    for obj in (args, *(getattr(args, entry[1]) for entry in args.thrift_spec.values())):
        spec = getattr(obj, "thrift_spec", None)
        if spec is None:
            continue
        for fid in sorted(spec):
            entry = spec[fid]
            if entry[-1] is True and getattr(obj, entry[1]) is None:
                return f"Required field '{entry[1]}' is unset! Struct:{java_struct_text(obj)}"
    return None
