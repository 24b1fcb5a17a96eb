"""Kafka's topic-level configs as CreateTopics gives them: which luxun honours, which
it accepts and ignores, which it refuses.

Every key of Apache Kafka's ``TopicConfig`` (3.x and 4.x) is known here; anything
else is refused with INVALID_CONFIG and Kafka's words ("Unknown topic config name:
x"). A value is parsed and range-checked as Kafka's ``ConfigDef`` does (type, bounds,
valid strings; surrounding blanks ignored), refused as Kafka words it ("Invalid value
x for configuration y: ..."). A valid value then meets luxun's policy for its key:

* **honoured**: ``message.timestamp.type``, ``retention.ms``, ``retention.bytes``
  (per partition, over the broker's retention; see :mod:`luxun.retention`),
  ``max.message.bytes`` (over the broker's ``message.max.bytes``; at most what one
  stored item can hold, the data page size), ``compression.type`` (batches of another
  codec re-encoded before they are stored, see :func:`luxun.records.validate`),
  ``cleanup.policy`` (``compact``: every record needs a key, INVALID_RECORD otherwise,
  as Kafka; luxun removes no older value of a key, so a compacted topic keeps at least
  the last value of each, as Kafka promises; with ``compact`` alone retention deletes
  nothing, with ``compact,delete`` it deletes as for ``delete``), ``flush.ms`` (each
  partition flushed, msync, at least that often, over the broker's
  ``log.default.flush.interval.ms``; Kafka's default, the largest long, leaves the
  broker's);
* **ignored**: keys with no effect on a one-broker log without compaction or tiered
  storage (replication throttles, segment and index sizes, compaction tuning,
  ``unclean.leader.election.enable``, ...), accepted at any valid value;
* **only the value luxun behaves as**: e.g. ``min.insync.replicas=1``; any other
  value is refused with INVALID_CONFIG saying luxun does not support it.

:data:`TOPIC_CONFIGS` is the table; :func:`check_topic_configs` applies it to one
topic's configs. Thread-safety: pure functions over constant tables.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "BROKER_CONFIGS",
    "HONOURED",
    "IGNORED",
    "ONLY",
    "TOPIC_CONFIGS",
    "ConfigProblem",
    "TopicConfig",
    "altered",
    "check_broker_configs",
    "check_topic_configs",
    "parsed_value",
]

INT32_MIN: Final = -(1 << 31)
INT32_MAX: Final = (1 << 31) - 1
INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1

#: How luxun treats a key (the README's table says the same).
HONOURED: Final = "honoured"
IGNORED: Final = "accepted, no effect"
ONLY: Final = "only"

_THROTTLED: Final = re.compile(r"^\d+:\d+$")
#: Kafka's MetadataVersion strings: "3.0", "2.8-IV1", "0.10.0", "0.10.0.0" (0.x versions
#: have 3 parts; Kafka ignores what follows them).
_FORMAT_VERSION: Final = re.compile(r"^\d+\.\d+(\.\d+){0,2}(-IV\d+)?$")


class ConfigProblem(ValueError):
    """A config of a CreateTopics request that is refused (Kafka's INVALID_CONFIG); the
    message names the key (and the value, unless absent)."""


@dataclass(frozen=True)
class TopicConfig:
    """One Kafka topic-level config key.

    ``kind``: Kafka's type (``long``, ``int``, ``boolean``, ``string``, ``list``,
    ``double``); ``lo``/``hi``: its bounds; ``choices``: its valid strings (for a list,
    of each element); ``default``: Kafka's default as DescribeConfigs shows it;
    ``handling``: :data:`HONOURED`, :data:`IGNORED` or :data:`ONLY`; ``supported``:
    for ONLY, the values luxun behaves as (parsed), ``why``: why the others are refused.
    """

    name: str
    kind: str
    default: str
    handling: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    supported: tuple[object, ...] = ()
    why: str = ""
    valid: Callable[[object], str | None] | None = None


def _throttled_replicas(value: object) -> str | None:
    """Kafka's ThrottledReplicaListValidator: ``*`` or ``partition:broker`` pairs."""
    assert isinstance(value, list)
    if value == ["*"] or all(_THROTTLED.match(v) for v in value):
        return None
    return "must be the literal '*' or a list of replicas in the following format: [partitionId]:[brokerId],..."


