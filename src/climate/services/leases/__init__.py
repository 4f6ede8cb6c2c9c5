"""Lease use cases, one module each: creating (``create``), changing and deleting (``change``),
holds (``holds``) and the waiting queue (``queue``), all admitting through one pipeline
(``admission``), refusals explained after it (``offers``)."""

from climate.domain.requests import LeaseChanges, LeaseRequest, ReservationRequest
from climate.services.leases.change import Changing
from climate.services.leases.create import Checked, Creating, Trial
from climate.services.leases.listing import Listing
from climate.services.leases.queue import Queue

__all__ = [
    "Checked",
    "LeaseChanges",
    "LeaseRequest",
    "LeaseService",
    "ReservationRequest",
    "Trial",
]


class LeaseService(Creating, Changing, Queue, Listing):
    """Every lease use case, on one service context."""
