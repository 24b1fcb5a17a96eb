"""Kafka transactions with aiokafka: its transactional producer (``async with
producer.transaction()``, an abort by an exception in it, ``send_offsets_to_transaction``)
and its read_committed consumer, against a real broker."""

from __future__ import annotations

import asyncio

import pytest

from tests._broker import BrokerProcess

from ._txn import broker, read_all, values

__all__ = ["broker"]  # the fixture

pytestmark = pytest.mark.timeout(90)


class _Abort(Exception):
    pass


async def _produce_and_read(bootstrap: str) -> tuple[list[bytes], int]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    # Input for the consume-transform-produce part.
    plain = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await plain.start()
    try:
        for i in range(4):
            await plain.send_and_wait("aio-in", b"in%d" % i)
    finally:
        await plain.stop()

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="aio-tx", request_timeout_ms=10_000)
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(3):
                await producer.send("aio-txn", b"c%d" % i)
        with pytest.raises(_Abort):
            async with producer.transaction():
                await (await producer.send("aio-txn", b"aborted"))  # stored, then aborted
                raise _Abort
        # consume-transform-produce: the outputs and the input offsets in one transaction
        async with producer.transaction():
            for i in range(4):
                await producer.send("aio-txn", b"out-in%d" % i)
            await producer.send_offsets_to_transaction({TopicPartition("aio-in", 0): 4}, "aio-group")
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        "aio-txn",
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    try:
        got: list[bytes] = []
        async with asyncio.timeout(20):
            while len(got) < 7:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend(r.value for r in records)
    finally:
        await consumer.stop()
    group = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id="aio-group", enable_auto_commit=False)
    await group.start()
    try:
        committed = await group.committed(TopicPartition("aio-in", 0))
    finally:
        await group.stop()
    return got, committed


def test_aiokafka_transactions_and_its_read_committed_consumer(broker: BrokerProcess) -> None:
    got, committed = asyncio.run(_produce_and_read(broker.bootstrap))
    assert got == [b"c0", b"c1", b"c2"] + [b"out-in%d" % i for i in range(4)]
    assert committed == 4
    # The aborted record is stored (read_uncommitted sees it), hidden from read_committed.
    assert b"aborted" in values(read_all(broker.bootstrap, "aio-txn", committed=False))
    assert b"aborted" not in values(read_all(broker.bootstrap, "aio-txn", committed=True))
