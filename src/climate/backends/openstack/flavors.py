"""An instance reservation's Nova side, as Blazar's ``plugins/instances`` makes it: the private
flavor ``reservation:<id>`` (id = the reservation id) that only the reservation's aggregate and
inventory can host, and the server group of its affinity rule."""

from __future__ import annotations

from typing import Any

from climate.backends.base import Handover
from climate.backends.openstack.placement import resource_class
from climate.backends.openstack.servers import RESERVATION_PREFIX

FLAVOR_EXTRA_SPEC = "aggregate_instance_extra_specs:reservation"


def find_flavor(conn: Any, flavor_id: str) -> Any:
    from openstack.exceptions import NotFoundException

    try:
        return conn.compute.get_flavor(flavor_id)
    except NotFoundException:
        return None


def make_flavor(conn: Any, h: Handover, group_id: str | None) -> Any:
    """The reservation's flavor, made if missing, with its extra specs set."""
    rid = h.reservation_id
    flavor = find_flavor(conn, rid)
    if flavor is None:
        flavor = conn.compute.create_flavor(
            id=rid,
            name=f"{RESERVATION_PREFIX}:{rid}",
            vcpus=int(h.params["vcpus"]),
            ram=int(h.params["memory_mb"]),
            disk=int(h.params["disk_gb"]),
            is_public=False,
        )
    specs = {FLAVOR_EXTRA_SPEC: rid, f"resources:{resource_class(rid)}": "1"}
    if group_id is not None:
        specs["affinity_id"] = group_id
    conn.compute.create_flavor_extra_specs(flavor, specs)
    return flavor


def drop_flavor(conn: Any, h: Handover, *, keep: bool) -> None:
    """The project's access to the flavor revoked; the flavor deleted too unless ``keep``."""
    flavor = find_flavor(conn, h.reservation_id)
    if flavor is None:
        return
    try:
        conn.compute.flavor_remove_tenant_access(flavor, h.project_id)
    except Exception as exc:
        if "404" not in str(exc) and "not found" not in str(exc).lower():
            raise
    if not keep:
        conn.compute.delete_flavor(flavor, ignore_missing=True)


def find_server_group(conn: Any, rid: str) -> str | None:
    """The id of reservation ``rid``'s server group, in whichever project made it."""
    for group in conn.compute.server_groups(all_projects=True):
        if group.name == f"{RESERVATION_PREFIX}:{rid}":
            return str(group.id)
    return None


def drop_server_group(conn: Any, rid: str) -> None:
    for group in conn.compute.server_groups(all_projects=True):
        if group.name == f"{RESERVATION_PREFIX}:{rid}":
            conn.compute.delete_server_group(group, ignore_missing=True)
