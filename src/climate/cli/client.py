"""``climate host / lease / availability / audit ...``: friendly commands over the HTTP API."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any
from urllib.parse import urlencode

import httpx

from climate.cli.output import record, render_json, table


class ApiClient:
    def __init__(self, url: str, token: str | None, project: str | None, roles: str | None) -> None:
        headers = {"Accept": "application/json"}
        if token:
            headers["X-Auth-Token"] = token
        if project:
            headers["X-Project-Id"] = project
            headers["X-Roles"] = roles or "member"
        self.http = httpx.Client(base_url=url.rstrip("/") + "/v1", headers=headers, timeout=30)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise SystemExit(f"error: cannot reach {self.http.base_url}: {exc}") from exc
        if response.status_code >= 400:
            try:
                error = response.json()
                message = error.get("error_message", response.text) + _offers(error)
            except (ValueError, AttributeError):
                message = response.text
            raise SystemExit(f"error ({response.status_code}): {message}")
        return response.json() if response.content else None


def _offers(error: dict[str, Any]) -> str:
    """A refusal's counter-offers, one line each, as options of ``lease create``."""
    lines = []
    for offer in error.get("offers") or []:
        lease = offer["lease"]
        counts = " ".join(f"--min {r['min']} --max {r['max']}" for r in lease["reservations"])
        below = " (fewer hosts than asked)" if offer["below_request"] else ""
        start, end = lease["start_date"], lease["end_date"]
        lines.append(f"  {offer['kind']}: --start '{start}' --end '{end}' {counts}{below}")
    if not lines:
        return ""
    return "\nthese would fit (each is also a lease body to POST as is):\n" + "\n".join(lines)


def add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("CLIMATE_URL", "http://127.0.0.1:1234"))
    parser.add_argument("--token", default=os.environ.get("CLIMATE_TOKEN"))
    parser.add_argument(
        "--project",
        default=os.environ.get("CLIMATE_PROJECT"),
        help="act as this project (noauth mode)",
    )
    parser.add_argument("--roles", default=os.environ.get("CLIMATE_ROLES"))
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def _extras(pairs: list[str], option: str = "--extra") -> dict[str, str]:
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: {option} wants key=value, not {pair!r}")
        found[key] = value
    return found


def _show(args: argparse.Namespace, data: Any, columns: list[str] | None = None) -> None:
    if args.json:
        print(render_json(data))
    elif columns is not None:
        print(table(data, columns))
    else:
        print(record(data))


def _show_lease(args: argparse.Namespace, lease: dict[str, Any]) -> None:
    """A lease for people: its fields, then one line per reservation and per event."""
    if args.json:
        print(render_json(lease))
        return
    print(record({k: v for k, v in lease.items() if k not in ("reservations", "events")}))
    reservations = [
        {
            "id": r["id"],
            "type": r["resource_type"],
            "status": r["status"],
            "min-max": f"{r.get('min')}-{r.get('max')}",
            "hosts": ",".join(a["resource_id"] for a in r.get("allocations", [])),
        }
        for r in lease["reservations"]
    ]
    print(table(reservations, ["id", "type", "status", "min-max", "hosts"]))
    events = sorted(lease["events"], key=lambda e: e["time"])
    print(table(events, ["event_type", "time", "status", "last_error"]))


def host_command(args: argparse.Namespace) -> None:
    api = ApiClient(args.url, args.token, args.project, args.roles)
    if args.action == "list":
        hosts = api.call("GET", "/os-hosts")["hosts"]
        _show(args, hosts, ["id", "hypervisor_hostname", "vcpus", "memory_mb", "local_gb"])
    elif args.action == "show":
        _show(args, api.call("GET", f"/os-hosts/{args.host}")["host"])
    elif args.action == "create":
        body: dict[str, Any] = {"name": args.name, **_extras(args.extra)}
        _show(args, api.call("POST", "/os-hosts", body)["host"])
    elif args.action == "update":
        _show(args, api.call("PUT", f"/os-hosts/{args.host}", _extras(args.extra))["host"])
    elif args.action == "delete":
        api.call("DELETE", f"/os-hosts/{args.host}")
        print(f"Deleted host {args.host}")


