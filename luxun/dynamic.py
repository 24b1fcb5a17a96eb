"""The broker settings a Kafka client may change at run time (Kafka's dynamic broker
configs), kept across restarts.

Luxun honours two of Kafka's dynamic broker configs: ``log.retention.ms`` and
``log.retention.bytes``, the retention of every topic without its own (see
:mod:`luxun.retention`); set, they win over the file's ``log.retention.hours`` and
``log.retention.size``. They live in ``kafka-broker-configs.json`` in the data
directory (a JSON object of key -> value string), replaced crash-safely
(:func:`luxun.files.replace_file`); Java Luxun ignores the file. The values are checked
by the door that sets them; a file that does not read is logged and ignored.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from typing import Final

from .files import replace_file

__all__ = ["BROKER_CONFIGS_FILE", "DynamicBrokerConfigs"]

log = logging.getLogger(__name__)

BROKER_CONFIGS_FILE: Final = "kafka-broker-configs.json"


class DynamicBrokerConfigs:
    """The dynamic broker configs of the broker whose data directory is ``data_dir``.

    Args:
        retention_ms, retention_bytes: the file's retention (negative: none), what
            applies where no dynamic value is set.
    """

    def __init__(self, data_dir: str, *, retention_ms: int, retention_bytes: int) -> None:
        self.path = os.path.join(data_dir, BROKER_CONFIGS_FILE)
        self.static = {"log.retention.ms": str(retention_ms), "log.retention.bytes": str(retention_bytes)}
        self._lock = threading.Lock()
        self._values: dict[str, str] = {}
        try:
            with open(self.path, encoding="utf-8") as f:
                loaded = json.load(f)
            self._values = {str(k): str(v) for k, v in loaded.items() if k in self.static}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError) as exc:
            log.error("ignoring the dynamic broker configs in %s: %s", self.path, exc)

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
            self._values = dict(values)
        log.info("dynamic broker configs now %s", dict(values) or "none")

    def retention(self) -> tuple[int | None, int | None]:
        """``log.retention.ms`` and ``log.retention.bytes`` set at run time (None: not
        set). For :class:`~luxun.retention.Maintenance` (``broker_overrides``)."""
        values = self._values
        ms, size = values.get("log.retention.ms"), values.get("log.retention.bytes")
        return (None if ms is None else int(ms)), (None if size is None else int(size))
