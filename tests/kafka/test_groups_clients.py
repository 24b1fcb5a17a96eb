"""Consumer groups with real Kafka clients against a real broker subprocess.

Each consumer runs in its own process (so it can be SIGKILLed) and prints its
assignment as a JSON line after every poll; the test reads those lines.
Sessions: 6 s (Kafka's smallest by default), heartbeats every second.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests._broker import BrokerProcess

pytestmark = pytest.mark.timeout(180)

SESSION_MS = 6000
PARTITIONS = 4

KAFKA_PYTHON_MEMBER = """
import json, sys, time
from kafka import KafkaConsumer
consumer = KafkaConsumer(sys.argv[2], group_id=sys.argv[3], bootstrap_servers=sys.argv[1],
                         session_timeout_ms=SESSION_MS, heartbeat_interval_ms=1000, enable_auto_commit=False,
                         auto_offset_reset="earliest")
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    consumer.poll(timeout_ms=200)
    print(json.dumps(sorted(tp.partition for tp in consumer.assignment())), flush=True)
""".replace("SESSION_MS", str(SESSION_MS))

CONFLUENT_MEMBER = """
import json, sys, time
from confluent_kafka import Consumer
consumer = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[3],
                     "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 1000,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest"})
consumer.subscribe([sys.argv[2]])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    consumer.poll(0.2)
    print(json.dumps(sorted(tp.partition for tp in consumer.assignment())), flush=True)
""".replace("SESSION_MS", str(SESSION_MS))

#: A static member (group.instance.id = argv[4]).
CONFLUENT_STATIC_MEMBER = CONFLUENT_MEMBER.replace(
    '"group.id": sys.argv[3],', '"group.id": sys.argv[3], "group.instance.id": sys.argv[4],'
)

AIOKAFKA_MEMBER = """
import asyncio, json, sys, time
from aiokafka import AIOKafkaConsumer

