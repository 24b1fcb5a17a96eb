"""Kafka committed offsets, kept on the topics' committed positions.

Kafka group ``G``'s committed offset on partition ``p`` of topic ``T`` is the committed
position of fanout group ``G`` on the luxun topic ``partition_topic(T, p)``
(``committed_<G>/page-0.dat`` in that topic's directory, see ``bigarray.format``):

* the index is the item that holds the committed record offset
  (``BigArray.find_offset``: a Kafka offset inside a batch item commits that item), so
  a Thrift client's ``getCommitted`` of group ``G`` reads on from the same place (it
  re-reads the whole item: at-least-once);
* the exact record offset is stored beside it (``FanoutQueue.commit(..., offset=)``)
  and is what OffsetFetch answers, with the leader epoch the commit gave (OffsetCommit
  v6+, ``leader_epoch=``; in the same committed page, -1 when none was given); a
  position committed by a Thrift client (an index without an offset) reads as the
  first offset of that item.

So commits are crash-safe (written through the mapped page before the answer) and
survive a broker restart. The commit's metadata string is kept in memory only (it is
lost on a restart; OffsetFetch then answers ``""``).

One group across both doors (docs/groups.md): a group that has committed a position
on a topic is an at-least-once group for the Thrift port too
(``luxun/thrift/service.py``): consumes of it that move the position on their own are
refused there. The other way round, a group that Thrift consumers read by group on a
topic (its position moves as they read: a ``front_index_<G>`` without a committed
page) is theirs on that topic: a Kafka commit to it, or a fetch of its committed offset,
is refused with GROUP_AUTHORIZATION_FAILED, so a Kafka client can neither turn it into
an at-least-once group under them nor (by DeleteGroups after a commit) rewind it.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from bigarray import ArrayClosedError, IndexOutOfRangeError
from bigarray.format import COMMITTED_DIR_PREFIX, FRONT_DIR_PREFIX, page_file_name

from ..logs import RateLimitedLog
from ..partitions import partition_of, partition_topic
from ..topics import Topic, TopicManager
from .log import legal_topic_name

__all__ = ["NO_OFFSET", "OffsetStore"]

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

#: The committed offset of a partition the group never committed (Kafka's INVALID_OFFSET).
NO_OFFSET = -1

#: Kafka's offset.metadata.max.bytes default.
DEFAULT_MAX_METADATA_BYTES = 4096


class OffsetStore:
    """Commits and reads Kafka group offsets on the topics of ``topics``.

    Args:
        topics: the broker's topic manager.
        max_metadata_bytes: longest commit metadata string accepted (UTF-8 bytes);
            longer ones get OFFSET_METADATA_TOO_LARGE.
    """

    def __init__(self, topics: TopicManager, *, max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES) -> None:
        self.topics = topics
        self.max_metadata_bytes = max_metadata_bytes
        self._lock = threading.Lock()
        #: (group, luxun topic) -> the metadata of the last commit (in memory only).
        self._metadata: dict[tuple[str, str], str] = {}
        topics.add_delete_listener(self._forget)

    def _forget(self, name: str) -> None:
        """Luxun topic ``name`` was deleted (by either door): its commits' metadata goes too."""
        with self._lock:
            for key in [k for k in self._metadata if k[1] == name]:
                del self._metadata[key]

    def commit(
        self, group: str, topic: str, partition: int, offset: int, metadata: str | None, leader_epoch: int = -1
    ) -> ErrorCode:
        """Commit ``offset`` (the next record the group reads) of ``group`` on
        ``partition`` of ``topic``, with the ``leader_epoch`` the client gives (OffsetCommit
        v6+; -1: none); the error code of the partition's answer."""
        if metadata is not None and len(metadata.encode()) > self.max_metadata_bytes:
            return ErrorCode.offset_metadata_too_large
        if offset < 0:  # Kafka stores it; a committed position cannot point before offset 0
            return ErrorCode.invalid_request
        name = _luxun_name(topic, partition)
        if name is None:
            return ErrorCode.unknown_topic_or_partition

        def do(t: Topic) -> ErrorCode:
            queue = t.queue
            array = queue.array
            if _read_by_thrift(t, group):
                _limited.warning(
                    f"thrift-group-{name}",
                    "Kafka commit of group %r on topic %r refused: Thrift consumers read that group by "
                    "group on that topic (its position moves as they read); use another group id",
                    group,
                    name,
                )
                return ErrorCode.group_authorization_failed
            epoch = leader_epoch if 0 <= leader_epoch < 1 << 31 else None
            try:
                queue.commit(group, array.find_offset(offset), offset=offset, leader_epoch=epoch)
            except IndexOutOfRangeError:  # retention moved tail past it meanwhile
                queue.commit(group, array.find_offset(offset), offset=offset, leader_epoch=epoch)
            with self._lock:
                if metadata:
                    self._metadata[(group, name)] = metadata
                else:
                    self._metadata.pop((group, name), None)
            return ErrorCode.none

        return self._on_topic(name, do, "commit", ErrorCode.unknown_topic_or_partition)

    def fetch(self, group: str, topic: str, partition: int) -> tuple[int, str, ErrorCode, int]:
        """``(committed offset, metadata, error code, leader epoch)`` of ``group`` on
        ``partition`` of ``topic``: ``(-1, "", NONE, -1)`` when it has none (or the
        partition does not exist, as Kafka answers); leader epoch -1 when the commit gave
        none (a Thrift commit, an OffsetCommit before v6, a commit made before luxun kept
        them)."""
        name = _luxun_name(topic, partition)
        if name is None:
            return NO_OFFSET, "", ErrorCode.none, -1
        found: list[tuple[int, int]] = []

        def do(t: Topic) -> ErrorCode:
            if _read_by_thrift(t, group):
                return ErrorCode.group_authorization_failed
            epoch = t.queue.committed_leader_epoch(group)
            found.append((_committed_offset(t, group), -1 if epoch is None else epoch))
            return ErrorCode.none

        error = self._on_topic(name, do, "fetch", ErrorCode.none)
        offset, epoch = found[0] if found else (NO_OFFSET, -1)
        if offset == NO_OFFSET:
            return NO_OFFSET, "", error, -1
        with self._lock:
            metadata = self._metadata.get((group, name), "")
        return offset, metadata, error, epoch

    def delete(self, group: str, topic: str, partition: int) -> ErrorCode:
        """Delete ``group``'s committed offset on ``partition`` of ``topic`` (Kafka's
        OffsetDelete): its committed page and position go, as a DeleteGroups removes
        them. UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist; NONE for one
        the group has no committed offset on (a position Thrift consumers move by group
        is theirs and stays)."""
        name = _luxun_name(topic, partition)
        if name is None:
            return ErrorCode.unknown_topic_or_partition

        def do(t: Topic) -> ErrorCode:
            if t.queue.committed(group) is not None:
                t.queue.remove_group(group)
            return ErrorCode.none

        error = self._on_topic(name, do, "delete", ErrorCode.unknown_topic_or_partition)
        with self._lock:
            self._metadata.pop((group, name), None)
        return error

    def partitions(self, group: str) -> list[tuple[str, int]]:
        """Every (topic, partition) where ``group`` has a committed position, sorted
        (one directory look-up per topic; topics whose names Kafka does not allow are
        left out, as Metadata leaves them out)."""
        out = []
        data_dir = self.topics.data_dir
        for name in self.topics.names():
            if os.path.isdir(os.path.join(data_dir, name, COMMITTED_DIR_PREFIX + group)):
                topic, partition = partition_of(name)
                if legal_topic_name(topic) is None:
                    out.append((topic, partition))
        return sorted(out)

    def last_commit_age_s(self, group: str) -> float | None:
        """Seconds since ``group``'s committed page was last written on any topic (by
        either door: the page's modification time, which a write through the mapping
        updates within about half a minute), None if it has none."""
        newest = None
        data_dir = self.topics.data_dir
        for topic, partition in self.partitions(group):
            folder = os.path.join(data_dir, partition_topic(topic, partition), COMMITTED_DIR_PREFIX + group)
            page = os.path.join(folder, page_file_name(0))
            try:
                mtime = os.stat(page).st_mtime
            except OSError:
                continue
            newest = mtime if newest is None else max(newest, mtime)
        return None if newest is None else max(0.0, time.time() - newest)

    def has_offsets(self, group: str) -> bool:
        """True if ``group`` has a committed position on some topic."""
        return bool(self.partitions(group))

    def groups(self) -> set[str]:
        """Every group with a committed position on some topic Kafka clients see (a
        scan of the topics' directories)."""
        out: set[str] = set()
        data_dir = self.topics.data_dir
        for name in self.topics.names():
            if legal_topic_name(partition_of(name)[0]) is not None:
                continue
            try:
                entries = os.listdir(os.path.join(data_dir, name))
            except OSError:
                continue
            out.update(e[len(COMMITTED_DIR_PREFIX) :] for e in entries if e.startswith(COMMITTED_DIR_PREFIX))
        return out

    def delete_group(self, group: str) -> None:
        """Forget ``group``'s positions (committed and not) on every topic."""
        for topic, partition in self.partitions(group):
            name = partition_topic(topic, partition)

            def do(t: Topic) -> ErrorCode:
                t.queue.remove_group(group)
                return ErrorCode.none

            if self._on_topic(name, do, "delete", ErrorCode.none) is not ErrorCode.none:
                # not open-able: remove the directories (the topic is not in use)
                shutil.rmtree(os.path.join(self.topics.data_dir, name, COMMITTED_DIR_PREFIX + group), True)
        with self._lock:
            for key in [k for k in self._metadata if k[0] == group]:
                del self._metadata[key]

    def _on_topic(self, name: str, action: Callable[[Topic], ErrorCode], what: str, missing: ErrorCode) -> ErrorCode:
        """``action(topic)`` on luxun topic ``name`` (opened if needed; once more if it
        was closed under it to make room); ``missing`` when there is no such topic."""
        try:
            for _ in range(2):
                topic = self.topics.get(name) or self.topics.open(name)
                if topic is None:
                    return missing
                try:
                    return action(topic)
                except ArrayClosedError:
                    continue
        except Exception:
            _limited.exception(f"offsets-{what}", "offset %s on topic %r failed", what, name)
            return ErrorCode.unknown_server_error
        return ErrorCode.coordinator_load_in_progress  # closed twice in a row: the client retries


def _luxun_name(topic: Any, partition: Any) -> str | None:
    """The luxun topic of (topic, partition), None when no such partition can exist."""
    if not isinstance(topic, str) or not topic or not isinstance(partition, int) or partition < 0:
        return None
    try:
        name = partition_topic(topic, partition)
        TopicManager.validate(name)
    except ValueError:
        return None
    return name


def _read_by_thrift(topic: Topic, group: str) -> bool:
    """Whether Thrift consumers read ``group`` on ``topic`` by group (at-most-once: a
    position and no committed one; only Thrift's consume by group makes that)."""
    queue = topic.queue
    return queue.committed(group) is None and os.path.isdir(os.path.join(queue.path, FRONT_DIR_PREFIX + group))


def _committed_offset(topic: Topic, group: str) -> int:
    """The group's committed record offset on ``topic``, -1 if it never committed."""
    queue = topic.queue
    offset: int | None = queue.committed_offset(group)
    if offset is not None:
        return offset
    index = queue.committed(group)
    if index is None:
        return NO_OFFSET
    array = queue.array
    index = max(index, array.tail)
    if index >= array.head:
        return int(array.next_offset)
    return int(array.first_offset(index))
