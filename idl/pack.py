"""Message packs: what a producer puts in one queue item.

A producer batch is ONE queue item, a *message pack*, byte-compatible with Java Luxun
(``MessageList.toThriftBuffer`` / ``fromThriftBuffer``; IDL in ``idl/message.thrift``).
All integers are big-endian; Thrift binary protocol, no message envelope::

    TMessagePack (as Java Luxun and this module write it: 22 bytes, payload, 1 byte)
      03 0001  magic      i8   1 (format version; anything else is refused)
      03 0002  attribute  i8   CompressionCodec of the payload: 0 none, 1 gzip, 2 snappy
      08 0003  crc32      i32  CRC-32 of the payload bytes as stored (after compression),
                               as a signed i32; 0 = not set (Java Luxun always wrote 0)
      0b 0004  messageList binary: i32 length + payload
      00       STOP

    payload = compress(TMessageList, attribute)
    TMessageList
      0f 0001  messages   list<binary>: element type 0b, i32 count, then per message
                          i32 length + bytes
      00       STOP       (Java writes just ``00`` for a batch without messages)

The payload's compression is :mod:`idl.codec`'s business.

This is the one home of the layout: the clients (``clients.pack``: producers, consumers,
the agent) and the broker (``luxun.records.batch_to_pack``, a Kafka batch served to a
Thrift consumer) both write and read packs with these functions.

Reading is defensive: a malformed, truncated or corrupt pack raises :class:`PackError`
(a ``ValueError``) naming what is wrong, and nothing else (a codec's
:class:`~idl.codec.CodecError` is raised as a PackError with the same message; the
clients raise their own ``clients.errors.PackError``, a subclass of this one, with the
same message again).

Payloads whose integrity is checked (the pack's crc32 is set and matches, or gzip's own
CRC matched) are read by thriftpy2's Cython binary protocol, over a buffered transport
that raises at the end of the data. Other payloads (Java packs, which have no crc32, in the none or snappy
codecs) go through a bounds-checked pure-Python reader, about 3x slower, that never
reads past the item and whose loops are bounded by the bytes left. The Cython reader
is not hardened against a *deliberately crafted* pack with a valid crc32 (one can make
it reserve address space for a claimed 2 GiB message, or skip a list of two billion
empty elements for seconds); producers are trusted not to write those.

Thread-safety: every function here is pure and may be called from any number of
threads.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from itertools import chain
from typing import Any, Final

from . import message_thrift as M
from .binary import T_BYTE as _T_BYTE
from .binary import T_I32 as _T_I32
from .binary import T_LIST as _T_LIST
from .binary import T_STOP as _T_STOP
from .binary import T_STRING as _T_STRING
from .binary import ThriftBinaryError, skip_value
from .codec import CODEC_NAMES as _CODEC_NAMES
from .codec import GZIP, NO_COMPRESSION, CodecError, compress, decompress, unknown_codec

try:  # the fast reader/writer; thriftpy2 wheels for CPython always ship it
    from thriftpy2.protocol.cybin import TCyBinaryProtocol  # type: ignore[attr-defined]
    from thriftpy2.transport.buffered import TCyBufferedTransport  # type: ignore[attr-defined]
    from thriftpy2.transport.memory import TCyMemoryBuffer  # type: ignore[attr-defined]

    _HAVE_CYTHON = True
except ImportError:  # pragma: no cover - pure-Python thriftpy2 builds
    _HAVE_CYTHON = False

__all__ = [
    "MAGIC",
    "PackError",
    "decode_pack",
    "encode_pack",
    "encode_pack_written",
    "pack_codec",
    "pack_rest",
    "pack_written_parts",
]

#: The only pack format version there is.
MAGIC: Final = 1


class PackError(ValueError):
    """An item is not a valid message pack (bad magic, bad crc32, unknown codec, corrupt
    or truncated payload), or a codec cannot be used (snappy not installed)."""


# Unknown fields are skipped by idl.binary's bounded walker, at most this deep.
_MAX_DEPTH: Final = 64

# TMessagePack as Java Luxun (and we) write it: the four field headers and values in
# id order, then the payload, then STOP.
_PACK_HEAD: Final = struct.Struct(">bhbbhbbhibhi")
_PACK_HEAD_SIZE: Final = _PACK_HEAD.size  # 22
# TMessageList's list header: field 1 of type list, element type binary.
_LIST_HEAD: Final = b"\x0f\x00\x01\x0b"
_LIST_HEAD_SIZE: Final = 8  # + i32 count

_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")

_TMessageList: Any = M.TMessageList


def encode_pack(messages: Sequence[bytes], codec: int = NO_COMPRESSION) -> bytes:
    """One queue item holding ``messages``, compressed with ``codec``.

    Messages must be ``bytes`` (``bytearray`` and ``memoryview`` are copied to bytes;
    anything else is a ``TypeError``). The crc32 field is always filled in.
    Raises :class:`PackError` for an unknown codec or snappy when it is not installed.
    """
    return _pack_payload(_write_message_list(messages), codec)


def encode_pack_written(count: int, written: bytes | bytearray, codec: int = NO_COMPRESSION) -> bytes:
    """:func:`encode_pack` of ``count`` messages already written one after the other as
    ``written``, each as its i32 big-endian length then its bytes (what a batcher can build
    up in one ``bytearray`` instead of keeping an object per message)."""
    return _pack_payload(b"".join((_LIST_HEAD, _I32.pack(count), written, b"\x00")), codec)


def pack_written_parts(count: int, written: bytes | bytearray) -> list[bytes | bytearray]:
    """:func:`encode_pack_written` without compression, as the buffers the pack is made of,
    in order (``written`` itself among them, not copied): for ``sendmsg``, so that a
    batch's bytes go from its buffer to the kernel with no copy made in between."""
    list_head = _LIST_HEAD + _I32.pack(count)
    crc = zlib.crc32(b"\x00", zlib.crc32(written, zlib.crc32(list_head)))
    size = len(list_head) + len(written) + 1  # the payload: list, STOP of its struct
    return [_pack_head(NO_COMPRESSION, crc, size), list_head, written, b"\x00\x00"]  # payload's STOP, pack's STOP


