"""``climate calendar``: a Gantt chart of the resources against days (or hours) with the leases
that hold them, as wide as the terminal and readable without colour: each lease has a letter,
explained by a legend below the chart (docs/cli.md)."""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import string
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from climate.cli.http import ApiClient, add_client_options, connect
from climate.cli.output import cell, console, emit, pooled_name, printable, show_date

GLYPHS = string.ascii_uppercase + string.ascii_lowercase + string.digits
SEVERAL = "*"
"""A cell two leases or more hold part of."""
OTHERS = "#"
"""Every lease beyond the 62 that have a letter."""
FREE, BOUNDARY = ".", "|"
"""A free cell; a free cell that starts a day (an hour)."""
COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")
LEGEND_COLUMNS = ["mark", "name", "status", "start_date", "end_date", "project_id", "id"]
FOLDS = frozenset({"name", "id"})
"""The legend's columns that fold to fit; narrower than ``FOLDED_WIDTH`` each, it is a
paragraph per lease instead."""
FOLDED_WIDTH = 12


@dataclass(frozen=True)
class RowKind:
    """The resources of one type as the chart's rows: where they are listed, what names one."""

    label: str
    path: str
    list_key: str
    name_field: str
    pool_field: str | None = None


ROW_KINDS = {
    "physical:host": RowKind("host", "/os-hosts", "hosts", "hypervisor_hostname"),
    "device": RowKind("device", "/devices", "devices", "name"),
    "network": RowKind("segment", "/networks", "networks", "segment_id", "physical_network"),
    "virtual:floatingip": RowKind("fip", "/floatingips", "floatingips", "floating_ip_address"),
    "virtual:volume": RowKind("pool", "/volume-pools", "volume_pools", "name"),
}
ROW_OF = {"virtual:instance": "physical:host"}
"""Reservation types whose allocations are rows of another type (instances: on hosts)."""
RESOURCE_TYPES = (*ROW_KINDS, *ROW_OF)


@dataclass
class Row:
    resource_type: str
    id: str
    name: str
    held: list[tuple[dt.datetime, dt.datetime, str]] = field(default_factory=list)
    """(start, end, lease id) of each allocation in the window."""


@dataclass(frozen=True)
class Window:
    start: dt.datetime
    slots: int
    slot: dt.timedelta

    @property
    def end(self) -> dt.datetime:
        return self.start + self.slots * self.slot


def parse_date(option: str, text: str) -> dt.datetime:
    """``now``, ``YYYY-MM-DD``, ``YYYY-MM-DD HH:MM[:SS[.ffffff]]`` (UTC) or ISO 8601 with an
    offset: the dates the API takes (docs/cli.md)."""
    if text.strip().lower() == "now":
        return dt.datetime.now(dt.UTC)
    try:
        found = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(
            f"error: {option}: {printable(text)!r} is not a date; use 'YYYY-MM-DD HH:MM' (UTC)"
        ) from None
    return found.replace(tzinfo=dt.UTC) if found.tzinfo is None else found.astimezone(dt.UTC)


