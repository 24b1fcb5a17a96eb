"""Record offsets (issue 13 groundwork): an item holds ``count`` records, numbered
across the array, kept in the last 8 bytes of its index item (``aux``, see
bigarray/format.py). Real mapped files throughout; crash tests kill -9 a writer."""

from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bigarray import BigArray, FanoutQueue, IndexOutOfRangeError
from bigarray import format as fmt

from ._util import PYTHON, ROOT, FakeClock

pytestmark = pytest.mark.timeout(180)

INDEX_ITEMS = fmt.INDEX_ITEMS_PER_PAGE
_AUX = struct.Struct(">Q")


def raw_aux(path: Path, index: int) -> int:
    """The aux of item ``index``, read from its index page file by hand."""
    page, slot = divmod(index, INDEX_ITEMS)
    with open(path / "index" / f"page-{page}.dat", "rb") as f:
        f.seek(slot * 32 + 24)
        return int(_AUX.unpack(f.read(8))[0])


def model_ends(counts: list[int], first_end: int = 0) -> list[int]:
    """End offsets of items holding ``counts`` records, numbered from ``first_end``."""
    out, end = [], first_end
    for c in counts:
        end += c
        out.append(end)
    return out


def model_find(ends: list[int], tail: int, offset: int) -> int:
    """find_offset on a model: the smallest i in [tail, head) with ends[i] > offset."""
    for i in range(tail, len(ends)):
        if ends[i] > offset:
            return i
    return len(ends)


def check_offsets(arr: BigArray | FanoutQueue, ends: list[int], kinds: list[int]) -> None:
    """Every offset accessor of [tail, head) against the model."""
    tail, head = arr.tail, arr.head
    assert head == len(ends)
    assert arr.next_offset == (ends[-1] if ends else 0)
    for i in range(tail, head):
        assert arr.end_offset(i) == ends[i], i
        assert arr.first_offset(i) == (ends[i - 1] if i else 0), i
        assert arr.item_kind(i) == kinds[i], i
    got_ends, got_kinds = arr.offset_fields(tail, head - tail)
    assert got_ends.tolist() == ends[tail:head]
    assert got_kinds.tolist() == kinds[tail:head]
    assert got_ends.dtype == np.int64 and got_kinds.dtype == np.uint8
    assert arr.log_start_offset == (ends[tail - 1] if tail else 0)


# -- counts and kinds ------------------------------------------------------------------
def test_counts_and_kinds_through_append_and_append_many(tmp_path: Path) -> None:
    path = tmp_path / "a"
    counts: list[int] = []
    kinds: list[int] = []
    with BigArray(path, data_page_size=4096, prefetch=False) as arr:
        assert (arr.next_offset, arr.log_start_offset, arr.find_offset(0)) == (0, 0, 0)
        for _ in range(3):  # plain items first: aux stays 0
            arr.append(b"plain")
            counts.append(1)
            kinds.append(0)
        assert arr.next_offset == 3
        assert arr.append_many([b"x", b"y"], counts=[1, 1]) == 3  # counts of 1: still plain
        counts += [1, 1]
        kinds += [0, 0]
        assert arr.append(b"k", kind=7) == 5  # a kind, one record
        counts.append(1)
        kinds.append(7)
        assert arr.next_offset == 6 == arr.head
        assert arr.append(b"batch of 5", count=5, kind=1) == 6
        counts.append(5)
        kinds.append(1)
        assert arr.next_offset == 11
        assert arr.append(b"plain after") == 7  # one record, but past a counted item
        counts.append(1)
        kinds.append(0)
        first = arr.append_many([b"a", b"b", b"c", b"d"], counts=np.array([3, 1, 2, 9]), kind=1)
        assert first == 8
        counts += [3, 1, 2, 9]
        kinds += [1] * 4
        assert arr.append_many([b"e"] * 3) == 12  # counts None: one record each
        counts += [1, 1, 1]
        kinds += [0] * 3
        assert arr.append_many([]) == 15  # nothing: next offset unchanged
        assert arr.append_many([], counts=[], kind=3) == 15
        ends = model_ends(counts)
        check_offsets(arr, ends, kinds)
        assert arr.next_offset == 30
        # the bytes: aux 0 up to the first item that was not plain, the full aux after
        for i in range(arr.head):
            expected = 0 if i < 5 else (kinds[i] << 56) | ends[i]
            assert raw_aux(path, i) == expected, i
    with BigArray(path) as arr:  # and the same after reopen
        check_offsets(arr, ends, kinds)
        arr.append(b"more", count=2)
        assert arr.next_offset == 32
        ends.append(32)
        kinds.append(0)
        check_offsets(arr, ends, kinds)


