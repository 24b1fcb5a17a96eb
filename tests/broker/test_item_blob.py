"""The ``itemsAsBlob`` extension against a real broker: a consume that sets it gets its
items as ``itemBlob`` + ``itemLengths`` (fields 8 and 9) instead of ``itemList``, the
same items, by index and by group, from one data page (sent from the page's view) or
several; a consume that does not set it gets ``itemList`` as ever."""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from thriftpy2.protocol.cybin import TCyBinaryProtocol
from thriftpy2.thrift import TMessageType
from thriftpy2.transport.memory import TCyMemoryBuffer

from idl import QueueService
from idl import luxun_thrift as T

pytestmark = pytest.mark.timeout(120)

OK = T.ResultCode.SUCCESS
PAGE = 65536  # log.backfile.page.size: a 1 MiB fetch spans many data pages


def small_pages(tmp_path: Path) -> str:
    config = tmp_path / "server.properties"
    config.write_text(f"log.backfile.page.size={PAGE}\n")
    return str(config)


def blob_items(reply: Any) -> list[bytes]:
    """The items of a reply sent as a blob (checked to be one: no itemList)."""
    assert reply.itemList is None, "itemsAsBlob asked: itemList must be unset"
    assert reply.itemBlob is not None and reply.itemLengths is not None
    assert len(reply.itemLengths) % 4 == 0
    lengths = np.frombuffer(reply.itemLengths, dtype=">i4").tolist()
    assert sum(lengths) == len(reply.itemBlob)
    out, pos = [], 0
    for n in lengths:
        out.append(reply.itemBlob[pos : pos + n])
        pos += n
    return out


def produced(client: Any, topic: str, items: list[bytes]) -> None:
    for item in items:
        assert client.produce(T.ProduceRequest(item=item, topic=topic)).result.resultCode == OK


# Items of 0 bytes among others, big ones that fill data pages (a fetch spans several),
# then many small ones (a fetch of thousands of items from one page).
ITEMS = (
    [b"", b"a", b"", b"\x00" * 7, b""]
    + [bytes([i]) * (20_000 + 997 * i) for i in range(12)]
    + [b"%05d" % i for i in range(6000)]
    + [b""]
)


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests._broker import BrokerProcess

    root = tmp_path_factory.mktemp("blob")
    broker = BrokerProcess(root / "data", root / "broker.log", "--config", small_pages(root)).start()
    client = broker.client()
    produced(client, "blob", ITEMS)
    yield broker, client
    client.close()
    broker.stop()


@pytest.mark.parametrize("max_fetch", [0, 1, 100, 50_000, 1 << 20])
@pytest.mark.parametrize("start", [0, 1, 4, 5, 9, 17, 3000, len(ITEMS) - 1])
def test_a_fetch_by_index_as_a_blob_holds_the_items_of_its_item_list(filled: Any, start: int, max_fetch: int) -> None:
    _, client = filled
    for times in (None, True):
        plain = client.consume(
            T.ConsumeRequest(topic="blob", startIndex=start, maxFetchSize=max_fetch, withTimestamps=times)
        )
        blob = client.consume(
            T.ConsumeRequest(
                topic="blob", startIndex=start, maxFetchSize=max_fetch, withTimestamps=times, itemsAsBlob=True
            )
        )
        assert plain.result.resultCode == blob.result.resultCode == OK
        assert plain.itemBlob is None and plain.itemLengths is None  # not asked: itemList, as ever
        assert plain.itemList == ITEMS[start : start + len(plain.itemList)]
        assert blob_items(blob) == plain.itemList
        for field in ("lastConsumedIndex", "timestampList", "firstIndex", "firstMessage"):
            assert getattr(blob, field) == getattr(plain, field), field


def test_a_whole_topic_read_as_blobs_is_its_items(filled: Any) -> None:
    """Fetches of 1 MiB across every page: together, exactly the items produced."""
    _, client = filled
    got: list[bytes] = []
    while len(got) < len(ITEMS):
        reply = client.consume(
            T.ConsumeRequest(topic="blob", startIndex=len(got), maxFetchSize=1 << 20, itemsAsBlob=True)
        )
        assert reply.result.resultCode == OK
        got.extend(blob_items(reply))
    assert got == ITEMS


def test_a_group_reads_blobs_and_errors_stay_as_they_were(filled: Any) -> None:
    _, client = filled
    got: list[bytes] = []
    for max_fetch in (0, 30_000, *[1 << 20] * 10):
        if len(got) == len(ITEMS):
            break
        reply = client.consume(T.ConsumeRequest(topic="blob", fanoutId="g", maxFetchSize=max_fetch, itemsAsBlob=True))
        assert reply.result.resultCode == OK
        got.extend(blob_items(reply))
    assert got == ITEMS
    done = client.consume(T.ConsumeRequest(topic="blob", fanoutId="g", maxFetchSize=1 << 20, itemsAsBlob=True))
    missing = client.consume(T.ConsumeRequest(topic="nope", startIndex=0, maxFetchSize=1 << 20, itemsAsBlob=True))
    for reply in (done, missing):  # error replies: no items at all, as without the flag
        assert reply.result.resultCode != OK
        assert reply.itemList is None and reply.itemBlob is None and reply.itemLengths is None


def raw_call(port: int, request: Any) -> bytes:
    """Send one consume call as thriftpy2 writes it; the reply frame's bytes as sent."""
    proto = TCyBinaryProtocol(TCyMemoryBuffer())
    proto.write_message_begin("consume", TMessageType.CALL, 3)
    QueueService.consume_args(consumeRequest=request).write(proto)
    proto.write_message_end()
    body = bytes(proto.trans.getvalue())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        head = sock.recv(4, socket.MSG_WAITALL)
        (size,) = struct.unpack(">i", head)
        data = bytearray()
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            assert chunk
            data += chunk
    return bytes(data)


def reference(response: Any) -> bytes:
    proto = TCyBinaryProtocol(TCyMemoryBuffer())
    proto.write_message_begin("consume", TMessageType.REPLY, 3)
    QueueService.consume_result(success=response).write(proto)
    proto.write_message_end()
    return bytes(proto.trans.getvalue())


def test_the_replies_on_the_wire_are_what_thriftpy2_writes(filled: Any) -> None:
    """Without the flag, the reply is the itemList reply, byte for byte (an original
    client's); with it, fields 8 and 9 in place of field 2 and nothing else changed."""
    broker, client = filled
    for start in (0, 5, 3000):
        request = T.ConsumeRequest(topic="blob", startIndex=start, maxFetchSize=1 << 20, withTimestamps=True)
        plain = client.consume(request)
        assert raw_call(broker.port, request) == reference(plain)
        request.itemsAsBlob = True
        items = plain.itemList
        as_blob = T.ConsumeResponse(
            result=plain.result,
            lastConsumedIndex=plain.lastConsumedIndex,
            timestampList=plain.timestampList,
            firstIndex=plain.firstIndex,
            itemBlob=b"".join(items),
            itemLengths=np.array([len(x) for x in items], dtype=">i4").tobytes(),
        )
        assert raw_call(broker.port, request) == reference(as_blob)
