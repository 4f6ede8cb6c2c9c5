"""``climate device / network / floatingip / volume-pool / instance ...``: the inventories of
the resource types other than hosts, and what is reserved of each, over the HTTP API."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from climate.cli.client import key_values, show
from climate.cli.http import HOST, ApiClient, Kind, add_client_options, connect, find_id, path_of
from climate.cli.output import emit, table


@dataclass(frozen=True)
class Inventory:
    """One inventory API as the command line sees it."""

    command: str
    path: str
    """Under /v1; also the list's key, except for volume pools."""
    key: str
    """The key of one object in an answer."""
    columns: tuple[str, ...]
    """What ``list`` shows."""
    create: Callable[[argparse.Namespace], dict[str, Any]]
    """The create body's own fields, from the command's arguments."""
    list_key: str = ""
    name_field: str = "name"
    """The field ``show``, ``update``... find an object by, beside its id."""
    pool_field: str | None = None
    """The field its name is unique within (``Kind.pool_field``)."""

    @property
    def kind(self) -> Kind:
        list_key = self.list_key or self.path
        return Kind(
            self.command,
            f"/{self.path}",
            list_key,
            self.name_field,
            numbered=True,
            pool_field=self.pool_field,
        )

    def listed(self, answer: dict[str, Any]) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = answer[self.list_key or self.path]
        return found


def _network(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"segment_id": args.segment_id}
    if args.physical_network is not None:
        body["physical_network"] = args.physical_network
    if args.network_type is not None:
        body["network_type"] = args.network_type
    return body


INVENTORIES = (
    Inventory(
        "device",
        "devices",
        "device",
        ("id", "name", "reservable"),
        lambda args: {"name": args.name},
    ),
    Inventory(
        "network",
        "networks",
        "network",
        ("id", "physical_network", "segment_id", "network_type", "reservable"),
        _network,
        name_field="segment_id",
        pool_field="physical_network",
    ),
    Inventory(
        "floatingip",
        "floatingips",
        "floatingip",
        ("id", "floating_network_id", "floating_ip_address", "reservable"),
        lambda args: {"floating_network_id": args.network, "floating_ip_address": args.address},
        name_field="floating_ip_address",
        pool_field="floating_network_id",
    ),
    Inventory(
        "volume-pool",
        "volume-pools",
        "volume_pool",
        ("id", "name", "capacity_gb", "reservable"),
        lambda args: {"name": args.name, "capacity_gb": args.capacity_gb},
        list_key="volume_pools",
    ),
)


def _query(args: argparse.Namespace, names: dict[str, str]) -> str:
    """The query string of the options in ``names`` (option dest -> query parameter) given."""
    given = {param: getattr(args, dest) for dest, param in names.items()}
    found = {k: v for k, v in given.items() if v is not None}
    return "?" + urlencode(found) if found else ""


PAGE = {"limit": "limit", "marker": "marker"}
FILTERS = {
    "lease_id": "lease_id",
    "reservation_id": "reservation_id",
    "start": "start_date",
    "end": "end_date",
}


def _properties(args: argparse.Namespace) -> dict[str, Any]:
    """``--extra`` pairs, ``--unset`` keys (sent as null, which removes them) and
    ``--reservable``."""
    body: dict[str, Any] = dict(key_values(args.extra))
    for key in getattr(args, "unset", []):
        body[key] = None
    if args.reservable is not None:
        body["reservable"] = args.reservable == "true"
    return body


def inventory_command(args: argparse.Namespace) -> None:
    inventory: Inventory = args.inventory
    api = connect(args)
    base = f"/{inventory.path}"
    if args.action == "list":
        names = {**PAGE, "sort_key": "sort_key", "sort_dir": "sort_dir"}
        found = inventory.listed(api.call("GET", base + _query(args, names)))
        show(args, found, list(inventory.columns))
        return
    if args.action == "create":
        body = {**_properties(args), **inventory.create(args)}
        show(args, api.call("POST", base, body)[inventory.key])
        return
    if args.action == "allocations" and args.id is None:
        allocations_command(args, api, f"{base}/allocations", "")
        return
    item_id = find_id(api, inventory.kind, args.id)
    path = path_of(inventory.kind, item_id)
    if args.action == "show":
        show(args, api.call("GET", path)[inventory.key])
    elif args.action == "update":
        body = _properties(args)
        if getattr(args, "capacity_gb", None) is not None:
            body["capacity_gb"] = args.capacity_gb
        if not body:
            raise SystemExit("error: nothing to update; give --extra, --unset or --reservable")
        show(args, api.call("PUT", path, body)[inventory.key])
    elif args.action == "delete":
        api.call("DELETE", path)
        print(f"Deleted {inventory.command} {item_id}")
    elif args.action == "allocations":
        allocations_command(args, api, f"{base}/allocations", f"{path}/allocation")


