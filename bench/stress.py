"""``python -m bench.stress``: many clients against several API and manager processes on one
PostgreSQL database, optionally with a failing backend and managers killed with SIGKILL; then
checks by SQL that nothing was booked twice, no event fired twice and every lease ended in the
state the rules say, and prints the figures with PASS/FAIL per check (exit 1 on any FAIL)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from bench.server import DEFAULT_PG_ADMIN_URL, climate_executable, free_port, pg_database
from bench.stats import jsonable, percentile, table
from climate.db import migrate
from climate.db.engine import Database

RESULTS_DIR = Path(__file__).resolve().parent / "results"
LEASE_DATE = "%Y-%m-%dT%H:%M:%S.%f"
MAX_ATTEMPTS = 3
"""``event_max_attempts`` of the processes (the default)."""
KEEPALIVE_SECONDS = 2.0
"""How long a client keeps an idle connection."""


@dataclass(frozen=True)
class StressConfig:
    seconds: float = 300.0
    apis: int = 4
    managers: int = 2
    clients: int = 32
    hosts: int = 50
    faults: bool = False
    fault_rate: float = 0.2
    kill_every: float = 20.0
    start_within: float = 60.0
    """Leases start now or within this many seconds..."""
    longest: float = 90.0
    """...and last 5 s up to this long: starts and ends really fire during the run."""
    think_ms: float = 20.0
    settle_timeout: float = 180.0
    seed: int = 42
    keep_logs: bool = False
    """Keep the processes' logs even when every check passed."""
    pg_admin_url: str = DEFAULT_PG_ADMIN_URL


@dataclass
class Check:
    name: str
    verdict: str
    """PASS, FAIL, or "not checked (why)"."""
    detail: str = ""


@dataclass
class StressResult:
    config: StressConfig
    requests: dict[str, dict[str, Any]]
    rejects: dict[str, int]
    statuses: dict[str, int]
    kills: int
    leases: dict[str, int]
    events: dict[str, int]
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.verdict != "FAIL" for c in self.checks)


# -- processes ---------------------------------------------------------------------------------


class Proc:
    """A ``climate`` subprocess on loopback, its output in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as out:
            return subprocess.Popen(
                [climate_executable(), *self.args], env=self.env, stdout=out, stderr=out
            )

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def restart(self) -> None:
        self.proc = self._spawn()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _env(config: StressConfig) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIMATE_")}
    env.update(
        CLIMATE_AUTH="noauth",
        CLIMATE_EVENT_MAX_ATTEMPTS=str(MAX_ATTEMPTS),
        CLIMATE_EVENT_RETRY_BASE_SECONDS="0.5",
        # A killed manager's claims come back this soon (longer than any healthy pass takes).
        CLIMATE_EVENT_CLAIM_SECONDS="15",
        CLIMATE_BACKEND_TIMEOUT_SECONDS="5",
    )
    if config.faults:
        env.update(CLIMATE_BACKEND="faulty", CLIMATE_FAULT_RATE=str(config.fault_rate))
    return env


def _wait_up(url: str, proc: Proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"climate {proc.args[0]} exited; see {proc.log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/versions", timeout=2).status_code == 300:
                return
        time.sleep(0.1)
    raise RuntimeError(f"climate api on {url} did not come up; see {proc.log}")


@contextlib.contextmanager
def _cluster(
    config: StressConfig, database_url: str, logs: Path
) -> Iterator[tuple[list[str], list[Proc]]]:
    env = _env(config)
    started: list[Proc] = []
    try:
        urls = []
        for i in range(config.apis):
            port = free_port()
            api = Proc(
                ["api", "--database-url", database_url, "--port", str(port)],
                env,
                logs / f"api-{i}.log",
            )
            started.append(api)
            urls.append(f"http://127.0.0.1:{port}")
            _wait_up(urls[-1], api)
        managers = []
        for i in range(config.managers):
            manager_env = {**env, "CLIMATE_FAULT_SEED": str(config.seed + i)}
            managers.append(
                Proc(
                    ["manager", "--database-url", database_url],
                    manager_env,
                    logs / f"manager-{i}.log",
                )
            )
        started.extend(managers)
        yield urls, managers
    finally:
        for proc in started:
            proc.stop()


# -- clients -----------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the clients saw; each client thread appends, read after they all stopped."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter[str] = field(default_factory=Counter)
    rejects: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    """Requests that got no answer, by exception."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, status: int, seconds: float, reason: str | None) -> None:
        """``reason``: a 409's reason, or why there was no answer (status 0)."""
        with self.lock:
            self.latencies[kind].append(seconds * 1000.0)
            self.statuses[f"{kind} {status}"] += 1
            if status == 409 and reason is not None:
                self.rejects[reason] += 1
            if status == 0 and reason is not None:
                self.failures[reason] += 1


_IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIMES = re.compile(r"\d{4}-\d\d-\d\dT[\d:.+]+")
_NUMBERS = re.compile(r"\d+")
_NAMES = re.compile(r"'[^']*'")


def _reason(body: str) -> str:
    """A 409's message with ids, names, times and numbers taken out, so alike ones count
    together."""
    try:
        message = str(json.loads(body).get("error_message", body))
    except ValueError:
        message = body
    for pattern, stand_in in ((_IDS, "<id>"), (_TIMES, "<time>"), (_NAMES, "<name>")):
        message = pattern.sub(stand_in, message)
    return _NUMBERS.sub("N", message)


def _date(value: str) -> dt.datetime:
    return dt.datetime.strptime(value, LEASE_DATE).replace(tzinfo=dt.UTC)


class Client(threading.Thread):
    """Creates leases with short windows, updates, deletes, lists and shows them until told to
    stop. Keeps the windows of its own leases to make sensible updates."""

    def __init__(
        self,
        number: int,
        urls: list[str],
        config: StressConfig,
        tally: Tally,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"stress-client-{number}", daemon=True)
        self.number, self.urls, self.config, self.tally, self.stop = (
            number,
            urls,
            config,
            tally,
            stop,
        )
        self.random = random.Random(config.seed * 1000 + number)
        self.mine: dict[str, tuple[dt.datetime, dt.datetime]] = {}
        self.made = 0

    def run(self) -> None:
        # Idle connections are dropped before the server's keep-alive (uvicorn: 5 s) ends them:
        # at the same expiry a request can go out on a connection the server is just closing.
        limits = httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS)
        with httpx.Client(timeout=60, limits=limits) as http:
            self.http = http
            while not self.stop.is_set():
                action = self.random.choices(
                    [self.create, self.update, self.delete, self.list, self.show],
                    weights=[40, 20, 10, 10, 20],
                )[0]
                action()
                self.stop.wait(self.random.uniform(0, 2 * self.config.think_ms) / 1000.0)

    def _call(self, kind: str, method: str, path: str, body: Any = None) -> httpx.Response | None:
        url = self.random.choice(self.urls) + path
        began = time.perf_counter()
        try:
            response = self.http.request(method, url, json=body)
        except httpx.HTTPError as exc:  # status 0: no answer
            self.tally.add(kind, 0, time.perf_counter() - began, f"{type(exc).__name__}: {exc}")
            return None
        reason = _reason(response.text) if response.status_code == 409 else None
        self.tally.add(kind, response.status_code, time.perf_counter() - began, reason)
        return response

    def _remember(self, response: httpx.Response | None) -> None:
        if response is not None and response.status_code in (200, 201):
            lease = response.json()["lease"]
            self.mine[lease["id"]] = (_date(lease["start_date"]), _date(lease["end_date"]))

    def create(self) -> None:
        now = dt.datetime.now(dt.UTC)
        start = now + dt.timedelta(seconds=self.random.uniform(1, self.config.start_within))
        count = self.random.randint(1, 3)
        self.made += 1
        body = {
            "name": f"c{self.number}-{self.made}",
            "start_date": "now" if self.random.random() < 0.2 else start.isoformat(),
            "end_date": (
                start + dt.timedelta(seconds=self.random.uniform(5, self.config.longest))
            ).isoformat(),
            "reservations": [{"resource_type": "physical:host", "min": count, "max": count}],
            "events": [],
        }
        self._remember(self._call("create", "POST", "/v1/leases", body))

    def _pick(self) -> str | None:
        return self.random.choice(sorted(self.mine)) if self.mine else None

    def update(self) -> None:
        lease_id = self._pick()
        if lease_id is None:
            return self.create()
        start, end = self.mine[lease_id]
        now = dt.datetime.now(dt.UTC)
        how = self.random.choice(["extend", "shrink", "rename"])
        shift = dt.timedelta(seconds=self.random.uniform(3, 20))
        if how == "extend":
            body: dict[str, Any] = {"end_date": (end + shift).isoformat()}
        elif how == "shrink" and end - shift > max(start, now) + dt.timedelta(seconds=3):
            body = {"end_date": (end - shift).isoformat()}
        else:
            how = "rename"
            self.made += 1
            body = {"name": f"c{self.number}-{self.made}"}
        self._remember(self._call(f"update:{how}", "PUT", f"/v1/leases/{lease_id}", body))

    def delete(self) -> None:
        lease_id = self._pick()
        if lease_id is None:
            return
        response = self._call("delete", "DELETE", f"/v1/leases/{lease_id}")
        if response is not None and response.status_code in (204, 404):
            del self.mine[lease_id]

    def list(self) -> None:
        self._call("list", "GET", "/v1/leases")

    def show(self) -> None:
        lease_id = self._pick()
        if lease_id is not None:
            self._call("show", "GET", f"/v1/leases/{lease_id}")


