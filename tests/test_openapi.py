"""The OpenAPI document describes every route, and real answers match what it says."""

from __future__ import annotations

import json
import time
import typing
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema_rs
import pytest
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts

from climate.api.app import create_app
from climate.api.deps import BodyDep, WriteDep
from climate.api.openapi import document
from climate.config import load_settings
from climate.db.engine import Database
from climate.runtime import build_context
from tests.conftest import LiveServer
from tests.test_items_http import call_item_operations
from tests.test_series import call_series_operations

MEMBER = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
READ_BODY = {typing.get_args(dep)[1].dependency for dep in (BodyDep, WriteDep)}


@pytest.fixture(scope="module")
def app() -> Iterator[FastAPI]:
    database = Database("sqlite://")
    yield create_app(build_context(load_settings(env={}), database))
    database.dispose()


def routes(app: FastAPI) -> Iterator[tuple[str, str, Dependant]]:
    """Every (method, path, dependencies) the app serves, routers included."""
    for route in iter_route_contexts(app.routes):
        dependant = getattr(route, "dependant", None)  # None for Starlette's own /docs routes
        if route.methods and route.path_format and isinstance(dependant, Dependant):
            for method in route.methods:
                yield method, route.path_format, dependant


def reads_body(dependant: Dependant) -> bool:
    return any(d.call in READ_BODY or reads_body(d) for d in dependant.dependencies)


def test_every_route_is_described(app: FastAPI) -> None:
    """Every route declares its answers (``responses=answers(...)``, api/schemas/answers.py)."""
    served = {(method, path) for method, path, _ in routes(app)}
    assert len(served) > 10
    declared = {
        (method, route.path_format)
        for route in iter_route_contexts(app.routes)
        if isinstance(route.original_route, APIRoute) and route.original_route.responses
        for method in route.methods or ()
    }
    assert served - declared == set(), "give these routes responses=answers()"


def test_a_route_that_reads_a_body_describes_it_and_no_other_does(app: FastAPI) -> None:
    paths = document(app)["paths"]
    for method, path, dependant in routes(app):
        described = "requestBody" in paths[path][method.lower()]
        assert described == reads_body(dependant), (method, path)


def test_every_operation_answers_with_bodies_and_statuses_it_can_really_give(app: FastAPI) -> None:
    spec = document(app)
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            responses = operation["responses"]
            assert "422" not in responses, (method, path)  # validation errors are 400s
            assert {"400", "500"} <= set(responses), (method, path)
            for status, response in responses.items():
                if status == "204":
                    assert "content" not in response
                else:
                    media = "application/json"
                    if status == "200" and path.endswith(".ics"):
                        media = "text/calendar"
                    elif status == "200" and path == "/metrics":
                        media = "text/plain"
                    assert media in response["content"], (method, path, status)
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_every_schema_is_valid_json_schema_and_every_reference_resolves(app: FastAPI) -> None:
    spec = document(app)
    text = json.dumps(spec)
    for name, schema in spec["components"]["schemas"].items():
        jsonschema_rs.meta.validate(schema)
        assert f'"#/components/schemas/{name}"' in text, f"{name} is never used"
    for reference in {part.split('"')[0] for part in text.split('"$ref": "')[1:]}:
        name = reference.removeprefix("#/components/schemas/")
        assert name in spec["components"]["schemas"], reference


def test_links_lead_from_a_created_resource_to_the_operations_on_it(app: FastAPI) -> None:
    spec = document(app)
    operations = {
        op["operationId"]: path
        for path, methods in spec["paths"].items()
        for op in methods.values()
    }
    lease_links = spec["paths"]["/v1/leases"]["post"]["responses"]["201"]["links"]
    host_links = spec["paths"]["/v1/os-hosts"]["post"]["responses"]["201"]["links"]
    assert {operations[link["operationId"]] for link in lease_links.values()} == {
        path for path in spec["paths"] if "{lease_id}" in path
    }
    assert {operations[link["operationId"]] for link in host_links.values()} == {
        path for path in spec["paths"] if "{host_id}" in path
    }
    assert all(
        link["parameters"] == {"lease_id": "$response.body#/lease/id"}
        for link in lease_links.values()
    )


def test_the_server_serves_the_document(live_sqlite: LiveServer, app: FastAPI) -> None:
    response = httpx.get(f"{live_sqlite.url}/openapi.json", timeout=30)
    assert response.status_code == 200
    assert response.json() == json.loads(json.dumps(document(app)))


