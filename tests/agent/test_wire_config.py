"""The wire format against Dory's own C library, and the Dory config subset."""

from __future__ import annotations

import itertools
import random
import struct
from pathlib import Path

import pytest

from clients.agent.config import AgentConfigError, load_dory_config
from clients.agent.wire import (
    Malformed,
    Message,
    Run,
    UnsupportedApiKey,
    UnsupportedVersion,
    encode,
    parse,
    parse_checked,
    parse_runs,
)

from ._dory import DoryLib

pytestmark = pytest.mark.timeout(120)


def test_our_encoding_is_byte_for_byte_dorys_and_parses_back(dory: Path) -> None:
    lib = DoryLib(dory)
    # the example of Dory's doc: 0x31 = 49 bytes for test_topic / hello world (28 bytes of overhead)
    assert lib.size(b"test_topic", b"", b"hello world", partition_key=False) == 49
    assert lib.size(b"test_topic", b"", b"hello world", partition_key=True) == 53
    for pk in (None, 0, 7, 2**31 - 1, -1):
        for key in (b"", b"k3y"):
            theirs = lib.message(b"t\xc3\xa9", b"v" * 300, key=key, partition_key=pk, timestamp_ms=1234567890123)
            ours = encode(b"t\xc3\xa9", b"v" * 300, key=key, partition_key=pk, timestamp_ms=1234567890123)
            assert ours == theirs
            m = parse(theirs)
            assert (m.topic, m.key, m.value, m.timestamp_ms) == (b"t\xc3\xa9", key, b"v" * 300, 1234567890123)
            assert m.partition_key == (None if pk is None else pk & 0xFFFFFFFF)  # read as uint32


def _bad_cases() -> list[tuple[str, bytes, type]]:
    good = encode(b"topic", b"value", timestamp_ms=1)
    goodk = encode(b"topic", b"value", partition_key=3)

    def patch(msg: bytes, offset: int, fmt: str, value: int) -> bytes:
        b = bytearray(msg)
        struct.pack_into(fmt, b, offset, value)
        return bytes(b)

    return [
        ("empty", b"", Malformed),
        ("7 bytes", good[:7], Malformed),
        ("Size negative", patch(good, 0, ">i", -5), Malformed),
        ("Size one short (to_dory --bad)", patch(good, 0, ">i", len(good) - 1), Malformed),
        ("Size one more", patch(good, 0, ">i", len(good) + 1), Malformed),
        ("ApiKey 255", patch(good, 4, ">h", 255), UnsupportedApiKey),
        ("ApiKey before version", patch(patch(good, 4, ">h", 300), 6, ">h", 9), UnsupportedApiKey),
        ("version 1", patch(good, 6, ">h", 1), UnsupportedVersion),
        ("PartitionKey version 2", patch(goodk, 6, ">h", 2), UnsupportedVersion),
        ("header only", patch(good[:8], 0, ">i", 8), Malformed),
        ("Flags 1", patch(good, 8, ">h", 1), Malformed),
        ("TopicSize 0", encode(b"", b"value"), Malformed),
        ("TopicSize negative", patch(good, 10, ">h", -1), Malformed),
        ("TopicSize past the end", patch(good, 10, ">h", 200), Malformed),
        ("KeySize negative", patch(good, 12 + 5 + 8, ">i", -1), Malformed),
        ("ValueSize negative", patch(good, 12 + 5 + 12, ">i", -1), Malformed),
        ("value truncated", patch(good[:-1], 0, ">i", len(good) - 1), Malformed),
        ("bytes after the value", patch(good + b"!", 0, ">i", len(good) + 1), Malformed),
        ("PartitionKey truncated", patch(goodk[:14], 0, ">i", 14), Malformed),
    ]


