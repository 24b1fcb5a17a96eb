"""Idempotent producers: confluent-kafka's exactly-once delivery, a retried Produce
answered with the first one's offset and not stored twice, a sequence gap refused
(transactions: test_transactions.py)."""

from __future__ import annotations

import datetime
import signal
from pathlib import Path

import pytest

from tests._broker import BrokerProcess

from ._kafka import (
    RawClient,
    metadata_request,
    produce_partition_response,
    produce_request,
    read_partition,
    record_batch,
    request,
)

pytestmark = pytest.mark.timeout(90)

OUT_OF_ORDER_SEQUENCE_NUMBER = 45


def test_confluent_idempotent_producer_delivers_exactly_once(broker: BrokerProcess) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 2, "acks": "all"}
    )
    for i in range(1000):
        producer.produce("idem", value=b"%d" % i)
        if i % 100 == 0:
            producer.poll(0)
    assert producer.flush(20) == 0
    got = read_partition(broker.bootstrap, "idem", 0, 1000)
    assert [(m.offset(), m.value()) for m in got] == [(i, b"%d" % i) for i in range(1000)]


def test_a_retried_produce_is_answered_with_the_first_offset_and_stored_once(broker: BrokerProcess) -> None:
    with RawClient(broker.kafka_port) as raw:
        init = raw.call(request(22, 1, transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60)))
        assert init.error_code == 0 and init.producer_id >= 0
        pid, epoch = init.producer_id, init.producer_epoch

        def send(values: list[bytes], seq: int) -> tuple[int, int]:
            batch = record_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
            part = produce_partition_response(raw.call(produce_request("retry", 0, batch)))
            return int(part.error_code), int(part.base_offset)

        (topic,) = raw.call(metadata_request("retry")).topics  # creates it, as a producer's Metadata does
        assert topic.error_code == 0
        assert send([b"a0", b"a1", b"a2"], 0) == (0, 0)
        assert send([b"a0", b"a1", b"a2"], 0) == (0, 0)  # the same request again: a retry
        assert send([b"b0", b"b1"], 3) == (0, 3)
        assert send([b"a0", b"a1", b"a2"], 0) == (0, 0)  # an older retry, still remembered
        assert send([b"b0", b"b1"], 3) == (0, 3)
        code, _ = send([b"gap"], 9)  # 5 expected
        assert code == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert send([b"c0"], 5) == (0, 5)
    got = read_partition(broker.bootstrap, "retry", 0, 6)
    assert [(m.offset(), m.value()) for m in got] == list(enumerate([b"a0", b"a1", b"a2", b"b0", b"b1", b"c0"]))


def test_a_retry_after_a_broker_restart_is_still_recognised(tmp_path: Path) -> None:
    """Producer sequences are rebuilt from the stored batches after a restart (SIGKILL):
    the retry of the last batch is answered with its offset, the next one continues."""
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        with RawClient(broker.kafka_port) as raw:
            init = raw.call(request(22, 1, transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60)))
            pid, epoch = init.producer_id, init.producer_epoch
            raw.call(metadata_request("durable"))
            for seq in range(0, 6, 2):
                batch = record_batch([b"%d" % seq, b"%d" % (seq + 1)], producer_id=pid, producer_epoch=epoch,
                                     base_sequence=seq)  # fmt: skip
                part = produce_partition_response(raw.call(produce_request("durable", 0, batch)))
                assert (part.error_code, part.base_offset) == (0, seq)
        broker.stop(signal.SIGKILL)
        broker = BrokerProcess(tmp_path / "data", tmp_path / "broker-2.log", kafka=True).start()
        with RawClient(broker.kafka_port) as raw:
            retry = record_batch([b"4", b"5"], producer_id=pid, producer_epoch=epoch, base_sequence=4)
            part = produce_partition_response(raw.call(produce_request("durable", 0, retry)))
            assert (part.error_code, part.base_offset) == (0, 4), "the retry is answered with the stored offset"
            gap = record_batch([b"x"], producer_id=pid, producer_epoch=epoch, base_sequence=7)
            part = produce_partition_response(raw.call(produce_request("durable", 0, gap)))
            assert part.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
            following = record_batch([b"6"], producer_id=pid, producer_epoch=epoch, base_sequence=6)
            part = produce_partition_response(raw.call(produce_request("durable", 0, following)))
            assert (part.error_code, part.base_offset) == (0, 6)
        got = read_partition(broker.bootstrap, "durable", 0, 7)
        assert [(m.offset(), m.value()) for m in got] == [(i, b"%d" % i) for i in range(7)]
    finally:
        broker.stop()


def test_produce_many_answers_each_request_as_if_alone(tmp_path: Path) -> None:
    """KafkaLog.produce_many (a run of pipelined Produce requests for one partition, see
    test_pipelining.py): an idempotent producer's batches are checked one by one (a retry
    in the run is answered with the first one's offset, stored once), and when one
    append of the run fails (an item larger than a data page), nothing of it was stored
    and each request is stored alone: the one at fault refused, the others stored."""
    from luxun.kafka.log import KafkaLog
    from luxun.partitions import partition_topic
    from luxun.topics import TopicManager

    message_too_large = 10
    topics = TopicManager(str(tmp_path / "data"), data_page_size_bytes=4096)
    try:
        kafka = KafkaLog(topics)
        assert kafka.create("r", 1) == (0, None)

        def idem(values: list[bytes], seq: int) -> bytes:
            return record_batch(values, producer_id=1000, producer_epoch=0, base_sequence=seq)

        big = record_batch([b"x" * 5000])  # past a 4 KiB data page
        results = kafka.produce_many(
            "r",
            0,
            [idem([b"a0", b"a1", b"a2"], 0), idem([b"a0", b"a1", b"a2"], 0), idem([b"b0"], 3), record_batch([b"p"])],
        )
        assert [(r.error, r.base_offset) for r in results] == [(0, 0), (0, 0), (0, 3), (0, 4)]
        results = kafka.produce_many("r", 0, [record_batch([b"q0", b"q1"]), big, record_batch([b"s"]), None])
        assert [(r.error, r.base_offset) for r in results] == [(0, 5), (message_too_large, -1), (0, 7), (2, -1)]
        assert [r.log_start_offset for r in results] == [0, -1, 0, -1]
        assert kafka.produce("r", 0, record_batch([b"t"])).base_offset == 8  # 8 records stored, once each
        stored = topics.get(partition_topic("r", 0))
        assert stored is not None and stored.queue.head == 6  # items: batches of 3, 1, 1, 2, 1, 1
    finally:
        topics.close()
