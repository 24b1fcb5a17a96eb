"""Produce calls written by hand as buffers (what the agent sends): a real broker stores
them and answers them as thriftpy2's own calls, and every byte goes even when the kernel
takes the buffers in pieces."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

import pytest

from clients.connection import BrokerConnection, consume_request, produce_call_parts, send_parts
from clients.messages import decode_pack
from clients.pack import pack_written_parts
from idl import luxun_thrift as T

from .conftest import address


def _written(values: list[bytes]) -> bytearray:
    return bytearray(b"".join(struct.pack(">i", len(v)) + v for v in values))


def test_hand_framed_produce_calls_are_stored_and_answered_in_order(brokers: Any) -> None:
    """Three calls pipelined on one connection (two topics, one pack of 300 KB, one
    empty item), their answers read with thriftpy2's client: each stored at the index
    answered, byte for byte. A wrong frame length or field would make the broker close
    the connection or store other bytes."""
    (b,) = brokers(1)
    conn = BrokerConnection(address(b))
    try:
        client = conn._connect()
        big = [bytes([i % 251]) * 1000 for i in range(300)]
        sends: list[tuple[str, list[bytes | bytearray]]] = [
            ("parts-a", pack_written_parts(len(big), _written(big))),
            ("parts-b", pack_written_parts(2, _written([b"x", b"yz"]))),
            ("parts-a", [b""]),
        ]
        sock = client._oprot.trans.sock
        for topic, item in sends:
            send_parts(sock, produce_call_parts(item, sum(map(len, item)), topic))
        answers = [client._recv("produce") for _ in sends]
        assert [a.result.resultCode for a in answers] == [T.ResultCode.SUCCESS] * 3
        assert [a.index for a in answers] == [0, 0, 1]
        # The connection still serves thriftpy2's own calls.
        got_a = conn.call("consume", consume_request("parts-a", index=0))
        got_a2 = conn.call("consume", consume_request("parts-a", index=1))
        got_b = conn.call("consume", consume_request("parts-b", index=0))
    finally:
        conn.close()
    assert decode_pack(got_a.itemList[0]) == big
    assert got_a2.itemList == [b""]
    assert decode_pack(got_b.itemList[0]) == [b"x", b"yz"]


def test_produce_and_async_produce_framed_by_hand(brokers: Any) -> None:
    """BrokerConnection.produce (what the Producer sends with): acknowledged calls get
    their index, oneway ones land in order between them, a refusal is the BrokerError of
    its Result, and the connection goes on."""
    from clients.errors import MessageSizeTooLargeError

    (b,) = brokers(1)
    with BrokerConnection(address(b)) as conn:
        assert conn.produce(b"first", "hand").index == 0
        assert conn.produce(b"second", "hand", oneway=True) is None
        assert conn.produce(bytearray(b"third"), "hand", oneway=True) is None
        assert conn.produce(b"x" * 300_000, "hand").index == 3
        with pytest.raises(MessageSizeTooLargeError):
            conn.produce(b"y" * ((1 << 20) + 1), "hand")  # over the broker's max.message.size (1 MiB)
        assert conn.produce(b"last", "hand").index == 4
        got = [conn.call("consume", consume_request("hand", index=i)).itemList[0] for i in range(5)]
    assert got == [b"first", b"second", b"third", b"x" * 300_000, b"last"]


def test_send_parts_sends_every_byte_when_the_kernel_takes_them_in_pieces() -> None:
    """A small send buffer and a reader that takes 4 KiB at a time: sendmsg returns after
    part of the buffers, again and again (counted), and the bytes arrive whole, in order."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    parts: list[bytes | bytearray] = [bytes(range(256)) * 4000, b"", bytearray(b"z" * 70_001), b"end"]
    expected = b"".join(parts)
    got = bytearray()

    def read() -> None:
        while len(got) < len(expected):
            chunk = b.recv(4096)
            if not chunk:
                return
            got.extend(chunk)

    calls = 0
    real_sendmsg = a.sendmsg

    class Counting:
        def sendmsg(self, buffers: Any) -> int:
            nonlocal calls
            calls += 1
            return real_sendmsg(buffers)

        def __getattr__(self, name: str) -> Any:
            return getattr(a, name)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    a.settimeout(30)
    try:
        send_parts(Counting(), parts)  # type: ignore[arg-type]
        reader.join(30)
    finally:
        a.close()
        b.close()
    assert bytes(got) == expected
    assert calls > 10, f"sendmsg took everything in {calls} calls: the test did not make partial sends"
