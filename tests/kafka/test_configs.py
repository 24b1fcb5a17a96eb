"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs of topics and the broker
with confluent-kafka's and kafka-python's admin clients: the keys luxun honours take
effect at once and survive a SIGKILL and restart (topics in kafka.json, the broker in
kafka-broker-configs.json, groups in kafka-group-configs.json); other keys and values
are refused with INVALID_CONFIG and change nothing. Groups have Kafka 4.0's group
configs (KIP-848), checked as Kafka checks them; the broker's log.cleanup.policy is the
cleanup.policy of topics without their own. Issue 32, item 2."""

from __future__ import annotations

import importlib
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests._broker import BrokerProcess

from ._kafka import RawClient, produce_request, record_batch

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning"),  # it is what we test
]

INVALID_RECORD = 87
INVALID_REQUEST = 42
TOPIC, BROKER, GROUP = 2, 4, 32


def _admin(broker: BrokerProcess) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": broker.bootstrap})


def _describe(admin: Any, kind: str, name: str) -> dict[str, tuple[str, int]]:
    from confluent_kafka.admin import ConfigResource

    (future,) = admin.describe_configs([ConfigResource(kind, name)], request_timeout=10).values()
    return {k: (e.value, e.source) for k, e in future.result(10).items()}


def _alter(admin: Any, kind: str, name: str, configs: dict[str, str], *, validate_only: bool = False) -> None:
    from confluent_kafka.admin import ConfigResource

    (future,) = admin.alter_configs(
        [ConfigResource(kind, name, set_config=configs)], request_timeout=10, validate_only=validate_only
    ).values()
    future.result(10)


def _incremental(
    admin: Any, kind: str, name: str, *ops: tuple[str, str, str | None], validate_only: bool = False
) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    entries = [ConfigEntry(k, v, incremental_operation=getattr(AlterConfigOpType, op)) for k, op, v in ops]
    (future,) = admin.incremental_alter_configs(
        [ConfigResource(kind, name, incremental_configs=entries)], request_timeout=10, validate_only=validate_only
    ).values()
    future.result(10)


def _refused(call: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException) as info:
        call(*args, **kwargs)
    error = info.value.args[0]
    return error.name(), error.str()


def test_alter_configs_replaces_the_set_and_survives_a_kill(tmp_path: Path) -> None:
    from confluent_kafka.admin import ConfigSource, NewTopic

    topic_source, static, default = (
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
        ConfigSource.STATIC_BROKER_CONFIG.value,
        ConfigSource.DEFAULT_CONFIG.value,
    )
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = _admin(broker)
        config = {"retention.ms": "7200000", "segment.bytes": "1048576"}
        admin.create_topics([NewTopic("set", 1, 1, config=config)], request_timeout=10)["set"].result(10)
        _alter(admin, "topic", "set", {"retention.bytes": "100000"}, validate_only=True)
        assert _describe(admin, "topic", "set")["retention.ms"] == ("7200000", topic_source)
        _alter(admin, "topic", "set", {"retention.bytes": "100000"})
        broker.stop(signal.SIGKILL)
    finally:
        broker.stop()
    broker.start()
    try:
        entries = _describe(_admin(broker), "topic", "set")
        assert entries["retention.bytes"] == ("100000", topic_source)
        assert entries["retention.ms"] == (str(168 * 3_600_000), static)  # back to the broker's
        assert entries["segment.bytes"] == ("1073741824", default)
    finally:
        broker.stop()


def test_refused_configs_get_invalid_config_and_change_nothing(broker: BrokerProcess) -> None:
    from confluent_kafka.admin import NewTopic

    admin = _admin(broker)
    admin.create_topics([NewTopic("kept", 1, 1, config={"retention.ms": "5000"})], request_timeout=10)["kept"].result(
        10
    )
    assert _refused(_alter, admin, "topic", "kept", {"retention.mss": "1"}) == (
        "INVALID_CONFIG",
        "Unknown topic config name: retention.mss",
    )
    name, message = _refused(_alter, admin, "topic", "kept", {"retention.ms": "soon"})
    assert name == "INVALID_CONFIG" and "Invalid value soon for configuration retention.ms" in message
    name, message = _refused(_alter, admin, "topic", "kept", {"min.insync.replicas": "2"})
    assert name == "INVALID_CONFIG" and "luxun does not support min.insync.replicas=2" in message
    name, message = _refused(_incremental, admin, "topic", "kept", ("retention.ms", "APPEND", "1"))
    assert (name, message) == ("INVALID_CONFIG", "Config value append is not allowed for config key: retention.ms")
    name, message = _refused(_incremental, admin, "topic", "kept", ("flush.messages", "SET", "1"))
    assert name == "INVALID_CONFIG" and "luxun does not support flush.messages=1" in message
    name, _ = _refused(_alter, admin, "topic", "missing", {"retention.ms": "1"})
    assert name == "UNKNOWN_TOPIC_OR_PART"
    assert _describe(admin, "topic", "kept")["retention.ms"][0] == "5000"  # nothing changed


def test_incremental_set_and_delete_take_effect_at_once(broker: BrokerProcess) -> None:
    """SET message.timestamp.type=LogAppendTime: the next record is stamped by the
    broker; DELETE: back to CreateTime (the producer's timestamp)."""
    from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition
    from confluent_kafka.admin import NewTopic

    admin = _admin(broker)
    admin.create_topics([NewTopic("stamps", 1, 1)], request_timeout=10)["stamps"].result(10)
    with RawClient(broker.kafka_port) as raw:
        _incremental(admin, "topic", "stamps", ("message.timestamp.type", "SET", "LogAppendTime"))
        assert raw.call(produce_request("stamps", 0, record_batch([b"a"], timestamp_ms=1000))).responses
        _incremental(admin, "topic", "stamps", ("message.timestamp.type", "DELETE", None))
        assert raw.call(produce_request("stamps", 0, record_batch([b"b"], timestamp_ms=1000))).responses
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "stamps", "enable.auto.commit": False})
    consumer.assign([TopicPartition("stamps", 0, 0)])
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 2 and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.timestamp())
    consumer.close()
    assert got[0][0] == TIMESTAMP_LOG_APPEND_TIME and got[0][1] > 1000
    assert got[1] == (TIMESTAMP_CREATE_TIME, 1000)


