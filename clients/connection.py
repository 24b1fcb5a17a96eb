"""One Thrift connection to one broker, with lazy connect, timeouts and error translation.

Thrift and socket errors become :class:`BrokerUnavailableError` (keeping the cause)
with a one-line message naming the broker's host:port and what happened: connection
refused, no answer within the timeout, connection reset or closed during a call (a
luxun metrics port given instead of the QueueService port closes it at once), an
unknown method. A failed
``Result`` becomes the matching :class:`BrokerError`. After a transport error the
connection is dropped and the next call reconnects.

Timeouts: ``connect_timeout_ms`` bounds establishing the TCP connection,
``timeout_ms`` every later read and write of a call (None: no limit, e.g. for long
polls that set their own bound).

Thread-safety: not thread-safe; give each thread its own connection.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Sequence
from typing import Any

from thriftpy2.protocol import TCyBinaryProtocolFactory
from thriftpy2.thrift import TApplicationException, TClient
from thriftpy2.transport import TCyFramedTransportFactory, TSocket, TTransportException

from idl import QueueService
from idl import luxun_thrift as T
from idl.calls import ARGS_ITEM, ASYNC_PRODUCE_NAME, CALL, ONEWAY, PRODUCE_NAME, TOPIC_FIELD

from .errors import BrokerUnavailableError, ClientClosedError, broker_error

DEFAULT_PORT = 9092
#: What a call on a broken, closed or silent connection raises (thriftpy2 and socket errors).
CALL_ERRORS = (TTransportException, OSError, TApplicationException, EOFError)
# A framed produce (or oneway asyncProduce) call (idl.calls): frame length, message type,
# the name, seqid, the item's field headers and length; after the item, the topic's field.
_CALL_HEADS = {  # oneway -> (the head's layout, message type, name with its length)
    oneway: (struct.Struct(f">ii{len(name)}si{len(ARGS_ITEM)}si"), kind, name)
    for oneway, kind, name in ((False, CALL, PRODUCE_NAME), (True, ONEWAY, ASYNC_PRODUCE_NAME))
}
_I32 = struct.Struct(">i")
#: Defaults for tools (the ``luxun`` CLI): establishing a connection, then each call.
DEFAULT_CONNECT_TIMEOUT_MS = 5_000
DEFAULT_CALL_TIMEOUT_MS = 30_000


def parse_broker(address: str) -> tuple[str, int]:
    """``host:port``, ``id:host:port`` (Luxun's broker.list form) or ``host`` -> (host, port)."""
    parts = address.strip().split(":")
    if len(parts) == 3:
        parts = parts[1:]
    if len(parts) == 1:
        return parts[0] or "127.0.0.1", DEFAULT_PORT
    if len(parts) != 2 or not parts[1].isdigit() or not 0 < int(parts[1]) <= 65535:
        raise ValueError(f"broker address {address!r} is not host:port or id:host:port (port 1-65535)")
    return parts[0] or "127.0.0.1", int(parts[1])


def parse_broker_list(brokers: str | list[str] | tuple[str, ...]) -> list[str]:
    """A comma-separated list or a sequence of broker addresses -> ["host:port", ...]."""
    items = brokers.split(",") if isinstance(brokers, str) else list(brokers)
    out = [f"{h}:{p}" for h, p in (parse_broker(b) for b in items if b.strip())]
    if not out:
        raise ValueError("no broker given")
    return out


class BrokerConnection:
    """A QueueService client for one broker ("host:port").

    Args:
        address: ``host:port``, ``id:host:port`` or ``host`` (port 9092).
        timeout_ms: bound on each read/write of a call; None: no limit.
        connect_timeout_ms: bound on establishing the connection; None: ``timeout_ms``.

    Raises:
        ValueError: a malformed address.
    """

    def __init__(self, address: str, *, timeout_ms: int | None = 30_000, connect_timeout_ms: int | None = None) -> None:
        self.address = address
        self.host, self.port = parse_broker(address)
        self.timeout_ms = timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self._client: Any = None
        self._closed = False
        self._answered = False  # a call got its answer: the address is a broker's

    @property
    def where(self) -> str:
        """``host:port`` as connected to (named in every error message)."""
        return f"{self.host}:{self.port}"

    def _connect(self) -> Any:
        if self._closed:
            raise ClientClosedError(f"connection to {self.address} was closed")
        if self._client is None:
            try:
                sock = TSocket(  # type: ignore[no-untyped-call]
                    self.host,
                    self.port,
                    socket_timeout=self.timeout_ms,  # None: no limit
                    connect_timeout=self.connect_timeout_ms,
                )
                transport = TCyFramedTransportFactory().get_transport(sock)
                transport.open()
                protocol = TCyBinaryProtocolFactory().get_protocol(transport)  # type: ignore[no-untyped-call]
                client = TClient(QueueService, protocol)
            except (TTransportException, OSError) as exc:
                cause = exc.__context__ if isinstance(exc, TTransportException) and exc.__context__ else exc
                raise BrokerUnavailableError(f"cannot connect to broker {self.where}: {self._reason(cause)}") from cause
            self._client = client  # thriftpy2's TSocket sets TCP_NODELAY itself
        return self._client

    def _reason(self, exc: BaseException, method: str | None = None) -> str:
        """What happened, in words, for a connect (``method`` None) or a call."""
        if isinstance(exc, TimeoutError | socket.timeout):
            ms = self.timeout_ms if method else (self.connect_timeout_ms or self.timeout_ms)
            within = f" within {ms / 1000:.1f} s" if ms else ""
            if method is None:
                return f"no answer{within}"
            return f"no answer to {method}{within}{self._hint()}"
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused (is a broker running there?)"
        if isinstance(exc, socket.gaierror):
            return f"unknown host ({exc.strerror or exc})"
        if isinstance(exc, ConnectionResetError | BrokenPipeError):
            return "the broker reset the connection"
        if isinstance(exc, TTransportException) and exc.type == TTransportException.END_OF_FILE:
            return f"the broker closed the connection{self._hint()}"
        if isinstance(exc, TApplicationException) and exc.type == TApplicationException.UNKNOWN_METHOD:
            return f"the broker does not know the call {method} (an older luxun, or Java Luxun)"
        if isinstance(exc, OSError) and exc.strerror:
            return exc.strerror
        return str(exc) or type(exc).__name__

    def _hint(self) -> str:
        """Ask whether the port is right, unless a call on this connection was answered."""
        return "" if self._answered else " (is it the QueueService port of a luxun broker?)"

    def call(self, method: str, request: Any) -> Any:
        """Call ``method`` with ``request``; return the response (None for oneway).

        Raises:
            BrokerUnavailableError: the broker cannot be reached, did not answer in time,
                or closed/reset the connection; the connection is dropped.
        """
        client = self._connect()
        try:
            response = getattr(client, method)(request)
        except CALL_ERRORS as exc:
            raise self._lost(exc, method) from exc
        if response is not None:
            self._answered = True
        return response

    def checked(self, method: str, request: Any) -> Any:
        """Like :meth:`call`, raising the BrokerError of a failed Result."""
        return _checked(self.call(method, request))

    def produce(
        self, item: bytes | bytearray | Sequence[bytes | bytearray], topic: str, *, oneway: bool = False
    ) -> Any:
        """``checked("produce", ...)`` of ``item`` (or of the item made of these buffers, in
        order) to ``topic`` (``oneway``: ``asyncProduce``, returning None), with the call
        framed by hand and sent from ``item`` itself: thriftpy2 would copy the item into its
        buffer, then into the frame (a 1 MB item took 4x as long). Errors as :meth:`call`
        and :meth:`checked`."""
        method = "asyncProduce" if oneway else "produce"
        parts = (item,) if isinstance(item, bytes | bytearray) else item
        client = self._connect()
        try:
            send_parts(client._oprot.trans.sock, produce_call_parts(parts, sum(map(len, parts)), topic, oneway=oneway))
            if oneway:
                return None
            response = client._recv(method)
        except CALL_ERRORS as exc:
            raise self._lost(exc, method) from exc
        self._answered = True
        return _checked(response)

    def _lost(self, exc: BaseException, method: str) -> BrokerUnavailableError:
        """Drop the connection after ``exc`` (one of CALL_ERRORS) broke ``method``: the
        error to raise, naming the broker and what happened."""
        self._drop()
        return BrokerUnavailableError(f"broker {self.where}, {method}: {self._reason(exc, method)}")

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


def _checked(response: Any) -> Any:
    """``response``, or the BrokerError of its failed Result."""
    result = response.result
    if result.resultCode != T.ResultCode.SUCCESS:
        raise broker_error(result.resultCode, result.errorCode, result.errorMessage, response)
    return response


def produce_call_parts(
    item: Sequence[bytes | bytearray], item_size: int, topic: str, *, oneway: bool = False
) -> list[bytes | bytearray]:
    """A ``produce`` call (``oneway``: ``asyncProduce``; framed, seqid 0) of the item whose
    ``item_size`` bytes are ``item``'s buffers in order, as buffers (the item's own, not
    copied): for :func:`send_parts`. The answer is read as thriftpy2's client reads any."""
    head, message_type, method = _CALL_HEADS[oneway]
    name = topic.encode()
    tail = b"".join((TOPIC_FIELD, _I32.pack(len(name)), name, b"\x00\x00"))
    size = head.size - 4 + item_size + len(tail)
    return [head.pack(size, message_type, method, 0, ARGS_ITEM, item_size), *item, tail]


def send_parts(sock: socket.socket, parts: Sequence[bytes | bytearray]) -> None:
    """Send all of ``parts`` (a few buffers: at most IOV_MAX, 1024 on Linux), in order,
    with ``sendmsg`` (again from where a partial send stopped); the socket's timeout
    bounds each wait."""
    n = sock.sendmsg(parts)
    total = sum(map(len, parts))
    if n == total:
        return
    views = [memoryview(p) for p in parts]
    try:
        while True:
            total -= n
            while n:  # drop what was sent
                k = len(views[0])
                if n >= k:
                    views.pop(0).release()
                    n -= k
                else:
                    views[0] = views[0][n:]
                    n = 0
            if not total:
                return
            n = sock.sendmsg(views)
    finally:
        for v in views:
            v.release()


def consume_request(
    topic: str,
    *,
    index: int | None = None,
    group: str | None = None,
    max_bytes: int = 0,
    wait_ms: int = 0,
    with_timestamps: bool = False,
    from_committed: bool = False,
    member_id: str | None = None,
    items_as_blob: bool = False,
) -> Any:
    """A ``ConsumeRequest`` (the one place clients build them): by ``index`` (the first
    item wanted) or by ``group`` (its position); give one of the two, except with
    ``from_committed``: the ``group``'s committed position, moving nothing (``index``,
    if given, says where to read instead), as member ``member_id``. ``max_bytes`` <= 0
    asks for one item (the broker always returns at least one if any is there);
    ``wait_ms`` > 0 long-polls that long for new items; ``with_timestamps`` asks for each
    item's append time; ``items_as_blob`` asks for the items as one buffer and their
    lengths (``itemBlob``, ``itemLengths``) instead of ``itemList`` (extensions that
    original brokers skip: they answer with ``itemList``)."""
    if from_committed:
        if group is None:
            raise ValueError("a consume request from the committed position needs the group")
    elif (index is None) == (group is None):
        raise ValueError("a consume request reads by index or by group: give exactly one")
    return T.ConsumeRequest(
        topic=topic,
        fanoutId=group,
        startIndex=index,
        maxFetchSize=max_bytes,
        maxWaitMs=wait_ms if wait_ms > 0 else None,
        withTimestamps=True if with_timestamps else None,
        fromCommitted=True if from_committed else None,
        memberId=member_id,
        itemsAsBlob=True if items_as_blob else None,
    )
