"""Credits (docs/credits.md): a dry run's quote is what creation encumbers, updates encumber or
refund the difference, an early delete refunds the rest, the end settles; a lease the balance
cannot cover is refused with the figures; every ledger entry is audited and notified; who may
read and grant."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from decimal import Decimal

import pytest
from sqlalchemy import select

from climate.backends import load_backend
from climate.config import Settings
from climate.db import credits as credit_rows
from climate.db.engine import Database
from climate.db.records import AuditLog
from climate.db.tables import OutboxMessage
from climate.domain.clock import ManualClock
from climate.domain.requests import LeaseChanges, LeaseRequest
from climate.domain.status import LeaseType
from climate.errors import Conflict, Forbidden, InvalidInput, NotEnoughCredits
from climate.fairshare import credits as credits_module
from climate.manager.service import Manager
from climate.resources.capabilities import item_kinds
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.credits import CreditsService
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ADMIN, ALICE, BOB, T0
from tests.helpers import host_request, hosts_of

HOUR = dt.timedelta(hours=1)
PRICES = {"physical:host": "1.50", "physical:host[gpu=a100]": "4.00"}
HOOK = "http://127.0.0.1:9/hook"
GPU = '["==", "$gpu", "a100"]'


@pytest.fixture
def priced(settings: Settings) -> Settings:
    return settings.model_copy(update={"prices": PRICES, "credits": True, "webhooks": (HOOK,)})


@pytest.fixture
def world(priced: Settings, db: Database, clock: ManualClock) -> ServiceContext:
    """Two plain hosts (one weighing double by su_factor) and a GPU host."""
    ctx = build_context(priced, db, clock)
    hosts = HostService(ctx)
    hosts.create(ADMIN, "plain-1", {"rack": "r1"})
    hosts.create(ADMIN, "plain-2", {"rack": "r2", "su_factor": "2"})
    hosts.create(ADMIN, "gpu-1", {"gpu": "a100"})
    return ctx


def rack(name: str) -> str:
    return f'["==", "$rack", "{name}"]'


def ledger_sums(ctx: ServiceContext, project: str) -> tuple[Decimal, Decimal, Decimal]:
    """(balance, sum of the ledger's amounts, what is encumbered)."""
    with ctx.db.reader() as session:
        balance = credit_rows.balance(session, project) or 0
        amounts, encumbered = credit_rows.totals(session, project)
    return Decimal(balance) / 100, Decimal(amounts) / 100, Decimal(encumbered) / 100


def kinds(ctx: ServiceContext, project: str) -> list[tuple[str, str, str]]:
    return [
        (w.entry.kind, str(Decimal(w.entry.amount_cents) / 100), str(w.balance_cents))
        for w in CreditsService(ctx).ledger(ADMIN, project)
    ]


def test_without_credits_a_priced_lease_is_refused_with_the_figures(world: ServiceContext) -> None:
    leases = LeaseService(world)
    request = host_request("a", T0 + HOUR, T0 + 3 * HOUR, resource_properties=rack("r1"))
    with pytest.raises(NotEnoughCredits) as refused:
        leases.create(ALICE, request)
    assert (refused.value.balance, refused.value.quote, refused.value.shortfall) == (
        "0.00",
        "3.00",
        "3.00",
    )
    assert refused.value.status == 403
    assert "project project-a has 0.00; the lease's quote is 3.00" in refused.value.message
    assert CreditsService(world).ledger(ADMIN, "project-a") == []
    assert leases.list_all(ALICE) == []
    with world.db.reader() as session:
        denied = session.scalars(select(AuditLog).where(AuditLog.action == "credits.deny")).all()
        topics = session.scalars(select(OutboxMessage.topic)).all()
    assert len(denied) == 1 and json.loads(denied[0].detail or "{}")["shortfall"] == "3.00"
    assert "credits.deny" in topics


def test_the_quote_is_what_creation_encumbers_and_updates_adjust(world: ServiceContext) -> None:
    leases, credits = LeaseService(world), CreditsService(world)
    credits.grant(ADMIN, "project-a", Decimal("100"), "start-up")
    # plain-2 weighs 2: 2 h x 1.50 x 2 = 6.00
    request = host_request("a", T0 + HOUR, T0 + 3 * HOUR, resource_properties=rack("r2"))
    trial = leases.dry_run(ALICE, request)
    assert trial.quote == Decimal("6.00")
    assert ledger_sums(world, "project-a") == (Decimal(100), Decimal(100), Decimal(0))
    lease = leases.create(ALICE, request)
    assert ledger_sums(world, "project-a") == (Decimal(94), Decimal(94), Decimal(6))
    leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 4 * HOUR))  # +1 h: 3.00 more
    assert ledger_sums(world, "project-a") == (Decimal(91), Decimal(91), Decimal(9))
    leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 2 * HOUR))  # 1 h in all: 3.00
    assert ledger_sums(world, "project-a") == (Decimal(97), Decimal(97), Decimal(3))
    assert [k for k, _, _ in kinds(world, "project-a")] == ["grant", "encumber", "adjust", "adjust"]
    # Deleted before it started: nothing used, all refunded, with one line (no charge of 0.00).
    leases.delete(ALICE, lease.id)
    assert ledger_sums(world, "project-a") == (Decimal(100), Decimal(100), Decimal(0))
    assert kinds(world, "project-a")[-2:] == [("adjust", "6", "9700"), ("refund", "3", "10000")]


