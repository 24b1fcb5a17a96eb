"""Fixtures for client tests: real broker subprocesses (one or two)."""

from __future__ import annotations

from tests._broker import address, brokers  # noqa: F401 (the shared fixture and helper, used by the tests here)
