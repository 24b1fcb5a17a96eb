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
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
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
def own_broker(
    data_parent: Path | None,
    name: str,
    broker_cpus: list[int] | None = None,
    properties: dict[str, str] | None = None,
) -> Iterator[BrokerInfo]:
    """Start ``python -m luxun.cli serve`` on 127.0.0.1 (a free port) with a temporary data
    dir and a random deleteTopic password, pinned to ``broker_cpus`` if given; wait for its
    "serving" log line; at the end SIGTERM it and remove the data dir. ``name`` (the
    benchmark's) prefixes the data dir and the progress lines on stderr; ``properties``
    are written to a ``server.properties`` it is started with (e.g. ``busy.poll.us``)."""
    root = _fresh_root(data_parent, name)
    data_dir = root / "data"
    password = secrets.token_hex(8)
    command = [
        sys.executable, "-m", "luxun.cli", "serve",
        "--data-dir", str(data_dir), "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
        "--password", f"plain:{password}", "--log-level", "INFO",
    ]  # fmt: skip
    if properties:
        config = root / "server.properties"
        config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()), encoding="utf-8")
        command += ["--config", str(config)]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def ready(text: str) -> tuple[str, int] | None:
        m = _SERVING.search(text)
        return (m.group(1), int(m.group(2))) if m else None

    with _broker_process(name, root, command, ready, password, broker_cpus, env=env, cwd=REPO) as info:
        yield info


def _fresh_root(data_parent: Path | None, name: str) -> Path:
    if data_parent is not None:
        data_parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=data_parent))


