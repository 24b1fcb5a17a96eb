"""The layout of QueueService's ``produce`` and ``asyncProduce`` calls on the wire, as every
Thrift generator writes them (strict binary protocol): one definition for the broker,
which reads them by hand (:mod:`luxun.thrift.wire`), and the clients, which write them by hand
(:mod:`clients.connection`).

A framed call is: the frame's length (i32), the message type (version 1 | ``CALL``, or
``ONEWAY`` for asyncProduce), the method name with its i32 length, the seqid (i32),
:data:`ARGS_ITEM` (the args' field 1, the ProduceRequest struct, and its field 1, the
binary item), the item's length (i32) and the item, then :data:`TOPIC_FIELD` (the
request's field 2, the string topic), the topic's length and the topic, and two STOPs
(of the request and of the args).
"""

from __future__ import annotations

from typing import Final

#: Message types: version 1 | CALL (1), ONEWAY (4), REPLY (2); as signed i32.
CALL: Final = -2147418111  # 0x80010001
ONEWAY: Final = -2147418108  # 0x80010004
REPLY: Final = -2147418110  # 0x80010002
#: The method names as they are written: an i32 length, then the name.
PRODUCE_NAME: Final = b"\x00\x00\x00\x07produce"
ASYNC_PRODUCE_NAME: Final = b"\x00\x00\x00\x0casyncProduce"
#: The args' field 1 (struct ProduceRequest), then the request's field 1 (binary item).
ARGS_ITEM: Final = b"\x0c\x00\x01\x0b\x00\x01"
#: The request's field 2 (string topic).
TOPIC_FIELD: Final = b"\x0b\x00\x02"

__all__ = ["ARGS_ITEM", "ASYNC_PRODUCE_NAME", "CALL", "ONEWAY", "PRODUCE_NAME", "REPLY", "TOPIC_FIELD"]
