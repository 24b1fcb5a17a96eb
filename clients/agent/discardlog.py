"""Dory's discard log file: one line per discarded message, rotated by size.

Dory's ``discardLogging`` (``enable``, ``path``, ``maxFileSize``, ``maxArchiveSize``,
``maxMsgPrefixSize``), in Dory's line format::

    now: <ms> ts: <message ms> event: DISC info: <REASON> topic: <n>[<topic>] key: <n>[<base64>] msg: <n>[<base64>]

where ``<n>`` is the length of what follows in brackets, key and value are base64 of at
most ``maxMsgPrefixSize`` bytes, and REASON is Dory's blurb: ``MALFORMED``,
``API_KEY(n)``, ``VERSION(n)``, ``BAD_TOPIC``, ``LONG_MSG``, ``RATE_LIMIT``, ``NO_MEM``,
``DELIVERY_ATTEMPT_LIMIT``, ``KAFKA_ERROR_ACK`` (a broker refused the pack), ``SERVER_SHUTDOWN``,
``UNCLEAN_U``/``UNCLEAN_T`` (bytes left by a UNIX stream / TCP client that closed inside a
message). A malformed message is logged whole (as ``msg``, no topic); a message discarded
after routing has no key (the agent drops keys when it routes).

When the next line would make the file bigger than ``maxFileSize``, the file ``f`` is
renamed ``f.<epoch ms>`` and a new ``f`` started; then the oldest ``f.<digits>`` files are
deleted while together they hold more than ``maxArchiveSize``. A write error is logged
once per minute (rate-limited) and the line is dropped; discards are still counted.

Thread-safety: :meth:`DiscardLog.write` from any thread (one lock).
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import time
from collections.abc import Iterable

log = logging.getLogger("luxun.agent")

MALFORMED = "MALFORMED"
BAD_TOPIC = "BAD_TOPIC"
LONG_MSG = "LONG_MSG"
RATE_LIMIT = "RATE_LIMIT"
NO_MEM = "NO_MEM"
DELIVERY_ATTEMPT_LIMIT = "DELIVERY_ATTEMPT_LIMIT"
ERROR_ACK = "KAFKA_ERROR_ACK"
SHUTDOWN = "SERVER_SHUTDOWN"


class DiscardLog:
    """Args:
    path: the log file (its folder is made if missing).
    max_file_bytes, max_archive_bytes: Dory's maxFileSize, maxArchiveSize.
    max_prefix_bytes: Dory's maxMsgPrefixSize (None: unlimited).

    Raises:
        OSError: the file cannot be opened (the message names it).
    """

    def __init__(self, path: str, max_file_bytes: int, max_archive_bytes: int, max_prefix_bytes: int | None) -> None:
        self.path = os.path.abspath(path)
        self.max_file_bytes = max_file_bytes
        self.max_archive_bytes = max_archive_bytes
        self.prefix = max_prefix_bytes
        self._lock = threading.Lock()
        self._last_error = -1e18
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise OSError(exc.errno, f"cannot open the discard log {self.path}: {exc.strerror}") from exc
        self._size = self._file.tell()

    def write(self, info: str, topic: bytes | str, ts: int | None, key: bytes, value: bytes | memoryview) -> None:
        """One discarded message (``ts`` None: now)."""
        self.write_many(info, topic, ts, key, (value,))

    def write_many(self, info: str, topic: bytes | str, ts: int | None, key: bytes,
                   values: Iterable[bytes | memoryview]) -> None:  # fmt: skip
        """Discarded messages of one topic, one line each."""
        now = int(time.time() * 1000)
        t = topic.encode(errors="replace") if isinstance(topic, str) else topic
        stamp = now if ts is None else ts
        k = self._b64(key)
        head = b"now: %d ts: %d event: DISC info: %s topic: %d[%s] key: %d[%s] msg: " % (
            now, stamp, info.encode(), len(t), t, len(k), k)  # fmt: skip
        lines = [b"%s%d[%s]\n" % (head, len(v), v) for v in map(self._b64, values)]
        with self._lock:
            try:
                for line in lines:
                    if self._size and self._size + len(line) > self.max_file_bytes:
                        self._rotate(now)
                    self._file.write(line)
                    self._size += len(line)
                self._file.flush()
            except (OSError, ValueError) as exc:
                if time.monotonic() - self._last_error > 60:
                    self._last_error = time.monotonic()
                    log.warning("discard log %s: %s (lines dropped; discards still counted)", self.path, exc)

    def _b64(self, data: bytes | memoryview) -> bytes:
        if self.prefix is not None:
            data = data[: self.prefix]
        return base64.b64encode(data) if data else b""

    def _rotate(self, now_ms: int) -> None:
        self._file.close()
        os.rename(self.path, f"{self.path}.{now_ms}")
        self._file = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        self._size = 0
        folder, name = os.path.split(self.path)
        old: list[tuple[int, str, int]] = []
        for entry in os.scandir(folder):
            stem, _, digits = entry.name.rpartition(".")
            if stem == name and digits.isdigit() and entry.is_file():
                old.append((int(digits), entry.path, entry.stat().st_size))
        old.sort()
        total = sum(size for _, _, size in old)
        for _, p, size in old:
            if total <= self.max_archive_bytes:
                break
            os.unlink(p)
            total -= size

    def close(self) -> None:
        with self._lock:
            self._file.close()


def values_of(written: bytes | bytearray) -> list[memoryview]:
    """The values of a batch's buffer (i32 length, bytes, one after the other)."""
    view = memoryview(written)
    out: list[memoryview] = []
    pos = 0
    while pos + 4 <= len(view):
        n = int.from_bytes(view[pos : pos + 4], "big")
        out.append(view[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out


__all__ = ["DiscardLog", "values_of"]
