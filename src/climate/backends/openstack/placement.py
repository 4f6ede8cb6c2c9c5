"""Placement as Blazar's instance reservations use it: a custom resource class per reservation
(``CUSTOM_RESERVATION_<ID>``) and its inventory on a child provider ``blazar_<host>`` of each
reserved compute. Placement answers races with 409s (a provider's generation moved) and, on
MySQL, with a few stranger answers; each call here tries again where the answer allows."""

from __future__ import annotations

import random
import time
from typing import Any

from climate.backends.base import UnknownResource

PLACEMENT_MICROVERSION = "1.29"
CONFLICT_ATTEMPTS = 20


def resource_class(reservation_id: str) -> str:
    """Blazar's custom resource class of an instance reservation."""
    return "CUSTOM_RESERVATION_" + reservation_id.upper().replace("-", "_")


class Placement:
    """Placement through an openstacksdk connection's ``placement`` proxy."""

    def __init__(self, conn: Any, deletion_seconds: float) -> None:
        self.api = conn.placement
        self.deletion_seconds = deletion_seconds
        """How long a deleted server's allocations may keep an inventory in use."""

    def get(self, url: str) -> Any:
        response = self.api.get(url, microversion=PLACEMENT_MICROVERSION)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()

    def put(self, url: str, body: object) -> Any:
        response = self.api.put(
            url, json=body, microversion=PLACEMENT_MICROVERSION, raise_exc=False
        )
        if response.status_code >= 400:
            raise RuntimeError(f"Placement PUT {url}: {response.status_code} {response.text}")
        return response.json() if response.content else None

    def delete(self, url: str) -> None:
        response = self.api.delete(url, microversion=PLACEMENT_MICROVERSION, raise_exc=False)
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
        response = self.api.post(
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

    def make_resource_class(self, rc: str) -> None:
        """Custom resource class ``rc``, made if missing and then seen. Placement on MySQL may
        answer 204 ("exists") to a PUT that lost a race for the next class id to another one's:
        it reads the primary key's duplicate entry as the name's, and makes nothing."""
        for attempt in range(CONFLICT_ATTEMPTS):
            if attempt:
                time.sleep(random.uniform(0, 0.05 * attempt))
            self.put(f"/resource_classes/{rc}", None)
            if self.rc_exists(rc):
                return
        raise RuntimeError(f"Placement did not make resource class {rc}")

    def set_inventory(self, host: str, rc: str, total: int) -> None:
        for attempt in range(CONFLICT_ATTEMPTS):
            # A concurrent writer (another reservation's start, nova-compute) bumped the
            # provider's generation: read it again, after a short random pause. Placement may
            # also not know a resource class made a moment ago by this very start: each of its
            # threads caches the classes and refreshes the cache from its own snapshot of the
            # database, which under concurrent starts can predate the class (400).
            if attempt:
                time.sleep(random.uniform(0, 0.05 * attempt))
            child = self.child(host)
            base = f"/resource_providers/{child['uuid']}/inventories"
            body: dict[str, Any] = {
                "resource_provider_generation": child["generation"],
                "total": total,
            }
            if self.get(f"{base}/{rc}") is None:
                response = self.api.post(
                    base,
                    json={**body, "resource_class": rc},
                    microversion=PLACEMENT_MICROVERSION,
                    raise_exc=False,
                )
            else:
                response = self.api.put(
                    f"{base}/{rc}", json=body, microversion=PLACEMENT_MICROVERSION, raise_exc=False
                )
            if response.status_code == 400 and "No such resource class" in response.text:
                self.make_resource_class(rc)
                continue
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

    def delete_inventory(self, host: str, rc: str, *, in_use_ok: bool = False) -> None:
        """The reservation's inventory on ``host`` removed. Placement refuses (409) while
        allocations use it: a deleted server's are released by its compute a moment after the
        server is gone from the API, so a refusal is tried again for a while; ``in_use_ok``:
        a refusal leaves it (servers still running on a failed host hold it)."""
        child = self.provider(f"blazar_{host}")
        if child is None:
            return
        url = f"/resource_providers/{child['uuid']}/inventories/{rc}"
        deadline = time.monotonic() + self.deletion_seconds
        while True:
            response = self.api.delete(url, microversion=PLACEMENT_MICROVERSION, raise_exc=False)
            if response.status_code < 400 or response.status_code == 404:
                return
            if response.status_code == 409 and in_use_ok:
                return
            if response.status_code != 409 or time.monotonic() > deadline:
                raise RuntimeError(
                    f"Placement DELETE {url}: {response.status_code} {response.text}"
                )
            time.sleep(0.2)

    def holders(self, rc: str) -> set[str]:
        """Hosts whose ``blazar_<host>`` provider has room of ``rc`` left: those the
        reservation holds, and any a heal left it on (a failed host's inventory, which its
        servers' allocations kept Placement from deleting then)."""
        if not self.rc_exists(rc):
            return set()
        found = self.get(f"/resource_providers?resources={rc}:1")
        names = (p["name"] for p in (found or {}).get("resource_providers", []))
        return {n.removeprefix("blazar_") for n in names if n.startswith("blazar_")}

    def rc_exists(self, rc: str) -> bool:
        return self.get(f"/resource_classes/{rc}") is not None
