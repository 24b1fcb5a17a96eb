"""The hand-written consume reply is byte-for-byte what thriftpy2 writes."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from thriftpy2.protocol.cybin import TCyBinaryProtocol
from thriftpy2.thrift import TMessageType
from thriftpy2.transport.memory import TCyMemoryBuffer

from idl import QueueService
from idl import luxun_thrift as T
from luxun.thrift.wire import (
    ItemBlob,
    consume_one_reply_frame,
    encode_consume_reply,
    encode_consume_reply_parts,
    encode_produce_reply,
    parse_consume_call,
    parse_produce_call,
    produce_reply_frame,
)


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
    "uniform": T.ConsumeResponse(  # one size: framed as rows of a 2-D array
        result=T.Result(resultCode=0), itemList=[bytes([i % 256]) * 100 for i in range(3000)], lastConsumedIndex=0
    ),
    "many big": T.ConsumeResponse(  # >= 512 B each, more than fit in one sendmsg: joined
        result=T.Result(resultCode=0), itemList=[bytes([i % 256]) * (600 + i) for i in range(700)], lastConsumedIndex=0
    ),
    "many big of one size": T.ConsumeResponse(  # >= 512 B, too many for one sendmsg, one size: rows
        result=T.Result(resultCode=0), itemList=[bytes([i % 256]) * 1000 for i in range(1048)], lastConsumedIndex=0
    ),
    "few big": T.ConsumeResponse(  # sent as memoryview slices
        result=T.Result(resultCode=0), itemList=[b"a" * 100_000, b"b" * 70_000, b""], lastConsumedIndex=0
    ),
    "unset itemList": T.ConsumeResponse(  # error replies, as Java Luxun's
        result=T.Result(resultCode=1, errorCode=1, errorMessage="topic nope does not exist on broker 1"),
        lastConsumedIndex=0,
    ),
    "unset itemList with timestamps": T.ConsumeResponse(
        result=T.Result(resultCode=2, errorCode=7, errorMessage="try later"),
        lastConsumedIndex=0,
        timestampList=[],
        firstIndex=4,
    ),
    "held by another member": T.ConsumeResponse(  # EXTENSION heldBy (field 6)
        result=T.Result(resultCode=2, errorCode=7, errorMessage="group 'g' is read by member 'ü'"),
        lastConsumedIndex=0,
        heldBy="member-ü",
    ),
    "from a pack committed in part": T.ConsumeResponse(  # EXTENSION firstMessage (field 7)
        result=T.Result(resultCode=0),
        itemList=[b"pack", b"next"],
        lastConsumedIndex=6,
        firstIndex=5,
        firstMessage=2**31 - 1,
    ),
    "many": T.ConsumeResponse(
        result=T.Result(resultCode=0), itemList=[b"%d" % i for i in range(5000)], lastConsumedIndex=4999
    ),
    "few of one size": T.ConsumeResponse(  # as many as are framed in Python
        result=T.Result(resultCode=0), itemList=[bytes([65 + i]) * 100 for i in range(16)], lastConsumedIndex=9
    ),
    "one more, sizes mixed": T.ConsumeResponse(  # one more than that: numpy's insert
        result=T.Result(resultCode=0),
        itemList=[bytes([65 + i]) * (i * 7 % 300) for i in range(17)],
        lastConsumedIndex=9,
    ),
}


@pytest.mark.parametrize("name", sorted(RESPONSES))
@pytest.mark.parametrize("seqid", [0, 1, 2**31 - 1, -5])
def test_encode_consume_reply_matches_thriftpy2(name: str, seqid: int) -> None:
    response = RESPONSES[name]
    assert encode_consume_reply(seqid, response) == reference(seqid, response)


@pytest.mark.parametrize("name", sorted(n for n, r in RESPONSES.items() if r.itemList is not None))
@pytest.mark.parametrize("view", [False, True], ids=["bytes", "view"])
def test_items_as_one_blob_encode_the_same(name: str, view: bool) -> None:
    response = RESPONSES[name]
    items = response.itemList
    data = b"".join(items)  # a storage page's view when read with read_range_view
    blob = ItemBlob(np.array([len(x) for x in items], dtype=np.int64), memoryview(data).toreadonly() if view else data)
    assert len(blob) == len(items) and blob.nbytes == sum(map(len, items)) and blob.to_list() == items
    as_blob = copy.copy(response)
    as_blob.itemList = blob
    assert encode_consume_reply(3, as_blob) == reference(3, response)


@pytest.mark.parametrize("name", sorted(n for n, r in RESPONSES.items() if r.itemList))
@pytest.mark.parametrize("view", [False, True], ids=["bytes", "view"])
def test_items_sent_as_a_blob_are_fields_8_and_9(name: str, view: bool) -> None:
    """EXTENSION itemsAsBlob: the reply thriftpy2 writes with itemBlob and itemLengths
    set and itemList unset, the blob's bytes sent as they are (one buffer: not copied)."""
    response = RESPONSES[name]
    items = response.itemList
    data = b"".join(items)
    blob = ItemBlob(np.array([len(x) for x in items], dtype=np.int64), memoryview(data).toreadonly() if view else data)
    blob.as_blob = True
    as_blob = copy.copy(response)
    as_blob.itemList = blob
    want = copy.copy(response)
    want.itemList = None
    want.itemBlob = data
    want.itemLengths = b"".join(len(x).to_bytes(4, "big") for x in items)
    parts = encode_consume_reply_parts(3, as_blob)
    assert b"".join(parts) == encode_consume_reply(3, as_blob) == reference(3, want)
    assert len(parts) == 3 and parts[1] is blob.data
    assert ItemBlob.of(items).to_list() == items


