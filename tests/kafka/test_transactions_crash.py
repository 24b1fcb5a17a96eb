"""Transactions across a kill -9 of the broker: an open transaction is aborted at the
restart (never half visible), one whose commit was decided (PrepareCommit in the state
file) but whose markers were not written is completed, offsets with it."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from luxun.kafka.transactions import STATE_FILE

from ._kafka import RawClient, request
from ._txn import read_all, transactional_producer, txn_broker, values

pytestmark = pytest.mark.timeout(120)


def _open_transaction(bootstrap: str, tid: str, topic: str) -> object:
    """A transaction with records in both partitions of ``topic``, stored, not ended."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(20)
    producer = transactional_producer(bootstrap, tid, **{"message.timeout.ms": 5000})
    producer.begin_transaction()
    for i in range(6):
        producer.produce(topic, value=b"r%d" % i, partition=i % 2)
    assert producer.flush(20) == 0
    return producer


def test_an_open_transaction_is_aborted_when_the_broker_restarts(tmp_path: Path) -> None:
    broker = txn_broker(tmp_path).start()
    try:
        producer = _open_transaction(broker.bootstrap, "tx-crash", "crash")
        assert read_all(broker.bootstrap, "crash", committed=True, partitions=2) == []
        broker.stop(signal.SIGKILL)
        del producer
        broker.start()
        assert read_all(broker.bootstrap, "crash", committed=True, partitions=2) == []  # not held back: aborted
        assert sorted(values(read_all(broker.bootstrap, "crash", committed=False, partitions=2))) == [
            b"r%d" % i for i in range(6)
        ]
        # The id lives on with a new epoch; a new producer commits through it.
        again = transactional_producer(broker.bootstrap, "tx-crash")
        again.begin_transaction()
        again.produce("crash", value=b"after", partition=1)
        again.commit_transaction(20)
        assert values(read_all(broker.bootstrap, "crash", committed=True, partitions=2)) == [b"after"]
        # A second restart (clean this time) keeps all of it: the txn index was reloaded.
        broker.stop()
        broker.start()
        assert values(read_all(broker.bootstrap, "crash", committed=True, partitions=2)) == [b"after"]
    finally:
        broker.stop()


def test_a_commit_decided_before_the_crash_is_completed_at_the_restart(tmp_path: Path) -> None:
    """The crash point between EndTxn's PrepareCommit line and its markers, made by
    writing that line after the kill: what the state file holds if the broker died
    right after persisting the decision."""
    from confluent_kafka import Consumer, TopicPartition

    broker = txn_broker(tmp_path).start()
    try:
        producer = _open_transaction(broker.bootstrap, "tx-prepared", "prepared")
        broker.stop(signal.SIGKILL)
        del producer
        state = tmp_path / "data" / STATE_FILE
        last = json.loads(state.read_text().splitlines()[-1])
        assert last["id"] == "tx-prepared" and last["state"] == "Ongoing"
        assert sorted(last["partitions"]) == ["prepared", "prepared~1"]
        last["state"] = "PrepareCommit"
        last["offsets"] = {"prep-group": [["prepared", 0, 2, "m"]]}
        with state.open("a") as f:
            f.write(json.dumps(last) + "\n" + '{"id": "torn", "pi')  # and a torn last line
        broker.start()
        assert sorted(values(read_all(broker.bootstrap, "prepared", committed=True, partitions=2))) == [
            b"r%d" % i for i in range(6)
        ]
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "prep-group"})
        try:
            (committed,) = consumer.committed([TopicPartition("prepared", 0)], 10)
            assert committed.offset == 2
        finally:
            consumer.close()
        assert "1 interrupted transactions finished" in broker.log()
        with RawClient(broker.kafka_port) as raw:  # the old epoch is fenced
            pid, epoch = last["pid"], last["epoch"] - 1
            old = raw.call(
                request(26, 3, transactional_id="tx-prepared", producer_id=pid, producer_epoch=epoch, committed=True)
            )
            assert old.error_code == 90
    finally:
        broker.stop()
