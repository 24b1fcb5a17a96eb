"""Fixtures for client tests: real broker subprocesses (one or two)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._broker import BrokerProcess


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Any]:
    """``brokers(n)`` starts n brokers with separate data dirs; all are stopped at the end."""
    started: list[BrokerProcess] = []

    def start(n: int = 1) -> list[BrokerProcess]:
        for _ in range(n):
            i = len(started)
            started.append(BrokerProcess(tmp_path / f"data-{i}", tmp_path / f"broker-{i}.log").start())
        return started[-n:]

    yield start
    for broker in started:
        broker.stop()


def address(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{broker.port}"
