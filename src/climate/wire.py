"""Blazar v1 wire shapes: the one place that knows its JSON field names and date formats.

The API renders responses with these functions and notifications carry the same shapes, so a
webhook receiver sees a lease exactly as ``GET /v1/leases/{id}`` shows it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from climate.db import hosts as host_rows
from climate.db.leases import reminder_offsets
from climate.db.tables import (
    Host,
    Item,
    Lease,
    LeaseSeries,
    VolumePool,
)
from climate.domain import formats
from climate.domain.admission import SeriesRefused, UpdateRefused
from climate.domain.status import EndPolicy
from climate.domain.views import (
    EventView,
    HostAllocationView,
    InstanceAllocationView,
    ItemAllocationView,
    LeaseView,
    ReservationView,
    VolumeAllocationView,
)
from climate.resources import shown
from climate.resources.base import ACKNOWLEDGED_AT, STARTED_AT, end_policy_of, start_policy_of
from climate.resources.kinds import Kind

if TYPE_CHECKING:
    from climate.domain.admission import (
        Explained,
        LeaseRefused,
        Offer,
        Refusal,
        Skipped,
    )
    from climate.domain.requests import LeaseChanges, LeaseRequest

STAMP_FORMAT = "%Y-%m-%d %H:%M:%S"

lease_date = formats.lease_date
duration = formats.duration


def stamp(value: dt.datetime | None) -> str | None:
    """``STAMP_FORMAT``, written as ``formats.lease_date`` is, for speed."""
    if value is None:
        return None
    return formats.in_utc(value).isoformat(" ", "seconds")[:19]


def lease(row: LeaseView, queue_position: int | None = None) -> dict[str, Any]:
    """A lease as Blazar shows it, with Climate's own fields after (Blazar clients ignore
    them): its type, queue priority and position, attempts, deadline and hold expiry, its
    before-end instant and reminders, and the series it belongs to."""
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
        "lease_type": row.lease_type,
        "priority": row.priority,
        "queue_position": queue_position,
        "attempts": row.attempts,
        "retries": row.max_attempts,
        "next_attempt_at": _optional_date(row.next_attempt_at),
        "deadline": _optional_date(row.deadline),
        "hold_expires_at": _optional_date(row.hold_expires_at),
        "before_end_date": _optional_date(row.before_end_date),
        "reminders": [duration(o) for o in reminder_offsets(row)],
        "series_id": row.series_id,
        "occurrence": _optional_date(row.occurrence),
        "requested_window": _requested_window(row),
    }


def _requested_window(row: LeaseView) -> dict[str, Any] | None:
    """The flexible window a lease was placed in; None for a lease asked with fixed dates."""
    if row.requested_latest_end is None or row.requested_earliest_start is None:
        return None
    return {
        "earliest_start": lease_date(row.requested_earliest_start),
        "latest_end": lease_date(row.requested_latest_end),
        "duration": row.requested_duration_seconds,
    }


def series(row: LeaseSeries, leases: Sequence[Lease] | None = None) -> dict[str, Any]:
    """A lease series (docs/series.md); with its leases, each live occurrence and the
    instants of those cancelled."""
    body: dict[str, Any] = {
        "id": row.id,
        "name": row.name,
        "project_id": row.project_id,
        "user_id": row.user_id,
        "rrule": row.rrule,
        "exdates": [lease_date(dt.datetime.fromisoformat(at)) for at in row.exdates],
        "start_date": lease_date(row.first_start),
        "end_date": lease_date(row.first_start + dt.timedelta(seconds=row.duration_seconds)),
        "duration": row.duration_seconds,
        "reservations": row.body["reservations"],
        "before_end_offset": _optional_duration(row.body.get("before_end_offset")),
        "reminders": [duration(dt.timedelta(seconds=s)) for s in row.body.get("reminders") or []],
        "created_at": stamp(row.created_at),
        "updated_at": stamp(row.updated_at),
    }
    if leases is not None:
        body["occurrences"] = [
            {
                "lease_id": lease.id,
                "occurrence": _optional_date(lease.occurrence),
                "start_date": lease_date(lease.start_date),
                "end_date": lease_date(lease.end_date),
                "status": lease.status,
            }
            for lease in leases
            if lease.deleted_at is None
        ]
        body["cancelled"] = [
            _optional_date(lease.occurrence) for lease in leases if lease.deleted_at is not None
        ]
    return body


def skipped_occurrence(found: Skipped) -> dict[str, Any]:
    """An occurrence of a series that did not fit, with the refusal a lease would get."""
    return {
        "occurrence": lease_date(found.occurrence),
        "end_date": lease_date(found.end),
        "error_message": found.refused.message,
        **lease_refusal(found.refused),
    }


def _optional_duration(seconds: int | None) -> str | None:
    return None if seconds is None else duration(dt.timedelta(seconds=seconds))


def _optional_date(value: dt.datetime | None) -> str | None:
    return None if value is None else lease_date(value)


def reservation(row: ReservationView) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": row.id,
        "lease_id": row.lease_id,
        "status": row.status,
        "missing_resources": row.missing_resources,
        "resources_changed": row.resources_changed,
        **({"missing_hosts": row.missing_hosts} if row.missing_hosts else {}),
        "resource_id": row.resource_id,
        "resource_type": row.resource_type,
    }
    body.update(row.params)
    body.update(policies(row.params))
    body.update(shown(row))
    # A reservation has allocations in its own type's table only.
    body["allocations"] = [
        *(allocation(a) for a in row.allocations),
        *(item_allocation(a) for a in row.item_allocations),
        *(volume_allocation(a) for a in row.volume_allocations),
        *(instance_allocation(a) for a in row.instance_allocations),
    ]
    body["created_at"] = stamp(row.created_at)
    body["updated_at"] = stamp(row.updated_at)
    return body


def policies(params: Mapping[str, Any]) -> dict[str, Any]:
    """A reservation's start and end policies (the defaults when not given) and what its
    project did under them: ``started_at`` (a manual start), ``acknowledged`` and
    ``acknowledged_at`` (a keep-until-ack end; ``acknowledged`` is null for other policies)."""
    end = end_policy_of(params)
    acknowledged_at = params.get(ACKNOWLEDGED_AT)
    return {
        "start_policy": str(start_policy_of(params)),
        "end_policy": str(end),
        "started_at": _stored_date(params.get(STARTED_AT)),
        "acknowledged": acknowledged_at is not None if end is EndPolicy.KEEP_UNTIL_ACK else None,
        "acknowledged_at": _stored_date(acknowledged_at),
    }


def _stored_date(value: str | None) -> str | None:
    return None if value is None else lease_date(dt.datetime.fromisoformat(value))


def allocation(row: HostAllocationView) -> dict[str, Any]:
    return {
        "resource_id": str(row.host_id),
        "start_date": lease_date(row.start_date),
        "end_date": lease_date(row.end_date),
    }


def item_allocation(row: ItemAllocationView) -> dict[str, Any]:
    return {
        "resource_id": str(row.item_id),
        "start_date": lease_date(row.start_date),
        "end_date": lease_date(row.end_date),
    }


def volume_allocation(row: VolumeAllocationView) -> dict[str, Any]:
    return {
        "resource_id": str(row.pool_id),
        "start_date": lease_date(row.start_date),
        "end_date": lease_date(row.end_date),
    }


def instance_allocation(row: InstanceAllocationView) -> dict[str, Any]:
    return {
        "resource_id": str(row.host_id),
        "count": row.count,
        "start_date": lease_date(row.start_date),
        "end_date": lease_date(row.end_date),
    }


def event(row: EventView) -> dict[str, Any]:
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
    body.update({c: getattr(row, c) for c in host_rows.HOST_COLUMNS})
    body.update(
        {
            "availability_zone": "",  # Blazar's column; an extra property of that name shows
            # As Blazar shows it: false while the host is down; ``health`` says why.
            "reservable": row.reservable and row.health == "up",
            "status": row.status,
            "trust_id": row.trust_id,
            "health": row.health,
            "health_reason": row.health_reason,
            "health_since": stamp(row.health_since),
            "created_at": stamp(row.created_at),
            "updated_at": stamp(row.updated_at),
        }
    )
    body.update({p.name: p.value for p in row.properties})
    return body


def item(row: Item, kind: Kind) -> dict[str, Any]:
    """A device, network segment or floating IP: its pool and name under the kind's field
    names, then its extra properties."""
    body: dict[str, Any] = {"id": str(row.id)}
    if kind.pool_field is not None:
        body[kind.pool_field] = row.pool
    body[kind.name_field] = row.name
    body.update(
        {
            "reservable": row.reservable,
            "created_at": stamp(row.created_at),
            "updated_at": stamp(row.updated_at),
        }
    )
    body.update(dict.fromkeys(kind.shown))
    body.update({p.name: p.value for p in row.properties})
    return body


def volume_pool(row: VolumePool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(row.id),
        "name": row.name,
        "capacity_gb": row.capacity_gb,
        "reservable": row.reservable,
        "created_at": stamp(row.created_at),
        "updated_at": stamp(row.updated_at),
    }
    body.update({p.name: p.value for p in row.properties})
    return body


BUSY_UNTIL_SHOWN = 10


def refused(found: Explained) -> dict[str, Any]:
    """What an explained refusal adds to the 409's error body (docs/admission.md)."""
    if isinstance(found, SeriesRefused):
        return {"conflicts": [skipped_occurrence(s) for s in found.skipped]}
    if isinstance(found, UpdateRefused):
        return update_refusal(found)
    return lease_refusal(found)


