"""The on-disk format, checked against the documented layout (bigqueue 0.7.2) with
plain struct/open code, in both directions:

(a) a directory built byte by byte, as Java writes it (no bigarray.json), opens;
(b) what our writer produces parses by hand into the documented fields.
"""

from __future__ import annotations

import json
import os
import struct

import pytest

from bigarray import BigArray, FanoutQueue

from ._util import FakeClock, page_files

pytestmark = pytest.mark.timeout(60)

INDEX_ITEM = struct.Struct(">qiiq8x")  # data page, offset, length, timestamp ms, 8 zero bytes
assert INDEX_ITEM.size == 32
ITEMS_PER_INDEX_PAGE = 1 << 17
INDEX_PAGE_SIZE = 32 * ITEMS_PER_INDEX_PAGE  # 4 MiB
META = struct.Struct(">qq")  # head, tail
FRONT = struct.Struct(">q")


def write_java_array(path, data_page_size, pages, *, tail=0, groups=None, gap=0):
    """Write an array directory the way Java bigqueue 0.7.2 lays it out.

    ``pages`` is a list of data pages, each a list of (item bytes, timestamp ms);
    items are packed back to back from offset 0 of their page (with ``gap`` unused
    bytes after each, which no writer leaves but a reader must not assume away).
    Returns the flat list of (item, timestamp).
    """
    os.makedirs(path / "index")
    os.makedirs(path / "data")
    os.makedirs(path / "meta_data")
    flat = []
    index = bytearray(INDEX_PAGE_SIZE)
    for page_no, page_items in enumerate(pages):
        blob = bytearray(data_page_size)
        off = 0
        for item, ts in page_items:
            blob[off : off + len(item)] = item
            INDEX_ITEM.pack_into(index, len(flat) * 32, page_no, off, len(item), ts)
            flat.append((item, ts))
            off += len(item) + gap
        assert off <= data_page_size
        with open(path / "data" / f"page-{page_no}.dat", "wb") as f:
            f.write(blob)
    with open(path / "index" / "page-0.dat", "wb") as f:
        f.write(index)
    with open(path / "meta_data" / "page-0.dat", "wb") as f:
        f.write(META.pack(len(flat), tail))
    for name, pos in (groups or {}).items():
        os.makedirs(path / f"front_index_{name}")
        with open(path / f"front_index_{name}" / "page-0.dat", "wb") as f:
            f.write(FRONT.pack(pos))
    return flat


def java_fixture(path):
    page_size = 8192
    pages = [
        [(b"first", 1_600_000_000_000), (b"\x00\xff" * 100, 1_600_000_000_500), (b"A" * 7000, 1_600_000_001_000)],
        [(b"B" * 8192, 1_600_000_002_000)],
        [(b"", 1_600_000_003_000), (b"last item", 1_600_000_004_000)],
    ]
    return write_java_array(path, page_size, pages, groups={"readers": 2, "other": 0})


def test_opens_a_java_written_array(tmp_path):
    path = tmp_path / "topic"
    flat = java_fixture(path)
    assert not (path / "bigarray.json").exists()
    with BigArray(path) as arr:
        assert arr.data_page_size == 8192  # taken from the existing data page
        assert (arr.tail, arr.head) == (0, len(flat))
        assert [arr.get(i) for i in range(len(flat))] == [item for item, _ in flat]
        assert arr.read_range(0) == [item for item, _ in flat]
        assert [arr.timestamp(i) for i in range(len(flat))] == [ts for _, ts in flat]
        assert [arr.item_length(i) for i in range(len(flat))] == [len(item) for item, _ in flat]
        assert arr.find_closest_index(1_600_000_001_900) == 3
        # appends continue after the last item, in the same page as Java left it
        assert arr.append(b"python") == len(flat)
        assert arr.get(len(flat)) == b"python"
    raw = (path / "index" / "page-0.dat").read_bytes()
    page, off, length, _ = INDEX_ITEM.unpack_from(raw, len(flat) * 32)
    assert (page, off, length) == (2, len(b"last item"), 6)
    assert json.loads((path / "bigarray.json").read_text())["data_page_size"] == 8192


@pytest.mark.parametrize("gap", [0, 3])
def test_read_range_blob_matches_read_range(tmp_path, gap):
    path = tmp_path / "topic"
    pages = [
        [(b"first", 1), (b"\x00\xff" * 100, 2), (b"A" * 5000, 3)],
        [(b"B" * 8000, 4)],
        [(b"", 5), (b"x", 6), (b"last item", 7)],
    ]
    flat = write_java_array(path, 8192, pages, gap=gap)
    with BigArray(path) as arr:
        for start in range(len(flat)):
            for kw in ({}, {"max_bytes": 5300}, {"max_items": 2}, {"max_bytes": 1}):
                items = arr.read_range(start, **kw)
                lengths, data = arr.read_range_blob(start, **kw)
                assert (lengths.tolist(), data) == ([len(x) for x in items], b"".join(items)), (start, kw)
        lengths, data = arr.read_range_blob(len(flat))
        assert (lengths.tolist(), data) == ([], b"")


def test_opens_a_java_written_queue_with_groups(tmp_path):
    path = tmp_path / "topic"
    flat = java_fixture(path)
    with FanoutQueue(path) as q:
        assert q.groups() == ["other", "readers"]
        assert q.group_index("readers") == 2
        assert q.size("readers") == len(flat) - 2
        assert q.dequeue("readers") == flat[2][0]
        assert q.dequeue_many("readers") == [item for item, _ in flat[3:]]
        assert q.dequeue("other") == b"first"
    raw = (path / "front_index_readers" / "page-0.dat").read_bytes()
    assert FRONT.unpack_from(raw, 0) == (len(flat),)
    assert FRONT.unpack_from((path / "front_index_other" / "page-0.dat").read_bytes(), 0) == (1,)


