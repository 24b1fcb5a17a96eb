"""The compiled loop (luxun._netloop, through luxun.thrift.server) against the Python loop
(``LUXUN_PURE_PYTHON=1``): the same calls, sent as raw frames to a broker of each kind, get
the same reply bytes, whether the compiled loop answers them (a canonical produce, a
one-item consume served at once) or leaves them to the Python loop (errors, other
layouts, other calls, several frames in one read, part of one, long polls)."""

from __future__ import annotations

import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from thriftpy2.protocol.cybin import TCyBinaryProtocol
from thriftpy2.thrift import TMessageType
from thriftpy2.transport.memory import TCyMemoryBuffer

from idl import QueueService
from idl import luxun_thrift as T
from luxun.thrift import server as thrift_server

from .test_produce_path import call_frame, odd_layout_frame

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.environ.get("LUXUN_PURE_PYTHON", "") not in ("", "0"), reason="LUXUN_PURE_PYTHON is set"),
]


def test_the_compiled_loop_is_built() -> None:
    """The README's set-up (scripts/bootstrap.sh) installs a C compiler and builds it."""
    assert thrift_server.COMPILED_LOOP, "luxun._netloop is not built: scripts/bootstrap.sh builds it (needs cc)"


LIMIT = 1000  # max.message.size of the brokers under test


def frame(api: str, seqid: int, **args: Any) -> bytes:
    """One framed call of ``api`` with its ``<api>_args`` fields, as thriftpy2 writes it."""
    proto = TCyBinaryProtocol(TCyMemoryBuffer())
    oneway = api == "asyncProduce"
    proto.write_message_begin(api, TMessageType.ONEWAY if oneway else TMessageType.CALL, seqid)
    getattr(QueueService, api + "_args")(**args).write(proto)
    proto.write_message_end()
    body = bytes(proto.trans.getvalue())
    return struct.pack(">i", len(body)) + body


def consume(seqid: int, **request: Any) -> bytes:
    return frame("consume", seqid, consumeRequest=T.ConsumeRequest(**request))


def read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
    body = sock.recv(size, socket.MSG_WAITALL)
    assert len(body) == size
    return body


def decode(body: bytes) -> tuple[str, int, Any]:
    proto = TCyBinaryProtocol(TCyMemoryBuffer(body))
    name, _, seqid = proto.read_message_begin()
    result = getattr(QueueService, name + "_result")()
    result.read(proto)
    return name, seqid, result.success


def counters(broker: Any, name: str) -> dict[str, int]:
    """Every sample of metric ``name``, by its labels."""
    found = dict(re.findall(rf"^{name}(\{{[^}}]*\}}) (\d+)$", broker.metrics_page(), re.M))
    assert found, name
    return {labels: int(value) for labels, value in found.items()}


# Each step: what is sent (one or more frames, sent whole or in parts), and how many replies
# come back. Items are numbered so that every reply names what it carries.
ITEM = bytes(range(100))


def script() -> list[tuple[list[bytes], int]]:
    """The calls, in order; each entry's parts are sent with a pause between them."""
    steps: list[tuple[list[bytes], int]] = []
    for i in range(3):  # canonical produces: compiled
        steps.append(([call_frame("produce", "t", ITEM + bytes([i]), seqid=10 + i)], 1))
    steps += [
        ([call_frame("produce", "a/b", ITEM, seqid=20)], 1),  # a bad name, an error Result: the reply from Python
        ([call_frame("produce", "t", bytes(LIMIT + 1), seqid=21)], 1),  # too large: an error Result
        ([odd_layout_frame("t", b"odd", extra_field=True)], 0),  # another layout (oneway): the generic path
        ([consume(30, topic="t", startIndex=1)], 1),  # one item by index: compiled
        ([consume(31, topic="t", fanoutId="g")], 1),  # by group: compiled
        ([consume(32, topic="t", fanoutId="g", maxFetchSize=0)], 1),
        ([consume(33, topic="t", startIndex=99)], 1),  # out of range: left to Python
        ([consume(34, topic="nope", startIndex=0)], 1),  # no such topic: left to Python
        ([consume(35, topic="t", startIndex=0, withTimestamps=True)], 1),  # field 6: Python
        ([consume(36, topic="t", startIndex=0, maxFetchSize=1 << 20)], 1),  # a fetch: Python
        ([call_frame("produce", "t", b"p1", seqid=40) + call_frame("produce", "t", b"p2", seqid=41)], 2),  # one read
        ([(f := call_frame("produce", "t", b"split", seqid=42))[:10], f[10:]], 1),  # a frame in two reads
        ([(f := consume(43, topic="t", startIndex=2))[:5], f[5:]], 1),
        ([frame("getSize", 44, getSizeRequest=T.GetSizeRequest(topic="t"))], 1),  # another call: Python
    ]
    steps.append(([call_frame("asyncProduce", "t", b"a%d" % i) for i in range(5)], 0))
    steps.append(([consume(50, topic="t", startIndex=9)], 1))  # the last async item, after the batch
    steps.append(([consume(51, topic="t", fanoutId="g2", maxWaitMs=50)], 1))  # a new group at the head: long poll
    steps.append(([call_frame("produce", "t", b"\xff" * 7, seqid=52)], 1))
    return steps


