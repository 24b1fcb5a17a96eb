"""Reads that can return only a few items take their own path (the index read item by
item, no numpy: BigArray._small_fields); reads of many take numpy's. Both must give what
read_range's contract says, item for item: checked against get() around the end of an
index page and of data pages, with every kind of limit, through the three read calls
and the queue's dequeue calls."""

from __future__ import annotations

import os
import random
import struct

import numpy as np
import pytest

from bigarray import BigArray, FanoutQueue, IndexOutOfRangeError
from bigarray import format as fmt

pytestmark = pytest.mark.timeout(300)

PER_PAGE = fmt.INDEX_ITEMS_PER_PAGE
MAX_ITEMS = (None, 1, 3, 32, 33, 64, 100)
MAX_BYTES = (None, 0, 1, 150, 1000, 4000, 20000)


def expected(arr: BigArray, start: int, max_items: int | None, max_bytes: int | None) -> list[bytes]:
    """read_range's contract, from get(): consecutive items from ``start``, at most
    ``max_items``, summing to at most ``max_bytes``, but at least one."""
    out: list[bytes] = []
    total = 0
    for i in range(start, arr.head):
        if max_items is not None and len(out) >= max(1, max_items):
            break
        item = arr.get(i)
        if max_bytes is not None and out and total + len(item) > max_bytes:
            break
        out.append(item)
        total += len(item)
    return out


def check_reads(arr: BigArray, start: int, max_items: int | None, max_bytes: int | None) -> None:
    want = expected(arr, start, max_items, max_bytes)
    where = f"start {start}, max_items {max_items}, max_bytes {max_bytes}"
    assert arr.read_range(start, max_items=max_items, max_bytes=max_bytes) == want, where
    lengths, data = arr.read_range_blob(start, max_items=max_items, max_bytes=max_bytes)
    assert lengths.tolist() == [len(x) for x in want], where
    assert bytes(data) == b"".join(want), where
    lengths, view, release = arr.read_range_view(start, max_items=max_items, max_bytes=max_bytes)
    try:
        assert lengths.tolist() == [len(x) for x in want], where
        assert bytes(view) == b"".join(want), where
    finally:
        release()


@pytest.fixture(scope="module")
def across_pages(tmp_path_factory: pytest.TempPathFactory) -> BigArray:
    """An index page of 1-byte items, then items of 0-300 bytes of varying size on
    16 KiB data pages (a run crosses the index page's end and several data pages'),
    then a 3000-byte item and 1-byte items after it."""
    rng = random.Random(7)
    arr = BigArray(tmp_path_factory.mktemp("small") / "a", data_page_size=16 << 10)
    arr.append_many([bytes([i % 251]) for i in range(PER_PAGE - 150)])
    arr.append_many([bytes([i % 251]) * rng.randrange(0, 301) for i in range(400)])
    arr.append_many([b"B" * 3000] + [b"s"] * 300)
    yield arr
    arr.close()


def test_reads_across_the_end_of_an_index_page_match_the_contract(across_pages: BigArray) -> None:
    arr = across_pages
    for start in [*range(PER_PAGE - 160, PER_PAGE - 140), *range(PER_PAGE - 40, PER_PAGE + 3)]:
        for max_items in MAX_ITEMS:
            for max_bytes in MAX_BYTES:
                check_reads(arr, start, max_items, max_bytes)


def test_reads_across_data_pages_match_the_contract(across_pages: BigArray) -> None:
    arr = across_pages
    # The data page numbers change somewhere in the 400 varying items: read around each change.
    changes = [
        i for i in range(PER_PAGE - 150, PER_PAGE + 250) if arr._index_record(i)[0] != arr._index_record(i + 1)[0]
    ]
    assert len(changes) >= 3
    for change in changes:
        for start in range(change - 3, change + 2):
            for max_items in MAX_ITEMS:
                for max_bytes in MAX_BYTES:
                    check_reads(arr, start, max_items, max_bytes)


def test_a_big_first_item_then_small_ones_reads_as_many_as_fit(across_pages: BigArray) -> None:
    # Judged by the 3000-byte first item, 20000 bytes hold few items; the 1-byte items
    # after it fill the budget far beyond what the item-by-item path reads at once.
    arr = across_pages
    big = arr.head - 301
    assert arr.item_length(big) == 3000
    for max_bytes in (3000, 3001, 3063, 3064, 3065, 20000, 90000):
        check_reads(arr, big, None, max_bytes)
    assert len(arr.read_range(big, max_bytes=20000)) == 301  # everything to head
    assert len(arr.read_range(big, max_bytes=3100)) == 101


def test_reads_at_head_and_outside_the_array(across_pages: BigArray) -> None:
    arr = across_pages
    for max_items in MAX_ITEMS:
        for max_bytes in MAX_BYTES:
            assert arr.read_range(arr.head, max_items=max_items, max_bytes=max_bytes) == []
            lengths, data = arr.read_range_blob(arr.head, max_items=max_items, max_bytes=max_bytes)
            assert (len(lengths), bytes(data)) == (0, b"")
            for start in (arr.head + 1, -1):
                with pytest.raises(IndexOutOfRangeError):
                    arr.read_range(start, max_items=max_items, max_bytes=max_bytes)
                with pytest.raises(IndexOutOfRangeError):
                    arr.read_range_view(start, max_items=max_items, max_bytes=max_bytes)


def test_few_items_below_a_new_tail_are_out_of_range(tmp_path) -> None:
    with BigArray(tmp_path / "a", data_page_size=4096) as arr:
        arr.append_many([b"x" * 100] * 200)
        arr.remove_before_index(150)
        for start in (0, 100, 149):
            with pytest.raises(IndexOutOfRangeError):
                arr.read_range(start, max_items=2)
            with pytest.raises(IndexOutOfRangeError):
                arr.read_range_blob(start, max_bytes=150)
        assert arr.read_range(150, max_items=2) == [b"x" * 100] * 2


def test_a_group_dequeuing_few_items_at_a_time_gets_every_item_once_in_order(tmp_path) -> None:
    rng = random.Random(3)
    items = [bytes([i % 251]) * rng.randrange(1, 400) for i in range(3000)]
    with FanoutQueue(tmp_path / "q", data_page_size=16 << 10) as q:
        got: dict[str, list[bytes]] = {"list": [], "blob": [], "view": []}
        pos = 0
        while pos < len(items):  # the writer a few items ahead of the readers, as live consumers are
            n = rng.randrange(1, 40)
            q.enqueue_many(items[pos : pos + n])
            pos += n
            for _ in range(3):
                limit = rng.choice([None, 1, 2, 5, 40])
                budget = rng.choice([None, 0, 300, 1000, 5000])
                got["list"] += q.dequeue_many("list", max_items=limit, max_bytes=budget)
                _, lengths, data = q.dequeue_blob("blob", max_items=limit, max_bytes=budget)
                ends = lengths.cumsum().tolist()
                got["blob"] += [bytes(data[a:b]) for a, b in zip([0, *ends], ends, strict=False)]
                _, lengths, view, release = q.dequeue_view("view", max_items=limit, max_bytes=budget)
                ends = lengths.cumsum().tolist()
                got["view"] += [bytes(view[a:b]) for a, b in zip([0, *ends], ends, strict=False)]
                release()
        for name in got:
            while True:
                more = q.dequeue_many(name, max_items=7)
                if not more:
                    break
                got[name] += more
            assert got[name] == items, name


def test_items_not_back_to_back_on_their_page_are_read_each_from_its_place(tmp_path) -> None:
    # Our writers leave a page's items back to back, and a reply may then be one view of
    # the page; an array whose index places an item elsewhere (here, one byte further,
    # a byte shorter) must still give each item from its own place.
    with BigArray(tmp_path / "a", data_page_size=4096) as arr:
        arr.append_many([b"a" * 10, b"0123456789", b"c" * 10, b"d" * 10])
        page_no, off, length, ts = arr._index_record(1)
        index_file = tmp_path / "a" / fmt.INDEX_DIR / fmt.page_file_name(0)
        fd = os.open(index_file, os.O_RDWR)
        try:
            os.pwrite(
                fd, struct.pack(fmt.INDEX_ITEM_STRUCT, page_no, off + 1, length - 1, ts), fmt.index_slot_offset(1)
            )
        finally:
            os.close(fd)
        want = [b"a" * 10, b"123456789", b"c" * 10, b"d" * 10]
        assert [arr.get(i) for i in range(4)] == want
        for max_items in (None, 2, 3):
            check_reads(arr, 0, max_items, None)
            check_reads(arr, 1, max_items, 25)


def test_offset_fields_of_a_few_items_match_each_items_offsets(tmp_path) -> None:
    # Plain items (aux 0) and items holding several records with a kind, across the end
    # of an index page: offset_fields of up to 32 items reads them without numpy.
    with BigArray(tmp_path / "a") as arr:
        arr.append_many([b"p"] * (PER_PAGE - 10))
        for i in range(24):
            if i % 3:
                arr.append(b"c%d" % i, count=i + 1, kind=i % 5)
            else:
                arr.append(b"p")
        for start in range(PER_PAGE - 14, arr.head):
            for count in range(1, min(34, arr.head - start) + 1):
                ends, kinds = arr.offset_fields(start, count)
                assert ends.dtype == np.int64 and kinds.dtype == np.uint8
                assert ends.tolist() == [arr.end_offset(i) for i in range(start, start + count)], (start, count)
                assert kinds.tolist() == [arr.item_kind(i) for i in range(start, start + count)], (start, count)
        with pytest.raises(IndexOutOfRangeError):
            arr.offset_fields(arr.head - 2, 3)
        arr.remove_before_index(PER_PAGE + 1)
        with pytest.raises(IndexOutOfRangeError):
            arr.offset_fields(PER_PAGE, 2)
