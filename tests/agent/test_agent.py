"""``luxun agent`` end to end: Dory's own clients -> a real agent process -> real brokers."""

from __future__ import annotations

import signal
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clients.agent.wire import encode
from clients.consumer import SimpleConsumer
from clients.messages import GZIP, NO_COMPRESSION, pack_codec
from clients.pack import decode_pack

from ._dory import DoryLib, to_dory
from .conftest import AgentProcess, BrokerProcess, address, read_topic

pytestmark = pytest.mark.timeout(240)

Agents = Callable[..., AgentProcess]


def dgram_send(path: str, messages: list[bytes], how: str = "unbound") -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        if how == "connected":
            s.connect(path)
            for m in messages:
                s.send(m)
        else:
            for m in messages:
                s.sendto(m, path)
    finally:
        s.close()


def stream_send(where: str | int, data: bytes) -> socket.socket:
    """Write ``data`` on a new stream connection; return the (open) socket."""
    if isinstance(where, int):
        s = socket.create_connection(("127.0.0.1", where))
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(where)
    s.sendall(data)
    return s


def closed_by_peer(s: socket.socket, timeout_s: float = 10.0) -> bool:
    s.settimeout(timeout_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:  # closed with our unread bytes in its buffer
        return True
    except TimeoutError:
        return False


def test_dory_clients_over_three_transports_arrive_message_by_message(dory: Path, brokers: Any,
                                                                      agents: Agents) -> None:  # fmt: skip
    (b,) = brokers(1)
    a = agents([address(b)])
    n = 300
    to_dory(dory, "--socket-path", a.dgram, "--topic", "dg", "--value", "d", "--count", str(n), "--seq", "--pad", "4",
            "--interval", "0")  # fmt: skip
    to_dory(dory, "--stream-socket-path", a.stream, "--topic", "st", "--value", "s", "--count", str(n), "--seq",
            "--pad", "4", "--key", "k")  # fmt: skip
    to_dory(dory, "--port", str(a.tcp_port), "--topic", "tcp", "--value", "t", "--count", str(n), "--seq", "--pad",
            "4", "--partition-key", "4294967295")  # fmt: skip
    lib = DoryLib(dory)
    lib.send_datagrams(a.dgram, [lib.message(b"lib", b"c%d" % i, partition_key=i, key=b"kk") for i in range(n)])
    dgram_send(a.dgram, [encode(b"py", b"unbound %d" % i) for i in range(50)], "unbound")
    dgram_send(a.dgram, [encode(b"py", b"connected %d" % i) for i in range(50)], "connected")
    big = b"x" * 100_000  # a stream message bigger than a datagram
    stream_send(a.stream, encode(b"big", big) * 3).close()
    total = 4 * n + 100 + 3
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == total, message=f"{total} delivered")

    seq = [b"%04d " % i for i in range(1, n + 1)]
    assert read_topic(b, "dg") == [s + b"d" for s in seq]
    assert read_topic(b, "st") == [s + b"s" for s in seq]  # the Key is dropped, the value kept
    assert read_topic(b, "tcp") == [s + b"t" for s in seq]
    assert read_topic(b, "lib") == [b"c%d" % i for i in range(n)]
    assert read_topic(b, "py") == [b"unbound %d" % i for i in range(50)] + [b"connected %d" % i for i in range(50)]
    assert read_topic(b, "big") == [big] * 3
    c = a.counters()
    assert c["UnixDgInputAgentForwardMsg"] == n + n + 100
    assert c["UnixStreamInputAgentForwardMsg"] == n + 3
    assert c["TcpInputAgentForwardMsg"] == n
    assert c["AgentKeyDropped"] == 2 * n and c["AgentKeyDroppedBytes"] == n * 1 + n * 2
    assert sum(a.discards().values()) == 0
    assert a.stop() == 0
    assert a.summary()["delivered"] == total