def test_broker_retention_is_set_at_run_time_and_kept(tmp_path: Path) -> None:
    from confluent_kafka.admin import ConfigSource, NewTopic

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = _admin(broker)
        admin.create_topics([NewTopic("plain", 1, 1)], request_timeout=10)["plain"].result(10)
        entries = _describe(admin, "broker", "0")
        assert entries["log.retention.ms"] == (str(168 * 3_600_000), ConfigSource.STATIC_BROKER_CONFIG.value)
        _incremental(admin, "broker", "0", ("log.retention.ms", "SET", "3600000"))
        assert (
            _refused(_incremental, admin, "broker", "0", ("log.flush.scheduler.interval.ms", "SET", "9"))[0]
            == "INVALID_CONFIG"
        )
        assert _refused(_alter, admin, "broker", "0", {"log.retention.bytes": "lots"})[0] == "INVALID_CONFIG"
        broker.stop(signal.SIGKILL)
    finally:
        broker.stop()
    broker.start()
    try:
        admin = _admin(broker)
        entries = _describe(admin, "broker", "0")
        assert entries["log.retention.ms"] == ("3600000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        topic = _describe(admin, "topic", "plain")
        assert topic["retention.ms"] == ("3600000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
        _alter(admin, "broker", "0", {})  # AlterConfigs replaces the set: back to the file's
        assert _describe(admin, "broker", "0")["log.retention.ms"][0] == str(168 * 3_600_000)
    finally:
        broker.stop()


def _raw_describe(broker: BrokerProcess, kind: int, name: str, version: int = 4) -> Any:
    module = importlib.import_module(f"kio.schema.describe_configs.v{version}.request")
    extra = {"include_documentation": False} if version >= 3 else {}
    body = module.DescribeConfigsRequest(
        resources=(module.DescribeConfigsResource(resource_type=kind, resource_name=name, configuration_keys=None),),
        include_synonyms=False,
        **extra,
    )
    with RawClient(broker.kafka_port) as raw:
        return raw.call(body).results[0]


def test_unknown_resources_are_an_invalid_request(broker: BrokerProcess) -> None:
    result = _raw_describe(broker, 3, "some-group")  # ACL's GROUP code, no config resource type
    assert (result.error_code, result.error_message) == (INVALID_REQUEST, "Unsupported resource type: UNKNOWN")
    result = _raw_describe(broker, GROUP, "")
    assert (result.error_code, result.error_message) == (INVALID_REQUEST, "Group name must not be empty")
    assert _raw_describe(broker, BROKER, "7").error_code == INVALID_REQUEST  # another broker's
    assert _raw_describe(broker, BROKER, "0", version=1).error_code == 0
    assert _raw_describe(broker, GROUP, "any-group", version=1).error_code == 0


GROUP_DEFAULTS = {
    "consumer.session.timeout.ms": "45000",
    "consumer.heartbeat.interval.ms": "5000",
    "share.session.timeout.ms": "45000",
    "share.heartbeat.interval.ms": "5000",
    "share.record.lock.duration.ms": "30000",
    "share.auto.offset.reset": "latest",
}


def test_group_configs_are_checked_kept_and_described_as_kafka_4(tmp_path: Path) -> None:
    """A group (existing or not: Kafka 4.0 keeps configs by name) shows Kafka's six group
    keys at their defaults; a value set by IncrementalAlterConfigs or AlterConfigs is
    shown as GROUP_CONFIG and survives a SIGKILL; values outside the broker's bounds
    (group.consumer.min/max.session.timeout.ms...), unknown keys and bad values are
    INVALID_CONFIG in Kafka's words and change nothing; DELETE goes back to the default."""
    from confluent_kafka.admin import ConfigSource

    group_source, default = ConfigSource.GROUP_CONFIG.value, ConfigSource.DEFAULT_CONFIG.value
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = _admin(broker)
        assert _describe(admin, "group", "tuned") == {k: (v, default) for k, v in GROUP_DEFAULTS.items()}
        _incremental(admin, "group", "tuned", ("consumer.session.timeout.ms", "SET", "50000"), validate_only=True)
        assert _describe(admin, "group", "tuned")["consumer.session.timeout.ms"] == ("45000", default)
        _incremental(admin, "group", "tuned", ("consumer.session.timeout.ms", "SET", "50000"))
        _incremental(admin, "group", "tuned", ("share.auto.offset.reset", "SET", "earliest"))
        for ops, message in (
            (("consumer.session.timeout.ms", "SET", "70000"),
             "consumer.session.timeout.ms must be less than or equal to group.consumer.max.session.timeout.ms"),
            (("consumer.heartbeat.interval.ms", "SET", "4000"),
             "consumer.heartbeat.interval.ms must be greater than or equal to group.consumer.min.heartbeat"),
            (("share.record.lock.duration.ms", "SET", "999"),
             "Invalid value 999 for configuration share.record.lock.duration.ms: Value must be at least 1000"),
            (("share.auto.offset.reset", "SET", "middle"),
             "Invalid value middle for configuration share.auto.offset.reset: String must be one of: latest, earliest"),
            (("session.timeout.ms", "SET", "50000"), "Unknown group config name: session.timeout.ms"),
            (("consumer.session.timeout.ms", "APPEND", "1"),
             "Config value append is not allowed for config key: consumer.session.timeout.ms"),
        ):  # fmt: skip
            name, said = _refused(_incremental, admin, "group", "tuned", ops)
            assert name == "INVALID_CONFIG" and said.startswith(message), said
        name, said = _refused(
            _alter, admin, "group", "tuned",
            {"consumer.session.timeout.ms": "46000", "consumer.heartbeat.interval.ms": "16000"},
        )  # fmt: skip
        assert (name, said) == (
            "INVALID_CONFIG",
            "consumer.heartbeat.interval.ms must be less than or equal to group.consumer.max.heartbeat.interval.ms"
            " (15000 on this broker)",
        )
        assert _describe(admin, "group", "tuned")["consumer.session.timeout.ms"] == ("50000", group_source)
        _alter(admin, "group", "other", {"consumer.heartbeat.interval.ms": "6000"})
        broker.stop(signal.SIGKILL)
    finally:
        broker.stop()
    broker.start()
    try:
        admin = _admin(broker)
        tuned = _describe(admin, "group", "tuned")
        assert tuned["consumer.session.timeout.ms"] == ("50000", group_source)
        assert tuned["share.auto.offset.reset"] == ("earliest", group_source)
        assert tuned["consumer.heartbeat.interval.ms"] == ("5000", default)
        assert _describe(admin, "group", "other")["consumer.heartbeat.interval.ms"] == ("6000", group_source)
        _incremental(
            admin, "group", "tuned",
            ("consumer.session.timeout.ms", "DELETE", None), ("share.auto.offset.reset", "DELETE", None),
        )  # fmt: skip
        assert _describe(admin, "group", "tuned") == {k: (v, default) for k, v in GROUP_DEFAULTS.items()}
        _alter(admin, "group", "other", {})  # AlterConfigs replaces the set: back to the defaults
        assert _describe(admin, "group", "other")["consumer.heartbeat.interval.ms"] == ("5000", default)
    finally:
        broker.stop()
    assert json.loads((tmp_path / "data" / "kafka-group-configs.json").read_text()) == {}


def test_the_brokers_log_cleanup_policy_is_the_policy_of_topics_without_their_own(tmp_path: Path) -> None:
    """librdkafka's 0081 APPENDs compact to the broker's log.cleanup.policy, and later
    SUBTRACTs it. Kafka's semantics for one broker: a topic without its own
    cleanup.policy is then compacted (a record without a key is INVALID_RECORD, shown as
    DYNAMIC_DEFAULT_BROKER_CONFIG), a topic with its own is not; it survives a SIGKILL,
    and so do the broker keys of no effect set beside it."""
    from confluent_kafka.admin import ConfigSource, NewTopic

    dynamic_default, default = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value, ConfigSource.DEFAULT_CONFIG.value
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = _admin(broker)
        for name, config in (("plain", {}), ("own", {"cleanup.policy": "delete"})):
            admin.create_topics([NewTopic(name, 1, 1, config=config)], request_timeout=10)[name].result(10)
        assert _describe(admin, "topic", "plain")["cleanup.policy"] == ("delete", default)
        assert _produce_keyless(broker, "plain") == 0
        _incremental(
            admin, "broker", "0", ("background.threads", "SET", "9"), ("log.cleanup.policy", "APPEND", "compact")
        )
        assert _describe(admin, "broker", "0")["log.cleanup.policy"][0] == "delete,compact"
        assert _describe(admin, "topic", "plain")["cleanup.policy"] == ("delete,compact", dynamic_default)
        assert _produce_keyless(broker, "plain") == INVALID_RECORD
        assert _produce_keyless(broker, "own") == 0
        assert _refused(_incremental, admin, "broker", "0", ("log.cleanup.policy", "APPEND", "tidy"))[0] == (
            "INVALID_CONFIG"
        )
        broker.stop(signal.SIGKILL)
    finally:
        broker.stop()
    broker.start()
    try:
        admin = _admin(broker)
        shown = _describe(admin, "broker", "0")
        assert (shown["log.cleanup.policy"][0], shown["background.threads"][0]) == ("delete,compact", "9")
        assert _produce_keyless(broker, "plain") == INVALID_RECORD
        _incremental(
            admin, "broker", "0", ("background.threads", "DELETE", None), ("log.cleanup.policy", "SUBTRACT", "compact")
        )
        assert _describe(admin, "topic", "plain")["cleanup.policy"] == ("delete", dynamic_default)
        assert _produce_keyless(broker, "plain") == 0
    finally:
        broker.stop()


def _produce_keyless(broker: BrokerProcess, topic: str) -> int:
    """The error code of a Produce of one record without a key to partition 0."""
    with RawClient(broker.kafka_port) as raw:
        response = raw.call(produce_request(topic, 0, record_batch([b"no key"])))
    return int(response.responses[0].partition_responses[0].error_code)


def test_kafka_python_alters_and_describes(broker: BrokerProcess) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic("kp", 1, 1)])
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "kp", configs={"retention.ms": "60000"})])
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "kp")])
    finally:
        admin.close()
    assert "60000" in repr(described)


