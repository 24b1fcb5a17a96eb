"""Java's ordering across connections, and the clean-shutdown marker.

Java Luxun serves every connection from one selector thread, so a consume is answered
after everything received before it on any connection: its own JUnit integration tests
(LazyInitProducerTest) send a oneway asyncProduce on one connection and consume at once
on another. Ours answers such a consume after that input is applied too (bounded; see
luxun/thrift/service.py). Java also leaves ``.luxun_cleanshutdown`` in its data
directory when it stops cleanly and removes it at start; so does ours.

The Java-driven tests need the Java Luxun 0.6.2 build (``LUXUN_JAVA_PEER``, see
../shared/peers/luxun-java/README.md) and a JDK; they are skipped without them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from idl import luxun_thrift as T
from tests._broker import JAVA_PEER, start_java_luxun

pytestmark = pytest.mark.timeout(300)

ORDER_SOURCE = Path(__file__).resolve().parent / "interop" / "ProduceThenConsumeOrder.java"
MARKER = ".luxun_cleanshutdown"
ROUNDS = 200


def _java_tools() -> tuple[str, str, str]:
    """java, javac and the Java Luxun build's classpath; the test is skipped without them."""
    classpath_file = JAVA_PEER / "build" / "classpath.txt"
    java, javac = shutil.which("java"), shutil.which("javac")
    if not classpath_file.exists():
        pytest.skip(f"no Java Luxun build at {JAVA_PEER} (set LUXUN_JAVA_PEER)")
    if not (java and javac):
        pytest.skip("java/javac (a JDK) is not installed")
    return java, javac, classpath_file.read_text().strip()