class Conformance:
    """Calls the live server and checks each answer against the document."""

    def __init__(self, http: httpx.Client, spec: dict[str, Any]) -> None:
        self.http = http
        self.spec = spec
        self.seen: set[tuple[str, str]] = set()

    def __call__(
        self, method: str, template: str, status: int, *, json: Any = None, **kw: Any
    ) -> httpx.Response:
        path = template.format(**kw.pop("at", {}))
        response = self.http.request(method, path, json=json, **kw)
        assert response.status_code == status, (method, path, response.text)
        responses = self.spec["paths"][template][method.lower()]["responses"]
        assert str(status) in responses, f"{method} {template} may not answer {status}"
        content = responses[str(status)].get("content")
        if content is None:
            assert response.content == b""
        elif "text/calendar" in content:
            assert response.headers["content-type"].startswith("text/calendar")
            assert response.text.startswith("BEGIN:VCALENDAR\r\n")
        elif "text/plain" in content:
            assert response.headers["content-type"].startswith("text/plain")
        else:
            assert response.headers["content-type"] == "application/json"
            schema = {**content["application/json"]["schema"], **self.spec}
            errors = list(jsonschema_rs.validator_for(schema).iter_errors(response.json()))
            assert not errors, (method, path, [str(e) for e in errors[:3]])
        for header in ("OpenStack-API-Version", "x-openstack-request-id"):
            assert header in response.headers
        self.seen.add((method, template))
        return response


def test_real_answers_match_the_document(live: LiveServer, app: FastAPI) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as http:
        call = Conformance(http, document(app))
        call_every_operation(call)
    served = {(method, path) for method, path, _ in routes(app)}
    assert call.seen == served, "call the new operation in call_every_operation too"