def lease_refusal(found: LeaseRefused) -> dict[str, Any]:
    """The ``reason`` and ``offers`` added to a refused lease's error body: counts and times
    only, never another lease, project or resource identity."""
    request, params = found.request, found.params
    return {
        "reason": reason(found.refusal, [r.resource_type for r in request.reservations]),
        "offers": [offer(o, found.refusal, request, params) for o in found.refusal.offers],
    }


def update_refusal(found: UpdateRefused) -> dict[str, Any]:
    """The ``reason`` and ``offers`` added to a refused update's error body: each offer's
    ``lease`` is a body for ``PUT /v1/leases/{id}``."""
    return {
        "reason": reason(found.refusal, found.resource_types),
        "offers": [
            {"kind": m.kind, "below_request": m.below_request, "lease": changes_body(m.changes)}
            for m in found.offers
        ],
    }


def changes_body(changes: LeaseChanges) -> dict[str, Any]:
    """A lease update as ``PUT /v1/leases/{id}`` takes it: only the fields it changes."""
    body: dict[str, Any] = {}
    if changes.name is not None:
        body["name"] = changes.name
    if changes.start_now:
        body["start_date"] = "now"
    elif changes.start is not None:
        body["start_date"] = lease_date(changes.start)
    if changes.end is not None:
        body["end_date"] = lease_date(changes.end)
    if changes.before_end is not None:
        body["before_end_date"] = lease_date(changes.before_end)
    if changes.before_end_offset is not None:
        body["before_end_offset"] = duration(changes.before_end_offset)
    if changes.reminders is not None:
        body["reminders"] = [duration(o) for o in changes.reminders]
    if changes.reservations:
        body["reservations"] = [{"id": r.id, **r.fields} for r in changes.reservations]
    return body


