"""Fixtures of the Kafka port's tests: a broker subprocess with its Kafka port open."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._broker import BrokerProcess


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker on free 127.0.0.1 ports (Thrift and Kafka; ``.bootstrap``), stopped after the test."""
    b = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        yield b
    finally:
        b.stop()
