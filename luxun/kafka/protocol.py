"""The Kafka wire protocol: frames, request and response headers, and kio's schemas.

The schemas of every API and version come from `kio <https://github.com/Aiven-Open/kio>`_
(generated from Apache Kafka's own JSON message definitions; parsing and
serialisation in native code: a Metadata request parses in about 0.6 us). This module
adds what kio leaves to a server:

* :func:`parse_request_header`: the request header (v1, or v2 with tagged fields for
  flexible versions) and where the body starts;
* :func:`encode_response`: a response frame (header v0, or v1 for flexible versions,
  except ApiVersions, whose response header is always v0, as KIP-511 requires);
* :func:`build`: a response entity of any version from plain values (``dict`` for
  nested entities, ``int`` for error codes, milliseconds for durations), filling the
  fields a version has and ignoring the ones it lacks, so a handler is written once
  for every version.

Thread-safety: every function is pure (caches are filled under the GIL, idempotently).
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import types
import typing
import uuid
from collections.abc import Callable
from typing import Any, Final

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

__all__ = [
    "API_VERSIONS_KEY",
    "CloseConnection",
    "ErrorCode",
    "ProtocolError",
    "RequestHeader",
    "build",
    "encode_response",
    "parse_request_header",
    "read_request",
    "request_schema",
]

API_VERSIONS_KEY: Final = 18

_HEAD: Final = struct.Struct(">hhih")
_I32: Final = struct.Struct(">i")
_ZERO_UUID: Final = uuid.UUID(int=0)
_EPOCH: Final = datetime.datetime.fromtimestamp(0, datetime.UTC)


class ProtocolError(ValueError):
    """A request that cannot be parsed: the connection is closed (as Kafka does)."""


class CloseConnection(ProtocolError):
    """A request answered with ``response`` (a whole frame; None: no answer), after
    which the connection is closed, as Kafka closes it: a failed SASL login, a request
    before authentication. The message is the broker's log line (rate-limited under
    ``log_key``)."""

    def __init__(self, message: str, response: bytes | None = None, *, log_key: str = "kafka-sasl") -> None:
        super().__init__(message)
        self.response = response
        self.log_key = log_key


@dataclasses.dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: Where the request body starts in the frame.
    body_offset: int


def _uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtocolError("truncated varint in the request header")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ProtocolError("varint longer than 5 bytes in the request header")


def parse_request_header(frame: bytes, flexible: Callable[[int, int], bool]) -> RequestHeader:
    """Parse a request header; ``flexible(api_key, version)`` says whether it is v2.

    Raises:
        ProtocolError: the header is truncated or malformed.
    """
    if len(frame) < _HEAD.size:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, version, correlation_id, n = _HEAD.unpack_from(frame, 0)
    pos = _HEAD.size
    client_id: str | None = None
    if n >= 0:
        if pos + n > len(frame):
            raise ProtocolError("client id runs past the end of the request")
        try:
            client_id = frame[pos : pos + n].decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("client id is not UTF-8") from None
        pos += n
    elif n != -1:
        raise ProtocolError(f"client id length {n}")
    if flexible(api_key, version):
        count, pos = _uvarint(frame, pos)
        for _ in range(count):
            _, pos = _uvarint(frame, pos)
            size, pos = _uvarint(frame, pos)
            pos += size
            if pos > len(frame):
                raise ProtocolError("tagged field runs past the end of the request header")
    return RequestHeader(api_key, version, correlation_id, client_id, pos)


_readers: dict[tuple[int, int], Callable[..., Any]] = {}
_writers: dict[type, Callable[..., Any]] = {}


def request_schema(api_key: int, version: int) -> Any:
    """kio's request class for ``api_key`` at ``version`` (KeyError-free: raises
    ProtocolError when kio has none)."""
    try:
        return load_request_schema(api_key, version)
    except Exception as exc:  # kio raises its own index errors
        raise ProtocolError(f"no schema for API {api_key} v{version}") from exc


def read_request(header: RequestHeader, frame: bytes) -> Any:
    """Parse the body of a request as kio's entity for its API and version.

    Raises:
        ProtocolError: the body does not parse (bytes after it are ignored, as in Kafka).
    """
    key = (header.api_key, header.api_version)
    reader = _readers.get(key)
    if reader is None:
        reader = _readers[key] = entity_reader(request_schema(*key))
    try:
        entity, _size = reader(frame, header.body_offset)
    except Exception as exc:  # kio raises ValueError, IndexError, UnicodeDecodeError...
        raise ProtocolError(f"malformed API {key[0]} v{key[1]} request: {exc}") from None
    # Bytes after the body are ignored, as Kafka does (RequestContext.parseRequest):
    # librdkafka 2.x sends 3 of them after a Metadata v12 request for all topics.
    return entity


def encode_response(header: RequestHeader, response: Any) -> bytes:
    """The frame (size included) answering ``header`` with kio entity ``response``."""
    writer = _writers.get(type(response))
    if writer is None:
        writer = _writers[type(response)] = entity_writer(type(response))
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(_I32.pack(header.correlation_id))
    if response.__flexible__ and header.api_key != API_VERSIONS_KEY:
        out.write(b"\0")  # response header v1: no tagged fields
    writer(out, response)
    frame = out.getbuffer()
    _I32.pack_into(frame, 0, len(frame) - 4)
    del frame
    return out.getvalue()


_response_schemas: dict[tuple[int, int], Any] = {}


def response_schema(api_key: int, version: int) -> Any:
    """kio's response class for ``api_key`` at ``version`` (cached: kio resolves it by
    importing its module by name on every call)."""
    schema = _response_schemas.get((api_key, version))
    if schema is None:
        schema = _response_schemas[api_key, version] = load_response_schema(api_key, version)
    return schema


# -- building entities from plain values ------------------------------------------------
_hints: dict[type, list[tuple[str, Any, Any]]] = {}


def _fields(cls: type) -> list[tuple[str, Any, Any]]:
    fields = _hints.get(cls)
    if fields is None:
        hints = typing.get_type_hints(cls)
        fields = []
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING
            if f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            fields.append((f.name, hints[f.name], default))
        _hints[cls] = fields
    return fields


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    tp, _ = _strip_optional(tp)
    origin = typing.get_origin(tp)
    if origin is tuple:
        (inner, *_rest) = typing.get_args(tp)
        return tuple(_convert(inner, v) for v in value)
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp):
            return value if isinstance(value, tp) else build(tp, **value)
        if issubclass(tp, ErrorCode):
            return value if isinstance(value, ErrorCode) else ErrorCode(value)
        if issubclass(tp, datetime.timedelta):
            return value if isinstance(value, datetime.timedelta) else datetime.timedelta(milliseconds=value)
        if issubclass(tp, datetime.datetime):
            if isinstance(value, datetime.datetime):
                return value
            return _EPOCH + datetime.timedelta(milliseconds=value)
        if tp is uuid.UUID and not isinstance(value, uuid.UUID):
            return uuid.UUID(str(value))
    return value


def _zero(tp: Any) -> Any:
    tp, optional = _strip_optional(tp)
    if optional:
        return None
    if typing.get_origin(tp) is tuple:
        return ()
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp):
            return build(tp)
        if issubclass(tp, ErrorCode):
            return ErrorCode.none
        if issubclass(tp, datetime.timedelta):
            return datetime.timedelta(0)
        if issubclass(tp, datetime.datetime):
            return _EPOCH
        if tp is uuid.UUID:
            return _ZERO_UUID
        if issubclass(tp, bool):
            return False
        if issubclass(tp, str):
            return ""
        if issubclass(tp, bytes):
            return b""
        if issubclass(tp, (int, float)):
            return tp(0)
    return None


def build(cls: type, **values: Any) -> Any:
    """An instance of kio entity ``cls`` from plain values; missing fields take their
    schema default or a zero value, values for fields ``cls`` lacks are ignored."""
    kwargs = {}
    for name, tp, default in _fields(cls):
        if name in values:
            kwargs[name] = _convert(tp, values[name])
        elif default is not dataclasses.MISSING:
            kwargs[name] = default
        else:
            kwargs[name] = _zero(tp)
    return cls(**kwargs)
