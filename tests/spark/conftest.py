"""Fixtures for the Spark data source tests: ONE local[2] SparkSession for the whole
suite (quiet, offline, UI off) and real broker subprocesses.

Skipped when pyspark is not installed (``pip install -e .[spark]``).
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.2")
pytest.importorskip("pyarrow")

from clients.messages import encode_pack
from idl import luxun_thrift as T
from tests._broker import BrokerProcess

LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.spark.name = org.apache.spark
logger.spark.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
"""


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The suite's one SparkSession (local[2]) with the luxun source registered."""
    from pyspark.sql import SparkSession

    from clients.spark import register

    conf_dir = tmp_path_factory.mktemp("spark-conf")
    log4j = conf_dir / "log4j2.properties"
    log4j.write_text(LOG4J2)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("luxun-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.warehouse.dir", str(conf_dir / "warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


class Brokers:
    """Starts brokers for one test (or module) and stops them all at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[BrokerProcess] = []

    def start(self, *extra: str, data_dir: Path | None = None, port: int | None = None) -> BrokerProcess:
        """A broker on a free port (or ``port``: restart one where clients expect it)."""
        n = len(self.started)
        broker = BrokerProcess(data_dir or self.root / f"data-{n}", self.root / f"broker-{n}.log", *extra)
        if port is not None:
            broker.port = port
        self.started.append(broker)
        return broker.start()

    def stop_all(self) -> None:
        for broker in self.started:
            if broker.proc is not None:
                broker.stop()

    def logs(self) -> str:
        return "".join(f"--- {b.log_path.name} ---\n{b.log()}\n" for b in self.started)


@pytest.fixture
def brokers(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Brokers]:
    """``brokers.start()`` brokers on demand for one test; stopped at its end."""
    b = Brokers(tmp_path)
    yield b
    b.stop_all()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        sys.stderr.write(b.logs())


@pytest.fixture(scope="session")
def shared_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """Two brokers shared by the suite (tests use their own topic names)."""
    b = Brokers(tmp_path_factory.mktemp("brokers"))
    first, second = b.start(), b.start()
    yield first, second
    b.stop_all()


@pytest.fixture
def broker(shared_brokers: tuple[BrokerProcess, BrokerProcess]) -> BrokerProcess:
    return shared_brokers[0]


_topic_counter = itertools.count()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name unique to this test."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:60]
    return f"{name}-{next(_topic_counter)}"


def address(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{broker.port}"


def produce_packs(broker: BrokerProcess, topic: str, packs: Sequence[Sequence[bytes]], codec: int = 0) -> list[int]:
    """Produce each list of messages as one pack; return their indexes."""
    client = broker.client()
    try:
        out = []
        for messages in packs:
            r = client.produce(T.ProduceRequest(item=encode_pack(list(messages), codec), topic=topic))
            assert r.result.resultCode == T.ResultCode.SUCCESS, r.result.errorMessage
            out.append(r.index)
        return out
    finally:
        client.close()


def make_packs(prefix: str, n_packs: int, per_pack: int) -> list[list[bytes]]:
    return [[f"{prefix}-{i}-{j}".encode() for j in range(per_pack)] for i in range(n_packs)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, "rep_" + rep.when, rep)
