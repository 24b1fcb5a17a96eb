"""Fixtures for the README tests: real broker subprocesses, started on demand."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._broker import BrokerProcess

StartBroker = Callable[..., BrokerProcess]


@pytest.fixture
def brokers(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StartBroker]:
    """``brokers(metrics=False, kafka=False)`` starts a broker (own data dir, free 127.0.0.1 ports,
    password ``tests._broker.PASSWORD``); all are stopped at the end of the test and
    their logs printed if it failed."""
    started: list[BrokerProcess] = []

    def start(*, metrics: bool = False, kafka: bool = False) -> BrokerProcess:
        n = len(started)
        broker = BrokerProcess(tmp_path / f"data-{n}", tmp_path / f"broker-{n}.log", metrics=metrics, kafka=kafka)
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        if broker.proc is not None:
            broker.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for broker in started:
            sys.stderr.write(f"--- {broker.log_path.name} ---\n{broker.log()}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, "rep_" + rep.when, rep)
