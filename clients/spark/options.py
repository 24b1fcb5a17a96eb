"""Options of the ``luxun`` data source: parsed once, on the driver, into plain frozen
values that pickle cheaply into Spark's Python workers (see the package doc for the list).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import BinaryType, StringType, StructType

from ..connection import parse_broker

#: Bytes per consume call. Measured here: 256 KiB-1 MiB replies move ~1.2 GB/s, 2-4 MiB
#: ones 4-5x less (thriftpy2's framed transport copies big frames over and over).
DEFAULT_FETCH_BYTES = 1 << 20
DEFAULT_TIMEOUT_MS = 30_000
DEFAULT_PACK_SIZE = 1000
DEFAULT_PACK_BYTES = 512 << 10
#: Kafka's default maxTriggerDelay (15 minutes).
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
CODECS = {"none": 0, "gzip": 1, "snappy": 2}

Key = tuple[str, str]  # (topic, "host:port")


@dataclass(frozen=True)
class AtTime:
    """A position given by time: the first index whose append time is >= ``ms``
    (the head when there is none), as Kafka's ``startingOffsetsByTimestamp``."""

    ms: int


#: A position: an index, ``"earliest"``/``"latest"``, or a time.
Spec = int | str | AtTime


def broker_address(address: str) -> str:
    """``host:port`` (or ``host``, or ``id:host:port``) -> normalised ``host:port``."""
    host, port = parse_broker(address)
    return f"{host}:{port}"


def servers(options: Any) -> tuple[str, ...]:
    raw = options.get("luxun.servers")
    if not raw:
        raise ValueError("option 'luxun.servers' is required (host:port,host:port)")
    out = tuple(dict.fromkeys(broker_address(s) for s in raw.split(",") if s.strip()))
    if not out:
        raise ValueError("option 'luxun.servers' names no broker")
    return out


def _given(options: Any, name: str) -> bool:
    raw = options.get(name)
    return raw is not None and str(raw).strip() != ""


def int_option(options: Any, name: str, default: int | None, minimum: int) -> int | None:
    if not _given(options, name):
        return default
    raw = options.get(name)
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name!r} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise ValueError(f"option {name!r} must be >= {minimum}, not {value}")
    return value


def bool_option(options: Any, name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {name!r} must be true or false, not {raw!r}")
    return value == "true"


_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_option(options: Any, name: str, default: int) -> int:
    """A duration in ms: ``500ms``, ``10s``, ``15m``, ``1h``, ``1d``; a bare number is ms
    (as Spark's Kafka source reads ``maxTriggerDelay``)."""
    if not _given(options, name):
        return default
    raw = str(options.get(name))
    match = _DURATION.match(raw)
    if match is None:
        raise ValueError(f"option {name!r} must be a duration like 500ms, 10s, 15m or 1h, not {raw!r}")
    return int(match.group(1)) * _UNIT_MS[(match.group(2) or "ms").lower()]


# -- read options ----------------------------------------------------------------------
@dataclass(frozen=True)
class ReadOptions:
    """Everything a reader needs: plain, picklable values."""

    servers: tuple[str, ...]
    topics: tuple[str, ...]
    starting: dict[Key, Spec]
    starting_default: Spec
    ending: dict[Key, Spec]
    ending_default: Spec
    min_partitions: int | None
    fail_on_data_loss: bool
    decode: str
    fetch_bytes: int
    timeout_ms: int
    max_items_per_trigger: int | None
    max_rows_per_trigger: int | None = None
    min_items_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    items_as_blob: bool = True

    @classmethod
    def parse(cls, options: Any, *, streaming: bool) -> ReadOptions:
        brokers = servers(options)
        raw_topics = options.get("subscribe")
        if not raw_topics:
            raise ValueError("option 'subscribe' is required (topic1,topic2)")
        topics = tuple(dict.fromkeys(t.strip() for t in raw_topics.split(",") if t.strip()))
        if not topics:
            raise ValueError("option 'subscribe' names no topic")
        if streaming:
            for name in ("endingIndexes", "endingIndexesByTimestamp", "endingTimestamp"):
                if options.get(name) is not None:
                    raise ValueError(f"option {name!r} is for batch queries only")
        start_default, starting = _positions(
            options, "starting", "latest" if streaming else "earliest", topics, brokers
        )
        end_default, ending = _positions(options, "ending", "latest", topics, brokers)
        decode = str(options.get("decode") or "messages").strip().lower()
        if decode not in ("messages", "raw"):
            raise ValueError(f"option 'decode' must be 'messages' or 'raw', not {decode!r}")
        min_items = int_option(options, "minItemsPerTrigger", None, 1)
        if _given(options, "maxTriggerDelay") and min_items is None:
            raise ValueError("option 'maxTriggerDelay' needs 'minItemsPerTrigger' (it bounds how long that waits)")
        return cls(
            servers=brokers,
            topics=topics,
            starting=starting,
            starting_default=start_default,
            ending=ending,
            ending_default=end_default,
            min_partitions=int_option(options, "minPartitions", None, 1),
            fail_on_data_loss=bool_option(options, "failOnDataLoss", True),
            decode=decode,
            fetch_bytes=int_option(options, "fetchBytes", DEFAULT_FETCH_BYTES, 1) or DEFAULT_FETCH_BYTES,
            timeout_ms=int_option(options, "timeoutMs", DEFAULT_TIMEOUT_MS, 1) or DEFAULT_TIMEOUT_MS,
            max_items_per_trigger=int_option(options, "maxItemsPerTrigger", None, 1),
            max_rows_per_trigger=int_option(options, "maxRowsPerTrigger", None, 1),
            min_items_per_trigger=min_items,
            max_trigger_delay_ms=duration_option(options, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
            items_as_blob=bool_option(options, "itemsAsBlob", True),
        )

    def keys(self) -> list[Key]:
        return [(t, b) for t in self.topics for b in self.servers]

    @property
    def limited(self) -> bool:
        """Whether any per-trigger limit is set."""
        return bool(self.max_items_per_trigger or self.max_rows_per_trigger or self.min_items_per_trigger)


def _positions(
    options: Any, side: str, default: str, topics: Sequence[str], brokers: Sequence[str]
) -> tuple[Spec, dict[Key, Spec]]:
    """``{side}Indexes``, ``{side}IndexesByTimestamp`` and ``{side}Timestamp`` ->
    (the spec of pairs not named, {(topic, broker): spec})."""
    by_index, by_time, at = f"{side}Indexes", f"{side}IndexesByTimestamp", f"{side}Timestamp"
    if _given(options, at):
        for other in (by_index, by_time):
            if _given(options, other):
                raise ValueError(f"options {at!r} and {other!r} exclude each other: {at!r} applies to every pair")
        ms = int_option(options, at, None, 0)
        assert ms is not None
        return AtTime(ms), {}
    spec_default, named = _parse_spec(options.get(by_index), by_index, default, topics, brokers)
    for key, ms in _parse_json(options.get(by_time), by_time, "ms", topics, brokers).items():
        if key in named:
            raise ValueError(f"{key[0]}/{key[1]} is named in both {by_index!r} and {by_time!r}")
        if not isinstance(ms, int) or isinstance(ms, bool) or ms < 0:
            raise ValueError(f"option {by_time!r}: {key[0]}/{key[1]} must be a time in ms >= 0, not {ms!r}")
        named[key] = AtTime(ms)
    return spec_default, named


def _parse_json(raw: str | None, name: str, what: str, topics: Sequence[str], brokers: Sequence[str]) -> dict[Key, Any]:
    """JSON ``{topic: {host:port: value}}`` -> {(topic, broker): value} (values unchecked)."""
    if raw is None or raw.strip() == "":
        return {}
    try:
        spec = json.loads(raw)
    except ValueError:
        raise ValueError(f"option {name!r} must be JSON {{topic: {{host:port: {what}}}}}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"option {name!r}: JSON must be an object {{topic: {{host:port: {what}}}}}")
    out: dict[Key, Any] = {}
    for topic, per_broker in spec.items():
        if topic not in topics:
            raise ValueError(f"option {name!r} names topic {topic!r}, which is not subscribed")
        if not isinstance(per_broker, dict):
            raise ValueError(f"option {name!r}: topic {topic!r} must map to {{host:port: {what}}}")
        for address, value in per_broker.items():
            broker = broker_address(address)
            if broker not in brokers:
                raise ValueError(f"option {name!r} names broker {address!r}, which is not in luxun.servers")
            out[(topic, broker)] = value
    return out


def _parse_spec(
    raw: str | None, name: str, default: str, topics: Sequence[str], brokers: Sequence[str]
) -> tuple[Spec, dict[Key, Spec]]:
    """``earliest``/``latest``/JSON -> (default for pairs not named, {(topic, broker): spec})."""
    if raw is None or raw.strip() == "":
        return default, {}
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower(), {}
    try:
        json.loads(text)
    except ValueError:
        raise ValueError(f"option {name!r} must be earliest, latest or JSON {{topic: {{host:port: index}}}}") from None
    out: dict[Key, Spec] = {}
    for (topic, broker), index in _parse_json(text, name, "index", topics, brokers).items():
        if isinstance(index, str) and index.lower() in ("earliest", "latest"):
            out[(topic, broker)] = index.lower()
        elif isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            out[(topic, broker)] = index
        else:
            raise ValueError(
                f"option {name!r}: {topic}/{broker} must be an index >= 0, 'earliest' or 'latest', not {index!r}"
            )
    return default, out


# -- write options ---------------------------------------------------------------------
@dataclass(frozen=True)
class WriteOptions:
    servers: tuple[str, ...]
    topic: str | None
    pack_size: int
    pack_bytes: int
    codec: int
    timeout_ms: int

    @classmethod
    def parse(cls, options: Any, schema: StructType) -> WriteOptions:
        names = {f.name: f for f in schema.fields}
        value = names.get("value")
        if value is None or not isinstance(value.dataType, BinaryType | StringType):
            raise ValueError("luxun writes need a 'value' column of type binary or string")
        topic = (options.get("topic") or "").strip() or None
        if topic is None:
            column = names.get("topic")
            if column is None:
                raise ValueError("luxun writes need a 'topic' option or a 'topic' column")
            if not isinstance(column.dataType, StringType):
                raise ValueError("the 'topic' column must be of type string")
        codec = str(options.get("compression") or "none").strip().lower()
        if codec not in CODECS:
            raise ValueError(f"option 'compression' must be one of {sorted(CODECS)}, not {codec!r}")
        return cls(
            servers=servers(options),
            topic=topic,
            pack_size=int_option(options, "packSize", DEFAULT_PACK_SIZE, 1) or DEFAULT_PACK_SIZE,
            pack_bytes=int_option(options, "packBytes", DEFAULT_PACK_BYTES, 1) or DEFAULT_PACK_BYTES,
            codec=CODECS[codec],
            timeout_ms=int_option(options, "timeoutMs", DEFAULT_TIMEOUT_MS, 1) or DEFAULT_TIMEOUT_MS,
        )
