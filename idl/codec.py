"""The compression codecs of message-pack payloads, and snappy-java's stream framing.

Compression of a pack's payload (``TMessagePack.attribute``, see :mod:`idl.pack`):

- ``NO_COMPRESSION`` (0): the serialised ``TMessageList`` as is.
- ``GZIP`` (1): one gzip stream (what ``java.util.zip.GZIPOutputStream`` writes; level 6
  as Java's default). Readers accept concatenated members, as ``GZIPInputStream`` does.
  gzip carries its own CRC-32 of the uncompressed bytes.
- ``SNAPPY`` (2): snappy-java's ``SnappyOutputStream`` stream framing ("xerial"): a
  16-byte header ``82 'SNAPPY' 00`` + i32 version 1 + i32 compatible version 1, then
  blocks of [i32 compressed length][raw snappy block], each block holding at most
  32 KiB of input. Readers also accept a bare raw snappy block (``Snappy.compress``),
  as snappy-java's ``SnappyInputStream`` does when the header is missing, and a header
  repeated between blocks (concatenated streams). No checksum.

The xerial framing is also how the Java Kafka client and librdkafka frame snappy record
batches: the broker reads those with :func:`unsnappy` too (``luxun.records``).

Reading is bounded when asked: :func:`unsnappy` and :func:`decompress` take
``max_bytes`` and refuse, with :class:`TooLargeError`, a snappy payload whose blocks
*declare* more output than that, before decompressing the block that would cross it.

Errors: every failure is a :class:`CodecError` (a ``ValueError``) naming what is wrong;
the users translate it into their own (:mod:`idl.pack`: ``idl.pack.PackError``; the
clients: ``clients.errors.PackError``; the broker: ``BatchError(CORRUPT_MESSAGE)``).

Thread-safety: pure functions, callable from any number of threads.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Final

try:  # snappy is an optional codec for clients (the broker requires python-snappy)
    import snappy as _snappy  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - depends on the environment
    _snappy = None

__all__ = [
    "CODEC_NAMES",
    "GZIP",
    "NO_COMPRESSION",
    "SNAPPY",
    "CodecError",
    "TooLargeError",
    "compress",
    "decompress",
    "snappy_available",
    "unknown_codec",
    "unsnappy",
    "xerial_compress",
]

#: CompressionCodec values (``TMessagePack.attribute``).
NO_COMPRESSION: Final = 0
GZIP: Final = 1
SNAPPY: Final = 2
#: Short names of the codecs (in messages).
CODEC_NAMES: Final = {NO_COMPRESSION: "none", GZIP: "gzip", SNAPPY: "snappy"}

_I32: Final = struct.Struct(">i")

# snappy-java's SnappyOutputStream framing.
_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_VERSION: Final = 1
_XERIAL_COMPATIBLE_VERSION: Final = 1
_XERIAL_HEADER: Final = _XERIAL_MAGIC + struct.pack(">ii", _XERIAL_VERSION, _XERIAL_COMPATIBLE_VERSION)
_XERIAL_HEADER_SIZE: Final = len(_XERIAL_HEADER)  # 16
_XERIAL_BLOCK_SIZE: Final = 32 * 1024  # snappy-java's default block size

#: gzip level: Java's ``GZIPOutputStream`` uses zlib's default (6).
_GZIP_LEVEL: Final = 6


class CodecError(ValueError):
    """A compressed payload that does not decompress (corrupt, truncated), an unknown
    codec, or a codec that cannot be used (snappy not installed)."""


class TooLargeError(CodecError):
    """A payload that would decompress to more than ``limit`` bytes (refused unread)."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


def compress(payload: bytes, codec: int) -> bytes:
    """``payload`` compressed as a pack's payload is for ``codec`` (0 returns it as is)."""
    if codec == NO_COMPRESSION:
        return bytes(payload)
    if codec == GZIP:
        return zlib.compress(payload, _GZIP_LEVEL, wbits=31)  # wbits 31: a gzip stream
    if codec == SNAPPY:
        return xerial_compress(payload)
    raise unknown_codec(codec)


def decompress(payload: bytes | memoryview, codec: int, max_bytes: int | None = None) -> bytes:
    """The inverse of :func:`compress`; :class:`CodecError` if ``payload`` is corrupt.

    ``max_bytes`` bounds snappy's output (see :func:`unsnappy`); None: no bound.
    """
    if codec == NO_COMPRESSION:
        return bytes(payload)
    if codec == GZIP:
        return _gunzip(memoryview(payload))
    if codec == SNAPPY:
        return unsnappy(memoryview(payload), max_bytes)
    raise unknown_codec(codec)


def snappy_available() -> bool:
    """Whether the snappy codec can be used (python-snappy is installed)."""
    return _snappy is not None and hasattr(_snappy, "compress") and hasattr(_snappy, "decompress")


def unknown_codec(codec: Any) -> CodecError:
    """The error for a codec that is not 0, 1 or 2."""
    return CodecError(f"unknown compression codec {codec!r} (known: 0 none, 1 gzip, 2 snappy)")


