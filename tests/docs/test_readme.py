"""The README's quickstart code, run for real against broker subprocesses (STYLE.md habit 12).

README.md is parsed at test time: the fenced ``sh`` and ``python`` blocks under the
headings in :data:`SECTIONS` are run as they are written, after a small, explicit
rewrite (:func:`rewrite`) that points their addresses at brokers on free 127.0.0.1
ports (and their ``/tmp`` paths at the test's own directory). Every rewrite must find
what it replaces, so a README edit that moves an address or renames a call fails here
with a message saying which block and which text, instead of passing silently.

Each Python block runs in a fresh ``python -c`` subprocess (cwd: the repository) via
:data:`DRIVER`, which records the value of every expression statement of the block
(``c.produce(...).index  # 0`` in the README becomes checkable) and then runs a few
check lines in the block's namespace: ``value("<expression as written>")`` is the last
value that expression produced, ``check(actual, expected)`` compares.

``LUXUN_README=/path/to/copy.md`` runs the tests against another copy of the README
(used to check that a broken block makes its test fail).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from clients.messages import decode_pack
from idl import luxun_thrift as T
from tests._broker import PASSWORD, BrokerProcess, stop_process

from .conftest import StartBroker

pytestmark = pytest.mark.timeout(120)

REPO_ROOT = Path(__file__).resolve().parents[2]
README = Path(os.environ.get("LUXUN_README", REPO_ROOT / "README.md"))

BROKER = "Quickstart: the broker"
STORAGE = "Quickstart: the storage library"
CLIENTS = "Quickstart: Python clients"
AT_LEAST_ONCE = "At-least-once consumer groups"
AGENT = "Local agent (Dory-compatible)"
AGENT_READ = "Local agent: reading what it delivered"
SPARK = "Spark"
KAFKA = "Kafka clients"
KAFKA_CONFLUENT = "Kafka clients: confluent-kafka"
KAFKA_AIOKAFKA = "Kafka clients: aiokafka"
SECTIONS = (BROKER, STORAGE, CLIENTS, AT_LEAST_ONCE, AGENT, AGENT_READ, SPARK, KAFKA, KAFKA_CONFLUENT, KAFKA_AIOKAFKA)
#: The (section, language) blocks the tests below run; every block under SECTIONS must be one.
COVERED = {
    (BROKER, "sh"),
    (BROKER, "python"),
    (STORAGE, "python"),
    (CLIENTS, "python"),
    (AT_LEAST_ONCE, "python"),
    (AGENT, "sh"),
    (AGENT, "python"),
    (AGENT_READ, "python"),
    (SPARK, "sh"),
    (SPARK, "python"),
    (KAFKA, "sh"),
    (KAFKA, "python"),
    (KAFKA_CONFLUENT, "python"),
    (KAFKA_AIOKAFKA, "python"),
}

BLOCK_TIMEOUT_S = 90
SPARK_BLOCK_TIMEOUT_S = 240
HAVE_PYSPARK = all(importlib.util.find_spec(name) is not None for name in ("pyspark", "pyarrow"))

# Runs argv[1] (a README block whose fence is on line argv[3] of file argv[2]; tracebacks
# name the README's own lines) after argv[4] (a prelude, not recorded), then argv[5] (checks),
# then checks every output the block claims in a comment (see claims()); argv[6] is a JSON
# map of the test's addresses and paths back to the README's, for comparing what is shown.
DRIVER = """\
import ast, contextlib, io, json, re, sys, tokenize

source, readme, fence_line, prelude, checks, shown_as = sys.argv[1:7]
shown_as = json.loads(shown_as)
values = {}

def __record__(key, value):
    values.setdefault(key, []).append(value)
    return value

def __printed__(key, call):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        call()
    sys.stdout.write(out.getvalue())
    values.setdefault(key, []).append(Printed(out.getvalue()))

class Printed(str):
    pass

def value(key):
    if key not in values:
        raise AssertionError(f"the README block ran no expression statement {key!r}; it ran: {list(values)}")
    return values[key][-1]

