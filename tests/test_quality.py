"""The planning-quality benchmark (bench/quality.py): a faithful baseline, a safe and deterministic
replay of Climate's planner, and sane figures on tiny workloads. Nothing here is timed."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from bench.quality import (
    ADVANCE,
    DAY,
    GPU,
    HOUR,
    INTERACTIVE,
    POLICIES,
    T0,
    Calendar,
    Matcher,
    Profile,
    Request,
    Step,
    Workload,
    blazar_greedy,
    host_properties,
    make_workload,
    offline_bound,
    quality_targets,
    replay,
    run_quality,
)

NOW = T0 + 10 * DAY


def booked(
    calendar: Calendar, index: int, start: dt.datetime, end: dt.datetime, *hosts: int
) -> None:
    calendar.add(Request(index, start - DAY, start, end, len(hosts), len(hosts), ""), hosts)


def asking(low: int, high: int, start: dt.datetime = NOW + HOUR, hours: int = 2) -> Request:
    return Request(99, NOW, start, start + hours * HOUR, low, high, "")


@pytest.fixture
def calendar() -> Calendar:
    """Hosts 1 to 5. Host 1 is booked in the window, host 2 after it, host 3 had a lease that has
    ended; hosts 4 and 5 never had one."""
    cal = Calendar(range(1, 6), longest=7 * DAY)
    booked(cal, 1, NOW, NOW + 5 * HOUR, 1)
    booked(cal, 2, NOW + 10 * HOUR, NOW + 12 * HOUR, 2)
    booked(cal, 3, NOW - 3 * DAY, NOW - DAY, 3)
    return cal


def test_greedy_takes_never_allocated_hosts_first_in_id_order(calendar: Calendar) -> None:
    # Host 3's allocation ended (Blazar deleted its rows): it counts as not allocated.
    assert blazar_greedy(calendar, asking(1, 2), [1, 2, 3, 4, 5]) == [3, 4]
    # At least min not allocated: only those, even though host 2 is free in the window too.
    assert blazar_greedy(calendar, asking(3, 5), [1, 2, 3, 4, 5]) == [3, 4, 5]


def test_greedy_falls_back_to_free_allocated_hosts_then_the_others(calendar: Calendar) -> None:
    # Fewer than min not allocated: the allocated hosts free for the window come first.
    assert blazar_greedy(calendar, asking(4, 5), [1, 2, 3, 4, 5]) == [2, 3, 4, 5]
    assert blazar_greedy(calendar, asking(2, 2), [1, 2, 4]) == [2, 4]
    # Host 1 is busy in the window; with it, too few: refused.
    assert blazar_greedy(calendar, asking(5, 5), [1, 2, 3, 4, 5]) == []
    # Later, host 1 is free for the window but still allocated (its lease has not ended).
    later = asking(2, 2, start=NOW + 6 * HOUR, hours=1)
    assert blazar_greedy(calendar, later, [1, 2, 4]) == [1, 2]


def test_greedy_only_looks_at_matching_hosts(calendar: Calendar) -> None:
    assert blazar_greedy(calendar, asking(1, 5), [2, 5]) == [5]
    assert blazar_greedy(calendar, asking(1, 1), [1]) == []


@pytest.mark.parametrize("profile", [INTERACTIVE, ADVANCE], ids=lambda p: p.name)
def test_workload_is_seeded_and_exactly_at_the_offered_load(profile: Profile) -> None:
    one = make_workload(seed=3, load=0.8, hosts=16, horizon_days=6, profile=profile)
    assert one == make_workload(seed=3, load=0.8, hosts=16, horizon_days=6, profile=profile)
    assert one != make_workload(seed=4, load=0.8, hosts=16, horizon_days=6, profile=profile)
    # The last request is cut where the load is reached: exact to a minute of its hosts.
    assert math.isclose(one.offered_load, 0.8, abs_tol=16 * 60 / (16 * 6 * 86400))
    arrivals = [r.arrival for r in one.requests]
    assert arrivals == sorted(arrivals)
    matcher = Matcher(one.hosts)
    for r in one.requests:
        assert r.arrival <= r.start < r.end
        assert 1 <= r.min <= r.max <= len(matcher(r.properties))


def test_advance_workload_books_ahead_with_multi_host_experiments() -> None:
    requests = make_workload(seed=1, profile=ADVANCE).requests
    ahead = sum(1 for r in requests if DAY <= r.start - r.arrival <= 14 * DAY)
    assert ahead / len(requests) > 0.65
    assert max(r.start - r.arrival for r in requests) <= 14 * DAY
    wide = [r for r in requests if r.max >= 8]
    assert 0.3 < len(wide) / len(requests) < 0.5
    assert max(r.max for r in requests) == 32
    assert max(r.max for r in requests if r.properties == GPU) <= 16


def small_contended_workload() -> Workload:
    """Few hosts, many bookings ahead: re-optimisation has work to do."""
    return make_workload(seed=7, load=0.8, hosts=12, horizon_days=20, profile=ADVANCE)


def test_climate_never_double_books_nor_breaks_a_promise() -> None:
    workload = small_contended_workload()
    log: list[Step] = []
    result = replay(workload, "climate", log)
    by_index = {r.index: r for r in workload.requests}
    matcher = Matcher(workload.hosts)
    held: dict[int, set[int]] = {}
    moves = 0
    for step in log:
        request = by_index[step.reservation]
        if not step.removed:  # an admission
            assert step.at == request.arrival and step.reservation not in held
            assert request.min <= len(step.added) <= request.max
            held[step.reservation] = set(step.added)
            continue
        moves += 1
        # Only a lease that has not started moves; it keeps its count and its properties.
        assert request.start > step.at
        assert step.removed <= held[step.reservation]
        count = len(held[step.reservation])
        held[step.reservation] = (held[step.reservation] - step.removed) | step.added
        assert len(held[step.reservation]) == count
        assert held[step.reservation] <= set(matcher(request.properties))
    assert moves > 0, "the workload should exercise re-optimisation"
    assert len(held) == result["admitted"]
    for host in range(1, len(workload.hosts) + 1):
        windows = sorted(
            (by_index[i].start, by_index[i].end) for i, hosts in held.items() if host in hosts
        )
        for (_, end), (start, _) in zip(windows, windows[1:], strict=False):
            assert end <= start, f"host {host} is booked twice at once"


@pytest.mark.parametrize("policy", POLICIES)
def test_replay_is_deterministic(policy: str) -> None:
    workload = small_contended_workload()
    runs = []
    for _ in range(2):
        log: list[Step] = []
        result = replay(workload, policy, log)
        result.pop("seconds")
        result.get("repack", {}).pop("seconds", None)
        result.get("repack", {}).pop("slowest_ms", None)
        runs.append((result, log))
    assert runs[0] == runs[1]


def test_the_ceiling_bounds_every_policy() -> None:
    workload = small_contended_workload()
    admitted = {p: replay(workload, p)["admitted"] for p in POLICIES}
    bound = offline_bound(workload, max(admitted.values()))
    assert max(admitted.values()) <= bound <= len(workload.requests)
    # Three requests asking for all 4 hosts at once: at most one fits, whatever the planner.
    hosts = host_properties(4)
    clash = [Request(i, T0, T0 + HOUR, T0 + 3 * HOUR, 4, 4, "") for i in range(3)]
    alone = Request(3, T0, T0 + 5 * HOUR, T0 + 6 * HOUR, 1, 1, "")
    tiny = Workload("hand-made", 0, hosts, [*clash, alone], (T0, T0 + DAY), 0.0)
    assert offline_bound(tiny, 2) == pytest.approx(2, abs=1e-6)


def test_run_quality_on_tiny_workloads() -> None:
    result = run_quality(seed=5, load=0.8, hosts=16, horizon_days=6)
    assert set(result["workloads"]) == {"interactive", "advance"}
    for one in result["workloads"].values():
        requests = one["workload"]["requests"]
        assert requests > 10
        policies = one["policies"]
        assert set(policies) == set(POLICIES)
        for r in policies.values():
            assert r["requests"] == requests
            assert 0 < r["admitted"] <= requests
            assert r["acceptance"] == r["admitted"] / requests
            assert 0 < r["utilisation"] <= 1
            assert 0 < r["demand_admitted"] <= 1
            assert r["refused_capacity"] + r["refused_placement"] == requests - r["admitted"]
        repack = policies["climate"]["repack"]
        assert 0 <= repack["admitted"] <= repack["attempts"]
        base = policies["blazar-greedy"]["admitted"]
        assert math.isclose(
            one["gain_percent"]["climate"], (policies["climate"]["admitted"] / base - 1) * 100
        )
        assert one["ceiling"]["admitted"] >= max(r["admitted"] for r in policies.values())
        for kind in ("max hosts", "lead time", "properties"):
            rows = [row for row in one["refusals"] if row["by"] == kind]
            assert sum(row["requests"] for row in rows) == requests
            for policy, r in policies.items():
                assert sum(row["refused"][policy] for row in rows) == requests - r["admitted"]
    (target,) = quality_targets(result)
    advance = result["workloads"]["advance"]
    assert target.measured == advance["gain_percent"]["climate"]
    assert target.goal == 15 and target.higher_is_better
    assert "advance" in target.name
