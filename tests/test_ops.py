"""Operations: /healthz, /readyz naming the failing check, /metrics parsed with
prometheus-client's own parser (counters move with requests, in one process and summed over two
``climate api`` workers), and nothing in it that names a project unless allowed."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from prometheus_client import REGISTRY
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from climate.api.app import create_app
from climate.api.routes import include
from climate.config import Settings
from climate.db import managers, outbox
from climate.db.engine import Database
from climate.domain.clock import SystemClock
from climate.runtime import build_context
from climate.serving import ServerConfig
from tests.conftest import LiveServer, free_port, serve
from tests.processes import Process

MEMBER = {"X-Project-Id": "secret-project-4711", "X-User-Id": "u", "X-Roles": "member"}


def _samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = httpx.get(f"{url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def _value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _lease(name: str, hosts: int) -> dict[str, object]:
    return {
        "name": name,
        "start_date": "2031-01-01 10:00",
        "end_date": "2031-01-01 12:00",
        "reservations": [{"resource_type": "physical:host", "min": hosts, "max": hosts}],
        "events": [],
    }


def test_health_is_up(live: LiveServer) -> None:
    response = httpx.get(f"{live.url}/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_metrics_parse_and_counters_move_with_requests(live: LiveServer) -> None:
    url = live.url
    assert httpx.post(f"{url}/v1/os-hosts", json={"name": "h1"}).status_code == 201
    before = _samples(url)
    for _ in range(3):
        assert httpx.get(f"{url}/v1/leases").status_code == 200
    assert httpx.get(f"{url}/v1/leases/nope").status_code == 404
    assert httpx.get(f"{url}/no/such/path").status_code == 404
    assert httpx.post(f"{url}/v1/leases", json=_lease("fits", 1)).status_code == 201
    refused = httpx.post(f"{url}/v1/leases", json=_lease("too-big", 2))
    assert refused.status_code == 409, refused.text
    after = _samples(url)

    def moved(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    requests = "climate_http_requests_total"
    assert moved(requests, route="/v1/leases", method="GET", status="200") == 3
    assert moved(requests, route="/v1/leases/{lease_id}", method="GET", status="404") == 1
    assert moved(requests, route="unmatched", method="GET", status="404") == 1
    assert moved(requests, route="/v1/leases", method="POST", status="201") == 1
    assert moved(requests, route="/v1/leases", method="POST", status="409") == 1
    assert moved("climate_admission_seconds_count") == 2
    assert (
        moved(
            "climate_admission_refusals_total",
            reason="too_few_match",
            resource_type="physical:host",
        )
        == 1
    )
    assert _value(after, "climate_leases", status="PENDING") == 1
    assert _value(after, "climate_outbox_backlog") == 0
    assert 0 <= _value(after, "climate_manager_heartbeat_age_seconds") < 5


def test_each_blocking_route_counts_the_cpu_time_of_its_worker_thread(live: LiveServer) -> None:
    url = live.url
    assert httpx.post(f"{url}/v1/os-hosts", json={"name": "h1"}).status_code == 201
    before = _samples(url)
    began = time.perf_counter()
    for i in range(20):
        assert httpx.post(f"{url}/v1/leases", json=_lease(f"l{i}", 1)).status_code in (201, 409)
    elapsed = time.perf_counter() - began
    after = _samples(url)

    def moved(**labels: str) -> float:
        name = "climate_http_route_cpu_seconds_total"
        return _value(after, name, **labels) - _value(before, name, **labels)

    # One request at a time: their handlers' CPU cannot add up to more than the time taken.
    assert 0 < moved(route="/v1/leases", method="POST") < elapsed
    assert moved(route="/v1/leases/{lease_id}", method="DELETE") == 0
    counted = {
        dict(labels)["route"]
        for name, labels in after
        if name == "climate_http_route_cpu_seconds_total"
    }
    assert {"/v1/leases", "/v1/leases/{lease_id}"} <= counted
    assert not {"/metrics", "/healthz"} & counted  # handlers run on the event loop


def test_a_router_put_on_two_apps_counts_its_handlers_cpu_once() -> None:
    spent: list[float] = []
    router = APIRouter()

    @router.get("/burn-once")
    def burn() -> dict[str, int]:
        began = time.thread_time()
        while time.thread_time() - began < 0.02:
            pass
        spent.append(time.thread_time() - began)
        return {}

    first, second = FastAPI(), FastAPI()
    include(first, router)
    include(second, router)  # the same route objects: a module's router is shared
    labels = {"route": "/burn-once", "method": "GET"}
    name = "climate_http_route_cpu_seconds_total"
    before = REGISTRY.get_sample_value(name, labels) or 0.0
    (route,) = second.router.routes[-1:]
    assert isinstance(route, APIRoute) and route.dependant.call is not None
    route.dependant.call()  # as FastAPI calls a blocking handler, on a worker thread
    moved = (REGISTRY.get_sample_value(name, labels) or 0.0) - before

    assert spent[0] <= moved < 1.5 * spent[0]


def test_event_lag_is_observed_by_the_manager(live: LiveServer) -> None:
    url = live.url
    assert httpx.post(f"{url}/v1/os-hosts", json={"name": "h1"}).status_code == 201
    before = _value(_samples(url), "climate_event_lag_seconds_count", event_type="start_lease")
    body = {**_lease("now", 1), "start_date": "now"}
    lease = httpx.post(f"{url}/v1/leases", json=body).json()["lease"]
    deadline = time.monotonic() + 10
    while httpx.get(f"{url}/v1/leases/{lease['id']}").json()["lease"]["status"] != "ACTIVE":
        assert time.monotonic() < deadline, "the lease never started"
        time.sleep(0.05)
    after = _samples(url)
    assert _value(after, "climate_event_lag_seconds_count", event_type="start_lease") == before + 1
    assert _value(after, "climate_leases", status="ACTIVE") == 1


def test_refusals_by_a_usage_rule_or_credits_are_counted_as_such(
    settings: Settings, sqlite_url: str
) -> None:
    rule = {"name": "short", "kind": "max_length", "limit": "1h"}
    update = {"usage_rules": (rule,), "credits": True, "prices": {"physical:host": "1"}}
    with serve(settings.model_copy(update=update), sqlite_url) as live:
        url = live.url
        assert httpx.post(f"{url}/v1/os-hosts", json={"name": "h1"}).status_code == 201
        before = _samples(url)
        assert httpx.post(f"{url}/v1/leases", json=_lease("long", 1)).status_code == 403
        grant = httpx.post(f"{url}/v1/projects/admin/credits", json={"amount": "0.50"})
        assert grant.status_code == 201
        short = {**_lease("short", 1), "end_date": "2031-01-01 11:00"}
        assert httpx.post(f"{url}/v1/leases", json=short).status_code == 403
        after = _samples(url)

    def moved(**labels: str) -> float:
        name = "climate_admission_refusals_total"
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert moved(reason="usage_rule", resource_type="") == 1
    assert moved(reason="credits", resource_type="") == 1
    assert moved(reason="unexplained", resource_type="") == 0


def test_metrics_name_no_project_unless_allowed(settings: Settings, database_url: str) -> None:
    with _api(settings, database_url, manager=True) as url:
        assert httpx.post(f"{url}/v1/os-hosts", json={"name": "h1"}).status_code == 201
        made = httpx.post(f"{url}/v1/leases", json=_lease("mine", 1), headers=MEMBER)
        assert made.status_code == 201, made.text
        lease_id = made.json()["lease"]["id"]
        assert httpx.get(f"{url}/v1/leases/{lease_id}", headers=MEMBER).status_code == 200
        text = httpx.get(f"{url}/metrics").text
    assert lease_id not in text
    assert "secret-project-4711" not in text
    shown = settings.model_copy(update={"metrics_show_projects": True})
    with _api(shown, database_url, manager=True) as url:
        samples = _samples(url)
    assert (
        _value(samples, "climate_project_leases", project="secret-project-4711", status="PENDING")
        == 1
    )
    assert _value(samples, "climate_leases", status="PENDING") == 1


@contextlib.contextmanager
def _api(settings: Settings, url: str, *, manager: bool) -> Iterator[str]:
    """A live API on ``url``'s database, with its manager running or with none at all."""
    db = Database(url)
    ctx = build_context(settings, db, SystemClock())
    try:
        if manager:
            with LiveServer(ctx) as live:
                yield live.url
            return
        port = free_port()
        here = settings.model_copy(update={"bind_host": "127.0.0.1", "port": port})
        server = uvicorn.Server(ServerConfig(create_app(ctx), here))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(timeout=10)
    finally:
        db.dispose()


