"""Host allocation ratios: how far a host's size is overcommitted for instances."""

from __future__ import annotations

import math

from climate.errors import InvalidInput

RATIOS = ("cpu_allocation_ratio", "ram_allocation_ratio", "disk_allocation_ratio")
"""Per size column, the host property (or setting) that scales it."""


def parse_ratio(name: str, value: object) -> float:
    """An allocation ratio: a number above 0 (a host property is text).

    :raises InvalidInput: naming ``name``.
    """
    try:
        ratio = float(str(value))
    except ValueError:
        ratio = math.nan
    if isinstance(value, bool) or not (ratio > 0 and math.isfinite(ratio)):
        raise InvalidInput(name, f"must be a number above 0, not {value!r}")
    return ratio