def run(broker: Any) -> list[bytes]:
    """Every reply body of the script, in order, from one connection to ``broker``."""
    replies: list[bytes] = []
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        for parts, n in script():
            for k, part in enumerate(parts):
                if k:
                    time.sleep(0.05)
                sock.sendall(part)
            replies += [read_frame(sock) for _ in range(n)]
    return replies


@pytest.fixture
def both_brokers(broker_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Any]:
    """``start(loop)``: a broker with the compiled loop in its shared thread ("compiled"), in
    each connection's thread ("per-connection"), or without it ("python"); a data dir each."""
    config = tmp_path / "server.properties"
    config.write_text(f"max.message.size={LIMIT}\n")

    def start(loop: str, poll_us: int = 200) -> Any:
        config = tmp_path / f"{loop}-{poll_us}.properties"
        config.write_text(f"max.message.size={LIMIT}\nbusy.poll.us={poll_us}\n")
        monkeypatch.delenv("LUXUN_PURE_PYTHON", raising=False)
        monkeypatch.delenv("LUXUN_SHARED_LOOP", raising=False)
        if loop == "python":
            monkeypatch.setenv("LUXUN_PURE_PYTHON", "1")
        elif loop == "per-connection":
            monkeypatch.setenv("LUXUN_SHARED_LOOP", "0")
        broker = broker_factory("--config", str(config), data_dir=tmp_path / f"data-{loop}-{poll_us}", metrics=True)
        monkeypatch.delenv("LUXUN_PURE_PYTHON", raising=False)
        monkeypatch.delenv("LUXUN_SHARED_LOOP", raising=False)
        return broker

    return start


@pytest.mark.parametrize("poll_us", [0, 200])
@pytest.mark.parametrize("loop", ["compiled", "per-connection"])
def test_both_loops_answer_every_call_with_the_same_bytes(both_brokers: Any, loop: str, poll_us: int) -> None:
    compiled, python = both_brokers(loop, poll_us), both_brokers("python", poll_us)
    shared = "served by the compiled loop (luxun._netloop), in one shared thread" in compiled.log()
    assert shared == (loop == "compiled")
    assert "served by the compiled loop (luxun._netloop)" in compiled.log()
    assert "served by the Python loop (LUXUN_PURE_PYTHON is set)" in python.log()
    got, expected = run(compiled), run(python)
    assert len(got) == len(expected) == sum(n for _, n in script())
    for k, (a, b) in enumerate(zip(got, expected, strict=True)):
        if k == 10:  # withTimestamps: each broker's own append times, otherwise the same
            (_, _, x), (_, _, y) = decode(a), decode(b)
            assert len(x.timestampList) == len(y.timestampList) == 1
            x.timestampList = y.timestampList = None
            assert x == y
            continue
        assert a == b, f"reply {k}: {decode(a)} != {decode(b)}"
    # What they say (the Python loop's replies are the reference, checked here too).
    replies = [decode(body) for body in got]
    assert [(r[1], r[2].index) for r in replies[:3]] == [(10, 0), (11, 1), (12, 2)]
    assert replies[3][2].result.errorCode == T.ErrorCode.INVALID_TOPIC  # from the Python side of the reply
    assert replies[4][2].result.errorCode == T.ErrorCode.MESSAGE_SIZE_TOO_LARGE
    assert (replies[5][2].itemList, replies[5][2].lastConsumedIndex) == ([ITEM + b"\x01"], 1)
    assert [replies[k][2].itemList for k in (6, 7)] == [[ITEM + b"\x00"], [ITEM + b"\x01"]]  # group g from the tail
    assert replies[8][2].result.errorCode == T.ErrorCode.INDEX_OUT_OF_BOUNDS
    assert replies[9][2].result.errorCode == T.ErrorCode.TOPIC_NOT_EXIST
    assert replies[10][2].timestampList and len(replies[11][2].itemList) == 4  # the fetch: 3 items and "odd"
    assert [r[2].index for r in replies[12:15]] == [4, 5, 6]  # p1, p2, split ("odd" took 3)
    assert replies[15][2].itemList == [ITEM + b"\x02"]
    assert replies[16][2].size == 7
    assert (replies[17][2].itemList, replies[17][2].lastConsumedIndex) == ([b"a2"], 9)  # after the batch
    assert replies[18][2].itemList == [ITEM + b"\x00"]
    assert replies[19][2].index == 12
    # The compiled loop answered the canonical calls itself, some of them without the
    # handler (bigarray._fastpath: produces 11, 12 and 52, consume 32, and consume 50 unless
    # the Python loop read it right behind the asyncProduce batch, after its wait:
    # async.batch.us); the Python loop none.
    in_place = compiled.metric("luxun_compiled_loop_in_place_total")
    assert in_place >= 4
    if shared:  # the shared loop serves only in place: the rest goes to the connection's thread
        assert compiled.metric("luxun_compiled_loop_calls_total") == in_place
    else:  # ... a connection's own compiled loop calls the handler too (produce 10, consumes 30, 31)
        assert compiled.metric("luxun_compiled_loop_calls_total") >= in_place + 3
    assert python.metric("luxun_compiled_loop_calls_total") == 0
    assert python.metric("luxun_compiled_loop_in_place_total") == 0
    # ... and counted them as the handler does: the topic's stats, the calls by method.
    for name in ("luxun_topic_items_in_total", "luxun_topic_bytes_in_total", "luxun_topic_items_out_total",
                 "luxun_topic_bytes_out_total", "luxun_requests_total",
                 "luxun_request_duration_seconds_count"):  # fmt: skip
        assert counters(compiled, name) == counters(python, name), name


