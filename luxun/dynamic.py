"""The broker settings a Kafka client may change at run time (Kafka's dynamic broker
configs), kept across restarts.

Luxun honours three of Kafka's dynamic broker configs: ``log.retention.ms`` and
``log.retention.bytes``, the retention of every topic without its own (see
:mod:`luxun.retention`; set, they win over the file's ``log.retention.hours`` and
``log.retention.size``), and ``log.cleanup.policy``, the ``cleanup.policy`` of every
Kafka topic without its own (:attr:`DynamicBrokerConfigs.compact`). Kafka's dynamic
keys of no effect on one broker are kept here too. They live in
``kafka-broker-configs.json`` in the data directory (a JSON object of key -> value
string), replaced crash-safely (:func:`luxun.files.replace_file`); Java Luxun ignores
the file. The values are checked by the door that sets them; a file that does not read
is logged and ignored, and so is a key the door does not know (``known``).

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Final

from .files import replace_file

__all__ = ["BROKER_CONFIGS_FILE", "DynamicBrokerConfigs", "cleanup_policy"]

log = logging.getLogger(__name__)

BROKER_CONFIGS_FILE: Final = "kafka-broker-configs.json"


class DynamicBrokerConfigs:
    """The dynamic broker configs of the broker whose data directory is ``data_dir``.

    Args:
        retention_ms, retention_bytes: the file's retention (negative: none), what
            applies where no dynamic value is set.
        known: the keys the door lets clients set; another key in the file is logged
            and dropped (None: every key is loaded).
    """

    def __init__(
        self, data_dir: str, *, retention_ms: int, retention_bytes: int, known: Iterable[str] | None = None
    ) -> None:
        self.path = os.path.join(data_dir, BROKER_CONFIGS_FILE)
        self.static = {"log.retention.ms": str(retention_ms), "log.retention.bytes": str(retention_bytes)}
        self._lock = threading.Lock()
        self._values: dict[str, str] = {}
        #: ``log.cleanup.policy`` set at run time names ``compact``: a Kafka topic without
        #: a ``cleanup.policy`` of its own is compacted (read on every produce: a bool).
        self.compact = False
        try:
            with open(self.path, encoding="utf-8") as f:
                loaded = json.load(f)
            values = {str(k): str(v) for k, v in loaded.items()}
        except FileNotFoundError:
            values = {}
        except (OSError, ValueError, AttributeError) as exc:
            log.error("ignoring the dynamic broker configs in %s: %s", self.path, exc)
            values = {}
        if known is not None:
            wanted = set(known)
            for key in sorted(set(values) - wanted):
                log.error("ignoring dynamic broker config %s in %s: not a key of this broker", key, self.path)
            values = {k: v for k, v in values.items() if k in wanted}
        self._set(values)

    def _set(self, values: Mapping[str, str]) -> None:
        self._values = dict(values)
        self.compact = "compact" in cleanup_policy(self._values.get("log.cleanup.policy", "delete"))

    def values(self) -> dict[str, str]:
        """The configs set at run time (key -> value)."""
        return dict(self._values)

    def replace(self, values: Mapping[str, str]) -> None:
        """Make ``values`` the configs set at run time (checked by the caller), durably.

        Raises:
            OSError: the disk refused (nothing changed).
        """
        with self._lock:
            replace_file(self.path, json.dumps(dict(values), sort_keys=True).encode())
            self._set(values)
        log.info("dynamic broker configs now %s", dict(values) or "none")

    def retention(self) -> tuple[int | None, int | None]:
        """``log.retention.ms`` and ``log.retention.bytes`` set at run time (None: not
        set). For :class:`~luxun.retention.Maintenance` (``broker_overrides``)."""
        values = self._values
        ms, size = values.get("log.retention.ms"), values.get("log.retention.bytes")
        return (None if ms is None else int(ms)), (None if size is None else int(size))

    def cleanup_policy(self) -> frozenset[str]:
        """The cleanup policy of Kafka topics without their own (``log.cleanup.policy``
        set at run time, else Kafka's default, ``delete``)."""
        return cleanup_policy(self._values.get("log.cleanup.policy", "delete"))


def cleanup_policy(value: str) -> frozenset[str]:
    """The policies a ``cleanup.policy`` (or ``log.cleanup.policy``) value names."""
    return frozenset(v.strip() for v in value.split(",") if v.strip())
