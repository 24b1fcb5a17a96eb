"""Bounded memory: the mapped set stays small however big the array is, and idle
pages are unmapped after their TTL."""

from __future__ import annotations

import shutil
import time

import pytest

from bigarray import BigArray

from ._util import mapped_files

pytestmark = pytest.mark.timeout(180)

MIB = 1 << 20


def item_of(i: int) -> bytes:
    return i.to_bytes(8, "big") * (MIB // 8)


def check_bound(arr: BigArray, bound: int, path) -> int:
    count = arr.mapped_page_count()
    assert count <= bound, f"{count} pages mapped, more than {bound}"
    # the process's real mappings agree (a leaked mapping would show up here)
    real = [m for m in mapped_files(path) if "/meta_data/" not in m]
    assert len(real) <= bound, f"{len(real)} page files mapped: {real}"
    return count


def test_mapped_pages_stay_bounded_over_a_gib(tmp_path):
    path = tmp_path / "big"
    max_cached = 4
    bound = 2 * max_cached + 2
    n = 1024  # 1 MiB items: 1 GiB in 128 data pages of 8 MiB
    peak = 0
    arr = BigArray(path, data_page_size=8 * MIB, max_cached_pages=max_cached)
    try:
        i = 0
        while i < n:
            if i % 3:
                arr.append(item_of(i))
                i += 1
            else:
                k = min(5, n - i)
                arr.append_many([item_of(i + j) for j in range(k)])
                i += k
            peak = max(peak, check_bound(arr, bound, path))
        assert arr.head == n
        # read everything back: item by item, then in batches, then at random
        for i in range(0, n, 3):
            assert arr.get(i) == item_of(i)
            check_bound(arr, bound, path)
        i = 0
        while i < n:
            batch = arr.read_range(i, max_bytes=10 * MIB)
            assert batch[0] == item_of(i) and batch[-1] == item_of(i + len(batch) - 1)
            i += len(batch)
            peak = max(peak, check_bound(arr, bound, path))
        for i in range(n - 1, 0, -37):
            assert arr.item_length(i) == MIB
            check_bound(arr, bound, path)
        assert peak >= 2  # it did map pages
    finally:
        arr.close()
        assert mapped_files(path) == []
        shutil.rmtree(path, ignore_errors=True)


def test_idle_pages_are_unmapped_after_ttl(tmp_path):
    path = tmp_path / "a"
    with BigArray(path, data_page_size=4096, max_cached_pages=8, page_ttl_s=0.2) as arr:
        arr.append_many([b"x" * 3000 for _ in range(20)])  # 20 data pages
        for i in range(0, 20, 3):
            arr.get(i)
        before = arr.mapped_page_count()
        assert before >= 5
        time.sleep(0.35)
        arr.expire_idle_pages()
        after = arr.mapped_page_count()
        # only the pages the writer holds (head index and data page) stay mapped
        assert after <= 2, after
        assert len([m for m in mapped_files(path) if "/meta_data/" not in m]) <= 2
        assert arr.get(0) == b"x" * 3000  # maps again on demand
    with BigArray(path, page_ttl_s=0.2) as arr:  # a reader only: nothing stays
        assert arr.read_range(0) == [b"x" * 3000] * 20
        assert arr.mapped_page_count() >= 2
        time.sleep(0.35)
        arr.expire_idle_pages()
        assert arr.mapped_page_count() == 0
        assert [m for m in mapped_files(path) if "/meta_data/" not in m] == []


def test_pages_used_recently_are_kept(tmp_path):
    with BigArray(tmp_path / "a", data_page_size=4096, page_ttl_s=5.0) as arr:
        arr.append_many([b"y" * 3000 for _ in range(4)])
        arr.get(0)
        count = arr.mapped_page_count()
        arr.expire_idle_pages()
        assert arr.mapped_page_count() == count


def test_close_unmaps_everything(tmp_path):
    path = tmp_path / "a"
    arr = BigArray(path, data_page_size=4096)
    arr.append_many([b"z" * 2000 for _ in range(50)])
    arr.read_range(0)
    assert mapped_files(path)
    arr.close()
    assert mapped_files(path) == []
