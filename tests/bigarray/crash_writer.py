"""Writer process for test_crash.py: ``python crash_writer.py DIR SEED``.

Opens (or reopens) the array in DIR and appends self-checking items (each encodes
its own index and a CRC, see _util.make_item) with a random mix of append and
append_many, forever. After every append returns it writes the last acknowledged
index as one line to stdout and flushes, so whatever the parent reads was
acknowledged before the process was killed.
"""

from __future__ import annotations

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _util import make_item

from bigarray import BigArray

DATA_PAGE_SIZE = 64 * 1024


def main() -> None:
    path, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    out = sys.stdout
    with BigArray(path, data_page_size=DATA_PAGE_SIZE) as arr:
        out.write(f"open {arr.tail} {arr.head}\n")
        out.flush()
        while True:
            head = arr.head
            if rng.random() < 0.5:
                last = arr.append(make_item(head, rng.randrange(500, 1600)))
            else:
                n = rng.randrange(1, 40)
                items = [make_item(head + k, rng.randrange(16, 1600)) for k in range(n)]
                last = arr.append_many(items) + n - 1
            out.write(f"{last}\n")
            out.flush()


if __name__ == "__main__":
    main()
