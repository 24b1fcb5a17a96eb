"""Restarts keep data and group positions; kill -9 loses no acknowledged item."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest

from idl import luxun_thrift as T

pytestmark = pytest.mark.timeout(180)


def test_restart_keeps_items_and_group_positions(broker: Any) -> None:
    c = broker.client()
    for i in range(100):
        c.produce(T.ProduceRequest(item=b"%03d" % i, topic="keep"))
    got = c.consume(T.ConsumeRequest(topic="keep", fanoutId="g", maxFetchSize=40)).itemList
    assert got == [b"%03d" % i for i in range(13)]  # 13 * 3 bytes <= 40
    c.close()
    assert broker.stop() == 0  # SIGTERM: clean exit
    assert "stopped; every topic flushed and closed" in broker.log()
    broker.start()
    c = broker.client()
    assert c.getSize(T.GetSizeRequest(topic="keep")).size == 100
    assert c.getSize(T.GetSizeRequest(topic="keep", fanoutId="g")).size == 87
    rest = c.consume(T.ConsumeRequest(topic="keep", fanoutId="g", maxFetchSize=1 << 20)).itemList
    assert rest == [b"%03d" % i for i in range(13, 100)]
    assert c.produce(T.ProduceRequest(item=b"new", topic="keep")).index == 100
    c.close()


def test_a_second_broker_on_the_same_data_dir_is_refused(broker: Any, broker_factory: Any) -> None:
    with pytest.raises(RuntimeError, match="in use by another broker"):
        broker_factory(data_dir=broker.data_dir)


@pytest.mark.parametrize("round_", range(3))
def test_kill_9_during_acknowledged_produces_loses_nothing(broker_factory: Any, round_: int) -> None:
    broker = broker_factory()
    acked: list[int] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce_stream(worker: int) -> None:
        c = broker.client(timeout_ms=5000)
        try:
            for i in range(1_000_000):
                if stop.is_set():
                    return
                value = worker * 10_000_000 + i
                response = c.produce(T.ProduceRequest(item=b"%d" % value, topic="crash"))
                if response.result.resultCode == 0:
                    acked.append(value)
        except Exception as exc:  # the broker died under us: expected
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=produce_stream, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.5 + 0.3 * round_)
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait(10)
    stop.set()
    for t in threads:
        t.join(10)
    assert len(acked) > 100, "the load did not get going"
    broker.start()
    c = broker.client()
    size = c.getSize(T.GetSizeRequest(topic="crash")).size
    stored: list[bytes] = []
    while len(stored) < size:
        stored += c.consume(T.ConsumeRequest(topic="crash", startIndex=len(stored), maxFetchSize=1 << 20)).itemList
    stored_values = {int(v) for v in stored}
    missing = set(acked) - stored_values
    assert not missing, f"{len(missing)} acknowledged items lost after kill -9"
    assert len(stored_values) == len(stored)  # nothing duplicated
    for w in range(3):  # per producer, order is kept
        mine = [int(v) for v in stored if int(v) // 10_000_000 == w]
        assert mine == sorted(mine)
    c.close()
