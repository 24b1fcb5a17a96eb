"""The structs and shifts that read and write index items and meta cells in place.

One home for the byte-level helpers of :mod:`bigarray.format` that the hot paths of
:class:`bigarray.BigArray` (append, get, the small reads) and of
:class:`bigarray.FanoutQueue` (dequeue) use as module globals: a function call such as
``fmt.index_slot_offset(i)`` costs more there than the rest of the lookup, so those
paths write ``(i & SLOT_MASK) << SLOT_BITS`` with these constants and call the bound
``unpack_from`` / ``pack_into`` of these structs directly. Everywhere else uses the
``fmt`` helpers. Nothing here changes the bytes: an index item is
``page i64 | offset i32 | length i32 | timestamp i64 | aux u64``, big-endian.
"""

from __future__ import annotations

import ctypes
import functools
import struct
from collections.abc import Callable

from . import format as fmt
from .format import IndexItem

#: Index page of array index i: ``i >> PAGE_BITS`` (fmt.index_page_of).
PAGE_BITS = fmt.INDEX_ITEMS_PER_PAGE_BITS
#: Slot of array index i in its index page: ``i & SLOT_MASK`` (fmt.index_slot).
SLOT_MASK = fmt.INDEX_SLOT_MASK
#: Byte offset of index i's item in its page: ``(i & SLOT_MASK) << SLOT_BITS``
#: (fmt.index_slot_offset).
SLOT_BITS = fmt.INDEX_ITEM_SIZE.bit_length() - 1
assert 1 << SLOT_BITS == fmt.INDEX_ITEM_SIZE
#: Byte offset of aux in an index item.
AUX_OFFSET = fmt.INDEX_AUX_OFFSET
#: Mask of the end offset in aux.
OFFSET_MASK = fmt.OFFSET_MASK

#: A big-endian i64 (meta page head and tail, a group's front index).
I64 = struct.Struct(">q")
#: The meta page: head i64, tail i64.
HEAD_TAIL = struct.Struct(">qq")
#: The first 24 bytes of an index item: (page, offset, length, timestamp).
unpack_index_item = struct.Struct(fmt.INDEX_ITEM_STRUCT).unpack_from
#: The data page, offset and length of an index item (what get() needs).
unpack_item_place = struct.Struct(fmt.INDEX_ITEM_STRUCT[:-1]).unpack_from
#: An aux field (read at ``slot offset + AUX_OFFSET``).
unpack_u64 = struct.Struct(">Q").unpack_from
#: Pack a whole index item: with its aux, or with 8 zero bytes (cheaper than packing a 0).
#: Every append writes all 32 bytes: slots past head may hold stale bytes (of items
#: dropped by recovery, or of a batch that failed).
pack_index_item = struct.Struct(fmt.INDEX_ITEM_AUX_STRUCT).pack_into
pack_plain_index_item = struct.Struct(fmt.INDEX_ITEM_STRUCT + "8x").pack_into
#: An i64 cell written as one ctypes big-endian int64 over a mapping (head in the meta
#: page, a group's position): a store costs about a third of ``struct.pack_into``, which
#: parses its buffer argument with a format string on every call.
BE_I64: type[ctypes.c_int64] = ctypes.c_int64.__ctype_be__
#: An IndexItem from the tuple struct unpacks (C calls only: no Python-level __new__).
index_item_of: Callable[[tuple[int, int, int, int]], IndexItem] = functools.partial(tuple.__new__, IndexItem)
