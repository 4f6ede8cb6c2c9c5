"""Per-reservation start and end policies (docs/policies.md): a manual reservation is held until
its project starts it, each end policy reaches the backend, keep-until-ack waits for the
project's acknowledgement. Live server with the manager running, over SQLite and PostgreSQL;
the before-end and backend-failure cases on a manual clock."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic import command
from sqlalchemy import select, text

from climate.backends.base import Acknowledge, Action, BeforeEnd, Result, StartManual
from climate.backends.standalone import StandaloneBackend
from climate.cli.main import main
from climate.config import Settings
from climate.db import leases as lease_rows
from climate.db import migrate
from climate.db.engine import Database
from climate.db.records import AuditLog
from climate.db.tables import Assignment, Event, OutboxMessage
from climate.domain.clock import ManualClock
from climate.errors import BackendError, Conflict, Forbidden, NotFound
from climate.manager.service import Manager
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseRequest, LeaseService, ReservationRequest
from climate.services.reservation_actions import ReservationActionService
from tests.conftest import ADMIN, T0, LiveServer
from tests.conftest import ALICE as ALICE_ACTOR
from tests.conftest import BOB as BOB_ACTOR
from tests.helpers import add_hosts, host_request

ALICE = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
BOB = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
FORMAT = "%Y-%m-%d %H:%M:%S"
HOUR = dt.timedelta(hours=1)
SIZE = {"vcpus": 64, "memory_mb": 65536, "local_gb": 1000}
POLICIES = ("release", "delete", "suspend", "snapshot", "keep-until-ack")


def at(delta: dt.timedelta) -> str:
    return (dt.datetime.now(dt.UTC) + delta).strftime(FORMAT)


def instance(**extra: Any) -> dict[str, Any]:
    fields = {"amount": 1, "vcpus": 1, "memory_mb": 1024, "disk_gb": 10, **extra}
    return {"resource_type": "virtual:instance", **fields}


def whole_host(**extra: Any) -> dict[str, Any]:
    fields = {"min": 1, "max": 1, "hypervisor_properties": "", "resource_properties": ""}
    return {"resource_type": "physical:host", **fields, **extra}


def body(name: str, *reservations: dict[str, Any], start: str = "now") -> dict[str, Any]:
    return {
        "name": name,
        "start_date": start,
        "end_date": at(HOUR),
        "reservations": list(reservations),
        "events": [],
    }


@pytest.fixture
def http(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=30) as client:
        client.post("/v1/os-hosts", json={"name": "sized", **SIZE}).raise_for_status()
        client.post("/v1/os-hosts", json={"name": "whole"}).raise_for_status()
        yield client


def create(http: httpx.Client, lease: dict[str, Any], headers: dict[str, str] = ALICE) -> Any:
    response = http.post("/v1/leases", json=lease, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["lease"]


def lease_of(http: httpx.Client, lease_id: str) -> dict[str, Any]:
    found: dict[str, Any] = http.get(f"/v1/leases/{lease_id}").raise_for_status().json()["lease"]
    return found


def status_becomes(http: httpx.Client, lease_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while (lease := lease_of(http, lease_id))["status"] != status:
        assert time.monotonic() < deadline, f"lease {lease_id} is {lease['status']}, not {status}"
        time.sleep(0.05)
    return lease


def act(
    http: httpx.Client,
    action: str,
    lease_id: str,
    reservation_id: str,
    status: int = 200,
    headers: dict[str, str] = ALICE,
) -> Any:
    path = f"/v1/leases/{lease_id}/reservations/{reservation_id}/{action}"
    response = http.post(path, headers=headers)
    assert response.status_code == status, response.text
    return response.json()


def end_now(http: httpx.Client, lease_id: str) -> dict[str, Any]:
    """An operator ends the lease now, through the backend (the lease stays visible)."""
    http.post(f"/v1/leases/{lease_id}/force-end").raise_for_status()
    return status_becomes(http, lease_id, "TERMINATED")


def states(live: LiveServer, lease_id: str) -> dict[str, tuple[str, str, str]]:
    """Per reservation: the standalone backend's (start_policy, end_policy, state)."""
    with live.ctx.db.reader() as session:
        rows = session.scalars(select(Assignment).where(Assignment.lease_id == lease_id)).all()
        return {r.reservation_id: (r.start_policy, r.end_policy, r.state) for r in rows}


