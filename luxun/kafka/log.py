"""Kafka topics and partitions on luxun topics: produce, fetch, offsets, metadata.

Storage (see :mod:`luxun.kafka`): partition p of topic T is the luxun topic
``partition_topic(T, p)``. A record batch (magic 2) is validated from its header and
CRC-32C and appended as ONE item of kind ``KIND_KAFKA_BATCH`` holding as many record
offsets as it has records; the big array numbers the records (``next_offset``), so
offsets mean what Kafka users expect and continue across restarts. A fetch reads the
items holding the asked offset onwards and writes each batch's base offset into the
reply (the stored bytes are never rewritten); items written by Thrift clients (one
record each) are served as record batches built on the fly.

Time: records keep the timestamps their producer gave (CreateTime; a LogAppendTime
topic's batches are restamped with the append time before they are stored), and
ListOffsets by time answers as Kafka's broker does: the first offset whose record
timestamp is at or after the target, with that record's timestamp, found through the
partition's time index (:mod:`.timeindex`), which each produce extends by its
batches' max timestamps under the partition's lock.

A topic's Kafka settings live in ``kafka.json`` in the directory of its partition 0
(``partitions``, ``topic_id``, ``timestamp_type``, the ``configs`` given at creation,
see :mod:`.topic_configs`); a luxun topic without one is a one-partition topic with
CreateTime and a topic id derived from its name. Java Luxun ignores the file. Two of
the configs act on every produce: ``max.message.bytes`` (:meth:`KafkaLog._too_large`,
instead of the broker's ``message.max.bytes``) and ``compression.type`` (a batch of
another codec re-encoded by :func:`luxun.records.validate`); both are read once into
the cached :class:`TopicInfo`. A
creation writes it last (as ``kafka.json.tmp`` first, which marks the creation as
under way); :func:`remove_interrupted_creations` removes at start what a crash left.

Idempotent producers: per partition, the last sequence numbers of each producer id
(the last five batches, as Kafka) are kept in memory: a retried batch is answered
with the offset it was stored at and not stored again; a gap is answered
OUT_OF_ORDER_SEQUENCE_NUMBER. After a broker restart this state is rebuilt from the
last batches of each partition when the partition is first produced to.

Transactions (see :mod:`.transactions` and docs/kafka-transactions.md): a batch with
the transactional bit is stored only if its producer's open transaction (the
coordinator's ``check_produce``, :attr:`KafkaLog.transactions`) holds the partition
with the producer's epoch; the markers come through :meth:`KafkaLog.write_marker`;
each partition's open and aborted transactions are a :class:`~.txnindex.TxnIndex`,
from which a read_committed Fetch gets its last stable offset and aborted list.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import os
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from bigarray import ArrayClosedError, IndexOutOfRangeError, InvalidNameError, ItemTooLargeError
from bigarray import format as fmt

from .. import records as rec
from ..dynamic import DynamicBrokerConfigs, cleanup_policy
from ..files import replace_file
from ..logs import RateLimitedLog
from ..partitions import KIND_KAFKA_BATCH, PARTITION_SEPARATOR, partition_of, partition_topic
from ..topics import (
    RESERVED_PREFIX,
    TRASH_PREFIX,
    Topic,
    TopicLimitError,
    TopicManager,
    TopicStorageError,
    UnknownTopicError,
)
from .logstart import LogStarts
from .timeindex import TimeIndex
from .topic_configs import ConfigProblem, check_topic_configs
from .txnindex import TxnIndex, control_batch, control_type

__all__ = [
    "FetchResult",
    "KafkaLog",
    "ProduceResult",
    "TopicInfo",
    "legal_topic_name",
    "remove_interrupted_creations",
]

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

SETTINGS_FILE: Final = "kafka.json"
_TOPIC_ID_NAMESPACE: Final = uuid.UUID("6c757875-6e2d-6b61-666b-612d746f7069")
#: Kafka's legal topic names (other luxun topics are not shown to Kafka clients).
_LEGAL: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_MAX_NAME: Final = 249
#: Batches of one producer remembered per partition for deduplication (Kafka: 5).
_PRODUCER_BATCHES: Final = 5
#: Items scanned back at a partition's first produce to rebuild producer state.
_REBUILD_ITEMS: Final = 1000

_I64 = struct.Struct(">q")
#: compression.type -> the codec batches are stored with (``producer``: absent, as sent).
_CODECS: Final = {
    "uncompressed": rec.CODEC_NONE,
    "gzip": rec.CODEC_GZIP,
    "snappy": rec.CODEC_SNAPPY,
    "lz4": rec.CODEC_LZ4,
    "zstd": rec.CODEC_ZSTD,
}

# Kafka error codes used here (kio.schema.errors.ErrorCode values).
NONE: Final = 0
OFFSET_OUT_OF_RANGE: Final = 1
CORRUPT_MESSAGE: Final = 2
UNKNOWN_TOPIC_OR_PARTITION: Final = 3
MESSAGE_TOO_LARGE: Final = 10
INVALID_TOPIC_EXCEPTION: Final = 17
RECORD_LIST_TOO_LARGE: Final = 18
KAFKA_STORAGE_ERROR: Final = 56
TOPIC_ALREADY_EXISTS: Final = 36
INVALID_PARTITIONS: Final = 37
INVALID_REPLICATION_FACTOR: Final = 38
INVALID_CONFIG: Final = 40
POLICY_VIOLATION: Final = 44
OUT_OF_ORDER_SEQUENCE_NUMBER: Final = 45
INVALID_PRODUCER_EPOCH: Final = 47
TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Final = 53
_TRANSACTIONAL: Final = 0x10  # record batch attributes bit 4
READ_COMMITTED: Final = 1
TOPIC_DELETION_DISABLED: Final = 73
UNKNOWN_SERVER_ERROR: Final = -1


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int
    topic_id: uuid.UUID
    timestamp_type: str = "CreateTime"
    #: The configs given at creation (name -> value), as DescribeConfigs answers them.
    configs: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: Its ``max.message.bytes`` (None: not set, the broker's ``message.max.bytes``).
    max_message_bytes: int | None = None
    #: The codec of its ``compression.type`` (None: ``producer``, batches kept as sent).
    codec: int | None = None
    #: Its ``cleanup.policy`` names ``compact``: every record needs a key (None: it has
    #: none of its own, the broker's ``log.cleanup.policy`` applies).
    compact: bool | None = None


@dataclass
class _ProducerState:
    epoch: int
    #: (first sequence, last sequence, base offset) of its last batches.
    batches: collections.deque[tuple[int, int, int]] = field(
        default_factory=lambda: collections.deque(maxlen=_PRODUCER_BATCHES)
    )


@dataclass
class _PartitionState:
    lock: threading.Lock = field(default_factory=threading.Lock)
    producers: dict[int, _ProducerState] = field(default_factory=dict)
    rebuilt: bool = False
    #: The partition's time index, once used (under ``lock``).
    times: TimeIndex | None = None
    #: Its open and aborted transactions, once loaded (under ``lock``; with ``rebuilt``).
    txns: TxnIndex | None = None


@dataclass(slots=True)
class ProduceResult:
    error: int = NONE
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    message: str | None = None
    #: (index of the record in its batch, message) of records refused (KIP-467).
    record_errors: tuple[tuple[int, str | None], ...] = ()


@dataclass
class FetchResult:
    error: int = NONE
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes | bytearray | None = None
    #: -1: the high watermark (read_uncommitted answers do not look).
    last_stable_offset: int = -1
    #: (producer id, first offset) of aborted transactions in the answer (read_committed).
    aborted: list[tuple[int, int]] | None = None


def legal_topic_name(name: str) -> str | None:
    """None if ``name`` is a legal Kafka topic name, else why not."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name {name!r} is not allowed"
    if len(name) > _MAX_NAME:
        return f"topic name has {len(name)} characters; at most {_MAX_NAME} are allowed"
    bad = sorted(set(name) - _LEGAL)
    if bad:
        return f"topic name {name!r} contains {''.join(bad)!r}; only ASCII letters, digits, '.', '_' and '-' are legal"
    return None


