"""Topic names: which are legal, the broker's rules in one place for every side.

A legal topic name is a ``str`` that is

- not empty, and at most 255 characters;
- not ``.`` or ``..``, and without ``/``;
- without control (Cc), private-use (Co), surrogate (Cs) or unassigned (Cn)
  characters; format characters (Cf, e.g. U+200B ZERO WIDTH SPACE, U+FEFF) are
  allowed, as is any other assigned character;
- at most 255 bytes in UTF-8 (it is a directory name on the broker);
- not starting with ``.luxun`` (:data:`RESERVED_PREFIX`: the broker's own).

The broker stores a topic as a directory named after it, so these are its storage
rules (``bigarray.validate_name``, which ``idl`` cannot import) plus its reserved
prefix; a test checks that the two agree. The agent drops messages for an illegal
topic instead of sending them, and the ``luxun`` command refuses one before
connecting, both with :func:`topic_name_problem`.

Thread-safety: pure functions.
"""

from __future__ import annotations

import unicodedata
from typing import Final

__all__ = ["MAX_TOPIC_BYTES", "MAX_TOPIC_CHARS", "RESERVED_PREFIX", "topic_name_problem"]

#: Longest topic name, in characters.
MAX_TOPIC_CHARS: Final = 255
#: Longest topic name, in bytes of UTF-8 (a directory name on most Linux file systems).
MAX_TOPIC_BYTES: Final = 255
#: Topic names starting with this are the broker's own.
RESERVED_PREFIX: Final = ".luxun"

_FORBIDDEN_CATEGORIES: Final = frozenset({"Cc", "Co", "Cs", "Cn"})


def topic_name_problem(name: object) -> str | None:
    """None if ``name`` is a legal topic name; else one short reason, fit to follow
    ``topic 'x': `` (e.g. ``"must not contain '/'"``)."""
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not name:
        return "must not be empty"
    if len(name) > MAX_TOPIC_CHARS:
        return f"has {len(name)} characters; at most {MAX_TOPIC_CHARS} are allowed"
    if name in (".", ".."):
        return f"{name!r} is reserved"
    if "/" in name:
        return "must not contain '/'"
    category = unicodedata.category
    for ch in name:
        if category(ch) in _FORBIDDEN_CATEGORIES:
            return f"contains a control, private-use, surrogate or unassigned character (U+{ord(ch):04X})"
    size = len(name.encode("utf-8"))
    if size > MAX_TOPIC_BYTES:
        return f"takes {size} bytes in UTF-8; at most {MAX_TOPIC_BYTES} are allowed"
    if name.startswith(RESERVED_PREFIX):
        return f"names starting with {RESERVED_PREFIX!r} are reserved"
    return None
