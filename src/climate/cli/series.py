"""``climate series create / list / show / delete``: recurring leases over the HTTP API
(docs/series.md)."""

from __future__ import annotations

import argparse
from typing import Any

from climate.cli.client import show
from climate.cli.durations import EXAMPLES, seconds
from climate.cli.http import SERIES, add_client_options, connect, find_id, path_of
from climate.cli.output import emit, record, table
from climate.cli.reservation_args import add_reservation_options, requested_reservations

OCCURRENCE_COLUMNS = ["occurrence", "lease_id", "status", "start_date", "end_date"]


def series_command(args: argparse.Namespace) -> None:
    api = connect(args)
    if args.action == "list":
        found = api.call("GET", "/lease-series")["series"]
        show(args, found, ["id", "name", "rrule", "start_date", "end_date"])
    elif args.action == "show":
        _show(args, api.call("GET", path_of(SERIES, find_id(api, SERIES, args.series))))
    elif args.action == "create":
        _show(args, api.call("POST", "/lease-series", _body(args)))
    elif args.action == "delete":
        series_id = find_id(api, SERIES, args.series)
        api.call("DELETE", path_of(SERIES, series_id))
        print(f"Deleted series {series_id} and its occurrences not yet ended")


def _body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": args.name,
        "start_date": args.start,
        "rrule": args.rrule,
        "exdates": args.exdate,
        "conflicts": args.conflicts,
        "reservations": requested_reservations(args),
        "events": [],
    }
    if (args.end is None) == (args.duration is None):
        raise SystemExit("error: give --end (of the first occurrence) or --duration")
    if args.end is not None:
        body["end_date"] = args.end
    else:
        body["duration"] = args.duration
    if args.reminder:
        body["reminders"] = args.reminder
    if args.before_end_offset is not None:
        body["before_end_offset"] = args.before_end_offset
    return body


def _show(args: argparse.Namespace, answer: dict[str, Any]) -> None:
    """A series for people: its fields, then its occurrences, then those skipped."""
    if emit(args, answer):
        return
    series = answer["series"]
    shown = {k: v for k, v in series.items() if k not in ("occurrences", "reservations")}
    print(record(shown))
    print(table(series.get("occurrences", []), OCCURRENCE_COLUMNS))
    skipped = answer.get("skipped") or []
    if skipped:
        print(f"skipped {len(skipped)} occurrence(s) that do not fit:")
        print(table(skipped, ["occurrence", "end_date", "error_message"]))


def register(sub: Any) -> None:
    series = sub.add_parser("series", help="recurring leases (an iCalendar RRULE)")
    actions = series.add_subparsers(dest="action", required=True)
    add_client_options(actions.add_parser("list", help="the series you may see"))
    for action, text in (
        ("show", "one series with its occurrences"),
        ("delete", "delete a series and its occurrences not yet ended"),
    ):
        p = actions.add_parser(action, help=text)
        p.add_argument("series", help="series id or name")
        add_client_options(p)
    p = actions.add_parser("create", help="a lease per occurrence of a rule")
    p.add_argument("name", help="the series' name (each occurrence's lease is named after it)")
    p.add_argument("--start", required=True, help="the first occurrence's start (UTC)")
    p.add_argument("--end", help="the first occurrence's end (or --duration)")
    p.add_argument("--duration", type=seconds, help=f"each occurrence's length: {EXAMPLES}")
    p.add_argument(
        "--rrule", required=True, help="e.g. 'FREQ=WEEKLY;BYDAY=TU;COUNT=8' (COUNT or UNTIL)"
    )
    p.add_argument(
        "--exdate", action="append", default=[], help="an occurrence to leave out; repeatable"
    )
    p.add_argument(
        "--conflicts",
        choices=("reject", "skip"),
        default="reject",
        help="reject: all or nothing (default); skip: create those that fit",
    )
    add_reservation_options(p)
    p.add_argument(
        "--reminder",
        type=seconds,
        action="append",
        default=[],
        help="a reminder this long before each end, e.g. 1h; repeatable",
    )
    p.add_argument(
        "--before-end-offset", type=seconds, help="the before-end event this long before the end"
    )
    add_client_options(p)
    series.set_defaults(func=series_command)
