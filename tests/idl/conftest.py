"""Fixtures for the idl tests: real broker subprocesses, for the end-to-end checks."""

from __future__ import annotations

from tests._broker import brokers  # noqa: F401 (the shared fixture, used by the tests here)