def test_every_malformed_case_is_counted_and_the_agent_keeps_going(dory: Path, brokers: Any, agents: Agents) -> None:
    (b,) = brokers(1)
    config = """<doryConfig>
      <inputConfig><maxStreamMsgSize value="1k" /></inputConfig>
      <batching><namedConfigs><config name="c"><time value="20" /><messages value="disable" />
        <bytes value="64k" /></config></namedConfigs>
        <messageMaxBytes value="8k" /><defaultTopic action="perTopic" config="c" /></batching>
      <topicRateLimiting><namedConfigs><config name="two" interval="600000" maxCount="2" />
        <config name="inf" interval="1" maxCount="unlimited" /></namedConfigs>
        <defaultTopic config="inf" /><topicConfigs><topic name="limited" config="two" /></topicConfigs>
      </topicRateLimiting>
      <httpInterface><badMsgPrefixSize value="16" /></httpInterface>
    </doryConfig>"""
    a = agents([address(b)], config=config)
    good = encode(b"ok", b"value", timestamp_ms=5)

    def patch(msg: bytes, offset: int, fmt: str, value: int) -> bytes:
        out = bytearray(msg)
        struct.pack_into(fmt, out, offset, value)
        return bytes(out)

    malformed = [
        b"", good[:7], patch(good, 0, ">i", -1), patch(good, 0, ">i", len(good) - 1),
        patch(good[:8], 0, ">i", 8), patch(good, 8, ">h", 1), encode(b"", b"v"), patch(good, 10, ">h", -3),
        patch(good, 10, ">h", 99), patch(good, 22, ">i", -1), patch(good, 26, ">i", -1),
        patch(good + b"!", 0, ">i", len(good) + 1), patch(good[:-2], 0, ">i", len(good) - 2),
    ]  # fmt: skip
    unsupported_key = [patch(good, 4, ">h", 258), patch(patch(good, 4, ">h", 1), 6, ">h", 1)]
    unsupported_version = [patch(good, 6, ">h", 1), patch(encode(b"ok", b"v", partition_key=1), 6, ">h", 3)]
    bad_topic = [encode(b"a/b", b"v"), encode(b"..", b"v"), encode(b"\xff\xfe", b"v"), encode(b".luxun-x", b"v")]
    too_large = [encode(b"ok", b"L" * 9000, timestamp_ms=5)]
    dgram_send(a.dgram, malformed + unsupported_key + unsupported_version + bad_topic + too_large)
    to_dory(dory, "--socket-path", a.dgram, "--topic", "ok", "--value", "bad", "--bad")  # Size one short
    to_dory(dory, "--socket-path", a.dgram, "--topic", "limited", "--value", "r", "--count", "5")
    dgram_send(a.dgram, [good])
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == 3, message="the good and 2 rate-limited messages")
    d = a.discards()
    assert d["malformed"] == len(malformed) + 1
    assert d["unsupported_api_key"] == 2 and d["unsupported_version"] == 2
    assert d["bad_topic"] == 4 and d["too_large"] == 1 and d["rate_limited"] == 3
    rep = a.get("/discards/json")["unfinished_report"]
    assert len(rep["recent_malformed"]) == 10 and rep["unsupported_versions"] == [
        {"version": 1, "count": 1}, {"version": 3, "count": 1}]  # fmt: skip
    assert rep["rate_limit_discard"] == [{"topic": "limited", "count": 3}]
    assert {"topic": "ok", "min_timestamp": 5, "max_timestamp": 5, "count": 1} in rep["discard_topic"]  # too large
    assert a.counters()["InputAgentDiscardMsgMalformed"] == len(malformed) + 1

    # streams: a complete bad frame is discarded and the connection stays open ...
    for where, prefix in ((a.stream, "UnixStream"), (a.tcp_port, "Tcp")):
        s = stream_send(where, patch(good, 8, ">h", 7) + encode(b"ok", b"after bad") + patch(good, 4, ">h", 9))
        s.sendall(encode(b"ok", b"still open"))
        s.close()
        # ... a Size below 4 closes it ...
        s = stream_send(where, struct.pack(">i", 3) + b"junk")
        assert closed_by_peer(s)
        s.close()
        # ... so does a body over maxStreamMsgSize (1k), before it is sent ...
        s = stream_send(where, struct.pack(">i", 4 + 1025))
        assert closed_by_peer(s)
        s.close()
        # ... and EOF inside a message is an unclean disconnect, its bytes counted apart
        stream_send(where, encode(b"ok", b"whole") + encode(b"ok", b"cut")[:-2]).close()
        a.wait(lambda p=prefix: a.counters().get(f"{p}InputUncleanDisconnect", 0) == 1, message="unclean")  # type: ignore[misc]
        c = a.counters()
        assert c[f"{prefix}InputInvalidSizeField"] == 1 and c[f"{prefix}InputMsgBodyTooLarge"] == 1
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == 3 + 6, message="stream messages")
    assert read_topic(b, "ok") == [b"value"] + [b"after bad", b"still open", b"whole"] * 2
    d = a.discards()
    assert d["malformed"] == len(malformed) + 1 + 2 * 3 and d["unsupported_api_key"] == 4
    rep = a.get("/discards/json")
    assert rep["unfinished_report"]["unix_stream_unclean_disconnect_count"] == 1
    assert rep["unfinished_report"]["tcp_unclean_disconnect_count"] == 1
    assert rep["totals"]["unclean_disconnect_bytes"] == {"unix_stream": len(encode(b"ok", b"cut")) - 2,
                                                         "tcp": len(encode(b"ok", b"cut")) - 2}  # fmt: skip
    # the plain pages tell the same
    assert "malformed msg count: 20" in a.get("/discards/plain")
    assert a.stop() == 0


