"""At-least-once consumer groups end to end: StreamConsumer(auto_commit=False) with
commit/poll/seek/position/committed, SimpleConsumer's explicit forms, consumer
processes killed with SIGKILL (no message lost, duplicates only past the last commit,
order kept per broker), two members of one group with one killed, and the CLI's
--commit/--no-commit. Real broker subprocesses, real consumer subprocesses."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from clients.consumer import Message, Position, SimpleConsumer, StreamConsumer
from clients.errors import BrokerError
from clients.messages import decode_pack
from clients.producer import Producer

from .conftest import address

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]


def produce(brokers: str, topic: str, values: list[bytes], batch_size: int = 10) -> None:
    with Producer(brokers, batch_size=batch_size, linger_ms=10_000) as producer:
        for i, value in enumerate(values):
            producer.send(topic, value, key=str(i % 7))
        assert producer.flush(20)


def values(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i:05d}".encode() for i in range(n)]


def poll_until(consumer: StreamConsumer, n: int, timeout_s: float = 20, max_messages: int = 500) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out.extend(consumer.poll(200, max_messages=min(max_messages, n - len(out))))
    return out


def test_commit_then_a_new_consumer_starts_at_the_commit(brokers: Any) -> None:
    (b,) = brokers(1)
    produce(address(b), "t", values(100))  # 10 packs of 10
    consumer = StreamConsumer(address(b), "g", auto_commit=False, wait_ms=200)
    consumer.subscribe(["t"])
    first = poll_until(consumer, 35, max_messages=35)
    assert first == values(35)
    assert consumer.position("t") == {address(b): Position(3, 5)}  # pack 3 is handed out in part: message 5 is next
    assert consumer.committed("t") == {address(b): None}
    consumer.commit()
    assert consumer.committed("t") == {address(b): (3, 5)}
    consumer.close(commit=False)
    # a new member of the group starts at message 5 of pack 3: nothing committed again
    again = StreamConsumer(address(b), "g", auto_commit=False, wait_ms=200, with_metadata=True)
    again.subscribe(["t"])
    rest = poll_until(again, 65)
    assert [m.value for m in rest] == values(100)[35:]
    assert isinstance(rest[0], Message) and (rest[0].index, rest[0].offset, rest[0].count) == (3, 5, 10)
    assert rest[-1].broker == address(b) and rest[-1].topic == "t"
    again.close()  # commits what was handed out
    with SimpleConsumer(address(b)) as simple:
        assert simple.committed("t", "g") == Position(10, 0)
        assert simple.consume_committed("t", "g").messages == []
        # the group is an at-least-once group now: auto-moving consumes are refused
        with pytest.raises(BrokerError, match="'g' of topic 't' commits its positions"):
            simple.consume("t", "g")


def test_two_brokers_positions_seek_and_commit_of_finished_messages(brokers: Any) -> None:
    b1, b2 = brokers(2)
    both = f"{address(b1)},{address(b2)}"
    produce(both, "t", values(200))
    consumer = StreamConsumer(both, "g", auto_commit=False, with_metadata=True, wait_ms=200)
    streams = consumer.create_message_streams({"t": 2})["t"]
    got: list[list[Message]] = [[], []]

    def read(k: int) -> None:
        for m in streams[k]:
            got[k].append(m)
            if sum(map(len, got)) >= 200:
                return

    threads = [threading.Thread(target=read, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while sum(map(len, got)) < 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(m.value for m in got[0] + got[1]) == values(200)
    # commit(messages): only what the first thread finished, per broker
    mine = got[0]
    consumer.commit(mine)
    committed = consumer.committed("t")
    for broker in (address(b1), address(b2)):
        last = max(((m.index, m.offset, m.count) for m in mine if m.broker == broker), default=None)
        expected = None if last is None else (last[0] + 1, 0) if last[1] == last[2] - 1 else (last[0], last[1] + 1)
        assert committed[broker] == expected
    # seek back to the start of broker 1 and read it again
    consumer.seek("t", {address(b1): 0})
    assert consumer.position("t")[address(b1)] == (0, 0)
    consumer.close(commit=False)
    for t in threads:
        t.join(5)


def test_auto_commit_is_the_default_and_metadata_is_optional(brokers: Any) -> None:
    (b,) = brokers(1)
    produce(address(b), "t", values(20))
    with StreamConsumer(address(b), "auto", consumer_timeout_ms=3000) as plain:
        stream = plain.create_message_streams({"t": 1})["t"][0]
        assert [next(stream) for _ in range(20)] == values(20)
        with pytest.raises(ValueError, match="auto_commit=False"):
            plain.commit()
    with StreamConsumer(address(b), "auto2", with_metadata=True, wait_ms=200) as meta:
        meta.subscribe(["t"])
        got = poll_until(meta, 20)
        assert [m.value for m in got] == values(20)
        assert [(m.index, m.offset) for m in got[:11]] == [(0, i) for i in range(10)] + [(1, 0)]


# -- consumer processes killed with SIGKILL ----------------------------------------------------------
WORKER = r"""
import json, random, sys, time
from clients.consumer import StreamConsumer
brokers, group, member, seed, mode = sys.argv[1:6]
rng = random.Random(int(seed))
out = sys.stdout
consumer = StreamConsumer(brokers, group, auto_commit=False, with_metadata=True, wait_ms=100, member_id=member)
consumer.subscribe(["t"])
out.write("START\n"); out.flush()
idle = time.monotonic()
polls = 0
while True:
    got = consumer.poll(100, max_messages=rng.randrange(1, 40))
    for m in got:
        out.write(f"M {m.broker} {m.index} {m.offset} {m.value.decode()}\n")
    out.flush()
    if got:
        idle = time.monotonic()
    polls += 1
    if polls % rng.randrange(1, 6) == 0:
        consumer.commit()
        out.write("C " + json.dumps(consumer.position("t")) + "\n"); out.flush()
    if mode in ("drain", "survivor") and time.monotonic() - idle > (2.0 if mode == "drain" else 8.0):
        position = consumer.position("t")
        consumer.close()  # commits what was handed out: position
        out.write("C " + json.dumps(position) + "\n"); out.flush()
        break
    if mode == "slow":
        time.sleep(0.01)