def call_every_operation(call: Conformance) -> None:
    reservation = {
        "resource_type": "physical:host",
        "min": "1",
        "max": 1,
        "resource_properties": '["==", "$gpu", "a100"]',
    }
    lease = {
        "name": "l1",
        "start_date": "2031-01-01 10:00",
        "end_date": "2031-01-02 10:00",
        "reservations": [reservation],
        "events": [],
    }

    call("GET", "/", 300)
    call("GET", "/versions", 300)
    call("GET", "/healthz", 200)
    call("GET", "/readyz", 200)
    call("GET", "/metrics", 200)
    call("GET", "/v1/usage", 200, params={"period": "day"})
    call("GET", "/v1/usage", 400, params={"period": "week"})
    call("GET", "/v1/demand", 200, params={"period": "day"})
    call("GET", "/v1/demand", 400, params={"bucket": "week"})
    gpu = call("POST", "/v1/os-hosts", 201, json={"name": "c1", "gpu": "a100", "vcpus": 4})
    plain = call("POST", "/v1/os-hosts", 201, json={"name": "c2", "rack": 7, "cpu_info": "{}"})
    call("POST", "/v1/os-hosts", 409, json={"name": "c1"})
    call("POST", "/v1/os-hosts", 400, json={"name": "c3", "vcpus": -1})
    host_id = gpu.json()["host"]["id"]
    call("GET", "/v1/os-hosts", 200)
    call("GET", "/v1/os-hosts", 403, headers=MEMBER)
    call("GET", "/v1/os-hosts", 401, headers={"X-User-Id": "alice"})
    call("GET", "/v1/os-hosts/{host_id}", 200, at={"host_id": host_id})
    call("GET", "/v1/os-hosts/{host_id}", 404, at={"host_id": "99"})
    call("PUT", "/v1/os-hosts/{host_id}", 200, json={"rack": "r1"}, at={"host_id": host_id})
    call("GET", "/v1/os-hosts/properties", 200)
    call("GET", "/v1/power", 200)
    call("GET", "/v1/power", 400, params={"start": "2031-01-02 10:00", "end": "2031-01-01 10:00"})
    call("GET", "/v1/power", 403, headers=MEMBER)
    call("GET", "/v1/os-hosts/properties", 200, params={"detail": "True", "all": "True"})
    call("PATCH", "/v1/os-hosts/properties/{name}", 200, json={"private": True}, at={"name": "gpu"})
    call("PATCH", "/v1/os-hosts/properties/{name}", 404, json={"private": True}, at={"name": "x"})

    created = call("POST", "/v1/leases", 201, json=lease).json()["lease"]
    other = call(
        "POST",
        "/v1/leases",
        201,
        json={
            **lease,
            "name": "l2",
            "start_date": "2032-01-01 10:00",
            "end_date": "2032-01-02 10:00",
        },
    ).json()["lease"]
    call("POST", "/v1/leases", 409, json=lease)
    refused = call("POST", "/v1/leases", 409, json={**lease, "name": "l3"}).json()
    assert refused["offers"] and refused["reason"]["reservations"][0]["rule"] == "too_few_free"
    flexible = {k: v for k, v in lease.items() if k not in ("start_date", "end_date")}
    flexible |= {
        "name": "l3",
        "earliest_start": "2031-01-02 10:00",
        "latest_end": "2031-01-03 10:00",
        "duration": "PT1H",
    }
    call("POST", "/v1/leases", 200, json=flexible, params={"dry_run": "true"})
    call("POST", "/v1/leases", 400, json={**lease, "end_date": "tomorrow"})
    call("POST", "/v1/leases", 413, content=b" " * (load_settings(env={}).max_body_bytes + 1))
    call("GET", "/v1/leases", 200)
    call("GET", "/v1/leases", 200, headers=MEMBER)
    call("GET", "/v1/leases/{lease_id}", 200, at={"lease_id": created["id"]})
    call("GET", "/v1/leases/{lease_id}", 404, at={"lease_id": created["id"]}, headers=MEMBER)
    call("PUT", "/v1/leases/{lease_id}", 200, json={"name": "l1b"}, at={"lease_id": created["id"]})
    call("GET", "/v1/os-hosts/allocations", 200)
    call("GET", "/v1/os-hosts/{host_id}/allocation", 200, at={"host_id": host_id})
    health = "/v1/os-hosts/{host_id}/health"
    call("PUT", health, 200, json={"health": "up"}, at={"host_id": host_id})
    call("PUT", health, 400, json={"health": "down", "why": "x"}, at={"host_id": host_id})
    call("PUT", health, 404, json={"health": "down"}, at={"host_id": "99"})
    call("POST", "/v1/leases/{lease_id}/retry", 409, at={"lease_id": created["id"]})
    call("POST", "/v1/leases/{lease_id}/force-end", 200, at={"lease_id": other["id"]})
    held = {**lease, "name": "held", "start_date": "2033-01-01 10:00", "end_date": "2033-01-02"}
    hold = call("POST", "/v1/leases", 201, json={**held, "hold": {"expires_in": 600}}).json()
    call("POST", "/v1/leases/{lease_id}/confirm", 200, at={"lease_id": hold["lease"]["id"]})
    call("POST", "/v1/leases/{lease_id}/confirm", 409, at={"lease_id": hold["lease"]["id"]})
    beat = "/v1/leases/{lease_id}/heartbeat"
    call("POST", beat, 409, at={"lease_id": created["id"]})  # not running: nothing to use
    call("POST", beat, 404, at={"lease_id": created["id"]}, headers=MEMBER)
    running = {**lease, "name": "running", "start_date": "now", "end_date": "2030-12-31 00:00"}
    now = call("POST", "/v1/leases", 201, json=running).json()["lease"]
    call("POST", beat, 200, at={"lease_id": active(call.http, now["id"])})
    idle = "/v1/leases/{lease_id}/idle"
    call("PUT", idle, 200, json={"exempt": True}, at={"lease_id": now["id"]})
    call("PUT", idle, 400, json={"exempt": "yes"}, at={"lease_id": now["id"]})
    call("PUT", idle, 404, json={"exempt": True}, at={"lease_id": "no-such-lease"})
    ids = {"lease_id": created["id"], "reservation_id": created["reservations"][0]["id"]}
    call("POST", "/v1/leases/{lease_id}/reservations/{reservation_id}/start", 409, at=ids)
    call("POST", "/v1/leases/{lease_id}/reservations/{reservation_id}/acknowledge", 409, at=ids)
    call("GET", "/v1/audit", 200)
    window = {"search_start": "2031-01-01 00:00", "search_end": "2031-01-03 00:00"}
    ask = {"reservations": [reservation], "duration": "01:00", **window}
    call("POST", "/v1/availability", 200, json=ask)
    call("POST", "/v1/availability", 200, json=ask, headers=MEMBER)
    call("POST", "/v1/availability", 400, json={**ask, "limit": 0})
    timeline = {"start": window["search_start"], "end": window["search_end"]}
    call("GET", "/v1/availability/timeline", 200, params=timeline)
    call("GET", "/v1/availability/timeline", 400, params={"end": "soon"})
    call("GET", "/v1/timeline", 200, params=timeline)
    call("GET", "/v1/timeline", 200, params=timeline, headers=MEMBER)
    call("GET", "/v1/timeline", 400, params={"resource_type": "x"})
    call("GET", "/v1/timeline", 401, headers={"X-User-Id": "alice"})
    call("GET", "/v1/leases.ics", 200)
    call("GET", "/v1/leases.ics", 200, headers=MEMBER)
    call("GET", "/v1/policy/usage", 200, headers=MEMBER)
    call("GET", "/v1/policy/caller", 200)
    assert call("GET", "/v1/policy/caller", 200, headers=MEMBER).json()["caller"]["admin"] is False
    call("GET", "/v1/policy/caller", 401, headers={"X-User-Id": "alice"})
    call("GET", "/v1/policy/usage", 403, params={"project_id": "project-b"}, headers=MEMBER)
    credits, ledger = "/v1/projects/{project_id}/credits", "/v1/projects/{project_id}/ledger"
    mine, theirs = {"project_id": "project-a"}, {"project_id": "project-b"}
    call("POST", credits, 201, json={"amount": "10.50", "note": "x"}, at=mine)
    call("POST", credits, 400, json={"amount": "1.005"}, at=mine)
    call("POST", credits, 409, json={"amount": "-20"}, at=mine)
    call("POST", credits, 403, json={"amount": "1"}, at=mine, headers=MEMBER)
    call("GET", credits, 200, at=mine, headers=MEMBER)
    call("GET", credits, 403, at=theirs, headers=MEMBER)
    call("GET", ledger, 200, at=mine, headers=MEMBER)
    call("GET", ledger, 400, at=mine, params={"limit": "0"})
    call("DELETE", "/v1/os-hosts/{host_id}", 409, at={"host_id": host_id})
    call("DELETE", "/v1/leases/{lease_id}", 204, at={"lease_id": created["id"]})
    call("DELETE", "/v1/leases/{lease_id}", 404, at={"lease_id": created["id"]})
    call("DELETE", "/v1/os-hosts/{host_id}", 204, at={"host_id": plain.json()["host"]["id"]})
    call_item_operations(call)
    call_instance_operations(call)
    call_series_operations(call)


