"""The topic manager: topic name -> FanoutQueue under the data directory.

Each sub-directory of the data directory is one topic (as in Java Luxun, so keep
nothing else there but files). The data directory itself is locked (``flock`` on a
``.luxun.lock`` file), so a second broker on the same directory is refused.

Lifecycle of a topic:

* **Start**: the directories are listed, nothing is opened; a topic is opened on its
  first use. A restart therefore never needs every topic open at once.
* **Open topics are bounded** (``max_open_topics``): opening one more closes the least
  recently used ones (a CLOCK sweep: a topic used since the last sweep gets a second
  chance). A topic with a waiting Thrift long poll is never closed (a Kafka Fetch
  watches its partitions without holding them open: :meth:`TopicManager.watch`); a
  call that still holds a topic closed under it sees ``ArrayClosedError`` and the
  service retries it once on the reopened topic (nothing was appended or moved by the
  failed attempt). A topic's items, group positions and counters survive close and
  reopen, and so do its record offsets (:meth:`TopicManager.idle_offsets`: a Kafka
  consumer that has read all of a closed partition is answered without reopening it).
* **What the bound protects**: an open topic holds file descriptors and mappings (the
  directory lock, the meta page, the index and data pages in use, cached ones, a page
  per group; CPython's ``mmap`` keeps a descriptor per mapping). Measured idle, read
  and written: 4 descriptors, 3 mappings and about 270 KiB resident (the head data
  page's first reserved step, mapped); at most :data:`FDS_PER_OPEN_TOPIC_WORST`
  descriptors and :data:`MAPS_PER_OPEN_TOPIC_WORST` mappings. ``max_open_topics=0``
  (the default) sizes the bound from what the process may hold
  (:func:`open_topics_limit`: ``RLIMIT_NOFILE`` and ``vm.max_map_count`` at the worst
  cost, at most :data:`AUTO_MAX_OPEN_TOPICS`), so each Kafka partition (a topic of its
  own) of a few hundred stays open under a steady consumer instead of being closed and
  reopened on every Fetch; running out of descriptors anyway is an error of the one
  call (:class:`TopicStorageError`, a Kafka storage error), never of the broker.
* **Creation** (by produce, :meth:`TopicManager.create_and_append`) opens the new
  topic *and appends its first items* before anyone can see it: a consumer asking
  meanwhile waits for the creation to finish, so a topic is never visible empty
  because it is being created. A creation that fails (too many open files, full
  disk, ...) leaves no directory behind.
* **Appending** (:meth:`TopicManager.append`) is one method for every door: it opens or
  creates the topic, retries on a topic closed under it, counts the topic's stats,
  applies ``log.flush.count`` (msync after that many appended items), wakes waiting
  consumers, and turns storage failures (a full disk, too many open files) into one
  logged :class:`TopicStorageError` that each door answers with its own code.
* **Deletion** (:meth:`TopicManager.delete`, whichever door asks) takes the topic's Kafka
  partitions (``T~p``, see :mod:`luxun.partitions`) with it, and with the directories
  every group position and committed offset in them; the doors' in-memory state about
  a deleted topic (Kafka producer sequences, group metadata, Thrift member leases)
  goes through the listeners added with :meth:`TopicManager.add_delete_listener`. It
  closes the topic (in-flight appends finish first), then renames its directory to
  ``.luxun-deleted-<random hex>`` before the name can be used again, and removes that
  directory in a background thread. A re-created topic thus never shares a file with
  the old one. Leftover ``.luxun-deleted-*`` directories (a crash during removal) are
  removed at start. Java Luxun would take such a directory for a topic, so do not hand
  a data directory to Java Luxun while one exists.

Names starting with ``.luxun`` are the broker's own (lock file, deleted topics, the
clean-shutdown marker) and refused as topic names.

The clean-shutdown marker, as Java Luxun's ``LuxunServer``: an empty file
``.luxun_cleanshutdown`` is removed when the data directory is opened (once it is
locked) and created when it is closed after every topic closed without error; so it
is there only while no broker runs and the last one stopped cleanly (not after kill -9
or a failed close). Nothing here reads it: recovery is the same either way (Java passes
it on as ``needRecovery`` and does not use it either); it is for tools and scripts.

Waiting consumers (the long-poll extension) wait on a per-topic condition that a
produce notifies; waiting costs a blocked thread, never a busy one.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import resource
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bigarray import ArrayClosedError, DiskFullError, FanoutQueue, InvalidNameError, validate_name
from bigarray import format as fmt
from idl.names import RESERVED_PREFIX, topic_name_problem

from .config import DEFAULT_MAX_OPEN_TOPICS
from .errors import DataDirLockedError
from .logs import RateLimitedLog
from .partitions import KIND_LUXUN, partition_of

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

LOCK_FILE = ".luxun.lock"
#: Java Luxun's clean-shutdown marker (LuxunServer.CLEAN_SHUTDOWN_FILE); see the module docstring.
CLEAN_SHUTDOWN_FILE = ".luxun_cleanshutdown"
#: A deleted topic's directory is renamed to this prefix + random hex, then removed.
TRASH_PREFIX = ".luxun-deleted-"
#: Longest wait for another thread's creation, reopening or deletion of a topic.
_BUSY_WAIT_S = 30.0

_HEAD_TAIL = struct.Struct(">qq")
_I64 = struct.Struct(">q")
_INDEX_ITEM = struct.Struct(fmt.INDEX_ITEM_STRUCT)


#: File descriptors an open topic may hold (CPython's mmap keeps one per mapped page):
#: its directory lock and meta page, up to 4 cached index and 4 data pages plus the
#: writer's two, and a group's position. Measured: 4 for a topic written and read
#: (tests/broker/test_topic_limits.py), about 5 with a consumer group.
FDS_PER_OPEN_TOPIC_WORST = 13
#: Descriptors kept for connections, the listener and the rest of the process.
FDS_RESERVED = 256
#: Mappings an open topic may hold (the kernel's ``vm.max_map_count`` bounds a process's
#: mappings; one more mmap then fails with ENOMEM): the pages above, one each.
MAPS_PER_OPEN_TOPIC_WORST = 13
#: Mappings kept for the interpreter, its libraries and thread stacks.
MAPS_RESERVED = 8192
#: Most topics kept open when ``max.open.topics`` is not set, whatever the limits allow:
#: an idle open topic keeps about 270 KiB of its head data page resident (file-backed
#: page cache, reclaimable), so at most ~270 MiB.
AUTO_MAX_OPEN_TOPICS = 1000
_MAX_MAP_COUNT = "/proc/sys/vm/max_map_count"


def open_topics_limit(fd_limit: int | None = None, max_map_count: int | None = None) -> int:
    """``max.open.topics`` when it is not set (0): how many topics the process may keep
    open at their worst cost, :data:`FDS_PER_OPEN_TOPIC_WORST` descriptors and
    :data:`MAPS_PER_OPEN_TOPIC_WORST` mappings each, within ``fd_limit`` (default: the
    soft ``RLIMIT_NOFILE`` now) less :data:`FDS_RESERVED` and ``max_map_count`` (default:
    ``vm.max_map_count``, 65530 if unreadable) less :data:`MAPS_RESERVED`; at most
    :data:`AUTO_MAX_OPEN_TOPICS`, at least 1."""
    if fd_limit is None:
        fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if fd_limit < 0:  # RLIM_INFINITY
        fd_limit = 1 << 30
    if max_map_count is None:
        max_map_count = 65530
        with contextlib.suppress(OSError, ValueError), open(_MAX_MAP_COUNT, encoding="ascii") as f:
            max_map_count = int(f.read())
    by_fds = (fd_limit - FDS_RESERVED) // FDS_PER_OPEN_TOPIC_WORST
    by_maps = (max_map_count - MAPS_RESERVED) // MAPS_PER_OPEN_TOPIC_WORST
    return max(1, min(by_fds, by_maps, AUTO_MAX_OPEN_TOPICS))


class TopicLimitError(RuntimeError):
    """A new topic would exceed ``max.topics``, or auto-creation is off."""


class TopicAutoCreateDisabledError(TopicLimitError):
    """Produce to an unknown topic while ``auto.create.topics.enable`` is false."""


class UnknownTopicError(LookupError):
    """An append with ``create=False`` to a topic that does not exist (or was deleted)."""


class TopicStorageError(RuntimeError):
    """Storage refused an append: a full disk, too many open files, an I/O error. Logged
    once (rate-limited) by :meth:`TopicManager.append`; the cause is ``__cause__``.
    Nothing of the append was stored."""


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
    """One topic: its queue, its counters and the condition waiting consumers use.

    The object lives as long as the topic (across closes and reopens); ``queue`` is the
    open queue, or the last one, closed, while the topic is not open.
    """

    __slots__ = ("cond", "deleted", "idle", "name", "queue", "stats", "used", "waiters", "watchers")

    def __init__(self, name: str, queue: FanoutQueue) -> None:
        self.name = name
        self.queue = queue
        self.stats = TopicStats()
        self.cond = threading.Condition(threading.Lock())
        #: Consumers waiting on ``cond`` (a topic they wait on is not closed to make room).
        self.waiters = 0
        self.used = True
        self.deleted = False
        #: ``(log_start_offset, next_offset)`` while the topic is closed to make room
        #: (they cannot change before it is reopened), else None.
        self.idle: tuple[int, int] | None = None
        #: Events set on every append: waiters watching several topics at once (a
        #: Kafka fetch of several partitions). They do not keep the topic open: the
        #: object outlives a close, and an append reopens the topic and sets them.
        self.watchers: set[threading.Event] = set()

    def notify(self) -> None:
        """Wake the consumers waiting for new items (cheap when nobody waits)."""
        if self.waiters or self.watchers:
            with self.cond:
                self.cond.notify_all()
                for event in self.watchers:
                    event.set()

    def watch(self, event: threading.Event) -> None:
        """Set ``event`` on every append until :meth:`unwatch` (closed to make room
        meanwhile or not)."""
        with self.cond:
            self.watchers.add(event)

    def unwatch(self, event: threading.Event) -> None:
        with self.cond:
            self.watchers.discard(event)


class QueueSnapshot:
    """Sizes of a topic that is not open, read from its files without opening it (the
    subset of :class:`~bigarray.FanoutQueue` the metrics use)."""

    closed = True

    def __init__(self, path: str) -> None:
        self.path = path
        self.head = self.tail = 0
        self._groups: dict[str, int] = {}
        meta = os.path.join(path, fmt.META_DIR, fmt.page_file_name(0))
        with contextlib.suppress(OSError, struct.error), open(meta, "rb") as f:
            self.head, self.tail = _HEAD_TAIL.unpack(f.read(_HEAD_TAIL.size))
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(path)):
                if entry.startswith(fmt.FRONT_DIR_PREFIX):
                    with contextlib.suppress(OSError, struct.error):
                        name = os.path.join(path, entry, fmt.page_file_name(0))
                        with open(name, "rb") as f:
                            self._groups[entry[len(fmt.FRONT_DIR_PREFIX) :]] = _I64.unpack(f.read(_I64.size))[0]
        self._disk = self._allocated = 0  # file sizes (as Java's getBackFileSize), blocks in use
        for sub in (fmt.INDEX_DIR, fmt.DATA_DIR):
            with contextlib.suppress(OSError), os.scandir(os.path.join(path, sub)) as it:
                for page in it:
                    if fmt.parse_page_file_name(page.name) is not None:
                        with contextlib.suppress(OSError):
                            st = page.stat()
                            self._disk += st.st_size
                            self._allocated += st.st_blocks * 512

    def groups(self) -> list[str]:
        return sorted(self._groups)

    def size(self, group: str | None = None) -> int:
        if group is None:
            return self.head - self.tail
        return self.head - max(self._groups.get(group, self.tail), self.tail)

    def back_file_size(self) -> int:
        return self._disk

    def allocated_size(self) -> int:
        """Disk blocks the index and data pages take (pages are sparse)."""
        return self._allocated

    def oldest_ms(self) -> int:
        """Append time of the item at tail in ms (0: none, or unreadable)."""
        if self.head <= self.tail:
            return 0
        page = os.path.join(self.path, fmt.INDEX_DIR, fmt.page_file_name(self.tail >> fmt.INDEX_ITEMS_PER_PAGE_BITS))
        try:
            with open(page, "rb") as f:
                f.seek((self.tail & fmt.INDEX_SLOT_MASK) * fmt.INDEX_ITEM_SIZE)
                return int(_INDEX_ITEM.unpack(f.read(_INDEX_ITEM.size))[3])
        except (OSError, struct.error):
            return 0


class TopicView:
    """What the metrics see of a topic that is not open: name, counters, sizes."""

    __slots__ = ("name", "queue", "stats")

    def __init__(self, name: str, stats: TopicStats, queue: QueueSnapshot) -> None:
        self.name = name
        self.stats = stats
        self.queue = queue


class TopicManager:
    """Opens, creates, lists and deletes topics under ``data_dir``.

    Args:
        data_dir: the broker's data directory (created if missing).
        data_page_size_bytes: data page size for new topics.
        max_cached_pages: idle pages kept mapped per topic folder.
        max_open_topics: topics kept open at once (least recently used ones are
            closed beyond it; topics with waiting Thrift consumers may exceed it);
            0: sized from the process's limits (:func:`open_topics_limit`).
        max_topics: most topics that may exist; 0: no limit.
        auto_create: create a topic on its first produce (else produce to an unknown
            topic fails with :class:`TopicAutoCreateDisabledError`).
        flush_count: msync a topic after this many appended items (``log.flush.count``;
            <= 0: never), whichever door appends.
        repair: called with the data directory once it is locked, before the topics are
            listed: a door removes what a crash left half made (the Kafka door: an
            interrupted CreateTopics, ``luxun.kafka.log.remove_interrupted_creations``).
    """

    def __init__(
        self,
        data_dir: str,
        *,
        data_page_size_bytes: int,
        max_cached_pages: int = 4,
        max_open_topics: int = DEFAULT_MAX_OPEN_TOPICS,
        max_topics: int = 0,
        auto_create: bool = True,
        flush_count: int = 0,
        repair: Callable[[str], object] | None = None,
    ) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.flush_count = flush_count
        self._delete_listeners: list[Callable[[str], None]] = []
        self._page_size = data_page_size_bytes
        #: The largest item a new topic holds (items never span data pages).
        self.max_item_bytes = data_page_size_bytes
        self._max_cached_pages = max_cached_pages
        #: The bound in force (``max_open_topics``, or what 0 was sized to).
        self.max_open_topics = max_open_topics if max_open_topics > 0 else open_topics_limit()
        self.max_topics = max_topics
        self.auto_create = auto_create
        self._lock = threading.Lock()
        #: Open topics (the lock-free lookup of every call).
        self._open: dict[str, Topic] = {}
        #: Every topic: its Topic once opened in this process, else None.
        self._known: dict[str, Topic | None] = {}
        #: Cached sizes of topics not open (for the metrics), dropped when opened.
        self._snapshots: dict[str, TopicView] = {}
        #: Names being created, opened, closed or deleted by some thread.
        self._busy: dict[str, threading.Event] = {}
        self._creating = 0
        #: Topics opened from their files (created, or reopened), and topics closed to
        #: make room (``luxun_topic_opens_total``, ``luxun_topic_lru_closes_total``):
        #: their growth under a steady load is the open-topic LRU thrashing.
        self.opens_total = 0
        self.lru_closes_total = 0
        self._closed = False
        self._trash_threads: list[threading.Thread] = []
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
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.data_dir, CLEAN_SHUTDOWN_FILE))
                log.info("the data directory was closed cleanly last time (%s)", CLEAN_SHUTDOWN_FILE)
            if repair is not None:
                repair(self.data_dir)
            self._list_existing()
        except BaseException:
            self.close()
            raise

    def _list_existing(self) -> None:
        for entry in sorted(os.listdir(self.data_dir)):
            path = os.path.join(self.data_dir, entry)
            if entry.startswith(TRASH_PREFIX):
                shutil.rmtree(path, ignore_errors=True)
                log.info("removed a deleted topic's directory left behind: %s", entry)
                continue
            if not os.path.isdir(path):
                continue
            try:
                self.validate(entry)
            except InvalidNameError as exc:
                log.warning("skipping directory %r in the data directory: %s", entry, exc)
                continue
            self._known[entry] = None
        log.info("found %d topics in %s (opened on first use)", len(self._known), self.data_dir)

    @staticmethod
    def validate(name: object) -> str:
        """Check a topic name: :func:`validate_topic`."""
        return validate_topic(name)

    def _open_queue(self, path: str) -> FanoutQueue:
        return FanoutQueue(path, data_page_size=self._page_size, max_cached_pages=self._max_cached_pages)

    # -- lookups -----------------------------------------------------------------------
    def get(self, name: str) -> Topic | None:
        """The topic called ``name`` if it is open now, else None (then use :meth:`open`).

        The hot path of every call: a dict lookup and an attribute write (the use mark
        of the LRU sweep).
        """
        topic = self._open.get(name)
        if topic is not None:
            topic.used = True
        return topic

    def open(self, name: str) -> Topic | None:
        """The topic called ``name``, opened if needed; None if it does not exist.

        Waits while another thread creates, opens, closes or deletes it.

        Raises:
            OSError: the topic could not be opened (e.g. too many open files).
            bigarray.ArrayLockedError: another process holds the topic's directory.
        """
        deadline = time.monotonic() + _BUSY_WAIT_S
        while True:
            with self._lock:
                topic = self._open.get(name)
                if topic is not None:
                    topic.used = True
                    return topic
                if self._closed:
                    return None
                busy = self._busy.get(name)
                if busy is None:
                    if name not in self._known:
                        return None
                    busy = self._busy[name] = threading.Event()
                    mine = True
                else:
                    mine = False
            if not mine:
                self._wait_busy(name, busy, deadline)
                continue
            try:
                return self._reopen(name)
            finally:
                self._release(name, busy)

    def _reopen(self, name: str) -> Topic:
        """Open a known topic (the caller holds its busy mark)."""
        self._make_room()
        queue = self._open_queue(os.path.join(self.data_dir, name))
        with self._lock:
            if self._closed:
                queue.close()
                raise ArrayClosedError("the broker is shutting down")
            topic = self._known.get(name)
            self._snapshots.pop(name, None)
            if topic is None:
                topic = Topic(name, queue)
                self._known[name] = topic
            else:
                topic.queue = queue
                topic.used = True
                topic.idle = None
            self._open[name] = topic
            self.opens_total += 1
        log.debug("opened topic %r: %d items (indexes %d..%d)", name, queue.size(), queue.tail, queue.head)
        return topic

    @property
    def open_topics(self) -> Mapping[str, Topic]:
        """The open topics by name: the live dict, read only (the compiled loop looks
        topics up in it to do :meth:`append`'s hot path in C, see
        :meth:`luxun.thrift.service.QueueHandler.in_place_calls`)."""
        return self._open

    def append(
        self,
        name: str,
        items: Sequence[bytes | bytearray | memoryview],
        counts: Sequence[int] | None = None,
        kind: int = KIND_LUXUN,
        *,
        create: bool = True,
        call: str = "append",
    ) -> tuple[Topic, int]:
        """Append ``items`` to topic ``name``: ``(topic, index of the first item)``. The
        one append of every door (its hot path for one plain item has a C twin in
        luxun/_netloop.c, append_here: keep them in step). ``call`` names the request in
        log lines ("produce").

        ``counts``: record offsets each item holds (a Kafka batch holds its records;
        default one each), ``kind``: the items' kind (:mod:`luxun.partitions`).
        ``create``: create the topic if it does not exist (a produce; refused as
        :meth:`create_and_append` says); else :class:`UnknownTopicError`. A topic
        closed under the append (to make room, or deleted) is looked up again: nothing
        was appended by the failed attempt. Then the topic's stats count the records
        and bytes, ``flush_count`` is applied, and waiting consumers are woken.

        Raises:
            bigarray.InvalidNameError, TopicLimitError, TopicAutoCreateDisabledError:
                as :meth:`create_and_append`.
            UnknownTopicError: ``create=False`` and no such topic.
            bigarray.ItemTooLargeError: an item does not fit a data page.
            TopicStorageError: a full disk, too many open files, an I/O error (logged).
            ArrayClosedError: the broker is shutting down.
        """
        # The hot path: an open topic, found by one dict lookup.
        topic = self._open.get(name)
        try:
            if topic is not None:
                topic.used = True
                try:
                    index = self._append(topic.queue, items, counts, kind)
                except ArrayClosedError:  # closed to make room, or deleted, under us: nothing was appended
                    topic, index = self.create_and_append(name, items, counts, kind, create=create)
            else:  # not open, not existing, or being created: the slow path
                topic, index = self.create_and_append(name, items, counts, kind, create=create)
        except DiskFullError as exc:
            _limited.error("disk-full", "%s to topic %r failed: %s", call, name, exc)
            raise TopicStorageError(str(exc)) from exc
        except TimeoutError:  # another thread held the topic busy too long: not storage
            raise
        except OSError as exc:
            if is_fd_exhaustion(exc):
                _limited.error("fd-limit", "%s to topic %r failed: %s", call, name, exc)
            else:
                _limited.exception("append-io", "%s to topic %r failed", call, name)
            raise TopicStorageError(f"cannot append to topic {name!r}: {exc}") from exc
        stats = topic.stats
        n = len(items)
        stats.items_in += n if counts is None else int(sum(counts))
        stats.bytes_in += len(items[0]) if n == 1 else sum(map(len, items))
        if self.flush_count > 0:
            stats.unflushed += n
            if stats.unflushed >= self.flush_count:
                stats.unflushed = 0
                topic.queue.flush()
        topic.notify()
        return topic, index

    def create_and_append(
        self,
        name: str,
        items: Sequence[bytes | bytearray | memoryview],
        counts: Sequence[int] | None = None,
        kind: int = KIND_LUXUN,
        *,
        explicit: bool = False,
        create: bool = True,
    ) -> tuple[Topic, int]:
        """Append ``items`` to topic ``name``, creating (or opening) it first if needed;
        ``(topic, index of the first item)``.

        A new topic is created with ``items`` already in it before any other thread can
        see it. If the creation or the first append fails, the topic is not created.
        ``explicit``: a request to create it (Kafka's CreateTopics), which
        ``auto.create.topics.enable=false`` does not refuse. ``create=False``: never
        create it (:class:`UnknownTopicError`). No stats, flush or notify: that is
        :meth:`append`'s.

        Raises:
            bigarray.InvalidNameError: the name breaks the topic naming rules.
            TopicLimitError: ``max_topics`` is reached, or auto-creation is off.
            ArrayClosedError: the broker is shutting down.
            Whatever the append raises (``ItemTooLargeError``, ``DiskFullError``, ...).
        """
        deadline = time.monotonic() + _BUSY_WAIT_S
        while True:
            topic = self.get(name) or self.open(name)
            if topic is not None:
                try:
                    return topic, self._append(topic.queue, items, counts, kind)
                except ArrayClosedError:
                    if self._closed or time.monotonic() > deadline:
                        raise
                    continue  # closed or deleted under us: look again
            if not create:
                raise UnknownTopicError(f"topic {name!r} does not exist")
            self.validate(name)
            with self._lock:
                if self._closed:
                    raise ArrayClosedError("the broker is shutting down")
                busy = self._busy.get(name)
                if busy is None and name in self._known:
                    continue  # created meanwhile
                if busy is None:
                    if not self.auto_create and not explicit:
                        raise TopicAutoCreateDisabledError(
                            f"topic {name!r} does not exist and auto.create.topics.enable is false"
                        )
                    if self.max_topics > 0 and len(self._known) + self._creating >= self.max_topics:
                        raise TopicLimitError(
                            f"cannot create topic {name!r}: the broker holds max.topics={self.max_topics} topics"
                        )
                    busy = self._busy[name] = threading.Event()
                    self._creating += 1
                    mine = True
                else:
                    mine = False
            if not mine:
                self._wait_busy(name, busy, deadline)
                continue
            try:
                return self._create(name, items, counts, kind)
            finally:
                with self._lock:
                    self._creating -= 1
                self._release(name, busy)

    def get_or_create(self, name: str) -> Topic:
        """The topic called ``name``, opened, or created empty even with auto-creation
        off (an explicit creation: Kafka's CreateTopics, tools and tests; a produce
        creates topics with their first items, :meth:`create_and_append`)."""
        return self.create_and_append(name, [], explicit=True)[0]

    @staticmethod
    def _append(
        queue: FanoutQueue, items: Sequence[bytes | bytearray | memoryview], counts: Sequence[int] | None, kind: int
    ) -> int:
        if len(items) == 1:
            return queue.enqueue(items[0], 1 if counts is None else counts[0], kind)
        return queue.enqueue_many(items, counts, kind)

    def _create(
        self, name: str, items: Sequence[bytes | bytearray | memoryview], counts: Sequence[int] | None, kind: int
    ) -> tuple[Topic, int]:
        """Create topic ``name`` holding ``items`` (the caller holds its busy mark)."""
        self._make_room()
        path = os.path.join(self.data_dir, name)
        made = False
        queue: FanoutQueue | None = None
        try:
            try:
                os.mkdir(path)
                made = True
            except FileExistsError:
                pass  # a directory put there from outside: it is taken as the topic's
            queue = self._open_queue(path)
            index = self._append(queue, items, counts, kind)
        except BaseException:
            if queue is not None:
                with contextlib.suppress(Exception):
                    queue.close()
            if made:
                self._discard(path)
            raise
        topic = Topic(name, queue)
        with self._lock:
            self._known[name] = topic
            self.opens_total += 1
            if not self._closed:
                self._open[name] = topic
        if self._closed:  # shut down meanwhile: the items are in, the topic stays closed
            queue.close()
            return topic, index
        with self.created:
            self.created.notify_all()
        log.info("created topic %r", name)
        return topic, index

    @staticmethod
    def _wait_busy(name: str, busy: threading.Event, deadline: float) -> None:
        """Wait until another thread's creation, opening, closing or deletion of topic
        ``name`` ends (``busy`` set), at the latest until the monotonic ``deadline``."""
        if not busy.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"topic {name!r} stayed busy (opening, closing or deleting) for too long")

    def _release(self, name: str, busy: threading.Event) -> None:
        with self._lock:
            if self._busy.get(name) is busy:
                del self._busy[name]
        busy.set()

    # -- closing least recently used topics ----------------------------------------------
    def _make_room(self) -> None:
        """Close least recently used topics so one more fits under ``max_open_topics``."""
        victims: list[tuple[Topic, threading.Event]] = []
        with self._lock:
            excess = len(self._open) + 1 - self.max_open_topics
            if excess <= 0:
                return
            for _ in range(2 * len(self._open)):
                if len(victims) >= excess or not self._open:
                    break
                name, topic = next(iter(self._open.items()))
                del self._open[name]
                if topic.used or topic.waiters:
                    topic.used = False  # second chance: to the back of the line
                    self._open[name] = topic
                    continue
                busy = self._busy[name] = threading.Event()
                victims.append((topic, busy))
            self.lru_closes_total += len(victims)
        if len(victims) < excess:
            _limited.warning(
                "open-limit", "more than max.open.topics=%d topics are in use at once", self.max_open_topics
            )
        for topic, busy in victims:
            try:
                queue = topic.queue
                start: int | None = None
                with contextlib.suppress(Exception):  # (then the next read reopens the topic)
                    start = queue.array.log_start_offset  # reads the index: before closing
                queue.close()  # appends in flight finish first: next_offset is final after it
                if start is not None:
                    topic.idle = (start, queue.array.next_offset)
                view = TopicView(topic.name, topic.stats, QueueSnapshot(topic.queue.path))
                with self._lock:
                    self._snapshots[topic.name] = view
            except Exception as exc:
                _limited.error("close", "closing topic %r failed: %s", topic.name, exc)
            finally:
                self._release(topic.name, busy)

    # -- deletion ----------------------------------------------------------------------
    def add_delete_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(name)`` after each luxun topic is deleted (a door forgets what it
        keeps in memory about it). A listener that raises is logged and skipped."""
        self._delete_listeners.append(listener)

    def delete(self, name: str) -> bool:
        """Delete a topic, its Kafka partitions (``name~p``) and their files (group
        positions and committed offsets live there); False if none of them existed.

        When this returns, the names are free: a produce creates a new, empty topic.
        """
        partitions = [other for other in self.names() if partition_of(other)[0] == name and other != name]
        found = self._delete_one(name)
        for other in partitions:
            found = self._delete_one(other) or found
        return found

    def _delete_one(self, name: str) -> bool:
        deadline = time.monotonic() + _BUSY_WAIT_S
        while True:
            with self._lock:
                busy = self._busy.get(name)
                if busy is None:
                    if name not in self._known or self._closed:
                        return False
                    topic = self._known.pop(name)
                    self._open.pop(name, None)
                    self._snapshots.pop(name, None)
                    busy = self._busy[name] = threading.Event()
                    break
            self._wait_busy(name, busy, deadline)
        try:
            if topic is not None:
                topic.deleted = True
                topic.queue.close()  # appends in flight finish first; later ones fail
                with topic.cond:
                    topic.cond.notify_all()
            self._discard(os.path.join(self.data_dir, name))
        finally:
            self._release(name, busy)
        for listener in self._delete_listeners:
            try:
                listener(name)
            except Exception:
                log.exception("forgetting deleted topic %r failed", name)
        log.info("deleted topic %r", name)
        return True

    def _discard(self, path: str) -> None:
        """Move a topic directory out of the way at once and remove it in the background."""
        trash = os.path.join(self.data_dir, TRASH_PREFIX + uuid.uuid4().hex)
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("cannot rename %s to %s (%s): removing it in place", path, trash, exc)
            shutil.rmtree(path, ignore_errors=True)
            if os.path.exists(path):
                raise
            return
        thread = threading.Thread(target=self._remove_trash, args=(trash,), name="luxun-trash", daemon=True)
        thread.start()
        self._trash_threads = [t for t in self._trash_threads if t.is_alive()] + [thread]

    @staticmethod
    def _remove_trash(trash: str) -> None:
        for attempt in range(50):
            shutil.rmtree(trash, ignore_errors=True)
            if not os.path.exists(trash):
                return
            time.sleep(0.1 * (attempt + 1))  # e.g. too many open files just now
        log.warning("could not remove %s; it is removed at the next start", trash)

    # -- listing -----------------------------------------------------------------------
    def topics(self) -> list[Topic]:
        """The open topics, sorted by name."""
        with self._lock:
            return [self._open[k] for k in sorted(self._open)]

    def names(self) -> list[str]:
        """Every topic's name, open or not, sorted."""
        with self._lock:
            return sorted(self._known)

    def count(self) -> int:
        """How many topics exist."""
        return len(self._known)

    def open_count(self) -> int:
        """How many topics are open now."""
        return len(self._open)

    def __iter__(self) -> Iterator[Topic]:
        return iter(self.topics())

    def views(self) -> list[Any]:
        """Every topic for the metrics, sorted by name: open ones live, the others from
        sizes cached when they were closed (or read once from their files)."""
        with self._lock:
            known = dict(self._known)
            opened = dict(self._open)
            cached = dict(self._snapshots)
        out: list[Any] = []
        for name in sorted(known):
            if name in opened:
                out.append(opened[name])
                continue
            view = cached.get(name)
            if view is None:
                topic = known[name]
                stats = topic.stats if topic is not None else TopicStats()
                view = TopicView(name, stats, QueueSnapshot(os.path.join(self.data_dir, name)))
                with self._lock:
                    if name in self._known and name not in self._open:
                        self._snapshots[name] = view
            out.append(view)
        return out

    def idle_offsets(self, name: str) -> tuple[int, int] | None:
        """``(log_start_offset, next_offset)`` of topic ``name`` if it was closed to make
        room and is not open now (nothing was appended since: an append reopens it), else
        None. Lets a reader that is at the end see so without reopening the topic."""
        topic = self._known.get(name)
        if topic is None or name in self._open:
            return None
        return topic.idle

    # -- long polls --------------------------------------------------------------------
    def watch(self, name: str, event: threading.Event) -> Topic | None:
        """Set ``event`` on every append to topic ``name`` until ``unwatch(event)`` on
        the topic returned (None: no such topic). The topic is opened only if it was
        never opened since the start; it is not kept open (unlike :meth:`wait_for`), so a
        Fetch of many partitions does not hold them all open while it waits.

        Raises:
            OSError: the topic could not be opened (e.g. too many open files).
        """
        topic = self._known.get(name)
        if topic is None:
            topic = self.open(name)
            if topic is None:
                return None
        topic.watch(event)
        return topic

    def wait_for(self, name: str, ready: Callable[[Topic | None], bool], timeout_s: float) -> Topic | None:
        """Wait up to ``timeout_s`` until ``ready(topic)`` is true; return the topic
        (None if it does not exist or was deleted).

        ``ready`` is evaluated under the topic's condition, so a produce between the
        check and the wait is never missed. A waiting topic is never closed to make room.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            topic = self.get(name) or self.open(name)
            if topic is None:
                with self.created:
                    if name in self._open or name in self._busy:
                        continue
                    if ready(None) or self._closed:
                        return None
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    self.created.wait(remaining)
                    continue
            with topic.cond:
                topic.waiters += 1
                try:
                    try:
                        if ready(topic) or self._closed or topic.deleted:
                            return None if topic.deleted else topic
                    except ArrayClosedError:
                        if topic.deleted or self._closed:
                            return None
                        continue  # closed to make room just before we registered: reopen
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return topic
                    topic.cond.wait(remaining)
                finally:
                    topic.waiters -= 1
            if topic.deleted:
                return None
            if time.monotonic() >= deadline:
                return topic

    def known(self, name: str) -> bool:
        """Whether topic ``name`` exists (open or not)."""
        return name in self._known

    @property
    def closed(self) -> bool:
        """True once :meth:`close` started (the broker is stopping)."""
        return self._closed

    def wake_all(self) -> None:
        """Wake every waiting consumer (used at shutdown)."""
        with self.created:
            self.created.notify_all()
        with self._lock:
            topics = [t for t in self._known.values() if t is not None]
        for topic in topics:
            with topic.cond:
                topic.cond.notify_all()
                for event in topic.watchers:
                    event.set()

    def flush(self) -> None:
        """msync every open topic."""
        for topic in self.topics():
            with contextlib.suppress(Exception):
                topic.queue.flush()

    def close(self) -> None:
        """Flush and close every topic and release the data directory."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            topics = list(self._open.values())
            self._open.clear()
        self.wake_all()
        clean = True
        for topic in topics:
            try:
                topic.queue.close()
            except Exception:
                clean = False
                log.exception("closing topic %r failed", topic.name)
        for thread in self._trash_threads:
            thread.join(10)
        if clean:  # as Java Luxun: an empty marker, created while the directory is still locked
            try:
                os.close(os.open(os.path.join(self.data_dir, CLEAN_SHUTDOWN_FILE), os.O_WRONLY | os.O_CREAT, 0o644))
            except OSError as exc:
                log.warning("could not create %s in %s: %s", CLEAN_SHUTDOWN_FILE, self.data_dir, exc)
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)


