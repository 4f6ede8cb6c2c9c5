"""Readable tables for people, JSON for scripts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def render_json(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [
        line,
        "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |",
        line,
    ]
    out += [
        "| " + " | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) + " |" for r in cells
    ]
    out.append(line)
    return "\n".join(out)


def record(data: Mapping[str, Any]) -> str:
    rows = [{"Field": k, "Value": _cell(v)} for k, v in data.items()]
    return table(rows, ["Field", "Value"])