class KafkaLog:
    """The Kafka view of a :class:`~luxun.topics.TopicManager`'s topics.

    Args:
        topics: the broker's topics (shared with the Thrift port).
        num_partitions: partitions of an auto-created topic (``num.partitions``).
        delete_enable: whether DeleteTopics may delete (``delete.topic.enable``).
        max_message_bytes: largest record batch accepted (``message.max.bytes``).
    """

    def __init__(
        self,
        topics: TopicManager,
        *,
        num_partitions: int = 1,
        delete_enable: bool = False,
        max_message_bytes: int = 1 << 20,
        broker_configs: DynamicBrokerConfigs | None = None,
    ) -> None:
        self.topics = topics
        #: The broker's configs set at run time: its ``log.cleanup.policy`` applies to
        #: topics without a ``cleanup.policy`` of their own (None: Kafka's default, delete).
        self.broker_configs = broker_configs
        self.num_partitions = num_partitions
        self.delete_enable = delete_enable
        self.max_message_bytes = max_message_bytes
        self._infos: dict[str, TopicInfo] = {}
        self._infos_lock = threading.Lock()
        self._states: dict[str, _PartitionState] = {}
        self._states_lock = threading.Lock()
        self._producer_ids = int(time.time() * 1000) << 10
        self._producer_lock = threading.Lock()
        #: The transaction coordinator's check of a transactional batch: ``(producer id,
        #: epoch, luxun topic) -> (error, message) or None``; None: transactions off.
        self.transactions: Any = None
        #: Held while a topic's settings change (partitions added, configs altered).
        self._alter_lock = threading.Lock()
        self._starts = LogStarts(topics.data_dir)
        topics.add_delete_listener(self._forget)

    def _forget(self, name: str) -> None:
        """A luxun topic was deleted (by either door): its producer sequences and, for a
        partition 0, its topic's settings go with it."""
        with self._states_lock:
            self._states.pop(name, None)
        self._starts.forget(name)
        topic, partition = partition_of(name)
        if partition == 0:
            with self._infos_lock:
                self._infos.pop(topic, None)

    # -- topics ------------------------------------------------------------------------
    def _settings_path(self, topic: str) -> str:
        return os.path.join(self.topics.data_dir, topic, SETTINGS_FILE)

    def describe(self, topic: str) -> TopicInfo | None:
        """The topic's partitions, id and timestamp type; None if it does not exist."""
        info = self._infos.get(topic)
        if info is not None and self.topics.known(topic):
            return info
        if not self.topics.known(topic) or legal_topic_name(topic) is not None:
            return None
        path = self._settings_path(topic)
        if os.path.exists(path + ".tmp"):
            # Being created (or its creation was interrupted): not a topic yet. Checked
            # before reading kafka.json, which replaces the .tmp in one rename.
            return None
        settings = self._read_settings(topic)
        try:
            topic_id = uuid.UUID(str(settings["topic_id"]))
        except (KeyError, ValueError):
            topic_id = uuid.uuid5(_TOPIC_ID_NAMESPACE, topic)
        configs = settings.get("configs")
        kept = {str(k): str(v) for k, v in configs.items()} if isinstance(configs, dict) else {}
        info = TopicInfo(
            topic,
            max(1, int(settings.get("partitions", 1))),
            topic_id,
            str(settings.get("timestamp_type", "CreateTime")),
            kept,
            int(kept["max.message.bytes"]) if "max.message.bytes" in kept else None,
            _CODECS.get(kept.get("compression.type", "producer")),
            ("compact" in cleanup_policy(kept["cleanup.policy"])) if "cleanup.policy" in kept else None,
        )
        with self._infos_lock:
            self._infos[topic] = info
        return info

    def list_topics(self) -> list[TopicInfo]:
        """Every topic a Kafka client may see (luxun topics with legal Kafka names)."""
        out = []
        for name in self.topics.names():
            if PARTITION_SEPARATOR in name:
                continue
            info = self.describe(name)
            if info is not None:
                out.append(info)
        return out

    def create(
        self,
        topic: str,
        partitions: int,
        *,
        timestamp_type: str = "CreateTime",
        configs: Iterable[tuple[str, str | None]] = (),
        validate_only: bool = False,
        reserved: int = 0,
    ) -> tuple[int, str | None]:
        """Create a topic with ``partitions`` partitions: ``(error code, message)``.

        ``configs``: the request's ``(name, value)`` pairs, checked by
        :func:`~luxun.kafka.topic_configs.check_topic_configs` (INVALID_CONFIG naming
        the first refused one) and kept in ``kafka.json`` for DescribeConfigs; a
        ``message.timestamp.type`` among them wins over ``timestamp_type``.
        ``reserved``: luxun topics that earlier topics of the same validate-only
        request would take, so that its answer is the one creating them all would give.

        Checks, in Kafka's order where Kafka has them: the name, the topic's existence,
        the partition count, the configs, then ``max.topics``. All come before anything
        is made; with ``validate_only`` nothing is made. Then, in this
        order (what :func:`remove_interrupted_creations` relies on after a crash): the
        topic's directory appears holding ``kafka.json.tmp`` (renamed into place, so it
        never exists without it), partitions n-1..1 are made, partition 0 takes that
        directory, and ``kafka.json`` replaces the ``.tmp``: from then on Kafka clients
        see the topic. A failure on the way removes what was made.
        """
        why = legal_topic_name(topic)
        if why is not None:
            return INVALID_TOPIC_EXCEPTION, why
        if self.describe(topic) is not None:
            return TOPIC_ALREADY_EXISTS, f"topic {topic!r} already exists"
        if partitions < 1:
            return INVALID_PARTITIONS, f"number of partitions must be at least 1, not {partitions}"
        if partitions > 10_000:
            return INVALID_PARTITIONS, f"at most 10000 partitions per topic, not {partitions}"
        try:
            kept = check_topic_configs(configs, max_item_bytes=self.topics.max_item_bytes)
        except ConfigProblem as exc:
            return INVALID_CONFIG, str(exc)
        timestamp_type = kept.get("message.timestamp.type", timestamp_type)
        if timestamp_type not in ("CreateTime", "LogAppendTime"):
            return INVALID_CONFIG, f"message.timestamp.type must be CreateTime or LogAppendTime, not {timestamp_type!r}"
        limit, held = self.topics.max_topics, self.topics.count() + reserved
        if limit > 0 and held + partitions > limit:  # each partition is a luxun topic
            return POLICY_VIOLATION, (
                f"cannot create topic {topic!r} with {partitions} partition(s): the broker holds {held} of "
                f"max.topics={limit} topics (each partition is one)"
            )
        if validate_only:
            return NONE, None
        settings = {
            "partitions": partitions,
            "topic_id": str(uuid.uuid4()),
            "timestamp_type": timestamp_type,
            "configs": kept,
        }
        try:
            self._stage_directory(topic, settings)
        except FileExistsError:
            return TOPIC_ALREADY_EXISTS, f"topic {topic!r} is being created"
        except OSError as exc:
            log.warning("cannot create topic %r: %s", topic, exc)
            return KAFKA_STORAGE_ERROR, f"cannot create topic {topic!r}: {exc}"
        path = self._settings_path(topic)
        # partition 0 last: it takes the staged directory
        code, message = self._make_partitions(
            topic,
            range(partitions - 1, -1, -1),
            lambda: os.replace(path + ".tmp", path),
            lambda made: self._undo_create(topic, made),
            f"create topic {topic!r}",
        )
        if code != NONE:
            return code, message
        with self._infos_lock:
            self._infos.pop(topic, None)
        log.info("created topic %r with %d partitions (Kafka)", topic, partitions)
        return NONE, None

    def _stage_directory(self, topic: str, settings: dict[str, Any]) -> None:
        """Make the directory of ``topic``'s partition 0 holding ``kafka.json.tmp``: built
        under a trash name (removed at start if we die meanwhile), then renamed.

        Raises:
            FileExistsError: the directory exists (another creation is under way).
            OSError: the disk refused.
        """
        staging = os.path.join(self.topics.data_dir, TRASH_PREFIX + uuid.uuid4().hex)
        os.mkdir(staging)
        try:
            with open(os.path.join(staging, SETTINGS_FILE + ".tmp"), "w", encoding="utf-8") as f:
                json.dump(settings, f)
                f.flush()
                os.fsync(f.fileno())
            final = os.path.join(self.topics.data_dir, topic)
            if os.path.lexists(final):
                raise FileExistsError(errno.EEXIST, "exists", final)
            os.rename(staging, final)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(*exc.args) from exc
            raise

    def _make_partitions(
        self,
        topic: str,
        numbers: Iterable[int],
        finish: Callable[[], None],
        undo: Callable[[list[str]], None],
        what: str,
    ) -> tuple[int, str | None]:
        """Make the luxun topics of ``topic``'s partitions ``numbers`` in that order (one
        that exists is kept), then ``finish()``; if either fails, ``undo(the ones made)``
        and answer POLICY_VIOLATION (a limit) or KAFKA_STORAGE_ERROR, naming ``what``."""
        made: list[str] = []
        try:
            for p in numbers:
                name = partition_topic(topic, p)
                existed = self.topics.known(name)
                self.topics.get_or_create(name)
                if not existed:
                    made.append(name)
            finish()
        except (TopicLimitError, InvalidNameError) as exc:
            undo(made)
            return POLICY_VIOLATION, str(exc)
        except (OSError, TopicStorageError) as exc:
            undo(made)
            log.warning("cannot %s: %s", what, exc)
            return KAFKA_STORAGE_ERROR, f"cannot {what}: {exc}"
        return NONE, None

    def _undo_create(self, topic: str, made: list[str], *, keep_topic: bool = False) -> None:
        """A creation refused part-way (another creation took the last of max.topics
        meanwhile, a full disk, too many open files): the partitions it made go again,
        and the staged directory of partition 0, so nothing is left behind, invisible
        to Kafka clients and counted against the limit. ``keep_topic``: a refused
        CreatePartitions; only the partitions it made go."""
        for name in made:
            try:
                self.topics.delete(name)
            except Exception:
                log.exception("removing partition %r of the refused topic %r failed", name, topic)
        if keep_topic:
            return
        path = os.path.join(self.topics.data_dir, topic)
        if self.topics.known(topic):  # made by a Thrift produce meanwhile: it stays, without our settings
            with contextlib.suppress(OSError):
                os.remove(self._settings_path(topic) + ".tmp")
            return
        trash = os.path.join(self.topics.data_dir, TRASH_PREFIX + uuid.uuid4().hex)
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        except OSError:
            log.exception("removing the directory of the refused topic %r failed", topic)
            return
        shutil.rmtree(trash, ignore_errors=True)

    def _read_settings(self, topic: str) -> dict[str, Any]:
        """The topic's ``kafka.json`` as a dict (empty: none, or unreadable)."""
        with contextlib.suppress(ValueError, OSError), open(self._settings_path(topic), encoding="utf-8") as f:
            settings = json.load(f)
            return settings if isinstance(settings, dict) else {}
        return {}

    def write_settings(self, topic: str, info: TopicInfo, **changes: Any) -> None:
        """Replace the topic's ``kafka.json`` by ``info``'s settings with ``changes``,
        crash-safely (:func:`luxun.files.replace_file`: after a crash the file is the old
        one or the new one, whole). Forgets the cached info.

        Raises:
            OSError: the disk refused (the old settings stay).
        """
        settings = self._read_settings(topic)
        settings.update(
            partitions=info.partitions,
            topic_id=str(info.topic_id),
            timestamp_type=info.timestamp_type,
            configs=dict(info.configs),
        )
        settings.update(changes)
        replace_file(self._settings_path(topic), json.dumps(settings).encode())
        with self._infos_lock:
            self._infos.pop(topic, None)

    def add_partitions(
        self, topic: str, count: int, *, validate_only: bool = False, reserved: int = 0
    ) -> tuple[int, str | None]:
        """Grow ``topic`` to ``count`` partitions (Kafka's CreatePartitions): ``(error
        code, message)``. Checked as Kafka's broker checks (the topic exists, ``count``
        is more than today's, at most 10000 as at creation), then ``max.topics`` (each new
        partition is a luxun topic; ``reserved``: as in :meth:`create`); with
        ``validate_only`` nothing is made.

        Crash-safe like a creation: the new partitions ``T~n..T~count-1`` are made
        (empty) first, then ``kafka.json`` is rewritten with the new count
        (:meth:`write_settings`): Kafka clients see them from then on. A crash between
        leaves empty partitions beyond the count in ``kafka.json``, which
        :func:`remove_interrupted_creations` removes at the next start.
        """
        with self._alter_lock:
            info = self.describe(topic)
            if info is None:
                return UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{topic}' does not exist."
            if count < info.partitions:
                return INVALID_PARTITIONS, (
                    f"Topic currently has {info.partitions} partitions, which is higher than the requested {count}."
                )
            if count == info.partitions:
                return INVALID_PARTITIONS, f"Topic already has {info.partitions} partitions."
            if count > 10_000:
                return INVALID_PARTITIONS, f"at most 10000 partitions per topic, not {count}"
            added = count - info.partitions
            limit, held = self.topics.max_topics, self.topics.count() + reserved
            if limit > 0 and held + added > limit:
                return POLICY_VIOLATION, (
                    f"cannot add {added} partition(s) to topic {topic!r}: the broker holds {held} of "
                    f"max.topics={limit} topics (each partition is one)"
                )
            if validate_only:
                return NONE, None
            code, message = self._make_partitions(
                topic,
                range(info.partitions, count),
                lambda: self.write_settings(topic, info, partitions=count),
                lambda made: self._undo_create(topic, made, keep_topic=True),
                f"add partitions to topic {topic!r}",
            )
            if code != NONE:
                return code, message
        log.info("topic %r now has %d partitions (was %d, Kafka CreatePartitions)", topic, count, info.partitions)
        return NONE, None

    def alter_configs(
        self,
        topic: str,
        change: Callable[[Mapping[str, str]], Iterable[tuple[str, str | None]]],
        *,
        validate_only: bool = False,
    ) -> tuple[int, str | None]:
        """Replace ``topic``'s configs by ``change(its configs now)`` (AlterConfigs gives
        the whole new set; IncrementalAlterConfigs derives it): ``(error code, message)``.

        The new set is checked as at creation (:func:`check_topic_configs`: INVALID_CONFIG
        naming the first refused config), then kept in ``kafka.json``
        (:meth:`write_settings`, crash-safe) unless ``validate_only``. It takes effect at
        once: ``message.timestamp.type``, ``max.message.bytes`` and ``compression.type``
        for the next produce, ``retention.ms`` and ``retention.bytes`` at the next
        retention pass.

        Raises:
            ConfigProblem: from ``change``, answered as INVALID_CONFIG.
        """
        with self._alter_lock:
            info = self.describe(topic)
            if info is None:
                return UNKNOWN_TOPIC_OR_PARTITION, f"Topic {topic} does not exist"
            try:
                kept = check_topic_configs(change(info.configs), max_item_bytes=self.topics.max_item_bytes)
            except ConfigProblem as exc:
                return INVALID_CONFIG, str(exc)
            if validate_only:
                return NONE, None
            timestamp_type = kept.get("message.timestamp.type", "CreateTime")
            try:
                self.write_settings(topic, info, configs=kept, timestamp_type=timestamp_type)
            except OSError as exc:
                log.warning("cannot change the configs of topic %r: %s", topic, exc)
                return KAFKA_STORAGE_ERROR, f"cannot change the configs of topic {topic!r}: {exc}"
        log.info("topic %r configs now %s (Kafka AlterConfigs)", topic, kept or "the defaults")
        return NONE, None

    def retention_overrides(self, name: str) -> tuple[int | None, int | None]:
        """``retention.ms`` and ``retention.bytes`` given at the creation of the Kafka
        topic whose partition is the luxun topic ``name`` (None: not given; the broker's
        settings apply). For :class:`~luxun.retention.Maintenance` (``topic_overrides``).
        A topic whose ``cleanup.policy`` (its own, else the broker's ``log.cleanup.policy``)
        is ``compact`` alone keeps everything (-1, -1): luxun does not compact, and
        deleting by age or size would lose the last value of a key, which a compacted
        topic keeps."""
        topic = partition_of(name)[0]
        info = self._infos.get(topic) or self.describe(topic)
        if info is None:
            return None, None
        if "cleanup.policy" in info.configs:
            policy = cleanup_policy(info.configs["cleanup.policy"])
        elif self.broker_configs is not None:
            policy = self.broker_configs.cleanup_policy()
        else:
            policy = frozenset(("delete",))
        if policy == {"compact"}:
            return -1, -1
        ms, size = info.configs.get("retention.ms"), info.configs.get("retention.bytes")
        return (None if ms is None else int(ms)), (None if size is None else int(size))

    def flush_override(self, name: str) -> int | None:
        """The ``flush.ms`` of the Kafka topic whose partition is luxun topic ``name``
        (None: not set, or Kafka's default, the largest long: the broker's interval
        applies). For :class:`~luxun.retention.Maintenance` (``flush_overrides``)."""
        info = self._infos.get(partition_of(name)[0]) or self.describe(partition_of(name)[0])
        value = None if info is None else info.configs.get("flush.ms")
        if value is None or int(value) >= (1 << 63) - 1:
            return None
        return int(value)

    def auto_create(self, topic: str) -> tuple[int, str | None]:
        """Create ``topic`` with ``num.partitions`` if auto-creation is on."""
        if not self.topics.auto_create:
            return UNKNOWN_TOPIC_OR_PARTITION, "auto.create.topics.enable is false"
        code, message = self.create(topic, self.num_partitions)
        return (NONE, None) if code == TOPIC_ALREADY_EXISTS else (code, message)

    def delete(self, topic: str) -> tuple[int, str | None]:
        if not self.delete_enable:
            return TOPIC_DELETION_DISABLED, "topic deletion is disabled (delete.topic.enable=false)"
        if self.describe(topic) is None:
            return UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} does not exist"
        self.topics.delete(topic)  # with its partitions; _forget drops what we keep of them
        return NONE, None

    # -- partitions --------------------------------------------------------------------
    def _partition(self, topic: str, partition: int, info: TopicInfo | None = None) -> Topic | None:
        """The open partition ``partition`` of ``topic`` (``info``: its describe() just
        read, if the caller has it); None if there is no such partition."""
        if info is None:
            info = self.describe(topic)
        if info is None or not 0 <= partition < info.partitions:
            return None
        name = partition_topic(topic, partition)
        return self.topics.get(name) or self.topics.open(name)

    @staticmethod
    def _keyless(topic: str, partition: int, missing: Sequence[int]) -> ProduceResult:
        """A compacted topic's refusal of records without a key (``missing``, found by
        :func:`luxun.records.validate` as it read them), as Kafka's broker answers it:
        INVALID_RECORD, each such record in ``record_errors``."""
        message = f"Compacted topic cannot accept message without key in topic partition {topic}-{partition}."
        return ProduceResult(
            error=rec.INVALID_RECORD, message=message, record_errors=tuple((i, message) for i in missing)
        )

    def _state(self, name: str) -> _PartitionState:
        state = self._states.get(name)
        if state is None:
            with self._states_lock:
                state = self._states.setdefault(name, _PartitionState())
        return state

    def next_producer_id(self) -> int:
        with self._producer_lock:
            self._producer_ids += 1
            return self._producer_ids

    def produce(self, topic: str, partition: int, records: bytes | None) -> ProduceResult:
        """Append the record batches of one partition of a Produce request."""
        prepared = self._prepare(topic, partition, records, self.describe(topic))
        if isinstance(prepared, ProduceResult):
            return prepared
        return self._store(topic, partition, prepared[0], [prepared[1]])[0]

    def produce_many(self, topic: str, partition: int, records: Sequence[bytes | None]) -> list[ProduceResult]:
        """:meth:`produce` of several requests' records for the same partition, in order,
        one result each, as if produced one after the other (a refused one stores
        nothing, the others are stored), their batches stored with one append where
        that is the same (none from an idempotent or transactional producer)."""
        info = self.describe(topic)
        prepared = [self._prepare(topic, partition, r, info) for r in records]
        good = [p for p in prepared if not isinstance(p, ProduceResult)]
        stored = iter(self._store(topic, partition, good[0][0], [p[1] for p in good]) if good else ())
        return [p if isinstance(p, ProduceResult) else next(stored) for p in prepared]

    def _prepare(
        self, topic: str, partition: int, records: bytes | None, info: TopicInfo | None
    ) -> ProduceResult | tuple[TopicInfo, list[rec.Batch]]:
        """A Produce's records read and checked before anything is stored: ``(topic's
        info, the batches to store)``, or the refusal. ``info``: the topic's describe()."""
        try:
            batches = rec.split_batches(records or b"")
        except rec.BatchError as exc:
            return ProduceResult(error=exc.code, message=str(exc))
        if not batches:
            return ProduceResult(error=CORRUPT_MESSAGE, message="no record batch in the request")
        too_large = self._too_large(batches, info)
        if too_large is not None:
            return too_large
        codec = None if info is None else info.codec
        # A compacted topic (its own cleanup.policy, else the broker's) needs a key in
        # every record: validation notes the keyless ones while it reads them.
        keys = info is not None and (
            info.compact or (info.compact is None and self.broker_configs is not None and self.broker_configs.compact)
        )
        try:  # every record read before anything is stored (a few ns per record)
            if codec is None and not keys:
                batches = [rec.validate(b) for b in batches]
            else:  # re-encoded where the codec differs: sizes may change (Kafka checks again)
                batches = [rec.validate(b, codec=codec, keys=keys) for b in batches]
                too_large = self._too_large(batches, info) if codec is not None else None
                if too_large is not None:
                    return too_large
        except rec.KeylessRecords as exc:
            return self._keyless(topic, partition, exc.records)
        except rec.BatchError as exc:
            errors = () if exc.record is None else ((exc.record, str(exc)),)
            return ProduceResult(error=exc.code, message=str(exc), record_errors=errors)
        if info is None:
            return ProduceResult(error=UNKNOWN_TOPIC_OR_PARTITION)
        return info, batches

    def _store(
        self, topic: str, partition: int, info: TopicInfo, requests: Sequence[Sequence[rec.Batch]]
    ) -> list[ProduceResult]:
        """Store each request's checked batches, in order: one result each. Requests
        that may be stored together (no producer id: nothing to check against what is
        stored) go in one append; if that append fails, nothing of it was stored, and
        they are stored one by one to answer each as it would have been alone."""
        results: list[ProduceResult] = []
        one_by_one = len(requests) == 1 or any(b.producer_id >= 0 for batches in requests for b in batches)
        log_append = info.timestamp_type == "LogAppendTime"
        for attempt in range(3):
            part = self._partition(topic, partition, None if attempt else info)  # looked up again after a close
            if part is None:
                break
            state = self._state(part.name)
            try:
                with state.lock:
                    while len(results) < len(requests):
                        todo = requests[len(results) : len(results) + 1] if one_by_one else requests[len(results) :]
                        try:
                            results += self._append(part, state, todo, log_append)
                        except (ItemTooLargeError, TopicStorageError) as exc:
                            if len(todo) > 1:
                                one_by_one = True
                                continue
                            code = MESSAGE_TOO_LARGE if isinstance(exc, ItemTooLargeError) else KAFKA_STORAGE_ERROR
                            results.append(ProduceResult(error=code, message=str(exc)))  # (storage errors logged)
                return results
            except ArrayClosedError:
                continue  # closed to make room, or deleted: look again
            except UnknownTopicError:
                break
        return results + [ProduceResult(error=UNKNOWN_TOPIC_OR_PARTITION) for _ in requests[len(results) :]]

    def _too_large(self, batches: Sequence[rec.Batch], info: TopicInfo | None) -> ProduceResult | None:
        """MESSAGE_TOO_LARGE if a batch is larger than the topic's ``max.message.bytes``
        (the broker's ``message.max.bytes`` where the topic sets none), as Kafka's
        ``RecordTooLargeException``; None if every batch fits."""
        limit, name = self.max_message_bytes, "message.max.bytes"
        if info is not None and info.max_message_bytes is not None:
            limit, name = info.max_message_bytes, "max.message.bytes"
        for b in batches:
            if len(b.data) > limit:
                return ProduceResult(
                    error=MESSAGE_TOO_LARGE,
                    message=f"record batch of {len(b.data)} bytes is larger than {name}={limit}",
                )
        return None

    def _append(
        self, part: Topic, state: _PartitionState, requests: Sequence[Sequence[rec.Batch]], log_append: bool
    ) -> list[ProduceResult]:
        """Store the batches of ``requests`` (one, or several without a producer id) with
        one append (``state.lock`` held): a result for each."""
        if not state.rebuilt:
            self._rebuild_producers(part.queue, state)
        batches = requests[0] if len(requests) == 1 else [b for batches in requests for b in batches]
        duplicate = self._check_sequences(state, batches, part.name)
        if isinstance(duplicate, ProduceResult):
            duplicate.log_start_offset = self.log_start(part)
            return [duplicate]
        now = int(time.time() * 1000)
        items = [rec.with_log_append_time(b.data, now) if log_append else b.data for b in batches]
        counts = [b.record_count for b in batches]
        # The topic manager's one append (stats, log.flush.count, wake-ups, storage errors);
        # never creates a partition: CreateTopics and auto-creation do (self.create).
        part, first = self.topics.append(part.name, items, counts, KIND_KAFKA_BATCH, create=False, call="Kafka produce")
        queue = part.queue
        self._index_times(part.name, state, queue, first, [now if log_append else b.max_timestamp for b in batches])
        offset = queue.first_offset(first)
        log_start = self.log_start(part)
        results = []
        for request in requests:
            results.append(
                ProduceResult(base_offset=offset, log_append_time=now if log_append else -1, log_start_offset=log_start)
            )
            for b in request:
                if b.producer_id >= 0:
                    ps = state.producers.setdefault(b.producer_id, _ProducerState(b.producer_epoch))
                    ps.epoch = b.producer_epoch
                    ps.batches.append((b.base_sequence, b.base_sequence + b.record_count - 1, offset))
                    if b.attributes & _TRANSACTIONAL:
                        self._txns(state, queue).begin(b.producer_id, offset)
                offset += b.record_count
        return results

    @staticmethod
    def _txns(state: _PartitionState, queue: Any) -> TxnIndex:
        """The partition's transactions (``state.lock`` held; loaded by ``_rebuild_producers``)."""
        if state.txns is None:
            state.txns = TxnIndex(queue.path)
        return state.txns

    @staticmethod
    def _marker_epoch(ps: _ProducerState, epoch: int) -> None:
        """A marker of ``epoch`` for producer ``ps``: a newer epoch (the coordinator aborted
        on a timeout or a new InitProducerId) fences the older ones here and starts the
        sequences again."""
        if epoch > ps.epoch:
            ps.epoch = epoch
            ps.batches.clear()

    def write_marker(
        self, name: str, producer_id: int, epoch: int, commit: bool, coordinator_epoch: int = 0
    ) -> tuple[int, str | None]:
        """Append the COMMIT or ABORT marker of ``producer_id``'s transaction to the
        partition that is luxun topic ``name``: ``(error, message)``. A partition deleted
        meanwhile answers NONE (nothing is left to mark)."""
        topic, partition = partition_of(name)
        for _attempt in range(3):
            part = self._partition(topic, partition)
            if part is None:
                return NONE, None
            state = self._state(part.name)
            try:
                with state.lock:
                    queue = part.queue
                    if not state.rebuilt:
                        self._rebuild_producers(queue, state)
                    now = int(time.time() * 1000)
                    batch = control_batch(producer_id, epoch, commit, coordinator_epoch, now)
                    part, first = self.topics.append(
                        part.name, [batch], [1], KIND_KAFKA_BATCH, create=False, call="Kafka transaction marker"
                    )
                    queue = part.queue
                    self._index_times(part.name, state, queue, first, [now])
                    offset = queue.first_offset(first)
                    ps = state.producers.setdefault(producer_id, _ProducerState(epoch))
                    self._marker_epoch(ps, epoch)
                    self._txns(state, queue).end(producer_id, offset, commit)
                    return NONE, None
            except ArrayClosedError:
                continue
            except UnknownTopicError:
                return NONE, None
            except (TopicStorageError, OSError) as exc:
                return KAFKA_STORAGE_ERROR, f"cannot write the transaction marker to {name!r}: {exc}"
        return KAFKA_STORAGE_ERROR, f"cannot write the transaction marker to {name!r}: the partition keeps closing"

    def _committed_view(self, part: Topic) -> tuple[int, TxnIndex]:
        """``(last stable offset, txn index)`` of a partition, for read_committed."""
        state = self._state(part.name)
        with state.lock:
            queue = part.queue
            if not state.rebuilt:
                self._rebuild_producers(queue, state)
            txns = self._txns(state, queue)
            txns.trim(queue.log_start_offset)
            return txns.last_stable_offset(queue.next_offset), txns

    @staticmethod
    def _times(state: _PartitionState, queue: Any) -> TimeIndex:
        """The partition's time index (``state.lock`` held)."""
        if state.times is None:
            state.times = TimeIndex(queue.path)
        return state.times

    def _index_times(
        self, name: str, state: _PartitionState, queue: Any, first: int, timestamps: Sequence[int]
    ) -> None:
        """Extend the time index by the items just stored (``state.lock`` held). Never
        fails the produce: the batches are stored; an index not written is loaded and
        mended at its next use."""
        times = state.times or self._times(state, queue)
        try:
            times.add(queue, first, timestamps)
        except Exception as exc:
            times.invalidate()
            _limited.warning("time-index", "time index of %r not extended: %s: %s", name, type(exc).__name__, exc)

    def _check_sequences(self, state: _PartitionState, batches: Sequence[Any], name: str) -> ProduceResult | None:
        """A duplicate of a stored batch (its result), a sequence error, a transactional
        batch its transaction does not allow here, or None."""
        for b in batches:
            if b.producer_id < 0:
                continue
            if b.attributes & _TRANSACTIONAL:
                check = self.transactions
                refusal = (
                    (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactions are off on this broker")
                    if check is None
                    else check(b.producer_id, b.producer_epoch, name)
                )
                if refusal is not None:
                    return ProduceResult(error=refusal[0], message=refusal[1])
            ps = state.producers.get(b.producer_id)
            if ps is None:
                continue
            if b.producer_epoch < ps.epoch:
                return ProduceResult(error=INVALID_PRODUCER_EPOCH, message="producer epoch is older than the last seen")
            if b.producer_epoch > ps.epoch:
                continue  # a new epoch starts its sequences again
            last = b.base_sequence + b.record_count - 1
            for first_seq, last_seq, offset in ps.batches:
                if first_seq == b.base_sequence and last_seq == last:
                    return ProduceResult(base_offset=offset)
            if ps.batches:
                expected = (ps.batches[-1][1] + 1) & 0x7FFFFFFF
                if b.base_sequence != expected:
                    return ProduceResult(
                        error=OUT_OF_ORDER_SEQUENCE_NUMBER,
                        message=f"sequence {b.base_sequence} of producer {b.producer_id}, expected {expected}",
                    )
        return None

    def _rebuild_producers(self, array: Any, state: _PartitionState) -> None:
        """Producer sequences of the partition's last batches (after a restart), and its
        transactions (the txn index, and the batches after its last record); ``array``:
        the partition's queue."""
        state.rebuilt = True
        txns = self._txns(state, array)
        txns.load(array.log_start_offset, array.next_offset)
        head, tail = array.head, array.tail
        start = max(tail, head - _REBUILD_ITEMS)
        if start >= head:
            return
        try:
            ends, kinds = array.offset_fields(start, head - start)
            first_offsets = [array.first_offset(start)] + [int(e) for e in ends[:-1]]
            for i in range(head - start):
                if int(kinds[i]) != KIND_KAFKA_BATCH:
                    continue
                data = array.get(start + i)
                header = rec.split_batches(data, from_client=False)[0]
                if header.producer_id < 0:
                    continue
                kind = control_type(rec.batch_records(data)[0].key) if header.control else None
                txns.replay(first_offsets[i], header.producer_id, header.transactional, kind)
                ps = state.producers.setdefault(header.producer_id, _ProducerState(header.producer_epoch))
                if header.control:
                    self._marker_epoch(ps, header.producer_epoch)
                    continue
                ps.epoch = max(ps.epoch, header.producer_epoch)
                ps.batches.append(
                    (header.base_sequence, header.base_sequence + header.record_count - 1, first_offsets[i])
                )
        except Exception:  # a damaged old batch must not stop produce
            log.warning("could not rebuild producer sequences of %s", array.path, exc_info=True)

    # -- reading -----------------------------------------------------------------------
    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        *,
        at_least_one: bool = True,
        isolation: int = 0,
    ) -> FetchResult:
        """Record batches from ``offset`` on, about ``max_bytes``: at least one batch when
        ``at_least_one`` (KIP-74's first non-empty partition of a Fetch), else only
        batches that fit (none when the first does not). ``isolation`` READ_COMMITTED:
        only below the last stable offset, with the aborted transactions among them."""
        for _attempt in range(3):
            if isolation != READ_COMMITTED:
                idle = self._idle_end(topic, partition, offset)
                if idle is not None:
                    return idle
            try:
                part = self._partition(topic, partition)
                if part is None:
                    return FetchResult(error=UNKNOWN_TOPIC_OR_PARTITION)
                if isolation == READ_COMMITTED:
                    return self._read_committed(part, offset, max_bytes, at_least_one)
                return self._read(part, offset, max_bytes, at_least_one)
            except ArrayClosedError:
                continue
            except OSError as exc:  # e.g. too many open files: this partition's error, not the connection's
                _limited.error("fetch-storage", "Kafka fetch of %s-%d failed: %s", topic, partition, exc)
                return FetchResult(error=KAFKA_STORAGE_ERROR)
        return FetchResult(error=UNKNOWN_TOPIC_OR_PARTITION)

    def _idle_end(self, topic: str, partition: int, offset: int) -> FetchResult | None:
        """The empty answer to a read at the end of a partition that is closed to make
        room (max.open.topics), without reopening it; None for any other read."""
        ends = self.topics.idle_offsets(partition_topic(topic, partition)) if partition >= 0 else None
        if ends is None or offset != ends[1]:
            return None
        info = self.describe(topic)
        if info is None or partition >= info.partitions:
            return None
        start = max(ends[0], min(self._starts.get(partition_topic(topic, partition)), ends[1]))
        return FetchResult(high_watermark=ends[1], log_start_offset=start, records=b"")

    def _read_committed(self, part: Topic, offset: int, max_bytes: int, at_least_one: bool) -> FetchResult:
        """A read_committed read: below the last stable offset, with the aborted
        transactions overlapping what is returned."""
        lso, txns = self._committed_view(part)
        result = self._read(part, offset, max_bytes, at_least_one, lso)
        result.last_stable_offset = min(lso, result.high_watermark)
        if result.records:
            result.aborted = txns.aborted_between(offset, lso)
        return result

    def _read(
        self, part: Topic, offset: int, max_bytes: int, at_least_one: bool, stable: int | None = None
    ) -> FetchResult:
        array = part.queue
        start, end = self.log_start(part), array.next_offset
        if offset < start or offset > end:
            return FetchResult(error=OFFSET_OUT_OF_RANGE, high_watermark=end, log_start_offset=start)
        visible = end if stable is None else min(stable, end)
        if offset >= visible or (max_bytes <= 0 and not at_least_one):
            return FetchResult(high_watermark=end, log_start_offset=start, records=b"")
        index = array.find_offset(offset)
        if visible < end:  # read_committed: the items below the last stable offset
            lengths, blob = array.read_range_blob(
                index, max_items=array.find_offset(visible) - index, max_bytes=max(1, max_bytes)
            )
        else:
            lengths, blob = array.read_range_blob(index, max_bytes=max(1, max_bytes))
        if not at_least_one and len(lengths) and int(lengths[0]) > max_bytes:  # does not fit: none
            return FetchResult(high_watermark=end, log_start_offset=start, records=b"")
        count = len(lengths)
        ends, kinds = array.offset_fields(index, count)
        first = array.first_offset(index)
        out = self._as_batches(array, index, first, lengths, blob, ends, kinds)
        part.stats.items_out += int(ends[-1]) - first if count else 0
        part.stats.bytes_out += len(out)
        return FetchResult(high_watermark=end, log_start_offset=start, records=out)

    @staticmethod
    def _as_batches(
        array: Any, index: int, first: int, lengths: Any, blob: bytes, ends: Any, kinds: Any
    ) -> bytes | bytearray:
        count = len(lengths)
        if count and not (kinds != KIND_KAFKA_BATCH).any():
            out = bytearray(blob)
            starts = np.cumsum(lengths) - lengths
            bases = np.concatenate(([first], ends[:-1]))
            rec.patch_base_offsets(out, starts, bases)
            return out  # sent as it is: no copy into bytes
        # Mixed: Thrift-written items become batches of their own records.
        parts: list[bytes] = []
        pos = 0
        base = first
        i = 0
        while i < count:
            if int(kinds[i]) == KIND_KAFKA_BATCH:
                n = int(lengths[i])
                parts.append(_I64.pack(base) + blob[pos + 8 : pos + n])
                pos += n
                base = int(ends[i])
                i += 1
                continue
            j = i
            while j < count and int(kinds[j]) != KIND_KAFKA_BATCH:
                j += 1
            items = []
            for k in range(i, j):
                n = int(lengths[k])
                items.append(blob[pos : pos + n])
                pos += n
            parts.append(rec.luxun_items_to_batch(items, base, array.timestamps(index + i, j - i)))
            base = int(ends[j - 1])
            i = j
        return b"".join(parts)

    def list_offset(self, topic: str, partition: int, timestamp: int, isolation: int = 0) -> tuple[int, int, int]:
        """``(error, offset, timestamp)`` for ListOffsets, as Kafka's broker answers: -1
        latest, -2 earliest (timestamp -1), -3 the record with the largest timestamp
        (KIP-734: the first such), else the first record whose timestamp is >= the
        target, with its timestamp; offset and timestamp -1 if there is none.

        A record's timestamp is its CreateTime, or in a LogAppendTime topic its batch's
        append time; a Thrift-written item's is its append time (see :mod:`.timeindex`).
        """
        for _attempt in range(3):
            part = self._partition(topic, partition)
            if part is None:
                return UNKNOWN_TOPIC_OR_PARTITION, -1, -1
            try:
                if timestamp == -1 and isolation == READ_COMMITTED:
                    return NONE, self._committed_view(part)[0], -1
                return self._list_offset(part, timestamp)
            except (ArrayClosedError, IndexOutOfRangeError):
                continue  # closed to make room, or retention took the item found: look again
        return UNKNOWN_TOPIC_OR_PARTITION, -1, -1

    def _list_offset(self, part: Topic, timestamp: int) -> tuple[int, int, int]:
        queue = part.queue
        if timestamp == -1:
            return NONE, queue.next_offset, -1
        start = self.log_start(part)
        if timestamp == -2:
            return NONE, start, -1
        state = self._state(part.name)
        with state.lock:  # the index is read and extended by produce under this lock
            times = self._times(state, queue)
            try:
                times.catch_up(queue)
                target = times.max_timestamp(queue) if timestamp == -3 else timestamp
                index = None if target is None else times.find(queue, target)
            except (ArrayClosedError, IndexOutOfRangeError):
                times.invalidate()
                raise
            except OSError as exc:
                times.invalidate()
                _limited.warning("time-index", "time index of %r unusable: %s", part.name, exc)
                return KAFKA_STORAGE_ERROR, -1, -1
        if index is None or target is None:
            return NONE, -1, -1
        offset, found = self._record_at(queue, index, target, start)
        return NONE, offset, found

    @staticmethod
    def _record_at(queue: Any, index: int, target: int, start: int = 0) -> tuple[int, int]:
        """``(offset, timestamp)`` of the first record of item ``index`` at or after
        ``start`` (the log start: DeleteRecords may put it inside a batch) whose timestamp
        is >= ``target`` (the item's timestamp, as the time index knows it, is). Only
        this one batch is decompressed (bounded: :func:`luxun.records.batch_records`)."""
        first = queue.first_offset(index)
        if queue.item_kind(index) != KIND_KAFKA_BATCH:
            return first, queue.timestamp(index)
        data = queue.get(index)
        try:
            records = rec.batch_records(data)
        except rec.BatchError as exc:  # stored, so once valid: answer with its header
            log.warning("batch at offset %d of %s does not read: %s", first, queue.path, exc)
            return first, int(_I64.unpack_from(data, rec.MAX_TIMESTAMP_OFFSET)[0])
        stored_base = int(_I64.unpack_from(data, 0)[0])
        for r in records:
            if r.timestamp >= target and first + r.offset - stored_base >= start:
                return first + r.offset - stored_base, r.timestamp
        # a header whose maxTimestamp no record has: its first record, as it claims
        return first, int(_I64.unpack_from(data, rec.MAX_TIMESTAMP_OFFSET)[0])

    # -- the log start (DeleteRecords) -------------------------------------------------
    def log_start(self, part: Topic) -> int:
        """The partition's first offset Kafka clients may read: its array's log start, or
        the one a DeleteRecords set inside a batch (:mod:`.logstart`), whichever is larger.
        A DeleteRecords interrupted by a crash after keeping its offset and before moving
        tail is finished here."""
        queue = part.queue
        start, kept = queue.log_start_offset, self._starts.get(part.name)
        if kept <= start:
            return start
        kept = min(kept, queue.next_offset)
        index = queue.find_offset(kept)
        if index > queue.tail:
            with contextlib.suppress(IndexOutOfRangeError):
                queue.remove_before_index(index)
        return kept

    def delete_records(self, topic: str, partition: int, offset: int) -> tuple[int, int, str | None]:
        """Kafka's DeleteRecords of one partition: ``(error, low watermark, message)``.

        ``offset`` -1 is the high watermark; another negative offset, or one above the
        high watermark, is OFFSET_OUT_OF_RANGE; one at or below the log start changes
        nothing. Else the offset is kept (durably, :mod:`.logstart`), then tail moves to
        the item holding it and the pages wholly below are deleted, as retention deletes
        them (:meth:`bigarray.BigArray.remove_before_index`): a Thrift consumer by index
        below the new tail gets INDEX_OUT_OF_BOUNDS, as after retention.
        """
        for _attempt in range(3):
            part = self._partition(topic, partition)
            if part is None:
                return UNKNOWN_TOPIC_OR_PARTITION, -1, f"{topic}-{partition} does not exist"
            try:
                with self._alter_lock:
                    return self._delete_records(part, offset)
            except (ArrayClosedError, IndexOutOfRangeError):
                continue  # closed to make room meanwhile: again
            except OSError as exc:
                _limited.error("delete-records", "DeleteRecords of %s-%d failed: %s", topic, partition, exc)
                return KAFKA_STORAGE_ERROR, -1, f"cannot delete records of {topic}-{partition}: {exc}"
        return UNKNOWN_TOPIC_OR_PARTITION, -1, f"{topic}-{partition} is not available"

    def _delete_records(self, part: Topic, offset: int) -> tuple[int, int, str | None]:
        queue = part.queue
        high = queue.next_offset
        target = high if offset == -1 else offset
        if target < 0:
            return OFFSET_OUT_OF_RANGE, -1, f"The offset {offset} for partition {part.name} is not valid"
        if target > high:
            return (
                OFFSET_OUT_OF_RANGE,
                -1,
                (
                    f"Cannot increment the log start offset to {target} of partition {part.name} since it is "
                    f"larger than the high watermark {high}"
                ),
            )
        start = self.log_start(part)
        if target <= start:
            return NONE, start, None
        self._starts.set(part.name, target)
        queue.remove_before_index(queue.find_offset(target))
        log.info("DeleteRecords: partition %r now starts at offset %d (was %d)", part.name, target, start)
        return NONE, target, None

    # -- waiting -----------------------------------------------------------------------
    def wait(self, partitions: Iterable[tuple[str, int]], until: float, enough: Any) -> None:
        """Block until ``enough()`` is true, a produce to one of ``partitions`` wakes us
        and ``enough()`` is then true, or the monotonic time ``until``."""
        event = threading.Event()
        watched: list[Topic] = []
        try:
            for topic, p in partitions:
                info = self.describe(topic)
                if info is None or not 0 <= p < info.partitions:
                    continue
                try:  # without holding the partition open (max.open.topics)
                    part = self.topics.watch(partition_topic(topic, p), event)
                except OSError as exc:
                    _limited.error("fetch-watch", "Kafka fetch of %s-%d cannot wait: %s", topic, p, exc)
                    continue
                if part is not None:
                    watched.append(part)
            while not enough():
                left = until - time.monotonic()
                if left <= 0 or self.topics.closed:
                    return
                event.wait(left)
                event.clear()
        finally:
            for part in watched:
                part.unwatch(event)