def _beat(db: Database, seconds_ago: float) -> None:
    """A manager's last sign of life ``seconds_ago``, as a manager leaves it: its heartbeat row
    (PostgreSQL) or its lock file touched (SQLite)."""
    at = managers.wall_now() - dt.timedelta(seconds=seconds_ago)
    if db.dialect == "sqlite":
        path = f"{db.engine.url.database}-manager"
        Path(path).touch()
        os.utime(path, (at.timestamp(), at.timestamp()))
        return
    with db.transaction() as session:
        managers.beat(session, "gone-manager", at)


def _ready(url: str) -> tuple[int, list[str], dict[str, str]]:
    response = httpx.get(f"{url}/readyz")
    body = response.json()
    return response.status_code, body["failed"], {c["name"]: c["detail"] for c in body["checks"]}


def test_readyz_names_a_stale_or_missing_manager(settings: Settings, database_url: str) -> None:
    db = Database(database_url)
    with _api(settings, database_url, manager=False) as url:
        status, failed, details = _ready(url)
        assert (status, failed) == (503, ["manager"])
        assert "no manager" in details["manager"]
        _beat(db, seconds_ago=60)
        status, failed, details = _ready(url)
        assert (status, failed) == (503, ["manager"])
        assert "last heartbeat 60" in details["manager"], details
        _beat(db, seconds_ago=0)
        assert _ready(url)[:2] == (200, [])
    db.dispose()