def window(args: argparse.Namespace) -> Window:
    slot = dt.timedelta(hours=1) if args.hours else dt.timedelta(days=1)
    start = parse_date("--start", args.start)
    if args.hours:
        start = start.replace(minute=0, second=0, microsecond=0)
    else:
        start = start.replace(hour=0, minute=0, second=0, microsecond=0)
    if args.end is not None:
        end = parse_date("--end", args.end)
        if end <= start:
            raise SystemExit("error: --end must come after --start")
        slots = -(-(end - start) // slot)  # whole slots, the last one reaching the end
    elif args.days is not None:
        slots = args.days * (24 if args.hours else 1)
    else:
        slots = 24 if args.hours else 7
    return Window(start, slots, slot)


def _rows(api: ApiClient, kinds: list[str]) -> dict[tuple[str, str], Row]:
    """Every resource of the kinds the caller may list (a member may list none: the chart then
    shows what their leases hold, by id)."""
    rows: dict[tuple[str, str], Row] = {}
    for kind in kinds:
        spec = ROW_KINDS[kind]
        status, _ = api.lookup(f"{spec.path}?limit=1")
        if status != 200:
            continue
        for found in api.every(spec.path, spec.list_key):
            name = pooled_name(found, spec.name_field, spec.pool_field) or str(found["id"])
            rows[(kind, str(found["id"]))] = Row(kind, str(found["id"]), name)
    return rows


def _utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def collect(
    api: ApiClient, span: Window, resource_type: str | None, project_id: str | None
) -> tuple[list[Row], list[dict[str, Any]]]:
    """The rows with the allocations in the window, and the leases holding them (by start)."""
    types = [resource_type] if resource_type else list(RESOURCE_TYPES)
    kinds = list(dict.fromkeys(ROW_OF.get(t, t) for t in types))
    rows = _rows(api, kinds)
    query = {"project_id": project_id} if project_id else {}
    shown: dict[str, dict[str, Any]] = {}
    for lease in api.every("/leases", "leases", **query):
        for reservation in lease["reservations"]:
            if reservation["resource_type"] not in types:
                continue
            kind = ROW_OF.get(reservation["resource_type"], reservation["resource_type"])
            for allocation in reservation.get("allocations", []):
                start, end = _utc(allocation["start_date"]), _utc(allocation["end_date"])
                if start >= span.end or end <= span.start:
                    continue
                key = (kind, str(allocation["resource_id"]))
                row = rows.setdefault(key, Row(kind, key[1], key[1]))
                row.held.append((start, end, lease["id"]))
                shown[lease["id"]] = lease
    order = list(ROW_KINDS)
    ordered = sorted(rows.values(), key=lambda r: (order.index(r.resource_type), r.name, r.id))
    leases = sorted(shown.values(), key=lambda lease: (lease["start_date"], lease["name"]))
    return ordered, leases


def marks(leases: list[dict[str, Any]]) -> dict[str, str]:
    """A letter (or digit) per lease in order; ``#`` for all beyond."""
    return {lease["id"]: GLYPHS[i] if i < len(GLYPHS) else OTHERS for i, lease in enumerate(leases)}


def line(row: Row, span: Window, per_slot: int, mark: dict[str, str]) -> list[str]:
    """One row's cells: ``per_slot`` characters per day (hour), each the lease holding any of
    its time, ``*`` for several, else free."""
    cell = span.slot / per_slot
    cells = []
    for i in range(span.slots * per_slot):
        begin = span.start + i * cell
        finish = begin + cell
        holders = {lease for start, end, lease in row.held if start < finish and end > begin}
        if len(holders) > 1:
            cells.append(SEVERAL)
        elif holders:
            cells.append(mark[holders.pop()])
        else:
            cells.append(BOUNDARY if i % per_slot == 0 and per_slot >= 3 else FREE)
    return cells


def ruler(span: Window, per_slot: int) -> str:
    """The dates (hours) above the chart, each at its column when it fits."""
    width = span.slots * per_slot
    text = [" "] * width
    free_from = 0
    for i in range(span.slots):
        at = span.start + i * span.slot
        if span.slot >= dt.timedelta(days=1):
            label = at.strftime("%a %m-%d" if per_slot >= 10 else "%m-%d")
        elif at.hour == 0 or i == 0:
            label = at.strftime("%m-%d %H:%M" if per_slot >= 12 else "%H:%M")
        else:
            label = at.strftime("%H:%M" if per_slot >= 6 else "%H")
        position = i * per_slot
        if position >= free_from and position + len(label) <= width:
            text[position : position + len(label)] = label
            free_from = position + len(label) + 1
    return "".join(text)


def _span_text(delta: dt.timedelta) -> str:
    seconds = int(delta.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size} {unit}")
            seconds %= size
    return " ".join(parts) or "0 s"


def calendar_command(args: argparse.Namespace) -> None:
    api = connect(args)
    span = window(args)
    rows, leases = collect(api, span, args.resource_type, args.project_id)
    mark = marks(leases)
    if args.format != "table":
        emit(args, _data(span, rows, leases, mark))
        return
    width = args.width or shutil.get_terminal_size((80, 24)).columns
    labels = [f"{ROW_KINDS[r.resource_type].label} {printable(r.name)}" for r in rows]
    label_width = min(max([len("resource"), *map(len, labels)]), 32)
    room = width - label_width - 7  # the table's borders and padding
    per_slot = room // span.slots
    unit = "hour" if args.hours else "day"
    if per_slot < 1:
        raise SystemExit(
            f"error: {span.slots} {unit}s do not fit in {width} columns (at most {max(room, 0)}); "
            "ask for fewer (--days, --end), or days instead of --hours, or give --width"
        )
    out = console(width=width)
    last = show_date((span.end - dt.timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M"))
    out.print(
        Text(
            f"{unit.capitalize()}s {show_date(span.start.strftime('%Y-%m-%d %H:%M'))} to {last} "
            f"UTC, one character = {_span_text(span.slot / per_slot)}"
        )
    )
    chart = Table(box=box.ASCII, header_style="bold")
    chart.add_column("resource", no_wrap=True, overflow="ellipsis", max_width=label_width)
    chart.add_column(
        Text(ruler(span, per_slot)), no_wrap=True, width=span.slots * per_slot, overflow="crop"
    )
    colour = {lease["id"]: COLOURS[i % len(COLOURS)] for i, lease in enumerate(leases)}
    by_mark = {m: colour[lease] for lease, m in mark.items() if m != OTHERS}
    for row, label in zip(rows, labels, strict=True):
        cells = Text()
        for char in line(row, span, per_slot, mark):
            cells.append(char, style=by_mark.get(char, "bold" if char == SEVERAL else "dim"))
        chart.add_row(Text(label), cells)
    out.print(chart)
    if not rows:
        out.print(Text("no resources to show"))
    if leases:
        out.print(_legend(out, leases, mark, by_mark))
    notes = f"{SEVERAL}: several leases; {FREE}: free"
    if per_slot >= 3:
        notes += f"; {BOUNDARY}: free, start of {'an hour' if args.hours else 'a day'}"
    out.print(Text(notes))


def _legend(
    out: Console, leases: list[dict[str, Any]], mark: dict[str, str], colour: dict[str, str]
) -> RenderableType:
    """Each lease's mark and what it is: a table where it fits (only names and ids fold), else
    a paragraph per lease."""
    rows = [
        [mark[lease["id"]], *(cell(lease.get(c)) for c in LEGEND_COLUMNS[1:])] for lease in leases
    ]
    widths = [
        max(len(text) for text in column) for column in zip(LEGEND_COLUMNS, *rows, strict=True)
    ]
    # The table fits when the columns that do not fold are whole and the others (name, id) have
    # FOLDED_WIDTH each; 3 per column of borders and padding, and the last border.
    needed = sum(
        min(w, FOLDED_WIDTH) if c in FOLDS else w
        for c, w in zip(LEGEND_COLUMNS, widths, strict=True)
    )
    if needed + 3 * len(LEGEND_COLUMNS) + 1 <= out.width:
        legend = Table(box=box.ASCII, header_style="bold")
        for column in LEGEND_COLUMNS:
            folds = column in FOLDS
            legend.add_column(column, no_wrap=not folds, overflow="fold" if folds else "ellipsis")
        for row in rows:
            legend.add_row(Text(row[0], style=colour.get(row[0], "")), *map(Text, row[1:]))
        return legend
    paragraphs = []
    for lease in leases:
        shown = mark[lease["id"]]
        what = Text(shown, style=colour.get(shown, ""))
        what.append(
            f" {cell(lease['name'])}: {lease['status']}, {cell(lease['start_date'])} to "
            f"{cell(lease['end_date'])}, project {cell(lease['project_id'])}, id {lease['id']}"
        )
        what.overflow = "fold"
        paragraphs.append(what)
    return Group(*paragraphs)


def _data(
    span: Window, rows: list[Row], leases: list[dict[str, Any]], mark: dict[str, str]
) -> dict[str, Any]:
    """The chart for scripts (``-f json``/``yaml``): the window, each row's allocations in it
    and the leases with their marks; dates as the API writes them."""

    def wire(when: dt.datetime) -> str:
        return when.strftime("%Y-%m-%dT%H:%M:%S.%f")

    return {
        "start_date": wire(span.start),
        "end_date": wire(span.end),
        "slot_seconds": int(span.slot.total_seconds()),
        "resources": [
            {
                "resource_type": row.resource_type,
                "id": row.id,
                "name": row.name,
                "allocations": [
                    {"lease_id": lease, "start_date": wire(start), "end_date": wire(end)}
                    for start, end, lease in sorted(row.held)
                ],
            }
            for row in rows
        ],
        "leases": [
            {k: lease[k] for k in LEGEND_COLUMNS[1:]} | {"mark": mark[lease["id"]]}
            for lease in leases
        ],
    }


def register(sub: Any) -> None:
    p = sub.add_parser(
        "calendar",
        help="a chart of the resources against days (or hours) with the leases that hold them",
    )
    p.add_argument(
        "--start",
        default="now",
        help="the first day (hour): 'now' (the default), 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM' UTC",
    )
    length = p.add_mutually_exclusive_group()
    length.add_argument("--end", help="the last day (hour) shown ends at or after this date")
    length.add_argument(
        "--days", type=_positive, help="how many days (default 7, or 1 with --hours)"
    )
    p.add_argument("--hours", action="store_true", help="a column per hour instead of per day")
    p.add_argument(
        "--resource-type",
        choices=RESOURCE_TYPES,
        help="only this type's resources and reservations (virtual:instance: on hosts)",
    )
    p.add_argument(
        "--project-id",
        help="only this project's leases (the resources are all shown, free or not)",
    )
    p.add_argument(
        "--width",
        type=_positive,
        help="columns to fill (default: the terminal's width, $COLUMNS, else 80)",
    )
    add_client_options(p)
    p.set_defaults(func=calendar_command)


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) > 0):
        raise argparse.ArgumentTypeError(f"must be a whole number above 0, not {text!r}")
    return int(text)
