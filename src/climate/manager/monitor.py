"""The host monitor: the manager process asks the backend how the world sees each host
(``Backend.host_states``: Nova's os-services for openstack) every ``nova_poll_seconds`` and
marks Climate's hosts down or up to match, which heals their reservations at once
(services/healing.py). Blazar's ``host_plugin.poll`` every ``polling_interval`` (60 s).

A host marked down by an operator (``climate host down``) is never marked up by the monitor:
it marks up only the hosts whose down reason it wrote (``nova: ...``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import select

from climate.backends.base import Timeboxed
from climate.context import ServiceContext
from climate.db import hosts as host_rows
from climate.db.tables import Host
from climate.services.healing import HealingService, HealReport

LOG = logging.getLogger(__name__)
ACTOR = "nova"
"""Who the audit log names for the monitor's changes."""
OWN_REASON = "nova:"


class HostMonitor:
    def __init__(self, ctx: ServiceContext, backend: Timeboxed) -> None:
        self.ctx = ctx
        self.backend = backend
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._unlisten: Callable[[], None] | None = None

    def poll(self) -> list[HealReport]:
        """One look at the world; the hosts whose health changed, with the healing done."""
        states = self.backend.inner.host_states()
        with self.ctx.db.reader() as session:
            hosts = [
                (h.id, h.service_name or h.hypervisor_hostname, h.health, h.health_reason)
                for h in session.scalars(select(Host).order_by(Host.id))
            ]
        healing = HealingService(self.ctx, self.backend)
        reports: list[HealReport] = []
        for host_id, name, health, reason in hosts:
            state = states.get(name)
            if state is None:
                continue
            if not state.up and health != host_rows.DOWN:
                LOG.warning("host %s (%s) is down in the cloud: %s", host_id, name, state.reason)
                reports.append(healing.mark_down(ACTOR, str(host_id), state.reason))
            elif state.up and health == host_rows.DOWN and (reason or "").startswith(OWN_REASON):
                LOG.info("host %s (%s) is up again in the cloud", host_id, name)
                reports.append(healing.mark_up(ACTOR, str(host_id)))
        return reports

    def wake(self) -> None:
        """Look now (the cloud said a host changed)."""
        self._wake.set()

    def run_forever(self) -> None:
        period = self.ctx.settings.nova_poll_seconds
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.poll()
            except Exception as exc:  # the cloud unreachable: look again next period
                LOG.warning("host monitor: %s: %s", type(exc).__name__, exc)
            self._wake.wait(period)

    def start(self) -> None:
        try:
            self._unlisten = self.backend.inner.on_host_change(self.wake)
        except Exception as exc:  # the bus unreachable: polling still runs
            LOG.warning("host monitor: not listening to the cloud: %s: %s", type(exc).__name__, exc)
        self._thread = threading.Thread(
            target=self.run_forever, name="climate-host-monitor", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._unlisten is not None:
            self._unlisten()
        if self._thread is not None:
            self._thread.join(timeout=10)
