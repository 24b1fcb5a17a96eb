"""ACLs of the Kafka port and the authorizer that enforces them, as Kafka's StandardAuthorizer.

With SASL on (:mod:`luxun.kafka.sasl`), every request of a logged-in user is checked
here: :meth:`Authorizer.authorize` answers whether ``User:<name>`` from its host may do
an operation on a resource. Kafka's rules (KIP-140 ACLs, KIP-290 prefixed patterns):

* a binding names a resource pattern (type TOPIC, GROUP, CLUSTER or TRANSACTIONAL_ID;
  a name; LITERAL, where ``*`` matches every name, or PREFIXED), a principal
  (``User:NAME`` or ``User:*``), a host (an address or ``*``), an operation and ALLOW
  or DENY;
* a DENY that matches wins over every ALLOW; an ALLOW of READ, WRITE, DELETE or ALTER
  also allows DESCRIBE, one of ALTER_CONFIGS also DESCRIBE_CONFIGS, one of ALL every
  operation (a DENY denies only its operation, or all for ALL);
* users with the ``admin`` role in the users file are the super users: always allowed;
* a resource no binding matches at all (whatever principal or operation) is allowed to
  everyone only with ``allow.everyone.if.no.acl.found=true`` (Kafka's key; default false).

With SASL off there is no authorizer (the handlers never call one: nothing is checked,
as a Kafka broker without ``authorizer.class.name``).

The bindings live in ``<data dir>/.luxun-kafka-acls.json`` (:data:`ACL_FILE`): UTF-8,
one JSON object a line (``{"resource_type": "TOPIC", "name": "orders", "pattern":
"LITERAL", "principal": "User:bob", "host": "*", "operation": "READ", "permission":
"ALLOW"}``), read at start (a bad file stops the broker with a line naming it),
rewritten whole on every change: a temporary file in the same directory, fsynced, then
renamed over it, so a crash leaves the old file or the new one. Every writer (the
CreateAcls/DeleteAcls APIs, ``luxun kafka-acl``) holds an ``flock`` on
``<file>.lock`` (:mod:`.textfile`) while it reads, changes and writes the file, so two writers never lose
one another's change: the file is the truth. The broker looks at the file's
modification time, size and inode at most once a second, from the checks themselves,
and reads it again when they change (a bad change is logged once and the previous
bindings stay). At most :data:`MAX_ACLS` bindings (CreateAcls beyond it fails).

Cost: each session (one connection) keeps its decisions in a dict keyed by
``(operation, resource type, name)``, emptied when the bindings change (a generation
number); a decision is one dict lookup plus a clock read. The per-session dict holds at
most :data:`MAX_CACHED_DECISIONS` entries.

Thread-safety: an :class:`Authorizer` is shared by every connection; the bindings are
replaced whole (never changed in place) under a lock, readers take the current ones.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol

from ..errors import ConfigError
from .textfile import replace_text, writers_lock

__all__ = [
    "ACL_FILE",
    "ALL_OPERATIONS",
    "CLUSTER_NAME",
    "MAX_ACLS",
    "NO_AUTHORIZED_OPERATIONS",
    "Acl",
    "AclFilter",
    "Authorizer",
    "Operation",
    "PatternType",
    "Permission",
    "ResourceType",
    "allows",
    "edit_acl_file",
    "parse_acls",
    "read_acl_file",
    "supported_operations",
]

log = logging.getLogger(__name__)

#: The bindings' file in the data directory.
ACL_FILE: Final = ".luxun-kafka-acls.json"
#: Most bindings kept (CreateAcls beyond answers INVALID_REQUEST... see Authorizer.create).
MAX_ACLS: Final = 10_000
#: Most decisions one session remembers (then it starts again empty).
MAX_CACHED_DECISIONS: Final = 4096
#: The name of the one CLUSTER resource (Kafka's ``kafka-cluster``).
CLUSTER_NAME: Final = "kafka-cluster"
WILDCARD: Final = "*"
#: The authorized-operations field of an answer that was not asked for them (KIP-430).
NO_AUTHORIZED_OPERATIONS: Final = -(2**31)
#: How often (seconds) the checks look at the file for a change made by another writer.
_STAT_INTERVAL_S: Final = 1.0


class ResourceType(enum.IntEnum):
    """Kafka's resource types (their wire codes)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    """Kafka's resource pattern types (their wire codes)."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    """Kafka's ACL operations (their wire codes; bit ``code`` of an authorized-operations field)."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    """Kafka's ACL permission types (their wire codes)."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