def lease_command(args: argparse.Namespace) -> None:
    api = ApiClient(args.url, args.token, args.project, args.roles)
    if args.action == "list":
        leases = api.call("GET", "/leases")["leases"]
        _show(args, leases, ["id", "name", "status", "start_date", "end_date"])
    elif args.action == "show":
        _show_lease(args, api.call("GET", f"/leases/{args.lease}")["lease"])
    elif args.action == "create" and args.from_template:
        _create_from_template(api, args)
    elif args.action == "create":
        reservation: dict[str, Any] = {
            "resource_type": "physical:host",
            "min": args.min,
            "max": args.max if args.max is not None else args.min,
            "hypervisor_properties": "",
            "resource_properties": args.properties or "",
        }
        body: dict[str, Any] = {"name": args.name, "reservations": [reservation], "events": []}
        if args.duration is not None:
            if args.latest_end is None:
                raise SystemExit("error: --duration needs --latest-end")
            body["earliest_start"] = args.earliest_start
            body["latest_end"] = args.latest_end
            body["duration"] = args.duration
        elif args.end is None:
            raise SystemExit("error: --end is required (or --duration and --latest-end)")
        else:
            body["start_date"] = args.start
            body["end_date"] = args.end
        answer = api.call("POST", "/leases?dry_run=true" if args.dry_run else "/leases", body)
        _show_lease(args, answer["lease"])
        if args.dry_run and not args.json:
            print("dry run: nothing was created")
    elif args.action == "update":
        changes: dict[str, Any] = {}
        if args.name:
            changes["name"] = args.name
        if args.end:
            changes["end_date"] = args.end
        if args.start:
            changes["start_date"] = args.start
        _show_lease(args, api.call("PUT", f"/leases/{args.lease}", changes)["lease"])
    elif args.action == "delete":
        api.call("DELETE", f"/leases/{args.lease}")
        print(f"Deleted lease {args.lease}")
    elif args.action == "retry":
        _show_lease(args, api.call("POST", f"/leases/{args.lease}/retry")["lease"])
    elif args.action == "force-end":
        body = {"skip_backend": args.skip_backend}
        _show_lease(args, api.call("POST", f"/leases/{args.lease}/force-end", body)["lease"])


