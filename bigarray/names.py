"""Name rules shared by topics and fanout groups."""

from __future__ import annotations

import unicodedata

from .errors import InvalidNameError

#: Longest name, in characters.
MAX_NAME_CHARS = 255
#: Longest file name most Linux file systems accept, in bytes.
MAX_FILE_NAME_BYTES = 255

_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Co", "Cs", "Cn"})


def validate_name(name: object, *, what: str = "name", prefix: str = "") -> str:
    """Check a topic or group name and return it.

    A name is a non-empty ``str`` of at most 255 characters, not ``.`` or ``..``,
    without ``/``, NUL, control, private-use, surrogate or unassigned characters, whose
    file name (``prefix + name`` in UTF-8) fits in 255 bytes. Such a name can never
    escape the directory it is created in.

    Raises:
        InvalidNameError: naming the rule that was broken.
    """
    if not isinstance(name, str):
        raise InvalidNameError(f"{what} must be a string, not {type(name).__name__}")
    if not name:
        raise InvalidNameError(f"{what} must not be empty")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidNameError(f"{what} has {len(name)} characters; at most {MAX_NAME_CHARS} are allowed")
    if name in (".", ".."):
        raise InvalidNameError(f"{what} {name!r} is reserved")
    if "/" in name:
        raise InvalidNameError(f"{what} {name!r} must not contain '/'")
    for ch in name:
        if unicodedata.category(ch) in _FORBIDDEN_CATEGORIES:
            raise InvalidNameError(
                f"{what} {name!r} contains a control, private-use, surrogate or unassigned character (U+{ord(ch):04X})"
            )
    size = len((prefix + name).encode("utf-8"))
    if size > MAX_FILE_NAME_BYTES:
        raise InvalidNameError(
            f"{what} {name!r} takes {size} bytes as a file name; at most {MAX_FILE_NAME_BYTES} are allowed"
        )
    return name
