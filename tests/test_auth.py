"""Who may do what, over real HTTP: noauth identity headers, project scoping, API tokens."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from climate.config import Settings, load_settings
from climate.errors import InvalidInput
from climate.keystone import service_credentials
from climate.services.context import ServiceContext
from climate.services.tokens import TokenService
from tests.conftest import LiveServer, serve

ERROR_KEYS = {"error_code", "error_message", "error_name"}
ALICE = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
BOB = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
CAROL_ADMIN = {"X-Project-Id": "ops", "X-User-Id": "carol", "X-Roles": "member,admin"}


def fmt(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M")


T0 = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)


def lease_body(name: str, day: int = 1, query: str = "") -> dict[str, Any]:
    """A one-host lease for [T0 + day, T0 + day + 1 day)."""
    return {
        "name": name,
        "start_date": fmt(T0 + dt.timedelta(days=day)),
        "end_date": fmt(T0 + dt.timedelta(days=day + 1)),
        "reservations": [
            {
                "resource_type": "physical:host",
                "min": 1,
                "max": 1,
                "hypervisor_properties": "",
                "resource_properties": query,
            }
        ],
        "events": [],
    }


@contextlib.contextmanager
def client(server: LiveServer, headers: dict[str, str] | None = None) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=headers or {}, timeout=30) as http:
        yield http


def assert_error(response: httpx.Response, status: int, *mentions: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    body: dict[str, Any] = response.json()
    assert set(body) == ERROR_KEYS and body["error_code"] == status, body
    for mention in mentions:
        assert mention in body["error_message"], (mention, body)
    return body


def created(response: httpx.Response, key: str) -> dict[str, Any]:
    assert response.status_code == 201, response.text
    item: dict[str, Any] = response.json()[key]
    return item


def ids(response: httpx.Response) -> set[str]:
    assert response.status_code == 200, response.text
    return {lease["id"] for lease in response.json()["leases"]}


# -- noauth --------------------------------------------------------------------------------------


def test_no_identity_headers_is_the_default_admin(live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin:
        created(admin.post("/v1/os-hosts", json={"name": "compute-0"}), "host")
        lease = created(admin.post("/v1/leases", json=lease_body("mine")), "lease")
    settings = live_sqlite.ctx.settings
    assert (lease["project_id"], lease["user_id"]) == (
        settings.default_project_id,
        settings.default_user_id,
    )


def test_identity_headers_act_as_that_member(live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin:
        created(admin.post("/v1/os-hosts", json={"name": "compute-0"}), "host")
    with client(live_sqlite, ALICE) as alice:
        lease = created(alice.post("/v1/leases", json=lease_body("hers")), "lease")
        assert (lease["project_id"], lease["user_id"]) == ("project-a", "alice")
        # A member is no admin: no host management.
        assert_error(alice.get("/v1/os-hosts"), 403)
    # A project header without roles is a member too, never the default admin.
    with client(live_sqlite, {"X-Project-Id": "project-a"}) as roleless:
        assert_error(roleless.post("/v1/os-hosts", json={"name": "x"}), 403)
        assert ids(roleless.get("/v1/leases")) == {lease["id"]}
    # An admin role in the headers is an admin, whatever the project.
    with client(live_sqlite, CAROL_ADMIN) as carol:
        assert carol.get("/v1/os-hosts").status_code == 200
        assert ids(carol.get("/v1/leases")) == {lease["id"]}


def test_identity_headers_without_a_project_are_refused(live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin:
        created(admin.post("/v1/os-hosts", json={"name": "compute-0"}), "host")
        created(admin.post("/v1/leases", json=lease_body("default-project")), "lease")
    # Half an identity would otherwise borrow the default project and see its leases.
    for headers in ({"X-User-Id": "mallory"}, {"X-Roles": "member"}):
        with client(live_sqlite, headers) as partial:
            assert_error(partial.get("/v1/leases"), 401, "X-Project-Id")


def test_members_see_and_touch_only_their_own_project(live: LiveServer) -> None:
    with client(live) as admin:
        for i in range(2):
            created(admin.post("/v1/os-hosts", json={"name": f"compute-{i}"}), "host")
    with client(live, ALICE) as alice, client(live, BOB) as bob, client(live) as admin:
        hers = created(alice.post("/v1/leases", json=lease_body("same-name")), "lease")
        # Names are per project: Bob may use the same one.
        his = created(bob.post("/v1/leases", json=lease_body("same-name")), "lease")

        assert ids(alice.get("/v1/leases")) == {hers["id"]}
        assert ids(bob.get("/v1/leases")) == {his["id"]}
        assert ids(bob.get("/v1/leases?project_id=project-a")) == set()
        assert ids(admin.get("/v1/leases")) == {hers["id"], his["id"]}
        assert ids(admin.get("/v1/leases?project_id=project-a")) == {hers["id"]}

        # Another project's lease is "not found", exactly like one that does not exist.
        missing = "00000000-0000-4000-8000-000000000000"
        path = f"/v1/leases/{hers['id']}"
        for method, body in (("GET", None), ("PUT", {"name": "stolen"}), ("DELETE", None)):
            refused = assert_error(bob.request(method, path, json=body), 404)
            unknown = assert_error(bob.request(method, f"/v1/leases/{missing}", json=body), 404)
            assert refused["error_message"] == unknown["error_message"].replace(missing, hers["id"])
            assert refused["error_name"] == unknown["error_name"]

        unchanged = alice.get(path)
        assert unchanged.status_code == 200
        assert unchanged.json()["lease"] == hers
        assert admin.get(path).json()["lease"] == hers
        # The admin may change and delete anyone's lease.
        assert admin.put(path, json={"name": "by-admin"}).json()["lease"]["name"] == "by-admin"
        assert admin.delete(path).status_code == 204
        assert_error(alice.get(path), 404)


def test_members_cannot_manage_hosts(live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin:
        host = created(admin.post("/v1/os-hosts", json={"name": "compute-0", "gpu": "a"}), "host")
        before = admin.get(f"/v1/os-hosts/{host['id']}").json()
    with client(live_sqlite, ALICE) as alice:
        for method, path, body in (
            ("POST", "/v1/os-hosts", {"name": "compute-9"}),
            ("PUT", f"/v1/os-hosts/{host['id']}", {"vcpus": 4}),
            ("DELETE", f"/v1/os-hosts/{host['id']}", None),
            ("PATCH", "/v1/os-hosts/properties/gpu", {"private": True}),
            ("GET", "/v1/os-hosts", None),
            ("GET", f"/v1/os-hosts/{host['id']}", None),
        ):
            body_ = assert_error(alice.request(method, path, json=body), 403)
            assert body_["error_name"] == 403
    with client(live_sqlite) as admin:
        assert admin.get(f"/v1/os-hosts/{host['id']}").json() == before
        assert [h["hypervisor_hostname"] for h in admin.get("/v1/os-hosts").json()["hosts"]] == [
            "compute-0"
        ]
        listed = admin.get("/v1/os-hosts/properties?detail=True&all=True").json()
        assert listed["resource_properties"][0]["private"] is False


def test_private_properties_are_hidden_unless_an_admin_asks_for_all(
    live_sqlite: LiveServer,
) -> None:
    with client(live_sqlite) as admin:
        created(
            admin.post("/v1/os-hosts", json={"name": "c0", "gpu": "a100", "rack": "r1"}), "host"
        )
        created(
            admin.post("/v1/os-hosts", json={"name": "c1", "gpu": "v100", "rack": "r2"}), "host"
        )
        response = admin.patch("/v1/os-hosts/properties/rack", json={"private": True})
        assert response.status_code == 200, response.text
        setting = response.json()["resource_property"]
        assert (setting["property_name"], setting["private"]) == ("rack", True)
        # As in Blazar, an empty update answers the property as it is.
        for name, private in (("rack", True), ("gpu", False)):
            response = admin.patch(f"/v1/os-hosts/properties/{name}", json={})
            assert response.status_code == 200, response.text
            shown = response.json()["resource_property"]
            assert (shown["property_name"], shown["private"]) == (name, private)

        def names(http: httpx.Client, query: str) -> list[Any]:
            response = http.get(f"/v1/os-hosts/properties{query}")
            assert response.status_code == 200, response.text
            return list(response.json()["resource_properties"])

        with client(live_sqlite, ALICE) as alice:
            assert names(alice, "") == [{"property": "gpu"}]
            assert names(alice, "?detail=True") == [
                {"property": "gpu", "private": False, "values": ["a100", "v100"]}
            ]
            # all=True is an admin's privilege: a member asking still sees no private ones.
            assert names(alice, "?detail=True&all=True") == names(alice, "?detail=True")
        assert names(admin, "?detail=True") == [
            {"property": "gpu", "private": False, "values": ["a100", "v100"]}
        ]
        assert names(admin, "?detail=True&all=True") == [
            {"property": "gpu", "private": False, "values": ["a100", "v100"]},
            {"property": "rack", "private": True, "values": ["r1", "r2"]},
        ]
        assert names(admin, "?all=true") == [{"property": "gpu"}, {"property": "rack"}]

        assert admin.patch("/v1/os-hosts/properties/rack", json={"private": False}).is_success
        with client(live_sqlite, ALICE) as alice:
            assert names(alice, "") == [{"property": "gpu"}, {"property": "rack"}]


def test_members_see_only_their_own_allocations(live: LiveServer) -> None:
    with client(live) as admin, client(live, ALICE) as alice, client(live, BOB) as bob:
        hosts = [
            created(admin.post("/v1/os-hosts", json={"name": f"c{i}", "slot": str(i)}), "host")
            for i in range(2)
        ]
        hers = created(
            alice.post("/v1/leases", json=lease_body("a", query='["==", "$slot", "0"]')), "lease"
        )
        his = created(
            bob.post("/v1/leases", json=lease_body("b", query='["==", "$slot", "1"]')), "lease"
        )

        def leases_in(http: httpx.Client, path: str) -> dict[str, set[str]]:
            response = http.get(path)
            assert response.status_code == 200, response.text
            body = response.json()
            found = body["allocations"] if "allocations" in body else [body["allocation"]]
            return {a["resource_id"]: {r["lease_id"] for r in a["reservations"]} for a in found}

        everything = {hosts[0]["id"]: {hers["id"]}, hosts[1]["id"]: {his["id"]}}
        assert leases_in(admin, "/v1/os-hosts/allocations") == everything
        assert leases_in(alice, "/v1/os-hosts/allocations") == {
            hosts[0]["id"]: {hers["id"]},
            hosts[1]["id"]: set(),
        }
        assert leases_in(bob, "/v1/os-hosts/allocations") == {
            hosts[0]["id"]: set(),
            hosts[1]["id"]: {his["id"]},
        }
        assert leases_in(alice, f"/v1/os-hosts/allocations?lease_id={his['id']}") == {
            hosts[0]["id"]: set(),
            hosts[1]["id"]: set(),
        }
        assert leases_in(alice, f"/v1/os-hosts/{hosts[1]['id']}/allocation") == {
            hosts[1]["id"]: set()
        }
        assert leases_in(admin, f"/v1/os-hosts/{hosts[1]['id']}/allocation") == {
            hosts[1]["id"]: {his["id"]}
        }


# -- tokens --------------------------------------------------------------------------------------


@contextlib.contextmanager
def token_server(settings: Settings, url: str) -> Iterator[LiveServer]:
    with serve(settings.model_copy(update={"auth": "token"}), url) as server:
        yield server


@pytest.fixture
def token_live(settings: Settings, sqlite_url: str) -> Iterator[LiveServer]:
    with token_server(settings, sqlite_url) as server:
        yield server


def issue(server: LiveServer, name: str, project: str, roles: list[str], **kw: Any) -> str:
    return TokenService(server.ctx).issue(name, f"user-{name}", project, roles, **kw).token


def test_token_mode_end_to_end(settings: Settings, database_url: str) -> None:
    with token_server(settings, database_url) as server:
        admin = issue(server, "ops", "ops", ["admin"])
        alice = issue(server, "alice", "project-a", ["member"])
        bob = issue(server, "bob", "project-b", ["member"])
        with (
            client(server, {"X-Auth-Token": admin}) as as_admin,
            client(server, {"X-Auth-Token": alice}) as as_alice,
            client(server, {"X-Auth-Token": bob}) as as_bob,
            client(server) as anonymous,
        ):
            assert_error(anonymous.get("/v1/leases"), 401)
            host = created(as_admin.post("/v1/os-hosts", json={"name": "compute-0"}), "host")
            lease = created(as_alice.post("/v1/leases", json=lease_body("t")), "lease")
            assert (lease["project_id"], lease["user_id"]) == ("project-a", "user-alice")
            assert ids(as_alice.get("/v1/leases")) == {lease["id"]}
            assert ids(as_bob.get("/v1/leases")) == set()
            assert_error(as_bob.get(f"/v1/leases/{lease['id']}"), 404)
            assert ids(as_admin.get("/v1/leases")) == {lease["id"]}
            assert_error(as_alice.post("/v1/os-hosts", json={"name": "x"}), 403)
            assert as_alice.delete(f"/v1/leases/{lease['id']}").status_code == 204
            assert as_admin.delete(f"/v1/os-hosts/{host['id']}").status_code == 204


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/leases"),
        ("POST", "/v1/leases"),
        ("GET", "/v1/leases/00000000-0000-4000-8000-000000000000"),
        ("DELETE", "/v1/leases/00000000-0000-4000-8000-000000000000"),
        ("GET", "/v1/os-hosts"),
        ("POST", "/v1/os-hosts"),
        ("GET", "/v1/os-hosts/allocations"),
        ("GET", "/v1/os-hosts/properties"),
        ("PATCH", "/v1/os-hosts/properties/gpu"),
    ],
)
def test_every_endpoint_wants_a_token(token_live: LiveServer, method: str, path: str) -> None:
    with client(token_live) as anonymous:
        body = assert_error(anonymous.request(method, path, json={"name": "x"}), 401)
        assert body["error_name"] == 401
        # noauth identity headers mean nothing in token mode.
        spoofed = anonymous.request(method, path, json={"name": "x"}, headers=CAROL_ADMIN)
        assert_error(spoofed, 401)


def test_bad_tokens_are_401(token_live: LiveServer) -> None:
    tokens = TokenService(token_live.ctx)
    good = tokens.issue("good", "u", "project-a", ["member"])
    prefix, token_id, secret = good.token.split("_", 2)
    other = tokens.issue("other", "u", "project-a", ["member"]).token
    wrong = [
        "",
        "nonsense",
        "clm_",
        "clm__",
        f"{prefix}_{token_id}_",
        f"{prefix}_{token_id}_{secret}x",
        f"{prefix}_{token_id}_{secret[:-1]}",
        f"{prefix}_{token_id}_{other.split('_', 2)[2]}",  # another token's secret
        f"{prefix}_{'0' * 16}_{secret}",
        f"xyz_{token_id}_{secret}",
        "clm_" + "a" * 5000 + "_b",
    ]
    with client(token_live) as http:
        for presented in wrong:
            response = http.get("/v1/leases", headers={"X-Auth-Token": presented})
            assert_error(response, 401)
        assert http.get("/v1/leases", headers={"X-Auth-Token": good.token}).status_code == 200


def test_revoked_token_is_401(token_live: LiveServer) -> None:
    tokens = TokenService(token_live.ctx)
    issued = tokens.issue("soon-revoked", "u", "project-a", ["admin"])
    with client(token_live, {"X-Auth-Token": issued.token}) as http:
        assert http.get("/v1/os-hosts").status_code == 200
        tokens.revoke(issued.row.id)
        assert_error(http.get("/v1/os-hosts"), 401)
        assert_error(http.get("/v1/leases"), 401)


def test_expired_token_is_401(token_live: LiveServer) -> None:
    tokens = TokenService(token_live.ctx)
    expired = tokens.issue("old", "u", "p", ["member"], expires_in=dt.timedelta(seconds=-1))
    fresh = tokens.issue("new", "u", "p", ["member"], expires_in=dt.timedelta(hours=1))
    with client(token_live) as http:
        assert_error(http.get("/v1/leases", headers={"X-Auth-Token": expired.token}), 401)
        assert http.get("/v1/leases", headers={"X-Auth-Token": fresh.token}).status_code == 200


def test_member_token_is_scoped_to_its_project_whatever_the_headers(
    token_live: LiveServer,
) -> None:
    admin = issue(token_live, "ops", "ops", ["admin"])
    member = issue(token_live, "alice", "project-a", ["member"])
    with client(token_live, {"X-Auth-Token": admin}) as as_admin:
        created(as_admin.post("/v1/os-hosts", json={"name": "compute-0"}), "host")
        created(as_admin.post("/v1/leases", json=lease_body("ops-lease")), "lease")
    spoof = {"X-Auth-Token": member, **CAROL_ADMIN}
    with client(token_live, spoof) as as_member:
        assert_error(as_member.post("/v1/os-hosts", json={"name": "x"}), 403)
        assert ids(as_member.get("/v1/leases")) == set()
        lease = created(as_member.post("/v1/leases", json=lease_body("mine", day=3)), "lease")
        assert (lease["project_id"], lease["user_id"]) == ("project-a", "user-alice")


def test_admin_token_manages_hosts(token_live: LiveServer) -> None:
    admin = issue(token_live, "ops", "ops", ["admin", "member"])
    with client(token_live, {"X-Auth-Token": admin}) as http:
        host = created(http.post("/v1/os-hosts", json={"name": "compute-0", "gpu": "a"}), "host")
        response = http.put(f"/v1/os-hosts/{host['id']}", json={"vcpus": 8})
        assert response.status_code == 200 and response.json()["host"]["vcpus"] == 8
        assert http.patch("/v1/os-hosts/properties/gpu", json={"private": True}).is_success
        listed = http.get("/v1/os-hosts/properties?detail=True&all=True").json()
        assert listed["resource_properties"][0]["private"] is True
        assert http.delete(f"/v1/os-hosts/{host['id']}").status_code == 204
        assert http.get("/v1/os-hosts").json() == {"hosts": []}


def test_tokens_are_stored_hashed(settings: Settings, database_url: str) -> None:
    with token_server(settings, database_url) as server:
        issued = TokenService(server.ctx).issue("stored", "u", "p", ["member"])
        secret = issued.token.split("_", 2)[2]
        with server.ctx.db.reader() as session:
            rows = [dict(r._mapping) for r in session.execute(text("SELECT * FROM api_tokens"))]
    (row,) = rows
    assert row["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    for value in row.values():
        assert secret not in str(value)
        assert issued.token not in str(value)


# -- binding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.org"])
def test_noauth_refuses_a_public_address_unless_forced(host: str) -> None:
    settings = load_settings(env={})
    assert settings.auth == "noauth"
    with pytest.raises(InvalidInput) as refused:
        settings.check_bind(host)
    assert refused.value.field == "bind_host"
    assert host in refused.value.message
    settings.check_bind(host, force=True)
    load_settings(env={}, allow_noauth_public=True).check_bind(host)
    load_settings(env={"CLIMATE_ALLOW_NOAUTH_PUBLIC": "true"}).check_bind(host)
    load_settings(env={}, auth="token").check_bind(host)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_noauth_may_listen_on_loopback(host: str) -> None:
    load_settings(env={}).check_bind(host)


# -- keystone settings (the live checks are in tests/openstack/test_keystone.py) -----------------


def test_keystone_service_user_comes_from_the_file_or_os_variables_a_missing_key_is_named(
    tmp_path: Path,
) -> None:
    config = tmp_path / "climate.toml"
    config.write_text(
        '[climate]\nauth = "keystone"\nos_auth_url = "http://keystone:5000/v3"\n'
        'os_username = "climate"\nos_password = "from-file"\nos_project_name = "service"\n'
        'os_user_domain_name = "Default"\n'
    )
    with pytest.raises(InvalidInput, match=r"OS_PROJECT_DOMAIN_NAME \(os_project_domain_name\)"):
        load_settings(str(config), env={})
    env = {"OS_PROJECT_DOMAIN_NAME": "Default", "OS_PASSWORD": "from-env"}
    credentials = service_credentials(load_settings(str(config), env=env))
    assert credentials.auth["project_domain_name"] == "Default"
    assert credentials.auth["password"] == "from-env"
    both = {**env, "CLIMATE_OS_PASSWORD": "from-climate-variable"}
    assert service_credentials(load_settings(str(config), env=both)).auth["password"] == (
        "from-climate-variable"
    )
    with pytest.raises(InvalidInput, match=r"OS_AUTH_TYPE \(os_auth_type\)"):
        load_settings(str(config), env={**env, "OS_AUTH_TYPE": "token"})
    # Noauth ignores the OS_* variables an operator's shell may hold.
    assert load_settings(env={"OS_AUTH_URL": "x"}).auth == "noauth"


def test_a_zero_lifetime_is_not_a_token_that_never_expires(ctx: ServiceContext) -> None:
    tokens = TokenService(ctx)
    issued = tokens.issue("t", "u", "p", ["member"], dt.timedelta(0))
    (row,) = [t for t in tokens.list_all() if t.id == issued.row.id]
    assert row.expires_at is not None
