"""Dory's C client library through ctypes, and ``to_dory``, as the tests use them."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path


class DoryClientSocket(ctypes.Structure):  # dory_client_socket_t
    _fields_ = [("sock_fd", ctypes.c_int), ("server_addr", ctypes.c_byte * 110)]


class DoryLib:
    def __init__(self, folder: Path) -> None:
        self.lib = ctypes.CDLL(str(folder / "libdory_client.so"))

    def size(self, topic: bytes, key: bytes, value: bytes, *, partition_key: bool) -> int:
        out = ctypes.c_size_t()
        f = self.lib.dory_find_partition_key_msg_size if partition_key else self.lib.dory_find_any_partition_msg_size
        rc = f(ctypes.c_size_t(len(topic)), ctypes.c_size_t(len(key)), ctypes.c_size_t(len(value)), ctypes.byref(out))
        assert rc == 0, rc
        return out.value

    def message(self, topic: bytes, value: bytes, *, key: bytes = b"", partition_key: int | None = None,
                timestamp_ms: int = 1_700_000_000_123) -> bytes:  # fmt: skip
        n = self.size(topic, key, value, partition_key=partition_key is not None)
        buf = ctypes.create_string_buffer(n)
        if partition_key is None:
            rc = self.lib.dory_write_any_partition_msg(buf, ctypes.c_size_t(n), topic, ctypes.c_int64(timestamp_ms),
                                                       key, ctypes.c_size_t(len(key)), value,
                                                       ctypes.c_size_t(len(value)))  # fmt: skip
        else:
            rc = self.lib.dory_write_partition_key_msg(buf, ctypes.c_size_t(n), ctypes.c_int32(partition_key), topic,
                                                       ctypes.c_int64(timestamp_ms), key, ctypes.c_size_t(len(key)),
                                                       value, ctypes.c_size_t(len(value)))  # fmt: skip
        assert rc == 0, rc
        return buf.raw

    def send_datagrams(self, path: str, messages: list[bytes]) -> None:
        """Send with the library's own socket (bound to a temp name, ``sendto``)."""
        s = DoryClientSocket()
        self.lib.dory_client_socket_init(ctypes.byref(s))
        assert self.lib.dory_client_socket_bind(ctypes.byref(s), path.encode()) == 0
        try:
            for m in messages:
                rc = self.lib.dory_client_socket_send(ctypes.byref(s), m, ctypes.c_size_t(len(m)))
                assert rc == 0, rc
        finally:
            self.lib.dory_client_socket_close(ctypes.byref(s))


def to_dory(folder: Path, *args: str) -> None:
    run = subprocess.run([str(folder / "to_dory"), *args], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"to_dory {' '.join(args)}: {run.returncode} {run.stderr}"
