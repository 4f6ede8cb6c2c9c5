"""A resource type from outside Climate: a toy item kind, ``toy:widget``, installed the way pip
leaves a plugin (its module and a ``*.dist-info`` naming it in the ``climate.resources`` entry
points, on ``sys.path``) gets its inventory at /v1/widgets, admission, allocations, availability
and its place in the OpenAPI document, with no change to Climate."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from climate.config import Settings
from climate.resources import load_resource_types
from climate.resources.capabilities import Items
from tests.conftest import LiveServer, serve

MODULE = "climate_toy_widgets"
TOY = '''
"""Widgets: whole items, ``amount`` of them, named by their ``label``, in ``shelf`` pools."""

from climate.resources.base import (
    POLICY_FIELDS,
    before_end_field,
    int_field,
    merged_fields,
    policy_fields,
    text_field,
)
from climate.resources.items import ItemDemand, ItemType
from climate.resources.kinds import Kind
from climate.resources.wire_fields import COUNT, POSITIVE, STRING, WireFields

WIDGETS = Kind(
    kind="widget",
    resource_type="toy:widget",
    singular="widget",
    plural="widgets",
    path="widgets",
    key="widget",
    model="Widget",
    rules="toy:widgets",
    name_field="label",
    check_name=text_field,
    fields={"shelf": STRING, "label": {"type": "string", "minLength": 1}},
    example={"shelf": "top", "label": "w-1", "colour": "red"},
    pool_field="shelf",
    pool_required=True,
)


class WidgetType(ItemType):
    name = "toy:widget"
    kind = WIDGETS
    wire = WireFields(
        model="Widget",
        asked={"amount": COUNT, "shelf": STRING},
        shown={"amount": POSITIVE, "shelf": STRING},
        required=("amount", "shelf"),
    )
    fields = frozenset({"amount", "shelf", "before_end"}) | POLICY_FIELDS

    def validate(self, raw, current, field):
        merged = merged_fields(self, raw, current)
        return {
            "amount": int_field(merged, "amount", field, minimum=1),
            "shelf": text_field(f"{field}.shelf", merged.get("shelf")),
            "before_end": before_end_field(self.before_end_actions, merged, field),
            **policy_fields(self, merged, field),
        }

    def demand(self, session, params):
        shelf = params["shelf"]
        found = self.inventory.matching(session, pool=shelf)
        return ItemDemand(found, params["amount"], params["amount"], where=f"on shelf {shelf}")
'''
ENTRY_POINTS = f"[climate.resources]\ntoy:widget = {MODULE}:WidgetType\n"
WINDOW = {"start_date": "2031-05-01 10:00", "end_date": "2031-05-01 12:00"}


@contextlib.contextmanager
def installed(directory: Path) -> Iterator[None]:
    """The toy plugin on ``sys.path`` as an installed distribution, until the block ends."""
    directory.mkdir()
    (directory / f"{MODULE}.py").write_text(TOY)
    metadata = directory / "climate_toy_widgets-0.1.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: climate-toy-widgets\nVersion: 0.1\n"
    )
    (metadata / "entry_points.txt").write_text(ENTRY_POINTS)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(directory))
        try:
            yield
        finally:
            sys.modules.pop(MODULE, None)


@pytest.fixture
def live_widgets(tmp_path: Path, settings: Settings, database_url: str) -> Iterator[LiveServer]:
    """A live server of a service that has the toy plugin installed, on SQLite and PostgreSQL."""
    with installed(tmp_path / "site"), serve(settings, database_url) as server:
        yield server


def lease(name: str, amount: int, shelf: str = "top") -> dict[str, Any]:
    widgets = {"resource_type": "toy:widget", "amount": amount, "shelf": shelf}
    return {"name": name, **WINDOW, "reservations": [widgets]}


def test_the_plugin_is_found_through_the_entry_points_and_gone_once_uninstalled(
    tmp_path: Path,
) -> None:
    with installed(tmp_path / "site"):
        widgets = load_resource_types()["toy:widget"]
        assert isinstance(widgets, Items) and widgets.kind.path == "widgets"
    assert "toy:widget" not in load_resource_types()
    assert MODULE not in sys.modules


def test_widgets_have_an_inventory_at_their_path(live_widgets: LiveServer) -> None:
    with httpx.Client(base_url=f"{live_widgets.url}/v1", timeout=30) as http:
        created = http.post("/widgets", json={"shelf": "top", "label": "w-1", "colour": "red"})
        assert created.status_code == 201, created.text
        widget = created.json()["widget"]
        assert (widget["shelf"], widget["label"], widget["colour"]) == ("top", "w-1", "red")
        assert widget["reservable"] is True
        one = f"/widgets/{widget['id']}"

        assert [w["id"] for w in http.get("/widgets").json()["widgets"]] == [widget["id"]]
        assert http.get(one).json()["widget"] == widget
        changed = http.put(one, json={"colour": "blue", "reservable": False})
        assert changed.status_code == 200, changed.text
        assert changed.json()["widget"]["colour"] == "blue"
        assert changed.json()["widget"]["reservable"] is False
        assert http.delete(one).status_code == 204
        assert http.get(one).status_code == 404
        assert http.get("/widgets").json()["widgets"] == []


def test_the_policy_guards_widgets_by_their_rules(live_widgets: LiveServer) -> None:
    member = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
    with httpx.Client(base_url=f"{live_widgets.url}/v1", headers=member, timeout=30) as http:
        refused = http.post("/widgets", json={"shelf": "top", "label": "w-1"})
        assert refused.status_code == 403
        assert "toy:widgets:post" in refused.json()["error_message"]
        assert http.get("/widgets/allocations").status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"label": "w-1"}, "shelf"),
        ({"shelf": "top"}, "label"),
        ({"shelf": "top", "label": "w-1", "colour": ["red"]}, "colour"),
        ({"shelf": "top", "label": "w-1", "reservable": "yes"}, "reservable"),
    ],
)
def test_a_bad_widget_is_a_400_naming_the_field(
    live_widgets: LiveServer, body: dict[str, Any], field: str
) -> None:
    response = httpx.post(f"{live_widgets.url}/v1/widgets", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error_message"].startswith(f"{field}:")


def test_widgets_are_leased_until_none_is_free(live_widgets: LiveServer) -> None:
    with httpx.Client(base_url=f"{live_widgets.url}/v1", timeout=30) as http:
        ids = [
            http.post("/widgets", json={"shelf": "top", "label": f"w-{i}"}).json()["widget"]["id"]
            for i in range(2)
        ]

        created = http.post("/leases", json=lease("both", 2))
        assert created.status_code == 201, created.text
        [reservation] = created.json()["lease"]["reservations"]
        assert (reservation["resource_type"], reservation["amount"]) == ("toy:widget", 2)
        assert sorted(a["resource_id"] for a in reservation["allocations"]) == sorted(ids)
        held = http.get("/widgets/allocations").json()["allocations"]
        assert {a["resource_id"]: len(a["reservations"]) for a in held} == dict.fromkeys(ids, 1)
        assert held[0]["reservations"][0]["lease_id"] == created.json()["lease"]["id"]

        refused = http.post("/leases", json=lease("more", 1))
        assert refused.status_code == 409, refused.text
        assert "Not enough widgets available on shelf top" in refused.json()["error_message"]
        assert http.delete(f"/widgets/{ids[0]}").status_code == 409


def test_availability_searches_widgets(live_widgets: LiveServer) -> None:
    with httpx.Client(base_url=f"{live_widgets.url}/v1", timeout=30) as http:
        http.post("/widgets", json={"shelf": "top", "label": "w-1"}).raise_for_status()
        assert http.post("/leases", json=lease("first", 1)).status_code == 201
        ask = {
            "reservations": [{"resource_type": "toy:widget", "amount": 1, "shelf": "top"}],
            "duration": "02:00",
            "search_start": WINDOW["start_date"],
            "search_end": "2031-05-02 10:00",
            "limit": 1,
        }

        searched = http.post("/availability", json=ask)

        assert searched.status_code == 200, searched.text
        [window] = searched.json()["windows"]
        assert window["start_date"].startswith("2031-05-01T12:00")
        [offered] = window["reservations"]
        assert [i["label"] for i in offered["items"]] == ["w-1"]
        timeline = http.get(
            "/availability/timeline",
            params={
                "resource_type": "toy:widget",
                "pool": "top",
                "start": WINDOW["start_date"],
                "end": "2031-05-01 14:00",
                "bucket": "7200",
            },
        )
        assert timeline.status_code == 200, timeline.text
        assert timeline.json()["timeline"]["unit"] == "widgets"
        assert [b["free"] for b in timeline.json()["timeline"]["buckets"]] == [0, 1]


def test_the_document_describes_widgets(live_widgets: LiveServer) -> None:
    document = httpx.get(f"{live_widgets.url}/openapi.json", timeout=30).json()
    paths = document["paths"]
    assert set(paths["/v1/widgets"]) == {"get", "post"}
    assert set(paths["/v1/widgets/{item_id}"]) == {"get", "put", "delete"}
    assert "/v1/widgets/allocations" in paths and "/v1/widgets/{item_id}/allocation" in paths
    schemas = document["components"]["schemas"]
    assert schemas["WidgetCreate"]["required"] == ["shelf", "label"]
    assert schemas["WidgetReservationCreate"]["required"] == ["resource_type", "amount", "shelf"]
    created = schemas["AnyReservationCreate"]["discriminator"]["mapping"]
    assert created["toy:widget"] == "#/components/schemas/WidgetReservationCreate"
