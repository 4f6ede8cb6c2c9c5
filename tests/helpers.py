"""Small builders shared by the tests."""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from climate import wire
from climate.backends.standalone import StandaloneBackend
from climate.config import load_settings
from climate.db.engine import Database
from climate.domain.admission import AdmissionRefused
from climate.domain.clock import ManualClock
from climate.manager.service import Manager
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseRequest, LeaseService, ReservationRequest
from tests.conftest import ADMIN, T0


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


@dataclass
class World:
    """The services over one database, on a manual clock."""

    db: Database
    clock: ManualClock
    ctx: ServiceContext
    leases: LeaseService
    hosts: HostService
    manager: Manager


@contextmanager
def world_on_copy(template: Path) -> Iterator[World]:
    """The services over a copy of the migrated SQLite ``template`` (a hypothesis example's
    own database), at ``T0``, with one host of 8 vCPUs."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "climate.db"
        shutil.copy(template, path)
        db = Database(f"sqlite:///{path}")
        clock = ManualClock(T0)
        ctx = build_context(load_settings(env={}, event_retry_base_seconds=0.0), db, clock)
        world = World(
            db, clock, ctx, LeaseService(ctx), HostService(ctx), Manager(ctx, StandaloneBackend())
        )
        world.hosts.create(ADMIN, "node-0", {"vcpus": 8})
        try:
            yield world
        finally:
            db.dispose()