# -- start-up ----------------------------------------------------------------------------
def remove_interrupted_creations(data_dir: str) -> list[str]:
    """Remove what a CreateTopics interrupted by a crash left in ``data_dir``: the names
    removed, one ``INFO`` line each. Run at start, under the data directory's lock,
    before the topic manager lists the topics (``TopicManager(repair=...)``), so such
    leftovers never count against ``max.topics``.

    A creation makes the directory of partition 0 holding ``kafka.json.tmp``, then the
    partitions ``T~p`` (empty), then partition 0's files, then renames the ``.tmp`` to
    ``kafka.json`` (see :meth:`KafkaLog.create`; older brokers made the partitions
    before partition 0 and wrote no ``.tmp``). So, for a legal Kafka topic name ``T``
    whose directory holds no ``kafka.json``:

    * each ``T~p`` (p >= 1) that never held an item is a leftover and goes (a
      Thrift-written ``T~p`` holds items and stays);
    * ``T`` itself goes if it holds ``kafka.json.tmp`` and never held an item, unless a
      partition of it stays; otherwise only its ``.tmp`` goes. A ``T`` without a
      ``.tmp`` is a luxun topic of one partition (made by a Thrift produce) and stays.

    A ``kafka.json.tmp`` beside a ``kafka.json`` is removed too. For a topic with a
    ``kafka.json`` of ``n`` partitions, each ``T~p`` (p >= n) that never held an item is
    what an interrupted CreatePartitions made (see :meth:`KafkaLog.add_partitions`) and goes.
    """
    names = sorted(
        e
        for e in os.listdir(data_dir)
        if not e.startswith(RESERVED_PREFIX) and os.path.isdir(os.path.join(data_dir, e))
    )
    partitions: dict[str, list[str]] = {}
    for name in names:
        topic, p = partition_of(name)
        if p:
            partitions.setdefault(topic, []).append(name)

    def settled(topic: str) -> bool:
        return os.path.exists(os.path.join(data_dir, topic, SETTINGS_FILE))

    leftovers: dict[str, str] = {}
    for topic, parts in partitions.items():
        if legal_topic_name(topic) is not None:
            continue
        if settled(topic):  # a CreatePartitions interrupted before kafka.json took the new count
            count = _settled_partitions(os.path.join(data_dir, topic, SETTINGS_FILE))
            for name in parts:
                p = partition_of(name)[1]
                if p >= count and name not in partitions and _never_written(os.path.join(data_dir, name)):
                    leftovers[name] = (
                        f"partition {p} of topic {topic!r}, beyond its {count} partitions in {SETTINGS_FILE} "
                        "(an interrupted CreatePartitions)"
                    )
            continue
        for name in parts:
            if name not in partitions and _never_written(os.path.join(data_dir, name)):
                leftovers[name] = (
                    f"partition {partition_of(name)[1]} of topic {topic!r}, whose creation was interrupted "
                    f"(no {SETTINGS_FILE} in {topic!r})"
                )
    for topic in names:
        tmp = os.path.join(data_dir, topic, SETTINGS_FILE + ".tmp")
        if partition_of(topic)[1] or not os.path.exists(tmp):
            continue
        if (
            not settled(topic)
            and legal_topic_name(topic) is None
            and _never_written(os.path.join(data_dir, topic))
            and all(name in leftovers for name in partitions.get(topic, []))
        ):
            leftovers[topic] = f"topic {topic!r}, whose creation was interrupted (a .tmp, no {SETTINGS_FILE})"
            continue
        try:
            os.remove(tmp)
        except OSError as exc:
            log.warning("cannot remove %s, left by an interrupted creation: %s", tmp, exc)
            continue
        log.info("removed %s/%s.tmp, left by an interrupted creation of topic %r", topic, SETTINGS_FILE, topic)
    removed = []
    for name in sorted(leftovers, key=lambda n: (partition_of(n)[0], -partition_of(n)[1])):
        trash = os.path.join(data_dir, TRASH_PREFIX + uuid.uuid4().hex)
        try:
            os.rename(os.path.join(data_dir, name), trash)
        except OSError as exc:
            log.warning("cannot remove %r, %s: %s", name, leftovers[name], exc)
            continue
        shutil.rmtree(trash, ignore_errors=True)  # else removed at the next start
        removed.append(name)
        log.info("removed %r at start: %s", name, leftovers[name])
    return removed


def _settled_partitions(path: str) -> int:
    """The partition count in the ``kafka.json`` at ``path`` (as :meth:`KafkaLog.describe`
    reads it; a huge number when unreadable, so nothing is taken for a leftover)."""
    try:
        with open(path, encoding="utf-8") as f:
            return max(1, int(json.load(f).get("partitions", 1)))
    except (OSError, ValueError, TypeError, AttributeError):
        return 1 << 62


def _never_written(path: str) -> bool:
    """True if the luxun topic at ``path`` never held an item: no index or data page, and
    a head of 0 in its meta page (or no meta page). A topic made by a produce holds its
    first items from the start, so only an explicit creation leaves such a topic."""
    for sub in (fmt.INDEX_DIR, fmt.DATA_DIR):
        try:
            if any(fmt.parse_page_file_name(e) is not None for e in os.listdir(os.path.join(path, sub))):
                return False
        except FileNotFoundError:
            continue
    meta = os.path.join(path, fmt.META_DIR, fmt.page_file_name(0))
    try:
        with open(meta, "rb") as f:
            head = f.read(8)
    except FileNotFoundError:
        return True
    return len(head) == 8 and _I64.unpack(head)[0] == 0
