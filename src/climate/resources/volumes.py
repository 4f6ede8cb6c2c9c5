"""``virtual:volume``: ``amount`` volumes of ``size_gb`` each, from one storage pool's capacity.

A pool is not reserved whole: reservations share it as long as, at every instant, their sizes
add up to at most its ``capacity_gb`` (``planner/capacity.py``). The pool is chosen by name
(``pool``) or among those matching ``resource_properties``, best fit: the one the request leaves
the least room in. A running reservation stays in its pool (its volumes exist there).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from climate.db import volumes as volume_rows
from climate.db.tables import Reservation, VolumePool
from climate.domain.status import EndPolicy
from climate.errors import InvalidInput, NotEnoughCapacity
from climate.planner.capacity import Pool, choose_pool
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
from climate.resources.wire_fields import COUNT, POSITIVE, QUERY, STRING, WireFields, nullable

FIELDS = (
    frozenset({"size_gb", "amount", "pool", "resource_properties", "before_end"}) | POLICY_FIELDS
)


def pool_properties(pool: VolumePool) -> dict[str, str | int | None]:
    """What a ``resource_properties`` query sees of a pool."""
    found: dict[str, str | int | None] = {p.name: p.value for p in pool.properties}
    found.update(name=pool.name, capacity_gb=pool.capacity_gb)
    return found


class VolumeType(ResourceType):
    name = "virtual:volume"
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
        merged = merged_fields(raw, current, FIELDS, field)
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
