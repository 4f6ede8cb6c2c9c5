"""A new lease's user read is narrowed to the rules that can apply to its hosts
(``fairshare.admission._reaching``): the decisions are the same as with the whole range, bit
for bit, and the read is narrower when a rule's scope leaves the lease out."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from climate.config import Settings
from climate.db.engine import Database
from climate.domain.clock import ManualClock
from climate.fairshare import admission
from climate.fairshare.rule_config import parse_rules
from climate.fairshare.rules import DAY, HOSTS, Admission, Span, evaluate, reach
from climate.runtime import build_context
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ALICE, T0
from tests.helpers import add_hosts, host_request

GPU = {"gpu": "a100", "gpu_count": "4", "vcpus": 32}
CPU = {"gpu": "none", "vcpus": 16}
AMOUNTS = {
    id(GPU): {"hosts": 1.0, "vcpus": 32.0, "gpus": 4.0},
    id(CPU): {"hosts": 1.0, "vcpus": 16.0, "gpus": 0.0},
}
A100 = '["==", "$gpu", "a100"]'
RULES: tuple[dict[str, Any], ...] = (
    {"name": "gpu-days", "kind": "budget", "unit": "gpus", "limit": 60, "window": "30d"}
    | {"properties": A100},
    {"name": "host-days", "kind": "budget", "unit": "hosts", "limit": 4, "window": "3d"},
    {"name": "hosts", "kind": "concurrent", "unit": "hosts", "limit": 3},
    {"name": "gpus", "kind": "concurrent", "unit": "gpus", "limit": 8, "properties": A100},
    {"name": "stacking", "kind": "stacking", "limit": 3, "gap": "10m", "window": "1d"},
    {"name": "gpu-stacking", "kind": "stacking", "limit": 2, "gap": "1h", "window": "5d"}
    | {"properties": A100},
    {"name": "project-days", "kind": "budget", "unit": "vcpus", "per": "project", "limit": 900}
    | {"window": "7d"},
    {"name": "length", "kind": "max_length", "limit": "3d"},
)
NOW = 1_900_000_000.0
H = dt.timedelta(hours=1)
MS = st.integers(0, 40 * 86_400_000).map(lambda ms: NOW - 20 * DAY + ms / 1000)


@st.composite
def held(draw: st.DrawFn, lease_id: str) -> Span:
    start = draw(MS)
    length = draw(st.integers(1_000, 3 * 86_400_000)) / 1000
    props = draw(st.sampled_from([GPU, CPU]))
    user = draw(st.sampled_from(["alice", "carol"]))
    return Span(lease_id, user, HOSTS, props, AMOUNTS[id(props)], start, start + length)


@st.composite
def cases(draw: st.DrawFn) -> tuple[tuple[Any, ...], Admission, list[Span], list[Span]]:
    scoped = draw(st.sampled_from([RULES[0], RULES[5]]))  # a wide reach, GPU hosts only
    others = draw(st.lists(st.sampled_from(RULES), unique_by=str))
    rules = parse_rules([scoped, *(r for r in others if r is not scoped)])
    start = NOW + draw(st.integers(0, 5 * 86_400_000)) / 1000
    end = start + draw(st.integers(60_000, 2 * 86_400_000)) / 1000
    history = [draw(held(f"l{i}")) for i in range(draw(st.integers(0, 40)))]
    hosts = draw(st.lists(st.sampled_from([CPU, CPU, GPU]), min_size=1, max_size=3))
    own = [Span("new", "alice", HOSTS, p, AMOUNTS[id(p)], start, end) for p in hosts]
    lease = Admission("new", "p", "alice", NOW, start, end, frozenset({HOSTS}))
    return rules, lease, own, history


def read(spans: list[Span], bounds: tuple[float, float]) -> list[Span]:
    """What the held statement reads of ``spans`` over ``bounds``."""
    return [s for s in spans if s.end > bounds[0] and s.start < bounds[1]]


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_the_narrowed_read_decides_as_the_whole_one(
    case: tuple[tuple[Any, ...], Admission, list[Span], list[Span]],
) -> None:
    rules, lease, own, history = case
    whole = reach(rules, lease, "user") or (lease.start, lease.end)
    narrowed = admission._reaching(rules, [(s.resource_type, s.properties) for s in own])
    mine = reach(narrowed, lease, "user") or (lease.start, lease.end)
    ours = reach(rules, lease, "project")
    users = [s for s in history if s.user_id == "alice"] + own
    project = None if ours is None else read(history + own, ours)

    def decided(bounds: tuple[float, float]) -> list[tuple[str, bool, float, bool]]:
        found = evaluate(rules, lease, read(users, bounds), project)
        return [(d.rule.name, d.allowed, d.figure, d.exempt) for d in found]

    assert whole[0] <= mine[0] and mine[1] <= whole[1]
    assert decided(mine) == decided(whole)


@pytest.mark.parametrize("gpu", [True, False])
def test_a_new_lease_out_of_a_budget_s_scope_reads_only_what_the_others_need(
    settings: Settings,
    db: Database,
    clock: ManualClock,
    hosts: HostService,
    monkeypatch: pytest.MonkeyPatch,
    gpu: bool,
) -> None:
    rules = (RULES[0], RULES[2])  # the GPU budget over 30 days, concurrent hosts
    ctx = build_context(settings.model_copy(update={"usage_rules": rules}), db, clock)
    add_hosts(hosts, 1, prefix="gpu", gpu="a100", gpu_count="4")
    add_hosts(hosts, 1, prefix="cpu", gpu="none")
    asked: list[tuple[float, float]] = []
    real = admission.spans

    def spy(*args: Any) -> tuple[list[Span], list[Span] | None]:
        asked.append(args[4])  # the user's range, from the calendar or the database
        return real(*args)

    monkeypatch.setattr(admission, "spans", spy)
    start, end = T0 + H, T0 + 3 * H
    wanted = f'["==", "$gpu", "{"a100" if gpu else "none"}"]'
    LeaseService(ctx).create(ALICE, host_request("l", start, end, resource_properties=wanted))
    pad = dt.timedelta(days=30) if gpu else dt.timedelta(0)
    assert asked == [((start - pad).timestamp(), (end + pad).timestamp())]


def test_a_span_read_for_another_rule_moves_no_budget_s_figure() -> None:
    """A span read only for a rule that does not apply (the GPU budget's 30 days, for a lease
    of a CPU host) lies in no window of the user's 1-day budget: its figure is the same, bit
    for bit, so the read is narrowed even though a user budget applies."""
    vcpu_days = {"name": "vcpu-days", "kind": "budget", "unit": "vcpus", "limit": 10**6}
    rules = parse_rules([RULES[0], vcpu_days | {"window": "1d"}])
    lease = Admission("new", "p", "alice", NOW, 1900067023.24, 1900134901.286, frozenset({HOSTS}))
    own = Span("new", "alice", HOSTS, CPU, {"vcpus": 1.0}, lease.start, lease.end)
    old = Span("old", "alice", HOSTS, CPU, {"vcpus": 4096.0}, 1897937440.836, 1899534591.25)
    whole = reach(rules, lease, "user")
    alone = reach(rules[1:], lease, "user")
    assert whole is not None and alone is not None
    assert read([old], whole) == [old] and read([old], alone) == []

    def figures(bounds: tuple[float, float]) -> list[float]:
        return [d.figure for d in evaluate(rules, lease, read([old, own], bounds), None)]

    assert figures(whole) == figures(alone) == [pytest.approx((lease.end - lease.start) / DAY)]
    assert list(admission._reaching(rules, [(HOSTS, CPU)])) == list(rules[1:])


def test_a_stacking_scoped_to_the_lease_s_hosts_keeps_its_reach() -> None:
    rules = parse_rules([RULES[5], RULES[2]])  # stacking of GPU hosts over 5 days, hosts
    start, end = NOW, NOW + 3_600
    lease = Admission("new", "p", "alice", NOW - 60, start, end, frozenset({HOSTS}))
    chained = [
        Span("a", "alice", HOSTS, GPU, AMOUNTS[id(GPU)], start - 3 * DAY, start - 1.5 * DAY),
        Span("b", "alice", HOSTS, GPU, AMOUNTS[id(GPU)], start - 1.6 * DAY, start + 60),
    ]
    for props, figure in ((GPU, 3.0), (CPU, None)):
        own = Span("new", "alice", HOSTS, props, AMOUNTS[id(props)], start, end)
        narrowed = admission._reaching(rules, [(HOSTS, props)])
        mine = reach(narrowed, lease, "user") or (start, end)
        found = evaluate(rules, lease, read([*chained, own], mine), None)
        assert {d.rule.name: d.figure for d in found}.get("gpu-stacking") == figure
