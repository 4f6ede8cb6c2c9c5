"""Readable tables for people, JSON for scripts; either way, never a control character that
came from the server (docs/security.md)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Unicode category Cc: a terminal obeys ESC (window titles, colours, cursor moves), CSI, BEL
and carriage returns, whoever stored them."""


def printable(text: str) -> str:
    """``text`` with each control character shown as its Python escape (``\\x1b``, ``\\n``)."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], text)


def render_json(data: object) -> str:
    return _json(data, indent=2, sort_keys=True)


def _json(data: object, **options: Any) -> str:
    # ASCII-only JSON escapes every control character but DEL.
    return json.dumps(data, **options).replace("\x7f", "\\u007f")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return _json(value)
    return printable(str(value))


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
    rows = [{"Field": k, "Value": v} for k, v in data.items()]
    return table(rows, ["Field", "Value"])


def describe_reservation(
    reservation: Mapping[str, Any], label: Callable[[str, str], str]
) -> dict[str, str]:
    """One reservation for people: what it asks for and what it holds, in its type's terms;
    ``label(resource_type, resource_id)`` names a held resource."""
    kind = str(reservation["resource_type"])
    r = reservation

    def held() -> str:
        ids = dict.fromkeys(str(a["resource_id"]) for a in r.get("allocations", []))
        return ", ".join(label(kind, i) for i in ids)

    if kind == "virtual:instance":
        asks = f"{r.get('amount')} x {r.get('vcpus')} vCPU, {r.get('memory_mb')} MB, "
        asks += f"{r.get('disk_gb')} GB"
        if r.get("affinity") is not None:
            asks += f", affinity {r['affinity']}"
        holds = ", ".join(f"{label(kind, h['host_id'])} x{h['count']}" for h in r.get("hosts", []))
    elif kind == "virtual:floatingip":
        asks = f"{r.get('amount')} from network {r.get('network_id')}"
        if r.get("required_floatingips"):
            asks += f" incl. {', '.join(r['required_floatingips'])}"
        holds = held()
    elif kind == "virtual:volume":
        asks = f"{r.get('amount')} x {r.get('size_gb')} GB"
        if r.get("pool"):
            asks += f" from pool {r['pool']}"
        holds = f"pool {held()}" if r.get("allocations") else ""
    elif kind == "network":
        asks = f"{r.get('amount')} segment(s)"
        holds = held()
    elif "min" in r:
        asks = f"{r.get('min')}-{r.get('max')}"
        holds = held()
    else:
        asks, holds = "", held()
    return {
        "id": str(r["id"]),
        "type": kind,
        "status": str(r.get("status", "")),
        "asks": asks,
        "holds": holds,
    }


def describe_grant(offered: Mapping[str, Any]) -> str:
    """What one reservation of an availability window would get (docs/availability.md): hosts
    by name (or id), instances as host x count, items by name, volumes as GB from a pool."""
    if "hosts" in offered:
        return ", ".join(offered.get("host_names") or offered["hosts"])
    if "placement" in offered:
        return ", ".join(
            f"{p.get('host_name', p['host'])} x{p['count']}" for p in offered["placement"]
        )
    if "items" in offered:
        return ", ".join(_item_name(item) for item in offered["items"])
    if "pool" in offered:
        return f"{offered['gb']} GB from pool {offered['pool'] or offered['pool_id']}"
    return ""


def _item_name(item: Mapping[str, Any]) -> str:
    """An item by its name field (a device's name, a floating IP's address...), else its id."""
    names = [str(value) for key, value in item.items() if key != "id" and value]
    return names[0] if names else str(item["id"])


def describe_capacity(timeline: Mapping[str, Any]) -> str:
    """A capacity timeline's heading: what ``total`` counts, in its ``unit``."""
    total, unit, bucket = timeline["total"], timeline["unit"], timeline["bucket"]
    if unit == "GB":
        counted = f"{total} GB in the matching pool(s)"
    elif unit == "instances":
        counted = f"{total} instance(s) of this size fit the matching hosts when empty"
    else:
        counted = f"{total} matching {unit.removesuffix('s')}(s)"
    return f"{counted}, buckets of {bucket} s"
