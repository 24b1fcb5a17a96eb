"""The broker's exception tree, mapped to the IDL's ``ErrorCode``.

::

    LuxunError                 base; error_code, result_code, retriable
    ├── TopicNotExist          TOPIC_NOT_EXIST         FAILURE    unknown topic
    ├── IndexOutOfBounds       INDEX_OUT_OF_BOUNDS     FAILURE    index outside [tail, head)
    ├── InvalidTopic           INVALID_TOPIC           FAILURE    bad topic (or group) name
    ├── TopicIsEmpty           TOPIC_IS_EMPTY          FAILURE    topic without items
    ├── AuthenticationFailure  AUTHENTICATION_FAILURE  FAILURE    wrong (or no) deleteTopic password
    ├── MessageSizeTooLarge    MESSAGE_SIZE_TOO_LARGE  FAILURE    item over max.message.size
    ├── AllMessageConsumed     ALL_MESSAGE_CONSUMED    TRY_LATER  nothing new yet (retriable)
    └── InternalError          INTERNAL_ERROR          FAILURE    anything else (disk full, bug...)
        ├── ConfigError        INTERNAL_ERROR          FAILURE    bad configuration (also a ValueError)
        └── DataDirLockedError INTERNAL_ERROR          FAILURE    another broker holds the data directory
                                                                  (at start-up; also a RuntimeError)

``error_code`` and ``result_code`` are the ints of the IDL enums (``idl.luxun_thrift``),
so a handler answers ``Result(resultCode=e.result_code, errorCode=e.error_code,
errorMessage=str(e))`` -- or simply ``e.to_result()``. ``retriable`` is True when
the same call can succeed later (exactly the ``TRY_LATER`` errors). Messages name the
topic, index and limits involved, never payloads or passwords.

:func:`error_for_code` goes the other way (an ``ErrorCode`` from the wire to an
exception) and keeps unknown codes instead of failing on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from idl import luxun_thrift as _T

_E = _T.ErrorCode
_R = _T.ResultCode


def _restore(cls: type[LuxunError], args: tuple[Any, ...], state: dict[str, Any]) -> LuxunError:
    """Unpickle an error without calling its (keyword-rich) ``__init__``."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class LuxunError(Exception):
    """Base class of every error the broker reports to clients.

    Attributes:
        error_code: the IDL ``ErrorCode`` value (int).
        result_code: the IDL ``ResultCode`` value sent with it (int).
        retriable: True when trying the same call later can succeed.
    """

    error_code: int = _E.INTERNAL_ERROR
    result_code: int = _R.FAILURE
    retriable: bool = False

    def __init__(self, message: str, *, error_code: int | None = None) -> None:
        super().__init__(message)
        if error_code is not None:
            # Only used for codes this version does not know (see error_for_code).
            self.error_code = error_code

    @property
    def message(self) -> str:
        """The human-readable message (what goes into ``Result.errorMessage``)."""
        return str(self.args[0]) if self.args else ""

    def to_result(self) -> Any:
        """This error as an IDL ``Result`` struct."""
        return _T.Result(resultCode=self.result_code, errorCode=self.error_code, errorMessage=self.message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args, dict(self.__dict__)))


class _TopicStateError(LuxunError):
    """A topic's state refuses the call, in Java Luxun's words: "topic T <state>[ on
    broker N]"."""

    state = ""

    def __init__(self, topic: str, *, broker_id: int | None = None) -> None:
        where = "" if broker_id is None else f" on broker {broker_id}"
        super().__init__(f"topic {topic} {self.state}{where}")  # Java Luxun's text
        self.topic = topic
        self.broker_id = broker_id


class TopicNotExist(_TopicStateError):
    """The topic does not exist (consume, findClosestIndexByTime, getSize)."""

    error_code = _E.TOPIC_NOT_EXIST
    state = "does not exist"


class IndexOutOfBounds(LuxunError):
    """An index outside the readable range ``[tail, head)`` of a topic."""

    error_code = _E.INDEX_OUT_OF_BOUNDS

    def __init__(self, topic: str, index: int, tail: int, head: int) -> None:
        super().__init__(f"index {index} of topic {topic!r} is outside the readable range [{tail}, {head})")
        self.topic = topic
        self.index = index
        self.tail = tail
        self.head = head


