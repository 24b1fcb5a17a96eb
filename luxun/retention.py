"""Background maintenance: time and size retention, timed flushes, idle page unmapping.

One daemon thread wakes every ``tick_s`` seconds and, per topic:

- every ``cleanup_interval_s``: removes items older than the topic's retention
  (``log.retention.hours`` or its ``topic.log.retention.hours`` override), judged by
  each item's append time, so small topics are trimmed too; then trims the topic to
  ``log.retention.size`` bytes of page files (``-1``: no limit); then unmaps idle pages;
- the broker's ``log.retention.ms`` and ``log.retention.bytes`` set at run time
  (``broker_overrides``, :mod:`luxun.dynamic`) win over ``log.retention.hours`` (not
  over a ``topic.log.retention.hours``) and ``log.retention.size``;
- a door may override both limits per topic (``topic_overrides``: the Kafka door's
  ``retention.ms`` and ``retention.bytes`` of a topic, for each of its partitions);
  an override wins over the broker's settings for that topic;
- flushes (msync) a topic whose flush interval (``log.default.flush.interval.ms`` or
  its ``topic.flush.intervals.ms`` override, or a door's, ``flush_overrides``: the
  Kafka door's ``flush.ms``; ``<= 0``: never) has passed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeAlias

from bigarray import now_ms

from .topics import Topic, TopicManager

log = logging.getLogger(__name__)

#: A topic's name -> (retention in ms, retention in bytes) of its own; None where the
#: broker's setting applies; a negative value: no limit.
RetentionOverrides: TypeAlias = Callable[[str], tuple[int | None, int | None]]


class Maintenance:
    """The retention and flush thread of a broker."""

    def __init__(
        self,
        topics: TopicManager,
        *,
        retention_hours: float,
        topic_retention_hours: Mapping[str, float],
        retention_size_bytes: int,
        cleanup_interval_s: float,
        flush_interval_ms: int,
        topic_flush_intervals_ms: Mapping[str, int],
        tick_s: float,
        clock_ms: Callable[[], int] = now_ms,
        topic_overrides: RetentionOverrides | None = None,
        broker_overrides: Callable[[], tuple[int | None, int | None]] | None = None,
        flush_overrides: Callable[[str], int | None] | None = None,
    ) -> None:
        self.topics = topics
        self.retention_hours = retention_hours
        self.topic_retention_hours = dict(topic_retention_hours)
        self.retention_size_bytes = retention_size_bytes
        self.cleanup_interval_s = cleanup_interval_s
        self.flush_interval_ms = flush_interval_ms
        self.topic_flush_intervals_ms = dict(topic_flush_intervals_ms)
        self.tick_s = max(0.05, tick_s)
        self._clock_ms = clock_ms
        self.topic_overrides = topic_overrides
        self.broker_overrides = broker_overrides
        #: A door's flush interval of a topic (the Kafka door's flush.ms); None: none.
        self.flush_overrides = flush_overrides
        self._stop = threading.Event()
        self._next_cleanup = time.monotonic() + cleanup_interval_s
        self._thread = threading.Thread(target=self._run, name="luxun-maintenance", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.run_once()
            except Exception:
                log.exception("maintenance pass failed")

    def run_once(self, *, force_cleanup: bool = False) -> None:
        """One pass: cleanup when due (or forced), flushes when due.

        Open topics are cleaned and flushed in place. A topic that is not open (see
        :class:`~luxun.topics.TopicManager`) has nothing to flush; it is opened for a
        cleanup only when its files show work to do (its oldest item is past retention,
        or its files exceed the size limit), so a pass does not open every topic.
        """
        now = time.monotonic()
        cleanup = force_cleanup or now >= self._next_cleanup
        if cleanup:
            self._next_cleanup = now + self.cleanup_interval_s
        for topic in self.topics.topics():
            self._maintain(topic, cleanup, now)
        if not cleanup:
            return
        for view in self.topics.views():
            if isinstance(view, Topic):
                continue  # open: done above
            keep_ms, keep_bytes = self._limits(view.name)
            snapshot = view.queue
            expired = keep_ms >= 0 and 0 < snapshot.oldest_ms() < self._clock_ms() - keep_ms
            oversized = 0 <= keep_bytes < snapshot.back_file_size()
            if expired or oversized:
                try:
                    opened = self.topics.open(view.name)
                except Exception as exc:
                    log.error("maintenance of topic %r failed: cannot open it: %s", view.name, exc)
                    continue
                if opened is not None:
                    self._maintain(opened, True, now)

    def _maintain(self, topic: Topic, cleanup: bool, now: float) -> None:
        queue = topic.queue
        try:
            if cleanup:
                keep_ms, keep_bytes = self._limits(topic.name)
                if keep_ms >= 0:
                    before = queue.tail
                    queue.remove_before(self._clock_ms() - keep_ms)
                    if queue.tail > before:
                        log.info(
                            "retention: topic %r dropped %d items older than %g h",
                            topic.name,
                            queue.tail - before,
                            keep_ms / 3_600_000,
                        )
                if keep_bytes >= 0:
                    before = queue.tail
                    queue.limit_back_file_size(keep_bytes)
                    if queue.tail > before:
                        log.info(
                            "retention: topic %r dropped %d items to stay under %d bytes",
                            topic.name,
                            queue.tail - before,
                            keep_bytes,
                        )
                queue.array.expire_idle_pages()
            interval_ms = self.topic_flush_intervals_ms.get(topic.name, self.flush_interval_ms)
            if self.flush_overrides is not None:
                own = self.flush_overrides(topic.name)
                interval_ms = interval_ms if own is None else max(own, 1)
            if interval_ms > 0 and (now - topic.stats.last_flush_monotonic) * 1000 >= interval_ms:
                topic.stats.last_flush_monotonic = now
                queue.flush()
        except Exception as exc:
            if queue.closed:
                return  # deleted, or closed to make room, meanwhile
            log.error("maintenance of topic %r failed: %s", topic.name, exc)

    def _limits(self, name: str) -> tuple[int, int]:
        """Topic ``name``'s retention: (age in ms, size in bytes); negative: no limit."""
        hours = self.topic_retention_hours.get(name, self.retention_hours)
        keep_ms = int(hours * 3_600_000) if hours > 0 else -1
        keep_bytes = self.retention_size_bytes
        if self.broker_overrides is not None:
            default_ms, default_bytes = self.broker_overrides()
            if default_ms is not None and name not in self.topic_retention_hours:
                keep_ms = default_ms
            keep_bytes = keep_bytes if default_bytes is None else default_bytes
        if self.topic_overrides is not None:
            try:
                own_ms, own_bytes = self.topic_overrides(name)
            except Exception:
                log.exception("reading the retention settings of topic %r failed", name)
                own_ms = own_bytes = None
            keep_ms = keep_ms if own_ms is None else own_ms
            keep_bytes = keep_bytes if own_bytes is None else own_bytes
        return keep_ms, keep_bytes
