"""What runs on a reservation's capacity in Nova: the servers of an instance reservation's
flavor, the servers on a host reservation's hosts; and whether any of them is in use
(``InspectUsage``, idle reclamation: docs/idle.md)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from climate.backends.base import Handover, Usage

HOSTS = "physical:host"
INSTANCES = "virtual:instance"
RESERVATION_PREFIX = "reservation"
IN_USE = "ACTIVE"
"""A server in use: running. One stopped, shelved, paused or in error uses nothing."""


def flavor_id(server: Any) -> str | None:
    """The id of the server's flavor, or for a reservation flavor the reservation id.

    From microversion 2.47 the flavor is embedded without its id; openstacksdk then answers its
    ``original_name`` (``reservation:<id>`` for Blazar's flavors) as ``id``."""
    flavor = server.flavor
    if flavor is None:
        return None
    prefix = f"{RESERVATION_PREFIX}:"
    for key in ("original_name", "id", "name"):
        found = flavor.get(key) if isinstance(flavor, Mapping) else getattr(flavor, key, None)
        if found and str(found).startswith(prefix):
            return str(found)[len(prefix) :]
    found = flavor.get("id") if isinstance(flavor, Mapping) else getattr(flavor, "id", None)
    return str(found) if found else None


def inspect_usage(conn: Any, handovers: Sequence[Handover]) -> Usage:
    """Per reservation: in use when an ACTIVE server runs on a host of its aggregate (host
    reservations: the aggregate named by the reservation id holds its hosts while it runs) or
    was booted with its flavor (instance reservations: flavor id = reservation id); None for a
    type whose use Nova does not show. One listing of the servers and the aggregates for all."""
    running = [
        s for s in conn.compute.servers(all_projects=True, status=IN_USE) if s.status == IN_USE
    ]
    busy_hosts = {s.compute_host for s in running if s.compute_host}
    busy_flavors = {flavor_id(s) for s in running}
    wanted = {h.reservation_id for h in handovers if h.resource_type == HOSTS}
    reserved: dict[str, set[str]] = {}
    if wanted:
        for aggregate in conn.compute.aggregates():
            if aggregate.name in wanted:
                reserved[aggregate.name] = set(aggregate.hosts or [])
    in_use: dict[str, bool | None] = {}
    for h in handovers:
        rid = h.reservation_id
        if h.resource_type == INSTANCES:
            in_use[rid] = rid in busy_flavors
        elif h.resource_type == HOSTS:
            in_use[rid] = bool(reserved.get(rid, set()) & busy_hosts)
        else:
            in_use[rid] = None
    return Usage(in_use)


def servers_of(conn: Any, h: Handover) -> list[Any]:
    """The servers running on the reservation's capacity: on its hosts (host reservation) or of
    its flavor (instance reservation)."""
    every = conn.compute.servers(all_projects=True)
    if h.resource_type == INSTANCES:
        return [s for s in every if flavor_id(s) == h.reservation_id]
    hosts = set(h.hosts.values())
    return [s for s in every if s.compute_host in hosts]


def kept(conn: Any, h: Handover) -> list[Any]:
    """What a keep-until-ack end kept: the project's stopped servers on the capacity."""
    if h.resource_type == INSTANCES:
        return servers_of(conn, h)
    return [s for s in servers_of(conn, h) if s.project_id == h.project_id]


def delete_servers(conn: Any, servers: Sequence[Any], seconds: float) -> None:
    """Each server deleted, and gone from the API within ``seconds``."""
    for server in servers:
        conn.compute.delete_server(server, ignore_missing=True)
    deadline = time.monotonic() + seconds
    for server in servers:
        while exists(conn, server.id):
            if time.monotonic() > deadline:
                raise TimeoutError(f"server {server.id} was not deleted in time")
            time.sleep(0.2)


def wait_for(conn: Any, servers: Sequence[Any], statuses: frozenset[str], seconds: float) -> None:
    """Until each server shows one of ``statuses`` (Nova's stop and shelve return before they
    are done; the hosts must not go back to the freepool before)."""
    deadline = time.monotonic() + seconds
    for server in servers:
        while (status := conn.compute.get_server(server.id).status) not in statuses:
            if status == "ERROR" or time.monotonic() > deadline:
                raise RuntimeError(
                    f"server {server.id} is {status}, not {'/'.join(sorted(statuses))}"
                )
            time.sleep(0.2)


def exists(conn: Any, server_id: str) -> bool:
    from openstack.exceptions import NotFoundException

    try:
        conn.compute.get_server(server_id)
    except NotFoundException:
        return False
    return True
