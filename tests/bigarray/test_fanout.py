"""Unit tests of FanoutQueue: groups, positions, retention, names, clean-up."""

from __future__ import annotations

import logging
import os
import struct

import pytest

from bigarray import (
    ArrayClosedError,
    FanoutQueue,
    IndexOutOfRangeError,
    InvalidNameError,
)

from ._util import page_files

pytestmark = pytest.mark.timeout(60)

PAGE = 4096


def open_queue(path, **kw) -> FanoutQueue:
    kw.setdefault("data_page_size", PAGE)
    return FanoutQueue(path, **kw)


def snapshot(path) -> list[str]:
    """Every file and directory under path (relative), sorted."""
    out = []
    for dirpath, dirs, files in os.walk(path):
        rel = os.path.relpath(dirpath, path)
        out += [os.path.join(rel, d) + "/" for d in dirs]
        out += [os.path.join(rel, f) for f in files]
    return sorted(out)


def test_enqueue_dequeue(tmp_path):
    with open_queue(tmp_path / "q") as q:
        assert q.enqueue(b"a") == 0
        assert q.enqueue_many([b"b", b"c", b"d"]) == 1
        assert q.enqueue_many([]) == 4
        assert q.dequeue("g1") == b"a"
        assert q.dequeue("g1") == b"b"
        assert q.dequeue("g2") == b"a"  # each group reads everything
        assert q.dequeue_many("g1") == [b"c", b"d"]
        assert q.dequeue("g1") is None
        assert q.dequeue_many("g1") == []
        assert q.dequeue_many("g2", max_items=2) == [b"b", b"c"]
        assert q.size() == 4
        assert q.size("g1") == 0
        assert q.size("g2") == 1
        assert q.head == 4 and q.tail == 0 and not q.is_empty
        assert q.get(3) == b"d"
        assert q.read_range(1, max_items=2) == [b"b", b"c"]


def test_dequeue_many_limits(tmp_path):
    with open_queue(tmp_path / "q") as q:
        q.enqueue_many([b"x" * 10] * 10 + [b"L" * 3000, b"y"])
        assert q.dequeue_many("g", max_bytes=35) == [b"x" * 10] * 3
        assert q.dequeue_many("g", max_items=2, max_bytes=1000) == [b"x" * 10] * 2
        assert q.dequeue_many("g", max_items=100, max_bytes=40) == [b"x" * 10] * 4
        assert q.dequeue_many("g", max_bytes=50) == [b"x" * 10]
        # an item larger than max_bytes is returned on its own: the group is not stuck
        assert q.dequeue_many("g", max_bytes=50) == [b"L" * 3000]
        assert q.dequeue_many("g", max_bytes=50) == [b"y"]
        assert q.dequeue_many("g", max_bytes=50) == []


def test_dequeue_indexed_says_where_the_items_are(tmp_path):
    with open_queue(tmp_path / "q") as q:
        assert q.dequeue_indexed("g", max_items=5) == (0, [])
        q.enqueue_many([b"%d" % i for i in range(6)])
        assert q.dequeue_indexed("g", max_items=2) == (0, [b"0", b"1"])
        assert q.dequeue_indexed("g", max_bytes=1) == (2, [b"2"])
        q.remove_before_index(4)  # retention overtakes the group: it moves to the tail
        assert q.dequeue_indexed("g") == (4, [b"4", b"5"])
        assert q.dequeue_indexed("g") == (6, [])
        assert q.timestamps(4, 2) == [q.timestamp(4), q.timestamp(5)]


