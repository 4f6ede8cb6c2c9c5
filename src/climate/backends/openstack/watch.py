"""Hearing about Nova's hosts: the state of a nova-compute service, and Nova's versioned
``service.update`` notifications, which wake the host monitor."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from climate.backends.base import HostState

LOG = logging.getLogger("climate.backends.openstack")


def service_state(service: Mapping[str, Any]) -> HostState:
    if service.get("forced_down"):
        return HostState(False, "nova: forced down")
    if service.get("status") == "disabled":
        why = "".join(c for c in str(service.get("disabled_reason") or "") if c.isprintable())
        return HostState(False, f"nova: disabled ({why[:200]})" if why else "nova: disabled")
    if service.get("state") != "up":
        return HostState(False, "nova: down")
    return HostState(True)


def listen_to_services(url: str, topic: str, wake: Callable[[], None]) -> Callable[[], None]:
    """Listen (oslo.messaging, pool ``climate``) on ``url`` for nova-compute services'
    ``service.update`` notifications, each calling ``wake``; returns how to stop listening."""
    with warnings.catch_warnings():
        # oslo.messaging imports eventlet and oslo.utils' eventletutils, both deprecated
        # (and unused with the threading executor); their import-time warnings are noise.
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

    transport = oslo_messaging.get_notification_transport(cfg.ConfigOpts(), url=url)
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
