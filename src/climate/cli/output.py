"""Readable tables for people, JSON for scripts; either way, never a control character that
came from the server (docs/security.md)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml
from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Unicode category Cc: a terminal obeys ESC (window titles, colours, cursor moves), CSI, BEL
and carriage returns, whoever stored them."""


def printable(text: str) -> str:
    """``text`` with each control character shown as its Python escape (``\\x1b``, ``\\n``)."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], text)


FORMATS = ("table", "json", "yaml")
_DATE = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[T ]([0-9]{2}:[0-9]{2})(?::([0-9]{2})(\.[0-9]+)?)?"
)

_STAMP = re.compile(
    r"(?<![0-9])[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?"
    r"(?:Z|[+-][0-9]{2}:[0-9]{2})?(?![0-9])"
)
"""A date with its time anywhere in a text, with an offset or not."""


def add_format_options(parser: argparse.ArgumentParser) -> None:
    """``-f json|yaml|table`` and ``--json`` (the same as ``-f json``, for scripts)."""
    parser.add_argument(
        "-f",
        "--format",
        choices=FORMATS,
        default="table",
        help="output format: table for people (the default), json or yaml for scripts "
        "(the API's fields and dates as they are)",
    )
    parser.add_argument(
        "--json", dest="format", action="store_const", const="json", help="the same as -f json"
    )


def emit(args: argparse.Namespace, data: object) -> bool:
    """Print ``data`` as JSON or YAML if ``-f`` asks for either; False when a table is wanted."""
    if args.format == "json":
        print(render_json(data))
    elif args.format == "yaml":
        print(render_yaml(data), end="")
    else:
        return False
    return True


def render_json(data: object) -> str:
    return _json(data, indent=2, sort_keys=True)


def render_yaml(data: object) -> str:
    # ASCII-only YAML quotes and escapes every control character.
    return yaml.safe_dump(data, sort_keys=True, allow_unicode=False, default_flow_style=False)


def _json(data: object, **options: Any) -> str:
    # ASCII-only JSON escapes every control character but DEL.
    return json.dumps(data, **options).replace("\x7f", "\\u007f")


def show_date(text: str) -> str:
    """A date of the API (``2030-06-01T09:00:00.000000``, ``2030-06-01 09:00:00``) in the
    command line's one format, ``YYYY-MM-DD HH:MM[:SS[.ffffff]]`` in UTC: seconds and their
    fraction only when not zero, so that what is shown is exact and reads back as input."""
    found = _DATE.fullmatch(text)
    if found is None:
        return text
    day, minute, seconds, fraction = found.groups()
    fraction = (fraction or "").rstrip("0").rstrip(".")
    shown = f"{day} {minute}"
    if fraction or (seconds or "00") != "00":
        shown += f":{seconds}{fraction}"
    return shown


def show_dates(text: str) -> str:
    """``text`` with each date in it (``2030-06-01T09:00:00.000000``, with an offset or not, as
    the server's messages write them) as ``show_date`` shows one, in UTC."""

    def shown(found: re.Match[str]) -> str:
        try:
            when = dt.datetime.fromisoformat(found.group().replace("Z", "+00:00"))
        except ValueError:
            return found.group()
        if when.tzinfo is not None:
            when = when.astimezone(dt.UTC).replace(tzinfo=None)
        return show_date(when.isoformat())

    return _STAMP.sub(shown, text)


def cell(value: Any) -> str:
    """A value as a table shows it."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return _json(value)
    return show_dates(printable(str(value)))


def console(*, stderr: bool = False, width: int | None = None) -> Console:
    """Rich's console on stdout (or stderr): as wide as the terminal, or ``width``; writing to
    a file or a pipe, lines are never folded (scripts and ``grep`` see whole rows)."""
    stream = sys.stderr if stderr else sys.stdout
    if width is None and not stream.isatty():
        width = 100_000
    return Console(file=stream, width=width, highlight=False, emoji=False, markup=False)


def _render(renderable: RenderableType) -> str:
    out = console()
    with out.capture() as captured:
        out.print(renderable)
    return captured.get().rstrip("\n")


def rich_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Table:
    shown = Table(box=box.ASCII, header_style="bold", show_lines=False)
    for column in columns:
        shown.add_column(column, overflow="fold")
    for row in rows:
        shown.add_row(*(Text(cell(row.get(c))) for c in columns))
    return shown


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Rows as a table (Rich, with ASCII borders as ``openstack`` prints them); control
    characters escaped and dates in the one format (``show_date``)."""
    return _render(rich_table(rows, columns))


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


def pooled_name(item: Mapping[str, Any], name_field: str, pool_field: str | None) -> str | None:
    """What names ``item`` for people: its ``name_field``, as ``POOL/NAME`` where its kind has
    pools and it is in one (segment 100 of physnet1 and of physnet2 are two segments); None
    without a name."""
    name = item.get(name_field)
    if name is None:
        return None
    pool = None if pool_field is None else item.get(pool_field)
    return str(name) if pool is None else f"{pool}/{name}"


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