def test_dequeue_blob_is_dequeue_indexed_as_one_blob(tmp_path):
    with open_queue(tmp_path / "q") as q:
        lengths, data = q.dequeue_blob("g", max_bytes=100)[1:]
        assert (lengths.tolist(), data) == ([], b"")
        items = [b"%d" % i * (i % 7) for i in range(300)]  # crosses several 4 KiB data pages
        q.enqueue_many(items)
        pos = 0
        while pos < len(items):
            first, lengths, data = q.dequeue_blob("g", max_bytes=1000)
            assert first == pos and len(lengths) > 0
            assert data == b"".join(items[pos : pos + len(lengths)])
            assert lengths.tolist() == [len(x) for x in items[pos : pos + len(lengths)]]
            pos += len(lengths)
        assert q.group_index("g") == 300 and q.dequeue_blob("g")[0] == 300
        with pytest.raises(IndexOutOfRangeError):
            q.read_range_blob(301)


def test_peek_does_not_move(tmp_path):
    with open_queue(tmp_path / "q") as q:
        assert q.peek("g") is None
        q.enqueue_many([b"a", b"b"])
        assert q.peek("g") == b"a"
        assert q.peek("g") == b"a"
        assert q.dequeue("g") == b"a"
        assert q.peek("g") == b"b"
        assert q.dequeue("g") == b"b"
        assert q.peek("g") is None


def test_group_index_and_size(tmp_path):
    with open_queue(tmp_path / "q") as q:
        q.enqueue_many([b"%d" % i for i in range(10)])
        assert q.group_index("g") == 0
        assert q.size("g") == 10
        q.dequeue_many("g", max_items=4)
        assert q.group_index("g") == 4
        assert q.size("g") == 6
        q.enqueue(b"10")
        assert q.size("g") == 7


def test_unknown_group_is_not_created(tmp_path):
    path = tmp_path / "q"
    with open_queue(path) as q:
        q.enqueue_many([b"a", b"b", b"c"])
        q.remove_before_index(1)
        before = snapshot(path)
        assert q.size("ghost") == 2  # what a new group would see
        assert q.group_index("ghost") == 1
        assert q.peek("ghost") == b"b"
        q.remove_group("ghost")
        assert q.groups() == []
        assert snapshot(path) == before
        assert not any(n.startswith("front_index_") for n in os.listdir(path))
    with open_queue(path) as q:
        assert q.groups() == []


def test_new_group_starts_at_tail(tmp_path):
    with open_queue(tmp_path / "q") as q:
        q.enqueue_many([b"%d" % i for i in range(10)])
        q.remove_before_index(6)
        assert q.dequeue("late") == b"6"
        assert q.group_index("late") == 7
        q.reset_group("other", 8)  # reset creates the group at the given index
        assert q.dequeue("other") == b"8"
        assert q.groups() == ["late", "other"]


def test_group_overtaken_by_retention_moves_to_tail(tmp_path, caplog):
    with open_queue(tmp_path / "q") as q:
        q.enqueue_many([b"%d" % i for i in range(20)])
        assert q.dequeue_many("slow", max_items=3) == [b"0", b"1", b"2"]
        q.remove_before_index(15)
        assert q.group_index("slow") == 15
        assert q.size("slow") == 5
        assert q.peek("slow") == b"15"
        with caplog.at_level(logging.WARNING, logger="bigarray"):
            assert q.dequeue("slow") == b"15"
        skipped = [r for r in caplog.records if "skipped" in r.getMessage()]
        assert len(skipped) == 1
        msg = skipped[0].getMessage()
        assert "'slow'" in msg
        assert "12 item" in msg
        assert skipped[0].levelno >= logging.WARNING
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="bigarray"):
            assert q.dequeue("slow") == b"16"
        assert not [r for r in caplog.records if "skipped" in r.getMessage()]


def test_reset_group(tmp_path):
    with open_queue(tmp_path / "q") as q:
        q.enqueue_many([b"%d" % i for i in range(5)])
        q.dequeue_many("g")
        q.reset_group("g", 2)
        assert q.dequeue("g") == b"2"
        q.reset_group("g", 5)  # head is allowed: nothing left
        assert q.dequeue("g") is None
        q.reset_group("g", 0)
        assert q.dequeue("g") == b"0"
        q.remove_before_index(3)
        for bad in (2, 6, -1):
            with pytest.raises(IndexOutOfRangeError):
                q.reset_group("g", bad)
        assert q.group_index("g") == 3  # unchanged (tail-clamped) after the errors


