"""The load client of the ``mixed`` scenario, run in a process of its own.

``python -m bench.mixed_client --base-url URL --clients C --seconds S --hosts H --out PATH``
starts C threads, each with one keep-alive ``http.client`` connection (the lightest client the
standard library has: the clients share the machine with the server under test), and sends
requests back to back, without think time, for S seconds: a weighted mix of lease creations
(whole hosts and instances, random future windows over 30 days; some ask for a few of the scarce
GPU hosts, some for more GPU hosts than the H hosts have, which are refused), lists, gets,
updates (extend, shrink, rename), deletes of the thread's own leases, availability searches,
allocation lists and capacity timelines. Creations outnumber deletions, so the database grows
while it runs. Every request is recorded as
``[operation, status, started, finished, error kind]`` (seconds since the run began; status 0 is
a transport error) and written with the client's own CPU time as JSON to PATH.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import random
import resource
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

HTTP_TIMEOUT = 120.0
GPU = '["==", "$gpu", "true"]'
"""Hosts 0, 10, 20... have ``gpu=true`` (``bench.scenarios.host_body``)."""

WEIGHTS: dict[str, int] = {
    "create host lease": 16,
    "create instance lease": 8,
    "list leases": 12,
    "get lease": 14,
    "update lease": 12,
    "delete lease": 6,
    "availability search": 10,
    "host allocations": 8,
    "instance allocations": 4,
    "timeline": 10,
}
"""Relative weights of the operations (per cent). A get, update or delete of a thread that has
no lease of its own yet creates a host lease instead."""


def _date(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat(timespec="seconds")


@dataclass
class Worker:
    """One simulated client: its connection, its random stream and the leases it made."""

    number: int
    base_url: str
    began: float
    deadline: float
    gpu_hosts: int
    records: list[list[Any]] = field(default_factory=list)
    mine: dict[str, tuple[dt.datetime, dt.datetime]] = field(default_factory=dict)
    made: int = 0
    failure: str | None = None
    """Why the worker stopped before the deadline: a client that dies quietly would make the
    load fall for reasons of its own."""

    def __post_init__(self) -> None:
        self.random = random.Random(1000 + self.number)
        parts = urlsplit(self.base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port
        self.conn = self._connect()

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=HTTP_TIMEOUT)

    def run(self) -> None:
        actions: dict[str, Callable[[], None]] = {
            "create host lease": self.create_host_lease,
            "create instance lease": self.create_instance_lease,
            "list leases": self.list_leases,
            "get lease": self.get_lease,
            "update lease": self.update_lease,
            "delete lease": self.delete_lease,
            "availability search": self.availability,
            "host allocations": lambda: self.call(
                "host allocations", "GET", "/v1/os-hosts/allocations"
            ),
            "instance allocations": lambda: self.call(
                "instance allocations", "GET", "/v1/instances/allocations"
            ),
            "timeline": self.timeline,
        }
        names, weights = list(WEIGHTS), list(WEIGHTS.values())
        try:
            while time.monotonic() < self.deadline:
                actions[self.random.choices(names, weights)[0]]()
        except Exception:
            self.failure = traceback.format_exc()
        finally:
            self.conn.close()

    def call(
        self, operation: str, method: str, path: str, body: Any = None, *, decode: bool = False
    ) -> Any:
        """Send one request and record it; the decoded JSON answer if ``decode`` (else True)
        when it succeeded, or None. Only answers read are decoded: the client shares the
        machine with the server, and decoding every listing of thousands of leases took CPU
        (and the client's GIL) from both."""
        payload = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        started = time.monotonic()
        try:
            self.conn.request(method, path, payload, headers)
            response = self.conn.getresponse()
            raw = response.read()
            status = response.status
        except (OSError, http.client.HTTPException) as exc:
            self.records.append(
                [operation, 0, started - self.began, time.monotonic() - self.began, repr(exc)]
            )
            self.conn.close()
            self.conn = self._connect()
            return None
        finished = time.monotonic()
        answer: Any = None
        if raw and (decode or status >= 400):
            try:
                answer = json.loads(raw)
            except ValueError:
                answer = None
        error = _kind(answer) if isinstance(answer, dict) and status >= 400 else ""
        self.records.append([operation, status, started - self.began, finished - self.began, error])
        if status >= 300:
            return None
        return answer if decode else True

    def _window(self) -> tuple[dt.datetime, dt.datetime]:
        start = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=self.random.randint(10, 30 * 1440))
        return start, start + dt.timedelta(minutes=self.random.randint(60, 3 * 1440))

    def _create(self, operation: str, reservation: dict[str, Any]) -> None:
        start, end = self._window()
        self.made += 1
        body = {
            "name": f"mixed-{self.number}-{self.made}",
            "start_date": _date(start),
            "end_date": _date(end),
            "reservations": [reservation],
            "events": [],
        }
        answer = self.call(operation, "POST", "/v1/leases", body, decode=True)
        if answer is not None:
            self.mine[answer["lease"]["id"]] = (start, end)

    def create_host_lease(self) -> None:
        draw = self.random.random()
        if draw < 0.05:  # more GPU hosts than exist: refused, with counter-offers
            count, properties = self.gpu_hosts + self.random.randint(1, 4), GPU
        elif draw < 0.2:  # a few of the scarce GPU hosts
            count, properties = self.random.randint(2, 6), GPU
        else:
            count, properties = self.random.randint(1, 3), ""
        reservation = {
            "resource_type": "physical:host",
            "min": count,
            "max": count,
            "hypervisor_properties": "",
            "resource_properties": properties,
        }
        self._create("create host lease", reservation)

    def create_instance_lease(self) -> None:
        reservation = {
            "resource_type": "virtual:instance",
            "amount": self.random.randint(1, 4),
            "vcpus": self.random.choice([2, 4, 8, 16]),
            "memory_mb": self.random.choice([4096, 8192, 16384, 32768]),
            "disk_gb": self.random.choice([20, 50, 100]),
            "affinity": self.random.choice([None, True, False]),
            "resource_properties": "",
        }
        self._create("create instance lease", reservation)

    def _pick(self) -> str | None:
        return self.random.choice(list(self.mine)) if self.mine else None

    def list_leases(self) -> None:
        # A page of 1,000, as every run measured it since the start: without ``limit`` the
        # list is whole (Blazar's answer), and bc8738b's server honours ``limit`` too.
        self.call("list leases", "GET", "/v1/leases?limit=1000")

    def get_lease(self) -> None:
        lease_id = self._pick()
        if lease_id is None:
            return self.create_host_lease()
        self.call("get lease", "GET", f"/v1/leases/{lease_id}")

    def update_lease(self) -> None:
        lease_id = self._pick()
        if lease_id is None:
            return self.create_host_lease()
        start, end = self.mine[lease_id]
        how = self.random.choice(["extend", "shrink", "rename"])
        shift = dt.timedelta(minutes=self.random.randint(30, 24 * 60))
        if how == "extend":
            end = end + shift
            body: dict[str, Any] = {"end_date": _date(end)}
        elif how == "shrink" and end - shift > start + dt.timedelta(minutes=30):
            end = end - shift
            body = {"end_date": _date(end)}
        else:
            self.made += 1
            body = {"name": f"mixed-{self.number}-{self.made}"}
        if self.call("update lease", "PUT", f"/v1/leases/{lease_id}", body) is not None:
            self.mine[lease_id] = (start, end)

    def delete_lease(self) -> None:
        lease_id = self._pick()
        if lease_id is None:
            return self.create_host_lease()
        self.call("delete lease", "DELETE", f"/v1/leases/{lease_id}")
        del self.mine[lease_id]

    def availability(self) -> None:
        now = dt.datetime.now(dt.UTC)
        reservation: dict[str, Any]
        if self.random.random() < 0.25:
            reservation = {
                "resource_type": "virtual:instance",
                "amount": self.random.randint(1, 8),
                "vcpus": self.random.choice([4, 16]),
                "memory_mb": 16384,
                "disk_gb": 50,
            }
        else:
            count = self.random.randint(1, 8)
            gpu = self.random.random() < 0.3
            reservation = {
                "resource_type": "physical:host",
                "min": count,
                "max": count,
                "resource_properties": GPU if gpu else "",
            }
        body = {
            "reservations": [reservation],
            "duration": self.random.randint(1, 48) * 3600,
            "search_start": "now",
            "search_end": _date(now + dt.timedelta(days=30)),
            "limit": 3,
        }
        self.call("availability search", "POST", "/v1/availability", body)

    def timeline(self) -> None:
        now = dt.datetime.now(dt.UTC)
        query: dict[str, str] = {"end": _date(now + dt.timedelta(days=7)), "bucket": "3600"}
        kind = self.random.random()
        if kind < 0.25:
            query.update(resource_type="virtual:instance", vcpus="4", memory_mb="8192")
        elif kind < 0.5:
            query["resource_properties"] = GPU
        self.call("timeline", "GET", f"/v1/availability/timeline?{urlencode(query)}")


def run(base_url: str, clients: int, seconds: float, hosts: int) -> dict[str, Any]:
    began, epoch = time.monotonic(), time.time()
    gpu_hosts = (hosts + 9) // 10
    workers = [Worker(i, base_url, began, began + seconds, gpu_hosts) for i in range(clients)]
    threads = [threading.Thread(target=w.run, name=f"mixed-{w.number}") for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "started_epoch": epoch,
        "wall_seconds": time.monotonic() - began,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "records": [r for w in workers for r in w.records],
        "failures": [w.failure for w in workers if w.failure is not None],
    }


def _kind(answer: dict[str, Any]) -> str:
    """What an error was: a capacity refusal explains itself with ``reason``; anything else
    by the start of its message (``error_name`` is only the status, as Blazar)."""
    return "capacity" if "reason" in answer else str(answer.get("error_message", ""))[:40]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mixed_client", description=__doc__)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--hosts", type=int, required=True, help="hosts the server has")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = run(args.base_url, args.clients, args.seconds, args.hosts)
    args.out.write_text(json.dumps(result))
    for failure in result["failures"]:
        print(failure, file=sys.stderr)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
