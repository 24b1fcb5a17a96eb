"""Our broker answers every wire-level case byte for byte as Java Luxun 0.6.2 does.

The replies of the Java broker were recorded by ``tests/broker/record_java_replies.py``
into ``fixtures/java_replies.json``; here the same request frames go to our broker (a
real subprocess with the same settings: broker id 1, password ``plain:luxun``, a
fresh data dir holding an empty topic) and each reply is compared with Java's. No
Java is needed.

A reply must be equal byte for byte, except where :data:`DIFFERENCES` (the one table
of documented differences, also summed up in the README's semantics paragraph) says
otherwise for that case and step; the replies are then decoded and compared field by
field with only the listed fields left out (and both sides must still decode).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from thriftpy2.protocol.cybin import TCyBinaryProtocol
from thriftpy2.thrift import TApplicationException, TMessageType
from thriftpy2.transport.memory import TCyMemoryBuffer

from idl import QueueService
from tests._broker import BrokerProcess
from tests.broker import record_java_replies as R

pytestmark = pytest.mark.timeout(180)

FIXTURE = json.loads(R.FIXTURE.read_text())

# The documented differences: (case, reply steps, what is not compared, why). "result"
# leaves out every field of Result, "result.errorMessage" only the text; CLOSED: Java
# closed the connection instead of answering; "*": the case is not compared (our side
# is checked by its own test below). Everything not listed must be equal byte for byte.
MESSAGE = "result.errorMessage"
CLOSED = "<java closed the connection>"
_NAMES = tuple(f"invalid topic name ({label})" for label in R.INVALID_NAMES if label != "empty")
DIFFERENCES: list[tuple[str, tuple[int, ...] | str, tuple[str, ...], str]] = [
    # -- error texts where ours say more (codes equal)
    ("produce oversized item", (0,), (MESSAGE,), "size and limit, and the topic"),
    ("consume by group", (7, 8, 9), (MESSAGE,), "all consumed: ours names the topic and the group"),
    ("consume by index", (10, 11), (MESSAGE,), "all consumed: ours names the topic and the index"),
    ("consume with maxWaitMs, nothing there", (1,), (MESSAGE,), "all consumed, as above"),
    (
        "consume index past head",
        (3, 4, 5),
        (MESSAGE,),
        "Java sends none (a bare IndexOutOfBoundsException); ours gives the index and the readable range",
    ),
    ("consume index before tail", (3, 4), (MESSAGE,), "as above"),
    ("consume invalid fanout id", (1, 2, 3), (MESSAGE,), "Java's 'invalid fanout identifier', then why"),
    ("getSize invalid fanout id", (1, 2), (MESSAGE,), "as above"),
    ("deleteTopic", (1,), (MESSAGE,), "wrong password: ours names the topic"),
    ("deleteTopic missing topic", (1,), (MESSAGE,), "as above"),
    ("no argument struct", (2, 3, 4), (MESSAGE,), "Java sends its NullPointerException's text"),
    ("invalid topic name (empty)", (0, 1, 2, 3, 4), (MESSAGE,), "ours says why the name is invalid"),
    *((case, (0,), (MESSAGE,), "ours says why the name is invalid") for case in _NAMES),
    # -- other results
    *(
        (
            case,
            (1, 2, 3, 4),
            ("result",),
            "INVALID_TOPIC: Java checks names only when it creates a topic and answers TOPIC_NOT_EXIST",
        )
        for case in _NAMES
    ),
    *(
        (case, (5,), ("result",), "deleteTopic: INVALID_TOPIC (Java: SUCCESS)")
        for case in (*_NAMES, "invalid topic name (empty)")
    ),
    (
        "produce oversized item",
        (1,),
        ("result",),
        "a refused produce does not create the topic (Java creates it, empty): TOPIC_NOT_EXIST, not a size of 0",
    ),
    (
        "consume by group, first item over maxFetchSize",
        (2,),
        ("itemList",),
        "the item is returned (Java: an empty list, forever)",
    ),
    ("consume by index, first item over maxFetchSize", (2,), ("itemList",), "the item is returned (Java: none)"),
    # -- extensions and time
    ("consume with timestamps", (2, 3), ("timestampList", "firstIndex"), "withTimestamps (extension field 6)"),
    ("consume with timestamps", (3,), (MESSAGE,), "all consumed, as above"),
    ("findClosestIndexByTime", (3, 4, 5, 6), ("timestampOfIndex",), "append times of the items"),
    # -- after a request that is not valid Thrift for the IDL
    *(
        (
            case,
            (1,),
            (CLOSED,),
            "after a PROTOCOL_ERROR Java's Thrift server (libthrift 0.16) fails to read the "
            "next call and closes the connection; we answer it",
        )
        for case in (
            "ProduceRequest without item",
            "ProduceRequest without topic",
            "ConsumeRequest without topic",
            "FindClosestIndexByTimeRequest without a field",
            "DeleteTopicRequest without a field",
        )
    ),
    ("consume topic sent as an i32", (2,), (CLOSED,), "as above"),
    ("listTopics (our extension)", (1,), ("*",), "an extension call: Java answers UNKNOWN_METHOD"),
    (
        "asyncProduce ProduceRequest without item",
        "*",
        ("*",),
        "Java answers the oneway call (PROTOCOL_ERROR, "
        "read by nobody or taken for the next call's reply) then closes; we send nothing and answer the next call",
    ),
]


def allowed(case: str, step: int) -> set[str]:
    out: set[str] = set()
    for name, steps, fields, _ in DIFFERENCES:
        if name == case and (steps == "*" or step in steps):
            out.update(fields)
    return out


# -- decoding --------------------------------------------------------------------------------
def decode(reply: bytes | None) -> Any:
    """A reply as ``(name, type, seqid, payload)``: the ``success`` struct of a REPLY,
    the TApplicationException of an EXCEPTION; None for a closed connection."""
    if reply is None:
        return None
    proto = TCyBinaryProtocol(TCyMemoryBuffer(reply))
    name, mtype, seqid = proto.read_message_begin()
    if mtype == TMessageType.EXCEPTION:
        payload: Any = TApplicationException()
        payload.read(proto)
    else:
        result = getattr(QueueService, name + "_result")()
        result.read(proto)
        payload = result.success
    return name, mtype, seqid, payload


def _fields(value: Any, prefix: str = "") -> dict[str, Any]:
    """A decoded struct flattened to ``{"result.errorCode": 7, ...}``."""
    spec = getattr(value, "thrift_spec", None)
    if spec is None:
        if isinstance(value, TApplicationException):
            return {f"{prefix}type": value.type, f"{prefix}message": value.message}
        return {prefix.rstrip("."): value}
    out: dict[str, Any] = {}
    for entry in spec.values():
        field = getattr(value, entry[1])
        if field is not None and hasattr(field, "thrift_spec"):
            out.update(_fields(field, f"{prefix}{entry[1]}."))
        else:
            out[prefix + entry[1]] = field
    return out


def flatten(reply: bytes | None) -> dict[str, Any] | None:
    decoded = decode(reply)
    if decoded is None:
        return None
    name, mtype, seqid, payload = decoded
    head = {"message.name": name, "message.type": mtype, "message.seqid": seqid}
    return head | ({"payload": None} if payload is None else _fields(payload))


def readable(reply: bytes | None) -> str:
    try:
        return repr(flatten(reply))
    except Exception as exc:  # not decodable: show the bytes
        return f"<undecodable: {exc}> {None if reply is None else reply.hex()}"


# -- the broker ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("java-replies")
    data = tmp / "data"
    R.prepare_data_dir(data)
    props = tmp / "server.properties"
    props.write_text(R.server_properties(data, 0))
    broker = BrokerProcess(data, tmp / "broker.log", "--config", str(props), "--password", f"plain:{R.PASSWORD}")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def replies(ours: Any) -> dict[str, list[bytes | None]]:
    return R.run_cases(ours.port)


def test_the_fixture_was_recorded_from_these_frames() -> None:
    """The cases have not changed since the recording (else: run the recorder again)."""
    recorded = {name: case["frames"] for name, case in FIXTURE["cases"].items()}
    now = {name: [R.frame_digest(f) for f in frames] for name, frames in R.CASES.items()}
    assert sorted(now) == sorted(recorded), "cases added or removed: record again"
    changed = [name for name in now if now[name] != recorded[name]]
    assert not changed, f"frames changed since the recording: {changed}"


def test_every_difference_names_a_recorded_reply() -> None:
    for case, steps, _, _ in DIFFERENCES:
        assert case in FIXTURE["cases"], case
        n = len(FIXTURE["cases"][case]["replies"])
        assert steps == "*" or all(step < n for step in steps), (case, steps)


def _same(want: bytes, have: bytes, skip: set[str]) -> bool:
    """Equal once the fields in ``skip`` (and the fields under them) are left out."""
    a, b = flatten(want), flatten(have)
    if a is None or b is None:
        return False

    def kept(fields: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in fields.items() if not any(k == f or k.startswith(f + ".") for f in skip)}

    return kept(a) == kept(b)


@pytest.mark.parametrize("case", sorted(FIXTURE["cases"]))
def test_replies_match_java(case: str, replies: dict[str, list[bytes | None]]) -> None:
    java = [None if r is None else bytes.fromhex(r) for r in FIXTURE["cases"][case]["replies"]]
    got = replies[case]
    problems = []
    for step in range(max(len(java), len(got))):
        want = java[step] if step < len(java) else "<no reply>"
        have = got[step] if step < len(got) else "<no reply>"
        skip = allowed(case, step)
        if want == have or "*" in skip:
            continue
        if isinstance(want, bytes) and isinstance(have, bytes) and skip and _same(want, have, skip):
            continue
        if want is None and CLOSED in skip and isinstance(have, bytes) and flatten(have) is not None:
            continue
        problems.append(
            f"step {step} (frame {_frame_of(case, step)}):\n"
            f"  java: {readable(want) if not isinstance(want, str) else want}\n"
            f"  ours: {readable(have) if not isinstance(have, str) else have}\n"
            f"  java hex: {want.hex() if isinstance(want, bytes) else want}\n"
            f"  ours hex: {have.hex() if isinstance(have, bytes) else have}"
        )
    assert not problems, f"case {case!r}: replies differ from Java Luxun's\n" + "\n".join(problems)


def _frame_of(case: str, step: int) -> int:
    """The index of the frame whose reply is reply ``step``."""
    n = -1
    for i, frame in enumerate(R.CASES[case]):
        if R.expects_reply(frame):
            n += 1
            if n == step:
                return i
    return -1


def test_the_broker_logged_no_traceback(replies: Any, ours: Any) -> None:
    assert "Traceback" not in ours.log(), ours.log()


def test_oneway_call_without_item_gets_no_reply(replies: dict[str, list[bytes | None]]) -> None:
    """The one case left out of the byte comparison: nothing answers the oneway call,
    and the next call on the connection is answered (topic r3 was not created)."""
    (only,) = replies["asyncProduce ProduceRequest without item"]
    fields = flatten(only)
    assert fields is not None
    assert (fields["message.name"], fields["message.seqid"], fields["result.errorCode"]) == ("getSize", 2, 1)
    assert fields["result.errorMessage"] == "topic r3 does not exist on broker 1"


@pytest.mark.skipif(
    not (R.java_peer() / "build" / "classpath.txt").exists(),
    reason=f"no Java Luxun build at {R.java_peer()} (set LUXUN_JAVA_PEER; see ../shared/peers/luxun-java/README.md)",
)
def test_the_fixture_is_what_java_answers_now(tmp_path: Path) -> None:
    """With the Java build at hand: record again and find the same replies (only the
    append times may differ), so the fixture is neither stale nor hand-edited."""
    fresh = R.record(R.java_peer(), tmp_path / "java_replies.json")["cases"]
    stale = []
    for case, recorded in FIXTURE["cases"].items():
        for step, (old, new) in enumerate(zip(recorded["replies"], fresh[case]["replies"], strict=True)):
            if old != new and not (old and new and _same(bytes.fromhex(old), bytes.fromhex(new), {"timestampOfIndex"})):
                stale.append(f"{case!r} step {step}:\n  fixture: {old}\n  now:     {new}")
    assert not stale, "the Java broker answers differently now: record again\n" + "\n".join(stale)


def test_list_topics_is_answered(replies: dict[str, list[bytes | None]]) -> None:
    """The extension call left out of the byte comparison (Java does not know it)."""
    fields = flatten(replies["listTopics (our extension)"][1])
    assert fields is not None and (fields["message.name"], fields["result.resultCode"]) == ("listTopics", 0)
    assert "lt" in [topic.name for topic in fields["topics"]]
