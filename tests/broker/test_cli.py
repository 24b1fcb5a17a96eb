"""The ``luxun`` command as a person meets it: one-line errors, never a traceback.

Every test runs the real ``python -m luxun.cli`` in a subprocess, against real broker
subprocesses (or against nothing at all), and checks the exit code, that stderr is
exactly one line naming what went wrong (the host:port, the port, the size, the
limit), and that no Python traceback is printed.
"""

from __future__ import annotations

import configparser
import hashlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idl import luxun_thrift as T
from tests._broker import PASSWORD, free_port, java_luxun

pytestmark = pytest.mark.timeout(120)

ONE_MIB = 1 << 20


def run_cli(*args: str, stdin: bytes = b"", timeout_s: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "luxun.cli", *args], input=stdin, capture_output=True, timeout=timeout_s
    )


def one_line_error(done: subprocess.CompletedProcess[bytes], *needles: str, code: int | None = None) -> str:
    """The single stderr line of a failed command; it must contain every needle."""
    err = done.stderr.decode(errors="replace")
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    assert done.returncode != 0, f"exit code 0 for a failure: {err}"
    if code is not None:
        assert done.returncode == code, f"exit code {done.returncode}, expected {code}: {err}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def topic_size(broker: Any, topic: str) -> int | None:
    client = broker.client()
    try:
        response = client.getSize(T.GetSizeRequest(topic=topic))
    finally:
        client.close()
    return None if response.result.errorCode == T.ErrorCode.TOPIC_NOT_EXIST else int(response.size)


# -- reaching the broker ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "args,stdin",
    [
        (("produce", "t"), b"x\n"),
        (("produce", "t", "--async"), b"x\n"),
        (("consume", "t", "--group", "g"), b""),
        (("consume", "t", "--from", "earliest"), b""),
        (("delete", "t", "--password", "p"), b""),
        (("topics",), b""),
    ],
    ids=["produce", "produce-async", "consume-group", "consume-from", "delete", "topics"],
)
def test_a_broker_that_is_down_is_one_line_naming_host_and_port(args: tuple[str, ...], stdin: bytes) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    done = run_cli(*args, "--broker", address, stdin=stdin)
    one_line_error(done, address, "cannot connect", code=1)


@pytest.mark.parametrize(
    "args,stdin",
    [(("produce", "t"), b"x\n"), (("produce", "t", "--async"), b"x\n"), (("consume", "t", "--group", "g"), b""),
     (("consume", "t", "--from", "earliest"), b""), (("topics",), b"")],
    ids=["produce", "produce-async", "consume-group", "consume-from", "topics"],
)  # fmt: skip
def test_a_client_command_at_the_metrics_port_fails_at_once_with_one_line(
    broker_factory: Any, args: tuple[str, ...], stdin: bytes
) -> None:
    """The metrics HTTP server closes a connection whose first bytes are no HTTP request
    line (a Thrift frame starts with its length), so the command fails without waiting
    for its 30 s call timeout (the default here), in one line naming the address and the
    likely mistake."""
    broker = broker_factory(metrics=True)
    address = f"127.0.0.1:{broker.metrics_port}"
    t0 = time.monotonic()
    done = run_cli(*args, "--broker", address, stdin=stdin, timeout_s=60)
    elapsed = time.monotonic() - t0
    line = one_line_error(done, address, "closed the connection", "QueueService port", code=1)
    assert "max.message.size" not in line, line  # a 1-byte item is not why
    assert elapsed < 25, f"{args[0]} took {elapsed:.1f} s: it waited for the 30 s call timeout"
    assert broker.proc.poll() is None
    status = urllib.request.urlopen(f"http://{address}/topics.json", timeout=10)  # HTTP still answered
    assert status.status == 200


