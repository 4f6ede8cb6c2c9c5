"""``virtual:volume``: ``amount`` volumes of ``size_gb`` each, from one storage pool's capacity.

A pool is not reserved whole: reservations share it as long as, at every instant, their sizes
add up to at most its ``capacity_gb`` (``planner/capacity.py``). The pool is chosen by name
(``pool``) or among those matching ``resource_properties``, best fit: the one the request leaves
the least room in. A running reservation stays in its pool (its volumes exist there).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from climate.db import volumes as volume_rows
from climate.db.tables import Reservation, VolumePool
from climate.domain.status import EndPolicy
from climate.errors import InvalidInput, NotEnoughCapacity
from climate.planner.availability import SearchRange
from climate.planner.calendar import moment
from climate.planner.capacity import Pool, choose_pool
from climate.planner.capacity_search import (
    AmountTimeline,
    StoragePool,
    VolumePlacer,
    VolumeRequest,
    volume_timeline,
)
from climate.planner.query import parse_query
from climate.resources.base import (
    POLICY_FIELDS,
    ResourceType,
    before_end_field,
    int_field,
    merged_fields,
    policy_fields,
    query_field,
    text_field,
)
from climate.resources.capabilities import PooledCapacity
from climate.resources.wire_fields import COUNT, POSITIVE, QUERY, STRING, WireFields, nullable

FIELDS = (
    frozenset({"size_gb", "amount", "pool", "resource_properties", "before_end"}) | POLICY_FIELDS
)


def pool_properties(pool: VolumePool) -> dict[str, str | int | None]:
    """What a ``resource_properties`` query sees of a pool."""
    found: dict[str, str | int | None] = {p.name: p.value for p in pool.properties}
    found.update(name=pool.name, capacity_gb=pool.capacity_gb)
    return found


def _storage_pools(
    session: Session, pool: str | None, resource_properties: str, start: int, end: int
) -> list[StoragePool]:
    """The reservable pools named ``pool`` (any, for None) matching the query, with what is
    held in each over [start, end) (seconds)."""
    query = parse_query("resource_properties", resource_properties)
    matching = [
        p
        for p in volume_rows.reservable(session)
        if (pool is None or p.name == pool) and query.matches(pool_properties(p))
    ]
    uses = volume_rows.uses(
        session, [p.id for p in matching], moment(start), moment(end), other_than=""
    )
    return [
        StoragePool(
            p.id,
            p.name,
            p.capacity_gb,
            [(s.timestamp(), e.timestamp(), gb) for s, e, gb in uses[p.id]],
        )
        for p in matching
    ]


class VolumeType(ResourceType, PooledCapacity):
    name = "virtual:volume"
    fields = FIELDS
    wire = WireFields(
        model="Volume",
        asked={
            "size_gb": COUNT,
            "amount": COUNT,
            "pool": nullable({"type": "string", "maxLength": 255}),
            "resource_properties": QUERY,
        },
        shown={
            "size_gb": POSITIVE,
            "amount": POSITIVE,
            "pool": nullable(STRING),
            "resource_properties": STRING,
        },
        required=("size_gb",),
    )
    end_policies = frozenset(
        {EndPolicy.RELEASE, EndPolicy.DELETE, EndPolicy.SNAPSHOT, EndPolicy.KEEP_UNTIL_ACK}
    )

    def validate(
        self, raw: Mapping[str, Any], current: Mapping[str, Any] | None, field: str
    ) -> dict[str, Any]:
        merged = merged_fields(self, raw, current)
        merged.setdefault("amount", 1)
        pool = merged.get("pool")
        return {
            "size_gb": int_field(merged, "size_gb", field, minimum=1),
            "amount": int_field(merged, "amount", field, minimum=1),
            "pool": None if pool in (None, "") else text_field(f"{field}.pool", pool),
            "resource_properties": query_field(merged, "resource_properties", field),
            "before_end": before_end_field(self.before_end_actions, merged, field),
            **policy_fields(self, merged, field),
        }

    def admit(
        self,
        session: Session,
        reservation: Reservation,
        start: dt.datetime,
        end: dt.datetime,
        *,
        active: bool,
        now: dt.datetime | None = None,
    ) -> None:
        params = reservation.params
        size, amount, named = params["size_gb"], params["amount"], params["pool"]
        need = size * amount
        query = parse_query("resource_properties", params["resource_properties"])
        pools = volume_rows.reservable(session)
        if named is not None and all(p.name != named for p in pools):
            raise InvalidInput("pool", f"no reservable volume pool named {named!r}")
        matching = [
            p
            for p in pools
            if (named is None or p.name == named) and query.matches(pool_properties(p))
        ]
        if not matching:
            raise NotEnoughCapacity(
                f"not enough volume capacity: {need} GB requested, but no reservable pool "
                "matches the properties"
            )
        largest = max(p.capacity_gb for p in matching)
        if need > largest:
            raise InvalidInput(
                "size_gb",
                f"{amount} x {size} GB = {need} GB is more than any matching pool can hold "
                f"(the largest holds {largest} GB)",
            )
        held = {a.pool_id for a in reservation.volume_allocations}
        if active and held:
            matching = [p for p in matching if p.id in held]
            if not matching:
                raise NotEnoughCapacity(
                    "the lease is active on a volume pool that no longer matches; its volumes "
                    "cannot move"
                )
        uses = volume_rows.uses(session, [p.id for p in matching], start, end, reservation.id)
        fit = choose_pool(
            [Pool(p.id, p.name, p.capacity_gb, uses[p.id]) for p in matching], need, start, end
        )
        if fit.free < need:
            raise NotEnoughCapacity(
                f"not enough volume capacity: {need} GB requested, {len(matching)} pool(s) "
                f"match, at most {max(fit.free, 0)} GB free for the whole window "
                f"{start.isoformat()} to {end.isoformat()} (pool {fit.pool.name})"
            )
        row = volume_rows.replace(
            session, reservation.id, reservation.lease_id, fit.pool.id, need, start, end
        )
        set_committed_value(reservation, "volume_allocations", [row])

    @contextlib.contextmanager
    def searching(
        self,
        session: Session,
        reservations: Sequence[tuple[int, Mapping[str, Any]]],
        search: SearchRange,
    ) -> Iterator[VolumePlacer]:
        """An availability search for validated reservations (position in the request,
        parameters), over the pools and their uses as committed.

        :raises InvalidInput: an unknown pool, or more than any matching pool holds
            (``reservations[i].pool``, ``reservations[i].size_gb``).
        """
        pools: dict[int, StoragePool] = {}
        requests = []
        names = {p.name for p in volume_rows.reservable(session)}
        for index, params in reservations:
            named = params["pool"]
            if named is not None and named not in names:
                raise InvalidInput(
                    f"reservations[{index}].pool", f"no reservable volume pool named {named!r}"
                )
            found = _storage_pools(
                session, named, params["resource_properties"], search.start, search.end
            )
            need = params["size_gb"] * params["amount"]
            largest = max((p.capacity for p in found), default=need)
            if need > largest:
                raise InvalidInput(
                    f"reservations[{index}].size_gb",
                    f"{params['amount']} x {params['size_gb']} GB = {need} GB is more than any "
                    f"matching pool can hold (the largest holds {largest} GB)",
                )
            pools.update((p.id, p) for p in found)
            requests.append(VolumeRequest(index, tuple(p.id for p in found), need))
        yield VolumePlacer(list(pools.values()), requests, search)

    def timeline(
        self,
        session: Session,
        pool: str | None,
        resource_properties: str,
        start: int,
        bucket: int,
        count: int,
    ) -> AmountTimeline:
        """Free GB per bucket (seconds) in the pools named ``pool`` (any, for None) matching
        the query."""
        pools = _storage_pools(session, pool, resource_properties, start, start + bucket * count)
        return volume_timeline(pools, start, bucket, count)

    def release(self, session: Session, reservation: Reservation, at: dt.datetime) -> None:
        if all(a.end_date <= at for a in reservation.volume_allocations):
            return
        volume_rows.truncate(session, reservation.id, at)
        session.refresh(reservation, ["volume_allocations"])

    def resource_ids(self, reservation: Reservation) -> list[str]:
        """One id per volume: the pool's id and the volume's number."""
        return [
            f"{a.pool_id}:{n}"
            for a in reservation.volume_allocations
            for n in range(reservation.params["amount"])
        ]
