"""Damaged ends and crashes, as ordinary tests: the files are damaged by hand, the
array reopened. Exactly a prefix of the items must survive, intact, head rolled back,
and the dropped count logged."""

from __future__ import annotations

import logging
import os
import random
import struct

import pytest

from bigarray import BigArray, BigArrayError, CorruptArrayError, FanoutQueue

from ._util import make_item

pytestmark = pytest.mark.timeout(60)

PAGE = 4096
META = struct.Struct(">qq")


def build(path, items, *, page_size=PAGE, batch=7):
    with BigArray(path, data_page_size=page_size, prefetch=False) as arr:
        for k in range(0, len(items), batch):
            if (k // batch) % 2:
                arr.append_many(items[k : k + batch])
            else:
                for item in items[k : k + batch]:
                    arr.append(item)
        assert arr.head == len(items)


def reopen_and_check(path, items, caplog, expected_head):
    """Reopen; check head, every item below it and the warning naming the count."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bigarray"):
        arr = BigArray(path)
    try:
        assert arr.head == expected_head
        assert arr.recovery == (len(items), expected_head) and arr.recovery.dropped == len(items) - expected_head
        assert arr.read_range(arr.tail) == items[arr.tail : expected_head]
        for i in range(arr.tail, expected_head):
            assert arr.get(i) == items[i], i
        dropped = len(items) - expected_head
        msgs = [r.getMessage() for r in caplog.records if r.name.startswith("bigarray") and "dropped" in r.getMessage()]
        if dropped:
            assert len(msgs) == 1, msgs
            assert f"dropped {dropped} " in msgs[0]
            assert str(path) in msgs[0]
        else:
            assert msgs == []
        # the array goes on from the new head, and survives another reopen unchanged
        extra = [make_item(expected_head + k, 50 + 300 * k) for k in range(5)]
        assert arr.append(extra[0]) == expected_head
        assert arr.append_many(extra[1:]) == expected_head + 1
    finally:
        arr.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bigarray"), BigArray(path) as arr:
        assert arr.head == expected_head + 5
        assert arr.read_range(arr.tail) == items[arr.tail : expected_head] + extra
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]


def items_100(size=100):
    return [make_item(i, size) for i in range(100)]  # 40 per 4 KiB page: pages 0..2


def test_intact_array_drops_nothing(tmp_path, caplog):
    items = items_100()
    build(tmp_path / "a", items)
    reopen_and_check(tmp_path / "a", items, caplog, 100)


def test_truncated_last_data_page(tmp_path, caplog):
    items = items_100()
    build(tmp_path / "a", items)
    # page 2 holds items 80..99 at offsets 0, 100, ...: keep 80..89 whole, 90 cut
    os.truncate(tmp_path / "a" / "data" / "page-2.dat", 1050)
    reopen_and_check(tmp_path / "a", items, caplog, 90)


def test_last_data_page_truncated_to_nothing(tmp_path, caplog):
    items = items_100()
    build(tmp_path / "a", items)
    os.truncate(tmp_path / "a" / "data" / "page-2.dat", 0)
    reopen_and_check(tmp_path / "a", items, caplog, 80)


def test_missing_last_data_page(tmp_path, caplog):
    items = items_100()
    build(tmp_path / "a", items)
    os.unlink(tmp_path / "a" / "data" / "page-2.dat")
    reopen_and_check(tmp_path / "a", items, caplog, 80)


def test_truncated_last_data_page_with_more_items_than_the_check_window(tmp_path, caplog):
    """The last data page holds 10,000 items, more than the 4096 checked by default;
    the page is cut after its first 100. Items whose bytes are gone must not stay
    readable (they would read back as zeros)."""
    per_page = 16_384
    items = [make_item(i, 16) for i in range(per_page + 10_000)]  # page 0 full, page 1 last
    build(tmp_path / "a", items, page_size=16 * per_page, batch=1000)
    assert sorted(os.listdir(tmp_path / "a" / "data")) == ["page-0.dat", "page-1.dat"]
    os.truncate(tmp_path / "a" / "data" / "page-1.dat", 16 * 100)
    reopen_and_check(tmp_path / "a", items, caplog, per_page + 100)


@pytest.mark.parametrize(("first", "count"), [(99, 1), (95, 5), (90, 3), (0, 2)])
def test_garbage_over_index_items(tmp_path, caplog, first, count):
    items = items_100()
    build(tmp_path / "a", items)
    rng = random.Random(first * 1000 + count)
    with open(tmp_path / "a" / "index" / "page-0.dat", "r+b") as f:
        f.seek(first * 32)
        f.write(rng.randbytes(32 * count))
    reopen_and_check(tmp_path / "a", items, caplog, first)


def test_index_items_pointing_past_their_data_page(tmp_path, caplog):
    items = items_100()
    build(tmp_path / "a", items)
    with open(tmp_path / "a" / "index" / "page-0.dat", "r+b") as f:
        f.seek(97 * 32 + 12)
        f.write(struct.pack(">i", PAGE))  # length: offset + length beyond the page
    reopen_and_check(tmp_path / "a", items, caplog, 97)


def test_truncated_index_page(tmp_path, caplog):
    items = items_100()
    build(tmp_path / "a", items)
    os.truncate(tmp_path / "a" / "index" / "page-0.dat", 50 * 32 + 10)  # items 50.. gone
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bigarray"), BigArray(tmp_path / "a") as arr:
        head = arr.head
        assert head <= 50
        assert [arr.get(i) for i in range(head)] == items[:head]
    assert [r for r in caplog.records if f"dropped {100 - head} " in r.getMessage()]


def test_truncated_index_page_beyond_the_check_window(tmp_path, caplog):
    """140,000 items: index page 1 holds 8,928 of them, more than the 4096 checked
    by default. Cut to nothing, none of them may stay readable (they would read as
    empty items)."""
    path = tmp_path / "a"
    n = 140_000
    items = [i.to_bytes(4, "big") for i in range(n)]
    with BigArray(path, data_page_size=1 << 20) as arr:
        arr.append_many(items)
    os.truncate(path / "index" / "page-1.dat", 0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bigarray"), BigArray(path) as arr:
        head = arr.head
        assert head <= 1 << 17
        bad = [i for i in range(head) if arr.get(i) != items[i]]
        assert bad == [], f"{len(bad)} items read back wrong, from index {bad[:1]}"
        assert arr.read_range(0) == items[:head]
    assert [r for r in caplog.records if f"dropped {n - head} " in r.getMessage()]


@pytest.mark.parametrize("beyond", [1, 7, 40, 1000])
def test_head_beyond_written_items(tmp_path, caplog, beyond):
    items = items_100()
    build(tmp_path / "a", items)
    with open(tmp_path / "a" / "meta_data" / "page-0.dat", "r+b") as f:
        f.write(struct.pack(">q", 100 + beyond))
    # the index slots past 100 hold zeros: reopen must drop exactly them
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bigarray"), BigArray(tmp_path / "a") as arr:
        assert arr.head == 100
        assert arr.read_range(0) == items
    assert [r for r in caplog.records if f"dropped {beyond} " in r.getMessage()]


def test_head_far_beyond_written_items(tmp_path, caplog):
    """Head set 5000 items past the last written one (more than the check window):
    the zero-filled index slots are not items (a real append never writes timestamp 0)."""
    items = items_100()
    build(tmp_path / "a", items)
    with open(tmp_path / "a" / "meta_data" / "page-0.dat", "r+b") as f:
        f.write(struct.pack(">q", 5100))
    with caplog.at_level(logging.WARNING, logger="bigarray"), BigArray(tmp_path / "a") as arr:
        head = arr.head
        assert head <= 100
        assert [arr.get(i) for i in range(head)] == items[:head]


def test_head_beyond_into_a_missing_index_page(tmp_path, caplog):
    items = items_100()
    build(tmp_path / "a", items)
    with open(tmp_path / "a" / "meta_data" / "page-0.dat", "r+b") as f:
        f.write(struct.pack(">q", (1 << 17) + 5))
    with caplog.at_level(logging.WARNING, logger="bigarray"), BigArray(tmp_path / "a") as arr:
        head = arr.head
        assert head <= 100
        assert [arr.get(i) for i in range(head)] == items[:head]


def test_group_beyond_rolled_back_head_sees_new_items(tmp_path):
    """A group that had read items that were then lost to damage must not skip the
    items appended after recovery (nor report a negative size)."""
    path = tmp_path / "q"
    with FanoutQueue(path, data_page_size=PAGE, prefetch=False) as q:
        q.enqueue_many(items_100())
        assert len(q.dequeue_many("g")) == 100
    os.truncate(path / "data" / "page-2.dat", 1050)  # items 90.. lost
    with FanoutQueue(path) as q:
        assert q.head == 90
        assert 0 <= q.size("g") <= 0
        q.enqueue(b"after recovery")
        assert q.size("g") == 1
        assert q.dequeue("g") == b"after recovery"


def test_items_stamped_by_a_zero_clock_survive_reopen(tmp_path, caplog):
    """A clock at (or before) the epoch must not make an item look unwritten."""
    path = tmp_path / "a"
    with BigArray(path, data_page_size=PAGE, clock=lambda: 0) as arr:
        arr.append(b"zero")
        arr.append_many([b"one", b"two"])
    with BigArray(path, data_page_size=PAGE, clock=lambda: -5) as arr:
        arr.append(b"three")
    with caplog.at_level(logging.WARNING, logger="bigarray"), BigArray(path) as arr:
        assert arr.read_range(0) == [b"zero", b"one", b"two", b"three"]
        assert [arr.timestamp(i) for i in range(4)] == sorted(arr.timestamp(i) for i in range(4))
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]


@pytest.mark.parametrize(("head", "tail"), [(5, 6), (0, 1), (10, -1), (-3, -5)])
def test_inconsistent_meta_page_is_corrupt(tmp_path, head, tail):
    path = tmp_path / "a"
    build(path, items_100()[:10])
    with open(path / "meta_data" / "page-0.dat", "r+b") as f:
        f.write(META.pack(head, tail))
    with pytest.raises(CorruptArrayError) as info:
        BigArray(path)
    assert isinstance(info.value, BigArrayError)
    assert str(tail) in str(info.value)
    # the failed open released the directory: fixing the meta page lets it open
    with open(path / "meta_data" / "page-0.dat", "r+b") as f:
        f.write(META.pack(10, 0))
    with BigArray(path) as arr:
        assert arr.head == 10


def test_corrupt_extras_file(tmp_path):
    path = tmp_path / "a"
    build(path, items_100()[:10])
    (path / "bigarray.json").write_text("{not json")
    with pytest.raises(CorruptArrayError):
        BigArray(path)
    (path / "bigarray.json").unlink()  # without it, the size comes from the data pages
    with BigArray(path) as arr:
        assert arr.data_page_size == PAGE
        assert arr.read_range(0) == items_100()[:10]


def test_damage_below_tail_is_ignored(tmp_path, caplog):
    """Only the end is checked; after retention the old pages are gone anyway."""
    items = items_100()
    build(tmp_path / "a", items)
    with BigArray(tmp_path / "a") as arr:
        arr.remove_before_index(85)
    with open(tmp_path / "a" / "index" / "page-0.dat", "r+b") as f:
        f.seek(10 * 32)
        f.write(b"\xff" * 32)  # below tail: not an item any more
    with caplog.at_level(logging.WARNING, logger="bigarray"), BigArray(tmp_path / "a") as arr:
        assert (arr.tail, arr.head) == (85, 100)
        assert arr.read_range(85) == items[85:]
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]
