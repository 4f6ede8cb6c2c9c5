"""Credits, by property (docs/credits.md): the quote against a brute-force oracle in exact
fractions; random sequences of grants, creates, updates, deletes and ends keep the ledger's sum
equal to the balance, never below zero, and leave nothing encumbered once every lease ended."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from climate import pricing
from climate.backends import load_backend
from climate.config import Settings
from climate.db import credits as credit_rows
from climate.db.engine import Database
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock
from climate.domain.requests import LeaseChanges
from climate.errors import ClimateError, NotEnoughCredits
from climate.manager.service import Manager
from climate.pricing import PriceTable, Use
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.credits import CreditsService
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ADMIN, T0
from tests.helpers import host_request

HOUR = dt.timedelta(hours=1)
PRICES = {"physical:host": "1.37", "physical:host[gpu=a100]": "4.05", "virtual:volume": "0.0003"}
TYPES = ("physical:host", "virtual:volume", "device")
PROPERTIES = (
    {},
    {"gpu": "a100"},
    {"su_factor": "2.5"},
    {"gpu": "a100", "su_factor": "0.75"},
    {"su_factor": "bogus"},
    {"su_factor": "-1"},
)


def best_price(table: dict[str, str], kind: str, props: dict[str, str]) -> Fraction:
    """The highest matching premium, else the flat price, else nothing."""
    premiums = []
    for rule, price in table.items():
        if rule.startswith(kind + "[") and rule.endswith("]"):
            name, value = rule[len(kind) + 1 : -1].split("=", 1)
            if props.get(name) == value:
                premiums.append(Fraction(Decimal(price)))
    if premiums:
        return max(premiums)
    return Fraction(Decimal(table[kind])) if kind in table else Fraction(0)


def weight(props: dict[str, str]) -> Fraction:
    text = props.get("su_factor")
    if text is None:
        return Fraction(1)
    try:
        found = Fraction(Decimal(text))
    except ArithmeticError:
        return Fraction(1)
    return found if found >= 0 else Fraction(1)


def oracle(table: dict[str, str], uses: list[tuple[str, dict[str, str], int, int]]) -> Decimal:
    """The quote by hand, in exact fractions, rounded once to the cent, half to even."""
    total = sum(
        (
            best_price(table, kind, props)
            * weight(props)
            * units
            * Fraction(max(us, 0), 3600 * 10**6)
            for kind, props, units, us in uses
        ),
        Fraction(0),
    )
    cents = total * 100
    floor = cents.numerator // cents.denominator
    rest = cents - floor
    up = rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2 == 1)
    return Decimal(floor + up) / 100


USES = st.lists(
    st.tuples(
        st.sampled_from(TYPES),
        st.sampled_from(PROPERTIES),
        st.integers(1, 2000),
        st.integers(-10, 40 * 24 * 3600 * 10**6),
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(uses=USES)
def test_the_quote_is_the_oracle_s(uses: list[tuple[str, dict[str, str], int, int]]) -> None:
    table = PriceTable.parse(PRICES)
    found = pricing.quote(table, "su_factor", [Use(k, p, Decimal(u), us) for k, p, u, us in uses])
    assert found == oracle(PRICES, uses)
    assert found == found.quantize(Decimal("0.01"))


@settings(max_examples=100, deadline=None)
@given(uses=USES, cut=st.integers(0, 10**12))
def test_a_use_cut_short_never_costs_more(
    uses: list[tuple[str, dict[str, str], int, int]], cut: int
) -> None:
    table = PriceTable.parse(PRICES)
    whole = [Use(k, p, Decimal(u), us) for k, p, u, us in uses]
    shorter = [Use(k, p, Decimal(u), min(us, cut)) for k, p, u, us in uses]
    assert pricing.quote(table, "su_factor", shorter) <= pricing.quote(table, "su_factor", whole)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("grant"), st.integers(1, 3000)),
        st.tuples(st.just("create"), st.integers(0, 2), st.integers(0, 6), st.integers(1, 4)),
        st.tuples(st.just("update"), st.integers(0, 7), st.integers(1, 6)),
        st.tuples(st.just("delete"), st.integers(0, 7)),
        st.tuples(st.just("advance"), st.integers(10, 200)),
    ),
    min_size=1,
    max_size=14,
)


@pytest.fixture
def world(settings: Settings, sqlite_url: str) -> tuple[ServiceContext, Manager]:
    priced = settings.model_copy(
        update={
            "prices": {"physical:host": "1.37", "physical:host[gpu=a100]": "4.05"},
            "credits": True,
        }
    )
    ctx = build_context(priced, Database(sqlite_url), ManualClock(T0))
    hosts = HostService(ctx)
    for n, props in enumerate(({}, {"gpu": "a100"}, {"su_factor": "1.5"})):
        hosts.create(ADMIN, f"h{n}", {"slot": str(n), **props})
    return ctx, Manager(ctx, load_backend(priced))


def sums(ctx: ServiceContext, project: str) -> tuple[int, int, int]:
    with ctx.db.reader() as session:
        amounts, encumbered = credit_rows.totals(session, project)
        return credit_rows.balance(session, project) or 0, amounts, encumbered


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
def test_the_ledger_balances_over_random_operations(
    world: tuple[ServiceContext, Manager], ops: list[tuple[Any, ...]]
) -> None:
    ctx, manager = world
    clock = ctx.clock
    assert isinstance(clock, ManualClock)
    # Examples share the database: each is a project of its own, from the clock as it stands.
    actor = Actor("u", f"p-{uuid.uuid4().hex[:8]}", frozenset({"member"}))
    leases, credits = LeaseService(ctx), CreditsService(ctx)
    made: list[str] = []
    for n, op in enumerate(ops):
        try:
            if op[0] == "grant":
                credits.grant(ADMIN, actor.project_id, Decimal(op[1]) / 100)
            elif op[0] == "create":
                _, slot, offset, length = op
                start = clock.now() + offset * HOUR + dt.timedelta(minutes=1)
                props = f'["==", "$slot", "{slot}"]'
                request = host_request(
                    f"l{n}", start, start + length * HOUR, resource_properties=props
                )
                quote = leases.dry_run(actor, request).quote
                lease = leases.create(actor, request)
                made.append(lease.id)
                assert quote is not None
                with ctx.db.reader() as session:
                    found = credit_rows.encumbered(session, lease.id) or 0
                assert found == pricing.cents(quote)
            elif op[0] == "update" and made:
                lease_id = made[op[1] % len(made)]
                lease = leases.get(actor, lease_id)
                leases.update(actor, lease_id, LeaseChanges(end=lease.start_date + op[2] * HOUR))
            elif op[0] == "delete" and made:
                leases.delete(actor, made[op[1] % len(made)])
            elif op[0] == "advance":
                clock.advance(dt.timedelta(minutes=op[1]))
                manager.run_due()
        except NotEnoughCredits as refused:
            assert Decimal(refused.shortfall) > 0
        except ClimateError as refused:
            assert refused.status < 500, refused
        balance, amounts, encumbered = sums(ctx, actor.project_id)
        assert balance >= 0 and encumbered >= 0
        assert amounts == balance
    clock.advance(dt.timedelta(days=2))
    manager.run_due()
    balance, amounts, encumbered = sums(ctx, actor.project_id)
    assert (amounts, encumbered) == (balance, 0)
    event(" ".join(sorted({w.entry.kind for w in credits.ledger(ADMIN, actor.project_id)})))