def test_readyz_names_an_outbox_backlog_over_the_threshold(
    settings: Settings, database_url: str
) -> None:
    db = Database(database_url)
    strict = settings.model_copy(update={"ready_max_outbox_backlog": 2})
    now = dt.datetime.now(dt.UTC)
    with _api(strict, database_url, manager=False) as url:
        _beat(db, seconds_ago=0)
        with db.transaction() as session:
            outbox.enqueue(session, ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"], "t", {}, now)
        assert _ready(url)[:2] == (200, [])
        with db.transaction() as session:
            outbox.enqueue(session, ["http://127.0.0.1:9/c"], "t", {}, now)
        status, failed, details = _ready(url)
        assert (status, failed) == (503, ["outbox"])
        assert details["outbox"] == "3 undelivered notification(s) (over 2)"
        assert _value(_samples(url), "climate_outbox_backlog") == 3
    db.dispose()


def test_readyz_names_an_unreachable_database(settings: Settings, tmp_path: Path) -> None:
    gone = f"sqlite:///{tmp_path}/no/such/dir/climate.db"
    with _api(settings, gone, manager=False) as url:
        status, failed, details = _ready(url)
    assert (status, failed) == (503, ["database"])
    assert details["database"].startswith("unreachable")


@pytest.mark.slow
def test_metrics_sum_over_two_api_processes_and_json_logs(sqlite_url: str, tmp_path: Path) -> None:
    metrics_dir = tmp_path / "metrics"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    api = Process(
        ["api", "--workers", "2", "--database-url", sqlite_url, "--port", str(port)],
        {"CLIMATE_METRICS_DIR": str(metrics_dir), "CLIMATE_LOG_FORMAT": "json"},
    )
    try:
        # The parent and both workers import the metrics (each makes its histogram file); two
        # workers starting at once on a loaded machine can take longer than start_serving waits.
        deadline = time.monotonic() + 120
        while len(list(metrics_dir.glob("histogram_*.db"))) < 3 or not _answers(url):
            assert api.proc.poll() is None and time.monotonic() < deadline, "workers not up"
            time.sleep(0.2)
        before = _leases_got(url)
        made = 0
        # Each request on a new connection, in bursts: the kernel hands them to either worker.
        # Go on until both have answered some (each keeps its counters in a file of its own).
        with ThreadPoolExecutor(16) as pool:
            while made < 1024 and len(_served_by(metrics_dir)) < 2:
                codes = list(
                    pool.map(lambda _: httpx.get(f"{url}/v1/leases").status_code, range(64))
                )
                assert codes == [200] * 64
                made += 64
        # A worker counts a request just after its answer is sent: wait for the last counts.
        deadline = time.monotonic() + 10
        while (total := _leases_got(url)) - before < made and time.monotonic() < deadline:
            time.sleep(0.05)
        served = _served_by(metrics_dir)
        assert len(served) == 2, served
    finally:
        logs = api.stop()
    assert "Traceback" not in logs, logs
    assert total - before == made
    assert sum(served.values()) == total
    # Both workers log JSON lines, the access log among them.
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    access = [line for line in lines if line["logger"] == "climate.access"]
    assert len(access) >= made
    assert access[-1]["route"] in ("/v1/leases", "/metrics")
    assert {"ts", "level", "message", "method", "path", "status", "duration_ms"} <= set(access[-1])


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _leases_got(url: str) -> float:
    """GET /v1/leases answered 200, summed over the processes by /metrics."""
    return _value(
        _samples(url), "climate_http_requests_total", route="/v1/leases", method="GET", status="200"
    )


def _served_by(metrics_dir: Path) -> dict[str, float]:
    """GET /v1/leases answered 200 by each process, from its own counter file."""
    counts = {}
    for path in metrics_dir.glob("counter_*.db"):
        for key, value, *_ in MmapedDict.read_all_values_from_file(str(path)):
            if '"/v1/leases"' in key and '"GET"' in key and '"200"' in key and "_total" in key:
                counts[path.name] = counts.get(path.name, 0.0) + value
    return {name: n for name, n in counts.items() if n}


def test_the_grafana_dashboard_shows_every_metric_and_only_those_that_exist(
    live: LiveServer,
) -> None:
    dashboard = json.loads((Path(__file__).parents[1] / "docs/grafana/climate.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    named = {name for e in exprs for name in re.findall(r"climate_[a-z_]+", e)}
    served = {
        family.name
        for family in text_string_to_metric_families(httpx.get(f"{live.url}/metrics").text)
    }
    missing = {
        n
        for n in named
        if n not in served
        and n.removesuffix("_bucket") not in served
        and n.removesuffix("_total") not in served
    }
    assert not missing, missing
    shown = {n.removesuffix("_bucket").removesuffix("_total") for n in named}
    # prometheus-client's own <name>_created families are when a series began, not a metric.
    unshown = {
        n
        for n in served
        if n.startswith("climate_") and not n.endswith("_created") and n not in shown
    }
    assert not unshown, f"served but not on the dashboard: {unshown}"