async def main():
    consumer = AIOKafkaConsumer(sys.argv[2], group_id=sys.argv[3], bootstrap_servers=sys.argv[1],
                                session_timeout_ms=SESSION_MS, heartbeat_interval_ms=1000,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        await consumer.getmany(timeout_ms=200)
        print(json.dumps(sorted(tp.partition for tp in consumer.assignment())), flush=True)

asyncio.run(main())
""".replace("SESSION_MS", str(SESSION_MS))

MEMBERS = {"kafka-python": KAFKA_PYTHON_MEMBER, "confluent-kafka": CONFLUENT_MEMBER, "aiokafka": AIOKAFKA_MEMBER}


class Member:
    """A consumer in a child process; ``assignment`` is what it printed last."""

    def __init__(self, script: str, bootstrap: str, topic: str, group: str, log: Path, *extra: str) -> None:
        self.log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, bootstrap, topic, group, *extra], stdout=subprocess.PIPE, stderr=self.log
        )
        self.assignment: list[int] | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.assignment = json.loads(line)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def wait_for(condition: object, timeout_s: float, what: str, broker: BrokerProcess) -> float:
    """Seconds until ``condition()`` held; fails naming ``what`` (with the broker's log)."""
    t0 = time.monotonic()
    while not condition():  # type: ignore[operator]
        if time.monotonic() - t0 > timeout_s:
            pytest.fail(f"{what}: not within {timeout_s} s\n{broker.log()[-4000:]}")
        time.sleep(0.05)
    return time.monotonic() - t0


def create_topic(broker: BrokerProcess, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(15)


@pytest.mark.parametrize("client", sorted(MEMBERS))
def test_two_members_split_the_partitions_and_the_survivor_takes_a_killed_ones(
    broker: BrokerProcess, tmp_path: Path, client: str
) -> None:
    create_topic(broker, "split", PARTITIONS)
    everything = list(range(PARTITIONS))
    a = Member(MEMBERS[client], broker.bootstrap, "split", "g", tmp_path / "a.log")
    b = None
    try:
        wait_for(lambda: a.assignment == everything, 30, "the first member owns every partition", broker)
        b = Member(MEMBERS[client], broker.bootstrap, "split", "g", tmp_path / "b.log")

        def split() -> bool:
            x, y = a.assignment or [], b.assignment or []  # type: ignore[union-attr]
            return len(x) == len(y) == PARTITIONS // 2 and sorted(x + y) == everything

        wait_for(split, 30, "the two members split the partitions 2 + 2", broker)
        b.stop(signal.SIGKILL)
        took = wait_for(lambda: a.assignment == everything, SESSION_MS / 1000 + 10, "the survivor owns all", broker)
        # the killed member is noticed when its session ends, and the survivor hears of the
        # rebalance at its next heartbeat (1 s): nothing much before, nothing much after
        print(f"{client}: the survivor owned every partition {took:.1f} s after the kill")
        assert SESSION_MS / 1000 - 1.5 < took < SESSION_MS / 1000 + 5, took
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_members_of_different_clients_share_a_group(broker: BrokerProcess, tmp_path: Path) -> None:
    """kafka-python and confluent-kafka in one group: a protocol both support is chosen
    (range) and the leader's assignment reaches the other client."""
    create_topic(broker, "mixed", PARTITIONS)
    a = Member(KAFKA_PYTHON_MEMBER, broker.bootstrap, "mixed", "g", tmp_path / "a.log")
    b = Member(CONFLUENT_MEMBER, broker.bootstrap, "mixed", "g", tmp_path / "b.log")
    c = Member(AIOKAFKA_MEMBER, broker.bootstrap, "mixed", "g", tmp_path / "c.log")
    members = (a, b, c)
    try:

        def split() -> bool:
            owned = [m.assignment or [] for m in members]
            return all(owned) and sorted(p for o in owned for p in o) == list(range(PARTITIONS))

        wait_for(split, 45, "three clients split the partitions", broker)
    finally:
        for m in members:
            m.stop()


def test_a_restarted_static_member_gets_its_partitions_back_without_a_rebalance(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    create_topic(broker, "static", PARTITIONS)
    x = Member(CONFLUENT_STATIC_MEMBER, broker.bootstrap, "static", "g", tmp_path / "x.log", "x")
    y = Member(CONFLUENT_STATIC_MEMBER, broker.bootstrap, "static", "g", tmp_path / "y.log", "y")
    y2 = None
    try:
        wait_for(lambda: len(x.assignment or []) == len(y.assignment or []) == 2, 40, "x and y split", broker)
        xs, ys = x.assignment, y.assignment
        rebalances = broker.log().count("preparing to rebalance")
        y.stop(signal.SIGKILL)
        y2 = Member(CONFLUENT_STATIC_MEMBER, broker.bootstrap, "static", "g", tmp_path / "y2.log", "y")
        took = wait_for(lambda: y2.assignment == ys, 20, "the restarted y has its partitions", broker)  # type: ignore[union-attr]
        assert took < SESSION_MS / 1000  # before y's session could end: it took y's place
        time.sleep(SESSION_MS / 1000 + 1)  # past y's old session: nothing moves
        assert (x.assignment, y2.assignment) == (xs, ys)
        assert broker.log().count("preparing to rebalance") == rebalances, "a rebalance happened"
    finally:
        for m in (x, y, y2):
            if m is not None:
                m.stop()


def produce(broker: BrokerProcess, topic: str, n: int, *, batch: int) -> None:
    """``n`` records to partition 0, in batches of ``batch`` (each batch one item)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 10_000})
    for i in range(n):
        producer.produce(topic, value=b"%d" % i, partition=0)
        if (i + 1) % batch == 0 or i == n - 1:
            assert producer.flush(15) == 0


def test_kafka_python_commit_survives_a_broker_restart(broker: BrokerProcess) -> None:
    from kafka import KafkaConsumer, TopicPartition

    create_topic(broker, "kp", 1)
    produce(broker, "kp", 30, batch=10)

    def consumer() -> KafkaConsumer:
        return KafkaConsumer("kp", group_id="resume", bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=5000, session_timeout_ms=SESSION_MS,
                             heartbeat_interval_ms=1000)  # fmt: skip

    c = consumer()
    seen = []
    for m in c:
        seen.append(int(m.value))
        if len(seen) == 12:
            break
    c.commit({TopicPartition("kp", 0): _offset_and_metadata(12, "twelve")})
    c.close()
    assert seen == list(range(12))
    assert broker.stop() == 0
    broker.start()
    c = consumer()
    try:
        assert c.committed(TopicPartition("kp", 0)) == 12
        rest = [int(m.value) for m in c]
        assert rest == list(range(12, 30))
    finally:
        c.close()
    # the Thrift port sees the same group's committed position: the item holding offset 12
    # (a Thrift reader reads that batch again whole). Which item that is depends on how
    # librdkafka cut the batches, so it is looked up through Thrift by index.
    from clients.pack import decode_pack
    from idl import luxun_thrift as T

    thrift = broker.client()
    try:
        items = thrift.consume(T.ConsumeRequest(topic="kp", startIndex=0, maxFetchSize=1 << 20)).itemList
        holding = [i for i, item in enumerate(items) if b"12" in decode_pack(item)]
        assert len(holding) == 1, [decode_pack(item) for item in items]
        r = thrift.getCommitted(T.GetCommittedRequest(topic="kp", fanoutId="resume"))
        assert (r.committed, r.index) == (True, holding[0])
    finally:
        thrift.close()


def _offset_and_metadata(offset: int, metadata: str) -> object:
    from kafka.structs import OffsetAndMetadata

    try:
        return OffsetAndMetadata(offset, metadata, -1)
    except TypeError:  # kafka-python before 2.1: no leader epoch
        return OffsetAndMetadata(offset, metadata)  # type: ignore[call-arg]


def test_confluent_commit_survives_a_broker_restart(broker: BrokerProcess) -> None:
    from confluent_kafka import Consumer, TopicPartition

    create_topic(broker, "ck", 1)
    produce(broker, "ck", 30, batch=30)

    def consume(n: int) -> tuple[Consumer, list[int]]:
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "resume", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS})  # fmt: skip
        c.subscribe(["ck"])
        got: list[int] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(int(m.value()))
        return c, got

    c, got = consume(7)
    assert got == list(range(7))
    c.commit(offsets=[TopicPartition("ck", 0, 7)], asynchronous=False)
    c.close()
    assert broker.stop() == 0
    broker.start()
    c, got = consume(23)
    try:
        assert got == list(range(7, 30))
        (tp,) = c.committed([TopicPartition("ck", 0)], timeout=10)
        assert tp.offset == 7
    finally:
        c.close()


def test_groups_seen_by_the_admin_client(broker: BrokerProcess) -> None:
    from confluent_kafka import ConsumerGroupState, TopicPartition
    from confluent_kafka.admin import AdminClient

    create_topic(broker, "adm", 2)
    produce(broker, "adm", 3, batch=3)
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watched", "session.timeout.ms": SESSION_MS,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    c.subscribe(["adm"])
    deadline = time.monotonic() + 30
    while not c.assignment() and time.monotonic() < deadline:
        c.poll(0.2)
    c.commit(offsets=[TopicPartition("adm", 0, 2)], asynchronous=False)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listed = admin.list_consumer_groups().result(10)
    assert [(g.group_id, g.state) for g in listed.valid] == [("watched", ConsumerGroupState.STABLE)]
    described = admin.describe_consumer_groups(["watched"])["watched"].result(10)
    assert described.state == ConsumerGroupState.STABLE and len(described.members) == 1
    assert {tp.partition for tp in described.members[0].assignment.topic_partitions} == {0, 1}
    c.close()
    wait_for(lambda: _state(admin, "watched") == ConsumerGroupState.EMPTY, 10, "the group is empty", broker)
    offsets = admin.list_consumer_group_offsets([_request("watched")])["watched"].result(10)
    assert {(tp.topic, tp.partition, tp.offset) for tp in offsets.topic_partitions} == {("adm", 0, 2)}
    admin.delete_consumer_groups(["watched"])["watched"].result(10)
    assert admin.list_consumer_groups().result(10).valid == []


def _state(admin: object, group: str) -> object:
    return admin.describe_consumer_groups([group])[group].result(10).state  # type: ignore[attr-defined]


def _request(group: str) -> object:
    from confluent_kafka import ConsumerGroupTopicPartitions

    return ConsumerGroupTopicPartitions(group)


def test_aiokafka_commit_survives_a_broker_restart(broker: BrokerProcess) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition

    create_topic(broker, "ak", 1)
    produce(broker, "ak", 20, batch=5)
    tp = TopicPartition("ak", 0)

    async def consume(n: int, commit_at: int | None) -> tuple[list[int], int | None]:
        c = AIOKafkaConsumer("ak", group_id="resume", bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=SESSION_MS)  # fmt: skip
        await c.start()
        try:
            got: list[int] = []
            deadline = time.monotonic() + 30
            while len(got) < n and time.monotonic() < deadline:
                for records in (await c.getmany(timeout_ms=200)).values():
                    got.extend(int(r.value) for r in records)
            if commit_at is not None:
                await c.commit({tp: commit_at})
            return got, await c.committed(tp)
        finally:
            await c.stop()

    got, committed = asyncio.run(consume(20, commit_at=8))
    assert got == list(range(20)) and committed == 8
    assert broker.stop() == 0
    broker.start()
    got, committed = asyncio.run(consume(12, commit_at=None))
    assert committed == 8 and got == list(range(8, 20))


class RawClient:
    """Kafka requests of non-flexible versions over one socket (to hold a JoinGroup open)."""

    def __init__(self, broker: BrokerProcess) -> None:
        import socket

        self.sock = socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=30)
        self.correlation = 0

    def send(self, api: int, version: int, **values: object) -> None:
        import io
        import struct

        from kio.index import load_request_schema
        from kio.serial import entity_writer

        from luxun.kafka.protocol import build

        request = build(load_request_schema(api, version), **values)
        body = io.BytesIO()
        entity_writer(type(request))(body, request)
        self.correlation += 1
        header = struct.pack(">hhih", api, version, self.correlation, 3) + b"raw"
        frame = header + body.getvalue()
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)

    def receive(self, api: int, version: int) -> object:
        import struct

        from kio.index import load_response_schema
        from kio.serial import entity_reader

        def exactly(n: int) -> bytes:
            data = b""
            while len(data) < n:
                chunk = self.sock.recv(n - len(data))
                if not chunk:
                    raise ConnectionError("closed by the broker")
                data += chunk
            return data

        (size,) = struct.unpack(">i", exactly(4))
        frame = exactly(size)
        return entity_reader(load_response_schema(api, version))(frame, 4)[0]

    def join(self, member: str = "") -> object:
        self.send(11, 5, group_id="held", session_timeout=30_000, rebalance_timeout=60_000, member_id=member,
                  protocol_type="consumer", protocols=[{"name": "range", "metadata": b""}])  # fmt: skip
        return self.receive(11, 5)


def test_broker_stop_answers_a_waiting_join_group(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True, metrics=True).start()
    try:
        a, b = RawClient(broker), RawClient(broker)
        first = a.join()
        a_joined = a.join(first.member_id)  # type: ignore[attr-defined]
        assert a_joined.error_code == 0 and a_joined.generation_id == 1  # type: ignore[attr-defined]
        b_id = b.join().member_id  # type: ignore[attr-defined]
        b.send(11, 5, group_id="held", session_timeout=30_000, rebalance_timeout=60_000, member_id=b_id,
               protocol_type="consumer", protocols=[{"name": "range", "metadata": b""}])  # fmt: skip
        time.sleep(0.5)  # b's JoinGroup now waits for a to rejoin (up to 60 s)
        page = broker.metrics_page()
        assert 'luxun_kafka_groups{state="PreparingRebalance"} 1' in page
        assert "luxun_kafka_group_rebalances_total 1" in page
        t0 = time.monotonic()
        assert broker.stop() == 0
        print(f"stop took {time.monotonic() - t0:.2f} s")
        assert time.monotonic() - t0 < 10
        try:
            answer = b.receive(11, 5)
            print("answered", answer.error_code)  # type: ignore[attr-defined]
            assert answer.error_code == 15  # type: ignore[attr-defined]  # COORDINATOR_NOT_AVAILABLE
        except ConnectionError:
            pass  # closed before the answer went out: the client looks for the coordinator again
    finally:
        broker.stop()


def test_a_commit_survives_a_broker_killed_with_sigkill(broker: BrokerProcess) -> None:
    """The committed offset is in the topic's mapped committed page once OffsetCommit is
    answered: a kill -9 of the broker right after loses nothing."""
    from confluent_kafka import Consumer, TopicPartition

    create_topic(broker, "crash", 2)
    produce(broker, "crash", 10, batch=4)  # partition 0: items of 4, 4 and 2 records
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "crash", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("crash", 0, 6), TopicPartition("crash", 1, 0)], asynchronous=False)
    c.close()
    broker.stop(signal.SIGKILL)
    broker.start()
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "crash", "enable.auto.commit": False})
    try:
        committed = c.committed([TopicPartition("crash", 0), TopicPartition("crash", 1)], timeout=10)
        assert [(tp.partition, tp.offset) for tp in committed] == [(0, 6), (1, 0)]
    finally:
        c.close()
