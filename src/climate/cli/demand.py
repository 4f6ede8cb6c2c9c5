"""``climate demand``: refused demand beside utilisation, and how many more hosts would have
admitted a share of it (GET /v1/demand, docs/demand.md)."""

from __future__ import annotations

import argparse
from typing import Any

from climate.cli.client import show
from climate.cli.http import add_client_options
from climate.cli.output import emit
from climate.cli.usage import report

COLUMNS = [
    "resource_type",
    "properties",
    "start",
    "refused_requests",
    "refused_unit_hours",
    "reserved_hours",
    "capacity_hours",
]


def demand_command(args: argparse.Namespace) -> None:
    more = {
        "bucket": args.bucket,
        "resource_type": args.resource_type,
        "properties": args.properties,
        "target": args.target,
    }
    found = report(args, "demand", more)
    if found is None or emit(args, found):
        return
    rows: list[dict[str, Any]] = [
        {"resource_type": g["resource_type"], "properties": g["properties"], **b}
        for g in found["groups"]
        for b in g["buckets"]
    ]
    print(f"{found['start']} to {found['end']} ({found['period']}, per {found['bucket']})")
    show(args, rows, COLUMNS)
    plan = found["plan"]
    if plan is not None:
        extra = plan["extra_hosts"]
        print(
            f"{plan['target_percent']}% of the {plan['counted_requests']} refused request(s) "
            f"hosts like {plan['template_host']} could serve ({plan['needed_requests']}): "
            + ("more than 1000 extra hosts" if extra is None else f"extra hosts: {extra}")
            + f" (admits {plan['admitted_requests']}; with none, {plan['admitted_without_extra']})"
        )


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demand", help="refused demand, utilisation and hosts to add (docs/demand.md)"
    )
    p.add_argument("--period", choices=["day", "month"], help="the day or month holding --start")
    p.add_argument("--start", help="a date: the period's day or month, or a custom range's start")
    p.add_argument("--end", help="a custom range's end (with --start, without --period)")
    p.add_argument("--project-id", help="one project (admins; members see their own)")
    p.add_argument("--bucket", choices=["day", "hour"], help="bucket of time (default day)")
    p.add_argument("--resource-type", help="only this resource type")
    p.add_argument("--properties", help="the hosts to add: copies of the first host matching")
    p.add_argument("--target", help="the share of refused host requests to admit, in %%")
    p.add_argument("--csv", action="store_true", help="print CSV")
    add_client_options(p)
    p.set_defaults(func=demand_command)
