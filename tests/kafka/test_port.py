"""The Kafka port with real Kafka clients against a real broker subprocess."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests._broker import BrokerProcess


def test_kafka_python_round_trip_keeps_keys_headers_and_offsets(broker: BrokerProcess) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    for i in range(20):
        producer.send("events", value=b"v%d" % i, key=b"k%d" % i, headers=[("h", b"%d" % i)])
    producer.flush(10)
    producer.close()
    consumer = KafkaConsumer(
        "events", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000
    )
    got = [(m.offset, m.key, m.value, m.headers) for m in consumer]
    consumer.close()
    assert got == [(i, b"k%d" % i, b"v%d" % i, [("h", b"%d" % i)]) for i in range(20)]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_every_codec(broker: BrokerProcess, codec: str) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 5})
    for i in range(500):
        producer.produce("c-" + codec, value=b"value-%d" % i, key=b"key-%d" % (i % 7))
    assert producer.flush(15) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([TopicPartition("c-" + codec, 0, 0)])
    got: list[tuple[int, bytes | None, bytes | None]] = []
    deadline = time.monotonic() + 20
    while len(got) < 500 and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append((m.offset(), m.key(), m.value()))
    consumer.close()
    assert got == [(i, b"key-%d" % (i % 7), b"value-%d" % i) for i in range(500)]


def test_metrics_and_status_page_count_kafka_requests_and_errors(tmp_path: Path) -> None:
    import urllib.request

    from kafka import KafkaConsumer, TopicPartition

    b = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True, metrics=True).start()
    try:
        consumer = KafkaConsumer(bootstrap_servers=b.bootstrap, consumer_timeout_ms=1000)
        tp = TopicPartition("seen", 0)
        consumer.assign([tp])  # Metadata auto-creates "seen"; its partition 0 exists
        consumer.seek(tp, 5)  # beyond the end: OFFSET_OUT_OF_RANGE (1) answered
        assert list(consumer) == []
        consumer.close()
        base = f"http://127.0.0.1:{b.metrics_port}"
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        page = urllib.request.urlopen(base + "/", timeout=5).read().decode()
    finally:
        b.stop()
    assert 'luxun_kafka_requests_total{api_key="18",version="3"}' in text  # ApiVersions v3
    assert 'luxun_kafka_requests_total{api_key="3",' in text  # Metadata
    assert 'luxun_kafka_errors_total{code="1",name="OFFSET_OUT_OF_RANGE"}' in text
    assert "<h2>Kafka protocol</h2>" in page and "<td>fetch</td>" in page and "OFFSET_OUT_OF_RANGE" in page


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_every_acks_setting_stores_everything_in_order(broker: BrokerProcess, acks: int | str) -> None:
    """acks=0 gets no response at all (as in Kafka), 1 and all an answer after the append;
    each stores every record once, in order."""
    from kafka import KafkaConsumer, KafkaProducer

    topic = f"acks-{acks}"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks=acks, linger_ms=2, request_timeout_ms=10_000)
    futures = [producer.send(topic, value=b"%d" % i) for i in range(300)]
    producer.flush(10)
    offsets = [f.get(timeout=10).offset for f in futures]
    producer.close()
    if acks != 0:  # with acks=0 the client never hears an offset (kafka-python guesses one)
        assert offsets == list(range(300))
    consumer = KafkaConsumer(
        topic, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000
    )
    got = [(m.offset, m.value) for m in consumer]
    consumer.close()
    assert got == [(i, b"%d" % i) for i in range(300)]
