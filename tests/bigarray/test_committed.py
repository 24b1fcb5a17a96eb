"""Committed positions of fanout groups (at-least-once groups): stored beside the
group's position, refused by dequeue, and readable after kill -9 of the writer."""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from bigarray import FanoutQueue, IndexOutOfRangeError
from bigarray.fanout import CommittedGroupError

from ._util import PYTHON, ROOT

pytestmark = pytest.mark.timeout(120)


def filled(path: Path, n: int = 10) -> FanoutQueue:
    q = FanoutQueue(path)
    q.enqueue_many([b"item-%d" % i for i in range(n)])
    return q


def test_commit_is_stored_beside_the_group_position(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        assert q.committed("g") is None
        assert q.committed_start("g") == 0  # a new group starts at tail, and is not created
        assert q.groups() == []
        q.commit("g", 4)
        assert q.committed("g") == 4
        assert q.committed_start("g") == 4
        assert q.size("g") == 6  # the group's position moved with the commit
    page = tmp_path / "q" / "committed_g" / "page-0.dat"
    assert struct.unpack(">q", page.read_bytes()[:8]) == (4,)
    assert struct.unpack(">q", (tmp_path / "q" / "front_index_g" / "page-0.dat").read_bytes()[:8]) == (4,)
    with FanoutQueue(tmp_path / "q") as q:
        assert q.committed("g") == 4
        assert q.groups() == ["g"]


def test_commit_outside_tail_head_is_refused(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        q.commit("g", 10)  # head: everything processed
        with pytest.raises(IndexOutOfRangeError):
            q.commit("g", 11)
        q.remove_before_index(3)
        with pytest.raises(IndexOutOfRangeError):
            q.commit("g", 2)
        assert q.committed("g") == 10
        q.commit("g", 3)  # backwards is allowed (a seek)
        assert q.committed("g") == 3


def test_a_committing_group_refuses_dequeue(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        assert q.dequeue("auto") == b"item-0"
        q.commit("g", 2)
        for call in (
            lambda: q.dequeue("g"),
            lambda: q.dequeue_many("g", max_items=3),
            lambda: q.dequeue_blob("g", max_items=3),
        ):
            with pytest.raises(CommittedGroupError, match="'g' commits its positions"):
                call()
        assert q.committed("g") == 2
        # an at-most-once group that starts committing continues where it stands
        assert q.committed_start("auto") == 1
        assert q.dequeue("auto") == b"item-1"


def test_remove_group_forgets_the_committed_position(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        q.commit("g", 5)
        q.remove_group("g")
        assert not (tmp_path / "q" / "committed_g").exists()
        assert q.committed("g") is None
        assert q.dequeue("g") == b"item-0"  # an ordinary group again


def test_retention_past_the_committed_index_starts_at_tail(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        q.commit("g", 2)
        q.remove_before_index(5)
        assert q.committed_start("g") == 5
        q.cleanup()  # the committed group is the slowest: nothing below it matters
        assert q.tail == 5


def test_a_committed_position_beyond_head_after_a_crash_is_moved_to_head(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        q.commit("g", 10)
    # items lost in a crash: head rolled back below the committed index
    meta = tmp_path / "q" / "meta_data" / "page-0.dat"
    data = bytearray(meta.read_bytes())
    data[0:8] = struct.pack(">q", 7)
    meta.write_bytes(bytes(data))
    with FanoutQueue(tmp_path / "q") as q:
        assert q.head == 7
        assert q.committed("g") == 7


COMMITTER = """
import sys
from bigarray import FanoutQueue
q = FanoutQueue(sys.argv[1])
out = sys.stdout
i = q.committed("g") or 0
while True:
    i = i + 1 if i < q.head else q.tail
    q.commit("g", i)
    out.write(f"{i}\\n")
    out.flush()
"""


def test_committed_positions_survive_kill_9(tmp_path: Path) -> None:
    """A process commits as fast as it can and is killed at random moments: after each
    kill the committed index is the last one acknowledged or the one after it."""
    path = tmp_path / "q"
    with FanoutQueue(path) as q:
        q.enqueue_many([b"x"] * 5000)
    rng = random.Random(11)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for _ in range(10):
        acks = tmp_path / "acks.txt"
        with acks.open("w") as out:
            proc = subprocess.Popen([PYTHON, "-c", COMMITTER, str(path)], stdout=out, cwd=ROOT, env=env)
            deadline = time.monotonic() + 20
            while acks.stat().st_size == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.2))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        lines = acks.read_text().split("\n")
        last = int(lines[-2])  # the last complete line was acknowledged
        with FanoutQueue(path) as q:
            assert q.committed("g") in (last, last + 1, q.tail), (last, q.committed("g"))


# -- message positions inside an item (Issue 31, part 1) ------------------------------------------
def test_a_commit_names_a_message_inside_an_item(tmp_path: Path) -> None:
    page = tmp_path / "q" / "committed_g" / "page-0.dat"
    with filled(tmp_path / "q") as q:
        assert q.committed_message("g") == 0 and q.committed_position("g") == (0, 0)
        q.commit("g", 4, message=3)  # items 0..3 and messages 0..2 of item 4 processed
        assert (q.committed("g"), q.committed_message("g"), q.committed_position("g")) == (4, 3, (4, 3))
        assert q.size("g") == 6  # lag counts the item the group is in
        assert struct.unpack(">qqqq", page.read_bytes()) == (4, 0, 3, 0)
        with pytest.raises(IndexOutOfRangeError):
            q.commit("g", 10, message=1)  # no item at head to be inside of
        with pytest.raises(ValueError, match="committed message -1 of group 'g'"):
            q.commit("g", 5, message=-1)
        with pytest.raises(ValueError, match="out of range"):
            q.commit("g", 5, message=1 << 31)
        assert q.committed_position("g") == (4, 3)  # refused commits changed nothing
    with FanoutQueue(tmp_path / "q") as q:  # reopened: the message position is kept
        assert q.committed_position("g") == (4, 3)
        q.commit("g", 5)  # a commit of a whole item clears it
        assert q.committed_position("g") == (5, 0)
        q.commit("g", 5, message=7)
        q.remove_before_index(6)  # retention removed the item: the message is moot
        assert q.committed_position("g") == (6, 0)
        assert q.committed_message("g") == 7


def test_a_committed_page_of_16_bytes_opens_with_message_0(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        q.commit("g", 2, message=4)
    page = tmp_path / "q" / "committed_g" / "page-0.dat"
    page.write_bytes(struct.pack(">qq", 3, 0))  # as written before message positions existed
    with FanoutQueue(tmp_path / "q") as q:
        assert q.committed_position("g") == (3, 0)
        q.commit("g", 3, message=1)
    assert struct.unpack(">qqqq", page.read_bytes()) == (3, 0, 1, 0)


def test_a_message_position_in_an_item_lost_in_a_crash_is_cleared(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        q.commit("g", 7, message=2)
    meta = tmp_path / "q" / "meta_data" / "page-0.dat"
    data = bytearray(meta.read_bytes())
    data[0:8] = struct.pack(">q", 7)  # head rolled back to 7: item 7 is gone
    meta.write_bytes(bytes(data))
    with FanoutQueue(tmp_path / "q") as q:
        assert q.committed_position("g") == (7, 0)


MESSAGE_COMMITTER = """
import sys
from bigarray import FanoutQueue
q = FanoutQueue(sys.argv[1])
out = sys.stdout
i = 0
while True:
    i += 1
    q.commit("g", (i // 10) % 5000, message=i % 10)
    out.write(f"{i}\\n")
    out.flush()
"""


def test_message_positions_survive_kill_9(tmp_path: Path) -> None:
    """Commits of (index, message) pairs, killed at random moments: the pair read back
    is the last one acknowledged or the one after it, never a mix of two commits."""
    path = tmp_path / "q"
    with FanoutQueue(path) as q:
        q.enqueue_many([b"x"] * 5001)
    rng = random.Random(31)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for _ in range(6):
        acks = tmp_path / "acks.txt"
        with acks.open("w") as out:
            proc = subprocess.Popen([PYTHON, "-c", MESSAGE_COMMITTER, str(path)], stdout=out, cwd=ROOT, env=env)
            deadline = time.monotonic() + 20
            while acks.stat().st_size == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.2))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        last = int(acks.read_text().split("\n")[-2])
        with FanoutQueue(path) as q:
            got = q.committed_position("g")
            assert got in {((i // 10) % 5000, i % 10) for i in (last, last + 1)}, (last, got)


# -- the committed leader epoch (Issue 32, item 5) -------------------------------------------------
def test_a_commit_keeps_its_leader_epoch_and_a_24_byte_page_opens_without_one(tmp_path: Path) -> None:
    page = tmp_path / "q" / "committed_g" / "page-0.dat"
    with filled(tmp_path / "q") as q:
        q.commit("g", 4, offset=4, leader_epoch=0)
        assert q.committed_leader_epoch("g") == 0
        q.commit("g", 5, offset=5, leader_epoch=7)
        with pytest.raises(ValueError, match="leader epoch -1"):
            q.commit("g", 6, leader_epoch=-1)
    assert struct.unpack(">qqqq", page.read_bytes()) == (5, 6, 0, 8)
    with FanoutQueue(tmp_path / "q") as q:  # reopened: kept
        assert (q.committed("g"), q.committed_offset("g"), q.committed_leader_epoch("g")) == (5, 5, 7)
        q.commit("g", 6)  # a commit without one clears it
        assert q.committed_leader_epoch("g") is None
        assert q.committed_leader_epoch("never") is None
    page.write_bytes(struct.pack(">qqq", 3, 4, 0))  # as written before leader epochs existed
    with FanoutQueue(tmp_path / "q") as q:
        assert (q.committed("g"), q.committed_offset("g"), q.committed_leader_epoch("g")) == (3, 3, None)
    assert len(page.read_bytes()) == 32
