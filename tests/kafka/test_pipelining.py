"""Pipelined requests on one Kafka connection: read ahead, answered in order, whatever the
sizes and however the bytes arrive."""

from __future__ import annotations

import io
import socket
import struct
import time

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
