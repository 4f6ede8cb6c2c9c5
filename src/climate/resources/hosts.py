"""``physical:host``: whole compute hosts, reserved min..max at a time."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from climate import pricing
from climate.config import Settings
from climate.db import hosts as host_rows
from climate.db import locking, repacking
from climate.db.calendar_cache import CalendarCache
from climate.db.engine import Database
from climate.db.tables import Reservation
from climate.domain.status import EndPolicy
from climate.errors import InvalidInput, NotEnoughCapacity
from climate.planner.availability import (
    HostPlacer,
    HostRequest,
    SearchRange,
    Timeline,
    timeline,
)
from climate.planner.calendar import HostSet, moment
from climate.planner.hosts import HostDemand, HostsView, choose_hosts
from climate.planner.query import parse_query
from climate.planner.repack import Occupant, Repack, RepackDemand, Taken, plan
from climate.resources.base import (
    COUNT_TOO_SMALL,
    INVALID_RANGE,
    POLICY_FIELDS,
    ResourceType,
    before_end_field,
    changed_while_running,
    int_field,
    merged_fields,
    policy_fields,
)
from climate.resources.capabilities import WholeHosts
from climate.resources.wire_fields import COUNT, POSITIVE, QUERY, STRING, WireFields

RESOURCE_TYPE = "physical:host"
T = TypeVar("T")
MAX_REMEMBERED_QUERIES = 1024
FIELDS = (
    frozenset(
        {"min", "max", "hypervisor_properties", "resource_properties", "before_end", "count_range"}
    )
    | POLICY_FIELDS
    | {"reclaim"}
)


class Inventory:
    """This process's copy of the reservable hosts, reloaded when the inventory version moves.

    Admission reads one version number per request instead of every host and property row;
    the hosts matching a given pair of queries are remembered until the inventory changes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = -1
        self._records: list[host_rows.HostRecord] = []
        self._matches: dict[tuple[str, str], HostSet] = {}
        self._rates: dict[int, float] | None = None
        self._prices: dict[tuple[str, str], npt.NDArray[np.float64] | None] = {}
        self._derived: dict[object, object] = {}
        self.table = pricing.PriceTable({}, {})
        self.factor_property = ""

    def derived(
        self, session: Session, key: object, make: Callable[[list[host_rows.HostRecord]], T]
    ) -> T:
        """``make(records)``, kept under ``key`` until the inventory changes (what another
        resource type works out from the hosts for every admission)."""
        version = host_rows.inventory_version(session)
        with self._lock:
            self._refresh(session, version)
            if key in self._derived:
                return cast(T, self._derived[key])
            records = self._records
        found = make(records)
        with self._lock:
            if self._records is records:
                if len(self._derived) > MAX_REMEMBERED_QUERIES:
                    self._derived.clear()
                self._derived[key] = found
        return found

    def matching(
        self, session: Session, hypervisor_properties: str, resource_properties: str
    ) -> HostSet:
        version = host_rows.inventory_version(session)
        key = (hypervisor_properties, resource_properties)
        with self._lock:
            self._refresh(session, version)
            found = self._matches.get(key)
            if found is None:
                queries = [
                    parse_query("hypervisor_properties", hypervisor_properties),
                    parse_query("resource_properties", resource_properties),
                ]
                found = HostSet(
                    (r.id, r.hypervisor_hostname)
                    for r in self._records
                    if all(q.matches(r.properties) for q in queries)
                )
                if len(self._matches) > MAX_REMEMBERED_QUERIES:
                    self._matches.clear()
                self._matches[key] = found
            return found

    def prices(
        self, session: Session, hypervisor_properties: str, resource_properties: str
    ) -> npt.NDArray[np.float64] | None:
        """The price per hour of each host ``matching`` gives for these queries, as a quote
        prices it (the price table's premium or flat price, times the host's factor property),
        in its order; None when they all cost the same (or nothing)."""
        hosts = self.matching(session, hypervisor_properties, resource_properties)
        key = (hypervisor_properties, resource_properties)
        with self._lock:
            if key not in self._prices:
                rates = self._host_rates()
                found = np.array([rates.get(h, 0.0) for h in hosts.ids.tolist()], np.float64)
                self._prices[key] = None if np.all(found == found[:1]) else found
            return self._prices[key]

    def _host_rates(self) -> dict[int, float]:
        # Called holding the lock, once per inventory version.
        if self._rates is None:
            rates: dict[int, float] = {}
            for record in self._records:
                extras = {
                    k: str(v)
                    for k, v in record.properties.items()
                    if k not in host_rows.HOST_COLUMNS and v is not None
                }
                rate = self.table.price(RESOURCE_TYPE, extras)
                rates[record.id] = float(rate * pricing.factor(extras, self.factor_property))
            self._rates = rates
        return self._rates

    def records(self, session: Session) -> list[host_rows.HostRecord]:
        """Every reservable host with its columns and extra properties."""
        version = host_rows.inventory_version(session)
        with self._lock:
            self._refresh(session, version)
            return self._records

    def _refresh(self, session: Session, version: int) -> None:
        if version != self._version:
            self._records = host_rows.reservable_records(session, host_rows.HOST_COLUMNS)
            self._matches, self._rates, self._prices, self._derived = {}, None, {}, {}
            self._version = version