def allocations_command(args: argparse.Namespace, api: ApiClient, many: str, one: str) -> None:
    """One resource's allocations (at ``one``, when ``ID`` is given) or a page of resources
    with theirs (at ``many``), one row per reservation."""
    if args.id is not None:
        found = [api.call("GET", one + _query(args, FILTERS))["allocation"]]
    else:
        found = api.call("GET", many + _query(args, {**FILTERS, **PAGE}))["allocations"]
    if emit(args, found[0] if args.id is not None else found):
        return
    rows = [
        {"resource_id": a["resource_id"], "reservation_id": r["id"], **r}
        for a in found
        for r in a["reservations"]
    ]
    columns = ["resource_id", "lease_id", "reservation_id", "start_date", "end_date"]
    columns += [c for c in ("count", "size_gb") if any(c in row for row in rows)]
    print(table(rows, columns))


def instance_command(args: argparse.Namespace) -> None:
    api = connect(args)
    many = "/instances/allocations"
    one = "" if args.id is None else f"{many}/{find_id(api, HOST, args.id)}"
    allocations_command(args, api, many, one)


def _allocation_options(p: argparse.ArgumentParser, resource: str, named: str) -> None:
    p.add_argument("id", nargs="?", help=f"only this {resource}'s allocations ({named})")
    p.add_argument("--lease-id", help="only this lease's")
    p.add_argument("--reservation-id", help="only this reservation's")
    p.add_argument("--start", help="from this date on (default now)")
    p.add_argument("--end", help="up to this date")
    p.add_argument("--limit", type=int, help=f"{resource}s per page")
    p.add_argument("--marker", help=f"the last {resource} id of the previous page")
    add_client_options(p)


def _property_options(p: argparse.ArgumentParser, *, updating: bool) -> None:
    p.add_argument(
        "--extra", action="append", default=[], metavar="KEY=VALUE", help="a property; repeatable"
    )
    p.add_argument("--reservable", choices=("true", "false"), help="whether leases may take it")
    if updating:
        p.add_argument(
            "--unset", action="append", default=[], metavar="KEY", help="remove a property"
        )
    add_client_options(p)


def _create_arguments(inventory: Inventory, p: argparse.ArgumentParser) -> None:
    if inventory.command == "network":
        p.add_argument("segment_id", help="e.g. a VLAN id")
        p.add_argument("--physical-network", help="e.g. physnet1")
        p.add_argument("--network-type", help="e.g. vlan or vxlan (required by the API)")
    elif inventory.command == "floatingip":
        p.add_argument("network", help="the floating network's id")
        p.add_argument("address", help="the floating IP address")
    else:
        p.add_argument("name", help=f"the {inventory.command}'s name")
    if inventory.command == "volume-pool":
        p.add_argument("--capacity-gb", type=int, required=True, help="the pool's size")


def register(sub: Any) -> None:
    for inventory in INVENTORIES:
        noun = inventory.command
        named = f"id or {inventory.name_field.replace('_', ' ')}"
        if inventory.pool_field is not None:
            named += f" (or {inventory.pool_field.replace('_', ' ')}/{inventory.name_field})"
        parser = sub.add_parser(noun, help=f"manage {inventory.path} (admin)")
        actions = parser.add_subparsers(dest="action", required=True)
        p = actions.add_parser("list", help=f"the {inventory.path}, a page at a time")
        p.add_argument("--limit", type=int, help="per page")
        p.add_argument("--marker", help=f"the last {noun} id of the previous page")
        p.add_argument("--sort-key", help="id, name or created_at")
        p.add_argument("--sort-dir", choices=("asc", "desc"), help="ascending or descending")
        add_client_options(p)
        for action, text in (("show", f"one {noun}"), ("delete", f"remove a {noun}")):
            p = actions.add_parser(action, help=text)
            p.add_argument("id", help=f"the {noun}'s {named}")
            add_client_options(p)
        p = actions.add_parser("create", help=f"register a {noun}")
        _create_arguments(inventory, p)
        _property_options(p, updating=False)
        p = actions.add_parser("update", help=f"change a {noun}'s properties")
        p.add_argument("id", help=f"the {noun}'s {named}")
        if inventory.command == "volume-pool":
            p.add_argument("--capacity-gb", type=int, help="the pool's new size")
        _property_options(p, updating=True)
        p = actions.add_parser("allocations", help=f"what leases hold of each {noun}")
        _allocation_options(p, noun, named)
        parser.set_defaults(func=inventory_command, inventory=inventory)

    instance = sub.add_parser("instance", help="instance reservations per host")
    actions = instance.add_subparsers(dest="action", required=True)
    p = actions.add_parser("allocations", help="the instance reservations of each host")
    _allocation_options(p, "host", "id or name")
    instance.set_defaults(func=instance_command)
