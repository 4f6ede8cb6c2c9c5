"""``climate usage``: reserved and used unit-hours and their price per project (GET /v1/usage)."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlencode

import httpx

from climate.cli.client import show
from climate.cli.http import add_client_options, connect
from climate.cli.output import emit

COLUMNS = [
    "project_id",
    "resource_type",
    "price_rule",
    "reserved_hours",
    "used_hours",
    "reserved_amount",
    "used_amount",
]


def report(args: argparse.Namespace, name: str, more: dict[str, str | None]) -> Any:
    """``GET /v1/<name>`` for the period and project ``args`` ask (and ``more`` of its query):
    with ``--csv`` its CSV printed as the server wrote it (None), else its JSON body."""
    api = connect(args)
    asked = {
        "period": args.period,
        "start": args.start,
        "end": args.end,
        "project_id": args.project_id,
        **more,
    }
    query = f"/{name}?" + urlencode({k: v for k, v in asked.items() if v is not None})
    if not args.csv:
        return api.call("GET", query)[name]
    try:
        response = api.http.get(query + "&format=csv")
    except httpx.HTTPError as exc:
        raise SystemExit(f"error: cannot reach {api.http.base_url}: {exc}") from exc
    if response.status_code >= 400:
        api.call("GET", query)  # exits with the error message
    print(response.text, end="")
    return None


def usage_command(args: argparse.Namespace) -> None:
    found = report(args, "usage", {})
    if found is None or emit(args, found):
        return
    rows: list[dict[str, Any]] = [
        {"project_id": p["project_id"], **line} for p in found["projects"] for line in p["lines"]
    ]
    rows += [
        {
            "project_id": p["project_id"],
            "resource_type": "total",
            "price_rule": "",
            "reserved_hours": "",
            "used_hours": "",
            "reserved_amount": p["reserved_amount"],
            "used_amount": p["used_amount"],
        }
        for p in found["projects"]
    ]
    print(f"{found['start']} to {found['end']} ({found['period']})")
    show(args, rows, COLUMNS)


def register(sub: Any) -> None:
    p = sub.add_parser("usage", help="reserved and used hours and their price (docs/usage.md)")
    p.add_argument("--period", choices=["day", "month"], help="the day or month holding --start")
    p.add_argument("--start", help="a date: the period's day or month, or a custom range's start")
    p.add_argument("--end", help="a custom range's end (with --start, without --period)")
    p.add_argument("--project-id", help="one project (admins; members see their own)")
    p.add_argument("--csv", action="store_true", help="print CSV")
    add_client_options(p)
    p.set_defaults(func=usage_command)
