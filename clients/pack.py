"""Message packs: what a producer puts in one queue item, as the clients see them.

The layout (byte-compatible with Java Luxun's ``MessageList``) and its defensive
reader live in :mod:`idl.pack`, shared with the broker; see there for the format.
This module keeps the clients' names and raises the clients'
:class:`~clients.errors.PackError` (same message) where ``idl.pack`` raises its own.

Thread-safety: every function here is pure and may be called from any number of
threads.
"""

from __future__ import annotations

from idl import pack as _pack
from idl.pack import MAGIC, pack_written_parts

from .codec import client_errors

__all__ = [
    "MAGIC",
    "decode_pack",
    "encode_pack",
    "encode_pack_written",
    "pack_codec",
    "pack_rest",
    "pack_written_parts",
]

#: One queue item holding ``messages`` (``bytes``; ``bytearray`` and ``memoryview`` are
#: copied), compressed with ``codec``, the crc32 filled in; :class:`~clients.errors.PackError`
#: for an unknown codec or snappy when it is not installed.
encode_pack = client_errors(_pack.encode_pack)
#: :func:`encode_pack` of ``count`` messages already written one after the other as
#: ``written``, each as its i32 big-endian length then its bytes.
encode_pack_written = client_errors(_pack.encode_pack_written)
#: The messages of one queue item, in order (the inverse of :func:`encode_pack`): checks
#: the magic (1) and the crc32 (unless 0, "not set"), decompresses per the codec (snappy:
#: xerial framing or a raw block); :class:`~clients.errors.PackError` naming the problem
#: for anything malformed.
decode_pack = client_errors(_pack.decode_pack)
#: The codec of a pack, without decompressing or checking the crc32;
#: :class:`~clients.errors.PackError` if ``item`` is not a pack of magic 1.
pack_codec = client_errors(_pack.pack_codec)
#: ``item`` without its first ``skip`` messages, re-encoded in its own codec (``item``
#: itself when ``skip`` <= 0); :class:`~clients.errors.PackError` if it is not a pack.
pack_rest = client_errors(_pack.pack_rest)
