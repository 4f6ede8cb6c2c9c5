"""Operator recovery over HTTP, with the manager running and a backend that fails: retry a
lease's failed events, force its end (through the backend or without it)."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import httpx
import pytest

from climate.cli.main import main
from climate.config import Settings
from tests.conftest import serve

MEMBER = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}


HTTP = httpx.Client(timeout=30.0)
"""Under the whole suite on two cores a server may take more than httpx's default 5 s to
answer; how fast it answers is not what these tests are about."""


def _faulty(settings: Settings, fault_rate: float) -> Settings:
    return settings.model_copy(update={"backend": "faulty", "fault_rate": fault_rate})


def _add_host(url: str) -> None:
    assert HTTP.post(f"{url}/v1/os-hosts", json={"name": "h1"}).status_code == 201


def _create_lease(url: str, name: str, hours: float = 1.0) -> dict[str, Any]:
    end = dt.datetime.now(dt.UTC) + dt.timedelta(hours=hours)
    body = {
        "name": name,
        "start_date": "now",
        "end_date": end.strftime("%Y-%m-%d %H:%M"),
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
        "events": [],
    }
    response = HTTP.post(f"{url}/v1/leases", json=body)
    assert response.status_code == 201, response.text
    lease: dict[str, Any] = response.json()["lease"]
    return lease


def _wait_status(url: str, lease_id: str, status: str, timeout: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        lease: dict[str, Any] = HTTP.get(f"{url}/v1/leases/{lease_id}").json()["lease"]
        if lease["status"] == status:
            return lease
        if time.monotonic() > deadline:
            raise AssertionError(f"lease is {lease['status']}, not {status}: {lease}")
        time.sleep(0.05)


def _events(lease: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    return {e["event_type"]: (e["status"], e["last_error"]) for e in lease["events"]}


def _lease_in_error(settings: Settings, database_url: str) -> str:
    """A lease whose start failed every attempt against a backend that always fails."""
    with serve(_faulty(settings, 1.0), database_url) as live:
        _add_host(live.url)
        lease_id = str(_create_lease(live.url, "unlucky")["id"])
        failed = _wait_status(live.url, lease_id, "ERROR")
    assert failed["status_reason"] == (
        "start_lease failed after 3 attempt(s): InjectedFault: injected start fault"
    )
    return lease_id


def test_retry_after_the_backend_recovered_starts_the_lease(
    settings: Settings, database_url: str
) -> None:
    lease_id = _lease_in_error(settings, database_url)
    with serve(_faulty(settings, 0.0), database_url) as live:
        response = HTTP.post(f"{live.url}/v1/leases/{lease_id}/retry")
        assert response.status_code == 200, response.text
        retried = response.json()["lease"]
        assert retried["status"] in ("PENDING", "STARTING", "ACTIVE")
        assert retried["status_reason"] is None
        active = _wait_status(live.url, lease_id, "ACTIVE")
    assert _events(active)["start_lease"] == ("DONE", None)
    assert [r["status"] for r in active["reservations"]] == ["active"]


def test_force_end_without_the_backend_frees_the_hosts_of_a_failing_lease(
    settings: Settings, database_url: str
) -> None:
    lease_id = _lease_in_error(settings, database_url)
    with serve(_faulty(settings, 1.0), database_url) as live:
        response = HTTP.post(
            f"{live.url}/v1/leases/{lease_id}/force-end", json={"skip_backend": True}
        )
        assert response.status_code == 200, response.text
        ended = response.json()["lease"]
        assert ended["status"] == "TERMINATED"
        assert ended["status_reason"].startswith("ended by admin (project admin) at ")
        assert ended["status_reason"].endswith(" without the backend")
        events = _events(ended)
        assert events["start_lease"][0] == "ERROR"  # it never happened, and says why not
        assert events["end_lease"] == ("ERROR", f"not run: lease {ended['status_reason']}")
        assert [r["status"] for r in ended["reservations"]] == ["deleted"]
        # The only host is free again from now on: a new lease gets it.
        _create_lease(live.url, "next")
        again = HTTP.post(f"{live.url}/v1/leases/{lease_id}/force-end", json={})
        assert again.status_code == 409
        assert "has ended already" in again.json()["error_message"]


def test_force_end_through_the_backend_runs_the_end_event_now(
    settings: Settings, database_url: str
) -> None:
    with serve(_faulty(settings, 0.0), database_url) as live:
        _add_host(live.url)
        lease_id = str(_create_lease(live.url, "short-lived", hours=5)["id"])
        _wait_status(live.url, lease_id, "ACTIVE")
        response = HTTP.post(f"{live.url}/v1/leases/{lease_id}/force-end")
        assert response.status_code == 200, response.text
        assert response.json()["lease"]["status_reason"].startswith("end forced: ended by admin")
        ended = _wait_status(live.url, lease_id, "TERMINATED")
        events = _events(ended)
        assert events["end_lease"] == ("DONE", None)
        assert "before_end_lease" not in events  # the warning was dropped: no end is coming
        _create_lease(live.url, "next")


def test_retry_and_force_end_are_refused_to_members_unknown_and_healthy_leases(
    settings: Settings, database_url: str
) -> None:
    with serve(settings, database_url) as live:
        _add_host(live.url)
        lease_id = str(_create_lease(live.url, "healthy")["id"])
        _wait_status(live.url, lease_id, "ACTIVE")
        for action in ("retry", "force-end"):
            refused = HTTP.post(f"{live.url}/v1/leases/{lease_id}/{action}", headers=MEMBER)
            assert refused.status_code == 403
            assert refused.json()["error_name"] == 403
            unknown = HTTP.post(f"{live.url}/v1/leases/no-such-lease/{action}")
            assert unknown.status_code == 404
            assert unknown.json()["error_message"] == (
                "Lease no-such-lease could not be found "
                "(Object with {'lease_id': 'no-such-lease'} not found)"
            )
        healthy = HTTP.post(f"{live.url}/v1/leases/{lease_id}/retry")
        assert healthy.status_code == 409
        assert healthy.json()["error_message"] == (
            f"lease {lease_id} is ACTIVE and has no failed event: there is nothing to retry"
        )
        bad = HTTP.post(f"{live.url}/v1/leases/{lease_id}/force-end", json={"skip": True})
        assert bad.status_code == 400
        assert bad.json()["error_message"].startswith("skip: unknown field")
        assert _wait_status(live.url, lease_id, "ACTIVE")["status"] == "ACTIVE"


def test_cli_retries_and_force_ends(
    settings: Settings, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lease_id = _lease_in_error(settings, sqlite_url)
    with serve(_faulty(settings, 0.0), sqlite_url) as live:
        main(["lease", "retry", lease_id, "--url", live.url, "--json"])
        assert lease_id in capsys.readouterr().out
        _wait_status(live.url, lease_id, "ACTIVE")
        main(["lease", "force-end", lease_id, "--skip-backend", "--url", live.url])
        shown = capsys.readouterr().out
        assert "TERMINATED" in shown
        assert "without the backend" in shown