def _killer(managers: list[Proc], every: float, stop: threading.Event, kills: list[int]) -> None:
    """SIGKILL one manager every ``every`` seconds (in turn) and start it again at once."""
    turn = 0
    while not stop.wait(every):
        victim = managers[turn % len(managers)]
        victim.kill9()
        victim.restart()
        kills.append(turn)
        turn += 1


# -- checks ------------------------------------------------------------------------------------


def _settle(db: Database, timeout: float) -> int:
    """Wait until no event waits or runs any more (every lease's window is over by then);
    returns how many still do at the deadline."""
    deadline = time.monotonic() + timeout
    query = text("SELECT count(*) FROM events WHERE status IN ('UNDONE', 'IN_PROGRESS')")
    while True:
        with db.reader() as session:
            left = int(session.scalar(query) or 0)
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def _count(db: Database, sql: str) -> int:
    with db.reader() as session:
        return int(session.scalar(text(sql)) or 0)


DOUBLE_BOOKINGS = """
SELECT count(*) FROM host_allocations a JOIN host_allocations b
  ON a.host_id = b.host_id AND a.id < b.id
 AND a.start_date < b.end_date AND b.start_date < a.end_date
"""

# A lease once every event is settled: TERMINATED with every reservation deleted and its end
# done, or ERROR with a reason and an event that used up its attempts (a claim taken over from a
# killed manager counts as an attempt too, so there may be more than the maximum).
INCONSISTENT_LEASES = f"""
SELECT l.id, l.status, l.status_reason FROM leases l
 WHERE NOT (
   (l.status = 'TERMINATED'
    AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.lease_id = l.id AND r.status <> 'deleted')
    AND (EXISTS (SELECT 1 FROM events e WHERE e.lease_id = l.id
                  AND e.event_type = 'end_lease' AND e.status = 'DONE')
         OR l.deleted_at IS NOT NULL  -- deleted before it started: its events were dropped
            AND NOT EXISTS (SELECT 1 FROM events e WHERE e.lease_id = l.id)))
   OR (l.status = 'ERROR' AND coalesce(l.status_reason, '') <> ''
       AND EXISTS (SELECT 1 FROM events e WHERE e.lease_id = l.id
                    AND e.status = 'ERROR' AND e.attempts >= {MAX_ATTEMPTS}))
 )
"""

BAD_EVENTS = f"""
SELECT count(*) FROM events
 WHERE status NOT IN ('DONE', 'ERROR') OR (status = 'ERROR' AND attempts < {MAX_ATTEMPTS})
"""

HELD_AFTER_END = """
SELECT count(*) FROM assignments a JOIN leases l ON l.id = a.lease_id
 WHERE a.released_at IS NULL AND l.status = 'TERMINATED'
"""


