"""The README's reference sections, checked against the code and run for real.

* "Configuration reference": its table lists exactly the keys ``luxun.config`` accepts
  (plus keys marked "new" that another change is adding), and every flag it names is a
  ``luxun serve`` flag.
* "Several brokers on one machine": the ```sh block runs as written, on free ports and
  in the test's own directory.
* "Deleting topics: the password forms": each row of the table, against a real broker
  started with that form.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from luxun.config import KNOWN_KEYS
from tests._broker import free_port

from .test_readme import README, REPO_ROOT, block, parse_blocks, rewrite

pytestmark = pytest.mark.timeout(120)

CONFIG = "Configuration reference"
SEVERAL = "Several brokers on one machine"
DELETE = "Deleting topics: the password forms"
LUXUN_COMMAND = ".venv/bin/luxun"


def section_text(heading: str) -> str:
    """The README text under ``## heading`` up to the next ``## `` heading."""
    text = README.read_text()
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert match is not None, f"{README}: no '## {heading}' section"
    return match.group(1)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row below the header separators."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[-| ]+\|", line.strip()):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[1:]  # the first row is the header


def test_configuration_reference_lists_every_key() -> None:
    rows = table_rows(section_text(CONFIG))
    listed = [row[0].strip("`") for row in rows]
    assert len(listed) == len(set(listed)), f"a key is listed twice: {listed}"
    missing = sorted(KNOWN_KEYS - set(listed))
    assert not missing, f"{README}: the configuration reference lacks {missing}"
    unknown = sorted(set(listed) - KNOWN_KEYS)
    assert not unknown, f"{README}: the configuration reference lists keys luxun.config does not know: {unknown}"
    for row in rows:
        key, origin = row[0].strip("`"), row[-1]
        assert origin in ("Java", "ours", "ours, new", "ours, Kafka's"), f"{key}: last column {origin!r}"


def test_configuration_reference_flags_are_serve_flags() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "luxun.cli", "serve", "--help"], capture_output=True, text=True, timeout=60
    )
    flags = set(re.findall(r"--[a-z-]+", done.stdout))
    named = {cell.strip("`") for row in table_rows(section_text(CONFIG)) for cell in row[3:4] if cell}
    assert named, "no flag named in the table"
    assert named <= flags, f"flags in the README that `luxun serve` lacks: {sorted(named - flags)}"


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
        return True
    return False


def test_several_brokers_block(tmp_path: Path) -> None:
    blk = block(SEVERAL, "sh")
    ports = {p: free_port() for p in (9192, 9193, 9194, 9195)}
    replacements = {LUXUN_COMMAND: f"{shlex.quote(sys.executable)} -m luxun"}
    for old, new in ports.items():
        replacements[f"port {old}"] = f"port {new}"  # --port, --metrics-port
        if old in (9192, 9194):
            replacements[f"127.0.0.1:{old}"] = f"127.0.0.1:{new}"  # --broker
    for name in ("data-a", "data-b"):
        replacements[f"./{name}"] = str(tmp_path / name)
    code = rewrite(blk, replacements)
    background: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    outputs: list[str] = []

    def brokers_state() -> str:
        """Each broker started so far: running or its exit code, and its log's end."""
        return "".join(
            f"\n--- broker {log.stem}: {'running' if proc.poll() is None else f'exited {proc.returncode}'}\n"
            + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            for proc, log in zip(background, logs, strict=True)
        )

    try:
        for offset, line in enumerate(code.splitlines(), start=1):
            where = f"{README}:{blk.line + offset}: {blk.code.splitlines()[offset - 1]}"
            command = line.split("#", 1)[0].strip()
            if not command:
                continue
            if command.endswith("&"):
                argv = shlex.split(command[:-1])
                port = int(argv[argv.index("--port") + 1])
                logs.append(tmp_path / f"broker-{port}.log")
                with logs[-1].open("wb") as log:
                    background.append(subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=log))
                deadline = time.monotonic() + 20
                # Its own "serving" line, not only a port that answers: that could be another listener.
                while f"on 127.0.0.1:{port} (" not in logs[-1].read_text(errors="replace") or not _listening(port):
                    assert background[-1].poll() is None, f"{where}\nexited{brokers_state()}"
                    assert time.monotonic() < deadline, f"{where}\nnot listening on {port} after 20 s{brokers_state()}"
                    time.sleep(0.05)
                continue
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", command], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, f"{where}\nexit code {done.returncode}\n{done.stderr}{brokers_state()}"
            outputs.append(done.stdout)
    finally:
        for proc in background:
            proc.send_signal(signal.SIGTERM)
        for proc in background:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert len(background) == 2, "the block should start two brokers"
    assert [proc.returncode for proc in background] == [0, 0]
    listed = [line.split()[0] for line in outputs[-1].splitlines()[1:]]
    assert listed == ["views"], f"`luxun topics` of the second broker listed {listed}"
    assert sorted(p.name for p in (tmp_path / "data-a").iterdir() if p.is_dir()) == ["clicks"]
    assert sorted(p.name for p in (tmp_path / "data-b").iterdir() if p.is_dir()) == ["views"]


