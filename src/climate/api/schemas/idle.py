"""Idle reclamation on the wire (docs/idle.md): the heartbeat a lease's consumer sends while it
uses the lease (``POST /v1/leases/{id}/heartbeat``) and an admin's opt-out of a lease
(``PUT /v1/leases/{id}/idle``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from climate import wire
from climate.services.idle import Heartbeat, IdleState


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


class IdleUpdate(BaseModel):
    """Exempt a lease from idle reclamation, or no longer (admin)."""

    model_config = ConfigDict(extra="forbid")
    exempt: StrictBool = Field(description="true: never warned nor released for idleness")


class IdlePublic(BaseModel):
    lease_id: str
    exempt: bool
    last_used_at: str | None = Field(description="the last sign of use seen (null: none yet)")
    warned_at: str | None = Field(description="the last idleness warning (null: none)")


class IdleAnswer(BaseModel):
    idle: IdlePublic


def idle_answer(state: IdleState) -> IdleAnswer:
    return IdleAnswer(
        idle=IdlePublic(
            lease_id=state.lease_id,
            exempt=state.exempt,
            last_used_at=None
            if state.last_used_at is None
            else wire.lease_date(state.last_used_at),
            warned_at=None if state.warned_at is None else wire.lease_date(state.warned_at),
        )
    )
