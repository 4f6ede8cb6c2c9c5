"""``auth = "keystone"`` against the rig's real Keystone: tokens validated by keystonemiddleware,
project, user and roles from the token, Blazar's secure-RBAC defaults, and the ``blazar`` and
``openstack reservation`` commands finding Climate through the Keystone catalog.

Every user, project, region and catalog entry made here has a unique name and is removed at the
end: another suite shares the rig. Climate's endpoint goes into a region of its own, so that
another ``reservation`` endpoint registered on the shared rig meanwhile is never the one found."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from climate.api.auth import Authenticator
from climate.config import Settings, load_settings
from climate.errors import InvalidInput
from climate.keystone import service_credentials
from tests.conftest import LiveServer, free_port, serve
from tests.test_auth import assert_error, created, ids, lease_body
from tests.test_blazar_cli import Blazar

BIN = Path(sys.executable).parent


@dataclass
class Identity:
    name: str
    password: str
    project: str
    user_id: str = ""
    project_id: str = ""


class KeystoneAdmin:
    """The rig's admin, over Keystone's REST API; remembers what it made, to delete it."""

    def __init__(self, auth_url: str) -> None:
        self.auth_url = auth_url
        self.http = httpx.Client(base_url=auth_url, timeout=30)
        self.http.headers["X-Auth-Token"] = self.token(Identity("admin", "admin", "admin"))
        self.made: list[str] = []

    def token(self, who: Identity) -> str:
        scope = {"project": {"name": who.project, "domain": {"id": "default"}}}
        user = {"name": who.name, "domain": {"id": "default"}, "password": who.password}
        identity = {"methods": ["password"], "password": {"user": user}}
        return self.issue({"identity": identity, "scope": scope})

    def issue(self, auth: dict[str, Any]) -> str:
        response = httpx.post(f"{self.auth_url}/auth/tokens", json={"auth": auth}, timeout=30)
        assert response.status_code == 201, response.text
        return response.headers["X-Subject-Token"]

    def create(self, path: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post(path, json={key: body})
        assert response.status_code == 201, response.text
        item: dict[str, Any] = response.json()[key]
        self.made.append(f"{path}/{item['id']}")
        return item

    def find(self, path: str, key: str, name: str) -> str:
        found = self.http.get(path, params={"name": name}).json()[key]
        assert len(found) == 1, (path, name, found)
        return str(found[0]["id"])

    def user(self, name: str, project_id: str, *roles: str) -> Identity:
        who = Identity(name, f"pw-{uuid.uuid4().hex}", "")
        user = self.create("/users", "user", {"name": name, "password": who.password})
        for role in roles:
            role_id = self.find("/roles", "roles", role)
            response = self.http.put(f"/projects/{project_id}/users/{user['id']}/roles/{role_id}")
            assert response.status_code == 204, response.text
        project = self.http.get(f"/projects/{project_id}").json()["project"]
        return dataclasses.replace(
            who, project=project["name"], user_id=user["id"], project_id=project_id
        )

    def revoke(self, token: str) -> None:
        response = self.http.delete("/auth/tokens", headers={"X-Subject-Token": token})
        assert response.status_code == 204, response.text

    def clean_up(self) -> None:
        for path in reversed(self.made):
            self.http.delete(path)
        self.http.close()


@dataclass
class Cloud:
    admin: KeystoneAdmin
    alice: Identity
    """member of project A"""
    rita: Identity
    """reader of project A"""
    bob: Identity
    """member of project B"""
    service: Identity
    """Climate's service user: role ``service`` in the project ``service``"""
    region: str


@pytest.fixture(scope="module")
def cloud(openstack_env: dict[str, str]) -> Iterator[Cloud]:
    admin = KeystoneAdmin(openstack_env["OS_AUTH_URL"])
    tag = uuid.uuid4().hex[:8]
    try:
        a = admin.create("/projects", "project", {"name": f"ks-a-{tag}", "domain_id": "default"})
        b = admin.create("/projects", "project", {"name": f"ks-b-{tag}", "domain_id": "default"})
        service_project = admin.find("/projects", "projects", "service")
        region = admin.create("/regions", "region", {"id": f"ks-{tag}"})["id"]
        yield Cloud(
            admin,
            alice=admin.user(f"ks-alice-{tag}", a["id"], "member"),
            rita=admin.user(f"ks-rita-{tag}", a["id"], "reader"),
            bob=admin.user(f"ks-bob-{tag}", b["id"], "member"),
            service=admin.user(f"ks-climate-{tag}", service_project, "service"),
            region=region,
        )
    finally:
        admin.clean_up()


