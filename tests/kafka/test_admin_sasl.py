"""With SASL on, the admin APIs of issue 32 are under the ACLs, as Kafka's KafkaApis
checks them: a user without the ACL gets TOPIC_AUTHORIZATION_FAILED (CreatePartitions:
ALTER, DeleteRecords: DELETE, topic AlterConfigs: ALTER_CONFIGS),
CLUSTER_AUTHORIZATION_FAILED (the broker's configs) or GROUP_AUTHORIZATION_FAILED
(OffsetDelete: DELETE on the group) and nothing changes; an admin (a super user) may,
and so may the user once granted. Uses test_sasl's broker (alice: admin, bob: a user
who may read and write every topic and read every group)."""

from __future__ import annotations

import time

import pytest

from tests._broker import BrokerProcess

from .test_sasl import ALICE, BOB, _confluent, _kafka_acl, _login, sasl_broker  # noqa: F401 - the fixture

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning"),
]


def _error(future: object) -> str:
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException) as info:
        future.result(10)  # type: ignore[attr-defined]
    return str(info.value.args[0].name())


def test_only_admins_grow_topics_delete_records_and_alter_configs(sasl_broker: BrokerProcess) -> None:  # noqa: F811
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

    alice = AdminClient(_confluent(sasl_broker, "SCRAM-SHA-256", ALICE))
    bob = AdminClient(_confluent(sasl_broker, "SCRAM-SHA-256", BOB))
    alice.create_topics([NewTopic("guarded", 1, 1)], request_timeout=10)["guarded"].result(10)
    assert _error(bob.create_partitions([NewPartitions("guarded", 2)], request_timeout=10)["guarded"]) == (
        "TOPIC_AUTHORIZATION_FAILED"
    )
    (deleted,) = bob.delete_records([TopicPartition("guarded", 0, 0)], request_timeout=10).values()
    assert _error(deleted) == "TOPIC_AUTHORIZATION_FAILED"
    topic = ConfigResource("topic", "guarded", set_config={"retention.ms": "1000"})
    (altered,) = bob.alter_configs([topic], request_timeout=10).values()
    assert _error(altered) == "TOPIC_AUTHORIZATION_FAILED"
    (altered,) = bob.alter_configs(
        [ConfigResource("broker", "0", set_config={"log.retention.ms": "1000"})], request_timeout=10
    ).values()
    assert _error(altered) == "CLUSTER_AUTHORIZATION_FAILED"
    (described,) = alice.describe_configs([ConfigResource("topic", "guarded")], request_timeout=10).values()
    assert described.result(10)["retention.ms"].value != "1000"  # nothing changed
    alice.create_partitions([NewPartitions("guarded", 2)], request_timeout=10)["guarded"].result(10)
    (altered,) = alice.alter_configs([topic], request_timeout=10).values()
    altered.result(10)
    # granted ALTER and ALTER_CONFIGS on the topic, bob may grow it and change its configs
    done = _kafka_acl(
        sasl_broker.data_dir, "add", "--principal", "User:bob", "--topic", "guarded",
        "--operation", "ALTER", "--operation", "ALTER_CONFIGS",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 10  # the broker picks the file's change up within a second
    while True:
        future = bob.create_partitions([NewPartitions("guarded", 3)], request_timeout=10)["guarded"]
        try:
            future.result(10)
            break
        except KafkaException:
            assert time.monotonic() < deadline, "bob's ALTER ACL did not take effect"
            time.sleep(0.2)
    (altered,) = bob.alter_configs([ConfigResource("topic", "guarded", set_config={"retention.ms": "2000"})],
                                   request_timeout=10).values()  # fmt: skip
    altered.result(10)
    (described,) = alice.describe_configs([ConfigResource("topic", "guarded")], request_timeout=10).values()
    assert described.result(10)["retention.ms"].value == "2000"


def test_only_admins_delete_group_offsets(sasl_broker: BrokerProcess) -> None:  # noqa: F811
    import kio.schema.offset_delete.v0.request as schema

    body = schema.OffsetDeleteRequest(
        group_id="g",
        topics=(
            schema.OffsetDeleteRequestTopic(
                name="t", partitions=(schema.OffsetDeleteRequestPartition(partition_index=0),)
            ),
        ),
    )
    with _login(sasl_broker.kafka_port, BOB) as bob:
        assert bob.call(body).error_code == 30  # GROUP_AUTHORIZATION_FAILED
    with _login(sasl_broker.kafka_port, ALICE) as alice:
        assert alice.call(body).error_code == 69  # GROUP_ID_NOT_FOUND: it got to the coordinator


def test_group_configs_need_the_configs_acls_on_the_group(sasl_broker: BrokerProcess) -> None:  # noqa: F811
    """Kafka 4.0 checks DESCRIBE_CONFIGS and ALTER_CONFIGS on the GROUP resource for a
    group's configs: bob (READ on every group) gets GROUP_AUTHORIZATION_FAILED and
    nothing changes; granted ALTER_CONFIGS on the group (which implies
    DESCRIBE_CONFIGS), he may; an admin always may. A group's authorized operations
    include the two, as Kafka 4.0 answers them."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    alice = AdminClient(_confluent(sasl_broker, "SCRAM-SHA-256", ALICE))
    bob = AdminClient(_confluent(sasl_broker, "SCRAM-SHA-256", BOB))
    entry = ConfigEntry("consumer.session.timeout.ms", "50000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("group", "tuned-acl", incremental_configs=[entry])
    (altered,) = bob.incremental_alter_configs([resource], request_timeout=10).values()
    assert _error(altered) == "GROUP_AUTHORIZATION_FAILED"
    (described,) = bob.describe_configs([ConfigResource("group", "tuned-acl")], request_timeout=10).values()
    assert _error(described) == "GROUP_AUTHORIZATION_FAILED"
    (described,) = alice.describe_configs([ConfigResource("group", "tuned-acl")], request_timeout=10).values()
    assert described.result(10)["consumer.session.timeout.ms"].value == "45000"  # nothing changed
    done = _kafka_acl(
        sasl_broker.data_dir, "add", "--principal", "User:bob", "--group", "tuned-acl", "--operation", "ALTER_CONFIGS"
    )
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 10  # the broker picks the file's change up within a second
    while True:
        (altered,) = bob.incremental_alter_configs([resource], request_timeout=10).values()
        try:
            altered.result(10)
            break
        except KafkaException:
            assert time.monotonic() < deadline, "bob's ALTER_CONFIGS ACL did not take effect"
            time.sleep(0.2)
    (described,) = bob.describe_configs([ConfigResource("group", "tuned-acl")], request_timeout=10).values()
    assert described.result(10)["consumer.session.timeout.ms"].value == "50000"
    with _login(sasl_broker.kafka_port, ALICE) as raw:
        operations = _group_operations(raw, "tuned-acl")
    assert operations == {"READ", "DESCRIBE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}


def _group_operations(raw: object, group: str) -> set[str]:
    """The authorized operations DescribeGroups v5 answers for ``group``."""
    import kio.schema.describe_groups.v5.request as schema

    from luxun.kafka.acls import Operation

    body = schema.DescribeGroupsRequest(groups=(group,), include_authorized_operations=True)
    (described,) = raw.call(body).groups  # type: ignore[attr-defined]
    bits = int(described.authorized_operations)
    return {op.name for op in Operation if op.value < 32 and bits & (1 << op.value)}