@pytest.mark.parametrize("prefetch", [False, True])
def test_append_inlined_writes_what_its_general_path_writes(tmp_path: Path, prefetch: bool) -> None:
    """append's inlined paths (plain items, and items with a count or a kind) leave the
    files _append_slowly leaves: one array with the default clock (the inlined paths
    armed), one with another clock (every append through _append_slowly), the same
    items of every shape, several pages; timestamps aside."""
    sizes = [1, 100, 195, 1000, 4096, 70_000]  # 70 KB goes into the file
    shapes = [(1, 0), (1, 0), (1, 3), (1, 0), (5, 3), (1, 0), (2, 0), (1, 7), (100, 3)]
    fast_dir, slow_dir = tmp_path / "fast", tmp_path / "slow"
    fast = BigArray(fast_dir, data_page_size=256 << 10, prefetch=prefetch)
    slow = BigArray(slow_dir, data_page_size=256 << 10, prefetch=prefetch, clock=FakeClock())
    general = 0
    slowly = fast._append_slowly

    def counted(item: Any, count: int, kind: int) -> int:
        nonlocal general
        general += 1
        return slowly(item, count, kind)

    fast._append_slowly = counted  # type: ignore[method-assign]
    counts: list[int] = []
    kinds: list[int] = []
    for i in range(1200):
        count, kind = shapes[i % len(shapes)] if i >= 40 else (1, 0)  # plain ones first
        item = bytes([i % 251]) * sizes[i % len(sizes)]
        if 40 <= i < 43:  # the first counted item, inlined, then a plain one, inlined too
            count, kind, item = [(1, 7), (4, 0), (1, 0)][i - 40] + (bytes([i]) * 100,)
        assert fast.append(item, count=count, kind=kind) == slow.append(item, count=count, kind=kind) == i
        counts.append(count)
        kinds.append(kind)
    assert general < 450  # the 70 KB items (200), new pages and the read-ahead points
    ends = model_ends(counts)
    check_offsets(fast, ends, kinds)
    fast.close()
    slow.close()
    got, expected = (
        {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        for root in (fast_dir, slow_dir)
    )
    if prefetch:  # pages read ahead by another thread: as many as it got to
        got = {name: data for name, data in got.items() if name in expected}
        expected = {name: data for name, data in expected.items() if name in got}
    assert got.keys() == expected.keys()
    for name, data in expected.items():
        if name.startswith(fmt.INDEX_DIR + os.sep):
            mine, theirs = bytearray(got[name]), bytearray(data)
            for at in range(0, len(mine), fmt.INDEX_ITEM_SIZE):  # timestamps aside
                mine[at + 16 : at + 24] = theirs[at + 16 : at + 24] = bytes(8)
            assert mine == theirs, name
        else:
            assert got[name] == data, name
    with BigArray(fast_dir) as again:  # and it reads back after a reopen
        check_offsets(again, ends, kinds)
        assert again.get(1199) == bytes([1199 % 251]) * sizes[1199 % len(sizes)]
        assert again.get(42) == bytes([42]) * 100


def test_the_first_counted_item_inside_a_batch(tmp_path: Path) -> None:
    path = tmp_path / "a"
    with BigArray(path, prefetch=False) as arr:
        arr.append_many([b"p"] * 6, counts=[1, 1, 1, 4, 1, 1])
        assert [raw_aux(path, i) for i in range(6)] == [0, 0, 0, 7, 8, 9]
        assert arr.next_offset == 9
        arr.append_many([b"q"] * 2)
        assert [raw_aux(path, i) for i in (6, 7)] == [10, 11]
        assert [arr.find_offset(o) for o in range(12)] == [0, 1, 2, 3, 3, 3, 3, 4, 5, 6, 7, 8]


def test_fanout_queue_passes_counts_and_kinds_through(tmp_path: Path) -> None:
    with FanoutQueue(tmp_path / "q") as q:
        assert q.enqueue(b"a", 3, 1) == 0
        assert q.enqueue(b"b") == 1
        assert q.enqueue_many([b"c", b"d"], [2, 2], 1) == 2
        check_offsets(q, [3, 4, 6, 8], [1, 0, 1, 1])
        assert q.find_offset(5) == 2
        assert q.dequeue_many("g") == [b"a", b"b", b"c", b"d"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda a: a.append(b"x", count=0), "at least 1 record"),
        (lambda a: a.append(b"x", count=-3), "at least 1 record"),
        (lambda a: a.append(b"x", kind=256), "kind 256 is outside 0..255"),
        (lambda a: a.append(b"x", kind=-1), "kind -1 is outside"),
        (lambda a: a.append(b"x", count=1.5), "must be integers"),
        (lambda a: a.append(b"x", count=fmt.MAX_END_OFFSET), "would pass"),
        (lambda a: a.append_many([b"x", b"y"], counts=[1]), "1 counts for 2 items"),
        (lambda a: a.append_many([b"x"], counts=[1, 2]), "2 counts for 1 items"),
        (lambda a: a.append_many([b"x", b"y"], counts=[2, 0]), "at least 1 record"),
        (lambda a: a.append_many([b"x"], counts=[1.0]), "must be integers"),
        (lambda a: a.append_many([b"x"], kind=300), "kind 300 is outside"),
        (lambda a: a.append_many([b"x"] * 300, counts=[1 << 55] * 300), "would pass"),
    ],
)
def test_bad_counts_and_kinds_are_refused_and_append_nothing(tmp_path: Path, call, message) -> None:
    path = tmp_path / "a"
    with BigArray(path, data_page_size=4096, prefetch=False) as arr:
        arr.append(b"before", count=2)
        with pytest.raises(ValueError, match=message) as info:
            call(arr)
        assert str(path) in str(info.value)
        assert (arr.head, arr.next_offset) == (1, 2)
        assert arr.append_many([b"after", b"x"]) == 1
        assert arr.read_range(0) == [b"before", b"after", b"x"]
        assert arr.next_offset == 4


