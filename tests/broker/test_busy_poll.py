"""Busy polling (``busy.poll.us``, luxun.thrift.server): a connection that has been the only one
receiving polls for its next call after answering; another connection receiving stops it,
and 0 turns it off. Counted in ``luxun_busy_polls_total`` / ``luxun_busy_poll_hits_total``.

Counts, not times: a long poll window (1 s) makes every call of a client that calls in a
loop arrive while the broker polls, however slow the machine."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from idl import luxun_thrift as T

pytestmark = pytest.mark.timeout(120)

QUIET_S = 0.05  # luxun.thrift.server._BUSY_POLL_QUIET_S: alone this long before polling
CALLS = 200


def polls(broker: Any) -> tuple[int, int]:
    """(luxun_busy_polls_total, luxun_busy_poll_hits_total)."""
    return int(broker.metric("luxun_busy_polls_total")), int(broker.metric("luxun_busy_poll_hits_total"))


def start(broker_factory: Any, tmp_path: Path, poll_us: int) -> Any:
    config = tmp_path / f"busy{poll_us}.properties"
    config.write_text(f"busy.poll.us={poll_us}\nfollow.client.cpu=false\n")  # polls, not moves (test_follow_cpu)
    return broker_factory("--config", str(config), metrics=True)


def produce_in_a_loop(client: Any, topic: str, n: int) -> None:
    for i in range(n):
        assert client.produce(T.ProduceRequest(item=b"%d" % i, topic=topic)).result.resultCode == 0


def test_a_lone_client_calling_in_a_loop_is_answered_from_busy_polls(broker_factory: Any, tmp_path: Path) -> None:
    broker = start(broker_factory, tmp_path, 1_000_000)
    client = broker.client()
    produce_in_a_loop(client, "t", 5)
    time.sleep(2 * QUIET_S)  # alone for longer than the quiet time
    before = polls(broker)
    produce_in_a_loop(client, "t", CALLS)
    for i in range(CALLS):  # one-item consumes take the same loop
        assert client.consume(T.ConsumeRequest(topic="t", startIndex=5 + i)).itemList == [b"%d" % i]
    done, hits = (a - b for a, b in zip(polls(broker), before, strict=True))
    # all but the first call and one in every 2 ms of polls (then it waits in recv once) came while polling
    assert hits >= CALLS, (done, hits)
    assert done - hits <= 2, (done, hits)  # a poll that ran out: only at the end
    client.close()


def test_busy_polling_stops_while_another_connection_receives(broker_factory: Any, tmp_path: Path) -> None:
    broker = start(broker_factory, tmp_path, 1_000_000)
    a, b = broker.client(), broker.client()
    produce_in_a_loop(a, "t", 5)
    time.sleep(2 * QUIET_S)
    before = polls(broker)
    for _ in range(CALLS):  # both connections receive all the time: nobody is alone
        assert a.produce(T.ProduceRequest(item=b"a", topic="t")).result.resultCode == 0
        assert b.produce(T.ProduceRequest(item=b"b", topic="t")).result.resultCode == 0
    done, _ = (x - y for x, y in zip(polls(broker), before, strict=True))
    assert done <= 2, done  # a poll begun just before the other connection came in
    a.close()
    b.close()


def test_a_long_poll_is_answered_while_a_lone_producer_is_busy_polled(broker_factory: Any, tmp_path: Path) -> None:
    """The polling thread holds the interpreter between its recv calls; after 2 ms of polls
    it waits in recv once, so a long poll woken by its produce still gets to answer."""
    broker = start(broker_factory, tmp_path, 1_000_000)
    producer, consumer = broker.client(), broker.client()
    produce_in_a_loop(producer, "wait", 1)
    assert consumer.consume(T.ConsumeRequest(topic="wait", fanoutId="g")).itemList == [b"0"]
    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.append(
            consumer.consume(T.ConsumeRequest(topic="wait", fanoutId="g", maxWaitMs=60_000)).itemList
        )
    )
    waiter.start()
    time.sleep(0.2)  # the consumer waits; the producer alone receives from now on
    before = polls(broker)
    polled_from = time.monotonic() + 4 * QUIET_S
    while time.monotonic() < polled_from:  # a lone producer calling in a loop: polled by now
        producer.produce(T.ProduceRequest(item=b"x", topic="busy"))
    producer.produce(T.ProduceRequest(item=b"wake", topic="wait"))
    deadline = time.monotonic() + 30
    while waiter.is_alive() and time.monotonic() < deadline:  # still calling in a loop
        producer.produce(T.ProduceRequest(item=b"x", topic="busy"))
    waiter.join(5)
    assert got == [[b"wake"]]
    assert polls(broker)[1] > before[1]  # the producer was busy polled meanwhile
    producer.close()
    consumer.close()


def test_polls_follow_replies_up_to_256_kib_and_not_bigger_ones(broker_factory: Any, tmp_path: Path) -> None:
    """A client taking one item of 100 KB per call decodes it in far less than a poll lasts:
    its next call is polled for. After a reply of 256 KiB or more nothing is polled."""
    broker = start(broker_factory, tmp_path, 1_000_000)
    client = broker.client()
    for item in (b"s" * 100_000, b"b" * 300_000):
        assert client.produce(T.ProduceRequest(item=item, topic="t")).result.resultCode == 0
    time.sleep(2 * QUIET_S)
    n = 50
    before = polls(broker)
    for _ in range(n):
        assert len(client.consume(T.ConsumeRequest(topic="t", startIndex=0)).itemList[0]) == 100_000
    mid = polls(broker)
    for _ in range(n):
        assert len(client.consume(T.ConsumeRequest(topic="t", startIndex=1)).itemList[0]) == 300_000
    after = polls(broker)
    small_polls, small_hits = (a - b for a, b in zip(mid, before, strict=True))
    # replies were followed by polls the next call ended (not all: after 2 ms of polls back
    # to back the thread waits in recv once; the last poll ends with the second loop's first call)
    assert small_hits >= n // 2, (small_polls, small_hits)
    assert small_polls - small_hits <= 1, (small_polls, small_hits)
    assert after[0] - mid[0] <= 1, (mid, after)  # only that poll
    client.close()


def test_zero_turns_busy_polling_off(broker_factory: Any, tmp_path: Path) -> None:
    broker = start(broker_factory, tmp_path, 0)
    client = broker.client()
    produce_in_a_loop(client, "t", 5)
    time.sleep(2 * QUIET_S)
    produce_in_a_loop(client, "t", CALLS)
    assert polls(broker) == (0, 0)
    client.close()
