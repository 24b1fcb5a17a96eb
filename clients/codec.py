"""The compression codecs of message-pack payloads, as the clients see them.

The codecs themselves (gzip as Java's ``GZIPOutputStream`` writes it, snappy in
snappy-java's xerial stream framing or as one raw block) live in :mod:`idl.codec`,
shared with the broker; see there for the formats. This module keeps the clients'
names and raises the clients' :class:`~clients.errors.PackError` (same message) where
``idl.codec`` raises its ``CodecError``.

Thread-safety: pure functions, callable from any number of threads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from idl import codec as _codec
from idl.codec import CODEC_NAMES, GZIP, NO_COMPRESSION, SNAPPY, CodecError, snappy_available
from idl.pack import PackError as IdlPackError

from .errors import PackError

_P = ParamSpec("_P")
_R = TypeVar("_R")

__all__ = [
    "CODEC_NAMES",
    "GZIP",
    "NO_COMPRESSION",
    "SNAPPY",
    "compress",
    "decompress",
    "snappy_available",
    "unknown_codec",
]


def client_errors(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` (a function of :mod:`idl.codec` or :mod:`idl.pack`) raising the clients'
    :class:`PackError` where it raises ``idl``'s error (``CodecError``,
    ``idl.pack.PackError``): same message, its cause and traceback kept."""

    @functools.wraps(fn)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except (CodecError, IdlPackError) as exc:
            raise client_error(exc) from exc.__cause__

    return call


#: ``payload`` compressed as a pack's payload is for ``codec`` (0 returns it as is).
compress = client_errors(_codec.compress)
#: The inverse of :func:`compress`; :class:`PackError` if ``payload`` is corrupt
#: (``max_bytes`` bounds snappy's output, checked before decompressing; None: no bound).
decompress = client_errors(_codec.decompress)


def unknown_codec(codec: Any) -> PackError:
    """The error for a codec that is not 0, 1 or 2."""
    return client_error(_codec.unknown_codec(codec))


def client_error(exc: ValueError) -> PackError:
    """``idl``'s error (``CodecError``, ``idl.pack.PackError``) as the clients'
    :class:`PackError`: same message, its traceback kept (raise it ``from exc.__cause__``)."""
    return PackError(*exc.args).with_traceback(exc.__traceback__)
