"""A short bigarray demo: ``python -m bigarray [--dir DIR] [--items N]``.

Appends N items to a FanoutQueue in batches, reads them back with two groups, reopens
the queue to show positions persist, and prints the rates it saw and the disk space
the queue took. Without ``--dir`` the queue lives in a new temporary directory that is
removed at the end; with ``--dir`` it stays there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Iterator

from . import FanoutQueue


def _disk_use(path: str) -> int:
    """Bytes allocated on disk under ``path`` (st_blocks, not file sizes)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
    return total


@contextlib.contextmanager
def _queue_dir(given: str | None) -> Iterator[str]:
    if given:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="bigarray-demo-") as tmp:
        yield os.path.join(tmp, "demo")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bigarray", description=__doc__)
    parser.add_argument("--dir", help="queue directory, kept afterwards (default: a temporary one, removed at the end)")
    parser.add_argument("--items", type=int, default=1_000_000, help="items of 100 bytes to append (default 1,000,000)")
    args = parser.parse_args(argv)
    if args.items < 1:
        parser.error("--items must be at least 1")
    items = [i.to_bytes(8, "big") + b"." * 92 for i in range(args.items)]

    with _queue_dir(args.dir) as path:
        with FanoutQueue(path) as q:
            t0 = time.perf_counter()
            for k in range(0, len(items), 10_000):
                q.enqueue_many(items[k : k + 10_000])
            t1 = time.perf_counter()
            got = []
            while batch := q.dequeue_many("analytics", max_bytes=1 << 20):
                got.extend(batch)
            t2 = time.perf_counter()
            assert got == items, "read back something else than was appended"
            half = q.dequeue_many("archive", max_items=len(items) // 2)
        print(f"queue directory: {path}" + ("" if args.dir else " (temporary, removed at the end)"))
        print(f"appended {len(items):,} items of 100 B: {len(items) / (t1 - t0):,.0f} items/s")
        print(f"group 'analytics' read them all back:  {len(got) / (t2 - t1):,.0f} items/s")
        with FanoutQueue(path) as q:
            print(
                f"reopened: size={q.size()}, groups={q.groups()}, "
                f"'archive' has {q.size('archive'):,} left after reading {len(half):,}"
            )
        print(f"disk space used: {_disk_use(path) / 1e6:,.1f} MB for {len(items) * 100 / 1e6:,.1f} MB of items")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
