"""Broker configuration: server.properties parsing, validation, overrides and passwords."""

from __future__ import annotations

import dataclasses
import hmac
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest

from luxun import config as config_module
from luxun.config import (
    DEFAULT_DATA_PAGE_SIZE_BYTES,
    JAVA_KEYS,
    KNOWN_KEYS,
    OUR_KEYS,
    UNUSED_KEYS,
    BrokerConfig,
    check_password,
    load_properties,
    parse_properties,
)
from luxun.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

#: Java Luxun's conf/server.properties as shipped (bulldog2011/luxun, Apache-2.0; the
#: license header dropped).
JAVA_SAMPLE = """\
############################# Server Basics #############################

# The id of the broker. This must be set to a unique integer for each broker.
brokerid=1


############################# Socket Server Settings #############################

# The port the socket server listens on
port=9092

############################# Log Basics #############################

# The directory under which to store log files.
# The directory must be empty or only contains luxun files.
log.dir=./data

############################# Log Flush Policy #############################
# The number of messages to accept before forcing a flush of data to disk
#
# a negative number means not to flush explicitly

#log.flush.count=10000
log.flush.count=-1

#log.default.flush.interval.ms=10000
log.default.flush.interval.ms=-1

# Per-topic overrides for log.default.flush.interval.ms
#topic.flush.intervals.ms=topic1:1000, topic2:3000

# log.default.flush.scheduler.interval.ms=10000
log.default.flush.scheduler.interval.ms=-1

############################# Log Retention Policy #############################

# The minimum age of a log page file to be eligible for deletion
log.retention.hours=168

log.retention.size=1073741824

log.cleanup.interval.mins=10

# admin password
# support type:
#    plain:luxun
#    md5:3a8cb419bf0d34f5fa091ce416627f82
#    crc32:1688323579
password=plain:luxun
"""

#: Every key Java Luxun's ServerConfig reads, each set to a non-default value.
FULL_SAMPLE = """\
brokerid=7
port=9100
log.dir=/var/lib/luxun
log.flush.count=10000
log.default.flush.interval.ms=3000
log.default.flush.scheduler.interval.ms=1000
topic.flush.intervals.ms=topic1:1000, topic2:3000
log.retention.hours=72
topic.log.retention.hours=topic1:24,topic2: 48
log.retention.size=1073741824
log.cleanup.interval.mins=5
password=md5:3a8cb419bf0d34f5fa091ce416627f82
max.message.size=2097152
log.backfile.page.size=33554432
monitoring.period.secs=300
"""

#: DESIGN.md section 7's list of Java Luxun keys.
DESIGN_KEYS = {
    "brokerid",
    "port",
    "log.dir",
    "log.flush.count",
    "log.default.flush.interval.ms",
    "log.default.flush.scheduler.interval.ms",
    "topic.flush.intervals.ms",
    "log.retention.hours",
    "topic.log.retention.hours",
    "log.retention.size",
    "log.cleanup.interval.mins",
    "password",
    "max.message.size",
    "log.backfile.page.size",
    "monitoring.period.secs",
}


def _load(text: str, **overrides: Any) -> BrokerConfig:
    return BrokerConfig.from_properties(parse_properties(text), overrides=overrides)


# -- whole files ---------------------------------------------------------------------------
def test_full_sample_with_every_java_key(caplog: pytest.LogCaptureFixture) -> None:
    props = parse_properties(FULL_SAMPLE)
    assert set(props) == DESIGN_KEYS
    with caplog.at_level(logging.INFO, logger="luxun.config"):
        config = BrokerConfig.from_properties(props)
    assert config.broker_id == 7
    assert config.port == 9100
    assert config.data_dir == "/var/lib/luxun"
    assert config.flush_count == 10000
    assert config.flush_interval_ms == 3000
    assert config.flush_scheduler_interval_ms == 1000
    assert dict(config.topic_flush_intervals_ms) == {"topic1": 1000, "topic2": 3000}
    assert config.retention_hours == 72
    assert dict(config.topic_retention_hours) == {"topic1": 24, "topic2": 48}
    assert config.retention_size_bytes == 1073741824
    assert config.cleanup_interval_mins == 5
    assert config.password == "md5:3a8cb419bf0d34f5fa091ce416627f82"
    assert config.max_message_size_bytes == 2 * 1024 * 1024
    assert config.data_page_size_bytes == 32 * 1024 * 1024
    assert config.monitoring_period_secs == 300
    # Our own settings keep their defaults.
    assert (config.host, config.metrics_host, config.metrics_port) == ("127.0.0.1", "127.0.0.1", 9093)
    assert config.check_password("luxun") and not config.check_password("luxun ")


