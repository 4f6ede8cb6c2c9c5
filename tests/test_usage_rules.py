"""Usage rules at admission: each kind at, just under and just over its limit, their scope by
resource type and property, exemptions, every admission step, and what is recorded."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
from typing import Any

import pytest
from sqlalchemy import select

from climate.config import Settings
from climate.db.engine import Database
from climate.db.records import AuditLog
from climate.db.tables import Lease, OutboxMessage
from climate.domain.admission import AdmissionRefused, UpdateRefused
from climate.domain.clock import ManualClock
from climate.domain.status import LeaseStatus, LeaseType
from climate.errors import UsageRuleBroken
from climate.runtime import build_context
from climate.services.availability import AvailabilityQuery, AvailabilityService
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseRequest, LeaseService
from climate.services.series import Conflicts, SeriesRequest, SeriesService
from tests.conftest import ADMIN, ALICE, BOB, T0
from tests.helpers import add_hosts, host_request

H = dt.timedelta(hours=1)
M = dt.timedelta(minutes=1)
CAROL = dataclasses.replace(ALICE, user_id="carol")
"""Alice's colleague in project-a."""


def context(
    settings: Settings, db: Database, clock: ManualClock, *rules: dict[str, Any]
) -> ServiceContext:
    return build_context(settings.model_copy(update={"usage_rules": rules}), db, clock)


def refused(call: Any) -> UsageRuleBroken:
    with pytest.raises(UsageRuleBroken) as caught:
        call()
    return caught.value


def audit_rows(ctx: ServiceContext, action: str) -> list[tuple[AuditLog, dict[str, Any]]]:
    """The audit rows of ``action``, each with its detail decoded."""
    with ctx.db.reader() as session:
        rows = session.scalars(select(AuditLog).where(AuditLog.action == action))
        return [(row, json.loads(str(row.detail))) for row in rows]


@pytest.fixture
def gpu_hosts(hosts: HostService) -> list[int]:
    return add_hosts(hosts, 3, prefix="gpu", gpu="a100", gpu_count="4") + add_hosts(
        hosts, 3, prefix="cpu", gpu="none"
    )


# -- window rules ----------------------------------------------------------------------------


@pytest.mark.parametrize("length", [2 * H - M, 2 * H, 2 * H + M])
def test_max_length(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int], length: dt.timedelta
) -> None:
    ctx = context(settings, db, clock, {"name": "short", "kind": "max_length", "limit": "2h"})
    leases = LeaseService(ctx)
    request = host_request("l", T0 + H, T0 + H + length)
    if length <= 2 * H:
        assert leases.create(ALICE, request).status == LeaseStatus.PENDING
        return
    error = refused(lambda: leases.create(ALICE, request))
    assert error.status == 403
    assert str(error).startswith(
        "usage rule 'short' (max_length: a lease may last at most 2 hours)"
    )
    assert "this lease lasts 2 hours 1 minute; breaks the limit" in str(error)
    assert {"rules": list(error.rules)} == {
        "rules": [
            {
                "rule": "short",
                "kind": "max_length",
                "limit": 7200,
                "figure": 7260,
                "unit": "seconds",
                "allowed": False,
                "exempt": False,
                "message": str(error),
            }
        ]
    }
    with ctx.db.reader() as session:
        assert session.scalars(select(Lease)).all() == []


@pytest.mark.parametrize("ahead", [24 * H - M, 24 * H, 24 * H + M])
def test_max_advance(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int], ahead: dt.timedelta
) -> None:
    ctx = context(settings, db, clock, {"name": "soon", "kind": "max_advance", "limit": "1d"})
    leases = LeaseService(ctx)
    request = host_request("l", T0 + ahead, T0 + ahead + H)
    if ahead <= 24 * H:
        leases.create(ALICE, request)
    else:
        error = refused(lambda: leases.create(ALICE, request))
        assert "usage rule 'soon'" in str(error) and "starts 1 day 1 minute ahead" in str(error)


@pytest.mark.parametrize("before_end", [30 * M + M, 30 * M, 30 * M - M])
def test_extension_window(
    settings: Settings,
    db: Database,
    clock: ManualClock,
    gpu_hosts: list[int],
    before_end: dt.timedelta,
) -> None:
    ctx = context(settings, db, clock, {"name": "late", "kind": "extension_window", "limit": "30m"})
    leases = LeaseService(ctx)
    lease = leases.create(ALICE, host_request("l", T0 + H, T0 + 3 * H))
    clock.advance(3 * H - before_end)
    extend = LeaseChanges(end=T0 + 4 * H)
    if before_end <= 30 * M:
        assert leases.update(ALICE, lease.id, extend).end_date == T0 + 4 * H
    else:
        error = refused(lambda: leases.update(ALICE, lease.id, extend))
        assert "usage rule 'late'" in str(error)
        assert "it is asked 31 minutes before the lease ends" in str(error)
        assert leases.get(ALICE, lease.id).end_date == T0 + 3 * H
    # Shortening is no extension: never refused by it.
    leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 3 * H - before_end + 10 * M))


