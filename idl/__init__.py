"""The Thrift IDL of Luxun's QueueService (``luxun.thrift``) and message packs (``message.thrift``).

Both files are loaded with thriftpy2 once, at import time, and registered in
``sys.modules`` as ``luxun_thrift`` and ``message_thrift`` (so their structs can be
pickled, e.g. by Spark). The broker (``luxun``) and the clients (``clients``) import
them from here and never load the files themselves::

    from idl import QueueService, luxun_thrift as T, message_thrift as M

    request = T.ConsumeRequest(topic="logs", fanoutId="analytics", maxFetchSize=1 << 20)
    pack = M.TMessagePack(attribute=M.CompressionCodec.GZIP, messageList=b"...")

``luxun.thrift`` is the original Luxun IDL, wire-compatible with Java Luxun (framed
transport, binary protocol), plus optional extension fields and calls listed in its
header (e.g. ``ConsumeRequest.maxWaitMs``, long-poll consume; ``itemsAsBlob``, a
fetch's items as one buffer plus lengths). ``message.thrift`` mirrors Java
Luxun's message format: a producer batch is one queue item, a ``TMessagePack``
holding a binary-serialised (and maybe compressed) ``TMessageList``.

Attributes:
    LUXUN_THRIFT: absolute path of ``luxun.thrift``.
    MESSAGE_THRIFT: absolute path of ``message.thrift``.
    luxun_thrift: the loaded ``luxun.thrift`` module (structs, enums, constants).
    message_thrift: the loaded ``message.thrift`` module.
    QueueService: the Thrift service, for thriftpy2 clients and servers.
    ERROR_CODE_NAMES: ``ErrorCode`` value -> name (``{0: "INTERNAL_ERROR", ...}``), the
        one table of error codes the broker's and the clients' exception trees are
        built from.
    RESULT_CODE_NAMES: ``ResultCode`` value -> name (``{0: "SUCCESS", ...}``).

The loaded modules are immutable type definitions and safe to share between threads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import thriftpy2

_HERE: Final[str] = os.path.dirname(os.path.abspath(__file__))

#: Absolute path of the QueueService IDL.
LUXUN_THRIFT: Final[str] = os.path.join(_HERE, "luxun.thrift")
#: Absolute path of the message-pack IDL.
MESSAGE_THRIFT: Final[str] = os.path.join(_HERE, "message.thrift")

#: The ``luxun.thrift`` module: ``ResultCode``, ``ErrorCode``, the request and response
#: structs, the constants (``EARLIEST_TIME``, ...) and ``QueueService``.
luxun_thrift: Any = thriftpy2.load(LUXUN_THRIFT, module_name="luxun_thrift")
#: The ``message.thrift`` module: ``CompressionCodec``, ``TMessagePack``, ``TMessageList``.
message_thrift: Any = thriftpy2.load(MESSAGE_THRIFT, module_name="message_thrift")

#: The QueueService Thrift service (``thriftpy2.rpc.make_client(QueueService, ...)``).
QueueService: Any = luxun_thrift.QueueService

#: ``ErrorCode`` value -> name, read from the IDL (read-only).
ERROR_CODE_NAMES: Final[Mapping[int, str]] = MappingProxyType(dict(luxun_thrift.ErrorCode._VALUES_TO_NAMES))
#: ``ResultCode`` value -> name, read from the IDL (read-only).
RESULT_CODE_NAMES: Final[Mapping[int, str]] = MappingProxyType(dict(luxun_thrift.ResultCode._VALUES_TO_NAMES))

__all__ = [
    "ERROR_CODE_NAMES",
    "LUXUN_THRIFT",
    "MESSAGE_THRIFT",
    "RESULT_CODE_NAMES",
    "QueueService",
    "luxun_thrift",
    "message_thrift",
]