def _audit_checks(db: Database) -> list[Check]:
    with db.reader() as session:
        present = session.scalar(text("SELECT to_regclass('audit_log') IS NOT NULL"))
    if not present:
        why = "not checked (no audit_log table)"
        return [
            Check("events fired at most once (audit)", why),
            Check("DONE events audited once", why),
        ]
    twice = _count(
        db,
        "SELECT count(*) FROM (SELECT target_id FROM audit_log WHERE target_type = 'event' "
        "GROUP BY target_id HAVING count(*) > 1) t",
    )
    unaudited = _count(
        db,
        "SELECT count(*) FROM events e WHERE e.status = 'DONE' AND (SELECT count(*)"
        " FROM audit_log a WHERE a.target_type = 'event' AND a.target_id = e.id) <> 1",
    )
    return [
        Check(
            "events fired at most once (audit)",
            "PASS" if twice == 0 else "FAIL",
            f"{twice} fired twice",
        ),
        Check(
            "DONE events audited once",
            "PASS" if unaudited == 0 else "FAIL",
            f"{unaudited} DONE event(s) without exactly one audit row",
        ),
    ]


def _check(db: Database, tally: Tally, left: int) -> list[Check]:
    errors_5xx = sum(n for k, n in tally.statuses.items() if k.rsplit(" ", 1)[1].startswith("5"))
    transport = sum(n for k, n in tally.statuses.items() if k.endswith(" 0"))
    doubles = _count(db, DOUBLE_BOOKINGS)
    with db.reader() as session:
        wrong = session.execute(text(INCONSISTENT_LEASES)).all()
        examples = "; ".join(
            f"{r.id} {r.status} {r.status_reason or ''} events: "
            + ", ".join(
                f"{e.event_type} {e.status} x{e.attempts}"
                for e in session.execute(
                    text(
                        "SELECT event_type, status, attempts FROM events"
                        " WHERE lease_id = :id ORDER BY seq"
                    ),
                    {"id": r.id},
                )
            )
            for r in wrong[:3]
        )
    bad_events = _count(db, BAD_EVENTS)
    held = _count(db, HELD_AFTER_END)
    return [
        Check(
            "double bookings (SQL)",
            "PASS" if doubles == 0 else "FAIL",
            f"{doubles} overlapping pair(s)",
        ),
        Check("5xx responses", "PASS" if errors_5xx == 0 else "FAIL", f"{errors_5xx}"),
        Check(
            "transport errors",
            "PASS" if transport == 0 else "FAIL",
            "; ".join([str(transport), *(f"{n} x {why}" for why, n in tally.failures.items())]),
        ),
        Check(
            "every due event settled",
            "PASS" if left == 0 else "FAIL",
            f"{left} still waiting or running",
        ),
        Check(
            "leases in a consistent state",
            "PASS" if not wrong else "FAIL",
            f"{len(wrong)} wrong {examples}".strip(),
        ),
        Check(
            "events DONE, or ERROR after every attempt",
            "PASS" if bad_events == 0 else "FAIL",
            f"{bad_events} wrong",
        ),
        Check(
            "no host held after its lease ended",
            "PASS" if held == 0 else "FAIL",
            f"{held} assignment(s)",
        ),
        *_audit_checks(db),
    ]


def _group(db: Database, sql: str) -> dict[str, int]:
    with db.reader() as session:
        return {str(k): int(n) for k, n in session.execute(text(sql)).all()}


# -- the run -----------------------------------------------------------------------------------


def run_stress(config: StressConfig, log: Any = print) -> StressResult:
    """Start the processes on a throwaway database, load them for ``config.seconds``, wait for
    every event to settle, check and return the figures. The database is dropped after; the
    processes' logs are kept when a check failed."""
    logs = Path(tempfile.mkdtemp(prefix="climate-stress-"))
    result = _run(config, logs, log)
    if result.passed and not config.keep_logs:
        shutil.rmtree(logs, ignore_errors=True)
    else:
        log(f"  process logs kept in {logs}")
    return result


