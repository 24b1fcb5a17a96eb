"""Kafka's time semantics (issue 30, item 5): ListOffsets by time finds the first record
whose own timestamp is at or after the target (not the broker's append time), with that
record's timestamp, through each partition's time index.

Records are produced with timestamps an hour in the past, out of order across batches
and within them, by kafka-python, confluent-kafka and raw Produce frames; every lookup
(kafka-python's and confluent-kafka's ``offsets_for_times``, raw ListOffsets v1 and v7
frames, -3 for the largest timestamp) is checked against the record it must find, taken
from what a consumer reads back. Also: a LogAppendTime topic, items written through
Thrift into the same partition, a broker killed with SIGKILL while producing (the index
then torn or deleted), and retention having removed the first pages.
"""

from __future__ import annotations

import importlib
import os
import random
import signal
import struct
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema

from bigarray import FanoutQueue
from idl import luxun_thrift as T
from luxun import records as rec
from luxun.kafka import timeindex
from luxun.kafka.log import KafkaLog
from luxun.kafka.timeindex import TIME_INDEX_FILE, TimeIndex
from luxun.partitions import KIND_KAFKA_BATCH
from tests._broker import BrokerProcess

from ._kafka import RawClient, produce_partition_response, produce_request, read_partition, request

pytestmark = pytest.mark.timeout(180)

HOUR_MS = 3_600_000
#: Record timestamps of each batch, as deltas from a base an hour ago: out of order
#: across batches and within them, with repeats (ties go to the first record).
GROUPS: list[list[int]] = [[500, 100, 300], [50, 700, 700, 200], [400], [1000, 0, 600], [250, 250], [900, 800, 1000]]

Found = tuple[int, int] | None  # (offset, timestamp) of the record a lookup must give


def _hour_ago() -> int:
    return int(time.time() * 1000) - HOUR_MS


def _expected(records: Sequence[tuple[int, int]], target: int) -> Found:
    """What Kafka answers: the first record (by offset) whose timestamp is >= target."""
    return next(((o, t) for o, t in records if t >= target), None)


def _largest(records: Sequence[tuple[int, int]]) -> Found:
    """What Kafka answers to -3: the first record with the largest timestamp."""
    if not records:
        return None
    top = max(t for _, t in records)
    return _expected(records, top)


def _targets(records: Sequence[tuple[int, int]]) -> list[int]:
    stamps = sorted({t for _, t in records})
    out = {0, stamps[0] - 1, stamps[-1] + 1}
    for t in stamps:
        out.update((t - 1, t, t + 1))
    return sorted(x for x in out if x >= 0)


def _read_back(bootstrap: str, topic: str, count: int, start: int = 0) -> list[tuple[int, int]]:
    """(offset, timestamp) of the ``count`` records of partition 0 from ``start``, as a
    consumer reads them (confluent-kafka)."""
    if start == 0:
        return [(m.offset(), m.timestamp()[1]) for m in read_partition(bootstrap, topic, 0, count)]
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "read-back", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, start)])
        got: list[tuple[int, int]] = []
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append((m.offset(), m.timestamp()[1]))
        return got
    finally:
        consumer.close()


def _list_offsets_raw(client: RawClient, version: int, topic: str, timestamp: int) -> Found:
    schema = importlib.import_module(load_request_schema(2, version).__module__)  # kio's module of this version
    partition = (
        schema.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=timestamp)
        if version >= 4
        else schema.ListOffsetsPartition(partition_index=0, timestamp=timestamp)
    )
    fields: dict[str, Any] = {"isolation_level": 0} if version >= 2 else {}
    response = client.call(
        request(
            2, version, replica_id=-1, topics=(schema.ListOffsetsTopic(name=topic, partitions=(partition,)),), **fields
        )
    )
    ((part,),) = [t.partitions for t in response.topics]
    assert part.error_code == 0, part
    return None if part.offset == -1 else (part.offset, part.timestamp)


