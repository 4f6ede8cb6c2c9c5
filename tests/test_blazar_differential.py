"""Blazar's contract, checked differentially: the same requests, valid and invalid, sent to the
real Blazar 18 (``/work/shared/blazar/run_blazar.sh``: its API and manager unmodified, with no
Keystone or Nova) and to Climate give the same status codes, and Climate's error message
contains Blazar's (Climate may name the field around it).

Each case is a list of steps run against a fresh pair of servers' state so far; ``{lease}``
in a path is the id of the lease the case created last. Blazar's venv takes about 25 s to
install warm; without it these tests skip, except under CI=true, where they fail.
``BLAZAR_STATE`` says where it lives (default ``/tmp/blazar-ref``).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests import real_blazar
from tests.conftest import LiveServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.blazar]
DATE = "%Y-%m-%d %H:%M"


@pytest.fixture(scope="module")
def blazar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real Blazar 18's v1 URL, on an empty database, with one host."""
    path = tmp_path_factory.mktemp("blazar") / "blazar.sqlite"
    port = free_port()
    env = {**os.environ, "FRESH": "1"}
    real_blazar.start(port, path, env)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        assert httpx.post(f"{url}/os-hosts", json={"name": "node-1"}).status_code == 201
        yield url
    finally:
        real_blazar.stop(port, env)


@pytest.fixture
def climate(live_sqlite: LiveServer) -> str:
    url = f"{live_sqlite.url}/v1"
    assert httpx.post(f"{url}/os-hosts", json={"name": "node-1"}).status_code == 201
    return url


@dataclass
class Step:
    method: str
    path: str
    body: dict[str, Any] | None = None
    status: int = 200
    message: str | None = None
    """Blazar's error message, when it is part of the contract."""
    ours: int | None = None
    """Climate's status where Blazar's is a 500 (it crashes): a clear 4xx instead."""


@dataclass
class Case:
    name: str
    steps: list[Step] = field(default_factory=list)


def _at(days: float) -> str:
    when = dt.datetime.now(dt.UTC) + dt.timedelta(days=days)
    return when.strftime(DATE)


def _host_reservation() -> dict[str, Any]:
    return {
        "resource_type": "physical:host",
        "min": 1,
        "max": 1,
        "hypervisor_properties": "",
        "resource_properties": "",
    }


def _lease(name: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "start_date": _at(30),
        "end_date": _at(31),
        "reservations": [_host_reservation()],
        "events": [],
    }
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


