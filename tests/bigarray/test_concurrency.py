"""Threads: writers appending while readers dequeue (per group) or read by index."""

from __future__ import annotations

import random
import struct
import threading
import time
import zlib
from collections import Counter

import pytest

from bigarray import BigArray, FanoutQueue

from ._util import item_index, make_item, mapped_files

pytestmark = pytest.mark.timeout(120)

PAGE = 4096
_TAG = struct.Struct(">HI")  # writer id, sequence number


def tagged(writer: int, seq: int, size: int) -> bytes:
    """A self-checking item naming its writer and its sequence number."""
    body = _TAG.pack(writer, seq) + bytes([seq % 251]) * max(0, size - _TAG.size - 4)
    return body + struct.pack(">I", zlib.crc32(body))


def untag(item: bytes) -> tuple[int, int]:
    body, (crc,) = item[:-4], struct.unpack(">I", item[-4:])
    assert zlib.crc32(body) == crc, "damaged item"
    assert body[_TAG.size :] == bytes([_TAG.unpack_from(body)[1] % 251]) * (len(body) - _TAG.size)
    return _TAG.unpack_from(body)


class Threads:
    """Run functions in threads; re-raise the first exception any of them raised."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self, fn, *args) -> None:
        def run() -> None:
            try:
                fn(*args)
            except BaseException as exc:
                self.errors.append(exc)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "threads did not finish in time"
        if self.errors:
            raise self.errors[0]


def writer(q, wid: int, count: int, seed: int) -> None:
    rng = random.Random(seed)
    seq = 0
    while seq < count:
        if rng.random() < 0.5:
            q.enqueue(tagged(wid, seq, rng.randrange(10, 600)))
            seq += 1
        else:
            n = min(count - seq, rng.randrange(1, 60))
            q.enqueue_many([tagged(wid, seq + k, rng.randrange(10, 600)) for k in range(n)])
            seq += n


def test_writers_and_group_readers_each_item_once_per_group(tmp_path):
    writers, per_writer = 3, 4000
    groups = ("g1", "g2", "g3")
    total = writers * per_writer
    q = FanoutQueue(tmp_path / "q", data_page_size=PAGE, max_cached_pages=2)
    done_writing = threading.Event()
    received: dict[tuple[str, int], list[tuple[int, int]]] = {}

    def reader(group: str, rid: int, seed: int) -> None:
        rng = random.Random(seed)
        got = received.setdefault((group, rid), [])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            finished = done_writing.is_set()
            r = rng.random()
            if r < 0.3:
                item = q.dequeue(group)
                batch = [] if item is None else [item]
            elif r < 0.65:
                batch = q.dequeue_many(group, max_items=rng.randrange(1, 50))
            else:
                batch = q.dequeue_many(group, max_bytes=rng.randrange(0, 5000))
            got.extend(untag(item) for item in batch)
            if not batch:
                if finished:
                    return
                time.sleep(0.0005)

    threads = Threads()
    try:
        for g in groups:
            q.reset_group(g, 0)  # exist before anything is written
        for w in range(writers):
            threads.start(writer, q, w, per_writer, w)
        for gi, g in enumerate(groups):
            for r in range(2):
                threads.start(reader, g, r, 100 + gi * 10 + r)
        for t in threads.threads[:writers]:
            t.join(60)
        done_writing.set()
        threads.join(90)
        assert q.head == total
        everything = Counter((w, s) for w in range(writers) for s in range(per_writer))
        for g in groups:
            seen = Counter()
            for r in range(2):
                mine = received[(g, r)]
                seen.update(mine)
                # a single reader sees each writer's items in the writer's order
                for w in range(writers):
                    seqs = [s for ww, s in mine if ww == w]
                    assert seqs == sorted(seqs)
            assert seen == everything, f"group {g}: duplicates or losses"
            assert q.size(g) == 0
    finally:
        done_writing.set()
        q.close()


def test_read_range_by_index_while_writing(tmp_path):
    writers, per_writer = 3, 4000
    total = writers * per_writer
    arr = BigArray(tmp_path / "a", data_page_size=PAGE, max_cached_pages=2)
    seen: dict[int, bytes] = {}
    seen_lock = threading.Lock()
    done_writing = threading.Event()

    class Q:  # the writer helper speaks the queue's words
        enqueue = arr.append
        enqueue_many = arr.append_many

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        i = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            finished = done_writing.is_set()
            if rng.random() < 0.2 and i < arr.head:
                batch = [arr.get(i)]
            else:
                batch = arr.read_range(i, max_items=rng.randrange(1, 200), max_bytes=rng.choice([None, 3000, 20000]))
            for k, item in enumerate(batch):
                untag(item)
                with seen_lock:
                    assert seen.setdefault(i + k, item) == item, f"index {i + k} read two different items"
            i += len(batch)
            if not batch:
                if finished and i == total:
                    return
                time.sleep(0.0005)

    threads = Threads()
    try:
        for w in range(writers):
            threads.start(writer, Q, w, per_writer, w)
        for r in range(3):
            threads.start(reader, 50 + r)
        for t in threads.threads[:writers]:
            t.join(60)
        done_writing.set()
        threads.join(90)
        assert arr.head == total
        assert len(seen) == total
        final = arr.read_range(0)
        assert [seen[i] for i in range(total)] == final
        assert sorted(untag(item) for item in final) == sorted(
            (w, s) for w in range(writers) for s in range(per_writer)
        )
    finally:
        done_writing.set()
        arr.close()


def test_concurrent_readers_on_different_index_pages_with_a_small_cache(tmp_path):
    """Readers on three index pages with max_cached_pages=1: index pages are evicted
    and unmapped constantly while other readers use them. Every read must succeed."""
    per_page = 1 << 17
    n = 3 * per_page
    arr = BigArray(tmp_path / "a", data_page_size=1 << 20, max_cached_pages=1)
    try:
        arr.append_many([make_item(i, 16) for i in range(n)])

        def reader(page: int, seed: int) -> None:
            rng = random.Random(seed)
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                start = page * per_page + rng.randrange(0, per_page - 3000)
                batch = arr.read_range(start, max_items=rng.randrange(1, 3000))
                assert [item_index(x) for x in batch] == list(range(start, start + len(batch)))
                i = rng.randrange(page * per_page, (page + 1) * per_page)
                assert item_index(arr.get(i)) == i

        threads = Threads()
        for page in range(3):
            threads.start(reader, page, page)
        threads.join(30)
    finally:
        arr.close()


def test_writer_crossing_index_pages_while_readers_read_old_pages(tmp_path):
    """A writer moves through index pages (evicting old ones) while readers read the
    older pages by index, with max_cached_pages=1."""
    per_page = 1 << 17
    arr = BigArray(tmp_path / "a", data_page_size=1 << 20, max_cached_pages=1)
    stop = threading.Event()
    try:
        arr.append_many([make_item(i, 16) for i in range(per_page)])

        def write() -> None:
            try:
                i = arr.head
                while i < 4 * per_page:
                    k = min(2000, 4 * per_page - i)
                    if k % 2:
                        arr.append(make_item(i, 16))
                        k = 1
                    else:
                        arr.append_many([make_item(i + j, 16) for j in range(k)])
                    i += k
            finally:
                stop.set()

        def read(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                start = rng.randrange(0, arr.head - 1)
                batch = arr.read_range(start, max_items=rng.randrange(1, 2000))
                assert [item_index(x) for x in batch] == list(range(start, start + len(batch)))

        threads = Threads()
        threads.start(write)
        for r in range(2):
            threads.start(read, r)
        threads.join(60)
        assert arr.head == 4 * per_page
    finally:
        stop.set()
        arr.close()


def test_retention_while_readers_read(tmp_path):
    """remove_before_index deletes pages under readers: they get IndexOutOfRangeError
    for removed indexes, or correct items, never anything else."""
    from bigarray import IndexOutOfRangeError

    n = 20_000
    arr = BigArray(tmp_path / "a", data_page_size=PAGE, max_cached_pages=2)
    stop = threading.Event()
    try:
        arr.append_many([make_item(i, 100) for i in range(n)])

        def retain() -> None:
            try:
                for tail in range(0, n - 100, 97):
                    arr.remove_before_index(tail)
                    time.sleep(0.0002)
            finally:
                stop.set()

        def read(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                start = rng.randrange(max(0, arr.tail - 50), n)
                try:
                    batch = arr.read_range(start, max_items=rng.randrange(1, 100))
                except IndexOutOfRangeError:
                    continue
                assert [item_index(x) for x in batch] == list(range(start, start + len(batch)))

        threads = Threads()
        threads.start(retain)
        for r in range(2):
            threads.start(read, r)
        threads.join(60)
    finally:
        stop.set()
        arr.close()


def test_close_while_threads_read(tmp_path):
    """Closing under busy readers: they stop with ArrayClosedError, nothing else."""
    from bigarray import ArrayClosedError

    path = tmp_path / "a"
    with BigArray(path, data_page_size=PAGE) as arr:
        arr.append_many([make_item(i, 500) for i in range(2000)])
    for trial in range(100):
        arr = BigArray(path, max_cached_pages=2)
        started = threading.Barrier(5)

        def read(seed: int, arr=arr, started=started) -> None:
            rng = random.Random(seed)
            started.wait()
            while True:
                i = rng.randrange(0, 2000)
                try:
                    batch = arr.read_range(i, max_items=50)
                    assert [item_index(x) for x in batch] == list(range(i, i + len(batch)))
                    assert item_index(arr.get(i)) == i
                except ArrayClosedError:
                    return

        threads = Threads()
        for r in range(4):
            threads.start(read, trial * 10 + r)
        started.wait()
        time.sleep(0.0005 * (trial % 10))
        arr.close()
        threads.join(30)
        # nothing stays mapped once closed (a mapping would also pin deleted files' space)
        assert mapped_files(path) == [], f"trial {trial}"


def test_close_while_a_thread_writes(tmp_path):
    """Closing under a busy writer: it stops with ArrayClosedError; what it appended
    before is intact after a reopen."""
    from bigarray import ArrayClosedError

    path = tmp_path / "a"
    arr = BigArray(path, data_page_size=PAGE, max_cached_pages=2)
    started = threading.Event()

    def write() -> None:
        while True:
            try:
                arr.append(make_item(arr.head, 300))
                arr.append_many([make_item(arr.head + k, 100) for k in range(5)])
                started.set()
            except ArrayClosedError:
                return

    threads = Threads()
    threads.start(write)
    assert started.wait(10)
    time.sleep(0.05)
    arr.close()
    threads.join(30)
    with BigArray(path) as again:
        assert again.head > 0
        assert [item_index(x) for x in again.read_range(0)] == list(range(again.head))


def test_remove_group_while_the_group_is_read(tmp_path):
    """remove_group racing with dequeue on the same group: readers see items or a
    BigArrayError, never a raw error from a closed mapping; a group that exists
    afterwards has its position on disk (its folder was not removed under it)."""
    from bigarray import BigArrayError

    for trial in range(10):
        path = tmp_path / f"q{trial}"
        q = FanoutQueue(path, data_page_size=PAGE)
        q.enqueue_many([make_item(i, 100) for i in range(3000)])
        stop = threading.Event()

        def read(seed: int, q=q, stop=stop) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                try:
                    if rng.random() < 0.5:
                        item = q.dequeue("g")
                        if item is not None:
                            item_index(item)
                    else:
                        for item in q.dequeue_many("g", max_items=rng.randrange(1, 10)):
                            item_index(item)
                    q.peek("g")
                    q.size("g")
                except BigArrayError:
                    pass

        threads = Threads()
        for r in range(3):
            threads.start(read, trial * 10 + r)
        for _ in range(30):
            time.sleep(0.0005)
            q.remove_group("g")
        stop.set()
        threads.join(30)
        try:
            if "g" in q.groups():
                q.flush()
                front = path / "front_index_g" / "page-0.dat"
                assert front.exists(), f"trial {trial}: group 'g' exists but its folder was deleted"
                assert struct.unpack(">q", front.read_bytes()) == (q.group_index("g"),)
        finally:
            q.close()


def test_group_readers_while_retention_moves_the_tail(tmp_path):
    """Dequeuers racing retention: within a group no item is handed out twice, each
    reader sees increasing indexes, and everything not removed is delivered."""
    n = 20_000
    q = FanoutQueue(tmp_path / "q", data_page_size=PAGE, max_cached_pages=2)
    got: dict[tuple[str, int], list[int]] = {}
    retention_done = threading.Event()
    try:
        q.enqueue_many([make_item(i, 100) for i in range(n)])
        for g in ("g1", "g2"):
            q.reset_group(g, 0)

        def retain() -> None:
            try:
                for tail in range(0, n // 2, 113):
                    q.remove_before_index(tail)
                    time.sleep(0.0003)
            finally:
                retention_done.set()

        def read(group: str, rid: int) -> None:
            mine = got.setdefault((group, rid), [])
            while True:
                finished = retention_done.is_set()
                if rid % 2:
                    batch = q.dequeue_many(group, max_items=37)
                else:
                    item = q.dequeue(group)
                    batch = [] if item is None else [item]
                mine.extend(item_index(x) for x in batch)
                if not batch and finished:
                    return

        threads = Threads()
        threads.start(retain)
        for g in ("g1", "g2"):
            for r in range(2):
                threads.start(read, g, r)
        threads.join(60)
        final_tail = q.tail
        for g in ("g1", "g2"):
            seen = got[(g, 0)] + got[(g, 1)]
            assert len(seen) == len(set(seen)), f"group {g}: an item was handed out twice"
            for r in range(2):
                assert got[(g, r)] == sorted(got[(g, r)])
            assert set(range(final_tail, n)) <= set(seen), f"group {g}: retained items were not delivered"
    finally:
        retention_done.set()
        q.close()
