from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ._util import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_tmpfs(tmp_path) -> Iterator[Callable[[str], Path | None]]:
    """``make_tmpfs("16m")`` mounts a fresh tmpfs of that size under tmp_path and returns
    its path, or None when mounting is not possible (needs root / CAP_SYS_ADMIN). Every
    mount is unmounted at the end of the test."""
    mounts: list[Path] = []
    errors: list[str] = []

    def make(size: str) -> Path | None:
        mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:8]}"
        mnt.mkdir()
        out = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            errors.append(out.stderr.strip() or f"mount exited with {out.returncode}")
            return None
        mounts.append(mnt)
        return mnt

    make.errors = errors  # type: ignore[attr-defined]
    try:
        yield make
    finally:
        for mnt in mounts:
            subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)
            if os.path.ismount(mnt):
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


@pytest.fixture
def tmpfs(make_tmpfs) -> Path:
    """A fresh 16 MiB tmpfs; the test is skipped when one cannot be mounted."""
    mnt = make_tmpfs("16m")
    if mnt is None:
        pytest.skip(f"cannot mount a tmpfs here (needs root/CAP_SYS_ADMIN): {make_tmpfs.errors[-1]}")
    return mnt
