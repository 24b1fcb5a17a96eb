"""Metrics endpoint, status page, the command-line tools and retention."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bigarray.prefetch import PREFETCHER
from idl import luxun_thrift as T
from luxun.broker import Broker
from luxun.config import BrokerConfig
from luxun.topics import TopicManager
from tests._broker import PASSWORD, free_port
from tests._retention import make_maintenance

pytestmark = pytest.mark.timeout(120)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_metrics_status_page_and_topics_json(broker_factory: Any) -> None:
    broker = broker_factory(metrics=True)
    c = broker.client()
    for _ in range(3):
        c.produce(T.ProduceRequest(item=b"x" * 10, topic="web"))
    c.consume(T.ConsumeRequest(topic="web", fanoutId="reader", maxFetchSize=10))
    c.consume(T.ConsumeRequest(topic="nope", fanoutId="reader", maxFetchSize=10))
    base = f"http://127.0.0.1:{broker.metrics_port}"
    text = get(base + "/metrics")
    assert 'luxun_topic_items_in_total{topic="web"} 3' in text
    assert 'luxun_topic_bytes_in_total{topic="web"} 30' in text
    assert 'luxun_topic_items_out_total{topic="web"} 1' in text
    assert 'luxun_group_lag_items{topic="web",group="reader"} 2' in text
    assert 'luxun_requests_total{method="produce"} 3' in text
    assert 'luxun_request_errors_total{method="consume",code="TOPIC_NOT_EXIST"} 1' in text
    assert 'luxun_request_duration_seconds_count{method="produce"} 3' in text
    assert "# TYPE luxun_request_duration_seconds histogram" in text
    # what the broker held when it started is kept out of the collector's full passes
    frozen = re.search(r"^luxun_gc_frozen_objects (\d+)$", text, re.MULTILINE)
    assert frozen is not None and int(frozen.group(1)) > 10_000
    assert re.search(r'^python_gc_collections_total\{generation="2"\} \d+$', text, re.MULTILINE)
    page = get(base + "/")
    assert "web" in page and "reader (2)" in page
    rows = json.loads(get(base + "/topics.json"))
    assert [(r["name"], r["size"], r["groups"]) for r in rows] == [("web", 3, [["reader", 2]])]
    c.close()


def test_the_queue_port_accepts_only_once_metrics_and_kafka_ports_do(tmp_path: Path) -> None:
    """Clients (and our tests) take a connectable QueueService port as "the broker is up":
    until start() it refuses, and from then on the other ports accept as well."""
    ports = [free_port() for _ in range(3)]
    config = BrokerConfig(
        data_dir=str(tmp_path / "data"), host="127.0.0.1", port=ports[0], metrics_port=ports[1], kafka_port=ports[2]
    )
    broker = Broker(config)
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", ports[0]), timeout=5).close()
        broker.start()
        for port in ports:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        assert json.loads(get(f"http://127.0.0.1:{ports[1]}/topics.json")) == []
    finally:
        broker.stop()


def test_a_broker_never_started_stops_at_once_and_frees_its_ports(tmp_path: Path) -> None:
    """A program that builds a Broker and gives up before start() (or whose start() failed)
    calls stop(): it must return, close the topics and give every port back."""
    ports = [free_port() for _ in range(3)]
    config = BrokerConfig(
        data_dir=str(tmp_path / "data"), host="127.0.0.1", port=ports[0], metrics_port=ports[1], kafka_port=ports[2]
    )
    broker = Broker(config)
    stopper = threading.Thread(target=broker.stop, daemon=True)
    stopper.start()
    stopper.join(20)
    assert not stopper.is_alive(), "Broker.stop() before start() hangs"
    for port in ports:  # bindable again: nothing of the broker holds them
        with socket.socket() as again:
            again.bind(("127.0.0.1", port))
    reopened = Broker(config)  # the data dir was released too
    reopened.start()
    reopened.stop()


def run_cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "luxun", *args], input=stdin, capture_output=True, timeout=60)


def test_command_line_tools(broker_factory: Any) -> None:
    broker = broker_factory(metrics=True)
    where = f"127.0.0.1:{broker.port}"
    produced = run_cli("produce", "logs", "--broker", where, stdin=b"one\ntwo\nthree\n")
    assert produced.returncode == 0, produced.stderr
    by_group = run_cli("consume", "logs", "--group", "g", "--broker", where)
    assert (by_group.returncode, by_group.stdout) == (0, b"one\ntwo\nthree\n")
    by_index = run_cli("consume", "logs", "--from-index", "1", "--max", "1", "--broker", where)
    assert by_index.stdout == b"two\n"
    listed = run_cli("topics", "--metrics", f"http://127.0.0.1:{broker.metrics_port}")
    assert listed.returncode == 0 and b"logs" in listed.stdout and b"g (0)" in listed.stdout
    refused = run_cli("delete", "logs", "--password", "nope", "--broker", where)
    assert refused.returncode == 1 and b"AUTHENTICATION_FAILURE" in refused.stderr
    deleted = run_cli("delete", "logs", "--password", PASSWORD, "--broker", where)
    assert deleted.returncode == 0
    missing = run_cli("consume", "logs", "--group", "g", "--broker", where)
    assert missing.returncode == 1 and b"TOPIC_NOT_EXIST" in missing.stderr


def test_serve_refuses_an_unknown_config_key(tmp_path: Path) -> None:
    config = tmp_path / "server.properties"
    config.write_text("brokerid=1\nlog.retention.hourz=5\n")
    done = run_cli("serve", "--config", str(config), "--data-dir", str(tmp_path / "d"), "--port", "0")
    assert done.returncode == 2
    assert b"log.retention.hourz" in done.stderr


def test_time_and_size_retention_and_flush(tmp_path: Path) -> None:
    now = [1_000_000_000]
    topics = TopicManager(str(tmp_path / "data"), data_page_size_bytes=4096)
    try:
        old = topics.get_or_create("old")
        big = topics.get_or_create("big")
        keep = topics.get_or_create("keep")
        # Items appended "two hours ago" and "now" (the array's clock is the wall clock,
        # so judge retention against timestamps read back from the items).
        for i in range(10):
            old.queue.enqueue(b"%d" % i)
            keep.queue.enqueue(b"%d" % i)
        for _ in range(400):
            big.queue.enqueue(b"y" * 100)
        now[0] = old.queue.timestamp(9) + 2 * 3_600_000  # two hours after the last item
        # The read-ahead of big's next page counts against its size: let it be made first
        # (on a loaded machine the prefetch thread can run it after the retention pass).
        assert PREFETCHER.wait_idle(60)
        maintenance = make_maintenance(
            topics,
            retention_hours=1,
            topic_retention_hours={"keep": 5, "big": 5},
            retention_size_bytes=3 * 4096 + 4 * 1024 * 1024,  # index page + 3 data pages
            flush_interval_ms=1,
            clock_ms=lambda: now[0],
        )
        maintenance.run_once(force_cleanup=True)
        assert old.queue.size() == 0  # older than 1 h: trimmed although the topic is tiny
        assert keep.queue.size() == 10  # its own retention is 5 h
        assert big.queue.back_file_size() <= 3 * 4096 + 4 * 1024 * 1024
        assert 0 < big.queue.size() < 400
        assert big.queue.get(big.queue.tail) == b"y" * 100
    finally:
        topics.close()


def test_tune_allocator_applies_unless_the_environment_decides() -> None:
    """`luxun serve` keeps freed buffers for reuse (glibc mallopt) but leaves malloc alone
    when the environment sets it."""
    code = "from luxun.broker import tune_allocator; print(tune_allocator())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.stdout.strip() == "True", done.stderr
    env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.stdout.strip() == "False", done.stderr