def _create_from_template(api: ApiClient, args: argparse.Namespace) -> None:
    """One lease for a Heat stack template; the resources it does not reserve are warned about."""
    if args.end is None or args.duration is not None or args.dry_run:
        raise SystemExit("error: --from-template takes --start and --end (no window, no dry run)")
    try:
        with open(args.from_template, encoding="utf-8") as handle:
            template = handle.read()
    except OSError as exc:
        raise SystemExit(f"error: cannot read {args.from_template}: {exc}") from exc
    body = {
        "name": args.name,
        "start_date": args.start,
        "end_date": args.end,
        "template": template,
        "parameters": _extras(args.parameter, "--parameter"),
    }
    answer = api.call("POST", "/leases/from-template", body)
    if args.json:
        print(render_json(answer))
        return
    _show_lease(args, answer["lease"])
    for warning in answer["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)


def availability_command(args: argparse.Namespace) -> None:
    api = ApiClient(args.url, args.token, args.project, args.roles)
    if args.action == "search":
        reservation = {
            "resource_type": "physical:host",
            "min": args.min,
            "max": args.max if args.max is not None else args.min,
            "hypervisor_properties": "",
            "resource_properties": args.properties or "",
        }
        body = {
            "reservations": [reservation],
            "duration": args.duration,
            "search_start": args.start,
            "search_end": args.end,
            "limit": args.limit,
        }
        windows = api.call("POST", "/availability", body)["windows"]
        if args.json:
            print(render_json(windows))
            return
        rows = [
            {
                "start_date": w["start_date"],
                "end_date": w["end_date"],
                "free": w["reservations"][0]["available"],
                "hosts": ",".join(
                    w["reservations"][0].get("host_names") or w["reservations"][0]["hosts"]
                ),
            }
            for w in windows
        ]
        print(table(rows, ["start_date", "end_date", "free", "hosts"]))
    elif args.action == "timeline":
        query = {
            "start": args.start,
            "end": args.end,
            "bucket": args.bucket,
            "resource_properties": args.properties or "",
        }
        found = api.call("GET", "/availability/timeline?" + urlencode(query))["timeline"]
        if args.json:
            print(render_json(found))
            return
        print(f"{found['hosts']} matching host(s), buckets of {found['bucket']} s")
        print(table(found["buckets"], ["start_date", "free", "partly_busy", "busy"]))


def audit_command(args: argparse.Namespace) -> None:
    api = ApiClient(args.url, args.token, args.project, args.roles)
    filters = {
        "target_id": args.target_id,
        "action": args.action_name,
        "since": args.since,
        "limit": args.limit,
        "marker": args.marker,
    }
    query = {k: v for k, v in filters.items() if v is not None}
    records = api.call("GET", "/audit?" + urlencode(query))["audit_log"]
    columns = ["id", "at", "actor_user", "actor_project", "action", "target_type", "target_id"]
    _show(args, records, columns)


def register(sub: Any) -> None:
    host = sub.add_parser("host", help="manage reservable hosts (admin)")
    host_actions = host.add_subparsers(dest="action", required=True)
    add_client_options(host_actions.add_parser("list"))
    for action in ("show", "delete"):
        p = host_actions.add_parser(action)
        p.add_argument("host", help="host id")
        add_client_options(p)
    p = host_actions.add_parser("create")
    p.add_argument("name")
    p.add_argument("--extra", action="append", default=[], metavar="KEY=VALUE")
    add_client_options(p)
    p = host_actions.add_parser("update")
    p.add_argument("host")
    p.add_argument("--extra", action="append", default=[], metavar="KEY=VALUE")
    add_client_options(p)
    host.set_defaults(func=host_command)

    lease = sub.add_parser("lease", help="create and manage leases")
    lease_actions = lease.add_subparsers(dest="action", required=True)
    add_client_options(lease_actions.add_parser("list"))
    for action in ("show", "delete"):
        p = lease_actions.add_parser(action)
        p.add_argument("lease", help="lease id")
        add_client_options(p)
    p = lease_actions.add_parser("create", help="reserve hosts for a window")
    p.add_argument("name")
    p.add_argument("--start", default="now", help="'now', 'YYYY-MM-DD HH:MM' (UTC) or ISO 8601")
    p.add_argument("--end", help="required unless --duration and --latest-end are given")
    p.add_argument(
        "--duration",
        help="a flexible window: this long ('HH:MM', seconds or ISO 8601 like PT2H), at the "
        "earliest start that fits between --earliest-start and --latest-end",
    )
    p.add_argument("--earliest-start", default="now")
    p.add_argument("--latest-end")
    p.add_argument("--dry-run", action="store_true", help="show what would happen; create nothing")
    p.add_argument("--min", type=int, default=1, help="hosts wanted at least")
    p.add_argument("--max", type=int, help="hosts wanted at most (default: min)")
    p.add_argument(
        "--properties", help='resource_properties query, e.g. \'["==", "$gpu", "a100"]\''
    )
    p.add_argument(
        "--from-template",
        metavar="STACK.yaml",
        help="reserve what a Heat (HOT) template needs instead of hosts (docs/resources.md)",
    )
    p.add_argument(
        "--parameter", action="append", default=[], metavar="KEY=VALUE", help="a template parameter"
    )
    add_client_options(p)
    p = lease_actions.add_parser("update")
    p.add_argument("lease")
    p.add_argument("--name")
    p.add_argument("--start")
    p.add_argument("--end")
    add_client_options(p)
    p = lease_actions.add_parser("retry", help="run a lease's failed events again (admin)")
    p.add_argument("lease", help="lease id")
    add_client_options(p)
    p = lease_actions.add_parser("force-end", help="end a lease now (admin)")
    p.add_argument("lease", help="lease id")
    p.add_argument(
        "--skip-backend",
        action="store_true",
        help="terminate it and free its hosts without the backend (when the backend keeps failing)",
    )
    add_client_options(p)
    lease.set_defaults(func=lease_command)

    availability = sub.add_parser("availability", help="when hosts are free")
    availability_actions = availability.add_subparsers(dest="action", required=True)
    p = availability_actions.add_parser("search", help="the earliest windows a lease would fit")
    p.add_argument("--duration", required=True, help="'HH:MM' or seconds")
    p.add_argument("--start", default="now", help="search from ('now' or a date)")
    p.add_argument("--end", required=True, help="windows end by this date")
    p.add_argument("--min", type=int, default=1, help="hosts wanted at least")
    p.add_argument("--max", type=int, help="hosts wanted at most (default: min)")
    p.add_argument("--properties", help="resource_properties query")
    p.add_argument("--limit", type=int, default=3, help="windows wanted (at most 20)")
    add_client_options(p)
    p = availability_actions.add_parser("timeline", help="free hosts per bucket of time")
    p.add_argument("--start", default="now")
    p.add_argument("--end", required=True)
    p.add_argument("--bucket", type=int, default=3600, help="seconds per bucket")
    p.add_argument("--properties", help="resource_properties query")
    add_client_options(p)
    availability.set_defaults(func=availability_command)

    audit = sub.add_parser("audit", help="read the audit log (admin)")
    audit_actions = audit.add_subparsers(dest="action", required=True)
    p = audit_actions.add_parser("list", help="changes, oldest first")
    p.add_argument("--target-id")
    p.add_argument("--action", dest="action_name", help="e.g. lease.create, event.start_lease")
    p.add_argument("--since", help="'YYYY-MM-DD HH:MM' (UTC) or ISO 8601")
    p.add_argument("--limit", type=int)
    p.add_argument("--marker", help="the id of the last record of the previous page")
    add_client_options(p)
    audit.set_defaults(func=audit_command)
