"""Kafka 4.0's group configs (KIP-848, KIP-932): the keys, their checks, and where a
broker keeps them.

A group's configs are set by IncrementalAlterConfigs and AlterConfigs on a resource of
type GROUP (32) and shown by DescribeConfigs (:mod:`.admin`), as a Kafka 4.0 broker
does: any group name but the empty one, whether the group exists or not; the six keys of
Kafka's ``GroupConfig`` (:data:`GROUP_CONFIGS`); values parsed as Kafka's ``ConfigDef``
parses them, then checked as a whole (the keys not set at their defaults) against the
broker's bounds, Kafka's defaults: ``group.consumer.min/max.session.timeout.ms``
(45000-60000), ``group.consumer.min/max.heartbeat.interval.ms`` (5000-15000), the same
for share groups, ``group.share.min/max.record.lock.duration.ms`` (15000-60000), and a
session timeout greater than the heartbeat interval. A refusal is INVALID_CONFIG in
Kafka's words; an unknown key "Unknown group config name: x".

**Of no effect on luxun, said so in docs/kafka-admin.md.** Kafka applies the
``consumer.*`` keys only to groups of the consumer protocol (KIP-848's
ConsumerGroupHeartbeat) and the ``share.*`` keys only to share groups; luxun serves
classic groups only (JoinGroup/SyncGroup/Heartbeat, whose members give their own
session timeout), as a Kafka broker does to classic members whatever these keys say.
So they are checked, kept and shown, and nothing reads them.

They live in ``kafka-group-configs.json`` in the data directory (a JSON object: group
-> {key -> value}), replaced crash-safely (:func:`luxun.files.replace_file`) on every
change; a group whose keys are all deleted leaves the file. They belong to the name: a
DeleteGroups or the expiry of the group keeps them (whether Kafka 4.0 drops them with
the group is not checked here).

Thread-safety: :class:`GroupConfigStore`'s methods may be called from any thread.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Final

from ..files import replace_file
from .topic_configs import IGNORED, ConfigProblem, TopicConfig, parsed_value

__all__ = ["GROUP_CONFIGS", "GROUP_CONFIGS_FILE", "GroupConfigStore", "check_group_configs"]

log = logging.getLogger(__name__)

GROUP_CONFIGS_FILE: Final = "kafka-group-configs.json"

#: The keys of Kafka 4.0's GroupConfig, with Kafka's types, lower bounds and defaults.
GROUP_CONFIGS: Final[Mapping[str, TopicConfig]] = {
    c.name: c
    for c in (
        TopicConfig("consumer.session.timeout.ms", "int", "45000", IGNORED, lo=1),
        TopicConfig("consumer.heartbeat.interval.ms", "int", "5000", IGNORED, lo=1),
        TopicConfig("share.session.timeout.ms", "int", "45000", IGNORED, lo=1),
        TopicConfig("share.heartbeat.interval.ms", "int", "5000", IGNORED, lo=1),
        TopicConfig("share.record.lock.duration.ms", "int", "30000", IGNORED, lo=1000),
        TopicConfig("share.auto.offset.reset", "string", "latest", IGNORED, choices=("latest", "earliest")),
    )
}

#: Each bounded key: (the broker config of its lower bound, that bound, of its upper
#: bound, that bound). Luxun's broker has Kafka's defaults for them.
_BOUNDS: Final[Mapping[str, tuple[str, int, str, int]]] = {
    "consumer.heartbeat.interval.ms": (
        "group.consumer.min.heartbeat.interval.ms", 5000, "group.consumer.max.heartbeat.interval.ms", 15000,
    ),
    "consumer.session.timeout.ms": (
        "group.consumer.min.session.timeout.ms", 45000, "group.consumer.max.session.timeout.ms", 60000,
    ),
    "share.heartbeat.interval.ms": (
        "group.share.min.heartbeat.interval.ms", 5000, "group.share.max.heartbeat.interval.ms", 15000,
    ),
    "share.session.timeout.ms": (
        "group.share.min.session.timeout.ms", 45000, "group.share.max.session.timeout.ms", 60000,
    ),
    "share.record.lock.duration.ms": (
        "group.share.min.record.lock.duration.ms", 15000, "group.share.max.record.lock.duration.ms", 60000,
    ),
}  # fmt: skip


def check_group_configs(configs: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    """Check a group's whole set of configs (``(name, value)`` pairs, as they would be
    after the change): the configs to keep (name -> value, blanks stripped).

    Raises:
        ConfigProblem: an unknown key, a null or invalid value, a value outside the
            broker's bounds, a session timeout not above the heartbeat interval.
    """
    kept: dict[str, str] = {}
    values: dict[str, object] = {}
    for name, raw in configs:
        key = GROUP_CONFIGS.get(name)
        if key is None:
            raise ConfigProblem(f"Unknown group config name: {name}")
        if raw is None:
            raise ConfigProblem(f"Null value not supported for group configs: {name}")
        values[name] = parsed_value(key, raw)
        kept[name] = raw.strip()
    full = {name: values.get(name, parsed_value(key, key.default)) for name, key in GROUP_CONFIGS.items()}
    for name, (lo_name, lo, hi_name, hi) in _BOUNDS.items():
        value = full[name]
        assert isinstance(value, int)
        if value < lo:
            raise ConfigProblem(f"{name} must be greater than or equal to {lo_name} ({lo} on this broker)")
        if value > hi:
            raise ConfigProblem(f"{name} must be less than or equal to {hi_name} ({hi} on this broker)")
    for kind in ("consumer", "share"):
        session, heartbeat = full[f"{kind}.session.timeout.ms"], full[f"{kind}.heartbeat.interval.ms"]
        assert isinstance(session, int) and isinstance(heartbeat, int)
        if session <= heartbeat:
            raise ConfigProblem(f"{kind}.session.timeout.ms must be greater than {kind}.heartbeat.interval.ms")
    return kept


class GroupConfigStore:
    """The group configs of the broker whose data directory is ``data_dir`` (see the
    module); a file that does not read is logged and ignored, as are entries in it
    that no longer pass :func:`check_group_configs`."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, GROUP_CONFIGS_FILE)
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, str]] = {}
        try:
            with open(self.path, encoding="utf-8") as f:
                loaded = json.load(f)
            items = loaded.items()
        except FileNotFoundError:
            return
        except (OSError, ValueError, AttributeError) as exc:
            log.error("ignoring the group configs in %s: %s", self.path, exc)
            return
        for group, configs in items:
            try:
                if not isinstance(configs, dict) or not group:
                    raise ConfigProblem("not an object of configs")
                kept = check_group_configs((str(k), str(v)) for k, v in configs.items())
            except ConfigProblem as exc:
                log.error("ignoring the configs of group %r in %s: %s", group, self.path, exc)
                continue
            if kept:
                self._groups[str(group)] = kept

    def get(self, group: str) -> dict[str, str]:
        """The configs set on ``group`` (key -> value; empty: none)."""
        return dict(self._groups.get(group, {}))

    def groups(self) -> list[str]:
        """The groups with configs set."""
        return sorted(self._groups)

    def replace(self, group: str, values: Mapping[str, str]) -> None:
        """Make ``values`` (checked by the caller) the configs of ``group``, durably.

        Raises:
            OSError: the disk refused (nothing changed).
        """
        with self._lock:
            groups = dict(self._groups)
            if values:
                groups[group] = dict(values)
            else:
                groups.pop(group, None)
            replace_file(self.path, json.dumps(groups, sort_keys=True).encode())
            self._groups = groups
        log.info("group %r configs now %s", group, dict(values) or "the defaults")