@pytest.mark.parametrize(
    "setting",
    [
        "plain:s3cret",
        "s3cret",
        "md5:" + hashlib.md5(b"s3cret", usedforsecurity=False).hexdigest(),
        f"crc32:{zlib.crc32(b's3cret')}",
    ],
)
def test_delete_password_forms_table(tmp_path: Path, setting: str) -> None:
    """Each broker form of the table accepts what its row says the CLI may pass."""
    rows = table_rows(section_text(DELETE))
    assert len(rows) == 3, rows
    given = ["s3cret", "plain:s3cret"] if not setting.startswith(("md5:", "crc32:")) else ["s3cret"]
    port = free_port()
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as log:
        broker = subprocess.Popen(
            [sys.executable, "-m", "luxun.cli", "serve", "--data-dir", str(tmp_path / "d"), "--port", str(port),
             "--metrics-port", "0", "--password", setting],
            stdout=log, stderr=log,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not _listening(port):
            assert broker.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        for password in given:
            cli = [sys.executable, "-m", "luxun.cli"]
            address = ["--broker", f"127.0.0.1:{port}"]
            produced = subprocess.run([*cli, "produce", "t", *address], input=b"x\n", capture_output=True, timeout=60)
            assert produced.returncode == 0, produced.stderr
            done = subprocess.run(
                [*cli, "delete", "t", "--password", password, *address], capture_output=True, timeout=60
            )
            assert done.returncode == 0, f"broker {setting!r}, --password {password!r}: {done.stderr!r}"
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(20)


def test_cli_reference_lists_every_command() -> None:
    """The CLI reference names exactly the subcommands `luxun --help` lists."""
    done = subprocess.run([sys.executable, "-m", "luxun", "--help"], capture_output=True, text=True, timeout=60)
    match = re.search(r"\{([a-z,-]+)\}", done.stdout)
    assert match is not None, done.stdout
    listed = [row[0].strip("`").split()[0] for row in table_rows(section_text("CLI reference"))]
    assert sorted(listed) == sorted(match.group(1).split(",")), listed


def test_kafka_apis_table_matches_the_versions_served() -> None:
    """Every API the Kafka port announces is a row, with its versions; no other row."""
    from luxun.kafka import groups as G
    from luxun.kafka import handlers as H
    from luxun.kafka import transactions as X

    names = {
        "Produce": H.PRODUCE, "Fetch": H.FETCH, "ListOffsets": H.LIST_OFFSETS, "Metadata": H.METADATA,
        "SaslHandshake": H.SASL_HANDSHAKE, "ApiVersions": H.API_VERSIONS, "CreateTopics": H.CREATE_TOPICS,
        "DeleteTopics": H.DELETE_TOPICS, "InitProducerId": H.INIT_PRODUCER_ID,
        "DescribeConfigs": H.DESCRIBE_CONFIGS, "SaslAuthenticate": H.SASL_AUTHENTICATE,
        "DeleteGroups": H.DELETE_GROUPS, "DescribeCluster": H.DESCRIBE_CLUSTER,
        "OffsetCommit": G.OFFSET_COMMIT, "OffsetFetch": G.OFFSET_FETCH, "FindCoordinator": G.FIND_COORDINATOR,
        "JoinGroup": G.JOIN_GROUP, "Heartbeat": G.HEARTBEAT, "LeaveGroup": G.LEAVE_GROUP,
        "SyncGroup": G.SYNC_GROUP, "DescribeGroups": G.DESCRIBE_GROUPS, "ListGroups": G.LIST_GROUPS,
        "DescribeAcls": H.DESCRIBE_ACLS, "CreateAcls": H.CREATE_ACLS, "DeleteAcls": H.DELETE_ACLS,
        "DescribeUserScramCredentials": H.DESCRIBE_USER_SCRAM_CREDENTIALS,
        "AlterUserScramCredentials": H.ALTER_USER_SCRAM_CREDENTIALS,
        "CreatePartitions": H.CREATE_PARTITIONS, "DeleteRecords": H.DELETE_RECORDS,
        "AlterConfigs": H.ALTER_CONFIGS, "IncrementalAlterConfigs": H.INCREMENTAL_ALTER_CONFIGS,
        "OffsetDelete": G.OFFSET_DELETE,
        "AddPartitionsToTxn": X.ADD_PARTITIONS_TO_TXN, "AddOffsetsToTxn": X.ADD_OFFSETS_TO_TXN,
        "EndTxn": X.END_TXN, "TxnOffsetCommit": X.TXN_OFFSET_COMMIT,
    }  # fmt: skip
    served = {**H.VERSIONS, **H.SCRAM_VERSIONS, **G.GroupCoordinator.VERSIONS, **X.TransactionCoordinator.VERSIONS}
    unnamed = set(served) - set(names.values())
    assert not unnamed, f"API keys served without a name here: {unnamed}"
    expected = {name: f"v{served[key][0]}-v{served[key][1]}" for name, key in names.items() if key in served}
    listed = {row[0]: row[1] for row in table_rows(section_text("Kafka APIs served"))}
    assert listed == expected


def test_run_sh_starts_what_the_readme_says() -> None:
    """scripts/run.sh opens the Kafka port the README's Set-up and Kafka sections use, on
    the defaults `luxun serve` has for the rest; .ci/run runs scripts/test.sh alone."""
    run_sh = (REPO_ROOT / "scripts" / "run.sh").read_text()
    assert 'luxun serve --kafka-port 9094 "$@"' in run_sh, run_sh
    setup = section_text("Set-up: the two commands")
    assert "QueueService 127.0.0.1:9092, Kafka 127.0.0.1:9094, metrics http://127.0.0.1:9093/" in setup
    assert "127.0.0.1:9094" in section_text("Kafka clients")
    ci = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    assert ci[-1] == "exec scripts/test.sh", ci


def test_reference_sections_have_no_unrun_blocks() -> None:
    """Only the several-brokers block is code; it is run above."""
    found = [(b.section, b.lang) for b in parse_blocks(README) if b.section in (CONFIG, SEVERAL, DELETE)]
    assert found == [(SEVERAL, "sh")], found