def test_status_routes_and_shapes(brokers: Any, agents: Agents) -> None:
    import urllib.request

    (b,) = brokers(1)
    a = agents([address(b)])
    dgram_send(a.dgram, [encode(b"s", b"1")])
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == 1, message="one message")
    info = a.get("/server_info/json")
    assert info["pid"] == a.proc.pid and info["brokers"][0]["up"] is True  # type: ignore[union-attr]
    c = a.get("/counters/json")
    assert {"pid", "version", "since", "now", "counters"} <= set(c)
    assert all(set(x) == {"location", "name", "value"} for x in c["counters"])
    d = a.get("/discards/json")
    assert {"pid", "version", "since", "now", "interval", "unfinished_report", "finished_report"} <= set(d)
    for key in ("malformed_msg_count", "unsupported_api_key_msg_count", "unsupported_version_msg_count",
                "bad_topic_msg_count", "unix_stream_unclean_disconnect_count", "tcp_unclean_disconnect_count",
                "recent_malformed", "discard_topic", "rate_limit_discard"):  # fmt: skip
        assert key in d["unfinished_report"]
    q = a.get("/queues/json")
    assert {"pid", "version", "now", "sending", "new"} <= set(q)
    for page in ("server_info", "counters", "discards", "queues", "metadata_fetch_time"):
        assert a.get(f"/{page}/plain")
        a.get(f"/{page}/json")
    assert "UnixDgInputAgentForwardMsg=1" in a.get("/counters/plain")
    assert "<html>" in a.get("/")
    assert 'luxun_agent_delivered_total{topic="s"} 1' in a.get("/metrics")
    req = urllib.request.Request(f"http://127.0.0.1:{a.status_port}/metadata_update", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
    assert a.counters()["MetadataUpdateRequest"] == 1
    assert a.stop() == 0


def test_partition_key_picks_a_broker_stably_and_the_next_when_it_is_down(brokers: Any, agents: Agents) -> None:
    bs = brokers(3)
    a = agents([address(x) for x in bs])
    msgs = [encode(b"pk", b"%d:%d" % (k, i), partition_key=k) for i in range(20) for k in (0, 1, 2, 4, 2**32 - 1)]
    dgram_send(a.dgram, msgs)
    for j in range(6):  # six batches (100 ms apart): round robin over the three brokers
        dgram_send(a.dgram, [encode(b"any", b"%d" % i) for i in range(j * 100, j * 100 + 100)])
        time.sleep(0.25)
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == len(msgs) + 600, message="all delivered")
    on = [read_topic(x, "pk") for x in bs]
    assert sorted(on[0]) == sorted([b"0:%d" % i for i in range(20)] + [b"4294967295:%d" % i for i in range(20)])
    assert sorted(on[1]) == sorted([b"1:%d" % i for i in range(20)] + [b"4:%d" % i for i in range(20)])
    assert on[2] == [b"2:%d" % i for i in range(20)]
    spread = [len(read_topic(x, "any")) for x in bs]
    assert sum(spread) == 600 and all(n > 0 for n in spread), spread
    # broker 1 goes down: key 1 goes to broker 2, the next one, and nothing is lost
    bs[1].stop()
    dgram_send(a.dgram, [encode(b"pk2", b"%d" % i, partition_key=1) for i in range(30)])
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == len(msgs) + 630, message="rerouted")
    assert read_topic(bs[2], "pk2") == [b"%d" % i for i in range(30)]
    assert sum(a.discards().values()) == 0
    assert a.stop() == 0