def _check_lookups(broker: BrokerProcess, topic: str, records: Sequence[tuple[int, int]]) -> None:
    """Every target of ``records`` through kafka-python, confluent-kafka and raw frames."""
    from confluent_kafka import Consumer, TopicPartition
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    targets = _targets(records)
    want = {t: _expected(records, t) for t in targets}

    kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    try:
        tp = KTopicPartition(topic, 0)
        got: dict[int, Found] = {}
        for t in targets:
            found = kc.offsets_for_times({tp: t})[tp]
            got[t] = None if found is None else (found.offset, found.timestamp)
        assert got == want, "kafka-python offsets_for_times"
    finally:
        kc.close()

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "times", "enable.auto.commit": False})
    try:
        offsets = {t: consumer.offsets_for_times([TopicPartition(topic, 0, t)], timeout=10)[0].offset for t in targets}
        assert offsets == {t: -1 if w is None else w[0] for t, w in want.items()}, "confluent-kafka offsets_for_times"
    finally:
        consumer.close()

    with RawClient(broker.kafka_port) as raw:
        for version in (1, 7):
            assert {t: _list_offsets_raw(raw, version, topic, t) for t in targets} == want, f"ListOffsets v{version}"
        assert _list_offsets_raw(raw, 7, topic, -3) == _largest(records), "ListOffsets -3 (MAX_TIMESTAMP)"


def _produce_kafka_python(bootstrap: str, topic: str, base: int, groups: list[list[int]], codec: str | None) -> None:
    """One batch per group (linger long, flush after each), each record's timestamp given."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5000, compression_type=codec, acks="all")
    try:
        n = 0
        for group in groups:
            futures = [producer.send(topic, value=b"v%d" % (n + i), timestamp_ms=base + d) for i, d in enumerate(group)]
            producer.flush(15)
            assert len({f.get(10).offset - i for i, f in enumerate(futures)}) == 1, "the group is not one batch"
            n += len(group)
    finally:
        producer.close(10)


def _produce_confluent(bootstrap: str, topic: str, stamps: Sequence[int], **config: Any) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, **config})
    errors: list[Any] = []
    for i, ts in enumerate(stamps):
        producer.produce(
            topic, value=b"c%d" % i, timestamp=ts, on_delivery=lambda e, m: errors.append(e) if e else None
        )
        if i % 5 == 4:
            producer.flush(10)
    assert producer.flush(15) == 0 and not errors, errors


def _raw_batch(stamps: Sequence[int], codec: int = 0, pad: int = 0) -> bytes:
    """One record batch whose records have these timestamps (kafka-python's encoder)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 24)
    for i, ts in enumerate(stamps):
        builder.append(i, timestamp=ts, key=None, value=b"r%d" % i + b"." * pad, headers=[])
    return bytes(builder.build())


def _produce_raw(port: int, topic: str, batches: Sequence[bytes]) -> list[int]:
    """Each batch in its own Produce v7 request; the base offsets."""
    out = []
    with RawClient(port) as raw:
        for batch in batches:
            part = produce_partition_response(raw.call(produce_request(topic, 0, batch)))
            assert part.error_code == 0, part
            out.append(part.base_offset)
    return out


def _create(broker: BrokerProcess, topic: str, **config: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1, config=config)], request_timeout=10).values():
        future.result(10)


def test_offsets_for_times_with_producer_timestamps_an_hour_ago(broker: BrokerProcess) -> None:
    """kafka-python (gzip), confluent-kafka (lz4) and raw frames (zstd and none) produce
    records an hour old, out of order; every lookup finds the record Kafka would."""
    from confluent_kafka import TIMESTAMP_CREATE_TIME

    base = _hour_ago()
    _create(broker, "kp")
    _produce_kafka_python(broker.bootstrap, "kp", base, GROUPS, "gzip")
    stamps = [base + d for group in GROUPS for d in group]
    fetched = read_partition(broker.bootstrap, "kp", 0, len(stamps))
    # Fetch answers carry each record's own timestamp (the batches are stored as sent).
    assert [(m.offset(), m.timestamp()) for m in fetched] == [
        (i, (TIMESTAMP_CREATE_TIME, ts)) for i, ts in enumerate(stamps)
    ]
    _check_lookups(broker, "kp", _read_back(broker.bootstrap, "kp", len(stamps)))

    rnd = random.Random(5)
    shuffled = [base + rnd.randrange(0, 2000) for _ in range(40)]
    _create(broker, "cf")
    _produce_confluent(broker.bootstrap, "cf", shuffled, **{"compression.type": "lz4", "linger.ms": 50})
    records = _read_back(broker.bootstrap, "cf", len(shuffled))
    assert [t for _, t in records] == shuffled
    _check_lookups(broker, "cf", records)

    _create(broker, "raw")
    groups = [[base + d for d in group] for group in GROUPS]
    bases = _produce_raw(broker.kafka_port, "raw", [_raw_batch(g, codec=4 * (i % 2)) for i, g in enumerate(groups)])
    assert bases == [0, 3, 7, 8, 11, 13]
    records = _read_back(broker.bootstrap, "raw", 16)
    assert [t for _, t in records] == [t for g in groups for t in g]
    _check_lookups(broker, "raw", records)