class InvalidTopic(LuxunError):
    """A topic (or fanout group) name that breaks the naming rules."""

    error_code = _E.INVALID_TOPIC

    def __init__(self, topic: object, reason: str, *, what: str = "topic") -> None:
        super().__init__(f"invalid {what} name {topic!r}: {reason}")
        self.topic = topic
        self.reason = reason


class TopicIsEmpty(_TopicStateError):
    """The topic exists but holds no items."""

    error_code = _E.TOPIC_IS_EMPTY
    state = "is empty"


class AuthenticationFailure(LuxunError):
    """deleteTopic with a wrong password, or on a broker with no password configured."""

    error_code = _E.AUTHENTICATION_FAILURE

    def __init__(self, topic: str, reason: str = "wrong password") -> None:
        super().__init__(f"cannot delete topic {topic!r}: {reason}")
        self.topic = topic
        self.reason = reason


class MessageSizeTooLarge(LuxunError):
    """An item larger than ``max.message.size`` (or than a data page)."""

    error_code = _E.MESSAGE_SIZE_TOO_LARGE

    def __init__(self, topic: str, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"item of {size_bytes} bytes for topic {topic!r} is larger than the limit of {limit_bytes} bytes"
        )
        self.topic = topic
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class AllMessageConsumed(LuxunError):
    """Nothing to return yet: the group (or index) is at the end of the topic. Try later."""

    error_code = _E.ALL_MESSAGE_CONSUMED
    result_code = _R.TRY_LATER
    retriable = True

    def __init__(self, topic: str, *, fanout_id: str | None = None, index: int | None = None) -> None:
        if fanout_id:
            who = f" by group {fanout_id!r}"
        elif index is not None:
            who = f" up to index {index}"
        else:
            who = ""
        super().__init__(f"all items of topic {topic!r} have been consumed{who}; try later")
        self.topic = topic
        self.fanout_id = fanout_id
        self.index = index


class InternalError(LuxunError):
    """Anything else: an I/O error, a full disk, a bug. The message says what."""

    error_code = _E.INTERNAL_ERROR


class ConfigError(InternalError, ValueError):
    """A configuration problem: an unknown key, a bad value, a malformed password.

    Raised at start-up by :mod:`luxun.config`. If one surfaces during a call it is
    reported as ``INTERNAL_ERROR``.

    Attributes:
        key: the configuration key (or field) involved, when there is one.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class DataDirLockedError(InternalError, RuntimeError):
    """Another broker process holds the data directory's lock (raised at start-up by
    :class:`luxun.topics.Topics`, which re-exports it)."""


#: The exception class for each known ``ErrorCode``.
ERROR_CLASSES: Mapping[int, type[LuxunError]] = {
    cls.error_code: cls
    for cls in (
        InternalError,
        TopicNotExist,
        IndexOutOfBounds,
        InvalidTopic,
        TopicIsEmpty,
        AuthenticationFailure,
        MessageSizeTooLarge,
        AllMessageConsumed,
    )
}


def error_for_code(error_code: int, message: str) -> LuxunError:
    """The exception for an ``ErrorCode`` received on the wire, carrying ``message``.

    Unknown codes (from a newer broker) give a plain :class:`LuxunError` that keeps
    the code; they never raise.
    """
    cls = ERROR_CLASSES.get(error_code)
    if cls is None:
        return LuxunError(f"error code {error_code}: {message}", error_code=error_code)
    error = cls.__new__(cls)
    LuxunError.__init__(error, message)
    return error


__all__ = [
    "ERROR_CLASSES",
    "AllMessageConsumed",
    "AuthenticationFailure",
    "ConfigError",
    "DataDirLockedError",
    "IndexOutOfBounds",
    "InternalError",
    "InvalidTopic",
    "LuxunError",
    "MessageSizeTooLarge",
    "TopicIsEmpty",
    "TopicNotExist",
    "error_for_code",
]
