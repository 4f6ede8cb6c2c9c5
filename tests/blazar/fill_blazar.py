"""Adds rows to a Blazar 18 database through Blazar's own DB API (blazar.db.api), for what the
blazar CLI of a standalone Blazar cannot make: a lease that ended (Blazar keeps no allocations
for it), floating IPs and a floating IP reservation (no Neutron), and, with ``--unmappable``,
a reservation of a resource type Climate does not know.

Run with Blazar's own Python: ``<blazar venv>/bin/python fill_blazar.py DB_PATH [--unmappable]``.
Prints the ids it made as JSON.
"""

import datetime as dt
import json
import sys

from blazar.db import api as db_api
from oslo_config import cfg

path = sys.argv[1]
cfg.CONF([], project="blazar")
cfg.CONF.set_override("connection", "sqlite:///" + path, group="database")
# Blazar stores naive UTC.
now = dt.datetime.now(dt.UTC).replace(microsecond=0, tzinfo=None)
project, user = "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "b1a2c3d4e5f60718293a4b5c6d7e8f90"
made = {}

ended = db_api.lease_create(
    {
        "name": "ended-lease",
        "project_id": project,
        "user_id": user,
        "start_date": now - dt.timedelta(days=3),
        "end_date": now - dt.timedelta(days=2),
        "trust_id": "5a7f0e1c-0000-4000-8000-000000000001",
        "status": "TERMINATED",
        "reservations": [
            {"resource_type": "physical:host", "resource_id": "", "status": "deleted"}
        ],
        "events": [
            {"event_type": "start_lease", "time": now - dt.timedelta(days=3), "status": "DONE"},
            {
                "event_type": "before_end_lease",
                "time": now - dt.timedelta(days=2, hours=1),
                "status": "DONE",
            },
            {"event_type": "end_lease", "time": now - dt.timedelta(days=2), "status": "DONE"},
        ],
    }
)
reservation = ended["reservations"][0]
detail = db_api.host_reservation_create(
    {
        "reservation_id": reservation["id"],
        "count_range": "1-1",
        "before_end": "default",
        "hypervisor_properties": "",
        "resource_properties": '["==", "$gpu", "a100"]',
    }
)
db_api.reservation_update(reservation["id"], {"resource_id": detail["id"]})
made["ended"] = ended["id"]

fips = [
    db_api.floatingip_create(
        {
            "floating_network_id": "net-public",
            "subnet_id": "subnet-1",
            "floating_ip_address": address,
        }
    )
    for address in ("172.24.4.10", "172.24.4.11")
]
fip_lease = db_api.lease_create(
    {
        "name": "fip-lease",
        "project_id": project,
        "user_id": user,
        "start_date": now + dt.timedelta(days=5),
        "end_date": now + dt.timedelta(days=6),
        "trust_id": "5a7f0e1c-0000-4000-8000-000000000002",
        "status": "PENDING",
        "reservations": [
            {"resource_type": "virtual:floatingip", "resource_id": "", "status": "pending"}
        ],
        "events": [
            {"event_type": "start_lease", "time": now + dt.timedelta(days=5), "status": "UNDONE"},
            {"event_type": "end_lease", "time": now + dt.timedelta(days=6), "status": "UNDONE"},
        ],
    }
)
reservation = fip_lease["reservations"][0]
detail = db_api.fip_reservation_create(
    {
        "reservation_id": reservation["id"],
        "network_id": "net-public",
        "amount": 1,
    }
)
db_api.required_fip_create({"address": "172.24.4.10", "floatingip_reservation_id": detail["id"]})
db_api.reservation_update(reservation["id"], {"resource_id": detail["id"]})
db_api.fip_allocation_create({"reservation_id": reservation["id"], "floatingip_id": fips[0]["id"]})
made["fip"] = fip_lease["id"]

if "--unmappable" in sys.argv:
    odd = db_api.lease_create(
        {
            "name": "odd-lease",
            "project_id": project,
            "user_id": user,
            "start_date": now + dt.timedelta(days=7),
            "end_date": now + dt.timedelta(days=8),
            "trust_id": "5a7f0e1c-0000-4000-8000-000000000003",
            "status": "PENDING",
            "reservations": [{"resource_type": "foo", "resource_id": "x", "status": "pending"}],
            "events": [
                {
                    "event_type": "start_lease",
                    "time": now + dt.timedelta(days=7),
                    "status": "UNDONE",
                },
                {"event_type": "end_lease", "time": now + dt.timedelta(days=8), "status": "UNDONE"},
            ],
        }
    )
    made["odd"] = odd["id"]
    made["odd_reservation"] = odd["reservations"][0]["id"]
sys.stdout.write(json.dumps(made) + "\n")
