"""ACLs, authorized operations and SCRAM credential APIs on the Kafka port (issue 32).

Real brokers, real clients: confluent-kafka's AdminClient, Producer and Consumer, and
kafka-python's KafkaAdminClient. One broker with SASL on serves the module: alice is an
admin (a super user), bob and carol plain users with no ACL at first
(``allow.everyone.if.no.acl.found`` is false: they may do nothing). Before this change
every test here failed: the ACL and SCRAM APIs were not served, any logged-in user could
produce and consume, and authorized operations were never answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from luxun.kafka.acls import ACL_FILE
from tests._broker import BrokerProcess
from tests.kafka._kafka import RawClient, request
from tests.kafka.test_sasl import _confluent, _kafka_acl, _kafka_user, _login, _python_conf

pytestmark = pytest.mark.timeout(180)

CLUSTER_AUTHORIZATION_FAILED = 31
SECURITY_DISABLED = 54
SASL_AUTHENTICATION_FAILED = 58
MECHANISMS = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
ALICE = ("alice", "alice-secret")  # admin
BOB = ("bob", "bob-secret")
CAROL = ("carol", "carol-secret")
TOPIC_OPERATIONS = {"READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
CLUSTER_OPERATIONS = {"CREATE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "ALTER",
                      "DESCRIBE"}  # fmt: skip


def _start(tmp: Path, *extra: str) -> BrokerProcess:
    users = tmp / "users.txt"
    if not users.exists():
        for (name, password), role in ((ALICE, ["--admin"]), (BOB, []), (CAROL, [])):
            done = _kafka_user(users, "add", name, *role, password=password)
            assert done.returncode == 0, done.stderr
    props = tmp / "server.properties"
    props.write_text(
        f"delete.topic.enable=true\nkafka.sasl.mechanisms={MECHANISMS}\nkafka.sasl.users.file={users}\n"
        + "".join(f"{line}\n" for line in extra)
    )
    broker = BrokerProcess(tmp / "data", tmp / "broker.log", "--config", str(props), kafka=True).start()
    broker.users_file = users  # type: ignore[attr-defined]
    return broker


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = _start(tmp_path_factory.mktemp("acls"))
    try:
        yield broker
    finally:
        broker.stop()


def _admin(broker: BrokerProcess, user: tuple[str, str], mechanism: str = "SCRAM-SHA-256") -> AdminClient:
    return AdminClient(_confluent(broker, mechanism, user))


def _names(operations: Any) -> set[str]:
    return {op.name for op in operations or ()}


def _error_name(future: Any) -> str:
    with pytest.raises(KafkaException) as failed:
        future.result(15)
    return str(failed.value.args[0].name())


def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _binding(name: str, principal: str, op: AclOperation, *, pattern: ResourcePatternType = ResourcePatternType.LITERAL,
             permission: AclPermissionType = AclPermissionType.ALLOW,
             rtype: ResourceType = ResourceType.TOPIC) -> AclBinding:  # fmt: skip
    return AclBinding(rtype, name, pattern, principal, "*", op, permission)


def _create_acls(admin: AdminClient, *bindings: AclBinding) -> None:
    for future in admin.create_acls(list(bindings)).values():
        future.result(15)


def _create_topic(admin: AdminClient, name: str) -> None:
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name].result(15)


def _describe_all_acls() -> Any:
    """A DescribeAcls v1 request of every binding (all filters ANY)."""
    return request(29, 1, resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                   principal_filter=None, host_filter=None, operation=1, permission_type=1)  # fmt: skip


# -- SASL off: no authorizer ----------------------------------------------------------------------
def test_with_sasl_off_acl_apis_answer_security_disabled_and_every_operation_is_authorized(
    broker: BrokerProcess,
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    with RawClient(broker.kafka_port) as client:
        described = client.call(_describe_all_acls())
        assert described.error_code == SECURITY_DISABLED
        deleted = client.call(request(31, 1, filters=()))
        assert deleted.filter_results == ()
    binding = _binding("t", "User:bob", AclOperation.READ)
    assert _error_name(admin.create_acls([binding])[binding]) == "SECURITY_DISABLED"
    _create_topic(admin, "ops-off")
    described = admin.describe_topics(TopicCollection(["ops-off"]), include_authorized_operations=True)
    assert _names(described["ops-off"].result(15).authorized_operations) == TOPIC_OPERATIONS  # librdkafka 0081's 8
    plain = admin.describe_topics(TopicCollection(["ops-off"]), include_authorized_operations=False)
    assert plain["ops-off"].result(15).authorized_operations is None
    cluster = admin.describe_cluster(include_authorized_operations=True).result(15)
    assert _names(cluster.authorized_operations) == CLUSTER_OPERATIONS
    assert admin.describe_cluster().result(15).authorized_operations is None


def test_with_sasl_off_scram_credentials_are_kept_for_when_it_is_on(tmp_path: Path) -> None:
    """As librdkafka's 0081 asks of a plaintext broker: the credential APIs work (Kafka keeps
    credentials whatever its listeners); they land in the data dir's .luxun-kafka-users, and a
    broker with SASL on that names that file logs the user in."""
    from luxun.kafka.sasl import SCRAM_STORE

    plain = BrokerProcess(tmp_path / "data", tmp_path / "plain.log", kafka=True).start()
    try:
        admin = AdminClient({"bootstrap.servers": plain.bootstrap})
        missing = admin.describe_user_scram_credentials(["gina"])["gina"]
        assert _error_name(missing) == "RESOURCE_NOT_FOUND"
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        for future in admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("gina", info, b"gina-secret")]
        ).values():
            future.result(15)
        described = admin.describe_user_scram_credentials(["gina"])["gina"].result(15)
        assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
            (ScramMechanism.SCRAM_SHA_512, 4096)
        ]
    finally:
        plain.stop()
    store = tmp_path / "data" / SCRAM_STORE
    assert "gina" in store.read_text()
    props = tmp_path / "sasl.properties"
    props.write_text(f"kafka.sasl.mechanisms=SCRAM-SHA-512\nkafka.sasl.users.file={store}\n")
    sasl = BrokerProcess(tmp_path / "data", tmp_path / "sasl.log", "--config", str(props), kafka=True).start()
    try:
        _admin(sasl, ("gina", "gina-secret"), "SCRAM-SHA-512").list_topics(timeout=10)  # logs in
    finally:
        sasl.stop()


# -- the ACL APIs ---------------------------------------------------------------------------------
def test_confluent_admin_creates_describes_and_deletes_acls_with_kafkas_filters(acl_broker: BrokerProcess) -> None:
    alice = _admin(acl_broker, ALICE)
    literal = _binding("crud-orders", "User:bob", AclOperation.READ)
    prefixed = _binding("crud-", "User:bob", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED)
    group = _binding("crud-group", "User:*", AclOperation.READ, rtype=ResourceType.GROUP)
    _create_acls(alice, literal, prefixed, group)

    def described(name: str | None, pattern: ResourcePatternType, rtype: ResourceType = ResourceType.ANY) -> set[Any]:
        f = AclBindingFilter(rtype, name, pattern, None, None, AclOperation.ANY, AclPermissionType.ANY)
        return set(alice.describe_acls(f).result(15))

    assert {literal, prefixed, group} <= described(None, ResourcePatternType.ANY)
    assert described("crud-orders", ResourcePatternType.MATCH, ResourceType.TOPIC) == {literal, prefixed}
    assert described("crud-orders", ResourcePatternType.LITERAL) == {literal}
    assert described("crud-", ResourcePatternType.PREFIXED) == {prefixed}
    assert described(None, ResourcePatternType.ANY, ResourceType.GROUP) >= {group}

    bad = AclBinding(ResourceType.BROKER, "not-the-cluster", ResourcePatternType.LITERAL, "User:bob", "*",
                     AclOperation.ALTER, AclPermissionType.ALLOW)  # fmt: skip
    assert _error_name(alice.create_acls([bad])[bad]) == "INVALID_REQUEST"

    by_pattern = AclBindingFilter(ResourceType.TOPIC, "crud-orders", ResourcePatternType.MATCH, "User:bob", None,
                                  AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    assert set(alice.delete_acls([by_pattern])[by_pattern].result(15)) == {literal, prefixed}
    assert described("crud-orders", ResourcePatternType.MATCH, ResourceType.TOPIC) == set()
    everything = AclBindingFilter(ResourceType.GROUP, "crud-group", ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    assert alice.delete_acls([everything])[everything].result(15) == [group]


def test_a_user_without_cluster_acls_is_refused_the_acl_and_credential_apis(acl_broker: BrokerProcess) -> None:
    bob = _admin(acl_broker, BOB)
    any_acl = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                               AclPermissionType.ANY)  # fmt: skip
    with _login(acl_broker.kafka_port, BOB) as raw:  # librdkafka drops DescribeAcls' top-level error
        assert raw.call(_describe_all_acls()).error_code == CLUSTER_AUTHORIZATION_FAILED
    binding = _binding("mine", "User:bob", AclOperation.ALL)
    assert _error_name(bob.create_acls([binding])[binding]) == "CLUSTER_AUTHORIZATION_FAILED"
    assert _error_name(bob.delete_acls([any_acl])[any_acl]) == "CLUSTER_AUTHORIZATION_FAILED"
    with _login(acl_broker.kafka_port, BOB) as raw:  # (confluent-kafka 2.16 crashes on this answer's error)
        assert raw.call(request(50, 0, users=None)).error_code == CLUSTER_AUTHORIZATION_FAILED


def test_kafka_python_admin_client_acl_calls(acl_broker: BrokerProcess) -> None:
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as PyResourceType

    admin = KafkaAdminClient(**_python_conf(acl_broker, "PLAIN", ALICE), request_timeout_ms=15000)
    try:
        acl = ACL("User:carol", "*", ACLOperation.DESCRIBE, ACLPermissionType.ALLOW,
                  ResourcePattern(PyResourceType.TOPIC, "kp-", ACLResourcePatternType.PREFIXED))  # fmt: skip
        created = admin.create_acls([acl])
        assert created["failed"] == [] and len(created["succeeded"]) == 1
        pattern = ResourcePatternFilter(PyResourceType.TOPIC, "kp-x", ACLResourcePatternType.MATCH)
        wanted = ACLFilter("User:carol", None, ACLOperation.ANY, ACLPermissionType.ANY, pattern)
        found, error = admin.describe_acls(wanted)
        assert error.errno == 0
        assert [(a.principal, a.operation, a.resource_pattern.resource_name) for a in found] == [
            ("User:carol", ACLOperation.DESCRIBE, "kp-")
        ]
        [(_, deleted, error)] = admin.delete_acls([wanted])
        assert error.errno == 0 and [a.resource_pattern.resource_name for a in deleted] == ["kp-"]
    finally:
        admin.close()


# -- enforcement -------------------------------------------------------------------------------------
def test_producers_and_consumers_are_denied_then_allowed_by_acls_and_deny_wins(acl_broker: BrokerProcess) -> None:
    alice = _admin(acl_broker, ALICE)
    topic, group = "enforced-orders", "enforced-group"
    _create_topic(alice, topic)
    settings = _confluent(acl_broker, "SCRAM-SHA-512", CAROL) | {"enable.idempotence": False, "retries": 0}
    producer = Producer(settings)
    reports: list[Any] = []

    def send(value: bytes) -> Any:
        reports.clear()
        producer.produce(topic, value, on_delivery=lambda err, msg: reports.append(err))
        producer.flush(15)
        assert len(reports) == 1
        return reports[0]

    refused = send(b"before")
    assert refused is not None and refused.name() == "TOPIC_AUTHORIZATION_FAILED"
    # a prefixed ALLOW of WRITE for carol: effective at once, on the same connection
    _create_acls(alice, _binding("enforced-", "User:carol", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED))
    producer = Producer(settings)  # librdkafka keeps a topic it was refused as unauthorized: a new producer
    assert send(b"allowed") is None

    def consume() -> tuple[list[bytes], str | None]:
        consumer = Consumer(
            _confluent(acl_broker, "PLAIN", CAROL) | {"group.id": group, "auto.offset.reset": "earliest"}
        )
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error() is not None:
                    return [], msg.error().name()
                return [msg.value()], None
            return [], "timeout"
        finally:
            consumer.close()

    assert consume()[1] in ("GROUP_AUTHORIZATION_FAILED", "TOPIC_AUTHORIZATION_FAILED")
    # the wildcard principal may read the group; carol may read the topic
    _create_acls(
        alice,
        _binding(group, "User:*", AclOperation.READ, rtype=ResourceType.GROUP),
        _binding(topic, "User:carol", AclOperation.READ),
    )
    assert consume() == ([b"allowed"], None)
    # a DENY of every operation on the topic to every user wins over carol's ALLOWs
    _create_acls(alice, _binding(topic, "User:*", AclOperation.ALL, permission=AclPermissionType.DENY))
    refused = send(b"denied")
    assert refused is not None and refused.name() == "TOPIC_AUTHORIZATION_FAILED"
    assert consume()[1] == "TOPIC_AUTHORIZATION_FAILED"


def test_authorized_operations_follow_the_session_users_acls(acl_broker: BrokerProcess) -> None:
    alice = _admin(acl_broker, ALICE)
    _create_topic(alice, "ops-on")
    described = alice.describe_topics(TopicCollection(["ops-on"]), include_authorized_operations=True)
    assert _names(described["ops-on"].result(15).authorized_operations) == TOPIC_OPERATIONS  # a super user
    bob = _admin(acl_broker, BOB)
    assert _error_name(bob.describe_topics(TopicCollection(["ops-on"]))["ops-on"]) == "TOPIC_AUTHORIZATION_FAILED"
    _create_acls(alice, _binding("ops-on", "User:bob", AclOperation.READ))  # as librdkafka's 0081 does
    described = bob.describe_topics(TopicCollection(["ops-on"]), include_authorized_operations=True)
    assert _names(described["ops-on"].result(15).authorized_operations) == {"READ", "DESCRIBE"}
    assert _names(bob.describe_cluster(include_authorized_operations=True).result(15).authorized_operations) == set()
    _create_acls(alice, _binding("kafka-cluster", "User:bob", AclOperation.DESCRIBE, rtype=ResourceType.BROKER))
    cluster = bob.describe_cluster(include_authorized_operations=True).result(15)
    assert _names(cluster.authorized_operations) == {"DESCRIBE"}


def test_acls_made_by_the_cli_while_the_broker_runs_take_effect(acl_broker: BrokerProcess) -> None:
    data_dir = Path(acl_broker.data_dir)
    bob = _admin(acl_broker, BOB)
    alice = _admin(acl_broker, ALICE)
    _create_topic(alice, "cli-granted")

    def visible() -> bool:
        return "cli-granted" in bob.list_topics(timeout=10).topics

    assert not visible()
    done = _kafka_acl(data_dir, "add", "--principal", "User:bob", "--operation", "DESCRIBE", "--topic", "cli-")
    assert done.returncode == 0, done.stderr
    assert not _until(visible, 2.5)  # a literal "cli-" is not a prefix
    done = _kafka_acl(data_dir, "add", "--principal", "User:bob", "--operation", "DESCRIBE", "--topic", "cli-",
                      "--prefixed")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _until(visible)
    listed = _kafka_acl(data_dir, "list").stdout
    assert "ALLOW User:bob host=* DESCRIBE TOPIC PREFIXED cli-" in listed


def test_acls_survive_a_restart_in_the_data_directory(tmp_path: Path) -> None:
    broker = _start(tmp_path)
    binding = _binding("kept", "User:bob", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED)
    try:
        _create_acls(_admin(broker, ALICE), binding)
    finally:
        broker.stop()
    assert '"principal": "User:bob"' in (tmp_path / "data" / ACL_FILE).read_text()
    broker = _start(tmp_path)
    try:
        f = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                             AclPermissionType.ANY)  # fmt: skip
        assert _admin(broker, ALICE).describe_acls(f).result(15) == [binding]
    finally:
        broker.stop()


# -- SCRAM credentials (KIP-554) ---------------------------------------------------------------------
def test_a_scram_credential_added_by_the_api_logs_in_until_it_is_deleted(acl_broker: BrokerProcess) -> None:
    alice = _admin(acl_broker, ALICE)
    users: Path = acl_broker.users_file  # type: ignore[attr-defined]
    dave = ("dave", "dave-secret")
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192)
    for future in alice.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("dave", info, dave[1].encode())]
    ).values():
        future.result(15)
    assert "dave user SCRAM-SHA-256" in _kafka_user(users, "list").stdout  # the users file is the truth
    described = alice.describe_user_scram_credentials(["dave"])["dave"].result(15)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_256, 8192)
    ]
    _admin(acl_broker, dave).list_topics(timeout=10)  # logs in (SCRAM-SHA-256)
    _login(acl_broker.kafka_port, dave).close()  # and with PLAIN, checked against that credential
    assert "dave" in alice.describe_user_scram_credentials().result(15)

    refused = alice.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion("erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 20000), b"pw"),
            UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_512),
            UserScramCredentialDeletion("dave", ScramMechanism.SCRAM_SHA_512),
        ]
    )
    assert _error_name(refused["erin"]) == "UNACCEPTABLE_CREDENTIAL"
    assert _error_name(refused["nobody"]) == "RESOURCE_NOT_FOUND"
    assert _error_name(refused["dave"]) == "RESOURCE_NOT_FOUND"
    twice = alice.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion("frank", info, b"x"),
            UserScramCredentialDeletion("frank", ScramMechanism.SCRAM_SHA_256),
        ]
    )
    assert _error_name(twice["frank"]) == "DUPLICATE_RESOURCE"
    assert _error_name(alice.describe_user_scram_credentials(["erin"])["erin"]) == "RESOURCE_NOT_FOUND"

    deleted = alice.alter_user_scram_credentials([UserScramCredentialDeletion("dave", ScramMechanism.SCRAM_SHA_256)])
    deleted["dave"].result(15)
    with RawClient(acl_broker.kafka_port) as raw:  # the next login is refused
        assert raw.call(request(17, 1, mechanism="PLAIN")).error_code == 0
        assert raw.call(request(36, 2, auth_bytes=b"\0dave\0dave-secret")).error_code == SASL_AUTHENTICATION_FAILED
    assert "dave user \n" in _kafka_user(users, "list").stdout  # the line (and its role) stays, no credential


def test_a_transactional_id_needs_write_on_it(acl_broker: BrokerProcess) -> None:
    """init_transactions is refused until the user may WRITE the TRANSACTIONAL_ID (and
    IDEMPOTENT_WRITE the cluster, as Kafka); then a transaction commits to the topic."""
    alice = _admin(acl_broker, ALICE)
    topic, tid = "txn-acl-orders", "txn-acl-app"
    _create_topic(alice, topic)
    _create_acls(
        alice,
        _binding(topic, "User:bob", AclOperation.WRITE),
        _binding("kafka-cluster", "User:bob", AclOperation.IDEMPOTENT_WRITE, rtype=ResourceType.BROKER),
    )
    settings = _confluent(acl_broker, "SCRAM-SHA-256", BOB) | {"transactional.id": tid}
    producer = Producer(settings)
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(15)
    assert refused.value.args[0].name() == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    _create_acls(alice, _binding(tid, "User:bob", AclOperation.WRITE, rtype=ResourceType.TRANSACTIONAL_ID))
    producer = Producer(settings)
    producer.init_transactions(15)
    # bob may not see this topic: Metadata answers TOPIC_AUTHORIZATION_FAILED for it, and his
    # client fails the record, in produce() itself when that answer came first (a race
    # between the client's threads), else in its delivery report; the transaction aborts.
    _create_topic(alice, "txn-acl-other")
    producer.begin_transaction()
    errors: list[Any] = []
    try:
        producer.produce("txn-acl-other", b"not allowed", on_delivery=lambda err, msg: errors.append(err))
    except KafkaException as refused_now:
        errors.append(refused_now.args[0])
    else:
        with pytest.raises(KafkaException):
            producer.commit_transaction(15)
    producer.abort_transaction(15)
    assert [e.name() if e is not None else None for e in errors] == ["TOPIC_AUTHORIZATION_FAILED"]
    producer.begin_transaction()
    producer.produce(topic, b"in a transaction")
    producer.commit_transaction(15)
    _create_acls(alice, _binding(topic, "User:bob", AclOperation.READ),
                 _binding("txn-acl-readers", "User:bob", AclOperation.READ, rtype=ResourceType.GROUP))  # fmt: skip
    consumer = Consumer(
        _confluent(acl_broker, "PLAIN", BOB)
        | {"group.id": "txn-acl-readers", "auto.offset.reset": "earliest", "isolation.level": "read_committed"}
    )
    try:
        consumer.subscribe([topic])
        deadline, got = time.monotonic() + 15, None
        while got is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got = msg.value()
        assert got == b"in a transaction"
    finally:
        consumer.close()


def test_with_sasl_off_an_authorizer_applies_acls_to_user_anonymous(tmp_path: Path) -> None:
    """authorizer.class.name with SASL off (what librdkafka's 0081 assumes of a plaintext
    broker): ACLs are served and enforced, every connection being User:ANONYMOUS, as on a
    Kafka PLAINTEXT listener; allow.everyone.if.no.acl.found decides for resources no ACL
    names. A name that is not one of Kafka's authorizers is refused at start."""
    props = tmp_path / "server.properties"
    props.write_text(
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n"
        "allow.everyone.if.no.acl.found=true\n"
    )
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", "--config", str(props), kafka=True).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        _create_topic(admin, "anon-orders")
        _create_acls(
            admin, _binding("anon-orders", "User:ANONYMOUS", AclOperation.WRITE, permission=AclPermissionType.DENY)
        )
        described = admin.describe_acls(_describe_all_acls_filter()).result(15)
        assert [(b.name, b.principal, b.operation) for b in described] == [
            ("anon-orders", "User:ANONYMOUS", AclOperation.WRITE)
        ]
        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False, "retries": 0})
        reports: list[Any] = []
        producer.produce("anon-orders", b"x", on_delivery=lambda err, msg: reports.append(err))
        producer.flush(15)
        assert [e.name() if e is not None else None for e in reports] == ["TOPIC_AUTHORIZATION_FAILED"]
        producer.produce("anon-other", b"y", on_delivery=lambda err, msg: reports.append(err))  # no ACL: allowed
        producer.flush(15)
        assert reports[-1] is None
    finally:
        broker.stop()
    props.write_text("authorizer.class.name=com.example.MyAuthorizer\n")
    refused = BrokerProcess(tmp_path / "data", tmp_path / "refused.log", "--config", str(props), kafka=True)
    with pytest.raises(RuntimeError, match=r"authorizer\.class\.name"):
        refused.start()


def _describe_all_acls_filter() -> AclBindingFilter:
    return AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
