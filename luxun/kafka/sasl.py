"""SASL on the Kafka port: PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, as Kafka's broker does them.

Off unless ``kafka.sasl.mechanisms`` names mechanisms. This module holds what does not
depend on the wire: the users file (:class:`UserStore`), the credentials
(:class:`ScramCredential`) and one connection's exchange (:class:`SaslSession`).
The Kafka framing of the exchange (SaslHandshake, SaslAuthenticate, the legacy raw
tokens) is :meth:`luxun.kafka.handlers.KafkaHandler.handle_auth_frame`, and the
server (:mod:`luxun.kafka.server`) reads a connection's frames through it until the
session has a user; docs/kafka-sasl.md tells the whole story.

The users file (``kafka.sasl.users.file``): UTF-8 text, one user a line, ``#`` starts
a comment line, blank lines are skipped::

    # NAME  ROLE   MECHANISM=ITERATIONS:SALT:STORED_KEY:SERVER_KEY ...
    alice   admin  SCRAM-SHA-256=4096:<base64>:<base64>:<base64> SCRAM-SHA-512=4096:<...>
    bob     user   SCRAM-SHA-256=4096:<base64>:<base64>:<base64>

``ROLE`` is ``admin`` (a super user: every ACL check passes, see :mod:`.acls`) or ``user``.
Each credential is RFC 5802's: the salt, the iteration count, StoredKey and ServerKey
(base64), never the password: the one Kafka keeps (``kafka-configs --alter
--add-config SCRAM-SHA-256=[...]``), computed like Kafka's ``ScramFormatter`` (PBKDF2
of the password's UTF-8 bytes, no SASLprep). ``luxun kafka-user add`` writes the lines.
A user may log in with a SCRAM mechanism it has a credential for, and with PLAIN
whenever it has any credential: the password PLAIN carries is hashed with that
credential's salt and iterations and compared with its StoredKey in constant time
(:func:`hmac.compare_digest`), so no password is stored for PLAIN either. Names have
no whitespace or control characters and no ``#`` at the start; the file is read at
start (a bad one stops the broker with a line naming it) and again whenever its
modification time or size changes (a bad change is logged and the previous users
stay).

An unknown user gets the same answers as a known one with a wrong password: for SCRAM
a made-up salt (the same for the same name while the broker runs) and a failure only
at the proof; for PLAIN a hash of the same cost. The SCRAM exchange itself (message
parsing, nonces, the proof check) is the ``scramp`` library's.

Thread-safety: a :class:`UserStore` and an :class:`Authenticator` may be shared by
every connection; a :class:`SaslSession` belongs to one connection's thread.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

import scramp

from ..config import KAFKA_SASL_MECHANISMS
from ..errors import ConfigError
from .textfile import replace_text, writers_lock

__all__ = [
    "DEFAULT_ITERATIONS",
    "MECHANISMS",
    "SCRAM_MECHANISMS",
    "AuthenticationFailed",
    "Authenticator",
    "SaslSession",
    "ScramCredential",
    "User",
    "UserStore",
    "format_user",
    "new_user",
    "parse_users",
    "remove_user",
    "update_users",
    "user_name_problem",
    "write_user",
]

log = logging.getLogger(__name__)

#: The mechanisms this broker offers (``kafka.sasl.mechanisms`` takes a subset).
MECHANISMS: Final = KAFKA_SASL_MECHANISMS
#: The SCRAM mechanisms and the hash of each.
SCRAM_MECHANISMS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: Iterations of a new credential: Kafka's default and minimum (RFC 7677's too).
DEFAULT_ITERATIONS: Final = 4096
MIN_ITERATIONS: Final = 4096
#: More would let one PLAIN login cost the broker seconds of CPU.
MAX_ITERATIONS: Final = 1_000_000
_SALT_BYTES: Final = 16
ROLES: Final = ("admin", "user")

#: What a failed PLAIN login is told (Kafka's PlainSaslServer's words).
PLAIN_FAILED: Final = "Authentication failed: Invalid username or password"


def _scram_failed(mechanism: str) -> str:
    """What a failed SCRAM login is told: Kafka's words, which say nothing of why."""
    return f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"


