"""Devices, network segments and floating IPs: inventory, reservations inside leases (alone and
mixed with hosts), all-or-nothing admission, and the hand-over to the backend."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import select

from climate.db.tables import Assignment
from climate.domain.clock import ManualClock
from climate.errors import Conflict, InvalidInput, NotEnoughCapacity, NotFound, ResourceInUse
from climate.resources.items import DEVICES, FLOATING_IPS, NETWORKS
from climate.runtime import build_workers
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.items import ItemService
from climate.services.leases import LeaseChanges, LeaseRequest, LeaseService, ReservationRequest
from tests.conftest import ADMIN, ALICE, BOB, T0
from tests.helpers import add_hosts

HOUR = dt.timedelta(hours=1)
NET = "ext-net"


@pytest.fixture
def fips(ctx: ServiceContext) -> ItemService:
    return ItemService(ctx, FLOATING_IPS)


@pytest.fixture
def devices(ctx: ServiceContext) -> ItemService:
    return ItemService(ctx, DEVICES)


@pytest.fixture
def networks(ctx: ServiceContext) -> ItemService:
    return ItemService(ctx, NETWORKS)


def add_fips(fips: ItemService, count: int, network: str = NET) -> dict[str, int]:
    found = {}
    for i in range(count):
        item = fips.create(
            ADMIN, {"floating_network_id": network, "floating_ip_address": f"172.24.4.{10 + i}"}
        )
        found[item.name] = item.id
    return found


def lease_of(
    name: str, *reservations: tuple[str, dict[str, Any]], start: dt.datetime = T0 + HOUR
) -> LeaseRequest:
    return LeaseRequest(
        name=name,
        start=start,
        end=start + 2 * HOUR,
        reservations=[ReservationRequest(kind, fields) for kind, fields in reservations],
    )


def fip(amount: int = 1, *required: str, network: str = NET) -> tuple[str, dict[str, Any]]:
    fields = {"network_id": network, "amount": amount, "required_floatingips": list(required)}
    return ("virtual:floatingip", fields)


def items_of(lease: Any) -> list[int]:
    return sorted(a.item_id for r in lease.reservations for a in r.item_allocations)


def test_floating_ips_come_from_their_network_required_ones_first(
    fips: ItemService, leases: LeaseService
) -> None:
    ids = add_fips(fips, 4)
    add_fips(fips, 2, network="other-net")
    lease = leases.create(ALICE, lease_of("l", fip(2, "172.24.4.12")))
    chosen = items_of(lease)
    assert len(chosen) == 2
    assert ids["172.24.4.12"] in chosen
    assert set(chosen) <= set(ids.values())
    (reservation,) = lease.reservations
    assert reservation.params == {
        "network_id": NET,
        "amount": 2,
        "required_floatingips": ["172.24.4.12"],
        "before_end": "default",
    }


def test_a_required_floating_ip_held_by_another_lease_is_refused(
    fips: ItemService, leases: LeaseService
) -> None:
    add_fips(fips, 3)
    leases.create(ALICE, lease_of("first", fip(1, "172.24.4.10")))
    with pytest.raises(NotEnoughCapacity, match=r"floating IP\(s\) 172.24.4.10 not free"):
        leases.create(BOB, lease_of("second", fip(1, "172.24.4.10")))
    later = leases.create(BOB, lease_of("later", fip(1, "172.24.4.10"), start=T0 + 3 * HOUR))
    assert len(items_of(later)) == 1


def test_not_enough_floating_ips_says_how_many_match_and_are_free(
    fips: ItemService, leases: LeaseService
) -> None:
    add_fips(fips, 3)
    leases.create(ALICE, lease_of("first", fip(2)))
    with pytest.raises(NotEnoughCapacity) as refused:
        leases.create(BOB, lease_of("second", fip(2)))
    assert (
        "Not enough floating IPs available in network ext-net: 2 requested, 3 match, 1 free"
        in str(refused.value)
    )


@pytest.mark.parametrize(
    ("fields", "field", "problem"),
    [
        ({"network_id": NET, "amount": 0}, "reservations[0].amount", "must be >= 1"),
        ({"network_id": NET, "amount": -2}, "reservations[0].amount", "must be >= 1"),
        ({"amount": 1}, "reservations[0].network_id", "Missing parameter network_id"),
        (
            {"network_id": NET, "amount": 2, "required_floatingips": ["172.24.4.10"] * 2},
            "reservations[0].required_floatingips",
            "more than once",
        ),
        (
            {"network_id": NET, "amount": 1, "required_floatingips": ["not-an-ip"]},
            "reservations[0].required_floatingips",
            "IP address",
        ),
        (
            {"network_id": NET, "amount": 1, "required_floatingips": ["172.24.4.10", "1.1.1.1"]},
            "reservations[0].required_floatingips",
            "The amount must be equal to or longer than length of required_floatingips",
        ),
    ],
)
def test_bad_floating_ip_requests_name_the_field(
    fips: ItemService, leases: LeaseService, fields: dict[str, Any], field: str, problem: str
) -> None:
    add_fips(fips, 2)
    with pytest.raises(InvalidInput, match=problem) as refused:
        leases.create(ALICE, lease_of("bad", ("virtual:floatingip", fields)))
    assert refused.value.message.startswith(f"{field}:")


def test_a_key_floating_ips_do_not_take_is_ignored_and_not_stored(
    fips: ItemService, leases: LeaseService
) -> None:
    add_fips(fips, 2)
    fields = {"network_id": NET, "amount": 1, "colour": "red"}
    lease = leases.create(ALICE, lease_of("l", ("virtual:floatingip", fields)))
    assert "colour" not in lease.reservations[0].params


def test_unknown_network_and_addresses_outside_the_pool_are_bad_input(
    fips: ItemService, leases: LeaseService
) -> None:
    add_fips(fips, 2)
    with pytest.raises(InvalidInput, match="^network_id: no reservable floating IPs"):
        leases.create(ALICE, lease_of("l", fip(1, network="nowhere")))
    with pytest.raises(
        InvalidInput,
        match="^required_floatingips: Not enough floating IPs available: 10.0.0.1 not among",
    ):
        leases.create(ALICE, lease_of("l", fip(1, "10.0.0.1")))


def test_devices_are_reserved_min_to_max_matching_their_properties(
    devices: ItemService, leases: LeaseService
) -> None:
    gpus = [devices.create(ADMIN, {"name": f"gpu-{i}", "model": "a100"}).id for i in range(3)]
    devices.create(ADMIN, {"name": "fpga-0", "model": "u280"})
    fields = {"min": 1, "max": 2, "resource_properties": '["==", "$model", "a100"]'}
    first = leases.create(ALICE, lease_of("first", ("device", fields)))
    assert len(items_of(first)) == 2
    second = leases.create(BOB, lease_of("second", ("device", fields)))
    assert len(items_of(second)) == 1
    assert set(items_of(first)) | set(items_of(second)) == set(gpus)
    with pytest.raises(
        NotEnoughCapacity, match="Not enough devices available: 1 requested, 3 match, 0 free"
    ):
        leases.create(BOB, lease_of("third", ("device", fields)))


def test_network_segments_match_network_and_resource_properties(
    networks: ItemService, leases: LeaseService
) -> None:
    for segment in (100, 101):
        networks.create(
            ADMIN,
            {"network_type": "vlan", "physical_network": "physnet1", "segment_id": segment},
        )
    networks.create(
        ADMIN,
        {"network_type": "vlan", "physical_network": "physnet2", "segment_id": 100, "fast": "y"},
    )
    wanted = {"network_properties": '["==", "$physical_network", "physnet2"]'}
    lease = leases.create(ALICE, lease_of("l", ("network", wanted)))
    (segment,) = items_of(lease)
    assert segment == 3
    assert lease.reservations[0].params["amount"] == 1
    with pytest.raises(NotEnoughCapacity, match="Not enough network segments available"):
        leases.create(BOB, lease_of("again", ("network", {**wanted, "resource_properties": ""})))
    two = leases.create(BOB, lease_of("two", ("network", {"amount": 2})))
    assert items_of(two) == [1, 2]


def test_mixed_lease_is_all_or_nothing(
    ctx: ServiceContext, hosts: HostService, fips: ItemService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    add_fips(fips, 1)
    host = ("physical:host", {"min": 1, "max": 1})
    leases.create(ALICE, lease_of("ips", fip(1)))
    with pytest.raises(NotEnoughCapacity, match="floating IPs"):
        leases.create(BOB, lease_of("both", host, fip(1)))
    assert [lease.name for lease in leases.list_all(ADMIN)] == ["ips"]
    # The host it would have had is still free.
    assert leases.create(BOB, lease_of("host", host)).reservations[0].allocations


def test_update_readmits_every_reservation_or_changes_nothing(
    hosts: HostService, fips: ItemService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    add_fips(fips, 1)
    host = ("physical:host", {"min": 1, "max": 1})
    lease = leases.create(ALICE, lease_of("mixed", host, fip(1)))
    blocker = leases.create(BOB, lease_of("blocker", fip(1), start=T0 + 3 * HOUR))
    with pytest.raises(NotEnoughCapacity):
        leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 4 * HOUR))
    kept = leases.get(ALICE, lease.id)
    assert kept.end_date == T0 + 3 * HOUR
    assert items_of(kept) == items_of(lease)
    leases.delete(BOB, blocker.id)
    moved = leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 4 * HOUR))
    assert {a.end_date for r in moved.reservations for a in r.item_allocations} == {T0 + 4 * HOUR}
    (ips,) = [r for r in moved.reservations if r.resource_type == "virtual:floatingip"]
    fips.create(ADMIN, {"floating_network_id": NET, "floating_ip_address": "172.24.4.99"})
    grown = leases.update(
        ALICE,
        lease.id,
        LeaseChanges(reservations=[ReservationRequest(None, {"amount": 2}, ips.id)]),
    )
    assert len(items_of(grown)) == 2


def test_items_go_to_the_backend_at_start_and_come_back_at_the_end(
    ctx: ServiceContext,
    fips: ItemService,
    devices: ItemService,
    leases: LeaseService,
    clock: ManualClock,
) -> None:
    add_fips(fips, 1)
    device = devices.create(ADMIN, {"name": "gpu-0"})
    lease = leases.create(ALICE, lease_of("l", fip(1), ("device", {"min": 1, "max": 1})))
    manager = build_workers(ctx).manager
    clock.set(T0 + HOUR)
    manager.run_due()
    with ctx.db.reader() as session:
        held = session.execute(
            select(Assignment.resource_type, Assignment.resource_id, Assignment.released_at)
        ).all()
    assert sorted(held) == sorted(
        [
            (
                "virtual:floatingip",
                str(items_of(lease)[0] if items_of(lease)[0] != device.id else items_of(lease)[1]),
                None,
            ),
            ("device", str(device.id), None),
        ]
    )
    clock.set(T0 + 3 * HOUR)
    manager.run_due()
    with ctx.db.reader() as session:
        released = session.scalars(select(Assignment.released_at)).all()
    assert released == [T0 + 3 * HOUR] * 2


def test_inventory_delete_is_refused_while_a_lease_holds_the_item(
    fips: ItemService, leases: LeaseService, clock: ManualClock
) -> None:
    ids = add_fips(fips, 1)
    lease = leases.create(ALICE, lease_of("l", fip(1)))
    with pytest.raises(ResourceInUse, match=lease.id):
        fips.delete(ADMIN, str(ids["172.24.4.10"]))
    leases.delete(ALICE, lease.id)
    fips.delete(ADMIN, str(ids["172.24.4.10"]))
    with pytest.raises(NotFound):
        fips.get(ADMIN, str(ids["172.24.4.10"]))


def test_inventory_checks_its_fields(
    fips: ItemService, networks: ItemService, devices: ItemService
) -> None:
    add_fips(fips, 1)
    with pytest.raises(Conflict, match="floating_ip_address"):
        add_fips(fips, 1)
    with pytest.raises(InvalidInput, match="^floating_ip_address: IP address .* is invalid form"):
        fips.create(ADMIN, {"floating_network_id": NET, "floating_ip_address": "300.1.1.1"})
    # Blazar's words for a field left out (or null), rather than a complaint about None.
    with pytest.raises(InvalidInput, match="^floating_network_id: Missing parameter floating_n"):
        fips.create(ADMIN, {"floating_ip_address": "10.0.0.1"})
    with pytest.raises(InvalidInput, match="^floating_ip_address: Missing parameter floating_i"):
        fips.create(ADMIN, {"floating_network_id": NET, "floating_ip_address": None})
    with pytest.raises(InvalidInput, match="Missing parameter floating_network_id,floating_ip_"):
        fips.create(ADMIN, {})
    with pytest.raises(InvalidInput, match="^floating_network_id: must be a non-empty string"):
        fips.create(ADMIN, {"floating_network_id": " ", "floating_ip_address": "10.0.0.1"})
    with pytest.raises(InvalidInput, match="^name: Missing parameter name$"):
        devices.create(ADMIN, {"model": "a100"})
    with pytest.raises(InvalidInput, match="^network_type: required"):
        networks.create(ADMIN, {"segment_id": 5})
    with pytest.raises(InvalidInput, match="^segment_id: must be at least 1"):
        networks.create(ADMIN, {"segment_id": 0, "network_type": "vlan"})
    device = devices.create(ADMIN, {"name": "gpu-0", "model": "a100"})
    with pytest.raises(InvalidInput, match="^name: cannot be changed"):
        devices.update(ADMIN, str(device.id), {"name": "gpu-1"})
    changed = devices.update(ADMIN, str(device.id), {"model": None, "reservable": False})
    assert (changed.properties, changed.reservable) == ([], False)
    # Another kind's id is not found here.
    with pytest.raises(NotFound):
        networks.get(ADMIN, str(device.id))


def test_a_floating_ip_reservation_keeps_its_network_and_required_addresses(
    fips: ItemService, leases: LeaseService
) -> None:
    add_fips(fips, 3)
    add_fips(fips, 2, network="other-net")
    lease = leases.create(ALICE, lease_of("l", fip(2, "172.24.4.10")))
    (ips,) = lease.reservations

    def change(fields: dict[str, Any]) -> Any:
        asked = [ReservationRequest(None, fields, ips.id)]
        return leases.update(ALICE, lease.id, LeaseChanges(reservations=asked))

    with pytest.raises(InvalidInput, match="Updating network_id is not supported"):
        change({"network_id": "other-net"})
    with pytest.raises(
        InvalidInput, match="Updating required_floatingips is not supported except with an empty"
    ):
        change({"required_floatingips": ["172.24.4.11"]})
    assert leases.get(ALICE, lease.id).reservations[0].params == ips.params
    same = change({"network_id": NET, "required_floatingips": ["172.24.4.10"], "amount": 3})
    assert same.reservations[0].params["amount"] == 3
    emptied = change({"required_floatingips": []})
    assert emptied.reservations[0].params["required_floatingips"] == []
