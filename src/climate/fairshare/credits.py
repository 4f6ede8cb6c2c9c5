"""Credits at admission and at a lease's end (docs/credits.md): a lease's quote by the price
table is encumbered from its project's balance when it is admitted (``encumber``: created,
updated, confirmed, admitted from the queue), and settled when it ends (``settle``): the real
use is charged, the rest refunded. Every ledger entry is in the audit log and notified to the
webhooks (``credits.<kind>``); a refusal (``NotEnoughCredits``) is recorded once its
transaction has rolled back (``credits.deny``)."""

from __future__ import annotations

import datetime as dt
import functools
import logging
import weakref
from collections import defaultdict
from collections.abc import Iterable, Mapping
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from sqlalchemy.orm import Session

from climate import pricing, wire
from climate.context import ServiceContext
from climate.db import audit, billing, outbox
from climate.db import credits as credit_rows
from climate.db.tables import Lease
from climate.domain.actor import Actor
from climate.errors import NotEnoughCredits
from climate.fairshare import admission, consumption
from climate.pricing import PriceTable, Use
from climate.resources.base import ResourceType
from climate.resources.capabilities import item_kinds

LOG = logging.getLogger(__name__)
GRANT, ENCUMBER, ADJUST, SETTLE, REFUND = "grant", "encumber", "adjust", "settle", "refund"
KINDS_OF_ENTRY = (GRANT, ENCUMBER, ADJUST, SETTLE, REFUND)
_MEMORY_MB_PER_GB = 1024
Measure = tuple[str, int, int]
"""Price table resource type, index of the amount, divisor to its unit."""
_MEASURES: dict[str, tuple[Measure, ...]] = {
    "host": (("physical:host", 0, 1),),
    "instance": (
        ("virtual:instance:vcpu", 0, 1),
        ("virtual:instance:memory_gb", 1, _MEMORY_MB_PER_GB),
    ),
    "volume": (("virtual:volume", 0, 1),),
}
_ONE = dt.timedelta(microseconds=1)
_QUOTES: weakref.WeakKeyDictionary[Lease, Decimal] = weakref.WeakKeyDictionary()


def measures(resource_types: Mapping[str, ResourceType]) -> Mapping[str, tuple[Measure, ...]]:
    """What an allocation counts, per allocation table (``billing.Held.table``): an item is one
    of its kind's resource type."""
    return _measures(tuple(resource_types.items()))


@functools.lru_cache(maxsize=8)
def _measures(
    resource_types: tuple[tuple[str, ResourceType], ...],
) -> Mapping[str, tuple[Measure, ...]]:
    # Once per set of types: every quote asks (the types' isinstance tests cost more than it).
    items = item_kinds(dict(resource_types)).values()
    return MappingProxyType(
        _MEASURES | {kind.kind: ((kind.resource_type, 0, 1),) for kind in items}
    )


@functools.lru_cache(maxsize=8)
def _table(prices: tuple[tuple[str, str], ...]) -> PriceTable:
    return PriceTable.parse(dict(prices))


def price_table(ctx: ServiceContext) -> PriceTable:
    return _table(tuple(sorted(ctx.settings.prices.items())))


_TABLES = {"physical:host": "host", "virtual:instance": "instance", "virtual:volume": "volume"}


def quote(
    ctx: ServiceContext,
    session: Session,
    lease: Lease,
    until: dt.datetime | None = None,
    *,
    booked: bool = False,
) -> Decimal:
    """What ``lease``'s allocations cost as this transaction sees them, each cut at ``until``
    (None: whole). ``booked``: this transaction has just booked every reservation of the lease
    (each one's allocations are on it, as the admission wrote them): they are not read again."""
    held = _booked(ctx, lease) if booked else None
    if held is None:
        tables = {_TABLES.get(r.resource_type, "items") for r in lease.reservations}
        held = list(credit_rows.holdings(session, lease.id, tables))
    ids: dict[str, set[int]] = defaultdict(set)
    for h in held:
        ids[h.table].add(h.resource)
    # Hosts' properties from the per-database copy the usage rules keep too: no query.
    props = {
        table: consumption.host_properties(ctx, session)
        if table in ("host", "instance")
        else billing.properties(session, table, found)
        for table, found in ids.items()
    }
    return pricing.quote(
        price_table(ctx),
        ctx.settings.credits_factor_property,
        _uses(held, props, until, measures(ctx.resource_types)),
    )


