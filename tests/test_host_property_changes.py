"""A host's extra property that a reservation holding the host asks for cannot change under it
(Blazar's ``is_updatable_extra_capability``): changing or removing it is a 409 in Blazar's
words while the reservation holds the host, now or later; other properties change freely, and
so does that one once the reservation is over."""

from __future__ import annotations

import datetime as dt

import pytest

from climate.domain.clock import ManualClock
from climate.errors import Conflict
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ADMIN, T0
from tests.helpers import host_request
from tests.test_instances import instance_lease, sized_hosts

HOUR = dt.timedelta(hours=1)
GPU = '["==", "$gpu", "a100"]'


def _properties(hosts: HostService, host_id: int) -> dict[str, str]:
    return {p.name: p.value for p in hosts.get(ADMIN, str(host_id)).properties}


def test_a_property_a_lease_asks_for_can_be_neither_changed_nor_removed(
    hosts: HostService, leases: LeaseService
) -> None:
    host = hosts.create(ADMIN, "gpu-1", {"gpu": "a100", "rack": "r1"}).id
    leases.create(ADMIN, host_request("trainer", T0 + HOUR, T0 + 3 * HOUR, resource_properties=GPU))
    for change in ({"gpu": "h100"}, {"gpu": None}, {"gpu": "a100", "rack": "r2"}):
        with pytest.raises(Conflict) as refused:
            hosts.update(ADMIN, str(host), change)
        assert str(refused.value).startswith(f"Can't add extracapabilities ['gpu'] to Host {host}")
    assert _properties(hosts, host) == {"gpu": "a100", "rack": "r1"}  # nothing of it was written


def test_a_property_no_lease_asks_for_changes_freely(
    hosts: HostService, leases: LeaseService
) -> None:
    host = hosts.create(ADMIN, "gpu-1", {"gpu": "a100", "rack": "r1"}).id
    leases.create(ADMIN, host_request("trainer", T0 + HOUR, T0 + 3 * HOUR, resource_properties=GPU))
    hosts.update(ADMIN, str(host), {"rack": "r2", "new": "yes"})
    assert _properties(hosts, host) == {"gpu": "a100", "rack": "r2", "new": "yes"}


def test_once_the_lease_is_over_its_property_changes(
    hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    host = hosts.create(ADMIN, "gpu-1", {"gpu": "a100"}).id
    leases.create(ADMIN, host_request("trainer", T0 + HOUR, T0 + 3 * HOUR, resource_properties=GPU))
    clock.advance(4 * HOUR)
    hosts.update(ADMIN, str(host), {"gpu": "h100"})
    assert _properties(hosts, host) == {"gpu": "h100"}


def test_an_instance_reservation_on_the_host_holds_its_properties_too(
    hosts: HostService, leases: LeaseService
) -> None:
    (host,) = sized_hosts(hosts, 1, gpu="a100")
    leases.create(ADMIN, instance_lease("vms", resource_properties=GPU))
    with pytest.raises(Conflict, match=r"Can't add extracapabilities \['gpu'\]"):
        hosts.update(ADMIN, str(host), {"gpu": "h100"})