def _pack_payload(payload: bytes, codec: int) -> bytes:
    if codec != NO_COMPRESSION:
        try:
            payload = compress(payload, codec)
        except CodecError as exc:
            raise _pack_error(exc) from exc.__cause__
    return b"".join((_pack_head(codec, zlib.crc32(payload), len(payload)), payload, b"\x00"))


def _pack_head(codec: int, crc: int, size: int) -> bytes:
    """A pack's fields before its payload's bytes (``crc``: zlib's unsigned crc32 of the
    payload, stored as Java's signed int; ``size``: the payload's length)."""
    return _PACK_HEAD.pack(_T_BYTE, 1, MAGIC, _T_BYTE, 2, codec, _T_I32, 3, _signed(crc), _T_STRING, 4, size)


def decode_pack(item: bytes) -> list[bytes]:
    """The messages of one queue item, in order (the inverse of :func:`encode_pack`).

    Checks the magic (must be 1) and the crc32 (unless it is 0, "not set"), decompresses
    per the codec (snappy: xerial framing or a raw block) and raises :class:`PackError`
    naming the problem for anything malformed.
    """
    if type(item) is not bytes:
        item = bytes(item)
    magic, codec, crc, data, start, end = _read_pack(item)
    _check_magic(magic)
    if codec not in _CODEC_NAMES:
        raise _pack_error(unknown_codec(codec))
    payload = memoryview(data)[start:end]
    if crc != 0:
        actual = _signed_crc32(payload)
        if actual != crc:
            raise PackError(
                f"message pack crc32 mismatch: the pack says {crc}, its {_CODEC_NAMES[codec]} payload of "
                f"{end - start} bytes has {actual} (corrupt item)"
            )
    if codec != NO_COMPRESSION:
        try:
            data = decompress(payload, codec)
        except CodecError as exc:
            raise _pack_error(exc) from exc.__cause__
        start, end = 0, len(data)
    # Integrity checked (by our crc32 or gzip's): the fast reader is safe to use.
    return _read_message_list(data, start, end, trusted=crc != 0 or codec == GZIP)


def pack_codec(item: bytes) -> int:
    """The codec (``attribute``) of a pack, without decompressing or checking the crc32.

    Raises :class:`PackError` if ``item`` is not a pack of magic 1.
    """
    if type(item) is not bytes:
        item = bytes(item)
    magic, codec, *_ = _read_pack(item)
    _check_magic(magic)
    return codec


def pack_rest(item: bytes, skip: int) -> bytes:
    """``item`` without its first ``skip`` messages: the rest re-encoded as a pack in
    the item's own codec (what a reader that hands items out whole gives of a pack
    whose first messages a group has committed); ``item`` itself when ``skip`` <= 0.

    Raises :class:`PackError` if ``item`` is not a valid pack.
    """
    if skip <= 0:
        return item
    return encode_pack(decode_pack(item)[skip:], pack_codec(item))


# -- internals: the pack -------------------------------------------------------------

# (magic, attribute, crc32, buffer, payload start, payload end)
_Pack = tuple[int, int, int, bytes, int, int]


