"""The planning-quality benchmark (bench/quality.py) on a tiny workload: sane figures, quickly."""

from __future__ import annotations

import math

from bench.quality import make_workload, quality_targets, run_quality


def test_workload_is_seeded_and_at_the_offered_load() -> None:
    one = make_workload(seed=3, load=0.8, hosts=8, horizon_days=4)
    assert one == make_workload(seed=3, load=0.8, hosts=8, horizon_days=4)
    assert one != make_workload(seed=4, load=0.8, hosts=8, horizon_days=4)
    # Drawn until the load is reached: one request adds at most max / hosts = 8 / 8.
    assert 0.8 <= one.offered_load < 0.8 + 1.0
    arrivals = [r.arrival for r in one.requests]
    assert arrivals == sorted(arrivals)
    for r in one.requests:
        assert r.arrival <= r.start < r.end
        assert 1 <= r.min <= r.max <= 8


def test_run_quality_on_a_tiny_workload() -> None:
    result = run_quality(seed=5, load=0.8, hosts=8, horizon_days=4)
    requests = result["workload"]["requests"]
    assert requests > 10
    policies = result["policies"]
    assert set(policies) == {"blazar-greedy", "climate-bestfit", "climate"}
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
    gain = result["gain_percent"]["climate"]
    assert math.isclose(gain, (policies["climate"]["admitted"] / base - 1) * 100)
    (target,) = quality_targets(result)
    assert target.measured == gain and target.goal == 15 and target.higher_is_better
