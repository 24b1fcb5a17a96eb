"""luxun.net: the TCP floor both doors stand on (scatter/gather sends)."""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

import numpy as np
import pytest

from luxun.net import IOV_MAX, send_parts


def _send_and_read(parts: list[Any], *, header: bool = True, sndbuf: int = 8192) -> bytes:
    """What the other end of a socket pair reads while ``send_parts`` sends ``parts``."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    got = bytearray()

    def read() -> None:
        while True:
            chunk = b.recv(65536)
            if not chunk:
                return
            got.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        send_parts(a, parts, header=header)
    finally:
        a.close()
        reader.join(30)
        b.close()
    return bytes(got)


def test_send_parts_survives_partial_writes() -> None:
    """A reply of several buffers, much bigger than the socket buffer, arrives whole."""
    parts: list[Any] = [
        b"head",
        np.arange(3_000_000, dtype=np.int64).view(np.uint8).reshape(-1, 8),
        memoryview(b"x" * 100_001)[1:],
        b"",
        b"tail",
    ]
    want = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    assert _send_and_read(parts) == len(want).to_bytes(4, "big") + want


@pytest.mark.parametrize("header", [True, False])
def test_send_parts_takes_more_buffers_than_one_sendmsg_may(header: bool) -> None:
    """A reply of more buffers than IOV_MAX (a Kafka Fetch of 600 partitions with data has
    over 1,200) arrives whole: the kernel refuses such a sendmsg with EMSGSIZE."""
    parts: list[Any] = []
    for i in range(3 * IOV_MAX + 7):
        parts.append(i.to_bytes(4, "big") * 25)  # 100 bytes each, 300 KB in all
        if i % 3 == 0:
            parts.append(bytearray(b"b" * (i % 50)))
    want = b"".join(bytes(p) for p in parts)
    prefix = len(want).to_bytes(4, "big") if header else b""
    assert _send_and_read(parts, header=header) == prefix + want
    assert _send_and_read(parts, header=header, sndbuf=1 << 20) == prefix + want


def test_a_send_that_fails_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A send that fails for another reason than the peer going away is logged with the
    reply's size before it is raised (the connection is then closed)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        with caplog.at_level(logging.WARNING, logger="luxun.net"), pytest.raises(OSError):
            send_parts(a, [b"x" * 300_000, b"y" * 300_000])  # too big for one datagram
    finally:
        a.close()
        b.close()
    assert any("sending a reply of 600004 bytes in 3 buffers" in r.getMessage() for r in caplog.records)
