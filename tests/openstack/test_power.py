"""The power policy's backend actions on the real rig: ``PowerOff`` disables the host's
nova-compute service with the policy's reason (Nova schedules nothing there), the host monitor
takes it as asleep rather than failed, and ``PowerOn`` enables it again. Proved by reading
Nova's os-services, not Climate's word."""

from __future__ import annotations

from typing import Any

from climate.backends.base import Done, PowerOff, PowerOn
from climate.backends.openstack.compute_services import POWER_REASON
from tests.openstack.test_nova_healing import SERVICES, compute_service


def set_enabled(cloud: Any, host: str) -> None:
    service = compute_service(cloud, host)
    response = cloud.compute.put(
        f"/os-services/{service['id']}", json={"status": "enabled"}, microversion=SERVICES
    )
    response.raise_for_status()


def test_power_off_disables_the_compute_and_power_on_enables_it(climate: Any, cloud: Any) -> None:
    _, backend = climate
    host = sorted(backend.host_states())[0]
    try:
        (off,) = backend.handle([PowerOff("1", host, "no lease for 4 h")])
        assert isinstance(off, Done)
        service = compute_service(cloud, host)
        assert service["status"] == "disabled"
        assert service["disabled_reason"] == f"{POWER_REASON}: no lease for 4 h"
        assert backend.host_states()[host].up  # asleep by design, not a failed host

        (on,) = backend.handle([PowerOn("1", host)])
        assert isinstance(on, Done)
        assert compute_service(cloud, host)["status"] == "enabled"
    finally:
        set_enabled(cloud, host)


def test_waking_an_unknown_host_fails(climate: Any) -> None:
    _, backend = climate
    (result,) = backend.handle([PowerOn("1", "no-such-compute")])
    assert isinstance(result, LookupError)
