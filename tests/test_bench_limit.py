"""The ``limit`` benchmark (bench/limit.py): the floor app and Climate side by side, in a short
real run. Nothing is timed; the figures must exist and count every request."""

from __future__ import annotations

import os

import pytest
from bench.limit import LimitConfig, counted, limit_targets, run_limit
from bench.server import cpu_seconds


def test_cpu_seconds_counts_this_process() -> None:
    before = cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert cpu_seconds(os.getpid()) > before


@pytest.mark.slow
def test_a_short_limit_run_measures_both_servers_on_the_same_requests() -> None:
    result = run_limit(LimitConfig(requests=30, batch=10, warmup=5, hosts=5))

    for side in ("floor", "climate"):
        assert result[side]["codes"] == {201: 30}
        assert result[side]["latency_ms"]["count"] == 30
        assert result[side]["cpu_ms_per_request"] > 0
        assert result[side]["kb_written_per_request"] is not None
    assert result["statements_per_admission"] > 0
    assert result["trigger_programs_per_admission"] > 0  # the lease revision triggers
    targets = limit_targets(result)
    assert [t.unit for t in targets] == ["x", "x"]
    assert all(t.measured is not None and t.measured > 0 for t in targets)


def test_a_repeat_of_the_entry_before_is_a_trigger_program() -> None:
    traced = ["BEGIN", "INSERT a 1", "INSERT a 1", "INSERT a 1", "INSERT a 2", "INSERT a 2"]
    assert counted([*traced, "COMMIT"]) == (4, 3)
    assert counted([]) == (0, 0)
