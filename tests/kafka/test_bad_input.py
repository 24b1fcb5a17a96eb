"""Bad input on the Kafka port: each closes only its own connection (or, for a corrupt
batch, is answered CORRUPT_MESSAGE and nothing is stored); the broker keeps serving
Kafka and Thrift clients, and its memory stays within the input budget."""

from __future__ import annotations

import concurrent.futures
import socket
import struct
import threading
import time

import pytest

from idl import luxun_thrift as T
from tests._broker import BrokerProcess

from ._kafka import (
    RawClient,
    metadata_request,
    produce_partition_response,
    produce_request,
    read_partition,
    record_batch,
)

pytestmark = pytest.mark.timeout(120)

CORRUPT_MESSAGE = 2
MESSAGE_TOO_LARGE = 10
MiB = 1 << 20


def _header(api_key: int, version: int, client_id: bytes = b"bad") -> bytes:
    return struct.pack(">hhih", api_key, version, 1, len(client_id)) + client_id


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


BAD_INPUTS = {
    "HTTP request": b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",  # size 0x47455420: 1.1 GiB
    "garbage frame": _frame(b"\xff" * 16),  # API -1 v-1
    "frame announcing 2 GiB": struct.pack(">i", 2**31 - 1) + b"x" * 1000,
    "negative frame size": struct.pack(">i", -5) + b"x" * 10,
    "zero frame size": struct.pack(">i", 0),
    "truncated frame": struct.pack(">i", 500) + _header(18, 3)[:6],
    "frame shorter than a header": _frame(b"\x00\x12\x00"),
    "client id past the frame": _frame(struct.pack(">hhih", 18, 2, 1, 1000) + b"abc"),
    "negative client id length": _frame(struct.pack(">hhih", 18, 2, 1, -7)),
    "unknown API": _frame(_header(9999, 0)),
    "Metadata body cut short": _frame(_header(3, 4) + b"\x00\x00\x00\x05\x00\x02ab"),
    "Produce with a 2^31-1 array": _frame(_header(0, 7) + b"\xff\xff\x00\x01\x00\x00\x27\x10\x7f\xff\xff\xff"),
}