def _run(config: StressConfig, logs: Path, log: Any) -> StressResult:
    tally, stop = Tally(), threading.Event()
    kills: list[int] = []
    with pg_database(config.pg_admin_url) as database_url:
        db = Database(database_url)
        migrate.upgrade(db)
        try:
            with _cluster(config, database_url, logs) as (urls, managers):
                for i in range(config.hosts):
                    response = httpx.post(f"{urls[0]}/v1/os-hosts", json={"name": f"stress-{i}"})
                    response.raise_for_status()
                log(
                    f"  {config.apis} API(s), {config.managers} manager(s), {config.hosts} hosts;"
                    f" {config.clients} clients for {config.seconds:.0f} s"
                    f"{', faults on' if config.faults else ''}"
                )
                clients = [Client(i, urls, config, tally, stop) for i in range(config.clients)]
                killer = threading.Thread(
                    target=_killer, args=(managers, config.kill_every, stop, kills), daemon=True
                )
                for client in clients:
                    client.start()
                if config.faults:
                    killer.start()
                time.sleep(config.seconds)
                stop.set()
                for client in clients:
                    client.join()
                if config.faults:
                    killer.join()
                log("  load over; waiting for every event to settle")
                left = _settle(db, config.settle_timeout)
                checks = _check(db, tally, left)
            return StressResult(
                config=config,
                requests={
                    kind: {
                        "count": len(values),
                        "p50": percentile(values, 50),
                        "p95": percentile(values, 95),
                        "p99": percentile(values, 99),
                    }
                    for kind, values in sorted(tally.latencies.items())
                },
                rejects=dict(tally.rejects.most_common()),
                statuses=dict(sorted(tally.statuses.items())),
                kills=len(kills),
                leases=_group(db, "SELECT status, count(*) FROM leases GROUP BY status"),
                events=_group(
                    db,
                    "SELECT event_type || ' ' || status || ' attempts=' || attempts, count(*)"
                    " FROM events GROUP BY 1 ORDER BY 1",
                ),
                checks=checks,
            )
        finally:
            db.dispose()


def report(result: StressResult) -> str:
    rows = [[kind, v["count"], v["p50"], v["p95"], v["p99"]] for kind, v in result.requests.items()]
    out = ["", "requests (latency in ms)", table(["kind", "n", "p50", "p95", "p99"], rows)]
    out += ["", "responses", table(["kind status", "n"], list(result.statuses.items()))]
    if result.rejects:
        out += ["", "rejects (409) by reason", table(["reason", "n"], list(result.rejects.items()))]
    out += ["", f"managers killed with SIGKILL: {result.kills}"]
    out += ["", "leases by final status", table(["status", "n"], list(result.leases.items()))]
    out += ["", "events", table(["type status attempts", "n"], list(result.events.items()))]
    out += [
        "",
        "checks",
        table(
            ["check", "verdict", "detail"],
            [[c.name, c.verdict, c.detail] for c in result.checks],
            align="lll",
        ),
    ]
    out += ["", "PASS" if result.passed else "FAIL"]
    return "\n".join(out)


def save(result: StressResult) -> Path:
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"stress-{stamp}.json"
    body = {**asdict(result), "passed": result.passed}
    path.write_text(json.dumps(jsonable(body), indent=2))
    return path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.stress", description=__doc__)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--apis", type=int, default=4)
    p.add_argument("--managers", type=int, default=2)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--hosts", type=int, default=50)
    p.add_argument(
        "--faults",
        action="store_true",
        help="backend 'faulty' failing --fault-rate of calls; "
        "a manager SIGKILLed every --kill-every s",
    )
    p.add_argument("--fault-rate", type=float, default=0.2)
    p.add_argument("--kill-every", type=float, default=20.0)
    p.add_argument(
        "--start-within", type=float, default=60.0, help="leases start within this many s"
    )
    p.add_argument("--longest", type=float, default=90.0, help="longest lease, in s")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--keep-logs", action="store_true", help="keep the process logs on PASS too")
    p.add_argument("--pg-admin-url", default=DEFAULT_PG_ADMIN_URL)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = StressConfig(
        seconds=args.minutes * 60.0,
        apis=args.apis,
        managers=args.managers,
        clients=args.clients,
        hosts=args.hosts,
        faults=args.faults,
        fault_rate=args.fault_rate,
        kill_every=args.kill_every,
        start_within=args.start_within,
        longest=args.longest,
        seed=args.seed,
        keep_logs=args.keep_logs,
        pg_admin_url=args.pg_admin_url,
    )
    result = run_stress(config)
    print(report(result))
    print(f"\n  results: {save(result)}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
