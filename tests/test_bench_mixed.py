"""The mixed-load benchmark (bench/mixed.py): a short real run against ``climate serve`` with the
client in its own process, and the folding of a py-spy profile by package. Nothing is timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench.mixed import ROOT, MixedConfig, mixed_targets, run_mixed
from bench.mixed_client import WEIGHTS
from bench.profiling import read_collapsed

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