def xerial_compress(data: bytes | bytearray | memoryview) -> bytes:
    """``data`` as snappy-java's ``SnappyOutputStream`` writes it: the 16-byte header,
    then one [i32 length][raw snappy block] per 32 KiB of input (just the header for
    no input)."""
    lib = _require_snappy("compress")
    parts = [_XERIAL_HEADER]
    view = memoryview(data)
    pack_i32 = _I32.pack
    for start in range(0, len(view), _XERIAL_BLOCK_SIZE):
        block = lib.compress(view[start : start + _XERIAL_BLOCK_SIZE])
        parts.append(pack_i32(len(block)))
        parts.append(block)
    return b"".join(parts)


def unsnappy(data: bytes | memoryview, max_bytes: int | None = None) -> bytes:
    """The content of a snappy payload: xerial-framed (headers may repeat between
    blocks: concatenated streams) or, without the xerial magic, one raw snappy block.

    With ``max_bytes``, a payload whose blocks declare more output than that in all is
    refused with :class:`TooLargeError` before the block that crosses the bound is
    decompressed (each block's output length is read from its own preamble). Never
    reads past ``data``. Raises :class:`CodecError` naming what is wrong.
    """
    lib = _require_snappy("decompress")
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view[:8].tobytes() != _XERIAL_MAGIC:
        if max_bytes is not None:
            _check_declared(view, "raw snappy payload", max_bytes, max_bytes)
        return _snappy_block(lib, view, "raw snappy payload")
    size = len(view)
    out: list[bytes] = []
    left = 0 if max_bytes is None else max_bytes  # output still allowed
    pos = 0
    while pos < size:
        if view[pos : pos + 8].tobytes() == _XERIAL_MAGIC:  # the stream header (again, if streams were concatenated)
            if pos + _XERIAL_HEADER_SIZE > size:
                raise CodecError(f"snappy payload truncated in its stream header at offset {pos}")
            version = _I32.unpack_from(view, pos + 8)[0]
            if version < _XERIAL_COMPATIBLE_VERSION:
                raise CodecError(f"snappy stream version {version} is not supported (needs >= 1)")
            pos += _XERIAL_HEADER_SIZE
            continue
        if pos + 4 > size:
            raise CodecError(f"snappy payload truncated: {size - pos} bytes where a block length belongs")
        n = _I32.unpack_from(view, pos)[0]
        pos += 4
        if n <= 0 or pos + n > size:
            raise CodecError(f"snappy block at offset {pos - 4} claims {n} bytes, {size - pos} left (corrupt)")
        block = view[pos : pos + n]
        what = f"snappy block at offset {pos - 4}"
        if max_bytes is not None:
            left -= _check_declared(block, what, left, max_bytes)
        out.append(_snappy_block(lib, block, what))
        pos += n
    return b"".join(out)


# -- internals -------------------------------------------------------------------------


def _gunzip(payload: memoryview) -> bytes:
    """A gzip stream's content; further members are read on, as GZIPInputStream does."""
    out = []
    data: bytes | memoryview = payload
    while True:
        inflater = zlib.decompressobj(31)  # wbits 31: gzip header and trailer (CRC-32, length) checked
        try:
            out.append(inflater.decompress(data))
        except zlib.error as exc:
            raise CodecError(f"corrupt gzip payload ({len(payload)} bytes): {exc}") from exc
        if not inflater.eof:
            raise CodecError(f"gzip payload truncated ({len(payload)} bytes)")
        data = inflater.unused_data
        if not data:
            return out[0] if len(out) == 1 else b"".join(out)


def _require_snappy(action: str) -> Any:
    if not snappy_available():
        raise CodecError(
            f"cannot {action} a snappy payload: python-snappy is not installed (pip install python-snappy)"
        )
    return _snappy


def _check_declared(block: memoryview, what: str, left: int, max_bytes: int) -> int:
    """The output length raw snappy ``block`` declares, if at most ``left`` (what is
    left of ``max_bytes``); else :class:`TooLargeError`, the block unread."""
    declared = _declared_length(block)
    if declared is None:
        raise CodecError(f"corrupt {what} ({len(block)} bytes): no valid length preamble")
    if declared > left:
        raise TooLargeError(
            f"snappy output passes the {max_bytes}-byte limit: {what} declares {declared} bytes, {left} are left",
            max_bytes,
        )
    return declared


def _snappy_block(lib: Any, block: memoryview, what: str) -> bytes:
    """One raw snappy block, decompressed."""
    try:
        return bytes(lib.decompress(block))
    except Exception as exc:  # python-snappy raises UncompressError, cramjam its own errors
        raise CodecError(f"corrupt {what} ({len(block)} bytes): {type(exc).__name__}: {exc}") from exc


def _declared_length(block: memoryview) -> int | None:
    """The uncompressed length a raw snappy block declares (its leading varint of at
    most 5 bytes), or None when there is no valid one."""
    n = shift = 0
    for i in range(min(5, len(block))):
        b = block[i]
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n
        shift += 7
    return None
