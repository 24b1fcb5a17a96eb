"""Message packs: what a producer puts in one queue item, as the clients see them.

The layout (byte-compatible with Java Luxun's ``MessageList``) and its defensive
reader live in :mod:`idl.pack`, shared with the broker; see there for the format.
This module keeps the clients' names and raises the clients'
:class:`~clients.errors.PackError` (same message) where ``idl.pack`` raises its own.

Thread-safety: every function here is pure and may be called from any number of
threads.
"""

from __future__ import annotations

from collections.abc import Sequence

from idl import pack as _pack
from idl.codec import NO_COMPRESSION
from idl.pack import MAGIC, pack_written_parts

from .codec import client_error

__all__ = ["MAGIC", "decode_pack", "encode_pack", "encode_pack_written", "pack_codec", "pack_written_parts"]

_IdlPackError = _pack.PackError


def encode_pack(messages: Sequence[bytes], codec: int = NO_COMPRESSION) -> bytes:
    """One queue item holding ``messages``, compressed with ``codec``.

    Messages must be ``bytes`` (``bytearray`` and ``memoryview`` are copied to bytes;
    anything else is a ``TypeError``). The crc32 field is always filled in.
    Raises :class:`~clients.errors.PackError` for an unknown codec or snappy when it is
    not installed.
    """
    try:
        return _pack.encode_pack(messages, codec)
    except _IdlPackError as exc:
        raise client_error(exc) from exc.__cause__


def encode_pack_written(count: int, written: bytes | bytearray, codec: int = NO_COMPRESSION) -> bytes:
    """:func:`encode_pack` of ``count`` messages already written one after the other as
    ``written``, each as its i32 big-endian length then its bytes (see
    :func:`idl.pack.encode_pack_written`)."""
    try:
        return _pack.encode_pack_written(count, written, codec)
    except _IdlPackError as exc:
        raise client_error(exc) from exc.__cause__


def decode_pack(item: bytes) -> list[bytes]:
    """The messages of one queue item, in order (the inverse of :func:`encode_pack`).

    Checks the magic (must be 1) and the crc32 (unless it is 0, "not set"), decompresses
    per the codec (snappy: xerial framing or a raw block) and raises
    :class:`~clients.errors.PackError` naming the problem for anything malformed.
    """
    try:
        return _pack.decode_pack(item)
    except _IdlPackError as exc:
        raise client_error(exc) from exc.__cause__


def pack_codec(item: bytes) -> int:
    """The codec (``attribute``) of a pack, without decompressing or checking the crc32.

    Raises :class:`~clients.errors.PackError` if ``item`` is not a pack of magic 1.
    """
    try:
        return _pack.pack_codec(item)
    except _IdlPackError as exc:
        raise client_error(exc) from exc.__cause__
