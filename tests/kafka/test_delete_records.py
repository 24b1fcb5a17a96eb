"""DeleteRecords (API 21): the log start moves, durably, with confluent-kafka's and
kafka-python's admin clients; ListOffsets earliest and Fetch then start there and
below it is OFFSET_OUT_OF_RANGE; whole pages below are deleted as retention deletes
them; the Thrift door sees the tail retention would leave; bad offsets get Kafka's
errors and lose nothing. Issue 32, item 3."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from idl import luxun_thrift as T
from tests._broker import BrokerProcess

from ._kafka import RawClient, fetch_request, produce_request, record_batch

pytestmark = pytest.mark.timeout(120)

OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
BATCHES, PER_BATCH = 20, 5  # offsets 0..99, batch b holds 5b..5b+4


def _broker(tmp_path: Path) -> BrokerProcess:
    props = tmp_path / "small-pages.properties"
    props.write_text("log.backfile.page.size=16384\n")
    return BrokerProcess(tmp_path / "data", tmp_path / "broker.log", "--config", str(props), kafka=True)


def _fill(broker: BrokerProcess, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)], request_timeout=10)[topic].result(10)
    with RawClient(broker.kafka_port) as raw:
        for b in range(BATCHES):
            values = [b"%05d" % (b * PER_BATCH + i) + b"x" * 1500 for i in range(PER_BATCH)]
            response = raw.call(produce_request(topic, 0, record_batch(values)))
            assert response.responses[0].partition_responses[0].error_code == 0


def _watermarks(broker: BrokerProcess, topic: str) -> tuple[int, int]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "marks"})
    try:
        low, high = consumer.get_watermark_offsets(__import__("confluent_kafka").TopicPartition(topic, 0), timeout=10)
        return int(low), int(high)
    finally:
        consumer.close()


def _delete(broker: BrokerProcess, topic: str, partition: int, offset: int) -> int:
    """confluent-kafka's delete_records: the low watermark answered."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    (future,) = admin.delete_records([TopicPartition(topic, partition, offset)], request_timeout=10).values()
    return int(future.result(10).low_watermark)


def _raw_delete(
    broker: BrokerProcess, version: int, *parts: tuple[str, int, int]
) -> dict[tuple[str, int], tuple[int, int]]:
    """A raw DeleteRecords of ``(topic, partition, offset)`` each: (error, low watermark) by partition."""
    import datetime
    import importlib

    module = importlib.import_module(f"kio.schema.delete_records.v{version}.request")
    topics: dict[str, list[object]] = {}
    for topic, partition, offset in parts:
        topics.setdefault(topic, []).append(module.DeleteRecordsPartition(partition_index=partition, offset=offset))
    body = module.DeleteRecordsRequest(
        topics=tuple(module.DeleteRecordsTopic(name=t, partitions=tuple(ps)) for t, ps in topics.items()),
        timeout=datetime.timedelta(seconds=10),
    )
    with RawClient(broker.kafka_port) as raw:
        response = raw.call(body)
    return {(t.name, p.partition_index): (p.error_code, p.low_watermark) for t in response.topics for p in t.partitions}


