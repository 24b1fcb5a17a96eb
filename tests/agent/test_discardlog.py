"""Dory's discard log file (discardLogging): the line format, rotation, and an agent writing it."""

from __future__ import annotations

import base64
import re
import socket
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from clients.agent.config import load_dory_config
from clients.agent.discardlog import DiscardLog
from clients.agent.wire import encode

from .conftest import address

pytestmark = pytest.mark.timeout(120)

LINE = re.compile(rb"now: (\d+) ts: (-?\d+) event: DISC info: (\S+) topic: (\d+)\[(.*)\] key: (\d+)\[(.*)\] "
                  rb"msg: (\d+)\[(.*)\]\n")  # fmt: skip


def parse_lines(path: Path) -> list[tuple[bytes, bytes, bytes, bytes]]:
    """(info, topic, key, value) of each line, checking Dory's layout and the lengths."""
    out = []
    for line in path.read_bytes().splitlines(keepends=True):
        m = LINE.fullmatch(line)
        assert m, line
        _, _, info, tn, topic, kn, key, vn, value = m.groups()
        assert (int(tn), int(kn), int(vn)) == (len(topic), len(key), len(value)), line
        out.append((info, topic, base64.b64decode(key), base64.b64decode(value)))
    return out


def test_lines_in_dorys_format_rotated_by_size_and_the_archive_bounded(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "discard.log"
    dl = DiscardLog(str(path), max_file_bytes=1000, max_archive_bytes=2500, max_prefix_bytes=8)
    dl.write("NO_MEM", b"clicks", 1234, b"k", b"0123456789")
    line = b" ts: 1234 event: DISC info: NO_MEM topic: 6[clicks] key: 4[aw==] msg: 12[MDEyMzQ1Njc=]\n"
    assert path.read_bytes().endswith(line)  # the value cut to 8 bytes
    for i in range(100):
        dl.write_many("DELIVERY_ATTEMPT_LIMIT", "t", i, b"", [b"x" * 20, b"y" * 20])
    dl.close()
    archived = sorted(p for p in path.parent.iterdir() if p.name.startswith("discard.log."))
    assert archived and all(re.fullmatch(r"discard\.log\.\d+", p.name) for p in archived)
    assert all(p.stat().st_size <= 1000 for p in [path, *archived])
    assert sum(p.stat().st_size for p in archived) <= 2500  # the oldest were deleted
    for p in [path, *archived]:
        parse_lines(p)


def test_the_dory_config_turns_it_on() -> None:
    cfg = load_dory_config_text("""<doryConfig><discardLogging enable="true"><path value="/tmp/x/d.log" />
        <maxFileSize value="1m" /><maxArchiveSize value="8m" /><maxMsgPrefixSize value="unlimited" />
        </discardLogging></doryConfig>""")
    assert (cfg.discard_log_path, cfg.discard_log_max_file_bytes, cfg.discard_log_max_archive_bytes,
            cfg.discard_log_max_prefix_bytes) == ("/tmp/x/d.log", 1 << 20, 8 << 20, None)  # fmt: skip
    off = load_dory_config_text('<doryConfig><discardLogging enable="false"><path value="/tmp/x/d.log" />'
                                "</discardLogging></doryConfig>")  # fmt: skip
    assert off.discard_log_path is None and not any("discardLogging" in i for i in off.ignored)


def load_dory_config_text(xml: str) -> Any:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".xml") as f:
        f.write(xml)
        f.flush()
        return load_dory_config(f.name)


def test_an_agent_logs_each_discard_with_doryss_reason(brokers: Any, agents: Any, tmp_path: Path) -> None:
    (b,) = brokers(1)
    log_path = tmp_path / "discard.log"
    config = f"""<doryConfig><batching><messageMaxBytes value="1k" /></batching>
      <topicRateLimiting><namedConfigs><config name="none" interval="600000" maxCount="0" />
        <config name="inf" interval="1" maxCount="unlimited" /></namedConfigs>
        <defaultTopic config="inf" /><topicConfigs><topic name="muted" config="none" /></topicConfigs>
      </topicRateLimiting>
      <discardLogging enable="true"><path value="{log_path}" /></discardLogging></doryConfig>"""
    a = agents([address(b)], config=config)
    bad = [b"\x00\x00\x00\x05x",  # malformed
           struct.pack(">ihh", 8, 999, 0),  # unsupported API key
           encode(b"t", b"v")[:6] + b"\x00\x07" + encode(b"t", b"v")[8:]]  # unsupported version  # fmt: skip
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for m in [*bad, encode(b".luxun-x", b"bad topic"), encode(b"big", b"z" * 2000), encode(b"muted", b"hush"),
              encode(b"fine", b"kept")]:  # fmt: skip
        s.sendto(m, a.dgram)
    s.close()
    a.wait(lambda: sum(a.discards().values()) == 6 and a.counters().get("MsgDelivered", 0) == 1, message="counted")
    b.stop()  # what is buffered at SIGTERM with no broker: SERVER_SHUTDOWN or DELIVERY_ATTEMPT_LIMIT, per message
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for i in range(3):
        s.sendto(encode(b"late", b"late %d" % i, key=b"key"), a.dgram)
    s.close()
    a.wait(lambda: a.counters()["UnixDgInputAgentForwardMsg"] == 7, message="read")
    assert a.stop(timeout_s=60) == 0
    lines = parse_lines(log_path)
    infos = Counter(line[0] for line in lines)
    late = infos.pop(b"SERVER_SHUTDOWN", 0) + infos.pop(b"DELIVERY_ATTEMPT_LIMIT", 0)
    assert late == 3
    assert infos == {b"MALFORMED": 1, b"API_KEY(999)": 1, b"VERSION(7)": 1, b"BAD_TOPIC": 1, b"LONG_MSG": 1,
                     b"RATE_LIMIT": 1}, lines  # fmt: skip
    by_info = {line[0]: line for line in lines}
    assert by_info[b"MALFORMED"][3] == bad[0] and by_info[b"MALFORMED"][1] == b""
    assert by_info[b"BAD_TOPIC"][1:] == (b".luxun-x", b"", b"bad topic")
    assert by_info[b"RATE_LIMIT"][1:] == (b"muted", b"", b"hush")
    assert sorted(line[3] for line in lines if line[1] == b"late") == [b"late 0", b"late 1", b"late 2"]
