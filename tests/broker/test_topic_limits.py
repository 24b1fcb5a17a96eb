"""Bounded topics: thousands of topics under a 1,024 file-descriptor limit (only
recently used topics stay open), file-descriptor exhaustion that leaves nothing
half-created and never stops a restart, ``auto.create.topics.enable`` and
``max.topics``."""

from __future__ import annotations

import json
import os
import resource
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idl import luxun_thrift as T
from luxun.config import BrokerConfig, ConfigError
from luxun.metrics import Metrics
from luxun.thrift.service import QueueHandler
from luxun.topics import QueueSnapshot, TopicManager
from tests._broker import PASSWORD
from tests._retention import make_maintenance

pytestmark = pytest.mark.timeout(600)

OK, FAILURE = T.ResultCode.SUCCESS, T.ResultCode.FAILURE
E = T.ErrorCode


def nofile(soft: int, hard: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


def config_file(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "server.properties"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def topic_dirs(data: Path) -> set[str]:
    return {e for e in os.listdir(data) if not e.startswith(".luxun")}


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def start(tmp_path: Path, data: Path, *extra: str, preexec_fn: Callable[[], None] | None = None, n: int = 0) -> Any:
    from tests._broker import BrokerProcess

    return BrokerProcess(data, tmp_path / f"broker-{n}.log", *extra, preexec_fn=preexec_fn).start()


# -- many topics, few descriptors --------------------------------------------------------------------


def test_two_thousand_topics_under_a_1024_descriptor_limit(tmp_path: Path) -> None:
    data = tmp_path / "data"
    conf = config_file(tmp_path, "log.backfile.page.size=4096")
    limit = nofile(1024, 1024)
    broker = start(tmp_path, data, "--config", conf, preexec_fn=limit)
    try:
        c = broker.client()
        for i in range(2000):
            response = c.produce(T.ProduceRequest(item=b"item-%d" % i, topic=f"t{i:04d}"))
            assert response.result.resultCode == OK, (i, response.result)
        most_fds = open_fds(broker.proc.pid)
        for i in range(2000):
            topic = f"t{i:04d}"
            got = c.consume(T.ConsumeRequest(topic=topic, fanoutId="g", maxFetchSize=1 << 20)).itemList
            assert got == [b"item-%d" % i], topic
            assert c.getSize(T.GetSizeRequest(topic=topic, fanoutId="g")).size == 0
        most_fds = max(most_fds, open_fds(broker.proc.pid))
        c.close()
        assert broker.stop() == 0
        assert len(topic_dirs(data)) == 2000
        broker.start()  # (the same limit)
        c = broker.client()
        for i in range(0, 2000, 7):
            topic = f"t{i:04d}"
            got = c.consume(T.ConsumeRequest(topic=topic, startIndex=0, maxFetchSize=1 << 20)).itemList
            assert got == [b"item-%d" % i], topic
            # the group's position survived close, reopen and restart
            assert c.getSize(T.GetSizeRequest(topic=topic, fanoutId="g")).size == 0
            assert c.produce(T.ProduceRequest(item=b"more", topic=topic)).index == 1
        c.close()
        log = broker.log()
        assert "[Errno 24]" not in log  # EMFILE
        assert "Traceback" not in log
        # max.open.topics unset: sized from the limit, (1024 - 256) // 13 topics
        assert "max.open.topics: 59 (sized from the file descriptor limit 1024" in log
        print(f"most descriptors open in the broker: {most_fds} (limit 1024)")
    finally:
        broker.stop()
        shutil.rmtree(data, ignore_errors=True)  # ~8 GB of pre-allocated index pages


def test_descriptor_exhaustion_leaves_no_half_created_topic_and_a_restart_works(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # Room for the broker itself and a few topics only; no LRU to save the day.
    conf = config_file(tmp_path, "log.backfile.page.size=4096", "max.open.topics=100000")
    limit = nofile(60, 60)
    broker = start(tmp_path, data, "--config", conf, preexec_fn=limit)
    try:
        c = broker.client()
        created: list[str] = []
        refused = 0
        for i in range(40):
            topic = f"t{i}"
            response = c.produce(T.ProduceRequest(item=b"x%d" % i, topic=topic))
            if response.result.resultCode == OK:
                created.append(topic)
            else:
                refused += 1
                assert response.result.errorCode == E.INTERNAL_ERROR
                assert "Too many open files" in response.result.errorMessage, response.result
        assert refused, "the descriptor limit was never reached"
        assert created, "no topic could be created at all"
        c.close()
        deadline = time.monotonic() + 10  # the remains of failed creations go in the background
        while topic_dirs(data) != set(created) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert topic_dirs(data) == set(created)
        assert broker.stop() == 0
        broker.start()
        c = broker.client()
        for i, topic in enumerate(created):
            got = c.consume(T.ConsumeRequest(topic=topic, startIndex=0, maxFetchSize=1 << 20)).itemList
            assert got == [b"x%s" % topic[1:].encode()], (i, topic)
        c.close()
        # Errors were logged, rate-limited: far fewer lines than failures.
        assert broker.log().count("Too many open files") < refused + 5
    finally:
        broker.stop()


def test_a_full_disk_logs_one_line_per_interval_and_creates_nothing(tmp_path: Path) -> None:
    """RLIMIT_FSIZE below the data page size: every first append of a new topic fails
    as on a full disk (EFBIG). Each produce is answered; the log gets one line per 10 s
    with a count of the suppressed ones, and no half-created topic is left."""
    data = tmp_path / "data"
    conf = config_file(tmp_path, "log.backfile.page.size=16777216")

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, 8 << 20))

    broker = start(tmp_path, data, "--config", conf, preexec_fn=limits)
    try:
        c = broker.client()
        for i in range(200):
            response = c.produce(T.ProduceRequest(item=b"x", topic=f"full{i % 3}"))
            assert (response.result.resultCode, response.result.errorCode) == (FAILURE, E.INTERNAL_ERROR)
        c.close()
        lines = [line for line in broker.log().splitlines() if "produce to topic" in line]
        assert 1 <= len(lines) <= 2, lines
        deadline = time.monotonic() + 10
        while topic_dirs(data) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert topic_dirs(data) == set()
    finally:
        broker.stop()


# -- auto.create.topics.enable and max.topics ----------------------------------------------------------


def test_auto_create_off_refuses_unknown_topics_only(broker_factory: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = broker_factory(data_dir=data)
    c = first.client()
    assert c.produce(T.ProduceRequest(item=b"a", topic="known")).result.resultCode == OK
    c.close()
    first.stop()
    broker = broker_factory("--config", config_file(tmp_path, "auto.create.topics.enable=false"), data_dir=data)
    c = broker.client()
    response = c.produce(T.ProduceRequest(item=b"x", topic="unknown"))
    assert (response.result.resultCode, response.result.errorCode) == (FAILURE, E.TOPIC_NOT_EXIST)
    assert "auto.create.topics.enable" in response.result.errorMessage
    assert "unknown" in response.result.errorMessage
    c.asyncProduce(T.ProduceRequest(item=b"x", topic="unknown-async"))
    assert c.produce(T.ProduceRequest(item=b"b", topic="known")).index == 1
    assert c.getSize(T.GetSizeRequest(topic="unknown-async")).result.errorCode == E.TOPIC_NOT_EXIST
    c.close()
    assert topic_dirs(data) == {"known"}


def test_max_topics_refuses_one_more_with_a_clear_error(broker_factory: Any, tmp_path: Path) -> None:
    broker = broker_factory("--config", config_file(tmp_path, "max.topics=3"))
    c = broker.client()
    for name in ("a", "b", "c"):
        assert c.produce(T.ProduceRequest(item=b"x", topic=name)).result.resultCode == OK
    response = c.produce(T.ProduceRequest(item=b"x", topic="d"))
    assert (response.result.resultCode, response.result.errorCode) == (FAILURE, E.INTERNAL_ERROR)
    assert "max.topics=3" in response.result.errorMessage and "'d'" in response.result.errorMessage
    assert c.produce(T.ProduceRequest(item=b"y", topic="a")).index == 1  # existing ones still take items
    assert c.deleteTopic(T.DeleteTopicRequest(topic="b", password=PASSWORD)).result.resultCode == OK
    assert c.produce(T.ProduceRequest(item=b"x", topic="d")).result.resultCode == OK
    c.close()
    assert topic_dirs(broker.data_dir) == {"a", "c", "d"}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("auto.create.topics.enable", "yes"),
        ("max.topics", "-1"),
        ("max.open.topics", "-1"),
        ("max.open.topics", "many"),
    ],
)
def test_bad_topic_limit_values_are_refused_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        BrokerConfig.from_properties({key: value})