def test_retention_set_at_run_time_applies_at_the_next_pass(tmp_path: Path) -> None:
    """In one process: the broker's log.retention.ms, then a topic's retention.ms, set
    while the broker runs, are used by the next retention pass."""
    from bigarray.prefetch import PREFETCHER
    from luxun.dynamic import DynamicBrokerConfigs
    from luxun.kafka.log import KafkaLog
    from luxun.topics import TopicManager
    from tests._retention import make_maintenance

    now = [0]
    topics = TopicManager(str(tmp_path / "data"), data_page_size_bytes=4096)
    try:
        kafka = KafkaLog(topics)
        dynamic = DynamicBrokerConfigs(str(tmp_path / "data"), retention_ms=168 * 3_600_000, retention_bytes=-1)
        for topic in ("a", "b"):
            assert kafka.create(topic, 1) == (0, None)
            for _ in range(3):
                assert kafka.produce(topic, 0, record_batch([b"v"])).error == 0
        now[0] = topics.open("a").queue.timestamp(2) + 2 * 3_600_000
        assert PREFETCHER.wait_idle(60)
        maintenance = make_maintenance(
            topics,
            clock_ms=lambda: now[0],
            topic_overrides=kafka.retention_overrides,
            broker_overrides=dynamic.retention,
        )
        assert kafka.alter_configs("b", lambda now: [("retention.ms", str(7 * 24 * 3_600_000))]) == (0, None)
        maintenance.run_once(force_cleanup=True)
        assert (topics.open("a").queue.size(), topics.open("b").queue.size()) == (3, 3)
        dynamic.replace({"log.retention.ms": "3600000"})
        maintenance.run_once(force_cleanup=True)
        assert (topics.open("a").queue.size(), topics.open("b").queue.size()) == (0, 3)  # b keeps its own
        assert kafka.alter_configs("b", lambda now: []) == (0, None)  # back to the broker's
        maintenance.run_once(force_cleanup=True)
        assert topics.open("b").queue.size() == 0
        assert DynamicBrokerConfigs(str(tmp_path / "data"), retention_ms=1, retention_bytes=-1).values() == {
            "log.retention.ms": "3600000"
        }
    finally:
        topics.close()


