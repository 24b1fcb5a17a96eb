"""Java ``.properties`` files, read the way ``java.util.Properties.load`` reads them
(the format of Luxun's ``server.properties``): :func:`load_properties`,
:func:`parse_properties`.

Thread-safety: pure functions.
"""

from __future__ import annotations

import os
import re

from .errors import ConfigError

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_WHITESPACE = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def load_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a Java ``.properties`` file into ``{key: value}`` (see :func:`parse_properties`).

    The file is decoded as UTF-8 (a BOM is skipped), falling back to ISO-8859-1 (what
    Java's ``Properties.load(InputStream)`` uses) when it is not valid UTF-8.

    Raises:
        ConfigError: the file cannot be read, or has a malformed ``\\uXXXX`` escape.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {os.fspath(path)!r}: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return parse_properties(text, source=os.fspath(path))


def parse_properties(text: str, *, source: str = "<string>") -> dict[str, str]:
    """Parse ``.properties`` text the way Java's ``Properties.load`` does.

    * Lines end with ``\\n``, ``\\r`` or ``\\r\\n``; leading spaces, tabs and form
      feeds are skipped; blank lines and lines starting with ``#`` or ``!`` are
      comments.
    * A line ending in an odd number of backslashes continues on the next line,
      whose leading whitespace is dropped (a comment line never continues).
    * The key ends at the first unescaped ``=``, ``:`` or whitespace; whitespace and
      at most one ``=``/``:`` follow; the rest of the line is the value (trailing
      whitespace kept, as in Java). ``key`` alone has the value ``""``.
    * Escapes: ``\\t \\n \\r \\f``, ``\\uXXXX`` (surrogate pairs combine), and ``\\x`` for
      any other ``x`` is ``x`` itself (so ``\\=``, ``\\:``, ``\\ ``, ``\\\\``).
    * A repeated key: the last one wins.

    Raises:
        ConfigError: a malformed ``\\uXXXX`` escape (naming the source and line).
    """
    lines = _LINE_BREAK.split(text)
    result: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line_no = i + 1
        line = lines[i].lstrip(_WHITESPACE)
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line):
            line = line[:-1]
            if i >= len(lines):
                break
            line += lines[i].lstrip(_WHITESPACE)
            i += 1
        key, value = _split_key_value(line)
        where = f"{source}:{line_no}"
        result[_unescape(key, where)] = _unescape(value, where)
    return result


def _continues(line: str) -> bool:
    """True when ``line`` ends with an odd number of backslashes."""
    count = len(line) - len(line.rstrip("\\"))
    return count % 2 == 1


def _split_key_value(line: str) -> tuple[str, str]:
    key_end = len(line)
    value_start = len(line)
    has_sep = False
    escaped = False
    for pos, ch in enumerate(line):
        if not escaped and ch in "=:":
            key_end, value_start, has_sep = pos, pos + 1, True
            break
        if not escaped and ch in _WHITESPACE:
            key_end, value_start = pos, pos + 1
            break
        escaped = ch == "\\" and not escaped
    while value_start < len(line):
        ch = line[value_start]
        if ch not in _WHITESPACE:
            if not has_sep and ch in "=:":
                has_sep = True
            else:
                break
        value_start += 1
    return line[:key_end], line[value_start:]


def _unescape(text: str, where: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    pos = 0
    n = len(text)
    while pos < n:
        ch = text[pos]
        pos += 1
        if ch != "\\":
            out.append(ch)
            continue
        if pos >= n:  # a lone trailing backslash (end of input): dropped, as in Java
            break
        ch = text[pos]
        pos += 1
        if ch == "u":
            digits = text[pos : pos + 4]
            if len(digits) < 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                bad = "\\u" + digits
                raise ConfigError(f"{where}: malformed \\uxxxx escape {bad!r}")
            out.append(chr(int(digits, 16)))
            pos += 4
        else:
            out.append(_ESCAPES.get(ch, ch))
    result = "".join(out)
    # \uD83D\uDE00 -> one character, as Java's UTF-16 strings would read it.
    return result.encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")


__all__ = ["load_properties", "parse_properties"]
