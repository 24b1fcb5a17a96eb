"""Topic lifecycle under concurrency: deleteTopic racing produce, consume, long polls
and re-creation of the same topic; a topic never visible empty while it is created."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from thriftpy2.protocol.cybin import TCyBinaryProtocol
from thriftpy2.thrift import TMessageType
from thriftpy2.transport.memory import TCyMemoryBuffer

from idl import QueueService
from idl import luxun_thrift as T
from tests._broker import PASSWORD

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
#: The Java Luxun 0.6.2 build (see the peers README); only for the Java-driven test.
JAVA_PEER = Path(os.environ.get("LUXUN_JAVA_PEER", ROOT / ".peers" / "luxun-java"))
ASYNC_RACE_SOURCE = Path(__file__).resolve().parent / "interop" / "AsyncProducerRace.java"

OK, FAILURE, TRY_LATER = T.ResultCode.SUCCESS, T.ResultCode.FAILURE, T.ResultCode.TRY_LATER
E = T.ErrorCode


def async_frame(topic: str, item: bytes) -> bytes:
    """One framed oneway asyncProduce call, as thriftpy2 writes it."""
    proto = TCyBinaryProtocol(TCyMemoryBuffer())
    proto.write_message_begin("asyncProduce", TMessageType.ONEWAY, 1)
    QueueService.asyncProduce_args(produceRequest=T.ProduceRequest(item=item, topic=topic)).write(proto)
    proto.write_message_end()
    body = bytes(proto.trans.getvalue())
    return struct.pack(">i", len(body)) + body


def small_pages(tmp_path: Path, *lines: str) -> str:
    config = tmp_path / "server.properties"
    config.write_text("\n".join(["log.backfile.page.size=65536", *lines]) + "\n")
    return str(config)


def tracebacks(log: str) -> list[str]:
    lines = log.splitlines()
    return [lines[i - 1] if i else line for i, line in enumerate(lines) if line.startswith("Traceback")]


# -- a topic is never visible empty because it is being created -----------------------------------


def test_async_burst_then_consume_on_a_new_connection_never_sees_an_empty_topic(broker: Any) -> None:
    """Java's async Producer: a burst of oneway asyncProduce calls, close, then a
    consume by index 0 on a new connection at once. The consume must never find the
    topic created but still empty (TOPIC_IS_EMPTY) while its first batch is appended,
    nor missing (TOPIC_NOT_EXIST) while the burst's connection still holds its frames."""
    reader = broker.client()
    deleter = broker.client()
    answers: dict[str, int] = {}
    for round_ in range(30):
        topic = f"burst-{round_}"
        frames = b"".join(async_frame(topic, b"m-%03d" % i) for i in range(50))
        with socket.create_connection(("127.0.0.1", broker.port)) as s:
            s.sendall(frames)
        consumer = broker.client()
        response = consumer.consume(T.ConsumeRequest(topic=topic, startIndex=0, maxFetchSize=1 << 20))
        consumer.close()
        code = response.result.errorCode
        name = "OK" if code is None else E._VALUES_TO_NAMES[code]
        answers[name] = answers.get(name, 0) + 1
        # Neither empty (created before its first batch was in) nor missing (its
        # frames, sent before this consume, still unprocessed on their connection).
        assert code is None, f"round {round_}: {response.result.errorMessage} ({answers})"
        assert response.itemList == [b"m-%03d" % i for i in range(len(response.itemList))]
        # Everything arrives in the end, in order.
        deadline = time.monotonic() + 10
        while reader.getSize(T.GetSizeRequest(topic=topic)).size < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        got = reader.consume(T.ConsumeRequest(topic=topic, startIndex=0, maxFetchSize=1 << 20)).itemList
        assert got == [b"m-%03d" % i for i in range(50)]
        assert deleter.deleteTopic(T.DeleteTopicRequest(topic=topic, password=PASSWORD)).result.resultCode == OK
    reader.close()
    deleter.close()
    print("answers of the first consume:", answers)
    assert not tracebacks(broker.log())