def run_order_program(tmp_path: Path, port: int, prefix: str) -> dict[str, Any]:
    """ProduceThenConsumeOrder against ``port``: its report (failures per step)."""
    java, javac, classpath = _java_tools()
    classes = tmp_path / "order-classes"
    if not classes.exists():
        compiled = subprocess.run(
            [javac, "-nowarn", "-d", str(classes), "-cp", classpath, str(ORDER_SOURCE)],
            capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
        assert compiled.returncode == 0, compiled.stderr
    run = subprocess.run(
        [java, "-cp", os.pathsep.join([str(classes), classpath]), "ProduceThenConsumeOrder",
         "127.0.0.1", str(port), prefix, str(ROUNDS)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    lines = [line for line in run.stdout.splitlines() if line.startswith("ORDER ")]
    assert len(lines) == 1, f"exit {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    report: dict[str, Any] = json.loads(lines[0].removeprefix("ORDER "))
    report["exit"] = run.returncode
    return report


# -- a consume on one connection after a oneway produce on another -----------------------------


def test_java_clients_get_every_consume_answered_after_the_produce_sent_before(broker: Any, tmp_path: Path) -> None:
    """LazyInitProducerTest's pattern, 200 rounds: SyncProducer.send (asyncProduce), then
    at once SimpleConsumer's multiConsume of a new topic by index, consume by index and
    consume by group of a shared one, on its own connection. Each sees the send, on ours
    as on the Java broker (run the same way first, as the reference)."""
    _java_tools()
    java_dir = tmp_path / "java"
    java_dir.mkdir()
    proc, port = start_java_luxun(java_dir, java_dir / "data")
    try:
        java = run_order_program(tmp_path, port, "order")
    finally:
        proc.terminate()
        proc.wait(30)
    ours = run_order_program(tmp_path, broker.port, "order")
    print("java:", java, "\nours:", ours)
    assert (java["new_topic_by_index"], java["by_index"], java["by_group"]) == (0, 0, 0), java
    assert (ours["new_topic_by_index"], ours["by_index"], ours["by_group"]) == (0, 0, 0), ours
    assert ours["exit"] == 0
    assert "Traceback" not in broker.log()


def test_thriftpy2_async_produce_then_consume_on_another_connection(broker: Any) -> None:
    """The same race from one Python process: a oneway asyncProduce on one connection,
    then at once a consume on another: a fetch by index of a new topic, one item by
    index and one by group of a shared topic. Every consume sees the produce; with
    idle connections open, an answer with nothing to read still comes at once."""
    producer, consumer = broker.client(), broker.client()
    idle = [broker.client() for _ in range(3)]
    wrong: list[str] = []
    try:
        for round_ in range(ROUNDS):
            topic = f"py-new-{round_}"
            producer.asyncProduce(T.ProduceRequest(item=b"a-%d" % round_, topic=topic))
            producer.asyncProduce(T.ProduceRequest(item=b"b-%d" % round_, topic=topic))
            got = consumer.consume(T.ConsumeRequest(topic=topic, startIndex=0, maxFetchSize=10_000))
            if got.itemList != [b"a-%d" % round_, b"b-%d" % round_]:
                wrong.append(f"round {round_} new topic: {got.result.errorMessage or got.itemList}")
            item = b"m-%d" % round_
            producer.asyncProduce(T.ProduceRequest(item=item, topic="py-shared"))
            got = consumer.consume(T.ConsumeRequest(topic="py-shared", startIndex=round_))
            if got.itemList != [item]:
                wrong.append(f"round {round_} by index: {got.result.errorMessage or got.itemList}")
            got = consumer.consume(T.ConsumeRequest(topic="py-shared", fanoutId="fan", maxFetchSize=10_000))
            if got.itemList != [item]:
                wrong.append(f"round {round_} by group: {got.result.errorMessage or got.itemList}")
        # Nothing pending anywhere (other connections open but idle): an answer with
        # nothing to read is not held back by the ordering wait (0.5 s at most).
        t0 = time.monotonic()
        for _ in range(20):
            got = consumer.consume(T.ConsumeRequest(topic="py-shared", startIndex=ROUNDS, maxFetchSize=100))
            assert got.result.errorCode == T.ErrorCode.ALL_MESSAGE_CONSUMED
            got = consumer.consume(T.ConsumeRequest(topic="py-missing", startIndex=0))
            assert got.result.errorCode == T.ErrorCode.TOPIC_NOT_EXIST
            assert got.itemList is None  # as Java's broker answers it (LogManager.consume)
        assert time.monotonic() - t0 < 5.0
    finally:
        for c in [producer, consumer, *idle]:
            c.close()
    assert not wrong, f"{len(wrong)} of {3 * ROUNDS} consumes missed the produce sent before: {wrong[:5]}"


# -- .luxun_cleanshutdown: as Java Luxun leaves it -----------------------------------------------


def marker_states(start: Any, stop: Any, data: Path) -> list[tuple[str, bool, bytes | None]]:
    """Where the marker is through start, stop, start (with a marker), kill -9."""
    marker = data / MARKER

    def state(when: str) -> tuple[str, bool, bytes | None]:
        return when, marker.exists(), marker.read_bytes() if marker.exists() else None

    states = []
    handle = start()
    states.append(state("running, fresh directory"))
    stop(handle, signal.SIGTERM)
    states.append(state("after SIGTERM"))
    handle = start()
    states.append(state("running again"))
    stop(handle, signal.SIGKILL)
    states.append(state("after SIGKILL"))
    return states


def test_the_clean_shutdown_marker_is_where_java_leaves_it(broker_factory: Any, tmp_path: Path) -> None:
    """Java: no marker while running (removed at start), an empty one after a clean
    stop, none after a kill. Ours the same, compared with the Java broker's own run."""
    _java_tools()
    java_dir = tmp_path / "java"
    java_dir.mkdir()
    java_data = java_dir / "data"

    def start_j() -> Any:
        return start_java_luxun(java_dir, java_data)[0]

    def stop_j(proc: Any, sig: int) -> None:
        proc.send_signal(sig)
        proc.wait(30)

    java = marker_states(start_j, stop_j, java_data)
    ours_data = tmp_path / "ours"
    ours = marker_states(lambda: broker_factory(data_dir=ours_data), lambda b, sig: b.stop(sig), ours_data)
    print("java:", java, "\nours:", ours)
    assert ours == java
    assert java == [
        ("running, fresh directory", False, None),
        ("after SIGTERM", True, b""),
        ("running again", False, None),
        ("after SIGKILL", False, None),
    ]