"""


def start_worker(brokers: str, member: str, seed: int, mode: str, out: Any) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, brokers, "g", member, str(seed), mode], stdout=out, cwd=ROOT, env=env
    )


def parse(path: Path) -> tuple[list[tuple[str, int, int, str]], dict[str, tuple[int, int]] | None, bool]:
    """(messages printed, the last position printed after a commit, whether it started)."""
    seen: list[tuple[str, int, int, str]] = []
    committed: dict[str, tuple[int, int]] | None = None
    started = False
    for line in path.read_text().split("\n")[:-1]:  # the last line may be cut by the kill
        if line == "START":
            started = True
        elif line.startswith("M "):
            _, broker, index, offset, value = line.split(" ")
            seen.append((broker, int(index), int(offset), value))
        elif line.startswith("C "):
            committed = {broker: (index, message) for broker, (index, message) in json.loads(line[2:]).items()}
    return seen, committed, started


def wait_started(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if "START" in path.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"worker did not start: {path.read_text()[:500]}")


def test_a_consumer_killed_at_random_points_loses_nothing(brokers: Any, tmp_path: Path) -> None:
    b1, b2 = brokers(2)
    both = f"{address(b1)},{address(b2)}"
    expected = values(3000)
    produce(both, "t", expected, batch_size=25)
    rng = random.Random(5)
    everything: set[str] = set()
    committed: dict[str, tuple[int, int]] = {}
    for round_ in range(11):
        mode = "drain" if round_ == 10 else "slow"
        log_path = tmp_path / f"round-{round_}.txt"
        with log_path.open("w") as out:
            proc = start_worker(both, "worker-1", round_, mode, out)  # restarted with the same member id
            wait_started(log_path, proc)
            if mode == "drain":
                assert proc.wait(120) == 0
            else:
                time.sleep(rng.uniform(0.05, 0.6))
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
        seen, last_commit, _ = parse(log_path)
        # order kept per broker; duplicates only at or past the previous commit
        per_broker: dict[str, list[tuple[int, int]]] = {}
        for broker, index, offset, value in seen:
            per_broker.setdefault(broker, []).append((index, offset))
            if value in everything:
                assert (index, offset) >= committed.get(broker, (0, 0)), (round_, broker, index, committed)
        for broker, order in per_broker.items():
            assert order == sorted(order) and len(set(order)) == len(order), (round_, broker)
            if broker in committed:
                # A restart starts at the last commit: the one logged, or a later one whose
                # log line the kill cut off (commit() had returned; what it covered was
                # logged as processed before it, and "nothing lost" below checks that).
                assert order[0] >= committed[broker], (round_, broker, order[0], committed)
        everything.update(value for *_, value in seen)
        if last_commit is not None:
            committed.update(last_commit)
    assert everything == {v.decode() for v in expected}  # nothing lost


def test_two_members_one_killed_the_other_carries_on(brokers: Any, tmp_path: Path) -> None:
    b1, b2 = brokers(2)
    both = f"{address(b1)},{address(b2)}"
    first = values(1000, "a")
    produce(both, "t", first, batch_size=20)
    logs = [tmp_path / "member-a.txt", tmp_path / "member-b.txt"]
    with logs[0].open("w") as out_a, logs[1].open("w") as out_b:
        a = start_worker(both, "member-a", 1, "slow", out_a)
        wait_started(logs[0], a)
        time.sleep(0.3)  # a holds what it reads first
        b = start_worker(both, "member-b", 2, "survivor", out_b)  # exits after 8 s without a message
        wait_started(logs[1], b)
        time.sleep(0.5)
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        killed_at = time.monotonic()
        later = values(500, "z")
        produce(both, "t", later, batch_size=20)
        assert b.wait(120) == 0
        finished_at = time.monotonic()
    seen_a, _, _ = parse(logs[0])
    seen_b, _, _ = parse(logs[1])
    got = {value for *_, value in seen_a + seen_b}
    assert got == {v.decode() for v in first + later}  # nothing lost
    assert {value for *_, value in seen_b} >= {v.decode() for v in later}  # the survivor carries on
    # the survivor took over within its 8 s patience (the lease is 5 s), then drained and left
    assert finished_at - killed_at < 30


def test_a_member_that_closes_hands_over_at_once(brokers: Any) -> None:
    (b,) = brokers(1)
    produce(address(b), "t", values(50))
    a = StreamConsumer(address(b), "g", auto_commit=False, wait_ms=100, member_id="a")
    a.subscribe(["t"])
    assert poll_until(a, 20, max_messages=20) == values(20)
    other = StreamConsumer(address(b), "g", auto_commit=False, wait_ms=100, member_id="b")
    other.subscribe(["t"])
    assert other.poll(500) == []  # a holds the group
    a.close()  # commits 2 (20 messages, packs of 10), then gives its hold up
    t0 = time.monotonic()
    rest = poll_until(other, 30, timeout_s=10)
    assert rest == values(50)[20:]
    assert time.monotonic() - t0 < 3  # well under the 5 s lease
    other.close()


# -- SimpleConsumer and the CLI --------------------------------------------------------------------------
def test_simple_consumer_reads_from_the_committed_position_without_moving_it(brokers: Any) -> None:
    (b,) = brokers(1)
    produce(address(b), "t", values(30))
    with SimpleConsumer(address(b)) as simple:
        assert simple.committed("t", "g") is None
        peek = simple.consume_committed("t", "g", max_bytes=1)
        assert (peek.messages, peek.next_index, peek.packs) == (values(10), 1, 1)
        assert simple.consume_committed("t", "g", max_bytes=1).messages == values(10)  # nothing moved
        simple.commit("t", "g", 2)
        assert simple.committed("t", "g") == (2, 0)
        assert simple.consume_committed("t", "g").messages == values(30)[20:]
        assert simple.consume_committed("t", "g", start=1, max_bytes=1).messages == values(30)[10:20]
        with pytest.raises(BrokerError, match=r"outside \[tail, head\] = \[0, 3\]"):
            simple.commit("t", "g", 4)


def run_cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "luxun.cli", *args], input=stdin, capture_output=True, cwd=ROOT, env=env, timeout=60
    )


def test_cli_consume_commit_and_no_commit(brokers: Any) -> None:
    (b,) = brokers(1)
    broker = ["--broker", address(b)]
    assert run_cli("produce", "t", *broker, stdin=b"one\ntwo\nthree\n").returncode == 0
    peek = run_cli("consume", "t", "--group", "G", "--no-commit", *broker)
    assert (peek.returncode, peek.stdout) == (0, b"one\ntwo\nthree\n")
    assert run_cli("consume", "t", "--group", "G", "--no-commit", *broker).stdout == b"one\ntwo\nthree\n"
    first = run_cli("consume", "t", "--group", "G", "--commit", "--max", "2", *broker)
    assert first.stdout == b"one\ntwo\n" and b"committed up to index 2" in first.stderr
    assert run_cli("consume", "t", "--group", "G", "--commit", *broker).stdout == b"three\n"
    assert run_cli("consume", "t", "--group", "G", "--commit", *broker).stdout == b""
    refused = run_cli("consume", "t", "--group", "G", *broker)
    assert refused.returncode != 0 and b"commits its positions" in refused.stderr
    assert len(refused.stderr.strip().split(b"\n")) == 1
    bad = run_cli("consume", "t", "--from-index", "0", "--commit", *broker)
    assert bad.returncode == 2 and b"--commit and --no-commit need --group" in bad.stderr


# -- message positions (Issue 31, part 1) ----------------------------------------------------------------
def test_simple_consumer_and_cli_resume_inside_a_pack_committed_in_part(brokers: Any) -> None:
    (b,) = brokers(1)
    produce(address(b), "t", values(30))  # packs 0, 1, 2 of 10
    with SimpleConsumer(address(b)) as simple:
        simple.commit("t", "g", 1, 4)  # pack 0 and messages 0..3 of pack 1 processed
        assert simple.committed("t", "g") == Position(1, 4)
        got = simple.consume_committed("t", "g")
        assert (got.messages, got.start, got.next_index) == (values(30)[14:], (1, 4), 3)
        assert simple.consume_committed("t", "g", start=Position(2, 3)).messages == values(30)[23:]
        assert simple.consume_committed("t", "g", start=2).messages == values(30)[20:]
        simple.commit("t", "g", Position(1, 6))
        assert simple.committed("t", "g") == (1, 6)
    # the CLI prints the uncommitted messages of pack 1 (with --raw: as a pack of them)
    peek = run_cli("consume", "t", "--group", "g", "--no-commit", "--max", "1", "--broker", address(b))
    assert peek.returncode == 0 and peek.stdout.splitlines() == values(30)[16:20]
    raw = run_cli("consume", "t", "--group", "g", "--no-commit", "--max", "1", "--raw", "--broker", address(b))
    assert raw.returncode == 0 and decode_pack(raw.stdout[:-1]) == values(30)[16:20]
    done = run_cli("consume", "t", "--group", "g", "--commit", "--max", "1", "--broker", address(b))
    assert done.returncode == 0 and b"committed up to index 2" in done.stderr
    with SimpleConsumer(address(b)) as simple:
        assert simple.committed("t", "g") == (2, 0)
    # a stream consumer of the group resumes at the first message after the commit
    consumer = StreamConsumer(address(b), "g", auto_commit=False, wait_ms=100, with_metadata=True)
    consumer.subscribe(["t"])
    first = poll_until(consumer, 3, max_messages=3)
    assert [(m.index, m.offset) for m in first] == [(2, 0), (2, 1), (2, 2)]
    consumer.commit()
    assert consumer.committed("t") == {address(b): (2, 3)}
    consumer.seek("t", {address(b): Position(2, 8)})
    assert [m.value for m in poll_until(consumer, 2)] == values(30)[28:]
    consumer.close(commit=False)