def audited(live: LiveServer, action: str) -> list[str]:
    with live.ctx.db.reader() as session:
        query = select(AuditLog.target_id).where(AuditLog.action == action)
        return list(session.scalars(query))


# -- shown in the API -----------------------------------------------------------------------


def test_reservations_show_their_policies_defaults_when_not_given(http: httpx.Client) -> None:
    future = at(2 * HOUR)
    given = whole_host(start_policy="manual", end_policy="delete")
    lease = create(http, {**body("l", whole_host(), given, start=future), "end_date": at(3 * HOUR)})
    plain, chosen = lease["reservations"]
    assert {k: plain[k] for k in ("start_policy", "end_policy", "started_at", "acknowledged")} == {
        "start_policy": "auto",
        "end_policy": "release",
        "started_at": None,
        "acknowledged": None,
    }
    assert (chosen["start_policy"], chosen["end_policy"]) == ("manual", "delete")
    assert lease_of(http, lease["id"])["reservations"][1]["end_policy"] == "delete"
    changed = http.put(
        f"/v1/leases/{lease['id']}",
        json={"reservations": [{"id": plain["id"], "end_policy": "snapshot"}]},
        headers=ALICE,
    )
    assert changed.status_code == 200, changed.text
    assert [r["end_policy"] for r in changed.json()["lease"]["reservations"]] == [
        "snapshot",
        "delete",
    ]


@pytest.mark.parametrize(
    ("reservation", "field", "words"),
    [
        (whole_host(start_policy="later"), "reservations[0].start_policy", "auto, manual"),
        (whole_host(end_policy="explode"), "reservations[0].end_policy", "must be one of"),
        (whole_host(end_policy=["delete"]), "reservations[0].end_policy", "must be one of"),
        (whole_host(end_policy="suspend"), "reservations[0].end_policy", "physical:host"),
    ],
    ids=["start-unknown", "end-unknown", "end-list", "end-not-offered"],
)
def test_bad_policies_are_refused_naming_the_field(
    http: httpx.Client, reservation: dict[str, Any], field: str, words: str
) -> None:
    response = http.post("/v1/leases", json=body("bad", reservation), headers=ALICE)
    assert response.status_code == 400, response.text
    message = response.json()["error_message"]
    assert message.startswith(f"{field}: ") and words in message
    assert http.get("/v1/leases").json()["leases"] == []


def test_the_state_a_reservation_records_cannot_be_sent(http: httpx.Client) -> None:
    """``started_at`` and ``acknowledged_at`` are not fields: ignored, as any key a type does
    not take (Blazar ignores them), never stored over the reservation's own."""
    state = {"started_at": "2030-01-01T00:00:00", "acknowledged_at": "2030-01-01T00:00:00"}
    manual = instance(start_policy="manual", end_policy="keep-until-ack", **state)
    lease = create(http, body("vm", manual, start=at(2 * HOUR)) | {"end_date": at(3 * HOUR)})
    (reservation,) = lease["reservations"]
    assert (reservation["started_at"], reservation["acknowledged_at"]) == (None, None)
    response = http.put(
        f"/v1/leases/{lease['id']}",
        json={"reservations": [{"id": reservation["id"], **state}]},
        headers=ALICE,
    )
    assert response.status_code == 200, response.text
    (kept,) = lease_of(http, lease["id"])["reservations"]
    assert (kept["started_at"], kept["acknowledged_at"]) == (None, None)


