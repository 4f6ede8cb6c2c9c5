"""Unmet demand and planning (``GET /v1/demand``, docs/demand.md): the demand Climate refused
over a period, per resource type and properties and per bucket of time, beside the matching
hosts' utilisation; each refusal with whether its counter-offer was taken; and how many more
hosts like a template would have admitted a share of the refused host requests
(``planner.demand``)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import numpy.typing as npt

from climate.context import ServiceContext
from climate.db import demand as demand_rows
from climate.db import hosts as host_rows
from climate.db import timeline as timeline_rows
from climate.db.records import RefusedDemand
from climate.domain.actor import Actor
from climate.errors import InvalidInput
from climate.planner import demand as replaying
from climate.planner.calendar import seconds
from climate.planner.query import parse_query
from climate.services.demand_record import GAVE_UP, REFUSED, TIMED_OUT, USAGE_RULE
from climate.services.usage import Window

HOST_TYPE = host_rows.RESOURCE_TYPE
BUCKETS = {"hour": 3600, "day": 86_400}
HOUR_BUCKET_DAYS = 31
"""Hour buckets cover at most this many days."""
UNSERVED = (REFUSED, TIMED_OUT, GAVE_UP)
"""Outcomes counted as refused demand (a lapsed hold was admitted: it is listed, not counted)."""
TAKEN_WITHIN = dt.timedelta(hours=1)
OFFER_SLACK = dt.timedelta(minutes=1)
MAX_CELLS = 50_000_000
"""The most a replay may hold in memory (hosts x instants), in bytes."""
HOURS = Decimal("0.000001")


@dataclass(frozen=True)
class Bucket:
    start: dt.datetime
    refused: int
    """Refused requests whose window starts in the bucket."""
    refused_hours: Decimal
    """Unit-hours they asked for (``min`` units) within the bucket, whatever their start."""
    reserved_hours: Decimal | None
    capacity_hours: Decimal | None
    """Host-hours reserved on the hosts matching the properties, and those hosts' hours (host
    groups only)."""


@dataclass(frozen=True)
class Group:
    resource_type: str
    properties: str
    buckets: list[Bucket]


@dataclass(frozen=True)
class Asked:
    row: RefusedDemand
    taken: bool | None
    """Whether its counter-offer was taken (docs/demand.md); None: it had none."""


@dataclass(frozen=True)
class Planning:
    properties: str
    template: str
    """The host the synthetic hosts copy."""
    percent: int
    counted: int
    """Refused host requests the template matches: the share is of these."""
    replayed: int
    plan: replaying.Plan


@dataclass(frozen=True)
class Demand:
    window: Window
    bucket: str
    groups: list[Group]
    refusals: list[Asked]
    planning: Planning | None


@dataclass(frozen=True)
class Question:
    """What ``GET /v1/demand`` asks beside the period."""

    bucket: str = "day"
    resource_type: str | None = None
    properties: str | None = None
    target: int | None = None


def check(asked: Window, question: Question, known: Sequence[str]) -> None:
    """:raises InvalidInput: naming the field: an unknown bucket or resource type, hour buckets
    over more than ``HOUR_BUCKET_DAYS`` days, a target outside 1-100 or for another type than
    hosts, a malformed query, properties without a target."""
    if question.bucket not in BUCKETS:
        raise InvalidInput("bucket", f"must be hour or day, not {question.bucket!r}")
    if question.bucket == "hour" and asked.end - asked.start > dt.timedelta(days=HOUR_BUCKET_DAYS):
        raise InvalidInput("bucket", f"hour buckets cover at most {HOUR_BUCKET_DAYS} days")
    if question.resource_type is not None and question.resource_type not in known:
        raise InvalidInput("resource_type", f"unknown resource type {question.resource_type!r}")
    if question.target is None:
        if question.properties is not None:
            raise InvalidInput("target", "required with properties (the share to admit, in %)")
        return
    if not 1 <= question.target <= 100:
        raise InvalidInput("target", f"must be a percentage from 1 to 100, not {question.target}")
    if question.resource_type not in (None, HOST_TYPE):
        raise InvalidInput("resource_type", f"the replay adds hosts: only {HOST_TYPE}")
    parse_query("properties", question.properties)


class DemandService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def report(
        self, actor: Actor, asked: Window, question: Question, project_id: str | None = None
    ) -> Demand:
        """Refused demand over ``asked`` of ``project_id`` (or the caller's project; an admin
        naming none sees all), and the replay if ``question.target`` is given.

        :raises Forbidden: a member names another project.
        :raises InvalidInput: as ``check``; no host matches the properties; the replay would
            not fit in memory (``end``)."""
        scope = self.ctx.policy.scope(actor)
        wanted = project_id if project_id is not None else scope
        self.ctx.policy.enforce(
            actor, "climate:demand:get", {"project_id": wanted or actor.project_id}
        )
        check(asked, question, list(self.ctx.resource_types))
        with self.ctx.db.reader() as session:
            rows = demand_rows.overlapping(session, asked.start, asked.end, wanted)
            if question.resource_type is not None:
                rows = [r for r in rows if r.resource_type == question.resource_type]
            records = host_rows.reservable_records(session, host_rows.HOST_COLUMNS)
            counted = [r for r in rows if r.outcome in UNSERVED and r.reason != USAGE_RULE]
            hosts_wanted = [r for r in counted if r.resource_type == HOST_TYPE]
            low = min([asked.start, *(r.start_date for r in hosts_wanted)])
            high = max([asked.end, *(r.end_date for r in hosts_wanted)])
            allocations = timeline_rows.host_allocations(session, low, high)
            with_offers = [r for r in rows if r.offer is not None]
            leases = demand_rows.made_or_changed(
                session,
                {r.project_id for r in with_offers},
                min((r.at for r in with_offers), default=asked.start),
                max((r.at for r in with_offers), default=asked.start) + TAKEN_WITHIN,
            )
        edges = _edges(asked, BUCKETS[question.bucket])
        groups = _groups(counted, records, allocations, edges)
        planning = None
        if question.target is not None:
            planning = _planning(question, hosts_wanted, records, allocations)
        return Demand(
            asked, question.bucket, groups, [Asked(r, _taken(r, leases)) for r in rows], planning
        )


LeaseRow = tuple[str, str, dt.datetime, dt.datetime, dt.datetime, dt.datetime | None]


def _taken(row: RefusedDemand, leases: Sequence[LeaseRow]) -> bool | None:
    """Whether the project made (an update: the lease took) the offer's window, to the minute,
    within ``TAKEN_WITHIN`` of the refusal."""
    if row.offer is None:
        return None
    start = dt.datetime.fromisoformat(row.offer["start"])
    end = dt.datetime.fromisoformat(row.offer["end"])
    for lease_id, project, lease_start, lease_end, created, updated in leases:
        when = created if row.lease_id is None else updated
        if (
            project == row.project_id
            and (row.lease_id is None or lease_id == row.lease_id)
            and when is not None
            and row.at <= when <= row.at + TAKEN_WITHIN
            and abs(lease_start - start) <= OFFER_SLACK
            and abs(lease_end - end) <= OFFER_SLACK
        ):
            return True
    return False


FloatArray = npt.NDArray[np.float64]


def _edges(asked: Window, step: int) -> FloatArray:
    begin, finish = seconds(asked.start), seconds(asked.end)
    inner = np.arange(begin, finish, step, dtype=np.float64)
    return np.append(inner, finish)


def _overlaps(start: float, end: float, edges: FloatArray) -> FloatArray:
    """Seconds [start, end) has in each bucket."""
    found: FloatArray = np.clip(np.minimum(end, edges[1:]) - np.maximum(start, edges[:-1]), 0, None)
    return found


def _hours(value: float) -> Decimal:
    return (Decimal(repr(value)) / 3600).quantize(HOURS)


def _groups(
    counted: Sequence[RefusedDemand],
    records: Sequence[host_rows.HostRecord],
    allocations: Sequence[timeline_rows.Allocation],
    edges: FloatArray,
) -> list[Group]:
    by_key: dict[tuple[str, str], list[RefusedDemand]] = defaultdict(list)
    for row in counted:
        by_key[(row.resource_type, row.properties)].append(row)
    found = []
    for (resource_type, properties), rows in sorted(by_key.items()):
        starts = np.array([seconds(r.start_date) for r in rows], dtype=np.float64)
        numbers = np.histogram(starts, bins=edges)[0] if len(edges) > 1 else np.zeros(0)
        asked = np.zeros(len(edges) - 1)
        for r in rows:
            asked += r.count_min * _overlaps(seconds(r.start_date), seconds(r.end_date), edges)
        reserved: FloatArray | None = None
        capacity: FloatArray | None = None
        if resource_type == HOST_TYPE:
            query = parse_query("properties", properties)
            matching = {h.id for h in records if query.matches(h.properties)}
            reserved = np.zeros(len(edges) - 1)
            for host, start, end, amount, *_ in allocations:
                if host in matching and amount == 0:  # whole hosts
                    reserved += _overlaps(start, end, edges)
            capacity = len(matching) * np.diff(edges)
        found.append(
            Group(
                resource_type,
                properties,
                [
                    Bucket(
                        dt.datetime.fromtimestamp(float(edges[i]), dt.UTC),
                        int(numbers[i]),
                        _hours(float(asked[i])),
                        None if reserved is None else _hours(float(reserved[i])),
                        None if capacity is None else _hours(float(capacity[i])),
                    )
                    for i in range(len(edges) - 1)
                ],
            )
        )
    return found


def _planning(
    question: Question,
    wanted: Sequence[RefusedDemand],
    records: Sequence[host_rows.HostRecord],
    allocations: Sequence[timeline_rows.Allocation],
) -> Planning:
    assert question.target is not None
    properties = question.properties or ""
    query = parse_query("properties", properties)
    template = next((h for h in records if query.matches(h.properties)), None)
    if template is None:
        raise InvalidInput(
            "properties", "no reservable host matches: the replay adds copies of one that does"
        )
    busy: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for host, start, end, *_ in allocations:
        busy[host].append((float(start), float(end)))
    requests = []
    for row in wanted:
        queries = [
            parse_query("hypervisor_properties", row.params.get("hypervisor_properties", "")),
            parse_query("resource_properties", row.params.get("resource_properties", "")),
        ]
        requests.append(
            replaying.Wanted(
                seconds(row.start_date),
                seconds(row.end_date),
                row.count_min,
                row.count_max,
                frozenset(h.id for h in records if all(q.matches(h.properties) for q in queries)),
                all(q.matches(template.properties) for q in queries),
            )
        )
    replay = replaying.Replay(busy, requests)
    most = min(replaying.MOST_EXTRA, sum(w.max for w in requests if w.extra))
    if replaying.cells(replay, most) > MAX_CELLS:
        raise InvalidInput("end", "too many requests and allocations to replay: shorten the period")
    plan = replaying.least_extra(replay, question.target, most)
    return Planning(
        properties,
        template.hypervisor_hostname,
        question.target,
        sum(w.extra for w in requests),
        len(requests),
        plan,
    )
