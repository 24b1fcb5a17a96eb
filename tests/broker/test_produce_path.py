"""The broker's hand-written produce path: asyncProduce frames received together are
appended as one batch, each judged on its own, with calls still taking effect in the
order they were sent; anything not in the canonical layout takes the generic path."""

from __future__ import annotations

import random
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from thriftpy2.protocol.cybin import TCyBinaryProtocol
from thriftpy2.thrift import TMessageType
from thriftpy2.transport.memory import TCyMemoryBuffer

from idl import QueueService
from idl import luxun_thrift as T
from luxun.metrics import Metrics
from luxun.thrift.server import ThriftServer
from luxun.thrift.service import QueueHandler
from luxun.topics import TopicManager

pytestmark = pytest.mark.timeout(120)

LIMIT = 1000  # max.message.size of the broker under test


def call_frame(api: str, topic: str, item: bytes, seqid: int = 1) -> bytes:
    """One framed call as thriftpy2 writes it (canonical layout)."""
    proto = TCyBinaryProtocol(TCyMemoryBuffer())
    proto.write_message_begin(api, TMessageType.ONEWAY if api == "asyncProduce" else TMessageType.CALL, seqid)
    getattr(QueueService, api + "_args")(produceRequest=T.ProduceRequest(item=item, topic=topic)).write(proto)
    proto.write_message_end()
    body = bytes(proto.trans.getvalue())
    return struct.pack(">i", len(body)) + body


def odd_layout_frame(topic: str, item: bytes, *, extra_field: bool = False) -> bytes:
    """asyncProduce with ProduceRequest's fields written topic first (and optionally an
    unknown field 9): legal Thrift, not the canonical layout, so it takes the generic
    decoder."""
    t = topic.encode()
    request = b"\x0b\x00\x02" + struct.pack(">i", len(t)) + t + b"\x0b\x00\x01" + struct.pack(">i", len(item)) + item
    if extra_field:
        request += b"\x08\x00\x09" + struct.pack(">i", 42)
    name = b"asyncProduce"
    body = (
        struct.pack(">ii", -2147418108, len(name))
        + name
        + struct.pack(">i", 5)
        + b"\x0c\x00\x01"
        + request
        + b"\x00\x00"
    )
    return struct.pack(">i", len(body)) + body


@pytest.fixture
def small_broker(broker_factory: Any, tmp_path: Path) -> Any:
    config = tmp_path / "server.properties"
    config.write_text(f"max.message.size={LIMIT}\n")
    return broker_factory("--config", str(config), metrics=True)


def read_reply(sock: socket.socket) -> Any:
    header = sock.recv(4, socket.MSG_WAITALL)
    (size,) = struct.unpack(">i", header)
    body = sock.recv(size, socket.MSG_WAITALL)
    proto = TCyBinaryProtocol(TCyMemoryBuffer(body))
    name, _, seqid = proto.read_message_begin()
    result = QueueService.produce_result()
    result.read(proto)
    return name, seqid, result.success


def test_async_batch_keeps_order_refuses_only_the_oversized_item(small_broker: Any) -> None:
    frames = [
        call_frame("asyncProduce", "a", b"a1"),
        call_frame("asyncProduce", "a", b"a2"),
        call_frame("asyncProduce", "a", b"x" * (LIMIT + 1)),  # refused on its own
        call_frame("asyncProduce", "a", b"a3"),
        call_frame("asyncProduce", "b", b"b1"),
        call_frame("asyncProduce", "a", b"a4"),
        call_frame("asyncProduce", "../bad", b"z"),  # refused: invalid topic
        call_frame("produce", "a", b"a5", seqid=77),  # sees every oneway call sent before it
    ]
    with socket.create_connection(("127.0.0.1", small_broker.port), timeout=10) as sock:
        sock.sendall(b"".join(frames))  # one write: the broker finds them together
        name, seqid, response = read_reply(sock)
    assert (name, seqid, response.result.resultCode, response.index) == ("produce", 77, 0, 4)
    client = small_broker.client()
    items = client.consume(T.ConsumeRequest(topic="a", startIndex=0, maxFetchSize=1 << 20)).itemList
    assert items == [b"a1", b"a2", b"a3", b"a4", b"a5"]
    assert client.consume(T.ConsumeRequest(topic="b", startIndex=0, maxFetchSize=1 << 20)).itemList == [b"b1"]
    client.close()
    text = small_broker.metrics_page()
    assert 'luxun_requests_total{method="asyncProduce"} 7' in text
    assert 'luxun_request_errors_total{method="asyncProduce",code="MESSAGE_SIZE_TOO_LARGE"} 1' in text
    assert 'luxun_request_errors_total{method="asyncProduce",code="INVALID_TOPIC"} 1' in text
    assert 'luxun_topic_items_in_total{topic="a"} 5' in text
    assert "refused" in small_broker.log() or "failed" in small_broker.log()


