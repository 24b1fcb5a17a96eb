"""kill -9 a writer process at random moments, over and over, on one directory: every
append that returned (was acknowledged) must survive, intact and in order."""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from bigarray import BigArray

from ._util import PYTHON, ROOT, item_index

pytestmark = pytest.mark.timeout(180)

WRITER = Path(__file__).with_name("crash_writer.py")
ROUNDS = 24
TIME_BUDGET_S = 100
KEEP_ITEMS = 3000  # retention between rounds keeps the directory small


def start_writer(path, seed, out):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [PYTHON, str(WRITER), str(path), str(seed)],
        stdout=out,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )


def wait_for_first_line(ack_file, proc, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "\n" in ack_file.read_text():
            return
        if proc.poll() is not None:
            pytest.fail(f"writer exited with {proc.returncode}: {proc.stderr.read().decode()}")
        time.sleep(0.005)
    pytest.fail("writer did not open the array in time")


def verify(path, must_have_head, rounds_log):
    """Reopen; check [tail, head) item by item; return (tail, head)."""
    with BigArray(path) as arr:
        tail, head = arr.tail, arr.head
        assert head >= must_have_head, f"acknowledged items lost: head {head} < {must_have_head}; {rounds_log[-3:]}"
        i = tail
        while i < head:
            batch = arr.read_range(i, max_bytes=1 << 20)
            assert batch, f"read_range({i}) returned nothing below head {head}"
            for k, item in enumerate(batch):
                assert item_index(item) == i + k, f"item {i + k} holds another index"
            i += len(batch)
        # keep the directory small for the next rounds (also exercises tail on reopen)
        arr.remove_before_index(max(tail, head - KEEP_ITEMS))
        return arr.tail, head


def test_kill_9_loses_no_acknowledged_item(tmp_path):
    path = tmp_path / "array"
    rng = random.Random(20240611)
    started = time.monotonic()
    must_have = 0  # every index below this was acknowledged (or verified) earlier
    rounds_log = []
    rounds = acked_rounds = 0
    while rounds < ROUNDS and time.monotonic() - started < TIME_BUDGET_S:
        ack_file = tmp_path / f"acks-{rounds}.txt"
        with open(ack_file, "w") as out:
            proc = start_writer(path, rounds, out)
        try:
            if rounds % 4 == 3:
                time.sleep(rng.uniform(0.1, 0.5))  # maybe while it starts, opens or recovers
            else:
                wait_for_first_line(ack_file, proc)
                time.sleep(rng.uniform(0.0, 0.25))
            proc.kill()
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            stderr = proc.stderr.read().decode()
            proc.stderr.close()
        assert proc.returncode == -9, f"writer ended by itself ({proc.returncode}): {stderr}"
        lines = ack_file.read_text().split("\n")[:-1]  # the last piece may be cut
        acks = [int(x) for x in lines if x and not x.startswith("open")]
        assert acks == sorted(acks)
        if acks:
            acked_rounds += 1
            must_have = max(must_have, acks[-1] + 1)
        rounds_log.append((rounds, lines[:1], acks[-1:] if acks else None))
        _tail, head = verify(path, must_have, rounds_log)
        must_have = max(must_have, head)  # what was verified must stay too
        rounds += 1
    assert rounds >= 20, f"only {rounds} rounds in {TIME_BUDGET_S} s"
    assert acked_rounds >= rounds // 2
    assert must_have > 1000, "the writers appended too little to mean anything"
