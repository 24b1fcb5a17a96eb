"""Exactly once through a consume-transform-produce loop killed at random points: a
worker process (``_ctp_worker.py``: confluent-kafka, read_committed input, outputs and
input offsets in one transaction) is killed with SIGKILL a few times, the broker once
too, each restarted; at the end a read_committed reader finds each input record's
output exactly once."""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from luxun.kafka.protocol import build, request_schema
from tests._broker import BrokerProcess

from ._kafka import RawClient
from ._txn import read_all, txn_broker

pytestmark = pytest.mark.timeout(300)

TOTAL = 600
ROUNDS = 6


def test_every_input_record_is_output_exactly_once_across_kills(tmp_path: Path) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = txn_broker(tmp_path).start()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    worker_log = (tmp_path / "worker.log").open("ab")

    def worker() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.kafka._ctp_worker", broker.bootstrap, str(TOTAL)],
            cwd=root, env=env, stdout=worker_log, stderr=worker_log,
        )  # fmt: skip

    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for topic in ("ctp-in", "ctp-out"):
            admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(20)
        source = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(TOTAL):
            source.produce("ctp-in", value=b"%d" % i, partition=i % 2)
        assert source.flush(20) == 0
        rng = random.Random(int.from_bytes(os.urandom(4), "big"))
        finished_early = 0
        for round_ in range(ROUNDS):
            proc = worker()
            time.sleep(rng.uniform(0.8, 2.5))
            if round_ == ROUNDS // 2:  # the broker dies in the middle of the loop too
                broker.stop(signal.SIGKILL)
                broker.start()
                time.sleep(rng.uniform(0.5, 1.5))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            else:
                finished_early += 1
            proc.wait(20)
        assert finished_early < ROUNDS, "no kill hit the loop: it finished before the first"
        proc = worker()
        assert proc.wait(150) == 0, (tmp_path / "worker.log").read_text(errors="replace")[-3000:]
        out = read_all(broker.bootstrap, "ctp-out", committed=True, partitions=2, timeout_s=60)
        counts = collections.Counter(v for _p, _o, v in out)
        missing = sorted(set(b"out-%d" % i for i in range(TOTAL)) - set(counts))
        assert not missing, f"inputs without output: {missing}; {_ends(broker)}; output by offset {sorted(out)}"
        assert [v for v, n in counts.items() if n > 1] == [], "an output appears more than once"
        # The kills did cut open transactions: their outputs are stored, aborted (read_uncommitted sees them).
        uncommitted = read_all(broker.bootstrap, "ctp-out", committed=False, partitions=2, timeout_s=60)
        assert len(uncommitted) > len(out), "no kill landed inside a transaction with stored records"
    finally:
        worker_log.close()
        broker.stop()


def _ends(broker: BrokerProcess) -> dict[str, list[int]]:
    """Each partition of ctp-out's latest offset by isolation level (LSO, high watermark)."""
    ends: dict[str, list[int]] = {}
    with RawClient(broker.kafka_port) as raw:
        for isolation in (1, 0):
            answer = raw.call(
                build(request_schema(2, 5), replica_id=-1, isolation_level=isolation,
                      topics=[{"name": "ctp-out", "partitions": [{"partition_index": p, "timestamp": -1}
                                                                 for p in range(2)]}])
            )  # fmt: skip
            ends[f"isolation {isolation}"] = [int(p.offset) for p in answer.topics[0].partitions]
    return ends