@pytest.mark.parametrize("longer", [H - M, H, H + M])
def test_max_extension(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int], longer: dt.timedelta
) -> None:
    ctx = context(settings, db, clock, {"name": "ext", "kind": "max_extension", "limit": 3600})
    leases = LeaseService(ctx)
    lease = leases.create(ALICE, host_request("l", T0 + H, T0 + 2 * H))
    extend = LeaseChanges(end=T0 + 2 * H + longer)
    if longer <= H:
        leases.update(ALICE, lease.id, extend)
    else:
        error = refused(lambda: leases.update(ALICE, lease.id, extend))
        assert error.rules[0]["figure"] == 3660
        assert error.rules[0]["limit"] == 3600


# -- consumption rules -----------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3])
def test_concurrent_gpus_of_matching_hosts_only(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int], count: int
) -> None:
    """Limit 8 GPUs of a100 hosts (4 each): 2 hosts at once are at the limit, 3 over; hosts
    without the property count nothing, and neither do leases that do not overlap."""
    rule = {
        "name": "gpus",
        "kind": "concurrent",
        "unit": "gpus",
        "limit": 8,
        "properties": '["==", "$gpu", "a100"]',
    }
    ctx = context(settings, db, clock, rule)
    leases = LeaseService(ctx)
    a100 = '["==", "$gpu", "a100"]'
    no_gpu = '["!=", "$gpu", "a100"]'
    leases.create(ALICE, host_request("cpu", T0 + H, T0 + 5 * H, 3, resource_properties=no_gpu))
    leases.create(ALICE, host_request("before", T0, T0 + H, 2, resource_properties=a100))
    for i in range(count - 1):
        leases.create(ALICE, host_request(f"g{i}", T0 + H, T0 + 3 * H, resource_properties=a100))
    last = host_request("last", T0 + 2 * H, T0 + 4 * H, resource_properties=a100)
    if count <= 2:
        leases.create(ALICE, last)
        assert audit_rows(ctx, "usage.allow")
        return
    error = refused(lambda: leases.create(ALICE, last))
    assert "usage rule 'gpus'" in str(error)
    assert "would hold 12 gpus at once; breaks the limit" in str(error)


def test_concurrent_per_user_and_per_project(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int]
) -> None:
    ctx = context(
        settings,
        db,
        clock,
        {"name": "mine", "kind": "concurrent", "unit": "hosts", "limit": 2},
        {"name": "ours", "kind": "concurrent", "unit": "hosts", "limit": 3, "per": "project"},
    )
    leases = LeaseService(ctx)
    window = (T0 + H, T0 + 2 * H)
    leases.create(ALICE, host_request("a", *window, 2))
    error = refused(lambda: leases.create(ALICE, host_request("a2", *window)))
    assert [r["rule"] for r in error.rules] == ["mine"]
    leases.create(CAROL, host_request("c", *window))  # her own 1, the project's 3
    error = refused(lambda: leases.create(CAROL, host_request("c2", *window)))
    assert [r["rule"] for r in error.rules] == ["ours"]
    leases.create(BOB, host_request("b", *window, 2))  # another project


@pytest.mark.parametrize("extra", [M, dt.timedelta(0)])
def test_rolling_budget(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int], extra: dt.timedelta
) -> None:
    """At most 2 host-days in any 10 days per user: two 1-day leases 9 days apart use it up;
    one more minute within the 10 days is over, a lease 10 days after the first is not."""
    rule = {"name": "budget", "kind": "budget", "unit": "hosts", "limit": 2, "window": "10d"}
    ctx = context(settings, db, clock, rule)
    leases = LeaseService(ctx)
    day = dt.timedelta(days=1)
    leases.create(ALICE, host_request("d1", T0, T0 + day))
    leases.create(ALICE, host_request("d2", T0 + 9 * day, T0 + 10 * day))
    leases.create(ALICE, host_request("later", T0 + 11 * day, T0 + 11 * day + H))
    leases.create(BOB, host_request("bob", T0 + 5 * day, T0 + 6 * day))
    request = host_request("more", T0 + 5 * day, T0 + 5 * day + extra)
    if extra == dt.timedelta(0):
        request = host_request("more", T0 + 5 * day, T0 + 5 * day + dt.timedelta(seconds=1))
        error = refused(lambda: leases.create(ALICE, request))
        assert error.rules[0]["figure"] > 2
        return
    error = refused(lambda: leases.create(ALICE, request))
    assert "would use 2.00069 host-days in 10 days; breaks the limit" in str(error)