def _send_raw(port: int, data: bytes) -> bytes:
    """Send bytes on a fresh connection; what comes back before the broker closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass  # closed with unread input (the rest of what we sent): a reset, not a FIN
        return b"".join(chunks)


def _kafka_produce(raw: RawClient, topic: str, value: bytes) -> int:
    part = produce_partition_response(raw.call(produce_request(topic, 0, record_batch([value]))))
    assert part.error_code == 0, part
    return int(part.base_offset)


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_closes_only_that_connection(broker: BrokerProcess, name: str) -> None:
    thrift = broker.client()
    with RawClient(broker.kafka_port) as open_before:
        assert open_before.call(metadata_request("safe")).topics[0].error_code == 0
        assert _kafka_produce(open_before, "safe", b"before") == 0
        assert _send_raw(broker.kafka_port, BAD_INPUTS[name]) == b"", "nothing answered: the connection was closed"
        # The connection opened before still works, and so does a new one.
        assert _kafka_produce(open_before, "safe", b"after") == 1
    with RawClient(broker.kafka_port) as fresh:
        assert _kafka_produce(fresh, "safe", b"fresh") == 2
    assert thrift.produce(T.ProduceRequest(item=b"thrift", topic="thrift-safe")).result.resultCode == 0
    assert thrift.getSize(T.GetSizeRequest(topic="safe")).size == 3
    thrift.close()
    assert broker.proc is not None and broker.proc.poll() is None
    assert "Traceback" not in broker.log()


def test_a_corrupt_crc_is_answered_corrupt_message_and_nothing_stored(broker: BrokerProcess) -> None:
    with RawClient(broker.kafka_port) as raw:
        raw.call(metadata_request("crc"))
        good = record_batch([b"first", b"second"])
        bad = bytearray(good)
        bad[-3] ^= 0x40  # a byte of the last record's value: the CRC-32C no longer matches
        part = produce_partition_response(raw.call(produce_request("crc", 0, bytes(bad))))
        assert part.error_code == CORRUPT_MESSAGE, part
        # The connection stays usable; the good batch goes in at offset 0.
        part = produce_partition_response(raw.call(produce_request("crc", 0, good)))
        assert (part.error_code, part.base_offset) == (0, 0)
    got = read_partition(broker.bootstrap, "crc", 0, 2)
    assert [(m.offset(), m.value()) for m in got] == [(0, b"first"), (1, b"second")]


def _rss_kib(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


def test_100_connections_announcing_50_mib_stay_within_the_input_budget(broker: BrokerProcess) -> None:
    """Each of 100 connections announces a 50 MiB request, sends 10 MiB of it and holds
    it: 1000 MiB if the broker kept it all, 4 x its 256 MiB input budget. The broker
    reads only what the budget allows, closes connections that wait for budget longer
    than 10 s, and keeps serving. The bound is the Thrift port's (tests/broker/
    test_bounded.py): the budget plus 192 MiB for glibc's arenas, which keep up to 16 MiB
    each of freed memory."""
    from confluent_kafka import Producer

    assert broker.proc is not None
    pid = broker.proc.pid
    with RawClient(broker.kafka_port) as raw:
        raw.call(metadata_request("budget"))
        _kafka_produce(raw, "budget", b"warm")
    before = _rss_kib(pid)
    chunk = b"\0" * MiB
    header = struct.pack(">i", 50 * MiB) + _header(0, 7)
    release = threading.Event()

    def hold(_: int) -> bool:
        """True if all 10 MiB went out, False if the broker closed the connection."""
        with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=30) as s:
            try:
                s.sendall(header)
                for _ in range(10):
                    s.sendall(chunk)
            except OSError:
                return False
            release.wait(20)
            return True

    t0 = time.monotonic()
    peak = before
    with concurrent.futures.ThreadPoolExecutor(100) as pool:
        futures = [pool.submit(hold, i) for i in range(100)]
        while not all(f.done() for f in futures):
            elapsed = time.monotonic() - t0
            assert elapsed < 60
            peak = max(peak, _rss_kib(pid))
            if elapsed > 15:  # past the 10 s budget wait: the closed ones are done
                release.set()
            time.sleep(0.05)
        results = [f.result() for f in futures]
    grown_mib = (peak - before) / 1024
    print(f"100 x 10 MiB sent: {sum(results)} went out whole; broker RSS grew by at most {grown_mib:.0f} MiB")
    assert grown_mib > 128, f"RSS grew by only {grown_mib:.0f} MiB: the test did not press on the budget"
    assert grown_mib < 256 + 192, f"RSS grew by {grown_mib:.0f} MiB (from {before} KiB); the input budget is 256 MiB"
    assert not all(results), "some connections should have been closed for want of input budget"

    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce("budget", value=b"after")
    assert producer.flush(15) == 0
    assert [m.value() for m in read_partition(broker.bootstrap, "budget", 0, 2)] == [b"warm", b"after"]
    thrift = broker.client()
    assert thrift.getSize(T.GetSizeRequest(topic="budget")).size == 2
    thrift.close()


def test_a_batch_over_message_max_bytes_is_refused_and_the_connection_kept(broker: BrokerProcess) -> None:
    with RawClient(broker.kafka_port) as raw:
        raw.call(metadata_request("limit"))
        part = produce_partition_response(raw.call(produce_request("limit", 0, record_batch([b"x" * (2 * MiB)]))))
        assert part.error_code == MESSAGE_TOO_LARGE, part
        assert _kafka_produce(raw, "limit", b"small") == 0
    thrift = broker.client()
    assert thrift.getSize(T.GetSizeRequest(topic="limit")).size == 1
    thrift.close()
