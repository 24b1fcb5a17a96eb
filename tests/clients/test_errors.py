"""The client exception tree: the error-code table comes from the IDL, unknown codes are kept."""

from __future__ import annotations

import pickle

import pytest

import idl
from clients import errors
from clients.messages import PackError
from idl import luxun_thrift as T


def test_every_idl_error_code_has_one_client_exception() -> None:
    assert set(errors.BROKER_ERRORS) == set(idl.ERROR_CODE_NAMES)
    for code, cls in errors.BROKER_ERRORS.items():
        assert cls.error_name == idl.ERROR_CODE_NAMES[code]
        assert issubclass(cls, errors.BrokerError)
    assert len(set(errors.BROKER_ERRORS.values())) == len(errors.BROKER_ERRORS)


def test_the_tables_are_the_idl_enums() -> None:
    assert dict(idl.ERROR_CODE_NAMES) == T.ErrorCode._VALUES_TO_NAMES
    assert dict(idl.RESULT_CODE_NAMES) == T.ResultCode._VALUES_TO_NAMES
    assert errors.RESULT_TRY_LATER == T.ResultCode.TRY_LATER


@pytest.mark.parametrize("name", sorted(idl.ERROR_CODE_NAMES.values()))
def test_broker_error_names_the_code(name: str) -> None:
    code = getattr(T.ErrorCode, name)
    error = errors.broker_error(T.ResultCode.FAILURE, code, "what happened")
    assert type(error) is errors.BROKER_ERRORS[code]
    assert str(error) == f"{name}: what happened"
    assert error.code == code and error.broker_message == "what happened" and not error.retriable


def test_try_later_is_retriable_and_unknown_codes_are_kept() -> None:
    consumed = errors.broker_error(T.ResultCode.TRY_LATER, T.ErrorCode.ALL_MESSAGE_CONSUMED, "later")
    assert isinstance(consumed, errors.AllMessagesConsumedError) and consumed.retriable
    unknown = errors.broker_error(T.ResultCode.FAILURE, 99, "from the future")
    assert type(unknown) is errors.BrokerError and unknown.code == 99
    assert str(unknown) == "error code 99: from the future"
    assert errors.broker_error(T.ResultCode.FAILURE, None, None).code == -1


def test_one_tree() -> None:
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type):
            assert issubclass(obj, errors.LuxunClientError), name
    assert PackError is errors.PackError and issubclass(PackError, ValueError)
    assert issubclass(errors.BrokerUnavailableError, ConnectionError)
    assert issubclass(errors.ConsumerTimeoutError, TimeoutError)
    error = pickle.loads(pickle.dumps(errors.PackError("bad pack")))
    assert type(error) is errors.PackError and str(error) == "bad pack"
