"""``climate host / lease / availability / audit ...``: friendly commands over the HTTP API."""

from __future__ import annotations

import argparse
import sys
from typing import Any
from urllib.parse import urlencode

from climate.cli.durations import EXAMPLES, seconds
from climate.cli.http import HOST, LEASE, ApiClient, add_client_options, connect, find_id, path_of
from climate.cli.lease_display import show_lease
from climate.cli.lease_types import add_lease_type_options, lease_type_fields
from climate.cli.output import (
    describe_capacity,
    describe_grant,
    emit,
    printable,
    record,
    show_dates,
    table,
)
from climate.cli.reservation_args import add_reservation_options, requested_reservations
from climate.cli.wait import add_wait_options, wait_active, wait_ended

DATE_HELP = "'YYYY-MM-DD HH:MM[:SS]' in UTC (or ISO 8601 with an offset)"
HOST_REF = "host id or name"
LEASE_REF = "lease id or name"
EXTRA = "a property; repeat it for several"
AMOUNTS = ("min", "max", "amount")
"""What ``lease update`` changes of a reservation: hosts' and devices' ``min``/``max``, the
``amount`` of instances, floating IPs, segments and volumes."""


def key_values(pairs: list[str], option: str = "--extra") -> dict[str, str]:
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: {option} wants key=value, not {pair!r}")
        found[key] = value
    return found


def show(args: argparse.Namespace, data: Any, columns: list[str] | None = None) -> None:
    """``data`` as ``-f`` asks: a table of ``columns`` (or of one object's fields), JSON, YAML."""
    if emit(args, data):
        return
    if columns is not None:
        print(table(data, columns))
    else:
        print(record(data))


def host_command(args: argparse.Namespace) -> None:
    api = connect(args)
    if args.action == "list":
        hosts = api.call("GET", "/os-hosts")["hosts"]
        show(args, hosts, ["id", "hypervisor_hostname", "vcpus", "memory_mb", "local_gb"])
        return
    if args.action == "create":
        body: dict[str, Any] = {"name": args.name, **key_values(args.extra)}
        show(args, api.call("POST", "/os-hosts", body)["host"])
        return
    if args.action == "update" and not args.extra:
        raise SystemExit("error: nothing to update; give --extra KEY=VALUE")
    path = path_of(HOST, find_id(api, HOST, args.host))
    if args.action == "show":
        show(args, api.call("GET", path)["host"])
    elif args.action == "update":
        show(args, api.call("PUT", path, key_values(args.extra))["host"])
    elif args.action == "delete":
        api.call("DELETE", path)
        print(f"Deleted host {printable(args.host)}")
    elif args.action in ("down", "up"):
        body = {"health": args.action}
        if args.action == "down" and args.reason is not None:
            body["reason"] = args.reason
        found = api.call("PUT", f"{path}/health", body)
        if emit(args, found):
            return
        healed = found.pop("healed")
        show(args, found)
        if healed:
            columns = ["lease_id", "reservation_id", "from_host", "to_host", "handed_over"]
            show(args, healed, columns)


def lease_command(args: argparse.Namespace) -> None:
    api = connect(args)
    if args.action == "list":
        leases = api.call("GET", "/leases")["leases"]
        columns = ["id", "name", "status", "lease_type", "start_date", "end_date"]
        if any(lease.get("queue_position") is not None for lease in leases):
            columns.append("queue_position")
        show(args, leases, columns)
        return
    if args.action == "create":
        if args.from_template:
            _create_from_template(api, args)
        else:
            _create_lease(api, args)
        return
    changes = _changes(args) if args.action == "update" else {}
    lease_id = find_id(api, LEASE, args.lease)
    path = path_of(LEASE, lease_id)
    if args.action == "show":
        show_lease(args, api, api.call("GET", path)["lease"])
    elif args.action == "update":
        for changed in changes.get("reservations", []):
            changed["id"] = changed["id"] or _only_reservation(api.call("GET", path)["lease"])
        show_lease(args, api, api.call("PUT", path, changes)["lease"])
    elif args.action == "delete":
        api.call("DELETE", path)
        print(f"Deleted lease {lease_id}")
    elif args.action in ("retry", "confirm"):
        show_lease(args, api, api.call("POST", f"{path}/{args.action}")["lease"])
    elif args.action == "force-end":
        body = {"skip_backend": args.skip_backend}
        show_lease(args, api, wait_ended(api, api.call("POST", f"{path}/force-end", body)["lease"]))
    elif args.action == "idle-exempt":
        state = api.call("PUT", f"{path}/idle", {"exempt": not args.off})["idle"]
        if not emit(args, state):
            never = "exempt from" if state["exempt"] else "watched by"
            print(f"lease {state['lease_id']}: {never} idle reclamation")
    elif args.action == "heartbeat":
        beat = api.call("POST", f"{path}/heartbeat")["heartbeat"]
        if not emit(args, beat):
            print(_heartbeat_line(beat))


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    """``lease update``'s body, its reservation's id left None when not given; asking for no
    change is refused here rather than sent."""
    given = {"name": args.name, "start_date": args.start, "end_date": args.end}
    changes = {field: value for field, value in given.items() if value is not None}
    amounts = {key: getattr(args, key) for key in AMOUNTS if getattr(args, key) is not None}
    if args.reservation_id is not None and not amounts:
        raise SystemExit("error: --reservation-id goes with --min, --max or --amount")
    if not changes and not amounts:
        raise SystemExit(
            "error: nothing to update; give --name, --start, --end, --min, --max or --amount"
        )
    if amounts:
        changes["reservations"] = [{"id": args.reservation_id, **amounts}]
    return changes


