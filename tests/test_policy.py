"""Who may do what: named policy rules, Blazar's defaults with an operator's file on top."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from climate.config import Settings
from climate.db.engine import Database
from climate.domain.actor import Actor
from climate.errors import Forbidden, InvalidInput
from climate.policy import Policy, default_rules, load_policy
from climate.runtime import build_context
from tests.conftest import serve
from tests.test_auth import ALICE, BOB, assert_error, client, created, ids, lease_body

ADMIN = Actor("root", "ops", frozenset({"admin"}))
MEMBER = Actor("alice", "project-a", frozenset({"member"}))
OPERATOR = Actor("olga", "ops", frozenset({"operator"}))
OWN = {"project_id": "project-a"}
OTHERS = {"project_id": "project-b"}
OPERATOR_HEADERS = {"X-Project-Id": "ops", "X-User-Id": "olga", "X-Roles": "operator"}
ADMIN_HEADERS = {"X-Project-Id": "ops", "X-User-Id": "root", "X-Roles": "admin"}


def test_defaults_let_members_manage_their_own_leases_and_admins_everything() -> None:
    policy = load_policy("admin")
    for action in ("get", "post", "put", "delete"):
        rule = f"blazar:leases:{action}"
        assert policy.allows(MEMBER, rule, OWN)
        assert not policy.allows(MEMBER, rule, OTHERS)
        assert policy.allows(ADMIN, rule, OTHERS)
    for action in ("get", "post", "put", "delete"):
        assert not policy.allows(MEMBER, f"blazar:oshosts:{action}")
        assert policy.allows(ADMIN, f"blazar:oshosts:{action}")
    assert policy.allows(MEMBER, "blazar:oshosts:get_allocations", OWN)
    assert policy.allows(MEMBER, "blazar:oshosts:get_resource_properties")
    assert not policy.allows(MEMBER, "blazar:oshosts:update_resource_properties")
    assert not policy.allows(MEMBER, "climate:audit:get")
    assert policy.allows(ADMIN, "climate:audit:get")
    assert (policy.scope(MEMBER), policy.scope(ADMIN)) == ("project-a", None)


def test_defaults_are_blazars_secure_rbac_readers_read_members_write() -> None:
    policy = load_policy("admin")
    reader = Actor("rita", "project-a", frozenset({"reader"}))
    assert policy.allows(reader, "blazar:leases:get", OWN)
    assert not policy.allows(reader, "blazar:leases:get", OTHERS)
    for rule in ("blazar:leases:post", "blazar:leases:put", "blazar:leases:delete"):
        assert not policy.allows(reader, rule, OWN)
        assert policy.allows(MEMBER, rule, OWN)
    # A role that is none of Keystone's reads nothing.
    outsider = Actor("olga", "project-a", frozenset({"observer"}))
    assert not policy.allows(outsider, "blazar:leases:get", OWN)
    # Keystone's implied roles: admin implies manager, member and reader.
    assert policy.allows(ADMIN, "project_reader_api", {"project_id": "ops"})
    assert policy.rules["project_member_or_admin"] == "rule:project_member_api or rule:admin"
    assert policy.rules["blazar:leases:post"] == "rule:project_member_or_admin"
    assert policy.rules["blazar:leases:get"] == "rule:project_reader_or_admin"


def test_a_blazar_policy_yaml_file_is_read_as_blazar_reads_it(tmp_path: Path) -> None:
    """A Blazar site's policy.yaml (oslopolicy-sample-generator's shape) works unchanged."""
    blazar_file = write(
        tmp_path,
        "policy.yaml",
        '# "admin": "is_admin:True or role:admin"\n'
        '"admin": "is_admin:True or role:admin or role:cloud-operator"\n'
        '"project_reader_api": "role:reader and project_id:%(project_id)s"\n'
        '"blazar:oshosts:get": "rule:admin or role:observer"\n',
    )
    policy = load_policy("admin", blazar_file)
    operator = Actor("olga", "ops", frozenset({"cloud-operator"}))
    assert policy.allows(operator, "blazar:oshosts:post")
    assert policy.scope(operator) is None
    assert policy.allows(Actor("o", "p", frozenset({"observer"})), "blazar:oshosts:get")
    assert not policy.allows(MEMBER, "blazar:oshosts:get")
    assert not Policy({**default_rules("admin"), "admin": "is_admin:True"}).allows(ADMIN, "admin")


def test_the_admin_rule_follows_the_configured_admin_role() -> None:
    policy = load_policy("cloud-admin")
    assert not policy.allows(ADMIN, "blazar:oshosts:post")
    assert policy.allows(Actor("u", "p", frozenset({"cloud-admin"})), "blazar:oshosts:post")


def test_a_denied_call_is_forbidden_naming_the_rule() -> None:
    with pytest.raises(Forbidden, match="blazar:oshosts:post") as denied:
        load_policy("admin").enforce(MEMBER, "blazar:oshosts:post")
    assert (denied.value.status, denied.value.name) == (403, "FORBIDDEN")


@pytest.mark.parametrize(
    ("rule", "allowed"),
    [
        ("@", True),
        ("", True),
        ("!", False),
        ("role:member", True),
        ("role:admin", False),
        ("role:admin or role:member", True),
        ("role:admin and role:member", False),
        ("not role:admin", True),
        ("not (role:admin or role:member)", False),
        ("role:member and (user_id:bob or user_id:alice)", True),
        ("project_id:%(project_id)s", True),
        ("project_id:%(project_id)s and user_id:%(user_id)s", False),
        ("user_id:%(missing)s", False),
        ("role:admin or role:member and !", False),
        ("rule:admin_or_owner", True),
    ],
)
def test_rule_syntax(rule: str, allowed: bool) -> None:
    policy = Policy({**default_rules("admin"), "blazar:leases:get": rule})
    target = {"project_id": "project-a", "user_id": "bob"}
    assert policy.allows(MEMBER, "blazar:leases:get", target) is allowed


def write(tmp_path: Path, name: str, content: str) -> str:
    path = tmp_path / name
    path.write_text(content)
    return str(path)


def test_a_policy_file_lets_operators_manage_hosts(
    settings: Settings, database_url: str, tmp_path: Path
) -> None:
    rules = {
        "blazar:oshosts:get": "rule:admin or role:operator",
        "blazar:oshosts:post": "rule:admin or role:operator",
        "blazar:oshosts:put": "rule:admin or role:operator",
        "blazar:oshosts:delete": "rule:admin or role:operator",
    }
    policy_file = write(tmp_path, "policy.json", json.dumps(rules))
    with (
        serve(settings.model_copy(update={"policy_file": policy_file}), database_url) as server,
        client(server, OPERATOR_HEADERS) as operator,
        client(server, ALICE) as alice,
    ):
        host = created(operator.post("/v1/os-hosts", json={"name": "compute-0"}), "host")
        assert [h["id"] for h in operator.get("/v1/os-hosts").json()["hosts"]] == [host["id"]]
        changed = operator.put(f"/v1/os-hosts/{host['id']}", json={"rack": "r1"})
        assert changed.json()["host"]["rack"] == "r1"
        assert_error(alice.post("/v1/os-hosts", json={"name": "compute-1"}), 403)
        assert_error(alice.delete(f"/v1/os-hosts/{host['id']}"), 403, "blazar:oshosts:delete")
        # Only what the file names changed: properties stay admin-only to change.
        denied = operator.patch("/v1/os-hosts/properties/rack", json={"private": True})
        assert_error(denied, 403, "blazar:oshosts:update_resource_properties")
        assert operator.delete(f"/v1/os-hosts/{host['id']}").status_code == 204


def test_a_policy_file_can_deny_lease_creation(
    settings: Settings, database_url: str, tmp_path: Path
) -> None:
    policy_file = write(tmp_path, "policy.toml", '"blazar:leases:post" = "!"\n')
    with (
        serve(settings.model_copy(update={"policy_file": policy_file}), database_url) as server,
        client(server, ADMIN_HEADERS) as admin,
        client(server, ALICE) as alice,
    ):
        created(admin.post("/v1/os-hosts", json={"name": "compute-0"}), "host")
        body = assert_error(alice.post("/v1/leases", json=lease_body("x")), 403)
        assert body == {
            "error_code": 403,
            "error_message": "Policy doesn't allow blazar:leases:post to be performed",
            "error_name": 403,
        }
        assert_error(admin.post("/v1/leases", json=lease_body("y")), 403)
        assert ids(alice.get("/v1/leases")) == set()


def test_widening_the_admin_rule_widens_what_lists_show(
    settings: Settings, database_url: str, tmp_path: Path
) -> None:
    policy_file = write(tmp_path, "policy.json", '{"admin": "role:admin or role:auditor"}')
    auditor = {"X-Project-Id": "audit", "X-User-Id": "ann", "X-Roles": "auditor"}
    with (
        serve(settings.model_copy(update={"policy_file": policy_file}), database_url) as server,
        client(server, ADMIN_HEADERS) as admin,
        client(server, ALICE) as alice,
        client(server, BOB) as bob,
        client(server, auditor) as ann,
    ):
        created(admin.post("/v1/os-hosts", json={"name": "compute-0"}), "host")
        lease = created(alice.post("/v1/leases", json=lease_body("a")), "lease")
        assert ids(ann.get("/v1/leases")) == {lease["id"]}
        assert ann.get(f"/v1/leases/{lease['id']}").status_code == 200
        assert ids(bob.get("/v1/leases")) == set()


@pytest.mark.parametrize(
    ("name", "content", "mentions"),
    [
        ("p.json", '{"blazar:leases:gett": "@"}', ["'blazar:leases:gett'", "unknown rule"]),
        ("p.json", '{"blazar:leases:get": "role:admin or"}', ["'blazar:leases:get'", "ends"]),
        ("p.json", '{"blazar:leases:get": "(role:admin"}', ["'blazar:leases:get'", "parenthesis"]),
        ("p.json", '{"blazar:leases:get": "role:a role:b"}', ["'blazar:leases:get'", "'role:b'"]),
        ("p.json", '{"blazar:leases:get": "admin"}', ["'blazar:leases:get'", "not a check"]),
        ("p.json", '{"blazar:leases:get": "group:x"}', ["'blazar:leases:get'", "'group'"]),
        ("p.json", '{"blazar:leases:get": "rule:nope"}', ["'blazar:leases:get'", "'nope'"]),
        ("p.json", '{"admin": "rule:admin_or_owner"}', ["'admin'", "itself"]),
        ("p.json", '{"blazar:leases:get": true}', ["'blazar:leases:get'", "string"]),
        ("p.json", '["role:admin"]', ["policy_file", "map rule names"]),
        ("p.json", "{not json", ["policy_file", "cannot read"]),
        ("p.toml", "admin = [", ["policy_file", "cannot read"]),
    ],
)
def test_a_bad_policy_file_stops_startup_naming_the_rule(
    settings: Settings,
    sqlite_url: str,
    tmp_path: Path,
    name: str,
    content: str,
    mentions: list[str],
) -> None:
    bad = settings.model_copy(update={"policy_file": write(tmp_path, name, content)})
    db = Database(sqlite_url)
    try:
        with pytest.raises(InvalidInput) as refused:
            build_context(bad, db)
    finally:
        db.dispose()
    for mention in mentions:
        assert mention in refused.value.message


def test_a_missing_policy_file_stops_startup(settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="policy_file: cannot read"):
        load_policy("admin", str(tmp_path / "absent.json"))
