"""Fetch as consumers use it: an offset out of range reset by auto.offset.reset, records
larger than the fetch limits (KIP-74: at least one batch), and a waiting fetch
completed by a produce at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests._broker import BrokerProcess

from ._kafka import RawClient, fetch_request, metadata_request, produce_request, read_partition, record_batch

pytestmark = pytest.mark.timeout(90)

MiB = 1 << 20


def _produce(bootstrap: str, topic: str, values: list[bytes], **config: object) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, **config})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(15) == 0


def _consumer(bootstrap: str, **config: object) -> object:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": "fetch", "enable.auto.commit": False, **config})


def _poll(consumer: object, count: int, timeout_s: float = 15.0) -> list[object]:
    got: list[object] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        m = consumer.poll(0.2)  # type: ignore[attr-defined]
        if m is not None:
            assert m.error() is None, m.error()
            got.append(m)
    return got


@pytest.mark.parametrize(("reset", "first"), [("earliest", 0), ("latest", 10)])
def test_an_offset_out_of_range_is_reset(broker: BrokerProcess, reset: str, first: int) -> None:
    from confluent_kafka import TopicPartition

    _produce(broker.bootstrap, "range", [b"%d" % i for i in range(10)])
    consumer = _consumer(broker.bootstrap, **{"auto.offset.reset": reset})
    try:
        consumer.assign([TopicPartition("range", 0, 1000)])  # type: ignore[attr-defined]
        if reset == "latest":
            time.sleep(1.0)  # let it reset to the end before there is more
            _produce(broker.bootstrap, "range", [b"10"])
        got = _poll(consumer, 1)
        assert [(m.offset(), m.value()) for m in got] == [(first, b"%d" % first)]  # type: ignore[attr-defined]
    finally:
        consumer.close()  # type: ignore[attr-defined]


def test_records_larger_than_the_fetch_limits_are_still_served(broker: BrokerProcess) -> None:
    big = [bytes([65 + i]) * 200_000 for i in range(5)]
    _produce(broker.bootstrap, "big", big, **{"linger.ms": 0, "batch.size": 1_000_000})
    consumer = _consumer(
        broker.bootstrap,
        **{
            "fetch.max.bytes": 1024,
            "max.partition.fetch.bytes": 1024,
            "receive.message.max.bytes": 10_000_000,
            "message.max.bytes": 1000,
        },
    )
    try:
        from confluent_kafka import TopicPartition

        consumer.assign([TopicPartition("big", 0, 0)])  # type: ignore[attr-defined]
        got = _poll(consumer, 5)
        assert [(m.offset(), m.value()) for m in got] == list(enumerate(big))  # type: ignore[attr-defined]
    finally:
        consumer.close()  # type: ignore[attr-defined]


def test_a_waiting_fetch_is_completed_by_a_produce_at_once(broker: BrokerProcess) -> None:
    """kafka-python's consumer waits up to fetch_max_wait_ms=5000 for data; a record
    produced meanwhile reaches it well before that."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    producer.send("wake", b"first").get(10)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, fetch_max_wait_ms=5000, enable_auto_commit=False)
    try:
        tp = TopicPartition("wake", 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        assert [m.value for m in consumer.poll(5000, max_records=1).get(tp, [])] == [b"first"]
        latencies: list[float] = []
        for i in range(3):
            sent_at: list[float] = []

            def send_later(i: int = i, sent_at: list[float] = sent_at) -> None:
                time.sleep(0.5)  # the consumer's fetch is waiting by now
                sent_at.append(time.monotonic())
                producer.send("wake", b"late-%d" % i).get(10)

            sender = threading.Thread(target=send_later)
            sender.start()
            got: list[bytes] = []
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                got = [m.value for m in consumer.poll(200).get(tp, [])]
            latencies.append(time.monotonic() - sent_at[0])
            sender.join()
            assert got == [b"late-%d" % i]
        assert max(latencies) < 1.5, f"a produce should complete a waiting fetch at once: {latencies}"
    finally:
        consumer.close()
        producer.close(5)
    assert [m.value() for m in read_partition(broker.bootstrap, "wake", 0, 4)][-1] == b"late-2"


def _fetch(raw: RawClient, parts: list[tuple[str, int]], max_bytes: int) -> list[tuple[int, int]]:
    """One Fetch v4 of ``parts`` from offset 0 (partition limit 1 MiB): (partition, bytes of
    records) per partition answered, in order."""
    request = fetch_request(parts, max_bytes)
    response = raw.call(request)
    return [(p.partition_index, len(p.records or b"")) for t in response.responses for p in t.partitions]


def test_a_fetch_answer_stays_within_max_bytes_but_one_batch(broker: BrokerProcess) -> None:
    """KIP-74: only the first batch of the first partition with data may pass the Fetch's
    max_bytes; every later partition gets only whole batches that fit in what is left, so a
    Fetch naming 3 partitions of ~300 KB batches with max_bytes 400 KB gets one batch, and
    one naming a partition 50 times no more. Before, every later partition still got a
    batch (librdkafka refuses such an answer as larger than its fetch.max.bytes)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("budget", num_partitions=3, replication_factor=1)], request_timeout=10)[
        "budget"
    ].result(10)
    batch = record_batch([bytes([65 + i % 26]) * 1000 for i in range(300)])  # ~300 KB
    with RawClient(broker.kafka_port) as raw:
        for p in range(3):
            (topic,) = raw.call(produce_request("budget", p, batch)).responses
            assert topic.partition_responses[0].error_code == 0
        got = _fetch(raw, [("budget", p) for p in range(3)], 400_000)
        assert [p for p, _ in got] == [0, 1, 2]
        assert got[0][1] == len(batch) and got[1][1] == 0 and got[2][1] == 0
        got = _fetch(raw, [("budget", p) for p in range(3)], 2 * len(batch))  # room for two
        assert [n for _, n in got] == [len(batch), len(batch), 0]
        repeats = _fetch(raw, [("budget", 1)] * 50, 400_000)
        assert repeats == [(1, len(batch))]  # answered once, as Kafka's broker does


def test_fetch_max_bytes_caps_every_answer(tmp_path: Path) -> None:
    """The broker's fetch.max.bytes caps a Fetch that asks for more (a max_bytes of
    2^31-1 once got a 416 MB answer); KIP-74's one batch over it is still served."""
    props = tmp_path / "server.properties"
    props.write_text("fetch.max.bytes=500000\n")
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", "--config", str(props), kafka=True).start()
    try:
        batch = record_batch([bytes([65 + i % 26]) * 1000 for i in range(300)])  # ~300 KB
        with RawClient(broker.kafka_port) as raw:
            raw.call(metadata_request("capped"))
            for _ in range(4):
                (topic,) = raw.call(produce_request("capped", 0, batch)).responses
                assert topic.partition_responses[0].error_code == 0
            assert _fetch(raw, [("capped", 0)], 2**31 - 1) == [(0, len(batch))]  # 2 would pass 500 KB
        # A client asking for much more still reads everything, 300 KB at a time.
        got = read_partition(broker.bootstrap, "capped", 0, 1200)
        assert [m.offset() for m in got] == list(range(1200))
    finally:
        broker.stop()


