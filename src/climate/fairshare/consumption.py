"""What the usage rules count, read for an admission: the allocations of a lease's owner and
project over the time the rules look at (one indexed statement, ``db/usage.py``), each with
its resource's properties and amounts; and every host's facts, kept per database until the
inventory version moves (docs/fair-share.md)."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from climate.context import ServiceContext
from climate.db import hosts as host_rows
from climate.db import usage as usage_rows
from climate.db.calendar_cache import Owned
from climate.db.engine import Database
from climate.fairshare.rules import COUNTED_KINDS, DURATION_KINDS, HOSTS, UNITS, Rule, Span
from climate.planner.query import MATCH_ALL
from climate.resources.capabilities import WholeHosts

LOG = logging.getLogger(__name__)
COUNTED_TYPES = frozenset().union(*UNITS.values())
HOST_BASED = frozenset({HOSTS, "virtual:instance"})
FLOATING, VOLUMES = "virtual:floatingip", "virtual:volume"
_KNOWN = "usage_host_facts"
_FACTS: weakref.WeakKeyDictionary[Database, _Facts] = weakref.WeakKeyDictionary()
_FACTS_LOCK = threading.Lock()


def needed_types(rules: Sequence[Rule]) -> frozenset[str]:
    """The resource types whose allocations the rules look at."""
    types: set[str] = set()
    for rule in rules:
        if rule.kind in DURATION_KINDS and rule.properties is MATCH_ALL:
            continue
        holders = UNITS[str(rule.unit)] if rule.kind in COUNTED_KINDS else COUNTED_TYPES
        types |= holders if rule.resource_type is None else holders & {rule.resource_type}
    return frozenset(types)


def spans(
    ctx: ServiceContext,
    session: Session,
    project_id: str,
    user_id: str,
    mine: tuple[float, float],
    ours: tuple[float, float] | None,
    types: frozenset[str],
    lease_id: str = "",
) -> tuple[list[Span], list[Span] | None]:
    """What ``user_id`` holds of ``types`` in ``project_id`` over ``mine`` and, unless None,
    what the whole project holds over ``ours``, with each resource's properties and amounts.
    ``lease_id``: a lease of theirs this transaction wrote. Whole hosts alone are read from the
    hosts' calendar when it can tell (an admission's transaction), else from the database."""

    def moment(seconds: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(seconds, dt.UTC)

    hosts_type = ctx.resource_types.get(HOSTS)
    if types == {HOSTS} and isinstance(hosts_type, WholeHosts):
        lease = (lease_id, project_id, user_id) if lease_id else None
        found = hosts_type.calendar.held(session, project_id, user_id, mine, ours, lease)
        if found is not None:
            return _host_spans(ctx, session, found, ours is not None)
    rows = usage_rows.held(
        session,
        project_id,
        user_id,
        (moment(mine[0]), moment(mine[1])),
        None if ours is None else (moment(ours[0]), moment(ours[1])),
        types,
    )
    hosts, amounts_of = host_facts(ctx, session) if types & HOST_BASED else ({}, {})
    items = usage_rows.item_properties(
        session, (r[3] for r in rows if r[0] == FLOATING) if FLOATING in types else ()
    )
    pools = usage_rows.pool_properties(
        session, (r[3] for r in rows if r[0] == VOLUMES) if VOLUMES in types else ()
    )
    users: list[Span] = []
    project: list[Span] | None = None if ours is None else []
    for kind, lease_id, user, what, start, end, amount, own in rows:
        if start >= end:
            continue  # cut at its start (deleted as it began): held nothing, as in the calendar
        if kind == HOSTS:
            props, amounts = hosts.get(what, {}), amounts_of.get(what, {})
        elif kind == "virtual:instance":
            props, amounts = hosts.get(what, {}), {"vcpus": float(amount)}
        elif kind == "virtual:floatingip":
            props, amounts = items[what], {"ips": 1.0}
        else:
            props, amounts = pools[what], {"gb": float(amount)}
        span = Span(lease_id, user, kind, props, amounts, start, end)
        if own:
            users.append(span)
        elif project is not None:
            project.append(span)
    return users, project


def _host_spans(
    ctx: ServiceContext, session: Session, found: Sequence[Owned], ours: bool
) -> tuple[list[Span], list[Span] | None]:
    """``spans`` of whole hosts from the hosts' calendar (``CalendarCache.held``)."""
    hosts, amounts_of = host_facts(ctx, session)
    users: list[Span] = []
    project: list[Span] | None = [] if ours else None
    for lease_id, user, host, start, end, own in found:
        span = Span(
            lease_id, user, HOSTS, hosts.get(host, {}), amounts_of.get(host, {}), start, end
        )
        if own:
            users.append(span)
        elif project is not None:
            project.append(span)
    return users, project


