"""The checks every route shares on what a client sends: bounded integers, and text without
control characters (docs/limits.md). Small and free of the wire format, so that a typed
request model can call them as well."""

from __future__ import annotations

import re

from climate.errors import InvalidInput

MAX_INT = 2**31 - 1
"""The largest integer any request field takes: what an Integer column holds on every
database, and far below what numpy's int64 arithmetic in the planner overflows on."""
_DIGITS = len(str(MAX_INT))
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Unicode category Cc: C0, DEL and C1 (ESC starts terminal escape sequences, and C1's CSI
does on some terminals)."""
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Cc except tab and line feed."""
_SURROGATE = re.compile("[\ud800-\udfff]")
"""Half of a UTF-16 pair (JSON's ``"\\ud800"`` escape alone): no character at all, and no UTF-8
text, so no database, log line or answer could hold it."""
_SHOWN = 40


def shown(value: object) -> str:
    """``value`` quoted for an error message: escaped (never a raw control character) and
    cut short (a client may send a thousand digits)."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}..."


def printable(text: str) -> str:
    """``text`` as it is, or escaped if it holds a control character (or a lone surrogate,
    which no answer could encode): a field to name in an error message, which a terminal may
    show."""
    return shown(text) if _CONTROL.search(text) or _SURROGATE.search(text) else text


def integer(field: str, value: object, *, minimum: int, maximum: int = MAX_INT) -> int:
    """An integer from ``minimum`` to ``maximum``, given as a JSON number or as a string of
    digits (the blazar CLI sends strings).

    :raises InvalidInput: naming ``field``: a boolean, anything else not an integer, or one out
        of range.
    """
    if isinstance(value, bool):
        raise InvalidInput(
            field, f"is a boolean ({str(value).lower()}) where an integer is required"
        )
    number = value
    if isinstance(value, str):
        text = value.strip()
        digits = text.removeprefix("-")
        # isascii: isdigit also accepts "²"; the length: int() refuses thousands of digits.
        if not (digits.isascii() and digits.isdigit()):
            raise InvalidInput(field, f"must be an integer, not {shown(value)}")
        too_long = len(digits.lstrip("0")) > _DIGITS
        number = int(text) if not too_long else minimum - 1 if text[0] == "-" else maximum + 1
    elif not isinstance(value, int):
        raise InvalidInput(field, f"must be an integer, not {shown(value)}")
    assert isinstance(number, int)
    if number < minimum:
        raise InvalidInput(field, f"must be at least {minimum}, not {shown(value)}")
    if number > maximum:
        raise InvalidInput(field, f"must be at most {maximum}, not {shown(value)}")
    return number


def name_text(field: str, text: str) -> str:
    """A name, a key or any one-line text: no control character at all.

    :raises InvalidInput: naming ``field`` and the character (escaped).
    """
    _refuse(field, text, _CONTROL)
    return text


def free_text(field: str, text: str) -> str:
    """Longer text (a template, a description): tabs and line feeds, no other control
    character (a lone carriage return rewrites a terminal's line as well as ESC does)."""
    _refuse(field, text, _CONTROL_BUT_LINES)
    return text


def _refuse(field: str, text: str, pattern: re.Pattern[str]) -> None:
    half = _SURROGATE.search(text)
    if half is not None:
        raise InvalidInput(
            field,
            f"must not contain unpaired surrogates ({shown(half.group())} at {half.start()})",
        )
    found = pattern.search(text)
    if found is not None:
        raise InvalidInput(
            field,
            f"must not contain control characters ({shown(found.group())} at {found.start()})",
        )
