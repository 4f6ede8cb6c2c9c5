"""Record the notifications the real Blazar 18.0.0 sends for one lease's life, from RabbitMQ.

Run with the Python of a venv holding Blazar 18 (``../shared/blazar/requirements-lock.txt``) and
kombu, next to ``../shared/blazar/blazar_launcher.py``::

    python record_blazar.py LAUNCHER OUT.json [AMQP_URL]

It starts the launcher (Blazar's own API and manager, fake:// RPC) with notifications going to
RabbitMQ (``[oslo_messaging_notifications] driver = messagingv2``) on a topic of its own, then
creates a host and a lease starting now and ending in about two minutes, moves its end a minute
later, lets Blazar's manager start it and warn before its end, moves its end a minute later again
(which re-arms the warning), lets the manager warn again and end it, deletes it, and writes
every notification's oslo.messaging envelope (``oslo.message`` decoded) to OUT.json in the order
they arrived.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import kombu

HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json",
    "X-User-Id": "golden-user",
    "X-Project-Id": "golden-project",
    "X-Roles": "admin",
}


def call(base: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method, headers=HEADERS)
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    launcher, out = sys.argv[1], sys.argv[2]
    amqp = sys.argv[3] if len(sys.argv) > 3 else "amqp://guest:guest@127.0.0.1:5672//"
    topic = f"blazar_golden_{os.getpid()}"
    work = tempfile.mkdtemp(prefix="blazar-golden-")
    port = free_port()
    config = os.path.join(work, "blazar.conf")
    with open(config, "w") as handle:
        handle.write(
            "[DEFAULT]\nhost = 127.0.0.1\ntransport_url = fake://\n"
            f"[database]\nconnection = sqlite:///{work}/blazar.sqlite\n"
            "[manager]\nplugins = physical.host.plugin,virtual.instance.plugin\n"
            "minutes_before_end_lease = 1\n"
            "[oslo_messaging_notifications]\ndriver = messagingv2\n"
            f"transport_url = {amqp.replace('amqp://', 'rabbit://').rstrip('/')}/\n"
            f"topics = {topic}\n"
        )
    with kombu.Connection(amqp) as connection:
        # Declared before Blazar sends, so nothing is missed (oslo.messaging declares it too).
        exchange = kombu.Exchange("openstack", type="topic", durable=False)
        queue = kombu.Queue(f"{topic}.info", exchange, routing_key=f"{topic}.info", durable=False)
        queue(connection.default_channel).declare()
        server = subprocess.Popen(
            [
                sys.executable,
                "-W",
                "ignore",
                launcher,
                "--port",
                str(port),
                "--config-file",
                config,
                "--db",
                f"{work}/blazar.sqlite",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(work, "blazar.log"), "w"),
        )
        try:
            base = f"http://127.0.0.1:{port}/v1"
            for _ in range(120):
                try:
                    call(base, "GET", "/leases")
                    break
                except OSError:
                    time.sleep(0.5)
            call(base, "POST", "/os-hosts", {"name": "golden-host"})
            end = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=2)
            lease = call(
                base,
                "POST",
                "/leases",
                {
                    "name": "golden",
                    "start_date": "now",
                    "end_date": end.strftime("%Y-%m-%d %H:%M"),
                    "reservations": [
                        {
                            "resource_type": "physical:host",
                            "min": 1,
                            "max": 1,
                            "hypervisor_properties": "",
                            "resource_properties": "",
                        }
                    ],
                    "events": [],
                },
            )["lease"]
            # A rename alone sends nothing in Blazar; a new end date sends lease.update.
            later = (end + dt.timedelta(minutes=1)).strftime("%Y-%m-%d %H:%M")
            call(base, "PUT", f"/leases/{lease['id']}", {"name": "renamed", "end_date": later})
            received: list[dict[str, Any]] = []
            deleted = moved = False
            deadline = time.monotonic() + 480
            with connection.SimpleQueue(queue) as simple:
                while time.monotonic() < deadline:
                    try:
                        message = simple.get(timeout=1)
                    except simple.Empty:
                        continue
                    envelope = dict(message.payload)
                    envelope["oslo.message"] = json.loads(envelope["oslo.message"])
                    message.ack()
                    received.append(envelope)
                    event_type = envelope["oslo.message"]["event_type"]
                    if event_type == "lease.event.before_end_lease" and not moved:
                        # The warning has run: a later end re-arms it, and Blazar says so
                        # with lease.event.before_end_lease.stop after lease.update.
                        moved = True
                        later = (end + dt.timedelta(minutes=2)).strftime("%Y-%m-%d %H:%M")
                        call(base, "PUT", f"/leases/{lease['id']}", {"end_date": later})
                    if event_type == "lease.event.end_lease" and not deleted:
                        call(base, "DELETE", f"/leases/{lease['id']}")
                        deleted = True
                    if event_type == "lease.delete":
                        break
            queue(connection.default_channel).delete()
        finally:
            server.terminate()
            server.wait(10)
    with open(out, "w") as handle:
        json.dump(received, handle, indent=2, sort_keys=True)
        handle.write("\n")


if __name__ == "__main__":
    main()