def test_a_broker_killed_and_restarted_loses_nothing_the_agent_held(brokers: Any, agents: Agents) -> None:
    (b,) = brokers(1)
    # Enough attempts for a restart on a loaded machine (5, Dory's default, ran out once in
    # CI while the broker came back): what is tested is that nothing held is lost.
    keep = '<doryConfig><msgDelivery><maxFailedDeliveryAttempts value="1000" /></msgDelivery></doryConfig>'
    a = agents([address(b)], config=keep)
    sent = 0
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.connect(a.dgram)
    killed = restarted = False
    start = time.monotonic()
    while sent < 6000:
        s.send(encode(b"r", b"%d" % sent))
        sent += 1
        if sent % 100 == 0:
            time.sleep(0.01)
        if sent == 1500 and not killed:
            b.stop(signal.SIGKILL)
            killed = True
        if sent == 3500 and not restarted:
            b.start()
            restarted = True
    s.close()
    assert killed and restarted and time.monotonic() - start < 60
    a.wait(lambda: a.counters().get("MsgDelivered", 0) + sum(a.discards().values()) == sent, message="settled")
    assert sum(a.discards().values()) == 0
    assert a.counters()["SendProduceRequestFail"] >= 1  # it did see the broker down
    got = read_topic(b, "r")
    assert set(got) == {b"%d" % i for i in range(sent)}  # a resend after a lost answer may duplicate
    assert len(got) >= sent
    assert a.stop() == 0


def test_a_pack_the_broker_refuses_is_counted_and_the_agent_goes_on(tmp_path: Path, agents: Agents) -> None:
    """A broker whose max.message.size is below the agent's packs refuses them (an answer,
    not a lost connection): the agent counts their messages as too large, once, and
    delivers the packs the broker takes."""
    props = tmp_path / "server.properties"
    props.write_text("max.message.size=4096\n")
    b = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", "--config", str(props)).start()
    try:
        one_batch = """<doryConfig><batching><namedConfigs><config name="b"><time value="300" />
          <messages value="disable" /><bytes value="disable" /></config></namedConfigs>
          <defaultTopic action="perTopic" config="b" /></batching></doryConfig>"""
        a = agents([address(b)], config=one_batch)
        dgram_send(a.dgram, [encode(b"big", b"%04d" % i + b"x" * 96) for i in range(200)])  # 20 KB in 300 ms
        a.wait(lambda: sum(a.discards().values()) + a.counters().get("MsgDelivered", 0) == 200, message="settled")
        assert a.discards()["too_large"] > 0
        assert len(read_topic(b, "big")) + a.discards()["too_large"] == 200
        assert "refused" in a.log()
        dgram_send(a.dgram, [encode(b"small", b"alone")])  # a pack under the limit still goes
        a.wait(lambda: read_topic(b, "small") == [b"alone"], message="the small pack delivered")
        assert a.counters()["MsgDelivered"] + a.discards()["too_large"] == 201
        assert sum(a.discards().values()) == a.discards()["too_large"]
        assert a.stop() == 0
    finally:
        b.stop()


