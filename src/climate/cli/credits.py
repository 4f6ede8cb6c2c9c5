"""``climate credits balance|ledger|grant``: a project's credits (docs/credits.md), through
/v1/projects/{project_id}/credits and /ledger."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote, urlencode

from climate.cli.client import show
from climate.cli.http import add_client_options, connect

LEDGER_COLUMNS = [
    "id",
    "at",
    "kind",
    "lease_id",
    "amount",
    "encumbered",
    "balance",
    "actor",
    "note",
]


def credits_command(args: argparse.Namespace) -> None:
    project = args.project_id or args.project
    if not project:
        raise SystemExit("error: name the project (PROJECT, or --project / $CLIMATE_PROJECT)")
    api = connect(args)
    base = f"/projects/{quote(project, safe='')}"
    if args.action == "balance":
        show(args, api.call("GET", f"{base}/credits")["credits"])
    elif args.action == "ledger":
        asked = {"limit": args.limit, "marker": args.marker}
        query = urlencode({k: v for k, v in asked.items() if v is not None})
        found = api.call("GET", f"{base}/ledger" + (f"?{query}" if query else ""))
        show(args, found["ledger"], LEDGER_COLUMNS)
    else:
        body: dict[str, Any] = {"amount": args.amount}
        if args.note is not None:
            body["note"] = args.note
        show(args, api.call("POST", f"{base}/credits", body)["entry"])


def register(sub: Any) -> None:
    p = sub.add_parser("credits", help="a project's credits: balance, ledger, grant")
    actions = p.add_subparsers(dest="action", required=True)
    balance = actions.add_parser("balance", help="the balance and what is encumbered")
    ledger = actions.add_parser("ledger", help="the ledger, oldest first")
    ledger.add_argument("--limit", type=int, help="at most this many entries")
    ledger.add_argument("--marker", type=int, help="after this entry id")
    grant = actions.add_parser("grant", help="grant credits (admin); negative takes them back")
    for action in (balance, ledger):
        action.add_argument("project_id", nargs="?", metavar="PROJECT", help="default: --project")
        add_client_options(action)
        action.set_defaults(func=credits_command)
    grant.add_argument("project_id", metavar="PROJECT", help="the project to credit")
    grant.add_argument("amount", help="to the cent, e.g. 100.00 or -5")
    grant.add_argument("--note", help="why (kept in the ledger)")
    add_client_options(grant)
    grant.set_defaults(func=credits_command)
