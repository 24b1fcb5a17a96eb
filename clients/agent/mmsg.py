"""Read several datagrams per system call with Linux ``recvmmsg(2)`` through ctypes.

A UNIX datagram socket queues only ``net.unix.max_dgram_qlen`` datagrams (10 here) before
its senders block, so the agent must drain it fast. ``socket.recv`` costs one system call
and one give-and-take of the GIL per datagram; :class:`BatchReceiver` takes everything
queued (up to ``count``) in one call. Where ``recvmmsg`` is missing (not Linux, no glibc),
:func:`batch_receiver` returns None and the caller uses ``recv``.

A datagram longer than ``size`` is cut to ``size`` bytes, as ``recv(size)`` would cut it
(and the cut message then fails the Size check).

Thread-safety: one receiver per thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket

_MSG_DONTWAIT = 0x40


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(_IoVec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint)]


class BatchReceiver:
    """``receive()`` -> the datagrams waiting now (an empty list: none; raises
    BlockingIOError like ``recv`` on a non-blocking socket)."""

    def __init__(self, libc: ctypes.CDLL, sock: socket.socket, size: int, count: int = 16) -> None:
        self._fd = sock.fileno()
        self._size = size
        self._count = count
        self._buf = (ctypes.c_char * (size * count))()
        base = ctypes.addressof(self._buf)
        self._iov = (_IoVec * count)()
        self._msgs = (_MMsgHdr * count)()
        for i in range(count):
            self._iov[i].iov_base = base + i * size
            self._iov[i].iov_len = size
            self._msgs[i].msg_hdr.msg_iov = ctypes.pointer(self._iov[i])
            self._msgs[i].msg_hdr.msg_iovlen = 1
        self._view = memoryview(self._buf).cast("B")
        self._call = libc.recvmmsg
        self._call.argtypes = [ctypes.c_int, ctypes.POINTER(_MMsgHdr), ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
        self._call.restype = ctypes.c_int

    def receive(self) -> list[bytes]:
        n = self._call(self._fd, self._msgs, self._count, _MSG_DONTWAIT, None)
        if n < 0:
            err = ctypes.get_errno()
            if err in (0, 11):  # EAGAIN (errno is not always captured: treat as nothing queued)
                raise BlockingIOError
            raise OSError(err, os.strerror(err))
        view = self._view
        size = self._size
        msgs = self._msgs
        return [view[i * size : i * size + msgs[i].msg_len].tobytes() for i in range(n)]


def batch_receiver(sock: socket.socket, size: int, count: int = 16) -> BatchReceiver | None:
    """A receiver for ``sock``, or None when ``recvmmsg`` is not available."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.recvmmsg  # noqa: B018 - probe
    except (OSError, AttributeError):
        return None
    return BatchReceiver(libc, sock, size, count)


__all__ = ["BatchReceiver", "batch_receiver"]