# -- plain arrays stay bigqueue's bytes ----------------------------------------------------
def test_plain_arrays_keep_the_last_8_bytes_zero(tmp_path: Path) -> None:
    """Every way of appending without counts or kinds, across an index page boundary,
    reopen and a group: aux stays 0 (bigqueue's bytes), next offset = head."""
    path = tmp_path / "q"
    with FanoutQueue(path, data_page_size=1 << 20) as q:
        q.enqueue(b"one")
        q.enqueue_many([b"ab"] * (INDEX_ITEMS + 10))
        q.array.append(b"two", 1, 0)
        q.dequeue_many("g", max_items=5)
    with FanoutQueue(path) as q:
        q.enqueue(b"three")
        q.enqueue_many([b"c", b"d"], counts=[1, 1], kind=0)
        head = q.head
        assert q.next_offset == head
        assert q.find_offset(INDEX_ITEMS + 3) == INDEX_ITEMS + 3
        q.flush()
    for page in (0, 1):
        aux = np.fromfile(path / "index" / f"page-{page}.dat", dtype=fmt.INDEX_DTYPE)["aux"]
        assert not aux.any(), f"index page {page} holds a non-zero aux"


def test_stale_aux_bytes_past_a_recovered_head_are_overwritten(tmp_path: Path) -> None:
    """Recovery drops counted items at the end; the plain items appended after them
    must not inherit their aux (an append writes all 32 bytes of its index item)."""
    path = tmp_path / "a"
    with BigArray(path, data_page_size=4096, prefetch=False) as arr:
        arr.append_many([b"p"] * 10)
        arr.append_many([b"c"] * 5, counts=[3] * 5, kind=1)
        arr.append(b"c", count=2, kind=1)
    # damage item 10 (timestamp 0: never written): recovery drops 10..15
    with open(path / "index" / "page-0.dat", "r+b") as f:
        f.seek(10 * 32 + 16)
        f.write(bytes(8))
    with BigArray(path, prefetch=False) as arr:
        assert arr.recovery.dropped == 6
        assert (arr.head, arr.next_offset) == (10, 10)
        arr.append(b"q")
        arr.append_many([b"r", b"s"])
        assert arr.next_offset == arr.head == 13
    assert [raw_aux(path, i) for i in range(16)] == [0] * 13 + [(1 << 56) | 22, (1 << 56) | 25, (1 << 56) | 27]