class AuthenticationFailed(Exception):
    """A login refused; the message is what the client is told (SASL_AUTHENTICATION_FAILED)."""


# -- credentials ---------------------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"{what} is not base64") from None


@dataclasses.dataclass(frozen=True, slots=True)
class ScramCredential:
    """RFC 5802's server-side credential of one user for one SCRAM mechanism."""

    mechanism: str
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes = dataclasses.field(repr=False)

    @classmethod
    def from_password(
        cls, mechanism: str, password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
    ) -> ScramCredential:
        """The credential of ``password`` (a new random salt unless given)."""
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ValueError(f"iterations {iterations} is outside [{MIN_ITERATIONS}, {MAX_ITERATIONS}]")
        salt = secrets.token_bytes(_SALT_BYTES) if salt is None else salt
        stored_key, server_key = _keys(mechanism, password.encode("utf-8"), salt, iterations)
        return cls(mechanism, iterations, salt, stored_key, server_key)

    @classmethod
    def from_salted_password(
        cls, mechanism: str, salted_password: bytes, salt: bytes, iterations: int
    ) -> ScramCredential:
        """The credential of a client's SaltedPassword (KIP-554's AlterUserScramCredentials
        upsertion: ``Hi(password, salt, iterations)``), its salt and iterations."""
        stored_key, server_key = _keys_of_salted(mechanism, salted_password)
        return cls(mechanism, iterations, salt, stored_key, server_key)

    def matches(self, password: bytes) -> bool:
        """Whether ``password`` (UTF-8) is this credential's, compared in constant time."""
        stored_key, _ = _keys(self.mechanism, password, self.salt, self.iterations)
        return hmac.compare_digest(stored_key, self.stored_key)

    def to_text(self) -> str:
        """``MECHANISM=ITERATIONS:SALT:STORED_KEY:SERVER_KEY`` as the users file holds it."""
        parts = (str(self.iterations), _b64(self.salt), _b64(self.stored_key), _b64(self.server_key))
        return f"{self.mechanism}={':'.join(parts)}"

    @classmethod
    def from_text(cls, text: str) -> ScramCredential:
        """The inverse of :meth:`to_text`.

        Raises:
            ValueError: why it is not one (never echoing the keys).
        """
        mechanism, sep, value = text.partition("=")
        if not sep or mechanism not in _HASHES:
            raise ValueError(
                f"{mechanism!r} is not MECHANISM=ITERATIONS:SALT:STORED_KEY:SERVER_KEY with a mechanism "
                f"of {', '.join(SCRAM_MECHANISMS)}"
            )
        fields = value.split(":")
        if len(fields) != 4:
            raise ValueError(
                f"{mechanism}: expected ITERATIONS:SALT:STORED_KEY:SERVER_KEY (4 fields, not {len(fields)})"
            )
        if not fields[0].isascii() or not fields[0].isdigit():
            raise ValueError(f"{mechanism}: iterations {fields[0]!r} is not a number")
        iterations = int(fields[0])
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ValueError(f"{mechanism}: iterations {iterations} is outside [{MIN_ITERATIONS}, {MAX_ITERATIONS}]")
        salt = _unb64(fields[1], f"{mechanism}: the salt")
        stored_key = _unb64(fields[2], f"{mechanism}: StoredKey")
        server_key = _unb64(fields[3], f"{mechanism}: ServerKey")
        size = hashlib.new(_HASHES[mechanism]).digest_size
        if not salt or len(stored_key) != size or len(server_key) != size:
            raise ValueError(f"{mechanism}: an empty salt, or keys that are not {size} bytes")
        return cls(mechanism, iterations, salt, stored_key, server_key)