def test_budget_at_its_limit_is_admitted(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int]
) -> None:
    rule = {"name": "budget", "kind": "budget", "unit": "hosts", "limit": 2, "window": "10d"}
    ctx = context(settings, db, clock, rule)
    leases = LeaseService(ctx)
    day = dt.timedelta(days=1)
    leases.create(ALICE, host_request("d1", T0, T0 + day))
    leases.create(ALICE, host_request("d2", T0 + 2 * day, T0 + 3 * day - M))
    leases.create(ALICE, host_request("d3", T0 + 4 * day, T0 + 4 * day + M))  # exactly 2
    refused(lambda: leases.create(ALICE, host_request("d4", T0 + 5 * day, T0 + 5 * day + M)))


@pytest.mark.parametrize("gap", [H - M, H, H + M])
def test_stacking(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int], gap: dt.timedelta
) -> None:
    """At most 2 leases in a chain less than 1 hour apart: a third one hour or more away from
    the chain is a chain of its own."""
    rule = {"name": "stack", "kind": "stacking", "limit": 2, "gap": "1h"}
    ctx = context(settings, db, clock, rule)
    leases = LeaseService(ctx)
    leases.create(ALICE, host_request("a", T0 + H, T0 + 2 * H))
    leases.create(ALICE, host_request("b", T0 + 2 * H, T0 + 3 * H))  # back to back: 2
    leases.create(BOB, host_request("bob", T0 + 3 * H, T0 + 4 * H))
    third = host_request("c", T0 + 3 * H + gap, T0 + 5 * H)
    if gap >= H:
        leases.create(ALICE, third)
    else:
        error = refused(lambda: leases.create(ALICE, third))
        assert "would make 3 leases less than 1 hour apart" in str(error)


@pytest.mark.parametrize("with_budget", [False, True])
def test_stacking_follows_the_chain_only_as_far_as_its_window(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int], with_budget: bool
) -> None:
    """Three back-to-back leases made before the rule; a fourth after them is judged on the
    chain within the rule's 2 hours around it (the last two and itself), whether or not a
    10-day budget makes admission read further back."""
    seed = LeaseService(context(settings, db, clock))
    for i, name in enumerate("abc"):
        seed.create(ALICE, host_request(name, T0 + (i + 1) * H, T0 + (i + 2) * H))
    stacking = {"name": "stack", "kind": "stacking", "limit": 3, "gap": "1h", "window": "2h"}
    budget = {"name": "budget", "kind": "budget", "unit": "hosts", "limit": 99, "window": "10d"}
    rules = (stacking, budget) if with_budget else (stacking,)
    leases = LeaseService(context(settings, db, clock, *rules))
    leases.create(ALICE, host_request("d", T0 + 4 * H, T0 + 5 * H))  # b, c, d
    overlapping = host_request("e", T0 + 4 * H + 30 * M, T0 + 5 * H)  # b, c, d, e
    error = refused(lambda: leases.create(ALICE, overlapping))
    assert "would make 4 leases less than 1 hour apart" in str(error)


def test_exempt_project_is_admitted_and_the_exemption_recorded(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int]
) -> None:
    rule = {"name": "short", "kind": "max_length", "limit": "1h", "exempt_projects": ["project-a"]}
    ctx = context(settings, db, clock, rule)
    leases = LeaseService(ctx)
    lease = leases.create(ALICE, host_request("long", T0 + H, T0 + 5 * H))
    refused(lambda: leases.create(BOB, host_request("long", T0 + H, T0 + 5 * H)))
    [(allowed, detail)] = audit_rows(ctx, "usage.allow")
    assert allowed.target_id == lease.id
    assert detail["rules"][0]["exempt"] is True


def test_scope_by_resource_type(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int]
) -> None:
    rule = {
        "name": "ips",
        "kind": "max_length",
        "limit": "1h",
        "resource_type": "virtual:floatingip",
    }
    leases = LeaseService(context(settings, db, clock, rule))
    leases.create(ALICE, host_request("hosts", T0 + H, T0 + 5 * H))  # hosts: not in its scope


# -- every admission step --------------------------------------------------------------------


