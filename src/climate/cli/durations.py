"""Durations as the options take them, sent to the API as whole seconds: seconds (``600``),
``HH:MM`` (``01:30``), numbers with units (``30m``, ``2h``, ``1d``, ``1h30m``) or ISO 8601
(``PT2H``, ``P1DT12H``), the forms of the API's durations and of ``--hold``."""

from __future__ import annotations

import argparse
import re

EXAMPLES = "600 (seconds), 01:30, 30m, 2h, 1d, 1h30m or PT2H"
_CLOCK = re.compile(r"([0-9]{1,6}):([0-5][0-9])")
_UNITS = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_ISO = re.compile(r"p(?:([0-9]+)d)?(?:t(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?)?")
_SIZES = (86_400, 3600, 60, 1)


def seconds(text: str) -> int:
    """A duration above zero in whole seconds: the ``type`` of the options that take one, so
    that argparse names the option in the error."""
    clean = re.sub(r"\s+", "", text).lower()
    clock = _CLOCK.fullmatch(clean)
    found = _UNITS.fullmatch(clean) or _ISO.fullmatch(clean)
    total = 0
    if clean.isdigit():
        total = int(clean)
    elif clock is not None:
        total = int(clock.group(1)) * 3600 + int(clock.group(2)) * 60
    elif found is not None and any(found.groups()) and not clean.endswith("t"):
        total = sum(int(n or 0) * size for n, size in zip(found.groups(), _SIZES, strict=True))
    if total <= 0:
        raise argparse.ArgumentTypeError(
            f"must be a duration above zero like {EXAMPLES}, not {text!r}"
        )
    return total