def test_opens_a_java_written_array_with_tail(tmp_path):
    path = tmp_path / "topic"
    page_size = 4096
    pages = [[(b"old-%d" % i, 1_000 + i) for i in range(3)], [(b"new-%d" % i, 2_000 + i) for i in range(3)]]
    # Java deleted data page 0 when tail passed it; the index page is still there
    write_java_array(path, page_size, pages, tail=3)
    os.unlink(path / "data" / "page-0.dat")
    with BigArray(path) as arr:
        assert arr.data_page_size == page_size
        assert (arr.tail, arr.head) == (3, 6)
        assert arr.read_range(3) == [b"new-0", b"new-1", b"new-2"]
        assert arr.find_closest_index(BigArray.EARLIEST) == 3


# -- (b) our writer, parsed by hand ---------------------------------------------------
def index_item(path, i):
    """(data page, offset, length, timestamp, reserved bytes) of item i, from the file."""
    page, slot = divmod(i, ITEMS_PER_INDEX_PAGE)
    with open(path / "index" / f"page-{page}.dat", "rb") as f:
        f.seek(slot * 32)
        raw = f.read(32)
    return (*INDEX_ITEM.unpack(raw), raw[24:])


def parse_index(path, count):
    return [index_item(path, i) for i in range(count)]


def test_written_files_parse_by_hand(tmp_path):
    path = tmp_path / "a"
    page_size = 4096
    clock = FakeClock(1_700_000_000_000)
    items = []
    with BigArray(path, data_page_size=page_size, clock=clock, prefetch=False) as arr:
        for i in range(30):
            clock.now += 7
            item = bytes([i]) * (i * 97 % 1500)
            arr.append(item)
            items.append((item, clock.now))
        clock.now += 1000
        batch = [bytes([200 + i % 50]) * (i * 331 % 2000) for i in range(40)]
        arr.append_many(batch)
        items += [(item, clock.now) for item in batch]
        arr.remove_before_index(5)
        arr.flush()
        head, tail = arr.head, arr.tail
    assert (head, tail) == (70, 5)
    # meta page
    meta = (path / "meta_data" / "page-0.dat").read_bytes()
    assert len(meta) == 16
    assert META.unpack(meta) == (70, 5)
    # index items: back to back in a page, a new page at offset 0 when it does not fit
    parsed = parse_index(path, head)
    page, off = 0, 0
    for i, (item, ts) in enumerate(items):
        p, o, length, t, reserved = parsed[i]
        if off + len(item) > page_size:
            page, off = page + 1, 0
        assert (p, o, length, t) == (page, off, len(item), ts), i
        assert reserved == bytes(8)
        off += len(item)
        if i >= tail:
            with open(path / "data" / f"page-{p}.dat", "rb") as f:
                f.seek(o)
                assert f.read(length) == item, i
    last_page = page
    # page files: names, sizes; pages wholly below tail deleted
    first_kept = parsed[tail][0]
    assert page_files(path / "data") == [f"page-{n}.dat" for n in range(first_kept, last_page + 1)]
    for name in page_files(path / "data"):
        assert os.stat(path / "data" / name).st_size == page_size
    assert page_files(path / "index") == ["page-0.dat"]
    assert os.stat(path / "index" / "page-0.dat").st_size == INDEX_PAGE_SIZE
    assert page_files(path / "meta_data") == ["page-0.dat"]
    # nothing but the documented folders and our extras file
    assert sorted(os.listdir(path)) == ["bigarray.json", "data", "index", "meta_data"]
    extras = json.loads((path / "bigarray.json").read_text())
    assert extras["data_page_size"] == page_size
    assert extras["format_version"] == 1


def test_written_index_pages_and_front_index_parse_by_hand(tmp_path):
    path = tmp_path / "q"
    n = ITEMS_PER_INDEX_PAGE + 50
    with FanoutQueue(path, data_page_size=1 << 20) as q:
        q.enqueue_many([i.to_bytes(3, "big") for i in range(n)])
        q.dequeue_many("my group", max_items=ITEMS_PER_INDEX_PAGE + 1)
        q.dequeue_many("g2", max_items=3)
        q.flush()
    index_pages = page_files(path / "index")
    # the page after the last may exist already (prefetched), never more
    assert index_pages[:2] == ["page-0.dat", "page-1.dat"]
    assert len(index_pages) <= 3
    for name in index_pages:
        assert os.stat(path / "index" / name).st_size == INDEX_PAGE_SIZE
    for name in page_files(path / "data"):
        assert os.stat(path / "data" / name).st_size == 1 << 20
    for i in (0, 1, ITEMS_PER_INDEX_PAGE - 1, ITEMS_PER_INDEX_PAGE, n - 1):
        page, off, length, ts, reserved = index_item(path, i)
        assert length == 3
        with open(path / "data" / f"page-{page}.dat", "rb") as f:
            f.seek(off)
            assert f.read(3) == i.to_bytes(3, "big")
        assert reserved == bytes(8)
        assert ts > 1_600_000_000_000
    assert META.unpack((path / "meta_data" / "page-0.dat").read_bytes()) == (n, 0)
    front = path / "front_index_my group" / "page-0.dat"
    assert os.stat(front).st_size == 8
    assert FRONT.unpack(front.read_bytes()) == (ITEMS_PER_INDEX_PAGE + 1,)
    assert FRONT.unpack((path / "front_index_g2" / "page-0.dat").read_bytes()) == (3,)
    assert page_files(path / "front_index_g2") == ["page-0.dat"]
