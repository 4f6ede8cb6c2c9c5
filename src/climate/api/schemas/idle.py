"""The heartbeat a lease's consumer sends while it uses the lease
(``POST /v1/leases/{id}/heartbeat``, docs/idle.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from climate import wire
from climate.services.idle import Heartbeat


class HeartbeatPublic(BaseModel):
    lease_id: str
    at: str = Field(description="when the heartbeat was recorded: the lease was in use then")
    warning_at: str | None = Field(
        description="when the lease is warned of idleness if no sign of use comes before; "
        "null when idle reclamation does not watch it"
    )
    release_at: str | None = Field(
        description="when the lease is ended for idleness if no sign of use comes before; "
        "null when idle reclamation does not watch it"
    )


class HeartbeatAnswer(BaseModel):
    heartbeat: HeartbeatPublic


def heartbeat_answer(beat: Heartbeat) -> HeartbeatAnswer:
    return HeartbeatAnswer(
        heartbeat=HeartbeatPublic(
            lease_id=beat.lease_id,
            at=wire.lease_date(beat.at),
            warning_at=None if beat.warning_at is None else wire.lease_date(beat.warning_at),
            release_at=None if beat.release_at is None else wire.lease_date(beat.release_at),
        )
    )