def _format_version(value: object) -> str | None:
    assert isinstance(value, str)
    return None if _FORMAT_VERSION.match(value) else "Version must be a Kafka version such as 3.0 or 2.8-IV1"


def _gzip_level(value: object) -> str | None:
    return None if value != 0 else "Value must be -1 or between 1 and 9"


_NO_TIERING: Final = "luxun has no tiered storage"

#: Every topic-level key of Apache Kafka's TopicConfig, by name.
TOPIC_CONFIGS: Final[Mapping[str, TopicConfig]] = {
    c.name: c
    for c in (
        TopicConfig("cleanup.policy", "list", "delete", HONOURED, choices=("compact", "delete")),
        TopicConfig(
            "compression.type", "string", "producer", HONOURED,
            choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
        ),
        TopicConfig("compression.gzip.level", "int", "-1", IGNORED, lo=-1, hi=9, valid=_gzip_level),
        TopicConfig("compression.lz4.level", "int", "9", IGNORED, lo=1, hi=17),
        TopicConfig("compression.zstd.level", "int", "3", IGNORED, lo=-131072, hi=22),
        TopicConfig("delete.retention.ms", "long", "86400000", IGNORED, lo=0),
        TopicConfig("file.delete.delay.ms", "long", "60000", IGNORED, lo=0),
        TopicConfig(
            "flush.messages", "long", str(INT64_MAX), ONLY, lo=1, supported=(INT64_MAX,),
            why="per-topic flushes are the broker's (log.flush.count, topic.flush.intervals.ms)",
        ),
        TopicConfig("flush.ms", "long", str(INT64_MAX), HONOURED, lo=0),
        TopicConfig("follower.replication.throttled.replicas", "list", "", IGNORED, valid=_throttled_replicas),
        TopicConfig("leader.replication.throttled.replicas", "list", "", IGNORED, valid=_throttled_replicas),
        TopicConfig("index.interval.bytes", "int", "4096", IGNORED, lo=0),
        TopicConfig("local.retention.bytes", "long", "-2", IGNORED, lo=-2),
        TopicConfig("local.retention.ms", "long", "-2", IGNORED, lo=-2),
        TopicConfig("max.compaction.lag.ms", "long", str(INT64_MAX), IGNORED, lo=1),
        TopicConfig("min.compaction.lag.ms", "long", "0", IGNORED, lo=0),
        TopicConfig("min.cleanable.dirty.ratio", "double", "0.5", IGNORED, lo=0, hi=1),
        TopicConfig("max.message.bytes", "int", "1048588", HONOURED, lo=0),
        TopicConfig("message.downconversion.enable", "boolean", "true", IGNORED),
        TopicConfig("message.format.version", "string", "3.0-IV1", IGNORED, valid=_format_version),
        TopicConfig(
            "message.timestamp.after.max.ms", "long", str(INT64_MAX), ONLY, lo=0, supported=(INT64_MAX,),
            why="records are not refused for their timestamps",
        ),
        TopicConfig(
            "message.timestamp.before.max.ms", "long", str(INT64_MAX), ONLY, lo=0, supported=(INT64_MAX,),
            why="records are not refused for their timestamps",
        ),
        TopicConfig(
            "message.timestamp.difference.max.ms", "long", str(INT64_MAX), ONLY, lo=0, supported=(INT64_MAX,),
            why="records are not refused for their timestamps",
        ),
        TopicConfig(
            "message.timestamp.type", "string", "CreateTime", HONOURED, choices=("CreateTime", "LogAppendTime"),
        ),
        TopicConfig(
            "min.insync.replicas", "int", "1", ONLY, lo=1, supported=(1,),
            why="luxun is one broker: each partition has one replica",
        ),
        TopicConfig("preallocate", "boolean", "false", IGNORED),
        TopicConfig("remote.storage.enable", "boolean", "false", ONLY, supported=(False,), why=_NO_TIERING),
        TopicConfig("remote.log.copy.disable", "boolean", "false", IGNORED),
        TopicConfig("remote.log.delete.on.disable", "boolean", "false", IGNORED),
        TopicConfig("retention.bytes", "long", "-1", HONOURED),
        TopicConfig("retention.ms", "long", "604800000", HONOURED, lo=-1),
        TopicConfig("segment.bytes", "int", "1073741824", IGNORED, lo=14),
        TopicConfig("segment.index.bytes", "int", "10485760", IGNORED, lo=4),
        TopicConfig("segment.jitter.ms", "long", "0", IGNORED, lo=0),
        TopicConfig("segment.ms", "long", "604800000", IGNORED, lo=1),
        TopicConfig("unclean.leader.election.enable", "boolean", "false", IGNORED),
    )
}  # fmt: skip


