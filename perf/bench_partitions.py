"""Measure one consumer reading a topic of many partitions: topic opens and closes, and time.

A program, not a test (issue 30, item 3)::

    .venv/bin/python perf/bench_partitions.py                  # 600 partitions (~1 min)
    .venv/bin/python perf/bench_partitions.py --partitions 200 --config max.open.topics=50

Each Kafka partition is a luxun topic, and the broker keeps at most ``max.open.topics``
of them open. One broker (``python -m luxun.cli serve --kafka-port N``, fresh data dir on
127.0.0.1) gets a topic of ``--partitions`` partitions made by CreateTopics (kafka-python's
admin client) and ``--records`` records in each; then, one after the other, a kafka-python
and a confluent-kafka consumer assign every partition from offset 0 and read until they
hold every record (``read``), then keep polling for ``--steady-seconds`` with nothing new
(``steady``: a caught-up consumer, its Fetches answered empty after their wait). For
each phase: its time, the Fetch requests the broker answered, and the deltas of
``luxun_topic_opens_total`` and ``luxun_topic_lru_closes_total`` (/metrics). The
broker's open descriptors and RSS are read from /proc at the end of each phase.

Bounded: each read stops after ``--seconds``; the steady phase is ``--steady-seconds``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from _common import REPO, dist_versions, free_port, machine_info, port_answers

TOPIC = "many"
_METRIC = re.compile(r"^(luxun_[a-z_]+)(\{[^}]*\})? (\S+)$", re.M)


def metrics(port: int) -> dict[str, float]:
    """The broker's unlabelled metrics, and Fetch requests as ``fetches``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {"fetches": 0.0}
    for name, labels, value in _METRIC.findall(text):
        if not labels:
            out[name] = float(value)
        elif name == "luxun_kafka_requests_total" and 'api_key="1"' in labels:
            out["fetches"] += float(value)
    return out


def proc_figures(pid: int) -> dict[str, int]:
    """Open descriptors, mappings and RSS (KiB) of process ``pid``."""
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    maps = len(Path(f"/proc/{pid}/maps").read_text().splitlines())
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return {"fds": fds, "maps": maps, "rss_kib": rss}


def read_kafka_python(bootstrap: str, partitions: int, expected: int, args: argparse.Namespace, port: int) -> Any:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=500)
    consumer.assign([TopicPartition(TOPIC, p) for p in range(partitions)])
    consumer.seek_to_beginning()

    def poll() -> int:
        return sum(len(v) for v in consumer.poll(timeout_ms=200).values())

    try:
        return phases(poll, expected, args, port)
    finally:
        consumer.close()


def read_confluent(bootstrap: str, partitions: int, expected: int, args: argparse.Namespace, port: int) -> Any:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(partitions)])

    def poll() -> int:
        return sum(1 for m in consumer.consume(1000, timeout=0.2) if m.error() is None)

    try:
        return phases(poll, expected, args, port)
    finally:
        consumer.close()