def _booked(ctx: ServiceContext, lease: Lease) -> list[credit_rows.Holding] | None:
    """The lease's allocations as its reservations carry them; None when one does not carry
    them (not booked by this transaction)."""
    held: list[credit_rows.Holding] = []
    for r in lease.reservations:
        table = _TABLES.get(r.resource_type)
        loaded = r.__dict__
        if table == "host" and "allocations" in loaded:
            held += [
                credit_rows.Holding(table, a.host_id, (1,), a.start_date, a.end_date)
                for a in r.allocations
            ]
        elif table == "instance" and "instance_allocations" in loaded:
            held += [
                credit_rows.Holding(
                    table, a.host_id, (a.vcpus, a.memory_mb), a.start_date, a.end_date
                )
                for a in r.instance_allocations
            ]
        elif table == "volume" and "volume_allocations" in loaded:
            held += [
                credit_rows.Holding(table, a.pool_id, (a.size_gb,), a.start_date, a.end_date)
                for a in r.volume_allocations
            ]
        elif table is None and "item_allocations" in loaded:
            kind = getattr(ctx.resource_types.get(r.resource_type), "kind", None)
            if kind is None:
                return None
            held += [
                credit_rows.Holding(kind.kind, a.item_id, (1,), a.start_date, a.end_date)
                for a in r.item_allocations
            ]
        else:
            return None
    return held


