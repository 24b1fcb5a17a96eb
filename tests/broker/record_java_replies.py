"""Java Luxun's exact replies: the request cases, and the script that records them.

Every case is a list of raw request frames sent in order on one new connection to a
broker started on a fresh data directory (with an empty topic ``empty`` in it, the
deleteTopic password ``plain:luxun`` and broker id 1, as Java Luxun's own
``server.properties``). A reply is read after each frame except ``asyncProduce``
(oneway); a connection closed instead of a reply is recorded as ``null``.

Record (needs the Java Luxun 0.6.2 build, see ``../shared/peers/luxun-java/README.md``)::

    LUXUN_JAVA_PEER=.peers/luxun-java python -m tests.broker.record_java_replies

It starts the Java broker (``com.leansoft.luxun.Luxun``) on a free loopback port,
sends every case and writes ``tests/broker/fixtures/java_replies.json``: per case the
SHA-256 of each frame sent and each reply in hex. ``test_java_replies.py`` replays
the same frames against our broker and compares (no Java needed there).

Topics are named after their case, so cases do not see each other's data and the
order they run in does not matter.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from thriftpy2.protocol.cybin import TCyBinaryProtocol
from thriftpy2.thrift import TMessageType
from thriftpy2.transport.memory import TCyMemoryBuffer

from idl import QueueService
from idl import luxun_thrift as T

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "java_replies.json"
#: The password of Java Luxun's conf/server.properties (``password=plain:luxun``).
PASSWORD = "luxun"
BROKER_ID = 1
#: A topic directory created (empty) before the broker starts.
EMPTY_TOPIC = "empty"
#: Both brokers' default max.message.size.
MAX_MESSAGE_SIZE = 1024 * 1024
REPLY_TIMEOUT_S = 10.0

CALL, ONEWAY = TMessageType.CALL, TMessageType.ONEWAY


# -- frames ----------------------------------------------------------------------------------
def _framed(message: bytes) -> bytes:
    return struct.pack(">i", len(message)) + message


def call(api: str, request: Any = None, seqid: int = 1, kind: int = CALL) -> bytes:
    """A framed call written by thriftpy2, as any generated client writes it; an
    argument of None leaves the argument struct out (an empty args struct)."""
    proto = TCyBinaryProtocol(TCyMemoryBuffer())
    proto.write_message_begin(api, kind, seqid)
    args = getattr(QueueService, api + "_args")()
    if request is not None:
        setattr(args, next(iter(args.thrift_spec.values()))[1], request)
    args.write(proto)
    proto.write_message_end()
    return _framed(bytes(proto.trans.getvalue()))


def raw_call(api: bytes, body: bytes, seqid: int = 1, *, strict: bool = True, kind: int = CALL) -> bytes:
    """A framed call written by hand: ``body`` is the args struct (fields and STOP)."""
    name = struct.pack(">i", len(api)) + api
    if strict:
        message = struct.pack(">i", -2147418112 | kind) + name + struct.pack(">i", seqid)
    else:  # old style: name, type byte, seqid
        message = name + bytes([kind]) + struct.pack(">i", seqid)
    return _framed(message + body)


def _string(fid: int, value: bytes) -> bytes:
    return struct.pack(">bhi", 11, fid, len(value)) + value


def _i32(fid: int, value: int) -> bytes:
    return struct.pack(">bhi", 8, fid, value)


def _i64(fid: int, value: int) -> bytes:
    return struct.pack(">bhq", 10, fid, value)


def _args(*fields: bytes) -> bytes:
    """args { 1: struct { fields } }"""
    return b"\x0c\x00\x01" + b"".join(fields) + b"\x00\x00"


def produce(topic: str, item: bytes, seqid: int = 1) -> bytes:
    return call("produce", T.ProduceRequest(item=item, topic=topic), seqid)


def async_produce(topic: str, item: bytes, seqid: int = 1, kind: int = ONEWAY) -> bytes:
    return call("asyncProduce", T.ProduceRequest(item=item, topic=topic), seqid, kind)


def consume(topic: str, *, group: str | None = None, start: int | None = None, fetch: int | None = None,
            seqid: int = 1, **extra: Any) -> bytes:  # fmt: skip
    request = T.ConsumeRequest(topic=topic, fanoutId=group, startIndex=start, maxFetchSize=fetch, **extra)
    return call("consume", request, seqid)


def find(topic: str, timestamp: int, seqid: int = 1) -> bytes:
    return call("findClosestIndexByTime", T.FindClosestIndexByTimeRequest(timestamp=timestamp, topic=topic), seqid)


def delete(topic: str, password: str, seqid: int = 1) -> bytes:
    return call("deleteTopic", T.DeleteTopicRequest(topic=topic, password=password), seqid)


def size(topic: str, group: str | None = None, seqid: int = 1) -> bytes:
    return call("getSize", T.GetSizeRequest(topic=topic, fanoutId=group), seqid)


def _fill(topic: str, items: list[bytes]) -> list[bytes]:
    return [produce(topic, item, seqid=100 + i) for i, item in enumerate(items)]


def _numbered(n: int) -> list[bytes]:
    return [b"%d" % i for i in range(n)]


INVALID_NAMES = {"empty": "", "slash": "a/b", "dotdot": "..", "too long": "x" * 256, "nul": "bad\x00name",
                 "private use": "\ue000priv"}  # fmt: skip


def _cases() -> dict[str, list[bytes]]:
    cases: dict[str, list[bytes]] = {
        # produce / asyncProduce
        "produce": [produce("p", b"a", 1), produce("p", b"", 2), produce("p", b"\x00\xff" * 50, -7)],
        "produce old-style header": [
            raw_call(b"produce", _args(_string(1, b"item"), _string(2, b"p-old")), 5, strict=False),
            size("p-old", seqid=6),
        ],
        "produce fields in reverse order": [
            raw_call(b"produce", _args(_string(2, b"p-rev"), _string(1, b"item")), 3),
        ],
        "produce oversized item": [
            produce("p-big", b"x" * (MAX_MESSAGE_SIZE + 1), 1),
            size("p-big", seqid=2),
            produce("p-big", b"x" * MAX_MESSAGE_SIZE, 3),
        ],
        "asyncProduce then getSize": [
            *(async_produce("ap", b"%d" % i, seqid=i) for i in range(3)),
            size("ap", seqid=9),
            consume("ap", start=0, fetch=100, seqid=10),
        ],
        "asyncProduce sent as CALL": [async_produce("ap-call", b"x", 4, kind=CALL), size("ap-call", seqid=5)],
        "asyncProduce oversized item": [
            async_produce("ap-big", b"x" * (MAX_MESSAGE_SIZE + 1)),
            async_produce("ap-big", b"ok"),
            size("ap-big", seqid=2),
        ],
        # consume by group
        "consume by group": [
            *_fill("cg", [b"item-%d" % i for i in range(4)]),  # 6 bytes each
            consume("cg", group="g", fetch=0, seqid=1),
            consume("cg", group="g", fetch=13, seqid=2),
            consume("cg", group="g", fetch=-1, seqid=3),
            consume("cg", group="g", fetch=100, seqid=4),
            consume("cg", group="g", fetch=100, seqid=5),
            consume("cg", group="g", seqid=6),
            consume("cg", group="other", fetch=1 << 20, seqid=7),
        ],
        "consume by group, first item over maxFetchSize": [
            *_fill("cg-big", [b"x" * 500, b"y"]),
            consume("cg-big", group="g", fetch=100, seqid=1),
        ],
        "consume missing topic": [
            consume("nope", group="g", fetch=10, seqid=1),
            consume("nope", start=0, fetch=10, seqid=2),
            consume("nope", seqid=3),
        ],
        "consume empty topic": [
            consume(EMPTY_TOPIC, group="g", fetch=10, seqid=1),
            consume(EMPTY_TOPIC, start=0, fetch=10, seqid=2),
        ],
        "consume invalid fanout id": [
            *_fill("cf", [b"a"]),
            consume("cf", group="../g", fetch=10, seqid=1),
            consume("cf", group="a/b", fetch=0, seqid=2),
            consume("cf", group="x" * 256, fetch=10, seqid=3),
            consume("cf", group="g", fetch=10, seqid=4),
            consume(EMPTY_TOPIC, group="../g", fetch=10, seqid=5),
            consume("nope", group="../g", fetch=10, seqid=6),
        ],
        # consume by index
        "consume by index": [
            *_fill("ci", _numbered(6)),
            consume("ci", start=2, fetch=3, seqid=1),
            consume("ci", start=5, seqid=2),
            consume("ci", start=0, fetch=-5, seqid=3),
            consume("ci", start=0, fetch=1 << 20, seqid=4),
            consume("ci", start=6, fetch=100, seqid=5),
            consume("ci", start=6, seqid=6),
        ],
        "consume by index, first item over maxFetchSize": [
            *_fill("ci-big", [b"x" * 500, b"y"]),
            consume("ci-big", start=0, fetch=100, seqid=1),
        ],
        "consume index past head": [
            *_fill("co", _numbered(3)),
            consume("co", start=4, fetch=100, seqid=1),
            consume("co", start=4, fetch=0, seqid=2),
            consume("co", start=1000, fetch=100, seqid=3),
        ],
        "consume index before tail": [
            *_fill("cb", _numbered(3)),
            consume("cb", start=-1, fetch=100, seqid=1),
            consume("cb", start=-1, seqid=2),
        ],
        "consume with maxWaitMs, items there": [
            *_fill("cw", _numbered(2)),
            consume("cw", group="g", fetch=100, maxWaitMs=5000, seqid=1),
        ],
        "consume with maxWaitMs, nothing there": [
            *_fill("cw0", _numbered(1)),
            consume("cw0", start=1, fetch=100, maxWaitMs=50, seqid=1),
        ],
        "consume with timestamps": [
            *_fill("ct", _numbered(2)),
            consume("ct", start=0, fetch=100, withTimestamps=True, seqid=1),
            consume("ct", start=2, fetch=100, withTimestamps=True, seqid=2),
        ],
        "consume topic sent as an i32": [
            *_fill("t", [b"x"]),
            raw_call(b"consume", _args(_i32(1, 7)), 2),
            consume("t", start=0, fetch=100, seqid=3),
        ],
        # findClosestIndexByTime
        "findClosestIndexByTime": [
            *_fill("f", _numbered(3)),
            find("f", T.EARLIEST_TIME, 1),
            find("f", T.LATEST_TIME, 2),
            find("f", 0, 3),
            find("f", 2**62, 4),
        ],
        "findClosestIndexByTime missing topic": [find("nope", T.EARLIEST_TIME, 1), find("nope", 123, 2)],
        "findClosestIndexByTime empty topic": [
            find(EMPTY_TOPIC, T.EARLIEST_TIME, 1),
            find(EMPTY_TOPIC, T.LATEST_TIME, 2),
            find(EMPTY_TOPIC, 123, 3),
        ],
        # deleteTopic
        "deleteTopic": [
            *_fill("d", [b"x"]),
            delete("d", "guess", 1),
            size("d", seqid=2),
            delete("d", PASSWORD, 3),
            consume("d", group="g", fetch=10, seqid=4),
            delete("d", PASSWORD, 5),
            produce("d", b"again", 6),
        ],
        "deleteTopic missing topic": [delete("never", PASSWORD, 1), delete("never", "guess", 2)],
        # getSize
        "getSize": [
            *_fill("s", _numbered(4)),
            consume("s", group="reader", fetch=2, seqid=1),
            size("s", seqid=2),
            size("s", "reader", 3),
            size("s", "ghost", 4),
            size("s", "ghost", 5),
            size("nope", seqid=6),
            size(EMPTY_TOPIC, seqid=7),
        ],
        "getSize invalid fanout id": [*_fill("gs", [b"a"]), size("gs", "../g", 1), size("gs", "a/b", 2)],
        # required fields missing, argument structs missing, unknown methods
        "ProduceRequest without item": [
            raw_call(b"produce", _args(_string(2, b"r")), 1),
            produce("r", b"after", 2),
        ],
        "ProduceRequest without topic": [raw_call(b"produce", _args(_string(1, b"item")), 1), size("r2", seqid=2)],
        "asyncProduce ProduceRequest without item": [
            raw_call(b"asyncProduce", _args(_string(2, b"r3")), 1, kind=ONEWAY),
            size("r3", seqid=2),
        ],
        "ConsumeRequest without topic": [
            raw_call(b"consume", _args(_string(2, b"g"), _i32(4, 100)), 1),
            raw_call(b"consume", _args(), 2),
        ],
        "FindClosestIndexByTimeRequest without a field": [
            raw_call(b"findClosestIndexByTime", _args(_string(2, b"f")), 1),
            raw_call(b"findClosestIndexByTime", _args(_i64(1, -1)), 2),
        ],
        "DeleteTopicRequest without a field": [
            raw_call(b"deleteTopic", _args(_string(1, b"d2")), 1),
            raw_call(b"deleteTopic", _args(_string(2, PASSWORD.encode())), 2),
        ],
        "GetSizeRequest without topic": [raw_call(b"getSize", _args(_string(3, b"g")), 1)],
        "no argument struct": [
            call("produce", None, 1),
            call("consume", None, 2),
            call("findClosestIndexByTime", None, 3),
            call("deleteTopic", None, 4),
            call("getSize", None, 5),
            call("asyncProduce", None, 6, ONEWAY),
            size("nope", seqid=7),
        ],
        "unknown method": [raw_call(b"noSuchCall", b"\x00", 1), produce("u", b"after", 2)],
        "listTopics (our extension)": [*_fill("lt", [b"a"]), call("listTopics", T.ListTopicsRequest(), 1)],
    }
    for label, name in INVALID_NAMES.items():
        cases[f"invalid topic name ({label})"] = [
            produce(name, b"x", 1),
            async_produce(name, b"x", 2),
            consume(name, group="g", fetch=10, seqid=3),
            consume(name, start=0, fetch=10, seqid=4),
            find(name, T.EARLIEST_TIME, 5),
            size(name, seqid=6),
            delete(name, PASSWORD, 7),
        ]
    return cases


CASES = _cases()


def frame_digest(frame: bytes) -> str:
    return hashlib.sha256(frame).hexdigest()


# -- talking to a broker ------------------------------------------------------------------------
def expects_reply(frame: bytes) -> bool:
    """False for asyncProduce (oneway whatever its message type says)."""
    message = frame[4:]
    (first,) = struct.unpack_from(">i", message)
    start = 4 if first < 0 else 0
    (length,) = struct.unpack_from(">i", message, start)
    return message[start + 4 : start + 4 + length] != b"asyncProduce"


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data.extend(chunk)
    return bytes(data)


def exchange(port: int, frames: list[bytes], timeout_s: float = REPLY_TIMEOUT_S) -> list[bytes | None]:
    """Send ``frames`` in order on one new connection; one reply (the message,
    without its frame length) per frame that expects one, None if the broker closed
    the connection instead (and nothing is sent after that)."""
    replies: list[bytes | None] = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        for frame in frames:
            sock.sendall(frame)
            if not expects_reply(frame):
                continue
            header = _recv_exactly(sock, 4)
            body = None if header is None else _recv_exactly(sock, struct.unpack(">i", header)[0])
            replies.append(body)
            if body is None:
                break
    return replies


def run_cases(port: int, cases: dict[str, list[bytes]] = CASES) -> dict[str, list[bytes | None]]:
    return {name: exchange(port, frames) for name, frames in cases.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, alive: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{what} exited before listening on 127.0.0.1:{port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s:.0f} s")


def prepare_data_dir(path: Path) -> None:
    path.mkdir(parents=True)
    (path / EMPTY_TOPIC).mkdir()


def server_properties(data_dir: Path, port: int) -> str:
    """The settings both brokers get (Java Luxun's conf/server.properties values)."""
    return (
        f"brokerid={BROKER_ID}\nport={port}\nlog.dir={data_dir}\nlog.flush.count=-1\n"
        f"log.default.flush.interval.ms=-1\nlog.default.flush.scheduler.interval.ms=-1\n"
        f"password=plain:{PASSWORD}\n"
    )


# -- the Java broker --------------------------------------------------------------------------
def java_peer() -> Path:
    return Path(os.environ.get("LUXUN_JAVA_PEER") or ROOT / ".peers" / "luxun-java")


def java_build_note(peer: Path) -> str:
    version = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr.splitlines()
    jars = sorted(Path(p).name for p in (peer / "build" / "classpath.txt").read_text().strip().split(":"))
    thrift = sorted(p.name for p in Path("/usr/share/java").glob("thrift-*.jar"))
    return (
        f"Java Luxun 0.6.2 + bigqueue 0.7.2 (../shared/peers/luxun-java build: thrift 0.16 API patch), "
        f"{version[0] if version else 'java ?'}; classpath {', '.join(jars)}; {', '.join(thrift)}"
    )


def record(peer: Path, out: Path) -> dict[str, Any]:
    classpath = (peer / "build" / "classpath.txt").read_text().strip()
    with tempfile.TemporaryDirectory(prefix="luxun-java-replies-") as tmp:
        data = Path(tmp) / "data"
        prepare_data_dir(data)
        port = free_port()
        props = Path(tmp) / "server.properties"
        props.write_text(server_properties(data, port))
        log4j = Path(tmp) / "log4j.properties"
        log4j.write_text(
            "log4j.rootLogger=INFO,file\nlog4j.appender.file=org.apache.log4j.FileAppender\n"
            f"log4j.appender.file.File={tmp}/luxun.log\nlog4j.appender.file.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.file.layout.ConversionPattern=%d %-5p [%C{1}] %m%n\n"
        )
        cmd = ["java", "-Dluxun.bind.host=127.0.0.1", f"-Dlog4j.configuration=file:{log4j}",
               "-cp", classpath, "com.leansoft.luxun.Luxun", str(props)]  # fmt: skip
        with open(Path(tmp) / "stdout.log", "wb") as stdout:
            proc = subprocess.Popen(cmd, cwd=tmp, stdout=stdout, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port, lambda: proc.poll() is None, "the Java broker")
            replies = run_cases(port)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    fixture = {
        "note": (
            "Replies of the Java Luxun broker to the cases of tests/broker/record_java_replies.py "
            "(recorded by it; replayed against ours by test_java_replies.py). Per case: the SHA-256 of "
            "each request frame, and each reply message (without its frame length) in hex, null when "
            "the connection was closed instead."
        ),
        "java": java_build_note(peer),
        "recorded": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cases": {
            name: {
                "frames": [frame_digest(f) for f in CASES[name]],
                "replies": [None if r is None else r.hex() for r in replies[name]],
            }
            for name in CASES
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    return fixture


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=FIXTURE, help=f"where the fixture goes (default {FIXTURE})")
    args = parser.parse_args(argv)
    peer = java_peer()
    if not (peer / "build" / "classpath.txt").exists():
        print(f"record_java_replies: no Java Luxun build at {peer} (set LUXUN_JAVA_PEER)", file=sys.stderr)
        return 2
    fixture = record(peer, args.out)
    print(f"recorded {len(fixture['cases'])} cases into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
