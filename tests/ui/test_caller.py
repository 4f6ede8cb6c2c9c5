"""``GET /v1/policy/caller``: who the caller is and which rules hold for them, which the
dashboard asks instead of trying an admin's call."""

from __future__ import annotations

from climate.config import Settings
from tests.conftest import LiveServer
from tests.test_auth import client, issue, token_server

MEMBER = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}


def test_noauth_callers_are_told_who_they_are(live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin, client(live_sqlite, MEMBER) as member:
        found = admin.get("/v1/policy/caller").json()["caller"]
        assert found["admin"] is True
        assert {"blazar:oshosts:get", "climate:audit:get"} <= set(found["allowed"])
        mine = member.get("/v1/policy/caller").json()["caller"]
        assert (mine["user_id"], mine["project_id"], mine["admin"]) == ("alice", "project-a", False)
        assert mine["roles"] == ["member"]  # as given (the policy applies implied ones)
        assert {"blazar:leases:get", "blazar:leases:post"} <= set(mine["allowed"])
        assert "blazar:oshosts:get" not in mine["allowed"]
        assert "climate:audit:get" not in mine["allowed"]


def test_with_tokens_no_token_is_no_caller_and_a_bad_one_is_refused(
    settings: Settings, sqlite_url: str
) -> None:
    with token_server(settings, sqlite_url) as server:
        reader = issue(server, "rita", "project-a", ["reader"])
        with client(server) as anonymous:
            answer = anonymous.get("/v1/policy/caller")
            assert answer.status_code == 200
            assert answer.json() == {"caller": None}
            assert anonymous.get("/v1/leases").status_code == 401  # the rest still needs one
        with client(server, {"X-Auth-Token": "clm_nope"}) as wrong:
            assert wrong.get("/v1/policy/caller").status_code == 401
        with client(server, {"X-Auth-Token": reader}) as rita:
            found = rita.get("/v1/policy/caller").json()["caller"]
            assert "blazar:leases:get" in found["allowed"]
            assert "blazar:leases:post" not in found["allowed"]
