"""luxun: the broker (topic manager, QueueService, server, config, retention, metrics, CLI).

The public face, importable from here::

    from luxun import Broker, BrokerConfig

    broker = Broker(BrokerConfig.from_file("conf/server.properties"))
    broker.serve_forever()

Names load on first use (PEP 562), so ``import luxun.errors`` or the CLI's client
commands do not pay for the broker's imports (numpy, the storage, the server).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .broker import Broker, StartupError
    from .config import BrokerConfig, load_properties, parse_properties
    from .errors import ConfigError, DataDirLockedError, LuxunError

#: Where each public name lives.
_WHERE = {
    "Broker": "luxun.broker",
    "StartupError": "luxun.broker",
    "BrokerConfig": "luxun.config",
    "load_properties": "luxun.config",
    "parse_properties": "luxun.config",
    "ConfigError": "luxun.errors",
    "DataDirLockedError": "luxun.errors",
    "LuxunError": "luxun.errors",
}

__all__ = [
    "Broker",
    "BrokerConfig",
    "ConfigError",
    "DataDirLockedError",
    "LuxunError",
    "StartupError",
    "load_properties",
    "parse_properties",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'luxun' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
