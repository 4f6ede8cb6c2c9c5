"""``python -m bench.screenshot``: regenerate docs/img/dashboard.png, the dashboard as README
shows it. Starts a real ``climate serve`` on a fresh database, books a small week of leases of
three projects on eight hosts over HTTP (one host down), and photographs ``/ui/`` in Debian's
Chromium (Playwright)."""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from bench.server import climate_server

CHROMIUM = "/usr/bin/chromium"
OUTPUT = Path(__file__).resolve().parent.parent / "docs" / "img" / "dashboard.png"
PROJECTS = ("astro", "genomics", "climate-model")
# (project, name, host count, start in hours from now, length in hours)
LEASES = (
    ("astro", "survey-reduce", 2, -20, 50),
    ("genomics", "assembly", 3, 4, 30),
    ("climate-model", "ensemble-run", 2, 30, 60),
    ("astro", "gpu-training", 1, 60, 40),
    ("genomics", "alignment", 2, 90, 20),
    ("climate-model", "nightly", 1, 12, 10),
)


def book(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as admin:
        for i in range(1, 9):
            extra = {"gpu": "a100"} if i <= 3 else {"rack": f"r{(i + 1) // 2}"}
            admin.post("/v1/os-hosts", json={"name": f"compute-{i}", **extra}).raise_for_status()
        now = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
        for project, name, count, start, hours in LEASES:
            begin = now + dt.timedelta(hours=start)
            body = {
                "name": name,
                "start_date": "now" if start < 0 else begin.strftime("%Y-%m-%d %H:%M"),
                "end_date": (begin + dt.timedelta(hours=hours)).strftime("%Y-%m-%d %H:%M"),
                "reservations": [{"resource_type": "physical:host", "min": count, "max": count}],
                "events": [],
            }
            headers = {"X-Project-Id": project, "X-User-Id": f"{project}-user", "X-Roles": "member"}
            admin.post("/v1/leases", json=body, headers=headers).raise_for_status()
        admin.put("/v1/os-hosts/8/health", json={"health": "down"}).raise_for_status()


def photograph(base_url: str, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, chromium_sandbox=False)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 820})
            page.goto(f"{base_url}/ui/#/timeline/168")
            page.wait_for_selector("#timeline[data-state=drawn]")
            page.wait_for_selector("#capacity[data-state=drawn]")
            page.screenshot(path=str(output))
        finally:
            browser.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.screenshot", description=__doc__)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    with climate_server("sqlite") as server:
        book(server.base_url)
        photograph(server.base_url, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