@pytest.mark.parametrize(("name", "data", "error"), _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_validation_order(name: str, data: bytes, error: type) -> None:
    with pytest.raises(error):
        parse(data)


def _flatten(items: list[Run | bytes]) -> list[tuple[bytes, Message | None]]:
    """parse_runs' answer message by message: (the run's topic, the message) for a message
    of a run, (the bytes, None) for one left to parse_checked."""
    out: list[tuple[bytes, Message | None]] = []
    for item in items:
        if isinstance(item, Run):
            assert item.count == len(item.timestamps) > 0
            fields = item.fields()
            assert b"".join(len(f[4]).to_bytes(4, "big") + f[4] for f in fields) == item.values
            assert item.size == sum(len(encode(f[0], f[4], partition_key=f[1])) for f in fields)
            out.extend((item.topic, Message(*f)) for f in fields)
        else:
            out.append((item, None))
    return out


def test_parse_runs_reads_what_parse_checked_reads_and_leaves_the_rest_to_it() -> None:
    """The many-message fast path gives, in order, the messages parse_checked reads for every
    valid message without a Key (grouped in runs of one topic and partition key), and the
    bytes of every other message (keyed, or failing any check), so that parse_checked
    decides those: over the bad cases, and over random byte changes and cuts of messages
    sent right after a valid one of the same shape (the run's shortcut compares with it)."""
    rng = random.Random(3)
    valid = [
        encode(b"t", b"v"),
        encode(b"u", b"v"),  # same length and shape as the one before, another topic
        encode(b"topic", b""),
        encode(b"t" * 300, b"x" * 5000, timestamp_ms=-7),
        encode(b"k", b"v", partition_key=2**32 - 1),
        encode(b"k", b"v", partition_key=0, timestamp_ms=9),  # same length, another key
        encode(b"k", b"vv", partition_key=0),
    ]
    keyed = [encode(b"t", b"v", key=b"key"), encode(b"t", b"", key=b"v"), encode(b"t", b"v", partition_key=5, key=b"k")]
    messages = valid + keyed + [data for _, data, _ in _bad_cases()]
    for _ in range(3000):
        base = rng.choice(valid + keyed)
        messages.append(base)
        b = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        messages.append(bytes(b[: rng.randint(0, len(b))]) if rng.random() < 0.2 else bytes(b))
        if rng.random() < 0.3:  # a run: the same message with another timestamp
            f = parse_checked(base)
            ts = rng.randrange(-(2**63), 2**63)
            messages.append(encode(f[0], f[4], partition_key=f[1], timestamp_ms=ts, key=f[3]))
    items = parse_runs(messages)
    got = _flatten(items)
    assert len(got) == len(messages)
    for data, (topic, m) in zip(messages, got, strict=True):
        try:
            want = Message(*parse_checked(data))
        except ValueError:
            assert m is None and topic == data
            continue
        if want.key:
            assert m is None and topic == data
        elif m is None:  # a valid message the fast path leaves: only one with a Key
            raise AssertionError(f"fast path missed a valid message without a Key: {data!r}")
        else:
            assert (topic, m) == (want.topic, want), data
            assert parse(data) == want
    for a, b in itertools.pairwise(items):  # runs are as long as they can be
        if isinstance(a, Run) and isinstance(b, Run):
            assert (a.topic, a.pk) != (b.topic, b.pk)
    assert sum(isinstance(i, Run) for i in items) < len(messages) // 2
    # longer than max_len: left to parse_checked (the router discards it as too large)
    long, short = encode(b"t", b"x" * 100), encode(b"t", b"y")
    assert _flatten(parse_runs([short, long, short], len(long) - 1)) == [
        (b"t", Message(b"t", None, 0, b"", b"y")), (long, None), (b"t", Message(b"t", None, 0, b"", b"y"))]  # fmt: skip


EXAMPLE = """<?xml version="1.0" encoding="US-ASCII"?>
<doryConfig>
  <batching>
    <namedConfigs>
      <config name="fast"><time value="5" /><messages value="disable" /><bytes value="4k" /></config>
      <config name="slow"><time value="10000" /><messages value="100" /><bytes value="disable" /></config>
    </namedConfigs>
    <produceRequestDataLimit value="1024k" />
    <messageMaxBytes value="100k" />
    <combinedTopics enable="true" config="slow" />
    <defaultTopic action="combinedTopics" config="" />
    <topicConfigs>
      <topic name="quick" action="perTopic" config="fast" />
      <topic name="single" action="disable" />
    </topicConfigs>
  </batching>
  <compression>
    <namedConfigs>
      <config name="s" type="snappy" minSize="1k" />
      <config name="g" type="gzip" minSize="128" level="3" />
      <config name="n" type="none" />
    </namedConfigs>
    <sizeThresholdPercent value="60" />
    <defaultTopic config="n" />
    <topicConfigs><topic name="zipped" config="g" /><topic name="snapped" config="s" /></topicConfigs>
  </compression>
  <topicRateLimiting>
    <namedConfigs>
      <config name="zero" interval="1" maxCount="0" />
      <config name="inf" interval="1" maxCount="unlimited" />
      <config name="c2" interval="15000" maxCount="4k" />
    </namedConfigs>
    <defaultTopic config="inf" />
    <topicConfigs><topic name="muted" config="zero" /><topic name="slowed" config="c2" /></topicConfigs>
  </topicRateLimiting>
  <inputSources>
    <unixDatagram enable="true"><path value="/tmp/x/dg" /><mode value="0222" /></unixDatagram>
    <unixStream enable="false"><path value="/tmp/x/st" /><mode value="0222" /></unixStream>
    <tcp enable="true"><port value="9000" /></tcp>
  </inputSources>
  <inputConfig>
    <maxBuffer value="2m" /><maxDatagramMsgSize value="32k" />
    <allowLargeUnixDatagrams value="false" /><maxStreamMsgSize value="1m" />
  </inputConfig>
  <msgDelivery>
    <topicAutocreate enable="false" /><maxFailedDeliveryAttempts value="7" />
    <shutdownMaxDelay value="1500" /><kafkaSocketTimeout value="3" /><minPauseDelay value="5000" />
  </msgDelivery>
  <httpInterface>
    <port value="9191" /><loopbackOnly value="false" />
    <discardReportInterval value="60" /><badMsgPrefixSize value="32" />
  </httpInterface>
  <kafkaConfig><clientId value="dory" /></kafkaConfig>
  <initialBrokers><broker host="b1" port="9092" /><broker host="b2" port="9093" /></initialBrokers>
</doryConfig>
"""


def test_dory_config_subset(tmp_path: Path) -> None:
    path = tmp_path / "dory.xml"
    path.write_text(EXAMPLE)
    cfg = load_dory_config(path)
    assert cfg.brokers == ("b1:9092", "b2:9093")
    assert cfg.batching("quick").time_ms == 5 and cfg.batching("quick").bytes == 4096
    assert cfg.batching("other").messages == 100 and cfg.batching("other").time_ms == 10000
    assert cfg.batching("single").messages == 1
    assert cfg.message_max_bytes == 100 * 1024
    assert cfg.compression("zipped").codec == "gzip" and cfg.compression("zipped").min_size_bytes == 128
    assert cfg.compression("snapped").min_size_bytes == 1024 and cfg.compression("x").codec == "none"
    assert cfg.compression_size_threshold_percent == 60
    muted = cfg.rate_limit("muted")
    assert muted is not None and muted.max_count == 0
    slowed = cfg.rate_limit("slowed")
    assert slowed is not None and (slowed.interval_ms, slowed.max_count) == (15000, 4096)
    assert cfg.rate_limit("other") is None
    assert (cfg.dgram_path, cfg.dgram_mode, cfg.stream_path, cfg.tcp_port) == ("/tmp/x/dg", 0o222, None, 9000)
    assert (cfg.max_buffer_bytes, cfg.max_datagram_bytes, cfg.max_stream_msg_bytes) == (2 << 20, 32 << 10, 1 << 20)
    assert not cfg.topic_autocreate and cfg.max_failed_delivery_attempts == 7
    assert cfg.shutdown_max_delay_ms == 1500 and cfg.broker_timeout_ms == 3000
    assert cfg.status_port == 9191 and cfg.discard_report_interval_s == 60 and cfg.bad_msg_prefix_bytes == 32
    ignored = "\n".join(cfg.ignored)
    for name in ("produceRequestDataLimit", "minPauseDelay", "kafkaConfig", "loopbackOnly", "combinedTopics", "level"):
        assert name in ignored


@pytest.mark.parametrize(
    ("xml", "needle"),
    [
        ("<kafka/>", "not <doryConfig>"),
        ("<doryConfig><inputConfig><maxBuffer value='12q' /></inputConfig></doryConfig>", "maxBuffer"),
        (
            "<doryConfig><compression><namedConfigs><config name='l' type='lz4' /></namedConfigs></compression>"
            "</doryConfig>",
            "'l': type 'lz4' is not none, gzip or snappy .a Luxun pack cannot carry lz4",
        ),
        ("<doryConfig><batching><defaultTopic action='perTopic' config='nope' /></batching></doryConfig>", "nope"),
        ("<doryConfig", "cannot read"),
    ],
)
def test_bad_config_is_one_clear_error(tmp_path: Path, xml: str, needle: str) -> None:
    path = tmp_path / "dory.xml"
    path.write_text(xml)
    with pytest.raises(AgentConfigError, match=needle):
        load_dory_config(path)


@pytest.mark.parametrize("codec", [0, 1, 2])
def test_a_pack_from_written_values_equals_encode_pack(codec: int) -> None:
    """The agent's batches are the values written as a pack lists them (i32 length, bytes):
    clients.pack.encode_pack_written must make the same item encode_pack makes."""
    from clients.messages import decode_pack, encode_pack, snappy_available
    from clients.pack import encode_pack_written

    if codec == 2 and not snappy_available():
        pytest.skip("python-snappy is not installed")
    values = [b"", b"a", b"\x00" * 300, "é".encode() * 1000]
    written = bytearray(b"".join(struct.pack(">i", len(v)) + v for v in values))
    item = encode_pack_written(len(values), written, codec)
    assert item == encode_pack(values, codec)
    assert decode_pack(item) == values


def test_a_pack_as_parts_is_the_pack_and_holds_the_batch_buffer_itself() -> None:
    """The agent sends an uncompressed pack as its parts (pack_written_parts): joined, they
    are encode_pack_written's item, crc32 included (a wrong crc fails decode_pack), and the
    batch's buffer is one of them, not a copy."""
    from clients.messages import decode_pack
    from clients.pack import encode_pack_written, pack_written_parts

    for values in ([], [b""], [b"a", b"\x00" * 300, "é".encode() * 1000]):
        written = bytearray(b"".join(struct.pack(">i", len(v)) + v for v in values))
        parts = pack_written_parts(len(values), written)
        assert any(p is written for p in parts)
        item = b"".join(parts)
        assert item == encode_pack_written(len(values), bytes(written))
        assert decode_pack(item) == values