def test_refusal_is_recorded_after_the_rollback_and_notified(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int]
) -> None:
    hooked = settings.model_copy(update={"webhooks": ("http://127.0.0.1:9/hook",)})
    ctx = context(hooked, db, clock, {"name": "short", "kind": "max_length", "limit": "1h"})
    leases = LeaseService(ctx)
    lease = leases.create(ALICE, host_request("l", T0 + H, T0 + 2 * H))
    refused(lambda: leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 3 * H)))
    [(denied, detail)] = audit_rows(ctx, "usage.deny")
    assert denied.target_id == lease.id and denied.actor_user == "alice"
    assert detail["step"] == "update" and detail["rules"][0]["figure"] == 7200
    with ctx.db.reader() as session:
        [message] = session.scalars(
            select(OutboxMessage).where(OutboxMessage.topic == "usage.deny")
        ).all()
    assert message.payload["rules"][0]["rule"] == "short"
    assert message.payload["lease"]["id"] == lease.id
    assert leases.get(ALICE, lease.id).end_date == T0 + 2 * H


def test_dry_run_reports_the_broken_rules_and_records_nothing(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int]
) -> None:
    ctx = context(
        settings,
        db,
        clock,
        {"name": "short", "kind": "max_length", "limit": "1h"},
        {"name": "mine", "kind": "concurrent", "unit": "hosts", "limit": 1},
    )
    leases = LeaseService(ctx)
    error = refused(lambda: leases.dry_run(ALICE, host_request("l", T0 + H, T0 + 3 * H, 2)))
    # The window alone breaks "short" before the hosts are chosen.
    assert [r["rule"] for r in error.rules] == ["short"]
    error = refused(lambda: leases.dry_run(ALICE, host_request("l", T0 + H, T0 + 2 * H, 2)))
    assert [r["rule"] for r in error.rules] == ["mine"]
    assert audit_rows(ctx, "usage.deny") == [] and audit_rows(ctx, "usage.allow") == []


def test_waiting_lease_breaking_a_window_rule_is_refused_at_once(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int]
) -> None:
    ctx = context(settings, db, clock, {"name": "short", "kind": "max_length", "limit": "1h"})
    leases = LeaseService(ctx)
    request = dataclasses.replace(
        host_request("w", None, T0 + 2 * H),
        lease_type=LeaseType.BEST_EFFORT,
        deadline=T0 + 5 * H,
    )
    refused(lambda: leases.create(ALICE, request))
    with ctx.db.reader() as session:
        assert session.scalars(select(Lease)).all() == []


def test_best_effort_lease_waits_for_its_quota(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int]
) -> None:
    """A lease over a consumption limit waits in the queue (status_reason names the rule) and
    is admitted once the owner's other lease is gone."""
    ctx = context(
        settings, db, clock, {"name": "one", "kind": "concurrent", "unit": "hosts", "limit": 1}
    )
    leases = LeaseService(ctx)
    first = leases.create(ALICE, host_request("first", None, T0 + 3 * H))
    request = dataclasses.replace(
        host_request("waits", None, T0 + H), lease_type=LeaseType.BEST_EFFORT, deadline=T0 + 5 * H
    )
    waiting = leases.create(ALICE, request)
    assert waiting.status == LeaseStatus.IN_PROGRESS
    assert waiting.status_reason is not None and "usage rule 'one'" in waiting.status_reason
    assert leases.serve_queue(True) == 0
    leases.delete(ALICE, first.id)
    assert leases.serve_queue(True) == 1
    assert leases.get(ALICE, waiting.id).status == LeaseStatus.PENDING


def test_confirming_a_hold_checks_the_rules_again(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int]
) -> None:
    leases = LeaseService(build_context(settings, db, clock))
    held = leases.create(ALICE, dataclasses.replace(host_request("h", T0 + H, T0 + 5 * H), hold=H))
    strict = context(settings, db, clock, {"name": "short", "kind": "max_length", "limit": "2h"})
    error = refused(lambda: LeaseService(strict).confirm(ALICE, held.id))
    assert "usage rule 'short'" in str(error)
    assert leases.get(ALICE, held.id).status == LeaseStatus.HELD


def test_series_skips_the_occurrences_a_rule_refuses(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int]
) -> None:
    rule = {"name": "budget", "kind": "budget", "unit": "hosts", "limit": 0.25, "window": "7d"}
    ctx = context(settings, db, clock, rule)
    leases = LeaseService(ctx)
    series = SeriesService(ctx, leases)
    request = SeriesRequest(
        name="daily",
        start=T0 + H,
        duration=2 * H,
        rrule="FREQ=DAILY;COUNT=5",
        reservations=host_request("x", None, T0).reservations,
        conflicts=Conflicts.SKIP,
    )
    view = series.create(ALICE, request)
    assert len(view.leases) == 3  # 3 x 2 hours = 6 host-hours = 0.25 host-days
    assert all("usage rule 'budget'" in s.refused.message for s in view.skipped)