def test_what_describe_shows_can_be_given_back_whole(broker: BrokerProcess) -> None:
    """librdkafka's test helper (test_AlterConfigs_simple, used by its test 0092) alters
    a topic by giving back every config DescribeConfigs showed, plus its change."""
    from confluent_kafka.admin import NewTopic

    admin = _admin(broker)
    admin.create_topics([NewTopic("whole", 1, 1)], request_timeout=10)["whole"].result(10)
    shown = {k: v for k, (v, _) in _describe(admin, "topic", "whole").items()}
    assert len(shown) > 30
    _alter(admin, "topic", "whole", shown | {"message.format.version": "0.10.0.0"})
    assert _describe(admin, "topic", "whole")["message.format.version"][0] == "0.10.0.0"


def test_a_topics_flush_ms_sets_its_partitions_flush_interval(tmp_path: Path) -> None:
    """flush.ms set on a Kafka topic (by AlterConfigs) flushes its partitions at that
    interval in the next maintenance passes, where the broker's interval (never, here)
    flushes nothing; Kafka's default, the largest long, leaves the broker's."""
    from luxun.kafka.log import KafkaLog
    from luxun.topics import TopicManager
    from tests._retention import make_maintenance

    topics = TopicManager(str(tmp_path / "data"), data_page_size_bytes=4096)
    try:
        kafka = KafkaLog(topics)
        for topic in ("flushed", "plain"):
            assert kafka.create(topic, 2) == (0, None)
        assert kafka.alter_configs("flushed", lambda now: [("flush.ms", "1")]) == (0, None)
        assert kafka.alter_configs("plain", lambda now: [("flush.ms", str((1 << 63) - 1))]) == (0, None)
        assert (kafka.flush_override("flushed~1"), kafka.flush_override("plain")) == (1, None)
        maintenance = make_maintenance(
            topics,
            flush_overrides=kafka.flush_override,
        )
        for name in ("flushed", "flushed~1", "plain"):
            assert (
                kafka.produce(name.split("~")[0], int(name[-1]) if "~" in name else 0, record_batch([b"v"])).error == 0
            )
        before = {n: topics.open(n).stats.last_flush_monotonic for n in ("flushed", "flushed~1", "plain")}
        time.sleep(0.01)
        maintenance.run_once()
        after = {n: topics.open(n).stats.last_flush_monotonic for n in ("flushed", "flushed~1", "plain")}
        assert after["flushed"] > before["flushed"] and after["flushed~1"] > before["flushed~1"]
        assert after["plain"] == before["plain"]
    finally:
        topics.close()


