"""``lease create --wait``: follow a new lease until it is ACTIVE, showing where it is (waiting,
starting, active) on stderr; a lease that fails, lapses or outlasts ``--wait-timeout`` is a
failure (exit status 1). ``lease force-end``: the lease once the manager has ended it."""

from __future__ import annotations

import argparse
import datetime as dt
import time
from typing import TYPE_CHECKING, Any

from rich.text import Text

from climate.cli.output import console, printable, show_date, show_dates

if TYPE_CHECKING:
    from climate.cli.http import ApiClient

DEFAULT_TIMEOUT = 600.0
POLL_SECONDS = 0.5
FAILED = frozenset({"ERROR", "TIMEDOUT", "EXPIRED", "TERMINATING", "TERMINATED"})
ENDED = frozenset({"ERROR", "TIMEDOUT", "EXPIRED", "TERMINATED"})
END_TIMEOUT = 30.0
"""How long ``force-end`` waits for the manager to run the end it asked for."""


def add_wait_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait",
        action="store_true",
        help="follow the lease until it is ACTIVE (progress on stderr); exit 1 if it ends in "
        "ERROR, TIMEDOUT or EXPIRED, or is not ACTIVE within --wait-timeout",
    )
    parser.add_argument(
        "--wait-timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long --wait waits (default {DEFAULT_TIMEOUT:g})",
    )


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text!r}")
    return seconds


def phase(lease: dict[str, Any]) -> str:
    """Where a lease is, for people."""
    status = lease["status"]
    if status == "PENDING":
        start = dt.datetime.fromisoformat(lease["start_date"]).replace(tzinfo=dt.UTC)
        if start <= dt.datetime.now(dt.UTC):
            return "waiting: due now, the manager starts it"
        return f"waiting: starts at {show_date(lease['start_date'])} UTC"
    if status == "IN_PROGRESS":
        place = lease.get("queue_position")
        return "waiting for capacity" + (f" (queue position {place})" if place else "")
    if status == "HELD":
        until = show_date(str(lease.get("hold_expires_at")))
        return f"held until {until} UTC: waiting for `climate lease confirm`"
    if status == "STARTING":
        return "starting"
    if status == "ACTIVE":
        return "active"
    reason = f": {show_dates(lease['status_reason'])}" if lease.get("status_reason") else ""
    return f"{status.lower()}{reason}"


def wait_active(
    api: ApiClient, lease: dict[str, Any], timeout: float
) -> tuple[dict[str, Any], str | None]:
    """The lease once ACTIVE, or as it was when it failed or the time ran out, with the error."""
    out = console(stderr=True)
    name = printable(f"{lease['name']} ({lease['id']})")
    deadline = time.monotonic() + timeout
    shown = ""
    with out.status(Text(f"lease {name}: {printable(phase(lease))}")) as spinner:
        while True:
            now = phase(lease)
            if now != shown:
                out.print(f"lease {name}: {printable(now)}")
                spinner.update(Text(f"lease {name}: {printable(now)}"))
                shown = now
            if lease["status"] == "ACTIVE":
                return lease, None
            if lease["status"] in FAILED:
                return lease, f"error: lease {name} did not start: {printable(now)}"
            if time.monotonic() >= deadline:
                return lease, (
                    f"error: lease {name} is not ACTIVE after {timeout:g} s "
                    f"(--wait-timeout): {printable(now)}"
                )
            time.sleep(POLL_SECONDS)
            lease = api.call("GET", f"/leases/{lease['id']}")["lease"]


def wait_ended(
    api: ApiClient, lease: dict[str, Any], timeout: float = END_TIMEOUT
) -> dict[str, Any]:
    """The lease once ended, or as it is when ``timeout`` runs out (with a note on stderr):
    a forced end is an event the manager runs within moments, not at once."""
    out = console(stderr=True)
    deadline = time.monotonic() + timeout
    with out.status(Text(f"lease {printable(lease['name'])}: ending")):
        while lease["status"] not in ENDED and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            lease = api.call("GET", f"/leases/{lease['id']}")["lease"]
    if lease["status"] not in ENDED:
        out.print(
            Text(
                f"note: lease {printable(lease['name'])} is still {lease['status']} after "
                f"{timeout:g} s; the manager ends it shortly (see `climate lease show`)"
            )
        )
    return lease
