"""Kafka transactions with confluent-kafka (librdkafka) against a real broker: committed
records seen by read_committed readers, aborted ones never, an open transaction holding
back what follows it (the last stable offset), fencing by a newer producer, the broker
aborting a transaction past its timeout, offsets committed with the transaction
(consume-transform-produce), and the protocol's refusals seen raw."""

from __future__ import annotations

import dataclasses
import datetime
import time

import pytest

from luxun.kafka.protocol import build, request_schema
from tests._broker import BrokerProcess

from ._kafka import (
    RawClient,
    fetch_request,
    metadata_request,
    produce_partition_response,
    produce_request,
    request,
)
from ._txn import broker, read_all, transactional_producer, values

__all__ = ["broker"]  # the fixture

pytestmark = pytest.mark.timeout(120)

INVALID_TXN_STATE = 48
INVALID_TRANSACTION_TIMEOUT = 50
INVALID_PRODUCER_ID_MAPPING = 49
PRODUCER_FENCED = 90


def test_read_committed_sees_committed_records_and_never_aborted_ones(broker: BrokerProcess) -> None:
    producer = transactional_producer(broker.bootstrap, "tx-basic")
    producer.begin_transaction()
    for i in range(5):
        producer.produce("basic", value=b"c%d" % i)
    producer.commit_transaction(20)
    producer.begin_transaction()
    for i in range(3):
        producer.produce("basic", value=b"a%d" % i)
    assert producer.flush(20) == 0  # stored before the abort, so there is something to hide
    producer.abort_transaction(20)
    producer.begin_transaction()
    producer.produce("basic", value=b"d0")
    producer.commit_transaction(20)

    committed = read_all(broker.bootstrap, "basic", committed=True)
    assert values(committed) == [b"c0", b"c1", b"c2", b"c3", b"c4", b"d0"]
    # read_uncommitted: every data record, the markers (offsets 5, 9, 11) never as records.
    uncommitted = read_all(broker.bootstrap, "basic", committed=False)
    assert [(o, v) for _p, o, v in uncommitted] == [
        (0, b"c0"), (1, b"c1"), (2, b"c2"), (3, b"c3"), (4, b"c4"),
        (6, b"a0"), (7, b"a1"), (8, b"a2"), (10, b"d0"),
    ]  # fmt: skip


def test_an_open_transaction_holds_back_read_committed_readers_until_it_ends(broker: BrokerProcess) -> None:
    from confluent_kafka import Producer

    producer = transactional_producer(broker.bootstrap, "tx-open")
    producer.begin_transaction()
    producer.produce("open", value=b"t0")
    assert producer.flush(20) == 0
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce("open", value=b"after")  # behind the open transaction: held back too
    assert plain.flush(20) == 0

    assert values(read_all(broker.bootstrap, "open", committed=False)) == [b"t0", b"after"]
    assert read_all(broker.bootstrap, "open", committed=True) == []
    with RawClient(broker.kafka_port) as raw:  # ListOffsets latest: the LSO, or the high watermark
        assert _latest(raw, "open", isolation=1) == 0
        assert _latest(raw, "open", isolation=0) == 2
        fetched = raw.call(dataclasses.replace(fetch_request([("open", 0)], 1 << 20), isolation_level=1))
        part = fetched.responses[0].partitions[0]
        assert (part.high_watermark, part.last_stable_offset, part.records) == (2, 0, b"")

    producer.commit_transaction(20)
    assert values(read_all(broker.bootstrap, "open", committed=True)) == [b"t0", b"after"]
    with RawClient(broker.kafka_port) as raw:
        assert _latest(raw, "open", isolation=1) == 3  # t0, after, the marker


def test_a_second_producer_with_the_same_id_fences_the_first(broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaError, KafkaException

    first = transactional_producer(broker.bootstrap, "tx-fence")
    first.begin_transaction()
    first.produce("fence", value=b"zombie")
    assert first.flush(20) == 0
    second = transactional_producer(broker.bootstrap, "tx-fence")  # aborts the first's transaction
    with pytest.raises(KafkaException) as info:
        first.commit_transaction(20)
    error = info.value.args[0]
    assert error.fatal() and error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED), error

    second.begin_transaction()
    second.produce("fence", value=b"live")
    second.commit_transaction(20)
    assert values(read_all(broker.bootstrap, "fence", committed=True)) == [b"live"]
    assert values(read_all(broker.bootstrap, "fence", committed=False)) == [b"zombie", b"live"]


