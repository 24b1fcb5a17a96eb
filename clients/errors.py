"""The client exception tree.

::

    LuxunClientError                  base; ``retriable`` says if trying again can help
    ├── ClientClosedError             you closed this producer/consumer
    ├── BrokerUnavailableError        cannot reach the broker, or it went away (retriable)
    ├── BufferFullError               the producer's buffer stayed full (retriable)
    ├── MessageDroppedError           a message was dropped (rate limit, broker down, close);
    │                                 ``reason`` says why; it is counted in the metrics
    ├── ConsumerTimeoutError          no message within consumer_timeout_ms (retriable)
    ├── PackError                     a corrupt message pack (clients.messages; also a ValueError)
    └── BrokerError                   the broker answered with an error code
        ├── TopicNotExistError, TopicIsEmptyError, IndexOutOfBoundsError, InvalidTopicError,
        ├── AuthenticationError, MessageSizeTooLargeError, InternalBrokerError
        └── AllMessagesConsumedError  (retriable: TRY_LATER)

Unknown error codes from a newer broker become a plain :class:`BrokerError` that keeps
the code; they never crash the client.
"""

from __future__ import annotations


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


class BrokerError(LuxunClientError):
    """The broker answered with ``Result.errorCode``."""

    def __init__(self, code: int, message: str, *, retriable: bool = False) -> None:
        super().__init__(f"{_NAMES.get(code, f'error code {code}')}: {message}")
        self.code = code
        self.broker_message = message
        self.retriable = retriable


class InternalBrokerError(BrokerError):
    """INTERNAL_ERROR (e.g. the broker's disk is full)."""


class TopicNotExistError(BrokerError):
    """TOPIC_NOT_EXIST."""


class IndexOutOfBoundsError(BrokerError):
    """INDEX_OUT_OF_BOUNDS: outside [tail, head) of the topic."""


class InvalidTopicError(BrokerError):
    """INVALID_TOPIC: a bad topic or group name."""


class TopicIsEmptyError(BrokerError):
    """TOPIC_IS_EMPTY."""


class AuthenticationError(BrokerError):
    """AUTHENTICATION_FAILURE: wrong deleteTopic password."""


class MessageSizeTooLargeError(BrokerError):
    """MESSAGE_SIZE_TOO_LARGE: the pack is over the broker's max.message.size."""


class AllMessagesConsumedError(BrokerError):
    """ALL_MESSAGE_CONSUMED: nothing new yet (TRY_LATER)."""


_BY_CODE: dict[int, type[BrokerError]] = {
    0: InternalBrokerError,
    1: TopicNotExistError,
    2: IndexOutOfBoundsError,
    3: InvalidTopicError,
    4: TopicIsEmptyError,
    5: AuthenticationError,
    6: MessageSizeTooLargeError,
    7: AllMessagesConsumedError,
}
_NAMES = {
    0: "INTERNAL_ERROR",
    1: "TOPIC_NOT_EXIST",
    2: "INDEX_OUT_OF_BOUNDS",
    3: "INVALID_TOPIC",
    4: "TOPIC_IS_EMPTY",
    5: "AUTHENTICATION_FAILURE",
    6: "MESSAGE_SIZE_TOO_LARGE",
    7: "ALL_MESSAGE_CONSUMED",
}

RESULT_TRY_LATER = 2


def broker_error(result_code: int, error_code: int | None, message: str | None) -> BrokerError:
    """The exception for a failed ``Result`` (unknown codes are kept as BrokerError)."""
    code = -1 if error_code is None else error_code
    cls = _BY_CODE.get(code, BrokerError)
    return cls(code, message or "", retriable=result_code == RESULT_TRY_LATER)
