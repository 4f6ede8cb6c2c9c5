"""Nova servers as the openstack backend sees them: those on a reservation's capacity, and
waiting for Nova to finish stopping, shelving or deleting them."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from climate.backends.base import Handover

INSTANCES = "virtual:instance"
RESERVATION_PREFIX = "reservation"


class Servers:
    """The servers of reservations, through an openstacksdk connection."""

    def __init__(self, conn: Any, wait_seconds: float) -> None:
        self.conn = conn
        self.wait_seconds = wait_seconds
        """How long Nova may take to stop, shelve or delete a server."""

    def of(self, h: Handover) -> Iterable[Any]:
        """The servers running on the reservation's capacity: on its hosts (host reservation)
        or of its flavor (instance reservation)."""
        if h.resource_type == INSTANCES:
            return [
                s
                for s in self.conn.compute.servers(all_projects=True)
                if flavor_id(s) == h.reservation_id
            ]
        hosts = set(h.hosts.values())
        return [s for s in self.conn.compute.servers(all_projects=True) if s.compute_host in hosts]

    def kept(self, h: Handover) -> Iterable[Any]:
        """What a keep-until-ack end kept: the project's stopped servers on the capacity."""
        if h.resource_type == INSTANCES:
            return self.of(h)
        return [s for s in self.of(h) if s.project_id == h.project_id]

    def delete(self, servers: list[Any]) -> None:
        for server in servers:
            self.conn.compute.delete_server(server, ignore_missing=True)
        deadline = time.monotonic() + self.wait_seconds
        for server in servers:
            while self.exists(server.id):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"server {server.id} was not deleted in time")
                time.sleep(0.2)

    def wait_for(self, servers: list[Any], statuses: frozenset[str]) -> None:
        """Until each server shows one of ``statuses`` (Nova's stop and shelve return before
        they are done; the hosts must not go back to the freepool before)."""
        deadline = time.monotonic() + self.wait_seconds
        for server in servers:
            while (status := self.conn.compute.get_server(server.id).status) not in statuses:
                if status == "ERROR" or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"server {server.id} is {status}, not {'/'.join(sorted(statuses))}"
                    )
                time.sleep(0.2)

    def exists(self, server_id: str) -> bool:
        from openstack.exceptions import NotFoundException

        try:
            self.conn.compute.get_server(server_id)
        except NotFoundException:
            return False
        return True


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
