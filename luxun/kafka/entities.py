"""Building kio entities of any version from plain values.

kio has one frozen dataclass per API, version and nesting level, and the fields differ
between versions (``throttle_time`` from v1, ``group_instance_id`` from v5, ...). The
handlers here write one superset of values for every version of a response and
:func:`build` keeps what the version's class has:

* keys the class does not have are dropped;
* fields the class has but the values lack take their default, or when they have none a
  zero value of their type (``""``, ``b""``, ``0``, ``()``, ``None`` where nullable);
* ``None`` for a field that is not nullable in this version becomes that zero value
  (``protocol_name`` is nullable from JoinGroup v7 only);
* nested entities may be given as mappings, error codes as ints and durations as
  milliseconds.

Thread-safety: the per-class field tables are cached in a dict (idempotent writes).
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

__all__ = ["build", "field"]

_E = TypeVar("_E")

# class -> ((name, has default, converter), ...)
_Fields = tuple[tuple[str, bool, Any], ...]
_tables: dict[type, _Fields] = {}


def build(cls: type[_E], values: Mapping[str, Any]) -> _E:
    """An instance of kio entity ``cls`` from ``values`` (see the module docstring)."""
    table = _tables.get(cls)
    if table is None:
        table = _tables[cls] = _table(cls)
    kwargs: dict[str, Any] = {}
    for name, has_default, convert in table:
        if name in values:
            kwargs[name] = convert(values[name])
        elif not has_default:
            kwargs[name] = convert(None)
    return cls(**kwargs)


def field(entity: object, name: str, default: Any = None) -> Any:
    """``entity.name``, or ``default`` when this version of the entity has no such field."""
    return getattr(entity, name, default)


def _table(cls: type) -> _Fields:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        out.append((f.name, has_default, _converter(hints[f.name])))
    return tuple(out)


def _converter(tp: Any) -> Any:
    """A function from a plain value (or None) to a value of type ``tp``."""
    args = typing.get_args(tp)
    nullable = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args
    base = next(a for a in args if a is not type(None)) if nullable else tp
    origin = typing.get_origin(base)
    inner: Callable[[Any], Any]
    if origin is tuple:
        element: Any = typing.get_args(base)[0]
        nested: Any = element if dataclasses.is_dataclass(element) else None
        if nested is not None:

            def convert_each(v: Any) -> Any:
                return tuple(build(nested, x) if isinstance(x, Mapping) else x for x in v)

            inner = convert_each
        else:
            inner = tuple
        zero: Any = ()
    elif isinstance(base, type) and dataclasses.is_dataclass(base):
        entity: type = base

        def convert_entity(v: Any) -> Any:
            return build(entity, v) if isinstance(v, Mapping) else v

        inner, zero = convert_entity, {}
    elif base is ErrorCode:
        inner, zero = ErrorCode, ErrorCode.none
    elif isinstance(base, type) and issubclass(base, datetime.timedelta):
        inner, zero = _timedelta, datetime.timedelta(0)
    elif isinstance(base, type) and issubclass(base, bool):
        inner, zero = bool, False
    elif isinstance(base, type) and issubclass(base, int):
        inner, zero = _identity, 0
    elif isinstance(base, type) and issubclass(base, bytes):
        inner, zero = _identity, b""
    elif isinstance(base, type) and issubclass(base, str):
        inner, zero = _identity, ""
    else:
        inner, zero = _identity, None

    def convert(v: Any) -> Any:
        if v is None:
            if nullable:
                return None
            v = zero
        return inner(v)

    return convert


def _identity(v: Any) -> Any:
    return v


def _timedelta(v: Any) -> Any:
    """A duration: a timedelta as it is, a number as milliseconds."""
    return v if isinstance(v, datetime.timedelta) else datetime.timedelta(milliseconds=v)
