"""The usage rules and the external admission hook where leases are admitted: ``admit`` is
the one call each admission makes once its lease holds its resources in the transaction;
``check_request`` refuses a new lease that breaks a rule of its window alone before anything
is written (docs/fair-share.md)."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from climate import wire
from climate.addresses import BUS_PREFIX
from climate.context import ServiceContext
from climate.db import audit, locking, outbox
from climate.db.tables import Lease
from climate.domain.actor import Actor
from climate.errors import UsageRuleBroken
from climate.fairshare import external
from climate.fairshare.consumption import host_facts, needed_types, spans
from climate.fairshare.rules import (
    COUNTED_KINDS,
    HOSTS,
    Admission,
    Decision,
    Kind,
    Rule,
    Span,
    evaluate,
    reach,
)
from climate.planner.query import MATCH_ALL
from climate.resources.capabilities import WholeHosts

LOG = logging.getLogger(__name__)
CREATE, UPDATE, CONFIRM, QUEUE = "create", "update", "confirm", "queue"
_TRIAL: ContextVar[bool] = ContextVar("climate_usage_trial", default=False)


@contextlib.contextmanager
def trial() -> Iterator[None]:
    """Admissions inside are tries (an offer checked as the update it is): rules decide as
    always, but nothing is recorded and the external service is not asked."""
    token = _TRIAL.set(True)
    try:
        yield
    finally:
        _TRIAL.reset(token)


def trying() -> bool:
    """Whether this admission is a try (inside ``trial``): nothing of it is recorded."""
    return _TRIAL.get()


def check_request(
    ctx: ServiceContext,
    actor: Actor,
    resource_types: Sequence[str | None],
    start: dt.datetime,
    end: dt.datetime,
    now: dt.datetime,
) -> None:
    """The rules of a new lease's window alone (length, advance), before its resources are
    chosen: a lease that can never be admitted is refused before it is written, even one that
    would otherwise wait in the queue.

    :raises UsageRuleBroken: naming each broken rule, its limit and the lease's figure.
    """
    rules = ctx.settings.rules
    if not rules:
        return
    admission = Admission(
        "",
        actor.project_id,
        actor.user_id,
        now.timestamp(),
        start.timestamp(),
        end.timestamp(),
        frozenset(str(t) for t in resource_types),
    )
    broken = [d for d in evaluate(rules, admission, None) if not d.allowed]
    if broken:
        raise refusal(broken)


def admit(
    ctx: ServiceContext,
    session: Session,
    actor: Actor | str,
    lease: Lease,
    now: dt.datetime,
    step: str,
    *,
    before: Mapping[str, object] | None = None,
    dry_run: bool = False,
) -> None:
    """Judge ``lease`` as this transaction admits it (its allocations written): every usage
    rule, then the external service (not for dry runs and tries). A refusal raises; the
    caller's transaction rolls back, after which the refusal is recorded (audit log and
    notification) in a transaction of its own. An admission some rule looked at is recorded
    in the audit log with the figures. ``step`` is ``create``, ``update``, ``confirm`` or
    ``queue``; ``before`` is an update's lease window before it (``name``, ``start_date``,
    ``end_date``).

    :raises UsageRuleBroken: naming each broken rule with its limit and the figure, or the
        external service's message.
    """
    settings = ctx.settings
    url = external.endpoint(settings, "check-update" if step == UPDATE else "check-create")
    recorded = not dry_run and not _TRIAL.get() and step != QUEUE
    if not settings.rules and not url:
        return
    if settings.rules and ctx.db.shares(session):
        # Admissions beside this one may book for the same project or user: the rules count
        # what those hold, so each owner's admissions are judged one after the other.
        locking.owners(session, [f"project:{lease.project_id}", f"user:{lease.user_id}"])
    booked = step == CREATE  # its allocations are on its reservations, all of them
    decisions = judge(ctx, session, lease, now, before, booked=booked) if settings.rules else []
    broken = [d for d in decisions if not d.allowed]
    if broken:
        if recorded:
            values, bodies = _lease_values(lease), [d.body() for d in broken]
            _after_rollback(session, lambda: record_refusal(ctx, actor, values, step, bodies))
        raise refusal(broken)
    if recorded and decisions:
        summary = [d.summary() for d in decisions]
        _audit(session, now, actor, "usage.allow", _lease_values(lease), step, summary)
    if url and not dry_run and not _TRIAL.get():
        _ask(ctx, session, actor, lease, step, url, before)


def ask_update(
    ctx: ServiceContext,
    session: Session,
    actor: Actor | str,
    lease: Lease,
    before: Mapping[str, object],
) -> None:
    """The external service's check-update for an update that books nothing again (its
    window and resources stay: a new before-end date, reminders, a name with them). Blazar's
    update_lease asks it for every update but a new name alone; the usage rules judge only
    what an update books (``admit``), and this one books nothing.

    :raises UsageRuleBroken: the external service's refusal.
    """
    url = external.endpoint(ctx.settings, "check-update")
    if url and not _TRIAL.get():
        _ask(ctx, session, actor, lease, UPDATE, url, before)


def judge(
    ctx: ServiceContext,
    session: Session,
    lease: Lease,
    now: dt.datetime,
    before: Mapping[str, object] | None = None,
    *,
    booked: bool = False,
) -> list[Decision]:
    """Every rule's decision on ``lease`` as the session sees it (allocations included).
    ``booked``: this transaction has just booked every reservation of the new lease (each one's
    allocations are on it): the user's read is narrowed to the rules that can apply to them."""
    rules = ctx.settings.rules
    previous = None
    if before is not None:
        old_start, old_end = before["start_date"], before["end_date"]
        assert isinstance(old_start, dt.datetime) and isinstance(old_end, dt.datetime)
        previous = (old_start.timestamp(), old_end.timestamp())
    admission = Admission(
        lease.id,
        lease.project_id,
        lease.user_id,
        now.timestamp(),
        lease.start_date.timestamp(),
        lease.end_date.timestamp(),
        frozenset(r.resource_type for r in lease.reservations),
        previous,
    )
    active = [r for r in rules if lease.project_id not in r.exempt_projects]
    users, project = _consumption(ctx, session, active, admission, lease if booked else None)
    return evaluate(rules, admission, users, project)