CASES = [
    Case(
        "a lease with no reservations, then shown, renamed, moved and deleted",
        [
            Step("POST", "/leases", _lease("empty", reservations=[]), 201),
            Step("GET", "/leases/{lease}"),
            Step("PUT", "/leases/{lease}", {"name": "empty-2"}),
            Step("PUT", "/leases/{lease}", {"end_date": _at(32)}),
            Step(
                "PUT",
                "/leases/{lease}",
                {"reservations": [_host_reservation()]},
                400,
                "Missing parameter reservation ID",
            ),
            Step(
                "PUT",
                "/leases/{lease}",
                {"end_date": "bogus"},
                400,
                "bogus is an invalid date. Required format: %Y-%m-%d %H:%M",
            ),
            Step(
                "PUT",
                "/leases/{lease}",
                {"start_date": _at(40)},
                400,
                "End date must be later than current and start date",
            ),
            Step("DELETE", "/leases/{lease}", None, 204),
            Step("GET", "/leases/{lease}", None, 404),
        ],
    ),
    Case(
        "a lease without the reservations field",
        [Step("POST", "/leases", _lease("none", reservations=None), 201)],
    ),
    Case(
        "an inverted window",
        [
            Step(
                "POST",
                "/leases",
                _lease("inverted", start_date=_at(31), end_date=_at(30)),
                400,
                "End date must be later than start date.",
            )
        ],
    ),
    Case(
        "a bogus end date",
        [
            Step(
                "POST",
                "/leases",
                _lease("bogus", end_date="tomorrow"),
                400,
                "tomorrow is an invalid date. Required format: %Y-%m-%d %H:%M",
            )
        ],
    ),
    Case(
        "a bogus start date",
        [
            Step(
                "POST",
                "/leases",
                _lease("bogus-start", start_date="2031-13-01 10:00"),
                400,
                "2031-13-01 10:00 is an invalid date. Required format: %Y-%m-%d %H:%M",
            )
        ],
    ),
    Case(
        "no end_date",
        [
            Step(
                "POST",
                "/leases",
                _lease("no-end", end_date=None),
                400,
                "Missing parameter end_date",
            )
        ],
    ),
    Case(
        "no name",
        [
            Step(
                "POST",
                "/leases",
                {k: v for k, v in _lease("x").items() if k != "name"},
                400,
                "Missing parameter name",
            )
        ],
    ),
    Case(
        "a reservation without resource_type",
        [
            Step(
                "POST",
                "/leases",
                _lease("no-type", reservations=[{"min": 1, "max": 1}]),
                400,
                "Missing parameter resource_type",
            )
        ],
    ),
    Case(
        "a start in the past",
        [Step("POST", "/leases", _lease("past", start_date=_at(-2), end_date=_at(-1)), 400)],
    ),
    Case(
        "a 73-character extra capability key",
        [
            Step(
                "POST",
                "/os-hosts",
                {"name": "node-long", "k" * 73: "v"},
                400,
                "Extra capability key too long",
            )
        ],
    ),
    Case(
        "a 65-character extra capability key",
        [
            Step(
                "POST",
                "/os-hosts",
                {"name": "node-65", "k" * 65: "v"},
                400,
                "Extra capability key too long",
            )
        ],
    ),
    Case(
        "a 64-character extra capability key",
        [Step("POST", "/os-hosts", {"name": "node-64", "k" * 64: "v"}, 201)],
    ),
    Case(
        "a host lease, shown, listed and deleted",
        [
            Step("POST", "/leases", _lease("one-host"), 201),
            Step("GET", "/leases/{lease}"),
            Step("GET", "/leases"),
            Step("DELETE", "/leases/{lease}", None, 204),
        ],
    ),
    Case(
        "a long extra capability key in a host update",
        [
            Step("POST", "/os-hosts", {"name": "node-2"}, 201),
            Step("PUT", "/os-hosts/{host}", {"k" * 70: "v"}),
        ],
    ),
    Case(
        "an unknown lease",
        [
            Step(
                "GET",
                "/leases/no-such-lease",
                None,
                404,
                "Object with {'lease_id': 'no-such-lease'} not found",
            )
        ],
    ),
    Case(
        "an unknown host",
        [
            Step(
                "GET", "/os-hosts/999999", None, 404, "Object with {'host_id': '999999'} not found"
            ),
            Step("PUT", "/os-hosts/999999", {"k": "v"}, 404, "Object with {'host_id': '999999'}"),
            Step("DELETE", "/os-hosts/999999", None, 404, "Object with {'host_id': '999999'}"),
        ],
    ),
    Case(
        "a lease without start_date",
        [Step("POST", "/leases", _lease("no-start", start_date=None), 400, "Missing parameter")],
    ),
    Case(
        "a lease starting in the past",
        [
            Step(
                "POST",
                "/leases",
                _lease("past-start", start_date=_at(-1)),
                400,
                "Start date must be later than current date",
            )
        ],
    ),
    Case(
        "an empty end date",
        [
            Step(
                "POST",
                "/leases",
                _lease("empty-end", end_date=""),
                400,
                " is an invalid date. Required format: %Y-%m-%d %H:%M",
            )
        ],
    ),
    Case(
        "min and max of hosts out of order, zero, malformed, missing",
        [
            Step(
                "POST",
                "/leases",
                _lease("range", reservations=[{**_host_reservation(), "min": 2, "max": 1}]),
                400,
                "Invalid values for min/max of hosts. Max must be equal to or larger than min.",
            ),
            Step(
                "POST",
                "/leases",
                _lease("zero", reservations=[{**_host_reservation(), "min": 0}]),
                400,
                "Malformed parameter min and max (must be greater than or equal to 1)",
            ),
            Step(
                "POST",
                "/leases",
                _lease("float", reservations=[{**_host_reservation(), "min": 1.5}]),
                400,
                "Malformed parameter min",
            ),
            Step(
                "POST",
                "/leases",
                _lease("no-max", reservations=[{**_host_reservation(), "max": None}]),
                400,
                "Missing parameter max",
            ),
        ],
    ),
    Case(
        "malformed resource_properties",
        [
            Step(
                "POST",
                "/leases",
                _lease(
                    "bad-filter",
                    reservations=[{**_host_reservation(), "resource_properties": "not json"}],
                ),
                400,
                "Malformed requirements not json",
            )
        ],
    ),
    Case(
        "before_end actions of a host reservation",
        [
            Step(
                "POST",
                "/leases",
                _lease("snap", reservations=[{**_host_reservation(), "before_end": "snapshot"}]),
                201,
            ),
            Step("DELETE", "/leases/{lease}", None, 204),
            Step(
                "POST",
                "/leases",
                _lease("bogus-be", reservations=[{**_host_reservation(), "before_end": "bogus"}]),
                400,
                "Malformed parameter before_end",
            ),
        ],
    ),
    Case(
        "before_end_date outside the lease, then at its edge",
        [
            Step(
                "POST",
                "/leases",
                _lease("late-warning", before_end_date=_at(32)),
                403,
                "Datetime is out of lease limits",
            ),
            Step(
                "POST",
                "/leases",
                _lease("edge-warning", before_end_date=_at(31)),
                403,
                "Datetime is out of lease limits",
            ),
        ],
    ),
    Case(
        "updates: empty, an unknown reservation, one without its id, an empty end",
        [
            Step("POST", "/leases", _lease("updated"), 201),
            Step("PUT", "/leases/{lease}", {}),
            Step(
                "PUT",
                "/leases/{lease}",
                {"reservations": [{"id": "nope", "min": 1, "max": 1}]},
                400,
                "Please enter valid reservation IDs. Invalid reservation IDs are: nope",
            ),
            Step(
                "PUT",
                "/leases/{lease}",
                {"reservations": [{"min": 1, "max": 1}]},
                400,
                "Missing parameter reservation ID",
            ),
            Step(
                "PUT",
                "/leases/{lease}",
                {"end_date": ""},
                400,
                " is an invalid date. Required format: %Y-%m-%d %H:%M",
            ),
            Step("DELETE", "/leases/{lease}", None, 204),
        ],
    ),
]