def check(actual, expected):
    if actual != expected:
        raise AssertionError(f"README block: got {actual!r}, expected {expected!r}")

class Record(ast.NodeTransformer):
    def visit_Expr(self, node):
        key = ast.get_source_segment(source, node.value)
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print":
            thunk = ast.Lambda(ast.arguments([], [], None, [], [], None, []), call)
            wrapped = ast.Call(ast.Name("__printed__", ast.Load()), [ast.Constant(key), thunk], [])
        else:
            wrapped = ast.Call(ast.Name("__record__", ast.Load()), [ast.Constant(key), call], [])
        return ast.copy_location(ast.Expr(wrapped), node)

SHOWN = re.compile("[\\\\[({'\\"0-9-]|b['\\"]")

def claim_in(comment):
    # The outputs a comment may show, or None for a comment in words: a comment that
    # starts like a value (a bracket, quote, digit or b'...) shows one, followed by
    # nothing or by ': words' / '; words'; each start cut at a ':' or ';' is a candidate.
    if not SHOWN.match(comment):
        return None
    return [comment[:i].strip() for i, ch in enumerate(comment) if ch in ":;"] + [comment.strip()]

def claims(tree):
    # (line, expression as written, shown text) for each expression statement whose line
    # ends with a comment that shows an output, or is followed by a line holding only one.
    ends = {node.end_lineno: node for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        alone = not tok.line[: tok.start[1]].strip()
        node = ends.get(line - 1 if alone else line)
        shown = claim_in(as_shown(tok.string[1:].strip()))  # the README's own text
        if node is not None and shown is not None:
            found.append((line, ast.get_source_segment(source, node.value), shown))
    return found

def as_shown(text):
    for ours, theirs in shown_as.items():
        text = text.replace(ours, theirs)
    return text

def same(actual, candidates):
    text = as_shown(actual.rstrip("\\n")) if isinstance(actual, Printed) else as_shown(repr(actual))
    for shown in candidates:
        if text == shown:
            return True
        if not isinstance(actual, Printed):
            try:
                if ast.literal_eval(text) == ast.literal_eval(shown):
                    return True
            except (ValueError, SyntaxError):
                pass
    return False

namespace = {"__name__": "__main__", "__record__": __record__, "__printed__": __printed__,
             "value": value, "check": check}
exec(compile(prelude, "<prelude>", "exec"), namespace)
tree = ast.parse(source, readme)
shown = claims(tree)
tree = ast.fix_missing_locations(Record().visit(tree))
exec(compile(ast.increment_lineno(tree, int(fence_line)), readme, "exec"), namespace)
exec(compile(checks, "<checks>", "exec"), namespace)
for line, key, candidates in shown:
    actual = value(key)
    if not same(actual, candidates):
        where = f"{readme}:{int(fence_line) + line}"
        gave = as_shown(str(actual).rstrip() if isinstance(actual, Printed) else repr(actual))
        raise AssertionError(f"{where}: {key} shows {candidates[-1]!r} in the README, and gave {gave!r}")
print(f"__claims__ {len(shown)}", file=sys.stderr)
"""


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README."""

    section: str  # the nearest heading above it, without the #s
    lang: str  # the info string after the opening fence ("sh", "python", ...)
    code: str
    line: int  # 1-based line of the opening fence


def parse_blocks(path: Path) -> list[Block]:
    """Every fenced code block of a Markdown file, with the heading it sits under."""
    blocks: list[Block] = []
    section = ""
    fence: tuple[str, int, list[str]] | None = None
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if fence is None:
            if line.startswith("```"):
                fence = (line[3:].strip(), number, [])
            elif line.startswith("#"):
                section = line.lstrip("#").strip()
        elif line.strip() == "```":
            lang, start, lines = fence
            blocks.append(Block(section, lang, "\n".join(lines) + "\n", start))
            fence = None
        else:
            fence[2].append(line)
    assert fence is None, f"{path}: the code block opened on line {fence[1]} is never closed"
    return blocks


def block(section: str, lang: str) -> Block:
    """The one ``lang`` block under heading ``section``; fails clearly if there is not exactly one."""
    found = [b for b in parse_blocks(README) if b.section == section and b.lang == lang]
    if len(found) != 1:
        pytest.fail(f"{README}: expected one ```{lang} block under '{section}', found {len(found)}")
    return found[0]


def rewrite(blk: Block, replacements: dict[str, str]) -> str:
    """The block's code with each key replaced by its value (all at once, so a new port
    never gets replaced again); every key must occur in the block."""
    missing = [old for old in replacements if old not in blk.code]
    if missing:
        pytest.fail(
            f"{README}:{blk.line} (```{blk.lang} under '{blk.section}'): expected {missing} in the block; "
            "the README changed, update tests/docs/test_readme.py"
        )
    pattern = re.compile("|".join(re.escape(old) for old in sorted(replacements, key=len, reverse=True)))
    return pattern.sub(lambda m: replacements[m.group(0)], blk.code)


def address(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{broker.port}"


def run_python(
    blk: Block,
    checks: str,
    *,
    shows: int,
    replace: dict[str, str] | None = None,
    prelude: str = "",
    env: dict[str, str] | None = None,
    timeout_s: float,
) -> subprocess.CompletedProcess[str]:
    """Run a block (rewritten by ``replace``, see :func:`rewrite`), then ``checks``, in a fresh
    interpreter, then compare every output the block shows in a comment with what the
    expression gave (``expr  # 0``, ``print(x)  # [b'a']``, or the comment on the line
    below; the test's addresses read as the README's); assert exit code 0 and that the block
    shows ``shows`` outputs (so a README edit that hides one from the check fails here)."""
    replace = replace or {}
    code = rewrite(blk, replace) if replace else blk.code
    shown_as = {new.strip('"'): old.strip('"') for old, new in replace.items()}
    argv = [DRIVER, code, str(README.resolve()), str(blk.line), prelude, checks, json.dumps(shown_as)]
    done = subprocess.run(
        [sys.executable, "-c", *argv],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, (
        f"{README}:{blk.line} (```python under '{blk.section}') failed with exit code {done.returncode}\n"
        f"--- code run ---\n{code}--- checks ---\n{checks}--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}"
    )
    compared = re.findall(r"^__claims__ (\d+)$", done.stderr, re.M)
    assert compared == [str(shows)], (
        f"{README}:{blk.line} (```python under '{blk.section}'): the block shows {compared} outputs in comments, "
        f"the test expects {shows}; update the test if the README changed"
    )
    return done


def topic_messages(broker: BrokerProcess, topic: str) -> list[bytes]:
    """Every message of every pack in a topic (read by a fresh group)."""
    client = broker.client()
    try:
        response = client.consume(T.ConsumeRequest(topic=topic, fanoutId="readme-check", maxFetchSize=1 << 24))
        assert response.result.resultCode == T.ResultCode.SUCCESS, response.result
        return [message for item in response.itemList for message in decode_pack(item)]
    finally:
        client.close()


def topic_size(broker: BrokerProcess, topic: str) -> int | None:
    """The topic's item count, or None if the broker does not know the topic."""
    client = broker.client()
    try:
        response = client.getSize(T.GetSizeRequest(topic=topic))
    finally:
        client.close()
    if response.result.resultCode != T.ResultCode.SUCCESS:
        assert response.result.errorCode == T.ErrorCode.TOPIC_NOT_EXIST, response.result
        return None
    return int(response.size)


def test_every_quickstart_block_is_run() -> None:
    """A block added under a quickstart heading (or one moved away) must get a test here."""
    present = [(b.section, b.lang) for b in parse_blocks(README) if b.section in SECTIONS]
    assert sorted(present) == sorted(COVERED), (
        f"{README}: the quickstart blocks are now {sorted(present)}, the tests run {sorted(COVERED)}; "
        "update COVERED and the tests"
    )


# --- Quickstart: the broker ---------------------------------------------------------

#: Lines of the sh block that are not run: the test's broker is already running.
SKIPPED_COMMANDS = {"scripts/run.sh"}
LUXUN_COMMAND = ".venv/bin/luxun"  # the console script; run as `python -m luxun` (any venv)


def test_broker_cli_quickstart(brokers: StartBroker) -> None:
    """The ```sh block: produce two lines, read them by group and by index, list, delete."""
    broker = brokers(metrics=True)
    blk = block(BROKER, "sh")
    options = {
        "produce": ["--broker", address(broker)],
        "consume": ["--broker", address(broker)],
        "delete": ["--broker", address(broker)],
        "topics": ["--broker", address(broker)],  # listTopics on the QueueService port
    }

    def produced(done: subprocess.CompletedProcess[bytes]) -> None:
        assert topic_size(broker, "logs") == 2, "the produce should put 2 items in topic logs"

    def by_group(done: subprocess.CompletedProcess[bytes]) -> None:
        assert done.stdout == b"hello\nworld\n"

    def by_index(done: subprocess.CompletedProcess[bytes]) -> None:
        assert done.stdout == b"hello\n"

    def listed(done: subprocess.CompletedProcess[bytes]) -> None:
        rows = [line.split() for line in done.stdout.decode().splitlines()[1:]]
        assert [row[0] for row in rows] == ["logs"], done.stdout
        assert rows[0][1] == "2" and "analytics (0)" in done.stdout.decode(), done.stdout  # 2 items, group lag 0

    checks: dict[tuple[str, ...], Callable[[subprocess.CompletedProcess[bytes]], None]] = {
        ("produce", "logs"): produced,
        ("consume", "logs", "--group", "analytics"): by_group,
        ("consume", "logs", "--from", "earliest", "--max", "1"): by_index,
        ("topics",): listed,
    }
    ran: list[tuple[str, ...]] = []
    for offset, line in enumerate(blk.code.splitlines(), start=1):
        tokens = shlex.split(line, comments=True)
        if not tokens or tokens[0] in SKIPPED_COMMANDS:
            continue
        where = f"{README}:{blk.line + offset}: {line.strip()}"
        args, stages = rewrite_command(tokens, options, where)
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", " | ".join(map(shlex.join, stages))],
            cwd=REPO_ROOT,
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0, f"{where}\nexit code {done.returncode}\n{done.stderr.decode(errors='replace')}"
        ran.append(args)
        if args in checks:
            try:
                checks[args](done)
            except AssertionError as exc:
                raise AssertionError(f"{where}\nstdout: {done.stdout!r}\n{exc}") from None
    missing = [args for args in checks if args not in ran]
    assert not missing, f"{README}:{blk.line}: commands {missing} are no longer in the block (it ran {ran})"


def rewrite_command(
    tokens: list[str], options: dict[str, list[str]], where: str
) -> tuple[tuple[str, ...], list[list[str]]]:
    """A line's luxun arguments as the README writes them, and the line as pipeline stages
    with its luxun command rewritten: ``python -m luxun``, the test broker's address
    options added, the password filled in."""
    stages: list[list[str]] = [[]]
    for token in tokens:
        if token == "|":
            stages.append([])
        else:
            stages[-1].append(token)
    luxun = [stage for stage in stages if stage[0] == LUXUN_COMMAND]
    assert len(luxun) == 1, f"{where}: expected one {LUXUN_COMMAND} command in the line"
    stage = luxun[0]
    args = tuple(stage[1:])
    command = stage[1]
    assert command in options, f"{where}: no address options known for `luxun {command}`"
    if command == "delete":
        at = stage.index("--password") + 1
        assert stage[at] == "...", f"{where}: expected `--password ...` (the test fills in its broker's password)"
        stage[at] = PASSWORD
    stage[:1] = [sys.executable, "-m", "luxun"]
    stage.extend(options[command])
    return args, stages


def test_thrift_client_quickstart(brokers: StartBroker) -> None:
    """The ```python block under the broker quickstart: a raw thriftpy2 client."""
    broker = brokers()
    blk = block(BROKER, "python")
    replace = {'"127.0.0.1", 9092': f'"127.0.0.1", {broker.port}'}
    checks = """
check(value('c.produce(T.ProduceRequest(item=b"event", topic="thrift-raw")).index'), 0)
check(value('c.consume(T.ConsumeRequest(topic="thrift-raw", fanoutId="g", '
            'maxFetchSize=1 << 20, maxWaitMs=5000)).itemList'), [b"event"])
c.close()
"""
    run_python(blk, shows=2, replace=replace, checks=checks, timeout_s=BLOCK_TIMEOUT_S)


# --- Quickstart: the storage library --------------------------------------------------


def test_storage_quickstart(tmp_path: Path) -> None:
    """BigArray and FanoutQueue, in directories of this test rather than /tmp's fixed names."""
    blk = block(STORAGE, "python")
    replace = {
        '"/tmp/demo-array"': json.dumps(str(tmp_path / "demo-array")),
        '"/tmp/demo-queue"': json.dumps(str(tmp_path / "demo-queue")),
    }
    checks = """
check(first, 0)
check(value('arr.read_range(first, max_bytes=1 << 20)'), [b"event-1", b"event-2", b"event-3", b"event-4"])
check(value('arr.find_closest_index(BigArray.EARLIEST)'), 0)
check(value('q.dequeue("analytics")'), b"a")
check(value('q.dequeue_many("archive", max_items=10)'), [b"a", b"b", b"c"])
check(value('q.size("analytics")'), 2)
"""
    run_python(blk, shows=5, replace=replace, checks=checks, timeout_s=BLOCK_TIMEOUT_S)


# --- Quickstart: Python clients -------------------------------------------------------


def test_clients_quickstart(brokers: StartBroker) -> None:
    """Producer, SimpleConsumer and a StreamConsumer on the one broker of scripts/run.sh."""
    broker = brokers()
    blk = block(CLIENTS, "python")
    replace = {"127.0.0.1:9092": address(broker)}
    checks = """
click = {"user": 7, "action": "click"}
check(future.result(), 0)
check(fetched.messages, [click])
check(fetched.next_index, 1)
check(message, click)
"""
    run_python(blk, shows=3, replace=replace, checks=checks, timeout_s=BLOCK_TIMEOUT_S)


def test_at_least_once_quickstart(brokers: StartBroker) -> None:
    """auto_commit=False: poll, commit, position; the commit is on the broker after close."""
    broker = brokers()
    blk = block(AT_LEAST_ONCE, "python")
    replace = {"127.0.0.1:9092": address(broker)}
    checks = f"""
from clients.consumer import SimpleConsumer
check(done, 10)
check(value('consumer.position("invoices")'), {{{address(broker)!r}: (1, 0)}})
with SimpleConsumer({address(broker)!r}) as simple:
    check(simple.committed("invoices", "billing"), (1, 0))
"""
    run_python(blk, shows=1, replace=replace, checks=checks, timeout_s=BLOCK_TIMEOUT_S)


# --- Spark ----------------------------------------------------------------------------


def test_extra_install_blocks() -> None:
    """The Kafka and Spark sections install their extra with one line that names an extra
    setup.cfg declares (the line is not run here: it installs packages)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(REPO_ROOT / "setup.cfg")
    declared = set(cfg["options.extras_require"])
    for section, extra in ((KAFKA, "kafka"), (SPARK, "spark")):
        blk = block(section, "sh")
        assert blk.code.split("#")[0].split() == ["scripts/bootstrap.sh", extra], blk.code
        assert extra in declared, f"setup.cfg has no {extra!r} extra"


@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAVE_PYSPARK, reason="pyspark and pyarrow are not installed (scripts/bootstrap.sh spark)")
def test_spark_quickstart(brokers: StartBroker) -> None:
    """The block makes its own session, writes 5 rows to spark-readings, reads them back
    and copies them to spark-copy, all on the one broker."""
    broker = brokers()
    blk = block(SPARK, "python")
    replace = {"127.0.0.1:9092": address(broker)}
    checks = """
check(df.count(), 5)
spark.stop()
"""
    env = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = run_python(blk, shows=0, replace=replace, checks=checks, env=env, timeout_s=SPARK_BLOCK_TIMEOUT_S)
    shown = "".join(line[2:] + "\n" for line in blk.code.splitlines() if line.startswith(("# +", "# |")))
    assert shown.count("\n") == 5, f"the README should show the table show() prints:\n{blk.code}"
    assert shown in done.stdout, (
        f"df.groupBy('topic').count().show() printed:\n{done.stdout}\nthe README shows:\n{shown}"
    )
    expected = [f"reading {i}".encode() for i in range(5)]
    assert sorted(topic_messages(broker, "spark-readings")) == expected
    assert sorted(topic_messages(broker, "spark-copy")) == expected, "the write should copy every value"


# --- Local agent ------------------------------------------------------------------------


def test_agent_quickstart(brokers: StartBroker, tmp_path: Path) -> None:
    """The agent's start line (as written but for the broker, socket path and status port),
    the Python sender, then the reading block prints what the agent delivered."""
    broker = brokers()
    dgram = str(tmp_path / "agent.dgram")
    start = block(AGENT, "sh")
    line = rewrite(start, {"127.0.0.1:9092": address(broker), "/tmp/luxun-agent.dgram": dgram}).strip()
    assert line.startswith(LUXUN_COMMAND + " agent ") and line.endswith("&"), line
    argv = [sys.executable, "-m", "luxun", *shlex.split(line[:-1])[1:], "--status-port", "0"]
    log_path = tmp_path / "agent.log"
    with log_path.open("wb") as log:
        agent = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not Path(dgram).exists():
            assert agent.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, f"no socket after 30 s\n{log_path.read_text()}"
            time.sleep(0.05)
        send = block(AGENT, "python")
        run_python(
            send, "", shows=0, replace={'"/tmp/luxun-agent.dgram"': json.dumps(dgram)}, timeout_s=BLOCK_TIMEOUT_S
        )
        read = block(AGENT_READ, "python")
        done = run_python(read, "", shows=1, replace={"127.0.0.1:9092": address(broker)}, timeout_s=BLOCK_TIMEOUT_S)
        assert done.stdout == '[b\'{"page": "/"}\']\n', done.stdout
    finally:
        stop_process(agent, signal.SIGTERM, 30)


# --- Kafka clients ------------------------------------------------------------------------


def test_kafka_python_quickstart(brokers: StartBroker) -> None:
    broker = brokers(kafka=True)
    blk = block(KAFKA, "python")
    replace = {"127.0.0.1:9094": broker.bootstrap}
    checks = "check(value('records'), [(0, b'user-7', b'{\"page\": 3}', [('source', b'web')])])\n"
    run_python(blk, shows=1, replace=replace, checks=checks, timeout_s=BLOCK_TIMEOUT_S)


def test_confluent_kafka_quickstart(brokers: StartBroker) -> None:
    broker = brokers(kafka=True)
    blk = block(KAFKA_CONFLUENT, "python")
    replace = {"127.0.0.1:9094": broker.bootstrap}
    checks = "check(value('values'), [b'order 0', b'order 1', b'order 2'])\n"
    run_python(blk, shows=1, replace=replace, checks=checks, timeout_s=BLOCK_TIMEOUT_S)


def test_aiokafka_quickstart(brokers: StartBroker) -> None:
    broker = brokers(kafka=True)
    blk = block(KAFKA_AIOKAFKA, "python")
    replace = {"127.0.0.1:9094": broker.bootstrap}
    done = run_python(blk, shows=1, replace=replace, checks="", timeout_s=BLOCK_TIMEOUT_S)
    assert done.stdout == "[b'payment 0', b'payment 1', b'payment 2']\n", done.stdout


# --- Every quickstart, in the README's order, on one broker ------------------------------

RUN_SH = "scripts/run.sh"
#: scripts/run.sh installs (`pip install -e .`, which builds the C extension) before it serves.
RUN_SH_TIMEOUT_S = 300.0


def install(section: str, modules: tuple[str, ...]) -> str | None:
    """Run the section's install line as written (scripts/bootstrap.sh EXTRA, in this
    repository's .venv, as a newcomer does); None when the modules are then importable,
    else why the section is skipped."""
    blk = block(section, "sh")
    line = blk.code.split("#")[0].strip()
    done = subprocess.run(["bash", "-c", line], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return f"`{line}` failed (exit code {done.returncode}): {done.stderr.strip().splitlines()[-1:]}"
    found = subprocess.run(
        [str(REPO_ROOT / ".venv/bin/python"), "-c", f"import {', '.join(modules)}"], capture_output=True, text=True
    )
    return None if found.returncode == 0 else f"{', '.join(modules)} not importable after `{line}`"


@pytest.mark.timeout(600)
def test_quickstarts_in_order_on_one_broker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What a newcomer does: one broker started by scripts/run.sh (free ports and a fresh data
    dir given after its own options), the install lines of the Kafka and Spark sections run
    as written, then every quickstart in the README's order against that broker, each with
    its checks above. A section whose extra could not be installed is skipped, and the
    reason printed."""
    if Path(sys.prefix).resolve() != (REPO_ROOT / ".venv").resolve():
        pytest.skip(f"runs {RUN_SH}, which installs into {REPO_ROOT / '.venv'}: run it from that venv")
    broker = BrokerProcess(
        tmp_path / "luxun-data",
        tmp_path / "broker.log",
        metrics=True,
        kafka=True,
        command=[str(REPO_ROOT / RUN_SH)],  # passes our ports and data dir on to `luxun serve`
        password=False,
    ).start(timeout_s=RUN_SH_TIMEOUT_S)

    def same_broker(*, metrics: bool = False, kafka: bool = False) -> BrokerProcess:
        return broker

    kafka_missing = install(KAFKA, ("kafka", "aiokafka", "confluent_kafka"))
    spark_missing = install(SPARK, ("pyspark", "pyarrow"))
    steps: dict[str, tuple[Callable[[], None], str | None]] = {
        BROKER: (
            lambda: (test_broker_cli_quickstart(same_broker), test_thrift_client_quickstart(same_broker))[0],
            None,
        ),
        STORAGE: (lambda: test_storage_quickstart(tmp_path / "storage"), None),
        CLIENTS: (lambda: test_clients_quickstart(same_broker), None),
        AT_LEAST_ONCE: (lambda: test_at_least_once_quickstart(same_broker), None),
        AGENT: (lambda: test_agent_quickstart(same_broker, tmp_path / "agent"), None),
        AGENT_READ: (lambda: None, None),  # run with AGENT: it reads what the agent delivered
        KAFKA: (lambda: test_kafka_python_quickstart(same_broker), kafka_missing),
        KAFKA_CONFLUENT: (lambda: test_confluent_kafka_quickstart(same_broker), kafka_missing),
        KAFKA_AIOKAFKA: (lambda: test_aiokafka_quickstart(same_broker), kafka_missing),
        SPARK: (lambda: test_spark_quickstart(same_broker), spark_missing),
    }
    assert set(steps) == set(SECTIONS), sorted(set(SECTIONS) ^ set(steps))
    first_line: dict[str, int] = {}
    for blk in parse_blocks(README):
        first_line.setdefault(blk.section, blk.line)
    (tmp_path / "storage").mkdir()
    (tmp_path / "agent").mkdir()
    try:
        for section in sorted(steps, key=lambda name: first_line[name]):
            run, missing = steps[section]
            if missing is not None:
                with capsys.disabled():
                    print(f"\n{README}: '{section}' skipped: {missing}")
                continue
            run()
    finally:
        broker.stop()
