"""One topic, two protocols: items produced through Thrift read by Kafka consumers (one
record per item: value = the item's bytes, no key, timestamp = its append time), mixed
with Kafka-produced batches, with contiguous offsets. (Kafka-produced records read
through Thrift are tested with the Luxun-pack view of batches, tests/kafka/test_records.py
and the broker tests of that view.)"""

from __future__ import annotations

import time

import pytest

from idl import luxun_thrift as T
from tests._broker import BrokerProcess

from ._kafka import read_partition

pytestmark = pytest.mark.timeout(90)


def _kafka_batch(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    """One produce request of ``values`` (one batch; the producer waits to collect them)."""
    from confluent_kafka import Producer

    offsets: list[int] = []

    def on_delivery(err: object, msg: object) -> None:
        assert err is None, err
        offsets.append(msg.offset())  # type: ignore[attr-defined]

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 200, "batch.num.messages": len(values)})
    for value in values:
        producer.produce(topic, value=value, key=b"kafka", on_delivery=on_delivery)
    assert producer.flush(15) == 0
    return sorted(offsets)


def test_thrift_items_and_kafka_batches_in_one_topic(broker: BrokerProcess) -> None:
    from kafka import KafkaConsumer

    thrift = broker.client()
    t0 = int(time.time() * 1000)
    indexes = [thrift.produce(T.ProduceRequest(item=b"thrift-%d" % i, topic="mixed")).index for i in range(3)]
    assert indexes == [0, 1, 2]
    seen = thrift.consume(T.ConsumeRequest(topic="mixed", startIndex=0, maxFetchSize=1 << 20, withTimestamps=True))
    thrift_times = list(seen.timestampList)
    assert len(thrift_times) == 3 and all(t0 - 5 <= t <= time.time() * 1000 + 5 for t in thrift_times)

    assert _kafka_batch(broker.bootstrap, "mixed", [b"kafka-a%d" % i for i in range(4)]) == [3, 4, 5, 6]
    # Thrift items after a Kafka batch; a binary item (not UTF-8, with NULs) and an empty one.
    thrift.produce(T.ProduceRequest(item=b"\x00\xff\x00", topic="mixed"))
    thrift.produce(T.ProduceRequest(item=b"", topic="mixed"))
    assert _kafka_batch(broker.bootstrap, "mixed", [b"kafka-b%d" % i for i in range(2)]) == [9, 10]
    thrift.produce(T.ProduceRequest(item=b"last", topic="mixed"))
    t1 = int(time.time() * 1000)
    thrift.close()

    expected = [
        *((b"thrift-%d" % i, None) for i in range(3)),
        *((b"kafka-a%d" % i, b"kafka") for i in range(4)),
        (b"\x00\xff\x00", None),
        (b"", None),
        *((b"kafka-b%d" % i, b"kafka") for i in range(2)),
        (b"last", None),
    ]
    got = read_partition(broker.bootstrap, "mixed", 0, len(expected))
    assert [(m.offset(), m.value(), m.key(), m.headers()) for m in got] == [
        (i, value, key, None) for i, (value, key) in enumerate(expected)
    ]
    assert [m.timestamp()[1] for m in got[:3]] == thrift_times, "a Thrift item's timestamp is its append time"
    assert all(t0 - 5 <= m.timestamp()[1] <= t1 + 5 for m in got)

    # The same through kafka-python, starting in the middle (inside the first Kafka batch).
    from kafka import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, consumer_timeout_ms=3000, enable_auto_commit=False)
    tp = TopicPartition("mixed", 0)
    consumer.assign([tp])
    consumer.seek(tp, 5)
    tail = [(m.offset, m.value) for m in consumer]
    consumer.close()
    assert tail == [(i, value) for i, (value, _) in enumerate(expected)][5:]