def _consumption(
    ctx: ServiceContext,
    session: Session,
    rules: Sequence[Rule],
    admission: Admission,
    booked: Lease | None = None,
) -> tuple[list[Span], list[Span] | None]:
    """What the rules need: the user's spans (the lease's own included), and the project's
    when a rule counts per project: each over the range its rules look at (the user's, only
    that of the rules that can apply to the hosts of ``booked``, a lease this transaction has
    just booked)."""
    types = needed_types(rules) & admission.resource_types
    if not types:
        return [], None
    own = None if booked is None else _own_hosts(ctx, session, booked)
    mine = reach(_reaching(rules, own), admission, "user") or (admission.start, admission.end)
    ours = reach(rules, admission, "project")
    return spans(
        ctx, session, admission.project_id, admission.user_id, mine, ours, types, admission.lease_id
    )


def _reaching(
    rules: Sequence[Rule], own: Sequence[tuple[str, Mapping[str, Any]]] | None
) -> Sequence[Rule]:
    """The rules whose reach the user's read must cover: every rule, or, when the lease's own
    resources are known, not those no resource of it is in the scope of (counted kinds,
    stacking scoped by properties): ``evaluate`` leaves them out. A rule left in sees every
    span of its own reach either way, and looks at nothing else (a concurrent peak, a stacking
    chain and a rolling budget each leave out what lies beyond their own windows)."""
    if own is None:
        return rules
    return [r for r in rules if not _cannot_apply(r, own)]


def _cannot_apply(rule: Rule, own: Sequence[tuple[str, Mapping[str, Any]]]) -> bool:
    if rule.kind in COUNTED_KINDS:
        return not any(rule.covers(kind, props) for kind, props in own)
    if rule.kind == Kind.STACKING and rule.properties is not MATCH_ALL:
        return not any(rule.scoped(kind, props) for kind, props in own)
    return False


def _own_hosts(
    ctx: ServiceContext, session: Session, lease: Lease
) -> list[tuple[str, Mapping[str, Any]]] | None:
    """Each host allocation of the lease as its reservations carry them, with the host's
    properties as ``spans`` reads them; None unless every reservation is of whole hosts and
    carries its allocations, each within the lease's window and not empty (so that every read
    covering that window reads each of them)."""
    hosts, _ = host_facts(ctx, session)
    found: list[tuple[str, Mapping[str, Any]]] = []
    for r in lease.reservations:
        if r.resource_type != HOSTS or "allocations" not in r.__dict__:
            return None
        for a in r.allocations:
            if not lease.start_date <= a.start_date < a.end_date <= lease.end_date:
                return None
            found.append((HOSTS, hosts.get(a.host_id, {})))
    return found


