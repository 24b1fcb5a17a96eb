"""A broker's maintenance thread (luxun.retention) for tests that run its passes by hand."""

from __future__ import annotations

from typing import Any

from luxun.retention import Maintenance
from luxun.topics import TopicManager

#: What tests do not vary: a week's retention, none by size, an hourly cleanup, no timed flush.
DEFAULTS: dict[str, Any] = {
    "retention_hours": 168,
    "topic_retention_hours": {},
    "retention_size_bytes": -1,
    "cleanup_interval_s": 3600,
    "flush_interval_ms": -1,
    "topic_flush_intervals_ms": {},
    "tick_s": 1,
}


def make_maintenance(topics: TopicManager, **settings: Any) -> Maintenance:
    """A :class:`Maintenance` of ``topics`` with :data:`DEFAULTS`, ``settings`` winning."""
    return Maintenance(topics, **(DEFAULTS | settings))
