"""Taking a host out of a Nova aggregate while Placement's mirror of it races
(backends/openstack/aggregates.py). Nova answers such a race with a 409 only now and then, when
two reservations of one compute end within milliseconds: the answers are built here from Nova's
own wording, through openstacksdk's own parsing of a response."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from openstack.exceptions import ConflictException, raise_from_response

from climate.backends.openstack.aggregates import GENERATION_ATTEMPTS, Aggregates

# nova.exception.ResourceProviderUpdateConflict, as Nova 34 words it
GENERATION_RACE = (
    "A conflict was encountered attempting to update resource provider "
    "5c2a1f0e-0000-4000-8000-000000000001 (generation 7): "
    '{"errors": [{"status": 409, "title": "Conflict", "detail": "There was a conflict when '
    'trying to complete your request.\\n\\n resource provider generation conflict  ", '
    '"code": "placement.concurrent_update"}]}'
)
# nova.exception.InvalidAggregateActionDelete-like refusal: servers would change zone
ZONE_REFUSAL = (
    "Cannot remove host compute1 in aggregate 3: Host compute1 has instances in the "
    "availability zone of aggregate 3"
)


def conflict(message: str) -> ConflictException:
    response = requests.Response()
    response.status_code = 409
    response.headers["content-type"] = "application/json"
    response._content = json.dumps(
        {"conflictingRequest": {"code": 409, "message": message}}
    ).encode()
    try:
        raise_from_response(response)
    except ConflictException as error:
        return error
    raise AssertionError("a 409 did not raise")


@dataclass
class Compute:
    """Nova's aggregates: the first ``failures`` removals answer ``refusal``."""

    hosts: dict[str, list[str]]
    failures: int = 0
    refusal: str = GENERATION_RACE
    asked: int = 0
    made: list[str] = field(default_factory=list)

    def remove_host_from_aggregate(self, aggregate: Any, host: str) -> Any:
        self.asked += 1
        if self.asked <= self.failures:
            raise conflict(self.refusal)
        self.hosts[aggregate.name].remove(host)
        return SimpleNamespace(name=aggregate.name, hosts=list(self.hosts[aggregate.name]))

    def add_host_to_aggregate(self, aggregate: Any, host: str) -> Any:
        self.hosts[aggregate.name].append(host)
        return SimpleNamespace(name=aggregate.name, hosts=list(self.hosts[aggregate.name]))

    def aggregates(self) -> list[Any]:
        return [SimpleNamespace(name=n, hosts=list(h)) for n, h in self.hosts.items()]

    def delete_aggregate(self, aggregate: Any, ignore_missing: bool) -> None:
        del self.hosts[aggregate.name]


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    pauses: list[float] = []
    monkeypatch.setattr("time.sleep", pauses.append)
    return pauses


def test_a_reservation_ending_beside_another_on_its_compute_still_hands_the_host_back(
    no_pauses: list[float],
) -> None:
    compute = Compute({"freepool": [], "r-1": ["compute1"]}, failures=3)
    Aggregates(SimpleNamespace(compute=compute), "freepool").dissolve("r-1")
    assert compute.hosts == {"freepool": ["compute1"]}
    assert compute.asked == 4
    assert len(no_pauses) == 3 and all(0 <= p <= 0.05 * n for n, p in enumerate(no_pauses, 1))


def test_a_race_that_never_settles_fails_after_a_bounded_number_of_attempts(
    no_pauses: list[float],
) -> None:
    compute = Compute({"freepool": [], "r-1": ["compute1"]}, failures=GENERATION_ATTEMPTS)
    with pytest.raises(ConflictException) as refused:
        Aggregates(SimpleNamespace(compute=compute), "freepool").dissolve("r-1")
    assert "generation 7" in str(refused.value.details)
    assert compute.asked == GENERATION_ATTEMPTS
    assert compute.hosts["r-1"] == ["compute1"]  # joined the freepool first, still in its own


def test_a_conflict_that_is_a_refusal_is_not_asked_again(no_pauses: list[float]) -> None:
    compute = Compute({"freepool": ["compute1"], "r-1": []}, failures=1, refusal=ZONE_REFUSAL)
    pool = Aggregates(SimpleNamespace(compute=compute), "freepool")
    with pytest.raises(ConflictException) as refused:
        pool.move_in(SimpleNamespace(name="r-1", hosts=[]), ["compute1"], leave_freepool=True)
    assert "availability zone" in str(refused.value.details)
    assert compute.asked == 1 and no_pauses == []