def test_a_full_pool_discards_no_memory_and_counts_add_up(brokers: Any, agents: Agents) -> None:
    (b,) = brokers(1)
    b.stop()
    a = agents([address(b)], "--max-buffer", "64k")
    sent = 2000
    dgram_send(a.dgram, [encode(b"m", b"v" * 100 + b"%d" % i) for i in range(sent)])
    a.wait(lambda: a.discards()["no_memory"] > 0 and a.counters()["UnixDgInputAgentForwardMsg"] + a.discards()[
        "no_memory"] == sent, message="the pool filled")  # fmt: skip
    assert a.counters()["PoolBytesPeak"] <= 64 * 1024
    b.start()
    a.wait(lambda: a.counters().get("MsgDelivered", 0) + sum(a.discards().values()) == sent, message="counts add up")
    delivered = a.counters()["MsgDelivered"]
    assert 0 < delivered < sent
    got = read_topic(b, "m")
    assert len(got) == delivered and a.get("/discards/json")["totals"]["by_topic"]["m"]["no_memory"] == sent - delivered
    assert a.stop() == 0


def test_batches_queued_for_a_broker_go_in_one_round_trip(brokers: Any, agents: Agents) -> None:
    """Luxun's produce takes one pack of one topic, so queued batches (here of 40 topics,
    waiting for a broker that was down) are pipelined: all written, then all answers read."""
    (b,) = brokers(1)
    b.stop()
    config = """<doryConfig><batching><namedConfigs><config name="c"><time value="500" /><messages value="5" />
      <bytes value="disable" /></config></namedConfigs><defaultTopic action="perTopic" config="c" /></batching>
      <msgDelivery><maxFailedDeliveryAttempts value="1000" /></msgDelivery></doryConfig>"""
    a = agents([address(b)], config=config)
    topics = [b"pipe%d" % i for i in range(40)]
    dgram_send(a.dgram, [encode(t, b"%s-%d" % (t, i)) for i in range(5) for t in topics])
    a.wait(lambda: sum(q["send_wait"] + q["ack_wait"] for q in a.get("/queues/json")["sending"]) == 200,
           message="40 batches queued")  # fmt: skip
    b.start()
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == 200, message="delivered")
    c = a.counters()
    assert c["SendProduceRequestOk"] == 40
    assert c["SendProduceRoundTrip"] - c["SendProduceRequestFail"] <= 4, c  # 16 packs per round trip at most
    for t in topics:
        assert read_topic(b, t.decode()) == [b"%s-%d" % (t, i) for i in range(5)]
    assert a.stop() == 0


def test_runs_of_one_topic_and_key_fill_batches_in_order_across_dispatches(brokers: Any, agents: Agents) -> None:
    """The router looks a topic and its batch up once per run of messages with the same
    topic and partition key: runs longer than a batch (5 messages here) continue in a new
    batch once the full one is dispatched, and runs broken by another topic, another key
    or a bad topic pick the right batch up again. Every message arrives, in order per
    topic and key, in packs of at most 5."""
    (b,) = brokers(1)
    config = """<doryConfig><batching><namedConfigs><config name="c"><time value="300" /><messages value="5" />
      <bytes value="disable" /></config></namedConfigs><defaultTopic action="perTopic" config="c" /></batching>
      </doryConfig>"""
    a = agents([address(b)], config=config)
    runs = [(b"ra", None, 12), (b"rb", 7, 3), (b"bad/topic", None, 2), (b"ra", None, 11), (b"rb", 7, 7),
            (b"rb", 8, 4), (b"ra", None, 1), (b"rb", 7, 5)]  # fmt: skip
    want: dict[tuple[bytes, int | None], list[bytes]] = {}
    msgs = []
    for topic, pk, n in runs:
        for _ in range(n):
            seq = want.setdefault((topic, pk), [])
            value = b"%s/%s/%d" % (topic, str(pk).encode(), len(seq))
            seq.append(value)
            msgs.append(encode(topic, value, partition_key=pk))
    dgram_send(a.dgram, msgs)
    good = len(msgs) - 2
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == good, message="delivered")
    assert a.discards()["bad_topic"] == 2
    assert read_topic(b, "ra") == want[(b"ra", None)]
    got_rb = read_topic(b, "rb")
    for pk in (7, 8):  # one broker: both keys land in one topic, each in its own order
        assert [v for v in got_rb if v.startswith(b"rb/%d/" % pk)] == want[(b"rb", pk)]
    assert len(got_rb) == 19
    with SimpleConsumer(address(b), raw=True) as raw:
        for t in ("ra", "rb"):
            packs = raw.consume_by_index(t, 0).messages
            assert packs and all(1 <= len(decode_pack(p)) <= 5 for p in packs), t
    assert a.stop() == 0