def test_a_client_closing_mid_frame_leaves_the_broker_serving(both_brokers: Any) -> None:
    broker = both_brokers("compiled", 0)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(call_frame("produce", "t", b"x", seqid=1))
        assert decode(read_frame(sock))[2].index == 0
        sock.sendall(call_frame("produce", "t", b"y", seqid=2)[:9])  # part of a frame, then gone
    client = broker.client()
    assert client.produce(T.ProduceRequest(item=b"z", topic="t")).index == 1  # y never landed
    assert client.consume(T.ConsumeRequest(topic="t", startIndex=1)).itemList == [b"z"]
    client.close()


def test_a_produce_appended_in_place_wakes_a_long_poll(both_brokers: Any) -> None:
    """The compiled loop's own append wakes consumers waiting on the topic, as the topic
    manager's append does (without that, the waiting consume would answer at its timeout)."""
    broker = both_brokers("compiled", 0)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        for i in range(2):  # the first creates the topic; then the array's fast room is armed
            sock.sendall(call_frame("produce", "w", b"x%d" % i, seqid=i))
            assert decode(read_frame(sock))[2].index == i
        before = broker.metric("luxun_compiled_loop_in_place_total")
        got: list[Any] = []
        waiter = broker.client()

        def wait() -> None:
            started = time.monotonic()
            got.append(waiter.consume(T.ConsumeRequest(topic="w", startIndex=2, maxWaitMs=8_000)))
            got.append(time.monotonic() - started)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.5)  # the consume waits
        sock.sendall(call_frame("produce", "w", b"woken", seqid=9))
        assert decode(read_frame(sock))[2].index == 2
        thread.join(30)
        waiter.close()
    assert broker.metric("luxun_compiled_loop_in_place_total") == before + 1  # appended in place
    assert got, "the waiting consume failed"
    assert got[1] < 4, f"the waiting consume answered after {got[1]:.1f} s: not woken by the append"
    assert got[0].itemList == [b"woken"]


def test_many_connections_share_the_loop(both_brokers: Any) -> None:
    """Several connections calling at once through the shared loop: every reply goes to its
    own caller and says the right thing; a client that goes away while parked leaves the
    others served; the broker stops with connections parked."""
    broker = both_brokers("compiled", 200)
    clients, rounds = 6, 150
    errors: list[BaseException] = []
    produced: dict[int, list[int]] = {}

    def work(k: int) -> None:
        try:
            client = broker.client()
            own: list[int] = []
            for i in range(rounds):
                item = b"%d-%d" % (k, i)
                own.append(client.produce(T.ProduceRequest(item=item, topic=f"own{k}")).index)
                shared = client.produce(T.ProduceRequest(item=item, topic="shared")).index
                got = client.consume(T.ConsumeRequest(topic="shared", startIndex=shared))
                assert got.itemList == [item], (k, i, got)
                back = client.consume(T.ConsumeRequest(topic=f"own{k}", fanoutId="g"))
                assert back.itemList == [item], (k, i, back)
            produced[k] = own
            client.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors[0]
    assert all(produced[k] == list(range(rounds)) for k in range(clients))
    size = broker.client()
    assert size.getSize(T.GetSizeRequest(topic="shared")).size == clients * rounds
    assert broker.metric("luxun_compiled_loop_in_place_total") >= clients * rounds * 3
    # A client that goes away while its connection is parked: the rest goes on.
    gone = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    gone.sendall(call_frame("produce", "shared", b"last", seqid=1))
    assert decode(read_frame(gone))[2].index == clients * rounds
    gone.close()
    assert size.produce(T.ProduceRequest(item=b"after", topic="shared")).index == clients * rounds + 1
    # Stopping with a connection parked (size's) is prompt and clean.
    started = time.monotonic()
    assert broker.stop() == 0
    assert time.monotonic() - started < 10
    size.close()
    assert "Traceback" not in broker.log()