def _only_reservation(lease: dict[str, Any]) -> str:
    """The id of the lease's one reservation; with several, which one must be said."""
    reservations = lease["reservations"]
    if len(reservations) == 1:
        return str(reservations[0]["id"])
    listed = ", ".join(f"{r['id']} ({r['resource_type']})" for r in reservations)
    raise SystemExit(
        f"error: lease {lease['id']} has {len(reservations)} reservations; give "
        f"--reservation-id, one of {printable(listed)}"
    )


def _heartbeat_line(beat: dict[str, Any]) -> str:
    said = f"lease {beat['lease_id']}: in use at {beat['at']}"
    if beat["release_at"] is None:
        return show_dates(f"{said}; idle reclamation does not watch it")
    warned, ended = beat["warning_at"], beat["release_at"]
    return show_dates(f"{said}; if idle, warned at {warned} and ended at {ended} (UTC)")


def _create_lease(api: ApiClient, args: argparse.Namespace) -> None:
    """A lease of hosts (``--min``/``--max``/``--properties``) or of the ``--reservation``s."""
    body: dict[str, Any] = {
        "name": args.name,
        "reservations": requested_reservations(args),
        "events": [],
        **lease_type_fields(args),
    }
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
    if args.dry_run and args.wait:
        raise SystemExit("error: --wait and --dry-run cannot be combined")
    answer = api.call("POST", "/leases?dry_run=true" if args.dry_run else "/leases", body)
    _show_created(args, api, answer["lease"])
    if args.dry_run and args.format == "table":
        print("dry run: nothing was created")


def _show_created(args: argparse.Namespace, api: ApiClient, lease: dict[str, Any]) -> None:
    """A new lease, once ACTIVE with ``--wait``; exits 1 after showing it if it failed."""
    problem = None
    if args.wait:
        lease, problem = wait_active(api, lease, args.wait_timeout)
    show_lease(args, api, lease)
    if problem is not None:
        raise SystemExit(problem)


def _create_from_template(api: ApiClient, args: argparse.Namespace) -> None:
    """One lease for a Heat stack template (with the nested templates it names, given by
    ``--template-file``); the resources it does not reserve are warned about."""
    if args.end is None or args.duration is not None or args.dry_run:
        raise SystemExit("error: --from-template takes --start and --end (no window, no dry run)")
    if args.reservation:
        raise SystemExit("error: --from-template and --reservation cannot be combined")
    files = {
        name: _read(path, "--template-file")
        for name, path in key_values(args.template_file, "--template-file").items()
    }
    body = {
        "name": args.name,
        "start_date": args.start,
        "end_date": args.end,
        "template": _read(args.from_template, "--from-template"),
        "parameters": key_values(args.parameter, "--parameter"),
        **lease_type_fields(args),
    }
    if files:
        body["files"] = files
    answer = api.call("POST", "/leases/from-template", body)
    problem = None
    if args.wait:
        answer["lease"], problem = wait_active(api, answer["lease"], args.wait_timeout)
    if not emit(args, answer):
        show_lease(args, api, answer["lease"])
    for warning in answer["warnings"]:
        print(f"warning: {printable(str(warning))}", file=sys.stderr)
    if problem is not None:
        raise SystemExit(problem)


