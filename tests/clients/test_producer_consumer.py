"""The producer and consumers end to end against real broker subprocesses."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from concurrent.futures import Future
from typing import Any

import pytest

from clients.consumer import SimpleConsumer, StreamConsumer
from clients.errors import ClientClosedError, ConsumerTimeoutError, MessageDroppedError
from clients.messages import GZIP, NO_COMPRESSION, SNAPPY, decode_pack, pack_codec
from clients.producer import Producer, ProducerConfig
from idl import luxun_thrift as T

from .conftest import address

pytestmark = pytest.mark.timeout(180)


def drain(consumer: SimpleConsumer, topic: str) -> list[Any]:
    """Every message of a topic, read by index (the index always moves by packs)."""
    out: list[Any] = []
    index = consumer.find_closest_index(topic, -1)
    for _ in range(100_000):
        fetched = consumer.consume_by_index(topic, index)
        if not fetched.messages:
            return out
        assert fetched.next_index is not None and fetched.next_index == index + fetched.packs
        index = fetched.next_index
        out.extend(fetched.messages)
    raise AssertionError("topic never ended")


def test_sync_producer_batches_into_packs_and_futures_get_pack_indexes(brokers: Any) -> None:
    (b,) = brokers(1)
    with Producer(address(b), batch_size=10, linger_ms=10_000) as producer:
        futures = [producer.send("t", b"m%d" % i) for i in range(25)]
        assert producer.flush(10)
        indexes = [f.result(5) for f in futures]
    assert indexes == [0] * 10 + [1] * 10 + [2] * 5  # a pack per batch; the index addresses the pack
    with SimpleConsumer(address(b)) as consumer:
        assert consumer.size("t") == 3
        assert drain(consumer, "t") == [b"m%d" % i for i in range(25)]
        by_index = consumer.consume_by_index("t", 1, max_bytes=1)  # one pack at least
        assert by_index.messages == [b"m%d" % i for i in range(10, 20)]
        assert by_index.next_index == 2  # never 1 + 10 messages (Java Luxun issue #10)


def test_linger_sends_a_partial_batch(brokers: Any) -> None:
    (b,) = brokers(1)
    with Producer(address(b), batch_size=1000, linger_ms=50) as producer:
        future = producer.send("t", b"alone")
        assert future.result(5) == 0
    with SimpleConsumer(address(b)) as consumer:
        assert consumer.consume("t", "g").messages == [b"alone"]
        assert consumer.consume("t", "g").messages == []


@pytest.mark.parametrize("codec", [GZIP, SNAPPY])
def test_compression_with_its_two_safeguards(brokers: Any, codec: int) -> None:
    (b,) = brokers(1)
    text = [b"the same log line again and again %d" % (i % 3) for i in range(200)]
    cfg = ProducerConfig(compression_codec=codec, compressed_topics=frozenset({"zipped", "tiny", "noisy"}),
                         min_compress_bytes=1024, linger_ms=10_000)  # fmt: skip
    with Producer(address(b), config=cfg) as producer:
        for m in text:
            producer.send("zipped", m)
        producer.send("tiny", b"small")  # below min_compress_bytes: sent plain
        noise = [os.urandom(100) for _ in range(50)]  # incompressible: ratio too high, sent plain
        for m in noise:
            producer.send("noisy", m)
        for m in text[:50]:
            producer.send("plain", m)  # not a compressed topic
        assert producer.flush(10)
    with SimpleConsumer(address(b)) as consumer:
        conn = consumer._conn

        def first_item(topic: str) -> bytes:
            return conn.checked("consume", T.ConsumeRequest(topic=topic, startIndex=0, maxFetchSize=0)).itemList[0]

        assert pack_codec(first_item("zipped")) == codec
        assert pack_codec(first_item("tiny")) == NO_COMPRESSION
        assert pack_codec(first_item("noisy")) == NO_COMPRESSION
        assert pack_codec(first_item("plain")) == NO_COMPRESSION
        assert decode_pack(first_item("noisy")) == noise
        assert drain(consumer, "zipped") == text


def test_partitioning_by_key_is_stable_and_custom_partitioners_work(brokers: Any) -> None:
    b1, b2 = brokers(2)
    with Producer([address(b1), address(b2)], linger_ms=5) as producer:
        for i in range(200):
            producer.send("keyed", b"%d" % i, key=b"user-%d" % (i % 10))
        assert producer.flush(10)
    per_broker = []
    for b in (b1, b2):
        with SimpleConsumer(address(b)) as consumer:
            try:
                per_broker.append(drain(consumer, "keyed"))
            except Exception:
                per_broker.append([])
    assert sum(map(len, per_broker)) == 200
    for key in range(10):  # all of one key on one broker, in order
        holders = [i for i, msgs in enumerate(per_broker) if any(int(m) % 10 == key for m in msgs)]
        assert len(holders) == 1
        mine = [int(m) for m in per_broker[holders[0]] if int(m) % 10 == key]
        assert mine == sorted(mine)
    with Producer([address(b1), address(b2)], partitioner=lambda key, n: 1) as producer:
        producer.send("pinned", b"x").result(5)
    with SimpleConsumer(address(b2)) as consumer:
        assert consumer.size("pinned") == 1


def test_rate_limit_and_full_buffer_drops_are_counted_not_silent(brokers: Any) -> None:
    (b,) = brokers(1)
    with Producer(address(b), rate_limits={"limited": (5, 60_000)}, linger_ms=5) as producer:
        futures = [producer.send("limited", b"%d" % i) for i in range(8)]
        producer.flush(10)
        failed = [f for f in futures if f.exception(5) is not None]
        assert len(failed) == 3
        assert all(isinstance(f.exception(), MessageDroppedError) and f.exception().reason == "rate_limit"
                   for f in failed)  # fmt: skip
        metrics = producer.metrics()
        assert metrics["dropped"] == {"limited": {"rate_limit": 3}}
        assert metrics["sent"] == {"limited": 5}


def test_broker_down_drops_after_retries_and_counts_add_up(brokers: Any) -> None:
    (b,) = brokers(1)
    addr = address(b)
    b.stop()
    with Producer(addr, num_retries=2, retry_backoff_ms=20, linger_ms=1) as producer:
        futures = [producer.send("t", b"x") for _ in range(5)]
        producer.flush(10)
        assert all(isinstance(f.exception(5), MessageDroppedError) for f in futures)
        assert producer.metrics()["dropped"]["t"]["broker_down"] == 5


def test_async_producer_with_a_broker_restart_counts_add_up(brokers: Any) -> None:
    (b,) = brokers(1)
    sent = 0
    with Producer(address(b), sync=False, batch_size=50, linger_ms=2, num_retries=20, retry_backoff_ms=50,
                  max_backoff_ms=200) as producer:  # fmt: skip
        futures: list[Future[int | None]] = []
        for i in range(3000):
            futures.append(producer.send("async", b"%d" % i))
            sent += 1
            if i == 1000:
                b.stop()
                threading.Timer(0.5, b.start).start()
            if i % 100 == 0:
                time.sleep(0.01)
        assert producer.flush(30)
        metrics = producer.metrics()
        delivered = metrics["sent"].get("async", 0)
        dropped = sum(metrics["dropped"].get("async", {}).values())
        assert delivered + dropped == sent
        assert sum(1 for f in futures if f.exception(5) is None) == delivered
    time.sleep(0.2)
    with SimpleConsumer(address(b)) as consumer:
        stored = drain(consumer, "async")
    assert len(stored) <= delivered
    assert len(set(stored)) == len(stored)


def test_stream_consumers_two_groups_two_brokers_many_threads(brokers: Any) -> None:
    b1, b2 = brokers(2)
    addrs = [address(b1), address(b2)]
    total = 4000
    with Producer(addrs, batch_size=100, linger_ms=5, serializer="json") as producer:
        for i in range(total):
            producer.send("events", {"n": i})
        assert producer.flush(20)

    def consume_group(group: str, n_streams: int) -> Counter[int]:
        seen: Counter[int] = Counter()
        lock = threading.Lock()
        consumer = StreamConsumer(addrs, group, decoder="json", consumer_timeout_ms=1500, wait_ms=200)
        streams = consumer.create_message_streams({"events": n_streams})["events"]

        def run(stream: Any) -> None:
            try:
                for message in stream:
                    with lock:
                        seen[message["n"]] += 1
            except ConsumerTimeoutError:
                pass

        threads = [threading.Thread(target=run, args=(s,)) for s in streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        consumer.close()
        return seen

    for group in ("analytics", "archive"):
        seen = consume_group(group, 3)
        assert set(seen) == set(range(total)), f"{group}: {total - len(seen)} missing"
        assert max(seen.values()) == 1, f"{group}: duplicates"


def test_a_late_consumer_starts_where_its_group_is(brokers: Any) -> None:
    (b,) = brokers(1)
    with Producer(address(b), batch_size=10, linger_ms=1) as producer:
        for i in range(100):
            producer.send("t", b"%d" % i)
        producer.flush(10)
    with SimpleConsumer(address(b)) as first:
        got = first.consume("t", "g", max_bytes=1).messages  # one pack: 10 messages
    assert got == [b"%d" % i for i in range(10)]
    consumer = StreamConsumer(address(b), "g", consumer_timeout_ms=1000, wait_ms=100)
    stream = consumer.create_message_streams({"t": 1})["t"][0]
    rest = []
    with pytest.raises(ConsumerTimeoutError):
        for m in stream:
            rest.append(m)
    consumer.close()
    assert rest == [b"%d" % i for i in range(10, 100)]


def test_close_under_load_hands_out_everything_fetched(brokers: Any) -> None:
    (b,) = brokers(1)
    total = 20_000
    with Producer(address(b), batch_size=500, linger_ms=5) as producer:
        for i in range(total):
            producer.send("load", b"%d" % i)
        producer.flush(20)
    consumer = StreamConsumer(address(b), "g", queue_chunks=4, wait_ms=100)
    stream = consumer.create_message_streams({"load": 1})["load"][0]
    got = [next(stream) for _ in range(3000)]
    consumer.close()  # fetchers may be blocked on a full queue or inside a fetch
    got.extend(stream)  # the rest of what was fetched, then StopIteration
    with SimpleConsumer(address(b)) as rest:
        while more := rest.consume("load", "g").messages:
            got.extend(more)
    assert sorted(int(m) for m in got) == list(range(total))  # nothing lost, nothing twice
    with pytest.raises(ClientClosedError):
        consumer.create_message_streams({"other": 1})


def test_producer_properties_in_luxun_form() -> None:
    cfg = ProducerConfig.from_properties({
        "broker.list": "0:127.0.0.1:9092,1:127.0.0.1:9093",
        "producer.type": "async",
        "batch.size": "50",
        "queue.time": "20",
        "queue.size": "500",
        "compression.codec": "1",
        "compressed.topics": "a,b",
        "num.retries": "7",
    })  # fmt: skip
    assert cfg.brokers == ("127.0.0.1:9092", "127.0.0.1:9093")
    assert (cfg.sync, cfg.batch_size, cfg.linger_ms, cfg.buffer_messages) == (False, 50, 20, 500)
    assert (cfg.compression_codec, cfg.compressed_topics, cfg.num_retries) == (GZIP, frozenset({"a", "b"}), 7)
    with pytest.raises(ValueError, match=r"unknown producer property 'batch\.sise'"):
        ProducerConfig.from_properties({"batch.sise": "5"})
    with pytest.raises(ValueError, match=r"producer\.type"):
        ProducerConfig.from_properties({"producer.type": "fast"})
