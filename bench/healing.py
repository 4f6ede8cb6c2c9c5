"""``python -m bench.healing``: time from ``host down`` to the reservation healed, over HTTP on a
real ``climate serve``, beside Blazar's periodic check (docs/healing.md).

Each round: hosts, running one-host leases on some of them, then a host with a running lease is
marked down (``PUT /v1/os-hosts/{id}/health``); the figure is the time until the lease shows its
reservation on another host (``GET /v1/leases/{id}``): the heal happens inside the request.
"""

from __future__ import annotations

import argparse
import time

import httpx

from bench.server import climate_server
from bench.stats import percentile

BLAZAR_POLL_SECONDS = 60
"""Blazar 18's ``[physical:host] polling_interval`` default: a host failure is seen after up to
this long (its ``healing_interval``, 60 minutes, sets how far ahead future reservations heal)."""


def run(db: str, rounds: int, hosts: int) -> list[float]:
    took: list[float] = []
    with (
        climate_server(db) as server,
        httpx.Client(base_url=f"{server.base_url}/v1", timeout=30) as http,
    ):
        for i in range(hosts):
            http.post("/os-hosts", json={"name": f"h{i}"}).raise_for_status()
        for r in range(rounds):
            lease = http.post(
                "/leases",
                json={
                    "name": f"l{r}",
                    "start_date": "now",
                    "end_date": "2099-01-01 00:00",
                    "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
                    "events": [],
                },
            )
            lease.raise_for_status()
            body = lease.json()["lease"]
            host = body["reservations"][0]["allocations"][0]["resource_id"]
            began = time.perf_counter()
            http.put(f"/os-hosts/{host}/health", json={"health": "down"}).raise_for_status()
            while True:
                shown = http.get(f"/leases/{body['id']}").json()["lease"]
                held = {a["resource_id"] for a in shown["reservations"][0]["allocations"]}
                if held - {host}:
                    break
            took.append(time.perf_counter() - began)
            http.put(f"/os-hosts/{host}/health", json={"health": "up"}).raise_for_status()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.healing", description=__doc__)
    parser.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--hosts", type=int, default=100)
    args = parser.parse_args()
    took = sorted(run(args.db, args.rounds, args.hosts))
    median, p95 = percentile(took, 50) * 1e3, percentile(took, 95) * 1e3
    print(
        f"{args.db}: host down -> reservation healed: median {median:.1f} ms, p95 {p95:.1f} ms, "
        f"max {took[-1] * 1e3:.1f} ms over {len(took)} rounds ({args.hosts} hosts); Blazar: up "
        f"to {BLAZAR_POLL_SECONDS} s (its poll interval), "
        f"{BLAZAR_POLL_SECONDS / (median / 1e3):.0f}x the median"
    )


if __name__ == "__main__":
    main()
