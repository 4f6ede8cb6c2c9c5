"""Every change leaves exactly one audit row (who, what, when), written in the change's own
transaction, and one JSON line on the ``climate.audit`` logger once it commits."""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from climate.backends.base import Backend
from climate.db import audit
from climate.db.records import AuditLog
from climate.domain.clock import ManualClock
from climate.domain.status import LeaseStatus
from climate.errors import NotEnoughCapacity
from climate.manager.service import Manager
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseService
from climate.services.tokens import TokenService
from tests.conftest import ADMIN, ALICE, T0, LiveServer
from tests.helpers import add_hosts, host_request
from tests.test_auth import ALICE as ALICE_HEADERS
from tests.test_auth import CAROL_ADMIN, assert_error, client, created, lease_body
from tests.test_cli import run
from tests.test_manager_batches import FailingFor, RecordingBackend

HOUR = dt.timedelta(hours=1)
DUPLICATE_EVENTS = (
    "SELECT target_id, count(*) FROM audit_log WHERE target_type='event' "
    "GROUP BY target_id HAVING count(*) > 1"
)


def rows(ctx: ServiceContext, **filters: Any) -> list[AuditLog]:
    with ctx.db.reader() as session:
        return list(audit.find(session, **filters))


def detail(row: AuditLog) -> dict[str, Any]:
    assert row.detail is not None
    found: dict[str, Any] = json.loads(row.detail)
    return found


def test_lease_create_update_delete_each_write_one_row_with_who_what_when(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("l", T0 + HOUR, T0 + 2 * HOUR))
    leases.update(ALICE, lease.id, LeaseChanges(name="renamed", end=T0 + 3 * HOUR))
    leases.delete(ALICE, lease.id)

    found = rows(ctx, target_type="lease")
    assert [(r.action, r.target_id) for r in found] == [
        ("lease.create", lease.id),
        ("lease.update", lease.id),
        ("lease.delete", lease.id),
    ]
    assert {(r.actor_user, r.actor_project, r.at) for r in found} == {("alice", "project-a", T0)}
    assert detail(found[0])["name"] == "l"
    assert detail(found[1]) == {
        "project_id": "project-a",
        "name": ["l", "renamed"],
        "end_date": [str(T0 + 2 * HOUR), str(T0 + 3 * HOUR)],
        "before_end_date": [str(T0 + HOUR), str(T0 + 2 * HOUR)],  # keeps its distance
    }
    assert detail(found[2]) == {"project_id": "project-a", "status": "PENDING"}


def test_host_and_property_changes_each_write_one_row(
    ctx: ServiceContext, hosts: HostService
) -> None:
    host = hosts.create(ADMIN, "compute-0", {"gpu": "a100", "vcpus": 8})
    hosts.update(ADMIN, str(host.id), {"rack": "r1"})
    hosts.set_property_private(ADMIN, "gpu", True)
    hosts.delete(ADMIN, str(host.id))

    found = rows(ctx)
    assert [(r.action, r.target_type, r.target_id) for r in found] == [
        ("host.create", "host", str(host.id)),
        ("host.update", "host", str(host.id)),
        ("property.update", "resource_property", "gpu"),
        ("host.delete", "host", str(host.id)),
    ]
    assert {(r.actor_user, r.actor_project) for r in found} == {("admin-user", "admin-project")}
    assert [detail(r) for r in found] == [
        {"name": "compute-0", "gpu": "a100", "vcpus": 8},
        {"rack": "r1"},
        {"private": True},
        {"name": "compute-0"},
    ]


def test_token_changes_are_audited_without_their_secret(ctx: ServiceContext) -> None:
    tokens = TokenService(ctx)
    issued = tokens.issue("ci", "robot", "project-a", ["member"])
    tokens.revoke(issued.row.id)

    found = rows(ctx, target_type="token")
    assert [(r.action, r.target_id, r.actor_user) for r in found] == [
        ("token.issue", issued.row.id, "cli"),
        ("token.revoke", issued.row.id, "cli"),
    ]
    assert detail(found[0]) == {
        "name": "ci",
        "project_id": "project-a",
        "roles": "member",
        "user_id": "robot",
    }
    secret = issued.token.rsplit("_", 1)[1]
    for row in found:
        assert secret not in (row.detail or "") and issued.row.secret_hash not in (row.detail or "")


