"""Topic names: idl.names holds the broker's rules once; the agent and the ``luxun``
command use it. The rules must agree with the broker's own (bigarray's names plus the
reserved prefix), on tricky names, on random text, and end to end."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import clients.agent.core
from bigarray import InvalidNameError, validate_name
from idl import luxun_thrift as T
from idl.names import RESERVED_PREFIX, topic_name_problem
from luxun.topics import RESERVED_PREFIX as BROKER_RESERVED_PREFIX
from luxun.topics import TopicManager
from tests._broker import BrokerProcess

pytestmark = pytest.mark.timeout(120)

LEGAL = [
    "a",
    "clicks",
    "\u200b",  # ZERO WIDTH SPACE (Cf): the agent refused format characters, the broker takes them
    "a\ufeffb",  # BOM (Cf)
    "a\u200db",  # ZERO WIDTH JOINER (Cf)
    "soft\u00adhyphen",  # SOFT HYPHEN (Cf)
    "\u0600",  # ARABIC NUMBER SIGN (Cf)
    "x.luxun",
    ".Luxun",  # the prefix is case-sensitive
    ".luxu",
    "...",
    ".a",
    "a" * 255,
    "\u00e9" * 127 + "a",  # 255 bytes
    "\U0001f600" * 63,  # 252 bytes
    "日本語",
    "with space",
    "~",
    "T~1",
]
ILLEGAL = [
    "",
    ".",
    "..",
    "a/b",
    "/",
    "a/",
    ".luxun",
    ".luxun-x",
    ".luxun-deleted-00ff",
    ".luxunx",
    "\x00",
    "a\x00b",
    "tab\there",
    "new\nline",
    "\x7f",
    "\u0085",  # NEXT LINE (Cc)
    "\ue000",  # private use (Co)
    "\U000f0000",  # supplementary private use (Co)
    "\u0378",  # unassigned (Cn)
    "\ud800",  # surrogate (Cs)
    "a\udcffb",  # what a non-UTF-8 byte becomes in sys.argv (surrogateescape)
    "a" * 256,
    "\u00e9" * 128,  # 256 bytes
    "\U0001f600" * 64,  # 256 bytes
]


def broker_problem(name: object) -> str | None:
    """The broker's rules, as the broker has them: bigarray's names, the reserved prefix."""
    try:
        validate_name(name, what="topic")
    except InvalidNameError as exc:
        return str(exc)
    assert isinstance(name, str)
    return "reserved" if name.startswith(BROKER_RESERVED_PREFIX) else None


def topic_manager_problem(name: object) -> str | None:
    try:
        TopicManager.validate(name)
    except InvalidNameError as exc:
        return str(exc)
    return None


def test_the_agent_uses_idls_rules() -> None:
    assert clients.agent.core.topic_name_problem is topic_name_problem
    assert RESERVED_PREFIX == BROKER_RESERVED_PREFIX


@pytest.mark.parametrize("name", LEGAL, ids=ascii)
def test_legal_names(name: str) -> None:
    assert topic_name_problem(name) is None
    assert broker_problem(name) is None
    assert topic_manager_problem(name) is None


@pytest.mark.parametrize("name", ILLEGAL, ids=ascii)
def test_illegal_names_each_with_one_short_reason(name: str) -> None:
    problem = topic_name_problem(name)
    assert problem is not None and "\n" not in problem and len(problem) < 100
    assert broker_problem(name) is not None
    assert topic_manager_problem(name) is not None


@pytest.mark.parametrize("name", [None, 1, b"abc"], ids=repr)
def test_not_a_string(name: object) -> None:
    assert topic_name_problem(name) == f"must be a string, not {type(name).__name__}"
    assert broker_problem(name) is not None


@settings(max_examples=500, deadline=None)
@given(
    st.text(st.characters(exclude_categories=()), max_size=300)
    | st.text(st.sampled_from(["a", ".", "/", "\u00e9", "\U0001f600", "\u200b", "\x00", "\ud800"]), max_size=300)
    | st.text(max_size=20).map(lambda s: RESERVED_PREFIX[: len(s) % 7] + s)
)
def test_agent_and_broker_agree_on_any_text(name: str) -> None:
    assert (topic_name_problem(name) is None) == (broker_problem(name) is None), name


def test_a_real_broker_takes_exactly_the_legal_names(brokers: Callable[[int], list[BrokerProcess]]) -> None:
    [broker] = brokers(1)
    client = broker.client()
    try:
        for name in LEGAL + ILLEGAL:
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                continue  # a surrogate cannot travel as Thrift's UTF-8 string
            result = client.produce(T.ProduceRequest(item=b"x", topic=name)).result
            legal = topic_name_problem(name) is None
            assert (result.resultCode == T.ResultCode.SUCCESS) == legal, (ascii(name), result)
            if not legal:
                assert result.errorCode == T.ErrorCode.INVALID_TOPIC, (ascii(name), result)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["produce", "a/b"], "topic 'a/b': must not contain '/'"),
        (["consume", ".luxun-x", "--from", "earliest"], "topic '.luxun-x': names starting with '.luxun' are reserved"),
        (["delete", "..", "--password", "x"], "topic '..': '..' is reserved"),
    ],
)
def test_the_cli_refuses_an_illegal_topic_before_connecting(args: list[str], reason: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "luxun.cli", *args, "--broker", "127.0.0.1:1", "--connect-timeout-ms", "100"],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.decode().splitlines() == [f"luxun: {reason}"]
