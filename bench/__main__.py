"""``python -m bench``: benchmark a real ``climate serve`` over HTTP and print the figures."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench import machine
from bench.availability import availability_targets, print_availability, run_availability
from bench.growth import print_growth, run_growth
from bench.instances import print_instances, run_instances
from bench.limit import limit_targets, print_limit, run_limit
from bench.mixed import (
    BASELINE_REV,
    QUICK,
    MixedConfig,
    mixed_targets,
    print_mixed,
    run_mixed,
    run_mixed_against,
)
from bench.openstack import openstack_targets, print_openstack, run_openstack
from bench.profiling import read_collapsed, sampled
from bench.quality import print_quality, quality_targets, run_quality
from bench.rules import print_rules, rules_targets, run_rules
from bench.scale import print_scale, run_scale, scale_targets
from bench.scenarios import (
    CreateConfig,
    EventsConfig,
    create_targets,
    events_targets,
    run_create,
    run_events,
)
from bench.server import DEFAULT_PG_ADMIN_URL, RunningServer, climate_server
from bench.stats import fmt, jsonable, percentile, table
from bench.targets import Target
from bench.throughput import print_throughput, run_all, throughput_targets
from bench.ui import print_ui, run_ui, ui_targets

RESULTS_DIR = Path(__file__).resolve().parent / "results"
LAT_HEADERS = ("", "n", "median", "p95", "p99", "max", "mean")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument(
        "--scenario",
        choices=[
            "create",
            "events",
            "scale",
            "quality",
            "throughput",
            "growth",
            "availability",
            "instances",
            "mixed",
            "openstack",
            "limit",
            "ui",
            "rules",
            "ops",
            "demand",
            "all",
        ],
        default="all",
    )
    p.add_argument(
        "--tp-clients", type=int, default=8, help="throughput: clients (default %(default)s)"
    )
    p.add_argument(
        "--tp-seconds",
        type=float,
        default=15.0,
        help="throughput: seconds of creating per server (default %(default)s)",
    )
    p.add_argument(
        "--scale-hosts", type=int, default=1000, help="scale: hosts (default %(default)s)"
    )
    p.add_argument(
        "--scale-allocations",
        type=int,
        default=100_000,
        help="scale: seeded future allocations (default %(default)s)",
    )
    p.add_argument(
        "--mixed-clients", type=int, default=32, help="mixed: clients (default %(default)s)"
    )
    p.add_argument(
        "--mixed-seconds",
        type=float,
        default=60.0,
        help="mixed: seconds of load (default %(default)s)",
    )
    p.add_argument(
        "--mixed-hosts", type=int, default=300, help="mixed: hosts (default %(default)s)"
    )
    p.add_argument(
        "--mixed-workers",
        type=int,
        default=1,
        help="mixed: API processes of climate serve (--workers; default %(default)s)",
    )
    p.add_argument(
        "--mixed-against",
        default=BASELINE_REV,
        metavar="REV",
        help="mixed: first the same load on this commit's server (one process, from a git "
        "worktree of this repository), the baseline of the throughput target; '' for none "
        "(default %(default)s)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="mixed: a smoke run, 10 s on 100 hosts (overrides --mixed-seconds, --mixed-hosts)",
    )
    p.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    p.add_argument(
        "--pg-admin-url",
        default=DEFAULT_PG_ADMIN_URL,
        help="PostgreSQL to create the throwaway database on (default %(default)s)",
    )
    p.add_argument("--hosts", type=int, default=500, help="create: hosts (default %(default)s)")
    p.add_argument("--leases", type=int, default=2000, help="create: leases (default %(default)s)")
    p.add_argument(
        "--horizon-days",
        type=float,
        default=7.0,
        help="create: lease starts are uniform over this many days (default %(default)s)",
    )
    p.add_argument(
        "--load",
        type=float,
        default=1.0,
        help="create: mean demand as a fraction of the hosts; sets the mean lease length "
        "(default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=42, help="create: random seed (default %(default)s)")
    p.add_argument(
        "--events-leases", type=int, default=1000, help="events: leases (default %(default)s)"
    )
    p.add_argument("--events-hosts", type=int, help="events: hosts (default: --events-leases)")
    p.add_argument(
        "--events-duration",
        type=float,
        default=5.0,
        help="events: seconds between the common start and the common end (default %(default)s)",
    )
    p.add_argument(
        "--events-lead",
        type=float,
        help="events: seconds from now to the common start (default: estimated so that all "
        "leases exist before it)",
    )
    p.add_argument(
        "--events-settle",
        type=float,
        default=120.0,
        help="events: give up waiting this many seconds after the end (default %(default)s)",
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results/*.json")
    p.add_argument(
        "--profile",
        action="store_true",
        help="sample the server with py-spy while it admits leases (create) and while it "
        "applies the events (events); needs py-spy",
    )
    p.add_argument(
        "--profile-idle",
        action="store_true",
        help="mixed: with --profile, sample waiting threads too and break the wall time of "
        "lease creations down (lock waits included)",
    )
    p.add_argument("--keep", action="store_true", help="keep the server's temp dir and log")
    return p


def _lat_row(label: str, s: dict[str, Any]) -> list[object]:
    return [label, s["count"], s["median"], s["p95"], s["p99"], s["max"], s["mean"]]


def print_machine(info: dict[str, Any], db: str, started: str) -> None:
    print(f"Climate benchmark, {started}")
    print(
        table(
            ("machine", ""),
            [
                ("nproc", info["nproc"]),
                ("cpu", info["cpu_model"]),
                ("python", info["python"]),
                ("os", info["os"]),
                ("load avg at start", f"{info['load_average_at_start']} (1, 5, 15 min)"),
                ("climate", info["climate_commit"]),
                ("database", db),
            ],
            align="ll",
        )
    )


def print_create(r: dict[str, Any]) -> None:
    c = r["config"]
    print()
    print(
        f"scenario create: {c['hosts']} hosts, {c['leases']} leases of 1 host, sequential, one "
        f"HTTP client; starts uniform over {c['horizon_days']:g} days, mean length "
        f"{c['mean_duration_hours']:.1f} h (load {c['load']:g}), seed {c['seed']}"
    )
    h = r["hosts"]
    total = r["admitted"] + r["refused"] + r["errors"]
    print(
        table(
            ("", "value"),
            [
                (
                    "hosts created",
                    f"{h['count']} in {h['seconds']:.1f} s ({h['per_second']:.1f}/s, "
                    f"median {h['latency_ms']['median']:.1f} ms)",
                ),
                ("leases requested", total),
                ("admitted (201)", r["admitted"]),
                ("refused (409 capacity)", r["refused"]),
                ("other errors", f"{r['errors']} {r['error_kinds'] or ''}".strip()),
                ("elapsed", f"{r['seconds']:.2f} s"),
                ("throughput", f"{r['leases_per_second']:.1f} lease requests/s"),
            ],
            align="ll",
        )
    )
    print()
    print("  lease creation latency, ms (client side, POST /v1/leases)")
    lat = r["latency_ms"]
    print(
        table(
            LAT_HEADERS,
            [
                _lat_row("all", lat["all"]),
                _lat_row("admitted", lat["admitted"]),
                _lat_row("refused", lat["refused"]),
                _lat_row("first 10%", lat["first_10pct"]),
                _lat_row("last 10%", lat["last_10pct"]),
            ],
            indent="    ",
        )
    )
    tenths = " ".join(f"{m:.0f}" for m in lat["median_by_tenth"])
    print(f"    median by tenth of the run, ms: {tenths}")


def print_events(r: dict[str, Any]) -> None:
    c = r["config"]
    print()
    print(
        f"scenario events: {c['leases']} leases on {c['hosts']} hosts, all starting at "
        f"{r['start_time']} and ending {c['duration_seconds']:g} s later"
    )
    margin = r["created_before_start_seconds"]
    note = "" if margin > 0 else "  (WARNING: creation overran the start; raise --events-lead)"
    print(
        table(
            ("", "value"),
            [
                ("admitted / refused", f"{r['admitted']} / {r['refused']}"),
                (
                    "lead to start",
                    f"{c['lead_seconds']:.1f} s (calibrated "
                    f"{c['calibrated_seconds_per_lease'] * 1000:.1f} ms per lease)",
                ),
                ("all created before start by", f"{margin:.2f} s{note}"),
                ("event status", r["event_status"]),
                ("lease status after", r["lease_status"]),
                (
                    "climate serve memory",
                    f"peak RSS {fmt(r['server_rss_mb']['peak'])} MB (VmHWM), "
                    f"{fmt(r['server_rss_mb']['current'])} MB at the end",
                ),
            ],
            align="ll",
        )
    )
    print()
    print("  event lag = done_at - scheduled time, ms")
    rows = []
    for kind in ("start_lease", "before_end_lease", "end_lease", "all"):
        s = r["lag_ms"][kind]
        rows.append(
            [
                kind,
                s["count"],
                s["median"],
                s["p95"],
                s["p99"],
                s["max"],
                s["late_over_100ms"],
                s["late_over_1s"],
                s["not_done"],
            ]
        )
    print(
        table(
            ("", "n", "p50", "p95", "p99", "max", "late >100ms", "late >1s", "not done"),
            rows,
            indent="    ",
        )
    )
    print()
    print(
        table(
            ("target", "measured", "goal", "verdict", "note"),
            [t.row() for t in events_targets(r)],
            indent="    ",
            align="lrrll",
        )
    )


def print_profile(profile: dict[str, Any], during: str, inside: str) -> None:
    print()
    threads = ", ".join(f"{name} {n}" for name, n in sorted(profile["threads"].items()))
    kind = "samples" if profile.get("idle_included") else "non-idle samples"
    print(f"  server profile {during} (py-spy, {kind} per thread: {threads})")
    print(f"  shares below are of the {profile['samples']} samples inside {inside}")
    for which, title in (
        ("inclusive_climate", "inclusive time, climate code"),
        ("self", "self time, any code"),
    ):
        rows = [(e["function"], e["samples"], f"{e['percent']:.1f}%") for e in profile[which]]
        print()
        print(table((f"top by {title}", "samples", "share"), rows[:15], indent="    "))


def print_breakdown(profile: dict[str, Any]) -> None:
    """Inclusive time per API function (the endpoints and what they call there), and self time
    per package."""
    for key, label, title in (
        ("inclusive_api", "function", "inclusive time, climate/api"),
        ("self_by_package", "package", "self time by package"),
    ):
        rows = [(e[label], e["samples"], f"{e['percent']:.1f}%") for e in profile[key]]
        print()
        print(table((title, "samples", "share"), rows[:15], indent="    "))


def _mixed(args: argparse.Namespace, stamp: str) -> dict[str, Any]:
    config = MixedConfig(
        clients=args.mixed_clients,
        seconds=QUICK.seconds if args.quick else args.mixed_seconds,
        hosts=QUICK.hosts if args.quick else args.mixed_hosts,
        db=args.db,
        pg_admin_url=args.pg_admin_url,
        workers=args.mixed_workers,
    )
    profile_path = RESULTS_DIR / f"{stamp}-mixed.pyspy.txt"

    def around(server: RunningServer) -> contextlib.AbstractContextManager[Any]:
        if not args.profile:
            return contextlib.nullcontext()
        return sampled(server.pid, profile_path, idle=args.profile_idle)

    if args.mixed_against:
        result = run_mixed_against(config, args.mixed_against, around_load=around, keep=args.keep)
    else:
        result = run_mixed(config, around_load=around, keep=args.keep)
    if args.profile:
        # With idle samples, only the stacks of lease creations: where their wall time goes.
        only = "create_lease" if args.profile_idle else ""
        profile = read_collapsed(profile_path, only_threads_with=only).as_dict()
        profile["raw_output"] = str(profile_path)
        profile["idle_included"] = args.profile_idle
        result["profile"] = profile
    return result


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[RunningServer]:
    with climate_server(args.db, pg_admin_url=args.pg_admin_url, keep=args.keep) as server:
        yield server


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started_at = dt.datetime.now(dt.UTC)
    started = started_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    info = machine.describe()
    results: dict[str, Any] = {
        "started": started_at.isoformat(),
        "machine": info,
        "database": args.db,
        "argv": list(sys.argv[1:] if argv is None else argv),
        "scenarios": {},
    }
    print_machine(info, args.db, started)
    stamp = started_at.strftime("%Y%m%dT%H%M%SZ")

    if args.scenario in ("create", "all"):
        config = CreateConfig(args.hosts, args.leases, args.horizon_days, args.load, args.seed)
        with _server(args) as server:
            profile_path = RESULTS_DIR / f"{stamp}-create.pyspy.txt"

            def around() -> contextlib.AbstractContextManager[Any]:
                if args.profile:
                    return sampled(server.pid, profile_path)
                return contextlib.nullcontext()

            created = run_create(server, config, around_leases=around)
        if args.profile:
            # Only the request handling threads: stacks that went through the lease endpoint.
            profile = read_collapsed(profile_path, only_threads_with="create_lease").as_dict()
            profile["raw_output"] = str(profile_path)
            created["profile"] = profile
        results["scenarios"]["create"] = created
        print_create(created)
        if args.profile:
            print_profile(created["profile"], "while admitting leases", "create_lease")

    if args.scenario in ("events", "all"):
        config_e = EventsConfig(
            leases=args.events_leases,
            hosts=args.events_hosts or args.events_leases,
            duration_seconds=args.events_duration,
            lead_seconds=args.events_lead,
            settle_seconds=args.events_settle,
        )
        with _server(args) as server:
            events_profile_path = RESULTS_DIR / f"{stamp}-events.pyspy.txt"

            def around_wait() -> contextlib.AbstractContextManager[Any]:
                if args.profile:
                    return sampled(server.pid, events_profile_path)
                return contextlib.nullcontext()

            events = run_events(server, config_e, around_wait=around_wait)
        if args.profile:
            profile = read_collapsed(events_profile_path, only_threads_with="run_due").as_dict()
            profile["raw_output"] = str(events_profile_path)
            events["profile"] = profile
        results["scenarios"]["events"] = events
        print_events(events)
        if args.profile:
            print_profile(events["profile"], "while applying the events", "Manager.run_due")

    targets: list[Target] = []
    if "create" in results["scenarios"]:
        targets += create_targets(results["scenarios"]["create"])
    if "events" in results["scenarios"]:
        targets += events_targets(results["scenarios"]["events"])
    if args.scenario in ("scale", "all"):
        small = run_scale(50, 0, 200)
        print_scale(small)
        targets.append(
            Target(
                "HTTP single-host p50, H=50, 200 contending",
                percentile(small["single_ms"], 50),
                2.5,
                "ms",
            )
        )
        big = run_scale(args.scale_hosts, args.scale_allocations, 200)
        print_scale(big)
        targets += scale_targets(big)
        results["scenarios"]["scale"] = {"small": small, "large": big}
    if args.scenario in ("throughput", "all"):
        throughput = run_all(args.tp_clients, args.tp_seconds, args.pg_admin_url)
        print_throughput(throughput)
        targets += throughput_targets(throughput)
        results["scenarios"]["throughput"] = throughput
    if args.scenario in ("quality", "all"):
        quality = run_quality()
        print_quality(quality)
        targets += quality_targets(quality)
        results["scenarios"]["quality"] = quality
    if args.scenario in ("availability", "all"):
        availability = run_availability()
        print_availability(availability)
        targets += availability_targets(availability)
        results["scenarios"]["availability"] = availability
    if args.scenario == "instances":  # not part of "all": seeding takes 1-2 minutes
        instances = run_instances()
        print_instances(instances)
        results["scenarios"]["instances"] = instances
    if args.scenario == "mixed":  # not part of "all": a minute of load, see bench/README.md
        mixed = _mixed(args, stamp)
        print_mixed(mixed)
        if args.profile:
            if args.profile_idle:
                print_profile(mixed["profile"], "under mixed load, idle included", "create_lease")
            else:
                print_profile(mixed["profile"], "under mixed load", "any server thread")
            print_breakdown(mixed["profile"])
        targets += mixed_targets(mixed)
        results["scenarios"]["mixed"] = mixed
    if args.scenario == "openstack":  # not part of "all": needs the OpenStack rig running
        found = run_openstack()
        print_openstack(found)
        targets += openstack_targets(found)
        results["scenarios"]["openstack"] = found
    if args.scenario == "limit":  # not part of "all": compares with another server
        limit = run_limit()
        print_limit(limit)
        targets += limit_targets(limit)
        results["scenarios"]["limit"] = limit
    if args.scenario in ("ui", "all"):
        ui = run_ui()
        print_ui(ui)
        targets += ui_targets(ui)
        results["scenarios"]["ui"] = ui
    if args.scenario == "rules":  # not part of "all": seeding takes about a minute
        rules = run_rules()
        print_rules(rules)
        targets += rules_targets(rules)
        results["scenarios"]["rules"] = rules
    if args.scenario == "ops":  # not part of "all": seeds 10,000 leases
        from bench.ops import ops_targets, print_ops, run_ops

        ops = run_ops(args.db)
        print_ops(ops)
        targets += ops_targets(ops)
        results["scenarios"]["ops"] = ops
    if args.scenario == "demand":  # not part of "all": seeds 10,000 leases and 2,000 refusals
        from bench.demand import demand_targets, print_demand, run_demand

        found = run_demand(args.db)
        print_demand(found)
        targets += demand_targets(found)
        results["scenarios"]["demand"] = found
    if args.scenario == "growth":  # not part of "all": see bench/README.md
        growth = run_growth()
        print_growth(growth)
        results["scenarios"]["growth"] = growth
    if targets:
        print()
        print("targets")
        print(table(["target", "measured", "goal", "verdict", "note"], [t.row() for t in targets]))
        results["targets"] = [t.as_dict() for t in targets]

    results["machine"]["load_average_at_end"] = machine.load_average()
    print()
    print(f"load average at end: {results['machine']['load_average_at_end']} (1, 5, 15 min)")
    payload = json.dumps(jsonable(results), indent=2, sort_keys=True, default=str)
    written = []
    if not args.no_save:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{stamp}.json"
        path.write_text(payload + "\n")
        written.append(path)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(payload + "\n")
        written.append(args.json)
    print()
    for path in written:
        print(f"results written to {fmt(str(path))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