def test_thrift_items_in_a_partition_have_their_append_time(broker: BrokerProcess) -> None:
    """Items a Thrift client writes into the partition between Kafka batches count at
    their append time, and become the largest timestamp (-3)."""
    base = _hour_ago()
    _create(broker, "mixed")
    _produce_raw(broker.kafka_port, "mixed", [_raw_batch([base + 500, base + 100])])
    before = int(time.time() * 1000)
    client = broker.client()
    try:
        assert client.produce(T.ProduceRequest(item=b"thrift item", topic="mixed")).index == 1
    finally:
        client.close()
    after = int(time.time() * 1000)
    _produce_raw(broker.kafka_port, "mixed", [_raw_batch([base + 50, base + 900])])
    records = _read_back(broker.bootstrap, "mixed", 5)
    assert records[:2] == [(0, base + 500), (1, base + 100)] and records[3:] == [(3, base + 50), (4, base + 900)]
    assert records[2][0] == 2 and before <= records[2][1] <= after
    with RawClient(broker.kafka_port) as raw:
        assert _list_offsets_raw(raw, 7, "mixed", -3) == records[2]
        assert _list_offsets_raw(raw, 7, "mixed", base + 600) == records[2]
        assert _list_offsets_raw(raw, 7, "mixed", records[2][1] + 1) is None
    _check_lookups(broker, "mixed", records)


