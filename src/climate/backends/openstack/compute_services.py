"""Nova's compute hosts as the backend sees them: their hypervisors, the health of their
nova-compute services (read from os-services, woken by Nova's ``service.update``
notifications), and the power policy's disable and enable."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from climate.backends.base import HostState, UnknownResource

LOG = logging.getLogger(__name__)

HYPERVISOR_MICROVERSION = "2.87"
"""The last microversion whose hypervisor details carry vcpus, memory_mb and local_gb."""
SERVICES_MICROVERSION = "2.53"
"""os-services with ``forced_down`` and service UUIDs."""
POWER_REASON = "climate power policy"
"""The start of the ``disabled_reason`` of a compute service the power policy disabled: the host
monitor takes such a host as asleep, not failed."""


def find_hypervisor(conn: Any, name: str) -> dict[str, Any] | None:
    """The hypervisor whose hostname or service host is ``name``, with its details."""
    response = conn.compute.get("/os-hypervisors/detail", microversion=HYPERVISOR_MICROVERSION)
    response.raise_for_status()
    for found in response.json()["hypervisors"]:
        if name in (found["hypervisor_hostname"], found["service"]["host"]):
            return dict(found)
    return None


def cpu_info(hypervisor: Mapping[str, Any]) -> str | None:
    """The hypervisor's ``cpu_info`` as Blazar stores it: Nova's JSON text (an object from
    microversion 2.28 on, written back as JSON here)."""
    found = hypervisor.get("cpu_info")
    if found is None or isinstance(found, str):
        return found
    return json.dumps(found)


def availability_zone(conn: Any, service_host: str) -> str | None:
    """The availability zone whose ``nova-compute`` services include ``service_host``'s (as
    Blazar's ``az_aware`` host details read it), None when Nova lists it in none."""
    response = conn.compute.get("/os-availability-zone/detail")
    response.raise_for_status()
    for zone in response.json()["availabilityZoneInfo"]:
        if "nova-compute" in ((zone.get("hosts") or {}).get(service_host) or {}):
            return str(zone["zoneName"])
    return None


def host_states(conn: Any) -> Mapping[str, HostState]:
    """Each nova-compute service's host: down when Nova reports it down (no heartbeat for
    ``service_down_time``), forced down, or disabled (Blazar's ``poll`` takes the same three as
    failures)."""
    response = conn.compute.get(
        "/os-services?binary=nova-compute", microversion=SERVICES_MICROVERSION
    )
    response.raise_for_status()
    return {str(service["host"]): service_state(service) for service in response.json()["services"]}


def set_compute_service(conn: Any, host: str, disabled_reason: str | None) -> None:
    """Disable (with the reason) or enable the nova-compute service of ``host``."""
    response = conn.compute.get(
        f"/os-services?binary=nova-compute&host={quote(host)}",
        microversion=SERVICES_MICROVERSION,
    )
    response.raise_for_status()
    services = response.json()["services"]
    if not services:
        raise UnknownResource(f"no nova-compute service on host {host!r}")
    body = (
        {"status": "enabled"}
        if disabled_reason is None
        else {"status": "disabled", "disabled_reason": disabled_reason}
    )
    response = conn.compute.put(
        f"/os-services/{services[0]['id']}", json=body, microversion=SERVICES_MICROVERSION
    )
    response.raise_for_status()


def listen_for_service_updates(
    transport_url: str, topic: str, wake: Callable[[], None]
) -> Callable[[], None]:
    """Listen (oslo.messaging, pool ``climate``) for Nova's versioned ``service.update``
    notifications of nova-compute services; each calls ``wake`` (the monitor then reads
    os-services, which stays the one source of truth). Returns what stops listening."""
    with warnings.catch_warnings():
        # oslo.messaging imports eventlet and oslo.utils' eventletutils, both deprecated (and
        # unused with the threading executor); their import-time warnings are noise.
        warnings.simplefilter("ignore")
        import oslo_messaging
        from oslo_config import cfg

    class Endpoint:
        filter_rule = oslo_messaging.NotificationFilter(event_type=r"^service\.update$")

        def info(self, ctxt: object, publisher: str, event: str, payload: Any, meta: Any) -> None:
            data = payload.get("nova_object.data", {}) if isinstance(payload, dict) else {}
            if data.get("binary", "nova-compute") == "nova-compute":
                LOG.info("nova: service.update of %s", data.get("host"))
                wake()

    transport = oslo_messaging.get_notification_transport(cfg.ConfigOpts(), url=transport_url)
    listener = oslo_messaging.get_notification_listener(
        transport,
        # Nova publishes on its own exchange (its control_exchange), not "openstack".
        [oslo_messaging.Target(exchange="nova", topic=topic)],
        [Endpoint()],
        executor="threading",
        pool="climate",
    )
    listener.start()

    def stop() -> None:
        listener.stop()
        listener.wait()
        transport.cleanup()

    return stop


def service_state(service: Mapping[str, Any]) -> HostState:
    if service.get("status") == "disabled" and str(service.get("disabled_reason") or "").startswith(
        POWER_REASON
    ):
        return HostState(True)  # asleep by the power policy, whatever its heartbeat says
    if service.get("forced_down"):
        return HostState(False, "nova: forced down")
    if service.get("status") == "disabled":
        why = "".join(c for c in str(service.get("disabled_reason") or "") if c.isprintable())
        return HostState(False, f"nova: disabled ({why[:200]})" if why else "nova: disabled")
    if service.get("state") != "up":
        return HostState(False, "nova: down")
    return HostState(True)
