"""Pipelined requests on one Kafka connection: read ahead, answered in order, whatever the
sizes and however the bytes arrive."""

from __future__ import annotations

import io
import re
import socket
import struct
import time
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.serial import entity_reader, entity_writer

from luxun.kafka import protocol as P
from tests._broker import BrokerProcess

pytestmark = pytest.mark.timeout(120)


def batch(n: int, size: int) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30)
    for i in range(n):
        b.append(i, 1_700_000_000_000, None, b"%08d" % i + b"x" * (size - 8), [])
    return bytes(b.build())


def request(api_key: int, version: int, correlation_id: int, **values: object) -> bytes:
    entity = P.build(P.request_schema(api_key, version), **values)
    out = io.BytesIO()
    out.write(struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test")
    if entity.__flexible__:
        out.write(b"\0")
    entity_writer(type(entity))(out, entity)
    body = out.getvalue()
    return struct.pack(">i", len(body)) + body


def produce(correlation_id: int, records: bytes, version: int = 9) -> bytes:
    data = [{"name": "pipe", "partition_data": [{"index": 0, "records": records}]}]
    return request(0, version, correlation_id, acks=1, timeout=10_000, topic_data=data)


def read_response(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return bytes(out)

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def produce_answer(response: bytes, version: int = 9) -> tuple[int, int, int]:
    """(correlation id, error code, base offset) of a one-partition Produce response."""
    (correlation_id,) = struct.unpack_from(">i", response)
    start = 5 if version >= 9 else 4  # the flexible header's tagged fields
    entity, _ = entity_reader(P.response_schema(0, version))(response, start)
    p = entity.responses[0].partition_responses[0]
    return correlation_id, int(p.error_code), int(p.base_offset)


def test_pipelined_requests_of_every_size_are_answered_in_order(broker: BrokerProcess) -> None:
    host, port = broker.bootstrap.split(":")
    small, big = batch(3, 100), batch(200, 1000)  # ~300 B and ~200 KB (past the read-ahead)
    frames = []
    expected_offsets = []
    offset = 0
    for i in range(60):
        records = big if i % 20 == 10 else small
        frames.append(produce(i, records, version=9 if i % 2 else 3))
        expected_offsets.append(offset)
        offset += 200 if records is big else 3
    frames.insert(30, request(18, 0, 1000))  # an ApiVersions between the produces
    wire = b"".join(frames)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request(3, 4, 99, topics=[{"name": "pipe"}], allow_auto_topic_creation=True))
        read_response(sock)  # the topic now exists
        # First in one write, then in odd-sized pieces that split headers and frames.
        sock.sendall(wire)
        answers = [read_response(sock) for _ in frames]
        pos = 0
        for step in (1, 3, 7, 4096, 65_537, 5):
            end = min(len(wire), pos + step)
            sock.sendall(wire[pos:end])
            pos = end
            time.sleep(0.01)
        sock.sendall(wire[pos:])
        answers += [read_response(sock) for _ in frames]
    ids = [struct.unpack_from(">i", a)[0] for a in answers]
    order = [struct.unpack_from(">i", f, 8)[0] for f in frames]
    assert ids == order + order
    produced = [a for a, i in zip(answers, ids, strict=True) if i != 1000]
    got = [produce_answer(a, 9 if i % 2 else 3) for a, i in zip(produced, [i for i in ids if i != 1000], strict=True)]
    assert [e for _, e, _ in got] == [0] * 120
    assert [o for _, _, o in got] == expected_offsets + [offset + o for o in expected_offsets]


def test_requests_before_a_bad_frame_are_answered_before_the_connection_closes(broker: BrokerProcess) -> None:
    host, port = broker.bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request(3, 4, 99, topics=[{"name": "pipe"}], allow_auto_topic_creation=True))
        read_response(sock)
        # Two produces, then a frame of size 0 that looks like a third one to a quick glance.
        sock.sendall(produce(1, batch(2, 100)) + produce(2, batch(2, 100)) + b"\0" * 6)
        answers = [produce_answer(read_response(sock)) for _ in range(2)]
        assert sock.recv(1) == b""  # then the connection closes
    assert answers == [(1, 0, 0), (2, 0, 2)]


def test_a_run_of_produce_requests_is_answered_as_one_by_one(tmp_path: Path) -> None:
    """Produce requests that arrive together are stored as a run (KafkaHandler.handle_frames):
    each still gets its own answer and offsets, a refused one stores nothing, acks=0 gets
    no answer, another topic or partition splits the run, and a frame that closes the
    connection leaves every request before it stored and answered, none after it; each
    request read is counted in the metrics."""
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True, metrics=True).start()
    try:
        run_requests(broker)
        text = broker.metrics_page()
    finally:
        broker.stop()
    counted = dict(re.findall(r'^luxun_kafka_requests_total\{api_key="0",version="(\d+)"\} (\d+)$', text, re.MULTILINE))
    assert counted == {"2": "1", "3": "1", "9": "8"}  # the one after the refusal was never read


def run_requests(broker: BrokerProcess) -> None:
    host, port = broker.bootstrap.split(":")

    def to(topic: str, partition: int, correlation_id: int, records: bytes, acks: int = 1, version: int = 9) -> bytes:
        data = [{"name": topic, "partition_data": [{"index": partition, "records": records}]}]
        return request(0, version, correlation_id, acks=acks, timeout=10_000, topic_data=data)

    corrupt = bytearray(batch(2, 100))
    corrupt[-1] ^= 0xFF  # a value byte: the crc no longer matches
    unsupported = bytearray(to("pipe", 0, 8, batch(1, 100)))
    unsupported[6:8] = struct.pack(">h", 2)  # Produce v2: not served, the connection closes
    frames = [
        to("pipe", 0, 1, batch(2, 100)),
        to("pipe", 0, 2, bytes(corrupt)),
        to("pipe", 0, 3, batch(3, 100), acks=0),
        to("other", 0, 4, batch(1, 100)),
        to("pipe", 0, 5, batch(2, 100), version=3),
        to("pipe", 7, 6, batch(1, 100)),  # no such partition
        to("pipe", 0, 7, batch(1, 100)),
        bytes(unsupported),
        to("pipe", 0, 9, batch(1, 100)),  # after the refusal: never stored
    ]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request(3, 4, 99, topics=[{"name": "pipe"}, {"name": "other"}], allow_auto_topic_creation=True))
        read_response(sock)
        sock.sendall(b"".join(frames))
        answers = [produce_answer(read_response(sock), 3 if i == 5 else 9) for i in (1, 2, 4, 5, 6, 7)]
        assert sock.recv(1) == b""
    assert answers == [(1, 0, 0), (2, 2, -1), (4, 0, 0), (5, 0, 5), (6, 3, -1), (7, 0, 7)]
    with socket.create_connection((host, int(port)), timeout=30) as sock:  # 8 records stored: 0..7
        sock.sendall(to("pipe", 0, 10, batch(1, 100)) + to("pipe", 0, 11, batch(1, 100)))
        assert [produce_answer(read_response(sock)) for _ in range(2)] == [(10, 0, 8), (11, 0, 9)]
