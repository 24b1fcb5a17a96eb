"""A short bigarray demo: ``python -m bigarray [--dir DIR] [--items N]``.

Appends N items to a FanoutQueue in batches, reads them back with two groups, reopens
the queue to show positions persist, and prints the rates it saw.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from . import FanoutQueue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bigarray", description=__doc__)
    parser.add_argument("--dir", help="queue directory (default: a new temporary directory)")
    parser.add_argument("--items", type=int, default=1_000_000, help="items of 100 bytes to append (default 1,000,000)")
    args = parser.parse_args(argv)
    path = args.dir or os.path.join(tempfile.mkdtemp(prefix="bigarray-demo-"), "demo")
    items = [i.to_bytes(8, "big") + b"." * 92 for i in range(args.items)]

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
    print(f"queue directory: {path}")
    print(f"appended {len(items):,} items of 100 B: {len(items) / (t1 - t0):,.0f} items/s")
    print(f"group 'analytics' read them all back:  {len(got) / (t2 - t1):,.0f} items/s")
    with FanoutQueue(path) as q:
        print(
            f"reopened: size={q.size()}, groups={q.groups()}, "
            f"'archive' has {q.size('archive'):,} left after reading {len(half):,}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
