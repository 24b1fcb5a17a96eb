"""A real luxun broker in a subprocess on a free loopback port (shared by test tiers)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from thriftpy2.protocol import TCyBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.transport import TCyFramedTransportFactory

from idl import QueueService

PASSWORD = "secret"
#: The Java Luxun 0.6.2 build the Java-peer tests run (skipped without it).
JAVA_PEER = Path(os.environ.get("LUXUN_JAVA_PEER", Path(__file__).resolve().parents[1] / ".peers" / "luxun-java"))


#: Every port free_port handed out in this process.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago and that this process has not
    handed out before: the kernel may offer a just-closed port again, and a broker given
    the same port twice (its port and its metrics port) fails only once one of them listens."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 that this process has not handed out ({len(_HANDED_OUT)} so far)")


class BrokerProcess:
    """``python -m luxun.cli serve`` in a subprocess; its stderr goes to a log file."""

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        *extra: str,
        metrics: bool = False,
        kafka: bool = False,
        preexec_fn: Callable[[], None] | None = None,
        command: Sequence[str] | None = None,
        password: bool = True,
    ) -> None:
        self.data_dir = data_dir
        #: What runs the broker, before the options (default ``python -m luxun.cli serve``;
        #: e.g. ``scripts/run.sh``, which passes them on to ``luxun serve``).
        self.command = list(command) if command else [sys.executable, "-m", "luxun.cli", "serve"]
        self.password = password
        self.preexec_fn = preexec_fn  # run in the child before exec (e.g. resource limits)
        self.log_path = log_path
        self.extra = list(extra)
        self.port = free_port()
        self.metrics_port = free_port() if metrics else 0
        #: The Kafka-protocol port (0: off).
        self.kafka_port = free_port() if kafka else 0
        self.proc: subprocess.Popen[bytes] | None = None
        #: group.initial.rebalance.delay.ms given to the broker unless its --config sets
        #: it (0: the suite does not wait 3 s per new group); None: the broker's default.
        self.initial_rebalance_delay_ms: int | None = 0

    def _extra_args(self) -> list[str]:
        """``extra`` with group.initial.rebalance.delay.ms set (see
        :attr:`initial_rebalance_delay_ms`): added to a copy of the --config file, or in
        a file of its own."""
        extra = list(self.extra)
        key = "group.initial.rebalance.delay.ms"
        if self.initial_rebalance_delay_ms is None:
            return extra
        line = f"{key}={self.initial_rebalance_delay_ms}\n"
        if "--config" in extra:
            i = extra.index("--config") + 1
            original = Path(extra[i])
            text = original.read_text()
            if any(row.split("=", 1)[0].strip() == key for row in text.splitlines()):
                return extra
            merged = original.with_name(original.name + ".tests")
            merged.write_text(text.rstrip("\n") + "\n" + line)
            extra[i] = str(merged)
            return extra
        own = self.log_path.with_name(self.log_path.name + ".properties")
        own.write_text(line)
        return [*extra, "--config", str(own)]

    def start(self, timeout_s: float = 20.0) -> BrokerProcess:
        cmd = [
            *self.command,
            "--data-dir", str(self.data_dir),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--metrics-port", str(self.metrics_port),
            *(["--password", f"plain:{PASSWORD}"] if self.password else []),
            *(["--kafka-port", str(self.kafka_port)] if self.kafka_port else []),
            *self._extra_args(),
        ]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, preexec_fn=self.preexec_fn)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                if self.kafka_port:  # bound before the Thrift port accepts, but check
                    socket.create_connection(("127.0.0.1", self.kafka_port), timeout=0.2).close()
                return self
            time.sleep(0.05)
        raise RuntimeError(f"broker did not listen within {timeout_s}s:\n{self.log()}")

    @property
    def bootstrap(self) -> str:
        """``bootstrap_servers`` of the Kafka port."""
        return f"127.0.0.1:{self.kafka_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metrics_page(self) -> str:
        """The broker's /metrics page (started with ``metrics=True``)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as page:
            text: str = page.read().decode()
        return text

    def metric(self, name: str) -> float:
        """The value of the unlabelled metric ``name`` on the broker's /metrics page."""
        found = re.search(rf"^{name} (\S+)$", self.metrics_page(), re.M)
        assert found, f"{name} is not on the metrics page"
        return float(found.group(1))

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        assert self.proc is not None
        return stop_process(self.proc, sig, timeout_s)

    def client(self, timeout_ms: int | None = 10_000) -> Any:
        return make_client(
            QueueService,
            "127.0.0.1",
            self.port,
            proto_factory=TCyBinaryProtocolFactory(),
            trans_factory=TCyFramedTransportFactory(),
            timeout=timeout_ms,
        )


def stop_process(proc: subprocess.Popen[bytes], sig: int, timeout_s: float) -> int:
    """Send ``sig`` unless ``proc`` has exited; SIGKILL it after ``timeout_s``; its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


def address(broker: BrokerProcess) -> str:
    """``host:port`` of a broker's QueueService."""
    return f"127.0.0.1:{broker.port}"


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Callable[[int], list[BrokerProcess]]]:
    """``brokers(n)`` starts n brokers with separate data dirs; all are stopped at the end."""
    started: list[BrokerProcess] = []

    def start(n: int = 1) -> list[BrokerProcess]:
        for _ in range(n):
            i = len(started)
            started.append(BrokerProcess(tmp_path / f"data-{i}", tmp_path / f"broker-{i}.log").start())
        return started[-n:]

    yield start
    for broker in started:
        broker.stop()


def start_java_luxun(work: Path, data: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """Java Luxun 0.6.2 (``JAVA_PEER``) on a free loopback port, its files in ``work`` and
    its topics in ``data`` (default ``work / "java-data"``; its password: plain:luxun), once
    its port answers: the process and the port. Skips the test without the build."""
    classpath = JAVA_PEER / "build" / "classpath.txt"
    properties = JAVA_PEER / "src" / "luxun" / "conf" / "server.properties"
    if not classpath.is_file() or not properties.is_file() or shutil.which("java") is None:
        pytest.skip(f"no Java Luxun build at {JAVA_PEER} (set LUXUN_JAVA_PEER)")
    port = free_port()
    text = re.sub(r"(?m)^log\.dir=.*$", f"log.dir={data or work / 'java-data'}", properties.read_text())
    (work / "server.properties").write_text(re.sub(r"(?m)^port=.*$", f"port={port}", text))
    (work / "log4j.properties").write_text(
        "log4j.rootLogger=WARN, c\nlog4j.appender.c=org.apache.log4j.ConsoleAppender\n"
        "log4j.appender.c.layout=org.apache.log4j.SimpleLayout\n"
    )
    log_path = work / "java.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["java", "-Dluxun.bind.host=127.0.0.1", f"-Dlog4j.configuration=file:{work / 'log4j.properties'}",
             "-cp", classpath.read_text().strip(), "com.leansoft.luxun.Luxun", str(work / "server.properties")],
            stdout=log, stderr=log,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return proc, port
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(log_path.read_text())
        time.sleep(0.1)


@contextlib.contextmanager
def java_luxun(work: Path, data: Path | None = None) -> Iterator[str]:
    """:func:`start_java_luxun` for the block: yields host:port, stops it at the end."""
    proc, port = start_java_luxun(work, data)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(proc, signal.SIGTERM, 20)