def test_a_lease_that_names_no_property_gets_the_cheapest_hosts_and_is_quoted_for_them(
    priced: Settings, db: Database, clock: ManualClock
) -> None:
    """Host 1 has the GPU premium (4.00 an hour), host 2 weighs double (1.50 x su_factor 2),
    host 3 is plain (1.50): a lease of any host is given the cheapest free ones, not the first
    by id, so a balance that covers the cheapest hosts is enough, and the premium hosts stay
    for those who ask for them."""
    ctx = build_context(priced, db, clock)
    hosts = HostService(ctx)
    hosts.create(ADMIN, "gpu-1", {"gpu": "a100"})
    hosts.create(ADMIN, "double-1", {"su_factor": "2"})
    hosts.create(ADMIN, "plain-1", {})
    leases, credits = LeaseService(ctx), CreditsService(ctx)
    credits.grant(ADMIN, "project-a", Decimal("10"))
    window = (T0 + HOUR, T0 + 3 * HOUR)
    assert leases.dry_run(ALICE, host_request("any", *window)).quote == Decimal("3.00")
    first = leases.create(ALICE, host_request("any", *window))
    assert hosts_of(first) == {3}
    second = leases.create(ALICE, host_request("then", *window))
    assert hosts_of(second) == {2}  # 6.00, where the GPU host would cost 8.00
    assert ledger_sums(ctx, "project-a") == (Decimal(1), Decimal(1), Decimal(9))
    with pytest.raises(NotEnoughCredits):
        leases.create(ALICE, host_request("last", *window))  # only the GPU host is left
    credits.grant(ADMIN, "project-b", Decimal("10"))
    both = leases.dry_run(BOB, host_request("two", T0 + 5 * HOUR, T0 + 6 * HOUR, 2))
    assert hosts_of(both.lease) == {3, 2} and both.quote == Decimal("4.50")
    gpu = leases.dry_run(BOB, host_request("gpu", *window, resource_properties=GPU))
    assert hosts_of(gpu.lease) == {1}