def test_groups_and_remove_group(tmp_path):
    path = tmp_path / "q"
    with open_queue(path) as q:
        q.enqueue_many([b"a", b"b"])
        q.dequeue("b-group")
        q.dequeue("a-group")
        assert q.groups() == ["a-group", "b-group"]
        assert os.path.isdir(path / "front_index_a-group")
        q.remove_group("a-group")
        assert q.groups() == ["b-group"]
        assert not os.path.exists(path / "front_index_a-group")
        q.remove_group("a-group")  # unknown: no-op
        assert q.dequeue("a-group") == b"a"  # a new group starts again at tail
    with open_queue(path) as q:
        assert q.groups() == ["a-group", "b-group"]


def test_positions_persist_across_reopen(tmp_path):
    path = tmp_path / "q"
    with open_queue(path) as q:
        q.enqueue_many([b"x" * 700 for _ in range(30)])
        q.dequeue_many("g1", max_items=7)
        q.dequeue_many("g2", max_items=19)
        q.dequeue("g3")
        q.reset_group("g3", 0)
    with open_queue(path) as q:
        assert q.groups() == ["g1", "g2", "g3"]
        assert [q.group_index(g) for g in ("g1", "g2", "g3")] == [7, 19, 0]
        assert q.size("g2") == 11
        q.enqueue(b"new")
        assert q.dequeue_many("g2") == [b"x" * 700] * 11 + [b"new"]
    with open_queue(path) as q:
        assert q.group_index("g2") == 31
        assert q.dequeue("g2") is None


def test_group_position_file_format(tmp_path):
    path = tmp_path / "q"
    with open_queue(path) as q:
        q.enqueue_many([b"a"] * 5)
        q.dequeue_many("grp", max_items=3)
        q.flush()
        raw = (path / "front_index_grp" / "page-0.dat").read_bytes()
        assert len(raw) == 8
        assert struct.unpack(">q", raw) == (3,)


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "a/b",
        "/abs",
        "a\x00b",
        "\x1f",
        "tab\there",
        "\ue000",
        "\U000f0000",
        "x" * 300,
        "é" * 122,
        "日" * 82,
    ],
)
def test_invalid_group_names(tmp_path, name):
    path = tmp_path / "q"
    with open_queue(path) as q:
        q.enqueue(b"a")
        before = snapshot(path)
        parent_before = sorted(os.listdir(tmp_path))
        calls = [
            lambda: q.dequeue(name),
            lambda: q.dequeue_many(name, max_items=1),
            lambda: q.peek(name),
            lambda: q.size(name),
            lambda: q.group_index(name),
            lambda: q.reset_group(name, 0),
            lambda: q.remove_group(name),
        ]
        for call in calls:
            with pytest.raises(InvalidNameError):
                call()
        assert q.groups() == []
        assert snapshot(path) == before
        assert sorted(os.listdir(tmp_path)) == parent_before


def test_longest_valid_group_names(tmp_path):
    """255 - len('front_index_') = 243 bytes of UTF-8 is the limit."""
    path = tmp_path / "q"
    names = ["x" * 243, "é" * 121 + "x", "ok name with spaces", "ünïcödé", "a.b", "..."]
    with open_queue(path) as q:
        q.enqueue(b"a")
        for name in names:
            assert q.dequeue(name) == b"a"
        assert q.groups() == sorted(names)
    with open_queue(path) as q, pytest.raises(InvalidNameError):
        q.dequeue("x" * 244)
    with open_queue(path) as q:
        assert q.groups() == sorted(names)


