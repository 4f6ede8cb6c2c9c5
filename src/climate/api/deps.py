"""Typed dependencies: the services and the caller, taken from the app's state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from climate.domain.actor import Actor
from climate.errors import PayloadTooLarge
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from climate.services.tokens import TokenService


@dataclass
class Services:
    leases: LeaseService
    hosts: HostService
    tokens: TokenService
    max_body_bytes: int


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def _actor(request: Request) -> Actor:
    actor: Actor = request.app.state.authenticate(request)
    return actor


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


ServicesDep = Annotated[Services, Depends(_services)]
ActorDep = Annotated[Actor, Depends(_actor)]
BodyDep = Annotated[bytes, Depends(_body)]
