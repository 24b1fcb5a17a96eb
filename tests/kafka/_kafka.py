"""Helpers of the Kafka port tests: raw requests over a socket (kio's schemas, as a
client would send them), record batches (kafka-python's encoder) and reading a
partition with confluent-kafka."""

from __future__ import annotations

import datetime
import importlib
import io
import socket
import struct
import time
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

_I32 = struct.Struct(">i")


def encode_request(entity: Any, correlation_id: int, client_id: str | None = "luxun-tests") -> bytes:
    """A request frame (size included) carrying kio request ``entity``."""
    out = io.BytesIO()
    out.write(struct.pack(">hhi", entity.__api_key__, entity.__version__, correlation_id))
    if client_id is None:
        out.write(struct.pack(">h", -1))
    else:
        raw = client_id.encode()
        out.write(struct.pack(">h", len(raw)) + raw)
    if entity.__flexible__:
        out.write(b"\0")  # request header v2: no tagged fields
    entity_writer(type(entity))(out, entity)
    body = out.getvalue()
    return _I32.pack(len(body)) + body


def read_frame(sock: socket.socket) -> bytes | None:
    """One response frame (size excluded), or None if the broker closed the connection."""
    head = recv_exactly(sock, 4)
    if head is None:
        return None
    (size,) = _I32.unpack(head)
    return recv_exactly(sock, size)


def recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def decode_response(frame: bytes, api_key: int, version: int) -> tuple[int, Any]:
    """``(correlation id, kio response entity)`` of a response frame."""
    schema = load_response_schema(api_key, version)
    (correlation_id,) = _I32.unpack_from(frame, 0)
    pos = 4
    if schema.__flexible__ and api_key != 18:  # response header v1 (ApiVersions: always v0)
        assert frame[pos] == 0, "no tagged fields expected in the response header"
        pos += 1
    entity, size = entity_reader(schema)(frame, pos)
    assert pos + size == len(frame), f"{len(frame) - pos - size} bytes after the response body"
    return correlation_id, entity


class RawClient:
    """One Kafka connection speaking raw requests (kio entities)."""

    def __init__(self, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.correlation_id = 0

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, entity: Any) -> int:
        self.correlation_id += 1
        self.sock.sendall(encode_request(entity, self.correlation_id))
        return self.correlation_id

    def call(self, entity: Any) -> Any:
        """Send ``entity`` and return the response (kio entity of the same version)."""
        cid = self.send(entity)
        frame = read_frame(self.sock)
        assert frame is not None, f"the broker closed the connection instead of answering {type(entity).__name__}"
        got_cid, response = decode_response(frame, entity.__api_key__, entity.__version__)
        assert got_cid == cid
        return response

    def closed_by_broker(self, wait_s: float = 5.0) -> bool:
        """True if the broker closes the connection (EOF) within ``wait_s`` without a reply."""
        self.sock.settimeout(wait_s)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def request(api_key: int, version: int, **fields: Any) -> Any:
    """A kio request entity; nested values are given as kio entities of that version."""
    return load_request_schema(api_key, version)(**fields)


def record_batch(
    values: list[bytes],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp_ms: int | None = None,
    codec: int = 0,
) -> bytes:
    """A record batch v2 (kafka-python's encoder), base offset 0."""
    builder = DefaultRecordBatchBuilder(2, codec, False, producer_id, producer_epoch, base_sequence, 1 << 24)
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    for i, value in enumerate(values):
        builder.append(i, timestamp=ts, key=None, value=value, headers=[])
    return bytes(builder.build())


def produce_request(topic: str, partition: int, records: bytes, *, version: int = 7, acks: int = -1) -> Any:
    schema = load_request_schema(0, version)
    module = importlib.import_module(schema.__module__)
    return schema(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            module.TopicProduceData(
                name=topic, partition_data=(module.PartitionProduceData(index=partition, records=records),)
            ),
        ),
    )


def fetch_request(
    parts: list[tuple[str, int]], max_bytes: int, *, partition_max_bytes: int = 1 << 20, version: int = 4
) -> Any:
    """A Fetch of ``parts`` (topic, partition) from offset 0 that does not wait."""
    schema = load_request_schema(1, version)
    module = importlib.import_module(schema.__module__)
    by_topic: dict[str, list[Any]] = {}
    for topic, p in parts:
        by_topic.setdefault(topic, []).append(
            module.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=partition_max_bytes)
        )
    return schema(
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=0),
        min_bytes=0,
        max_bytes=max_bytes,
        isolation_level=0,
        topics=tuple(module.FetchTopic(topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
    )


def metadata_request(*topics: str, version: int = 4) -> Any:
    """Metadata of ``topics`` (created if unknown, as a producer's first Metadata does)."""
    schema = load_request_schema(3, version)
    module = importlib.import_module(schema.__module__)
    return schema(topics=tuple(module.MetadataRequestTopic(name=t) for t in topics), allow_auto_topic_creation=True)


def produce_partition_response(response: Any) -> Any:
    """The one partition response of a one-partition Produce response."""
    (topic,) = response.responses
    (part,) = topic.partition_responses
    return part


def read_partition(bootstrap: str, topic: str, partition: int, count: int, timeout_s: float = 20.0) -> list[Any]:
    """``count`` messages of one partition from offset 0 (confluent-kafka, assign)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "read-partition", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        got: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < count and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append(m)
        # Anything past ``count`` would be a bug: one more short poll.
        extra = consumer.poll(0.3)
        assert extra is None or extra.error() is not None, f"more than {count} records in {topic}-{partition}"
        return got
    finally:
        consumer.close()