def test_timeout_flags_are_documented_with_their_defaults() -> None:
    for command in ("produce", "consume", "delete", "topics"):
        done = run_cli(command, "--help")
        text = " ".join(done.stdout.decode().split())  # argparse wraps lines
        assert "--connect-timeout-ms" in text and "--timeout-ms" in text, (command, text)
        assert "default 5000" in text and "default 30000" in text, (command, text)


@pytest.mark.parametrize("bad", ["localhost:notaport", "a:b:c:d", "localhost:70000"])
def test_a_malformed_broker_address_is_one_line(bad: str) -> None:
    done = run_cli("consume", "t", "--group", "g", "--broker", bad)
    one_line_error(done, bad, "host:port", code=2)


def test_a_broker_address_without_port_means_9092() -> None:
    """``--broker localhost`` is localhost:9092 (whatever answers there, the reply is one line)."""
    done = run_cli(
        "consume", "no-such-topic-cli-test", "--from", "earliest", "--broker", "localhost", "--timeout-ms", "3000"
    )
    one_line_error(done, "localhost:9092", code=1)


# -- usage errors ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args,flag,hint",
    [
        (("consume", "logs", "--gruop", "g"), "--gruop", "--group"),
        (("serve", "--prot", "9092"), "--prot", "--port"),
        (("produce", "logs", "--asnyc"), "--asnyc", "--async"),
    ],
    ids=["consume", "serve", "produce"],
)
def test_an_unknown_flag_is_named_with_the_subcommands_usage(args: tuple[str, ...], flag: str, hint: str) -> None:
    """Named before a missing required option (consume's --group | --from-index | --from), and
    under ``usage: luxun <command>``, not the top-level usage."""
    done = run_cli(*args, timeout_s=30)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 2, err
    assert "Traceback" not in err, err
    assert err.startswith(f"usage: luxun {args[0]} "), err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"luxun {args[0]}: error: unrecognized arguments: {flag}"), err
    assert f"did you mean {hint}?" in last, err
    assert "required" not in err, err


def test_a_missing_required_option_is_still_named() -> None:
    done = run_cli("consume", "logs", timeout_s=30)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 2, err
    assert err.startswith("usage: luxun consume "), err
    assert "one of the arguments --group --from-index --from is required" in err, err


# -- item sizes -----------------------------------------------------------------------------
def test_an_item_over_the_default_limit_is_refused_before_sending(broker_factory: Any) -> None:
    broker = broker_factory()
    address = f"127.0.0.1:{broker.port}"
    big = 20 * ONE_MIB
    done = run_cli("produce", "sizes", "--broker", address, stdin=b"small\n" + b"x" * big + b"\nafter\n")
    line = one_line_error(done, f"{big} bytes", f"{ONE_MIB}", "--max-item-bytes", "max.message.size", code=1)
    assert "line 2" in line, line
    assert topic_size(broker, "sizes") == 1  # the line before it went, nothing after it
    assert broker.proc.poll() is None


def test_max_item_bytes_is_the_largest_item_sent(broker_factory: Any) -> None:
    broker = broker_factory()
    address = f"127.0.0.1:{broker.port}"
    done = run_cli("produce", "edge", "--broker", address, "--max-item-bytes", "10", stdin=b"x" * 10 + b"\n")
    assert done.returncode == 0, done.stderr
    done = run_cli("produce", "edge", "--broker", address, "--max-item-bytes", "10", stdin=b"y" * 11 + b"\n")
    one_line_error(done, "11 bytes", "--max-item-bytes 10", code=1)
    assert topic_size(broker, "edge") == 1


def test_a_reset_connection_during_produce_says_the_item_may_be_too_large(broker_factory: Any) -> None:
    """Allowed by --max-item-bytes, the 20 MB frame makes the broker close the connection."""
    broker = broker_factory()
    address = f"127.0.0.1:{broker.port}"
    for extra in ((), ("--async",)):
        done = run_cli(
            "produce", "sizes", "--broker", address, "--max-item-bytes", str(30 * ONE_MIB), *extra,
            stdin=b"x" * (20 * ONE_MIB) + b"\n",
        )  # fmt: skip
        one_line_error(done, address, "max.message.size", code=1)
    assert broker.proc.poll() is None