def validate_topic(name: object) -> str:
    """Check a topic name against the topic-name rules (:mod:`idl.names`, the same for
    every door, the agent and the CLI; they hold bigarray's rules for directory names).

    Raises:
        bigarray.InvalidNameError: naming the rule that was broken.
    """
    problem = topic_name_problem(name)  # one scan of a legal name (every call that names a topic)
    if problem is not None:
        validate_name(name, what="topic")  # bigarray's words, where it has a rule for it
        raise InvalidNameError(f"topic {name!r}: {problem}")
    assert isinstance(name, str)
    return name


def is_fd_exhaustion(exc: BaseException) -> bool:
    """True for "too many open files" (per process or system wide)."""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


__all__ = [
    "AUTO_MAX_OPEN_TOPICS",
    "CLEAN_SHUTDOWN_FILE",
    "FDS_PER_OPEN_TOPIC_WORST",
    "FDS_RESERVED",
    "LOCK_FILE",
    "MAPS_PER_OPEN_TOPIC_WORST",
    "MAPS_RESERVED",
    "RESERVED_PREFIX",
    "TRASH_PREFIX",
    "DataDirLockedError",
    "QueueSnapshot",
    "Topic",
    "TopicAutoCreateDisabledError",
    "TopicLimitError",
    "TopicManager",
    "TopicStorageError",
    "TopicView",
    "UnknownTopicError",
    "is_fd_exhaustion",
    "open_topics_limit",
    "validate_topic",
]
