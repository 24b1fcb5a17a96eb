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
        self._count = count
        self._buf = (ctypes.c_char * (size * count))()
        base = ctypes.addressof(self._buf)
        self._iov = (_IoVec * count)()
        # The headers over a bytearray, so that the lengths the kernel writes (msg_len) are
        # read through a memoryview: indexing the ctypes array makes an object per read.
        self._raw = bytearray(ctypes.sizeof(_MMsgHdr) * count)
        self._msgs = (_MMsgHdr * count).from_buffer(self._raw)
        for i in range(count):
            self._iov[i].iov_base = base + i * size
            self._iov[i].iov_len = size
            self._msgs[i].msg_hdr.msg_iov = ctypes.pointer(self._iov[i])
            self._msgs[i].msg_hdr.msg_iovlen = 1
        self._lens = memoryview(self._raw).cast("I")
        stride = ctypes.sizeof(_MMsgHdr) // 4
        at = _MMsgHdr.msg_len.offset // 4
        #: per slot: where its datagram starts in _buf, where its length is in _lens
        self._slots = tuple((i * size, i * stride + at) for i in range(count))
        # Called without argtypes, the arguments made once (ints go as C ints, the headers'
        # address as a c_void_p): argtypes converts each argument on every call, about half
        # the cost of a call that finds the socket empty (2.1 -> 1.4 us here).
        self._call = libc.recvmmsg
        self._call.restype = ctypes.c_int
        self._msgs_at = ctypes.c_void_p(ctypes.addressof(self._msgs))

    def receive(self) -> list[bytes]:
        n = self._call(self._fd, self._msgs_at, self._count, _MSG_DONTWAIT, None)
        if n < 0:
            err = ctypes.get_errno()
            if err in (0, 11):  # EAGAIN (errno is not always captured: treat as nothing queued)
                raise BlockingIOError
            raise OSError(err, os.strerror(err))
        buf = self._buf
        lens = self._lens
        # a slice of a c_char array is bytes (typeshed says list[bytes])
        return [buf[start : start + lens[at]] for start, at in self._slots[:n]]  # type: ignore[misc]


def batch_receiver(sock: socket.socket, size: int, count: int = 16) -> BatchReceiver | None:
    """A receiver for ``sock``, or None when ``recvmmsg`` is not available."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.recvmmsg  # noqa: B018 - probe
    except (OSError, AttributeError):
        return None
    return BatchReceiver(libc, sock, size, count)


__all__ = ["BatchReceiver", "batch_receiver"]
