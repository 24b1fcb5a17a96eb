"""bigarray._fastpath, the C twins of the inlined paths of BigArray.append, BigArray.get and
FanoutQueue.dequeue (luxun's compiled loop calls them): each leaves the same files and answers
the same as its Python path, and declines (None, -1: nothing done) wherever that path's first
branch does not apply, so the caller's fallback to the Python path is always right."""

from __future__ import annotations

import importlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from bigarray import BigArray, FanoutQueue
from bigarray import format as fmt

BUILT = importlib.util.find_spec("bigarray._fastpath") is not None


@pytest.fixture
def fast() -> Any:
    if not BUILT:
        pytest.skip("bigarray._fastpath is not built")
    return importlib.import_module("bigarray._fastpath")


def test_the_fast_paths_are_built() -> None:
    """The README's set-up (scripts/bootstrap.sh) builds them (luxun's compiled loop uses them)."""
    assert BUILT, "bigarray._fastpath is not built: scripts/bootstrap.sh builds it (needs cc)"


def items(n: int) -> list[bytes]:
    """Items of many sizes, up to past the 64 KiB that append writes into the file."""
    sizes = [1, 7, 100, 1000, 4096, 30_000, 70_000]
    return [bytes([i % 251]) * sizes[i % len(sizes)] for i in range(n)]


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def without_times(index_page: bytes) -> bytes:
    """An index page with each item's timestamp (bytes 16-24 of its slot) zeroed."""
    out = bytearray(index_page)
    for at in range(0, len(out), fmt.INDEX_ITEM_SIZE):
        out[at + 16 : at + 24] = bytes(8)
    return bytes(out)


@pytest.mark.parametrize("prefetch", [False, True])
def test_append_writes_what_the_python_path_writes(tmp_path: Path, fast: Any, prefetch: bool) -> None:
    a_dir, b_dir = tmp_path / "c", tmp_path / "py"
    a = BigArray(a_dir, data_page_size=256 << 10, prefetch=prefetch)
    b = BigArray(b_dir, data_page_size=256 << 10, prefetch=prefetch)
    taken = 0
    for item in items(400):  # several data pages
        index = fast.append(a, item)
        if index < 0:
            index = a.append(item)  # what the caller does: the Python path
        else:
            taken += 1
        assert index == b.append(item)
    assert a.head == b.head == 400
    assert 250 <= taken < 400  # most, not the first, nor any 70 KB item, nor a new page's
    a.close()
    b.close()
    got, expected = files(a_dir), files(b_dir)
    if prefetch:  # pages read ahead of the writer by another thread: as many as it got to
        got = {name: data for name, data in got.items() if name in expected}
        expected = {name: data for name, data in expected.items() if name in got}
    assert got.keys() == expected.keys()
    for name, data in expected.items():
        if name.startswith(fmt.INDEX_DIR + os.sep):
            assert without_times(got[name]) == without_times(data), name
        else:
            assert got[name] == data, name
    # ... and what it wrote reads back after a reopen (the commit point is head).
    again = BigArray(a_dir, data_page_size=256 << 10)
    assert [again.get(i) for i in range(400)] == items(400)
    again.close()


def test_append_declines_where_the_python_path_must_decide(tmp_path: Path, fast: Any) -> None:
    array = BigArray(tmp_path / "a")
    assert fast.append(array, b"x") == -1  # before the first append: no head pages armed
    array.append(b"x")
    assert fast.append(array, b"y") == 1
    # Another thread holds the array's lock (an append, a close): not taken, nothing written.
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with array._lock:
            held.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        assert fast.append(array, b"z") == -1
        assert array.head == 2
    finally:
        done.set()
        thread.join()
    assert fast.append(array, b"z") == 2
    # An item with a record count makes every later append take the Python path.
    array.append(b"counted", 3)
    assert fast.append(array, b"w") == -1
    assert array.head == 4
    array.close()
    assert fast.append(array, b"v") == -1  # closed: BigArray.append raises there


def test_get_reads_what_get_reads_and_declines_the_rest(tmp_path: Path, fast: Any) -> None:
    array = BigArray(tmp_path / "a", data_page_size=64 << 10)
    written = [bytes([i % 256]) * (i % 900 + 1) for i in range(300)]  # several data pages
    for item in written:
        array.append(item)
    assert fast.get(array, 0) is None  # no page read yet: get maps it
    got = []
    for i in range(300):
        item = fast.get(array, i)
        got.append(item is not None)
        assert (item if item is not None else array.get(i)) == written[i]
    assert sum(got) >= 250  # not the first read of each data page
    assert fast.get(array, 300) is None and fast.get(array, -1) is None
    array.close()
    assert fast.get(array, 5) is None


def test_dequeue_moves_the_group_as_dequeue_does(tmp_path: Path, fast: Any) -> None:
    queue = FanoutQueue(tmp_path / "q")
    written = [b"item-%d" % i for i in range(50)]
    for item in written:
        queue.enqueue(item)
    assert fast.dequeue(queue, "g") is None  # an unknown group: dequeue makes it
    assert queue.dequeue("g") == written[0]
    got = [fast.dequeue(queue, "g") for _ in range(49)]
    assert got == written[1:]
    assert fast.dequeue(queue, "g") is None  # at head: dequeue answers None
    assert queue.dequeue("g") is None
    # The group's position is in its page: a reopened queue reads on from there.
    queue.enqueue(b"after")
    queue.close()
    queue = FanoutQueue(tmp_path / "q")
    assert queue.dequeue("g") == b"after"
    # Another thread holds the group's lock: not taken, the group not moved.
    queue.enqueue(b"next")
    lock = queue._groups["g"].lock
    with lock:
        assert fast.dequeue(queue, "g") is None
    assert fast.dequeue(queue, "g") == b"next"
    # A committed group, and a closed queue: the Python path answers (raises).
    queue.enqueue(b"more")
    queue.commit("g", queue.head - 1)
    assert fast.dequeue(queue, "g") is None
    queue.close()
    assert fast.dequeue(queue, "g") is None
