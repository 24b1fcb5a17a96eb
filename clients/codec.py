"""The compression codecs of message-pack payloads, as the clients see them.

The codecs themselves (gzip as Java's ``GZIPOutputStream`` writes it, snappy in
snappy-java's xerial stream framing or as one raw block) live in :mod:`idl.codec`,
shared with the broker; see there for the formats. This module keeps the clients'
names and raises the clients' :class:`~clients.errors.PackError` (same message) where
``idl.codec`` raises its ``CodecError``.

Thread-safety: pure functions, callable from any number of threads.
"""

from __future__ import annotations

from typing import Any

from idl import codec as _codec
from idl.codec import CODEC_NAMES, GZIP, NO_COMPRESSION, SNAPPY, CodecError, snappy_available

from .errors import PackError

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


def compress(payload: bytes, codec: int) -> bytes:
    """``payload`` compressed as a pack's payload is for ``codec`` (0 returns it as is)."""
    try:
        return _codec.compress(payload, codec)
    except CodecError as exc:
        raise client_error(exc) from exc.__cause__


def decompress(payload: bytes | memoryview, codec: int, max_bytes: int | None = None) -> bytes:
    """The inverse of :func:`compress`; :class:`PackError` if ``payload`` is corrupt.

    ``max_bytes`` bounds snappy's output, checked before decompressing (None: no bound).
    """
    try:
        return _codec.decompress(payload, codec, max_bytes)
    except CodecError as exc:
        raise client_error(exc) from exc.__cause__


def unknown_codec(codec: Any) -> PackError:
    """The error for a codec that is not 0, 1 or 2."""
    return client_error(_codec.unknown_codec(codec))


def client_error(exc: ValueError) -> PackError:
    """``idl``'s error (``CodecError``, ``idl.pack.PackError``) as the clients'
    :class:`PackError`: same message, its traceback kept (raise it ``from exc.__cause__``)."""
    return PackError(*exc.args).with_traceback(exc.__traceback__)
