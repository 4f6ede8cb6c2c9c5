"""The mixed-load benchmark (bench/mixed.py): a short real run against ``climate serve`` with the
client in its own process, and the folding of a py-spy profile by package. Nothing is timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from bench.mixed import (
    ROOT,
    MixedConfig,
    _route_costs,
    _route_counts,
    mixed_targets,
    run_mixed,
    run_mixed_against,
)
from bench.mixed_client import WEIGHTS
from bench.profiling import read_collapsed
from bench.server import RunningServer, checkout

from tests.conftest import LiveServer


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_short_mixed_run_grows_the_database_and_reports_every_operation(workers: int) -> None:
    """With ``--workers 2``, two API processes and the manager: the figures are all of them."""
    result = run_mixed(MixedConfig(clients=4, seconds=4.0, hosts=20, workers=workers))

    assert result["requests"] > 20
    assert set(result["operations"]) == set(WEIGHTS)
    assert (
        sum(op["latency_ms"]["count"] for op in result["operations"].values())
        == (result["requests"])
    )
    assert result["server_errors"] == 0
    assert result["no_answer"] == 0
    assert result["create_latency_ms"]["count"] > 0
    assert result["database"]["leases_end"] > 0
    assert result["database"]["mb_end"] >= result["database"]["mb_start"] > 0
    assert result["server"]["rss_mb_end"] > 0
    assert result["server"]["cpu_seconds"] > 0
    assert len(result["slices"]) == 4
    assert "route_cpu" not in result  # a run shorter than both edges
    completed = sum(s["requests_per_second"] * s["seconds"] for s in result["slices"])
    assert round(completed) == result["requests"]
    verdicts = {t.name: t.verdict for t in mixed_targets(result)}
    assert verdicts["5xx answers, mixed load, 4 clients"] == "PASS"


def test_a_profile_counts_self_time_by_package(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "process 1;thread (0x1): MainThread;run (uvicorn/server.py:10);"
        "create_lease (climate/api/leases.py:50);admit (climate/planner/hosts.py:9) 3\n"
        "process 1;thread (0x2): AnyIO worker;get (climate/api/leases.py:70);"
        "execute (sqlalchemy/orm/session.py:2000) 5\n"
        "process 1;thread (0x2): AnyIO worker;dumps (json/encoder.py:200) 2\n"
    )

    profile = read_collapsed(raw).as_dict()

    shares = {e["package"]: e["samples"] for e in profile["self_by_package"]}
    assert shares == {"sqlalchemy": 5, "climate.planner": 3, "json": 2}
    assert profile["samples"] == 10


def test_route_costs_are_worker_cpu_per_request_between_two_scrapes() -> None:
    before = {"POST /v1/leases": (1.0, 100.0), "GET /v1/leases": (0.5, 10.0)}
    after = {
        "POST /v1/leases": (1.5, 300.0),
        "GET /v1/leases": (0.5, 10.0),  # no request in between: not shown
        "DELETE /v1/leases/{lease_id}": (0.2, 20.0),
    }

    assert _route_costs(before, after) == {
        "POST /v1/leases": {"requests": 200, "cpu_ms": pytest.approx(2.5)},
        "DELETE /v1/leases/{lease_id}": {"requests": 20, "cpu_ms": pytest.approx(10.0)},
    }
    assert _route_costs(None, after) == {}


def test_route_counts_are_read_from_the_servers_metrics(live_sqlite: LiveServer) -> None:
    server = RunningServer(live_sqlite.url, os.getpid(), "sqlite", "", None, Path())
    before = _route_counts(server)
    for _ in range(3):
        assert httpx.get(f"{live_sqlite.url}/v1/leases").status_code == 200
    after = _route_counts(server)

    assert before is not None and after is not None
    costs = _route_costs(before, after)
    assert costs["GET /v1/leases"]["requests"] == 3
    assert costs["GET /v1/leases"]["cpu_ms"] > 0


def test_a_server_without_metrics_counts_no_routes(live_sqlite: LiveServer) -> None:
    """The throughput baseline (bc8738b) answers /metrics with a 404 body, not the format."""
    server = RunningServer(f"{live_sqlite.url}/nowhere", os.getpid(), "sqlite", "", None, Path())
    assert httpx.get(f"{server.base_url}/metrics").status_code == 404
    assert _route_counts(server) is None


def test_the_load_client_keeps_going_after_refusals(
    live_sqlite: LiveServer, tmp_path: Path
) -> None:
    """No host is registered, so every creation is refused (409): each client goes on to its
    deadline, and the run reports no client failure."""
    out = tmp_path / "records.json"
    command = [sys.executable, "-m", "bench.mixed_client", "--base-url", live_sqlite.url]
    command += ["--clients", "2", "--seconds", "2", "--hosts", "10", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    load = json.loads(out.read_text())
    assert load["failures"] == []
    refused = [r for r in load["records"] if r[1] == 409]
    assert len(refused) > 2
    assert max(r[3] for r in load["records"]) > 1.5  # both went on to near the deadline


def _result(rates: list[float], *, baseline: float | None, rev: str = "bc8738b") -> dict[str, Any]:
    """A mixed run's figures as ``run_mixed`` gives them, cut to what the targets read."""
    result: dict[str, Any] = {
        "config": {"clients": 32, "slice_seconds": 5.0},
        "requests_per_second": 500.0,
        "server_errors": 0,
        "no_answer": 0,
        "create_latency_ms": {"p99": 240.0},
        "server": {"rss_mb_end": 200.0},
        "slices": [{"seconds": 5.0, "requests_per_second": rate} for rate in rates],
    }
    if baseline is not None:
        result["baseline"] = {"rev": rev, "requests_per_second": baseline}
    return result