def test_update_offers_never_break_a_rule(
    settings: Settings, db: Database, clock: ManualClock, hosts: HostService
) -> None:
    """Refused for capacity, an update is offered only what the rules allow: the "shorter"
    offer would be admitted, the "later_start" one breaks max_advance and is not made."""
    add_hosts(hosts, 1)
    ctx = context(settings, db, clock, {"name": "soon", "kind": "max_advance", "limit": "3h"})
    leases = LeaseService(ctx)
    mine = leases.create(ALICE, host_request("mine", T0 + H, T0 + 2 * H))
    leases.create(BOB, host_request("bob", T0 + 3 * H, T0 + 4 * H))
    with pytest.raises(AdmissionRefused) as caught:
        leases.update(ALICE, mine.id, LeaseChanges(end=T0 + 5 * H))
    found = caught.value.refused
    assert isinstance(found, UpdateRefused)
    kinds = [o.kind for o in found.offers]
    assert "later_start" not in kinds and "shorter" in kinds


def test_request_with_lease_request_fields(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int]
) -> None:
    """An admin is held to the rules like anyone (exemptions are per project)."""
    ctx = context(settings, db, clock, {"name": "short", "kind": "max_length", "limit": "1h"})
    request = LeaseRequest(
        name="x",
        start=T0 + H,
        end=T0 + 3 * H,
        reservations=host_request("x", None, T0).reservations,
    )
    refused(lambda: LeaseService(ctx).create(ADMIN, request))


# -- what a request would break, before it is made -------------------------------------------


def test_availability_windows_name_the_rules_they_would_break(
    settings: Settings, db: Database, clock: ManualClock, hosts: HostService
) -> None:
    add_hosts(hosts, 1, gpu_count="2")
    ctx = context(
        settings,
        db,
        clock,
        {"name": "soon", "kind": "max_advance", "limit": "3h"},
        {
            "name": "gpus",
            "kind": "concurrent",
            "unit": "gpus",
            "limit": 1,
            "exempt_projects": ["project-b"],
        },
    )
    leases = LeaseService(ctx)
    leases.create(BOB, host_request("bob", T0, T0 + 2 * H))
    search = AvailabilityService(ctx).search
    asked = host_request("x", None, T0).reservations
    [window] = search(ALICE, AvailabilityQuery(asked, 3600, T0 + 10 * H))
    assert window.start == T0 + 2 * H
    assert [r["rule"] for r in window.usage_rules] == ["gpus"]
    assert window.usage_rules[0]["figure"] == 2
    [later] = search(ALICE, AvailabilityQuery(asked, 3600, T0 + 10 * H, T0 + 5 * H))
    assert [r["rule"] for r in later.usage_rules] == ["soon", "gpus"]


def test_counter_offers_are_only_what_the_rules_allow(
    settings: Settings, db: Database, clock: ManualClock, hosts: HostService
) -> None:
    add_hosts(hosts, 1)
    request = host_request("x", T0 + 2 * H, T0 + 3 * H)
    for rules, offered in (((), ["later_start"]), ((SOON,), [])):
        ctx = context(settings, db, clock, *rules)
        leases = LeaseService(ctx)
        bob = leases.create(BOB, host_request("bob", T0 + H, T0 + 3 * H))
        with pytest.raises(AdmissionRefused) as caught:
            leases.create(ALICE, request)
        assert [o.kind for o in caught.value.refused.refusal.offers] == offered
        leases.delete(BOB, bob.id)


SOON = {"name": "soon", "kind": "max_advance", "limit": "150m"}


def test_concurrent_admissions_cannot_both_take_the_last_unit(
    settings: Settings, db: Database, clock: ManualClock, gpu_hosts: list[int]
) -> None:
    """Eight admissions at once for a quota of one host: the rule is checked under the
    admission lock, so exactly one is admitted."""
    ctx = context(
        settings, db, clock, {"name": "one", "kind": "concurrent", "unit": "hosts", "limit": 1}
    )
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def admit(i: int) -> None:
        leases = LeaseService(ctx)
        barrier.wait()
        try:
            leases.create(ALICE, host_request(f"race-{i}", T0 + H, T0 + 2 * H))
            outcomes.append("admitted")
        except UsageRuleBroken:
            outcomes.append("refused")

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["admitted"] + ["refused"] * 7
    assert len(audit_rows(ctx, "usage.deny")) == 7
