"""Bad input: each is answered with an error or a closed connection, while other
clients keep working and the broker's memory stays bounded."""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Any

import pytest
from thriftpy2.protocol.cybin import TCyBinaryProtocol
from thriftpy2.thrift import TApplicationException, TMessageType
from thriftpy2.transport.memory import TCyMemoryBuffer

from idl import QueueService
from idl import luxun_thrift as T

pytestmark = pytest.mark.timeout(120)

STRICT_CALL = struct.pack(">i", -2147418112 | 1)  # version 1, message type CALL


def message(name: bytes, body: bytes, seqid: int = 1) -> bytes:
    return STRICT_CALL + struct.pack(">i", len(name)) + name + struct.pack(">i", seqid) + body


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def produce_body(topic: bytes, item: bytes) -> bytes:
    """args struct { 1: ProduceRequest { 1: binary item, 2: string topic } }"""
    request = (
        b"\x0b\x00\x01" + struct.pack(">i", len(item)) + item + b"\x0b\x00\x02" + struct.pack(">i", len(topic)) + topic
    ) + b"\x00"
    return b"\x0c\x00\x01" + request + b"\x00"


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def send_raw(port: int, data: bytes, *, read: bool = True) -> bytes:
    """Send bytes on a fresh connection; return what comes back before the broker closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        if read:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


BAD_INPUTS = {
    "random garbage": os.urandom(4096),
    "frame announcing 2 GiB": struct.pack(">i", 2**31 - 1) + b"x" * 1000,
    "negative frame size": struct.pack(">i", -5) + b"x" * 10,
    "zero frame size": struct.pack(">i", 0),
    "string length 2^31 - 1": framed(
        message(b"produce", b"\x0c\x00\x01\x0b\x00\x02" + struct.pack(">i", 2**31 - 1) + b"ab")
    ),
    "list length 2^31 - 1": framed(message(b"produce", b"\x0f\x00\x09\x0b" + struct.pack(">i", 2**31 - 1) + b"a")),
    "map length 2^31 - 1": framed(message(b"produce", b"\x0d\x00\x09\x0b\x0b" + struct.pack(">i", 2**31 - 1))),
    "deep nesting": framed(message(b"produce", b"\x0c\x00\x01" * 5000)),
    "unknown type id": framed(message(b"produce", b"\x11\x00\x01abc")),
    "bad protocol version": framed(struct.pack(">i", -2147352575) + b"\x00" * 20),
    "truncated frame": struct.pack(">i", 500) + b"\x80\x01\x00\x01" + b"\x00" * 20,
    "frame cut inside a struct": framed(message(b"produce", b"\x0c\x00\x01\x0b\x00\x01\x00\x00\x00\x05ab")),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_closes_only_that_connection(broker: Any, client: Any, name: str) -> None:
    assert client.produce(T.ProduceRequest(item=b"before", topic="safe")).result.resultCode == 0
    reply = send_raw(broker.port, BAD_INPUTS[name])
    assert reply == b""  # nothing sent back: the connection was just closed
    assert client.produce(T.ProduceRequest(item=b"after", topic="safe")).index == 1
    items = client.consume(T.ConsumeRequest(topic="safe", startIndex=0, maxFetchSize=1000)).itemList
    assert items == [b"before", b"after"]
    assert broker.proc.poll() is None


def test_unknown_method_gets_an_application_exception(broker: Any) -> None:
    reply = send_raw(broker.port, framed(message(b"noSuchCall", b"\x00")))
    assert len(reply) > 8
    (size,) = struct.unpack(">i", reply[:4])
    assert size == len(reply) - 4
    (version_and_type,) = struct.unpack(">i", reply[4:8])
    assert version_and_type & 0xFF == 3  # EXCEPTION


def test_invalid_utf8_topic_is_refused(broker: Any, client: Any) -> None:
    reply = send_raw(broker.port, framed(message(b"produce", produce_body(b"\xff\xfe bad", b"item"))))
    proto = TCyBinaryProtocol(TCyMemoryBuffer(reply[4:]))
    name, _, _ = proto.read_message_begin()
    assert name == "produce"
    result = QueueService.produce_result()
    result.read(proto)
    assert result.success.result.errorCode == T.ErrorCode.INVALID_TOPIC
    assert sorted(p.name for p in broker.data_dir.iterdir() if p.is_dir()) == []


def test_many_bad_connections_keep_memory_bounded(broker: Any, client: Any) -> None:
    client.produce(T.ProduceRequest(item=b"warm", topic="safe"))
    before = rss_kib(broker.proc.pid)
    deadline = time.monotonic() + 30
    for i in range(60):
        assert time.monotonic() < deadline
        name = sorted(BAD_INPUTS)[i % len(BAD_INPUTS)]
        send_raw(broker.port, BAD_INPUTS[name])
    # A frame announcing 2 GiB and actually sending 8 MiB of it.
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(struct.pack(">i", 2**31 - 1))
        try:
            for _ in range(128):
                s.sendall(b"x" * 65536)
        except OSError:
            pass  # closed on us: fine
    time.sleep(0.2)
    after = rss_kib(broker.proc.pid)
    assert after - before < 64 * 1024, f"RSS grew from {before} KiB to {after} KiB"
    assert client.getSize(T.GetSizeRequest(topic="safe")).size == 1


def test_a_slow_client_sending_half_a_frame_does_not_block_others(broker: Any, client: Any) -> None:
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as stuck:
        stuck.sendall(struct.pack(">i", 1000) + b"\x80\x01")
        t0 = time.monotonic()
        for i in range(50):
            assert client.produce(T.ProduceRequest(item=b"%d" % i, topic="free")).index == i
        assert time.monotonic() - t0 < 5


def read_consume_reply(reply: bytes) -> Any:
    """The ConsumeResponse of a reply frame, or the TApplicationException it carries."""
    (size,) = struct.unpack(">i", reply[:4])
    assert size == len(reply) - 4, "exactly one whole reply frame"
    proto = TCyBinaryProtocol(TCyMemoryBuffer(reply[4:]))
    name, kind, _ = proto.read_message_begin()
    assert name == "consume"
    if kind == TMessageType.EXCEPTION:
        error = TApplicationException()
        error.read(proto)
        return error
    result = QueueService.consume_result()
    result.read(proto)
    return result.success


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (b"\x00", (TApplicationException.INTERNAL_ERROR, "Internal error processing consume")),  # no request
        (b"\x0c\x00\x01\x00\x00", (TApplicationException.PROTOCOL_ERROR, "Required field 'topic' is unset!")),
        (
            b"\x0c\x00\x01\x08\x00\x01\x00\x00\x00\x07\x00\x00",  # topic sent as an i32: skipped, so missing
            (TApplicationException.PROTOCOL_ERROR, "Required field 'topic' is unset!"),
        ),
        (
            b"\x0c\x00\x01\x0b\x00\x01\x00\x00\x00\x01t\x08\x00\x04\xff\xff\xff\xff\x02\x00\x06\x01\x00\x00",
            None,
        ),  # fetch -1
    ],
    ids=["no request", "no topic", "topic of the wrong type", "negative fetch with timestamps"],
)
def test_odd_consume_requests_get_an_answer(broker: Any, client: Any, body: bytes, want: Any) -> None:
    """Well-formed frames with missing or mistyped consume fields: Java Luxun's
    TApplicationException (or, for a negative maxFetchSize, one item), no traceback
    in the log, and the broker keeps serving."""
    client.produce(T.ProduceRequest(item=b"x", topic="t"))
    response = read_consume_reply(send_raw(broker.port, framed(message(b"consume", body))))
    if want is None:
        assert (response.result.resultCode, response.itemList, response.timestampList[0] > 0) == (0, [b"x"], True)
    else:
        assert isinstance(response, TApplicationException)
        assert response.type == want[0] and response.message.startswith(want[1]), response
    assert client.consume(T.ConsumeRequest(topic="t", startIndex=0, maxFetchSize=100)).itemList == [b"x"]
    assert broker.proc.poll() is None
    assert "Traceback" not in broker.log()


def test_calls_without_their_request_struct_are_answered(broker: Any) -> None:
    """Every call with an empty args struct, on one connection: answered as Java Luxun
    does (produce and consume: TApplicationException INTERNAL_ERROR; the others an
    INTERNAL_ERROR Result), the connection stays open, no traceback is logged."""
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        for seqid, api in enumerate(["produce", "consume", "findClosestIndexByTime", "deleteTopic", "getSize"]):
            s.sendall(framed(message(api.encode(), b"\x00", seqid)))
            (size,) = struct.unpack(">i", _read(s, 4))
            proto = TCyBinaryProtocol(TCyMemoryBuffer(_read(s, size)))
            name, kind, got_seqid = proto.read_message_begin()
            assert (name, got_seqid) == (api, seqid)
            if api in ("produce", "consume"):
                assert kind == TMessageType.EXCEPTION
                error = TApplicationException()
                error.read(proto)
                assert (error.type, error.message) == (
                    TApplicationException.INTERNAL_ERROR,
                    f"Internal error processing {api}",
                )
            else:
                result = getattr(QueueService, api + "_result")()
                result.read(proto)
                assert result.success.result.errorCode == T.ErrorCode.INTERNAL_ERROR
                assert "needs a" in result.success.result.errorMessage
    assert "Traceback" not in broker.log() and "AttributeError" not in broker.log()


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data
