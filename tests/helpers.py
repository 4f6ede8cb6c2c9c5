"""Small builders shared by the tests."""

from __future__ import annotations

import datetime as dt
from typing import Any

from climate import wire
from climate.domain.admission import AdmissionRefused
from climate.services.hosts import HostService
from climate.services.leases import LeaseRequest, LeaseService, ReservationRequest
from tests.conftest import ADMIN


def refusal_body(error: BaseException) -> dict[str, Any]:
    """What the API adds to the error body of ``error``, an explained refusal."""
    assert isinstance(error, AdmissionRefused)
    return wire.refused(error.refused)


def nothing_kept(lease_id: str, revision: int, place: int | None) -> bytes | None:
    """A caller of ``list_revised`` or ``get_revised`` that keeps no lease: all are loaded."""
    return None


def queue_places(leases: LeaseService) -> dict[str, int]:
    """Each waiting lease's place in the queue, as a listing shows it."""
    return {x.id: x.place for x in leases.list_revised(ADMIN, nothing_kept) if x.place}


def add_hosts(hosts: HostService, count: int, **props: Any) -> list[int]:
    prefix = props.pop("prefix", "compute")
    return [hosts.create(ADMIN, f"{prefix}-{i}", dict(props)).id for i in range(count)]


def host_request(
    name: str,
    start: dt.datetime | None,
    end: dt.datetime,
    min_hosts: int = 1,
    max_hosts: int | None = None,
    resource_properties: str = "",
    before_end: dt.datetime | None = None,
) -> LeaseRequest:
    fields: dict[str, Any] = {
        "min": min_hosts,
        "max": max_hosts if max_hosts is not None else min_hosts,
        "hypervisor_properties": "",
        "resource_properties": resource_properties,
    }
    return LeaseRequest(
        name=name,
        start=start,
        end=end,
        before_end=before_end,
        reservations=[ReservationRequest("physical:host", fields)],
    )


def hosts_of(lease: Any) -> set[int]:
    return {a.host_id for r in lease.reservations for a in r.allocations}
