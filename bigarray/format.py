"""The on-disk format of a big array, declared once.

Compatible with bigqueue 0.7.2 (the storage of Java Luxun): a directory written by
one opens in the other. All integers are big-endian.

Layout of an array directory ``<path>/``::

    index/page-<N>.dat        index pages; item i lives in page i >> 17
    data/page-<N>.dat         data pages; N increases monotonically
    meta_data/page-0.dat      16 bytes: head i64 (next index), tail i64 (first index)
    front_index_<group>/page-0.dat   8 bytes: the group's next index (FanoutQueue)
    committed_<group>/page-0.dat     32 bytes: the group's committed index i64 at 0
                              (FanoutQueue.commit), then the committed record offset + 1
                              i64 at 8 (0: committed without an offset), then the
                              committed message position in the item at the index i64
                              at 16 (0: the whole item is still to read), then the
                              committed leader epoch + 1 i64 at 24 (0: none; Kafka's
                              OffsetCommit v6+); written in one copy; only for groups
                              that commit; bigqueue and Java Luxun never look. A shorter
                              page (8 bytes, written before offsets existed; 16, before
                              message positions; 24, before leader epochs) is extended
                              with zeros when opened: what it held, with no offset,
                              message 0 and no leader epoch.
    bigarray.json             our extras (format version, data page size); Java ignores it

Index item, 32 bytes::

    data page number i64 | offset in page i32 | length i32 | append time ms i64 | aux u64

Record offsets (``aux``, the last 8 bytes, zero in bigqueue's own items). An item
holds one or more *records* (a Kafka record batch is stored as one item), numbered
consecutively from 0 across the array: item i holds records
[first_offset(i), end_offset(i)), first_offset(i) = end_offset(i - 1) (0 for item 0).
``aux`` is 0, or ``(kind << 56) | end_offset`` with end_offset (56 bits, >= 1) the
offset after the item's last record and kind (0..255) a tag the caller chooses
(luxun: 0 a plain Luxun item, 1 a Kafka record batch). ``aux == 0`` means one record
and end_offset(i) = i + 1: every item Java Luxun, bigqueue or bigarray before offsets
wrote. The writer writes 0 exactly when kind is 0, the item holds one record and no
item so far held more than one (next offset == the item's index), so an array that
never sees a count or a kind stays byte-for-byte bigqueue's. Once an item held more
records, every later item carries its full ``aux``. End offsets increase strictly
(recovery treats an item breaking that as damage). The next offset is not stored: on
open it is end_offset(head - 1). Retention keeps the index item of tail - 1 (index
pages are deleted only when every item in them is below tail - 1) so that
first_offset(tail) can be read; where it is gone anyway (an array trimmed by Java),
first_offset(tail) is taken as end_offset(tail) - 1 (Java writes one record per item).

What survives a crash: an append copies the data, then writes the index item, then
advances head in the meta page. Head is the commit point and readers never look past
it, so after ``kill -9`` every append that returned is intact (the kernel keeps the
dirty mapped pages). Nothing is rebuilt from scratch: on open, the items just below
head are checked (index page present, data page present, offset and length inside the
page, items laid out back to back) and head is rolled back to the last valid item.
The writer's position (data page and offset) is derived from the item at head - 1.

Disk space (see :mod:`bigarray.page`): every page file has its full size (data pages
``data_page_size``, index pages 4 MiB) from the moment it is created, so any mapping of
it, ours or Java's ``FileChannel.map(READ_WRITE, 0, pageSize)``, sees the whole page.
Index and data page files are created *sparse* (``ftruncate``) and blocks are reserved
(``posix_fallocate``) in steps ahead of the writer: before an append copies a byte past
the reserved end of its page, the page is reserved up to past that byte (256 KiB
first, then doubling what the page holds, at most ``reserve_step``, 4 MiB by default).
The read-ahead of the next data page (when the writer passes an eighth of its page)
and of the next index page (half way) creates that page sparse and reserves its first
step only. A full disk therefore raises ``DiskFullError`` from a reservation, before
any byte lands in unreserved space (which would be a SIGBUS), at a step boundary
inside a page or when a page is created. A topic holding a few small items takes about
half a MiB (two first steps plus the 4 KiB meta and group pages), a busy one what it
holds plus at most one step ahead in its index and data pages and the first step of
the next data page. The meta and group pages are
allocated whole when created. Holes read as zeros, for bigqueue too; a page written by
Java (sparse as well on JDK 11+, or fully allocated) is read and appended to as it is.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

#: Bytes per index item.
INDEX_ITEM_SIZE = 32
#: log2 of the number of index items in one index page.
INDEX_ITEMS_PER_PAGE_BITS = 17
#: Index items per index page (131072).
INDEX_ITEMS_PER_PAGE = 1 << INDEX_ITEMS_PER_PAGE_BITS
#: Mask giving an index's slot within its index page.
INDEX_SLOT_MASK = INDEX_ITEMS_PER_PAGE - 1
#: Size of an index page file (4 MiB).
INDEX_PAGE_SIZE = INDEX_ITEM_SIZE * INDEX_ITEMS_PER_PAGE

#: Java Luxun's default data page size (128 MiB).
DEFAULT_DATA_PAGE_SIZE = 128 * 1024 * 1024
#: Smallest data page we accept (tests use small pages to cross boundaries often).
MIN_DATA_PAGE_SIZE = 4096
#: Largest data page: offsets and lengths are signed 32-bit in the index item.
MAX_DATA_PAGE_SIZE = (1 << 31) - 1

#: Meta page: head i64 at 0, tail i64 at 8.
META_PAGE_SIZE = 16
META_HEAD_OFFSET = 0
META_TAIL_OFFSET = 8

#: A fanout group's front index page: next index i64 at 0.
FRONT_PAGE_SIZE = 8

INDEX_DIR = "index"
DATA_DIR = "data"
META_DIR = "meta_data"
FRONT_DIR_PREFIX = "front_index_"
#: A fanout group's committed position (at-least-once groups): index i64 at 0,
#: record offset + 1 i64 at 8 (0: no offset committed), message position in the item
#: at the index i64 at 16 (0: none of its messages committed), leader epoch + 1 i64 at
#: 24 (0: none committed).
COMMITTED_DIR_PREFIX = "committed_"
COMMITTED_PAGE_SIZE = 32
COMMITTED_INDEX_OFFSET = 0
COMMITTED_RECORD_OFFSET = 8
COMMITTED_MESSAGE_OFFSET = 16
COMMITTED_EPOCH_OFFSET = 24
EXTRAS_FILE = "bigarray.json"
FORMAT_VERSION = 1

PAGE_FILE_PREFIX = "page-"
PAGE_FILE_SUFFIX = ".dat"

#: numpy view of an index page (one record per index item).
INDEX_DTYPE = np.dtype(
    [
        ("page", ">i8"),
        ("offset", ">i4"),
        ("length", ">i4"),
        ("timestamp", ">i8"),
        ("aux", ">u8"),
    ]
)
assert INDEX_DTYPE.itemsize == INDEX_ITEM_SIZE

#: struct format of the first 24 bytes of an index item.
INDEX_ITEM_STRUCT = ">qiiq"
#: struct format of a whole index item (the first 24 bytes, then aux).
INDEX_ITEM_AUX_STRUCT = ">qiiqQ"
#: Byte offset of aux in an index item.
INDEX_AUX_OFFSET = 24
#: Bits of aux holding the end offset; the kind is above them.
OFFSET_BITS = 56
#: Mask of the end offset in aux.
OFFSET_MASK = (1 << OFFSET_BITS) - 1
#: Largest end offset aux can hold.
MAX_END_OFFSET = OFFSET_MASK
#: Largest item kind.
MAX_KIND = 255


def page_file_name(page_no: int) -> str:
    """Return the file name of page ``page_no`` (``page-<N>.dat``)."""
    return f"{PAGE_FILE_PREFIX}{page_no}{PAGE_FILE_SUFFIX}"


def parse_page_file_name(name: str) -> int | None:
    """Return the page number of a page file name, or None if it is not one."""
    if not (name.startswith(PAGE_FILE_PREFIX) and name.endswith(PAGE_FILE_SUFFIX)):
        return None
    digits = name[len(PAGE_FILE_PREFIX) : -len(PAGE_FILE_SUFFIX)]
    if not digits.isdigit():
        return None
    return int(digits)


class IndexItem(NamedTuple):
    """One index item, as :data:`INDEX_ITEM_STRUCT` unpacks it."""

    #: Data page number holding the item.
    page: int
    #: Byte offset of the item in its data page.
    offset: int
    #: Length of the item in bytes.
    length: int
    #: Append time, ms since the epoch (>= 1; 0 marks a record never written).
    timestamp: int


def index_page_of(index: int) -> int:
    """Index page number holding array index ``index``."""
    return index >> INDEX_ITEMS_PER_PAGE_BITS


def index_slot(index: int) -> int:
    """Slot (item number) of array index ``index`` inside its index page."""
    return index & INDEX_SLOT_MASK


def index_slot_offset(index: int) -> int:
    """Byte offset of array index ``index``'s item inside its index page."""
    return (index & INDEX_SLOT_MASK) * INDEX_ITEM_SIZE


def first_index_of_page(page_no: int) -> int:
    """The first array index held by index page ``page_no``."""
    return page_no << INDEX_ITEMS_PER_PAGE_BITS


def slots_left_in_page(index: int) -> int:
    """How many index items fit in ``index``'s index page from ``index`` on."""
    return INDEX_ITEMS_PER_PAGE - (index & INDEX_SLOT_MASK)


def pack_aux(kind: int, end_offset: int) -> int:
    """The aux of an item of kind ``kind`` whose records end at ``end_offset``."""
    return (kind << OFFSET_BITS) | end_offset


def end_offset_of(index: int, aux: int) -> int:
    """End offset (the offset after its last record) of item ``index`` whose aux is ``aux``."""
    return index + 1 if aux == 0 else aux & OFFSET_MASK


def kind_of(aux: int) -> int:
    """Kind of an item whose aux is ``aux`` (0 for aux 0)."""
    return aux >> OFFSET_BITS
