"""The hand-written consume reply is byte-for-byte what thriftpy2 writes."""

from __future__ import annotations

from typing import Any

import pytest
from thriftpy2.protocol.cybin import TCyBinaryProtocol
from thriftpy2.thrift import TMessageType
from thriftpy2.transport.memory import TCyMemoryBuffer

from idl import QueueService
from idl import luxun_thrift as T
from luxun.wire import encode_consume_reply


def reference(seqid: int, response: Any) -> bytes:
    proto = TCyBinaryProtocol(TCyMemoryBuffer())
    proto.write_message_begin("consume", TMessageType.REPLY, seqid)
    QueueService.consume_result(success=response).write(proto)
    proto.write_message_end()
    return bytes(proto.trans.getvalue())


RESPONSES = {
    "items": T.ConsumeResponse(
        result=T.Result(resultCode=0), itemList=[b"", b"a", b"\x00" * 300, "é".encode()], lastConsumedIndex=2**40
    ),
    "try later": T.ConsumeResponse(
        result=T.Result(resultCode=2, errorCode=7, errorMessage="all messages have been consumed, try later"),
        itemList=[],
        lastConsumedIndex=0,
    ),
    "unicode error": T.ConsumeResponse(
        result=T.Result(resultCode=1, errorCode=1, errorMessage="topic 'ü' does not exist on broker 3"),
        itemList=[],
        lastConsumedIndex=0,
    ),
    "with timestamps": T.ConsumeResponse(
        result=T.Result(resultCode=0),
        itemList=[b"x", b"yz"],
        lastConsumedIndex=0,
        timestampList=[1_700_000_000_123, 2**62],
        firstIndex=2**33,
    ),
    "empty timestamps": T.ConsumeResponse(
        result=T.Result(resultCode=2, errorCode=7, errorMessage="try later"),
        itemList=[],
        lastConsumedIndex=0,
        timestampList=[],
        firstIndex=17,
    ),
    "many": T.ConsumeResponse(
        result=T.Result(resultCode=0), itemList=[b"%d" % i for i in range(5000)], lastConsumedIndex=4999
    ),
}


@pytest.mark.parametrize("name", sorted(RESPONSES))
@pytest.mark.parametrize("seqid", [0, 1, 2**31 - 1, -5])
def test_encode_consume_reply_matches_thriftpy2(name: str, seqid: int) -> None:
    response = RESPONSES[name]
    assert encode_consume_reply(seqid, response) == reference(seqid, response)