def test_the_broker_aborts_a_transaction_past_its_timeout(broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaException, Producer

    producer = transactional_producer(broker.bootstrap, "tx-slow", **{"transaction.timeout.ms": 1500})
    producer.begin_transaction()
    producer.produce("slow", value=b"late")
    assert producer.flush(20) == 0
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce("slow", value=b"plain")
    assert plain.flush(20) == 0
    deadline = time.monotonic() + 20
    while values(read_all(broker.bootstrap, "slow", committed=True)) != [b"plain"]:  # the abort lets it through
        assert time.monotonic() < deadline, "the timed-out transaction was not aborted"
        time.sleep(0.3)
    with pytest.raises(KafkaException):  # fenced by the abort's epoch bump
        producer.commit_transaction(20)


def test_offsets_sent_to_a_transaction_are_committed_with_it_and_only_then(broker: BrokerProcess) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    source = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        source.produce("ctp-in", value=b"%d" % i)
    assert source.flush(20) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "ctp",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    producer = transactional_producer(broker.bootstrap, "tx-ctp")
    try:
        consumer.assign([TopicPartition("ctp-in", 0, 0)])
        for round_, commit in ((0, True), (1, False)):
            batch = []
            while len(batch) < 5:
                m = consumer.poll(1)
                if m is not None and m.error() is None:
                    batch.append(m)
            producer.begin_transaction()
            for m in batch:
                producer.produce("ctp-out", value=b"out-" + m.value())
            producer.send_offsets_to_transaction(
                [TopicPartition("ctp-in", 0, batch[-1].offset() + 1)], consumer.consumer_group_metadata(), 20
            )
            if commit:
                producer.commit_transaction(20)
            else:
                assert producer.flush(20) == 0
                producer.abort_transaction(20)
            (committed,) = consumer.committed([TopicPartition("ctp-in", 0)], 10)
            assert committed.offset == 5, (round_, committed)  # the abort committed nothing
    finally:
        consumer.close()
    assert values(read_all(broker.bootstrap, "ctp-out", committed=True)) == [b"out-%d" % i for i in range(5)]


def test_the_protocol_refusals(broker: BrokerProcess) -> None:
    with RawClient(broker.kafka_port) as raw:
        too_long = raw.call(request(22, 4, transactional_id="raw", transaction_timeout=datetime.timedelta(hours=1)))
        assert too_long.error_code == INVALID_TRANSACTION_TIMEOUT
        init = raw.call(request(22, 4, transactional_id="raw", transaction_timeout=datetime.timedelta(seconds=60)))
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        assert raw.call(metadata_request("raw")).topics[0].error_code == 0
        # A transactional batch to a partition not added: refused, nothing stored.
        batch = _transactional_batch([b"x"], pid, epoch)
        part = produce_partition_response(raw.call(_produce(batch, "raw")))
        assert part.error_code == INVALID_TXN_STATE
        # EndTxn without a transaction; with a wrong producer id; with an old epoch.
        assert _end_txn(raw, pid, epoch) == INVALID_TXN_STATE
        assert _end_txn(raw, pid + 1, epoch) == INVALID_PRODUCER_ID_MAPPING
        again = raw.call(request(22, 4, transactional_id="raw", transaction_timeout=datetime.timedelta(seconds=60)))
        assert (again.producer_id, again.producer_epoch) == (pid, epoch + 1)
        assert _end_txn(raw, pid, epoch) == PRODUCER_FENCED
        # The partition added, with the new epoch: stored; with the old one: refused.
        added = raw.call(build(request_schema(24, 3), v3_and_below_transactional_id="raw", v3_and_below_producer_id=pid,
                                 v3_and_below_producer_epoch=epoch + 1,
                                 v3_and_below_topics=[{"name": "raw", "partitions": [0]}]))  # fmt: skip
        assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
        stale = produce_partition_response(raw.call(_produce(_transactional_batch([b"y"], pid, epoch), "raw")))
        assert stale.error_code == 47  # INVALID_PRODUCER_EPOCH
        ok = produce_partition_response(raw.call(_produce(_transactional_batch([b"z"], pid, epoch + 1), "raw")))
        assert (ok.error_code, ok.base_offset) == (0, 0)


def _end_txn(raw: RawClient, pid: int, epoch: int) -> int:
    answer = raw.call(request(26, 3, transactional_id="raw", producer_id=pid, producer_epoch=epoch, committed=True))
    return int(answer.error_code)


def _latest(raw: RawClient, topic: str, *, isolation: int) -> int:
    answer = raw.call(
        build(request_schema(2, 5), replica_id=-1, isolation_level=isolation,
                topics=[{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}])
    )  # fmt: skip
    return int(answer.topics[0].partitions[0].offset)


def _transactional_batch(values_: list[bytes], pid: int, epoch: int) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, 0, True, pid, epoch, 0, 1 << 24)
    for i, value in enumerate(values_):
        builder.append(i, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
    return bytes(builder.build())


def _produce(batch: bytes, topic: str) -> object:
    return dataclasses.replace(produce_request(topic, 0, batch), transactional_id="raw")