# -- next offset across reopen, recovery and crashes -------------------------------------
def test_recovery_rolls_next_offset_back_with_head(tmp_path: Path) -> None:
    path = tmp_path / "a"
    with BigArray(path, data_page_size=4096, prefetch=False) as arr:
        arr.append_many([b"x" * 1000] * 4, counts=[2, 2, 2, 2])  # data page 0
        arr.append_many([b"y" * 1000] * 4, counts=[5, 5, 5, 5])  # data page 1
        assert arr.next_offset == 28
    os.truncate(path / "data" / "page-1.dat", 1500)  # items 4.. damaged, item 4 keeps its bytes
    with BigArray(path) as arr:
        assert arr.head == 5
        assert arr.next_offset == 13
        assert arr.append(b"z", count=4) == 5
        assert arr.next_offset == 17


def test_an_end_offset_that_does_not_increase_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "a"
    with BigArray(path, prefetch=False) as arr:
        arr.append_many([b"x"] * 6, counts=[2] * 6)
    with open(path / "index" / "page-0.dat", "r+b") as f:  # item 4 claims to end at 3
        f.seek(4 * 32 + 24)
        f.write(_AUX.pack(3))
    with BigArray(path) as arr:
        assert arr.head == 4
        assert arr.next_offset == 8
    with open(path / "index" / "page-0.dat", "r+b") as f:  # a plain aux after counted items
        f.seek(3 * 32 + 24)
        f.write(_AUX.pack(0))
    with BigArray(path) as arr:
        assert (arr.head, arr.next_offset) == (3, 6)


CRASH_WRITER = """
import random, struct, sys
from bigarray import BigArray
rng = random.Random(int(sys.argv[2]))
out = sys.stdout
with BigArray(sys.argv[1], data_page_size=64 * 1024) as arr:
    while True:
        nxt = arr.next_offset
        if rng.random() < 0.5:
            count = rng.choice((1, 1, rng.randrange(1, 50)))
            item = struct.pack(">qqq", nxt, count, count % 3) * rng.randrange(1, 60)
            arr.append(item, count=count, kind=count % 3)
            last_end = nxt + count
        else:
            n = rng.randrange(1, 40)
            counts = [rng.randrange(1, 50) for _ in range(n)]
            items, o = [], nxt
            for c in counts:
                items.append(struct.pack(">qqq", o, c, 2) * rng.randrange(1, 60))
                o += c
            arr.append_many(items, counts=counts, kind=2)
            last_end = o
        out.write(f"{last_end}\\n")
        out.flush()
"""


