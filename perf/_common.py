"""What the perf/ benchmarks share: the machine they ran on, the git commit, number formats.

The benchmarks are run as ``python perf/bench_x.py``, so this folder is ``sys.path[0]``
and they import from here with ``from _common import ...``. Nothing here is timed. The
machine-info functions read ``/proc`` or run ``git`` once and never raise (unknown facts
come back as ``"unknown"``, 0 or an empty dict); :func:`own_broker` starts a broker
subprocess for a benchmark.

Thread-safety: every function may be called from any thread or process.
:func:`collect_reports` and :func:`own_broker` raise: that is how a benchmark learns
that one of its processes failed.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

#: The repository's root folder (the parent of perf/).
REPO: Final[Path] = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    """The first ``model name`` of ``/proc/cpuinfo``, or ``"unknown"``."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def ram_gib() -> float:
    """``MemTotal`` of ``/proc/meminfo`` in GiB (unrounded), or 0.0."""
    with contextlib.suppress(OSError), open("/proc/meminfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    return 0.0


def os_pretty_name() -> str | None:
    """``PRETTY_NAME`` of ``/etc/os-release`` without its quotes (e.g. ``Debian GNU/Linux 12
    (bookworm)``), or None when the file or the line is missing."""
    name = None
    with contextlib.suppress(OSError), open("/etc/os-release", encoding="utf-8") as f:
        for line in f:
            if line.startswith("PRETTY_NAME="):
                name = line.split("=", 1)[1].strip().strip('"')
    return name


def dist_versions(dists: Iterable[str]) -> dict[str, str]:
    """Installed version of each distribution in ``dists``; the ones not installed are left out."""
    versions = {}
    for dist in dists:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    return versions


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded to 0.01."""
    return [round(x, 2) for x in os.getloadavg()]


def filesystem_of(path: Path) -> str:
    """Type and device of the mount holding ``path`` (longest matching mount point)."""
    best = ("", "unknown")
    with contextlib.suppress(OSError), open("/proc/mounts", encoding="utf-8") as f:
        for line in f:
            dev, mount, fstype = line.split()[:3]
            if str(path.resolve()).startswith(mount.rstrip("/") + "/") and len(mount) > len(best[0]):
                best = (mount, f"{fstype} on {dev}")
    return best[1]


def git_commit() -> str:
    """``git describe --always --dirty`` of the repository (a short hash, ``-dirty`` when
    the work tree has changes), or ``"unknown"``."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def machine_base() -> dict[str, Any]:
    """The hardware, in this order: ``cpu``, ``cores``, ``cores_usable`` (this process's
    CPU affinity), ``ram_gib`` (rounded to 0.1)."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "ram_gib": round(ram_gib(), 1),
    }


def machine_info(data_dir: Path | None, **extra: Any) -> dict[str, Any]:
    """The machine of a broker benchmark, for its header and its JSON.

    Keys, in order: :func:`machine_base`'s, ``os`` (``PRETTY_NAME``), ``kernel``,
    ``python``, then ``extra`` (e.g. package versions), ``git_commit``,
    ``load_average_start``, ``data_dir`` (``data_dir``, or the system temp dir when
    None) and ``data_dir_filesystem``. The caller adds ``load_average_end``.
    """
    data_dir = data_dir or Path(tempfile.gettempdir())
    return {
        **machine_base(),
        "os": os_pretty_name() or platform.platform(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        **extra,
        "git_commit": git_commit(),
        "load_average_start": load_average(),
        "data_dir": str(data_dir),
        "data_dir_filesystem": filesystem_of(data_dir),
    }


def fmt_rate(x: float) -> str:
    """A rate with a k/M/G suffix: 2 decimals below 10 of the unit, 1 above (``950``, ``1.23 k``, ``45.6 M``)."""
    for limit, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= limit:
            return f"{x / limit:.2f} {unit}" if x < 10 * limit else f"{x / limit:.1f} {unit}"
    return f"{x:.0f}"


def collect_reports(procs: list[Any], results: Any, timeout_s: float, what: str = "benchmark") -> list[dict[str, Any]]:
    """One report (a dict) from each of the started processes ``procs``, taken from the
    multiprocessing queue ``results`` in arrival order, then every process joined (one
    still alive 10 s later is killed).

    Raises:
        RuntimeError: no report within ``timeout_s``; a process died without reporting;
            a report carries an ``"error"`` (its traceback).
    """
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < len(procs):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"{what} processes did not report within {timeout_s:.0f} s")
            try:
                out.append(results.get(timeout=min(remaining, 1.0)))
                continue
            except queue.Empty:
                pass
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                try:  # a report may still be in the pipe
                    out.append(results.get(timeout=2.0))
                except queue.Empty:
                    raise RuntimeError(f"{what} process(es) died: exit codes {dead}") from None
    finally:
        for p in procs:
            p.join(10.0)
            if p.is_alive():
                p.kill()
                p.join(5.0)
    errors = [r["error"] for r in out if "error" in r]
    if errors:
        raise RuntimeError(f"a {what} process failed:\n" + "\n".join(errors))
    return out


# -- a broker for the benchmarks ----------------------------------------------------------
BROKER_START_TIMEOUT_S = 60.0
BROKER_STOP_TIMEOUT_S = 60.0


@dataclass
class BrokerInfo:
    """A broker a benchmark talks to (``pid`` None: not started by it)."""

    host: str
    port: int
    pid: int | None
    password: str | None
    command: list[str]
    log_path: str | None
    exit_code: int | None = None
    stop_seconds: float | None = None


_SERVING = re.compile(r"serving \d+ topics from .* on (\S+):(\d+) \(")


@contextlib.contextmanager
def own_broker(data_parent: Path | None, name: str, broker_cpus: list[int] | None = None) -> Iterator[BrokerInfo]:
    """Start ``python -m luxun.cli serve`` on 127.0.0.1 (a free port) with a temporary data
    dir and a random deleteTopic password, pinned to ``broker_cpus`` if given; wait for its
    "serving" log line; at the end SIGTERM it and remove the data dir. ``name`` (the
    benchmark's) prefixes the data dir and the progress lines on stderr."""
    if data_parent is not None:
        data_parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=data_parent))
    data_dir = root / "data"
    log_path = root / "broker.log"
    password = secrets.token_hex(8)
    command = [
        sys.executable, "-m", "luxun.cli", "serve",
        "--data-dir", str(data_dir), "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
        "--password", f"plain:{password}", "--log-level", "INFO",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def pin() -> None:
        if broker_cpus:
            os.sched_setaffinity(0, broker_cpus)

    info: BrokerInfo | None = None
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, preexec_fn=pin
        )
    try:
        deadline = time.monotonic() + BROKER_START_TIMEOUT_S
        while True:
            text = log_path.read_text(encoding="utf-8", errors="replace")
            m = _SERVING.search(text)
            if m:
                info = BrokerInfo(m.group(1), int(m.group(2)), proc.pid, password, command, str(log_path))
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not start (exit code {proc.poll()}); its log:\n{text[-3000:]}")
            time.sleep(0.05)
        print(f"{name}: broker pid {proc.pid} on {info.host}:{info.port}, data in {data_dir}", file=sys.stderr)
        yield info
    finally:
        t = time.perf_counter()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(BROKER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"{name}: the broker did not stop after SIGTERM; killing it", file=sys.stderr)
                proc.kill()
                proc.wait()
        if info is not None:
            info.exit_code = proc.returncode
            info.stop_seconds = round(time.perf_counter() - t, 2)
        if proc.returncode not in (0, None):
            text = log_path.read_text(encoding="utf-8", errors="replace")
            print(f"{name}: broker exit code {proc.returncode}; log tail:\n{text[-2000:]}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def external_broker(address: str, password: str | None) -> Iterator[BrokerInfo]:
    """A running broker at ``host:port`` (``--broker``), left running."""
    host, _, port = address.rpartition(":")
    yield BrokerInfo(host or "127.0.0.1", int(port), None, password, [], None)