def test_a_policy_update_is_checked_against_the_reservations_type(http: httpx.Client) -> None:
    lease = create(http, body("vm", instance(), start=at(2 * HOUR)) | {"end_date": at(3 * HOUR)})
    (reservation,) = lease["reservations"]
    response = http.put(
        f"/v1/leases/{lease['id']}",
        json={"reservations": [{"id": reservation["id"], "end_policy": "forget"}]},
        headers=ALICE,
    )
    assert response.status_code == 400
    assert response.json()["error_message"].startswith("reservations[0].end_policy: ")
    assert lease_of(http, lease["id"])["reservations"][0]["end_policy"] == "release"


# -- manual start ---------------------------------------------------------------------------


def test_manual_reservation_is_held_until_its_project_starts_it(
    http: httpx.Client, live: LiveServer
) -> None:
    lease = create(http, body("manual", instance(start_policy="manual"), instance()))
    manual, auto = (r["id"] for r in lease["reservations"])
    status_becomes(http, lease["id"], "ACTIVE")
    assert states(live, lease["id"]) == {
        manual: ("manual", "release", "held"),
        auto: ("auto", "release", "running"),
    }

    started = act(http, "start", lease["id"], manual)["lease"]
    shown = {r["id"]: r for r in started["reservations"]}
    assert shown[manual]["started_at"] is not None
    assert shown[auto]["started_at"] is None
    assert states(live, lease["id"])[manual] == ("manual", "release", "running")
    assert audited(live, "reservation.start") == [manual]

    again = act(http, "start", lease["id"], manual, 409)
    assert "was started already" in again["error_message"]
    refused = act(http, "start", lease["id"], auto, 409)
    assert "starts automatically" in refused["error_message"]
    # An update of a started reservation keeps what its project did.
    http.put(
        f"/v1/leases/{lease['id']}",
        json={"reservations": [{"id": manual, "end_policy": "snapshot"}]},
        headers=ALICE,
    ).raise_for_status()
    kept = {r["id"]: r for r in lease_of(http, lease["id"])["reservations"]}[manual]
    assert kept["started_at"] == shown[manual]["started_at"]
    assert kept["end_policy"] == "snapshot"


def test_a_manual_reservation_cannot_start_before_or_after_its_lease_runs(
    http: httpx.Client,
) -> None:
    later = create(http, body("later", instance(start_policy="manual"), start=at(HOUR / 2)))
    (reservation,) = later["reservations"]
    refused = act(http, "start", later["id"], reservation["id"], 409)
    assert "is pending: only an active reservation" in refused["error_message"]

    now = create(http, body("now", instance(start_policy="manual")))
    (reservation,) = now["reservations"]
    status_becomes(http, now["id"], "ACTIVE")
    end_now(http, now["id"])
    refused = act(http, "start", now["id"], reservation["id"], 409)
    assert "is deleted" in refused["error_message"]


def test_another_projects_reservation_or_an_unknown_one_is_not_found(
    http: httpx.Client, live: LiveServer
) -> None:
    lease = create(http, body("mine", instance(start_policy="manual", end_policy="keep-until-ack")))
    (reservation,) = lease["reservations"]
    status_becomes(http, lease["id"], "ACTIVE")
    for action in ("start", "acknowledge"):
        foreign = act(http, action, lease["id"], reservation["id"], 404, headers=BOB)
        assert foreign["error_message"] == (
            f"Lease {lease['id']} could not be found (Object with {{'lease_id': '{lease['id']}'}} "
            "not found)"
        )
        unknown = act(http, action, lease["id"], "nope", 404)
        assert unknown["error_message"] == "Reservation nope could not be found"
    assert states(live, lease["id"])[reservation["id"]][2] == "held"
    assert audited(live, "reservation.start") == []


# -- end policies ---------------------------------------------------------------------------


