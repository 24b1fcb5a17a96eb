"""Fixtures for the agent tests: Dory's client built from source, brokers, an agent subprocess.

Dory's client code (``to_dory`` and ``libdory_client.so``) is built with Dory's
``build.sh`` from the folder named by ``LUXUN_DORY_PEER`` (default: ``../shared/peers/dory``
next to the repository, or next to its parent folder for a worktree) into the cache folder
``LUXUN_DORY_CACHE`` (default ``<tmp>/luxun-dory-client``); a second build of the same
sources does nothing. Tests that need it are skipped, with the reason, when the folder or
gcc/g++ are missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clients.consumer import SimpleConsumer
from tests._broker import BrokerProcess, address, brokers, free_port, stop_process  # noqa: F401 (brokers: the shared fixture)

REPO = Path(__file__).resolve().parents[2]


def _dory_peer() -> Path | None:
    env = os.environ.get("LUXUN_DORY_PEER")
    candidates = [Path(env)] if env else [REPO.parent / "shared/peers/dory", REPO.parent.parent / "shared/peers/dory"]
    return next((p for p in candidates if (p / "build.sh").is_file()), None)


@pytest.fixture(scope="session")
def dory() -> Path:
    """The folder holding Dory's ``to_dory`` and ``libdory_client.so``."""
    peer = _dory_peer()
    if peer is None:
        pytest.skip("Dory's client sources are absent (set LUXUN_DORY_PEER to the peers/dory folder)")
    if not (shutil.which("gcc") and shutil.which("g++")):
        pytest.skip("gcc/g++ are missing: cannot build Dory's client library and to_dory")
    out = Path(os.environ.get("LUXUN_DORY_CACHE", Path(tempfile.gettempdir()) / "luxun-dory-client"))
    run = subprocess.run(["bash", str(peer / "build.sh"), str(out)], capture_output=True, text=True, timeout=240)
    if run.returncode != 0:
        pytest.fail(f"building Dory's client failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
    return out


class AgentProcess:
    """``python -m luxun.cli agent`` with all three inputs, in a short temp folder
    (UNIX socket paths are limited to 107 bytes)."""

    def __init__(self, broker_addresses: list[str], *extra: str, config: str | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="lxa-"))
        self.dgram = str(self.dir / "dg")
        self.stream = str(self.dir / "st")
        self.status_port = free_port()
        self.tcp_port = 0
        self.log_path = self.dir / "agent.log"
        self.cmd = [sys.executable, "-m", "luxun.cli", "agent", "--dgram", self.dgram, "--stream", self.stream,
                    "--tcp-port", "0", "--status-port", str(self.status_port), *extra]  # fmt: skip
        for b in broker_addresses:
            self.cmd += ["--broker", b]
        if config is not None:
            path = self.dir / "dory.xml"
            path.write_text(config)
            self.cmd += ["--config", str(path)]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> AgentProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}:\n{self.log()}")
            m = re.search(r"agent serving .*tcp 127\.0\.0\.1:(\d+)", self.log())
            if m:
                self.tcp_port = int(m.group(1))
                return self
            time.sleep(0.05)
        raise RuntimeError(f"agent did not start within {timeout_s}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.status_port}{path}", timeout=10) as r:
            body = r.read().decode()
        return json.loads(body) if path.endswith("/json") else body

    def counters(self) -> dict[str, int]:
        return {c["name"]: c["value"] for c in self.get("/counters/json")["counters"]}

    def discards(self) -> dict[str, int]:
        return dict(self.get("/discards/json")["totals"]["by_reason"])

    def wait(self, what: Callable[[], bool], timeout_s: float = 30.0, message: str = "") -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if what():
                return
            assert self.proc is not None and self.proc.poll() is None, f"agent died:\n{self.log()}"
            time.sleep(0.05)
        raise AssertionError(f"timed out: {message}\ncounters: {self.counters()}\n{self.log()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        return stop_process(self.proc, sig, timeout_s)

    def summary(self) -> dict[str, Any]:
        m = re.search(r"agent stopped: (\{.*\})", self.log())
        assert m, self.log()
        return dict(json.loads(m.group(1)))


@pytest.fixture
def agents() -> Iterator[Callable[..., AgentProcess]]:
    started: list[AgentProcess] = []

    def start(broker_addresses: list[str], *extra: str, config: str | None = None) -> AgentProcess:
        a = AgentProcess(broker_addresses, *extra, config=config).start()
        started.append(a)
        return a

    yield start
    for a in started:
        with contextlib.suppress(Exception):
            a.stop(signal.SIGTERM, 10)
        shutil.rmtree(a.dir, ignore_errors=True)


def read_topic(broker: BrokerProcess, topic: str) -> list[bytes]:
    """Every message of ``topic`` on ``broker``, in order (packs decoded)."""
    out: list[bytes] = []
    with SimpleConsumer(address(broker)) as consumer:
        try:
            index = consumer.find_closest_index(topic, -1)
        except Exception:  # the topic does not exist there
            return out
        for _ in range(100_000):
            fetched = consumer.consume_by_index(topic, index)
            if not fetched.messages:
                return out
            assert fetched.next_index is not None
            index = fetched.next_index
            out.extend(fetched.messages)
    raise AssertionError("topic never ended")