def _signed_crc32(data: bytes | memoryview) -> int:
    return _signed(zlib.crc32(data))


def _pack_error(exc: CodecError) -> PackError:
    """A codec's error as this module's (same message; the traceback kept)."""
    return PackError(*exc.args).with_traceback(exc.__traceback__)


def _signed(crc: int) -> int:
    """zlib's unsigned crc32 as Java's signed int (what a pack stores)."""
    return crc - 0x1_0000_0000 if crc & 0x8000_0000 else crc


def _check_magic(magic: int) -> None:
    if magic != MAGIC:
        raise PackError(f"unsupported message pack magic {magic} (expected {MAGIC}): not a Luxun message pack")


def _read_pack(item: bytes) -> _Pack:
    """The fields of a serialised TMessagePack; the payload is ``buffer[start:end]``."""
    size = len(item)
    if size > _PACK_HEAD_SIZE:
        t1, f1, magic, t2, f2, codec, t3, f3, crc, t4, f4, n = _PACK_HEAD.unpack_from(item)
        if (
            n == size - _PACK_HEAD_SIZE - 1
            and item[-1] == _T_STOP
            and t1 == _T_BYTE
            and f1 == 1
            and t2 == _T_BYTE
            and f2 == 2
            and t3 == _T_I32
            and f3 == 3
            and t4 == _T_STRING
            and f4 == 4
        ):
            return magic, codec, crc, item, _PACK_HEAD_SIZE, size - 1
    return _read_pack_any_layout(item)


def _read_pack_any_layout(item: bytes) -> _Pack:
    """The general TMessagePack reader: fields in any order, unknown ones skipped,
    absent ones at their defaults (magic 1, attribute 0, crc32 0; messageList required)."""
    if not item:
        raise PackError("empty item: not a message pack")
    cur = _Cursor(item, 0, len(item), "message pack")
    magic, codec, crc = MAGIC, NO_COMPRESSION, 0
    start = end = -1
    while True:
        ftype = cur.u8()
        if ftype == _T_STOP:
            break
        fid = cur.i16()
        if fid == 1 and ftype == _T_BYTE:
            magic = cur.i8()
        elif fid == 2 and ftype == _T_BYTE:
            codec = cur.i8()
        elif fid == 3 and ftype == _T_I32:
            crc = cur.i32()
        elif fid == 4 and ftype == _T_STRING:
            n = cur.i32()
            start = cur.take(n)
            end = start + n
        else:
            cur.skip(ftype)
    cur.at_end()
    if start < 0:
        raise PackError(f"message pack of {len(item)} bytes has no messageList (required field 4)")
    return magic, codec, crc, item, start, end


# -- internals: the message list -----------------------------------------------------

# Messages of up to this many bytes on average are written and read by thriftpy2's
# Cython protocol (less work per message); bigger ones by hand (fewer copies).
_CYTHON_MAX_AVG_WRITE: Final = 512
_CYTHON_MAX_AVG_READ: Final = 2048
# The Cython reader's buffer, below glibc's mmap threshold so it is never a fresh mapping.
_CYTHON_READ_BUFFER: Final = 64 * 1024


def _write_message_list(messages: Sequence[bytes]) -> bytes:
    msgs = messages if type(messages) is list else list(messages)
    if not set(map(type, msgs)) <= {bytes}:
        msgs = [_as_bytes(m, i) for i, m in enumerate(msgs)]
    count = len(msgs)
    size = sum(map(len, msgs)) + 4 * count + _LIST_HEAD_SIZE + 1
    if _HAVE_CYTHON and size <= (_CYTHON_MAX_AVG_WRITE + 4) * count + _LIST_HEAD_SIZE + 1:
        buf = TCyMemoryBuffer(buf_size=size)
        TCyBinaryProtocol(buf).write_struct(_TMessageList(messages=msgs))
        return buf.getvalue()  # type: ignore[no-any-return]
    # One copy: the lengths and messages interleaved, joined in C.
    lengths = map(_I32.pack, map(len, msgs))
    return b"".join(
        chain((_LIST_HEAD, _I32.pack(count)), chain.from_iterable(zip(lengths, msgs, strict=True)), (b"\x00",))
    )


def _as_bytes(message: Any, index: int) -> bytes:
    if isinstance(message, (bytes, bytearray, memoryview)):
        return bytes(message)
    raise TypeError(f"message {index} is {type(message).__name__}, not bytes (use a serde to encode values)")


