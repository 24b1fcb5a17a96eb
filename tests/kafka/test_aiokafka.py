"""aiokafka (asyncio) against the Kafka port: produce and consume with keys and headers."""

from __future__ import annotations

import asyncio

import pytest

from tests._broker import BrokerProcess

pytestmark = pytest.mark.timeout(60)


async def _round_trip(bootstrap: str) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]], int]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await producer.start()
    try:
        sent = []
        for i in range(30):
            sent.append(
                await producer.send(
                    "aio", value=b"v%d" % i, key=b"k%d" % (i % 3), headers=[("n", b"%d" % i), ("empty", b"")]
                )
            )
        await producer.flush()
        metadata = [await f for f in sent]
    finally:
        await producer.stop()
    assert [m.offset for m in metadata] == list(range(30))
    consumer = AIOKafkaConsumer(
        "aio", bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False, group_id=None
    )
    await consumer.start()
    try:
        got = []
        async with asyncio.timeout(20):
            while len(got) < 30:
                batch = await consumer.getmany(timeout_ms=500)
                for messages in batch.values():
                    got.extend((m.offset, m.key, m.value, list(m.headers), m.timestamp) for m in messages)
        return got
    finally:
        await consumer.stop()


def test_aiokafka_round_trip_keeps_keys_headers_and_timestamps(broker: BrokerProcess) -> None:
    got = asyncio.run(_round_trip(broker.bootstrap))
    assert [(o, k, v, h) for o, k, v, h, _ in got] == [
        (i, b"k%d" % (i % 3), b"v%d" % i, [("n", b"%d" % i), ("empty", b"")]) for i in range(30)
    ]
    assert all(ts > 1_700_000_000_000 for *_, ts in got)
