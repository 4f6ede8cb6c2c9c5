"""Typed dependencies: the services and the caller, taken from the app's state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from climate import inputs
from climate.api.allocation_renders import AllocationRenders
from climate.api.auth import Authenticator
from climate.api.lease_renders import Renders
from climate.context import Page
from climate.domain.actor import Actor
from climate.errors import InvalidInput, PayloadTooLarge
from climate.services.audit import AuditService
from climate.services.availability import AvailabilityService
from climate.services.healing import HealingService
from climate.services.hosts import HostService
from climate.services.idle import IdleService
from climate.services.instances import InstanceAllocationService
from climate.services.items import ItemService
from climate.services.leases import LeaseService
from climate.services.power import PowerService
from climate.services.tokens import TokenService
from climate.services.volume_pools import VolumePoolService


@dataclass
class Services:
    leases: LeaseService
    hosts: HostService
    tokens: TokenService
    audit: AuditService
    availability: AvailabilityService
    items: dict[str, ItemService]
    """Per item resource type."""
    volume_pools: VolumePoolService
    instances: InstanceAllocationService
    healing: HealingService
    power: PowerService
    idle: IdleService
    max_body_bytes: int
    lease_renders: Renders = field(default_factory=Renders)
    allocation_renders: AllocationRenders = field(default_factory=AllocationRenders)
    """Whole-host reservations' allocations, per host."""
    instance_renders: AllocationRenders = field(default_factory=lambda: AllocationRenders("count"))
    """Instance reservations' allocations, per host, each with its ``count``."""


# The cheap dependencies are ``async``: FastAPI runs a plain ``def`` dependency on the thread pool.
async def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def _actor(request: Request) -> Actor:
    authenticate: Authenticator = request.app.state.authenticate
    if authenticate.blocks:
        return await run_in_threadpool(authenticate, request)
    return authenticate(request)


async def _body(request: Request) -> bytes:
    limit = request.app.state.services.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body: larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body: larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass(frozen=True)
class Write:
    """A write's services, caller and body."""

    services: Services
    actor: Actor
    body: bytes


async def _write(request: Request) -> Write:
    # One dependency instead of three: FastAPI's solving of each shows in the admission's
    # profile (bench/README.md, limit). As before, the caller is known before the body is read.
    actor = await _actor(request)
    return Write(await _services(request), actor, await _body(request))


async def _page(limit: str | None = None, marker: str | None = None) -> Page:
    """``limit`` and ``marker`` as in OpenStack: a positive integer (clamped to the
    ``max_page_size`` setting by the service) and the id of the last item seen."""
    count = None if limit is None else inputs.integer("limit", limit, minimum=1)
    return Page(limit=count, marker=marker)


async def _sorted_page(
    page: Annotated[Page, Depends(_page)], sort_key: str | None = None, sort_dir: str = "asc"
) -> Page:
    if sort_dir not in ("asc", "desc"):
        raise InvalidInput("sort_dir", f"must be 'asc' or 'desc', not {sort_dir!r}")
    return Page(page.limit, page.marker, sort_key, sort_dir)


ServicesDep = Annotated[Services, Depends(_services)]
ActorDep = Annotated[Actor, Depends(_actor)]
BodyDep = Annotated[bytes, Depends(_body)]
WriteDep = Annotated[Write, Depends(_write)]
PageDep = Annotated[Page, Depends(_page)]
SortedPageDep = Annotated[Page, Depends(_sorted_page)]
