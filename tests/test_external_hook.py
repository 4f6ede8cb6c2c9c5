"""The external admission hook (Blazar's ExternalServiceFilter contract) against a real HTTP
receiver on loopback: allow, deny, a service that never answers (fail-open and fail-closed),
check-update, on-end, and what is logged and recorded."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select

from climate.config import Settings
from climate.db.engine import Database
from climate.db.records import AuditLog
from climate.db.tables import Lease
from climate.domain.clock import ManualClock
from climate.errors import UsageRuleBroken
from climate.notify.delivery import Deliverer
from climate.runtime import build_context, build_workers
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseService
from tests.conftest import ALICE, T0
from tests.helpers import add_hosts, host_request

H = dt.timedelta(hours=1)


@dataclass
class Receiver:
    """What the service answers (``status``, ``body``) and every request it got."""

    status: int = 204
    body: bytes = b""
    requests: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)
    url: str = ""


@contextlib.contextmanager
def receiver() -> Iterator[Receiver]:
    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            body = json.loads(self.rfile.read(length))
            got.requests.append((self.path, dict(self.headers), body))
            self.send_response(got.status)
            self.send_header("Content-Length", str(len(got.body)))
            self.end_headers()
            self.wfile.write(got.body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    got.url = f"http://127.0.0.1:{server.server_address[1]}/enforcement/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent() -> Iterator[str]:
    """A port that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"


def context(
    settings: Settings, db: Database, clock: ManualClock, url: str, **more: object
) -> ServiceContext:
    update = {
        "external_service_base_endpoint": url,
        "external_service_token": "s3cret",
        "external_service_timeout_seconds": 0.5,
        **more,
    }
    return build_context(settings.model_copy(update=update), db, clock)


def actions(ctx: ServiceContext, action: str) -> list[dict[str, Any]]:
    with ctx.db.reader() as session:
        rows = session.scalars(select(AuditLog).where(AuditLog.action == action))
        return [json.loads(str(row.detail)) for row in rows]


def lease_count(ctx: ServiceContext) -> int:
    with ctx.db.reader() as session:
        return len(session.scalars(select(Lease)).all())


@pytest.fixture
def two_hosts(hosts: HostService) -> list[int]:
    return add_hosts(hosts, 2)


def test_allowed_with_blazars_payload_and_token(
    settings: Settings, db: Database, clock: ManualClock, two_hosts: list[int]
) -> None:
    with receiver() as service:
        ctx = context(settings, db, clock, service.url)
        lease = LeaseService(ctx).create(ALICE, host_request("l", T0 + H, T0 + 2 * H))
    [(path, headers, body)] = service.requests
    assert path == "/enforcement/check-create"
    assert headers["X-Auth-Token"] == "s3cret"
    assert headers["Content-Type"] == "application/json"
    assert body["context"] == {
        "user_id": "alice",
        "project_id": "project-a",
        "auth_url": None,
        "region_name": None,
    }
    assert body["lease"]["id"] == lease.id
    assert body["lease"]["start_date"] == "2030-01-01T13:00:00.000000"
    [reservation] = body["lease"]["reservations"]
    assert reservation["resource_type"] == "physical:host"
    assert len(reservation["allocations"]) == 1
    assert reservation["allocations"][0]["id"] in {str(h) for h in two_hosts}


def test_denied_with_the_services_message(
    settings: Settings, db: Database, clock: ManualClock, two_hosts: list[int]
) -> None:
    with receiver() as service:
        service.status, service.body = 403, b'{"message": "project-a has no credits left"}'
        ctx = context(settings, db, clock, service.url)
        with pytest.raises(UsageRuleBroken) as caught:
            LeaseService(ctx).create(ALICE, host_request("l", T0 + H, T0 + 2 * H))
    assert caught.value.status == 403
    assert str(caught.value) == "external admission service refused: project-a has no credits left"
    assert lease_count(ctx) == 0
    [denied] = actions(ctx, "usage.deny")
    assert denied["rules"][0]["rule"] == "external_service"
    assert denied["rules"][0]["message"] == "project-a has no credits left"


def test_a_403_without_a_message_gets_blazars_words(
    settings: Settings, db: Database, clock: ManualClock, two_hosts: list[int]
) -> None:
    with receiver() as service:
        service.status, service.body = 403, b"nope"
        ctx = context(settings, db, clock, service.url)
        with pytest.raises(UsageRuleBroken) as caught:
            LeaseService(ctx).create(ALICE, host_request("l", T0 + H, T0 + 2 * H))
    assert str(caught.value).endswith("External service enforcement filter denied the request.")


def test_check_update_gets_the_lease_before_and_after(
    settings: Settings, db: Database, clock: ManualClock, two_hosts: list[int]
) -> None:
    with receiver() as service:
        ctx = context(settings, db, clock, service.url)
        leases = LeaseService(ctx)
        lease = leases.create(ALICE, host_request("l", T0 + H, T0 + 2 * H))
        leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 3 * H))
        service.status, service.body = 403, b'{"message": "too long"}'
        with pytest.raises(UsageRuleBroken):
            leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 4 * H))
    path, _, body = service.requests[1]
    assert path == "/enforcement/check-update"
    assert body["current_lease"]["end_date"] == "2030-01-01T14:00:00.000000"
    assert body["lease"]["end_date"] == "2030-01-01T15:00:00.000000"
    assert leases.get(ALICE, lease.id).end_date == T0 + 3 * H


