"""The compression codecs of message-pack payloads (kept apart from the pack format, as
kafka-python keeps ``codec.py``).

Compression of the payload:

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

Every error is a :class:`~clients.errors.PackError` naming what is wrong.

Thread-safety: pure functions, callable from any number of threads.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Final

from .errors import PackError

try:  # snappy is an optional codec
    import snappy as _snappy  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - depends on the environment
    _snappy = None

__all__ = [
    "CODEC_NAMES",
    "GZIP",
    "NO_COMPRESSION",
    "SNAPPY",
    "compress",
    "decompress",
    "snappy_available",
    "unknown_codec",
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


def compress(payload: bytes, codec: int) -> bytes:
    """``payload`` compressed as a pack's payload is for ``codec`` (0 returns it as is)."""
    if codec == NO_COMPRESSION:
        return bytes(payload)
    if codec == GZIP:
        return zlib.compress(payload, _GZIP_LEVEL, wbits=31)  # wbits 31: a gzip stream
    if codec == SNAPPY:
        return _xerial_compress(_require_snappy("compress"), payload)
    raise unknown_codec(codec)


def decompress(payload: bytes | memoryview, codec: int) -> bytes:
    """The inverse of :func:`compress`; :class:`PackError` if ``payload`` is corrupt."""
    if codec == NO_COMPRESSION:
        return bytes(payload)
    return _decompress(memoryview(payload), codec)


def snappy_available() -> bool:
    """Whether the snappy codec can be used (python-snappy is installed)."""
    return _snappy is not None and hasattr(_snappy, "compress") and hasattr(_snappy, "decompress")


def unknown_codec(codec: Any) -> PackError:
    """The error for a codec that is not 0, 1 or 2."""
    return PackError(f"unknown compression codec {codec!r} (known: 0 none, 1 gzip, 2 snappy)")


def _decompress(payload: memoryview, codec: int) -> bytes:
    if codec == GZIP:
        return _gunzip(payload)
    if codec == SNAPPY:
        lib = _require_snappy("decompress")
        if payload[:8].tobytes() == _XERIAL_MAGIC:
            return _xerial_decompress(lib, payload)
        return _snappy_block(lib, payload, "raw snappy payload")
    raise unknown_codec(codec)


def _gunzip(payload: memoryview) -> bytes:
    """A gzip stream's content; further members are read on, as GZIPInputStream does."""
    out = []
    data: bytes | memoryview = payload
    while True:
        inflater = zlib.decompressobj(31)  # wbits 31: gzip header and trailer (CRC-32, length) checked
        try:
            out.append(inflater.decompress(data))
        except zlib.error as exc:
            raise PackError(f"corrupt gzip payload ({len(payload)} bytes): {exc}") from exc
        if not inflater.eof:
            raise PackError(f"gzip payload truncated ({len(payload)} bytes)")
        data = inflater.unused_data
        if not data:
            return out[0] if len(out) == 1 else b"".join(out)


def _require_snappy(action: str) -> Any:
    if not snappy_available():
        raise PackError(f"cannot {action} a snappy payload: python-snappy is not installed (pip install python-snappy)")
    return _snappy


def _snappy_block(lib: Any, block: memoryview, what: str) -> bytes:
    try:
        return bytes(lib.decompress(block))
    except Exception as exc:  # python-snappy raises UncompressError, cramjam its own errors
        raise PackError(f"corrupt {what} ({len(block)} bytes): {type(exc).__name__}: {exc}") from exc


def _xerial_compress(lib: Any, data: bytes) -> bytes:
    parts = [_XERIAL_HEADER]
    view = memoryview(data)
    pack_i32 = _I32.pack
    for start in range(0, len(data), _XERIAL_BLOCK_SIZE):
        block = lib.compress(view[start : start + _XERIAL_BLOCK_SIZE])
        parts.append(pack_i32(len(block)))
        parts.append(block)
    return b"".join(parts)


def _xerial_decompress(lib: Any, data: memoryview) -> bytes:
    size = len(data)
    out: list[bytes] = []
    pos = 0
    while pos < size:
        if data[pos : pos + 8].tobytes() == _XERIAL_MAGIC:  # the stream header (again, if streams were concatenated)
            if pos + _XERIAL_HEADER_SIZE > size:
                raise PackError(f"snappy payload truncated in its stream header at offset {pos}")
            version = _I32.unpack_from(data, pos + 8)[0]
            if version < _XERIAL_COMPATIBLE_VERSION:
                raise PackError(f"snappy stream version {version} is not supported (needs >= 1)")
            pos += _XERIAL_HEADER_SIZE
            continue
        if pos + 4 > size:
            raise PackError(f"snappy payload truncated: {size - pos} bytes where a block length belongs")
        n = _I32.unpack_from(data, pos)[0]
        pos += 4
        if n <= 0 or pos + n > size:
            raise PackError(f"snappy block at offset {pos - 4} claims {n} bytes, {size - pos} left (corrupt)")
        out.append(_snappy_block(lib, data[pos : pos + n], f"snappy block at offset {pos - 4}"))
        pos += n
    return b"".join(out)