def keystone_settings(settings: Settings, cloud: Cloud, **changes: Any) -> Settings:
    return settings.model_copy(
        update=dict(
            auth="keystone",
            os_auth_url=cloud.admin.auth_url,
            os_username=cloud.service.name,
            os_password=cloud.service.password,
            os_project_name="service",
            os_user_domain_name="Default",
            os_project_domain_name="Default",
            **changes,
        )
    )


@pytest.fixture
def server(cloud: Cloud, settings: Settings, sqlite_url: str) -> Iterator[LiveServer]:
    with serve(keystone_settings(settings, cloud), sqlite_url) as live:
        yield live


def as_(server: LiveServer, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"X-Auth-Token": token}, timeout=30)


def everything(server: LiveServer, cloud: Cloud) -> set[str]:
    """Every lease, as the cloud's admin sees them."""
    with as_(server, cloud.admin.token(Identity("admin", "admin", "admin"))) as admin:
        return ids(admin.get("/v1/leases"))


def test_members_manage_their_projects_leases_readers_read_admins_manage_hosts(
    server: LiveServer, cloud: Cloud
) -> None:
    admin_token = cloud.admin.token(Identity("admin", "admin", "admin"))
    with (
        as_(server, admin_token) as admin,
        as_(server, cloud.admin.token(cloud.alice)) as alice,
        as_(server, cloud.admin.token(cloud.rita)) as rita,
        as_(server, cloud.admin.token(cloud.bob)) as bob,
    ):
        created(admin.post("/v1/os-hosts", json={"name": "compute-9"}), "host")
        assert admin.get("/v1/os-hosts").status_code == 200
        lease = created(alice.post("/v1/leases", json=lease_body("hers")), "lease")
        # Project and user come from the token, not from headers a caller could forge.
        assert (lease["project_id"], lease["user_id"]) == (
            cloud.alice.project_id,
            cloud.alice.user_id,
        )
        assert ids(alice.get("/v1/leases")) == {lease["id"]}
        assert_error(alice.get("/v1/os-hosts"), 403, "blazar:oshosts:get")
        # A reader of the project reads its leases and changes nothing.
        assert ids(rita.get("/v1/leases")) == {lease["id"]}
        assert rita.get(f"/v1/leases/{lease['id']}").status_code == 200
        assert_error(rita.post("/v1/leases", json=lease_body("no", day=3)), 403, "leases:post")
        assert_error(rita.delete(f"/v1/leases/{lease['id']}"), 403, "blazar:leases:delete")
        # Another project's member does not even see it.
        assert ids(bob.get("/v1/leases")) == set()
        assert_error(bob.get(f"/v1/leases/{lease['id']}"), 404)
        assert_error(bob.put(f"/v1/leases/{lease['id']}", json={"name": "mine"}), 404)
        assert_error(bob.delete(f"/v1/leases/{lease['id']}"), 404)
        forged = {"X-Project-Id": cloud.alice.project_id, "X-Roles": "admin"}
        assert ids(bob.get("/v1/leases", headers=forged)) == set()
        assert ids(admin.get("/v1/leases")) == {lease["id"]}
        assert alice.get(f"/v1/leases/{lease['id']}").json()["lease"]["name"] == "hers"


