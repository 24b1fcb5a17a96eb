"""The Kafka APIs that manage security: CreateAcls (30), DescribeAcls (29), DeleteAcls
(31) over the :class:`~luxun.kafka.acls.Authorizer`, and DescribeUserScramCredentials
(50) and AlterUserScramCredentials (51) over the users file (KIP-554).

Answers are Kafka's: without an authorizer (SASL off) the ACL APIs answer
SECURITY_DISABLED; a user without ALTER (create, delete, alter credentials) or DESCRIBE
(describe) on the CLUSTER gets CLUSTER_AUTHORIZATION_FAILED; a bad binding or filter
INVALID_REQUEST with the reason; credentials are judged per user as Kafka's
ScramControlManager does (see :meth:`SecurityApis.alter_user_scram_credentials`).
Each method returns the response's values (:func:`luxun.kafka.protocol.build` makes
the entity of the request's version).

Thread-safety: the authorizer and the users file serialise their writers.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Final

from .acls import CLUSTER_NAME, Acl, AclFilter, Authorizer, Operation, ResourceType
from .sasl import (
    MAX_ITERATIONS,
    SCRAM_MECHANISMS,
    SaslSession,
    ScramCredential,
    User,
    UserStore,
    update_users,
    user_name_problem,
)

__all__ = ["SecurityApis"]

log = logging.getLogger(__name__)

NONE: Final = 0
UNKNOWN_SERVER_ERROR: Final = -1
CLUSTER_AUTHORIZATION_FAILED: Final = 31
UNSUPPORTED_SASL_MECHANISM: Final = 33
INVALID_REQUEST: Final = 42
SECURITY_DISABLED: Final = 54
RESOURCE_NOT_FOUND: Final = 91
DUPLICATE_RESOURCE: Final = 92
UNACCEPTABLE_CREDENTIAL: Final = 93
#: Iterations an upserted credential may have (Kafka's ScramMechanism bounds).
MIN_API_ITERATIONS: Final = 4096
MAX_API_ITERATIONS: Final = min(16384, MAX_ITERATIONS)
#: KIP-554's mechanism codes.
_MECHANISM_CODES: Final = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
_CODE_OF: Final = {name: code for code, name in _MECHANISM_CODES.items()}
_DESCRIBED_TWICE: Final = "Cannot describe SCRAM credentials for the same user twice in a single request"
_NO_AUTHORIZER: Final = (
    "No Authorizer is configured on the broker (SASL is off: kafka.sasl.mechanisms; or name authorizer.class.name)"
)
_SCRAM_DISABLED: Final = "SCRAM credentials live in the users file, which needs SASL on (kafka.sasl.mechanisms)"


def _no_cluster(operation: Operation) -> str:
    return f"the user may not {operation.name} the cluster (an ACL on CLUSTER {CLUSTER_NAME} allows it)"


class SecurityApis:
    """The ACL and SCRAM credential APIs.

    Args:
        authorizer: the ACLs (None: SASL off, no authorizer).
        users: the users file (None: SASL off).
    """

    def __init__(self, authorizer: Authorizer | None, users: UserStore | None) -> None:
        self.authorizer = authorizer
        self.users = users

    def _may(self, session: SaslSession | None, operation: Operation) -> bool:
        if session is None or self.authorizer is None:
            return True
        return self.authorizer.authorize(session, operation, ResourceType.CLUSTER, CLUSTER_NAME)

    # -- ACLs ----------------------------------------------------------------------------------
    def create_acls(self, request: Any, session: SaslSession | None) -> dict[str, Any]:
        n = len(request.creations)
        if self.authorizer is None:
            return {"results": [{"error_code": SECURITY_DISABLED, "error_message": _NO_AUTHORIZER}] * n}
        if not self._may(session, Operation.ALTER):
            message = _no_cluster(Operation.ALTER)
            return {"results": [{"error_code": CLUSTER_AUTHORIZATION_FAILED, "error_message": message}] * n}
        acls = [
            Acl.of(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host, c.operation,
                   c.permission_type)
            for c in request.creations
        ]  # fmt: skip
        try:
            problems = self.authorizer.create(acls)
        except OSError as exc:
            log.error("CreateAcls: cannot write the ACL file: %s", exc)
            message = f"cannot write the ACL file: {exc.strerror or exc}"
            return {"results": [{"error_code": UNKNOWN_SERVER_ERROR, "error_message": message}] * n}
        return {
            "results": [{"error_code": NONE if p is None else INVALID_REQUEST, "error_message": p} for p in problems]
        }

    def describe_acls(self, request: Any, session: SaslSession | None) -> dict[str, Any]:
        if self.authorizer is None:
            return {"error_code": SECURITY_DISABLED, "error_message": _NO_AUTHORIZER, "resources": []}
        if not self._may(session, Operation.DESCRIBE):
            message = _no_cluster(Operation.DESCRIBE)
            return {"error_code": CLUSTER_AUTHORIZATION_FAILED, "error_message": message, "resources": []}
        acl_filter = AclFilter.of(
            request.resource_type_filter, request.resource_name_filter, request.pattern_type_filter,
            request.principal_filter, request.host_filter, request.operation, request.permission_type,
        )  # fmt: skip
        problem = acl_filter.problem()
        if problem is not None:
            return {"error_code": INVALID_REQUEST, "error_message": problem, "resources": []}
        grouped: dict[tuple[int, str, int], list[dict[str, Any]]] = collections.defaultdict(list)
        for acl in self.authorizer.describe(acl_filter):
            grouped[(acl.resource_type, acl.name, acl.pattern)].append(
                {"principal": acl.principal, "host": acl.host, "operation": acl.operation,
                 "permission_type": acl.permission}
            )  # fmt: skip
        resources = [
            {"resource_type": t, "resource_name": name, "pattern_type": pattern, "acls": acls}
            for (t, name, pattern), acls in grouped.items()
        ]
        return {"error_code": NONE, "error_message": None, "resources": resources}

    def delete_acls(self, request: Any, session: SaslSession | None) -> dict[str, Any]:
        n = len(request.filters)
        if self.authorizer is None:
            failed = {"error_code": SECURITY_DISABLED, "error_message": _NO_AUTHORIZER, "matching_acls": []}
            return {"filter_results": [failed] * n}
        if not self._may(session, Operation.ALTER):
            message = _no_cluster(Operation.ALTER)
            failed = {"error_code": CLUSTER_AUTHORIZATION_FAILED, "error_message": message, "matching_acls": []}
            return {"filter_results": [failed] * n}
        filters = [
            AclFilter.of(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter, f.principal_filter,
                         f.host_filter, f.operation, f.permission_type)
            for f in request.filters
        ]  # fmt: skip
        problems = [f.problem() for f in filters]
        valid = [f for f, p in zip(filters, problems, strict=True) if p is None]
        try:
            deleted = iter(self.authorizer.delete(valid))
        except OSError as exc:
            log.error("DeleteAcls: cannot write the ACL file: %s", exc)
            failed = {"error_code": UNKNOWN_SERVER_ERROR, "error_message": f"cannot write the ACL file: {exc}",
                      "matching_acls": []}  # fmt: skip
            return {"filter_results": [failed] * n}
        results = []
        for problem in problems:
            if problem is not None:
                results.append({"error_code": INVALID_REQUEST, "error_message": problem, "matching_acls": []})
                continue
            matching = [
                {"error_code": NONE, "error_message": None, "resource_type": a.resource_type,
                 "resource_name": a.name, "pattern_type": a.pattern, "principal": a.principal, "host": a.host,
                 "operation": a.operation, "permission_type": a.permission}
                for a in next(deleted)
            ]  # fmt: skip
            results.append({"error_code": NONE, "error_message": None, "matching_acls": matching})
        return {"filter_results": results}

    # -- SCRAM credentials (KIP-554) -------------------------------------------------------------
    def describe_user_scram_credentials(self, request: Any, session: SaslSession | None) -> dict[str, Any]:
        if self.users is None:
            return {"error_code": UNSUPPORTED_SASL_MECHANISM, "error_message": _SCRAM_DISABLED, "results": []}
        if not self._may(session, Operation.DESCRIBE):
            message = _no_cluster(Operation.DESCRIBE)
            return {"error_code": CLUSTER_AUTHORIZATION_FAILED, "error_message": message, "results": []}
        users = self.users.all()
        if not request.users:
            names = [name for name, user in users.items() if user.credentials]
        else:
            names = [u.name for u in request.users]
        counts = collections.Counter(names)
        results = []
        for name in dict.fromkeys(names):
            user = users.get(name)
            if counts[name] > 1:
                code, message = DUPLICATE_RESOURCE, _DESCRIBED_TWICE
            elif user is None or not user.credentials:
                code, message = RESOURCE_NOT_FOUND, "Attempt to describe a user credential that does not exist"
            else:
                infos = [{"mechanism": _CODE_OF[m], "iterations": c.iterations} for m, c in user.credentials.items()]
                results.append({"user": name, "error_code": NONE, "error_message": None, "credential_infos": infos})
                continue
            results.append({"user": name, "error_code": code, "error_message": message, "credential_infos": []})
        return {"error_code": NONE, "error_message": None, "results": results}

    def alter_user_scram_credentials(self, request: Any, session: SaslSession | None) -> dict[str, Any]:
        """Upsertions and deletions, judged per user as Kafka does: a user named twice in
        the request (DUPLICATE_RESOURCE), an empty or unusable name or an empty salt or
        salted password, or iterations outside 4096..16384 (UNACCEPTABLE_CREDENTIAL), a
        mechanism that is not SCRAM-SHA-256/512 (UNSUPPORTED_SASL_MECHANISM), deleting a
        credential that does not exist (RESOURCE_NOT_FOUND). The accepted changes are
        written in one crash-safe rewrite of the users file (a new user gets the role
        ``user``; deleting a user's last credential keeps its line, so its role stays)."""
        everyone = [d.name for d in request.deletions] + [u.name for u in request.upsertions]
        if self.users is None or not self._may(session, Operation.ALTER):
            code, message = (
                (UNSUPPORTED_SASL_MECHANISM, _SCRAM_DISABLED)
                if self.users is None
                else (CLUSTER_AUTHORIZATION_FAILED, _no_cluster(Operation.ALTER))
            )
            return {
                "results": [{"user": n, "error_code": code, "error_message": message} for n in dict.fromkeys(everyone)]
            }
        counts = collections.Counter(everyone)
        errors: dict[str, tuple[int, str]] = {}
        for name in everyone:
            if counts[name] > 1:
                errors.setdefault(
                    name, (DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
                )
        for d in request.deletions:
            if d.name not in errors:
                problem = _name_problem(d.name) or _mechanism_problem(d.mechanism)
                if problem is not None:
                    errors[d.name] = problem
        for u in request.upsertions:
            if u.name not in errors:
                problem = _name_problem(u.name) or _mechanism_problem(u.mechanism) or _upsertion_problem(u)
                if problem is not None:
                    errors[u.name] = problem

        def change(users: dict[str, User]) -> dict[str, User]:
            changed: dict[str, User] = {}
            for d in request.deletions:
                if d.name in errors:
                    continue
                user = users.get(d.name)
                mechanism = _MECHANISM_CODES[d.mechanism]
                if user is None or mechanism not in user.credentials:
                    errors[d.name] = (RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
                    continue
                credentials = {m: c for m, c in user.credentials.items() if m != mechanism}
                changed[d.name] = User(user.name, user.admin, credentials)
            for u in request.upsertions:
                if u.name in errors:
                    continue
                mechanism = _MECHANISM_CODES[u.mechanism]
                credential = ScramCredential.from_salted_password(mechanism, u.salted_password, u.salt, u.iterations)
                user = users.get(u.name)
                before = dict(user.credentials) if user is not None else {}
                changed[u.name] = User(u.name, user is not None and user.admin, before | {mechanism: credential})
            return changed

        try:
            update_users(self.users.path, change)
        except (OSError, ValueError) as exc:
            log.error("AlterUserScramCredentials: cannot rewrite the users file: %s", exc)
            for name in everyone:
                errors.setdefault(name, (UNKNOWN_SERVER_ERROR, f"cannot rewrite the users file: {exc}"))
        return {
            "results": [
                {
                    "user": n,
                    "error_code": errors.get(n, (NONE, None))[0],
                    "error_message": errors.get(n, (NONE, None))[1],
                }
                for n in dict.fromkeys(everyone)
            ]
        }


def _name_problem(name: str) -> tuple[int, str] | None:
    if not name:
        return UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    problem = user_name_problem(name)
    return None if problem is None else (UNACCEPTABLE_CREDENTIAL, problem)


def _mechanism_problem(code: int) -> tuple[int, str] | None:
    if code in _MECHANISM_CODES:
        return None
    return (
        UNSUPPORTED_SASL_MECHANISM,
        f"Unknown SCRAM mechanism {code} (1: {SCRAM_MECHANISMS[0]}, 2: {SCRAM_MECHANISMS[1]})",
    )


def _upsertion_problem(u: Any) -> tuple[int, str] | None:
    if u.iterations < MIN_API_ITERATIONS:
        return UNACCEPTABLE_CREDENTIAL, f"Too few iterations: {u.iterations} (at least {MIN_API_ITERATIONS})"
    if u.iterations > MAX_API_ITERATIONS:
        return UNACCEPTABLE_CREDENTIAL, f"Too many iterations: {u.iterations} (at most {MAX_API_ITERATIONS})"
    if not u.salt:
        return UNACCEPTABLE_CREDENTIAL, "Salt must not be empty"
    if not u.salted_password:
        return UNACCEPTABLE_CREDENTIAL, "Salted password must not be empty"
    return None