_O = Operation
#: The operations each resource type has (Kafka's AclEntry.supportedOperations).
_SUPPORTED: Final[dict[ResourceType, tuple[Operation, ...]]] = {
    ResourceType.TOPIC: (_O.READ, _O.WRITE, _O.CREATE, _O.DESCRIBE, _O.DELETE, _O.ALTER, _O.DESCRIBE_CONFIGS,
                         _O.ALTER_CONFIGS),
    ResourceType.GROUP: (_O.READ, _O.DESCRIBE, _O.DELETE, _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS),
    ResourceType.CLUSTER: (_O.CREATE, _O.CLUSTER_ACTION, _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS, _O.IDEMPOTENT_WRITE,
                           _O.ALTER, _O.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (_O.DESCRIBE, _O.WRITE),
    ResourceType.DELEGATION_TOKEN: (_O.DESCRIBE,),
    ResourceType.USER: (_O.CREATE_TOKENS, _O.DESCRIBE_TOKENS),
}  # fmt: skip
#: An ALLOW of the key also allows these (Kafka's implied operations).
_IMPLIED_BY: Final[dict[Operation, frozenset[Operation]]] = {
    _O.DESCRIBE: frozenset({_O.DESCRIBE, _O.READ, _O.WRITE, _O.DELETE, _O.ALTER, _O.ALL}),
    _O.DESCRIBE_CONFIGS: frozenset({_O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS, _O.ALL}),
}


def allows(authorizer: Authorizer | None, session: Any, op: Operation, rtype: ResourceType, name: str) -> bool:
    """The one check every door-level caller makes: whether ``session`` may do ``op`` on
    the resource; always with no authorizer (SASL off, no ``authorizer.class.name``) or
    no session."""
    return session is None or authorizer is None or authorizer.authorize(session, op, rtype, name)


def supported_operations(resource_type: ResourceType) -> tuple[Operation, ...]:
    """The operations a resource of ``resource_type`` has."""
    return _SUPPORTED.get(resource_type, ())


def _bits(operations: Iterable[Operation]) -> int:
    """Kafka's 32-bit field: bit ``code`` set for each operation."""
    field = 0
    for op in operations:
        field |= 1 << int(op)
    return field


#: Every operation of each resource type, as a field (what a broker without authorizer answers).
ALL_OPERATIONS: Final = {t: _bits(ops) for t, ops in _SUPPORTED.items()}


def _enum_name(value: enum.IntEnum) -> str:
    return value.name


def _parse_enum(cls: type[enum.IntEnum], text: object, what: str) -> Any:
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a string, not {text!r}")
    try:
        return cls[text.upper()]
    except KeyError:
        raise ValueError(f"{what} {text!r} is not one of {', '.join(m.name for m in cls)}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class Acl:
    """One binding: who (principal, host) may or may not (permission) do what (operation)
    on which resources (type, name, pattern)."""

    resource_type: ResourceType
    name: str
    pattern: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    @classmethod
    def of(cls, resource_type: int, name: str, pattern: int, principal: str, host: str, operation: int,
           permission: int) -> Acl:  # fmt: skip
        """A binding from wire codes (unknown codes become UNKNOWN: :meth:`problem` says so)."""
        return cls(*_from_wire(resource_type, name, pattern, principal, host, operation, permission))

    def problem(self) -> str | None:
        """None if this binding may be stored, else why not (CreateAcls answers
        INVALID_REQUEST with it), as Kafka's AclControlManager and AclAuthorizer judge it."""
        if self.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            return f"Invalid resourceType {self.resource_type.name}"
        if self.pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
            return f"Invalid patternType {self.pattern.name}"
        if self.operation in (Operation.UNKNOWN, Operation.ANY):
            return f"Invalid operation {self.operation.name}"
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            return f"Invalid permissionType {self.permission.name}"
        if not self.name:
            return "Resource name should not be empty"
        if self.resource_type is ResourceType.CLUSTER and (
            self.name != CLUSTER_NAME or self.pattern is not PatternType.LITERAL
        ):
            return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME} (LITERAL)"
        if self.operation is not Operation.ALL and self.operation not in supported_operations(self.resource_type):
            return f"Operation {self.operation.name} is not supported by resource type {self.resource_type.name}"
        kind, colon, who = self.principal.partition(":")
        if not colon:
            return (
                f"Could not parse principal from `{self.principal}` (no colon is present separating the "
                "principal type from the principal name)"
            )
        if not kind or not who:
            return f"Could not parse principal from `{self.principal}`"
        if not self.host:
            return "Host should not be empty (use * for any host)"
        if any(not c.isprintable() for c in self.name + self.principal + self.host):
            return "Resource name, principal and host may not hold control characters"
        return None

    def to_json(self) -> str:
        """The ACL file's line of this binding."""
        return json.dumps(
            {
                "resource_type": self.resource_type.name,
                "name": self.name,
                "pattern": self.pattern.name,
                "principal": self.principal,
                "host": self.host,
                "operation": self.operation.name,
                "permission": self.permission.name,
            },
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, line: str) -> Acl:
        """The inverse of :meth:`to_json`.

        Raises:
            ValueError: why the line is not a valid binding.
        """
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        for key in ("name", "principal", "host"):
            if not isinstance(obj.get(key), str):
                raise ValueError(f"{key!r} must be a string")
        acl = cls(
            _parse_enum(ResourceType, obj.get("resource_type"), "resource_type"),
            obj["name"],
            _parse_enum(PatternType, obj.get("pattern"), "pattern"),
            obj["principal"],
            obj["host"],
            _parse_enum(Operation, obj.get("operation"), "operation"),
            _parse_enum(Permission, obj.get("permission"), "permission"),
        )
        problem = acl.problem()
        if problem is not None:
            raise ValueError(problem)
        return acl


def _from_wire(resource_type: int, name: str | None, pattern: int, principal: str | None, host: str | None,
               operation: int, permission: int) -> tuple[Any, ...]:  # fmt: skip
    """A binding's or filter's fields from wire codes (unknown codes become UNKNOWN)."""
    return (_code(ResourceType, resource_type), name, _code(PatternType, pattern), principal, host,
            _code(Operation, operation), _code(Permission, permission))  # fmt: skip


def _code(cls: type[enum.IntEnum], value: int) -> Any:
    try:
        return cls(value)
    except ValueError:
        return cls(0)


@dataclasses.dataclass(frozen=True, slots=True)
class AclFilter:
    """A DescribeAcls/DeleteAcls filter: ANY codes and None strings match everything;
    pattern MATCH matches the bindings that would apply to the name (the literal name,
    the literal ``*``, the prefixes of the name), as Kafka's ResourcePatternFilter."""

    resource_type: ResourceType
    name: str | None
    pattern: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    @classmethod
    def of(cls, resource_type: int, name: str | None, pattern: int, principal: str | None, host: str | None,
           operation: int, permission: int) -> AclFilter:  # fmt: skip
        return cls(*_from_wire(resource_type, name, pattern, principal, host, operation, permission))

    def problem(self) -> str | None:
        """None if the filter is valid, else why not (INVALID_REQUEST), as Kafka."""
        for value in (self.resource_type, self.pattern, self.operation, self.permission):
            if value == 0:
                return f"Filter contains UNKNOWN elements: {type(value).__name__} code is not one Kafka defines"
        return None

    def matches(self, acl: Acl) -> bool:
        if self.resource_type is not ResourceType.ANY and self.resource_type is not acl.resource_type:
            return False
        if not self._matches_pattern(acl):
            return False
        if self.principal is not None and self.principal != acl.principal:
            return False
        if self.host is not None and self.host != acl.host:
            return False
        if self.operation is not Operation.ANY and self.operation is not acl.operation:
            return False
        return self.permission is Permission.ANY or self.permission is acl.permission

    def _matches_pattern(self, acl: Acl) -> bool:
        if self.pattern is PatternType.ANY:
            return self.name is None or self.name == acl.name
        if self.pattern is PatternType.MATCH:
            if self.name is None:
                return True
            if acl.pattern is PatternType.LITERAL:
                return acl.name in (self.name, WILDCARD)
            return self.name.startswith(acl.name)
        return self.pattern is acl.pattern and (self.name is None or self.name == acl.name)


# -- the file ------------------------------------------------------------------------------
def parse_acls(text: str, *, source: str) -> list[Acl]:
    """The bindings of an ACL file's text (blank lines and ``#`` lines skipped).

    Raises:
        ValueError: ``"<source>, line N: why"`` for the first bad line.
    """
    acls: list[Acl] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            acls.append(Acl.from_json(stripped))
        except ValueError as exc:
            raise ValueError(f"{source}, line {number}: {exc}") from None
    return list(dict.fromkeys(acls))


def read_acl_file(path: str) -> tuple[list[Acl], tuple[int, int, int] | None]:
    """The bindings in the file at ``path`` (none if it does not exist) and its stamp
    (mtime ns, size, inode; None if missing).

    Raises:
        OSError, ValueError, UnicodeDecodeError: the file cannot be read or has a bad line.
    """
    try:
        with open(path, encoding="utf-8") as f:
            st = os.fstat(f.fileno())
            text = f.read()
    except FileNotFoundError:
        return [], None
    return parse_acls(text, source=path), (st.st_mtime_ns, st.st_size, st.st_ino)


def edit_acl_file(path: str, edit: Callable[[list[Acl]], list[Acl]]) -> list[Acl]:
    """Rewrite the ACL file with ``edit(bindings)`` under the writers' lock, crash-safely;
    the bindings written. The file is written only if ``edit`` changed them.

    Raises:
        OSError, ValueError: as :func:`read_acl_file`, or ``edit``'s own.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # a data directory no broker made yet
    with writers_lock(path):
        acls, _ = read_acl_file(path)
        out = list(dict.fromkeys(edit(list(acls))))
        if out != acls:
            replace_text(path, "".join(acl.to_json() + "\n" for acl in out))
        return out


# -- the authorizer --------------------------------------------------------------------------
class Session(Protocol):
    """What the authorizer reads of a connection (a :class:`~luxun.kafka.sasl.SaslSession`)."""

    @property
    def principal(self) -> str: ...  # "User:<name>"
    @property
    def super_user(self) -> bool: ...
    @property
    def host(self) -> str: ...

    authz: Any  # the decisions cache this module keeps there


class _Index:
    """The bindings of one generation, arranged for checks: per resource type, the
    literal ones by name and the prefixed ones in a list."""

    __slots__ = ("acls", "literal", "prefixed", "types")

    def __init__(self, acls: list[Acl]) -> None:
        self.acls = tuple(acls)
        self.literal: dict[tuple[ResourceType, str], list[Acl]] = {}
        self.prefixed: dict[ResourceType, list[Acl]] = {}
        self.types: set[ResourceType] = set()
        for acl in acls:
            self.types.add(acl.resource_type)
            if acl.pattern is PatternType.LITERAL:
                self.literal.setdefault((acl.resource_type, acl.name), []).append(acl)
            else:
                self.prefixed.setdefault(acl.resource_type, []).append(acl)

    def matching(self, resource_type: ResourceType, name: str) -> list[Acl]:
        """Every binding whose pattern covers the resource (any principal, operation)."""
        out = list(self.literal.get((resource_type, name), ()))
        if name != WILDCARD:
            out += self.literal.get((resource_type, WILDCARD), ())
        out += (a for a in self.prefixed.get(resource_type, ()) if name.startswith(a.name))
        return out


def _applies(acl: Acl, principal: str, host: str) -> bool:
    return acl.principal in (principal, "User:*") and acl.host in (host, WILDCARD)


class Authorizer:
    """The bindings of ``path`` (:data:`ACL_FILE` in the data directory) and the checks.

    Args:
        path: the ACL file (created at the first change).
        allow_everyone_if_no_acl_found: ``allow.everyone.if.no.acl.found``.
        max_acls: most bindings kept.

    Raises:
        ConfigError: the file cannot be read or has a bad line (named).
    """

    def __init__(self, path: str, *, allow_everyone_if_no_acl_found: bool = False, max_acls: int = MAX_ACLS) -> None:
        self.path = os.path.abspath(path)
        self.allow_everyone = allow_everyone_if_no_acl_found
        self.max_acls = max_acls
        try:
            acls, self._stamp = read_acl_file(self.path)
        except OSError as exc:
            raise ConfigError(f"cannot read the Kafka ACL file {self.path}: {exc.strerror or exc}") from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"the Kafka ACL file: {exc}") from exc
        self._lock = threading.Lock()
        self._index = _Index(acls)
        #: Bumped on every change of the bindings: sessions' cached decisions are then dropped.
        self.generation = 0
        self._next_stat = time.monotonic() + _STAT_INTERVAL_S
        log.info("Kafka ACLs: %d bindings in %s", len(acls), self.path)

    def __len__(self) -> int:
        return len(self._index.acls)

    # -- checks ------------------------------------------------------------------------------
    def authorize(self, session: Session, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        """Whether ``session``'s user may do ``operation`` on the resource."""
        if session.super_user:
            return True
        if time.monotonic() >= self._next_stat:
            self.reload_if_changed()
        cache = session.authz
        if cache is None or cache[0] != self.generation:
            cache = session.authz = (self.generation, {})
        decisions = cache[1]
        key = (operation, resource_type, name)
        allowed = decisions.get(key)
        if allowed is None:
            allowed = self._decide(session.principal, session.host, operation, resource_type, name)
            if len(decisions) >= MAX_CACHED_DECISIONS:
                decisions.clear()
            decisions[key] = allowed
        return bool(allowed)

    def _decide(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                name: str) -> bool:  # fmt: skip
        matching = self._index.matching(resource_type, name)
        if not matching:
            return self.allow_everyone
        allowing = _IMPLIED_BY.get(operation, frozenset((operation, Operation.ALL)))
        allowed = False
        for acl in matching:
            if not _applies(acl, principal, host):
                continue
            if acl.permission is Permission.DENY:
                if acl.operation is operation or acl.operation is Operation.ALL:
                    return False
            elif acl.operation in allowing:
                allowed = True
        return allowed

    def allowed_names(self, session: Session, operation: Operation, resource_type: ResourceType,
                      names: Iterable[str]) -> list[str]:  # fmt: skip
        """Those of ``names`` ``session`` may do ``operation`` on, in order."""
        return [n for n in names if self.authorize(session, operation, resource_type, n)]

    def authorize_any(self, session: Session, operation: Operation, resource_type: ResourceType) -> bool:
        """Whether ``session``'s user may do ``operation`` on some resource of the type
        (KIP-679's check, Kafka's ``authorizeByResourceType``): an applying ALLOW not
        cancelled by an applying DENY of the same pattern or of every name, or no
        binding of that type at all with ``allow.everyone.if.no.acl.found``."""
        if session.super_user:
            return True
        index = self._index
        if resource_type not in index.types:
            return self.allow_everyone
        principal, host = session.principal, session.host
        applying = [
            a for a in index.acls
            if a.resource_type is resource_type and _applies(a, principal, host)
            and a.operation in (operation, Operation.ALL)
        ]  # fmt: skip
        denied = {(a.pattern, a.name) for a in applying if a.permission is Permission.DENY}
        if (PatternType.LITERAL, WILDCARD) in denied or (PatternType.PREFIXED, "") in denied:
            return False
        return any(a.permission is Permission.ALLOW and (a.pattern, a.name) not in denied for a in applying)

    def authorized_operations(self, session: Session | None, resource_type: ResourceType, name: str) -> int:
        """KIP-430's field of the operations ``session`` may do on the resource (all the
        type has when there is no session: SASL off)."""
        if session is None or session.super_user:
            return ALL_OPERATIONS[resource_type]
        return _bits(op for op in _SUPPORTED[resource_type] if self.authorize(session, op, resource_type, name))

    # -- the bindings ------------------------------------------------------------------------
    def acls(self) -> tuple[Acl, ...]:
        """Every binding, as the file holds them now."""
        self.reload_if_changed()
        return self._index.acls

    def reload_if_changed(self) -> None:
        """Read the file again if another writer changed it (a bad file: logged, the
        bindings read before stay)."""
        self._next_stat = time.monotonic() + _STAT_INTERVAL_S
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        except OSError as exc:
            log.error("cannot stat the Kafka ACL file %s (%s); keeping the bindings read before", self.path, exc)
            return
        if stamp == self._stamp:
            return
        with self._lock:
            try:
                acls, stamp = read_acl_file(self.path)
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                log.error("Kafka ACL file not reloaded, the %d bindings read before stay: %s", len(self), exc)
                self._stamp = stamp  # once per change, not per check
                return
            self._install(acls, stamp)
        log.info("Kafka ACL file %s reloaded: %d bindings", self.path, len(acls))

    def _install(self, acls: list[Acl], stamp: tuple[int, int, int] | None) -> None:
        self._index = _Index(acls)
        self._stamp = stamp
        self.generation += 1

    def _change(self, edit: Callable[[list[Acl]], list[Acl]]) -> None:
        with self._lock:
            acls = edit_acl_file(self.path, edit)
            try:
                st = os.stat(self.path)
                stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
            except FileNotFoundError:
                stamp = None
            self._install(acls, stamp)

    def create(self, acls: list[Acl]) -> list[str | None]:
        """Store the valid ``acls`` (one write for all); for each, None or why it was
        refused (INVALID_REQUEST: a bad binding, or one over :attr:`max_acls`).

        Raises:
            OSError: the file cannot be written (nothing is stored).
        """
        problems: list[str | None] = [acl.problem() for acl in acls]

        def edit(current: list[Acl]) -> list[Acl]:
            have = dict.fromkeys(current)
            for i, acl in enumerate(acls):
                if problems[i] is not None or acl in have:
                    continue
                if len(have) >= self.max_acls:
                    problems[i] = f"this broker keeps at most {self.max_acls} ACL bindings"
                    continue
                have[acl] = None
            return list(have)

        if any(p is None for p in problems):
            self._change(edit)
        return problems

    def delete(self, filters: list[AclFilter]) -> list[list[Acl]]:
        """Delete the bindings each filter matches (one write for all); for each filter,
        the bindings it deleted.

        Raises:
            OSError: the file cannot be written (nothing is deleted).
        """
        deleted: list[list[Acl]] = [[] for _ in filters]

        def edit(current: list[Acl]) -> list[Acl]:
            for out in deleted:
                out.clear()
            keep = []
            for acl in current:
                hits = [i for i, f in enumerate(filters) if f.matches(acl)]
                for i in hits:
                    deleted[i].append(acl)
                if not hits:
                    keep.append(acl)
            return keep

        if filters:
            self._change(edit)
        return deleted

    def describe(self, acl_filter: AclFilter) -> list[Acl]:
        """The bindings ``acl_filter`` matches."""
        return [acl for acl in self.acls() if acl_filter.matches(acl)]