def _rss_mib(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak) of a process, MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line[:5]] = int(line.split()[1]) / 1024
    return out


def test_rss_stays_within_the_pool_when_it_fills_with_small_then_large_messages(brokers: Any,
                                                                                agents: Agents) -> None:  # fmt: skip
    """The pool filled in turn by 100 B and 1 KB messages, twice, drained in between: the
    agent's peak RSS stays within its idle RSS + the pool, and it goes back near idle once
    drained (was 126 MiB peak, 125 drained, for idle 33 + pool 48: small messages' objects
    kept pymalloc arenas, large ones the malloc arenas)."""
    (b,) = brokers(1)
    b.stop()
    pool_mib = 48
    keep = '<doryConfig><msgDelivery><maxFailedDeliveryAttempts value="100000" /></msgDelivery></doryConfig>'
    a = agents([address(b)], "--max-buffer", f"{pool_mib}m", config=keep)
    assert a.proc is not None
    idle = _rss_mib(a.proc.pid)["VmRSS"]
    sent = 0
    for size in (100, 1000, 100, 1000):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(a.stream)
        block = encode(b"mem%d" % size, b"v" * size) * 500
        before = a.discards().get("no_memory", 0)
        for _ in range(1000):  # until the pool is full (at most 500 k messages)
            s.sendall(block)
            sent += 500
            if a.discards().get("no_memory", 0) > before + 1000:
                break
        s.close()
        assert a.discards().get("no_memory", 0) > before, f"the pool never filled with {size} B messages"
        b.start()
        a.wait(lambda n=sent: a.counters()["PoolBytesUsed"] == 0 and a.counters()["MsgDelivered"] + sum(
            a.discards().values()) == n, 60, "drained")  # fmt: skip
        b.stop()
        rss = _rss_mib(a.proc.pid)
        assert rss["VmHWM"] <= idle + pool_mib * 1.05 + 4, f"{size} B: peak {rss} MiB; idle {idle}, pool {pool_mib}"
        assert rss["VmRSS"] <= idle + pool_mib * 0.25, f"{size} B: drained, still {rss} MiB; idle {idle}"
    assert a.stop() == 0


def test_sigint_and_sigterm_deliver_what_is_buffered_then_discard_past_the_delay(brokers: Any, agents: Agents) -> None:
    (b,) = brokers(1)
    slow = """<doryConfig><batching><namedConfigs><config name="slow"><time value="60000" />
      <messages value="disable" /><bytes value="disable" /></config></namedConfigs>
      <defaultTopic action="perTopic" config="slow" /></batching>
      <msgDelivery><shutdownMaxDelay value="1000" /></msgDelivery></doryConfig>"""
    a = agents([address(b)], config=slow)
    dgram_send(a.dgram, [encode(b"late", b"%d" % i) for i in range(100)])
    a.wait(lambda: a.get("/queues/json")["sending"] == [{"topic": "late", "batch": 100, "send_wait": 0,
                                                         "ack_wait": 0}], message="batched")  # fmt: skip
    assert "100 total batch" in a.get("/queues/plain")
    assert a.stop(signal.SIGINT) == 0  # Ctrl-C stops it as SIGTERM does
    assert read_topic(b, "late") == [b"%d" % i for i in range(100)]
    assert a.summary()["delivered"] == 100

    b.stop()  # no broker: what is buffered is discarded after shutdownMaxDelay, counted
    a = agents([address(b)], config=slow)
    dgram_send(a.dgram, [encode(b"lost", b"%d" % i) for i in range(50)])
    a.wait(lambda: a.counters()["UnixDgInputAgentForwardMsg"] == 50, message="read")
    t = time.monotonic()
    assert a.stop() == 0
    assert time.monotonic() - t < 10
    summary = a.summary()
    assert summary["discarded"]["shutdown"] + summary["discarded"]["broker_failure"] == 50
    assert summary["delivered"] == 0 and summary["buffered_bytes"] == 0