@contextlib.contextmanager
def _broker_process(
    name: str,
    root: Path,
    command: list[str],
    ready: Callable[[str], tuple[str, int] | None],
    password: str | None,
    broker_cpus: list[int] | None,
    *,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    clean_exit_codes: tuple[int, ...] = (0,),
) -> Iterator[BrokerInfo]:
    """Run ``command`` (its output to ``root/broker.log``) until ``ready(log text)`` gives the
    address it serves on; yield it; at the end SIGTERM it (kill after a timeout) and remove
    ``root``. An exit code outside ``clean_exit_codes`` prints the log's tail."""
    log_path = root / "broker.log"

    def pin() -> None:
        if broker_cpus:
            os.sched_setaffinity(0, broker_cpus)

    info: BrokerInfo | None = None
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, preexec_fn=pin
        )
    try:
        deadline = time.monotonic() + BROKER_START_TIMEOUT_S
        while True:
            text = log_path.read_text(encoding="utf-8", errors="replace")
            address = ready(text)
            if address:
                info = BrokerInfo(address[0], address[1], proc.pid, password, command, str(log_path))
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not start (exit code {proc.poll()}); its log:\n{text[-3000:]}")
            time.sleep(0.05)
        print(f"{name}: broker pid {proc.pid} on {info.host}:{info.port}, files in {root}", file=sys.stderr)
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
        if proc.returncode not in (*clean_exit_codes, None):
            text = log_path.read_text(encoding="utf-8", errors="replace")
            print(f"{name}: broker exit code {proc.returncode}; log tail:\n{text[-2000:]}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)


# -- the Java Luxun build, to measure against ---------------------------------------------
#: Where tests and benchmarks look for the Java Luxun 0.6.2 + bigqueue 0.7.2 build by default.
JAVA_PEER_ENV: Final = "LUXUN_JAVA_PEER"


def default_java_peer() -> Path:
    """``$LUXUN_JAVA_PEER``, or ``<repo>/.peers/luxun-java``."""
    return Path(os.environ.get(JAVA_PEER_ENV) or REPO / ".peers" / "luxun-java")


@dataclass(frozen=True)
class JavaPeer:
    """The Java Luxun build (../shared/peers/luxun-java/README.md): its runtime classpath,
    the bigqueue jar, the broker's conf folder and BigQueueBench's classes."""

    root: Path
    classpath: str
    bigqueue_jar: Path
    conf: Path
    bench_classes: Path

    @classmethod
    def at(cls, root: Path) -> JavaPeer:
        """The build under ``root``. Raises FileNotFoundError naming the first missing part."""
        root = root.resolve()
        cp_file = root / "build" / "classpath.txt"
        jars = sorted((root / "build").glob("bigqueue-*.jar"))
        conf = root / "src" / "luxun" / "conf"
        bench = root / "bench" / "classes"
        for path, what in (
            (cp_file, "build/classpath.txt"),
            (jars[0] if jars else root / "build" / "bigqueue-*.jar", "build/bigqueue-*.jar"),
            (conf / "server.properties", "src/luxun/conf/server.properties"),
            (conf / "log4j.properties", "src/luxun/conf/log4j.properties"),
            (bench / "BigQueueBench.class", "bench/classes/BigQueueBench.class"),
        ):
            if not path.exists():
                raise FileNotFoundError(f"no Java Luxun build at {root}: {what} is missing")
        if shutil.which("java") is None:
            raise FileNotFoundError("no `java` on PATH to run the Java Luxun build")
        return cls(root, cp_file.read_text(encoding="utf-8").strip(), jars[-1], conf, bench)


def java_version() -> str:
    """The first line of ``java -version`` (e.g. ``openjdk version "17.0.15" 2025-04-15``), or ``"unknown"``."""
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[0] if lines else "unknown"


#: Every port free_port handed out in this process.
_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` a moment ago (for a server that cannot be given port 0),
    never one handed out before in this process (the kernel may offer a just-closed port
    again, and one broker given it twice fails to start)."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port on {host} that this process has not handed out ({len(_HANDED_OUT)} so far)")


def port_answers(host: str, port: int) -> bool:
    """Whether a TCP connect to ``host:port`` succeeds."""
    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def java_broker(
    peer: JavaPeer,
    data_parent: Path | None,
    name: str,
    broker_cpus: list[int] | None = None,
    java_opts: tuple[str, ...] = (),
) -> Iterator[BrokerInfo]:
    """Start the Java Luxun broker on 127.0.0.1 (a free port) with a copy of its
    ``server.properties`` where only ``log.dir`` (a temporary folder) and ``port`` change,
    as the build's README says; ready once it logs "Thrift server started" and its port
    answers. At the end SIGTERM it (its shutdown hook closes the logs) and remove the
    folder. The deleteTopic password is the one in the file (``plain:luxun``)."""
    root = _fresh_root(data_parent, f"{name}-java")
    port = free_port()
    props = (peer.conf / "server.properties").read_text(encoding="utf-8")
    for key, value in (("log.dir", root / "data"), ("port", port)):
        props, n = re.subn(rf"(?m)^{re.escape(key)}=.*$", f"{key}={value}", props)
        if n != 1:
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(f"{peer.conf / 'server.properties'}: expected one `{key}=` line, found {n}")
    m = re.search(r"(?m)^password=plain:(\S*)\s*$", props)
    (root / "server.properties").write_text(props, encoding="utf-8")
    command = [
        "java", *java_opts, "-Dluxun.bind.host=127.0.0.1",
        f"-Dlog4j.configuration=file:{peer.conf / 'log4j.properties'}",
        "-cp", peer.classpath, "com.leansoft.luxun.Luxun", str(root / "server.properties"),
    ]  # fmt: skip

    def ready(text: str) -> tuple[str, int] | None:
        if "fail to start" in text:
            raise RuntimeError(f"the Java Luxun broker did not start on port {port}; its log:\n{text[-3000:]}")
        if "Thrift server started" in text and port_answers("127.0.0.1", port):
            return "127.0.0.1", port
        return None

    # The JVM exits with 143 (128 + SIGTERM) after running its shutdown hook.
    with _broker_process(
        name, root, command, ready, m.group(1) if m else None, broker_cpus, cwd=root, clean_exit_codes=(0, 143)
    ) as info:
        yield info


@contextlib.contextmanager
def external_broker(address: str, password: str | None) -> Iterator[BrokerInfo]:
    """A running broker at ``host:port`` (``--broker``), left running."""
    host, _, port = address.rpartition(":")
    yield BrokerInfo(host or "127.0.0.1", int(port), None, password, [], None)