def test_check_update_is_asked_for_every_update_but_a_rename_alone(
    settings: Settings, db: Database, clock: ManualClock, two_hosts: list[int]
) -> None:
    """As Blazar's update_lease: a new name alone is written without enforcement; any other
    update asks check-update, even one that moves neither the window nor the resources."""
    with receiver() as service:
        ctx = context(settings, db, clock, service.url)
        leases = LeaseService(ctx)
        lease = leases.create(ALICE, host_request("l", T0 + H, T0 + 3 * H))
        leases.update(ALICE, lease.id, LeaseChanges(name="renamed"))
        leases.update(ALICE, lease.id, LeaseChanges(before_end=T0 + 2 * H))
        leases.update(ALICE, lease.id, LeaseChanges(name="again", end=T0 + 3 * H))
        service.status, service.body = 403, b'{"message": "frozen"}'
        with pytest.raises(UsageRuleBroken, match="frozen"):
            leases.update(ALICE, lease.id, LeaseChanges(before_end=T0 + 2.5 * H))
    paths = [path.rsplit("/", 1)[1] for path, _, _ in service.requests]
    assert paths == ["check-create", "check-update", "check-update", "check-update"]
    _, _, body = service.requests[2]
    assert body["current_lease"]["name"] == "renamed" and body["lease"]["name"] == "again"
    kept = leases.get(ALICE, lease.id)
    assert (kept.name, kept.before_end_date) == ("again", T0 + 2 * H)


@pytest.mark.parametrize("fail_open", [False, True])
def test_a_service_that_never_answers(
    settings: Settings,
    db: Database,
    clock: ManualClock,
    two_hosts: list[int],
    fail_open: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with silent() as url, caplog.at_level(logging.WARNING, logger="climate.fairshare.external"):
        ctx = context(settings, db, clock, url, external_service_fail_open=fail_open)
        leases = LeaseService(ctx)
        request = host_request("l", T0 + H, T0 + 2 * H)
        if fail_open:
            leases.create(ALICE, request)
            [allowed] = actions(ctx, "usage.allow")
            assert allowed["rules"][0]["failed"] is True
        else:
            with pytest.raises(UsageRuleBroken) as caught:
                leases.create(ALICE, request)
            assert "the external admission service did not answer (ReadTimeout" in str(caught.value)
            assert lease_count(ctx) == 0
    verdict = "admitting" if fail_open else "refusing"
    assert f"{url}check-create failed (ReadTimeout" in caplog.text
    assert f"{verdict} as configured (external_service_fail_open = {str(fail_open).lower()})" in (
        caplog.text
    )


def test_a_server_error_follows_fail_closed(
    settings: Settings, db: Database, clock: ManualClock, two_hosts: list[int]
) -> None:
    with receiver() as service:
        service.status = 500
        ctx = context(settings, db, clock, service.url)
        with pytest.raises(UsageRuleBroken) as caught:
            LeaseService(ctx).create(ALICE, host_request("l", T0 + H, T0 + 2 * H))
    assert "did not answer (HTTP 500)" in str(caught.value)


def test_dry_runs_do_not_ask(
    settings: Settings, db: Database, clock: ManualClock, two_hosts: list[int]
) -> None:
    with receiver() as service:
        ctx = context(settings, db, clock, service.url)
        LeaseService(ctx).dry_run(ALICE, host_request("l", T0 + H, T0 + 2 * H))
    assert service.requests == []


def test_on_end_is_told_when_a_lease_is_deleted_before_it_starts(
    settings: Settings, db: Database, clock: ManualClock, two_hosts: list[int]
) -> None:
    with receiver() as service:
        ctx = context(settings, db, clock, service.url)
        leases = LeaseService(ctx)
        lease = leases.create(ALICE, host_request("l", T0 + H, T0 + 2 * H))
        leases.delete(ALICE, lease.id)
        assert Deliverer(ctx).deliver_due() == 1
    path, headers, body = service.requests[-1]
    assert path == "/enforcement/on-end"
    assert headers["X-Auth-Token"] == "s3cret"
    assert body["lease"]["id"] == lease.id and body["context"]["project_id"] == "project-a"


def test_on_end_is_told_when_the_manager_ends_a_lease(
    settings: Settings, db: Database, clock: ManualClock, two_hosts: list[int]
) -> None:
    with receiver() as service:
        ctx = context(settings, db, clock, service.url)
        lease = LeaseService(ctx).create(ALICE, host_request("l", None, T0 + H))
        manager = build_workers(ctx).manager
        manager.run_due()  # started
        clock.advance(H)
        manager.run_due()  # ended
        assert Deliverer(ctx).deliver_due() == 1
    paths = [path for path, _, _ in service.requests]
    assert paths == ["/enforcement/check-create", "/enforcement/on-end"]
    assert service.requests[-1][2]["lease"]["id"] == lease.id
