"""RateLimitedLog: first line of a key goes out, repeats are counted and summarised."""

from __future__ import annotations

import logging

import pytest

from luxun.logs import RateLimitedLog


def test_repeats_are_suppressed_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    rl = RateLimitedLog(logging.getLogger("t.rl"), every_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.rl"):
        assert rl.error("enospc", "disk full on %s", "a")
        for _ in range(1000):
            assert not rl.error("enospc", "disk full on %s", "a")
        assert rl.warning("emfile", "too many files")  # another key is independent
        now[0] += 10.0
        assert rl.error("enospc", "disk full on %s", "b")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "disk full on a",
        "too many files",
        "disk full on b (1000 similar lines suppressed in the last 10 s)",
    ]