def test_an_update_the_balance_cannot_cover_is_refused_and_changes_nothing(
    world: ServiceContext,
) -> None:
    leases, credits = LeaseService(world), CreditsService(world)
    credits.grant(ADMIN, "project-a", Decimal("4.50"))
    lease = leases.create(
        ALICE, host_request("a", T0 + HOUR, T0 + 3 * HOUR, resource_properties=rack("r1"))
    )  # 3.00
    with pytest.raises(NotEnoughCredits) as refused:
        leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 5 * HOUR))  # 3.00 more
    assert (refused.value.balance, refused.value.quote, refused.value.shortfall) == (
        "1.50",
        "6.00",
        "1.50",
    )
    assert leases.get(ALICE, lease.id).end_date == T0 + 3 * HOUR
    assert ledger_sums(world, "project-a") == (Decimal("1.5"), Decimal("1.5"), Decimal(3))


def test_the_end_settles_what_was_used_and_an_early_delete_refunds_the_rest(
    world: ServiceContext, clock: ManualClock
) -> None:
    leases, credits = LeaseService(world), CreditsService(world)
    credits.grant(ADMIN, "project-a", Decimal("50"))
    full = leases.create(
        ALICE, host_request("full", T0 + HOUR, T0 + 3 * HOUR, resource_properties=rack("r1"))
    )
    early = leases.create(
        ALICE,
        host_request(
            "early", T0 + HOUR, T0 + 5 * HOUR, resource_properties='["==", "$gpu", "a100"]'
        ),
    )
    assert ledger_sums(world, "project-a") == (Decimal(31), Decimal(31), Decimal(19))
    manager = Manager(world, load_backend(world.settings))
    clock.set(T0 + HOUR)
    manager.run_due()
    clock.set(T0 + 2 * HOUR + 30 * dt.timedelta(minutes=1))
    leases.delete(ALICE, early.id)  # 1.5 h of 4 used: 6.00 charged, 10.00 back
    manager.run_due()
    assert ledger_sums(world, "project-a") == (Decimal(41), Decimal(41), Decimal(3))
    clock.set(T0 + 3 * HOUR)
    manager.run_due()
    assert leases.get(ALICE, full.id).status == "TERMINATED"
    assert ledger_sums(world, "project-a") == (Decimal(41), Decimal(41), Decimal(0))
    settled = [
        w for w in credits.ledger(ALICE, "project-a") if w.entry.kind in ("settle", "refund")
    ]
    assert [(w.entry.lease_id, w.entry.kind, w.entry.encumbered_cents) for w in settled] == [
        (early.id, "settle", -600),
        (early.id, "refund", -1000),
        (full.id, "settle", -300),
    ]
    with world.db.reader() as session:
        audited = session.scalars(
            select(AuditLog.action).where(AuditLog.action.like("credits.%")).order_by(AuditLog.id)
        ).all()
        notified = session.scalars(
            select(OutboxMessage.payload).where(OutboxMessage.topic.like("credits.%"))
        ).all()
    assert audited == [
        "credits.grant",
        "credits.encumber",
        "credits.encumber",
        "credits.settle",
        "credits.refund",
        "credits.settle",
    ]
    assert len(notified) == len(audited)
    assert notified[-1]["entry"]["encumbered"] == "-3.00"


def test_every_credits_audit_row_names_the_acting_project(
    world: ServiceContext, clock: ManualClock
) -> None:
    """As every audit row of a caller's change does; the manager acts for no project."""
    leases, credits = LeaseService(world), CreditsService(world)
    credits.grant(ADMIN, "project-a", Decimal("3"))
    window = (T0 + HOUR, T0 + 3 * HOUR)
    lease = leases.create(ALICE, host_request("a", *window, resource_properties=rack("r1")))
    with pytest.raises(NotEnoughCredits):
        leases.create(ALICE, host_request("b", *window, resource_properties=rack("r2")))
    leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 2 * HOUR))
    clock.set(T0 + 2 * HOUR)
    Manager(world, load_backend(world.settings)).run_due()
    with world.db.reader() as session:
        audited = session.execute(
            select(AuditLog.action, AuditLog.actor_user, AuditLog.actor_project)
            .where(AuditLog.action.like("credits.%"))
            .order_by(AuditLog.id)
        ).all()
    assert [tuple(row) for row in audited] == [
        ("credits.grant", "admin-user", "admin-project"),
        ("credits.encumber", "alice", "project-a"),
        ("credits.deny", "alice", "project-a"),
        ("credits.adjust", "alice", "project-a"),
        ("credits.settle", "manager", None),
    ]


