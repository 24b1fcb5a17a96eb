"""scripts/librdkafka-suite.sh: librdkafka's own test suite against our broker.

The run needs a librdkafka source tree (``LIBRDKAFKA_SRC``; the script builds its test
runner if it is not built) and is skipped without one, saying so: CI has none. The
checks of the script's arguments and of its test list need no tree and always run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "librdkafka-suite.sh"
LIST = ROOT / "scripts" / "librdkafka-suite.list"
#: Tests of the list that pass today (v2.15.0): producing, unknown partitions,
#: consuming with seeks, a consumer group's offset commits.
PASSING = ("0001", "0002", "0015", "0030")


def _env() -> dict[str, str]:
    return {**os.environ, "LUXUN_TREE": str(ROOT), "LUXUN_PYTHON": sys.executable}


def _entries() -> list[tuple[str, str, str]]:
    out = []
    for line in LIST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            num, kind, *rest = line.split(maxsplit=2)
            out.append((num, kind, rest[0] if rest else ""))
    return out


def test_list_names_each_test_once_with_a_reason_for_each_skip() -> None:
    seen: dict[tuple[str, str], str] = {}
    for num, kind, rest in _entries():
        assert re.fullmatch(r"\d{4}", num), num
        assert kind in ("run", "skip", "local"), (num, kind)
        if kind == "run":
            assert all(re.fullmatch(r"(scenario|subtests)=\S+", w) for w in rest.split()), (num, rest)
        else:
            assert rest, f"{num}: a {kind} line gives its reason"
        scenario = re.search(r"scenario[= ](\S+)", rest)
        key = (num, scenario.group(1) if scenario else "default")
        assert key not in seen, f"{num} is listed twice for one scenario"
        seen[key] = kind
    assert sum(kind == "run" for kind in seen.values()) >= 50


def test_a_wrong_tree_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path), "0001"], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "needs a librdkafka source tree" in done.stderr and str(tmp_path) in done.stderr


@pytest.mark.timeout(1800)
def test_passing_tests_pass(tmp_path: Path) -> None:
    src = os.environ.get("LIBRDKAFKA_SRC")
    if not src:
        pytest.skip("LIBRDKAFKA_SRC is not set: no librdkafka source tree to run its test suite from")
    done = subprocess.run(
        ["bash", str(SCRIPT), "--logs", str(tmp_path / "logs"), "--timeout", "600", src, *PASSING],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1700,
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    for num in PASSING:
        assert re.search(rf"^{num}-\S+ \.\.\. passed \(", done.stdout, re.M), report
    assert f"\n{len(PASSING)} passed, 0 failed, 0 skipped\n" in done.stdout, report
    assert (tmp_path / "logs" / "0001.log").is_file()