def test_garbage_revoked_and_expired_tokens_are_401_and_write_nothing(
    server: LiveServer, cloud: Cloud
) -> None:
    alice_token = cloud.admin.token(cloud.alice)
    revoked = cloud.admin.token(cloud.alice)
    cloud.admin.revoke(revoked)
    # A token of an application credential ends with the credential: a real expired token.
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=8)
    credential = httpx.post(
        f"{cloud.admin.auth_url}/users/{cloud.alice.user_id}/application_credentials",
        headers={"X-Auth-Token": alice_token},
        json={
            "application_credential": {
                "name": f"short-{uuid.uuid4().hex[:8]}",
                "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        },
        timeout=30,
    ).json()["application_credential"]
    expiring = cloud.admin.issue(
        {
            "identity": {
                "methods": ["application_credential"],
                "application_credential": {
                    "id": credential["id"],
                    "secret": credential["secret"],
                },
            }
        }
    )
    time.sleep(max(0.0, (expires - dt.datetime.now(dt.UTC)).total_seconds()) + 1.5)
    before = everything(server, cloud)
    for token, why in (
        ("garbage", "invalid"),
        (revoked, "revoked"),
        (expiring, "expired"),
        (alice_token[:-4] + "AAAA", "invalid"),
    ):
        with as_(server, token) as caller:
            refused = caller.post("/v1/leases", json=lease_body(f"never-{why}"))
            body = assert_error(refused, 401, "invalid, expired or revoked")
            assert body["error_name"] == 401
            assert refused.headers["WWW-Authenticate"] == f'Keystone uri="{cloud.admin.auth_url}"'
            assert_error(caller.get("/v1/leases"), 401)
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        assert_error(anonymous.post("/v1/leases", json=lease_body("x")), 401, "X-Auth-Token")
        # noauth's identity headers mean nothing here.
        headers = {"X-Project-Id": cloud.alice.project_id, "X-Roles": "admin"}
        assert_error(anonymous.get("/v1/leases", headers=headers), 401)
    assert everything(server, cloud) == before


def openstack_env(cloud: Cloud, who: Identity) -> dict[str, str]:
    """The caller's environment with only ``who``'s Keystone credentials: no endpoint, no
    clouds.yaml; Climate is found in the catalog."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OS_")}
    env.update(
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        OS_AUTH_URL=cloud.admin.auth_url,
        OS_USERNAME=who.name,
        OS_PASSWORD=who.password,
        OS_PROJECT_NAME=who.project,
        OS_USER_DOMAIN_NAME="Default",
        OS_PROJECT_DOMAIN_NAME="Default",
        OS_REGION_NAME=cloud.region,
        OS_IDENTITY_API_VERSION="3",
        OS_AUTH_TYPE="password",  # the blazar command has no default (openstack does)
    )
    return env


@pytest.fixture
def catalogued(server: LiveServer, cloud: Cloud) -> Iterator[LiveServer]:
    """Climate registered in Keystone's catalog as Blazar is: service type ``reservation``,
    its ``/v1`` endpoint public in the region."""
    service = cloud.admin.create(
        "/services", "service", {"type": "reservation", "name": f"climate-{cloud.region}"}
    )
    endpoint = cloud.admin.create(
        "/endpoints",
        "endpoint",
        {
            "service_id": service["id"],
            "interface": "public",
            "region_id": cloud.region,
            "url": f"{server.url}/v1",
        },
    )
    try:
        yield server
    finally:
        for path in (f"/endpoints/{endpoint['id']}", f"/services/{service['id']}"):
            assert cloud.admin.http.delete(path).status_code == 204
            cloud.admin.made.remove(path)


def test_blazar_and_openstack_commands_find_climate_in_the_catalog(
    catalogued: LiveServer, cloud: Cloud
) -> None:
    admin = Blazar(openstack_env(cloud, Identity("admin", "admin", "admin")))
    alice = Blazar(openstack_env(cloud, cloud.alice))
    admin.ok("host-create", "compute-7")
    assert [h["hypervisor_hostname"] for h in admin.json("host-list")] == ["compute-7"]
    start = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    lease = alice.json(
        "lease-create",
        "--physical-reservation",
        "min=1,max=1",
        "--start-date",
        start.strftime("%Y-%m-%d %H:%M"),
        "--end-date",
        (start + dt.timedelta(hours=2)).strftime("%Y-%m-%d %H:%M"),
        "cli-lease",
    )
    assert lease["project_id"] == cloud.alice.project_id
    assert [item["name"] for item in alice.json("lease-list")] == ["cli-lease"]
    assert "blazar:oshosts:get" in alice.fails("host-list")
    listed = subprocess.run(
        [str(BIN / "openstack"), "reservation", "lease", "list", "-f", "json"],
        env=openstack_env(cloud, cloud.alice),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert [item["name"] for item in json.loads(listed.stdout)] == ["cli-lease"]
    bob = Blazar(openstack_env(cloud, cloud.bob))
    assert bob.json("lease-list") == []


def serve_env(cloud: Cloud, tmp_path: Path, **changes: str) -> dict[str, str]:
    """An operator's shell: the service user's OS_* variables, CLIMATE_AUTH and a data dir."""
    env = openstack_env(cloud, cloud.service)
    del env["OS_REGION_NAME"]
    env.update(CLIMATE_AUTH="keystone", CLIMATE_DATA_DIR=str(tmp_path), **changes)
    return env


def test_climate_serve_takes_its_service_user_from_os_variables(
    cloud: Cloud, tmp_path: Path
) -> None:
    port = free_port()
    process = subprocess.Popen(
        [str(BIN / "climate"), "serve", "--port", str(port)],
        env=serve_env(cloud, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "climate serve did not start"
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        token = cloud.admin.token(cloud.alice)
        with httpx.Client(base_url=url, headers={"X-Auth-Token": token}, timeout=30) as alice:
            assert alice.get("/v1/leases").json() == {"leases": []}
            assert_error(alice.get("/v1/os-hosts"), 403)
        assert_error(httpx.get(f"{url}/v1/leases", timeout=30), 401)
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"OS_PASSWORD": "S3cret-never-shown"}, "OS_PASSWORD (os_password)"),
        ({"OS_USERNAME": "nobody-at-all"}, "OS_USERNAME (os_username)"),
        ({"OS_AUTH_URL": "http://127.0.0.1:9/v3"}, "OS_AUTH_URL (os_auth_url)"),
        ({"OS_PASSWORD": ""}, "OS_PASSWORD (os_password): required"),
        ({"OS_USER_DOMAIN_NAME": ""}, "OS_USER_DOMAIN_NAME (os_user_domain_name) or"),
        ({"OS_CLOUD": "no-such-cloud"}, "OS_CLOUD (os_cloud)"),
    ],
)
def test_a_missing_or_wrong_service_user_setting_stops_start_up_naming_it(
    cloud: Cloud, tmp_path: Path, changes: dict[str, str], named: str
) -> None:
    env = serve_env(cloud, tmp_path, **changes)
    refused = subprocess.run(
        [str(BIN / "climate"), "serve", "--port", str(free_port())],
        env={k: v for k, v in env.items() if v},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode != 0
    assert named in refused.stderr, refused.stderr
    assert "S3cret-never-shown" not in refused.stderr


def test_a_clouds_yaml_cloud_is_the_service_user_and_os_variables_override_it(
    cloud: Cloud, tmp_path: Path, settings: Settings, sqlite_url: str
) -> None:
    clouds = tmp_path / "clouds.yaml"
    clouds.write_text(
        "clouds:\n"
        "  climate:\n"
        "    auth:\n"
        f"      auth_url: {cloud.admin.auth_url}\n"
        f"      username: {cloud.service.name}\n"
        "      password: not-this-one\n"
        "      project_name: service\n"
        "      user_domain_name: Default\n"
        "      project_domain_name: Default\n"
        "    region_name: RegionOne\n"
    )
    env = {"OS_CLIENT_CONFIG_FILE": str(clouds), "OS_CLOUD": "climate", "OS_PASSWORD": "x"}
    credentials = service_credentials(load_settings(env={"CLIMATE_AUTH": "keystone", **env}))
    assert credentials.auth["username"] == cloud.service.name
    assert (credentials.auth["password"], credentials.region_name) == ("x", "RegionOne")
    good = settings.model_copy(
        update={"auth": "keystone", "os_cloud": "climate", "os_client_config_file": str(clouds)}
    )
    with pytest.raises(InvalidInput, match="refused the service user"):
        Authenticator(good, None)  # type: ignore[arg-type]
    right = good.model_copy(update={"os_password": cloud.service.password})
    with serve(right, sqlite_url) as server, as_(server, cloud.admin.token(cloud.alice)) as alice:
        assert alice.get("/v1/leases").status_code == 200