def _number(text: str, kind: str) -> int | float:
    """Parse as Java's Integer/Long/Double.parseDouble; ValueError naming Kafka's type."""
    try:
        if kind == "double":
            value: int | float = float(text)
            if value != value:  # NaN
                raise ValueError
            return value
        if not re.fullmatch(r"[+-]?\d+", text):
            raise ValueError
        value = int(text)
    except ValueError:
        raise ValueError(f"Not a number of type {kind.upper()}") from None
    lo, hi = (INT32_MIN, INT32_MAX) if kind == "int" else (INT64_MIN, INT64_MAX)
    if not lo <= value <= hi:
        raise ValueError(f"Not a number of type {kind.upper()}")
    return value


def _parse(key: TopicConfig, raw: str) -> object:
    """The value of ``raw`` for ``key`` (Kafka's ConfigDef.parseType and validator)."""
    text = raw.strip()
    value: object
    if key.kind in ("int", "long", "double"):
        value = _number(text, key.kind)
        if key.lo is not None and value < key.lo:
            raise ValueError(f"Value must be at least {_plain(key.lo)}")
        if key.hi is not None and value > key.hi:
            raise ValueError(f"Value must be no more than {_plain(key.hi)}")
    elif key.kind == "boolean":
        if text.lower() not in ("true", "false"):
            raise ValueError("Expected value to be either true or false")
        value = text.lower() == "true"
    elif key.kind == "list":
        value = [] if not text else [v.strip() for v in text.split(",")]
        bad = [v for v in value if key.choices and v not in key.choices]
        if bad:
            raise ValueError(f"String must be one of: {', '.join(key.choices)}")
    else:
        value = text
        if key.choices and value not in key.choices:
            raise ValueError(f"String must be one of: {', '.join(key.choices)}")
    if key.valid is not None:
        why = key.valid(value)
        if why is not None:
            raise ValueError(why)
    return value