def _keys(mechanism: str, password: bytes, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) as RFC 5802 and Kafka's ScramFormatter compute them."""
    return _keys_of_salted(mechanism, hashlib.pbkdf2_hmac(_HASHES[mechanism], password, salt, iterations))


def _keys_of_salted(mechanism: str, salted: bytes) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) of RFC 5802's SaltedPassword."""
    name = _HASHES[mechanism]
    client_key = hmac.digest(salted, b"Client Key", name)
    return hashlib.new(name, client_key).digest(), hmac.digest(salted, b"Server Key", name)


@dataclasses.dataclass(frozen=True, slots=True)
class User:
    """A user of the Kafka port: its name, whether it is an admin, its credentials."""

    name: str
    admin: bool
    #: SCRAM mechanism -> credential (none: the user cannot log in).
    credentials: Mapping[str, ScramCredential]


def user_name_problem(name: str) -> str | None:
    """None if ``name`` can be a user in the users file, else why not."""
    if not name:
        return "a user name cannot be empty"
    if name.startswith("#"):
        return f"user name {name!r} starts with '#' (a comment in the users file)"
    if any(c.isspace() or not c.isprintable() for c in name):
        return f"user name {name!r} has whitespace or control characters"
    return None


def new_user(
    name: str,
    password: str,
    *,
    admin: bool = False,
    mechanisms: Iterable[str] = SCRAM_MECHANISMS,
    iterations: int = DEFAULT_ITERATIONS,
) -> User:
    """A user with a credential of ``password`` for each SCRAM mechanism named.

    Raises:
        ValueError: a bad name, an empty password, no or unknown mechanisms, or
            iterations out of range.
    """
    problem = user_name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    if not password:
        raise ValueError("the password is empty")
    chosen = [m for m in dict.fromkeys(mechanisms)]
    unknown = [m for m in chosen if m not in _HASHES]
    if unknown or not chosen:
        raise ValueError(f"credentials are made for {', '.join(SCRAM_MECHANISMS)}, not {unknown or 'none'}")
    credentials = {m: ScramCredential.from_password(m, password, iterations=iterations) for m in chosen}
    return User(name, admin, MappingProxyType(credentials))


def format_user(user: User) -> str:
    """The users file's line of ``user`` (no newline)."""
    role = "admin" if user.admin else "user"
    return " ".join([user.name, role, *(c.to_text() for c in user.credentials.values())])


def _parse_line(line: str) -> User:
    fields = line.split()
    if len(fields) < 2:
        raise ValueError("expected NAME ROLE MECHANISM=CREDENTIAL...")
    name, role, *creds = fields
    problem = user_name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    if role not in ROLES:
        raise ValueError(f"user {name!r}: role {role!r} is not admin or user")
    credentials: dict[str, ScramCredential] = {}
    for text in creds:
        try:
            credential = ScramCredential.from_text(text)
        except ValueError as exc:
            raise ValueError(f"user {name!r}: {exc}") from None
        if credential.mechanism in credentials:
            raise ValueError(f"user {name!r}: two {credential.mechanism} credentials")
        credentials[credential.mechanism] = credential
    return User(name, role == "admin", MappingProxyType(credentials))


def parse_users(text: str, *, source: str = "the users file") -> dict[str, User]:
    """The users of a users file's text, by name.

    Raises:
        ValueError: ``"<source>, line N: why"`` for the first bad line, or a name given twice.
    """
    users: dict[str, User] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            user = _parse_line(stripped)
        except ValueError as exc:
            raise ValueError(f"{source}, line {number}: {exc}") from None
        if user.name in users:
            raise ValueError(f"{source}, line {number}: user {user.name!r} is there twice")
        users[user.name] = user
    return users


def _read_users(path: str) -> tuple[dict[str, User], tuple[int, int, int]]:
    """The users of the file at ``path`` and its (mtime ns, size, inode)."""
    with open(path, encoding="utf-8") as f:
        st = os.fstat(f.fileno())
        text = f.read()
    return parse_users(text, source=path), (st.st_mtime_ns, st.st_size, st.st_ino)


