"""Record batches exactly as librdkafka (confluent-kafka) writes them, read by luxun.records.

confluent-kafka produces to librdkafka's own in-process mock cluster
(``test.mock.num.brokers``), which keeps each produced batch as sent; a Fetch v4 over a
plain socket takes the stored batches back, bytes untouched but baseOffset.
"""

from __future__ import annotations

import logging
import re
import socket
import struct
import time
from typing import Any

import pytest

from clients.pack import decode_pack
from luxun import records as R

pytestmark = pytest.mark.timeout(60)

confluent_kafka = pytest.importorskip("confluent_kafka")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the mock broker closed the connection")
        out += chunk
    return bytes(out)


def fetch_v4(address: tuple[str, int], topic: str, offset: int = 0) -> bytes:
    """The records field of partition 0 of ``topic`` from ``offset`` (Fetch v4, by hand)."""
    name = topic.encode()
    body = struct.pack(">iiiib", -1, 500, 1, 64 << 20, 0)  # replica, max wait, min bytes, max bytes, isolation
    body += struct.pack(">ih", 1, len(name)) + name + struct.pack(">iiqi", 1, 0, offset, 64 << 20)
    client_id = b"luxun-test"
    header = struct.pack(">hhih", 1, 4, 7, len(client_id)) + client_id
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
        reply = _recv_exactly(sock, size)
    pos = 4 + 4  # correlation id, throttle time
    (n_topics,) = struct.unpack_from(">i", reply, pos)
    assert n_topics == 1
    (nlen,) = struct.unpack_from(">h", reply, pos + 4)
    pos += 6 + nlen
    (n_parts,) = struct.unpack_from(">i", reply, pos)
    assert n_parts == 1
    partition, error = struct.unpack_from(">ih", reply, pos + 4)
    assert (partition, error) == (0, 0)
    pos += 4 + 4 + 2 + 8 + 8  # count, partition, error, high watermark, last stable offset
    (n_aborted,) = struct.unpack_from(">i", reply, pos)
    pos += 4 + max(n_aborted, 0) * 16
    (rlen,) = struct.unpack_from(">i", reply, pos)
    return reply[pos + 4 : pos + 4 + rlen]


CODECS = {name: codec for codec, name in R.CODEC_NAMES.items()}


@pytest.mark.parametrize("codec", list(CODECS))
def test_librdkafka_batches_read_back(codec: str) -> None:
    lines = _Lines()
    logger = logging.getLogger(f"librdkafka-{codec}")
    logger.addHandler(lines)
    logger.setLevel(logging.DEBUG)
    producer: Any = confluent_kafka.Producer(
        {"test.mock.num.brokers": 1, "debug": "mock", "compression.type": codec, "linger.ms": 50},
        logger=logger,
    )
    sent: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = []
    for i in range(300):
        key = None if i % 4 == 0 else b"key-%d" % i
        value = None if i % 9 == 4 else b"librdkafka value %d " % i * (1 + i % 7)
        headers = [("n", b"%d" % i)] if i % 2 else []
        sent.append((key, value, headers))
        producer.produce("t", value=value, key=key, headers=headers or None, partition=0)
    assert producer.flush(20) == 0
    found = None
    for _ in range(50):
        for line in lines.lines:
            found = found or re.search(r"bootstrap\.servers=(127\.0\.0\.1):(\d+)", line)
        if found:
            break
        producer.poll(0.1)
    assert found, lines.lines[:20]
    # Fetched from the next offset until every record is back: the mock cluster answers a
    # Fetch with some of the stored batches, fewer when the machine is busy.
    batches: list[Any] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = sum(b.record_count for b in batches)
        if got >= len(sent):
            break
        more = R.split_batches(fetch_v4((found.group(1), int(found.group(2))), "t", got))
        batches += more  # as a producer sent them: client checks pass too
        if not more:
            time.sleep(0.1)
    assert sum(b.record_count for b in batches) == len(sent)
    assert {b.codec for b in batches} == {CODECS[codec]}
    records = [r for b in batches for r in R.batch_records(b.data)]
    assert [r.offset for r in records] == list(range(len(sent)))
    assert [(r.key, r.value, [(k, v) for k, v in r.headers]) for r in records] == sent
    values = [v for b in batches for v in decode_pack(R.batch_to_pack(b.data))]
    assert values == [v or b"" for _, v, _ in sent]
    del producer