def test_next_offset_survives_kill_9_mid_appends(tmp_path: Path) -> None:
    """Every item encodes its own first offset and count; a writer is killed at random
    moments: after each kill the offsets of every item match what it encodes, nothing
    acknowledged is lost, and next offset is the end of the last item."""
    path = tmp_path / "a"
    rng = random.Random(1313)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    acked_end = 0
    started = time.monotonic()
    for rnd in range(8):
        if time.monotonic() - started > 90:
            break
        acks = tmp_path / f"acks-{rnd}.txt"
        with acks.open("w") as out:
            proc = subprocess.Popen([PYTHON, "-c", CRASH_WRITER, str(path), str(rnd)], stdout=out, cwd=ROOT, env=env)
            try:
                deadline = time.monotonic() + 30
                while acks.stat().st_size == 0 and time.monotonic() < deadline and proc.poll() is None:
                    time.sleep(0.005)
                time.sleep(rng.uniform(0.0, 0.15))
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
        lines = acks.read_text().split("\n")
        assert len(lines) > 1, f"round {rnd}: the writer acknowledged nothing (exit {proc.returncode})"
        acked_end = int(lines[-2])  # the last complete line was acknowledged
        with BigArray(path) as arr:
            assert arr.next_offset >= acked_end, (rnd, arr.next_offset, acked_end)
            ends, kinds = arr.offset_fields(arr.tail, arr.size)
            expected_first = arr.first_offset(arr.tail)
            for k, item in enumerate(arr.read_range(arr.tail)):
                first, count, kind = struct.unpack_from(">qqq", item)
                assert (first, first + count, kind) == (expected_first, int(ends[k]), int(kinds[k])), (
                    rnd,
                    arr.tail + k,
                )
                expected_first = first + count
            assert expected_first == arr.next_offset
            if arr.head > 4000:  # keep the directory small, and the offsets going on past tail
                arr.remove_before_index(arr.head - 2000)