def _host_amounts(props: Mapping[str, Any], gpu: str) -> dict[str, float]:
    return {"hosts": 1.0, "vcpus": float(props.get("vcpus") or 0), "gpus": gpus(props, gpu)}


def gpus(properties: Mapping[str, Any], name: str) -> float:
    """A host's GPUs: its property ``name`` as a whole number; none without it (or when it is
    not a whole number, which is logged)."""
    value = properties.get(name)
    if value is None:
        return 0.0
    try:
        count = int(str(value))
    except ValueError:
        LOG.warning("host property %s=%r is not a whole number: counted as 0 GPUs", name, value)
        return 0.0
    return float(max(count, 0))


def host_facts(
    ctx: ServiceContext, session: Session
) -> tuple[Mapping[int, Mapping[str, Any]], Mapping[int, Mapping[str, float]]]:
    """Every host's properties as the usage rules see them (``_Facts.seen_by``) and what it
    counts as (hosts, vCPUs, GPUs), kept per database until the inventory version moves (read
    once per transaction)."""
    facts = _facts(ctx, session)
    return facts.seen_by(ctx.settings.rules), facts.amounts


def host_properties(ctx: ServiceContext, session: Session) -> Mapping[int, Mapping[str, str]]:
    """Every host's extra properties (those it has: no columns), as text, kept like
    ``host_facts`` (credits price a lease's hosts by them)."""
    return _facts(ctx, session).extras


@dataclass(frozen=True)
class _Facts:
    version: int
    gpu: str
    properties: Mapping[int, Mapping[str, Any]]
    amounts: Mapping[int, Mapping[str, float]]
    extras: Mapping[int, Mapping[str, str]]
    _seen: dict[int, tuple[Sequence[Rule], Mapping[int, Mapping[str, Any]]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def seen_by(self, rules: Sequence[Rule]) -> Mapping[int, Mapping[str, Any]]:
        """Each host's properties that some rule's scope names, as one mapping shared by the
        hosts that agree on all of them: a rule's scope test on one holds for all of them, and
        the evaluation tests it once per such mapping (``rules._Pool``), not once per host."""
        known = self._seen.get(id(rules))
        if known is not None and known[0] is rules:
            return known[1]
        names = sorted(frozenset().union(*(r.properties.properties() for r in rules)))
        shared: dict[tuple[Any, ...], Mapping[str, Any]] = {}
        seen: dict[int, Mapping[str, Any]] = {}
        for host, props in self.properties.items():
            values = tuple(props.get(n) for n in names)
            found = shared.get(values)
            if found is None:
                found = shared[values] = {
                    n: v for n, v in zip(names, values, strict=True) if v is not None
                }
            seen[host] = found
        self._seen[id(rules)] = (rules, seen)
        return seen


def _facts(ctx: ServiceContext, session: Session) -> _Facts:
    known = session.info.get(_KNOWN)
    if isinstance(known, _Facts):
        return known
    version = host_rows.inventory_version(session)
    gpu = ctx.settings.usage_gpu_property
    with _FACTS_LOCK:
        cached = _FACTS.get(ctx.db)
    if cached is None or (cached.version, cached.gpu) != (version, gpu):
        properties, extras = usage_rows.host_facts(session)
        amounts = {h: _host_amounts(props, gpu) for h, props in properties.items()}
        cached = _Facts(version, gpu, properties, amounts, extras)
        with _FACTS_LOCK:
            _FACTS[ctx.db] = cached
    session.info[_KNOWN] = cached
    return cached
