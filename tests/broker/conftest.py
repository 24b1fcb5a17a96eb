"""Fixtures for broker tests: a real broker subprocess and thriftpy2 clients."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._broker import PASSWORD, BrokerProcess, free_port

__all__ = ["PASSWORD", "BrokerProcess", "free_port"]


@pytest.fixture
def broker_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Start brokers on demand: ``broker_factory(*extra_args, data_dir=None)``; all are
    stopped at the end and their logs printed if the test failed."""
    started: list[BrokerProcess] = []

    def start(*extra: str, data_dir: Path | None = None, metrics: bool = False) -> BrokerProcess:
        n = len(started)
        broker = BrokerProcess(data_dir or tmp_path / "data", tmp_path / f"broker-{n}.log", *extra, metrics=metrics)
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        broker.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for broker in started:
            sys.stderr.write(f"--- {broker.log_path.name} ---\n{broker.log()}\n")


@pytest.fixture
def broker(broker_factory: Any) -> BrokerProcess:
    """One broker with default options."""
    return broker_factory()  # type: ignore[no-any-return]


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[Any]:
    c = broker.client()
    yield c
    c.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, "rep_" + rep.when, rep)
