"""Our page files (sparse, reserved in steps) are read and written by Java bigqueue
0.7.2 and by Java Luxun 0.6.2's FanOutQueueImplEx, and theirs by us, byte for byte.

``interop/BigQueueInterop.java`` is compiled with javac against the Java Luxun build
found through ``LUXUN_JAVA_PEER`` (default ``<repo>/.peers/luxun-java``, see
``../shared/peers/luxun-java/README.md``); without that build or a JDK the tests skip.
Java's smallest data page is 32 MiB (``BigArrayImpl.MINIMUM_DATA_PAGE_SIZE``), so both
sides use 32 MiB pages and about 38 MB of items: two data pages, our reservation steps
(64 KiB here) crossed hundreds of times in data and a few times in the index.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from bigarray import FanoutQueue

from ._util import ROOT

pytestmark = pytest.mark.timeout(300)

PEER = Path(os.environ.get("LUXUN_JAVA_PEER", ROOT / ".peers" / "luxun-java"))
SOURCE = Path(__file__).resolve().parent / "interop" / "BigQueueInterop.java"
PAGE = 32 * 1024 * 1024  # Java's minimum data page size
COUNT = 2500  # items of BigQueueInterop.size(): about 38 MB, two data pages
STEP = 64 * 1024
EXTRA = 2200  # items Java appends to our queue: on past the end of data page 1
KIB = 1024


def size(i: int) -> int:
    """BigQueueInterop.size."""
    return 150_000 + i if i % 10 == 0 else 1 + (i * 37) % 500


def item(i: int) -> bytes:
    """BigQueueInterop.item: (i * 31 + k * 7) & 0xff."""
    start = (i * 31) & 0xFF
    period = bytes((start + k * 7) & 0xFF for k in range(256))
    n = size(i)
    return (period * (n // 256 + 1))[:n]


@pytest.fixture(scope="module")
def java(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The command that runs BigQueueInterop (compiled once per module)."""
    classpath_file = PEER / "build" / "classpath.txt"
    if not classpath_file.is_file():
        pytest.skip(f"no Java Luxun build at {PEER} (set LUXUN_JAVA_PEER; see ../shared/peers/luxun-java/README.md)")
    javac, java_bin = shutil.which("javac"), shutil.which("java")
    if not (javac and java_bin):
        pytest.skip("no JDK (java and javac) on PATH")
    classpath = classpath_file.read_text().strip()
    jars = classpath.split(os.pathsep)
    if not any("bigqueue" in os.path.basename(j) for j in jars) or not all(os.path.exists(j) for j in jars):
        pytest.skip(f"{classpath_file} does not name an existing bigqueue jar and Luxun jar")
    out = tmp_path_factory.mktemp("bq-interop-classes")
    proc = subprocess.run(
        [javac, "-cp", classpath, "-d", str(out), str(SOURCE)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"javac failed:\n{proc.stderr}"
    return [java_bin, "-cp", f"{out}{os.pathsep}{classpath}", "BigQueueInterop"]


def run_java(java: list[str], *args: object) -> dict:
    proc = subprocess.run([*java, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"BigQueueInterop {args[0]} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("BQ_INTEROP ")]
    assert lines, f"no result line from BigQueueInterop:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("BQ_INTEROP ") :])


def read_dump(path: Path) -> list[tuple[int, bytes]]:
    """The items BigQueueInterop read dumped: (index, bytes)."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        index, length = struct.unpack_from(">qi", data, pos)
        pos += 12
        out.append((index, data[pos : pos + length]))
        pos += length
    return out


def blocks(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_java_reads_and_appends_to_what_we_wrote(tmp_path, java):
    parent, name = tmp_path, "ours"
    qdir = parent / name
    with FanoutQueue(qdir, data_page_size=PAGE, reserve_step=STEP) as q:
        for i in range(0, COUNT, 50):  # batches and single appends
            q.enqueue_many([item(k) for k in range(i, i + 40)])
            for k in range(i + 40, i + 50):
                q.enqueue(item(k))
        assert len(q.dequeue_many("py", max_items=7)) == 7
        head = q.head
        last_page, last_off, last_len, _ = q.array._index_item(head - 1)
    data = qdir / "data"
    assert last_page == 1, "the items must cross a data page boundary"
    # our pages: full size, sparse beyond what was written and reserved (a step, and
    # half of one more where the writer reserves ahead to fault its pages in early)
    assert os.path.getsize(data / "page-1.dat") == PAGE
    assert blocks(data / "page-1.dat") <= last_off + last_len + STEP + STEP // 2
    assert blocks(qdir / "index" / "page-0.dat") <= head * 32 + STEP
    # A page file shorter than the page (we never leave one; our read-ahead may have
    # made page 2 sparse at full size): Java's FileChannel.map extends it when Java's
    # appends below roll into it.
    page2 = data / "page-2.dat"
    with open(page2, "ab") as f:
        f.truncate(4096)

    res = run_java(java, "read", parent, name, PAGE, tmp_path / "dump", "py", 1 << 20, head, EXTRA)
    assert (res["tail"], res["head"]) == (0, head)
    dump = read_dump(tmp_path / "dump")
    assert [i for i, _ in dump] == list(range(head))
    bad = [i for i, b in dump if b != item(i)]
    assert bad == [], f"Java read other bytes than we wrote at indexes {bad[:10]}"
    # Luxun's batchDequeue for the group we left at 7 (it checks the bytes itself)
    assert res["group_before"] == 7 and res["batch_items"] > 0
    assert res["group_after"] == 7 + res["batch_items"]
    assert res["head_after"] == head + EXTRA
    assert os.path.getsize(page2) == PAGE  # Java extended the short page and wrote into it

    # Java appended into our sparse page 1 and on into page 2: we read everything back
    with FanoutQueue(qdir) as q:
        assert q.array.data_page_size == PAGE
        assert q.head == head + EXTRA
        assert q.array._index_item(q.head - 1)[0] == 2
        assert q.group_index("py") == res["group_after"]
        got = []
        i = 0
        while i < q.head:
            batch = q.read_range(i, max_bytes=4 << 20)
            got += batch
            i += len(batch)
        bad = [k for k, b in enumerate(got) if b != item(k)]
        assert len(got) == head + EXTRA and bad == [], f"wrong bytes at {bad[:10]}"


def test_we_read_and_append_to_what_java_wrote(tmp_path, java):
    parent, name = tmp_path, "theirs"
    qdir = parent / name
    res = run_java(java, "write", parent, name, PAGE, COUNT, "java", 5)
    assert res == {"group_index": 5}
    data = qdir / "data"
    java_pages = sorted(os.listdir(data))
    assert java_pages[:2] == ["page-0.dat", "page-1.dat"]
    print(
        "Java's page files (size, allocated):",
        {n: (os.path.getsize(data / n), blocks(data / n)) for n in java_pages},
    )
    # One of Java's pages fully allocated, as an older JDK (or a copy) leaves it.
    fd = os.open(data / "page-1.dat", os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, PAGE)
    finally:
        os.close(fd)

    with FanoutQueue(qdir, reserve_step=STEP) as q:
        assert q.array.data_page_size == PAGE  # taken from Java's page file
        assert (q.tail, q.head) == (0, COUNT)
        assert q.group_index("java") == 5
        bad = [i for i in range(COUNT) if q.get(i) != item(i)]
        assert bad == [], f"we read other bytes than Java wrote at indexes {bad[:10]}"
        assert [b == item(5 + k) for k, b in enumerate(q.dequeue_many("java", max_items=3))] == [True] * 3
        # we append past Java's items, into its page and on into a new one of ours
        q.enqueue_many([item(k) for k in range(COUNT, COUNT + 200)])
        for k in range(COUNT + 200, COUNT + 300):
            q.enqueue(item(k))
        head = q.head
        assert q.array._index_item(head - 1)[0] >= 1

    res = run_java(java, "read", parent, name, PAGE, tmp_path / "dump", "java", 1 << 20, head, 0)
    assert (res["tail"], res["head"]) == (0, head)
    assert res["group_before"] == 8
    dump = read_dump(tmp_path / "dump")
    assert [i for i, _ in dump] == list(range(head))
    bad = [i for i, b in dump if b != item(i)]
    assert bad == [], f"Java read other bytes than were written at indexes {bad[:10]}"
