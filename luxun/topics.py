"""The topic manager: topic name -> FanoutQueue under the data directory.

Each sub-directory of the data directory is one topic (as in Java Luxun, so keep
nothing else there but files). Topics are opened at start, created on first produce and
deleted with their files. The data directory itself is locked (``flock`` on a
``.luxun.lock`` file), so a second broker on the same directory is refused.

Waiting consumers (the long-poll extension) wait on a per-topic condition that a
produce notifies; waiting costs a blocked thread, never a busy one.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bigarray import ArrayLockedError, FanoutQueue, validate_name

log = logging.getLogger(__name__)

LOCK_FILE = ".luxun.lock"


class DataDirLockedError(RuntimeError):
    """Another broker process is using the data directory."""


@dataclass
class TopicStats:
    """Counters of one topic, updated without a lock (approximate under races, cheap)."""

    items_in: int = 0
    bytes_in: int = 0
    items_out: int = 0
    bytes_out: int = 0
    unflushed: int = 0
    last_flush_monotonic: float = field(default_factory=time.monotonic)


class Topic:
    """One topic: its queue, its counters and the condition waiting consumers use."""

    __slots__ = ("cond", "name", "queue", "stats", "waiters")

    def __init__(self, name: str, queue: FanoutQueue) -> None:
        self.name = name
        self.queue = queue
        self.stats = TopicStats()
        self.cond = threading.Condition(threading.Lock())
        self.waiters = 0

    def notify(self) -> None:
        """Wake the consumers waiting for new items (cheap when nobody waits)."""
        if self.waiters:
            with self.cond:
                self.cond.notify_all()


class TopicManager:
    """Opens, creates, lists and deletes topics under ``data_dir``.

    Args:
        data_dir: the broker's data directory (created if missing).
        data_page_size_bytes: data page size for new topics.
        max_cached_pages: idle pages kept mapped per topic folder.
    """

    def __init__(self, data_dir: str, *, data_page_size_bytes: int, max_cached_pages: int = 4) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self._page_size = data_page_size_bytes
        self._max_cached_pages = max_cached_pages
        self._lock = threading.Lock()
        self._topics: dict[str, Topic] = {}
        self._closed = False
        # Anyone waiting for a topic that does not exist yet waits here.
        self.created = threading.Condition(threading.Lock())
        os.makedirs(self.data_dir, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self.data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DataDirLockedError(
                f"data directory {self.data_dir} is in use by another broker (lock {LOCK_FILE} is held)"
            ) from None
        try:
            self._open_existing()
        except BaseException:
            self.close()
            raise

    def _open_existing(self) -> None:
        for entry in sorted(os.listdir(self.data_dir)):
            path = os.path.join(self.data_dir, entry)
            if not os.path.isdir(path):
                continue
            try:
                validate_name(entry, what="topic")
            except ValueError as exc:
                log.warning("skipping directory %r in the data directory: %s", entry, exc)
                continue
            try:
                self._topics[entry] = Topic(entry, self._open_queue(path))
            except ArrayLockedError as exc:
                raise DataDirLockedError(f"topic {entry!r} is in use by another process: {exc}") from exc
            log.info(
                "opened topic %r: %d items (indexes %d..%d)",
                entry,
                self._topics[entry].queue.size(),
                self._topics[entry].queue.tail,
                self._topics[entry].queue.head,
            )

    def _open_queue(self, path: str) -> FanoutQueue:
        return FanoutQueue(path, data_page_size=self._page_size, max_cached_pages=self._max_cached_pages)

    def get(self, name: str) -> Topic | None:
        """The topic called ``name``, or None."""
        return self._topics.get(name)

    def get_or_create(self, name: str) -> Topic:
        """The topic called ``name``, created if needed.

        Raises:
            bigarray.InvalidNameError: the name breaks the topic naming rules.
        """
        topic = self._topics.get(name)
        if topic is not None:
            return topic
        validate_name(name, what="topic")
        with self._lock:
            if self._closed:
                raise RuntimeError("the broker is shutting down")
            topic = self._topics.get(name)
            if topic is None:
                topic = Topic(name, self._open_queue(os.path.join(self.data_dir, name)))
                self._topics[name] = topic
                log.info("created topic %r", name)
        with self.created:
            self.created.notify_all()
        return topic

    def delete(self, name: str) -> bool:
        """Delete a topic and its files; False if it did not exist."""
        with self._lock:
            topic = self._topics.pop(name, None)
        if topic is None:
            return False
        topic.queue.close()
        with topic.cond:
            topic.cond.notify_all()
        path = os.path.join(self.data_dir, name)
        for _ in range(5):  # a background prefetch may be creating a page file just now
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                break
            time.sleep(0.05)
        log.info("deleted topic %r", name)
        return True

    def topics(self) -> list[Topic]:
        """All topics, sorted by name."""
        with self._lock:
            return [self._topics[k] for k in sorted(self._topics)]

    def __iter__(self) -> Iterator[Topic]:
        return iter(self.topics())

    def wait_for(self, name: str, ready: Callable[[Topic | None], bool], timeout_s: float) -> Topic | None:
        """Wait up to ``timeout_s`` until ``ready(topic)`` is true; return the topic.

        ``ready`` is evaluated under the topic's condition, so a produce between the
        check and the wait is never missed.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            topic = self._topics.get(name)
            if topic is None:
                with self.created:
                    topic = self._topics.get(name)
                    if topic is None:
                        if ready(None) or self._closed:
                            return None
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            return None
                        self.created.wait(remaining)
                        continue
            with topic.cond:
                if ready(topic) or self._closed or topic.queue.closed:
                    return topic
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return topic
                topic.waiters += 1
                try:
                    topic.cond.wait(remaining)
                finally:
                    topic.waiters -= 1
            if ready(topic) or time.monotonic() >= deadline or topic.queue.closed:
                return topic

    def wake_all(self) -> None:
        """Wake every waiting consumer (used at shutdown)."""
        with self.created:
            self.created.notify_all()
        for topic in self.topics():
            with topic.cond:
                topic.cond.notify_all()

    def flush(self) -> None:
        """msync every topic."""
        for topic in self.topics():
            with contextlib.suppress(Exception):
                topic.queue.flush()

    def close(self) -> None:
        """Flush and close every topic and release the data directory."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            topics = list(self._topics.values())
            self._topics.clear()
        self.wake_all()
        for topic in topics:
            try:
                topic.queue.close()
            except Exception:
                log.exception("closing topic %r failed", topic.name)
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)