def test_a_refused_change_writes_no_row(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    before = len(rows(ctx))
    with pytest.raises(NotEnoughCapacity):
        leases.create(ALICE, host_request("too-big", T0 + HOUR, T0 + 2 * HOUR, min_hosts=2))
    assert len(rows(ctx)) == before


def test_a_rolled_back_transaction_keeps_neither_row_nor_log_line(
    ctx: ServiceContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="climate.audit")
    with pytest.raises(RuntimeError), ctx.db.transaction() as session:
        audit.record(
            session, at=T0, actor=ALICE, action="lease.create", target_type="lease", target_id="x"
        )
        raise RuntimeError("the change fails after its audit row was written")
    assert rows(ctx) == []
    assert [r for r in caplog.records if r.name == "climate.audit"] == []


def test_each_committed_row_is_logged_as_one_json_line(
    ctx: ServiceContext, hosts: HostService, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="climate.audit")
    host = hosts.create(ADMIN, "compute-0", {})
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "climate.audit"]
    assert lines == [
        {
            "action": "host.create",
            "actor_project": "admin-project",
            "actor_user": "admin-user",
            "at": T0.isoformat(),
            "detail": {"name": "compute-0"},
            "target_id": str(host.id),
            "target_type": "host",
        }
    ]


@pytest.mark.parametrize(
    ("target_id", "detail"),
    [
        ("x", None),
        ("x", {"count": 2**70, "name": "big"}),  # past orjson's integers: the library's JSON
    ],
)
def test_a_log_line_holds_the_row_and_its_detail_as_stored(
    ctx: ServiceContext,
    caplog: pytest.LogCaptureFixture,
    target_id: str,
    detail: dict[str, object] | None,
) -> None:
    caplog.set_level(logging.INFO, logger="climate.audit")
    with ctx.db.transaction() as session:
        audit.record(
            session,
            at=T0,
            actor=ALICE,
            action="lease.update",
            target_type="lease",
            target_id=target_id,
            detail=detail,
        )
    [line] = [json.loads(r.getMessage()) for r in caplog.records if r.name == "climate.audit"]
    assert line["target_id"] == target_id
    assert line["detail"] == detail
    assert line["at"] == T0.isoformat()


def test_no_json_is_made_at_commit_for_a_line_the_logger_drops(
    ctx: ServiceContext,
    hosts: HostService,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.WARNING, logger="climate.audit")

    def unwanted(row: object) -> str:
        raise AssertionError(f"a dropped log line was made: {row}")

    monkeypatch.setattr(audit, "_line", unwanted)
    host = hosts.create(ADMIN, "compute-0", {})
    assert [(r.action, r.target_id, detail(r)) for r in rows(ctx)] == [
        ("host.create", str(host.id), {"name": "compute-0"})
    ]
    assert [r for r in caplog.records if r.name == "climate.audit"] == []


@pytest.mark.parametrize("planned", [False, True])
def test_every_event_the_manager_applies_is_audited_once(
    ctx: ServiceContext,
    clock: ManualClock,
    hosts: HostService,
    leases: LeaseService,
    planned: bool,
) -> None:
    add_hosts(hosts, 3)
    made = [leases.create(ALICE, host_request(f"l{i}", T0 + HOUR, T0 + 3 * HOUR)) for i in range(3)]
    manager = Manager(ctx, RecordingBackend(), name="manager-1")
    for when in (T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR):
        if planned:
            clock.set(when - dt.timedelta(seconds=1))
            manager.prepare()
        clock.set(when)
        manager.run_due()

    found = rows(ctx, target_type="event")
    event_ids = {e.id for lease in made for e in leases.get(ALICE, lease.id).events}
    assert {r.target_id for r in found} == event_ids and len(found) == len(event_ids)
    assert {r.action for r in found} == {
        "event.start_lease",
        "event.before_end_lease",
        "event.end_lease",
    }
    assert {(r.actor_user, r.actor_project) for r in found} == {("manager", None)}
    by_event = {e.id: e.lease_id for lease in made for e in leases.get(ALICE, lease.id).events}
    for row in found:
        assert detail(row) == {"lease_id": by_event[row.target_id], "manager": "manager-1"}
    with ctx.db.reader() as session:
        assert session.execute(text(DUPLICATE_EVENTS)).all() == []


