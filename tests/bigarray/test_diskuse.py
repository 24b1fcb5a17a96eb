"""Disk use follows the data: page files are sparse at full size and disk space is
reserved in steps ahead of the writer (see bigarray/page.py). Measured as allocated
blocks (st_blocks), not file sizes."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from bigarray import BigArray, FanoutQueue
from bigarray import format as fmt
from bigarray.page import DEFAULT_RESERVE_STEP, FIRST_RESERVE_STEP

from ._util import PYTHON, ROOT, allocated_bytes, item_index, make_item, page_files

pytestmark = pytest.mark.timeout(120)

KIB = 1024
MIB = 1024 * 1024


def blocks(path) -> int:
    return os.stat(path).st_blocks * 512


def written_end(arr: BigArray) -> int:
    """End offset, in its data page, of the last item appended."""
    _page, off, length, _ts = arr._index_item(arr.head - 1)
    return off + length


def test_a_topic_with_a_few_small_items_takes_little_disk(tmp_path):
    """The issue: 132 MiB per topic whatever it held (two whole 128 MiB data pages and
    a 4 MiB index page, all allocated). Now: the first reservation steps only."""
    path = tmp_path / "topic"
    with FanoutQueue(path) as q:  # the defaults: 128 MiB data pages, as Java Luxun
        q.enqueue_many([make_item(i, 100) for i in range(10)])
        q.enqueue(make_item(10, 300))
        assert q.dequeue("analytics") is not None
        assert len(q.dequeue_many("archive", max_items=5)) == 5
        used_open = allocated_bytes(path)
    used = allocated_bytes(path)
    assert used < 16 * MIB
    # index and data: one first step each; meta, two groups and bigarray.json: a block each
    assert used_open <= 2 * FIRST_RESERVE_STEP + 64 * KIB, used_open
    assert used <= 2 * FIRST_RESERVE_STEP + 64 * KIB, used
    # ...while every page file has its full size, as Java's FileChannel.map expects
    assert os.path.getsize(path / "data" / "page-0.dat") == fmt.DEFAULT_DATA_PAGE_SIZE
    assert os.path.getsize(path / "index" / "page-0.dat") == fmt.INDEX_PAGE_SIZE
    assert page_files(path / "data") == ["page-0.dat"]
    with FanoutQueue(path) as q:  # reopened in the middle of its page: appends go on
        assert [item_index(x) for x in q.dequeue_many("analytics")] == list(range(1, 11))
        q.enqueue_many([make_item(11 + i, 100) for i in range(10)])
        assert [item_index(q.get(i)) for i in range(q.head)] == list(range(21))
    assert allocated_bytes(path) <= 2 * FIRST_RESERVE_STEP + 64 * KIB


def test_disk_use_follows_the_data(tmp_path):
    path = tmp_path / "a"
    item = b"d" * 100_000
    with BigArray(path) as arr:
        arr.append_many([item] * 200)  # 20 MB into the first 128 MiB page
        for _ in range(10):
            arr.append(item)
        written = 210 * len(item)
        data0 = blocks(path / "data" / "page-0.dat")
        assert written <= data0 <= written + DEFAULT_RESERVE_STEP
        # past an eighth of its page, the writer had the next page read ahead: it exists
        # (sparse, full size) with its first step reserved only
        # (the prefetch thread creates the file, then sizes it: wait for both, not just the name)
        page1 = path / "data" / "page-1.dat"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
            os.path.exists(page1) and os.path.getsize(page1) == fmt.DEFAULT_DATA_PAGE_SIZE
        ):
            time.sleep(0.01)
        assert os.path.getsize(page1) == fmt.DEFAULT_DATA_PAGE_SIZE
        assert blocks(page1) <= FIRST_RESERVE_STEP
        assert arr.allocated_size() == allocated_bytes(path / "data") + allocated_bytes(path / "index")
        assert arr.back_file_size() == 2 * fmt.DEFAULT_DATA_PAGE_SIZE + fmt.INDEX_PAGE_SIZE  # Java's sense


def test_reservations_grow_geometrically_up_to_the_step(tmp_path):
    """First step 256 KiB, then each doubles what the page holds, capped by the page."""
    path = tmp_path / "a"
    page0 = path / "data" / "page-0.dat"
    with BigArray(path, data_page_size=2 * MIB, prefetch=False) as arr:
        arr.append(b"x" * 1000)
        assert blocks(page0) == FIRST_RESERVE_STEP
        seen = []
        while arr.head < 2000:  # 2 MB: fills most of the page
            arr.append(b"x" * 1000)
            end, got = written_end(arr), blocks(page0)
            assert end <= got, f"bytes written up to {end} but only {got} reserved"
            if not seen or seen[-1] != got:
                seen.append(got)
        assert seen == [256 * KIB, 512 * KIB, 1 * MIB, 2 * MIB]


#: Blocks a file system may allocate beyond what was reserved or written (ext4 rounds
#: to blocks and can allocate a few more when it writes dirty mapped pages back: seen
#: once here, 4 KiB over, under load).
FS_SLACK = 16 * KIB


def test_a_small_step_reserves_step_by_step_and_so_does_the_index(tmp_path):
    path = tmp_path / "a"
    step = 64 * KIB
    with BigArray(path, data_page_size=1 * MIB, reserve_step=step, prefetch=False) as arr:
        for i in range(3000):  # about 3 data pages, and index slots across several steps
            if i % 3:
                arr.append(make_item(i, 1000))
            else:
                arr.append_many([make_item(i, 1000)])
            page_no = arr._index_item(arr.head - 1)[0]
            got = blocks(path / "data" / f"page-{page_no}.dat")
            assert written_end(arr) <= got <= written_end(arr) + step + FS_SLACK, (i, got)
            index_got = blocks(path / "index" / "page-0.dat")
            assert arr.head * fmt.INDEX_ITEM_SIZE <= index_got <= arr.head * fmt.INDEX_ITEM_SIZE + step + FS_SLACK
        assert len(page_files(path / "data")) == 3
        assert [item_index(x) for x in arr.read_range(0)] == list(range(3000))


def test_a_batch_larger_than_a_step_is_reserved_whole_before_it_is_copied(tmp_path):
    path = tmp_path / "a"
    with BigArray(path, data_page_size=4 * MIB, reserve_step=64 * KIB, prefetch=False) as arr:
        arr.append_many([make_item(i, 3000) for i in range(1000)])  # 3 MB at once
        assert blocks(path / "data" / "page-0.dat") >= 3_000_000
        assert [item_index(x) for x in arr.read_range(0)] == list(range(1000))


def test_next_page_read_ahead_reserves_only_its_first_step(tmp_path):
    path = tmp_path / "a"
    with BigArray(path, data_page_size=4 * MIB, reserve_step=64 * KIB) as arr:
        arr.append_many([b"p" * 1000] * 600)  # past an eighth of page 0
        page1 = path / "data" / "page-1.dat"
        deadline = time.monotonic() + 10
        while not (os.path.exists(page1) and blocks(page1)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.path.getsize(page1) == 4 * MIB
        assert blocks(page1) == 64 * KIB


def wait_for_blocks(path, timeout_s: float = 10.0) -> int:
    """Allocated bytes of ``path`` once the read-ahead thread has created and reserved it."""
    deadline = time.monotonic() + timeout_s
    while not (os.path.exists(path) and blocks(path)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return blocks(path) if os.path.exists(path) else -1


def test_appends_one_by_one_read_the_next_pages_ahead(tmp_path):
    """append's inlined path stops where the next page is to be read ahead: one by
    one, the item that takes the writer past an eighth of its data page creates the
    next data page, and the item at the middle slot of an index page the next index
    page, each with only its first step reserved, as append_many does. (A step of
    12 KiB: reservations of 64 KiB or of doubling sizes would end exactly at both
    points, which takes every writer through its general path there anyway.)"""
    path = tmp_path / "a"
    with BigArray(path, data_page_size=4 * MIB, reserve_step=12 * KIB) as arr:
        for i in range(524):  # 524 000 bytes: not past an eighth of the page (524 288)
            arr.append(make_item(i, 1000))
        time.sleep(0.2)
        assert not os.path.exists(path / "data" / "page-1.dat")
        arr.append(make_item(524, 1000))
        assert wait_for_blocks(path / "data" / "page-1.dat") == 12 * KIB
        half = fmt.INDEX_ITEMS_PER_PAGE // 2
        for _ in range(half - arr.head):
            arr.append(b"")
        time.sleep(0.2)
        assert not os.path.exists(path / "index" / "page-1.dat")
        arr.append(b"")  # index item in the middle slot of index page 0
        assert wait_for_blocks(path / "index" / "page-1.dat") == 12 * KIB
        assert arr.head == half + 1
        assert [item_index(x) for x in arr.read_range(0, max_items=525)] == list(range(525))


@pytest.mark.parametrize("step", [0, 1000, 4096 + 1])
def test_reserve_step_must_be_a_multiple_of_4096(tmp_path, step):
    with pytest.raises(ValueError, match="reserve_step"):
        BigArray(tmp_path / "a", reserve_step=step)


def test_a_short_or_fully_allocated_page_written_elsewhere_is_used_as_it_is(tmp_path):
    """Java writes page files itself (sparse with JDK 11+, allocated whole by older JDKs
    or when copied): appending to such a page reserves nothing twice and loses nothing."""
    path = tmp_path / "a"
    with BigArray(path, data_page_size=1 * MIB, prefetch=False) as arr:
        arr.append_many([make_item(i, 1000) for i in range(10)])
    page0 = path / "data" / "page-0.dat"
    fd = os.open(page0, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, 1 * MIB)  # as if fully allocated by its writer
    finally:
        os.close(fd)
    with BigArray(path, prefetch=False) as arr:
        arr.append_many([make_item(10 + i, 1000) for i in range(10)])
        assert [item_index(x) for x in arr.read_range(0)] == list(range(20))
    assert blocks(page0) == 1 * MIB


def test_the_demo_leaves_nothing_behind_unless_given_a_dir(tmp_path):
    """``python -m bigarray`` used to leave its queue (~293 MB) in /tmp on every run."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp))
    out = subprocess.run(
        [PYTHON, "-m", "bigarray", "--items", "3000"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "removed at the end" in out.stdout
    assert list(tmp.iterdir()) == []
    kept = tmp_path / "kept"
    out = subprocess.run(
        [PYTHON, "-m", "bigarray", "--items", "3000", "--dir", str(kept)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert f"queue directory: {kept}\n" in out.stdout
    with FanoutQueue(kept) as q:
        assert q.size() == 3000
    assert allocated_bytes(kept) < 2 * MIB
