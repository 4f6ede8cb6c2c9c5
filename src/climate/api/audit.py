"""/v1/audit: the audit log, read only (Climate's own; Blazar has none)."""

from __future__ import annotations

import json

from fastapi import APIRouter

from climate import wire
from climate.api.deps import ActorDep, PageDep, ServicesDep
from climate.api.parsing import optional_date
from climate.api.rendering import JSONResponse
from climate.api.schemas.answers import V1, answers
from climate.api.schemas.searches import AuditLog

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get("", responses=answers(200, AuditLog, V1))
def list_audit(
    services: ServicesDep,
    actor: ActorDep,
    page: PageDep,
    target_type: str | None = None,
    target_id: str | None = None,
    action: str | None = None,
    since: str | None = None,
) -> JSONResponse:
    rows = services.audit.list_all(
        actor,
        target_type=target_type,
        target_id=target_id,
        action=action,
        since=optional_date("since", since),
        page=page,
    )
    return JSONResponse(
        {
            "audit_log": [
                {
                    "id": row.id,
                    "at": wire.lease_date(row.at),
                    "actor_user": row.actor_user,
                    "actor_project": row.actor_project,
                    "action": row.action,
                    "target_type": row.target_type,
                    "target_id": row.target_id,
                    "detail": json.loads(row.detail) if row.detail else None,
                }
                for row in rows
            ]
        }
    )