def test_clients_that_never_read_hold_at_most_the_output_budget(tmp_path: Path) -> None:
    """Six connections pipeline Fetches of 1 MiB and never read (a 4 KiB receive window):
    the answers the broker holds for them stay within kafka.fetch.buffer.bytes (2 MiB) and
    one batch each (before, each held its answers whatever their number: 4 such clients
    held 1.7 GB), a healthy consumer still reads everything meanwhile, and the budget
    comes back when they go."""
    import socket

    from ._kafka import encode_request

    props = tmp_path / "server.properties"
    props.write_text("fetch.max.bytes=1048576\nkafka.fetch.buffer.bytes=2097152\n")
    broker = BrokerProcess(
        tmp_path / "data", tmp_path / "broker.log", "--config", str(props), kafka=True, metrics=True
    ).start()
    stuck: list[socket.socket] = []
    try:
        batch = record_batch([bytes([65 + i % 26]) * 1000 for i in range(100)])  # ~100 KB
        with RawClient(broker.kafka_port) as raw:
            raw.call(metadata_request("unread"))
            for _ in range(40):
                (topic,) = raw.call(produce_request("unread", 0, batch)).responses
                assert topic.partition_responses[0].error_code == 0
        fetch = fetch_request([("unread", 0)], 1 << 20)
        for _ in range(6):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", broker.kafka_port))
            s.sendall(b"".join(encode_request(fetch, k) for k in range(40)))
            stuck.append(s)
        deadline = time.monotonic() + 15
        while broker.metric("luxun_output_buffer_short_total") == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert broker.metric("luxun_output_buffer_short_total") > 0, "the budget was never spent"
        assert broker.metric("luxun_output_buffer_bytes") <= 2 * MiB + 6 * len(batch)
        got = read_partition(broker.bootstrap, "unread", 0, 4000)
        assert [m.offset() for m in got] == list(range(4000))
        assert broker.metric("luxun_output_buffer_bytes") <= 2 * MiB + 6 * len(batch)
    finally:
        for s in stuck:
            s.close()
    try:
        deadline = time.monotonic() + 15
        while broker.metric("luxun_output_buffer_bytes") > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert broker.metric("luxun_output_buffer_bytes") == 0
        assert "Traceback" not in broker.log()
    finally:
        broker.stop()
