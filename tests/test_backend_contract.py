"""One contract for every backend (as APScheduler runs one suite over every data store):
typed actions in, one typed result per action out; start and end are idempotent; every end
policy ends; manual start, acknowledge, migrate and enrol answer as the interface says.

``openstack`` runs against the real rig (tests/openstack/conftest.py) and skips where it cannot
start."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest

from climate.backends.base import (
    Acknowledge,
    Backend,
    BeforeEnd,
    Done,
    End,
    Enrol,
    Handover,
    Inspected,
    InspectUsage,
    Migrate,
    Migration,
    Replace,
    Start,
    StartManual,
    Timeboxed,
    UnknownResource,
    Usage,
    Withdraw,
)
from climate.backends.faulty import FaultyBackend
from climate.backends.openstack.placement import resource_class
from climate.backends.standalone import StandaloneBackend
from climate.domain.status import EndPolicy, StartPolicy
from tests.openstack.conftest import ON_THE_RIG, aggregate, empty_freepool, rig_settings
from tests.openstack.conftest import openstack_env as openstack_env  # the rig fixture

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(params=["standalone", "faulty", pytest.param("openstack", marks=ON_THE_RIG)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "standalone":
        yield StandaloneBackend()
    elif request.param == "faulty":
        yield FaultyBackend(fault_rate=0.0)
    else:
        env = request.getfixturevalue("openstack_env")
        os.environ.pop("OS_CLIENT_CONFIG_FILE", None)
        from climate.backends.openstack import OpenStackBackend

        backend = OpenStackBackend.from_settings(rig_settings(env))
        project = backend.conn.identity.create_project(
            name=f"climate-contract-{uuid.uuid4().hex[:8]}", domain_id="default"
        )
        PROJECT[0] = project.id
        yield backend
        PROJECT[0] = ""
        backend.handle([End((h,)) for h in MADE])  # whatever a failed test left started
        MADE.clear()
        backend.conn.identity.delete_project(project)
        empty_freepool(backend.conn, backend.config.freepool_name)


MADE: list[Handover] = []
PROJECT = [""]
"""The project the handovers name: a real one on the rig (Nova checks flavor access)."""


def host_handover(**changes: object) -> Handover:
    handover = Handover(
        lease_id=str(uuid.uuid4()),
        reservation_id=str(uuid.uuid4()),
        project_id=PROJECT[0] or uuid.uuid4().hex,
        resource_type="physical:host",
        resource_ids=("3",),
        at=NOW,
        hosts={"3": "compute3"},
    )
    made = replace(handover, **changes)  # type: ignore[arg-type]
    MADE.append(made)
    return made


def instance_handover(**changes: object) -> Handover:
    defaults: dict[str, object] = {
        "resource_type": "virtual:instance",
        "resource_ids": ("2:0", "2:1"),
        "hosts": {"2": "compute2"},
        "params": {"vcpus": 1, "memory_mb": 512, "disk_gb": 1, "amount": 2, "affinity": True},
    }
    return host_handover(**{**defaults, **changes})


def ok(result: object) -> None:
    assert isinstance(result, Done), f"{result!r}: {result}"


def test_one_result_per_action_in_order(backend: Backend) -> None:
    h, other = host_handover(), instance_handover()
    results = Timeboxed(backend, 60).handle([Start((h,)), Start((other,))])
    assert len(results) == 2
    for result in results:
        ok(result)
    for result in backend.handle([End((h,)), End((other,))]):
        ok(result)


@pytest.mark.parametrize("make", [host_handover, instance_handover], ids=["hosts", "instances"])
def test_start_and_end_are_idempotent(backend: Backend, make: type[Handover]) -> None:
    h = make()
    for action in (Start((h,)), Start((h,)), End((h,)), End((h,))):
        (result,) = backend.handle([action])
        ok(result)


@pytest.mark.parametrize("policy", list(EndPolicy))
def test_every_end_policy_ends(backend: Backend, policy: EndPolicy) -> None:
    h = host_handover(end_policy=policy)
    ok(backend.handle([Start((h,))])[0])
    ok(backend.handle([BeforeEnd(((h, "default"),))])[0])
    ok(backend.handle([End((h,))])[0])
    if policy is EndPolicy.KEEP_UNTIL_ACK:
        ok(backend.handle([Acknowledge(h)])[0])
        ok(backend.handle([Acknowledge(h)])[0])


def test_manual_start_then_start_again(backend: Backend) -> None:
    h = host_handover(start_policy=StartPolicy.MANUAL)
    ok(backend.handle([Start((h,))])[0])
    ok(backend.handle([StartManual(h)])[0])
    ok(backend.handle([StartManual(h)])[0])
    ok(backend.handle([End((h,))])[0])


def test_migrate_moves_a_started_reservation(backend: Backend) -> None:
    assert backend.can_migrate
    h = instance_handover(params={"vcpus": 1, "memory_mb": 512, "disk_gb": 1, "affinity": None})
    ok(backend.handle([Start((h,))])[0])
    move = Migration(
        h.lease_id, h.reservation_id, h.project_id, h.resource_type, 2, 1, 2, NOW,
        from_name="compute2", to_name="compute1",
    )  # fmt: skip
    ok(backend.handle([Migrate((move,))])[0])
    ok(backend.handle([Migrate((move,))])[0])
    moved = replace(h, resource_ids=("1:0", "1:1"), hosts={"1": "compute1"})
    ok(backend.handle([End((moved,))])[0])


def test_enrol_inspects_a_known_host(backend: Backend) -> None:
    (result,) = backend.handle([Enrol("physical:host", "compute1")])
    assert isinstance(result, Inspected)
    if backend.name == "openstack":
        assert result.fields["service_name"] == "compute1"
        assert result.fields["vcpus"] > 0 and result.fields["memory_mb"] > 0


def test_enrol_of_an_unknown_host(backend: Backend) -> None:
    (result,) = backend.handle([Enrol("physical:host", f"no-such-{uuid.uuid4().hex[:6]}")])
    if backend.name == "openstack":  # a backend with a world refuses what it does not know
        assert isinstance(result, UnknownResource)
    else:
        assert isinstance(result, Inspected)


def test_withdraw_is_idempotent(backend: Backend) -> None:
    assert isinstance(backend.handle([Enrol("physical:host", "compute1")])[0], Inspected)
    for _ in range(2):
        ok(backend.handle([Withdraw("physical:host", "compute1")])[0])


def test_replace_swaps_a_host_of_a_started_reservation(backend: Backend) -> None:
    h = host_handover()
    ok(backend.handle([Start((h,))])[0])
    both = {"2": "compute2", "3": "compute3"}
    swap = Replace(replace(h, resource_ids=("2",), hosts=both), old_host="3", new_host="2")
    for _ in range(2):  # a retried replace is a no-op
        ok(backend.handle([swap])[0])
    if backend.name == "openstack":
        conn = backend.conn  # type: ignore[attr-defined]
        assert aggregate(conn, h.reservation_id).hosts == ["compute2"]
        assert "compute3" in aggregate(conn, backend.config.freepool_name).hosts  # type: ignore[attr-defined]
    lost = Replace(replace(h, resource_ids=(), hosts=both), old_host="2", new_host=None)
    ok(backend.handle([lost])[0])  # no spare: the reservation goes on without the host
    if backend.name == "openstack":
        assert not aggregate(conn, h.reservation_id).hosts
    ok(backend.handle([End((replace(h, resource_ids=(), hosts={}),))])[0])


def test_replace_moves_an_instance_reservations_slots(backend: Backend) -> None:
    h = instance_handover()
    ok(backend.handle([Start((h,))])[0])
    both = {"1": "compute1", "2": "compute2"}
    moved = replace(h, resource_ids=("1:0", "1:1"), hosts=both)
    for _ in range(2):  # a retried replace is a no-op
        ok(backend.handle([Replace(moved, old_host="2", new_host="1")])[0])
    if backend.name == "openstack":
        conn = backend.conn  # type: ignore[attr-defined]
        rc = resource_class(h.reservation_id)
        assert aggregate(conn, h.reservation_id).hosts == ["compute1"]
        assert backend.placement.total("compute1", rc) == 2  # type: ignore[attr-defined]
        assert backend.placement.total("compute2", rc) == 0  # type: ignore[attr-defined]
    ok(backend.handle([End((replace(moved, resource_ids=("2:0", "2:1", "1:0", "1:1")),))])[0])
    if backend.name == "openstack":
        assert aggregate(conn, h.reservation_id) is None
        assert not backend.placement.rc_exists(rc)  # type: ignore[attr-defined]


def test_a_start_of_many_reservations_makes_each_and_the_end_takes_each_back(
    backend: Backend,
) -> None:
    """One lease's reservations are made side by side (``openstack_concurrency``)."""
    params = {"vcpus": 1, "memory_mb": 128, "disk_gb": 1, "amount": 1, "affinity": None}
    many = tuple(instance_handover(resource_ids=("2:0",), params=params) for _ in range(6))
    ok(backend.handle([Start(many)])[0])
    if backend.name == "openstack":
        conn = backend.conn  # type: ignore[attr-defined]
        for h in many:
            assert conn.compute.find_flavor(h.reservation_id, ignore_missing=True) is not None
            total = backend.placement.total("compute2", resource_class(h.reservation_id))  # type: ignore[attr-defined]
            assert total == 1
    ok(backend.handle([End(many)])[0])
    if backend.name == "openstack":
        for h in many:
            assert conn.compute.find_flavor(h.reservation_id, ignore_missing=True) is None
            assert aggregate(conn, h.reservation_id) is None


@pytest.mark.parametrize("make", [host_handover, instance_handover], ids=["hosts", "instances"])
def test_inspect_usage_answers_for_each_reservation_and_changes_nothing(
    backend: Backend, make: type[Handover]
) -> None:
    """Nothing booted: a backend with a world sees the reservation idle; the standalone one
    cannot tell (the consumer's heartbeats do). A type the world does not show is unknown."""
    h = make()
    other = replace(host_handover(), resource_type="network:floatingip", resource_ids=("9",))
    ok(backend.handle([Start((h,))])[0])
    for _ in range(2):  # read-only: asking again answers the same
        (result,) = backend.handle([InspectUsage((h, other))])
        assert isinstance(result, Usage), result
        expected = False if backend.name == "openstack" else None
        assert result.in_use == {h.reservation_id: expected, other.reservation_id: None}
    assert backend.handle([InspectUsage(())]) == [Usage({})]
    ok(backend.handle([End((h,))])[0])