def test_compression_per_topic_and_topic_autocreate_off(brokers: Any, agents: Agents) -> None:
    (b,) = brokers(1)
    conf = """<doryConfig>
      <compression><namedConfigs><config name="g" type="gzip" minSize="100" />
        <config name="n" type="none" /></namedConfigs><sizeThresholdPercent value="75" />
        <defaultTopic config="n" /><topicConfigs><topic name="zipped" config="g" /></topicConfigs></compression>
      <msgDelivery><topicAutocreate enable="false" /></msgDelivery></doryConfig>"""
    # topics must exist on the broker before the agent reads the list
    from idl import luxun_thrift as T

    client = b.client()
    for t in ("zipped", "plain"):
        assert client.produce(T.ProduceRequest(item=b"not a pack", topic=t)).result.resultCode == T.ResultCode.SUCCESS
    client.close()
    a = agents([address(b)], config=conf)
    lines = [b"the same line again %d" % (i % 2) for i in range(200)]
    dgram_send(a.dgram, [encode(b"zipped", m) for m in lines] + [encode(b"plain", m) for m in lines])
    dgram_send(a.dgram, [encode(b"unknown", b"x")])
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == 400, message="delivered")
    assert a.discards()["bad_topic"] == 1
    with SimpleConsumer(address(b), raw=True) as raw:
        items = {t: raw.consume_by_index(t, 1).messages for t in ("zipped", "plain")}
    assert {pack_codec(i) for i in items["zipped"]} == {GZIP}
    assert {pack_codec(i) for i in items["plain"]} == {NO_COMPRESSION}
    assert read_topic_from(b, "zipped", 1) == lines
    assert a.stop() == 0


def read_topic_from(b: Any, topic: str, index: int) -> list[bytes]:
    out: list[bytes] = []
    with SimpleConsumer(address(b)) as c:
        while True:
            f = c.consume_by_index(topic, index)
            if not f.messages:
                return out
            out.extend(f.messages)
            index = f.next_index  # type: ignore[assignment]


def test_the_readme_python_sender_works(brokers: Any, agents: Agents) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Local agent (Dory-compatible)") :]
    code = section[section.index("```python\n") + len("```python\n") :]
    code = code[: code.index("```")]
    assert "/tmp/luxun-agent.dgram" in code
    (b,) = brokers(1)
    a = agents([address(b)])
    exec(compile(code.replace("/tmp/luxun-agent.dgram", a.dgram), "README.md", "exec"), {})
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == 1, message="the README's message")
    assert read_topic(b, "agent-clicks") == [b'{"page": "/"}']
    assert a.stop() == 0


def test_a_datagram_over_max_datagram_msg_size_is_cut_and_malformed(brokers: Any, agents: Agents) -> None:
    (b,) = brokers(1)
    a = agents([address(b)], config="<doryConfig><inputConfig><maxDatagramMsgSize value='1k' /></inputConfig>"
                                    "</doryConfig>")  # fmt: skip
    dgram_send(a.dgram, [encode(b"d", b"x" * 2000), encode(b"d", b"y" * 900), encode(b"d", b"z" * 1024)])
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == 1, message="the one that fits")
    assert a.discards()["malformed"] == 2
    assert read_topic(b, "d") == [b"y" * 900]
    assert a.stop() == 0


