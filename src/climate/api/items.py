"""The inventories of the resource types other than hosts, with their allocations: each item
kind's (/v1/devices, /v1/networks, /v1/floatingips, ... at its ``Kind.path``) and
/v1/volume-pools."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Response

from climate import wire
from climate.api.allocation_renders import allocation
from climate.api.deps import ActorDep, BodyDep, PageDep, Services, ServicesDep, SortedPageDep
from climate.api.hosts import FiltersDep
from climate.api.parsing import json_object
from climate.api.rendering import JSONResponse
from climate.api.schemas import body
from climate.api.schemas.answers import ONE, V1, WRITE, answers
from climate.api.schemas.bodies import ItemUpdate, VolumePoolCreate, VolumePoolUpdate, item_create
from climate.api.schemas.inventory import (
    HostAllocation,
    VolumePoolAllocation,
    VolumePoolAnswer,
    VolumePools,
    allocations,
    item_models,
)
from climate.resources.kinds import Kind
from climate.services.items import ItemAllocations, ItemService
from climate.services.volume_pools import PoolAllocations

ITEM_ALLOCATION, ITEM_ALLOCATIONS = allocations(HostAllocation)
POOL_ALLOCATION, POOL_ALLOCATIONS = allocations(VolumePoolAllocation)


def _item_allocation(found: ItemAllocations) -> dict[str, object]:
    return allocation(found.item_id, found.reservations)


def _pool_allocation(found: PoolAllocations) -> dict[str, object]:
    return allocation(found.pool_id, found.reservations, "size_gb")


def item_router(kind: Kind) -> APIRouter:
    path, key = kind.path, kind.key
    router = APIRouter(prefix=f"/v1/{path}", tags=[path])
    one, many = item_models(kind)

    def inventory(services: Services) -> ItemService:
        return services.items[kind.resource_type]

    def render(items: Sequence[Any]) -> list[dict[str, Any]]:
        return [wire.item(i, kind) for i in items]

    @router.get("", name=f"list_{path}", responses=answers(200, many, V1))
    def list_items(services: ServicesDep, actor: ActorDep, page: SortedPageDep) -> JSONResponse:
        return JSONResponse({path: render(inventory(services).list_all(actor, page))})

    @router.post(
        "",
        status_code=201,
        name=f"create_{key}",
        openapi_extra=body(item_create(kind)),
        responses=answers(201, one, V1 | WRITE),
    )
    def create_item(services: ServicesDep, actor: ActorDep, body: BodyDep) -> JSONResponse:
        item = inventory(services).create(actor, json_object(body))
        return JSONResponse({key: wire.item(item, kind)}, status_code=201)

    @router.get(
        "/allocations",
        name=f"list_{key}_allocations",
        responses=answers(200, ITEM_ALLOCATIONS, V1),
    )
    def list_allocations(
        services: ServicesDep, actor: ActorDep, filters: FiltersDep, page: PageDep
    ) -> JSONResponse:
        """A page of items (by id; ``marker`` is a ``resource_id``) with their allocations."""
        found = inventory(services).allocations(actor, page=page, **filters.as_arguments())
        return JSONResponse({"allocations": [_item_allocation(a) for a in found]})

    @router.get("/{item_id}", name=f"show_{key}", responses=answers(200, one, ONE))
    def show_item(services: ServicesDep, actor: ActorDep, item_id: str) -> JSONResponse:
        return JSONResponse({key: wire.item(inventory(services).get(actor, item_id), kind)})

    @router.put(
        "/{item_id}",
        name=f"update_{key}",
        openapi_extra=body(ItemUpdate),
        responses=answers(200, one, ONE | {413}),
    )
    def update_item(
        services: ServicesDep, actor: ActorDep, item_id: str, body: BodyDep
    ) -> JSONResponse:
        item = inventory(services).update(actor, item_id, json_object(body))
        return JSONResponse({key: wire.item(item, kind)})

    @router.delete(
        "/{item_id}",
        status_code=204,
        name=f"delete_{key}",
        responses=answers(204, None, ONE | {409}),
    )
    def delete_item(services: ServicesDep, actor: ActorDep, item_id: str) -> Response:
        inventory(services).delete(actor, item_id)
        return Response(status_code=204)

    @router.get(
        "/{item_id}/allocation",
        name=f"show_{key}_allocation",
        responses=answers(200, ITEM_ALLOCATION, ONE),
    )
    def show_allocation(
        services: ServicesDep, actor: ActorDep, item_id: str, filters: FiltersDep
    ) -> JSONResponse:
        found = inventory(services).allocations(actor, item_id=item_id, **filters.as_arguments())
        return JSONResponse({"allocation": _item_allocation(found[0])})

    return router


pools = APIRouter(prefix="/v1/volume-pools", tags=["volume-pools"])


@pools.get("", responses=answers(200, VolumePools, V1))
def list_pools(services: ServicesDep, actor: ActorDep, page: SortedPageDep) -> JSONResponse:
    found = services.volume_pools.list_all(actor, page)
    return JSONResponse({"volume_pools": [wire.volume_pool(p) for p in found]})


@pools.post(
    "",
    status_code=201,
    openapi_extra=body(VolumePoolCreate),
    responses=answers(201, VolumePoolAnswer, V1 | WRITE, creates=("pool_id", "/volume_pool/id")),
)
def create_pool(services: ServicesDep, actor: ActorDep, body: BodyDep) -> JSONResponse:
    pool = services.volume_pools.create(actor, json_object(body))
    return JSONResponse({"volume_pool": wire.volume_pool(pool)}, status_code=201)


@pools.get("/allocations", responses=answers(200, POOL_ALLOCATIONS, V1))
def list_pool_allocations(
    services: ServicesDep, actor: ActorDep, filters: FiltersDep, page: PageDep
) -> JSONResponse:
    """A page of pools (by id) with their allocations, each with its ``size_gb``."""
    found = services.volume_pools.allocations(actor, page=page, **filters.as_arguments())
    return JSONResponse({"allocations": [_pool_allocation(a) for a in found]})


@pools.get("/{pool_id}", responses=answers(200, VolumePoolAnswer, ONE))
def show_pool(services: ServicesDep, actor: ActorDep, pool_id: str) -> JSONResponse:
    return JSONResponse(
        {"volume_pool": wire.volume_pool(services.volume_pools.get(actor, pool_id))}
    )


@pools.put(
    "/{pool_id}",
    openapi_extra=body(VolumePoolUpdate),
    responses=answers(200, VolumePoolAnswer, ONE | WRITE),
)
def update_pool(
    services: ServicesDep, actor: ActorDep, pool_id: str, body: BodyDep
) -> JSONResponse:
    pool = services.volume_pools.update(actor, pool_id, json_object(body))
    return JSONResponse({"volume_pool": wire.volume_pool(pool)})


@pools.delete("/{pool_id}", status_code=204, responses=answers(204, None, ONE | {409}))
def delete_pool(services: ServicesDep, actor: ActorDep, pool_id: str) -> Response:
    services.volume_pools.delete(actor, pool_id)
    return Response(status_code=204)


@pools.get("/{pool_id}/allocation", responses=answers(200, POOL_ALLOCATION, ONE))
def show_pool_allocation(
    services: ServicesDep, actor: ActorDep, pool_id: str, filters: FiltersDep
) -> JSONResponse:
    found = services.volume_pools.allocations(actor, pool_id=pool_id, **filters.as_arguments())
    return JSONResponse({"allocation": _pool_allocation(found[0])})