def call_bytes(api: str, request: Any, seqid: int, kind: int) -> bytes:
    proto = TCyBinaryProtocol(TCyMemoryBuffer())
    proto.write_message_begin(api, kind, seqid)
    args = getattr(QueueService, api + "_args")()
    setattr(args, "consumeRequest" if api == "consume" else "produceRequest", request)
    args.write(proto)
    proto.write_message_end()
    return bytes(proto.trans.getvalue())


@pytest.mark.parametrize(
    "result",
    [
        T.Result(resultCode=0),
        T.Result(resultCode=1, errorCode=6, errorMessage="item of 2000 bytes is over max.message.size 1000 ✓"),
    ],
    ids=["ok", "error"],
)
@pytest.mark.parametrize("seqid", [0, 2**31 - 1, -5])
def test_encode_produce_reply_matches_thriftpy2(result: Any, seqid: int) -> None:
    for index in (0, 1, 2**62):
        proto = TCyBinaryProtocol(TCyMemoryBuffer())
        proto.write_message_begin("produce", TMessageType.REPLY, seqid)
        QueueService.produce_result(success=T.ProduceResponse(result=result, index=index)).write(proto)
        proto.write_message_end()
        want = bytes(proto.trans.getvalue())
        assert encode_produce_reply(seqid, result, index) == want
        assert produce_reply_frame(seqid, result, index) == len(want).to_bytes(4, "big") + want


@pytest.mark.parametrize("seqid", [0, 7, -(2**31), 2**31 - 1])
@pytest.mark.parametrize("item", [b"", b"a", b"\x00" * 300, "é".encode(), bytes(range(256)) * 400])
@pytest.mark.parametrize("last", [0, 5, 2**40, 2**63 - 1])
def test_consume_one_reply_frame_matches_thriftpy2(seqid: int, item: bytes, last: int) -> None:
    """The one-item reply of QueueHandler.consume_single, framed, as thriftpy2 writes it."""
    body = reference(seqid, T.ConsumeResponse(result=T.Result(resultCode=0), itemList=[item], lastConsumedIndex=last))
    assert consume_one_reply_frame(seqid, item, last) == len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("item", [b"", b"\x00\xff" * 300, b"x" * 70_000])
@pytest.mark.parametrize("topic", ["t", "événements", "a" * 255])
def test_parse_produce_call_reads_what_thriftpy2_writes(item: bytes, topic: str) -> None:
    request = T.ProduceRequest(item=item, topic=topic)
    for api, kind, oneway in (
        ("produce", TMessageType.CALL, False),
        ("asyncProduce", TMessageType.ONEWAY, True),
        ("asyncProduce", TMessageType.CALL, True),  # old generators send oneway calls as CALL
    ):
        data = b"junk" + call_bytes(api, request, 9, kind) + b"more"
        assert parse_produce_call(data, 4, len(data) - 4) == (oneway, 9, item, topic)
        # the broker reads from its bytearray buffer, and from a memoryview of a big
        # frame's own mapping (the item then a view into it, not a copy)
        buffer = bytearray(data)
        from_buffer = parse_produce_call(buffer, 4, len(data) - 4)
        assert from_buffer == (oneway, 9, item, topic) and type(from_buffer[2]) is bytearray
        buffer[:] = bytes(len(buffer))  # the receive buffer is reused: the item is a copy
        assert from_buffer[2] == item
        from_view = parse_produce_call(memoryview(data), 4, len(data) - 4)
        assert from_view is not None and type(from_view[2]) is memoryview
        assert (from_view[0], from_view[1], bytes(from_view[2]), from_view[3]) == (oneway, 9, item, topic)