def test_java_sample_as_shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "server.properties"
    path.write_text(JAVA_SAMPLE)
    config = BrokerConfig.from_file(path)
    assert config.broker_id == 1
    assert config.port == 9092
    assert config.data_dir == str(tmp_path / "data")
    assert config.flush_count == -1
    assert config.flush_interval_ms == -1
    assert config.retention_hours == 168
    assert config.retention_size_bytes == 1073741824
    assert config.cleanup_interval_mins == 10
    assert config.password == "plain:luxun"
    assert config.check_password("luxun")
    # Keys the sample leaves out take Java's defaults.
    assert config.max_message_size_bytes == 1024 * 1024
    assert config.data_page_size_bytes == 128 * 1024 * 1024
    assert config.monitoring_period_secs == 600
    assert dict(config.topic_flush_intervals_ms) == {} and dict(config.topic_retention_hours) == {}


def test_defaults() -> None:
    config = BrokerConfig()
    assert config.data_dir == os.path.abspath("./luxun-data")
    assert (config.host, config.port, config.broker_id) == ("127.0.0.1", 9092, 0)
    assert (config.metrics_host, config.metrics_port, config.metrics_enabled) == ("127.0.0.1", 9093, True)
    assert (config.flush_count, config.flush_interval_ms, config.flush_scheduler_interval_ms) == (-1, -1, -1)
    assert (config.retention_hours, config.retention_size_bytes, config.cleanup_interval_mins) == (168, -1, 10)
    assert config.max_message_size_bytes == 1 << 20
    assert config.data_page_size_bytes == DEFAULT_DATA_PAGE_SIZE_BYTES == 128 << 20
    assert config.monitoring_period_secs == 600
    assert config.password == "" and not config.password_configured
    assert BrokerConfig.from_properties({}) == config


def test_known_keys_are_designs_list_plus_ours() -> None:
    assert JAVA_KEYS == DESIGN_KEYS
    topic_keys = {"auto.create.topics.enable", "max.topics", "max.open.topics"}
    kafka_keys = {
        "kafka.port",
        "kafka.host",
        "kafka.advertised.host",
        "kafka.advertised.port",
        "num.partitions",
        "delete.topic.enable",
        "message.max.bytes",
        "socket.request.max.bytes",
        "fetch.max.bytes",
        "kafka.fetch.buffer.bytes",
        "group.initial.rebalance.delay.ms",
        "max.groups",
        "offsets.retention.minutes",
        "offsets.retention.check.interval.ms",
        "kafka.sasl.mechanisms",
        "kafka.sasl.users.file",
        "kafka.allow.unauthenticated",
        "allow.everyone.if.no.acl.found",
        "authorizer.class.name",
        "transaction.max.timeout.ms",
        "transactional.id.expiration.ms",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "max.transactional.ids",
    }
    thrift_keys = {"busy.poll.us", "async.batch.us", "follow.client.cpu"}
    assert {"host", "metrics.host", "metrics.port", *thrift_keys, *topic_keys, *kafka_keys} == OUR_KEYS
    assert KNOWN_KEYS == DESIGN_KEYS | OUR_KEYS
    assert UNUSED_KEYS <= JAVA_KEYS


def test_our_keys_in_the_file() -> None:
    config = _load("host=0.0.0.0\nmetrics.host=::1\nmetrics.port=0\n")
    assert (config.host, config.metrics_host, config.metrics_port, config.metrics_enabled) == (
        "0.0.0.0",
        "::1",
        0,
        False,
    )


# -- unknown and unused keys ------------------------------------------------------------------
def test_unknown_key_is_named_with_the_closest_known_key() -> None:
    with pytest.raises(ConfigError, match=r"unknown configuration key 'log\.retention\.hour'") as info:
        _load("log.retention.hour=12\n")
    assert "did you mean 'log.retention.hours'" in str(info.value)
    assert info.value.key == "log.retention.hour"


def test_unknown_key_without_a_close_match_lists_the_known_keys() -> None:
    with pytest.raises(ConfigError) as info:
        _load("zookeeper.connect=localhost:2181\n")
    message = str(info.value)
    assert "'zookeeper.connect'" in message and "did you mean" not in message
    assert "log.retention.hours" in message


