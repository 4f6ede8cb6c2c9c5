"""Every integer field of every route is bounded, over real HTTP on both databases: boundary and
random out-of-range integers, and booleans, get a 400 naming the field, never a 5xx
(docs/limits.md)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from climate.api.app import create_app
from climate.api.openapi import document
from climate.config import load_settings
from climate.db.engine import Database
from climate.inputs import MAX_INT
from climate.runtime import build_context
from climate.services.credits import MAX_AMOUNT
from tests.conftest import LiveServer, _reset_pg, _sqlite_copy, serve

BOUNDARY = (MAX_INT, MAX_INT + 1, 2**63 - 1, 2**63, 10**30, -1, -(2**63), 0, True, False)
OUT_OF_RANGE = st.one_of(
    st.integers(min_value=MAX_INT + 1),
    st.integers(max_value=-MAX_INT - 1),
    st.booleans(),
)
TEMPLATE = """heat_template_version: 2018-08-31
parameters:
  n: {type: number, default: 1}
resources:
  disk:
    type: OS::Cinder::Volume
    properties: {size: {get_param: n}}
"""


def _date(days: float) -> str:
    when = dt.datetime.now(dt.UTC) + dt.timedelta(days=days)
    return when.strftime("%Y-%m-%d %H:%M")


def _host(**fields: Any) -> dict[str, Any]:
    return {"resource_type": "physical:host", "min": 1, "max": 1, **fields}


def _lease(**fields: Any) -> dict[str, Any]:
    return {
        "name": f"lease-{uuid.uuid4().hex[:8]}",
        "start_date": _date(1),
        "end_date": _date(2),
        "reservations": [_host()],
        **fields,
    }


def _instance(**fields: Any) -> dict[str, Any]:
    size = {"amount": 1, "vcpus": 1, "memory_mb": 512, "disk_gb": 1}
    return _lease(reservations=[{"resource_type": "virtual:instance", **size, **fields}])


def _search(**fields: Any) -> dict[str, Any]:
    return {"reservations": [_host()], "duration": 3600, "search_end": _date(3), **fields}


def _series(**fields: Any) -> dict[str, Any]:
    return {
        "name": f"series-{uuid.uuid4().hex[:8]}",
        "start_date": _date(1),
        "duration": 3600,
        "rrule": "FREQ=DAILY;COUNT=2",
        "reservations": [_host()],
        **fields,
    }


@dataclass(frozen=True)
class Target:
    """One integer field of one route: the request with ``value`` in that field."""

    method: str
    path: str
    field: str
    """What a refusal must name (an alternative after ``|``: the message names either)."""
    request: Callable[[Any, dict[str, str]], dict[str, Any]]
    """``value`` and the ids of what the server holds -> ``json`` or ``params`` for httpx."""
    maximum: int = MAX_INT
    """The largest magnitude the field takes (a credit amount goes further than a count)."""

    def __str__(self) -> str:
        return f"{self.method} {self.path} {self.field}"


def _body(build: Callable[[Any], dict[str, Any]]) -> Callable[[Any, dict[str, str]], Any]:
    return lambda value, _ids: {"json": build(value)}


def _query(name: str, **fixed: str) -> Callable[[Any, dict[str, str]], Any]:
    return lambda value, _ids: {"params": {**fixed, name: str(value).lower()}}


def _reservation_update(key: str) -> Callable[[Any, dict[str, str]], Any]:
    return lambda value, ids: {"json": {"reservations": [{"id": ids["reservation"], key: value}]}}


TARGETS = (
    *(
        Target(
            "POST",
            "/v1/leases",
            f"reservations[0].{key}",
            _body(lambda v, k=key: _lease(reservations=[_host(**{k: v})])),
        )
        for key in ("min", "max")
    ),
    *(
        Target(
            "POST",
            "/v1/leases",
            f"reservations[0].{key}",
            _body(lambda v, k=key: _instance(**{k: v})),
        )
        for key in ("amount", "vcpus", "memory_mb", "disk_gb")
    ),
    *(
        Target(
            "POST",
            "/v1/leases",
            f"reservations[0].{key}",
            _body(
                lambda v, k=key: _lease(
                    reservations=[
                        {"resource_type": "virtual:volume", "size_gb": 1, "amount": 1, k: v}
                    ]
                )
            ),
        )
        for key in ("size_gb", "amount")
    ),
    Target(
        "POST",
        "/v1/leases",
        "reservations[0].amount",
        _body(
            lambda v: _lease(
                reservations=[
                    {"resource_type": "virtual:floatingip", "network_id": "ext", "amount": v}
                ]
            )
        ),
    ),
    Target(
        "POST",
        "/v1/leases",
        "reservations[0].amount",
        _body(lambda v: _lease(reservations=[{"resource_type": "network", "amount": v}])),
    ),
    Target(
        "POST",
        "/v1/leases",
        "reservations[0].max",
        _body(lambda v: _lease(reservations=[{"resource_type": "device", "min": 1, "max": v}])),
    ),
    Target("POST", "/v1/leases", "priority", _body(lambda v: _lease(priority=v))),
    Target("POST", "/v1/leases", "retries", _body(lambda v: _lease(lease_type="retry", retries=v))),
    Target("POST", "/v1/leases", "hold_minutes", _body(lambda v: _lease(hold_minutes=v))),
    Target(
        "POST", "/v1/leases", "hold.expires_in", _body(lambda v: _lease(hold={"expires_in": v}))
    ),
    Target("POST", "/v1/leases", "before_end_offset", _body(lambda v: _lease(before_end_offset=v))),
    Target("POST", "/v1/leases", "reminders[0]", _body(lambda v: _lease(reminders=[v]))),
    Target(
        "POST",
        "/v1/leases",
        "duration",
        _body(
            lambda v: {
                **{k: w for k, w in _lease().items() if k not in ("start_date", "end_date")},
                "earliest_start": _date(1),
                "latest_end": _date(3),
                "duration": v,
            }
        ),
    ),
    Target("PUT", "/v1/leases/{lease_id}", "reservations[0].max", _reservation_update("max")),
    Target("PUT", "/v1/leases/{lease_id}", "reservations[0].min", _reservation_update("min")),
    Target(
        "PUT",
        "/v1/leases/{lease_id}",
        "before_end_offset",
        _body(lambda v: {"before_end_offset": v}),
    ),
    Target("PUT", "/v1/leases/{lease_id}", "reminders[0]", _body(lambda v: {"reminders": [v]})),
    Target(
        "POST",
        "/v1/projects/{project_id}/credits",
        "amount",
        _body(lambda v: {"amount": v}),
        int(MAX_AMOUNT),
    ),
    Target(
        "POST",
        "/v1/leases/from-template",
        "priority",
        _body(
            lambda v: {
                "name": f"t-{uuid.uuid4().hex[:8]}",
                "start_date": _date(1),
                "end_date": _date(2),
                "template": TEMPLATE,
                "priority": v,
            }
        ),
    ),
    Target(
        "POST",
        "/v1/leases/from-template",
        "template.resources.disk.properties.size|parameters.n",
        _body(
            lambda v: {
                "name": f"t-{uuid.uuid4().hex[:8]}",
                "start_date": _date(1),
                "end_date": _date(2),
                "template": TEMPLATE,
                "parameters": {"n": v},
            }
        ),
    ),
    *(
        Target("POST", "/v1/availability", field, _body(build))
        for field, build in (
            ("limit", lambda v: _search(limit=v)),
            ("step", lambda v: _search(step=v)),
            ("duration", lambda v: _search(duration=v)),
            ("reservations[0].min", lambda v: _search(reservations=[_host(min=v, max=1)])),
            ("reservations[0].max", lambda v: _search(reservations=[_host(max=v)])),
        )
    ),
    *(
        Target("POST", "/v1/lease-series", field, _body(build))
        for field, build in (
            ("duration", lambda v: _series(duration=v)),
            ("before_end_offset", lambda v: _series(before_end_offset=v)),
            ("reminders[0]", lambda v: _series(reminders=[v])),
            ("reservations[0].max", lambda v: _series(reservations=[_host(max=v)])),
        )
    ),
    *(
        Target(
            "POST",
            "/v1/os-hosts",
            key,
            _body(lambda v, k=key: {"name": f"h-{uuid.uuid4().hex[:8]}", k: v}),
        )
        for key in ("vcpus", "memory_mb", "local_gb")
    ),
    Target("PUT", "/v1/os-hosts/{host_id}", "vcpus", _body(lambda v: {"vcpus": v})),
    Target(
        "POST",
        "/v1/volume-pools",
        "capacity_gb",
        _body(lambda v: {"name": f"p-{uuid.uuid4().hex[:8]}", "capacity_gb": v}),
    ),
    Target("PUT", "/v1/volume-pools/{pool_id}", "capacity_gb", _body(lambda v: {"capacity_gb": v})),
    Target(
        "POST",
        "/v1/networks",
        "segment_id",
        _body(lambda v: {"network_type": "vlan", "segment_id": v}),
    ),
    *(
        Target("GET", path, "limit", _query("limit"))
        for path in (
            "/v1/leases",
            "/v1/os-hosts",
            "/v1/os-hosts/allocations",
            "/v1/audit",
            "/v1/devices",
            "/v1/volume-pools",
            "/v1/instances/allocations",
        )
    ),
    Target("GET", "/v1/availability/timeline", "bucket", _query("bucket", end=_date(2))),
    *(
        Target(
            "GET",
            "/v1/availability/timeline",
            name,
            _query(
                name, end=_date(2), resource_type="virtual:instance", vcpus="1", memory_mb="512"
            ),
        )
        for name in ("vcpus", "memory_mb", "disk_gb")
    ),
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    """A live server per database with hosts, a pool and a lease to update, for the module."""
    if request.param == "sqlite":
        url = _sqlite_copy(sqlite_template, tmp_path_factory.mktemp("limits"))
    else:
        url = request.getfixturevalue("pg_url")
        _reset_pg(url)
    with serve(load_settings(env={}), url) as live, httpx.Client(base_url=live.url) as http:
        size = {"vcpus": 8, "memory_mb": 8192, "local_gb": 100}
        hosts = [http.post("/v1/os-hosts", json={"name": f"c{i}", **size}) for i in range(2)]
        pool = http.post("/v1/volume-pools", json={"name": "ssd", "capacity_gb": 100})
        lease = http.post("/v1/leases", json=_lease(name="to-update"))
        assert lease.status_code == 201, lease.text
        ids = {
            "host_id": str(hosts[0].json()["host"]["id"]),
            "pool_id": str(pool.json()["volume_pool"]["id"]),
            "lease_id": lease.json()["lease"]["id"],
            "reservation": lease.json()["lease"]["reservations"][0]["id"],
            "project_id": "some-project",
        }
        yield live, ids


def _send(server: tuple[LiveServer, dict[str, str]], target: Target, value: Any) -> httpx.Response:
    live, ids = server
    with httpx.Client(base_url=live.url, timeout=30) as http:
        return http.request(target.method, target.path.format(**ids), **target.request(value, ids))


def _out_of_range(value: Any, maximum: int) -> bool:
    return isinstance(value, bool) or not -maximum <= value <= maximum


def check(response: httpx.Response, target: Target, value: Any) -> None:
    """Never a 5xx; out of range or a boolean, a 400 whose message starts with the field."""
    where = f"{target} = {value!r}"
    assert response.status_code < 500, (where, response.text)
    if _out_of_range(value, target.maximum):
        assert response.status_code == 400, (where, response.text)
        message = response.json()["error_message"]
        assert message.startswith(tuple(f"{f}: " for f in target.field.split("|"))), (
            where,
            message,
        )
        if isinstance(value, bool) and target.method != "GET":  # a query has no booleans
            assert "boolean" in message, (where, message)


def test_every_route_with_an_integer_field_is_covered() -> None:
    """Each operation whose documented request has an integer somewhere is among ``TARGETS``."""
    doc = document(create_app(build_context(load_settings(env={}), Database("sqlite://"))))

    def has_integer(node: object) -> bool:
        if isinstance(node, dict):
            if node.get("type") == "integer":
                return True
            if "$ref" in node:
                return has_integer(doc["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]])
            return any(has_integer(v) for v in node.values())
        return isinstance(node, list) and any(has_integer(v) for v in node)

    documented = {
        (method.upper(), path)
        for path, operations in doc["paths"].items()
        for method, operation in operations.items()
        if isinstance(operation, dict)
        and has_integer([operation.get("requestBody"), operation.get("parameters")])
    }
    assert documented and documented <= {(t.method, t.path) for t in TARGETS}


def test_boundary_integers_on_every_integer_field(
    server: tuple[LiveServer, dict[str, str]],
) -> None:
    for target in TARGETS:
        for value in (*BOUNDARY, target.maximum, target.maximum + 1):
            check(_send(server, target, value), target, value)


@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(target=st.sampled_from(TARGETS), value=OUT_OF_RANGE, as_text=st.booleans())
def test_out_of_range_integers_are_a_400_naming_the_field(
    server: tuple[LiveServer, dict[str, str]], target: Target, value: int, as_text: bool
) -> None:
    """As numbers, and as the strings of digits the blazar CLI sends."""
    sent = str(value) if as_text and not isinstance(value, bool) else value
    check(_send(server, target, sent), target, value)