CASES += [
    Case(
        "routing errors: no such path, no such method",
        [
            Step(
                "GET",
                "/nothing",
                None,
                404,
                "The requested URL was not found on the server. If you entered the URL manually "
                "please check your spelling and try again.",
            ),
            Step("GET", "/leases/{lease}/nothing", None, 404),
            Step("PATCH", "/leases", {}, 405, "The method is not allowed for the requested URL."),
            Step("DELETE", "/os-hosts/properties/gpu", None, 405),
        ],
    ),
    Case(
        "a host property: shown as it is by an empty update, then made private",
        [
            Step("POST", "/os-hosts", {"name": "node-props", "gpu": "a100"}, 201),
            Step("PATCH", "/os-hosts/properties/gpu", {}),
            Step("PATCH", "/os-hosts/properties/gpu", {"private": True}),
            Step("DELETE", "/os-hosts/{host}", None, 204),
        ],
    ),
]


def _instances(affinity: object) -> dict[str, Any]:
    reservation = {
        "resource_type": "virtual:instance",
        "amount": 1,
        "vcpus": 2,
        "memory_mb": 1024,
        "disk_gb": 10,
        "affinity": affinity,
        "resource_properties": "",
    }
    return _lease(f"instances-{affinity!r}", reservations=[reservation])


CASES += [
    Case(
        "instance affinity: Blazar's none values and boolean strings, nothing else",
        [
            # Blazar takes the host's size from Nova (its launcher's); Climate from the body.
            Step(
                "POST",
                "/os-hosts",
                {"name": "node-sized", "vcpus": 32, "memory_mb": 131072, "local_gb": 1000},
                201,
            ),
            *(
                Step("POST", "/leases", _instances(bad), 400, "Malformed parameter affinity")
                for bad in ("", "null", "NONE", 2)
            ),
            Step("POST", "/leases", _instances(1), 201),
            Step("DELETE", "/leases/{lease}", None, 204),
            Step("POST", "/leases", _instances("none"), 201),
            Step("DELETE", "/leases/{lease}", None, 204),
            Step("DELETE", "/os-hosts/{host}", None, 204),
        ],
    ),
]


CASES += [
    Case(
        "what Blazar answers with a 500, Climate with a 400 in Blazar's words",
        [
            Step(
                "POST",
                "/leases",
                _lease("foo", reservations=[{"resource_type": "foo:bar", "min": 1}]),
                500,
                "The foo:bar resource type is not supported",
                ours=400,
            ),
            Step(
                "POST",
                "/leases",
                _lease(
                    "no-disk",
                    reservations=[{**_instances(None)["reservations"][0], "disk_gb": None}],
                ),
                500,
                ours=400,
            ),
        ],
    ),
]