def test_each_end_policy_reaches_the_backend_and_shows_in_assignments(
    http: httpx.Client, live: LiveServer
) -> None:
    lease = create(http, body("ends", *(instance(end_policy=p) for p in POLICIES)))
    ids = [r["id"] for r in lease["reservations"]]
    status_becomes(http, lease["id"], "ACTIVE")
    assert {r: s[1:] for r, s in states(live, lease["id"]).items()} == {
        r: (p, "running") for r, p in zip(ids, POLICIES, strict=True)
    }
    ended = end_now(http, lease["id"])
    assert states(live, lease["id"]) == {
        ids[0]: ("auto", "release", "released"),
        ids[1]: ("auto", "delete", "deleted"),
        ids[2]: ("auto", "suspend", "suspended"),
        ids[3]: ("auto", "snapshot", "snapshotted"),
        ids[4]: ("auto", "keep-until-ack", "kept"),
    }
    assert [r["acknowledged"] for r in ended["reservations"]] == [None] * 4 + [False]


def test_keep_until_ack_is_kept_until_its_project_acknowledges(
    http: httpx.Client, live: LiveServer
) -> None:
    lease = create(http, body("keep", instance(end_policy="keep-until-ack"), instance()))
    kept, released = (r["id"] for r in lease["reservations"])
    status_becomes(http, lease["id"], "ACTIVE")
    early = act(http, "acknowledge", lease["id"], kept, 409)
    assert "is active: nothing is kept before it has ended" in early["error_message"]

    end_now(http, lease["id"])
    assert states(live, lease["id"])[kept][2] == "kept"
    # The resources went back to the pool at the end, whatever the policy.
    assert http.get("/v1/instances/allocations").json()["allocations"] == []

    answer = act(http, "acknowledge", lease["id"], kept)["lease"]
    shown = {r["id"]: r for r in answer["reservations"]}
    assert (shown[kept]["acknowledged"], shown[released]["acknowledged"]) == (True, None)
    assert shown[kept]["acknowledged_at"] is not None
    assert states(live, lease["id"])[kept] == ("auto", "keep-until-ack", "released")
    assert audited(live, "reservation.acknowledge") == [kept]

    twice = act(http, "acknowledge", lease["id"], kept, 409)
    assert "was acknowledged already" in twice["error_message"]
    other = act(http, "acknowledge", lease["id"], released, 409)
    assert "ends with end_policy release: nothing is kept" in other["error_message"]


def test_a_deleted_lease_releases_what_keep_until_ack_would_keep(
    http: httpx.Client, live: LiveServer
) -> None:
    lease = create(http, body("gone", instance(end_policy="keep-until-ack")))
    (reservation,) = lease["reservations"]
    status_becomes(http, lease["id"], "ACTIVE")
    http.delete(f"/v1/leases/{lease['id']}", headers=ALICE).raise_for_status()
    deadline = time.monotonic() + 10
    while states(live, lease["id"])[reservation["id"]][2] != "released":
        assert time.monotonic() < deadline, states(live, lease["id"])
        time.sleep(0.05)
    assert states(live, lease["id"])[reservation["id"]] == ("auto", "release", "released")


def test_deleting_an_ended_lease_discards_what_keep_until_ack_kept(
    http: httpx.Client, live: LiveServer
) -> None:
    keep = instance(end_policy="keep-until-ack")
    lease = create(http, body("kept", keep, keep, instance()))
    acked, kept, released = (r["id"] for r in lease["reservations"])
    status_becomes(http, lease["id"], "ACTIVE")
    end_now(http, lease["id"])
    act(http, "acknowledge", lease["id"], acked)
    assert [s[2] for s in states(live, lease["id"]).values()] == ["released", "kept", "released"]

    http.delete(f"/v1/leases/{lease['id']}", headers=ALICE).raise_for_status()

    # Deleting is the acknowledgement: the backend discards what was still kept, audited as
    # acknowledging it; what was acknowledged already is not discarded again.
    assert states(live, lease["id"])[kept] == ("auto", "keep-until-ack", "released")
    assert audited(live, "reservation.acknowledge") == [acked, kept]
    assert audited(live, "lease.delete") == [lease["id"]]
    assert http.get(f"/v1/leases/{lease['id']}").status_code == 404