def active(http: httpx.Client, lease_id: str) -> str:
    """``lease_id`` once the manager has started it (within 10 s)."""
    deadline = time.monotonic() + 10
    while http.get(f"/v1/leases/{lease_id}").json()["lease"]["status"] != "ACTIVE":
        assert time.monotonic() < deadline, f"lease {lease_id} did not start"
        time.sleep(0.05)
    return lease_id


def call_instance_operations(call: Conformance) -> None:
    size = {"vcpus": 8, "memory_mb": 8192, "local_gb": 100}
    sized = call("POST", "/v1/os-hosts", 201, json={"name": "sized", **size}).json()["host"]
    reservation = {
        "resource_type": "virtual:instance",
        "amount": 2,
        "vcpus": "2",
        "memory_mb": 2048,
        "disk_gb": 10,
        "affinity": "None",
    }
    window = {"start_date": "2033-01-01 10:00", "end_date": "2033-01-01 12:00"}
    lease = {"name": "vms", **window, "reservations": [reservation], "events": []}
    call("POST", "/v1/leases", 201, json=lease)
    call(
        "POST",
        "/v1/leases",
        400,
        json={**lease, "name": "big", "reservations": [{**reservation, "vcpus": 64}]},
    )
    call("GET", "/v1/instances/allocations", 200)
    call("GET", "/v1/instances/allocations", 200, headers=MEMBER)
    call("GET", "/v1/instances/allocations", 200, params={"limit": 1})
    call("GET", "/v1/instances/allocations", 400, params={"marker": "x"})
    call("GET", "/v1/instances/allocations/{host_id}", 200, at={"host_id": sized["id"]})
    call("GET", "/v1/instances/allocations/{host_id}", 404, at={"host_id": "999"})
    stack = "heat_template_version: 2018-08-31\nresources:\n  web:\n    type: OS::Nova::Server\n"
    stack += "    properties: {flavor: m1.small}\n  net:\n    type: OS::Neutron::Net\n"
    answer = call(
        "POST", "/v1/leases/from-template", 201, json={"name": "stack", **window, "template": stack}
    ).json()
    assert answer["warnings"] == ["net: resource type OS::Neutron::Net is not reserved"]
    call("POST", "/v1/leases/from-template", 400, json={"name": "bad", **window, "template": "["})


def test_every_route_is_matched_by_the_apps_own_router(app: FastAPI) -> None:
    """Routers are put on the app route by route (``api/routes.include``): FastAPI keeps an
    included router as one route that matches its routes anew, twice, on every request."""
    kinds = {type(route).__name__ for route in app.routes}
    assert kinds <= {"APIRoute", "APIWebSocketRoute", "Route", "Mount"}, kinds