def _read(path: str, option: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise SystemExit(f"error: {option}: cannot read {path}: {exc}") from exc


def availability_command(args: argparse.Namespace) -> None:
    api = connect(args)
    if args.action == "search":
        body = {
            "reservations": requested_reservations(args),
            "duration": args.duration,
            "search_start": args.start,
            "search_end": args.end,
            "limit": args.limit,
        }
        windows = api.call("POST", "/availability", body)["windows"]
        if emit(args, windows):
            return
        print(table(_window_rows(windows), ["start_date", "end_date", "free", "grant", "type"]))
    elif args.action == "timeline":
        options = {
            "start": args.start,
            "end": args.end,
            "bucket": args.bucket,
            "resource_type": args.resource_type,
            "resource_properties": args.properties,
            "pool": args.pool,
            "vcpus": args.vcpus,
            "memory_mb": args.memory_mb,
            "disk_gb": args.disk_gb,
        }
        query = urlencode({k: v for k, v in options.items() if v is not None})
        found = api.call("GET", "/availability/timeline?" + query)["timeline"]
        if emit(args, found):
            return
        print(printable(describe_capacity(found)))
        shared = any("largest" in b for b in found["buckets"])  # GB or instances, not items
        counts = ["free", "largest"] if shared else ["free", "partly_busy", "busy"]
        print(table(found["buckets"], ["start_date", *counts]))


def _window_rows(windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per reservation of each window, the window's dates on its first: what is free
    in the reservation's units, and what it would get."""
    rows = []
    for window in windows:
        dates = {"start_date": window["start_date"], "end_date": window["end_date"]}
        for offered in window["reservations"]:
            grant, kind = describe_grant(offered), offered["resource_type"]
            rows.append({**dates, "free": offered["available"], "grant": grant, "type": kind})
            dates = {}
    return rows


def audit_command(args: argparse.Namespace) -> None:
    api = connect(args)
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
    show(args, records, columns)


def register(sub: Any) -> None:
    host = sub.add_parser("host", help="manage reservable hosts (admin)")
    host_actions = host.add_subparsers(dest="action", required=True)
    add_client_options(host_actions.add_parser("list", help="every host"))
    for action, text in (("show", "one host with its properties"), ("delete", "remove a host")):
        p = host_actions.add_parser(action, help=text)
        p.add_argument("host", help=HOST_REF)
        add_client_options(p)
    p = host_actions.add_parser("create", help="register a host, reservable at once")
    p.add_argument("name", help="its hypervisor hostname (as Nova names it)")
    p.add_argument("--extra", action="append", default=[], metavar="KEY=VALUE", help=EXTRA)
    add_client_options(p)
    p = host_actions.add_parser("update", help="change or add a host's properties")
    p.add_argument("host", help=HOST_REF)
    p.add_argument("--extra", action="append", default=[], metavar="KEY=VALUE", help=EXTRA)
    add_client_options(p)
    p = host_actions.add_parser(
        "down", help="mark a host down: unreservable, its reservations healed (docs/healing.md)"
    )
    p.add_argument("host", help=HOST_REF)
    p.add_argument("--reason", help="why it is down")
    add_client_options(p)
    p = host_actions.add_parser("up", help="mark a host back up: reservable again")
    p.add_argument("host", help=HOST_REF)
    add_client_options(p)
    host.set_defaults(func=host_command)

    lease = sub.add_parser("lease", help="create and manage leases")
    lease_actions = lease.add_subparsers(dest="action", required=True)
    add_client_options(lease_actions.add_parser("list", help="the leases you may see"))
    for action, text in (
        ("show", "one lease with its reservations and events"),
        ("delete", "delete a lease (ending it first if it is active)"),
    ):
        p = lease_actions.add_parser(action, help=text)
        p.add_argument("lease", help=LEASE_REF)
        add_client_options(p)
    p = lease_actions.add_parser("create", help="reserve hosts or other resources for a window")
    p.add_argument("name", help="the lease's name (unique among the project's live leases)")
    p.add_argument("--start", default="now", help=f"'now' (the default) or {DATE_HELP}")
    p.add_argument(
        "--end", help=f"{DATE_HELP}; required unless --duration and --latest-end are given"
    )
    p.add_argument(
        "--duration",
        type=seconds,
        help=f"a flexible window: this long ({EXAMPLES}), at the earliest start that fits "
        "between --earliest-start and --latest-end",
    )
    p.add_argument("--earliest-start", default="now", help="with --duration: from this date")
    p.add_argument("--latest-end", help="with --duration: ending by this date")
    p.add_argument("--dry-run", action="store_true", help="show what would happen; create nothing")
    add_reservation_options(p)
    add_lease_type_options(p)
    p.add_argument(
        "--template-file",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a nested template the --from-template stack names as a resource type",
    )
    p.add_argument(
        "--from-template",
        metavar="STACK.yaml",
        help="reserve what a Heat (HOT) template needs instead of hosts (docs/resources.md)",
    )
    p.add_argument(
        "--parameter", action="append", default=[], metavar="KEY=VALUE", help="a template parameter"
    )
    add_wait_options(p)
    add_client_options(p)
    p = lease_actions.add_parser(
        "update", help="rename a lease, move its start, extend or shrink it, change its amounts"
    )
    p.add_argument("lease", help=LEASE_REF)
    p.add_argument("--name", help="a new name")
    p.add_argument("--start", help=f"a new start, {DATE_HELP} (a lease not yet started)")
    p.add_argument("--end", help=f"a new end, {DATE_HELP}")
    p.add_argument("--min", type=int, help="hosts or devices wanted at least")
    p.add_argument("--max", type=int, help="hosts or devices wanted at most")
    p.add_argument(
        "--amount", type=int, help="instances, floating IPs, network segments or volumes wanted"
    )
    p.add_argument(
        "--reservation-id",
        help="the reservation --min, --max or --amount change (needed when the lease has several)",
    )
    add_client_options(p)
    p = lease_actions.add_parser("confirm", help="confirm a held lease: it starts as planned")
    p.add_argument("lease", help=LEASE_REF)
    add_client_options(p)
    p = lease_actions.add_parser(
        "heartbeat", help="tell idle reclamation a running lease is in use now (docs/idle.md)"
    )
    p.add_argument("lease", help=LEASE_REF)
    add_client_options(p)
    p = lease_actions.add_parser(
        "idle-exempt", help="never warn nor release a lease for idleness (admin; docs/idle.md)"
    )
    p.add_argument("lease", help=LEASE_REF)
    p.add_argument("--off", action="store_true", help="watch it again")
    add_client_options(p)
    p = lease_actions.add_parser("retry", help="run a lease's failed events again (admin)")
    p.add_argument("lease", help=LEASE_REF)
    add_client_options(p)
    p = lease_actions.add_parser(
        "force-end", help="end a lease now (admin); shows it once the manager has ended it"
    )
    p.add_argument("lease", help=LEASE_REF)
    p.add_argument(
        "--skip-backend",
        action="store_true",
        help="terminate it and free its hosts without the backend (when the backend keeps failing)",
    )
    add_client_options(p)
    lease.set_defaults(func=lease_command)

    availability = sub.add_parser("availability", help="when resources are free")
    availability_actions = availability.add_subparsers(dest="action", required=True)
    p = availability_actions.add_parser("search", help="the earliest windows a lease would fit")
    p.add_argument("--duration", type=seconds, required=True, help=f"how long: {EXAMPLES}")
    p.add_argument("--start", default="now", help=f"search from 'now' (the default) or {DATE_HELP}")
    p.add_argument("--end", required=True, help=f"windows end by this date, {DATE_HELP}")
    add_reservation_options(p)
    p.add_argument("--limit", type=int, default=3, help="windows wanted (at most 20)")
    add_client_options(p)
    p = availability_actions.add_parser("timeline", help="free capacity per bucket of time")
    p.add_argument("--start", default="now", help=f"from 'now' (the default) or {DATE_HELP}")
    p.add_argument("--end", required=True, help=f"up to {DATE_HELP}")
    p.add_argument(
        "--bucket", type=seconds, default=3600, help="how long a bucket is, e.g. 3600 or 1h"
    )
    p.add_argument(
        "--resource-type", help="physical:host (default), virtual:instance, virtual:volume, ..."
    )
    p.add_argument("--properties", help="resource_properties query")
    p.add_argument(
        "--pool",
        help="items: a floating IP's network, a segment's physical network; "
        "volumes: the pool's name",
    )
    p.add_argument("--vcpus", type=int, help="instances: the size counted (with --memory-mb)")
    p.add_argument("--memory-mb", type=int, help="instances: the size counted")
    p.add_argument("--disk-gb", type=int, help="instances: the size counted (default 0)")
    add_client_options(p)
    availability.set_defaults(func=availability_command)

    audit = sub.add_parser("audit", help="read the audit log (admin)")
    audit_actions = audit.add_subparsers(dest="action", required=True)
    p = audit_actions.add_parser("list", help="changes, oldest first")
    p.add_argument("--target-id", help="only the changes of this lease, host...")
    p.add_argument("--action", dest="action_name", help="e.g. lease.create, event.start_lease")
    p.add_argument("--since", help=DATE_HELP)
    p.add_argument("--limit", type=int, help="records per page")
    p.add_argument("--marker", help="the id of the last record of the previous page")
    add_client_options(p)
    audit.set_defaults(func=audit_command)