def test_burst_then_consume_while_other_connections_keep_the_broker_busy(broker: Any) -> None:
    """The same race with four other connections streaming asyncProduce meanwhile: their
    threads compete for the broker's interpreter, so the burst's thread can be late by
    far more than any fixed grace; the consume must still see the burst's items."""
    stop = threading.Event()

    def stream(n: int) -> None:
        frames = b"".join(async_frame(f"load-{n}", b"x" * 1000) for _ in range(200))
        with socket.create_connection(("127.0.0.1", broker.port)) as s:
            deadline = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < deadline:
                s.sendall(frames)

    loaders = [threading.Thread(target=stream, args=(n,), daemon=True) for n in range(4)]
    for t in loaders:
        t.start()
    try:
        failures = []
        for round_ in range(40):
            topic = f"busy-burst-{round_}"
            with socket.create_connection(("127.0.0.1", broker.port)) as s:
                s.sendall(b"".join(async_frame(topic, b"m-%03d" % i) for i in range(20)))
            consumer = broker.client()
            response = consumer.consume(T.ConsumeRequest(topic=topic, startIndex=0, maxFetchSize=1 << 20))
            consumer.close()
            if response.result.errorCode is not None:
                failures.append((round_, response.result.errorMessage))
            else:
                assert response.itemList == [b"m-%03d" % i for i in range(len(response.itemList))]
    finally:
        stop.set()
        for t in loaders:
            t.join(10)
    assert not failures, f"{len(failures)} of 40 rounds: {failures[:3]}"
    assert not tracebacks(broker.log())


