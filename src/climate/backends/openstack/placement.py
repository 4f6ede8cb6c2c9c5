"""Placement, as the openstack backend uses it: a reservation's resource class, and its
inventory on a ``blazar_<host>`` child provider of each host it holds (Blazar's scheme)."""

from __future__ import annotations

import time
from typing import Any

from climate.backends.base import UnknownResource

PLACEMENT_MICROVERSION = "1.29"


class Placement:
    """Placement's HTTP API through an openstacksdk connection."""

    def __init__(self, conn: Any, deletion_seconds: float) -> None:
        self.conn = conn
        self.deletion_seconds = deletion_seconds
        """How long a refused inventory deletion is tried again (a deleted server's allocations
        are released a moment after it is gone)."""

    def get(self, url: str) -> Any:
        response = self.conn.placement.get(url, microversion=PLACEMENT_MICROVERSION)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()

    def put(self, url: str, body: object) -> Any:
        response = self.conn.placement.put(
            url, json=body, microversion=PLACEMENT_MICROVERSION, raise_exc=False
        )
        if response.status_code >= 400:
            raise RuntimeError(f"Placement PUT {url}: {response.status_code} {response.text}")
        return response.json() if response.content else None

    def delete(self, url: str) -> None:
        response = self.conn.placement.delete(
            url, microversion=PLACEMENT_MICROVERSION, raise_exc=False
        )
        if response.status_code >= 400 and response.status_code != 404:
            raise RuntimeError(f"Placement DELETE {url}: {response.status_code} {response.text}")

    def provider(self, name: str) -> dict[str, Any] | None:
        found = self.get(f"/resource_providers?name={name}")
        providers = (found or {}).get("resource_providers", [])
        return dict(providers[0]) if providers else None

    def child(self, host: str) -> dict[str, Any]:
        """The ``blazar_<host>`` provider under the compute's own one, made if missing."""
        child = self.provider(f"blazar_{host}")
        if child is not None:
            return child
        parent = self.provider(host)
        if parent is None:
            raise UnknownResource(f"Placement has no resource provider named {host!r}")
        response = self.conn.placement.post(
            "/resource_providers",
            json={"name": f"blazar_{host}", "parent_provider_uuid": parent["uuid"]},
            microversion=PLACEMENT_MICROVERSION,
            raise_exc=False,
        )
        if response.status_code >= 400 and response.status_code != 409:
            raise RuntimeError(f"Placement: {response.status_code} {response.text}")
        made = self.provider(f"blazar_{host}")
        if made is None:
            raise RuntimeError(f"Placement did not make provider blazar_{host}")
        return made

    def set_inventory(self, host: str, rc: str, total: int) -> None:
        for _ in range(5):  # a concurrent writer bumps the generation: read it again
            child = self.child(host)
            base = f"/resource_providers/{child['uuid']}/inventories"
            body: dict[str, Any] = {
                "resource_provider_generation": child["generation"],
                "total": total,
            }
            if self.get(f"{base}/{rc}") is None:
                response = self.conn.placement.post(
                    base,
                    json={**body, "resource_class": rc},
                    microversion=PLACEMENT_MICROVERSION,
                    raise_exc=False,
                )
            else:
                response = self.conn.placement.put(
                    f"{base}/{rc}", json=body, microversion=PLACEMENT_MICROVERSION, raise_exc=False
                )
            if response.status_code != 409:
                break
        if response.status_code >= 400:
            raise RuntimeError(f"Placement inventory {rc} on {host}: {response.text}")

    def total(self, host: str, rc: str) -> int:
        child = self.provider(f"blazar_{host}")
        if child is None:
            return 0
        found = self.get(f"/resource_providers/{child['uuid']}/inventories/{rc}")
        return int(found["total"]) if found else 0

    def delete_inventory(self, host: str, rc: str) -> None:
        """The reservation's inventory on ``host`` removed. Placement refuses (409) while
        allocations use it: a deleted server's are released by its compute a moment after the
        server is gone from the API, so a refusal is tried again for a while."""
        child = self.provider(f"blazar_{host}")
        if child is None:
            return
        url = f"/resource_providers/{child['uuid']}/inventories/{rc}"
        deadline = time.monotonic() + self.deletion_seconds
        while True:
            response = self.conn.placement.delete(
                url, microversion=PLACEMENT_MICROVERSION, raise_exc=False
            )
            if response.status_code < 400 or response.status_code == 404:
                return
            if response.status_code != 409 or time.monotonic() > deadline:
                raise RuntimeError(
                    f"Placement DELETE {url}: {response.status_code} {response.text}"
                )
            time.sleep(0.2)

    def rc_exists(self, rc: str) -> bool:
        return self.get(f"/resource_classes/{rc}") is not None