def test_a_lapsed_hold_refunds_and_a_confirmed_hold_stays_encumbered(
    world: ServiceContext, clock: ManualClock
) -> None:
    leases, credits = LeaseService(world), CreditsService(world)
    credits.grant(ADMIN, "project-a", Decimal("10"))
    window = (T0 + 5 * HOUR, T0 + 6 * HOUR)
    kept = leases.create(
        ALICE, _held(host_request("held", *window, resource_properties=rack("r1")))
    )
    lapsing = leases.create(
        ALICE, _held(host_request("lapse", *window, resource_properties=rack("r2")))
    )
    assert ledger_sums(world, "project-a") == (Decimal("5.5"), Decimal("5.5"), Decimal("4.5"))
    leases.confirm(ALICE, kept.id)
    clock.set(T0 + 2 * HOUR)
    leases.serve_queue(capacity_changed=False)
    assert leases.get(ALICE, lapsing.id).status == "EXPIRED"
    assert ledger_sums(world, "project-a") == (Decimal("8.5"), Decimal("8.5"), Decimal("1.5"))


def _held(request: LeaseRequest) -> LeaseRequest:
    return dataclasses.replace(request, hold=HOUR)


def test_what_an_allocation_counts_is_worked_out_once_per_set_of_resource_types(
    world: ServiceContext,
) -> None:
    types = world.resource_types
    counted = credits_module.measures(types)
    assert credits_module.measures(dict(types)) is counted
    kinds = item_kinds(types)
    assert kinds
    assert dict(counted) == credits_module._MEASURES | {
        kind.kind: ((kind.resource_type, 0, 1),) for kind in kinds.values()
    }
    without_items = {name: t for name, t in types.items() if name not in kinds}
    assert dict(credits_module.measures(without_items)) == credits_module._MEASURES
    with pytest.raises(TypeError):
        counted["host"] = ()  # type: ignore[index]


def test_free_resources_need_no_credits(world: ServiceContext) -> None:
    free = world.settings.model_copy(update={"prices": {"physical:host[gpu=a100]": "4.00"}})
    ctx = build_context(free, world.db, world.clock)
    lease = LeaseService(ctx).create(
        BOB, host_request("free", T0 + HOUR, T0 + 2 * HOUR, resource_properties=rack("r1"))
    )
    assert lease.status == "PENDING"
    assert CreditsService(ctx).ledger(BOB, "project-b") == []


def test_who_may_read_and_grant(world: ServiceContext) -> None:
    credits = CreditsService(world)
    written = credits.grant(ADMIN, "project-a", Decimal("12.25"), "semester")
    assert (written.balance_cents, written.entry.note, written.entry.actor) == (
        1225,
        "semester",
        "admin-user",
    )
    assert credits.account(ALICE, "project-a").balance == Decimal("12.25")
    assert credits.account(ADMIN, "project-b").balance == Decimal(0)
    with pytest.raises(Forbidden):
        credits.account(BOB, "project-a")
    with pytest.raises(Forbidden):
        credits.ledger(BOB, "project-a")
    with pytest.raises(Forbidden):
        credits.grant(ALICE, "project-a", Decimal(1))
    with pytest.raises(InvalidInput, match="amount"):
        credits.grant(ADMIN, "project-a", Decimal("0.001"))
    with pytest.raises(InvalidInput, match="amount"):
        credits.grant(ADMIN, "project-a", Decimal(0))
    with pytest.raises(InvalidInput, match="amount"):
        credits.grant(ADMIN, "project-a", Decimal("1e13"))
    with pytest.raises(InvalidInput, match="project_id"):
        credits.grant(ADMIN, "p" * 256, Decimal(1))
    with pytest.raises(Conflict, match="below zero"):
        credits.grant(ADMIN, "project-a", Decimal("-12.26"))
    credits.grant(ADMIN, "project-a", Decimal("-12.25"))
    assert credits.account(ALICE, "project-a").balance == Decimal(0)
    with pytest.raises(InvalidInput, match="limit"):
        credits.ledger(ALICE, "project-a", limit=0)
    assert len(credits.ledger(ALICE, "project-a", limit=1)) == 1
    [second] = credits.ledger(ALICE, "project-a", marker=written.id)
    assert second.entry.amount_cents == -1225