def test_other_layouts_take_the_generic_path_in_order(small_broker: Any) -> None:
    frames = [
        call_frame("asyncProduce", "o", b"1"),
        odd_layout_frame("o", b"2"),
        call_frame("asyncProduce", "o", b"3"),
        odd_layout_frame("o", b"4", extra_field=True),
        call_frame("asyncProduce", "o", b"5"),
        call_frame("produce", "o", b"6", seqid=-3),
    ]
    with socket.create_connection(("127.0.0.1", small_broker.port), timeout=10) as sock:
        sock.sendall(b"".join(frames))
        name, seqid, response = read_reply(sock)
    assert (name, seqid, response.index) == ("produce", -3, 5)
    client = small_broker.client()
    items = client.consume(T.ConsumeRequest(topic="o", startIndex=0, maxFetchSize=1 << 20)).itemList
    assert items == [b"1", b"2", b"3", b"4", b"5", b"6"]
    client.close()


def test_many_async_frames_in_flight_all_arrive(small_broker: Any) -> None:
    """Thousands of frames per write: batches are cut at their size bounds, nothing is lost."""
    frames = [call_frame("asyncProduce", "many", b"%06d" % i) for i in range(20_000)]
    with socket.create_connection(("127.0.0.1", small_broker.port), timeout=10) as sock:
        sock.sendall(b"".join(frames))
        sock.sendall(call_frame("produce", "many", b"end"))
        _, _, response = read_reply(sock)
    assert response.index == 20_000
    client = small_broker.client()
    got: list[bytes] = []
    while len(got) < 20_001:
        got += client.consume(T.ConsumeRequest(topic="many", startIndex=len(got), maxFetchSize=1 << 20)).itemList
    assert got == [b"%06d" % i for i in range(20_000)] + [b"end"]
    client.close()


def test_an_item_bigger_than_the_data_page_fails_alone(broker_factory: Any, tmp_path: Path) -> None:
    """max.message.size above the page size: the batch is refused by the storage, so
    its items are judged one by one and only the oversized one is lost."""
    config = tmp_path / "pages.properties"
    config.write_text("log.backfile.page.size=4096\nmax.message.size=100000\n")
    broker = broker_factory("--config", str(config), metrics=True)
    frames = [call_frame("asyncProduce", "p", b"s1"), call_frame("asyncProduce", "p", b"B" * 5000)]
    frames += [call_frame("asyncProduce", "p", b"s2"), call_frame("produce", "p", b"s3", seqid=4)]
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(b"".join(frames))
        _, _, response = read_reply(sock)
    assert response.index == 2
    client = broker.client()
    assert client.consume(T.ConsumeRequest(topic="p", startIndex=0, maxFetchSize=1 << 20)).itemList == [
        b"s1",
        b"s2",
        b"s3",
    ]
    client.close()
    text = broker.metrics_page()
    assert 'luxun_request_errors_total{method="asyncProduce",code="MESSAGE_SIZE_TOO_LARGE"} 1' in text
    assert 'luxun_requests_total{method="asyncProduce"} 3' in text


