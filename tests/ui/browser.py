"""Debian's Chromium driven by Playwright (never a downloaded browser), with every request to a
host other than Climate's refused, and the page's errors collected."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Response, Route, sync_playwright

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def require_chromium() -> None:
    """Skip (fail under CI=true) when Debian's chromium is not installed."""
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {CHROMIUM} is missing (apt-get install chromium)")
        pytest.skip(f"{CHROMIUM} is missing; skipping browser tests (apt-get install chromium)")


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        # As root (CI containers) Chromium runs only without its sandbox.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, chromium_sandbox=False)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Watched:
    page: Page
    base: str
    blocked: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Uncaught exceptions and console errors (a Content-Security-Policy refusal included)."""
    failed: list[str] = field(default_factory=list)
    """Answers of 400 and above, as ``METHOD /path?query STATUS``: expected refusals (a 409
    with offers, a 400 naming a field) are the test's to allow."""

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


def watched(browser: Browser, base: str, timezone: str = "UTC", width: int = 1400) -> Watched:
    """A new page for Climate at ``base``, with the network to anything else cut off, in a
    browser whose clock shows ``timezone``, ``width`` pixels wide."""
    context = browser.new_context(viewport={"width": width, "height": 900}, timezone_id=timezone)
    page = context.new_page()
    seen = Watched(page, base)

    def only_climate(route: Route) -> None:
        url = route.request.url
        if url.startswith((f"{base}/", "data:")):
            route.continue_()
        else:
            seen.blocked.append(url)
            route.abort()

    page.route("**/*", only_climate)
    page.on("pageerror", lambda error: seen.errors.append(f"page error: {error}"))

    def answered(response: Response) -> None:
        if response.status >= 400:
            request = response.request
            path = response.url.removeprefix(base)
            seen.failed.append(f"{request.method} {path} {response.status}")

    page.on("response", answered)

    def console(message: object) -> None:
        text = getattr(message, "text", "")
        if getattr(message, "type", "") != "error":
            return
        # Answers such as a 409 refusal or a member's 403 are the page's to show, and shown.
        if "status of 4" in text:
            return
        seen.errors.append(text)

    page.on("console", console)
    return seen