def test_log_append_time_topic(broker: BrokerProcess) -> None:
    """A LogAppendTime topic: batches are restamped at append (the Fetch answer says
    LogAppendTime and the produce answer's time), and lookups go by that time."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

    base = _hour_ago()
    _create(broker, "appended", **{"message.timestamp.type": "LogAppendTime"})
    answers = []
    with RawClient(broker.kafka_port) as raw:
        for i, group in enumerate(GROUPS):
            if i:
                time.sleep(0.003)  # distinct append times (ms), in order
            batch = _raw_batch([base + d for d in group], codec=1)
            part = produce_partition_response(raw.call(produce_request("appended", 0, batch)))
            assert part.error_code == 0 and part.log_append_time is not None, part
            answers.append((part.base_offset, round(part.log_append_time.timestamp() * 1000)))
    fetched = read_partition(broker.bootstrap, "appended", 0, 16)
    expect_ts = [ts for (first, ts), group in zip(answers, GROUPS, strict=True) for _ in group]
    assert [m.timestamp() for m in fetched] == [(TIMESTAMP_LOG_APPEND_TIME, ts) for ts in expect_ts]
    records = [(m.offset(), m.timestamp()[1]) for m in fetched]
    # an hour-old create time is before every append time: the first record
    with RawClient(broker.kafka_port) as raw:
        assert _list_offsets_raw(raw, 7, "appended", base + 500) == records[0]
    _check_lookups(broker, "appended", records)


def _partition_dir(broker: BrokerProcess, topic: str) -> Path:
    return broker.data_dir / topic


@pytest.mark.parametrize("damage", ["torn", "missing"])
def test_lookups_after_a_kill_while_producing(tmp_path: Path, damage: str) -> None:
    """SIGKILL while a producer sends out-of-order, hour-old records; then the index's
    tail torn, or the index deleted: rebuilt at the next start, every lookup right."""
    from confluent_kafka import Producer

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        _create(broker, "crash")
        base = _hour_ago()
        acked = 0
        stop = threading.Event()

        def on_delivery(err: Any, msg: Any) -> None:
            nonlocal acked
            if err is None:
                acked += 1

        def produce() -> None:
            producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1, "acks": "all"})
            rnd = random.Random(7)
            deadline = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < deadline:
                try:
                    for _ in range(rnd.randrange(1, 4)):
                        ts = base + rnd.randrange(0, 100_000)
                        producer.produce("crash", value=b"x" * 20, timestamp=ts, on_delivery=on_delivery)
                except BufferError:  # the queue is full: let it drain
                    producer.poll(0.05)
                producer.poll(0.001 if rnd.random() < 0.5 else 0)
            producer.flush(2)

        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while acked < 3000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert acked >= 3000, acked
        with RawClient(broker.kafka_port) as raw:  # a lookup writes the buffered entries out
            assert _list_offsets_raw(raw, 7, "crash", base) is not None
        flushed_at = acked
        while acked < flushed_at + 500 and time.monotonic() < deadline:  # and more wait in the buffer
            time.sleep(0.05)
        broker.stop(signal.SIGKILL)
        stop.set()
        thread.join(30)
        index = _partition_dir(broker, "crash") / TIME_INDEX_FILE
        size = index.stat().st_size
        assert size > 0 and size % 16 == 0
        if damage == "torn":
            os.truncate(index, size - 5)
        else:
            index.unlink()
        broker = BrokerProcess(tmp_path / "data", tmp_path / "broker-2.log", kafka=True).start()
        _produce_confluent(broker.bootstrap, "crash", [base + 50_000, base + 20, base + 200_000])
        with RawClient(broker.kafka_port) as raw:
            end = _list_offsets_raw(raw, 7, "crash", -1)
        assert end is not None and end[0] >= acked + 3
        records = _read_back(broker.bootstrap, "crash", end[0])
        # a sample of the targets (all of them would be thousands of lookups)
        rnd = random.Random(3)
        picked = sorted(rnd.sample(_targets(records), 40))
        want = {t: _expected(records, t) for t in picked}
        with RawClient(broker.kafka_port) as raw:
            assert {t: _list_offsets_raw(raw, 7, "crash", t) for t in picked} == want
            assert _list_offsets_raw(raw, 7, "crash", -3) == _largest(records)
        assert (index.stat().st_size) % 16 == 0
    finally:
        broker.stop()


def test_lookups_after_retention_removed_the_first_pages(tmp_path: Path) -> None:
    """The first batches carry the largest timestamps; after retention removed their
    pages, lookups find the live records (the gone ones' timestamps mislead nothing)."""
    props = tmp_path / "server.properties"
    props.write_text("log.backfile.page.size=4096\n")
    data = tmp_path / "data"
    broker = BrokerProcess(data, tmp_path / "broker.log", "--config", str(props), kafka=True).start()
    base = _hour_ago()
    rnd = random.Random(11)
    # 120 batches of 3 records of ~300 bytes: about 30 data pages; the first 30 batches
    # are the newest, the rest out of order below them
    batches = [[base + (50_000 if i < 30 else 0) + rnd.randrange(0, 10_000) for _ in range(3)] for i in range(120)]
    try:
        _create(broker, "trimmed")
        _produce_raw(broker.kafka_port, "trimmed", [_raw_batch(b, pad=300) for b in batches])
        with RawClient(broker.kafka_port) as raw:  # the index is built (and used) now
            assert _list_offsets_raw(raw, 7, "trimmed", base + 50_000) == (0, batches[0][0])
    finally:
        broker.stop()
    with FanoutQueue(data / "trimmed") as queue:  # the broker's retention, run here
        queue.limit_back_file_size(4 * 1024 * 1024 + 15 * 4096)  # an index page and 15 data pages
        assert 30 < queue.tail < 90, queue.tail  # the newest batches are gone
        start = queue.log_start_offset
    broker = BrokerProcess(data, tmp_path / "broker-2.log", "--config", str(props), kafka=True).start()
    try:
        records = _read_back(broker.bootstrap, "trimmed", 360 - start, start)
        assert [o for o, _ in records] == list(range(start, 360))
        with RawClient(broker.kafka_port) as raw:
            assert _list_offsets_raw(raw, 7, "trimmed", -2) == (start, -1)
        _check_lookups(broker, "trimmed", records)
    finally:
        broker.stop()


def test_the_time_index_goes_with_its_topic(tmp_path: Path) -> None:
    """Deleting a topic deletes its time index; a topic made again under the name
    starts a new one (lookups see only the new records)."""
    props = tmp_path / "server.properties"
    props.write_text("delete.topic.enable=true\n")
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", "--config", str(props), kafka=True).start()
    try:
        from confluent_kafka.admin import AdminClient

        base = _hour_ago()
        _create(broker, "gone")
        _produce_raw(broker.kafka_port, "gone", [_raw_batch([base + 900, base + 100])])
        with RawClient(broker.kafka_port) as raw:
            assert _list_offsets_raw(raw, 7, "gone", base + 500) == (0, base + 900)
        assert (_partition_dir(broker, "gone") / TIME_INDEX_FILE).exists()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.delete_topics(["gone"], request_timeout=10).values():
            future.result(10)
        _create(broker, "gone")
        _produce_raw(broker.kafka_port, "gone", [_raw_batch([base + 300])])
        with RawClient(broker.kafka_port) as raw:
            assert _list_offsets_raw(raw, 7, "gone", base + 200) == (0, base + 300)
            assert _list_offsets_raw(raw, 7, "gone", base + 500) is None
            assert _list_offsets_raw(raw, 7, "gone", -3) == (0, base + 300)
    finally:
        broker.stop()


# -- the index itself, in process (tiny segments, a real FanoutQueue) -----------------


def _model_stamps(queue: FanoutQueue) -> list[tuple[int, int]]:
    """(offset, timestamp) of every live record, read item by item (the model)."""
    out: list[tuple[int, int]] = []
    for i in range(queue.tail, queue.head):
        first = queue.first_offset(i)
        if queue.item_kind(i) != KIND_KAFKA_BATCH:
            out.append((first, queue.timestamp(i)))
            continue
        data = queue.get(i)
        stored_base = int.from_bytes(data[:8], "big", signed=True)
        out.extend((first + r.offset - stored_base, r.timestamp) for r in rec.batch_records(data))
    return out


def _lookup(index: TimeIndex, queue: FanoutQueue, target: int) -> Found:
    """What KafkaLog answers: the index's item, then the record in it."""
    index.catch_up(queue)
    item = index.find(queue, target)
    return None if item is None else KafkaLog._record_at(queue, item, target)


def _check_index(index: TimeIndex, queue: FanoutQueue, targets: Sequence[int]) -> None:
    records = _model_stamps(queue)
    assert {t: _lookup(index, queue, t) for t in targets} == {t: _expected(records, t) for t in targets}
    largest = _largest(records)
    assert index.max_timestamp(queue) == (None if largest is None else largest[1])


@pytest.fixture
def tiny_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments of 8 items, compaction from 4 dead entries, chunks of 5 entries: every
    path in few items."""
    monkeypatch.setattr(timeindex, "SEGMENT_BITS", 3)
    monkeypatch.setattr(timeindex, "SEGMENT_ITEMS", 8)
    monkeypatch.setattr(timeindex, "COMPACT_MIN_ENTRIES", 4)
    monkeypatch.setattr(timeindex, "_CHUNK_ENTRIES", 5)  # files read and written in several chunks


@pytest.mark.parametrize("seed", range(6))
def test_time_index_against_a_model(tmp_path: Path, tiny_segments: None, seed: int) -> None:
    """Random batches (out of order, a few far ahead), Thrift items, batches the index
    did not see (a crash before its write), retention, torn tails and reloads: every
    lookup equals reading every record."""
    rnd = random.Random(seed)
    now = 1_700_000_000_000
    with FanoutQueue(tmp_path / "p", data_page_size=4096) as queue:
        index = TimeIndex(queue.path)
        for step in range(160):
            roll = rnd.random()
            if roll < 0.15:
                queue.enqueue(b"thrift item")  # its append time (now) is far above the batches'
            else:
                centre = now + (10**6 if roll > 0.97 else 0) + rnd.randrange(-5000, 5000)
                stamps = [centre + rnd.randrange(-100, 100) for _ in range(rnd.randrange(1, 5))]
                batch = _raw_batch(stamps, codec=rnd.choice([0, 1]))
                first = queue.enqueue(batch, len(stamps), KIND_KAFKA_BATCH)
                if rnd.random() < 0.9:  # else: stored, then the broker died before the index write
                    index.add(queue, first, [max(stamps)])
                else:
                    index.invalidate()
            if rnd.random() < 0.05:
                queue.remove_before_index(min(queue.head, queue.tail + rnd.randrange(0, 25)))
            if rnd.random() < 0.04:
                with open(index.path, "ab") as f:
                    f.write(bytes(rnd.randrange(1, 16)))  # torn, or zeros: cut at load
                index.invalidate()
            if step % 16 == 15:
                targets = [now + rnd.randrange(-6000, 6000) for _ in range(12)] + [now + 10**6 + 1, 0]
                _check_index(index, queue, targets)
        index.flush()  # entries are buffered until a lookup or 256 wait
        assert os.path.getsize(index.path) % 16 == 0


def test_time_index_cuts_entries_a_crash_left_wrong(tmp_path: Path, tiny_segments: None) -> None:
    """An entry whose item says another time (items lost in a crash and written again)
    and an entry past head are cut at load; the items after the good ones are re-read."""
    now = 1_700_000_000_000
    with FanoutQueue(tmp_path / "p", data_page_size=4096) as queue:
        index = TimeIndex(queue.path)
        for k in range(12):
            stamps = [now + 100 * k, now + 100 * k - 50]
            index.add(queue, queue.enqueue(_raw_batch(stamps), 2, KIND_KAFKA_BATCH), [max(stamps)])
        index.flush()  # entries are buffered until a lookup or 256 wait
        good = os.path.getsize(index.path)
        for k in range(12, 15):  # stored, then the broker died before the index write
            queue.enqueue(_raw_batch([now + 100 * k]), 1, KIND_KAFKA_BATCH)
        with open(index.path, "ab") as f:
            f.write(struct.pack(">qq", now + 5000, 12))  # item 12 holds now + 1200, not now + 5000
            f.write(struct.pack(">qq", now + 6000, 40))  # no item 40
        index.invalidate()
        _check_index(index, queue, [now + 1050, now + 1101, now + 1201, now + 1400, now + 4999])
        index.flush()  # entries are buffered until a lookup or 256 wait
        assert os.path.getsize(index.path) == good + 3 * 16  # the two cut, items 12..14 indexed again
        assert _lookup(index, queue, now + 4999) is None


def test_time_index_compacts_entries_below_tail(tmp_path: Path, tiny_segments: None) -> None:
    """Once retention left the entries below tail most of the file, they are dropped."""
    now = 1_700_000_000_000
    with FanoutQueue(tmp_path / "p", data_page_size=4096) as queue:
        index = TimeIndex(queue.path)
        for k in range(64):  # timestamps in order: an entry per batch
            index.add(queue, queue.enqueue(_raw_batch([now + k]), 1, KIND_KAFKA_BATCH), [now + k])
        index.flush()  # entries are buffered until a lookup or 256 wait
        assert os.path.getsize(index.path) == 64 * 16
        queue.remove_before_index(60)
        index.add(queue, queue.enqueue(_raw_batch([now + 64]), 1, KIND_KAFKA_BATCH), [now + 64])
        index.flush()  # entries are buffered until a lookup or 256 wait
        assert os.path.getsize(index.path) == 9 * 16  # items 56..64: tail's segment (56..63) stays whole
        index.invalidate()
        index.catch_up(queue)
        index.flush()  # entries are buffered until a lookup or 256 wait
        assert os.path.getsize(index.path) == 9 * 16
        _check_index(index, queue, [0, now + 10, now + 62, now + 64, now + 65])