def test_whole_hosts_and_volumes_offer_their_own_end_policies(http: httpx.Client) -> None:
    http.post("/v1/volume-pools", json={"name": "ssd", "capacity_gb": 100}).raise_for_status()
    volume = {"resource_type": "virtual:volume", "size_gb": 10}
    create(http, body("fine", whole_host(end_policy="snapshot"), volume | {"end_policy": "delete"}))
    refused = http.post(
        "/v1/leases",
        json=body("no", whole_host(), volume | {"end_policy": "suspend"}),
        headers=ALICE,
    )
    assert refused.status_code == 400
    assert refused.json()["error_message"] == (
        "reservations[1].end_policy: suspend is not offered for virtual:volume reservations; "
        "use one of release, delete, snapshot, keep-until-ack"
    )


# -- the command line -----------------------------------------------------------------------


def test_cli_starts_and_acknowledges_reservations(
    http: httpx.Client, live: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    manual = instance(start_policy="manual", end_policy="keep-until-ack")
    lease = create(http, body("cli", manual))
    (reservation,) = lease["reservations"]
    status_becomes(http, lease["id"], "ACTIVE")
    client = ["--url", live.url, "--project", "project-a"]
    main(["reservation", "start", lease["id"], reservation["id"], *client])
    out = capsys.readouterr().out
    assert "started_at" in out and "manual" in out
    end_now(http, lease["id"])
    main(["reservation", "acknowledge", lease["id"], reservation["id"], *client, "--json"])
    assert '"acknowledged": true' in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"error \(409\): reservation .* acknowledged already"):
        main(["reservation", "acknowledge", lease["id"], reservation["id"], *client])


# -- the backend failing, before-end reminders (manual clock) -------------------------------


class Unreachable(StandaloneBackend):
    """The standalone backend whose cloud refuses, or never answers, manual starts."""

    def __init__(self, hang: bool = False) -> None:
        self.hang = hang

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        if not isinstance(actions[0], StartManual):
            return super().handle(actions)
        if self.hang:
            threading.Event().wait(5)
        raise RuntimeError("cloud said no")


@pytest.fixture
def manual_lease(ctx: ServiceContext, hosts: HostService, leases: LeaseService) -> str:
    """A running lease of one manual whole-host reservation; its id."""
    add_hosts(hosts, 1)
    fields = {"min": 1, "max": 1, "start_policy": "manual"}
    request = LeaseRequest(
        name="m",
        start=T0,
        end=T0 + 2 * HOUR,
        reservations=[ReservationRequest("physical:host", fields)],
    )
    lease = leases.create(ALICE_ACTOR, request)
    assert Manager(ctx, StandaloneBackend()).run_due() == 1
    return lease.id


@pytest.mark.parametrize("hang", [False, True], ids=["refused", "timed-out"])
def test_a_failing_backend_leaves_a_manual_reservation_held(
    settings: Settings,
    db: Database,
    clock: ManualClock,
    manual_lease: str,
    leases: LeaseService,
    hang: bool,
) -> None:
    ctx = build_context(settings.model_copy(update={"backend_timeout_seconds": 0.2}), db, clock)
    actions = ReservationActionService(ctx, Unreachable(hang))
    (reservation,) = leases.get(ALICE_ACTOR, manual_lease).reservations
    reason = "timed out after 0.2 s" if hang else "cloud said no"
    with pytest.raises(BackendError, match=f"failed to start: .*{reason}"):
        actions.start(ALICE_ACTOR, manual_lease, reservation.id)
    (reservation,) = leases.get(ALICE_ACTOR, manual_lease).reservations
    assert "started_at" not in reservation.params
    with db.reader() as session:
        assert set(session.scalars(select(Assignment.state))) == {"held"}
    working = ReservationActionService(ctx, StandaloneBackend())
    working.start(ALICE_ACTOR, manual_lease, reservation.id)
    with pytest.raises(Conflict, match="was started already"):
        working.start(ALICE_ACTOR, manual_lease, reservation.id)


