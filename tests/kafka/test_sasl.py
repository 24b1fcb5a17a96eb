"""SASL on the Kafka port (Issue 30, item 6): PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 with
confluent-kafka, kafka-python and aiokafka; raw frames before and after logging in; admin-only
topic and group deletion and creation; start refused on a non-loopback address without SASL.

One broker with SASL on serves the module (users made with ``luxun kafka-user add``): alice is
an admin, bob a plain user. Before SASL existed every test here failed: the clients could not
log in (SaslHandshake closed the connection), a Produce before any login was stored, bob could
create and delete, and a Kafka port on 0.0.0.0 started.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib
import logging
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema

from luxun.config import BrokerConfig, ConfigError
from tests._broker import BrokerProcess, free_port
from tests.kafka._kafka import RawClient, metadata_request, produce_request, read_frame, record_batch, request

pytestmark = pytest.mark.timeout(120)

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
ALICE = ("alice", "alice-secret")  # admin
BOB = ("bob", "bob-secret")  # user
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58
UNKNOWN_TOPIC_OR_PARTITION = 3


def _kafka_user(users: Path, *args: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    """``luxun kafka-user ...`` with ``password`` on stdin."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(
        [sys.executable, "-m", "luxun.cli", "kafka-user", *args, "--users-file", str(users)],
        input=None if password is None else password + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def _kafka_acl(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``luxun kafka-acl ...`` on the ACL file of ``data_dir``."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(
        [sys.executable, "-m", "luxun.cli", "kafka-acl", *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with PLAIN and both SCRAMs on its Kafka port and topic deletion enabled; bob
    may read and write every topic and read every group (ACLs made by ``luxun kafka-acl``)."""
    tmp = tmp_path_factory.mktemp("sasl")
    users = tmp / "users.txt"
    for (name, password), role in ((ALICE, ["--admin"]), (BOB, [])):
        done = _kafka_user(users, "add", name, *role, password=password)
        assert done.returncode == 0, done.stderr
    assert password_free(users.read_text())
    for grant in (
        ["--topic", "*", "--operation", "READ", "--operation", "WRITE"],
        ["--group", "*", "--operation", "READ"],
    ):
        done = _kafka_acl(tmp / "data", "add", "--principal", "User:bob", *grant)
        assert done.returncode == 0, done.stderr
    props = tmp / "server.properties"
    props.write_text(
        f"delete.topic.enable=true\nkafka.sasl.mechanisms={','.join(MECHANISMS)}\nkafka.sasl.users.file={users}\n"
    )
    broker = BrokerProcess(tmp / "data", tmp / "broker.log", "--config", str(props), kafka=True).start()
    broker.users_file = users  # type: ignore[attr-defined]
    try:
        yield broker
    finally:
        broker.stop()


def password_free(text: str) -> bool:
    """The users file holds no password, only salted SCRAM credentials."""
    return all(secret not in text for _, secret in (ALICE, BOB)) and "SCRAM-SHA-256=4096:" in text


# -- raw frames -------------------------------------------------------------------------------
def _plain(user: tuple[str, str]) -> bytes:
    return b"\0" + user[0].encode() + b"\0" + user[1].encode()


def _login(port: int, user: tuple[str, str]) -> RawClient:
    """A raw connection logged in with PLAIN (SaslHandshake v1, SaslAuthenticate v2)."""
    client = RawClient(port)
    shake = client.call(request(17, 1, mechanism="PLAIN"))
    assert shake.error_code == 0, shake
    auth = client.call(request(36, 2, auth_bytes=_plain(user)))
    assert auth.error_code == 0, auth
    return client


def _wait_for_log(broker: BrokerProcess, text: str, timeout_s: float = 10.0) -> int:
    """How many lines of the broker's log hold ``text``, once one does (0 after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        count = sum(text in line for line in broker.log().splitlines())
        if count or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def test_api_versions_is_answered_before_login_and_announces_the_sasl_apis(sasl_broker: BrokerProcess) -> None:
    with RawClient(sasl_broker.kafka_port) as client:
        versions = client.call(request(18, 3, client_software_name="t", client_software_version="1"))
        ranges = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert versions.error_code == 0
        assert (ranges[17], ranges[36]) == ((0, 1), (0, 2))
        shake = client.call(request(17, 1, mechanism="SCRAM-SHA-512"))
        assert (shake.error_code, list(shake.mechanisms)) == (0, list(MECHANISMS))


@pytest.mark.parametrize("what", ["produce", "metadata"])
def test_a_request_before_login_closes_the_connection_with_one_log_line(sasl_broker: BrokerProcess, what: str) -> None:
    topic = f"early-{what}"
    with _login(sasl_broker.kafka_port, ALICE) as admin:  # the topic exists: only the login is missing
        assert admin.call(metadata_request(topic)).topics[0].error_code == 0
    entity = produce_request(topic, 0, record_batch([b"sneaky"])) if what == "produce" else metadata_request(topic)
    with RawClient(sasl_broker.kafka_port) as client:
        client.send(entity)
        assert client.closed_by_broker(), "the broker answered a request sent before logging in"
    name = "Produce (API 0)" if what == "produce" else "Metadata (API 3)"
    assert _wait_for_log(sasl_broker, f"{name} before SASL authentication") == 1
    with _login(sasl_broker.kafka_port, BOB) as reader:
        fetch = reader.call(_fetch_request(topic))
        assert fetch.responses[0].partitions[0].high_watermark == 0  # nothing was stored


def _fetch_request(topic: str) -> Any:
    """A Fetch v4 of partition 0 of ``topic`` from offset 0."""
    schema = load_request_schema(1, 4)
    module = importlib.import_module(schema.__module__)
    part = module.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
    return schema(
        replica_id=-1,
        max_wait=datetime.timedelta(0),
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=(module.FetchTopic(topic=topic, partitions=(part,)),),
    )


def test_an_unknown_mechanism_is_refused_with_the_enabled_ones(sasl_broker: BrokerProcess) -> None:
    with RawClient(sasl_broker.kafka_port) as client:
        shake = client.call(request(17, 1, mechanism="GSSAPI"))
        assert (shake.error_code, list(shake.mechanisms)) == (UNSUPPORTED_SASL_MECHANISM, list(MECHANISMS))
        assert client.closed_by_broker()


def test_sasl_authenticate_before_the_handshake_is_an_illegal_state(sasl_broker: BrokerProcess) -> None:
    with RawClient(sasl_broker.kafka_port) as client:
        auth = client.call(request(36, 1, auth_bytes=_plain(ALICE)))
        assert auth.error_code == ILLEGAL_SASL_STATE and "SaslHandshake" in auth.error_message
        assert client.closed_by_broker()


def test_a_wrong_password_answers_sasl_authentication_failed_then_closes(sasl_broker: BrokerProcess) -> None:
    for user in [(ALICE[0], "wrong"), ("nobody", ALICE[1])]:
        with RawClient(sasl_broker.kafka_port) as client:
            assert client.call(request(17, 1, mechanism="PLAIN")).error_code == 0
            auth = client.call(request(36, 2, auth_bytes=_plain(user)))
            assert (auth.error_code, auth.error_message) == (
                SASL_AUTHENTICATION_FAILED,
                "Authentication failed: Invalid username or password",
            )
            assert client.closed_by_broker()


def test_a_login_then_sasl_requests_again_answer_illegal_state_and_the_connection_goes_on(
    sasl_broker: BrokerProcess,
) -> None:
    with _login(sasl_broker.kafka_port, ALICE) as client:
        assert client.call(request(17, 1, mechanism="PLAIN")).error_code == ILLEGAL_SASL_STATE
        assert client.call(request(36, 2, auth_bytes=_plain(ALICE))).error_code == ILLEGAL_SASL_STATE
        response = client.call(produce_request("after-login", 0, record_batch([b"a", b"b"])))
        assert response.responses[0].partition_responses[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert client.call(metadata_request("after-login")).topics[0].error_code == 0  # alice may create it
        response = client.call(produce_request("after-login", 0, record_batch([b"a", b"b"])))
        assert response.responses[0].partition_responses[0].error_code == 0


def test_the_legacy_v0_handshake_takes_bare_tokens(sasl_broker: BrokerProcess) -> None:
    """SaslHandshake v0: the tokens follow as bare size-prefixed frames (Kafka before 1.0)."""
    with RawClient(sasl_broker.kafka_port) as client:
        assert client.call(request(17, 0, mechanism="PLAIN")).error_code == 0
        token = _plain(BOB)
        client.sock.sendall(struct.pack(">i", len(token)) + token)
        assert read_frame(client.sock) == b""  # PLAIN's empty answer
        assert client.call(metadata_request("legacy-unknown", version=4)).topics[0].error_code == (
            TOPIC_AUTHORIZATION_FAILED  # logged in as bob, who may not auto-create
        )
    with RawClient(sasl_broker.kafka_port) as client:
        assert client.call(request(17, 0, mechanism="PLAIN")).error_code == 0
        token = _plain((BOB[0], "wrong"))
        client.sock.sendall(struct.pack(">i", len(token)) + token)
        assert client.closed_by_broker()


def _create_topics(name: str, partitions: int = 1) -> Any:
    schema = request(19, 4, topics=(), timeout=datetime.timedelta(seconds=10), validate_only=False)
    module = importlib.import_module(type(schema).__module__)
    topic = module.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=1, assignments=(), configs=()
    )
    return type(schema)(topics=(topic,), timeout=schema.timeout, validate_only=False)


def test_without_create_or_delete_acls_only_an_admin_creates_and_deletes_topics_and_deletes_groups(
    sasl_broker: BrokerProcess,
) -> None:
    with _login(sasl_broker.kafka_port, BOB) as bob, _login(sasl_broker.kafka_port, ALICE) as alice:
        created = bob.call(_create_topics("bobs"))
        assert created.topics[0].error_code == TOPIC_AUTHORIZATION_FAILED
        assert created.topics[0].error_message == "Authorization failed."
        assert bob.call(metadata_request("bobs")).topics[0].error_code == TOPIC_AUTHORIZATION_FAILED
        every = alice.call(request(3, 4, topics=None, allow_auto_topic_creation=False)).topics
        assert "bobs" not in [t.name for t in every]

        assert alice.call(_create_topics("alices", 2)).topics[0].error_code == 0
        deleted = bob.call(request(20, 4, topic_names=("alices",), timeout=datetime.timedelta(seconds=10)))
        assert deleted.responses[0].error_code == TOPIC_AUTHORIZATION_FAILED
        assert bob.call(metadata_request("alices")).topics[0].error_code == 0  # still there, and bob sees it

        groups = bob.call(request(42, 2, groups_names=("g1", "g2")))
        assert [(r.group_id, r.error_code) for r in groups.results] == [
            ("g1", GROUP_AUTHORIZATION_FAILED),
            ("g2", GROUP_AUTHORIZATION_FAILED),
        ]
        assert alice.call(request(42, 2, groups_names=("g1",))).results[0].error_code == 69  # GROUP_ID_NOT_FOUND
        deleted = alice.call(request(20, 4, topic_names=("alices",), timeout=datetime.timedelta(seconds=10)))
        assert deleted.responses[0].error_code == 0


def test_the_users_file_is_read_again_when_it_changes(sasl_broker: BrokerProcess) -> None:
    users: Path = sasl_broker.users_file  # type: ignore[attr-defined]
    with RawClient(sasl_broker.kafka_port) as client:
        client.call(request(17, 1, mechanism="PLAIN"))
        assert client.call(request(36, 2, auth_bytes=_plain(("carol", "c")))).error_code == SASL_AUTHENTICATION_FAILED
    done = _kafka_user(users, "add", "carol", password="carol-secret")
    assert done.returncode == 0, done.stderr
    assert "carol user SCRAM-SHA-256,SCRAM-SHA-512" in _kafka_user(users, "list").stdout
    with _login(sasl_broker.kafka_port, ("carol", "carol-secret")):
        pass
    assert _kafka_user(users, "remove", "carol").returncode == 0
    with RawClient(sasl_broker.kafka_port) as client:
        client.call(request(17, 1, mechanism="PLAIN"))
        auth = client.call(request(36, 2, auth_bytes=_plain(("carol", "carol-secret"))))
        assert auth.error_code == SASL_AUTHENTICATION_FAILED


# -- the three clients ------------------------------------------------------------------------------
def _confluent(broker: BrokerProcess, mechanism: str, user: tuple[str, str]) -> dict[str, Any]:
    return {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user[0],
        "sasl.password": user[1],
    }


def _python_conf(broker: BrokerProcess, mechanism: str, user: tuple[str, str]) -> dict[str, Any]:
    """kafka-python's and aiokafka's settings (the same names)."""
    return {
        "bootstrap_servers": broker.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user[0],
        "sasl_plain_password": user[1],
    }


VALUES = [b"v%d" % i for i in range(5)]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka(sasl_broker: BrokerProcess, mechanism: str) -> None:
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    topic = f"confluent-{mechanism}"
    producer = Producer(_confluent(sasl_broker, mechanism, ALICE))
    for value in VALUES:
        producer.produce(topic, value)
    assert producer.flush(20) == 0
    consumer = Consumer(
        {**_confluent(sasl_broker, mechanism, BOB), "group.id": f"g-{topic}", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < len(VALUES) and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(m.value())
        assert got == VALUES
    finally:
        consumer.close()

    errors: list[Any] = []
    refused = Producer({**_confluent(sasl_broker, mechanism, (ALICE[0], "wrong")), "error_cb": errors.append})
    deadline = time.monotonic() + 20
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
        refused.poll(0.2)
    auth = [e.str() for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert auth and "Authentication failed" in auth[0], errors


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python(sasl_broker: BrokerProcess, mechanism: str, caplog: pytest.LogCaptureFixture) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import KafkaError

    topic = f"kafka-python-{mechanism}"
    producer = KafkaProducer(**_python_conf(sasl_broker, mechanism, ALICE), request_timeout_ms=10_000)
    try:
        for value in VALUES:
            producer.send(topic, value).get(10)
    finally:
        producer.close()
    consumer = KafkaConsumer(**_python_conf(sasl_broker, mechanism, BOB), enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < len(VALUES) and time.monotonic() < deadline:
            got.extend(m.value for m in consumer.poll(500).get(tp, []))
        assert got == VALUES
    finally:
        consumer.close()

    with caplog.at_level(logging.ERROR, logger="kafka"), pytest.raises(KafkaError):
        KafkaProducer(**_python_conf(sasl_broker, mechanism, (ALICE[0], "wrong")), bootstrap_timeout_ms=10_000)
    assert "SaslAuthenticationFailedError" in caplog.text and "Authentication failed" in caplog.text


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_aiokafka(sasl_broker: BrokerProcess, mechanism: str, caplog: pytest.LogCaptureFixture) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError

    topic = f"aiokafka-{mechanism}"

    async def round_trip() -> list[bytes]:
        producer = AIOKafkaProducer(**_python_conf(sasl_broker, mechanism, ALICE), request_timeout_ms=10_000)
        await producer.start()
        try:
            for value in VALUES:
                await producer.send_and_wait(topic, value)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, **_python_conf(sasl_broker, mechanism, BOB), auto_offset_reset="earliest", group_id=None
        )
        await consumer.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(20):
                while len(got) < len(VALUES):
                    for messages in (await consumer.getmany(timeout_ms=500)).values():
                        got.extend(m.value for m in messages)
        finally:
            await consumer.stop()
        return got

    async def wrong_password() -> None:
        producer = AIOKafkaProducer(**_python_conf(sasl_broker, mechanism, (ALICE[0], "wrong")))
        try:
            await producer.start()
        finally:
            await producer.stop()

    assert asyncio.run(round_trip()) == VALUES
    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(KafkaConnectionError):
        asyncio.run(wrong_password())
    assert "SaslAuthenticationFailed" in caplog.text and "Authentication failed" in caplog.text


def test_confluent_admin_client_of_a_plain_user_is_refused(sasl_broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    bob = AdminClient(_confluent(sasl_broker, "SCRAM-SHA-256", BOB))
    with pytest.raises(KafkaException) as refused:
        bob.create_topics([NewTopic("admin-made", num_partitions=1, replication_factor=1)])["admin-made"].result(10)
    assert refused.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED"
    alice = AdminClient(_confluent(sasl_broker, "SCRAM-SHA-256", ALICE))
    alice.create_topics([NewTopic("admin-made", num_partitions=1, replication_factor=1)])["admin-made"].result(10)
    with pytest.raises(KafkaException) as refused:
        bob.delete_topics(["admin-made"])["admin-made"].result(10)
    assert refused.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED"
    alice.delete_topics(["admin-made"])["admin-made"].result(10)


# -- SASL off ------------------------------------------------------------------------------------
def test_with_sasl_off_sasl_requests_answer_illegal_state(broker: BrokerProcess) -> None:
    with RawClient(broker.kafka_port) as client:
        assert client.call(request(17, 1, mechanism="PLAIN")).error_code == ILLEGAL_SASL_STATE
        auth = client.call(request(36, 2, auth_bytes=_plain(ALICE)))
        assert auth.error_code == ILLEGAL_SASL_STATE and "kafka.sasl.mechanisms" in auth.error_message
        assert client.call(metadata_request("open")).topics[0].error_code == 0  # no login needed


# -- starting ------------------------------------------------------------------------------------
def _serve(tmp_path: Path, properties: str) -> subprocess.CompletedProcess[str]:
    """``luxun serve --config`` with ``properties``, expected to refuse to start."""
    props = tmp_path / "server.properties"
    props.write_text(properties)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "luxun.cli", "serve", "--config", str(props), "--data-dir", str(tmp_path / "data"),
           "--port", str(free_port()), "--metrics-port", "0"]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, check=False)


def test_start_is_refused_on_a_non_loopback_address_without_sasl(tmp_path: Path) -> None:
    """Refused before anything binds: the Kafka port is held by another socket (on 127.0.0.1, so
    0.0.0.0 cannot bind it either), and the refusal names authentication, not the port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = _serve(tmp_path, f"kafka.port={port}\nkafka.host=0.0.0.0\n")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "luxun: the Kafka port would listen on 0.0.0.0 without authentication"
    )
    assert "kafka.allow.unauthenticated=true" in lines[0]
    assert not (tmp_path / "data").exists()


def test_start_is_refused_with_a_bad_users_file(tmp_path: Path) -> None:
    users = tmp_path / "users.txt"
    users.write_text("# users\nalice admin SCRAM-SHA-256=4096:bm90:bm90:bm90\n")
    done = _serve(tmp_path, f"kafka.port={free_port()}\nkafka.sasl.mechanisms=PLAIN\nkafka.sasl.users.file={users}\n")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"luxun: kafka.sasl.users.file: {users}, line 2: user 'alice': SCRAM-SHA-256: an empty salt, or keys "
        "that are not 32 bytes"
    ]


@pytest.mark.parametrize(
    ("values", "refusal"),
    [
        ({"kafka_host": "0.0.0.0"}, "would listen on 0.0.0.0 without authentication"),
        ({"host": "::", "kafka_host": ""}, "would listen on :: without authentication"),
        ({"kafka_host": "broker.example"}, "would listen on broker.example without authentication"),
        ({"kafka_sasl_mechanisms": ("PLAIN",)}, "kafka.sasl.users.file is not"),
        ({"kafka_sasl_users_file": "u.txt"}, "kafka.sasl.mechanisms is not"),
        ({"kafka_sasl_mechanisms": "PLAIN,GSSAPI", "kafka_sasl_users_file": "u"}, "unknown SASL mechanism 'GSSAPI'"),
    ],
)
def test_config_refusals(values: dict[str, Any], refusal: str) -> None:
    with pytest.raises(ConfigError, match=refusal):
        BrokerConfig(kafka_port=9094, metrics_port=0, **values)


def test_config_allows_loopback_sasl_or_an_explicit_opt_out() -> None:
    assert BrokerConfig(kafka_port=9094, metrics_port=0).kafka_sasl_mechanisms == ()
    BrokerConfig(kafka_port=9094, metrics_port=0, kafka_host="::1")
    BrokerConfig(kafka_port=9094, metrics_port=0, kafka_host="localhost")
    BrokerConfig(kafka_port=9094, metrics_port=0, kafka_host="0.0.0.0", kafka_allow_unauthenticated=True)
    BrokerConfig(port=9092, kafka_port=0, host="0.0.0.0", metrics_port=0)  # no Kafka port: nothing to refuse
    config = BrokerConfig.from_properties(
        {"kafka.port": "9094", "kafka.host": "0.0.0.0", "kafka.sasl.mechanisms": " scram-sha-512, PLAIN,PLAIN ",
         "kafka.sasl.users.file": "users.txt", "metrics.port": "0"}
    )  # fmt: skip
    assert config.kafka_sasl_mechanisms == ("SCRAM-SHA-512", "PLAIN")
