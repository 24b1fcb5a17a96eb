"""Log lines that may repeat (a full disk, EMFILE, bad clients) at a bounded rate.

A broker under a repeated failure must not write a line per call: one full disk or
one client flood would fill the log and burn a core. :class:`RateLimitedLog` lets the
first line of each *key* through, then at most one line per ``every_s`` seconds for
that key, and says how many were suppressed in between::

    _enospc = RateLimitedLog(log, every_s=10.0)
    _enospc.error("disk-full", "produce to topic %r failed: %s", name, exc)
    # ... 10 s later, on the next failure:
    # "produce to topic 'x' failed: ... (1234 similar lines suppressed in the last 10 s)"

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

#: Default interval between two lines of one key, in seconds.
DEFAULT_EVERY_S = 10.0


class RateLimitedLog:
    """Wraps a :class:`logging.Logger`; lines are grouped by a key of the caller's.

    Args:
        logger: where the lines go.
        every_s: at most one line per key per this many seconds.
        clock: monotonic clock in seconds (a parameter for tests).
    """

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = DEFAULT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (time of the last line let through, lines suppressed since)
        self._state: dict[str, tuple[float, int]] = {}

    def log(self, level: int, key: str, msg: str, *args: Any, exc_info: bool = False) -> bool:
        """Log ``msg % args`` at ``level`` unless a line of ``key`` went out less than
        ``every_s`` ago; True if it was logged."""
        now = self._clock()
        with self._lock:
            last, suppressed = self._state.get(key, (float("-inf"), 0))
            if now - last < self.every_s:
                self._state[key] = (last, suppressed + 1)
                return False
            self._state[key] = (now, 0)
        if suppressed:
            msg = f"{msg} ({suppressed} similar lines suppressed in the last {self.every_s:.0f} s)"
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def error(self, key: str, msg: str, *args: Any) -> bool:
        return self.log(logging.ERROR, key, msg, *args)

    def warning(self, key: str, msg: str, *args: Any) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def exception(self, key: str, msg: str, *args: Any) -> bool:
        """ERROR with the current exception's traceback (only on lines let through)."""
        return self.log(logging.ERROR, key, msg, *args, exc_info=True)