def _uses(
    held: Iterable[credit_rows.Holding],
    props: Mapping[str, Mapping[int, Mapping[str, str]]],
    until: dt.datetime | None,
    counted: Mapping[str, tuple[Measure, ...]],
) -> Iterable[Use]:
    for h in held:
        end = h.end if until is None else min(h.end, until)
        span = max(0, (end - h.start) // _ONE)
        for resource_type, index, divisor in counted.get(h.table, ()):
            units = Decimal(h.amounts[index]) / divisor
            yield Use(resource_type, props[h.table].get(h.resource, {}), units, span)


def quoted(lease: Lease) -> Decimal | None:
    """The quote ``lease`` was admitted with in this process (a dry run's), if credits are on."""
    return _QUOTES.get(lease)


def encumber(
    ctx: ServiceContext,
    session: Session,
    actor: Actor | str,
    lease: Lease,
    now: dt.datetime,
    step: str,
    *,
    dry_run: bool = False,
) -> None:
    """Encumber ``lease``'s quote from its project's balance (what it holds encumbered already
    counts: an update encumbers or refunds the difference), in the admission's transaction.

    :raises NotEnoughCredits: the balance cannot cover it; the caller rolls back, after which
        the refusal is recorded unless this is a dry run, a try or the queue's attempt.
    """
    if not ctx.settings.credits:
        return
    # A lease created or admitted from the queue now has encumbered nothing before, and this
    # transaction booked each of its reservations.
    fresh = step in (admission.CREATE, admission.QUEUE)
    price = quote(ctx, session, lease, booked=fresh)
    _QUOTES[lease] = price
    held = 0 if fresh else credit_rows.encumbered(session, lease.id) or 0
    delta = pricing.cents(price) - held
    if delta == 0:
        return
    project = lease.project_id
    kind = ENCUMBER if held == 0 and step != admission.UPDATE else ADJUST
    entry = credit_rows.Entry(project, lease.id, kind, -delta, delta, _name(actor), now, step)
    # A quote past what a balance can hold is beyond any balance: refused without a write.
    written = credit_rows.post(session, entry) if delta <= pricing.MAX_CENTS else None
    if written is None:
        have = credit_rows.balance(session, project) or 0
        refused = NotEnoughCredits(
            project,
            str(pricing.from_cents(have)),
            str(price),
            str(pricing.from_cents(delta - have)),
        )
        if not dry_run and not admission.trying() and step != admission.QUEUE:
            detail = {"lease_id": lease.id, "step": step, **refused.rules[0]}
            session.info["after_rollback"].append(
                lambda: _record_refusal(ctx, actor, project, detail)
            )
        raise refused
    record(ctx, session, written, actor)


def settle(
    ctx: ServiceContext, session: Session, actor: Actor | str, lease: Lease, now: dt.datetime
) -> None:
    """``lease`` has ended (or was deleted, or its hold lapsed) at ``now``: charge what its
    allocations, cut at ``now``, cost (never more than it holds encumbered), refund the rest.
    Once settled, settling again does nothing."""
    if not ctx.settings.credits:
        return
    held = credit_rows.encumbered(session, lease.id)
    if not held:
        return
    charged = min(pricing.cents(quote(ctx, session, lease, now)), held)
    project, name = lease.project_id, _name(actor)
    # A lease that used nothing (deleted or lapsed before it started) gets its refund line
    # only: a "settle 0.00" would be a charge of nothing on the project's ledger.
    entries = []
    if charged:
        entries.append(credit_rows.Entry(project, lease.id, SETTLE, 0, -charged, name, now))
    rest = held - charged
    if rest:
        entries.append(credit_rows.Entry(project, lease.id, REFUND, rest, -rest, name, now))
    for entry in entries:
        written = credit_rows.post(session, entry)
        # Its balance has a row (it was debited when the lease was encumbered), and neither
        # entry takes anything from it.
        assert written is not None
        record(ctx, session, written, actor)


def grant(
    ctx: ServiceContext,
    session: Session,
    actor: Actor,
    project_id: str,
    amount: Decimal,
    now: dt.datetime,
    note: str | None,
) -> credit_rows.Written | None:
    """Add ``amount`` (negative: take it away) to the project's balance; None when that would
    take the balance below zero (nothing changed)."""
    credit_rows.open_account(session, project_id)
    entry = credit_rows.Entry(
        project_id, None, GRANT, pricing.cents(amount), 0, _name(actor), now, note
    )
    written = credit_rows.post(session, entry)
    if written is not None:
        record(ctx, session, written, actor)
    return written


def entry_body(written: credit_rows.Written) -> dict[str, Any]:
    """A ledger entry as the API, the audit log and the notifications show it."""
    e = written.entry
    return {
        "id": written.id,
        "project_id": e.project_id,
        "lease_id": e.lease_id,
        "kind": e.kind,
        "amount": str(pricing.from_cents(e.amount_cents)),
        "encumbered": str(pricing.from_cents(e.encumbered_cents)),
        "balance": str(pricing.from_cents(written.balance_cents)),
        "actor": e.actor,
        "at": wire.stamp(e.at),
        "note": e.note,
    }


def record(
    ctx: ServiceContext, session: Session, written: credit_rows.Written, actor: Actor | str
) -> None:
    """A ledger entry in the audit log (by ``actor``: a caller names its project there, as in
    every audit row of a caller's change) and to the webhooks, in its transaction."""
    body = entry_body(written)
    at = written.entry.at
    action = f"credits.{written.entry.kind}"
    _audit(session, at, actor, action, written.entry.project_id, body)
    if ctx.settings.webhooks:
        payload = {"event": action, "sent_at": wire.stamp(at), "entry": body}
        outbox.enqueue(session, ctx.settings.webhooks, action, payload, at, written.entry.lease_id)


def _record_refusal(
    ctx: ServiceContext, actor: Actor | str, project_id: str, detail: dict[str, Any]
) -> None:
    """A refusal, in a transaction of its own (the admission's rolled back); a failure here is
    logged, never raised over the refusal."""
    now = ctx.clock.now()
    try:
        with ctx.db.transaction() as session:
            _audit(session, now, actor, "credits.deny", project_id, detail)
            if ctx.settings.webhooks:
                payload = {"event": "credits.deny", "sent_at": wire.stamp(now), **detail}
                outbox.enqueue(session, ctx.settings.webhooks, "credits.deny", payload, now)
    except Exception:
        LOG.exception("could not record the credits refusal of lease %s", detail["lease_id"])


def _audit(
    session: Session,
    at: dt.datetime,
    actor: Actor | str,
    action: str,
    project_id: str,
    detail: Mapping[str, Any],
) -> None:
    audit.record(
        session,
        at=at,
        actor=actor,
        action=action,
        target_type="project",
        target_id=project_id,
        detail=dict(detail),
    )


def _name(actor: Actor | str) -> str:
    return actor if isinstance(actor, str) else actor.user_id
