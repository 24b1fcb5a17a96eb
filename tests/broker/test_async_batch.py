"""Batching a lone asyncProduce stream (``async.batch.us``, luxun.thrift.server): a connection
streaming oneway produces, the only one receiving, whose last read emptied its socket,
waits before reading again, so the calls come in batches; counted in
``luxun_async_batch_waits_total``. Another connection receiving stops it, and 0 turns it off.

Counts, not times: a long wait (20 ms) makes the batches large however slow the machine."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from idl import luxun_thrift as T

pytestmark = pytest.mark.timeout(120)

QUIET_S = 0.05  # luxun.thrift.server._BUSY_POLL_QUIET_S: alone this long before waiting
ITEMS = 3000


def waits(broker: Any) -> int:
    return int(broker.metric("luxun_async_batch_waits_total"))


def start(broker_factory: Any, tmp_path: Path, batch_us: int) -> Any:
    config = tmp_path / f"batch{batch_us}.properties"
    config.write_text(f"async.batch.us={batch_us}\n")
    return broker_factory("--config", str(config), metrics=True)


def stream(client: Any, topic: str, first: int, n: int) -> list[bytes]:
    items = [b"%s-%d" % (topic.encode(), i) for i in range(first, first + n)]
    for item in items:
        client.asyncProduce(T.ProduceRequest(item=item, topic=topic))
    return items


def stored(client: Any, topic: str) -> list[bytes]:
    size = client.getSize(T.GetSizeRequest(topic=topic)).size
    got: list[bytes] = []
    while len(got) < size:
        got += client.consume(T.ConsumeRequest(topic=topic, startIndex=len(got), maxFetchSize=1 << 20)).itemList
    return got


def test_a_lone_stream_of_async_produces_is_read_in_batches(broker_factory: Any, tmp_path: Path) -> None:
    broker = start(broker_factory, tmp_path, 20_000)
    client = broker.client()
    sent = stream(client, "t", 0, 5)
    time.sleep(2 * QUIET_S)  # alone for longer than the quiet time
    before = waits(broker)
    # Longer than the quiet time, whoever received last before it (it begins the 50 ms).
    until = time.monotonic() + 6 * QUIET_S
    while len(sent) < ITEMS or time.monotonic() < until:
        sent += stream(client, "t", len(sent), 100)
    # The sync call after the stream is answered after every item it sent (one wait at most).
    assert client.getSize(T.GetSizeRequest(topic="t")).size == len(sent)
    n = waits(broker) - before
    assert 1 <= n <= len(sent) // 10, (n, len(sent))  # a wait brought many calls, not one or two
    assert stored(client, "t") == sent  # each item once, in order
    client.close()


def test_batching_stops_while_another_connection_receives(broker_factory: Any, tmp_path: Path) -> None:
    broker = start(broker_factory, tmp_path, 20_000)
    a, b = broker.client(), broker.client()
    stream(a, "a", 0, 5)
    time.sleep(2 * QUIET_S)
    before = waits(broker)
    sent_a: list[bytes] = []
    sent_b: list[bytes] = []
    for i in range(0, ITEMS // 3, 10):  # both connections stream all the time: nobody is alone
        sent_a += stream(a, "a", 5 + i, 10)
        sent_b += stream(b, "b", i, 10)
        assert b.getSize(T.GetSizeRequest(topic="b")).size == len(sent_b)
    assert waits(broker) - before <= 2  # one begun just before the other connection came in
    assert stored(a, "a")[5:] == sent_a
    assert stored(b, "b") == sent_b
    a.close()
    b.close()


def test_zero_turns_batching_off(broker_factory: Any, tmp_path: Path) -> None:
    broker = start(broker_factory, tmp_path, 0)
    client = broker.client()
    sent = stream(client, "t", 0, 5)
    time.sleep(2 * QUIET_S)
    sent += stream(client, "t", 5, ITEMS)
    assert stored(client, "t") == sent
    assert waits(broker) == 0
    client.close()
