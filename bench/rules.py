"""``--scenario rules``: what ten usage rules, and credits with them, add to admission
(docs/fair-share.md, docs/credits.md).

One SQLite database is seeded (hosts, a quarter of them GPU hosts, and a history of leases of
ten projects of ten users each over the past and next 30 days), then copied, so two databases
hold the same rows (three copies). The same admissions (one host, 1 to 4 hours, in the next 7
days, owners in turn) are made on each through the service, in process, timed around
``LeaseService.create``: on one with no rule, on another with ten rules (every kind, budgets
over 30 days and 7 days, a property-scoped GPU limit) that all admit them, on the third with
the ten rules and credits on (every project granted plenty). All three have the same price
table (a flat and a premium price), so all book the same hosts, the cheapest first. In
turn, one on each, so all see the same machine. The figures are the differences of the
medians against no rule.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench.stats import percentile, table
from bench.targets import Target

GOAL_MS = 0.5
HOSTS = 200
PROJECTS = 10
USERS = 10
HISTORY = 1000
"""Leases seeded over the past and next 30 days, across all projects."""
ADMISSIONS = 300
PRICES = {"physical:host": "1.20", "physical:host[gpu=a100]": "4.00"}
VARIANTS = ("none", "rules", "credits")
RULES: tuple[dict[str, Any], ...] = (
    {"name": "length", "kind": "max_length", "limit": "7d"},
    {"name": "horizon", "kind": "max_advance", "limit": "60d"},
    {"name": "late", "kind": "extension_window", "limit": "2d"},
    {"name": "extend", "kind": "max_extension", "limit": "3d"},
    {"name": "hosts", "kind": "concurrent", "unit": "hosts", "limit": 40},
    {
        "name": "project-hosts",
        "kind": "concurrent",
        "unit": "hosts",
        "per": "project",
        "limit": 150,
    },
    {
        "name": "gpus",
        "kind": "concurrent",
        "unit": "gpus",
        "limit": 400,
        "properties": '["==", "$gpu", "a100"]',
    },
    {
        "name": "gpu-days",
        "kind": "budget",
        "unit": "gpus",
        "limit": 10_000,
        "window": "30d",
        "properties": '["==", "$gpu", "a100"]',
    },
    {
        "name": "host-days",
        "kind": "budget",
        "unit": "hosts",
        "per": "project",
        "limit": 100_000,
        "window": "7d",
    },
    {"name": "stacking", "kind": "stacking", "limit": 1000, "gap": "10m", "window": "1d"},
)


def run_rules(admissions: int = ADMISSIONS, seed: int = 42) -> dict[str, Any]:
    from climate.config import load_settings
    from climate.db import migrate
    from climate.db.engine import Database
    from climate.domain.actor import Actor
    from climate.domain.clock import ManualClock
    from climate.errors import NotEnoughCapacity
    from climate.runtime import build_context
    from climate.services.credits import CreditsService
    from climate.services.hosts import HostService
    from climate.services.leases import LeaseRequest, LeaseService, ReservationRequest

    admin = Actor("admin", "admin", frozenset({"admin"}))
    owners = [
        Actor(f"user-{p}-{u}", f"project-{p}", frozenset({"member"}))
        for p in range(PROJECTS)
        for u in range(USERS)
    ]
    now = datetime.now(UTC).replace(microsecond=0)
    rng = random.Random(seed)

    def request(name: str, start: datetime, hours: float) -> LeaseRequest:
        fields = {"min": 1, "max": 1, "hypervisor_properties": "", "resource_properties": ""}
        return LeaseRequest(
            name=name,
            start=start,
            end=start + timedelta(hours=hours),
            reservations=[ReservationRequest("physical:host", fields)],
        )

    with tempfile.TemporaryDirectory(prefix="climate-bench-rules-") as tmp:
        seeded = Path(tmp) / "seeded.db"
        settings = load_settings(env={}, data_dir=tmp)
        db = Database(f"sqlite:///{seeded}")
        migrate.upgrade(db)
        clock = ManualClock(now - timedelta(days=30))
        ctx = build_context(settings, db, clock)
        hosts = HostService(ctx)
        for i in range(HOSTS):
            extra = {"gpu": "a100", "gpu_count": "4"} if i % 4 == 0 else {"gpu": "none"}
            hosts.create(admin, f"node-{i}", {"vcpus": 32, **extra})
        leases = LeaseService(ctx)
        began = time.perf_counter()
        starts = sorted(now + timedelta(days=rng.uniform(-30, 30), hours=0) for _ in range(HISTORY))
        seeded_count = 0
        for i, start in enumerate(starts):
            if start > clock.now():
                clock.advance(start - clock.now())
            try:
                leases.create(owners[i % len(owners)], request(f"h{i}", start, rng.uniform(1, 24)))
                seeded_count += 1
            except NotEnoughCapacity:
                pass
        seed_seconds = time.perf_counter() - began
        db.dispose()
        copies = {}
        for name in VARIANTS:
            shutil.copy(seeded, Path(tmp) / f"{name}.db")
            copies[name] = Database(f"sqlite:///{Path(tmp) / f'{name}.db'}")
        # Every variant has the price table, so every one books the same hosts (the cheapest
        # first, docs/planning.md): only the rules and the credits check differ.
        plain = settings.model_copy(update={"prices": PRICES})
        ruled = plain.model_copy(update={"usage_rules": RULES})
        priced = ruled.model_copy(update={"credits": True})
        contexts = {
            "none": build_context(plain, copies["none"], ManualClock(now)),
            "rules": build_context(ruled, copies["rules"], ManualClock(now)),
            "credits": build_context(priced, copies["credits"], ManualClock(now)),
        }
        for p in range(PROJECTS):
            CreditsService(contexts["credits"]).grant(admin, f"project-{p}", Decimal(10**9))
        services = {name: LeaseService(ctx) for name, ctx in contexts.items()}
        timings: dict[str, list[float]] = {name: [] for name in VARIANTS}
        cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
        refused = dict.fromkeys(VARIANTS, 0)
        for i in range(admissions):
            owner = owners[i % len(owners)]
            asked = request(
                f"m{i}", now + timedelta(hours=rng.uniform(1, 24 * 7)), rng.uniform(1, 4)
            )
            shift = i % len(VARIANTS)
            for name in VARIANTS[shift:] + VARIANTS[:shift]:
                began, used = time.perf_counter(), time.process_time()
                try:
                    services[name].create(owner, asked)
                except NotEnoughCapacity:
                    refused[name] += 1
                timings[name].append((time.perf_counter() - began) * 1e3)
                cpu[name].append((time.process_time() - used) * 1e3)
        for database in copies.values():
            database.dispose()
    return {
        "hosts": HOSTS,
        "history": seeded_count,
        "seed_seconds": seed_seconds,
        "admissions": admissions,
        "rules": len(RULES),
        "ms": timings,
        "cpu_ms": cpu,
        "refused": refused,
    }


def print_rules(result: dict[str, Any]) -> None:
    print()
    print(
        f"rules: {result['admissions']} admissions of 1 host on {result['hosts']} hosts with "
        f"{result['history']} leases of {PROJECTS * USERS} users in {PROJECTS} projects over "
        f"the past and next 30 days (seeded in {result['seed_seconds']:.1f} s), service "
        f"in process on SQLite, no rule vs {result['rules']} rules vs the rules and credits, "
        "in turn"
    )
    rows = []
    for name in VARIANTS:
        ms, cpu = result["ms"][name], result["cpu_ms"][name]
        rows.append(
            [
                name,
                f"{percentile(ms, 50):.3f}",
                f"{percentile(ms, 95):.3f}",
                f"{max(ms):.3f}",
                f"{percentile(cpu, 50):.3f}",
                str(result["refused"][name]),
            ]
        )
    print(table(("", "p50 ms", "p95 ms", "max ms", "CPU p50 ms", "refused"), rows))


def rules_targets(result: dict[str, Any]) -> list[Target]:
    def added(key: str, name: str) -> float:
        return percentile(result[key][name], 50) - percentile(result[key]["none"], 50)

    note = f"{result['history']} leases of history, budgets over 30 and 7 days"
    cpu = "this process's CPU time: what a busy machine does not inflate"
    found = []
    for name, what in (("rules", "10 usage rules"), ("credits", "10 usage rules and credits")):
        found += [
            Target(
                f"admission with {what}, p50 added", added("ms", name), GOAL_MS, "ms", note=note
            ),
            Target(
                f"admission with {what}, CPU p50 added",
                added("cpu_ms", name),
                GOAL_MS,
                "ms",
                note=cpu,
            ),
        ]
    return found