# -- find_offset ---------------------------------------------------------------------------
def test_find_offset_on_boundaries_across_index_pages(tmp_path: Path) -> None:
    """Items of 1..4 records across two index page boundaries: first, last and
    inside records of items at the page boundaries, below tail, at and past next offset."""
    path = tmp_path / "a"
    n = 2 * INDEX_ITEMS + 1000
    counts = (np.arange(n) % 4 + 1).astype(np.int64)
    counts[: INDEX_ITEMS // 2] = 1  # plain at first (aux 0), counted from the middle of page 0
    with BigArray(path, data_page_size=1 << 22, prefetch=False) as arr:
        for k in range(0, n, 50_000):
            arr.append_many([b"r"] * min(50_000, n - k), counts=counts[k : k + 50_000], kind=1)
        ends = np.cumsum(counts)
        assert arr.next_offset == int(ends[-1])
        firsts = ends - counts

        def expect(offset: int, tail: int = 0) -> int:
            return max(tail, int(np.searchsorted(ends, offset, side="right")))

        probes = {0, 1, INDEX_ITEMS // 2, int(ends[-1]) - 1}
        for i in (0, 1, INDEX_ITEMS // 2, INDEX_ITEMS - 1, INDEX_ITEMS, INDEX_ITEMS + 1, 2 * INDEX_ITEMS, n - 1):
            probes |= {int(firsts[i]), int(ends[i]) - 1, int(firsts[i] + counts[i] // 2), int(ends[i])}
        for offset in sorted(probes):
            assert arr.find_offset(offset) == expect(offset), offset
        assert arr.find_offset(int(ends[-1])) == n  # next offset: head
        assert arr.find_offset(int(ends[-1]) + 100) == n
        assert arr.find_offset(-5) == 0
        for i in (INDEX_ITEMS - 1, INDEX_ITEMS, n - 1):
            assert arr.first_offset(i) == int(firsts[i])
            assert arr.end_offset(i) == int(ends[i])
        e, k = arr.offset_fields(INDEX_ITEMS - 3, 6)
        assert e.tolist() == ends[INDEX_ITEMS - 3 : INDEX_ITEMS + 3].tolist()
        assert k.tolist() == [1] * 6
        # below tail: tail; tail at an index page boundary (its item tail - 1 in the page before)
        for tail in (INDEX_ITEMS, 2 * INDEX_ITEMS + 1):
            arr.remove_before_index(tail)
            assert arr.log_start_offset == arr.first_offset(tail) == int(firsts[tail])
            for offset in (0, int(firsts[tail]) - 1, int(firsts[tail]), int(ends[tail]), int(ends[-1]) - 1):
                assert arr.find_offset(offset) == expect(offset, tail), (tail, offset)
            with pytest.raises(IndexOutOfRangeError):
                arr.end_offset(tail - 1)
            with pytest.raises(IndexOutOfRangeError):
                arr.first_offset(tail - 1)
            with pytest.raises(IndexOutOfRangeError):
                arr.item_kind(n)
            with pytest.raises(IndexOutOfRangeError):
                arr.offset_fields(tail - 1, 2)


def test_find_offset_of_a_plain_array_reads_nothing(tmp_path: Path) -> None:
    with BigArray(tmp_path / "a") as arr:
        arr.append_many([b"x"] * 100)
        arr.remove_before_index(40)
        assert [arr.find_offset(o) for o in (0, 39, 40, 41, 99, 100, 1000)] == [40, 40, 40, 41, 99, 100, 100]
        assert (arr.log_start_offset, arr.next_offset) == (40, 100)


def test_find_offset_and_log_start_of_an_empty_array(tmp_path: Path) -> None:
    path = tmp_path / "a"
    with BigArray(path) as arr:
        assert (arr.find_offset(0), arr.log_start_offset, arr.next_offset) == (0, 0, 0)
        arr.append_many([b"x"] * 3, counts=[4, 4, 4])
        arr.remove_before_index(3)  # empty again: offsets go on
        assert (arr.find_offset(0), arr.find_offset(12), arr.log_start_offset, arr.next_offset) == (3, 3, 12, 12)
    with BigArray(path) as arr:
        assert (arr.log_start_offset, arr.next_offset) == (12, 12)
        assert arr.append(b"y", count=2) == 3
        assert (arr.first_offset(3), arr.end_offset(3)) == (12, 14)


def test_find_offset_while_a_writer_appends_and_retention_trims(tmp_path: Path) -> None:
    """Readers look records up while one thread appends counted items (each encodes its
    first offset and count) and another trims the tail: the item find_offset names holds
    the record, or is head (not written yet), or tail (the record was trimmed)."""
    stop = threading.Event()
    errors: list[BaseException] = []
    with BigArray(tmp_path / "a", data_page_size=4096) as arr:

        def write() -> None:
            rng = random.Random(5)
            try:
                for k in range(20_000):
                    count = rng.randrange(1, 6)
                    nxt = arr.next_offset
                    if k % 3:
                        arr.append(struct.pack(">qq", nxt, count), count=count, kind=1)
                    else:
                        arr.append_many(
                            [struct.pack(">qq", nxt, count), struct.pack(">qq", nxt + count, 1)], [count, 1]
                        )
            except BaseException as exc:
                errors.append(exc)
            finally:
                stop.set()

        def trim() -> None:
            try:
                while not stop.is_set():
                    arr.remove_before_index(max(arr.tail, arr.head - 300))
                    time.sleep(0.001)
            except BaseException as exc:
                errors.append(exc)

        def read() -> None:
            rng = random.Random(6)
            try:
                while not stop.is_set():
                    start, end = arr.log_start_offset, arr.next_offset
                    if end <= start:
                        continue
                    # records that exist, and the next one (a consumer waiting at the end)
                    offset = rng.randrange(max(0, start - 5), end + 1)
                    i = arr.find_offset(offset)
                    while i >= arr.head and not stop.is_set():
                        time.sleep(0)  # the item that will hold it is not written yet
                    try:
                        first, count = struct.unpack(">qq", arr.get(i))
                    except IndexOutOfRangeError:
                        continue  # head (nothing there yet), or trimmed meanwhile
                    assert offset < first + count, (offset, i, first, count)
                    if offset < first:  # only for a record below log start: tail
                        assert i <= arr.tail, (offset, i, first)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=f, daemon=True) for f in (write, trim, read, read)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors[0]
        assert arr.next_offset == arr.end_offset(arr.head - 1)


# -- retention -----------------------------------------------------------------------------
def test_retention_keeps_the_index_item_of_tail_minus_1(tmp_path: Path) -> None:
    path = tmp_path / "a"
    n = INDEX_ITEMS + 20
    with BigArray(path, data_page_size=1 << 20, prefetch=False) as arr:
        arr.append_many([b"ab"] * n, counts=[3] * n)
        arr.remove_before_index(INDEX_ITEMS)  # tail - 1 is the last item of index page 0
        assert (path / "index" / "page-0.dat").exists()
        assert arr.first_offset(INDEX_ITEMS) == arr.log_start_offset == 3 * INDEX_ITEMS
    with BigArray(path, prefetch=False) as arr:  # reopening deletes nothing more
        assert (path / "index" / "page-0.dat").exists()
        assert arr.log_start_offset == 3 * INDEX_ITEMS
        arr.remove_before_index(INDEX_ITEMS + 1)
        assert not (path / "index" / "page-0.dat").exists()
        assert arr.log_start_offset == 3 * INDEX_ITEMS + 3
        arr.remove_before_index(n)  # empty: item n - 1 still there
        assert arr.log_start_offset == arr.next_offset == 3 * n
        assert arr.find_offset(0) == n


def test_first_offset_of_tail_falls_back_when_java_trimmed_the_item_before(tmp_path: Path) -> None:
    """Java deletes index pages below tail's: the item before tail is gone; its items
    hold one record each, so first_offset(tail) = end_offset(tail) - 1."""
    path = tmp_path / "a"
    n = INDEX_ITEMS + 20
    with BigArray(path, data_page_size=1 << 20, prefetch=False) as arr:
        arr.append_many([b"ab"] * n)
        arr.remove_before_index(INDEX_ITEMS)
    os.unlink(path / "index" / "page-0.dat")
    with BigArray(path) as arr:
        assert arr.first_offset(INDEX_ITEMS) == arr.log_start_offset == INDEX_ITEMS
        assert arr.find_offset(5) == INDEX_ITEMS
        assert arr.next_offset == n
        arr.append(b"batch", count=10, kind=1)
        assert arr.find_offset(n + 9) == n
        assert arr.next_offset == n + 10


# -- committed offsets -----------------------------------------------------------------------
def test_commit_with_an_offset_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with FanoutQueue(path) as q:
        q.enqueue_many([b"a", b"b", b"c"], counts=[5, 5, 5], kind=1)
        assert q.committed_offset("g") is None
        q.commit("g", 1, offset=7)  # inside item 1 (records 5..9)
        assert (q.committed("g"), q.committed_offset("g")) == (1, 7)
        q.commit("h", 2)
        assert (q.committed("h"), q.committed_offset("h")) == (2, None)
        q.commit("z", 0, offset=0)
        with pytest.raises(ValueError, match="committed offset -1 of group 'g'"):
            q.commit("g", 1, offset=-1)
    page = (path / "committed_g" / "page-0.dat").read_bytes()
    assert len(page) == 32 and struct.unpack(">qqqq", page) == (1, 8, 0, 0)
    with FanoutQueue(path) as q:
        assert (q.committed("g"), q.committed_offset("g")) == (1, 7)
        assert (q.committed("h"), q.committed_offset("h")) == (2, None)
        assert (q.committed("z"), q.committed_offset("z")) == (0, 0)
        q.commit("g", 2)  # a commit without an offset clears it
        assert q.committed_offset("g") is None
    with FanoutQueue(path) as q:
        assert (q.committed("g"), q.committed_offset("g")) == (2, None)
        q.remove_group("g")
        assert q.committed_offset("g") is None


def test_a_committed_page_of_8_bytes_opens_as_an_index_without_offset(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with FanoutQueue(path) as q:
        q.enqueue_many([b"a", b"b", b"c"])
        q.commit("g", 2)
    page = path / "committed_g" / "page-0.dat"
    page.write_bytes(struct.pack(">q", 2))  # as written before offsets existed
    with FanoutQueue(path) as q:
        assert (q.committed("g"), q.committed_offset("g")) == (2, None)
        q.commit("g", 3, offset=3)
    assert struct.unpack(">qqqq", page.read_bytes()) == (3, 4, 0, 0)


def test_a_committed_offset_beyond_next_offset_after_a_crash_is_moved_back(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with FanoutQueue(path, data_page_size=4096) as q:
        q.enqueue_many([b"x" * 1000] * 4, counts=[2] * 4)  # data page 0
        q.enqueue_many([b"y" * 1000] * 4, counts=[2] * 4)  # data page 1
        q.commit("g", 8, offset=16)
    os.unlink(path / "data" / "page-1.dat")  # items 4.. lost
    with FanoutQueue(path) as q:
        assert (q.head, q.next_offset) == (4, 8)
        assert (q.committed("g"), q.committed_offset("g")) == (4, 8)


COMMITTER = """
import sys
from bigarray import FanoutQueue
q = FanoutQueue(sys.argv[1])
out = sys.stdout
i = q.committed("g") or 0
while True:
    i = i + 1 if i < q.head else q.tail
    q.commit("g", i, offset=3 * i + 1)
    out.write(f"{i}\\n")
    out.flush()
"""


def test_committed_offsets_survive_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with FanoutQueue(path) as q:
        q.enqueue_many([b"x"] * 5000, counts=[3] * 5000)
    rng = random.Random(13)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for _ in range(6):
        acks = tmp_path / "acks.txt"
        with acks.open("w") as out:
            proc = subprocess.Popen([PYTHON, "-c", COMMITTER, str(path)], stdout=out, cwd=ROOT, env=env)
            try:
                deadline = time.monotonic() + 20
                while acks.stat().st_size == 0 and time.monotonic() < deadline and proc.poll() is None:
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.2))
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
        last = int(acks.read_text().split("\n")[-2])
        with FanoutQueue(path) as q:
            committed = q.committed("g")
            assert committed in (last, last + 1, q.tail), (last, committed)
            assert q.committed_offset("g") == 3 * committed + 1


# -- property: find_offset against a model -----------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(
        st.tuples(
            st.lists(st.integers(1, 4) | st.just(1), min_size=1, max_size=8),
            st.booleans(),  # one by one (append) or as a batch (append_many)
            st.integers(0, 2),  # kind
        ),
        max_size=12,
    ),
    tail_frac=st.floats(0, 1),
    reopen=st.booleans(),
)
def test_find_offset_matches_a_model(
    batches: list[tuple[list[int], bool, int]], tail_frac: float, reopen: bool
) -> None:
    tmp = tempfile.mkdtemp(prefix="bigarray-offsets-")
    try:
        path = Path(tmp) / "a"
        counts: list[int] = []
        kinds: list[int] = []
        arr = BigArray(path, data_page_size=4096, prefetch=False, clock=FakeClock())
        try:
            for cs, one_by_one, kind in batches:
                if one_by_one:
                    for c in cs:
                        arr.append(b"i", count=c, kind=kind)
                else:
                    arr.append_many([b"b"] * len(cs), counts=cs, kind=kind)
                counts += cs
                kinds += [kind] * len(cs)
            ends = model_ends(counts)
            tail = int(len(ends) * tail_frac)
            arr.remove_before_index(tail)
            if reopen:
                arr.close()
                arr = BigArray(path)
            check_offsets(arr, ends, kinds)
            for offset in range(-1, (ends[-1] if ends else 0) + 2):
                assert arr.find_offset(offset) == model_find(ends, tail, offset), offset
            # the bytes: aux 0 exactly for items of kind 0 and one record while the
            # next offset was the item's index
            for i in range(tail, len(ends)):
                plain = counts[i] == 1 and kinds[i] == 0 and (ends[i - 1] if i else 0) == i
                assert (raw_aux(path, i) == 0) == plain, i
        finally:
            arr.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