def phases(poll: Any, expected: int, args: argparse.Namespace, port: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    before, start, got = metrics(port), time.monotonic(), 0
    while got < expected and time.monotonic() - start < args.seconds:
        got += poll()
    after = metrics(port)
    out["read"] = phase(before, after, time.monotonic() - start, records=got)
    before, start = after, time.monotonic()
    while time.monotonic() - start < args.steady_seconds:
        got += poll()
    out["steady"] = phase(before, metrics(port), time.monotonic() - start, records=got - expected)
    return out


def phase(before: dict[str, float], after: dict[str, float], seconds: float, records: int) -> dict[str, Any]:
    def delta(key: str) -> int:
        return int(after.get(key, 0) - before.get(key, 0))

    return {
        "seconds": round(seconds, 2),
        "records": records,
        "fetches": delta("fetches"),
        "opens": delta("luxun_topic_opens_total"),
        "lru_closes": delta("luxun_topic_lru_closes_total"),
        "open_after": int(after.get("luxun_topics_open", -1)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=600)
    parser.add_argument("--records", type=int, default=3, help="records per partition")
    parser.add_argument("--seconds", type=float, default=60, help="longest read of everything")
    parser.add_argument("--steady-seconds", type=float, default=5)
    parser.add_argument("--config", action="append", default=[], help="a server.properties line (repeatable)")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--keep-log", help="copy the broker's log here")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench_partitions-"))
    conf = root / "server.properties"
    conf.write_text("\n".join(["log.backfile.page.size=1048576", *args.config]) + "\n")
    kafka_port, metrics_port, port = free_port(), free_port(), free_port()
    command = [
        sys.executable, "-m", "luxun.cli", "serve", "--config", str(conf),
        "--data-dir", str(root / "data"), "--host", "127.0.0.1", "--port", str(port),
        "--metrics-port", str(metrics_port), "--kafka-port", str(kafka_port),
    ]  # fmt: skip
    log = open(root / "broker.log", "wb")  # noqa: SIM115 - closed below
    broker = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=log)
    report: dict[str, Any] = {
        "machine": machine_info(root, **dist_versions(["kafka-python", "confluent-kafka"])),
        "partitions": args.partitions,
        "records_per_partition": args.records,
        "config": args.config,
    }
    try:
        deadline = time.monotonic() + 20
        while not (port_answers("127.0.0.1", port) and port_answers("127.0.0.1", kafka_port)):
            if broker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"broker did not start:\n{(root / 'broker.log').read_text()}")
            time.sleep(0.05)
        bootstrap = f"127.0.0.1:{kafka_port}"
        from kafka import KafkaProducer
        from kafka.admin import KafkaAdminClient, NewTopic

        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic(TOPIC, num_partitions=args.partitions, replication_factor=1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        start = time.monotonic()
        for p in range(args.partitions):
            for i in range(args.records):
                producer.send(TOPIC, value=b"p%d-r%d" % (p, i), partition=p)
        producer.flush(60)
        producer.close()
        report["produce_seconds"] = round(time.monotonic() - start, 2)
        report["after_produce"] = {**proc_figures(broker.pid), **metrics(metrics_port)}
        expected = args.partitions * args.records
        for name, read in (("kafka-python", read_kafka_python), ("confluent-kafka", read_confluent)):
            report[name] = read(bootstrap, args.partitions, expected, args, metrics_port)
            report[name]["broker"] = proc_figures(broker.pid)
    finally:
        broker.terminate()
        broker.wait(30)
        log.close()
        text = (root / "broker.log").read_text(errors="replace")
        report["broker_log"] = {
            "too_many_open_files": text.count("Too many open files"),
            "tracebacks": text.count("Traceback"),
            "errors": text.count(" ERROR "),
        }
        if args.keep_log:
            shutil.copy(root / "broker.log", args.keep_log)
        shutil.rmtree(root, ignore_errors=True)

    print(f"{args.partitions} partitions x {args.records} records, config {args.config or 'default'}")
    print(f"produce: {report['produce_seconds']} s; after it: {report['after_produce']['fds']} fds")
    print(f"{'client':16} {'phase':7} {'s':>6} {'records':>8} {'fetches':>8} {'opens':>7} {'closes':>7} {'open':>5}")
    for name in ("kafka-python", "confluent-kafka"):
        for ph in ("read", "steady"):
            r = report[name][ph]
            print(
                f"{name:16} {ph:7} {r['seconds']:>6} {r['records']:>8} {r['fetches']:>8} {r['opens']:>7}"
                f" {r['lru_closes']:>7} {r['open_after']:>5}"
            )
        b = report[name]["broker"]
        print(f"{'':16} broker: {b['fds']} fds, {b['maps']} mappings, RSS {b['rss_kib'] / 1024:.0f} MiB")
    print(f"broker log: {report['broker_log']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