def test_credits_off_prices_nothing(settings: Settings, db: Database, clock: ManualClock) -> None:
    ctx = build_context(settings.model_copy(update={"prices": PRICES}), db, clock)
    HostService(ctx).create(ADMIN, "h", {})
    leases = LeaseService(ctx)
    assert leases.dry_run(ALICE, host_request("a", T0 + HOUR, T0 + 2 * HOUR)).quote is None
    leases.create(ALICE, host_request("a", T0 + HOUR, T0 + 2 * HOUR))
    assert CreditsService(ctx).account(ALICE, "project-a").enabled is False
    assert CreditsService(ctx).ledger(ALICE, "project-a") == []


def test_a_waiting_lease_waits_for_credits_then_is_admitted_and_encumbered(
    world: ServiceContext, clock: ManualClock
) -> None:
    leases, credits = LeaseService(world), CreditsService(world)
    request = dataclasses.replace(
        host_request("r", None, T0 + 2 * HOUR, resource_properties=rack("r1")),
        lease_type=LeaseType.RETRY,
    )
    waiting = leases.create(ALICE, request)
    assert waiting.status == "IN_PROGRESS"
    assert "not enough credits" in (waiting.status_reason or "")
    clock.advance(dt.timedelta(minutes=2))
    leases.serve_queue(capacity_changed=True)
    assert leases.get(ALICE, waiting.id).status == "IN_PROGRESS"
    credits.grant(ADMIN, "project-a", Decimal(5))
    clock.advance(dt.timedelta(minutes=2))
    assert leases.serve_queue(capacity_changed=True) == 1
    assert leases.get(ALICE, waiting.id).status == "PENDING"
    assert ledger_sums(world, "project-a") == (Decimal(2), Decimal(2), Decimal(3))
    with world.db.reader() as session:
        denied = session.scalars(select(AuditLog).where(AuditLog.action == "credits.deny")).all()
    assert len(denied) == 1  # the creation's refusal; the manager's attempts record nothing


def test_a_refusal_that_cannot_be_recorded_is_still_a_refusal(
    world: ServiceContext, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_args: object, **_kw: object) -> None:
        raise RuntimeError("audit log unavailable")

    monkeypatch.setattr(credits_module, "_audit", broken)
    request = host_request("a", T0 + HOUR, T0 + 2 * HOUR, resource_properties=rack("r1"))
    with pytest.raises(NotEnoughCredits):
        LeaseService(world).create(ALICE, request)
    assert "could not record the credits refusal" in caplog.text


def test_grants_never_lift_a_balance_past_what_its_column_holds(world: ServiceContext) -> None:
    credits = CreditsService(world)
    # What some hundred thousand of the largest grants add up to, written at once.
    with world.db.transaction() as session:
        near = Decimal(2**63 - 1000) / 100
        credits_module.grant(world, session, ADMIN, "project-a", near, world.clock.now(), None)
    with pytest.raises(Conflict, match="would lift it above"):
        credits.grant(ADMIN, "project-a", Decimal(1000))
    assert ledger_sums(world, "project-a") == (near, near, Decimal(0))
    assert credits.grant(ADMIN, "project-a", Decimal(-1)).balance_cents == 2**63 - 1100