def _first_offset_read(broker: BrokerProcess, topic: str, offset: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "first", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                assert m.value()[:5] == b"%05d" % m.offset()
                return int(m.offset())
        raise AssertionError("nothing read")
    finally:
        consumer.close()


def _data_pages(broker: BrokerProcess, topic: str) -> int:
    return len(list((broker.data_dir / topic / "data").glob("page-*.dat")))


def test_delete_records_moves_the_log_start_durably(tmp_path: Path) -> None:
    broker = _broker(tmp_path).start()
    try:
        _fill(broker, "trim")
        pages = _data_pages(broker, "trim")
        assert pages > 3
        assert _delete(broker, "trim", 0, 12) == 12  # inside the batch 10..14
        assert _watermarks(broker, "trim") == (12, 100)
        assert _first_offset_read(broker, "trim", 12) == 12
        with RawClient(broker.kafka_port) as raw:
            answer = raw.call(fetch_request([("trim", 0)], 1 << 20, version=5))  # from offset 0
        part = answer.responses[0].partitions[0]
        assert (part.error_code, part.log_start_offset, part.high_watermark) == (OFFSET_OUT_OF_RANGE, 12, 100)
        thrift = broker.client()
        try:  # the tail is the item holding offset 12, as retention would leave it
            below = thrift.consume(T.ConsumeRequest(topic="trim", startIndex=1, maxFetchSize=1 << 20))
            assert below.result.errorCode == T.ErrorCode.INDEX_OUT_OF_BOUNDS
            kept = thrift.consume(T.ConsumeRequest(topic="trim", startIndex=2, maxFetchSize=1))
            assert kept.result.resultCode == T.ResultCode.SUCCESS
        finally:
            thrift.close()
        assert _delete(broker, "trim", 0, 5) == 12  # below the start: nothing changes
        assert _delete(broker, "trim", 0, 80) == 80
        assert _data_pages(broker, "trim") < pages  # whole pages below went, as retention deletes them
    finally:
        broker.stop()
    broker.start()
    try:
        assert _watermarks(broker, "trim") == (80, 100)
        assert _first_offset_read(broker, "trim", 80) == 80
        assert _delete(broker, "trim", 0, -1) == 100  # -1: the high watermark
    finally:
        broker.stop()
    broker.start()
    try:
        assert _watermarks(broker, "trim") == (100, 100)
    finally:
        broker.stop()


def test_a_start_kept_before_a_crash_is_applied_at_the_next_use(tmp_path: Path) -> None:
    """Killed after keeping the offset and before moving tail: the next start serves
    the kept start and moves tail then."""
    from luxun.kafka.logstart import LogStarts

    broker = _broker(tmp_path).start()
    try:
        _fill(broker, "cut")
    finally:
        broker.stop()
    LogStarts(str(broker.data_dir)).set("cut", 33)
    broker.start()
    try:
        assert _watermarks(broker, "cut") == (33, 100)
        thrift = broker.client()
        try:
            below = thrift.consume(T.ConsumeRequest(topic="cut", startIndex=5, maxFetchSize=1))
            assert below.result.errorCode == T.ErrorCode.INDEX_OUT_OF_BOUNDS
        finally:
            thrift.close()
    finally:
        broker.stop()


def test_bad_offsets_and_unknown_partitions_get_kafkas_errors(tmp_path: Path) -> None:
    from confluent_kafka import KafkaError, KafkaException

    broker = _broker(tmp_path).start()
    try:
        _fill(broker, "safe")
        for topic, partition, offset, code in (
            ("safe", 0, 101, KafkaError.OFFSET_OUT_OF_RANGE),
            ("safe", 0, -5, KafkaError.OFFSET_OUT_OF_RANGE),
        ):
            with pytest.raises(KafkaException) as info:
                _delete(broker, topic, partition, offset)
            assert info.value.args[0].code() == code, (topic, partition, offset, info.value)
        # librdkafka does not send a partition without a leader: raw requests, v0 and v2
        for version in (0, 2):
            answer = _raw_delete(broker, version, ("safe", 7, 1), ("nowhere", 0, 1), ("safe", 0, -7))
            assert answer == {
                ("safe", 7): (UNKNOWN_TOPIC_OR_PARTITION, -1),
                ("nowhere", 0): (UNKNOWN_TOPIC_OR_PARTITION, -1),
                ("safe", 0): (OFFSET_OUT_OF_RANGE, -1),
            }
        assert _watermarks(broker, "safe") == (0, 100)  # nothing lost
        assert _first_offset_read(broker, "safe", 0) == 0
    finally:
        broker.stop()


def test_kafka_python_deletes_records(tmp_path: Path) -> None:
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    broker = _broker(tmp_path).start()
    try:
        _fill(broker, "kp")
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            result = admin.delete_records({TopicPartition("kp", 0): 50})
        finally:
            admin.close()
        assert result[TopicPartition("kp", 0)]["low_watermark"] == 50
        assert _watermarks(broker, "kp") == (50, 100)
    finally:
        broker.stop()