@dataclass(frozen=True)
class Planned:
    """A reservation a lease would have, before it is admitted: its type and validated
    parameters, and the resources a search found for it (None: not known; estimated from
    the parameters then)."""

    resource_type: str
    params: Mapping[str, Any]
    resource_ids: tuple[int, ...] | None = None
    quantities: tuple[int, ...] = ()
    count: int | None = None
    """How many resources (hosts, instances, items) when ``resource_ids`` is None; None:
    the parameters' minimum."""


def forecast(
    ctx: ServiceContext,
    session: Session,
    actor: Actor,
    start: dt.datetime,
    end: dt.datetime,
    planned: Sequence[Planned],
) -> list[Decision]:
    """The rules a lease of ``actor`` holding ``planned`` over [start, end) would break if it
    were admitted now (the availability search's windows, counter-offers). Resources not found
    yet are estimated from what matches: a property-scoped rule counts them only when every
    matching host is in its scope, with the fewest units any of them has."""
    rules = [r for r in ctx.settings.rules if actor.project_id not in r.exempt_projects]
    if not rules:
        return []
    now = ctx.clock.now()
    admission = Admission(
        PLANNED,
        actor.project_id,
        actor.user_id,
        now.timestamp(),
        start.timestamp(),
        end.timestamp(),
        frozenset(p.resource_type for p in planned),
    )
    users, project = _consumption(ctx, session, rules, admission)
    hosts, amounts = host_facts(ctx, session)
    for p in planned:
        own = _planned_spans(ctx, session, p, hosts, amounts, actor.user_id, admission)
        users.extend(own)
        if project is not None:
            project.extend(own)
    return [d for d in evaluate(rules, admission, users, project) if not d.allowed]


PLANNED = "(planned)"
"""The lease id of a lease not admitted yet."""


def _planned_spans(
    ctx: ServiceContext,
    session: Session,
    p: Planned,
    hosts: Mapping[int, Mapping[str, Any]],
    host_amounts: Mapping[int, Mapping[str, float]],
    user: str,
    admission: Admission,
) -> list[Span]:
    def span_(props: Mapping[str, Any], amounts: Mapping[str, float]) -> Span:
        return Span(PLANNED, user, p.resource_type, props, amounts, admission.start, admission.end)

    low = int(p.params.get("min", p.params.get("amount", 1)))
    count = p.count if p.count is not None else low
    if p.resource_type == "physical:host":
        if p.resource_ids is not None:
            return [span_(hosts.get(h, {}), host_amounts.get(h, {})) for h in p.resource_ids]
        host_type = ctx.resource_types["physical:host"]
        assert isinstance(host_type, WholeHosts)
        matching = host_type.inventory.matching(
            session, p.params["hypervisor_properties"], p.params["resource_properties"]
        )
        ids = [int(h) for h in matching.ids.tolist()]
        common = _common([hosts.get(h, {}) for h in ids])
        amounts = {
            unit: min((host_amounts.get(h, {}).get(unit, 0.0) for h in ids), default=0.0)
            for unit in ("hosts", "vcpus", "gpus")
        }
        return [span_(common, amounts) for _ in range(count)]
    if p.resource_type == "virtual:instance":
        vcpus = float(p.params["vcpus"])
        if p.resource_ids is not None:
            return [
                span_(hosts.get(h, {}), {"vcpus": vcpus * n})
                for h, n in zip(p.resource_ids, p.quantities, strict=True)
            ]
        return [span_({}, {"vcpus": vcpus * count})]
    if p.resource_type == "virtual:floatingip":
        return [span_({}, {"ips": float(count)})]
    if p.resource_type == "virtual:volume":
        gb = sum(p.quantities) if p.quantities else int(p.params["size_gb"]) * count
        return [span_({}, {"gb": float(gb)})]
    return []


