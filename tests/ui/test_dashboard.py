"""The dashboard in a real browser (Debian's Chromium through Playwright) against a live
Climate: seeded leases on the timeline, a lease made through the form, a counter-offer taken,
a lease extended and deleted, a member who sees another project's booking only as busy, markup
in names shown as text, and nothing fetched from anywhere but Climate. Screenshots go to
tests/ui/artifacts/ (each path is printed)."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from climate.config import Settings
from tests.conftest import LiveServer
from tests.test_auth import client, created, issue, token_server
from tests.ui.browser import Watched, chromium, require_chromium, watched

ALICE = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
BOB = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
MARKUP = '<img src=x onerror="window.pwned=1"><b>bold</b>'


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    require_chromium()
    with chromium() as found:
        yield found


def minute(offset: dt.timedelta) -> dt.datetime:
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    return now + offset


def field(when: dt.datetime) -> str:
    """The value of a datetime-local field (the page takes them as UTC)."""
    return when.strftime("%Y-%m-%dT%H:%M")


def lease(name: str, start: dt.datetime, end: dt.datetime, count: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "start_date": start.strftime("%Y-%m-%d %H:%M"),
        "end_date": end.strftime("%Y-%m-%d %H:%M"),
        "reservations": [{"resource_type": "physical:host", "min": count, "max": count}],
        "events": [],
    }


def hosts(http: httpx.Client, *names: str) -> None:
    for name in names:
        created(http.post("/v1/os-hosts", json={"name": name, "rack": "r1"}), "host")


def alice_s_lease(server: LiveServer, name: str) -> tuple[str, str, dict[str, Any]]:
    """An admin's host and a lease of ``name`` on it by alice, a member of project-a: the
    admin's token, alice's, and the lease."""
    ops = issue(server, "ops", "ops", ["admin"])
    alice = issue(server, "alice", "project-a", ["member"])
    with client(server, {"X-Auth-Token": ops}) as admin:
        hosts(admin, "compute-1")
    with client(server, {"X-Auth-Token": alice}) as member:
        made = created(
            member.post("/v1/leases", json=lease(name, minute(HOUR), minute(DAY))), "lease"
        )
    return ops, alice, made


def log_in(page: Page, token: str) -> None:
    page.fill("#token-input", token)
    page.click("#login-form button[type=submit]")


def opened(
    browser: Browser,
    server: LiveServer,
    path: str = "#/timeline",
    timezone: str = "UTC",
    width: int = 1400,
) -> Watched:
    seen = watched(browser, server.url, timezone, width)
    seen.page.goto(f"{server.url}/ui/{path}")
    return seen


def drawn(seen: Watched) -> None:
    expect(seen.page.locator("#timeline")).to_have_attribute("data-state", "drawn")
    expect(seen.page.locator("#capacity")).to_have_attribute("data-state", "drawn")


def clean(seen: Watched) -> None:
    assert seen.blocked == [], f"the page asked for other hosts: {seen.blocked}"
    assert seen.errors == [], seen.errors


def test_seeded_leases_on_the_timeline_offline(browser: Browser, live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin, client(live_sqlite, BOB) as bob:
        hosts(admin, "compute-1", "compute-2", "compute-3")
        created(
            admin.post("/v1/leases", json=lease("training", minute(HOUR), minute(DAY))), "lease"
        )
        created(
            bob.post("/v1/leases", json=lease("bob-batch", minute(2 * HOUR), minute(2 * DAY))),
            "lease",
        )
    seen = opened(browser, live_sqlite)
    drawn(seen)
    page = seen.page
    expect(page.locator(".vis-label")).to_have_count(3)
    expect(page.locator(".vis-item.bar", has_text="training")).to_be_visible()
    expect(page.locator(".vis-item.bar", has_text="bob-batch")).to_be_visible()
    expect(page.locator(".vis-item.vis-background.free")).to_have_count(1)
    expect(page.locator(".vis-custom-time.now")).to_have_count(1)
    page.locator(".vis-item.bar", has_text="training").hover()
    expect(page.locator(".vis-tooltip")).to_contain_text("project admin")
    seen.shot("timeline-admin")
    page.click("text=month")
    expect(page.locator("#timeline")).to_have_attribute("data-state", "drawn")
    page.click("a[data-view=leases]")
    expect(page.locator("#lease-table tbody tr")).to_have_count(2)
    page.click("a[data-view=admin]")
    expect(page.locator("#admin-table tbody tr")).to_have_count(3)
    expect(page.locator("#admin-table")).to_contain_text("rack")
    seen.shot("inventory")
    clean(seen)
    assert page.evaluate("performance.getEntriesByType('resource').length") > 3


def test_create_a_lease_through_the_form(browser: Browser, live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin:
        hosts(admin, "compute-1")
    seen = opened(browser, live_sqlite, "#/new")
    page = seen.page
    page.fill("#new-name", "from-the-form")
    page.fill("#new-start", field(minute(HOUR)))
    page.fill("#new-end", field(minute(3 * HOUR)))
    page.click("#new-create")
    expect(page.locator("#lease-title")).to_have_text("from-the-form")
    expect(page.locator("#lease-reservations")).to_contain_text("physical:host")
    expect(page.locator("#lease-events tbody tr")).to_have_count(3)
    expect(page.locator("#lease-history")).to_contain_text("create")
    seen.shot("lease-page")
    page.click("a[data-view=timeline]")
    drawn(seen)
    expect(page.locator(".vis-item.bar", has_text="from-the-form")).to_be_visible()
    page.click("a[data-view=new]")
    expect(page.locator("#new-name")).to_have_value("")  # the next booking starts blank
    expect(page.locator("#new-start")).not_to_have_value("")
    clean(seen)


def test_a_submit_the_browser_blocks_replaces_the_last_answer(
    browser: Browser, live_sqlite: LiveServer
) -> None:
    """The browser refuses to send a form with a required field empty, and tells which beside
    the field; the page's status line must not still show the last request's answer."""
    with client(live_sqlite) as admin:
        hosts(admin, "compute-1")
        created(admin.post("/v1/leases", json=lease("first", minute(HOUR), minute(DAY))), "lease")
    seen = opened(browser, live_sqlite, "#/new")
    page = seen.page
    page.fill("#new-name", "second")
    page.fill("#new-start", field(minute(2 * HOUR)))
    page.fill("#new-end", field(minute(3 * HOUR)))
    page.click("#new-create")
    expect(page.locator("#status")).to_have_text("refused: see why below, and the offers")
    page.fill("#new-name", "")
    page.click("#new-create")
    status = page.locator("#status")
    expect(status).to_have_text(re.compile(r"^Name: .+"))  # the browser's own words
    expect(status).to_have_class("error")
    assert seen.failed == ["POST /v1/leases 409"]  # the blocked submit sent nothing
    clean(seen)


def test_take_a_counter_offer(browser: Browser, live_sqlite: LiveServer) -> None:
    busy_until = minute(4 * HOUR)
    with client(live_sqlite) as admin:
        hosts(admin, "compute-1")
        created(admin.post("/v1/leases", json=lease("first", minute(HOUR), busy_until)), "lease")
    seen = opened(browser, live_sqlite, "#/new")
    page = seen.page
    page.fill("#new-name", "second")
    page.fill("#new-start", field(minute(2 * HOUR)))
    page.fill("#new-end", field(minute(3 * HOUR)))
    page.click("#new-suggest")
    expect(page.locator("#new-windows li").first).to_contain_text(
        busy_until.strftime("%Y-%m-%d %H:%M")
    )
    page.click("#new-create")
    refusal = page.locator("#new-refusal")
    expect(refusal).to_contain_text("Not enough hosts available")
    expect(refusal).to_contain_text("too_few_free")
    seen.shot("refusal-and-offers")
    page.click("#new-refusal button[data-kind=later_start]")
    expect(page.locator("#lease-title")).to_have_text("second")
    with client(live_sqlite) as admin:
        [taken] = [x for x in admin.get("/v1/leases").json()["leases"] if x["name"] == "second"]
    assert taken["start_date"].startswith(busy_until.strftime("%Y-%m-%dT%H:%M"))
    clean(seen)


def test_extend_shrink_and_delete_a_lease(browser: Browser, live_sqlite: LiveServer) -> None:
    end = minute(3 * HOUR)
    with client(live_sqlite) as admin:
        hosts(admin, "compute-1")
        made = created(admin.post("/v1/leases", json=lease("grow", minute(HOUR), end)), "lease")
    seen = opened(browser, live_sqlite, f"#/lease/{made['id']}")
    page = seen.page
    expect(page.locator("#lease-title")).to_have_text("grow")
    page.click("#lease-extend")
    expect(page.locator("#status")).to_have_text("lease updated")
    expect(page.locator("#lease-end")).to_have_value(field(end + HOUR))
    seen.shot("lease-extended")
    with client(live_sqlite) as admin:
        shown = admin.get(f"/v1/leases/{made['id']}").json()["lease"]
        assert shown["end_date"].startswith((end + HOUR).strftime("%Y-%m-%dT%H:%M"))
    page.click("#lease-shrink")
    expect(page.locator("#lease-end")).to_have_value(field(end))
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#lease-delete")
    expect(page.locator("#status")).to_have_text("lease deleted")
    with client(live_sqlite) as admin:
        assert admin.get(f"/v1/leases/{made['id']}").status_code == 404
    clean(seen)


def test_a_member_sees_another_projects_booking_only_as_busy(
    browser: Browser, settings: Settings, sqlite_url: str
) -> None:
    with token_server(settings, sqlite_url) as server:
        tokens = {
            name: issue(server, name, project, roles)
            for name, project, roles in (
                ("ops", "ops", ["admin"]),
                ("alice", "project-a", ["member"]),
                ("bob", "project-b", ["member"]),
            )
        }
        with (
            client(server, {"X-Auth-Token": tokens["ops"]}) as admin,
            client(server, {"X-Auth-Token": tokens["alice"]}) as alice,
            client(server, {"X-Auth-Token": tokens["bob"]}) as bob,
        ):
            hosts(admin, "compute-1", "compute-2")
            mine = created(
                alice.post("/v1/leases", json=lease("alice-run", minute(HOUR), minute(DAY))),
                "lease",
            )
            theirs = created(
                bob.post("/v1/leases", json=lease("bob-secret-name", minute(HOUR), minute(DAY))),
                "lease",
            )
        seen = opened(browser, server)
        page = seen.page
        expect(page.locator("#login")).to_be_visible()
        log_in(page, tokens["alice"])
        drawn(seen)
        expect(page.locator(".vis-item.bar", has_text="alice-run")).to_be_visible()
        busy = page.locator(".vis-item.bar.busy")
        expect(busy).to_have_count(1)
        expect(busy).to_have_text("busy")
        busy.hover()
        expect(page.locator(".vis-tooltip")).to_contain_text("booked by another project")
        seen.shot("timeline-member")
        assert page.evaluate("sessionStorage.getItem('climate-token')") == tokens["alice"]
        expect(page.locator("#nav-admin")).to_be_hidden()
        page.locator(".vis-item.bar", has_text="alice-run").click()
        expect(page.locator("#lease-title")).to_have_text("alice-run")
        assert mine["id"] in page.content()
        page.click("a[data-view=leases]")
        expect(page.locator("#lease-table tbody tr")).to_have_count(1)
        page.click("a[data-view=timeline]")
        drawn(seen)
        text = page.content() + page.evaluate("JSON.stringify(sessionStorage)")
        for secret in ("bob-secret-name", theirs["id"], "project-b", "compute-1"):
            assert secret not in text, secret
        clean(seen)


def test_a_member_s_pages_ask_nothing_that_is_refused(
    browser: Browser, settings: Settings, sqlite_url: str
) -> None:
    """Whether the caller is an admin comes from ``GET /v1/policy/caller``: no admin's call is
    tried (a 403, and an error in the console) to find out."""
    with token_server(settings, sqlite_url) as server:
        ops, alice, mine = alice_s_lease(server, "alice-run")
        seen = opened(browser, server)
        page = seen.page
        expect(page.locator("#login")).to_be_visible()
        assert seen.failed == []  # no token: the page knows it must ask for one, unrefused
        log_in(page, alice)
        drawn(seen)
        expect(page.locator("#who")).to_have_text("project member")
        expect(page.locator("#nav-admin")).to_be_hidden()
        page.click("a[data-view=leases]")
        expect(page.locator("#lease-table tbody tr")).to_have_count(1)
        expect(page.locator("#filter-project")).to_be_hidden()
        page.goto(f"{server.url}/ui/#/lease/{mine['id']}")
        expect(page.locator("#lease-title")).to_have_text("alice-run")
        expect(page.locator("#lease-history")).to_contain_text("the audit log is for admins")
        page.click("a[data-view=new]")
        expect(page.locator("#new-name")).to_be_visible()
        page.wait_for_load_state("networkidle")
        assert seen.failed == []
        clean(seen)
        admin_seen = opened(browser, server)
        admin_page = admin_seen.page
        log_in(admin_page, ops)
        drawn(admin_seen)
        expect(admin_page.locator("#who")).to_have_text("admin")
        expect(admin_page.locator("#nav-admin")).to_be_visible()
        assert admin_seen.failed == []
        clean(admin_seen)


def test_without_a_token_every_view_waits_behind_the_token_form(
    browser: Browser, settings: Settings, sqlite_url: str
) -> None:
    with token_server(settings, sqlite_url) as server:
        alice = issue(server, "alice", "project-a", ["member"])
        seen = opened(browser, server, "#/leases")
        page = seen.page
        expect(page.locator("#login")).to_be_visible()
        for view in ("new", "timeline", "leases"):
            page.click(f"a[data-view={view}]")
            expect(page.locator("#login")).to_be_visible()
            expect(page.locator(".view:not([hidden])")).to_have_count(0)
        page.wait_for_load_state("networkidle")
        assert seen.failed == []  # nothing asked that needs the token not yet given
        log_in(page, alice)
        expect(page.locator("#lease-table")).to_be_visible()  # the view last asked for
        expect(page.locator("#login")).to_be_hidden()
        assert seen.failed == []
        clean(seen)


def test_a_reader_is_offered_no_change_the_policy_refuses(
    browser: Browser, settings: Settings, sqlite_url: str
) -> None:
    with token_server(settings, sqlite_url) as server:
        _, alice, theirs = alice_s_lease(server, "team-run")
        rita = issue(server, "rita", "project-a", ["reader"])
        seen = opened(browser, server)
        page = seen.page
        log_in(page, rita)
        drawn(seen)
        expect(page.locator("#who")).to_have_text("project reader (read only)")
        expect(page.locator("#nav-new")).to_be_hidden()
        page.goto(f"{server.url}/ui/#/lease/{theirs['id']}")
        expect(page.locator("#lease-title")).to_have_text("team-run")
        for button in ("#lease-extend", "#lease-shrink", "#lease-save", "#lease-delete"):
            expect(page.locator(button)).to_be_disabled()
        page.goto(f"{server.url}/ui/#/new")
        expect(page.locator("#status")).to_contain_text("blazar:leases:post")
        expect(page.locator("#new-create")).to_be_disabled()
        page.wait_for_load_state("networkidle")
        assert seen.failed == []
        clean(seen)
        with client(server, {"X-Auth-Token": alice}) as member:
            assert member.get(f"/v1/leases/{theirs['id']}").status_code == 200


def test_a_token_refused_for_its_scope_is_said_on_the_token_form(
    browser: Browser, settings: Settings, sqlite_url: str
) -> None:
    """Keystone refuses a token without a project with a 403 naming why (not a 401): the token
    form says so, and the page raises nothing."""
    message = "a project-scoped token is required (Blazar's rules have project scope)"
    with token_server(settings, sqlite_url) as server:
        seen = opened(browser, server)
        page = seen.page
        expect(page.locator("#login")).to_be_visible()
        body = {"error_code": 403, "error_message": message, "error_name": 403}
        page.route(
            "**/v1/policy/caller",
            lambda route: route.fulfill(status=403, json=body),
        )
        log_in(page, "a-domain-scoped-keystone-token")
        expect(page.locator("#status")).to_have_text(message)
        expect(page.locator("#login")).to_be_visible()
        assert page.evaluate("sessionStorage.getItem('climate-token')") is None
        assert seen.failed == ["GET /v1/policy/caller 403"]
        clean(seen)


def test_with_a_token_the_calendar_feed_is_saved_not_refused(
    browser: Browser, settings: Settings, sqlite_url: str
) -> None:
    with token_server(settings, sqlite_url) as server:
        _, alice, _ = alice_s_lease(server, "in-my-calendar")
        seen = watched(browser, server.url)
        page = seen.page
        page.context.add_init_script(f"sessionStorage.setItem('climate-token', '{alice}')")
        page.goto(f"{server.url}/ui/#/leases")
        expect(page.locator("#lease-table tbody tr")).to_have_count(1)
        with page.expect_download() as download:
            page.click("#feed-link")
        saved = download.value
        assert saved.suggested_filename == "climate-leases.ics"
        text = Path(saved.path()).read_text()
        assert text.startswith("BEGIN:VCALENDAR") and "in-my-calendar" in text
        expect(page.locator("#status")).to_have_text("calendar feed saved as climate-leases.ics")
        assert page.url.startswith(f"{server.url}/ui/")  # still on the dashboard
        assert seen.failed == []
        clean(seen)


def test_markup_in_names_is_shown_as_text(browser: Browser, live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin:
        created(admin.post("/v1/os-hosts", json={"name": "compute-1", "note": MARKUP}), "host")
        made = created(
            admin.post("/v1/leases", json=lease(MARKUP, minute(HOUR), minute(DAY))), "lease"
        )
    seen = opened(browser, live_sqlite)
    drawn(seen)
    page = seen.page
    expect(page.locator(".vis-item.bar", has_text=MARKUP)).to_be_visible()
    page.goto(f"{live_sqlite.url}/ui/#/lease/{made['id']}")
    expect(page.locator("#lease-title")).to_have_text(MARKUP)
    page.click("a[data-view=leases]")
    expect(page.locator("#lease-table tbody")).to_contain_text(MARKUP)
    page.click("a[data-view=admin]")
    expect(page.locator("#admin-table tbody")).to_contain_text(MARKUP)
    seen.shot("markup-as-text")
    assert page.evaluate("window.pwned") is None
    assert page.locator("main img, main b").count() == 0
    clean(seen)


def test_a_lease_page_that_fails_to_load_shows_and_acts_on_nothing(
    browser: Browser, live_sqlite: LiveServer
) -> None:
    end = minute(3 * HOUR)
    with client(live_sqlite) as admin:
        hosts(admin, "compute-1")
        made = created(admin.post("/v1/leases", json=lease("kept", minute(HOUR), end)), "lease")
    seen = opened(browser, live_sqlite, f"#/lease/{made['id']}")
    page = seen.page
    expect(page.locator("#lease-title")).to_have_text("kept")
    page.goto(f"{live_sqlite.url}/ui/#/lease/no-such-lease")
    expect(page.locator("#status")).to_contain_text("could not be found")
    expect(page.locator("#lease-title")).to_have_text("")
    expect(page.locator("#lease-fields")).to_be_empty()
    for button in ("#lease-extend", "#lease-shrink", "#lease-delete", "#lease-save"):
        expect(page.locator(button)).to_be_disabled()
    with client(live_sqlite) as admin:
        shown = admin.get(f"/v1/leases/{made['id']}").json()["lease"]
    assert shown["end_date"].startswith(end.strftime("%Y-%m-%dT%H:%M"))
    page.goto(f"{live_sqlite.url}/ui/#/lease/{made['id']}")
    expect(page.locator("#lease-extend")).to_be_enabled()
    clean(seen)


def test_the_timeline_shows_what_changed_when_visited_again(
    browser: Browser, live_sqlite: LiveServer
) -> None:
    with client(live_sqlite) as admin:
        hosts(admin, "compute-1", "compute-2")
        gone = created(
            admin.post("/v1/leases", json=lease("to-delete", minute(HOUR), minute(DAY))), "lease"
        )
    seen = opened(browser, live_sqlite)
    drawn(seen)
    page = seen.page
    expect(page.locator(".vis-item.bar", has_text="to-delete")).to_be_visible()
    page.click("a[data-view=leases]")
    with client(live_sqlite) as admin:
        assert admin.delete(f"/v1/leases/{gone['id']}").status_code == 204
        created(
            admin.post("/v1/leases", json=lease("made-meanwhile", minute(HOUR), minute(DAY))),
            "lease",
        )
    page.click("a[data-view=timeline]")
    expect(page.locator(".vis-item.bar", has_text="made-meanwhile")).to_be_visible()
    expect(page.locator(".vis-item.bar", has_text="to-delete")).to_have_count(0)
    clean(seen)


def test_the_time_axis_is_utc_in_any_browser_time_zone(
    browser: Browser, live_sqlite: LiveServer
) -> None:
    with client(live_sqlite) as admin:
        hosts(admin, "compute-1")
    seen = opened(browser, live_sqlite, timezone="Asia/Kolkata")  # UTC+05:30
    drawn(seen)
    page = seen.page
    page.click("text=6 h")
    drawn(seen)
    # The window runs from an hour ago to five hours on: the next whole UTC hour is on the
    # axis. Labelled in Kolkata's time, the hours shown would be five to ten hours later.
    next_hour = (dt.datetime.now(dt.UTC) + HOUR).strftime("%H:00")
    labels = page.locator(".vis-time-axis .vis-text.vis-minor").all_inner_texts()
    assert next_hour in [label.strip() for label in labels], labels
    clean(seen)


def test_a_bar_s_border_shows_its_lease_s_status(browser: Browser, live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin:
        hosts(admin, "compute-1", "compute-2")
        now = minute(dt.timedelta(0))
        running = created(
            admin.post("/v1/leases", json=lease("running", now, minute(DAY))), "lease"
        )
        created(admin.post("/v1/leases", json=lease("later", minute(HOUR), minute(DAY))), "lease")
        for _ in range(100):
            if admin.get(f"/v1/leases/{running['id']}").json()["lease"]["status"] == "ACTIVE":
                break
            time.sleep(0.1)
    seen = opened(browser, live_sqlite)
    drawn(seen)
    page = seen.page

    def border(name: str) -> list[str]:
        found: list[str] = page.locator(".vis-item.bar", has_text=name).evaluate(
            "bar => { const s = getComputedStyle(bar);"
            " return [s.borderTopColor, s.borderTopStyle, s.borderTopWidth]; }"
        )
        return found

    assert border("running") == ["rgb(17, 24, 39)", "solid", "2px"]  # active: dark, bold
    assert border("later")[1] == "dashed"  # pending
    clean(seen)


def test_the_lease_list_counts_what_its_filters_show(
    browser: Browser, live_sqlite: LiveServer
) -> None:
    with client(live_sqlite) as admin:
        hosts(admin, "compute-1", "compute-2")
        for name in ("alpha", "beta"):
            created(
                admin.post("/v1/leases", json=lease(name, minute(HOUR), minute(2 * HOUR))), "lease"
            )
    seen = opened(browser, live_sqlite, "#/leases")
    page = seen.page
    expect(page.locator("#lease-table tbody tr")).to_have_count(2)
    page.fill("#filter-name", "alp")
    page.click("#lease-filters button[type=submit]")
    expect(page.locator("#status")).to_have_text("1 lease(s)")
    page.fill("#filter-name", "nothing-like-it")
    page.click("#lease-filters button[type=submit]")
    expect(page.locator("#status")).to_have_text("0 lease(s)")
    expect(page.locator("#lease-table tbody")).to_have_text("No lease matches.")
    clean(seen)


def test_enter_in_the_row_filter_filters_and_sends_nothing(
    browser: Browser, live_sqlite: LiveServer
) -> None:
    with client(live_sqlite) as admin:
        hosts(admin, "compute-1", "gpu-1")
    seen = opened(browser, live_sqlite)
    drawn(seen)
    page = seen.page
    page.fill("#rows-filter", "gpu")
    page.press("#rows-filter", "Enter")
    expect(page.locator(".vis-label")).to_have_count(1)
    expect(page.locator("#rows-shown")).to_have_text("rows 1–1 of 1")
    clean(seen)  # a form sent would be the policy's form-action refusal, a console error


def test_floating_ips_are_booked_from_their_network(
    browser: Browser, live_sqlite: LiveServer
) -> None:
    with client(live_sqlite) as admin:
        for address in ("172.24.4.10", "172.24.4.11"):
            ip = {"floating_network_id": "public", "floating_ip_address": address}
            created(admin.post("/v1/floatingips", json=ip), "floatingip")
    seen = opened(browser, live_sqlite, "#/new")
    page = seen.page
    expect(page.locator("#new-network")).to_be_hidden()
    page.select_option("#new-type", "virtual:floatingip")
    expect(page.locator("#new-properties")).to_be_hidden()
    page.fill("#new-name", "two-addresses")
    page.fill("#new-count", "2")
    page.fill("#new-network", "public")
    page.fill("#new-start", field(minute(HOUR)))
    page.fill("#new-end", field(minute(3 * HOUR)))
    page.click("#new-create")
    expect(page.locator("#lease-title")).to_have_text("two-addresses")
    expect(page.locator("#lease-reservations")).to_contain_text("virtual:floatingip")
    expect(page.locator("#lease-reservations .allocations tbody tr")).to_have_count(2)
    clean(seen)


def test_a_date_left_empty_is_named_and_nothing_is_asked(
    browser: Browser, live_sqlite: LiveServer
) -> None:
    with client(live_sqlite) as admin:
        hosts(admin, "compute-1")
        made = created(
            admin.post("/v1/leases", json=lease("dated", minute(HOUR), minute(DAY))), "lease"
        )
    seen = opened(browser, live_sqlite, f"#/lease/{made['id']}")
    page = seen.page
    expect(page.locator("#lease-title")).to_have_text("dated")
    page.fill("#lease-end", "")
    page.click("#lease-save")
    expect(page.locator("#status")).to_have_text("end_date: a date and time is needed (UTC)")
    page.click("a[data-view=new]")
    page.fill("#new-start", "")
    page.click("#new-suggest")
    expect(page.locator("#status")).to_have_text("start_date: a date and time is needed (UTC)")
    page.wait_for_load_state("networkidle")
    assert seen.failed == []  # no bogus date (2000-01-01) sent to be refused
    with client(live_sqlite) as admin:
        assert admin.get(f"/v1/leases/{made['id']}").json()["lease"]["end_date"] == made["end_date"]
    clean(seen)


def test_instances_are_booked_from_the_form(browser: Browser, live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin:
        size = {"vcpus": 8, "memory_mb": 16384, "local_gb": 200}
        created(admin.post("/v1/os-hosts", json={"name": "compute-1", **size}), "host")
    seen = opened(browser, live_sqlite, "#/new")
    page = seen.page
    expect(page.locator("#new-vcpus")).to_be_hidden()
    page.select_option("#new-type", "virtual:instance")
    page.fill("#new-name", "two-vms")
    page.fill("#new-count", "2")
    page.fill("#new-vcpus", "2")
    page.fill("#new-memory", "2048")
    page.fill("#new-disk", "20")
    page.select_option("#new-affinity", "true")
    page.fill("#new-start", field(minute(HOUR)))
    page.fill("#new-end", field(minute(3 * HOUR)))
    page.click("#new-suggest")
    expect(page.locator("#new-windows li").first).to_contain_text("UTC")
    page.click("#new-create")
    expect(page.locator("#lease-title")).to_have_text("two-vms")
    reservations = page.locator("#lease-reservations")
    expect(reservations).to_contain_text("virtual:instance")
    expect(reservations.locator(".allocations tbody")).to_contain_text("compute-1 × 2")
    with client(live_sqlite) as admin:
        [made] = admin.get("/v1/leases").json()["leases"]
    [reservation] = made["reservations"]
    assert (reservation["vcpus"], reservation["memory_mb"], reservation["disk_gb"]) == (2, 2048, 20)
    assert reservation["affinity"] is True
    clean(seen)


def test_a_held_lease_is_confirmed_from_its_page(browser: Browser, live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin:
        hosts(admin, "compute-1")
        body = {**lease("on-hold", minute(HOUR), minute(DAY)), "hold": {"expires_in": 600}}
        made = created(admin.post("/v1/leases", json=body), "lease")
    seen = opened(browser, live_sqlite, f"#/lease/{made['id']}")
    page = seen.page
    expect(page.locator("#lease-fields")).to_contain_text("hold_expires_at")
    expect(page.locator("#lease-extend")).to_be_hidden()  # a hold is confirmed, not changed
    page.click("#lease-confirm")
    expect(page.locator("#status")).to_have_text("hold confirmed")
    expect(page.locator("#lease-confirm")).to_be_hidden()
    expect(page.locator("#lease-extend")).to_be_visible()
    with client(live_sqlite) as admin:
        assert admin.get(f"/v1/leases/{made['id']}").json()["lease"]["status"] == "PENDING"
    page.click("#lease-save")  # the dates as they were
    expect(page.locator("#status")).to_have_text("the dates are as they were: nothing to save")
    clean(seen)


def test_a_lease_page_names_its_hosts_for_an_admin(
    browser: Browser, live_sqlite: LiveServer
) -> None:
    with client(live_sqlite) as admin:
        hosts(admin, "compute-named")
        made = created(
            admin.post("/v1/leases", json=lease("named", minute(HOUR), minute(DAY))), "lease"
        )
    seen = opened(browser, live_sqlite, f"#/lease/{made['id']}")
    expect(seen.page.locator("#lease-reservations .allocations tbody")).to_contain_text(
        "compute-named"
    )
    clean(seen)


def test_a_phone_wide_page_does_not_scroll_sideways(
    browser: Browser, live_sqlite: LiveServer
) -> None:
    with client(live_sqlite) as admin:
        hosts(admin, "compute-with-a-rather-long-name-for-a-small-screen", "compute-2")
        created(admin.post("/v1/leases", json=lease("phone", minute(HOUR), minute(DAY))), "lease")
    seen = opened(browser, live_sqlite, "#/new", width=375)
    page = seen.page
    expect(page.locator("#new-name")).to_be_visible()
    for view in ("#/new", "#/leases", "#/admin"):
        page.goto(f"{live_sqlite.url}/ui/{view}")
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 375, (view, width)
    clean(seen)


def test_a_wide_inventory_scrolls_inside_its_table_on_a_desktop(
    browser: Browser, live_sqlite: LiveServer
) -> None:
    extra = {f"property_{i}": f"a-rather-long-value-number-{i}" for i in range(12)}
    with client(live_sqlite) as admin:
        made = admin.post("/v1/os-hosts", json={"name": "compute-1", "vcpus": 8, **extra})
        created(made, "host")
    seen = opened(browser, live_sqlite, "#/admin", width=1280)
    page = seen.page
    expect(page.locator("#admin-table tbody tr")).to_have_count(1)
    table = page.locator("#admin-table")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280  # the page does not,
    assert table.evaluate("t => t.scrollWidth > t.clientWidth")  # the table scrolls sideways
    clean(seen)


def test_the_timeline_says_which_colour_is_whose(browser: Browser, live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin, client(live_sqlite, BOB) as bob:
        hosts(admin, "compute-1", "compute-2")
        created(admin.post("/v1/leases", json=lease("ops-run", minute(HOUR), minute(DAY))), "lease")
        created(bob.post("/v1/leases", json=lease("bob-run", minute(HOUR), minute(DAY))), "lease")
    seen = opened(browser, live_sqlite)
    drawn(seen)
    page = seen.page
    entries = page.locator("#tl-projects .project")
    expect(entries).to_have_count(2)
    colour = "el => getComputedStyle(el).backgroundColor"
    bar = page.locator(".vis-item.bar", has_text="bob-run").evaluate(colour)
    swatch = entries.filter(has_text="project-b").locator(".swatch").evaluate(colour)
    assert bar == swatch != "rgba(0, 0, 0, 0)"
    page.focus("[data-lease][aria-label^='lease bob-run']")  # a bar is focusable (tabindex 0)
    page.keyboard.press("Enter")
    expect(page.locator("#lease-title")).to_have_text("bob-run")
    clean(seen)


HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
