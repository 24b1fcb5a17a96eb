"""Helpers shared by the bigarray tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import zlib
from pathlib import Path

#: The repository root (so subprocesses import this checkout's bigarray).
ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

_HEADER = struct.Struct(">qI")  # index, payload length
_CRC = struct.Struct(">I")
#: Bytes an encoded item takes on top of its payload.
OVERHEAD = _HEADER.size + _CRC.size


def make_item(index: int, size: int) -> bytes:
    """A self-checking item of ``size`` bytes (>= OVERHEAD) that encodes ``index``."""
    n = size - OVERHEAD
    if n < 0:
        raise ValueError(f"an item needs at least {OVERHEAD} bytes")
    payload = (index.to_bytes(8, "big") * (n // 8 + 1))[:n]
    body = _HEADER.pack(index, n) + payload
    return body + _CRC.pack(zlib.crc32(body))


def item_index(item: bytes) -> int:
    """The index encoded in an item made by :func:`make_item`; raises on damage."""
    if len(item) < OVERHEAD:
        raise AssertionError(f"item of {len(item)} bytes is too short")
    index, n = _HEADER.unpack_from(item, 0)
    if n != len(item) - OVERHEAD:
        raise AssertionError(f"item length {len(item)} does not match its header ({n})")
    (crc,) = _CRC.unpack_from(item, len(item) - _CRC.size)
    if crc != zlib.crc32(item[: -_CRC.size]):
        raise AssertionError(f"item claiming index {index} fails its checksum")
    return int(index)


class FakeClock:
    """A settable millisecond clock to inject as ``clock=``."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def page_files(folder: str | os.PathLike[str]) -> list[str]:
    """Sorted page file names of a folder, in page number order."""
    names = [n for n in os.listdir(folder) if n.startswith("page-") and n.endswith(".dat")]
    return sorted(names, key=lambda n: int(n[5:-4]))


def mapped_files(under: str | os.PathLike[str]) -> list[str]:
    """Paths of files under ``under`` mapped in this process (from /proc/self/maps);
    unlinked files keep their ' (deleted)' suffix."""
    prefix = os.fspath(under).rstrip("/") + "/"
    out = set()
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split(None, 5)
            if len(parts) == 6 and parts[5].startswith(prefix):
                out.add(parts[5])
    return sorted(out)


def allocated_bytes(root: str | os.PathLike[str]) -> int:
    """Disk space taken by the files under ``root`` (st_blocks, not st_size)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Free bytes of the file system holding ``path``."""
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def open_deleted_files(under: str | os.PathLike[str]) -> list[str]:
    """Unlinked files under ``under`` that this process still holds open."""
    prefix = os.fspath(under).rstrip("/") + "/"
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix) and target.endswith(" (deleted)"):
            out.append(target)
    return sorted(out)
