"""Following the client's CPU (``follow.client.cpu``, luxun.thrift.server): the shared loop
serves a lone connection on the CPU its client sends from, sleeping there instead of busy
polling; another connection receiving puts it back on every CPU; false turns it off.

The client is this test's thread, pinned to one CPU; the loop's thread is seen through
/proc (its allowed CPUs), the moves through ``luxun_cpu_follows_total``."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idl import luxun_thrift as T
from luxun.thrift.server import COMPILED_LOOP, SHARED_LOOP

CPUS = sorted(os.sched_getaffinity(0))

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(len(CPUS) < 2, reason="following a client's CPU needs two CPUs or more"),
    pytest.mark.skipif(not (COMPILED_LOOP and SHARED_LOOP), reason="the shared loop is not built or is turned off"),
]

ALL = set(CPUS)


@pytest.fixture
def on_cpu() -> Iterator[Any]:
    """``on_cpu(cpu)``: pin this thread (the client) to ``cpu``; every CPU again afterwards."""
    yield lambda cpu: os.sched_setaffinity(0, {cpu})
    os.sched_setaffinity(0, CPUS)


def start(broker_factory: Any, tmp_path: Path, follow: bool, poll_us: int = 200) -> Any:
    config = tmp_path / f"follow-{follow}.properties"
    config.write_text(f"follow.client.cpu={str(follow).lower()}\nbusy.poll.us={poll_us}\n")
    return broker_factory("--config", str(config), metrics=True)


def thread_cpus(broker: Any) -> list[set[int]]:
    """Each of the broker's threads' allowed CPUs (from /proc: "0-1" is {0, 1})."""
    found = []
    for task in Path(f"/proc/{broker.proc.pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        listed = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:")).split(":", 1)[1]
        cpus: set[int] = set()
        for part in listed.strip().split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        found.append(cpus)
    return found


def calls(client: Any, topic: str, seconds: float, start: int = 0) -> int:
    """Sync produces of the numbers from ``start`` for ``seconds`` (and at least 100): how many."""
    n = 0
    deadline = time.monotonic() + seconds
    while n < 100 or (time.monotonic() < deadline and n < 200_000):
        assert client.produce(T.ProduceRequest(item=b"%d" % (start + n), topic=topic)).result.resultCode == 0
        n += 1
    return n


def test_a_lone_client_is_served_on_the_cpu_it_sends_from(broker_factory: Any, tmp_path: Path, on_cpu: Any) -> None:
    broker = start(broker_factory, tmp_path, True)
    client = broker.client()
    on_cpu(CPUS[-1])
    sent = calls(client, "t", 0.3)  # alone for longer than the 50 ms it takes
    assert {CPUS[-1]} in thread_cpus(broker)  # the loop's thread, sleeping there
    first = broker.metric("luxun_cpu_follows_total")
    assert first >= 1
    on_cpu(CPUS[0])  # the client moves: the loop follows it
    sent += calls(client, "t", 0.3, sent)
    assert {CPUS[0]} in thread_cpus(broker) and {CPUS[-1]} not in thread_cpus(broker)
    assert broker.metric("luxun_cpu_follows_total") > first
    # every call answered and stored once, in order
    assert client.getSize(T.GetSizeRequest(topic="t")).size == sent
    items = client.consume(T.ConsumeRequest(topic="t", startIndex=0, maxFetchSize=1 << 24)).itemList
    assert items[:1000] == [b"%d" % i for i in range(min(1000, sent))]
    last = client.consume(T.ConsumeRequest(topic="t", startIndex=sent - 1)).itemList
    assert last == [b"%d" % (sent - 1)]
    client.close()


def test_another_connection_puts_the_loop_back_on_every_cpu(broker_factory: Any, tmp_path: Path, on_cpu: Any) -> None:
    broker = start(broker_factory, tmp_path, True)
    a, b = broker.client(), broker.client()
    on_cpu(CPUS[-1])
    calls(a, "t", 0.3)
    assert {CPUS[-1]} in thread_cpus(broker)
    for _ in range(200):  # both connections receive: nobody is alone
        assert a.produce(T.ProduceRequest(item=b"a", topic="t")).result.resultCode == 0
        assert b.produce(T.ProduceRequest(item=b"b", topic="t")).result.resultCode == 0
    assert all(cpus == ALL for cpus in thread_cpus(broker))
    a.close()
    b.close()


def test_false_keeps_busy_polling(broker_factory: Any, tmp_path: Path) -> None:
    """(The client is not pinned here: a poll on its CPU would hold it off.)"""
    broker = start(broker_factory, tmp_path, False, 1_000_000)
    client = broker.client()
    calls(client, "t", 0.3)
    assert all(cpus == ALL for cpus in thread_cpus(broker))
    assert broker.metric("luxun_cpu_follows_total") == 0
    assert broker.metric("luxun_busy_poll_hits_total") >= 100
    client.close()