def _run(base: str, case: Case) -> list[tuple[int, dict[str, Any] | None]]:
    answers: list[tuple[int, dict[str, Any] | None]] = []
    lease = host = "none"
    with httpx.Client(base_url=base, timeout=60) as http:
        for step in case.steps:
            response = http.request(
                step.method, step.path.format(lease=lease, host=host), json=step.body
            )
            found = response.json() if response.content else None
            if response.status_code == 201 and found and "lease" in found:
                lease = found["lease"]["id"]
            if response.status_code == 201 and found and "host" in found:
                host = found["host"]["id"]
            answers.append((response.status_code, found))
    return answers


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_climate_answers_as_blazar(blazar: str, climate: str, case: Case) -> None:
    theirs = _run(blazar, case)
    ours = _run(climate, case)
    for step, (their_status, their_body), (our_status, our_body) in zip(
        case.steps, theirs, ours, strict=True
    ):
        where = (case.name, step.method, step.path, their_body, our_body)
        assert their_status == step.status, where  # the case still says what Blazar does
        assert our_status == (step.ours or their_status), where
        if their_status >= 400:
            assert our_body is not None and their_body is not None, where
            # Routing errors have Blazar's Flask shape (``error``), the others its API's.
            for key in ("error_code", "error_name", "error"):
                if key in their_body and step.ours is None:
                    assert our_body.get(key) == their_body[key], (key, *where)
            if step.ours is not None:
                assert our_body["error_code"] == our_body["error_name"] == step.ours, where
            if step.message is not None:
                assert step.message in their_body["error_message"], where
                assert step.message in our_body["error_message"], where


def test_unknown_reservation_keys_are_ignored_as_blazar_ignores_them(
    blazar: str, climate: str
) -> None:
    """Blazar's plugins read only their own fields: a key they do not take (the blazar CLI and
    scripts may send one) neither fails a create or an update nor is stored."""
    extra = {"foo": "bar", "amount": 3}

    def shown(base: str) -> tuple[list[int], set[str]]:
        with httpx.Client(base_url=base, timeout=60) as http:
            made = http.post(
                "/leases", json=_lease("extra", reservations=[{**_host_reservation(), **extra}])
            )
            lease = made.json()["lease"]
            path = f"/leases/{lease['id']}"
            changes = {"reservations": [{"id": lease["reservations"][0]["id"], **extra}]}
            changed = http.put(path, json=changes)
            found = http.get(path).json()["lease"]["reservations"][0]
            http.delete(path)
            return [made.status_code, changed.status_code], set(found) & set(extra)

    assert shown(blazar) == ([201, 200], set())
    assert shown(climate) == ([201, 200], set())


ALLOCATION_QUERIES = [
    ("", True),
    ("?lease_id=", True),
    ("?lease_id=&reservation_id=", True),
    ("?lease_id={lease}", True),
    ("?reservation_id={reservation}", True),
    ("?lease_id=nope", False),
    ("?lease_id={lease}&reservation_id=nope", False),
]
"""Each query, and whether the lease made here is in its answer."""


def _allocations_seen(base: str) -> list[tuple[list[list[str]], list[str]]]:
    """For each query, the hosts' reservations (the lease made here as "held"), from both
    allocation routes, the per-host one on the host that holds the lease."""
    with httpx.Client(base_url=base, timeout=60) as http:
        lease = http.post("/leases", json=_lease("held")).json()["lease"]
        try:
            reservation = lease["reservations"][0]["id"]

            def tags(found: list[dict[str, Any]]) -> list[str]:
                return ["held" if r["lease_id"] == lease["id"] else "other" for r in found]

            listed = http.get("/os-hosts/allocations").json()["allocations"]
            (host,) = [a["resource_id"] for a in listed if "held" in tags(a["reservations"])]
            seen = []
            for query, _ in ALLOCATION_QUERIES:
                query = query.format(lease=lease["id"], reservation=reservation)
                everyone = http.get(f"/os-hosts/allocations{query}").json()["allocations"]
                one = http.get(f"/os-hosts/{host}/allocation{query}").json()["allocation"]
                held = sorted(tags(a["reservations"]) for a in everyone if a["reservations"])
                seen.append((held, tags(one["reservations"])))
            return seen
        finally:
            http.delete(f"/leases/{lease['id']}")


def test_host_allocations_are_filtered_as_blazar_filters_them(blazar: str, climate: str) -> None:
    """An empty ``lease_id`` or ``reservation_id`` is no filter, as in Blazar; an unknown one
    leaves each host's list empty; given both, both must match."""
    ours = _allocations_seen(climate)
    assert ours == [
        ([["held"]], ["held"]) if shown else ([], []) for _, shown in ALLOCATION_QUERIES
    ]
    assert _allocations_seen(blazar) == ours