def _common(props: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The properties every one of ``props`` has with the same value."""
    if not props:
        return {}
    first = dict(props[0])
    return {k: v for k, v in first.items() if all(p.get(k) == v for p in props[1:])}


def refusal(broken: Sequence[Decision]) -> UsageRuleBroken:
    """The 403: the first broken rule in the message (and how many more), each in ``rules``."""
    more = f" (and {len(broken) - 1} more rule(s) broken)" if len(broken) > 1 else ""
    return UsageRuleBroken(broken[0].message + more, [d.body() for d in broken])


def record_refusal(
    ctx: ServiceContext,
    actor: Actor | str,
    lease: Mapping[str, Any],
    step: str,
    rules: Sequence[Mapping[str, object]],
) -> None:
    """A refusal, in the audit log and to the webhooks (``usage.deny``), in a transaction of
    its own: the admission's rolled back. A failure here is logged, never raised over the
    refusal."""
    now = ctx.clock.now()
    try:
        with ctx.db.transaction() as session:
            _audit(session, now, actor, "usage.deny", lease, step, rules)
            on_end = external.endpoint(ctx.settings, "on-end")
            webhooks = [
                s
                for s in ctx.settings.notification_sinks
                if not s.startswith(BUS_PREFIX) and s != on_end
            ]
            if webhooks:
                payload = {
                    "event": "usage.deny",
                    "sent_at": wire.stamp(now),
                    "step": step,
                    "lease": dict(lease),
                    "rules": list(rules),
                }
                outbox.enqueue(session, webhooks, "usage.deny", payload, now)
    except Exception:
        LOG.exception("could not record the refusal of lease %s", lease["id"])


def _audit(
    session: Session,
    now: dt.datetime,
    actor: Actor | str,
    action: str,
    lease: Mapping[str, Any],
    step: str,
    rules: Sequence[Mapping[str, object]],
) -> None:
    audit.record(
        session,
        at=now,
        actor=actor,
        action=action,
        target_type="lease",
        target_id=str(lease["id"]),
        detail={
            "project_id": lease["project_id"],
            "user_id": lease["user_id"],
            "step": step,
            "start_date": lease["start_date"],
            "end_date": lease["end_date"],
            "rules": list(rules),
        },
    )


def _after_rollback(session: Session, then: Any) -> None:
    session.info.setdefault("after_rollback", []).append(then)


def _lease_values(lease: Lease) -> dict[str, Any]:
    return {
        "id": lease.id,
        "name": lease.name,
        "project_id": lease.project_id,
        "user_id": lease.user_id,
        "start_date": wire.lease_date(lease.start_date),
        "end_date": wire.lease_date(lease.end_date),
    }


def lease_body(ctx: ServiceContext, lease: Lease) -> dict[str, Any]:
    """The lease as Blazar's enforcement sends it: its values, and each reservation with the
    resources allocated to it (``allocations``: their ids)."""
    body = wire.lease(lease)
    for shown, reservation in zip(body["reservations"], lease.reservations, strict=True):
        ids = ctx.resource_types[reservation.resource_type].resource_ids(reservation)
        shown["allocations"] = [{"id": rid} for rid in ids]
    return body


def _ask(
    ctx: ServiceContext,
    session: Session,
    actor: Actor | str,
    lease: Lease,
    step: str,
    url: str,
    before: Mapping[str, object] | None,
) -> None:
    settings = ctx.settings
    body: dict[str, Any] = {
        "context": external.context(settings, lease.project_id, lease.user_id),
        "lease": lease_body(ctx, lease),
    }
    if step == UPDATE:
        current = dict(body["lease"])
        for key, value in (before or {}).items():
            current[key] = wire.lease_date(value) if isinstance(value, dt.datetime) else value
        body["current_lease"] = current
    verdict = external.ask(settings, url, body)
    decision = {
        "rule": "external_service",
        "kind": "external",
        "url": url,
        "allowed": verdict.allowed,
        "failed": verdict.failed,
        "message": verdict.message,
    }
    now = ctx.clock.now()
    if verdict.allowed:
        if verdict.failed:
            _audit(session, now, actor, "usage.allow", _lease_values(lease), step, [decision])
        return
    error = UsageRuleBroken(f"external admission service refused: {verdict.message}", [decision])
    values = _lease_values(lease)
    _after_rollback(session, lambda: record_refusal(ctx, actor, values, step, [decision]))
    raise error
