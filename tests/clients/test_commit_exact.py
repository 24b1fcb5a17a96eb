"""commit() covers exactly the messages processed (Issue 31, part 1): the experiment a
user of ``StreamConsumer(auto_commit=False)`` would run. Two real brokers, packs of
25 messages, a consumer process that commits after every K processed messages (K
random, often inside a pack) and is killed with SIGKILL at random moments, 15
rounds, then one that drains the rest. Checked: nothing lost; no message processed
again that a returned commit() covered; a restart never starts before the last
commit (per broker, its first message is the one just after the last committed)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from clients.producer import Producer

from .conftest import address

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 15
MESSAGES = 4000
PACK = 25

#: The consumer: polls at most what it will process before its next commit, so that
#: commit() (everything handed out) covers exactly the messages processed. Each
#: message is "processed" by writing its line (written before the commit is asked,
#: os.write: nothing buffered in the process); "C" follows a commit() that returned.
WORKER = r"""
import os, random, sys, time
from clients.consumer import StreamConsumer
brokers, seed, mode = sys.argv[1:4]
rng = random.Random(int(seed))
consumer = StreamConsumer(brokers, "g", auto_commit=False, with_metadata=True, wait_ms=100, member_id="worker")
consumer.subscribe(["t"])
os.write(1, b"START\n")
idle = time.monotonic()
left = rng.randrange(1, 60)
while True:
    got = consumer.poll(100, max_messages=left)
    if got:
        idle = time.monotonic()
        os.write(1, "".join(f"M {m.broker} {m.index} {m.offset} {m.value.decode()}\n" for m in got).encode())
        time.sleep(0.003 * len(got))  # the processing
        left -= len(got)
    if left == 0:
        consumer.commit()
        os.write(1, b"C\n")
        left = rng.randrange(1, 60)
    if mode == "drain" and time.monotonic() - idle > 2.0:
        consumer.commit()
        os.write(1, b"C\n")
        consumer.close()
        break
"""


def run_round(brokers: str, seed: int, mode: str, log_path: Path, kill_after_s: float) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with log_path.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", WORKER, brokers, str(seed), mode], stdout=out, cwd=ROOT, env=env)
        try:
            deadline = time.monotonic() + 30
            while b"START" not in log_path.read_bytes():
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[:500]
                time.sleep(0.01)
            if mode == "drain":
                assert proc.wait(120) == 0
            else:
                time.sleep(kill_after_s)
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return log_path.read_text()


def test_a_commit_covers_exactly_what_was_processed(brokers: Any, tmp_path: Path) -> None:
    b1, b2 = brokers(2)
    both = f"{address(b1)},{address(b2)}"
    expected = [f"m{i:05d}" for i in range(MESSAGES)]
    with Producer(both, batch_size=PACK, linger_ms=10_000) as producer:
        for i, value in enumerate(expected):
            producer.send("t", value.encode(), key=str(i % 7))
        assert producer.flush(30)
    rng = random.Random(31)
    covered: set[str] = set()  # processed before a commit() that returned
    last_covered: dict[str, tuple[int, int]] = {}  # broker -> the last message a returned commit covered
    processed: set[str] = set()
    again: list[tuple[int, str]] = []  # (round, message) processed again though a commit covered it
    early_starts: list[tuple[int, str, tuple[int, int], tuple[int, int]]] = []
    inside_a_pack = 0  # restarts that began inside a pack committed in part (what the test is about)
    for round_ in range(ROUNDS + 1):
        mode = "drain" if round_ == ROUNDS else "kill"
        text = run_round(both, round_, mode, tmp_path / f"round-{round_}.txt", rng.uniform(0.3, 1.5))
        lines = text.split("\n")[:-1]  # the last line may be cut by the kill
        pending: list[tuple[str, int, int, str]] = []
        first: dict[str, tuple[int, int]] = {}
        for line in lines:
            if line.startswith("M "):
                _, broker, index, offset, value = line.split(" ")
                where = (int(index), int(offset))
                if value in covered:
                    again.append((round_, value))
                if broker not in first:
                    first[broker] = where
                    if broker in last_covered and where <= last_covered[broker]:
                        early_starts.append((round_, broker, where, last_covered[broker]))
                    inside_a_pack += where[1] > 0
                pending.append((broker, *where, value))
                processed.add(value)
            elif line == "C":
                for broker, index, offset, value in pending:
                    covered.add(value)
                    last_covered[broker] = max(last_covered.get(broker, (-1, -1)), (index, offset))
                pending = []
    assert processed == set(expected), f"lost: {sorted(set(expected) - processed)[:10]}"
    assert again == [], f"{len(again)} messages covered by a returned commit() were processed again: {again[:10]}"
    assert early_starts == [], f"restarts before the last commit (round, broker, start, last committed): {early_starts}"
    assert inside_a_pack > 0  # the kills did land between commits inside packs
