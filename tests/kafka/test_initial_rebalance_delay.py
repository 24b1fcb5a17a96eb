"""group.initial.rebalance.delay.ms defaults to Kafka's 3000 ms: a second consumer that
joins a new group within it lands in the group's first generation, so neither member
is first handed every partition. (The rest of the suite runs its brokers with 0: see
tests/_broker.py.) Issue 32, item 6."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests._broker import BrokerProcess

pytestmark = pytest.mark.timeout(120)


def test_a_second_member_joining_within_the_default_delay_shares_the_first_generation(tmp_path: Path) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True)
    broker.initial_rebalance_delay_ms = None  # the broker's default
    broker.start()
    consumers: list[Any] = []
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("pair", 2, 1)], request_timeout=10)["pair"].result(10)
        first: dict[int, set[int]] = {}
        for n in range(2):
            consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "pair", "session.timeout.ms": 6000})
            consumer.subscribe(["pair"], on_assign=lambda c, ps, n=n: first.setdefault(n, {p.partition for p in ps}))
            consumers.append(consumer)
            consumer.poll(0.3)  # the first member sends its JoinGroup before the second exists
        deadline = time.monotonic() + 30
        while len(first) < 2 and time.monotonic() < deadline:
            for consumer in consumers:
                consumer.poll(0.1)
        # Without the delay the first member's first generation is its alone: both partitions.
        assert first == {0: {0}, 1: {1}} or first == {0: {1}, 1: {0}}, first
    finally:
        for consumer in consumers:
            consumer.close()
        broker.stop()