def _read_message_list(data: bytes, start: int, end: int, trusted: bool) -> list[bytes]:
    """The messages of the TMessageList serialised in ``data[start:end]``."""
    size = end - start
    if (
        trusted
        and _HAVE_CYTHON
        and size > _LIST_HEAD_SIZE
        and data[end - 1] == _T_STOP
        and data[start : start + 4] == _LIST_HEAD
    ):
        count = _I32.unpack_from(data, start + 4)[0]
        room = size - _LIST_HEAD_SIZE - 1 - 4 * count  # bytes for the messages themselves
        if count > 0 and 0 <= room <= _CYTHON_MAX_AVG_READ * count:
            return _read_message_list_cython(data, start, end)
    return _read_message_list_checked(data, start, end)


class _Chunks:
    """The file-like source of a TCyBufferedTransport over ``data[start:end]``."""

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: bytes, start: int, end: int) -> None:
        self.data = data
        self.pos = start
        self.end = end

    def read(self, n: int) -> bytes:
        pos = self.pos
        stop = min(pos + n, self.end)
        self.pos = stop
        return self.data[pos:stop]


def _read_message_list_cython(data: bytes, start: int, end: int) -> list[bytes]:
    # A buffered transport, not TCyMemoryBuffer: the memory buffer does not report a read
    # past its end (it hands out uninitialised bytes), the buffered one raises.
    trans = TCyBufferedTransport(_Chunks(data, start, end), buf_size=_CYTHON_READ_BUFFER)
    obj = _TMessageList()
    try:
        TCyBinaryProtocol(trans, decode_response=False).read_struct(obj)
    except Exception as exc:  # EOF, negative sizes, allocation failures: all mean corrupt
        raise PackError(f"corrupt message list ({end - start} bytes): {type(exc).__name__}: {exc}") from exc
    messages: list[bytes] | None = obj.messages
    return messages if messages is not None else []


def _read_message_list_checked(data: bytes, start: int, end: int) -> list[bytes]:
    """The bounds-checked reader: any layout, unknown fields skipped, never reads past
    ``end``, every loop bounded by the bytes left."""
    cur = _Cursor(data, start, end, "message list")
    messages: list[bytes] = []
    while True:
        ftype = cur.u8()
        if ftype == _T_STOP:
            break
        fid = cur.i16()
        if fid != 1 or ftype != _T_LIST:
            cur.skip(ftype)
            continue
        etype = cur.u8()
        count = cur.i32()
        if etype != _T_STRING:
            raise PackError(f"message list holds elements of Thrift type {etype}, expected {_T_STRING} (binary)")
        pos = cur.pos
        if count < 0 or count * 4 > end - pos:
            raise PackError(f"message list claims {count} messages but only {end - pos} bytes are left (corrupt)")
        messages = []
        append = messages.append
        unpack = _I32.unpack_from
        for i in range(count):
            if pos + 4 > end:
                raise PackError(f"message list truncated at message {i} of {count}")
            n = unpack(data, pos)[0]
            pos += 4
            stop = pos + n
            if n < 0 or stop > end:
                raise PackError(f"message {i} of {count} claims {n} bytes at offset {pos}, {end - pos} left (corrupt)")
            append(data[pos:stop])
            pos = stop
        cur.pos = pos
    cur.at_end()
    return messages


class _Cursor:
    """Bounds-checked reads of Thrift binary values from ``data[pos:end]``."""

    __slots__ = ("data", "end", "pos", "start", "what")

    def __init__(self, data: bytes, start: int, end: int, what: str) -> None:
        self.data = data
        self.start = start
        self.pos = start
        self.end = end
        self.what = what

    def take(self, n: int) -> int:
        """Skip ``n`` bytes; returns where they start."""
        pos = self.pos
        if n < 0 or pos + n > self.end:
            raise PackError(
                f"{self.what} truncated or corrupt: needs {n} bytes at offset {pos - self.start}, {self.end - pos} left"
            )
        self.pos = pos + n
        return pos

    def u8(self) -> int:
        return self.data[self.take(1)]

    def i8(self) -> int:
        b = self.data[self.take(1)]
        return b - 256 if b > 127 else b

    def i16(self) -> int:
        return int(_I16.unpack_from(self.data, self.take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack_from(self.data, self.take(4))[0])

    def skip(self, ttype: int) -> None:
        """Skip a value of Thrift type ``ttype`` (an unknown field), bounded by
        :func:`idl.binary.skip_value`."""
        try:
            self.pos = skip_value(self.data, self.pos, self.end, ttype, _MAX_DEPTH)
        except ThriftBinaryError as exc:
            raise PackError(f"{self.what} corrupt at offset {self.pos - self.start}: {exc}") from None

    def at_end(self) -> None:
        left = self.end - self.pos
        if left:
            raise PackError(f"{self.what} corrupt: {left} bytes after its end")
