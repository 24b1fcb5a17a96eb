"""SIGTERM while clients send: what the kernel already took from a sender is delivered or
counted, never dropped unseen (sent = delivered + discards (+ unclean bytes on a stream))."""

from __future__ import annotations

import errno
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from clients.agent.wire import encode

from .conftest import AgentProcess, address, read_topic

pytestmark = pytest.mark.timeout(120)

Agents = Callable[..., AgentProcess]

#: What a sender sees once the agent refused or closed its input (EPIPE: after its SHUT_RD).
_GONE = (errno.EPIPE, errno.ECONNREFUSED, errno.ENOENT, errno.ECONNRESET)
_MAX_MESSAGES = 2_000_000
_MAX_SECONDS = 10.0


def _message(topic: bytes, i: int) -> bytes:
    return encode(topic, b"%08d" % i)  # every message the same size


def _messages(topic: bytes, first: int, n: int) -> bytes:
    """Messages first .. first + n - 1, written out faster than the agent reads them (a
    stream test must fill the connection's queue)."""
    head = _message(topic, 0)[:-8]
    return b"".join([head + b"%08d" % i for i in range(first, first + n)])


class _Sender(threading.Thread):
    """Sends messages 0, 1, 2, ... until the agent's input refuses them; ``sent``: how many
    the kernel took completely, ``extra``: bytes of one more message it took in part."""

    def __init__(self, send: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self._send = send
        self.sent = 0
        self.extra = 0
        self.error: int | None = None
        self.full = 0  # times the kernel's queue was found full (EAGAIN)

    def run(self) -> None:
        try:
            self._send()
        except OSError as exc:
            if exc.errno not in _GONE:
                raise
            self.error = exc.errno


def _stop_while_sending(a: AgentProcess, sender: _Sender) -> dict[str, Any]:
    sender.start()
    time.sleep(0.3)
    end = time.monotonic() + 5
    while not sender.full and time.monotonic() < end:  # stop while the kernel's queue is full
        time.sleep(0.01)
    assert sender.is_alive() and sender.sent > 0 and sender.full, "the sender ended or never filled the queue"
    assert a.stop() == 0
    sender.join(_MAX_SECONDS + 5)
    assert not sender.is_alive()
    assert sender.error is not None, f"the sender was never refused ({sender.sent} sent)"
    return a.summary()


def test_sigterm_delivers_the_datagrams_the_kernel_had_queued(brokers: Any, agents: Agents) -> None:
    """The reader used to leave at once, so the datagrams waiting in the socket (up to
    net.unix.max_dgram_qlen + 1, sent successfully) were lost with it, counted nowhere."""
    (b,) = brokers(1)
    a = agents([address(b)])

    def send() -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.setblocking(False)
        end = time.monotonic() + _MAX_SECONDS
        try:
            while sender.sent < _MAX_MESSAGES and time.monotonic() < end:
                try:
                    s.sendto(_message(b"dgdrain", sender.sent), a.dgram)
                except BlockingIOError:  # the queue is full: keep it so (no sleep: outrun the reader)
                    sender.full += 1
                    time.sleep(0)
                    continue
                sender.sent += 1
        finally:
            s.close()

    sender = _Sender(send)
    summary = _stop_while_sending(a, sender)
    delivered, discarded = summary["delivered"], sum(summary["discarded"].values())
    assert summary["received"]["unix_dgram"] == sender.sent, (sender.sent, summary)
    assert delivered + discarded == sender.sent, (sender.sent, summary)
    values = read_topic(b, "dgdrain")
    assert len(values) == delivered and set(values) <= {b"%08d" % i for i in range(sender.sent)}


def test_sigterm_delivers_what_a_unix_stream_connection_had_queued(brokers: Any, agents: Agents) -> None:
    """The connection reader used to leave after the chunk it was reading, and the stop shut
    the connection down: the bytes in its receive queue (written successfully) were lost."""
    (b,) = brokers(1)
    a = agents([address(b)])
    size = len(_message(b"stdrain", 0))
    per_block = 1000

    def send() -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(a.stream)
        s.setblocking(False)
        end = time.monotonic() + _MAX_SECONDS
        written = 0  # bytes the kernel took
        try:
            while written // size < _MAX_MESSAGES and time.monotonic() < end:
                first = written // size
                block = memoryview(_messages(b"stdrain", first, per_block))
                pos = written - first * size
                while pos < len(block):
                    try:
                        n = s.send(block[pos:])  # raises once refused; then nothing of it was taken
                    except BlockingIOError:  # the connection's queue is full
                        sender.full += 1
                        select.select([], [s], [], 0.05)
                        continue
                    pos += n
                    written += n
                    sender.sent, sender.extra = divmod(written, size)
        finally:
            s.close()

    sender = _Sender(send)
    summary = _stop_while_sending(a, sender)
    delivered, discarded = summary["delivered"], sum(summary["discarded"].values())
    assert summary["received"]["unix_stream"] == sender.sent, (sender.sent, sender.extra, summary)
    assert delivered + discarded == sender.sent, (sender.sent, summary)
    assert summary["unclean_disconnect_bytes"]["unix_stream"] == sender.extra, (sender.extra, summary)
    values = read_topic(b, "stdrain")
    assert len(values) == delivered and set(values) <= {b"%08d" % i for i in range(sender.sent)}
    assert sender.error in (errno.EPIPE, errno.ECONNRESET)