def test_parse_produce_call_leaves_everything_else_to_the_generic_path() -> None:
    good = call_bytes("produce", T.ProduceRequest(item=b"item", topic="t"), 1, TMessageType.CALL)
    assert parse_produce_call(good, 0, len(good)) is not None
    others = {
        "another method": call_bytes(
            "produce", T.ProduceRequest(item=b"item", topic="t"), 1, TMessageType.CALL
        ).replace(b"produce", b"produca"),
        "reply type": good[:3] + b"\x02" + good[4:],
        "old-style header": good[4:],
        "truncated": good[:-1],
        "trailing byte": good + b"\x00",
        "item length past the end": good.replace(b"\x00\x00\x00\x04item", b"\x00\x00\x7f\xffitem"),
        "negative item length": good.replace(b"\x00\x00\x00\x04item", b"\xff\xff\xff\xffitem"),
        "invalid UTF-8 topic": good.replace(b"\x00\x00\x00\x01t", b"\x00\x00\x00\x01\xff"),
        "fields reversed": good.replace(b"\x0b\x00\x01", b"\x0b\x00\x03"),
        "missing STOP": good[:-2] + b"\x08\x00",
    }
    others["produce's name, asyncProduce's length"] = good.replace(b"\x00\x07produce", b"\x00\x0cproduce")
    others["cut inside the head"] = good[:20]
    others["nonzero end"] = good[:-1] + b"\x01"
    for name, data in others.items():
        for buf in (data, bytearray(data), memoryview(data)):
            assert parse_produce_call(buf, 0, len(data)) is None, name


CONSUME_REQUESTS = [
    T.ConsumeRequest(topic="t"),
    T.ConsumeRequest(topic="événements", startIndex=2**40, maxFetchSize=0),
    T.ConsumeRequest(topic="t", fanoutId="g", maxFetchSize=1 << 20, maxWaitMs=5000),
    T.ConsumeRequest(topic="t", fanoutId="", startIndex=-1, maxFetchSize=-5, withTimestamps=True),
    T.ConsumeRequest(
        topic="a" * 255, fanoutId="b" * 255, startIndex=7, maxFetchSize=1, maxWaitMs=0, withTimestamps=False
    ),
    T.ConsumeRequest(topic="t", startIndex=3, maxFetchSize=1 << 20, withTimestamps=True, itemsAsBlob=True),
    T.ConsumeRequest(topic="t", fanoutId="g", itemsAsBlob=False),
]


@pytest.mark.parametrize("request_", CONSUME_REQUESTS)
def test_parse_consume_call_reads_what_thriftpy2_writes(request_: Any) -> None:
    data = b"junk" + call_bytes("consume", request_, 11, TMessageType.CALL) + b"more"
    parsed = parse_consume_call(data, 4, len(data) - 4)
    assert parsed is not None
    seqid, fields = parsed
    assert seqid == 11
    assert T.ConsumeRequest(**fields) == request_


def test_parse_consume_call_leaves_everything_else_to_the_generic_path() -> None:
    request_ = T.ConsumeRequest(topic="t", fanoutId="g", startIndex=3, maxFetchSize=9)
    good = call_bytes("consume", request_, 1, TMessageType.CALL)
    assert parse_consume_call(good, 0, len(good)) is not None
    others = {
        "another method": good.replace(b"consume", b"consumf"),
        "oneway": good[:3] + b"\x04" + good[4:],
        "old-style header": good[4:],
        "truncated": good[:-1],
        "trailing byte": good + b"\x00",
        "no topic": call_bytes("consume", T.ConsumeRequest(fanoutId="g"), 1, TMessageType.CALL),
        "topic length past the end": good.replace(b"\x00\x00\x00\x01t", b"\x00\x00\x7f\xfft"),
        "negative topic length": good.replace(b"\x00\x00\x00\x01t", b"\xff\xff\xff\xfft"),
        "invalid UTF-8 topic": good.replace(b"\x00\x00\x00\x01t", b"\x00\x00\x00\x01\xff"),
        "unknown field": good[:-2] + b"\x08\x00\x63\x00\x00\x00\x01\x00\x00",
        "field of another type": good.replace(b"\x0a\x00\x03", b"\x08\x00\x03")[:-4] + b"\x00\x00",
        "fields out of order": good.replace(b"\x0b\x00\x02", b"\x0b\x00\x09"),
    }
    for name, data in others.items():
        assert parse_consume_call(data, 0, len(data)) is None, name
