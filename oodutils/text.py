"""Text at the output boundary, shared by every writer (files, pages, tables, CSV, the
terminal) and importing nothing of the project, so the lowest modules can use it:

- ``encodable(text)``: every lone surrogate (JSON's ``"\\ud800"``, a file name that is not
  UTF-8) made U+FFFD, so the text can be written as UTF-8; ``utf8_bytes(text)`` encodes
  it so, never raising.
- ``printable(text)``: every control character (C0, DEL, C1: an escape sequence, a carriage
  return, a backspace from someone's record) as ``\\xNN``, so it can neither drive a
  terminal nor break a table's lines.
"""
from __future__ import annotations

import re

__all__ = ["encodable", "utf8_bytes", "printable"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")   # all but \t and \n


def encodable(text: str) -> str:
    """`text` with every lone surrogate made U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def utf8_bytes(text: str) -> bytes:
    """`text` as UTF-8, lone surrogates written as U+FFFD (never an encoding error)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return encodable(text).encode("utf-8")


def _hex_escape(match: re.Match[str]) -> str:
    return "".join(f"\\x{ord(ch):02x}" for ch in match.group())


def printable(text: object, keep_layout: bool = False) -> str:
    """`text` with every control character written as ``\\xNN``; ``keep_layout``: tabs
    and line breaks kept (a whole output for a terminal)."""
    pattern = _TERMINAL_CONTROL if keep_layout else _CONTROL
    return pattern.sub(_hex_escape, str(text))
