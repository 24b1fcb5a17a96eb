"""Unit tests of BigArray: appending, reading, time lookups, retention, lifecycle."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import textwrap
import time

import pytest

from bigarray import (
    EARLIEST,
    LATEST,
    ArrayClosedError,
    ArrayEmptyError,
    ArrayLockedError,
    BigArray,
    BigArrayError,
    FanoutQueue,
    IndexOutOfRangeError,
    ItemTooLargeError,
)

from ._util import (
    PYTHON,
    ROOT,
    FakeClock,
    allocated_bytes,
    free_bytes,
    mapped_files,
    open_deleted_files,
    page_files,
)

pytestmark = pytest.mark.timeout(120)

PAGE = 4096


def open_array(path, **kw) -> BigArray:
    kw.setdefault("data_page_size", PAGE)
    return BigArray(path, **kw)


def sized_items(n: int, seed: int = 0, max_len: int = 1500) -> list[bytes]:
    rng = random.Random(seed)
    return [bytes([i % 256]) * rng.randrange(0, max_len) for i in range(n)]


# -- append / get ---------------------------------------------------------------------
def test_append_returns_consecutive_indexes(tmp_path):
    with open_array(tmp_path / "a") as arr:
        assert [arr.append(b"item-%d" % i) for i in range(5)] == [0, 1, 2, 3, 4]
        assert [arr.get(i) for i in range(5)] == [b"item-%d" % i for i in range(5)]


def test_append_accepts_bytes_like(tmp_path):
    with open_array(tmp_path / "a") as arr:
        arr.append(bytearray(b"ba"))
        arr.append(memoryview(b"xmvx")[1:3])
        arr.append_many([bytearray(b"1"), memoryview(b"22"), b"333"])
        assert [arr.get(i) for i in range(5)] == [b"ba", b"mv", b"1", b"22", b"333"]
        assert all(type(arr.get(i)) is bytes for i in range(5))


def test_empty_items(tmp_path):
    with open_array(tmp_path / "a") as arr:
        arr.append(b"")
        arr.append_many([b"", b"x", b""])
        assert [arr.get(i) for i in range(4)] == [b"", b"", b"x", b""]
        assert arr.read_range(0) == [b"", b"", b"x", b""]
        assert arr.item_length(0) == 0


def test_append_many_returns_first_index(tmp_path):
    with open_array(tmp_path / "a") as arr:
        assert arr.append_many([b"a", b"b"]) == 0
        assert arr.append(b"c") == 2
        assert arr.append_many(iter([b"d", b"e", b"f"])) == 3  # any iterable
        assert arr.append_many([]) == 6  # empty: head, nothing appended
        assert arr.head == 6
        assert arr.read_range(0) == [b"a", b"b", b"c", b"d", b"e", b"f"]


def test_items_cross_many_data_pages(tmp_path):
    items = sized_items(400, seed=1)
    with open_array(tmp_path / "a", prefetch=False) as arr:
        for k in range(0, 200, 7):
            arr.append_many(items[k : min(k + 7, 200)])
        for item in items[200:]:
            arr.append(item)
        assert arr.size == 400
        assert [arr.get(i) for i in range(400)] == items
        assert arr.read_range(0) == items
    # ~300 KB of items in 4 KiB pages: many data pages were used
    assert len(page_files(tmp_path / "a" / "data")) > 60


@pytest.mark.parametrize("prefetch", [False, True])
def test_batches_of_big_items_go_into_the_page_files_whole(tmp_path, prefetch):
    """Batches of items of 2 KiB and more on average are written with pwritev: more items
    than one call takes (1024), every bytes-like kind, across data pages, read back at
    once through the mappings and after a reopen; single appends and small batches
    between."""
    rng = random.Random(5)
    items = [os.urandom(rng.randrange(4096, 12000)) for _ in range(2600)]
    kinds = [bytes, bytearray, memoryview]
    expected: list[bytes] = []
    with open_array(tmp_path / "a", data_page_size=4 << 20, prefetch=prefetch) as arr:
        k = 0
        for n in (1500, 3, 1, 1096):  # 1500 > 1024 buffers; then a page roll inside a batch
            arr.append_many([kinds[(k + i) % 3](item) for i, item in enumerate(items[k : k + n])])
            arr.append(b"small")
            arr.append_many([b"x" * 10, b"y" * 20])  # small items: through the mapping
            expected += [*items[k : k + n], b"small", b"x" * 10, b"y" * 20]
            k += n
        assert arr.read_range(0, max_bytes=1 << 40) == expected
        assert [arr.get(i) for i in range(0, arr.head, 97)] == expected[::97]
    assert len(page_files(tmp_path / "a" / "data")) >= 5  # ~21 MB in 4 MiB pages
    with open_array(tmp_path / "a", data_page_size=4 << 20) as arr:
        assert arr.read_range(0, max_bytes=1 << 40) == expected


@pytest.mark.parametrize("prefetch", [False, True])
def test_batches_of_mid_sized_items_are_joined_into_the_page_files(tmp_path, prefetch):
    """Batches of items of 512 B to 2 KiB on average are joined and written with one
    pwrite (the head page's file is then open for it), smaller ones, and small batches
    that append's path takes, go through the mapping: every bytes-like kind, page rolls
    inside batches, read back at once and after a reopen. A memoryview whose len() is
    not its size is refused as before, nothing appended."""
    import array as pyarray

    rng = random.Random(7)
    kinds = [bytes, bytearray, memoryview]
    expected: list[bytes] = [b"s" * 100] * 10
    with open_array(tmp_path / "a", data_page_size=1 << 20, prefetch=prefetch) as arr:
        arr.append_many(expected)  # 100 B: through the mapping
        assert arr._write_fd < 0
        for k in range(6):  # ~7 MB in 1 MiB pages
            batch = [os.urandom(rng.randrange(512, 2048)) for _ in range(900)]
            assert arr.append_many([kinds[(k + i) % 3](item) for i, item in enumerate(batch)]) == len(expected)
            assert arr._write_fd >= 0  # written through the file
            expected += batch
            pair = [b"m" * 600, bytearray(b"n" * 700)]  # a small batch: through the mapping (as append)
            assert arr.append_many(pair) == len(expected)
            expected += [bytes(x) for x in pair]
            assert arr.read_range(len(expected) - 902, max_bytes=1 << 40) == expected[-902:]
        wide = memoryview(pyarray.array("i", [7] * 600))  # len 600, 2400 bytes
        with pytest.raises(IndexError):
            arr.append_many([wide, wide])
        assert arr.head == len(expected)
        assert arr.read_range(0, max_bytes=1 << 40) == expected
    assert len(page_files(tmp_path / "a" / "data")) >= 6
    with open_array(tmp_path / "a", data_page_size=1 << 20) as arr:
        assert arr.read_range(0, max_bytes=1 << 40) == expected
        assert arr.append_many([b"z" * 1000] * 3) == len(expected)  # on after a reopen
        assert arr.read_range(len(expected)) == [b"z" * 1000] * 3


@pytest.mark.parametrize("prefetch", [False, True])
def test_single_big_items_go_into_the_page_files(tmp_path, prefetch):
    """An append of an item of 32 KiB or more writes it with pwrite (the head page's file
    is then open for it), one just under through the mapping: every bytes-like kind, items
    with a record count (the Kafka door's batches), page rolls, small appends and batches
    between, each read back at once, all of them after a reopen."""
    rng = random.Random(6)
    kinds = [bytes, bytearray, memoryview]
    expected: list[bytes] = []
    with open_array(tmp_path / "a", data_page_size=1 << 20, prefetch=prefetch) as arr:
        for size in ((32 << 10) - 1, (32 << 10) - 1):  # twice: the second one inlined
            expected.append(os.urandom(size))
            assert arr.append(expected[-1], 3) == len(expected) - 1
            assert arr._write_fd < 0  # through the mapping
        for i in range(48):  # ~5 MB in 1 MiB pages
            item = os.urandom(rng.randrange(32 << 10, 200_000) if i else 32 << 10)
            assert arr.append(kinds[i % 3](item), 1 + i % 2) == len(expected)
            assert arr._write_fd >= 0  # written through the file, not the mapping
            expected.append(item)
            if i % 5 == 0:
                assert arr.append(b"small") == len(expected)
                expected.append(b"small")
            if i % 7 == 0:
                assert arr.append_many([b"a" * 10, item[:100]]) == len(expected)
                expected += [b"a" * 10, item[:100]]
            assert arr.get(len(expected) - 1) == expected[-1]
        assert [arr.get(i) for i in range(arr.head)] == expected
        assert arr.read_range(0, max_bytes=1 << 40) == expected
    assert len(page_files(tmp_path / "a" / "data")) >= 5
    with open_array(tmp_path / "a", data_page_size=1 << 20) as arr:
        assert [arr.get(i) for i in range(arr.head)] == expected


def test_a_single_item_whose_len_is_not_its_size_is_refused(tmp_path):
    """len() of a memoryview of 4-byte ints counts ints: 65,536 of them (256 KiB) are
    refused (IndexError, as the mapping's copy refuses them) and nothing moves."""
    wide = memoryview(bytearray((64 << 10) * 4)).cast("i")
    with open_array(tmp_path / "a", data_page_size=1 << 20, prefetch=False) as arr:
        arr.append(b"before")
        with pytest.raises(IndexError):
            arr.append(wide)
        assert arr.head == 1
        big = os.urandom(70_000)
        assert arr.append(big) == 1
        assert arr.read_range(0, max_bytes=1 << 20) == [b"before", big]


def test_a_batch_of_items_whose_len_is_not_their_size_is_refused_whole(tmp_path):
    """len() of a memoryview of 4-byte ints counts ints: such a batch is refused before
    anything is written, and the next append lands where it would have."""
    wide = memoryview(bytearray(8192 * 4)).cast("i")  # len 8192, 32 KiB
    with open_array(tmp_path / "a", data_page_size=1 << 20, prefetch=False) as arr:
        arr.append(b"before")
        with pytest.raises(IndexError):
            arr.append_many([wide, wide])
        assert arr.head == 1
        assert arr.append_many([b"a" * 5000, b"b" * 5000]) == 1
        assert arr.read_range(0, max_bytes=1 << 20) == [b"before", b"a" * 5000, b"b" * 5000]


def test_item_of_exactly_a_data_page(tmp_path):
    with open_array(tmp_path / "a") as arr:
        arr.append(b"s")
        big = bytes(range(256)) * (PAGE // 256)
        assert len(big) == PAGE
        assert arr.append(big) == 1
        assert arr.append_many([b"t", big, big]) == 2
        assert arr.read_range(0) == [b"s", big, b"t", big, big]


def test_item_too_large_is_refused_with_sizes(tmp_path):
    with open_array(tmp_path / "a") as arr:
        arr.append(b"before")
        with pytest.raises(ItemTooLargeError) as info:
            arr.append(b"x" * (PAGE + 1))
        assert str(PAGE + 1) in str(info.value)
        assert str(PAGE) in str(info.value).replace(str(PAGE + 1), "")
        assert isinstance(info.value, BigArrayError)
        assert isinstance(info.value, ValueError)
        assert arr.head == 1
        assert arr.append(b"after") == 1
        assert arr.read_range(0) == [b"before", b"after"]


def test_append_many_is_all_or_nothing(tmp_path):
    path = tmp_path / "a"
    with open_array(path) as arr:
        arr.append_many([b"a" * 1000, b"b" * 1000])
        batch = [b"c" * 3000, b"d" * 3000, b"e" * (PAGE * 2), b"f"]
        with pytest.raises(ItemTooLargeError) as info:
            arr.append_many(batch)
        assert str(PAGE * 2) in str(info.value)
        assert arr.head == 2
        with pytest.raises(IndexOutOfRangeError):
            arr.get(2)
        assert arr.append_many([b"g" * 10, b"h" * 3000]) == 2
        assert arr.read_range(0) == [b"a" * 1000, b"b" * 1000, b"g" * 10, b"h" * 3000]
    with open_array(path) as arr:
        assert arr.read_range(0) == [b"a" * 1000, b"b" * 1000, b"g" * 10, b"h" * 3000]


def test_get_out_of_range(tmp_path):
    with open_array(tmp_path / "a") as arr:
        with pytest.raises(IndexOutOfRangeError):
            arr.get(0)
        arr.append_many([b"a", b"b", b"c"])
        for bad in (-1, 3, 4, 1 << 40):
            with pytest.raises(IndexOutOfRangeError) as info:
                arr.get(bad)
            assert isinstance(info.value, IndexError)
        arr.remove_before_index(2)
        with pytest.raises(IndexOutOfRangeError):
            arr.get(1)
        assert arr.get(2) == b"c"


# -- read_range -----------------------------------------------------------------------
def test_get_maps_again_the_pages_of_its_last_read_once_they_are_unmapped(tmp_path):
    # get() goes straight to the index and data page of its previous call, holding no
    # reference to them: when the page cache has unmapped one since (evicted, idle,
    # deleted by retention), it must map it again, never fail on the closed mapping.
    items = [bytes([i]) * 3000 for i in range(8)]  # one item per 4 KiB data page
    with open_array(tmp_path / "a", max_cached_pages=1, page_ttl_s=0.2) as arr:
        arr.append_many(items)
        assert arr.get(1) == items[1]
        assert arr.read_range(3, max_items=1) == [items[3]]  # page 3 evicts page 1 (unmapped)
        assert arr.get(1) == items[1]
        assert arr.item_length(1) == 3000
        time.sleep(0.3)
        arr.expire_idle_pages()  # unmaps every idle page (all but the writer's)
        assert arr.get(1) == items[1]
        arr.remove_before_index(2)  # deletes data page 1, which get used last
        with pytest.raises(IndexOutOfRangeError):
            arr.get(1)
        assert arr.get(2) == items[2]
    with open_array(tmp_path / "a", max_cached_pages=1, page_ttl_s=0.2) as arr:  # no writer: no pinned page
        assert arr.get(4) == items[4]
        time.sleep(0.3)
        arr.expire_idle_pages()  # the index page is unmapped too now
        assert arr.mapped_page_count() == 0
        assert arr.timestamp(4) >= 1 and arr.get(4) == items[4] and arr.get(5) == items[5]
    with pytest.raises(ArrayClosedError):
        arr.get(5)  # the pages it used last are closed with the array


def test_read_range_limits(tmp_path):
    items = [b"%02d" % i + b"x" * 8 for i in range(20)]  # 10 bytes each
    with open_array(tmp_path / "a") as arr:
        arr.append_many(items)
        assert arr.read_range(0) == items
        assert arr.read_range(5) == items[5:]
        assert arr.read_range(19) == items[19:]
        assert arr.read_range(3, max_items=4) == items[3:7]
        assert arr.read_range(18, max_items=10) == items[18:]
        assert arr.read_range(0, max_bytes=30) == items[:3]
        assert arr.read_range(0, max_bytes=29) == items[:2]
        assert arr.read_range(0, max_bytes=31) == items[:3]
        assert arr.read_range(4, max_items=2, max_bytes=100) == items[4:6]
        assert arr.read_range(4, max_items=20, max_bytes=45) == items[4:8]
        assert arr.read_range(0, max_bytes=10_000) == items


def test_read_range_returns_one_item_larger_than_max_bytes(tmp_path):
    with open_array(tmp_path / "a") as arr:
        arr.append_many([b"L" * 3000, b"s", b"L" * 2000])
        assert arr.read_range(0, max_bytes=10) == [b"L" * 3000]
        assert arr.read_range(0, max_bytes=0) == [b"L" * 3000]
        assert arr.read_range(1, max_bytes=10) == [b"s"]
        assert arr.read_range(1, max_bytes=1999) == [b"s"]
        assert arr.read_range(2, max_bytes=1) == [b"L" * 2000]


def test_read_range_at_head_and_out_of_range(tmp_path):
    with open_array(tmp_path / "a") as arr:
        assert arr.read_range(0) == []
        with pytest.raises(IndexOutOfRangeError):
            arr.read_range(1)
        with pytest.raises(IndexOutOfRangeError):
            arr.read_range(-1)
        arr.append_many([b"a", b"b", b"c", b"d"])
        assert arr.read_range(4) == []
        assert arr.read_range(4, max_items=3, max_bytes=1) == []
        with pytest.raises(IndexOutOfRangeError):
            arr.read_range(5)
        arr.remove_before_index(2)
        assert arr.read_range(2) == [b"c", b"d"]
        with pytest.raises(IndexOutOfRangeError) as info:
            arr.read_range(1)
        assert (info.value.tail, info.value.head) == (2, 4)
        arr.remove_before_index(4)
        assert arr.read_range(4) == []
        with pytest.raises(IndexOutOfRangeError):
            arr.read_range(3)


def test_read_range_max_bytes_across_read_chunks(tmp_path):
    """read_range works through the index in chunks; the byte budget spans them."""
    items = [b"%05d" % i for i in range(40_000)]  # 5 bytes each
    with open_array(tmp_path / "a", data_page_size=1 << 20) as arr:
        arr.append_many(items)
        assert arr.read_range(0, max_bytes=5 * 30_000) == items[:30_000]
        assert arr.read_range(0, max_bytes=5 * 30_000 + 4) == items[:30_000]
        assert arr.read_range(100, max_bytes=5 * 16_384) == items[100:16_484]
        assert arr.read_range(16_383, max_bytes=7) == items[16_383:16_384]
        assert arr.read_range(16_383, max_bytes=10) == items[16_383:16_385]
        assert arr.read_range(0, max_items=35_000, max_bytes=1 << 30) == items[:35_000]


def _within(items: list[bytes], start: int, budget: int) -> list[bytes]:
    """What a read from ``start`` with max_bytes ``budget`` returns: the items whose
    lengths add up to at most the budget, and at least one."""
    out: list[bytes] = []
    total = 0
    for item in items[start:]:
        if out and total + len(item) > budget:
            break
        out.append(item)
        total += len(item)
    return out


@pytest.mark.parametrize("read", ["read_range", "read_range_blob", "read_range_view"])
def test_read_range_max_bytes_when_item_sizes_change(tmp_path, read):
    """A read with max_bytes converts only the index items its budget can use, guessed
    from the first item's length: reads whose later items are far smaller (the guess
    falls short and grows) or larger (the guess overshoots) than the first return the
    same items as a reference that walks them one by one."""
    rng = random.Random(7)
    runs = [(50, 3000), (2000, 7), (300, 100), (5, 20000), (3000, 1), (1, 60000), (4000, 2)]
    items = [bytes([i % 251]) * size for count, size in runs for i in range(count)]
    with open_array(tmp_path / "a", data_page_size=1 << 20) as arr:
        arr.append_many(items)
        starts = [0, 49, 50, 2049, 2340, 2350, 2649, 2654, 5654, len(items) - 1, *rng.sample(range(len(items)), 20)]
        for start in starts:
            for budget in (0, 6, 7, 3000, 4000, 20000, 1 << 16, 1 << 20, rng.randrange(1, 200_000)):
                want = _within(items, start, budget)
                if read == "read_range":
                    got = arr.read_range(start, max_bytes=budget)
                else:
                    result = getattr(arr, read)(start, max_bytes=budget)
                    lengths, data = result[0], bytes(result[1])
                    ends = [0, *itertools.accumulate(int(n) for n in lengths)]
                    got = [data[a:b] for a, b in itertools.pairwise(ends)]
                    if read == "read_range_view":
                        result[2]()
                assert got == want, (start, budget)


def test_read_range_items_of_one_length_wherever_they_lie(tmp_path):
    """read_range cuts a run of equal-length items laid out back to back in one pass;
    equal-length items laid out otherwise (across data pages, out of order, with gaps:
    what another writer's index may say) are read one by one, each from where its
    index item points; empty items stay empty."""
    items = [bytes([65 + i]) * 1000 for i in range(9)]  # 4 per 4096-byte data page
    with open_array(tmp_path / "a") as arr:
        arr.append_many(items)
        arr.append_many([b""] * 3)
        assert arr.read_range(0) == items + [b""] * 3
        assert arr.read_range(1, max_items=6) == items[1:7]
        assert arr.read_range(9) == [b""] * 3
        assert [x for i in range(12) for x in arr.read_range(i, max_items=1)] == items + [b""] * 3

        def point(index: int, offset: int) -> None:  # set the data offset of an index item
            with open(tmp_path / "a" / "index" / "page-0.dat", "r+b") as f:
                f.seek(index * 32 + 8)
                f.write(offset.to_bytes(4, "big"))

        point(1, 2000)
        point(2, 1000)  # items 1 and 2 swapped: not in order
        assert arr.read_range(0, max_items=4) == [items[0], items[2], items[1], items[3]]
        point(2, 3000)  # a gap between items 0 and 1, item 2 where item 3 is
        assert arr.read_range(0, max_items=5) == [items[0], items[2], items[3], items[3], items[4]]


# -- metadata of items ----------------------------------------------------------------
def test_item_length_and_timestamp(tmp_path, clock: FakeClock):
    with open_array(tmp_path / "a", clock=clock) as arr:
        clock.now = 5_000
        arr.append(b"abc")
        clock.now = 6_000
        arr.append_many([b"", b"x" * 4000])
        assert [arr.item_length(i) for i in range(3)] == [3, 0, 4000]
        assert [arr.timestamp(i) for i in range(3)] == [5_000, 6_000, 6_000]
        for f in (arr.item_length, arr.timestamp):
            with pytest.raises(IndexOutOfRangeError):
                f(3)
            with pytest.raises(IndexOutOfRangeError):
                f(-1)


def test_timestamps_of_a_range_cross_index_pages(tmp_path, clock: FakeClock):
    per_page = 16_384  # index items per index page (format: 2^14 items of 32 B = 512 KiB)
    with open_array(tmp_path / "a", clock=clock) as arr:
        for chunk in range(4):
            clock.now = 1_000 * (chunk + 1)
            arr.append_many([b"t"] * (per_page // 2 + 1))
        want = [arr.timestamp(i) for i in range(arr.head)]
        assert arr.timestamps(0, arr.head) == want
        assert arr.timestamps(per_page - 3, 10) == want[per_page - 3 : per_page + 7]
        assert arr.timestamps(5, 0) == []
        for start, count in ((arr.head - 1, 2), (-1, 2), (arr.head, 1)):
            with pytest.raises(IndexOutOfRangeError):
                arr.timestamps(start, count)
        arr.remove_before_index(per_page + 1)
        with pytest.raises(IndexOutOfRangeError):
            arr.timestamps(per_page, 2)
        assert arr.timestamps(per_page + 1, 2) == want[per_page + 1 : per_page + 3]


def test_timestamps_never_go_backwards(tmp_path, clock: FakeClock):
    path = tmp_path / "a"
    with open_array(path, clock=clock) as arr:
        clock.now = 10_000
        arr.append(b"a")
        clock.now = 9_000  # the clock goes back
        arr.append(b"b")
        arr.append_many([b"c", b"d"])
        clock.now = 12_000
        arr.append(b"e")
        clock.now = 11_000
        arr.append_many([b"f"])
        assert [arr.timestamp(i) for i in range(6)] == [10_000, 10_000, 10_000, 10_000, 12_000, 12_000]
    # also across a reopen: the last timestamp comes back from disk
    with open_array(path, clock=FakeClock(1_000)) as arr:
        arr.append(b"g")
        assert arr.timestamp(6) == 12_000


def test_default_clock_is_wall_time_ms(tmp_path):
    import time

    with open_array(tmp_path / "a") as arr:
        before = time.time_ns() // 1_000_000
        arr.append(b"x")
        after = time.time_ns() // 1_000_000
        assert before <= arr.timestamp(0) <= after


def test_head_tail_size_is_empty(tmp_path):
    with open_array(tmp_path / "a") as arr:
        assert (arr.head, arr.tail, arr.size, arr.is_empty) == (0, 0, 0, True)
        arr.append_many([b"a", b"b", b"c"])
        assert (arr.head, arr.tail, arr.size, arr.is_empty) == (3, 0, 3, False)
        arr.remove_before_index(1)
        assert (arr.head, arr.tail, arr.size, arr.is_empty) == (3, 1, 2, False)
        arr.remove_before_index(3)
        assert (arr.head, arr.tail, arr.size, arr.is_empty) == (3, 3, 0, True)
        arr.append(b"d")
        assert (arr.head, arr.tail, arr.size, arr.is_empty) == (4, 3, 1, False)
        assert arr.get(3) == b"d"


# -- find_closest_index ---------------------------------------------------------------
def test_find_closest_index(tmp_path, clock: FakeClock):
    with open_array(tmp_path / "a", clock=clock) as arr:
        with pytest.raises(ArrayEmptyError):
            arr.find_closest_index(1_000)
        assert arr.find_closest_index(EARLIEST) == 0
        assert arr.find_closest_index(LATEST) == 0
        for t in (1_000, 2_000, 3_000, 4_000):
            clock.now = t
            arr.append(b"t%d" % t)
        clock.now = 6_000
        arr.append_many([b"m1", b"m2", b"m3"])  # indexes 4..6 share 6_000
        assert BigArray.EARLIEST == EARLIEST == -1
        assert BigArray.LATEST == LATEST == -2
        assert arr.find_closest_index(EARLIEST) == 0
        assert arr.find_closest_index(LATEST) == 7
        expected = {
            0: 0,
            999: 0,
            1_000: 0,
            1_499: 0,
            1_500: 0,  # a tie goes to the earlier index
            1_501: 1,
            2_000: 1,
            2_600: 2,
            3_999: 3,
            4_999: 3,
            5_001: 4,
            6_000: 4,
            7_000: 6,
            10**13: 6,
        }
        for ts, idx in expected.items():
            assert arr.find_closest_index(ts) == idx, ts
        arr.remove_before_index(2)
        assert arr.find_closest_index(EARLIEST) == 2
        assert arr.find_closest_index(1_000) == 2
        assert arr.find_closest_index(LATEST) == 7
        arr.remove_before_index(7)
        with pytest.raises(ArrayEmptyError):
            arr.find_closest_index(6_000)
        assert arr.find_closest_index(EARLIEST) == 7
        assert arr.find_closest_index(LATEST) == 7


# -- retention ------------------------------------------------------------------------
def test_remove_before_index(tmp_path):
    with open_array(tmp_path / "a") as arr:
        arr.append_many([b"%d" % i for i in range(10)])
        arr.remove_before_index(4)
        assert arr.tail == 4
        assert arr.read_range(4) == [b"%d" % i for i in range(4, 10)]
        arr.remove_before_index(2)  # below tail: no-op
        arr.remove_before_index(4)
        assert arr.tail == 4
        with pytest.raises(IndexOutOfRangeError):
            arr.remove_before_index(11)
        assert arr.tail == 4
        arr.remove_before_index(10)
        assert arr.is_empty
        assert arr.append(b"10") == 10


def test_remove_before_index_persists(tmp_path):
    path = tmp_path / "a"
    with open_array(path) as arr:
        arr.append_many([b"x" * 500 for _ in range(40)])
        arr.remove_before_index(17)
    with open_array(path) as arr:
        assert (arr.tail, arr.head) == (17, 40)
        assert arr.read_range(17) == [b"x" * 500] * 23


def test_removed_pages_are_deleted_unmapped_and_space_freed(tmp_path, make_tmpfs):
    # On a private tmpfs the free-space count is exact; elsewhere other processes
    # write to the same file system, so only the per-file checks are made.
    private = make_tmpfs("32m")
    path = (private or tmp_path) / "a"
    item = b"z" * 4000  # one item per 4 KiB page
    with open_array(path, prefetch=False) as arr:
        arr.append_many([item] * 2000)  # 2000 data pages, ~8 MiB
        for i in range(0, 2000, 97):
            arr.get(i)  # map some old pages into the cache
        data = path / "data"
        assert page_files(data) == [f"page-{n}.dat" for n in range(2000)]
        used_before = allocated_bytes(data)
        free_before = free_bytes(path)
        arr.remove_before_index(1800)
        assert page_files(data) == [f"page-{n}.dat" for n in range(1800, 2000)]
        # no mapping or descriptor of a deleted file is left (it would keep the space)
        assert [m for m in mapped_files(path) if "(deleted)" in m] == []
        assert open_deleted_files(path) == []
        assert allocated_bytes(data) <= used_before - 1800 * PAGE
        if private is not None:
            freed = free_bytes(path) - free_before
            assert freed >= 1800 * PAGE, f"only {freed} bytes came back to the file system"
        assert arr.read_range(1800) == [item] * 200


def test_remove_before_index_deletes_index_pages(tmp_path):
    path = tmp_path / "a"
    n = (1 << 17) + 100
    with open_array(path, data_page_size=1 << 20, prefetch=False) as arr:
        arr.append_many([b"ab"] * n)
        arr.get(5)
        assert page_files(path / "index") == ["page-0.dat", "page-1.dat"]
        arr.remove_before_index(1 << 17)
        # the index item of tail - 1 is kept (first_offset(tail) reads it)
        assert page_files(path / "index") == ["page-0.dat", "page-1.dat"]
        assert arr.first_offset(1 << 17) == 1 << 17
        arr.remove_before_index((1 << 17) + 1)
        assert page_files(path / "index") == ["page-1.dat"]
        assert [m for m in mapped_files(path) if "(deleted)" in m] == []
        assert arr.get((1 << 17) + 1) == b"ab"
        assert arr.read_range(n - 3) == [b"ab"] * 3


def test_remove_before_timestamp(tmp_path, clock: FakeClock):
    with open_array(tmp_path / "a", clock=clock) as arr:
        arr.remove_before(10**13)  # empty: nothing to do
        assert (arr.tail, arr.head) == (0, 0)
        for t in range(10):
            clock.now = 1_000 * (t + 1)
            arr.append_many([b"%d-a" % t, b"%d-b" % t])
        arr.remove_before(3_000)  # items stamped before 3_000 go: 1_000 and 2_000
        assert arr.tail == 4
        assert arr.get(4) == b"2-a"
        arr.remove_before(3_500)
        assert arr.tail == 6
        arr.remove_before(100)  # nothing older: no-op
        assert arr.tail == 6
        arr.remove_before(10**13)
        assert arr.is_empty and arr.head == 20


def test_back_file_size_and_limit(tmp_path):
    path = tmp_path / "a"
    item = b"q" * 1000  # 4 per page
    with open_array(path, prefetch=False) as arr:
        arr.append_many([item] * 40)  # data pages 0..9
        files = [path / "index" / n for n in page_files(path / "index")]
        files += [path / "data" / n for n in page_files(path / "data")]
        assert arr.back_file_size() == sum(os.stat(f).st_size for f in files)
        assert arr.back_file_size() == 4 * 1024 * 1024 + 10 * PAGE
        arr.limit_back_file_size(10**12)  # already below: nothing happens
        assert arr.tail == 0
        arr.limit_back_file_size(4 * 1024 * 1024 + 3 * PAGE)
        assert page_files(path / "data") == ["page-7.dat", "page-8.dat", "page-9.dat"]
        assert arr.tail == 28
        assert arr.back_file_size() <= 4 * 1024 * 1024 + 3 * PAGE
        assert arr.read_range(28) == [item] * 12
        # below what the index page alone takes: all but the page being written go
        arr.limit_back_file_size(0)
        assert page_files(path / "data") == ["page-9.dat"]
        assert arr.tail == 36
        assert arr.read_range(36) == [item] * 4
        assert arr.append(b"more") == 40
    with open_array(path) as arr:
        assert (arr.tail, arr.head) == (36, 41)


# -- lifecycle ------------------------------------------------------------------------
def test_closed_array_raises(tmp_path):
    arr = open_array(tmp_path / "a")
    arr.append_many([b"a", b"b"])
    arr.close()
    assert arr.closed
    arr.close()  # twice is fine
    calls = [
        lambda: arr.append(b"x"),
        lambda: arr.append_many([b"x"]),
        lambda: arr.append_many([]),
        lambda: arr.get(0),
        lambda: arr.read_range(0),
        lambda: arr.item_length(0),
        lambda: arr.timestamp(0),
        lambda: arr.find_closest_index(EARLIEST),
        lambda: arr.find_closest_index(1),
        lambda: arr.remove_before_index(1),
        lambda: arr.remove_before(1),
        lambda: arr.limit_back_file_size(0),
        arr.flush,
        arr.__enter__,
    ]
    for call in calls:
        with pytest.raises(ArrayClosedError):
            call()
    assert "closed" in repr(arr)


def test_context_manager_closes(tmp_path):
    with open_array(tmp_path / "a") as arr:
        assert not arr.closed
        arr.append(b"x")
    assert arr.closed
    with pytest.raises(ArrayClosedError):
        arr.get(0)
    with pytest.raises(RuntimeError), open_array(tmp_path / "b") as arr2:
        raise RuntimeError("boom")
    assert arr2.closed
    with open_array(tmp_path / "b") as arr3:  # the lock was released
        assert arr3.is_empty


def test_second_open_in_same_process_is_locked(tmp_path):
    path = tmp_path / "a"
    arr = open_array(path)
    try:
        with pytest.raises(ArrayLockedError) as info:
            open_array(path)
        assert info.value.retriable
        with pytest.raises(ArrayLockedError):
            FanoutQueue(path, data_page_size=PAGE)
        arr.append(b"still fine")
    finally:
        arr.close()
    with open_array(path) as again:
        assert again.get(0) == b"still fine"


def _open_in_subprocess(path) -> str:
    code = textwrap.dedent(
        f"""
        import bigarray
        try:
            bigarray.BigArray({str(path)!r}, data_page_size={PAGE}).close()
            print("opened")
        except bigarray.BigArrayError as exc:
            print(type(exc).__name__)
        """
    )
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_second_open_in_another_process_is_locked(tmp_path):
    path = tmp_path / "a"
    with open_array(path) as arr:
        arr.append(b"x")
        assert _open_in_subprocess(path) == "ArrayLockedError"
    assert _open_in_subprocess(path) == "opened"


def test_reopen_keeps_data_and_page_size(tmp_path):
    path = tmp_path / "a"
    items = sized_items(100, seed=2)
    with open_array(path, data_page_size=PAGE) as arr:
        arr.append_many(items[:50])
        for item in items[50:]:
            arr.append(item)
    extras = json.loads((path / "bigarray.json").read_text())
    assert extras["data_page_size"] == PAGE
    with BigArray(path, data_page_size=8 * PAGE) as arr:  # an existing array keeps its size
        assert arr.data_page_size == PAGE
        assert (arr.tail, arr.head) == (0, 100)
        assert arr.read_range(0) == items
        with pytest.raises(ItemTooLargeError):
            arr.append(b"x" * (PAGE + 1))
        arr.append(b"y" * PAGE)
    with BigArray(path) as arr:
        assert arr.data_page_size == PAGE
        assert arr.read_range(0) == [*items, b"y" * PAGE]
    for name in page_files(path / "data"):
        assert os.stat(path / "data" / name).st_size == PAGE


def test_appends_after_reopen_continue_the_data_page(tmp_path):
    """The write position is derived from the last item: no page is wasted."""
    path = tmp_path / "a"
    with open_array(path, prefetch=False) as arr:
        arr.append(b"a" * 100)
    with open_array(path, prefetch=False) as arr:
        arr.append(b"b" * 100)
    with open_array(path, prefetch=False) as arr:
        assert arr.read_range(0) == [b"a" * 100, b"b" * 100]
        assert page_files(path / "data") == ["page-0.dat"]


def test_invalid_data_page_size(tmp_path):
    with pytest.raises(ValueError):
        BigArray(tmp_path / "a", data_page_size=100)
    with pytest.raises(ValueError):
        BigArray(tmp_path / "b", data_page_size=1 << 31)


# -- index pages ----------------------------------------------------------------------
INDEX_ITEMS = 1 << 17


def test_items_across_index_pages(tmp_path):
    path = tmp_path / "a"
    n = 140_000
    items = [i.to_bytes(4, "big") for i in range(n)]
    with open_array(path, data_page_size=1 << 20) as arr:
        arr.append_many(items[:100_000])
        arr.append_many(items[100_000:])
        assert arr.head == n
        assert page_files(path / "index")[:2] == ["page-0.dat", "page-1.dat"]
        for i in (0, INDEX_ITEMS - 1, INDEX_ITEMS, INDEX_ITEMS + 1, n - 1):
            assert arr.get(i) == items[i]
        assert arr.read_range(INDEX_ITEMS - 100, max_items=200) == items[INDEX_ITEMS - 100 : INDEX_ITEMS + 100]
        assert arr.read_range(INDEX_ITEMS - 3, max_bytes=24) == items[INDEX_ITEMS - 3 : INDEX_ITEMS + 3]
        assert arr.read_range(0) == items
        assert arr.read_range(0, max_bytes=4 * 135_000) == items[:135_000]
        # single appends across the boundary of the next index page too
        for i in range(2):
            arr.append(b"one-%d" % i)
    with open_array(path) as arr:
        assert arr.read_range(INDEX_ITEMS - 1, max_items=2) == items[INDEX_ITEMS - 1 : INDEX_ITEMS + 1]
        assert arr.get(n + 1) == b"one-1"


def test_read_range_max_bytes_at_last_slot_of_an_index_page(tmp_path):
    """An item larger than max_bytes is returned alone, also when it is the last item
    of an index page (the byte budget must not turn into 'no limit')."""
    path = tmp_path / "a"
    n = INDEX_ITEMS + 10
    with open_array(path, data_page_size=1 << 20) as arr:
        arr.append_many([b"x" * 100] * n)
        assert len(arr.read_range(INDEX_ITEMS - 2, max_bytes=50)) == 1
        assert len(arr.read_range(INDEX_ITEMS, max_bytes=50)) == 1
        assert len(arr.read_range(INDEX_ITEMS - 1, max_bytes=150)) == 1
        assert len(arr.read_range(INDEX_ITEMS - 1, max_bytes=50)) == 1


def test_empty_items_at_page_edges_survive_reopen(tmp_path):
    path = tmp_path / "a"
    full = b"F" * PAGE
    with open_array(path) as arr:
        arr.append_many([b"", b""])  # empty first items on a fresh array
        arr.append(full)
        arr.append(b"")  # an empty item at the very end of a full page
        arr.append_many([b"", full, b""])
    with open_array(path) as arr:
        assert arr.read_range(0) == [b"", b"", full, b"", b"", full, b""]
        arr.append(b"x")
        arr.append_many([b"", b"y"])
    with open_array(path) as arr:
        assert arr.read_range(0) == [b"", b"", full, b"", b"", full, b"", b"x", b"", b"y"]


def test_reopen_emptied_array_at_an_index_page_boundary(tmp_path, clock: FakeClock):
    path = tmp_path / "a"
    with open_array(path, data_page_size=1 << 20, clock=clock) as arr:
        arr.append_many([b"ab"] * INDEX_ITEMS)
        arr.remove_before_index(INDEX_ITEMS)  # everything gone but the index item of tail - 1
        assert page_files(path / "index")[:1] == ["page-0.dat"]
    os.unlink(path / "index" / "page-0.dat")  # as Java (and bigarray before offsets) trim it
    with open_array(path, clock=clock) as arr:
        assert (arr.tail, arr.head) == (INDEX_ITEMS, INDEX_ITEMS)
        assert arr.next_offset == arr.log_start_offset == INDEX_ITEMS
        assert arr.read_range(INDEX_ITEMS) == []
        assert arr.append(b"next") == INDEX_ITEMS
        assert arr.append_many([b"a", b"b"]) == INDEX_ITEMS + 1
    with open_array(path) as arr:
        assert arr.read_range(INDEX_ITEMS) == [b"next", b"a", b"b"]
        assert arr.find_closest_index(clock.now) == INDEX_ITEMS


def test_no_page_file_appears_after_close(tmp_path):
    """Background prefetching must stop with close(): a caller that closes and then
    deletes the directory (delete topic) must not see files come back."""
    import shutil
    import time

    for trial in range(5):
        path = tmp_path / f"a{trial}"
        arr = BigArray(path, data_page_size=1 << 20)  # prefetch on (the default)
        arr.append_many([b"p" * 1000] * 700)  # past half a page: the next page is prefetched
        arr.append(b"q" * 1000)
        arr.close()
        shutil.rmtree(path)  # fails if a file appears in a folder while it is removed
        time.sleep(0.02)
        assert not path.exists(), f"trial {trial}: {sorted(str(p) for p in path.rglob('*'))}"


def test_retention_deletes_pages_for_good_even_with_read_ahead_queued(tmp_path):
    """The writer queues a read-ahead of each next page; on a loaded machine the
    prefetch thread runs those jobs late. A page deleted by retention in between must
    not be created again by its late job (a clean-clone CI run saw such files count
    against log.retention.size)."""
    from bigarray.prefetch import PREFETCHER

    blocker = tmp_path / "blocker"  # keeps the prefetch thread busy while we append and delete
    with open(blocker, "wb") as f:
        f.truncate(1 << 30)
    PREFETCHER.prefetch(str(blocker), 1 << 30)
    path = tmp_path / "a"
    with BigArray(path, data_page_size=4096) as arr:  # prefetch on (the default); 40 items a page
        for _ in range(400):  # one by one: each page queues the read-ahead of the next
            arr.append(b"y" * 100)
        arr.remove_before_index(280)  # deletes pages 0-6
        assert PREFETCHER.wait_idle(60), "the prefetch thread did not finish its queue within 60 s"
        pages = sorted(int(p.name[5:-4]) for p in (path / "data").iterdir())
        assert pages == [7, 8, 9, 10]  # 10: the read-ahead of the head's page
        assert arr.read_range(280) == [b"y" * 100] * 120


def test_read_range_view_reads_in_place_until_released(tmp_path):
    """read_range_view: items back to back on one page come as a read-only view of the
    mapping (what read_range_blob would copy), which keeps the page mapped, even once
    retention deleted it, until release(); across pages they come as a copy."""
    path = tmp_path / "a"
    with open_array(path, data_page_size=64 * 1024, prefetch=False) as arr:
        items = [bytes([i]) * 1000 for i in range(200)]  # 64 a page
        arr.append_many(items)
        lengths, data, release = arr.read_range_view(3, max_bytes=10_000)
        assert isinstance(data, memoryview) and data.readonly
        assert lengths.tolist() == [1000] * 10 and bytes(data) == b"".join(items[3:13])
        assert (lengths, bytes(data)) == (lengths, arr.read_range_blob(3, max_bytes=10_000)[1])
        arr.remove_before_index(100)  # deletes page 0 under the view
        assert not (path / "data" / "page-0.dat").exists()
        assert bytes(data[:1000]) == items[3]  # still mapped, though the file is gone
        assert any("/data/page-0.dat" in f for f in mapped_files(path))
        release()
        assert not any("/data/page-0.dat" in f for f in mapped_files(path)), "the page stayed mapped after release"
        with pytest.raises(ValueError):
            bytes(data)  # a released view cannot be read any more
        lengths, data, release = arr.read_range_view(120, max_bytes=20_000)  # pages 1 and 2
        assert isinstance(data, bytes) and data == b"".join(items[120:140])
        release()
        lengths, data, release = arr.read_range_view(arr.head)
        assert len(lengths) == 0 and data == b""
        release()


def _mapped_kib(path) -> int:
    """KiB of ``path``'s mapping in this process's page tables (smaps ``Rss``)."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(" " + str(path)):
            for field in lines[i + 1 :]:
                if field.startswith("Rss:"):
                    return int(field.split()[1])
    raise AssertionError(f"{path} is not mapped")


@pytest.mark.parametrize("writer", ["fast", "slow", "no prefetch"])
def test_a_fast_writer_finds_its_next_reserved_bytes_mapped(tmp_path, monkeypatch, writer):
    """With prefetch, a writer that needs each next step of its data page soon (within
    _POPULATE_WITHIN_S) has it reserved early and faulted into its mapping by the prefetch
    thread (MADV_POPULATE_WRITE) before it gets there, so its copies take no page fault.
    Nothing past the reserved bytes is touched (a fault into an unreserved hole of a full
    disk would be a SIGBUS). A slow writer, or one without prefetch, faults in only what
    it writes."""
    from bigarray import write as write_module
    from bigarray.prefetch import PREFETCHER

    if writer != "no prefetch" and not PREFETCHER.populates:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
    if writer == "slow":
        monkeypatch.setattr(write_module, "_POPULATE_WITHIN_S", 0.0)
    path = tmp_path / "a"
    prefetch = writer != "no prefetch"
    with BigArray(path, data_page_size=8 << 20, reserve_step=1 << 20, prefetch=prefetch) as arr:
        page = path / "data" / "page-0.dat"
        for _ in range(1100):  # one by one past 1 MB: steps of 256 KiB, 512 KiB, then 1 MiB
            arr.append(b"x" * 1000)
        assert PREFETCHER.wait_idle(60)
        mapped = _mapped_kib(page)
        reserved = os.stat(page).st_blocks // 2  # KiB allocated
        written = 1100 * 1000 // 1024
        assert arr.read_range(0) == [b"x" * 1000] * 1100
    if writer == "fast":
        assert written + 256 < mapped == reserved, (mapped, reserved, written)
    else:
        assert written <= mapped <= written + 4, (mapped, written)
        assert reserved >= written + 256, (reserved, written)  # reserved all the same
