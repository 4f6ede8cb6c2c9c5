"""Percentiles and plain-text tables."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Count, median, p95, p99, max and mean of ``values`` (NaN when empty)."""
    return {
        "count": len(values),
        "median": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values) if values else math.nan,
        "mean": sum(values) / len(values) if values else math.nan,
    }


def fmt(value: object, digits: int = 1) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    indent: str = "  ",
    align: str = "",
) -> str:
    """A text table with a rule under the headers. ``align`` has one letter per column, ``l`` or
    ``r``; by default the first column is left-aligned and the others right-aligned."""
    align = align or "l" + "r" * (len(headers) - 1)
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]

    def line(items: Sequence[str]) -> str:
        parts = [
            items[i].ljust(widths[i]) if align[i] == "l" else items[i].rjust(widths[i])
            for i in range(len(items))
        ]
        return indent + "  ".join(parts).rstrip()

    out = [line([str(h) for h in headers]), indent + "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def jsonable(value: Any) -> Any:
    """NaN is not JSON: write it as null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value