def test_kafkas_dynamic_broker_keys_of_no_effect_are_accepted_and_kept(tmp_path: Path) -> None:
    """AlterConfigs of the broker with a key Kafka changes at run time and luxun has no use
    for (librdkafka's 0081 sets sasl.kerberos.min.time.before.relogin) is accepted and
    shown; an unknown one is still refused."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", kafka=True).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        resource = ConfigResource("broker", "0", set_config={"sasl.kerberos.min.time.before.relogin": "58000"})
        (future,) = admin.alter_configs([resource], request_timeout=10).values()
        future.result(10)
        (described,) = admin.describe_configs([ConfigResource("broker", "0")], request_timeout=10).values()
        assert described.result(10)["sasl.kerberos.min.time.before.relogin"].value == "58000"
        (refused,) = admin.alter_configs(
            [ConfigResource("broker", "0", set_config={"log.flush.scheduler.interval.ms": "1"})], request_timeout=10
        ).values()
        with pytest.raises(Exception, match="Cannot update these configs dynamically"):
            refused.result(10)
    finally:
        broker.stop()


def test_retention_keeps_everything_of_topics_compacted_by_the_brokers_policy(tmp_path: Path) -> None:
    """In one process: with the broker's log.cleanup.policy set to compact alone at run
    time, a retention pass deletes nothing from a topic without its own policy (a
    compacted topic keeps the last value of every key); back to delete, it deletes."""
    from bigarray.prefetch import PREFETCHER
    from luxun.dynamic import DynamicBrokerConfigs
    from luxun.kafka.log import KafkaLog
    from luxun.topics import TopicManager
    from tests._retention import make_maintenance

    now = [0]
    topics = TopicManager(str(tmp_path / "data"), data_page_size_bytes=4096)
    try:
        dynamic = DynamicBrokerConfigs(str(tmp_path / "data"), retention_ms=3_600_000, retention_bytes=-1)
        kafka = KafkaLog(topics, broker_configs=dynamic)
        assert kafka.create("kv", 1) == (0, None)
        for key in (b"a", b"b", b"c"):
            assert kafka.produce("kv", 0, _keyed_batch(key)).error == 0
        now[0] = topics.open("kv").queue.timestamp(2) + 2 * 3_600_000
        assert PREFETCHER.wait_idle(60)
        maintenance = make_maintenance(
            topics,
            clock_ms=lambda: now[0],
            retention_hours=1,
            topic_overrides=kafka.retention_overrides,
            broker_overrides=dynamic.retention,
        )
        dynamic.replace({"log.cleanup.policy": "compact"})
        assert kafka.retention_overrides("kv") == (-1, -1)
        maintenance.run_once(force_cleanup=True)
        assert topics.open("kv").queue.size() == 3
        dynamic.replace({"log.cleanup.policy": "compact,delete"})
        maintenance.run_once(force_cleanup=True)
        assert topics.open("kv").queue.size() == 0
    finally:
        topics.close()


def _keyed_batch(key: bytes) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    builder.append(0, int(time.time() * 1000), key, b"v", [])
    return bytes(builder.build())