def test_a_failed_attempt_is_not_audited_and_giving_up_is_lease_error(
    ctx: ServiceContext, clock: ManualClock, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("doomed", T0 + HOUR, T0 + 3 * HOUR))
    backend: Backend = FailingFor("project-a")
    manager = Manager(ctx, backend, name="manager-1")
    clock.set(T0 + HOUR)
    for _ in range(ctx.settings.event_max_attempts):
        manager.run_due()
    assert leases.get(ALICE, lease.id).status == LeaseStatus.ERROR

    assert rows(ctx, target_type="event") == []
    [error] = rows(ctx, action="lease.error")
    assert (error.target_type, error.target_id, error.actor_user) == ("lease", lease.id, "manager")
    assert detail(error)["manager"] == "manager-1"
    assert "cloud said no" in detail(error)["reason"]


def test_the_audit_api_is_for_admins_and_filters_and_pages(live: LiveServer) -> None:
    with client(live, CAROL_ADMIN) as admin, client(live, ALICE_HEADERS) as alice:
        created(admin.post("/v1/os-hosts", json={"name": "compute-0"}), "host")
        lease = created(alice.post("/v1/leases", json=lease_body("audited")), "lease")
        assert alice.put(f"/v1/leases/{lease['id']}", json={"name": "renamed"}).is_success

        body = assert_error(alice.get("/v1/audit"), 403, "climate:audit:get")
        assert body["error_name"] == 403

        mine = admin.get("/v1/audit", params={"target_id": lease["id"]}).json()["audit_log"]
        assert [(r["action"], r["actor_user"], r["actor_project"]) for r in mine] == [
            ("lease.create", "alice", "project-a"),
            ("lease.update", "alice", "project-a"),
        ]
        assert mine[1]["detail"]["name"] == ["audited", "renamed"]
        first = admin.get("/v1/audit", params={"limit": 1}).json()["audit_log"]
        assert [r["action"] for r in first] == ["host.create"]
        rest = admin.get("/v1/audit", params={"marker": first[0]["id"]}).json()["audit_log"]
        assert [r["action"] for r in rest] == ["lease.create", "lease.update"]
        updates = admin.get("/v1/audit", params={"action": "lease.update"}).json()["audit_log"]
        assert [r["target_id"] for r in updates] == [lease["id"]]
        later = admin.get("/v1/audit", params={"since": "2999-01-01 00:00"}).json()["audit_log"]
        assert later == []
        assert_error(admin.get("/v1/audit", params={"marker": "999999"}), 400, "marker")
        assert_error(admin.get("/v1/audit", params={"since": "yesterday"}), 400, "since")


def test_climate_audit_list(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    run("host", "create", "compute-0", *url)
    listed = json.loads(run("audit", "list", "--action", "host.create", "--json", *url).stdout)
    assert [(r["action"], r["detail"]) for r in listed] == [("host.create", {"name": "compute-0"})]
    assert "host.create" in run("audit", "list", "--limit", "1", *url).stdout
    denied = run("audit", "list", "--project", "project-a", *url, ok=False)
    assert "error (403)" in denied.stderr


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),  # past 64 bits too
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.datetimes(timezones=st.just(dt.UTC)),
    st.sampled_from(list(LeaseStatus)),
)
_details = st.dictionaries(
    st.text(),
    st.recursive(
        _scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=12,
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(detail=_details)
def test_a_detail_is_stored_as_the_standard_librarys_json_would_read(
    detail: dict[str, Any],
) -> None:
    """Written by orjson for speed: what a reader decodes is what the standard library's
    ``json.dumps(detail, sort_keys=True, default=str)`` gave, keys in the same order."""
    stored = audit._json(detail)
    expected = json.dumps(detail, sort_keys=True, default=str)
    assert json.loads(stored) == json.loads(expected)
    assert list(json.loads(stored)) == list(json.loads(expected))
