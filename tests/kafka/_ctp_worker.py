"""A consume-transform-produce worker (run as its own process by
test_transactions_loop.py): reads ``ctp-in`` as group ``ctp`` (read_committed, from the
group's committed offsets), writes ``out-<value>`` for each record to ``ctp-out`` and
sends the input offsets to the same transaction; exits 0 once every one of ``total``
input records is committed. Usage: ``python -m tests.kafka._ctp_worker BOOTSTRAP TOTAL``."""

from __future__ import annotations

import sys
import time

from confluent_kafka import OFFSET_STORED, Consumer, Producer, TopicPartition

PARTITIONS = 2


def main(bootstrap: str, total: int) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ctp",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "ctp-worker", "linger.ms": 2})
    producer.init_transactions(30)
    consumer.assign([TopicPartition("ctp-in", p, OFFSET_STORED) for p in range(PARTITIONS)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        committed = consumer.committed([TopicPartition("ctp-in", p) for p in range(PARTITIONS)], 10)
        if sum(max(0, tp.offset) for tp in committed) >= total:
            return 0
        batch = [m for m in consumer.consume(10, 0.5) if m.error() is None]
        if not batch:
            continue
        producer.begin_transaction()
        for m in batch:
            producer.produce("ctp-out", value=b"out-" + m.value(), partition=m.partition())
        producer.flush(30)  # stored while the transaction is open: a kill now leaves them to abort
        time.sleep(0.05)  # the "transform" time, where kills land
        positions = consumer.position([TopicPartition("ctp-in", p) for p in range(PARTITIONS)])
        producer.send_offsets_to_transaction(
            [tp for tp in positions if tp.offset >= 0], consumer.consumer_group_metadata(), 30
        )
        producer.commit_transaction(30)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