def test_throughput_is_judged_against_the_baseline_measured_in_the_same_run() -> None:
    measured = {t.name: t for t in mixed_targets(_result([100.0] * 12, baseline=100.0))}
    ratio = measured["requests/s, mixed load, 32 clients, over bc8738b's"]
    assert (ratio.measured, ratio.verdict) == (5.0, "PASS")
    assert measured["lease creation p99, mixed load"].verdict == "PASS"

    slower = {t.name: t for t in mixed_targets(_result([100.0] * 12, baseline=101.0))}
    assert slower["requests/s, mixed load, 32 clients, over bc8738b's"].verdict == "MISS"

    alone = {t.name: t for t in mixed_targets(_result([100.0] * 12, baseline=None))}
    assert alone["requests/s, mixed load, 32 clients, over bc8738b's"].measured is None

    other = {t.name: t for t in mixed_targets(_result([100.0] * 12, baseline=50, rev="95fbca1"))}
    against = other["requests/s, mixed load, 32 clients, over 95fbca1's"]
    assert against.measured == 10.0 and "the goal is 5x bc8738b's" in against.note


def test_throughput_kept_compares_the_first_and_the_last_ten_seconds() -> None:
    """Slices of 5 s: the first two against the last two, whatever lies between."""
    rates = [100.0, 80.0, 10.0, 10.0, 70.0, 60.0]
    kept = {t.name: t for t in mixed_targets(_result(rates, baseline=100.0))}
    target = kept["requests/s, last 10 s of the mixed load over the first"]
    assert target.measured == 65.0 / 90.0
    assert target.verdict == "MISS"

    steady = {t.name: t for t in mixed_targets(_result([90.0, 90.0, 10.0, 82.0, 81.0], baseline=1))}
    assert steady["requests/s, last 10 s of the mixed load over the first"].verdict == "PASS"


def _worktrees() -> set[str]:
    listed = subprocess.run(
        ["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(listed.stdout.splitlines())


@pytest.mark.slow
def test_a_run_against_another_commit_runs_that_commits_server_first() -> None:
    """The baseline is a git worktree of the commit, removed afterwards; HEAD stands in for
    bc8738b here, so the test needs no particular history."""
    before = _worktrees()
    result = run_mixed_against(MixedConfig(clients=2, seconds=2.0, hosts=10), "HEAD")

    assert result["baseline"]["rev"] == "HEAD"
    assert result["baseline"]["requests_per_second"] > 0
    assert result["requests"] > 0
    assert _worktrees() == before


def test_a_baseline_that_cannot_be_checked_out_is_refused_with_git_s_reason() -> None:
    with pytest.raises(RuntimeError, match="cannot check out no-such-commit"):
        with checkout("no-such-commit"):
            pass
