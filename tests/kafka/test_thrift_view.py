"""What a Thrift consumer reads of Kafka record batches stored in a topic (item kind 1):
one Luxun message pack per batch, of its records' values; Thrift-written items stay as
they were written, even one whose bytes are exactly a Kafka batch.

The batches are written by kafka-python's encoder straight into the topic's big array
(kind 1, one count per record, as the Kafka port stores them) while no broker runs; a
real broker subprocess then serves them to the thriftpy2 client over every consume path.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from bigarray import FanoutQueue
from clients.pack import decode_pack, encode_pack
from idl import luxun_thrift as T
from luxun.partitions import KIND_KAFKA_BATCH
from tests._broker import BrokerProcess

pytestmark = pytest.mark.timeout(90)

R = T.ResultCode
T0 = 1_700_000_000_000


def kafka_batch(values: list[bytes | None], codec: int) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i, value in enumerate(values):
        b.append(i, timestamp=T0 + i, key=b"k%d" % i, value=value, headers=[("h", b"v")])
    return bytes(b.build())


def control_batch() -> bytes:
    data = bytearray(kafka_batch([b"marker"], 0))
    data[22] |= 0x20  # control (a transaction marker, as a broker writes them)
    from crc32c import crc32c

    data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")
    return bytes(data)


GZ = [b"gzip record %d " % i * 20 for i in range(5)] + [None]
ZS = [b"zstd %d" % i * 30 for i in range(3)]
SN = [b"snappy %d" % i * 30 for i in range(4)]
PLAIN_1 = encode_pack([b"thrift one", b"thrift two"])
PLAIN_2 = encode_pack([b"thrift three"])
# A Thrift producer's item that is, byte for byte, a valid Kafka batch: it stays raw.
LOOKALIKE = kafka_batch([b"not a kafka record"], 0)

# A stored batch gone bad (its crc no longer matches): handed over as stored, and logged.
BROKEN = bytearray(kafka_batch([b"broken"] * 3, 0))
BROKEN[-1] ^= 0xFF

# (item, count, kind) in index order, and what a Thrift consumer must read for each
LAYOUT: list[tuple[bytes, int, int]] = [
    (PLAIN_1, 1, 0),
    (kafka_batch(GZ, 1), len(GZ), KIND_KAFKA_BATCH),
    (kafka_batch([b"single"], 0), 1, KIND_KAFKA_BATCH),
    (PLAIN_2, 1, 0),
    (kafka_batch(ZS, 4), len(ZS), KIND_KAFKA_BATCH),
    (control_batch(), 1, KIND_KAFKA_BATCH),
    (LOOKALIKE, 1, 0),
    (kafka_batch(SN, 2), len(SN), KIND_KAFKA_BATCH),
    (bytes(BROKEN), 3, KIND_KAFKA_BATCH),
]
EXPECTED: list[list[bytes] | bytes] = [
    [b"thrift one", b"thrift two"],
    [v or b"" for v in GZ],
    [b"single"],
    [b"thrift three"],
    ZS,
    [],
    LOOKALIKE,  # raw bytes, not a pack
    SN,
    bytes(BROKEN),
]


# More items than _may_hold_batches looks at one by one: raw Thrift items with a 2 at
# byte 16 (like a batch's magic; they stay raw) and three batches among them.
MANY: list[tuple[bytes, int, int]] = [(bytes(16) + b"\x02" + b"raw %03d" % i + bytes(80), 1, 0) for i in range(100)]
for _at in (3, 80, 99):
    MANY[_at] = (kafka_batch([b"batch at %d" % _at, None], _at % 5), 2, KIND_KAFKA_BATCH)
MANY_EXPECTED: list[list[bytes] | bytes] = [
    [b"batch at %d" % i, b""] if kind == KIND_KAFKA_BATCH else item for i, (item, _, kind) in enumerate(MANY)
]


def seen(item: bytes, want: list[bytes] | bytes) -> bool:
    return item == want if isinstance(want, bytes) else decode_pack(item) == want


@pytest.fixture
def broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BrokerProcess]:
    data = tmp_path / "data"
    queue = FanoutQueue(str(data / "mixed"))
    try:
        for item, count, kind in LAYOUT:
            queue.enqueue(item, count, kind)
        assert queue.array.next_offset == sum(count for _, count, _ in LAYOUT)
    finally:
        queue.close()
    queue = FanoutQueue(str(data / "many"))
    try:
        for item, count, kind in MANY:
            queue.enqueue(item, count, kind)
    finally:
        queue.close()
    proc = BrokerProcess(data, tmp_path / "broker.log").start()
    yield proc
    proc.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is None or rep.failed:
        sys.stderr.write(proc.log())


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[Any]:
    c = broker.client()
    yield c
    c.close()


def consume(client: Any, **fields: Any) -> Any:
    response = client.consume(T.ConsumeRequest(topic="mixed", **fields))
    assert response.result.resultCode == R.SUCCESS, response.result
    return response


def test_fetch_by_index_turns_batches_into_packs(client: Any, broker: BrokerProcess) -> None:
    response = consume(client, startIndex=0, maxFetchSize=1 << 20)
    assert len(response.itemList) == len(EXPECTED) and response.lastConsumedIndex == len(EXPECTED) - 1
    for i, (item, want) in enumerate(zip(response.itemList, EXPECTED, strict=True)):
        assert seen(item, want), i
    assert f"topic 'mixed' item {len(EXPECTED) - 1}: Kafka batch sent to a Thrift consumer as stored" in broker.log()
    part = consume(client, startIndex=4, maxFetchSize=1 << 20, withTimestamps=True)
    assert part.firstIndex == 4 and len(part.timestampList) == len(part.itemList) == len(EXPECTED) - 4
    assert all(seen(item, want) for item, want in zip(part.itemList, EXPECTED[4:], strict=True))


@pytest.mark.parametrize("fields", [{"startIndex": 0}, {"fanoutId": "g"}])
def test_a_fetch_of_many_items_finds_the_batches_among_them(client: Any, fields: dict[str, Any]) -> None:
    response = client.consume(T.ConsumeRequest(topic="many", maxFetchSize=1 << 20, **fields))
    assert response.result.resultCode == R.SUCCESS and len(response.itemList) == len(MANY) > 64
    for i, (item, want) in enumerate(zip(response.itemList, MANY_EXPECTED, strict=True)):
        assert seen(item, want), i
    plain = client.consume(T.ConsumeRequest(topic="many", startIndex=4, maxFetchSize=76 * 104)).itemList
    assert 64 < len(plain) <= 76  # none is a batch: the blob as read
    assert plain == [item for item, _, _ in MANY[4 : 4 + len(plain)]]


def test_single_items_by_index(client: Any) -> None:
    for i, want in enumerate(EXPECTED):
        [item] = consume(client, startIndex=i).itemList
        assert seen(item, want), i
        [item] = consume(client, startIndex=i, withTimestamps=True).itemList
        assert seen(item, want), i


@pytest.mark.parametrize("fields", [{}, {"withTimestamps": True}, {"maxFetchSize": 1 << 20}, {"maxFetchSize": 300}])
def test_groups_read_packs(client: Any, fields: dict[str, Any]) -> None:
    got: list[bytes] = []
    for _ in range(len(EXPECTED)):
        response = client.consume(T.ConsumeRequest(topic="mixed", fanoutId="g", **fields))
        if response.result.resultCode != R.SUCCESS:
            break
        got += response.itemList
    assert len(got) == len(EXPECTED)
    for i, (item, want) in enumerate(zip(got, EXPECTED, strict=True)):
        assert seen(item, want), i


def test_from_committed_reads_packs(client: Any) -> None:
    request = T.CommitOffsetRequest(topic="mixed", fanoutId="c", index=4)
    assert client.commitOffset(request).result.resultCode == R.SUCCESS
    response = consume(client, fanoutId="c", fromCommitted=True, maxFetchSize=1 << 20)
    assert all(seen(item, want) for item, want in zip(response.itemList, EXPECTED[4:], strict=True))
    assert len(response.itemList) == len(EXPECTED) - 4


# -- end to end: Kafka producers on the Kafka port, Thrift consumers -------------------


@pytest.fixture
def kafka_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "kdata", tmp_path / "kbroker.log", kafka=True).start()
    yield proc
    proc.stop()
    sys.stderr.write(proc.log())


def drain(client: Any, topic: str, group: str, want: int, **fields: Any) -> list[bytes]:
    """Thrift consume by group until ``want`` messages (in packs) are read or 20 s pass."""
    import time

    messages: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(messages) < want and time.monotonic() < deadline:
        response = client.consume(T.ConsumeRequest(topic=topic, fanoutId=group, maxWaitMs=200, **fields))
        for item in response.itemList or []:
            messages += decode_pack(item)
    return messages


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_thrift_consumers_read_what_confluent_kafka_produced(kafka_broker: BrokerProcess, codec: str) -> None:
    from confluent_kafka import Producer

    topic = "ck-" + codec
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "compression.type": codec, "linger.ms": 20})
    values = [None if i % 50 == 7 else b"record %d " % i * (1 + i % 5) for i in range(400)]
    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=b"k%d" % i, headers=[("h", b"x")])
    assert producer.flush(15) == 0
    want = [v or b"" for v in values]
    client = kafka_broker.client()
    try:
        assert drain(client, topic, "fetching", len(want), maxFetchSize=1 << 20) == want
        assert drain(client, topic, "one-by-one", len(want)) == want
    finally:
        client.close()


def test_thrift_and_kafka_producers_on_one_topic(kafka_broker: BrokerProcess) -> None:
    from kafka import KafkaProducer

    client = kafka_broker.client()
    try:
        ok = client.produce(T.ProduceRequest(topic="shared", item=encode_pack([b"thrift 1", b"thrift 2"])))
        assert ok.result.resultCode == R.SUCCESS
        producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, compression_type="gzip", linger_ms=20)
        for i in range(10):
            producer.send("shared", value=b"kafka %d" % i, key=b"k")
        producer.flush(10)
        producer.close()
        ok = client.produce(T.ProduceRequest(topic="shared", item=encode_pack([b"thrift 3"])))
        assert ok.result.resultCode == R.SUCCESS
        want = [b"thrift 1", b"thrift 2", *(b"kafka %d" % i for i in range(10)), b"thrift 3"]
        assert drain(client, "shared", "g", len(want), maxFetchSize=1 << 20) == want
    finally:
        client.close()


def test_packs_of_kafka_batches_stay_within_max_fetch_size(kafka_broker: BrokerProcess) -> None:
    """Each of 5 zstd batches is ~20 KB stored and a ~0.9 MB pack: a Thrift consume of 1 MiB
    gets one pack, by index and by group (the group moves past only what it got); before,
    one consume made and sent all five (4.5 MB for a 1 MiB fetch; 9 M-record batches took
    GBs)."""
    from ._kafka import RawClient, metadata_request, produce_partition_response, produce_request

    values = [b"%06d" % i + b"x" * 94 for i in range(8_000)]
    data = kafka_batch(values, 4)
    assert len(data) < 100_000  # five fit in one 1 MiB read as stored
    with RawClient(kafka_broker.kafka_port) as raw:
        raw.call(metadata_request("inflating"))
        for _ in range(5):
            part = produce_partition_response(raw.call(produce_request("inflating", 0, data)))
            assert part.error_code == 0, part
    client = kafka_broker.client()
    try:
        for index in range(5):
            response = client.consume(T.ConsumeRequest(topic="inflating", startIndex=index, maxFetchSize=1 << 20))
            assert response.result.resultCode == R.SUCCESS
            assert (len(response.itemList), response.lastConsumedIndex) == (1, index)
            assert decode_pack(response.itemList[0]) == values
        for _ in range(5):
            response = client.consume(T.ConsumeRequest(topic="inflating", fanoutId="g", maxFetchSize=1 << 20))
            assert len(response.itemList) == 1
            assert decode_pack(response.itemList[0]) == values
        response = client.consume(T.ConsumeRequest(topic="inflating", fanoutId="g", maxFetchSize=1 << 20))
        assert response.result.errorCode == T.ErrorCode.ALL_MESSAGE_CONSUMED
        # Small batches still come many to a consume.
        small = kafka_batch([b"a", b"b"], 4)
        with RawClient(kafka_broker.kafka_port) as raw:
            for _ in range(3):
                produce_partition_response(raw.call(produce_request("inflating", 0, small)))
        response = client.consume(T.ConsumeRequest(topic="inflating", fanoutId="g", maxFetchSize=1 << 20))
        assert [decode_pack(item) for item in response.itemList] == [[b"a", b"b"]] * 3
    finally:
        client.close()