def test_datagrams_reach_the_router_in_chunks_not_one_wake_up_per_few(brokers: Any, agents: Agents) -> None:
    """A datagram sender is held after net.unix.max_dgram_qlen (10) messages, so the agent's
    socket is empty every few messages; handing each few to the router cost a wake-up (a
    context switch) per ~2 messages. The reader now hands over after a short quiet time."""
    (b,) = brokers(1)
    a = agents([address(b)])
    n = 3000
    dgram_send(a.dgram, [encode(b"chunks", b"m%d" % i) for i in range(n)], "connected")
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == n, message=f"{n} delivered")
    handovers = a.counters()["AgentInputHandovers"]
    assert handovers <= 100, f"{handovers} hand-overs for {n} datagrams sent back to back"
    assert read_topic(b, "chunks") == [b"m%d" % i for i in range(n)]


def test_a_steady_trickle_of_datagrams_is_handed_over_within_milliseconds(brokers: Any, agents: Agents) -> None:
    """The reader keeps datagrams until 2 ms pass without one: a sender that never pauses
    that long must not leave them with the reader until 512 have come (up to 0.25 s here)."""
    import threading

    (b,) = brokers(1)
    a = agents([address(b)])
    sent = [0]
    stop = threading.Event()

    def send() -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.connect(a.dgram)
        while not stop.is_set() and sent[0] < 20_000:
            s.send(encode(b"trickle", b"%d" % sent[0]))
            sent[0] += 1
            time.sleep(0.0005)
        s.close()

    sender = threading.Thread(target=send)
    sender.start()
    lags = []
    try:
        for _ in range(8):
            time.sleep(0.13)
            before = sent[0]
            lags.append(before - a.counters()["UnixDgInputAgentForwardMsg"])
    finally:
        stop.set()
        sender.join()
    assert max(lags) < 200, f"datagrams sent but not yet routed, sampled: {lags}"
    a.wait(lambda: a.counters().get("MsgDelivered", 0) == sent[0], message="delivered")


def test_start_errors_are_one_line_exit_2_and_leave_nothing(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    regular = tmp_path / "file"
    regular.write_text("")
    cases = [
        (["--dgram", str(tmp_path / "d")], "no broker"),
        (["--broker", "127.0.0.1:1"], "no input"),
        (["--broker", "h:99999", "--dgram", str(tmp_path / "d")], "--broker"),
        (["--broker", "127.0.0.1:1", "--tcp-port", str(port), "--status-port", "0"], f"127.0.0.1:{port}"),
        (["--broker", "127.0.0.1:1", "--dgram", str(tmp_path / "d"), "--status-port", str(port)], "status port"),
        (["--broker", "127.0.0.1:1", "--dgram", str(regular), "--status-port", "0"], "is not a socket"),
        (["--broker", "127.0.0.1:1", "--dgram", str(tmp_path / "no/dir/d"), "--status-port", "0"], "cannot bind"),
        (
            ["--broker", "127.0.0.1:1", "--dgram", str(tmp_path / "d"), "--config", str(tmp_path / "none.xml")],
            "cannot read Dory config",
        ),
    ]
    try:
        for extra, needle in cases:
            run = subprocess.run([sys.executable, "-m", "luxun.cli", "agent", *extra], capture_output=True, text=True,
                                 timeout=30)  # fmt: skip
            assert run.returncode == 2, (extra, run.stderr)
            lines = run.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("luxun: ") and needle in lines[0], (extra, run.stderr)
            assert "Traceback" not in run.stderr
        assert not (tmp_path / "d").exists() and regular.read_text() == ""
        for bad in ("fast", "0", "-1"):  # the GIL switch interval knob
            run = subprocess.run([sys.executable, "-m", "luxun.cli", "agent", "--broker", "127.0.0.1:1", "--dgram",
                                  str(tmp_path / "d")], capture_output=True, text=True, timeout=30,
                                 env=dict(os.environ, LUXUN_AGENT_SWITCH_S=bad))  # fmt: skip
            assert run.returncode == 2 and run.stderr.startswith("luxun: LUXUN_AGENT_SWITCH_S="), (bad, run.stderr)
            assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "d").exists()
    finally:
        taken.close()
