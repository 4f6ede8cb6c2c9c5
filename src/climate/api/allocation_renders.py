"""Allocations as the allocation endpoints show them, and each host's kept as JSON while its
rows stay as they are (``db/allocation_listing.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from climate.db.allocation_listing import NO_END, Shown
from climate.jsontext import encode
from climate.services.hosts import HostAllocations


def allocation(resource_id: int, rows: Sequence[Shown], *extra: str) -> dict[str, object]:
    """One resource's allocations as Blazar shows them; each reservation also shows the
    ``extra`` fields of its row (a volume's ``size_gb``, an instance ``count``)."""
    reservations = [
        {
            "id": row.reservation_id,
            "lease_id": row.lease_id,
            "start_date": row.start_date,
            "end_date": row.end_date,
        }
        for row in rows
    ]
    if extra:
        for shown, row in zip(reservations, rows, strict=True):
            shown.update((name, getattr(row, name)) for name in extra)
    return {"resource_id": str(resource_id), "reservations": reservations}


class AllocationRenders:
    """Each host's allocations as JSON, with the stamp of the rows it shows, the ``since`` it
    was made for and the earliest end it shows: the same bytes answer any later ``since``
    before that end, while the stamp holds."""

    def __init__(self, *extra: str) -> None:
        self._extra = extra
        """Fields each reservation shows beyond Blazar's four (``allocation``)."""
        self._kept: dict[int, tuple[int, str, str, bytes]] = {}

    def body(self, found: Sequence[HostAllocations]) -> bytes:
        """``{"allocations": [...]}`` as ``JSONResponse`` writes it."""
        parts = []
        for host in found:
            if host.stamp is None:
                parts.append(encode(allocation(host.host_id, host.reservations, *self._extra)))
                continue
            kept = self._kept.get(host.host_id)
            if kept is not None and kept[0] == host.stamp and kept[1] <= host.since < kept[2]:
                parts.append(kept[3])
                continue
            piece = encode(allocation(host.host_id, host.reservations, *self._extra))
            until = min((row.end_date for row in host.reservations), default=NO_END)
            self._kept[host.host_id] = (host.stamp, host.since, until, piece)
            parts.append(piece)
        return b'{"allocations":[' + b",".join(parts) + b"]}"