#: With SASL off, the file in the data dir where the SCRAM credential APIs keep the
#: credentials (Kafka keeps them whatever its listeners); name it in
#: ``kafka.sasl.users.file`` to log in with them once SASL is on.
SCRAM_STORE: Final = ".luxun-kafka-users"


class UserStore:
    """The users file: read when made, read again when it changes.

    Args:
        path: the file (``kafka.sasl.users.file``).
        missing_ok: a missing file holds no users (until a credential is written: the
            store a broker with SASL off keeps for the credential APIs, :data:`SCRAM_STORE`).

    Raises:
        ConfigError: the file cannot be read or has a bad line (named), key
            ``kafka.sasl.users.file``.
    """

    KEY: Final = "kafka.sasl.users.file"

    def __init__(self, path: str, *, missing_ok: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.missing_ok = missing_ok
        try:
            self._users, self._stamp = _read_users(self.path)
        except FileNotFoundError as exc:
            if not missing_ok:
                raise ConfigError(f"{self.KEY}: cannot read {self.path}: {exc.strerror or exc}", key=self.KEY) from exc
            self._users, self._stamp = {}, (0, 0, 0)  # made by the first credential written
        except OSError as exc:
            raise ConfigError(f"{self.KEY}: cannot read {self.path}: {exc.strerror or exc}", key=self.KEY) from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{self.KEY}: {exc}", key=self.KEY) from exc
        self._lock = threading.Lock()
        if not self._users and not missing_ok:
            log.warning("%s has no users: no Kafka client can log in (add some with luxun kafka-user add)", self.path)

    def __len__(self) -> int:
        return len(self._users)

    def all(self) -> dict[str, User]:
        """Every user, by name, from the file as it is now."""
        self._reload_if_changed()
        return dict(self._users)

    def get(self, name: str) -> User | None:
        """The user called ``name`` (None if unknown), from the file as it is now."""
        self._reload_if_changed()
        return self._users.get(name)

    def _reload_if_changed(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if self.missing_ok and isinstance(exc, FileNotFoundError):
                return  # no credential written yet
            log.error("cannot stat the users file %s (%s); keeping the %d users read before", self.path, exc,
                      len(self._users))  # fmt: skip
            return
        if (st.st_mtime_ns, st.st_size, st.st_ino) == self._stamp:
            return
        with self._lock:
            try:
                users, stamp = _read_users(self.path)
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                log.error("users file not reloaded, the %d users read before stay: %s", len(self._users), exc)
                self._stamp = (st.st_mtime_ns, st.st_size, st.st_ino)  # once per change, not per login
                return
            self._users, self._stamp = users, stamp
        log.info("users file %s reloaded: %d users", self.path, len(users))


# -- editing the file (luxun kafka-user) ----------------------------------------------------
def _edit(path: str, edit: Callable[[list[str]], list[str]]) -> None:
    """Rewrite the users file at ``path`` with ``edit(lines)`` under the writers' lock
    (:mod:`.textfile`: no other writer's change is lost), crash-safely, readable by its
    owner only."""
    with writers_lock(path):
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = [
                "# luxun Kafka users (kafka.sasl.users.file): NAME ROLE MECHANISM=ITERATIONS:SALT:STOREDKEY:SERVERKEY"
            ]
        parse_users("\n".join(lines), source=path)  # refuse to edit a file the broker would refuse
        replace_text(path, "\n".join(edit(lines)) + "\n")


def _line_name(line: str) -> str | None:
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return None
    return stripped.split()[0]


def write_user(path: str, user: User) -> bool:
    """Add ``user`` to the users file (created if missing), replacing a line of the same
    name in place; True if it replaced one.

    Raises:
        OSError: the file cannot be read or written.
        ValueError: the file has a bad line (named).
    """
    replaced = False

    def edit(lines: list[str]) -> list[str]:
        nonlocal replaced
        out = []
        for line in lines:
            if _line_name(line) == user.name:
                replaced = True
                out.append(format_user(user))
            else:
                out.append(line)
        if not replaced:
            out.append(format_user(user))
        return out

    _edit(path, edit)
    return replaced


def update_users(path: str, change: Callable[[dict[str, User]], dict[str, User]]) -> None:
    """Change users of the users file: ``change(users)`` (the file's users as they are,
    read under the writers' lock) returns the users to write, by name; each replaces the
    line of its name in place or is appended. Crash-safe, as :func:`write_user`.

    Raises:
        OSError, ValueError: as :func:`write_user`.
    """

    def edit(lines: list[str]) -> list[str]:
        changed = change(parse_users("\n".join(lines), source=path))
        out = [format_user(changed.pop(n)) if (n := _line_name(line)) in changed else line for line in lines]
        return out + [format_user(u) for u in changed.values()]

    _edit(path, edit)


def remove_user(path: str, name: str) -> bool:
    """Remove user ``name`` from the users file; False if it was not there (the file is
    then left as it was).

    Raises:
        OSError, ValueError: as :func:`write_user`.
    """
    with open(path, encoding="utf-8") as f:
        if name not in parse_users(f.read(), source=path):
            return False
    _edit(path, lambda lines: [line for line in lines if _line_name(line) != name])
    return True


# -- one connection's exchange ----------------------------------------------------------------
class Authenticator:
    """The broker's SASL settings: the mechanisms offered and the users.

    Args:
        mechanisms: those offered, in the order SaslHandshake answers them.
        users: the users file.
    """

    def __init__(self, mechanisms: Iterable[str], users: UserStore) -> None:
        self.mechanisms = tuple(mechanisms)
        if not self.mechanisms or any(m not in MECHANISMS for m in self.mechanisms):
            raise ValueError(f"mechanisms {self.mechanisms} are not a subset of {MECHANISMS}")
        self.users = users
        self._secret = secrets.token_bytes(32)
        # Hashed for a PLAIN login of an unknown user, so that it costs what a known one does.
        self._decoy = ScramCredential.from_password("SCRAM-SHA-256", secrets.token_hex(16))

    def session(self) -> SaslSession:
        """A new connection's authentication state."""
        return SaslSession(self)

    def decoy(self, mechanism: str, name: str) -> ScramCredential:
        """A made-up credential for an unknown user: the same salt for the same name while
        the broker runs (an attacker sees no difference from a known user's), keys that
        no password matches."""
        salt = hmac.digest(self._secret, name.encode("utf-8"), "sha256")[:_SALT_BYTES]
        size = hashlib.new(_HASHES[mechanism]).digest_size
        return ScramCredential(
            mechanism, DEFAULT_ITERATIONS, salt, secrets.token_bytes(size), secrets.token_bytes(size)
        )

    def check_plain(self, token: bytes) -> User:
        """The user a PLAIN token (``authzid NUL authcid NUL password``) logs in.

        Raises:
            AuthenticationFailed: a malformed token or a wrong name or password.
        """
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailed(
                f"Authentication failed: invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}"
            )
        try:
            authzid, name, _ = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("Authentication failed: the SASL/PLAIN response is not UTF-8") from None
        if not name:
            raise AuthenticationFailed("Authentication failed: username not specified")
        if authzid and authzid != name:
            raise AuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is different from username"
            )
        user = self.users.get(name)
        credential = next(iter(user.credentials.values()), None) if user is not None else None
        if user is None or credential is None:
            self._decoy.matches(parts[2])
            raise AuthenticationFailed(PLAIN_FAILED)
        if not credential.matches(parts[2]):
            raise AuthenticationFailed(PLAIN_FAILED)
        return user


#: The principal's name of a connection without SASL (Kafka's KafkaPrincipal.ANONYMOUS).
ANONYMOUS: Final = "ANONYMOUS"


class SaslSession:
    """One connection's way through authentication.

    ``mechanism`` is set by :meth:`handshake`; :meth:`step` takes each token of the
    client and returns the server's, until ``user`` is set (authenticated). ``raw``:
    the client sent SaslHandshake v0, so its tokens come as bare size-prefixed frames
    (Kafka before 1.0) rather than in SaslAuthenticate requests.
    """

    __slots__ = ("_auth", "_pending", "_scram", "authz", "host", "mechanism", "raw", "user")

    def __init__(self, authenticator: Authenticator | None) -> None:
        self._auth = authenticator
        self.mechanism: str | None = None
        self.raw = False
        self.user: User | None = None
        self._scram: scramp.ScramServer | None = None
        self._pending: User | None = None  # the SCRAM user named, until the proof is checked
        #: The client's address (set at login; ACLs name hosts).
        self.host = ""
        #: The authorizer's cache of this connection's decisions (luxun.kafka.acls).
        self.authz: Any = None

    @classmethod
    def anonymous(cls, host: str) -> SaslSession:
        """A connection with SASL off to a broker with an authorizer: User:ANONYMOUS, as
        Kafka names the principal of a PLAINTEXT listener (ACLs may grant it rights)."""
        session = cls(None)
        session.user = User(ANONYMOUS, False, {})
        session.host = host
        return session

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """The mechanisms offered."""
        return self._auth.mechanisms if self._auth is not None else ()

    @property
    def admin(self) -> bool:
        """True once authenticated as an admin."""
        return self.user is not None and self.user.admin

    @property
    def principal(self) -> str:
        """``User:<name>``, as ACLs name the user."""
        return "User:" + (self.user.name if self.user is not None else "")

    @property
    def super_user(self) -> bool:
        """An admin: allowed everything whatever the ACLs (Kafka's super.users)."""
        return self.user is not None and self.user.admin

    @property
    def _authenticator(self) -> Authenticator:
        """The mechanisms and users (an anonymous session has none: it never logs in)."""
        if self._auth is None:
            raise AuthenticationFailed("this connection has SASL off")
        return self._auth

    def handshake(self, mechanism: str, version: int) -> bool:
        """The client chose ``mechanism`` (SaslHandshake of ``version``): True if offered."""
        if mechanism not in self._authenticator.mechanisms:
            return False
        self.mechanism = mechanism
        self.raw = version == 0
        return True

    def step(self, token: bytes) -> bytes:
        """The server's answer to the client's next ``token``; ``user`` is set when done.

        Raises:
            AuthenticationFailed: the login is refused (its message is for the client).
        """
        mechanism = self.mechanism
        if mechanism is None or self.user is not None:
            raise AuthenticationFailed("Authentication failed: no SASL exchange in progress")
        if mechanism == "PLAIN":
            self.user = self._authenticator.check_plain(token)
            return b""
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed(_scram_failed(mechanism)) from None
        try:
            if self._scram is None:
                self._scram = scramp.ScramMechanism(mechanism).make_server(self._credential)
                self._scram.set_client_first(text)
                return str(self._scram.get_server_first()).encode("utf-8")
            self._scram.set_client_final(text)
            final = str(self._scram.get_server_final()).encode("utf-8")
        except Exception as exc:  # scramp's ScramException; anything else it raises on garbage too
            log.debug("SCRAM exchange refused: %s", exc)
            raise AuthenticationFailed(_scram_failed(mechanism)) from None
        if self._pending is None:  # a decoy's proof cannot match; never let one through
            raise AuthenticationFailed(_scram_failed(mechanism))
        self.user = self._pending
        return final

    def _credential(self, name: str) -> tuple[bytes, bytes, bytes, int]:
        """scramp's ``auth_fn``: the credential of ``name`` for this mechanism (a decoy
        for an unknown user, or one without a credential for it)."""
        assert self.mechanism is not None
        user = self._authenticator.users.get(name)
        credential = user.credentials.get(self.mechanism) if user is not None else None
        if credential is None:
            credential = self._authenticator.decoy(self.mechanism, name)
            user = None
        self._pending = user
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations
