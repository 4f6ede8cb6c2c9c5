"""What admission answers, as values: a lease admitted, or refused with its reason and the
counter-offers that would fit instead (docs/admission.md). The API renders them; nothing here
knows Blazar's JSON."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from climate.domain.requests import LeaseChanges, LeaseRequest
from climate.errors import NotEnoughCapacity, UsageRuleBroken
from climate.planner.availability import Shortfall

LeaseT = TypeVar("LeaseT")


@dataclass(frozen=True)
class Admitted(Generic[LeaseT]):
    """The shape fits: the lease as written in the caller's transaction."""

    lease: LeaseT


@dataclass(frozen=True)
class Refused:
    """The shape does not fit; the transaction that tried it has rolled back. Why, and what
    would fit instead, is found afterwards (``services.leases.offers``)."""

    message: str
    broken: UsageRuleBroken | None = None
    """Refused by a usage rule or the external hook: answered as it is, with no offers."""


@dataclass(frozen=True)
class Offer:
    kind: str
    """``later_start``, ``fewer_hosts`` or ``shorter`` (``CounterOffer``)."""
    start: dt.datetime
    end: dt.datetime
    counts: tuple[tuple[int, int], ...]
    """(min, max) per reservation, in request order."""
    below_request: bool


@dataclass(frozen=True)
class Refusal:
    """Why a window does not fit, with the offers that would."""

    start: dt.datetime
    end: dt.datetime
    shortfalls: tuple[Shortfall, ...]
    """For reservations whose type can be searched (every built-in type), in its units: hosts,
    items, instances of its size, volume GB."""
    unexplained: tuple[tuple[int, str], ...]
    """(index, resource type) of the others."""
    offers: tuple[Offer, ...]


@dataclass(frozen=True)
class Reshaped:
    """One live reservation of a lease being changed, as the change would leave it."""

    id: str
    resource_type: str
    params: Mapping[str, Any]
    """Its validated parameters after the change."""
    sent: Mapping[str, Any] | None
    """The fields the change gave it; None: not changed."""


@dataclass(frozen=True)
class Reshape:
    """The shape an update tried to admit for a lease."""

    lease_id: str
    current_start: dt.datetime
    current_end: dt.datetime
    start: dt.datetime
    end: dt.datetime
    started: bool
    reservations: tuple[Reshaped, ...]
    name: str = ""
    """The lease's name (as it stood)."""


@dataclass(frozen=True)
class UpdateOffer:
    kind: str
    """As ``Offer.kind``."""
    below_request: bool
    changes: LeaseChanges
    """The update to send instead, checked to be admitted when it was made."""


@dataclass(frozen=True)
class LeaseRefused:
    """A new lease refused, explained: the offers are lease bodies for ``request``."""

    message: str
    refusal: Refusal
    request: LeaseRequest
    params: tuple[Mapping[str, Any], ...]
    """Each reservation's validated parameters, in request order."""


@dataclass(frozen=True)
class UpdateRefused:
    """A lease update refused, explained: each offer is an update that was admitted when made."""

    message: str
    refusal: Refusal
    resource_types: tuple[str, ...]
    """Of the reservations ``refusal`` indexes."""
    offers: tuple[UpdateOffer, ...]


@dataclass(frozen=True)
class Skipped:
    """An occurrence of a series that did not fit, with the refusal a single lease would get."""

    occurrence: dt.datetime
    end: dt.datetime
    refused: LeaseRefused


@dataclass(frozen=True)
class SeriesRefused:
    """A series of which some occurrences (or all) do not fit, and nothing was created."""

    message: str
    skipped: tuple[Skipped, ...]


Explained = LeaseRefused | UpdateRefused | SeriesRefused


class AdmissionRefused(NotEnoughCapacity):
    """A refusal with its explanation, raised to the edge that renders it."""

    def __init__(self, refused: Explained) -> None:
        super().__init__(refused.message)
        self.refused = refused
