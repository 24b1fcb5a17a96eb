"""Message packs (what a producer puts in one queue item) and value serdes: the public
names of three modules, kept importable from here.

- :mod:`clients.pack`: the pack format (``encode_pack``, ``decode_pack``, ``pack_codec``,
  ``MAGIC``), byte-compatible with Java Luxun, with its defensive reader (both kept in
  :mod:`idl.pack`, shared with the broker);
- :mod:`clients.codec`: the payload codecs (``NO_COMPRESSION``, ``GZIP``, ``SNAPPY``,
  ``compress``, ``decompress``, ``snappy_available``; kept in :mod:`idl.codec`);
- :mod:`clients.serde`: value serdes (``Serde``, ``BytesSerde``, ``StrSerde``,
  ``JsonSerde``, ``SERDES``, ``get_serde``);
- :class:`~clients.errors.PackError`: a corrupt pack or an unusable codec.
"""

from __future__ import annotations

from .codec import GZIP, NO_COMPRESSION, SNAPPY, compress, decompress, snappy_available
from .errors import PackError
from .pack import MAGIC, decode_pack, encode_pack, pack_codec
from .serde import SERDES, BytesSerde, JsonSerde, Serde, StrSerde, get_serde

__all__ = [
    "GZIP",
    "MAGIC",
    "NO_COMPRESSION",
    "SERDES",
    "SNAPPY",
    "BytesSerde",
    "JsonSerde",
    "PackError",
    "Serde",
    "StrSerde",
    "compress",
    "decode_pack",
    "decompress",
    "encode_pack",
    "get_serde",
    "pack_codec",
    "snappy_available",
]