HOLD_ATTEMPTS = 3
"""Plans tried when leases a plan would move turn out to be starting (``hold_starts``)."""


class PhysicalHostType(ResourceType, WholeHosts):
    name = RESOURCE_TYPE
    books_per_resource = True
    fields = FIELDS
    # Blazar's ("" and "default" do nothing unless configured; "snapshot" images the servers),
    # and Climate's "notification" (the notification alone).
    before_end_actions = frozenset({"", "default", "snapshot", "notification"})
    end_policies = frozenset({EndPolicy.RELEASE, EndPolicy.DELETE, EndPolicy.SNAPSHOT})
    wire = WireFields(
        model="",
        asked={
            "min": COUNT,
            "max": COUNT,
            "count_range": {"type": "string", "pattern": r"^[0-9]+(-[0-9]+)?$"},
            "hypervisor_properties": QUERY,
            "resource_properties": QUERY,
        },
        shown={
            "min": POSITIVE,
            "max": POSITIVE,
            "hypervisor_properties": STRING,
            "resource_properties": STRING,
        },
        description="min and max are required, directly or through count_range",
    )

    inventory: Inventory

    def __init__(self) -> None:
        self.inventory = Inventory()
        self.calendar = CalendarCache()
        self.reoptimise_seconds = 0.0

    def configure(self, settings: Settings) -> None:
        self.reoptimise_seconds = settings.reoptimise_budget_ms / 1000
        self.inventory.table = pricing.PriceTable.parse(settings.prices)
        self.inventory.factor_property = settings.credits_factor_property

    def _reoptimise_deadline(self) -> float | None:
        """When re-optimisation gives up (it runs under the admission lock), None: never."""
        if not self.reoptimise_seconds:
            return None
        return time.monotonic() + self.reoptimise_seconds

    def validate(
        self, raw: Mapping[str, Any], current: Mapping[str, Any] | None, field: str
    ) -> dict[str, Any]:
        merged = merged_fields(self, raw, current)
        if "count_range" in merged:
            low, _, high = str(merged.pop("count_range")).partition("-")
            merged.setdefault("min", low)
            merged.setdefault("max", high or low)
        minimum = int_field(merged, "min", field, minimum=1, too_small=COUNT_TOO_SMALL)
        maximum = int_field(merged, "max", field, minimum=1, too_small=COUNT_TOO_SMALL)
        if maximum < minimum:
            raise InvalidInput(f"{field}.max", f"{INVALID_RANGE} (min {minimum}, max {maximum})")
        params: dict[str, Any] = {"min": minimum, "max": maximum}
        for key in ("hypervisor_properties", "resource_properties"):
            value = merged.get(key) or ""
            if not isinstance(value, str | list):
                raise InvalidInput(f"{field}.{key}", "must be a JSON query string")
            parse_query(f"{field}.{key}", value)
            params[key] = value if isinstance(value, str) else json.dumps(value)
        params["before_end"] = before_end_field(self.before_end_actions, merged, field)
        params.update(policy_fields(self, merged, field))
        if flag_field(merged, "reclaim", field, default=False):
            params["reclaim"] = True  # stored only when asked: Blazar's shape stays as it was
        return params

    def admit(
        self,
        session: Session,
        reservation: Reservation,
        start: dt.datetime,
        end: dt.datetime,
        *,
        active: bool,
        now: dt.datetime | None = None,
    ) -> None:
        params = reservation.params
        matching = self.inventory.matching(
            session, params["hypervisor_properties"], params["resource_properties"]
        )
        held = frozenset(current_hosts(reservation))
        since = changed_while_running(active, now, start, end)
        starts: dict[int, dt.datetime] = {}
        if since is not None:
            for a in reservation.allocations:
                if a.host_id in held and a.end_date > since:
                    starts[a.host_id] = min(a.start_date, starts.get(a.host_id, a.start_date))
        calendars = self.view(session, params, since or start, end, [reservation.id])
        demand = HostDemand(
            start=since or start,
            end=end,
            min=params["min"],
            max=params["max"],
            held=held,
            must_keep=held if active else frozenset(),
        )
        vacated = not held
        try:
            chosen = choose_hosts(demand, calendars)
        except NotEnoughCapacity:
            # Late binding: pending leases may exchange hosts for equivalent ones to make room.
            if now is None:
                raise
            busy = self.calendar.taken(session, matching, demand.start, end, [reservation.id])
            if Database.shares(session):
                # Moving other leases is for the exclusive mode, which stops every admission
                # while it runs: a search that finds no moves refuses here, beside the others.
                if self._moves(session, reservation, demand, matching, now, busy) is None:
                    raise
                raise locking.Contended("late binding moves other leases") from None
            if held:
                # Moves may hand this reservation's old hosts to others: give them up first, as
                # the planner already assumes (PostgreSQL checks overlaps statement by statement).
                self.calendar.replace(
                    session, reservation.id, reservation.lease_id, [], start, end, since=since
                )
                vacated = True
            if not self._repack(session, reservation, demand, matching, now, busy):
                raise
            calendars = self.view(session, params, demand.start, end, [reservation.id])
            chosen = choose_hosts(demand, calendars)
        allocations = self.calendar.replace(
            session,
            reservation.id,
            reservation.lease_id,
            chosen,
            start,
            end,
            fresh=vacated and since is None,
            since=since,
            starts=starts,
        )
        # The reservation may not be in the session (a new lease is written with Core inserts).
        set_committed_value(reservation, "allocations", allocations)

    def view(
        self,
        session: Session,
        params: Mapping[str, Any],
        start: dt.datetime,
        end: dt.datetime,
        exclude: Sequence[str] = (),
    ) -> HostsView:
        queries = (params["hypervisor_properties"], params["resource_properties"])
        matching = self.inventory.matching(session, *queries)
        view = self.calendar.view(session, matching, start, end, exclude)
        price = self.inventory.prices(session, *queries)
        return view if price is None else dataclasses.replace(view, price=price)

    def _repack(
        self,
        session: Session,
        reservation: Reservation,
        demand: HostDemand,
        matching: HostSet,
        now: dt.datetime,
        busy: Taken,
    ) -> bool:
        """Move pending reservations (planner/repack.py) so that ``demand`` fits; False if no
        allowed moves do."""
        fixed: set[str] = set()
        for _ in range(HOLD_ATTEMPTS):
            found = self._moves(session, reservation, demand, matching, now, busy, fixed)
            if found is None:
                return False
            moved = {m.lease_id for m in found.moves}
            starting = moved - repacking.hold_starts(session, moved)
            if not starting:
                break
            fixed |= starting  # a manager is starting them: plan again without moving them
        else:
            return False

        def replace(rid: str, lid: str, hosts: list[int], s: dt.datetime, e: dt.datetime) -> None:
            self.calendar.replace(session, rid, lid, hosts, s, e)

        repacking.apply(session, found.moves, replace)
        return True

    def _moves(
        self,
        session: Session,
        reservation: Reservation,
        demand: HostDemand,
        matching: HostSet,
        now: dt.datetime,
        busy: Taken,
        fixed: Collection[str] = (),
    ) -> Repack | None:
        """Moves of pending reservations, but those of the leases ``fixed``, that make room for
        ``demand`` (planner/repack.py), found within the re-optimisation budget; None if none
        are. Reads only."""
        matched: dict[tuple[str, str], frozenset[int]] = {}

        def eligible(params: dict[str, Any]) -> frozenset[int]:
            key = (params.get("hypervisor_properties", ""), params.get("resource_properties", ""))
            if key not in matched:
                matched[key] = frozenset(self.inventory.matching(session, *key).ids.tolist())
            return matched[key]

        calendar = self.calendar.synced(session)
        moments: dict[float, dt.datetime] = {}  # the search reads each span many times

        def at(when: float) -> dt.datetime:
            found = moments.get(when)
            if found is None:
                found = moments[when] = moment(when)
            return found

        def spans(host: int, s: dt.datetime, e: dt.datetime) -> list[Occupant]:
            found = calendar.overlapping(host, s.timestamp(), e.timestamp())
            return [(at(x.start), at(x.end), x.owner) for x in found]

        def counts(hosts: Collection[int], s: dt.datetime, e: dt.datetime) -> dict[int, int]:
            which = HostSet((h, "") for h in hosts)
            found = calendar.counts(which, s.timestamp(), e.timestamp())
            return dict(zip(which.ids.tolist(), found.tolist(), strict=True))

        def straight(most: int) -> list[int]:
            s, e = demand.start.timestamp(), demand.end.timestamp()
            found: list[int] = calendar.straight(matching, s, e, most, [reservation.id]).tolist()
            return found

        candidates = frozenset(matching.ids.tolist())
        wanted = RepackDemand(
            start=demand.start,
            end=demand.end,
            count=max(demand.min, len(demand.must_keep)),
            candidates=candidates,
            required=demand.must_keep,
            closed=len(candidates) == len(eligible({})),
        )
        world = repacking.DatabaseWorld(
            session, spans, counts, eligible, reservation.id, reservation.lease_id, set(fixed)
        )
        deadline = self._reoptimise_deadline()
        return plan(wanted, now, world, busy=busy, straight=straight, deadline=deadline)

    def release(self, session: Session, reservation: Reservation, at: dt.datetime) -> None:
        if all(a.end_date <= at for a in reservation.allocations):
            return  # the usual end: the allocations end with the lease
        self.calendar.truncate(session, reservation.id, at)
        session.refresh(reservation, ["allocations"])

    def resource_ids(self, reservation: Reservation) -> list[str]:
        return [str(h) for h in current_hosts(reservation)]

    @contextlib.contextmanager
    def searching(
        self,
        session: Session,
        reservations: Sequence[tuple[int, Mapping[str, Any]]],
        search: SearchRange,
    ) -> Iterator[HostPlacer]:
        """An availability search for validated reservations (position in the request,
        parameters), over the calendar as committed, held still until the search is done."""
        requests = [
            HostRequest(
                index,
                self.inventory.matching(
                    session, params["hypervisor_properties"], params["resource_properties"]
                ),
                params["min"],
                params["max"],
            )
            for index, params in reservations
        ]
        with self.calendar.reading(session) as calendar:
            yield HostPlacer(calendar, requests, search)

    def timeline(
        self,
        session: Session,
        hypervisor_properties: str,
        resource_properties: str,
        start: int,
        bucket: int,
        count: int,
    ) -> Timeline:
        """How many matching hosts are free, busy or partly busy per bucket (seconds)."""
        matching = self.inventory.matching(session, hypervisor_properties, resource_properties)
        with self.calendar.reading(session) as calendar:
            return timeline(calendar, matching, start, bucket, count)


def current_hosts(reservation: Reservation) -> list[int]:
    """The hosts a reservation holds to its end: a host healing took away keeps only the
    allocation of its past, which ends before the others (services/healing.py)."""
    if not reservation.allocations:
        return []
    last = max(a.end_date for a in reservation.allocations)
    return [a.host_id for a in reservation.allocations if a.end_date == last]


def flag_field(merged: Mapping[str, Any], key: str, field: str, *, default: bool) -> bool:
    """A true/false field: a JSON boolean, or its text as the blazar CLI sends it.

    :raises InvalidInput: naming ``field.key``.
    """
    value = merged.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = value.strip().lower() if isinstance(value, str) else None
    if text in ("true", "false"):
        return text == "true"
    raise InvalidInput(f"{field}.{key}", f"must be true or false, not {value!r}")
