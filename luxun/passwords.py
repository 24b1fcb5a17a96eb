"""Deletion passwords: the ``password`` setting's schemes (Java Luxun's
``Authentication``), checking a password a client gave, and what a client sends.

``plain:<password>`` (or just ``<password>``), ``md5:<hex digest>`` and
``crc32:<decimal>``: see :func:`check_password`. The comparison takes the same time
wherever the first difference is. Error messages never hold the secret.

Thread-safety: pure functions (:func:`parse_password` keeps a small cache).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import zlib

from .errors import ConfigError

#: The schemes of a configured password (``<scheme>:<secret>``), as in Java Luxun.
PASSWORD_SCHEMES = ("plain", "md5", "crc32")
_MD5_RE = re.compile(r"[0-9a-fA-F]{32}")
_DECIMAL_RE = re.compile(r"[+-]?[0-9]+")


@functools.lru_cache(maxsize=32)
def parse_password(configured: str, *, label: str = "password") -> tuple[str, str | int] | None:
    """``(scheme, secret)`` of a configured password, or None when it is unset.

    Follows Java Luxun's ``Authentication.build``: ``<scheme>:<secret>`` with scheme
    and secret trimmed; ``plain`` keeps the secret, ``md5`` a 32-digit hex digest
    (compared in lower case), ``crc32`` a decimal CRC-32 (Java's ``Long.parseLong``).
    Extensions: no colon means a plain password, and a plain secret may contain ':'.
    Error messages never include the secret.
    """
    text = configured.strip()
    if not text:
        return None
    if ":" not in text:
        return ("plain", text)
    scheme, _, secret = text.partition(":")
    scheme = scheme.strip().lower()
    secret = secret.strip()
    if scheme not in PASSWORD_SCHEMES:
        raise ConfigError(
            f"{label}: unknown scheme {scheme!r}; use plain:<password>, md5:<hex digest> or crc32:<decimal> "
            "(write plain:<password> for a password that contains ':')",
            key="password",
        )
    if not secret:
        raise ConfigError(f"{label}: nothing after {scheme + ':'!r}", key="password")
    if scheme == "md5":
        if not _MD5_RE.fullmatch(secret):
            raise ConfigError(f"{label}: md5: needs the 32 hex digits of an MD5 digest", key="password")
        return ("md5", secret.lower())
    if scheme == "crc32":
        if not _DECIMAL_RE.fullmatch(secret):
            raise ConfigError(f"{label}: crc32: needs a decimal number, as in Java Luxun", key="password")
        value = int(secret)
        if not 0 <= value <= 0xFFFFFFFF:
            raise ConfigError(f"{label}: crc32: value is outside [0, 4294967295]", key="password")
        return ("crc32", value)
    return ("plain", secret)


def check_password(configured: str | None, given: str | None) -> bool:
    """Whether ``given`` (from a deleteTopic request) matches the configured password.

    ``configured`` forms, as in Java Luxun's ``server.properties``:

    * ``plain:luxun`` (or just ``luxun``): ``given`` must equal ``luxun``;
    * ``md5:3a8cb419bf0d34f5fa091ce416627f82``: the lower-case hex MD5 of ``given``
      (UTF-8) must equal the digest (which may be written in either case);
    * ``crc32:1688323579``: the CRC-32 of ``given`` (UTF-8), as an unsigned decimal,
      must equal the number.

    An unset or empty ``configured`` password refuses every request (Java Luxun
    accepted any password then); so does a ``None`` or wrong ``given``. The
    comparison takes the same time wherever the first difference is
    (:func:`hmac.compare_digest`; plain passwords are hashed with SHA-256 first, so
    not even the length leaks).

    Raises:
        ConfigError: ``configured`` is malformed (:class:`BrokerConfig` rejects such
            a value at load time, so a running broker never sees one).
    """
    spec = parse_password(configured or "")
    if spec is None or given is None:
        return False
    data = given.encode("utf-8")
    scheme, secret = spec
    if scheme == "md5":
        digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
        return hmac.compare_digest(digest.encode("ascii"), str(secret).encode("ascii"))
    if scheme == "crc32":
        crc = zlib.crc32(data) & 0xFFFFFFFF
        return hmac.compare_digest(crc.to_bytes(4, "big"), int(secret).to_bytes(4, "big"))
    return hmac.compare_digest(hashlib.sha256(data).digest(), hashlib.sha256(str(secret).encode("utf-8")).digest())


def password_to_send(given: str) -> str:
    """The password a client (``luxun delete --password``) sends, from the forms the
    broker's ``password`` setting accepts, so both sides can be given the same text.

    * ``plain:s3cret`` sends ``s3cret`` (the prefix and surrounding spaces stripped,
      as the broker strips them from its own setting);
    * a value with no known scheme prefix (``s3cret``, ``a:b``) is sent as it is;
    * ``md5:...`` and ``crc32:...`` are how a broker *stores* a password; a digest
      cannot be turned back into the password, so they are refused: pass the
      password itself (the broker hashes what it receives). A password that really
      starts with ``md5:`` is sent as ``plain:md5:...``.

    Raises:
        ConfigError: an ``md5:`` or ``crc32:`` form (the message never holds the secret).
    """
    scheme, sep, secret = given.partition(":")
    scheme = scheme.strip().lower()
    if not sep or scheme not in PASSWORD_SCHEMES:
        return given
    if scheme == "plain":
        return secret.strip()
    raise ConfigError(
        f"{scheme}:<...> is a form the broker stores, and it cannot be turned back into the password; "
        f"pass the password itself (or plain:<password>): the broker computes the {scheme} of what it receives",
        key="password",
    )


__all__ = ["PASSWORD_SCHEMES", "check_password", "parse_password", "password_to_send"]
