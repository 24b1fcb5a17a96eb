"""The agent's settings, and the subset of a Dory XML config file that applies to luxun.

:class:`AgentConfig` is a frozen dataclass with units in the names; :func:`load_dory_config`
reads Dory's ``<doryConfig>`` file into one, and lists the settings it read but does not use
(those that only mean something for Kafka, or that this agent does not implement) so that
``luxun agent`` can report them at start.

What a Dory config sets here (names as in Dory's ``detailed_config.md``):

- ``batching``: ``namedConfigs`` (``time``, ``messages``, ``bytes``; ``disable``),
  ``topicConfigs`` (``perTopic``/``disable``), ``defaultTopic``, ``combinedTopics`` (a luxun
  pack holds one topic: topics batched "combined" are batched per topic with the
  combinedTopics limits), ``messageMaxBytes`` (the largest pack; set it to the broker's
  ``max.message.size``);
- ``compression``: ``namedConfigs`` (``none``/``gzip``/``snappy``, ``minSize``),
  ``sizeThresholdPercent``, ``defaultTopic``, ``topicConfigs`` (a gzip ``level`` is read and
  ignored: packs use level 6, as Java Luxun);
- ``topicRateLimiting``: ``interval`` (ms) and ``maxCount`` (or ``unlimited``) per topic;
- ``inputSources``: ``unixDatagram``/``unixStream`` (``path``, ``mode``), ``tcp`` (``port``);
- ``inputConfig``: ``maxBuffer``, ``maxDatagramMsgSize``, ``allowLargeUnixDatagrams``,
  ``maxStreamMsgSize``;
- ``msgDelivery``: ``topicAutocreate``, ``maxFailedDeliveryAttempts``, ``shutdownMaxDelay``,
  ``kafkaSocketTimeout`` (the broker call timeout), ``metadataRefreshInterval`` (how often
  the topic list is read when ``topicAutocreate`` is off);
- ``discardLogging`` (``enable``, ``path``, ``maxFileSize``, ``maxArchiveSize``,
  ``maxMsgPrefixSize``): see :mod:`clients.agent.discardlog`;
- ``httpInterface``: ``port``, ``discardReportInterval``, ``badMsgPrefixSize``
  (``loopbackOnly`` false is reported: this agent always listens on 127.0.0.1);
- ``initialBrokers``: the brokers when no ``--broker`` is given.

Sizes take ``k``/``m`` (x 1024, x 1024 * 1024) as in Dory.

Thread-safety: immutable values.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

#: Compression names -> clients.messages codec numbers.
CODECS = {"none": 0, "gzip": 1, "snappy": 2}


class AgentConfigError(ValueError):
    """A bad setting; the message names the file, element and value."""


@dataclass(frozen=True)
class Batching:
    """When a topic's batch is sent: the first limit reached (None: no such limit)."""

    time_ms: int | None = 100
    messages: int | None = None
    bytes: int | None = 256 * 1024

    def __post_init__(self) -> None:
        if self.time_ms is None and self.messages is None and self.bytes is None:
            raise AgentConfigError("a batching config needs at least one of time, messages, bytes")


#: A topic whose batching is disabled: every message is sent alone.
NO_BATCHING = Batching(time_ms=0, messages=1, bytes=None)


@dataclass(frozen=True)
class Compression:
    codec: str = "none"
    min_size_bytes: int = 128

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise AgentConfigError(f"compression type {self.codec!r} is not one of none, gzip, snappy")


@dataclass(frozen=True)
class RateLimit:
    """At most ``max_count`` messages per ``interval_ms`` (None: unlimited)."""

    interval_ms: int
    max_count: int | None


@dataclass(frozen=True)
class AgentConfig:
    brokers: tuple[str, ...] = ()
    dgram_path: str | None = None
    dgram_mode: int | None = None
    stream_path: str | None = None
    stream_mode: int | None = None
    tcp_port: int | None = None
    status_port: int = 9090
    #: The memory pool: bytes of buffered messages (each costs its size + MSG_OVERHEAD_BYTES).
    max_buffer_bytes: int = 128 * 1024 * 1024
    max_datagram_bytes: int = 64 * 1024
    max_stream_msg_bytes: int = 16 * 1024 * 1024
    #: The largest pack (one queue item) sent: the broker's max.message.size.
    message_max_bytes: int = 1_000_000
    default_batching: Batching = Batching()
    topic_batching: Mapping[str, Batching] = field(default_factory=dict)
    default_compression: Compression = Compression()
    topic_compression: Mapping[str, Compression] = field(default_factory=dict)
    #: A compressed pack bigger than this percentage of the plain one is sent plain.
    compression_size_threshold_percent: int = 75
    default_rate_limit: RateLimit | None = None
    topic_rate_limits: Mapping[str, RateLimit | None] = field(default_factory=dict)
    #: True: any valid topic name is sent (luxun brokers create topics with their first
    #: item). False: only topics some broker lists (listTopics) are sent; others are
    #: "bad topic" discards.
    topic_autocreate: bool = True
    metadata_refresh_ms: int = 15 * 60 * 1000
    max_failed_delivery_attempts: int = 5
    retry_backoff_ms: int = 200
    max_retry_backoff_ms: int = 5_000
    shutdown_max_delay_ms: int = 30_000
    broker_timeout_ms: int = 10_000
    discard_report_interval_s: int = 600
    bad_msg_prefix_bytes: int = 256
    #: Dory's discardLogging: a file with one line per discarded message (None: off).
    discard_log_path: str | None = None
    discard_log_max_file_bytes: int = 32 * 1024 * 1024
    discard_log_max_archive_bytes: int = 256 * 1024 * 1024
    #: Bytes of a key and a value written to the discard log (None: unlimited).
    discard_log_max_prefix_bytes: int | None = 2 * 1024
    #: Settings read from a Dory config and not used, as "element: why".
    ignored: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_buffer_bytes", "max_datagram_bytes", "max_stream_msg_bytes", "message_max_bytes",
                     "max_failed_delivery_attempts"):  # fmt: skip
            if getattr(self, name) < 1:
                raise AgentConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.compression_size_threshold_percent <= 100:
            raise AgentConfigError("sizeThresholdPercent must be 0-100")
        if self.tcp_port is not None and not 0 <= self.tcp_port <= 65535:
            raise AgentConfigError(f"TCP port {self.tcp_port} is not 0-65535")
        if not 0 <= self.status_port <= 65535:
            raise AgentConfigError(f"status port {self.status_port} is not 0-65535")

    def batching(self, topic: str) -> Batching:
        return self.topic_batching.get(topic, self.default_batching)

    def compression(self, topic: str) -> Compression:
        return self.topic_compression.get(topic, self.default_compression)

    def rate_limit(self, topic: str) -> RateLimit | None:
        if topic in self.topic_rate_limits:
            return self.topic_rate_limits[topic]
        return self.default_rate_limit

    def with_(self, **changes: Any) -> AgentConfig:
        return replace(self, **changes)


def parse_size(text: str, where: str) -> int:
    """``"128m"`` -> 134217728; ``"64k"``; a plain integer."""
    t = text.strip().lower()
    mult = 1
    if t.endswith("k"):
        mult, t = 1024, t[:-1]
    elif t.endswith("m"):
        mult, t = 1024 * 1024, t[:-1]
    if not t.isdigit():
        raise AgentConfigError(f"{where}: {text!r} is not a size (an integer, optionally with k or m)")
    return int(t) * mult


def _mode(text: str, where: str) -> int | None:
    t = text.strip().lower()
    if t == "unspecified":
        return None
    try:
        if t.startswith("0b"):
            return int(t[2:], 2)
        if t.startswith("0"):
            return int(t, 8)
    except ValueError:
        pass
    raise AgentConfigError(f"{where}: mode {text!r} must be octal (0644), binary (0b110100100) or unspecified")


def _bool(text: str | None, where: str, default: bool = False) -> bool:
    if text is None:
        return default
    t = text.strip().lower()
    if t in ("true", "1", "yes"):
        return True
    if t in ("false", "0", "no"):
        return False
    raise AgentConfigError(f"{where}: {text!r} is not true or false")


def _value(el: ET.Element | None, where: str) -> str | None:
    if el is None:
        return None
    v = el.get("value")
    if v is None:
        raise AgentConfigError(f"{where}: missing value attribute")
    return v


def _limit(text: str | None, where: str, *, size: bool) -> int | None:
    if text is None or text.strip().lower() == "disable":
        return None
    return parse_size(text, where) if size else int(parse_size(text, where))


# Elements read and not used, with the reason reported at start.
_KAFKA_ONLY = {
    "batching/produceRequestDataLimit": "a produce request carries one pack here",
    "msgDelivery/dispatcherRestartMaxDelay": "Kafka metadata only",
    "msgDelivery/compareMetadataOnRefresh": "Kafka metadata only",
    "msgDelivery/pauseRateLimitInitial": "Kafka metadata only (retries back off from 200 ms)",
    "msgDelivery/pauseRateLimitMaxDouble": "Kafka metadata only",
    "msgDelivery/minPauseDelay": "Kafka metadata only",
    "kafkaConfig": "Kafka protocol settings",
    "msgDebug": "not implemented",
    "logging": "the agent logs to stderr (--log-level)",
}


def _topic_configs(
    section: Any,
    named: Mapping[str, Any],
    kind: str,
    default_where: str,
    topic_where: str,
    changes: dict[str, Any],
    default_key: str,
    topics_key: str,
) -> None:
    """A section's ``defaultTopic`` and ``topicConfigs/topic`` entries, each naming one of
    its ``named`` configs (an unknown name is an error naming the ``kind``), into
    ``changes[default_key]`` (only when given) and ``changes[topics_key]``."""

    def pick(name: str | None, w: str) -> Any:
        if name is None or name not in named:
            raise AgentConfigError(f"{w}: unknown {kind} config {name!r}")
        return named[name]

    dt = section.find("defaultTopic")
    if dt is not None:
        changes[default_key] = pick(dt.get("config"), f"{default_where} defaultTopic")
    changes[topics_key] = {
        t.get("name", ""): pick(t.get("config"), f"{topic_where} topic {t.get('name')!r}")
        for t in section.findall("topicConfigs/topic")
    }


def load_dory_config(path: str | Path, base: AgentConfig | None = None) -> AgentConfig:
    """Read a Dory XML config file over ``base`` (defaults).

    Raises:
        AgentConfigError: unreadable file, not a doryConfig, or a bad value (named).
    """
    where = str(path)
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise AgentConfigError(f"cannot read Dory config {where}: {exc}") from exc
    if root.tag != "doryConfig":
        raise AgentConfigError(f"{where}: the root element is <{root.tag}>, not <doryConfig>")
    cfg = base or AgentConfig()
    changes: dict[str, Any] = {}
    ignored: list[str] = []
    for name, why in _KAFKA_ONLY.items():
        if root.find(name) is not None:
            ignored.append(f"{name}: {why}")

    batching = root.find("batching")
    if batching is not None:
        named: dict[str, Batching] = {}
        for c in batching.findall("namedConfigs/config"):
            w = f"{where}: batching config {c.get('name')!r}"
            named[c.get("name", "")] = Batching(
                time_ms=_limit(_value(c.find("time"), w), w, size=False),
                messages=_limit(_value(c.find("messages"), w), w, size=True),
                bytes=_limit(_value(c.find("bytes"), w), w, size=True),
            )

        def pick(action: str | None, name: str | None, w: str) -> Batching:
            if action == "disable":
                return NO_BATCHING
            if action == "combinedTopics":
                return combined
            if name not in named:
                raise AgentConfigError(f"{w}: unknown batching config {name!r}")
            return named[name]

        mmb = _value(batching.find("messageMaxBytes"), f"{where}: messageMaxBytes")
        if mmb is not None:
            changes["message_max_bytes"] = parse_size(mmb, f"{where}: messageMaxBytes")
        combined = cfg.default_batching
        ct = batching.find("combinedTopics")
        if ct is not None and _bool(ct.get("enable"), f"{where}: combinedTopics", True):
            combined = pick("perTopic", ct.get("config"), f"{where}: combinedTopics")
            ignored.append("batching/combinedTopics: a pack holds one topic; combined topics are batched per topic "
                           "with its limits")  # fmt: skip
        dt = batching.find("defaultTopic")
        if dt is not None:
            changes["default_batching"] = pick(dt.get("action"), dt.get("config"), f"{where}: batching defaultTopic")
        else:
            changes["default_batching"] = combined
        changes["topic_batching"] = {
            t.get("name", ""): pick(t.get("action"), t.get("config"), f"{where}: batching topic {t.get('name')!r}")
            for t in batching.findall("topicConfigs/topic")
        }

    compression = root.find("compression")
    if compression is not None:
        cnamed: dict[str, Compression] = {}
        for c in compression.findall("namedConfigs/config"):
            w = f"{where}: compression config {c.get('name')!r}"
            ctype = (c.get("type") or "none").lower()
            if ctype not in CODECS:
                why = " (a Luxun pack cannot carry lz4: its codecs are none, gzip, snappy)" if ctype == "lz4" else ""
                raise AgentConfigError(f"{w}: type {ctype!r} is not none, gzip or snappy{why}")
            if c.get("level") is not None:
                ignored.append(f"compression/{c.get('name')}/level: gzip packs use level 6")
            cnamed[c.get("name", "")] = Compression(ctype, parse_size(c.get("minSize") or "0", w))

        stp = _value(compression.find("sizeThresholdPercent"), f"{where}: sizeThresholdPercent")
        if stp is not None:
            changes["compression_size_threshold_percent"] = int(stp)
        _topic_configs(compression, cnamed, "compression", f"{where}: compression", f"{where}: compression", changes,
                       "default_compression", "topic_compression")  # fmt: skip

    rl = root.find("topicRateLimiting")
    if rl is not None:
        rnamed: dict[str, RateLimit | None] = {}
        for c in rl.findall("namedConfigs/config"):
            w = f"{where}: rate limit config {c.get('name')!r}"
            mc = (c.get("maxCount") or "").strip().lower()
            interval = int(c.get("interval") or "0")
            if interval < 1:
                raise AgentConfigError(f"{w}: interval must be >= 1 ms")
            rnamed[c.get("name", "")] = None if mc == "unlimited" else RateLimit(interval, parse_size(mc, w))

        _topic_configs(rl, rnamed, "rate limit", f"{where}: topicRateLimiting", f"{where}: rate limit", changes,
                       "default_rate_limit", "topic_rate_limits")  # fmt: skip

    src = root.find("inputSources")
    if src is not None:
        for tag, prefix in (("unixDatagram", "dgram"), ("unixStream", "stream")):
            el = src.find(tag)
            if el is not None and _bool(el.get("enable"), f"{where}: {tag}"):
                p = _value(el.find("path"), f"{where}: {tag}/path") or ""
                if p and not p.startswith("/"):
                    raise AgentConfigError(f"{where}: {tag}/path {p!r} must be absolute")
                changes[f"{prefix}_path"] = p or None
                m = _value(el.find("mode"), f"{where}: {tag}/mode")
                if m is not None:
                    changes[f"{prefix}_mode"] = _mode(m, f"{where}: {tag}/mode")
        el = src.find("tcp")
        if el is not None and _bool(el.get("enable"), f"{where}: tcp"):
            port = (_value(el.find("port"), f"{where}: tcp/port") or "").strip()
            changes["tcp_port"] = int(port) if port else None

    ic = root.find("inputConfig")
    if ic is not None:
        for tag, name in (("maxBuffer", "max_buffer_bytes"), ("maxDatagramMsgSize", "max_datagram_bytes"),
                          ("maxStreamMsgSize", "max_stream_msg_bytes")):  # fmt: skip
            v = _value(ic.find(tag), f"{where}: {tag}")
            if v is not None:
                changes[name] = parse_size(v, f"{where}: {tag}")
        large = _value(ic.find("allowLargeUnixDatagrams"), f"{where}: allowLargeUnixDatagrams")
        if _bool(large, f"{where}: allowLargeUnixDatagrams"):
            changes["max_datagram_bytes"] = max(changes.get("max_datagram_bytes", cfg.max_datagram_bytes), 425_951)

    md = root.find("msgDelivery")
    if md is not None:
        ta = md.find("topicAutocreate")
        if ta is not None:
            changes["topic_autocreate"] = _bool(ta.get("enable"), f"{where}: topicAutocreate")
        for tag, name, mult in (("maxFailedDeliveryAttempts", "max_failed_delivery_attempts", 1),
                                ("shutdownMaxDelay", "shutdown_max_delay_ms", 1),
                                ("kafkaSocketTimeout", "broker_timeout_ms", 1000),
                                ("metadataRefreshInterval", "metadata_refresh_ms", 60_000)):  # fmt: skip
            v = _value(md.find(tag), f"{where}: {tag}")
            if v is not None:
                changes[name] = int(v) * mult

    hi = root.find("httpInterface")
    if hi is not None:
        v = _value(hi.find("port"), f"{where}: httpInterface/port")
        if v is not None:
            changes["status_port"] = int(v)
        if not _bool(_value(hi.find("loopbackOnly"), f"{where}: loopbackOnly"), "loopbackOnly", True):
            ignored.append("httpInterface/loopbackOnly=false: the status page listens on 127.0.0.1 only")
        v = _value(hi.find("discardReportInterval"), f"{where}: discardReportInterval")
        if v is not None:
            changes["discard_report_interval_s"] = int(v)
        v = _value(hi.find("badMsgPrefixSize"), f"{where}: badMsgPrefixSize")
        if v is not None:
            changes["bad_msg_prefix_bytes"] = parse_size(v, f"{where}: badMsgPrefixSize")

    dl = root.find("discardLogging")
    if dl is not None and _bool(dl.get("enable"), f"{where}: discardLogging enable"):
        w = f"{where}: discardLogging"
        v = _value(dl.find("path"), f"{w}/path")
        if v:  # unspecified: off, as in Dory
            changes["discard_log_path"] = v
        for tag, name in (("maxFileSize", "discard_log_max_file_bytes"),
                          ("maxArchiveSize", "discard_log_max_archive_bytes")):  # fmt: skip
            v = _value(dl.find(tag), f"{w}/{tag}")
            if v is not None:
                changes[name] = parse_size(v, f"{w}/{tag}")
        v = _value(dl.find("maxMsgPrefixSize"), f"{w}/maxMsgPrefixSize")
        if v is not None:
            unlimited = v.strip().lower() == "unlimited"
            changes["discard_log_max_prefix_bytes"] = None if unlimited else parse_size(v, f"{w}/maxMsgPrefixSize")

    brokers = [f"{b.get('host')}:{b.get('port') or 9092}" for b in root.findall("initialBrokers/broker")]
    if brokers and not cfg.brokers:
        changes["brokers"] = tuple(brokers)
    changes["ignored"] = tuple(ignored)
    try:
        return cfg.with_(**changes)
    except (TypeError, ValueError) as exc:
        raise AgentConfigError(f"{where}: {exc}") from exc


__all__ = ["AgentConfig", "AgentConfigError", "Batching", "Compression", "RateLimit", "load_dory_config",
           "parse_size"]  # fmt: skip
