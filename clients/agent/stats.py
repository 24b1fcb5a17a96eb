"""What the agent counts: Dory's counters, discards per reason and topic, discard reports.

Discard reasons (Dory's categories; the names in ``/discards`` and ``/metrics``):

=====================  ========================================================  =========================
reason                 when                                                      Dory counter
=====================  ========================================================  =========================
malformed              fails a check of the wire format (see ``wire``)           InputAgentDiscardMsgMalformed
unsupported_api_key    ApiKey not 256/257                                        InputAgentDiscardMsgUnsupportedApiKey
unsupported_version    ApiVersion not 0                                          InputAgentDiscardMsgUnsupportedVersion
bad_topic              not a valid luxun topic name (or, topicAutocreate off,    DiscardBadTopicMsgOnRoute
                       a topic no broker lists)
too_large              a value that cannot fit a pack of messageMaxBytes, or     DiscardLongMsg
                       refused by the broker as too large
rate_limited           over the topic's rate limit                               DiscardDueToRateLimit
no_memory              the pool (maxBuffer) is full                              InputAgentDiscardMsgNoMem
broker_failure         maxFailedDeliveryAttempts failed, or refused by a broker  DiscardBrokerFailure
shutdown               still buffered when shutdownMaxDelay ran out              DiscardOnShutdown
=====================  ========================================================  =========================

Discard reports follow Dory's: an unfinished report for the current interval
(``discardReportInterval``) and the latest finished one, plus (ours) ``totals`` since the
start, per reason and per topic, that never reset.

Thread-safety: every method takes the one lock; hot per-message counts are kept by the
thread that owns them (the router, each input) and read without it.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections import deque
from typing import Any

MALFORMED = "malformed"
UNSUPPORTED_API_KEY = "unsupported_api_key"
UNSUPPORTED_VERSION = "unsupported_version"
BAD_TOPIC = "bad_topic"
TOO_LARGE = "too_large"
RATE_LIMITED = "rate_limited"
NO_MEMORY = "no_memory"
BROKER_FAILURE = "broker_failure"
SHUTDOWN = "shutdown"
REASONS = (MALFORMED, UNSUPPORTED_API_KEY, UNSUPPORTED_VERSION, BAD_TOPIC, TOO_LARGE, RATE_LIMITED, NO_MEMORY,
           BROKER_FAILURE, SHUTDOWN)  # fmt: skip

COUNTER_OF_REASON = {
    MALFORMED: "InputAgentDiscardMsgMalformed",
    UNSUPPORTED_API_KEY: "InputAgentDiscardMsgUnsupportedApiKey",
    UNSUPPORTED_VERSION: "InputAgentDiscardMsgUnsupportedVersion",
    BAD_TOPIC: "DiscardBadTopicMsgOnRoute",
    TOO_LARGE: "DiscardLongMsg",
    RATE_LIMITED: "DiscardDueToRateLimit",
    NO_MEMORY: "InputAgentDiscardMsgNoMem",
    BROKER_FAILURE: "DiscardBrokerFailure",
    SHUTDOWN: "DiscardOnShutdown",
}
_RECENT = 10
#: One log line per discard reason per this many seconds (the others are counted in it).
LOG_INTERVAL_S = 10.0
log = logging.getLogger("luxun.agent")


class _Report:
    def __init__(self, report_id: int, start: float) -> None:
        self.id = report_id
        self.start = start
        self.counts = dict.fromkeys(REASONS, 0)
        self.versions: dict[int, int] = {}
        self.unclean = {"unix_stream": 0, "tcp": 0}
        self.recent: dict[str, deque[str]] = {r: deque(maxlen=_RECENT) for r in (MALFORMED, BAD_TOPIC, TOO_LARGE)}
        self.topics: dict[str, list[int]] = {}  # topic -> [min ts, max ts, count]
        self.rate_limited: dict[str, int] = {}

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "start_time": int(self.start),
            "malformed_msg_count": self.counts[MALFORMED],
            "unsupported_api_key_msg_count": self.counts[UNSUPPORTED_API_KEY],
            "unsupported_version_msg_count": self.counts[UNSUPPORTED_VERSION],
            "unsupported_versions": [{"version": v, "count": n} for v, n in sorted(self.versions.items())],
            "bad_topic_msg_count": self.counts[BAD_TOPIC],
            "unix_stream_unclean_disconnect_count": self.unclean["unix_stream"],
            "tcp_unclean_disconnect_count": self.unclean["tcp"],
            "recent_malformed": list(self.recent[MALFORMED]),
            "recent_bad_topic": list(self.recent[BAD_TOPIC]),
            "recent_too_long_msg": list(self.recent[TOO_LARGE]),
            "discard_topic": [
                {"topic": t, "min_timestamp": v[0], "max_timestamp": v[1], "count": v[2]}
                for t, v in sorted(self.topics.items())
            ],
            "rate_limit_discard": [{"topic": t, "count": n} for t, n in sorted(self.rate_limited.items())],
        }


class Stats:
    """Counters and discard reports of one agent."""

    def __init__(self, report_interval_s: int, prefix_bytes: int, clock: Any = time.time) -> None:
        self.lock = threading.Lock()
        self.clock = clock
        self.since = clock()
        self.interval_s = max(1, report_interval_s)
        self.prefix_bytes = prefix_bytes
        self.counters: dict[str, int] = {}
        self.totals: dict[str, dict[str, int]] = {r: {} for r in REASONS}  # reason -> topic ("" = none) -> n
        self.delivered: dict[str, int] = {}
        self.unclean_bytes = {"unix_stream": 0, "tcp": 0}
        self._current = _Report(0, self.since)
        self._finished: _Report | None = None
        self._logged: dict[str, tuple[float, int]] = {}  # reason -> (last line, discards since)

    def _rotate(self, now: float) -> _Report:
        if now - self._current.start >= self.interval_s:
            self._finished = self._current
            self._current = _Report(self._current.id + 1, now)
        return self._current

    def incr(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counters[name] = self.counters.get(name, 0) + n

    def discard(self, reason: str, topic: str | None, n: int = 1, *, sample: bytes | None = None,
                ts_min: int | None = None, ts_max: int | None = None, version: int | None = None) -> None:  # fmt: skip
        """Count ``n`` discarded messages of ``topic`` (None: unknown) for ``reason``."""
        with self.lock:
            report = self._rotate(self.clock())
            report.counts[reason] += n
            name = COUNTER_OF_REASON[reason]
            self.counters[name] = self.counters.get(name, 0) + n
            key = topic or ""
            self.totals[reason][key] = self.totals[reason].get(key, 0) + n
            if version is not None:
                report.versions[version] = report.versions.get(version, 0) + n
            if sample is not None and reason in report.recent:
                report.recent[reason].append(base64.b64encode(sample[: self.prefix_bytes]).decode())
            if topic is not None and reason not in (BAD_TOPIC,):
                entry = report.topics.get(topic)
                lo = ts_min if ts_min is not None else 0
                hi = ts_max if ts_max is not None else lo
                if entry is None:
                    report.topics[topic] = [lo, hi, n]
                else:
                    entry[0], entry[1], entry[2] = min(entry[0], lo), max(entry[1], hi), entry[2] + n
                if reason == RATE_LIMITED:
                    report.rate_limited[topic] = report.rate_limited.get(topic, 0) + n
            last, suppressed = self._logged.get(reason, (-1e18, 0))
            now = time.monotonic()
            if now - last < LOG_INTERVAL_S:
                self._logged[reason] = (last, suppressed + n)
                return
            self._logged[reason] = (now, 0)
        more = f" (+{suppressed} more since the last line)" if suppressed else ""
        log.warning("discarded %d %s: %s, topic %r%s", n, "message" if n == 1 else "messages", reason, topic, more)

    def unclean_disconnect(self, transport: str, left_bytes: int, counter: str) -> None:
        with self.lock:
            self._rotate(self.clock()).unclean[transport] += 1
            self.unclean_bytes[transport] += left_bytes
            self.counters[counter] = self.counters.get(counter, 0) + 1

    def count_delivered(self, topic: str, n: int) -> None:
        with self.lock:
            self.delivered[topic] = self.delivered.get(topic, 0) + n

    def discard_total(self) -> int:
        with self.lock:
            return sum(sum(by_topic.values()) for by_topic in self.totals.values())

    def discards_json(self) -> dict[str, Any]:
        with self.lock:
            now = self.clock()
            current = self._rotate(now)
            return {
                "since": int(self.since),
                "now": int(now),
                "interval": self.interval_s,
                "unfinished_report": current.as_json(),
                "finished_report": self._finished.as_json() if self._finished else None,
                "totals": {
                    "by_reason": {r: sum(t.values()) for r, t in self.totals.items()},
                    "by_topic": _by_topic(self.totals),
                    "unclean_disconnect_bytes": dict(self.unclean_bytes),
                },
            }


def _by_topic(totals: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for reason, by_topic in totals.items():
        for topic, n in by_topic.items():
            if topic:
                out.setdefault(topic, {})[reason] = n
    return out


__all__ = ["REASONS", "Stats"]