def test_topic_limit_keys_parse() -> None:
    config = BrokerConfig.from_properties(
        {"auto.create.topics.enable": " FALSE ", "max.topics": "10", "max.open.topics": "7"}
    )
    assert (config.auto_create_topics, config.max_topics, config.max_open_topics) == (False, 10, 7)
    default = BrokerConfig()
    assert (default.auto_create_topics, default.max_topics, default.max_open_topics) == (True, 0, 0)  # 0: sized


def test_metrics_show_topics_that_are_not_open(broker_factory: Any, tmp_path: Path) -> None:
    conf = config_file(tmp_path, "max.open.topics=2", "log.backfile.page.size=4096")
    broker = broker_factory("--config", conf, metrics=True)
    c = broker.client()
    for i in range(5):
        for k in range(3):
            c.produce(T.ProduceRequest(item=b"%d" % k, topic=f"m{i}"))
        c.consume(T.ConsumeRequest(topic=f"m{i}", fanoutId="g", maxFetchSize=0))
    c.close()
    base = f"http://127.0.0.1:{broker.metrics_port}"

    def rows() -> list[Any]:
        with urllib.request.urlopen(base + "/topics.json", timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    for _ in range(2):  # live and closed topics; then after a restart, nothing opened yet
        listed = rows()
        assert [r["name"] for r in listed] == [f"m{i}" for i in range(5)]
        for row in listed:
            assert (row["size"], row["head"], row["groups"]) == (3, 3, [["g", 2]]), row
            assert row["disk"] > 0
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'luxun_topic_size_items{topic="m0"} 3' in text
        assert 'luxun_group_lag_items{topic="m0",group="g"} 2' in text
        broker.stop()
        broker.start()
    assert "file descriptor limit" in broker.log()


# -- the open-topic LRU, in process ---------------------------------------------------------------------


def handler_for(topics: TopicManager) -> QueueHandler:
    return QueueHandler(topics, broker_id=0, max_message_size_bytes=1 << 20, password_check=None, metrics=Metrics())


def test_closed_topics_keep_items_groups_and_counters(tmp_path: Path) -> None:
    topics = TopicManager(str(tmp_path / "data"), data_page_size_bytes=4096, max_open_topics=2)
    handler = handler_for(topics)
    try:
        for round_ in range(3):
            for i in range(6):
                result, index = handler.produce_item(f"t{i}", b"%d-%d" % (round_, i))
                assert (result.resultCode, index) == (OK, round_)
                assert len(topics.topics()) <= 2
            for i in range(6):
                response = handler.consume(T.ConsumeRequest(topic=f"t{i}", fanoutId="g", maxFetchSize=1 << 20))
                assert response.itemList == [b"%d-%d" % (round_, i)]
        views = {v.name: v for v in topics.views()}
        assert sorted(views) == [f"t{i}" for i in range(6)]
        for view in views.values():
            assert (view.queue.size(), view.queue.size("g"), view.stats.items_in) == (3, 0, 3)
            assert view.queue.groups() == ["g"]
            assert view.queue.back_file_size() > 0
    finally:
        topics.close()


def test_a_topic_with_a_waiting_long_poll_is_never_closed(tmp_path: Path) -> None:
    topics = TopicManager(str(tmp_path / "data"), data_page_size_bytes=4096, max_open_topics=1)
    handler = handler_for(topics)
    try:
        handler.produce_item("waited", b"0")
        handler.consume(T.ConsumeRequest(topic="waited", fanoutId="g", maxFetchSize=100))
        got: list[Any] = []
        poll = threading.Thread(
            target=lambda: got.append(
                handler.consume(T.ConsumeRequest(topic="waited", fanoutId="g", maxFetchSize=100, maxWaitMs=10_000))
            )
        )
        poll.start()
        time.sleep(0.3)
        waited = topics.get("waited")
        assert waited is not None
        for i in range(5):  # each would need the only open slot
            handler.produce_item(f"other{i}", b"x")
        assert not waited.queue.closed
        assert handler.produce_item("waited", b"1")[0].resultCode == OK
        poll.join(10)
        assert got and got[0].itemList == [b"1"]
    finally:
        topics.close()


def test_retention_reaches_topics_that_are_not_open(tmp_path: Path) -> None:
    topics = TopicManager(str(tmp_path / "data"), data_page_size_bytes=4096, max_open_topics=1)
    try:
        topics.create_and_append("old", [b"x%d" % i for i in range(10)])
        topics.create_and_append("other", [b"y"])  # closes "old"
        assert topics.get("old") is None
        view = next(v for v in topics.views() if v.name == "old")
        assert isinstance(view.queue, QueueSnapshot) and view.queue.size() == 10
        later = view.queue.oldest_ms() + 2 * 3_600_000
        maintenance = make_maintenance(
            topics,
            retention_hours=1,
            clock_ms=lambda: later,
        )
        maintenance.run_once(force_cleanup=True)
        old = topics.open("old")
        assert old is not None and old.queue.size() == 0
    finally:
        topics.close()