def reason(found: Refusal, resource_types: Sequence[str | None]) -> dict[str, Any]:
    """Why a lease's reservations (of ``resource_types``, in order) do not fit its window."""
    reasons: list[dict[str, Any]] = [
        {"index": i, "resource_type": kind, "rule": "unexplained"} for i, kind in found.unexplained
    ]
    for s in found.shortfalls:
        until: dict[float, int] = {}
        for t in s.released:
            until[t] = until.get(t, 0) + 1
        enough = s.enough_free_by
        reasons.append(
            {
                "index": s.index,
                "resource_type": resource_types[s.index],
                "rule": s.rule,
                "min": s.min,
                "max": s.max,
                "matching": s.matching,
                "free": s.free,
                "available": s.available,
                "busy": s.matching - s.free,
                "busy_until": [
                    {"date": lease_date(_utc(t)), "count": n}
                    for t, n in list(until.items())[:BUSY_UNTIL_SHOWN]
                ],
                "enough_free_by": None if enough is None else lease_date(_utc(enough)),
            }
        )
    return {
        "start_date": lease_date(found.start),
        "end_date": lease_date(found.end),
        "reservations": sorted(reasons, key=lambda r: int(r["index"])),
    }


def offer(
    made: Offer, found: Refusal, request: LeaseRequest, params: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """One counter-offer: what it changes, and a lease body to post as is."""
    shift = made.start - found.start
    body: dict[str, Any] = {
        "name": request.name,
        "start_date": "now"
        if request.start is None and shift == dt.timedelta(0)
        else lease_date(made.start),
        "end_date": lease_date(made.end),
        "reservations": [
            {"resource_type": r.resource_type, **p, **_counts(p, low, high)}
            for r, p, (low, high) in zip(request.reservations, params, made.counts, strict=True)
        ],
        "events": [],
    }
    if request.before_end is not None and made.start <= request.before_end + shift <= made.end:
        body["before_end_date"] = lease_date(request.before_end + shift)
    length = made.end - made.start
    if request.before_end_offset is not None and request.before_end_offset <= length:
        body["before_end_offset"] = duration(request.before_end_offset)
    if request.reminders:
        body["reminders"] = [duration(o) for o in request.reminders if o < length]
    return {"kind": made.kind, "below_request": made.below_request, "lease": body}


def _counts(params: Mapping[str, Any], low: int, high: int) -> dict[str, int]:
    """An offer's counts in the reservation's own fields: ``min``..``max``, else ``amount``."""
    if "min" in params:
        return {"min": low, "max": high}
    return {"amount": high} if "amount" in params else {}


def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)
