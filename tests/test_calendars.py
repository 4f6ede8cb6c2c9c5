"""The planner's view of hosts read from the database: busy spans and the gaps around a window."""

from __future__ import annotations

import datetime as dt

from climate.db import hosts as host_rows
from climate.db.engine import ADMISSION_LOCK
from climate.domain.clock import ManualClock
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ALICE, T0
from tests.helpers import add_hosts, host_request

HOUR = dt.timedelta(hours=1)


def test_calendar_shows_overlaps_and_the_nearest_allocations_on_each_side(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    (host,) = add_hosts(hosts, 1)
    add_hosts(hosts, 1, prefix="idle")
    leases.create(ALICE, host_request("long-before", T0 + HOUR, T0 + 2 * HOUR))
    leases.create(ALICE, host_request("just-before", T0 + 2 * HOUR, T0 + 3 * HOUR))
    inside = leases.create(ALICE, host_request("inside", T0 + 4 * HOUR, T0 + 5 * HOUR))
    leases.create(ALICE, host_request("just-after", T0 + 7 * HOUR, T0 + 8 * HOUR))
    leases.create(ALICE, host_request("long-after", T0 + 9 * HOUR, T0 + 10 * HOUR))
    window = (T0 + 3 * HOUR, T0 + 7 * HOUR)
    with ctx.db.transaction(lock=ADMISSION_LOCK) as session:
        records = {
            r.hypervisor_hostname: r
            for r in host_rows.reservable_records(session, ("hypervisor_hostname",))
        }
        busy, idle = host_rows.calendars(session, records.values(), *window)
        (excluded, _) = host_rows.calendars(
            session, records.values(), *window, exclude_reservations={inside.reservations[0].id}
        )
    assert busy.host_id == host
    assert busy.busy == ((T0 + 4 * HOUR, T0 + 5 * HOUR),)
    # An allocation ending exactly at the window's start, and one starting exactly at its end,
    # touch the window without overlapping it.
    assert (busy.previous_end, busy.next_start) == (T0 + 3 * HOUR, T0 + 7 * HOUR)
    assert busy.fit(*window) == dt.timedelta(0)
    assert (idle.busy, idle.previous_end, idle.next_start) == ((), None, None)
    assert excluded.free