def _plain(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else str(bound)


def check_topic_configs(configs: Iterable[tuple[str, str | None]], *, max_item_bytes: int) -> dict[str, str]:
    """Check one CreateTopics topic's configs (``(name, value)`` pairs in request order):
    the configs to keep (name -> value as given, blanks stripped).

    ``max_item_bytes``: the largest item the broker's storage holds (its data page
    size), the most ``max.message.bytes`` may be.

    Raises:
        ConfigProblem: the first refused config: an unknown key, a key given twice, a
            null or invalid value, or a value luxun does not support.
    """
    kept: dict[str, str] = {}
    for name, raw in configs:
        key = TOPIC_CONFIGS.get(name)
        if key is None:
            raise ConfigProblem(f"Unknown topic config name: {name}")
        if name in kept:
            raise ConfigProblem(f"Topic config {name} is given more than once")
        if raw is None:
            raise ConfigProblem(f"Null value not supported for topic configs: {name}")
        try:
            value = _parse(key, raw)
        except ValueError as exc:
            raise ConfigProblem(f"Invalid value {raw} for configuration {name}: {exc}") from None
        if name == "max.message.bytes" and isinstance(value, int) and value > max_item_bytes:
            raise ConfigProblem(
                f"luxun does not support {name}={raw.strip()}: a record batch is stored as one item, "
                f"at most the data page size (log.backfile.page.size={max_item_bytes})"
            )
        if key.handling == ONLY and value not in key.supported:
            allowed = ", ".join(_show(v) for v in key.supported)
            raise ConfigProblem(f"luxun does not support {name}={raw.strip()}: {key.why} (accepted: {allowed})")
        kept[name] = raw.strip()
    return kept


def _show(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


#: The broker configs Kafka clients may set at run time (Kafka's dynamic broker
#: configs that luxun honours; see :mod:`luxun.dynamic`).
BROKER_CONFIGS: Final[Mapping[str, TopicConfig]] = {
    c.name: c
    for c in (
        TopicConfig("log.retention.ms", "long", "604800000", HONOURED, lo=-1),
        TopicConfig("log.retention.bytes", "long", "-1", HONOURED),
        # The cleanup.policy of topics without their own (luxun.dynamic).
        TopicConfig("log.cleanup.policy", "list", "delete", HONOURED, choices=("compact", "delete")),
        # Dynamic in Kafka, and of no effect on one broker without Kerberos, compaction,
        # replication or Kafka's thread pools: accepted and kept, as the topic keys of
        # that kind are.
        TopicConfig("sasl.kerberos.min.time.before.relogin", "long", "60000", IGNORED),
        TopicConfig("sasl.kerberos.ticket.renew.jitter", "double", "0.05", IGNORED),
        TopicConfig("sasl.kerberos.ticket.renew.window.factor", "double", "0.8", IGNORED),
        TopicConfig("background.threads", "int", "10", IGNORED, lo=1),
        TopicConfig("num.io.threads", "int", "8", IGNORED, lo=1),
        TopicConfig("num.network.threads", "int", "3", IGNORED, lo=1),
        TopicConfig("num.replica.fetchers", "int", "1", IGNORED),
        TopicConfig("num.recovery.threads.per.data.dir", "int", "2", IGNORED, lo=1),
        TopicConfig("log.cleaner.threads", "int", "1", IGNORED, lo=0),
        TopicConfig("log.cleaner.backoff.ms", "long", "15000", IGNORED, lo=0),
        TopicConfig("unclean.leader.election.enable", "boolean", "false", IGNORED),
        TopicConfig("leader.replication.throttled.rate", "long", str(INT64_MAX), IGNORED, lo=0),
        TopicConfig("follower.replication.throttled.rate", "long", str(INT64_MAX), IGNORED, lo=0),
    )
}

#: IncrementalAlterConfigs operations (Kafka's AlterConfigOp.OpType).
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_OPS: Final = {SET: "set", DELETE: "delete", APPEND: "append", SUBTRACT: "subtract"}


def check_broker_configs(configs: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    """Check dynamic broker configs (``(name, value)`` pairs): the configs to keep.

    Raises:
        ConfigProblem: the first refused config: a key luxun does not let clients
            change at run time (in Kafka's words), a key given twice, a null or
            invalid value.
    """
    kept: dict[str, str] = {}
    for name, raw in configs:
        key = BROKER_CONFIGS.get(name)
        if key is None:
            raise ConfigProblem(
                f"Cannot update these configs dynamically: Set({name}) (luxun changes only "
                f"{', '.join(BROKER_CONFIGS)} at run time)"
            )
        if name in kept:
            raise ConfigProblem(f"Broker config {name} is given more than once")
        if raw is None:
            raise ConfigProblem(f"Null value not supported for broker configs: {name}")
        parsed_value(key, raw)
        kept[name] = raw.strip()
    return kept


def parsed_value(key: TopicConfig, raw: str) -> object:
    """``raw`` parsed and range-checked for ``key`` as Kafka's ``ConfigDef`` does.

    Raises:
        ConfigProblem: in Kafka's words ("Invalid value x for configuration y: ...").
    """
    try:
        return _parse(key, raw)
    except ValueError as exc:
        raise ConfigProblem(f"Invalid value {raw} for configuration {key.name}: {exc}") from None


def altered(
    current: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]], table: Mapping[str, TopicConfig]
) -> list[tuple[str, str | None]]:
    """The configs after IncrementalAlterConfigs' ``(name, operation, value)`` changes to
    ``current``, as Kafka applies them: SET sets, DELETE removes (back to the default),
    APPEND and SUBTRACT add or remove the elements of a list key (starting from its
    default when not set). Checked afterwards as a whole (:func:`check_topic_configs`).

    Raises:
        ConfigProblem: APPEND or SUBTRACT of a key that is not a list (Kafka's words),
            an unknown operation.
    """
    out: dict[str, str | None] = dict(current)
    for name, op, value in ops:
        if op == SET:
            out[name] = value
        elif op == DELETE:
            out.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            key = table.get(name)
            if key is None:
                raise ConfigProblem(f"Unknown topic config name: {name}")
            if key.kind != "list":
                raise ConfigProblem(f"Config value {_OPS[op]} is not allowed for config key: {name}")
            now = out.get(name, key.default) or ""
            items = [v.strip() for v in now.split(",") if v.strip()]
            given = [v.strip() for v in (value or "").split(",") if v.strip()]
            if op == APPEND:
                items += [v for v in given if v not in items]
            else:
                items = [v for v in items if v not in given]
            out[name] = ",".join(items)
        else:
            raise ConfigProblem(f"Unknown config operation {op} for config key: {name}")
    return list(out.items())
