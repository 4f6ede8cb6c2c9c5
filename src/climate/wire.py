"""Blazar v1 wire shapes: the one place that knows its JSON field names and date formats.

The API renders responses with these functions and notifications carry the same shapes, so a
webhook receiver sees a lease exactly as ``GET /v1/leases/{id}`` shows it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from climate.db.tables import Event, Host, HostAllocation, Lease, Reservation
from climate.resources.hosts import HOST_COLUMNS

LEASE_DATE_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"
STAMP_FORMAT = "%Y-%m-%d %H:%M:%S"


def lease_date(value: dt.datetime) -> str:
    """Blazar's lease date: naive UTC with microseconds (the blazar CLI parses exactly this)."""
    return value.astimezone(dt.UTC).strftime(LEASE_DATE_FORMAT)


def stamp(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).strftime(STAMP_FORMAT)


def lease(row: Lease) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "start_date": lease_date(row.start_date),
        "end_date": lease_date(row.end_date),
        "status": row.status,
        "status_reason": row.status_reason,
        "degraded": row.degraded,
        "user_id": row.user_id,
        "project_id": row.project_id,
        "trust_id": row.trust_id,
        "created_at": stamp(row.created_at),
        "updated_at": stamp(row.updated_at),
        "reservations": [reservation(r) for r in row.reservations],
        "events": [event(e) for e in row.events],
    }


def reservation(row: Reservation) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": row.id,
        "lease_id": row.lease_id,
        "status": row.status,
        "missing_resources": row.missing_resources,
        "resources_changed": row.resources_changed,
        "resource_id": row.resource_id,
        "resource_type": row.resource_type,
    }
    body.update(row.params)
    body["allocations"] = [allocation(a) for a in row.allocations]
    body["created_at"] = stamp(row.created_at)
    body["updated_at"] = stamp(row.updated_at)
    return body


def allocation(row: HostAllocation) -> dict[str, Any]:
    return {
        "resource_id": str(row.host_id),
        "start_date": lease_date(row.start_date),
        "end_date": lease_date(row.end_date),
    }


def event(row: Event) -> dict[str, Any]:
    return {
        "id": row.id,
        "lease_id": row.lease_id,
        "status": row.status,
        "event_type": row.event_type,
        "time": lease_date(row.time),
        "attempts": row.attempts,
        "last_error": row.last_error,
        "created_at": stamp(row.created_at),
        "updated_at": stamp(row.updated_at),
    }


def host(row: Host) -> dict[str, Any]:
    body: dict[str, Any] = {"id": str(row.id)}
    body.update({c: getattr(row, c) for c in HOST_COLUMNS})
    body.update(
        {
            "reservable": row.reservable,
            "status": row.status,
            "trust_id": row.trust_id,
            "created_at": stamp(row.created_at),
            "updated_at": stamp(row.updated_at),
        }
    )
    body.update({p.name: p.value for p in row.properties})
    return body
