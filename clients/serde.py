"""Value serdes: turn application values into message bytes and back: objects with
``encode(value) -> bytes`` and ``decode(bytes) -> value`` (:class:`BytesSerde`,
:class:`StrSerde`, :class:`JsonSerde`, or your own; see :func:`get_serde`).

Thread-safety: the serdes keep no state beyond their settings; use them from any thread.
"""

from __future__ import annotations

import json
from typing import Any, Final, Protocol, runtime_checkable

__all__ = ["SERDES", "BytesSerde", "JsonSerde", "Serde", "StrSerde", "get_serde"]


@runtime_checkable
class Serde(Protocol):
    """Turns values into message bytes and back. A producer only needs ``encode`` and a
    consumer only ``decode``; both must be thread-safe."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class BytesSerde:
    """Messages are bytes as they are (``bytearray``/``memoryview`` are copied to bytes)."""

    __slots__ = ()

    def encode(self, value: Any) -> bytes:
        if type(value) is bytes:
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise TypeError(f"the bytes serde takes bytes-like values, not {type(value).__name__} (use 'str' or 'json')")

    def decode(self, data: bytes) -> bytes:
        return data

    def __repr__(self) -> str:
        return "BytesSerde()"


class StrSerde:
    """Messages are text in ``encoding`` (UTF-8 by default); ``errors`` as for ``str.encode``."""

    __slots__ = ("encoding", "errors")

    def __init__(self, encoding: str = "utf-8", errors: str = "strict") -> None:
        "".encode(encoding, errors)  # an unknown encoding fails here, not on the first message
        self.encoding = encoding
        self.errors = errors

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"the str serde takes str values, not {type(value).__name__}")
        return value.encode(self.encoding, self.errors)

    def decode(self, data: bytes) -> str:
        return data.decode(self.encoding, self.errors)

    def __repr__(self) -> str:
        return f"StrSerde(encoding={self.encoding!r}, errors={self.errors!r})"


class JsonSerde:
    """Messages are JSON documents in UTF-8.

    Keyword arguments go to ``json.dumps``; the defaults are compact
    (``separators=(",", ":")``, ``ensure_ascii=False``). Decoding uses ``json.loads``.
    """

    __slots__ = ("dumps_kwargs",)

    def __init__(self, **json_dumps_kwargs: Any) -> None:
        self.dumps_kwargs: dict[str, Any] = {"separators": (",", ":"), "ensure_ascii": False, **json_dumps_kwargs}

    def encode(self, value: Any) -> bytes:
        return json.dumps(value, **self.dumps_kwargs).encode("utf-8")

    def decode(self, data: bytes) -> Any:
        return json.loads(data)

    def __repr__(self) -> str:
        return f"JsonSerde(**{self.dumps_kwargs!r})"


#: The serdes known by name.
SERDES: Final[dict[str, Serde]] = {"bytes": BytesSerde(), "str": StrSerde(), "json": JsonSerde()}


def get_serde(name_or_obj: Any) -> Serde:
    """The serde called ``name_or_obj`` in :data:`SERDES`, or ``name_or_obj`` itself if it
    is an object with ``encode`` or ``decode`` methods (a producer needs only ``encode``,
    a consumer only ``decode``)."""
    if isinstance(name_or_obj, str):
        try:
            return SERDES[name_or_obj.lower()]
        except KeyError:
            known = ", ".join(repr(k) for k in SERDES)
            raise ValueError(f"unknown serde {name_or_obj!r}: use one of {known} or an object") from None
    if isinstance(name_or_obj, type):
        raise TypeError(f"pass a serde instance, not the class {name_or_obj.__name__}")
    if callable(getattr(name_or_obj, "encode", None)) or callable(getattr(name_or_obj, "decode", None)):
        return name_or_obj  # type: ignore[no-any-return]
    raise TypeError(
        f"a serde is a name ({', '.join(SERDES)}) or an object with encode()/decode(), not {type(name_or_obj).__name__}"
    )