def test_auto_cleanup_deletes_pages_all_groups_passed(tmp_path):
    path = tmp_path / "q"
    item = b"c" * 1000  # 4 per page
    with open_queue(path, auto_cleanup=True, cleanup_interval_s=0, prefetch=False) as q:
        q.enqueue_many([item] * 100)  # 25 data pages
        q.reset_group("fast", 0)
        q.reset_group("slow", 0)
        q.dequeue_many("fast", max_items=81)
        assert q.tail == 0  # held back by the slow group
        assert len(page_files(path / "data")) == 25
        q.dequeue_many("slow", max_items=61)
        assert q.tail == 61
        assert page_files(path / "data") == [f"page-{n}.dat" for n in range(15, 25)]
        assert q.dequeue("slow") == item
        q.dequeue_many("fast")
        q.dequeue_many("slow")
        assert q.tail == 100
        assert page_files(path / "data") == ["page-24.dat"]
        assert q.enqueue(b"more") == 100
        assert q.dequeue("fast") == b"more"


def test_auto_cleanup_off_by_default(tmp_path):
    with open_queue(tmp_path / "q") as q:
        q.enqueue_many([b"x"] * 10)
        q.dequeue_many("g")
        assert q.tail == 0


def test_cleanup(tmp_path):
    with open_queue(tmp_path / "q") as q:
        q.enqueue_many([b"%d" % i for i in range(10)])
        q.cleanup()  # no groups: nothing
        assert q.tail == 0 and q.size() == 10
        q.dequeue_many("a", max_items=4)
        q.dequeue_many("b", max_items=6)
        q.cleanup()
        assert q.tail == 4
        assert q.dequeue("a") == b"4"
        q.remove_group("a")
        q.cleanup()
        assert q.tail == 6
        q.dequeue_many("b")
        q.cleanup()
        assert q.tail == 10 and q.is_empty


def test_passthrough_retention_and_time(tmp_path, clock):
    with open_queue(tmp_path / "q", clock=clock) as q:
        clock.now = 1_000
        q.enqueue(b"a")
        clock.now = 2_000
        q.enqueue(b"b")
        assert q.timestamp(1) == 2_000
        assert q.find_closest_index(1_900) == 1
        assert q.find_closest_index(FanoutQueue.EARLIEST) == 0
        assert q.find_closest_index(FanoutQueue.LATEST) == 2
        q.remove_before(2_000)
        assert q.tail == 1
        assert q.back_file_size() > 0
        q.limit_back_file_size(10**12)
        assert q.tail == 1


def test_closed_queue(tmp_path):
    q = open_queue(tmp_path / "q")
    q.enqueue(b"a")
    q.dequeue("g")
    q.close()
    q.close()
    assert q.closed
    for call in (
        lambda: q.enqueue(b"x"),
        lambda: q.enqueue_many([b"x"]),
        lambda: q.dequeue("g"),
        lambda: q.dequeue("new"),
        lambda: q.dequeue_many("g"),
        lambda: q.peek("g"),
        lambda: q.size("g"),
        lambda: q.group_index("g"),
        lambda: q.reset_group("g", 0),
        lambda: q.remove_group("g"),
        lambda: q.get(0),
        lambda: q.cleanup(),
        q.__enter__,
    ):
        with pytest.raises(ArrayClosedError):
            call()
    with open_queue(tmp_path / "q") as q2:
        assert q2.group_index("g") == 1


def test_bad_group_folders_on_disk_are_ignored(tmp_path, caplog):
    path = tmp_path / "q"
    with open_queue(path) as q:
        q.enqueue_many([b"a", b"b"])
        q.dequeue("good")
    os.makedirs(path / "front_index_")  # empty name
    os.makedirs(path / "front_index_bad\x01name")
    (path / "front_index_afile").write_bytes(b"not a folder")
    with caplog.at_level(logging.WARNING, logger="bigarray"), open_queue(path) as q:
        assert q.groups() == ["good"]
        assert q.dequeue("good") == b"b"
    assert len([r for r in caplog.records if "ignoring group folder" in r.getMessage()]) == 2
