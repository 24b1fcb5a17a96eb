"""One Thrift connection to one broker, with lazy connect and error translation.

Thrift and socket errors become :class:`BrokerUnavailableError` (keeping the cause);
a failed ``Result`` becomes the matching :class:`BrokerError`. After a transport error
the connection is dropped and the next call reconnects.

Thread-safety: not thread-safe; give each thread its own connection.
"""

from __future__ import annotations

import contextlib
from typing import Any

from thriftpy2.protocol import TCyBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TCyFramedTransportFactory, TTransportException

from idl import QueueService
from idl import luxun_thrift as T

from .errors import BrokerUnavailableError, ClientClosedError, broker_error

DEFAULT_PORT = 9092


def parse_broker(address: str) -> tuple[str, int]:
    """``host:port``, ``id:host:port`` (Luxun's broker.list form) or ``host`` -> (host, port)."""
    parts = address.strip().split(":")
    if len(parts) == 3:
        parts = parts[1:]
    if len(parts) == 1:
        return parts[0] or "127.0.0.1", DEFAULT_PORT
    if len(parts) != 2 or not parts[1].isdigit():
        raise ValueError(f"broker address {address!r} is not host:port or id:host:port")
    return parts[0] or "127.0.0.1", int(parts[1])


def parse_broker_list(brokers: str | list[str] | tuple[str, ...]) -> list[str]:
    """A comma-separated list or a sequence of broker addresses -> ["host:port", ...]."""
    items = brokers.split(",") if isinstance(brokers, str) else list(brokers)
    out = [f"{h}:{p}" for h, p in (parse_broker(b) for b in items if b.strip())]
    if not out:
        raise ValueError("no broker given")
    return out


class BrokerConnection:
    """A QueueService client for one broker ("host:port")."""

    def __init__(self, address: str, *, timeout_ms: int | None = 30_000) -> None:
        self.address = address
        self.host, self.port = parse_broker(address)
        self.timeout_ms = timeout_ms
        self._client: Any = None
        self._closed = False

    def _connect(self) -> Any:
        if self._closed:
            raise ClientClosedError(f"connection to {self.address} was closed")
        if self._client is None:
            try:
                client = make_client(
                    QueueService,
                    self.host,
                    self.port,
                    proto_factory=TCyBinaryProtocolFactory(),
                    trans_factory=TCyFramedTransportFactory(),
                    timeout=self.timeout_ms,  # type: ignore[arg-type]
                )
            except (TTransportException, OSError) as exc:
                raise BrokerUnavailableError(f"cannot connect to broker {self.address}: {exc}") from exc
            self._client = client  # thriftpy2's TSocket sets TCP_NODELAY itself
        return self._client

    def call(self, method: str, request: Any) -> Any:
        """Call ``method`` with ``request``; return the response (None for oneway)."""
        client = self._connect()
        try:
            return getattr(client, method)(request)
        except (TTransportException, OSError, TApplicationException, EOFError) as exc:
            self._drop()
            raise BrokerUnavailableError(f"broker {self.address} failed during {method}: {exc}") from exc

    def checked(self, method: str, request: Any) -> Any:
        """Like :meth:`call`, raising the BrokerError of a failed Result."""
        response = self.call(method, request)
        result = response.result
        if result.resultCode != T.ResultCode.SUCCESS:
            raise broker_error(result.resultCode, result.errorCode, result.errorMessage)
        return response

    def _drop(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    def close(self) -> None:
        """Close the connection; closing twice is fine."""
        self._closed = True
        self._drop()

    def __enter__(self) -> BrokerConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
