"""The client exception tree: every error a producer, consumer or connection raises.

::

    LuxunClientError                  base; ``retriable`` says if trying again can help
    ├── ClientClosedError             you closed this producer/consumer/connection
    ├── BrokerUnavailableError        cannot reach the broker, or it went away (retriable;
    │                                 also a ConnectionError)
    ├── BufferFullError               the producer's buffer stayed full (retriable)
    ├── MessageDroppedError           a message was dropped (rate limit, broker down, close);
    │                                 ``reason`` says why; it is counted in the metrics
    ├── ConsumerTimeoutError          no message within consumer_timeout_ms (retriable;
    │                                 also a TimeoutError)
    ├── PackError                     a corrupt message pack (also a ValueError)
    └── BrokerError                   the broker answered with an ``ErrorCode``; ``code``
        │                             keeps it (unknown codes stay plain BrokerErrors)
        ├── InternalBrokerError       INTERNAL_ERROR (e.g. the broker's disk is full)
        ├── TopicNotExistError        TOPIC_NOT_EXIST
        ├── IndexOutOfBoundsError     INDEX_OUT_OF_BOUNDS
        ├── InvalidTopicError         INVALID_TOPIC
        ├── TopicIsEmptyError         TOPIC_IS_EMPTY
        ├── AuthenticationError       AUTHENTICATION_FAILURE
        ├── MessageSizeTooLargeError  MESSAGE_SIZE_TOO_LARGE
        └── AllMessagesConsumedError  ALL_MESSAGE_CONSUMED (retriable: TRY_LATER)

Where they come from: Thrift and socket errors, and failed ``Result`` structs, are
translated in one place, :class:`clients.connection.BrokerConnection` (``call`` and
``checked``, with :func:`broker_error`); message packs raise :class:`PackError`
(:mod:`clients.pack`). Nothing else from thriftpy2 or the socket layer reaches callers.

The error codes and their names are not typed in here: :data:`BROKER_ERRORS` is built
from the IDL's ``ErrorCode`` enum (``idl.ERROR_CODE_NAMES``), each class naming the code
it stands for. Unknown error codes from a newer broker become a plain
:class:`BrokerError` that keeps the code; they never crash the client. ``retriable``
of a BrokerError is True exactly when the broker said ``TRY_LATER``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final

from idl import ERROR_CODE_NAMES
from idl import luxun_thrift as _T


class LuxunClientError(Exception):
    """Base class of every error raised by luxun clients."""

    retriable = False


class ClientClosedError(LuxunClientError):
    """The producer or consumer was closed by its owner."""


class BrokerUnavailableError(LuxunClientError, ConnectionError):
    """The broker cannot be reached or closed the connection."""

    retriable = True


class BufferFullError(LuxunClientError):
    """The producer's buffer stayed full for longer than allowed."""

    retriable = True


class MessageDroppedError(LuxunClientError):
    """A message was not delivered; ``reason`` is one of the metrics' drop reasons."""

    def __init__(self, topic: str, reason: str, detail: str = "") -> None:
        super().__init__(f"message for topic {topic!r} dropped ({reason}){': ' + detail if detail else ''}")
        self.topic = topic
        self.reason = reason


class ConsumerTimeoutError(LuxunClientError, TimeoutError):
    """No message arrived within the consumer timeout."""

    retriable = True


class PackError(LuxunClientError, ValueError):
    """An item is not a valid message pack (bad magic, bad crc32, unknown codec, corrupt
    or truncated payload), or a codec cannot be used (snappy not installed)."""


class BrokerError(LuxunClientError):
    """The broker answered with ``Result.errorCode`` (``code``; ``broker_message`` is its text)."""

    #: The name of the IDL ``ErrorCode`` a subclass stands for (None: any code).
    error_name: ClassVar[str | None] = None

    def __init__(self, code: int, message: str, *, retriable: bool = False, response: Any = None) -> None:
        super().__init__(f"{ERROR_CODE_NAMES.get(code, f'error code {code}')}: {message}")
        self.code = code
        self.broker_message = message
        self.retriable = retriable
        #: The whole reply the Result came in (None when not known): its other fields
        #: (e.g. ``ConsumeResponse.heldBy``) tell a client what to do, never the text.
        self.response = response


class InternalBrokerError(BrokerError):
    """INTERNAL_ERROR (e.g. the broker's disk is full)."""

    error_name = "INTERNAL_ERROR"


class TopicNotExistError(BrokerError):
    """TOPIC_NOT_EXIST."""

    error_name = "TOPIC_NOT_EXIST"


class IndexOutOfBoundsError(BrokerError):
    """INDEX_OUT_OF_BOUNDS: outside [tail, head) of the topic."""

    error_name = "INDEX_OUT_OF_BOUNDS"


class InvalidTopicError(BrokerError):
    """INVALID_TOPIC: a bad topic or group name."""

    error_name = "INVALID_TOPIC"


class TopicIsEmptyError(BrokerError):
    """TOPIC_IS_EMPTY."""

    error_name = "TOPIC_IS_EMPTY"


class AuthenticationError(BrokerError):
    """AUTHENTICATION_FAILURE: wrong deleteTopic password."""

    error_name = "AUTHENTICATION_FAILURE"


class MessageSizeTooLargeError(BrokerError):
    """MESSAGE_SIZE_TOO_LARGE: the pack is over the broker's max.message.size."""

    error_name = "MESSAGE_SIZE_TOO_LARGE"


class AllMessagesConsumedError(BrokerError):
    """ALL_MESSAGE_CONSUMED: nothing new yet (TRY_LATER)."""

    error_name = "ALL_MESSAGE_CONSUMED"


#: ``ErrorCode`` value -> the exception class for it, built from the IDL's enum.
BROKER_ERRORS: Final[Mapping[int, type[BrokerError]]] = {
    getattr(_T.ErrorCode, cls.error_name): cls
    for cls in (
        InternalBrokerError,
        TopicNotExistError,
        IndexOutOfBoundsError,
        InvalidTopicError,
        TopicIsEmptyError,
        AuthenticationError,
        MessageSizeTooLargeError,
        AllMessagesConsumedError,
    )
    if cls.error_name is not None
}

#: ``ResultCode.TRY_LATER``: a failed Result that may succeed when tried again.
RESULT_TRY_LATER: Final[int] = _T.ResultCode.TRY_LATER


def broker_error(result_code: int, error_code: int | None, message: str | None, response: Any = None) -> BrokerError:
    """The exception for a failed ``Result`` (unknown codes are kept as BrokerError);
    ``response``: the reply it came in."""
    code = -1 if error_code is None else error_code
    cls = BROKER_ERRORS.get(code, BrokerError)
    return cls(code, message or "", retriable=result_code == RESULT_TRY_LATER, response=response)


__all__ = [
    "BROKER_ERRORS",
    "RESULT_TRY_LATER",
    "AllMessagesConsumedError",
    "AuthenticationError",
    "BrokerError",
    "BrokerUnavailableError",
    "BufferFullError",
    "ClientClosedError",
    "ConsumerTimeoutError",
    "IndexOutOfBoundsError",
    "InternalBrokerError",
    "InvalidTopicError",
    "LuxunClientError",
    "MessageDroppedError",
    "MessageSizeTooLargeError",
    "PackError",
    "TopicIsEmptyError",
    "TopicNotExistError",
    "broker_error",
]
