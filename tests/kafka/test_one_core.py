"""What both doors share lives once, below them (luxun/topics.py, luxun/net.py), so a
behaviour cannot hold on one door and not the other: ``log.flush.count`` on Kafka
appends, a Thrift deleteTopic forgetting the Kafka producer state, a Kafka Fetch of
more partitions with data than one ``sendmsg`` takes buffers."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest

from idl import luxun_thrift as T
from luxun.kafka.log import KafkaLog
from luxun.metrics import Metrics
from luxun.thrift.service import QueueHandler
from luxun.topics import TopicManager
from tests._broker import PASSWORD, BrokerProcess

from ._kafka import (
    RawClient,
    metadata_request,
    produce_partition_response,
    produce_request,
    read_partition,
    record_batch,
    request,
)

pytestmark = pytest.mark.timeout(120)


def test_log_flush_count_counts_kafka_appends_too(tmp_path: Path) -> None:
    """``log.flush.count`` counts the items of every door: 2 Kafka batches and 1 Thrift
    item reach 3 and flush (the count starts again); before, Kafka appends were not
    counted at all (and bypassed the topic's queue)."""
    topics = TopicManager(str(tmp_path / "data"), data_page_size_bytes=1 << 20, flush_count=3)
    try:
        kafka = KafkaLog(topics)
        thrift = QueueHandler(
            topics, broker_id=0, max_message_size_bytes=1 << 20, password_check=lambda _: True, metrics=Metrics()
        )
        assert kafka.create("flushed", 1) == (0, None)
        topic = topics.get("flushed")
        assert topic is not None
        assert kafka.produce("flushed", 0, record_batch([b"a", b"b"])).error == 0
        assert kafka.produce("flushed", 0, record_batch([b"c"])).error == 0
        assert topic.stats.unflushed == 2
        assert topic.stats.items_in == 3  # records, as Kafka counts them
        result, index = thrift.produce_item("flushed", b"pack")
        assert result.errorCode is None and index == 2
        assert topic.stats.unflushed == 0  # flushed at the third item
        assert kafka.produce("flushed", 0, record_batch([b"d"])).error == 0
        assert topic.stats.unflushed == 1
    finally:
        topics.close()


def test_a_thrift_delete_forgets_the_kafka_producer_state(broker: BrokerProcess) -> None:
    """An idempotent producer's sequences die with the topic, whichever door deletes it:
    after a Thrift deleteTopic, the re-created topic takes the same producer's batch of
    sequence 0 as new data. Before, the broker kept the old sequences and answered the
    new batch as a duplicate of the deleted one: acknowledged, and not stored."""
    with RawClient(broker.kafka_port) as raw:
        init = raw.call(request(22, 1, transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60)))
        pid, epoch = init.producer_id, init.producer_epoch

        def send(values: list[bytes]) -> tuple[int, int]:
            batch = record_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=0)
            part = produce_partition_response(raw.call(produce_request("again", 0, batch)))
            return int(part.error_code), int(part.base_offset)

        assert raw.call(metadata_request("again")).topics[0].error_code == 0
        assert send([b"old0", b"old1"]) == (0, 0)
        client = broker.client()
        try:
            deleted = client.deleteTopic(T.DeleteTopicRequest(topic="again", password=PASSWORD))
            assert deleted.result.resultCode == T.ResultCode.SUCCESS
        finally:
            client.close()
        assert raw.call(metadata_request("again")).topics[0].error_code == 0  # created anew
        assert send([b"new0", b"new1"]) == (0, 0)
    got = read_partition(broker.bootstrap, "again", 0, 2)
    assert [m.value() for m in got] == [b"new0", b"new1"]


def _value(p: int) -> bytes:
    return b"v%d-" % p + b"x" * 200  # 600 of them: a reply well over the 64 KiB sent joined


def test_a_fetch_of_600_partitions_with_data_reaches_kafka_python(tmp_path: Path) -> None:
    """A Fetch answer of more buffers than one ``sendmsg`` takes (IOV_MAX, 1024; two or
    more a partition) arrives whole. Before, the send failed with EMSGSIZE, the connection
    was closed with a DEBUG line, and kafka-python read nothing."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import KafkaConsumer, TopicPartition

    partitions = 600
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        futures = admin.create_topics(
            [NewTopic("wide", num_partitions=partitions, replication_factor=1)], request_timeout=60
        )
        futures["wide"].result(60)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50})
        for p in range(partitions):
            producer.produce("wide", value=_value(p), partition=p)
        assert producer.flush(60) == 0

        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, group_id=None)
        try:
            tps = [TopicPartition("wide", p) for p in range(partitions)]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            got: dict[int, bytes] = {}
            deadline = time.monotonic() + 60
            while len(got) < partitions and time.monotonic() < deadline:
                for tp, records in consumer.poll(timeout_ms=500).items():
                    for r in records:
                        got[tp.partition] = r.value
        finally:
            consumer.close()
        assert got == {p: _value(p) for p in range(partitions)}, f"{len(got)} of {partitions} partitions read"
        assert "Message too long" not in broker.log()
    finally:
        broker.stop()