def test_java_async_producer_then_simple_consumer_on_a_new_connection(broker: Any, tmp_path: Path) -> None:
    """The same race driven by Java Luxun's own clients: async Producer (gzip, batches of
    50, 500 messages), close(), then SimpleConsumer.consume(topic, 0, 1 MiB) at once."""
    classpath_file = JAVA_PEER / "build" / "classpath.txt"
    java, javac = shutil.which("java"), shutil.which("javac")
    if not classpath_file.exists():
        pytest.skip(f"no Java Luxun build at {JAVA_PEER} (set LUXUN_JAVA_PEER)")
    if not (java and javac):
        pytest.skip("java/javac (a JDK) is not installed")
    classpath = classpath_file.read_text().strip()
    classes = tmp_path / "classes"
    compiled = subprocess.run(
        [javac, "-nowarn", "-d", str(classes), "-cp", classpath, str(ASYNC_RACE_SOURCE)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr
    run = subprocess.run(
        [java, "-cp", os.pathsep.join([str(classes), classpath]), "AsyncProducerRace",
         "127.0.0.1", str(broker.port), "java-async", "20"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    lines = [line for line in run.stdout.splitlines() if line.startswith("ASYNC_RACE ")]
    assert len(lines) == 1, f"exit {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    report = json.loads(lines[0].removeprefix("ASYNC_RACE "))
    print("messages read right after close(), per round:", report["rounds"])
    assert report["failures"] == 0, report["rounds"]
    assert run.returncode == 0


# -- deleteTopic racing everything else ------------------------------------------------------------


def test_long_poll_on_a_topic_that_gets_deleted_answers_topic_not_exist(broker: Any) -> None:
    c = broker.client()
    c.produce(T.ProduceRequest(item=b"x", topic="doomed"))
    c.consume(T.ConsumeRequest(topic="doomed", fanoutId="g", maxFetchSize=1 << 20))
    results: list[Any] = []

    def wait() -> None:
        poller = broker.client()
        request = T.ConsumeRequest(topic="doomed", fanoutId="g", maxFetchSize=1 << 20, maxWaitMs=5000)
        results.append(poller.consume(request))
        request = T.ConsumeRequest(topic="doomed", startIndex=1, maxFetchSize=1 << 20, maxWaitMs=5000)
        results.append(poller.consume(request))
        poller.close()

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.5)
    assert c.deleteTopic(T.DeleteTopicRequest(topic="doomed", password=PASSWORD)).result.resultCode == OK
    t.join(15)
    c.close()
    first = results[0]
    assert (first.result.resultCode, first.result.errorCode) == (FAILURE, E.TOPIC_NOT_EXIST), first.result
    assert "doomed" in first.result.errorMessage
    assert not tracebacks(broker.log()), broker.log()


def test_a_deleted_topic_re_created_at_once_shares_nothing_with_the_old_one(broker: Any) -> None:
    c = broker.client()
    for round_ in range(20):
        for i in range(30):
            c.produce(T.ProduceRequest(item=b"old-%d-%d" % (round_, i), topic="again"))
        c.consume(T.ConsumeRequest(topic="again", fanoutId="g", maxFetchSize=100))
        assert c.deleteTopic(T.DeleteTopicRequest(topic="again", password=PASSWORD)).result.resultCode == OK
        response = c.produce(T.ProduceRequest(item=b"new-%d" % round_, topic="again"))
        assert (response.result.resultCode, response.index) == (OK, 0)
        assert c.getSize(T.GetSizeRequest(topic="again", fanoutId="g")).size == 1  # the group is new too
        got = c.consume(T.ConsumeRequest(topic="again", startIndex=0, maxFetchSize=1 << 20)).itemList
        assert got == [b"new-%d" % round_]
        assert c.deleteTopic(T.DeleteTopicRequest(topic="again", password=PASSWORD)).result.resultCode == OK
    c.close()
    deadline = time.monotonic() + 10
    while [e for e in os.listdir(broker.data_dir) if e != ".luxun.lock"] and time.monotonic() < deadline:
        time.sleep(0.05)  # deleted topics are removed in the background
    assert [e for e in os.listdir(broker.data_dir) if e != ".luxun.lock"] == []


def test_leftover_deleted_topic_directories_are_removed_at_start(broker_factory: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    trash = data / ".luxun-deleted-0123456789abcdef"
    (trash / "index").mkdir(parents=True)
    (trash / "index" / "page-0.dat").write_bytes(b"\0" * 32)
    broker = broker_factory(data_dir=data)
    c = broker.client()
    assert not trash.exists()
    assert "removed a deleted topic's directory" in broker.log()
    # Names of that form are the broker's own: refused as topics.
    response = c.produce(T.ProduceRequest(item=b"x", topic=".luxun-deleted-abc"))
    assert (response.result.resultCode, response.result.errorCode) == (FAILURE, E.INVALID_TOPIC)
    c.close()


def contested_round(broker: Any, topic: str, round_: int, rng: random.Random) -> tuple[list[bytes], set[bytes]]:
    """One round of produce, consume, long-poll and delete of ``topic`` from many
    connections; ``(items acknowledged that started after the last delete answered,
    items acknowledged before the last delete was sent)``."""
    stop = threading.Event()
    lock = threading.Lock()
    produced: list[tuple[bytes, int, int]] = []  # (item, started ns, acknowledged ns)
    deletes: list[tuple[int, int]] = []  # (sent ns, answered ns) of successful deletes
    errors: list[str] = []

    def producer(worker: int) -> None:
        c = broker.client()
        try:
            i = 0
            while not stop.is_set() and i < 4000:
                value = b"r%d-w%d-%06d-" % (round_, worker, i) + b"x" * rng.randrange(0, 3000)
                i += 1
                start = time.monotonic_ns()
                response = c.produce(T.ProduceRequest(item=value, topic=topic))
                if response.result.resultCode == OK:
                    with lock:
                        produced.append((value, start, time.monotonic_ns()))
                elif response.result.errorCode != E.TOPIC_NOT_EXIST:
                    errors.append(f"produce: {response.result}")
        finally:
            c.close()

    def consumer(worker: int) -> None:
        c = broker.client()
        try:
            index = 0
            while not stop.is_set():
                if worker % 3 == 0:
                    request = T.ConsumeRequest(topic=topic, fanoutId=f"g{worker}", maxFetchSize=20_000)
                elif worker % 3 == 1:
                    request = T.ConsumeRequest(topic=topic, fanoutId=f"g{worker}", maxFetchSize=20_000, maxWaitMs=300)
                else:
                    request = T.ConsumeRequest(topic=topic, startIndex=index, maxFetchSize=20_000, maxWaitMs=200)
                response = c.consume(request)
                code = response.result.errorCode
                if code is None:
                    if request.startIndex is not None:
                        index = response.lastConsumedIndex + 1
                elif code == E.INDEX_OUT_OF_BOUNDS:
                    index = 0
                elif code not in (E.TOPIC_NOT_EXIST, E.TOPIC_IS_EMPTY, E.ALL_MESSAGE_CONSUMED):
                    errors.append(f"consume: {response.result}")
                c.getSize(T.GetSizeRequest(topic=topic, fanoutId=f"g{worker}"))
        finally:
            c.close()

    def deleter() -> None:
        c = broker.client()
        try:
            for _ in range(6):
                time.sleep(rng.uniform(0.05, 0.3))
                sent = time.monotonic_ns()
                response = c.deleteTopic(T.DeleteTopicRequest(topic=topic, password=PASSWORD))
                if response.result.resultCode == OK:
                    deletes.append((sent, time.monotonic_ns()))
                else:
                    errors.append(f"delete: {response.result}")
        finally:
            c.close()

    threads = [threading.Thread(target=producer, args=(w,)) for w in range(4)]
    threads += [threading.Thread(target=consumer, args=(w,)) for w in range(6)]
    del_thread = threading.Thread(target=deleter)
    for t in threads:
        t.start()
    del_thread.start()
    del_thread.join(60)
    time.sleep(0.3)  # produce on after the last delete
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors[:5]
    assert deletes, "no delete succeeded"
    last_sent, last_answered = deletes[-1]
    after = [v for v, started, _ in produced if started > last_answered]
    before = {v for v, _, acked in produced if acked < last_sent}
    return after, before


def test_delete_racing_produce_consume_long_poll_and_re_creation(broker_factory: Any, tmp_path: Path) -> None:
    """Many connections produce, consume (by group and by index), long-poll and delete
    one topic at once, in rounds. After the last delete of each round, every produce
    that started after it and was acknowledged must survive a clean restart, and
    nothing produced before it may."""
    broker = broker_factory("--config", small_pages(tmp_path))
    topic = "contested"
    rng = random.Random(9)
    for round_ in range(4):
        after, before = contested_round(broker, topic, round_, rng)
        print(f"round {round_}: {len(after)} items acknowledged after the last delete, {len(before)} before it")
        assert after, "nothing was produced after the last delete"
        assert broker.stop() == 0
        broker.start()
        c = broker.client()
        size = c.getSize(T.GetSizeRequest(topic=topic)).size
        stored: list[bytes] = []
        while len(stored) < size:
            stored += c.consume(T.ConsumeRequest(topic=topic, startIndex=len(stored), maxFetchSize=1 << 20)).itemList
        c.close()
        stored_set = set(stored)
        missing = [v[:20] for v in after if v not in stored_set]
        assert not missing, f"round {round_}: {len(missing)} of {len(after)} acknowledged items lost: {missing[:3]}"
        resurrected = [v[:20] for v in stored if v in before]
        assert not resurrected, f"round {round_}: {len(resurrected)} items from before the delete: {resurrected[:3]}"
        log = broker.log()
        assert not tracebacks(log), "\n".join(tracebacks(log)[:5])
        for bad in ("FileNotFoundError", "ArrayLockedError", "INTERNAL_ERROR"):
            assert bad not in log, bad


def test_a_re_created_topic_gets_no_page_file_from_the_old_ones_read_ahead(tmp_path: Path) -> None:
    """The old topic's queued read-ahead jobs (page files it was about to use) must not
    run in the new topic's directory once the name is re-used."""
    from bigarray.prefetch import PREFETCHER
    from luxun.topics import TopicManager

    busy = TopicManager(str(tmp_path / "busy"), data_page_size_bytes=32 << 20)
    topics = TopicManager(str(tmp_path / "data"), data_page_size_bytes=1 << 20)
    try:
        for round_ in range(3):
            for k in range(6):  # keep the one read-ahead thread busy with 32 MiB pages
                busy.create_and_append(f"b{round_}-{k}", [b"z"])
            topics.create_and_append("t", [b"y" * 700_000] * 6)  # queues read-ahead of its next pages
            assert topics.delete("t")
            topics.create_and_append("t", [b"new"])
            deadline = time.monotonic() + 20
            while not PREFETCHER._jobs.empty() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.2)
            for sub in ("data", "index"):
                assert sorted(os.listdir(tmp_path / "data" / "t" / sub)) == ["page-0.dat"], (round_, sub)
            assert topics.delete("t")
            for k in range(6):
                busy.delete(f"b{round_}-{k}")
    finally:
        topics.close()
        busy.close()