def test_every_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError) as info:
        _load("b.unknown=1\na.unknown=2\nport=1\n")
    assert "'a.unknown'" in str(info.value) and "'b.unknown'" in str(info.value)


def test_known_unused_key_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="luxun.config"):
        config = _load("monitoring.period.secs=30\nport=1\n")
    lines = [r for r in caplog.records if r.name == "luxun.config"]
    assert len(lines) == 1
    assert lines[0].levelno == logging.INFO and "monitoring.period.secs=30" in lines[0].getMessage()
    assert config.monitoring_period_secs == 30


def test_used_keys_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="luxun.config"):
        _load(JAVA_SAMPLE)
    assert [r for r in caplog.records if r.name == "luxun.config"] == []


# -- bad values --------------------------------------------------------------------------------
@pytest.mark.parametrize("raw", ["abc", "1.5", "", "1_000", "0x10", "10k", "١٢", "9 0"])
def test_bad_numbers_name_key_and_value(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_properties({"log.retention.hours": raw})
    assert "log.retention.hours" in str(info.value) and repr(raw.strip()) in str(info.value)
    assert info.value.key == "log.retention.hours"


@pytest.mark.parametrize(
    ("key", "raw"),
    [
        ("log.retention.hours", "0"),
        ("log.retention.hours", "2147483648"),
        ("log.cleanup.interval.mins", "0"),
        ("monitoring.period.secs", "-5"),
        ("port", "65536"),
        ("port", "-1"),
        ("metrics.port", "70000"),
        ("brokerid", "2147483648"),
        ("log.flush.count", "-2147483649"),
        ("log.retention.size", "9223372036854775808"),
        ("max.message.size", "0"),
        ("log.backfile.page.size", "4095"),
        ("log.backfile.page.size", "2147483648"),
    ],
)
def test_out_of_range_values_name_key_and_value(key: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_properties({key: raw})
    assert key in str(info.value) and raw in str(info.value)
    assert info.value.key == key


@pytest.mark.parametrize(
    ("key", "raw", "expected"),
    [
        ("port", " 9092 ", 9092),
        ("log.flush.count", "+5", 5),
        ("log.retention.size", "-1", -1),
        ("log.retention.size", "9223372036854775807", (1 << 63) - 1),
        ("log.backfile.page.size", "4096", 4096),
        ("port", "0", 0),
    ],
)
def test_good_numbers(key: str, raw: str, expected: int) -> None:
    config = BrokerConfig.from_properties({key: raw})
    assert getattr(config, config_module._FIELD_BY_KEY[key].name) == expected


@pytest.mark.parametrize("raw", ["topic1", "topic1:abc", ":5", "topic1:", "a/b:5", "topic1:0"])
def test_bad_topic_maps(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"topic\.log\.retention\.hours"):
        BrokerConfig.from_properties({"topic.log.retention.hours": raw})


def test_topic_maps() -> None:
    config = BrokerConfig.from_properties(
        {
            "topic.flush.intervals.ms": " t1 : 10 ,, t2:-1 , t1:20,",
            "topic.log.retention.hours": "a:b:5",
        }
    )
    assert dict(config.topic_flush_intervals_ms) == {"t1": 20, "t2": -1}
    assert dict(config.topic_retention_hours) == {"a:b": 5}
    assert dict(BrokerConfig.from_properties({"topic.flush.intervals.ms": " "}).topic_flush_intervals_ms) == {}
    with pytest.raises(TypeError):
        config.topic_flush_intervals_ms["t3"] = 1  # type: ignore[index]


def test_empty_strings_are_refused() -> None:
    for key in ("log.dir", "host", "metrics.host"):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            BrokerConfig.from_properties({key: "  "})


# -- the dataclass itself --------------------------------------------------------------------
def test_frozen_and_replace_revalidates() -> None:
    config = BrokerConfig(port=1234)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1  # type: ignore[misc]
    assert dataclasses.replace(config, port=4321).port == 4321
    with pytest.raises(ConfigError, match="port"):
        dataclasses.replace(config, port=-3)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"port": True},
        {"port": "9092"},
        {"retention_hours": 1.5},
        {"host": ""},
        {"data_dir": 5},
        {"topic_retention_hours": {"t": 0}},
        {"topic_retention_hours": {"": 3}},
        {"topic_flush_intervals_ms": [("t", 1)]},
        {"password": "md5:nothex"},
    ],
)
def test_direct_construction_is_validated(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        BrokerConfig(**kwargs)


def test_metrics_port_none_means_off() -> None:
    assert not BrokerConfig(metrics_port=None).metrics_enabled
    assert not BrokerConfig(metrics_port=0).metrics_enabled
    assert BrokerConfig(metrics_port=1).metrics_enabled


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"port": 9100, "metrics_port": 9100}, "port (--port) and metrics.port (--metrics-port) are both 9100"),
        ({"port": 9100, "metrics_port": 0, "kafka_port": 9100}, "port (--port) and kafka.port (--kafka-port)"),
        ({"metrics_port": 9100, "kafka_port": 9100}, "metrics.port (--metrics-port) and kafka.port (--kafka-port)"),
        ({"port": 9093}, "are both 9093"),  # the default metrics port
        ({"host": "0.0.0.0", "metrics_host": "127.0.0.2", "metrics_port": 9092}, "are both 9092"),
        ({"kafka_host": "::", "kafka_port": 9093}, "metrics.port (--metrics-port) and kafka.port"),
        ({"kafka_host": "127.0.0.3", "kafka_port": 9092, "host": "127.0.0.3"}, "are both 9092"),
    ],
)
def test_two_listeners_on_one_port_are_refused(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        BrokerConfig(**kwargs)
    props = {config_module._FIELDS[name].metadata["key"]: str(value) for name, value in kwargs.items()}
    with pytest.raises(ConfigError, match=re.escape(named)):
        BrokerConfig.from_properties(props)


def test_listeners_on_distinct_addresses_or_port_0_may_share_the_number() -> None:
    BrokerConfig(port=9100, metrics_host="127.0.0.2", metrics_port=9100)
    BrokerConfig(port=9100, kafka_host="127.0.0.2", kafka_port=9100, metrics_port=0)
    BrokerConfig(port=0, metrics_port=0, kafka_port=0)  # 0: a free port each, never the same
    BrokerConfig(port=0, metrics_port=None)


def test_password_is_not_in_repr() -> None:
    assert "s3cret" not in repr(BrokerConfig(password="plain:s3cret"))


# -- flush interval default (Java: the scheduler interval) -------------------------------------------
def test_flush_interval_defaults_to_the_scheduler_interval() -> None:
    assert _load("log.default.flush.scheduler.interval.ms=500\n").flush_interval_ms == 500
    assert (
        _load("log.default.flush.scheduler.interval.ms=500\nlog.default.flush.interval.ms=70\n").flush_interval_ms == 70
    )
    assert _load("", flush_scheduler_interval_ms=250).flush_interval_ms == 250
    assert _load("log.default.flush.scheduler.interval.ms=500\n", flush_interval_ms=9).flush_interval_ms == 9


# -- overrides ------------------------------------------------------------------------------------
def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    config = _load(
        FULL_SAMPLE,
        data_dir=str(tmp_path / "over"),
        host="0.0.0.0",
        port=9200,
        password="plain:other",
        metrics_port=0,
        retention_hours="12",
    )
    assert config.data_dir == str(tmp_path / "over")
    assert (config.host, config.port, config.metrics_port, config.retention_hours) == ("0.0.0.0", 9200, 0, 12)
    assert config.check_password("other") and not config.check_password("luxun")
    # Untouched keys still come from the file.
    assert config.broker_id == 7 and config.cleanup_interval_mins == 5


def test_none_overrides_are_flags_not_given() -> None:
    config = _load("port=9300\n", port=None, data_dir=None, metrics_port=None)
    assert config.port == 9300 and config.metrics_port == 9093


def test_unknown_override_is_named() -> None:
    with pytest.raises(ConfigError, match=r"unknown override 'prot'; did you mean 'port'\?"):
        _load("", prot=1)


def test_bad_override_values() -> None:
    with pytest.raises(ConfigError, match=r"port.*'abc'"):
        _load("", port="abc")
    with pytest.raises(ConfigError, match=r"port.*70000"):
        _load("", port=70000)


# -- log.dir ---------------------------------------------------------------------------------------
def test_relative_log_dir_is_relative_to_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "server.properties"
    path.write_text("log.dir=./data/../queues\n")
    monkeypatch.chdir(tmp_path)
    config = BrokerConfig.from_file(path)
    # Not relative to the file's directory, and resolved once, at load time.
    assert config.data_dir == str(tmp_path / "queues")
    monkeypatch.chdir(tmp_path / "conf")
    assert config.data_dir == str(tmp_path / "queues")
    assert BrokerConfig.from_file(path).data_dir == str(tmp_path / "conf" / "queues")
    assert _load("", data_dir="rel").data_dir == str(tmp_path / "conf" / "rel")
    assert BrokerConfig(data_dir="x").data_dir == str(tmp_path / "conf" / "x")


def test_absolute_log_dir_is_kept(tmp_path: Path) -> None:
    assert _load(f"log.dir={tmp_path}/d\n").data_dir == f"{tmp_path}/d"


# -- passwords -------------------------------------------------------------------------------------
# Values from Java Luxun's server.properties and Authentication.java javadoc.
@pytest.mark.parametrize(
    ("configured", "given"),
    [
        ("plain:luxun", "luxun"),
        ("md5:3a8cb419bf0d34f5fa091ce416627f82", "luxun"),
        ("crc32:1688323579", "luxun"),
        ("md5:77be29f6d71ec4e310766ddf881ae6a0", "jafka"),
        ("crc32:1725717671", "jafka"),
        ("md5:3A8CB419BF0D34F5FA091CE416627F82", "luxun"),
        ("luxun", "luxun"),
        ("plain: luxun ", "luxun"),
        (" md5 : 3a8cb419bf0d34f5fa091ce416627f82", "luxun"),
        ("plain:a:b", "a:b"),
        ("plain:p\u00e4ss", "p\u00e4ss"),
        ("crc32:+1688323579", "luxun"),
    ],
)
def test_password_forms_accept(configured: str, given: str) -> None:
    assert check_password(configured, given)


@pytest.mark.parametrize(
    ("configured", "given"),
    [
        ("plain:luxun", "Luxun"),
        ("plain:luxun", "luxun "),
        ("plain:luxun", ""),
        ("md5:3a8cb419bf0d34f5fa091ce416627f82", "3a8cb419bf0d34f5fa091ce416627f82"),
        ("md5:3a8cb419bf0d34f5fa091ce416627f82", "jafka"),
        ("crc32:1688323579", "1688323579"),
        ("crc32:1688323579", "jafka"),
        ("luxun", "plain:luxun"),
        ("plain:luxun", None),
    ],
)
def test_password_forms_refuse(configured: str, given: str | None) -> None:
    assert not check_password(configured, given)


@pytest.mark.parametrize("configured", [None, "", "   "])
def test_unset_password_refuses_every_delete(configured: str | None) -> None:
    assert not check_password(configured, "")
    assert not check_password(configured, "luxun")
    assert not BrokerConfig().check_password("")


@pytest.mark.parametrize(
    ("configured", "hint"),
    [
        ("md5:xyz-secret", "32 hex"),
        ("md5:3a8cb419bf0d34f5fa091ce416627f8", "32 hex"),
        ("crc32:abc-secret", "decimal"),
        ("crc32:0x64a1c0fb", "decimal"),
        ("crc32:-1", "outside"),
        ("crc32:4294967296", "outside"),
        ("plain:", "nothing after"),
        ("plain:   ", "nothing after"),
        ("sha1:abc-secret", "unknown scheme 'sha1'"),
    ],
)
def test_malformed_passwords_are_config_errors_without_the_secret(configured: str, hint: str) -> None:
    with pytest.raises(ConfigError, match=hint) as info:
        BrokerConfig.from_properties({"password": configured})
    assert "secret" not in str(info.value) and "password" in str(info.value)
    assert info.value.key == "password"
    with pytest.raises(ConfigError):
        check_password(configured, "anything")


@pytest.mark.parametrize(
    "configured", ["plain:luxun", "luxun", "md5:3a8cb419bf0d34f5fa091ce416627f82", "crc32:1688323579"]
)
def test_password_comparison_goes_through_compare_digest(configured: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert check_password(configured, "luxun")
    assert not check_password(configured, "wrong")
    assert len(calls) == 2
    # Equal-length operands: the time taken does not depend on the given password.
    for a, b in calls:
        assert isinstance(a, bytes) and isinstance(b, bytes) and len(a) == len(b)
    # The decision is compare_digest's: a right password fails when it says no.
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: False)
    assert not check_password(configured, "luxun")


# -- .properties syntax ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=1", {"a": "1"}),
        ("a:1", {"a": "1"}),
        ("a 1", {"a": "1"}),
        ("a\t1", {"a": "1"}),
        ("  a  =  1", {"a": "1"}),
        ("a = = 1", {"a": "= 1"}),
        ("a : : 1", {"a": ": 1"}),
        ("a  :=1", {"a": "=1"}),
        ("a=1=2", {"a": "1=2"}),
        ("a=1   ", {"a": "1   "}),
        ("a=", {"a": ""}),
        ("a", {"a": ""}),
        ("a   ", {"a": ""}),
        ("# comment\n! bang\n  # indented\n\n\t\na=1", {"a": "1"}),
        ("a=1 # not a comment", {"a": "1 # not a comment"}),
        ("a=1\na=2", {"a": "2"}),
        ("a=1\r\nb=2\rc=3\n", {"a": "1", "b": "2", "c": "3"}),
        ("a=one \\\n    two", {"a": "one two"}),
        ("a=x\\\n\\\n  y", {"a": "xy"}),
        ("a=x\\\\\nb=y", {"a": "x\\", "b": "y"}),
        ("a=x\\\\\\\n  y", {"a": "x\\y"}),
        ("# comment \\\na=1", {"a": "1"}),
        ("a=1\\\n# not a comment", {"a": "1# not a comment"}),
        ("a=end\\", {"a": "end"}),
        ("a\\=b=c", {"a=b": "c"}),
        ("a\\:b:c", {"a:b": "c"}),
        ("a\\ b c", {"a b": "c"}),
        ("a=\\ lead", {"a": " lead"}),
        ("a=\\t\\n\\r\\f\\q\\\\", {"a": "\t\n\r\fq\\"}),
        ("a=caf\\u00e9", {"a": "caf\u00e9"}),
        ("\\u006b=v", {"k": "v"}),
        ("a=\\uD83D\\uDE00", {"a": "\U0001f600"}),
        ("a=\u00e9t\u00e9", {"a": "\u00e9t\u00e9"}),
        ("a=1\fb=2", {"a": "1\fb=2"}),
        ("", {}),
    ],
)
def test_properties_syntax(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


def test_malformed_unicode_escape_names_the_line() -> None:
    with pytest.raises(ConfigError, match=r"server\.properties:3: malformed \\uxxxx"):
        parse_properties("a=1\n\nb=\\u12G4\n", source="server.properties")
    with pytest.raises(ConfigError, match="malformed"):
        parse_properties("b=\\u12")


def test_load_properties_encodings(tmp_path: Path) -> None:
    utf8 = tmp_path / "utf8.properties"
    utf8.write_bytes("\ufeffpassword=plain:p\u00e4ss\n".encode())
    assert load_properties(utf8) == {"password": "plain:p\u00e4ss"}
    latin1 = tmp_path / "latin1.properties"
    latin1.write_bytes("password=plain:p\u00e4ss\n".encode("latin-1"))
    assert load_properties(latin1) == {"password": "plain:p\u00e4ss"}


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.properties"
    with pytest.raises(ConfigError, match=r"nope\.properties"):
        load_properties(missing)
    with pytest.raises(ConfigError, match=r"nope\.properties"):
        BrokerConfig.from_file(missing)


def test_kafka_keys_in_the_file() -> None:
    config = _load(
        "kafka.port=9094\nkafka.advertised.host=broker.example\nnum.partitions=4\n"
        "delete.topic.enable=true\ngroup.initial.rebalance.delay.ms=3000\n"
    )
    assert (config.kafka_port, config.kafka_host, config.kafka_advertised_host) == (9094, "", "broker.example")
    assert (config.num_partitions, config.delete_topic_enable, config.group_initial_rebalance_delay_ms) == (
        4,
        True,
        3000,
    )
    with pytest.raises(ConfigError, match=r"num\.partitions"):
        _load("num.partitions=0\n")
    with pytest.raises(ConfigError, match=r"delete\.topic\.enable"):
        _load("delete.topic.enable=yes\n")


def test_group_bounds_in_the_file() -> None:
    """Issue 31, part 2: max.groups and Kafka's offsets.retention keys (docs/groups.md)."""
    default = _load("")
    assert (default.max_groups, default.offsets_retention_minutes) == (10_000, 7 * 24 * 60)
    assert default.offsets_retention_check_interval_ms == 600_000
    config = _load("max.groups=50\noffsets.retention.minutes=2\noffsets.retention.check.interval.ms=1000\n")
    assert (config.max_groups, config.offsets_retention_minutes, config.offsets_retention_check_interval_ms) == (
        50,
        2,
        1000,
    )
    for bad in ("max.groups=0", "offsets.retention.minutes=0", "offsets.retention.check.interval.ms=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0].replace(".", r"\.")):
            _load(bad + "\n")
