"""What the perf/ benchmarks share: the machine they ran on, the git commit, number formats.

The benchmarks are run as ``python perf/bench_x.py``, so this folder is ``sys.path[0]``
and they import from here with ``from _common import ...``. Nothing here is timed; every
function reads ``/proc`` or runs ``git`` once and never raises (unknown facts come back
as ``"unknown"``, 0 or an empty dict).

Thread-safety: every function may be called from any thread or process.
:func:`collect_reports` is the exception to "never raises": it is how a benchmark
learns that one of its processes failed.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import queue
import subprocess
import tempfile
import time
from collections.abc import Iterable
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