def test_a_refused_item_within_the_frame_limit_is_reported(broker_factory: Any) -> None:
    """1.5 MiB: over the broker's 1 MiB max.message.size, under its frame limit: the
    broker answers MESSAGE_SIZE_TOO_LARGE and the CLI says so in one line."""
    broker = broker_factory()
    address = f"127.0.0.1:{broker.port}"
    done = run_cli(
        "produce", "sizes", "--broker", address, "--max-item-bytes", str(2 * ONE_MIB),
        stdin=b"x" * (3 * ONE_MIB // 2) + b"\n",
    )  # fmt: skip
    one_line_error(done, address, "MESSAGE_SIZE_TOO_LARGE", code=1)


# -- produce --async -----------------------------------------------------------------------
def test_async_produce_says_sent_and_that_refusals_are_not_reported(broker_factory: Any) -> None:
    broker = broker_factory()
    address = f"127.0.0.1:{broker.port}"
    assert run_cli("produce", "async", "--broker", address, stdin=b"first\n").returncode == 0
    # 1.5 MiB: the broker refuses it (max.message.size 1 MiB), and a oneway call hears nothing.
    done = run_cli(
        "produce", "async", "--async", "--broker", address, "--max-item-bytes", str(2 * ONE_MIB),
        stdin=b"x" * (3 * ONE_MIB // 2) + b"\n",
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "produced" not in err, err
    assert "sent 1 item to" in err and "oneway" in err and "not reported" in err, err
    assert topic_size(broker, "async") == 1


def test_async_produce_to_a_topic_that_never_appears_is_an_error(broker_factory: Any) -> None:
    broker = broker_factory()
    address = f"127.0.0.1:{broker.port}"
    done = run_cli(
        "produce", "never", "--async", "--broker", address, "--max-item-bytes", str(2 * ONE_MIB),
        stdin=b"x" * (3 * ONE_MIB // 2) + b"\n",
    )  # fmt: skip
    one_line_error(done, "'never'", "does not exist", address, code=1)


# -- wording ------------------------------------------------------------------------------------
def test_counts_of_one_are_singular(broker_factory: Any) -> None:
    broker = broker_factory()
    address = f"127.0.0.1:{broker.port}"
    for args, stdin, said in (
        (("produce", "one"), b"x\n", "produced 1 item to 'one'"),
        (("consume", "one", "--from", "earliest"), b"", "consumed 1 item from 'one'"),
        (("consume", "one", "--group", "g", "--no-commit"), b"", "consumed 1 item from 'one'"),
        (("delete", "one", "--password", PASSWORD), b"", "(1 item)"),
        (("produce", "two"), b"x\ny\n", "produced 2 items to 'two'"),
    ):
        done = run_cli(*args, "--broker", address, stdin=stdin)
        err = done.stderr.decode()
        assert done.returncode == 0, err
        assert said in err, (args, err)
    done = run_cli("produce", "one", "--broker", address, "--max-item-bytes", "1", stdin=b"x\nyy\n")
    one_line_error(done, "(1 item produced before it)", code=1)


def test_version_is_the_package_version() -> None:
    setup = configparser.ConfigParser()
    setup.read(Path(__file__).resolve().parents[2] / "setup.cfg", encoding="utf-8")
    done = run_cli("--version", timeout_s=30)
    assert (done.returncode, done.stderr) == (0, b""), done.stderr
    assert done.stdout.decode() == f"luxun {setup['metadata']['version']}\n"


# -- consume: packs ------------------------------------------------------------------------------
def test_consume_prints_the_messages_of_packs_and_raw_keeps_the_items(broker_factory: Any) -> None:
    """Packs (a producer's batches; gzip too) print one message per line, an item that is no
    pack as it is; ``--raw`` prints every item as stored; ``--max`` counts items."""
    from idl.codec import GZIP
    from idl.pack import encode_pack

    broker = broker_factory()
    address = f"127.0.0.1:{broker.port}"
    items = [encode_pack([b"a1", b"a2", b"a3"]), b"plain", encode_pack([b"b1", b"b2"], GZIP)]
    client = broker.client()
    try:
        for item in items:
            assert client.produce(T.ProduceRequest(item=item, topic="packs")).result.resultCode == T.ResultCode.SUCCESS
    finally:
        client.close()
    done = run_cli("consume", "packs", "--from", "earliest", "--broker", address)
    assert (done.returncode, done.stdout) == (0, b"a1\na2\na3\nplain\nb1\nb2\n"), done.stderr
    assert "consumed 3 items (2 packs, 5 messages) from 'packs'" in done.stderr.decode(), done.stderr
    done = run_cli("consume", "packs", "--from", "earliest", "--raw", "--broker", address)
    assert (done.returncode, done.stdout) == (0, b"".join(item + b"\n" for item in items)), done.stderr
    done = run_cli("consume", "packs", "--from-index", "0", "--max", "1", "--broker", address)
    assert (done.returncode, done.stdout) == (0, b"a1\na2\na3\n"), done.stderr
    done = run_cli("consume", "packs", "--group", "g", "--broker", address)
    assert (done.returncode, done.stdout) == (0, b"a1\na2\na3\nplain\nb1\nb2\n"), done.stderr


def test_consume_commit_prints_the_uncommitted_messages_of_a_pack(broker_factory: Any) -> None:
    """A group committed inside a pack (message 2 of pack 0): --no-commit and --commit print
    that pack's other messages one per line (--raw: as a pack of them), then the rest."""
    from clients.consumer import SimpleConsumer
    from idl.pack import decode_pack, encode_pack

    broker = broker_factory()
    address = f"127.0.0.1:{broker.port}"
    client = broker.client()
    try:
        for item in (encode_pack([b"a1", b"a2", b"a3"]), b"plain", encode_pack([b"b1", b"b2"])):
            client.produce(T.ProduceRequest(item=item, topic="packs"))
    finally:
        client.close()
    with SimpleConsumer(address) as simple:
        simple.commit("packs", "g", 0, 2)
    peek = run_cli("consume", "packs", "--group", "g", "--no-commit", "--broker", address)
    assert (peek.returncode, peek.stdout) == (0, b"a3\nplain\nb1\nb2\n"), peek.stderr
    raw = run_cli("consume", "packs", "--group", "g", "--no-commit", "--raw", "--max", "1", "--broker", address)
    assert raw.returncode == 0 and decode_pack(raw.stdout[:-1]) == [b"a3"], raw.stderr
    done = run_cli("consume", "packs", "--group", "g", "--commit", "--max", "2", "--broker", address)
    assert (done.returncode, done.stdout) == (0, b"a3\nplain\n"), done.stderr
    assert "committed up to index 2" in done.stderr.decode(), done.stderr
    done = run_cli("consume", "packs", "--group", "g", "--commit", "--broker", address)
    assert (done.returncode, done.stdout) == (0, b"b1\nb2\n"), done.stderr
    assert "consumed 1 item (1 pack, 2 messages)" in done.stderr.decode(), done.stderr


# -- delete ------------------------------------------------------------------------------------
def test_delete_accepts_the_plain_form_the_broker_was_started_with(broker_factory: Any) -> None:
    broker = broker_factory()  # started with --password plain:<PASSWORD>
    address = f"127.0.0.1:{broker.port}"
    for topic in ("a", "b"):
        assert run_cli("produce", topic, "--broker", address, stdin=b"x\n").returncode == 0
    done = run_cli("delete", "a", "--password", f"plain:{PASSWORD}", "--broker", address)
    assert done.returncode == 0, done.stderr
    assert topic_size(broker, "a") is None
    done = run_cli("delete", "b", "--password", PASSWORD, "--broker", address)
    assert done.returncode == 0, done.stderr
    assert topic_size(broker, "b") is None


@pytest.mark.parametrize(
    "form",
    [
        "md5:" + hashlib.md5(PASSWORD.encode(), usedforsecurity=False).hexdigest(),
        "crc32:1234",
    ],
)
def test_delete_refuses_a_hashed_password_form(broker_factory: Any, form: str) -> None:
    broker = broker_factory()
    address = f"127.0.0.1:{broker.port}"
    assert run_cli("produce", "keep", "--broker", address, stdin=b"x\n").returncode == 0
    done = run_cli("delete", "keep", "--password", form, "--broker", address)
    one_line_error(done, form.split(":")[0] + ":", "the password itself", code=2)
    assert form.split(":")[1] not in done.stderr.decode()  # the secret is not echoed
    assert topic_size(broker, "keep") == 1


def test_delete_of_a_missing_topic_does_not_say_deleted(broker_factory: Any) -> None:
    broker = broker_factory()
    address = f"127.0.0.1:{broker.port}"
    done = run_cli("delete", "ghost", "--password", PASSWORD, "--broker", address)
    line = one_line_error(done, "'ghost'", "does not exist", address, code=1)
    assert "deleted" not in line


def test_delete_on_a_broker_without_password_says_deletion_is_disabled(broker_factory: Any) -> None:
    broker = broker_factory("--password", "")  # the last --password wins: none configured
    address = f"127.0.0.1:{broker.port}"
    assert run_cli("produce", "kept", "--broker", address, stdin=b"x\n").returncode == 0
    done = run_cli("delete", "kept", "--password", "anything", "--broker", address)
    one_line_error(done, "'kept'", "disabled", address, code=1)
    assert topic_size(broker, "kept") == 1


def test_delete_with_a_wrong_password_is_one_line(broker_factory: Any) -> None:
    broker = broker_factory()
    address = f"127.0.0.1:{broker.port}"
    assert run_cli("produce", "kept", "--broker", address, stdin=b"x\n").returncode == 0
    done = run_cli("delete", "kept", "--password", "wrong", "--broker", address)
    one_line_error(done, "'kept'", "AUTHENTICATION_FAILURE", address, code=1)


# -- topics ----------------------------------------------------------------------------------------
def test_topics_from_the_broker_port_with_metrics_off(broker_factory: Any) -> None:
    """listTopics on the QueueService port; ``consume --group --max 1`` moves the group by one item only."""
    broker = broker_factory()  # metrics off
    address = f"127.0.0.1:{broker.port}"
    assert run_cli("produce", "logs", "--broker", address, stdin=b"1\n2\n3\n").returncode == 0
    assert run_cli("produce", "alpha", "--broker", address, stdin=b"1\n").returncode == 0
    assert run_cli("consume", "logs", "--group", "g", "--max", "1", "--broker", address).returncode == 0
    done = run_cli("topics", "--broker", address)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.decode().splitlines()[1:]]
    assert [row[:4] for row in rows] == [["alpha", "1", "0", "1"], ["logs", "3", "0", "3"]], done.stdout
    assert "g (2)" in done.stdout.decode()


def test_topics_from_a_metrics_url_that_is_down_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = run_cli("topics", "--metrics", url)
    one_line_error(done, url, code=1)


# -- serve -------------------------------------------------------------------------------------------
def test_serve_with_a_bogus_log_level_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = run_cli("serve", "--data-dir", str(data), "--port", "0", "--metrics-port", "0", "--log-level", "bogus")
    one_line_error(done, "'bogus'", "DEBUG", code=2)
    assert not data.exists()


@pytest.mark.parametrize("which", ["--port", "--metrics-port"])
def test_serve_on_a_port_in_use_names_it_and_creates_no_data_dir(tmp_path: Path, which: str) -> None:
    data = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        ports = {"--port": "0", "--metrics-port": "0", which: str(port)}
        args = [a for k, v in ports.items() for a in (k, v)]
        done = run_cli("serve", "--data-dir", str(data), *args, timeout_s=30)
    one_line_error(done, f"127.0.0.1:{port}", "in use", code=2)
    assert not data.exists()


def test_serve_with_two_listeners_on_one_port_is_one_line(tmp_path: Path) -> None:
    data, port = tmp_path / "data", str(free_port())
    done = run_cli("serve", "--data-dir", str(data), "--port", port, "--metrics-port", port, timeout_s=30)
    one_line_error(done, f"port (--port) and metrics.port (--metrics-port) are both {port}", code=2)
    assert not data.exists()


def test_serve_that_cannot_listen_stops_and_says_why_in_one_line(tmp_path: Path) -> None:
    # Two names of one address pass the configuration check; the metrics server listens
    # first, and the QueueService port then cannot.
    if socket.gethostbyname("localhost") != "127.0.0.1":
        pytest.skip("localhost is not 127.0.0.1 here")
    port = str(free_port())
    done = run_cli(
        "serve", "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1", "--port", port,
        "--metrics-host", "localhost", "--metrics-port", port, timeout_s=30,
    )  # fmt: skip
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 2, err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1] == f"luxun: 127.0.0.1:{port} (port, --port) cannot listen: Address already in use", err
    assert "stopped; every topic flushed and closed" in err, err


def test_serve_with_a_data_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.write_text("not a directory")
    done = run_cli("serve", "--data-dir", str(data), "--port", "0", "--metrics-port", "0", timeout_s=30)
    one_line_error(done, str(data), "not a directory", code=2)


# -- against Java Luxun (skipped without its build) ------------------------------------------
@pytest.fixture
def java_broker(tmp_path: Path) -> Iterator[str]:
    """Java Luxun 0.6.2 on a free loopback port (its password: plain:luxun); yields host:port."""
    with java_luxun(tmp_path) as where:
        yield where


def test_the_cli_against_java_luxun(java_broker: str) -> None:
    """The same commands against the original broker: plain: passwords work, the
    listTopics extension is named as unknown there, in one line."""
    assert run_cli("produce", "t", "--broker", java_broker, stdin=b"x\n").returncode == 0
    done = run_cli("topics", "--broker", java_broker)
    one_line_error(done, java_broker, "listTopics", "Java Luxun", code=1)
    done = run_cli("delete", "t", "--password", "plain:luxun", "--broker", java_broker)
    assert done.returncode == 0, done.stderr
    done = run_cli("delete", "t", "--password", "luxun", "--broker", java_broker)
    one_line_error(done, "'t'", "does not exist", java_broker, code=1)


def test_our_producer_and_hand_framed_produce_calls_against_java_luxun(java_broker: str) -> None:
    """Our Producer frames its produce and asyncProduce calls by hand (sent from the pack
    itself): Java Luxun's Thrift server must read them as it reads thriftpy2's, store the
    packs in order and answer the acknowledged ones."""
    from clients.connection import BrokerConnection, consume_request
    from clients.messages import decode_pack
    from clients.producer import Producer

    for sync in (True, False):
        topic = f"ours-{'sync' if sync else 'async'}"
        with Producer(java_broker, sync=sync, batch_size=100, linger_ms=5) as producer:
            for i in range(1000):
                producer.send(topic, b"%04d" % i + b"v" * (i % 300))
            producer.flush()
        got: list[bytes] = []
        with BrokerConnection(java_broker) as conn:
            deadline = time.monotonic() + 20
            while len(got) < 1000 and time.monotonic() < deadline:
                response = conn.call("consume", consume_request(topic, group="check", max_bytes=1 << 20))
                if response.result.resultCode == T.ResultCode.SUCCESS:
                    got.extend(m for item in response.itemList for m in decode_pack(item))
                else:
                    time.sleep(0.05)
        assert got == [b"%04d" % i + b"v" * (i % 300) for i in range(1000)], (sync, len(got))