class Unforgetting(StandaloneBackend):
    """The standalone backend whose cloud refuses to discard what it kept."""

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        if isinstance(actions[0], Acknowledge):
            raise RuntimeError("cloud said no")
        return super().handle(actions)


def test_a_failing_backend_leaves_an_ended_lease_undeleted_with_its_workload_kept(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    hosts.create(ADMIN, "sized", dict(SIZE))
    fields = {"amount": 1, "vcpus": 1, "memory_mb": 1024, "disk_gb": 10}
    request = LeaseRequest(
        name="k",
        start=T0,
        end=T0 + HOUR,
        reservations=[
            ReservationRequest("virtual:instance", {**fields, "end_policy": "keep-until-ack"})
        ],
    )
    lease = leases.create(ALICE_ACTOR, request)
    manager = Manager(ctx, StandaloneBackend())
    manager.run_due()
    clock.set(T0 + HOUR)
    manager.run_due()
    assert leases.get(ALICE_ACTOR, lease.id).status == "TERMINATED"

    deletion = select(AuditLog.action).where(
        AuditLog.action.in_(["lease.delete", "reservation.acknowledge"])
    )
    failing = ReservationActionService(ctx, Unforgetting())
    with pytest.raises(BackendError, match="failed to acknowledge: .*cloud said no"):
        failing.delete_lease(ALICE_ACTOR, lease.id)

    (reservation,) = leases.get(ALICE_ACTOR, lease.id).reservations
    assert "acknowledged_at" not in reservation.params
    with ctx.db.reader() as session:
        assert lease_rows.has_ended_reservation(session, lease.id)
        assert set(session.scalars(select(Assignment.state))) == {"kept"}
        assert list(session.scalars(deletion)) == []
    ReservationActionService(ctx, StandaloneBackend()).delete_lease(ALICE_ACTOR, lease.id)
    with ctx.db.reader() as session:
        assert set(session.scalars(select(Assignment.state))) == {"released"}
        assert sorted(session.scalars(deletion)) == ["lease.delete", "reservation.acknowledge"]


def test_deleting_a_lease_before_it_ends_asks_the_backend_to_discard_nothing(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    hosts.create(ADMIN, "sized", dict(SIZE))
    fields = {
        "amount": 1,
        "vcpus": 1,
        "memory_mb": 1024,
        "disk_gb": 10,
        "end_policy": "keep-until-ack",
    }
    request = LeaseRequest(
        name="early",
        start=T0 + HOUR,
        end=T0 + 2 * HOUR,
        reservations=[ReservationRequest("virtual:instance", fields)],
    )
    lease = leases.create(ALICE_ACTOR, request)
    with ctx.db.reader() as session:
        assert not lease_rows.has_ended_reservation(session, lease.id)
        assert not lease_rows.has_ended_reservation(session, "no-such-lease")

    actions = ReservationActionService(ctx, Unforgetting())  # refuses every discard
    with pytest.raises(NotFound):
        actions.delete_lease(BOB_ACTOR, lease.id)
    actions.delete_lease(ALICE_ACTOR, lease.id)
    with pytest.raises(NotFound):
        leases.get(ALICE_ACTOR, lease.id)
    with pytest.raises(NotFound):
        actions.delete_lease(ALICE_ACTOR, lease.id)


def test_the_actions_follow_their_policy_rules(
    settings: Settings, db: Database, clock: ManualClock, manual_lease: str, tmp_path: Path
) -> None:
    rules = tmp_path / "policy.json"
    rules.write_text('{"climate:leases:start_reservation": "rule:admin"}')
    ctx = build_context(settings.model_copy(update={"policy_file": str(rules)}), db, clock)
    actions = ReservationActionService(ctx, StandaloneBackend())
    (reservation,) = LeaseService(ctx).get(ALICE_ACTOR, manual_lease).reservations
    with pytest.raises(Forbidden, match="climate:leases:start_reservation"):
        actions.start(ALICE_ACTOR, manual_lease, reservation.id)
    actions.start(ADMIN, manual_lease, reservation.id)
    with db.reader() as session:
        assert set(session.scalars(select(Assignment.state))) == {"running"}
        (actor,) = session.scalars(
            select(AuditLog.actor_user).where(AuditLog.action == "reservation.start")
        )
    assert actor == ADMIN.user_id


class Recording(StandaloneBackend):
    def __init__(self) -> None:
        self.before_end_calls: list[tuple[str, str]] = []

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        for action in actions:
            if isinstance(action, BeforeEnd):
                self.before_end_calls += [(h.lease_id, what) for h, what in action.steps]
        return super().handle(actions)


@pytest.mark.parametrize("webhooks", [False, True], ids=["no-webhooks", "webhooks"])
@pytest.mark.parametrize("planned", [False, True], ids=["claimed", "planned"])
def test_a_reminder_only_notifies_and_the_before_end_event_runs_the_action(
    settings: Settings, db: Database, clock: ManualClock, planned: bool, webhooks: bool
) -> None:
    hooks = ("http://127.0.0.1:9/hook",) if webhooks else ()
    ctx = build_context(settings.model_copy(update={"webhooks": hooks}), db, clock)
    add_hosts(HostService(ctx), 1)
    end = T0 + 4 * HOUR
    request = replace(host_request("l", T0, end, before_end=end - HOUR), reminders=[2 * HOUR])
    request.reservations[0].fields["before_end"] = "notification"
    lease = LeaseService(ctx).create(ALICE_ACTOR, request)
    reminder = end - 2 * HOUR
    backend = Recording()
    manager = Manager(ctx, backend)

    def run_at(when: dt.datetime) -> None:
        if planned:
            clock.set(when - dt.timedelta(seconds=1))
            manager.prepare()
        clock.set(when)
        assert manager.run_due() == 1

    run_at(T0)
    run_at(reminder)
    assert backend.before_end_calls == []  # a reminder only notifies
    run_at(end - HOUR)
    assert backend.before_end_calls == [(lease.id, "notification")]
    with db.reader() as session:
        done = session.scalars(select(Event.status).where(Event.lease_id == lease.id)).all()
        topics = session.scalars(select(OutboxMessage.topic).order_by(OutboxMessage.id)).all()
    assert sorted(done) == ["DONE", "DONE", "DONE", "UNDONE"]
    if webhooks:
        assert topics == ["lease.create", "lease.start", "lease.before_end", "lease.before_end"]


# -- the migration --------------------------------------------------------------------------


def test_handover_policies_revision_marks_ended_assignments_released(db: Database) -> None:
    config = migrate._config(db)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0007")
        for name, released in (("open", None), ("ended", T0)):
            connection.execute(
                text(
                    "INSERT INTO assignments (id, reservation_id, lease_id, project_id, "
                    "resource_type, resource_id, assigned_at, released_at) "
                    "VALUES (:id, 'r', 'l', 'p', 'physical:host', :id, :at, :released)"
                ),
                {"id": name, "at": T0, "released": released},
            )
    migrate.upgrade(db)
    with db.reader() as session:
        rows = session.execute(
            select(Assignment.id, Assignment.start_policy, Assignment.end_policy, Assignment.state)
        ).all()
    assert sorted(tuple(r) for r in rows) == [
        ("ended", "auto", "release", "released"),
        ("open", "auto", "release", "running"),
    ]