class StreamSocket:
    """The receiving end of a stream for ThriftServer._read_frames: each recv_into
    fills the buffer it is given completely (or up to ``chunk`` bytes), so frame and
    header boundaries fall at every possible place relative to the server's buffer."""

    def __init__(self, data: bytes, chunk: int | None = None) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.chunk = chunk
        self.sent: list[bytes] = []

    def recv_into(self, view: memoryview, nbytes: int = 0, flags: int = 0) -> int:  # flags: a busy poll's
        n = min(len(view), len(self.data) - self.pos, self.chunk or len(view))
        view[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n

    def sendall(self, data: bytes) -> None:
        self.sent.append(bytes(data))


def serve_stream(tmp_path: Path, stream: bytes, chunk: int | None, *, item_limit: int,
                 others: tuple[str, ...] = ()) -> tuple[Any, Any, StreamSocket]:  # fmt: skip
    """Feed ``stream`` to a ThriftServer connection in process (real storage, pages of
    four items' size): ``(server, the items stored in topic "s", the socket with what
    was sent)``; with ``others``, the items of each of these topics follow "s"'s (a tuple).
    The storage is closed before it returns."""
    metrics = Metrics()
    topics = TopicManager(tmp_path / "data", data_page_size_bytes=4 * item_limit)
    handler = QueueHandler(
        topics, broker_id=0, max_message_size_bytes=item_limit,
        password_check=lambda _: False, metrics=metrics,
    )  # fmt: skip
    server = ThriftServer(QueueService, handler, "127.0.0.1", 0, max_frame_bytes=item_limit + 4096, metrics=metrics)
    sock = StreamSocket(stream, chunk)
    try:
        server._read_frames(sock, "test")  # type: ignore[arg-type]
        assert sock.pos == len(stream), "the server stopped reading before the end of the stream"
        assert metrics.bad_frames == 0
        stored = [topics.get(t).queue.read_range(0, max_items=1 << 20) for t in ("s", *others)]  # type: ignore[union-attr]
        return server, (tuple(stored) if others else stored[0]), sock
    finally:
        topics.close()


@pytest.mark.parametrize("chunk", [None, 1, 3, 4093])
def test_frames_split_anywhere_by_reads_are_all_handled(tmp_path: Path, chunk: int | None) -> None:
    """Full-buffer reads that end inside a frame header, or a few bytes at a time:
    every frame is handled, in order (in process, with real storage)."""
    rng = random.Random(chunk or 7)
    items = [bytes([i % 251]) * rng.randrange(0, 300) for i in range(3000)]
    stream = b"".join(call_frame("asyncProduce", "s", item) for item in items)
    stream += call_frame("produce", "s", b"last", seqid=9)
    _, stored, sock = serve_stream(tmp_path, stream, chunk, item_limit=1 << 20)
    assert stored == [*items, b"last"]
    assert len(sock.sent) == 1


@pytest.mark.parametrize("chunk", [None, 5, 4093])
def test_async_calls_shaped_like_the_last_one_land_in_their_topic_in_order(tmp_path: Path, chunk: int | None) -> None:
    """An asyncProduce shaped like the last one parsed (same topic, any item length or
    seqid) is read by comparing bytes; anything else is parsed: another topic of the same
    length, another field order (with or without an extra field), an extra field between
    item and topic, an asyncProduce typed CALL, a produce. Every item lands in its own
    topic, in order; only the produce is answered."""
    rng = random.Random(chunk or 11)
    want: dict[str, list[bytes]] = {"s": [], "t": []}
    frames = []
    for i in range(3000):
        topic = "s" if rng.random() < 0.7 else "t"
        item = bytes([i % 251]) * rng.choice([0, 1, 100, rng.randrange(0, 300)])
        r = rng.random()
        if r < 0.05:
            frames.append(odd_layout_frame(topic, item, extra_field=r < 0.025))
        elif r < 0.065:  # the canonical layout but for a field between item and topic: as
            # long as a canonical call of a 7 bytes longer item, whose tail it ends with
            t, name = topic.encode(), b"asyncProduce"
            body = (struct.pack(">ii", -2147418108, len(name)) + name + struct.pack(">i", i) + b"\x0c\x00\x01"
                    + b"\x0b\x00\x01" + struct.pack(">i", len(item)) + item + b"\x08\x00\x09" + struct.pack(">i", 7)
                    + b"\x0b\x00\x02" + struct.pack(">i", len(t)) + t + b"\x00\x00")  # fmt: skip
            frames.append(struct.pack(">i", len(body)) + body)
        elif r < 0.09:
            proto = TCyBinaryProtocol(TCyMemoryBuffer())
            proto.write_message_begin("asyncProduce", TMessageType.CALL, i)
            QueueService.asyncProduce_args(produceRequest=T.ProduceRequest(item=item, topic=topic)).write(proto)
            body = bytes(proto.trans.getvalue())
            frames.append(struct.pack(">i", len(body)) + body)
        else:
            frames.append(call_frame("asyncProduce", topic, item, seqid=rng.randrange(-(2**31), 2**31)))
        want[topic].append(item)
    stream = b"".join(frames) + call_frame("produce", "s", b"last", seqid=9)
    _, (stored_s, stored_t), sock = serve_stream(tmp_path, stream, chunk, item_limit=1 << 20, others=("t",))
    assert stored_s == [*want["s"], b"last"]
    assert stored_t == want["t"]
    assert len(sock.sent) == 1


@pytest.mark.parametrize("chunk", [None, 4093, 70001])
def test_big_frames_get_their_own_mapping_and_arrive_whole(tmp_path: Path, chunk: int | None) -> None:
    """Frames over 1 MiB (received into a mapping of their own, items not copied again)
    between small ones, by asyncProduce, produce and the generic path, split anywhere
    by reads: every item arrives whole and in order, and all input budget comes back."""
    big = [bytes([i]) * ((1 << 20) + 1000 * i) + b"end%d" % i for i in range(1, 4)]
    stream = b"".join(
        [
            call_frame("asyncProduce", "s", b"a"),
            call_frame("asyncProduce", "s", big[0]),
            call_frame("asyncProduce", "s", b"b"),
            call_frame("produce", "s", big[1], seqid=5),
            odd_layout_frame("s", big[2]),  # the generic path, decoded by thriftpy2
            call_frame("produce", "s", b"c", seqid=6),
        ]
    )
    server, stored, sock = serve_stream(tmp_path, stream, chunk, item_limit=2 << 20)
    assert stored == [b"a", big[0], b"b", big[1], big[2], b"c"]
    replies = []
    for frame in sock.sent:
        proto = TCyBinaryProtocol(TCyMemoryBuffer(frame[4:]))
        _, _, seqid = proto.read_message_begin()
        result = QueueService.produce_result()
        result.read(proto)
        replies.append((seqid, result.success.index))
    assert replies == [(5, 3), (6, 5)]
    assert server._budget.used == 0 and server.metrics.input_buffer_bytes == 0


@pytest.mark.parametrize("size", [100, 1000, 3000, 20_000])
def test_fetches_are_sent_from_the_pages_and_give_them_back(tmp_path: Path, size: int) -> None:
    """A fetch (by index and by group) sends its items from views of the storage pages:
    what arrives is what was stored, also across page ends and after retention deleted
    pages under a reader; once answered, no page is still referenced."""
    from thriftpy2.protocol import TCyBinaryProtocolFactory
    from thriftpy2.rpc import make_client
    from thriftpy2.transport import TCyFramedTransportFactory

    metrics = Metrics()
    topics = TopicManager(tmp_path / "data", data_page_size_bytes=64 * 1024)
    handler = QueueHandler(
        topics, broker_id=0, max_message_size_bytes=64 * 1024,
        password_check=lambda _: False, metrics=metrics,
    )  # fmt: skip
    server = ThriftServer(QueueService, handler, "127.0.0.1", 0, max_frame_bytes=1 << 20, metrics=metrics)
    server.start()
    try:
        items = [bytes([i % 251]) * (size + i % 3) for i in range(300)]  # lengths vary a little
        handler.async_produce_many("v", items[:150])
        handler.async_produce_many("v", items[150:])
        client = make_client(QueueService, "127.0.0.1", server.address[1], proto_factory=TCyBinaryProtocolFactory(),
                             trans_factory=TCyFramedTransportFactory(), timeout=20_000)  # fmt: skip
        got: list[bytes] = []
        while len(got) < 300:
            got += client.consume(T.ConsumeRequest(topic="v", startIndex=len(got), maxFetchSize=10_000)).itemList
        assert got == items
        queue = topics.get("v").queue  # type: ignore[union-attr]
        by_group: list[bytes] = []
        trimmed = False
        while len(by_group) < 300:
            by_group += client.consume(T.ConsumeRequest(topic="v", fanoutId="g", maxFetchSize=10_000)).itemList
            if not trimmed and len(by_group) >= 60:
                cut = len(by_group) + 50
                assert cut < 300
                queue.remove_before_index(cut)  # retention overtakes the group
                by_group, trimmed = items[:cut], True  # the group resumes at the new tail
        assert by_group == items and trimmed
        client.close()
        array = queue.array

        def refs() -> dict[int, int]:  # of each mapped data page, but for the writer's own reference
            return {p.page_no: p.refs - (p is array._data_page) for p in list(array._data._mapped.values())}

        deadline = time.monotonic() + 10  # the last reply may arrive before its thread gave the page back
        while any(refs().values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(refs().values()), refs()
    finally:
        server.stop()
        topics.close()
