"""``climate reservation start / acknowledge LEASE RESERVATION``: a project's actions on one
reservation, as its start and end policies allow (docs/policies.md)."""

from __future__ import annotations

import argparse
from typing import Any

from climate.cli.client import show
from climate.cli.http import LEASE, add_client_options, connect, find_id, path_of
from climate.cli.output import emit

SHOWN = (
    "id",
    "resource_type",
    "status",
    "start_policy",
    "started_at",
    "end_policy",
    "acknowledged",
    "acknowledged_at",
)


def reservation_command(args: argparse.Namespace) -> None:
    api = connect(args)
    lease_path = path_of(LEASE, find_id(api, LEASE, args.lease))
    path = f"{lease_path}/reservations/{args.reservation}/{args.action}"
    lease = api.call("POST", path)["lease"]
    if emit(args, lease):
        return
    (reservation,) = [r for r in lease["reservations"] if r["id"] == args.reservation]
    shown: dict[str, Any] = {"lease": lease["id"], **{k: reservation.get(k) for k in SHOWN}}
    show(args, shown)


def register(sub: Any) -> None:
    reservation = sub.add_parser(
        "reservation", help="start a manual reservation, acknowledge a keep-until-ack end"
    )
    actions = reservation.add_subparsers(dest="action", required=True)
    for action, text in (
        ("start", "start a manual reservation its lease's start left held"),
        ("acknowledge", "acknowledge a keep-until-ack reservation's end: discard what it kept"),
    ):
        p = actions.add_parser(action, help=text)
        p.add_argument("lease", help="lease id or name")
        p.add_argument("reservation", help="reservation id")
        add_client_options(p)
    reservation.set_defaults(func=reservation_command)
