"""The openstack backend's sign of use (backends/openstack/servers.py) on a stand-in for Nova:
which servers count, on which hosts, of which flavor. The rig proves it against real Nova
(tests/openstack/test_idle.py); this pins the rules where the rig cannot reach (stopped
servers, other hosts, a missing aggregate, types Nova does not show)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from climate.backends.base import Handover, Usage
from climate.backends.openstack.servers import inspect_usage

AT = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def server(status: str, host: str, flavor: str = "m1.small") -> SimpleNamespace:
    return SimpleNamespace(status=status, compute_host=host, flavor={"original_name": flavor})


@dataclass
class Compute:
    listed: list[Any]
    pools: dict[str, list[str]] = field(default_factory=dict)
    asked_aggregates: int = 0

    def servers(self, **query: Any) -> list[Any]:
        assert query == {"all_projects": True, "status": "ACTIVE"}
        return self.listed  # a filter Nova ignored is applied again here

    def aggregates(self) -> list[Any]:
        self.asked_aggregates += 1
        return [SimpleNamespace(name=n, hosts=h) for n, h in self.pools.items()]


def handover(rid: str, resource_type: str = "physical:host") -> Handover:
    return Handover("lease", rid, "project", resource_type, (), AT)


def probe(compute: Compute, *handovers: Handover) -> Usage:
    return inspect_usage(SimpleNamespace(compute=compute), handovers)


def test_a_host_reservation_is_in_use_while_an_active_server_runs_on_its_aggregates_hosts() -> None:
    pools = {"r-busy": ["compute1", "compute2"], "r-idle": ["compute3"], "freepool": ["compute4"]}
    compute = Compute(
        [
            server("ACTIVE", "compute2"),
            server("SHUTOFF", "compute3"),  # stopped: uses nothing
            server("ACTIVE", "compute4"),  # in the freepool, not the reservation's
        ],
        pools,
    )
    usage = probe(compute, handover("r-busy"), handover("r-idle"), handover("r-gone"))
    assert usage == Usage({"r-busy": True, "r-idle": False, "r-gone": False})
    assert compute.asked_aggregates == 1  # one listing for every reservation


def test_an_instance_reservation_is_in_use_while_an_active_server_has_its_flavor() -> None:
    compute = Compute(
        [
            server("ACTIVE", "compute1", "reservation:r-busy"),
            server("SHELVED_OFFLOADED", "", "reservation:r-shelved"),
            server("ACTIVE", "compute1", "m1.small"),
        ]
    )
    instances = [handover(r, "virtual:instance") for r in ("r-busy", "r-shelved", "r-idle")]
    assert probe(compute, *instances) == Usage(
        {"r-busy": True, "r-shelved": False, "r-idle": False}
    )
    assert compute.asked_aggregates == 0  # no host reservation: no aggregate looked at


def test_a_type_nova_does_not_show_is_unknown() -> None:
    compute = Compute([server("ACTIVE", "compute1")], {"r-ip": ["compute1"]})
    assert probe(compute, handover("r-ip", "network:floatingip")) == Usage({"r-ip": None})
