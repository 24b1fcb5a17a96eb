"""A really full disk (file size limit, or a tiny tmpfs) must give DiskFullError when a
page is allocated: never a crash (SIGBUS/SIGXFSZ), never a lost item.

Each scenario runs in a child process (a SIGBUS would otherwise kill pytest) that
prints one JSON line with what it saw."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import textwrap

import pytest

from ._util import PYTHON, ROOT

pytestmark = pytest.mark.timeout(120)

# Shared by every child: append self-checking items until DiskFullError.
PRELUDE = textwrap.dedent(
    """
    import json, os, random, resource, signal, sys
    sys.path.insert(0, os.path.join({root!r}, "tests", "bigarray"))
    from _util import make_item, item_index
    import bigarray
    from bigarray import BigArray, DiskFullError

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    result = {{}}

    def fill(arr, rng, limit=100_000):
        '''Append until DiskFullError; return the error (or None after `limit` items).'''
        for _ in range(limit):
            head = arr.head
            try:
                if rng.random() < 0.5:
                    assert arr.append(make_item(head, rng.randrange(200, 3000))) == head
                else:
                    n = rng.randrange(1, 30)
                    batch = [make_item(head + k, rng.randrange(16, 3000)) for k in range(n)]
                    assert arr.append_many(batch) == head
            except DiskFullError as exc:
                assert arr.head == head, "a failed append moved head"
                return exc
        return None

    def check_all(arr):
        for i in range(arr.tail, arr.head):
            assert item_index(arr.get(i)) == i, i
        got = []
        i = arr.tail
        while i < arr.head:
            batch = arr.read_range(i, max_bytes=1 << 20)
            got += [item_index(x) for x in batch]
            i += len(batch)
        assert got == list(range(arr.tail, arr.head))
    """
)


FILL_UP = textwrap.dedent(
    """
    import errno
    def fill_up(directory):
        fd = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for size in (64 * 1024, 512):
                try:
                    while True:
                        os.write(fd, bytes(size))
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
        finally:
            os.close(fd)
    """
)


def run_child(body: str, *, prelude: str = "", **fmt) -> dict:
    code = PRELUDE.format(root=str(ROOT)) + prelude + textwrap.dedent(body).format(**fmt)
    code += "\nprint(json.dumps(result))\n"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, f"child died with {out.returncode} (negative: a signal)\n{out.stderr[-3000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_file_size_limit_at_first_append(tmp_path):
    """RLIMIT_FSIZE below the 4 MiB index page: the very first append fails cleanly."""
    res = run_child(
        """
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        arr = BigArray({path!r}, data_page_size=64 * 1024)
        try:
            arr.append(b"x" * 100)
            result["raised"] = None
        except Exception as exc:
            result["raised"] = type(exc).__name__
            result["is_disk_full"] = isinstance(exc, bigarray.DiskFullError)
            result["is_oserror"] = isinstance(exc, OSError)
            result["retriable"] = exc.retriable
        result["head"] = arr.head
        result["read_at_head"] = arr.read_range(0)
        arr.close()
        result["closed"] = arr.closed
        """,
        path=str(tmp_path / "a"),
    )
    assert res == {
        "raised": "DiskFullError",
        "is_disk_full": True,
        "is_oserror": True,
        "retriable": True,
        "head": 0,
        "read_at_head": [],
        "closed": True,
    }


# a batch of 10 items of 8 KB (pwritev), or one item of 70 KB (pwrite)
_BIG_WRITES = {
    "batch": ("arr.append_many([make_item(head + k, 8000) for k in range(10)])", 100),
    "single": ("arr.append(make_item(head, 70_000))", 14),
}


@pytest.mark.parametrize("kind", sorted(_BIG_WRITES))
def test_big_items_are_written_through_the_mapping_past_the_file_size_limit(tmp_path, kind):
    """RLIMIT_FSIZE binds write() (pwritev of big batches, pwrite of big single items) but
    not a mapping: inside a page file made before the limit, big items still go in (the
    array finishes them through the mapping) until the next page cannot be made: then
    DiskFullError, and head has not moved."""
    write, at_least = _BIG_WRITES[kind]
    res = run_child(
        """
        arr = BigArray({path!r}, data_page_size=1 << 20, prefetch=False)
        arr.append(make_item(0, 1000))  # the first data page exists, 1 MiB sparse
        resource.setrlimit(resource.RLIMIT_FSIZE, (32 * 1024, resource.RLIM_INFINITY))
        error = None
        while error is None and arr.head < 10_000:
            head = arr.head
            try:
                assert {write} == head
            except DiskFullError as exc:
                error = exc
                assert arr.head == head
        result["error"] = type(error).__name__ if error else None
        result["head"] = arr.head
        check_all(arr)
        arr.close()
        """,
        path=str(tmp_path / "a"),
        write=write,
    )
    assert res["error"] == "DiskFullError"
    # ~1 MiB of items, most of them past the 32 KiB limit (15 of 70 KB fit in the page)
    assert res["head"] > at_least


def test_file_size_limit_reached_on_data_page_roll(tmp_path):
    res = run_child(
        """
        rng = random.Random(7)
        arr = BigArray({path!r}, data_page_size=64 * 1024)
        for i in range(200):
            arr.append(make_item(i, 1000))
        # from now on no file may grow past 32 KiB: the next new data page cannot be made
        resource.setrlimit(resource.RLIMIT_FSIZE, (32 * 1024, resource.RLIM_INFINITY))
        exc = fill(arr, rng)
        result["error"] = type(exc).__name__ if exc else None
        result["message"] = str(exc)
        result["head"] = arr.head
        check_all(arr)            # every item appended before is intact
        result["checked"] = True
        exc2 = fill(arr, rng)     # still full: still a clean error
        result["error_again"] = type(exc2).__name__ if exc2 else None
        check_all(arr)
        arr.close()
        result["closed"] = arr.closed
        """,
        path=str(tmp_path / "a"),
    )
    assert res["error"] == "DiskFullError"
    assert "page" in res["message"]
    assert res["head"] > 200
    assert res["checked"] and res["closed"]
    assert res["error_again"] == "DiskFullError"


def test_appends_resume_after_file_size_limit_is_lifted(tmp_path):
    """After DiskFullError (here in the middle of an append_many that had to roll to a
    new page), appends go on once space is back, and everything survives a reopen."""
    res = run_child(
        """
        arr = BigArray({path!r}, data_page_size=64 * 1024, prefetch=False)
        arr.append(make_item(0, 1000))
        resource.setrlimit(resource.RLIMIT_FSIZE, (32 * 1024, resource.RLIM_INFINITY))
        try:
            while True:
                head = arr.head
                arr.append_many([make_item(head + k, 1000) for k in range(10)])
        except DiskFullError:
            pass
        result["full_at"] = arr.head
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        for k in range(3):
            arr.append(make_item(arr.head, 100))
        arr.append_many([make_item(arr.head + k, 1000) for k in range(100)])
        result["head"] = arr.head
        check_all(arr)
        arr.close()
        arr = BigArray({path!r})
        result["head_after_reopen"] = arr.head
        check_all(arr)
        arr.close()
        """,
        path=str(tmp_path / "a"),
    )
    assert res["full_at"] == 61  # 64 KiB page / 1000-byte items, in batches of 10 after the first
    assert res["head"] == res["full_at"] + 103
    assert res["head_after_reopen"] == res["head"], "acknowledged items were dropped on reopen"


def test_full_tmpfs(tmpfs):
    res = run_child(
        """
        rng = random.Random(11)
        arr = BigArray({path!r}, data_page_size=64 * 1024)
        exc = fill(arr, rng)
        result["error"] = type(exc).__name__ if exc else None
        result["errno"] = getattr(exc, "errno", None)
        result["head"] = arr.head
        check_all(arr)
        result["checked"] = True
        result["error_again"] = type(fill(arr, rng)).__name__
        result["head_before_reopen"] = arr.head  # small items may still fit after the first error
        check_all(arr)
        arr.close()
        arr = BigArray({path!r})
        result["head_after_reopen"] = arr.head
        check_all(arr)
        arr.close()
        """,
        path=str(tmpfs / "a"),
    )
    assert res["error"] == "DiskFullError"
    assert res["errno"] == errno.ENOSPC
    assert res["head"] > 100
    assert res["checked"]
    assert res["error_again"] == "DiskFullError"
    assert res["head_before_reopen"] >= res["head"]
    assert res["head_after_reopen"] == res["head_before_reopen"]


def test_full_tmpfs_resumes_after_retention_frees_space(tmpfs):
    """The README's promise: nothing appended is lost, appends resume once space is
    freed (here by retention deleting old pages). The disk fills during append_many
    batches larger than a data page, so the failing batch had begun a page."""
    res = run_child(
        """
        rng = random.Random(12)
        arr = BigArray({path!r}, data_page_size=64 * 1024)
        for rounds in range(2):
            try:
                while True:
                    head = arr.head
                    arr.append_many([make_item(head + k, rng.randrange(1000, 3000)) for k in range(40)])
            except DiskFullError:
                pass
            check_all(arr)
            arr.remove_before_index(arr.head - 20)   # frees all but the last pages
            for k in range(50):
                arr.append(make_item(arr.head, 40 + k))
            arr.append_many([make_item(arr.head + k, 500) for k in range(50)])
            check_all(arr)
        result["tail"], result["head"] = arr.tail, arr.head
        arr.close()
        arr = BigArray({path!r})
        result["after_reopen"] = [arr.tail, arr.head]
        check_all(arr)
        arr.close()
        """,
        path=str(tmpfs / "a"),
    )
    assert res["after_reopen"] == [res["tail"], res["head"]], "acknowledged items were dropped on reopen"


def test_index_page_allocation_fails_at_the_index_page_boundary(tmp_path):
    """The next index page (4 MiB) cannot be made: append and append_many across the
    boundary fail cleanly, and go on once the limit is lifted."""
    res = run_child(
        """
        arr = BigArray({path!r}, data_page_size=64 * 1024, prefetch=False)
        per_page = 1 << 17
        arr.append_many([make_item(i, 16) for i in range(per_page - 5)])
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        errors = []
        try:
            arr.append_many([make_item(per_page - 5 + k, 16) for k in range(10)])  # crosses
        except DiskFullError:
            errors.append("many")
        for k in range(5):
            arr.append(make_item(arr.head, 16))  # the rest of index page 0 still works
        try:
            arr.append(make_item(arr.head, 16))
        except DiskFullError:
            errors.append("one")
        result["errors"] = errors
        result["full_head"] = arr.head
        check_all(arr)
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        arr.append(make_item(arr.head, 16))
        arr.append_many([make_item(arr.head + k, 16) for k in range(10)])
        result["head"] = arr.head
        arr.close()
        arr = BigArray({path!r})
        result["head_after_reopen"] = arr.head
        check_all(arr)
        arr.close()
        """,
        path=str(tmp_path / "a"),
    )
    per_page = 1 << 17
    assert res["errors"] == ["many", "one"]
    assert res["full_head"] == per_page
    assert res["head"] == per_page + 11
    assert res["head_after_reopen"] == res["head"]


def test_new_group_on_a_full_disk_leaves_nothing_behind(tmpfs):
    """Creating a group needs an 8-byte page: on a full disk that is a DiskFullError,
    and (like an invalid name) it must leave no half-made group that would come back,
    at position 0, on the next open, or stop the queue from opening while still full."""
    res = run_child(
        """
        from bigarray import FanoutQueue
        q = FanoutQueue({path!r}, data_page_size=64 * 1024)
        q.enqueue_many([make_item(i, 100) for i in range(10)])
        q.dequeue("old")
        fill_up({mnt!r})
        try:
            q.dequeue("new")
            result["error"] = None
        except DiskFullError:
            result["error"] = "DiskFullError"
        result["groups"] = q.groups()
        result["dirs"] = sorted(n for n in os.listdir({path!r}) if n.startswith("front_index_"))
        result["old"] = q.dequeue("old") is not None
        q.close()
        try:
            q = FanoutQueue({path!r})
            result["reopen_groups"] = q.groups()
            q.close()
        except Exception as exc:
            result["reopen_groups"] = type(exc).__name__
        """,
        path=str(tmpfs / "q"),
        mnt=str(tmpfs),
        prelude=FILL_UP,
    )
    assert res["error"] == "DiskFullError"
    assert res["groups"] == ["old"]
    assert res["old"] is True
    assert (res["dirs"], res["reopen_groups"]) == (["front_index_old"], ["old"])


def test_creating_an_array_on_a_full_disk(tmpfs):
    """A new array on a full disk: DiskFullError (an OSError with ENOSPC), no crash,
    no temporary file left behind; it opens once space is back."""
    res = run_child(
        """
        fill_up({mnt!r})
        try:
            BigArray({path!r}, data_page_size=64 * 1024).close()
            result["error"] = None
        except OSError as exc:
            result["error"] = type(exc).__name__
            result["errno"] = exc.errno
        result["left"] = sorted(os.listdir({path!r})) if os.path.isdir({path!r}) else []
        os.unlink(os.path.join({mnt!r}, "filler"))
        arr = BigArray({path!r}, data_page_size=64 * 1024)
        arr.append(make_item(0, 100))
        check_all(arr)
        arr.close()
        """,
        path=str(tmpfs / "a"),
        mnt=str(tmpfs),
        prelude=FILL_UP,
    )
    assert res["errno"] == errno.ENOSPC
    assert res["error"] == "DiskFullError"
    assert not [n for n in res["left"] if n.endswith(".tmp")], res["left"]


STEP_BOUNDARY = textwrap.dedent(
    """
    from bigarray import format as fmt
    arr = BigArray({path!r}, data_page_size=8 << 20, reserve_step=64 * 1024, prefetch={prefetch})
    for i in range({before}):
        arr.append(make_item(i, {size}))
    fill_up({mnt!r})   # the file system has no free block left from here on
    try:
        while True:     # what is reserved still takes appends, the next step does not
            arr.append(make_item(arr.head, {size}))
    except DiskFullError as exc:
        result["errno"] = exc.errno
        result["message"] = str(exc)
    result["full_at"] = arr.head
    result["data_pages"] = sorted(os.listdir(os.path.join({path!r}, "data")))
    try:
        arr.append_many([make_item(arr.head + k, {size}) for k in range(3)])
        result["many"] = None
    except DiskFullError:
        result["many"] = "DiskFullError"
    result["head_after_many"] = arr.head
    check_all(arr)
    os.unlink(os.path.join({mnt!r}, "filler"))   # space is back: appends go on
    for k in range(300):
        arr.append(make_item(arr.head, {size}))
    arr.append_many([make_item(arr.head + k, {size}) for k in range(300)])
    result["head"] = arr.head
    check_all(arr)
    arr.close()
    arr = BigArray({path!r})
    result["head_after_reopen"] = arr.head
    check_all(arr)
    arr.close()
    """
)


@pytest.mark.parametrize("prefetch", [False, True])
def test_full_tmpfs_at_a_data_step_boundary_inside_a_page(tmpfs, prefetch):
    """Data pages are sparse and reserved 64 KiB at a time here: with the disk full, the
    appends that fit in the reserved step succeed, the first one past it is a clean
    DiskFullError in the middle of the 8 MiB page (a write into the unreserved hole
    would have been a SIGBUS), and nothing is lost."""
    res = run_child(
        STEP_BOUNDARY,
        path=str(tmpfs / "a"),
        mnt=str(tmpfs),
        prefetch=prefetch,
        before=50,
        size=1000,
        prelude=FILL_UP,
    )
    assert res["errno"] == errno.ENOSPC
    assert "reserve" in res["message"] and "data" in res["message"], res["message"]
    assert res["full_at"] == 65  # 64 KiB step / 1000-byte items
    assert res["data_pages"] == ["page-0.dat"]  # inside the first page (8 MiB)
    assert (res["many"], res["head_after_many"]) == ("DiskFullError", 65)
    assert res["head"] == 65 + 600
    assert res["head_after_reopen"] == res["head"]


@pytest.mark.parametrize("prefetch", [False, True])
def test_full_tmpfs_while_a_fast_writer_reserves_ahead(tmpfs, prefetch):
    """A fast writer with prefetch reserves its next step half a step early (to have it
    faulted in ahead of it). With the disk full, that early reservation fails quietly:
    the writer goes on up to the end of what it holds, and only its own reservation
    raises, at the same item as without prefetch (256 KiB / 1000-byte items)."""
    res = run_child(
        STEP_BOUNDARY,
        path=str(tmpfs / "a"),
        mnt=str(tmpfs),
        prefetch=prefetch,
        before=200,  # 195 KiB: four steps reserved, the last at 192 KiB
        size=1000,
        prelude=FILL_UP,
    )
    assert res["errno"] == errno.ENOSPC
    assert res["full_at"] == 262
    assert (res["many"], res["head_after_many"]) == ("DiskFullError", 262)
    assert res["head"] == 262 + 600
    assert res["head_after_reopen"] == res["head"]


def test_full_tmpfs_at_an_index_step_boundary(tmpfs):
    """The index page is reserved in steps too: 4 KiB steps hold 128 index items."""
    body = STEP_BOUNDARY.replace("reserve_step=64 * 1024", "reserve_step=4096")
    res = run_child(body, path=str(tmpfs / "a"), mnt=str(tmpfs), prefetch=False, before=100, size=16, prelude=FILL_UP)
    assert res["errno"] == errno.ENOSPC
    assert "index" in res["message"], res["message"]
    assert res["full_at"] == 128
    assert (res["many"], res["head_after_many"]) == ("DiskFullError", 128)
    assert res["head"] == 128 + 600
    assert res["head_after_reopen"] == res["head"]
