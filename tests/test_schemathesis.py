"""Schemathesis against a live server: whatever it sends, no 5xx and no answer outside the spec.

Every operation of the OpenAPI document is called with generated requests (valid and invalid,
and with methods it does not take), as the default admin and, for the lease routes, as a member.
Each response must be documented for its operation: status, content type, headers and body.
Hosts exist beforehand so that some lease requests are admitted. Bounded and derandomised, so a
run is repeatable.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from climate.api.app import create_app
from climate.api.openapi import document
from climate.config import load_settings
from climate.db.engine import Database
from climate.runtime import build_context
from tests.conftest import LiveServer, _reset_pg, _sqlite_copy, serve

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    unsupported_method,
]
MEMBER = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
BOUNDED = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
# The routes are known without a database; the live server serves this same document.
schema = schemathesis.openapi.from_dict(
    document(create_app(build_context(load_settings(env={}), Database("sqlite://"))))
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest,
    sqlite_template: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LiveServer]:
    """One server per database for the whole module (a server per operation would double the
    run time), with three hosts."""
    if request.param == "sqlite":
        url = _sqlite_copy(sqlite_template, tmp_path_factory.mktemp("schemathesis"))
    else:
        url = request.getfixturevalue("pg_url")
        _reset_pg(url)
    with serve(load_settings(env={}), url) as live:
        with httpx.Client(base_url=live.url, timeout=30) as http:
            for i, extra in enumerate(({"gpu": "a100"}, {"gpu": "a100"}, {"rack": "r2"}), 1):
                response = http.post("/v1/os-hosts", json={"name": f"compute-{i}", **extra})
                assert response.status_code == 201, response.text
        yield live


@schema.parametrize()
@BOUNDED
def test_every_operation_as_admin(case: schemathesis.Case, server: LiveServer) -> None:
    case.call_and_validate(base_url=server.url, checks=CHECKS)


@schema.include(path_regex="^/v1/leases").parametrize()
@BOUNDED
def test_lease_operations_as_member(case: schemathesis.Case, server: LiveServer) -> None:
    case.call_and_validate(base_url=server.url, headers=MEMBER, checks=CHECKS)
