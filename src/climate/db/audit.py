"""The audit log: one row per change, written in the transaction of the change.

A transaction's rows are written together, in one statement, as it commits (an admission
records a few: the lease, the usage rules' verdict, its credits); reads of the log in that
transaction see them. Each row is also logged as one JSON line on the ``climate.audit`` logger
once its transaction commits (a rolled-back change leaves neither a row nor a line).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, cast

import orjson
from sqlalchemy import Table, event, insert, literal, select
from sqlalchemy.orm import Session

from climate.db import raw
from climate.db.engine import AFTER_COMMIT
from climate.db.leases import string_rows
from climate.db.records import AuditLog
from climate.db.types import UTCDateTime
from climate.domain.actor import Actor

LOG = logging.getLogger("climate.audit")
_ORJSON = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_NON_STR_KEYS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)
AUDIT = cast(Table, AuditLog.__table__)
Detail = Mapping[str, object]
_ADD = insert(AUDIT)
_PENDING = "audit_pending"


def record(
    session: Session,
    *,
    at: dt.datetime,
    actor: Actor | str,
    action: str,
    target_type: str,
    target_id: str,
    detail: Detail | None = None,
) -> None:
    """One change by ``actor`` (a caller, or the name of a part of Climate: ``"manager"``)."""
    user, project = (actor.user_id, actor.project_id) if isinstance(actor, Actor) else (actor, None)
    row = {
        "at": at,
        "actor_user": user,
        "actor_project": project,
        "action": action,
        "target_type": target_type,
        "target_id": target_id,
        "detail": _encode(detail),
    }
    pending: list[dict[str, Any]] | None = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = []
    pending.append(row)
    _log_on_commit(session, [row])


@event.listens_for(Session, "before_commit")
def write_pending(session: Session) -> None:
    """The rows ``record`` kept for this transaction, in one INSERT (in the order recorded)."""
    rows = session.info.pop(_PENDING, None)
    if rows:
        raw.write(session, _ADD, rows)


@event.listens_for(Session, "after_rollback")
def _drop_pending(session: Session) -> None:
    session.info.pop(_PENDING, None)


def record_many(
    session: Session,
    *,
    at: dt.datetime,
    actor_user: str,
    action: str,
    target_type: str,
    items: Sequence[tuple[str, Detail]],
) -> None:
    """The same change to many targets (``items``: target id and detail), in one INSERT."""
    if not items:
        return
    write_pending(session)  # the rows recorded before these come before them
    encoded = [(target_id, _json(detail)) for target_id, detail in items]
    target_id, detail = string_rows(session, encoded, 2)
    source = select(
        literal(at, UTCDateTime()),
        literal(actor_user),
        literal(action),
        literal(target_type),
        target_id,
        detail,
    )
    session.execute(
        insert(AUDIT).from_select(
            ["at", "actor_user", "action", "target_type", "target_id", "detail"], source
        )
    )
    _log_on_commit(
        session,
        [
            {
                "at": at,
                "actor_user": actor_user,
                "actor_project": None,
                "action": action,
                "target_type": target_type,
                "target_id": item_id,
                "detail": item_detail,
            }
            for item_id, item_detail in encoded
        ],
    )


def find(
    session: Session,
    *,
    target_type: str | None = None,
    target_id: str | None = None,
    action: str | None = None,
    since: dt.datetime | None = None,
    after_id: int | None = None,
    limit: int | None = None,
) -> Sequence[AuditLog]:
    """Rows matching every filter given, oldest first (by id: the order they were written)."""
    write_pending(session)
    query = select(AuditLog).order_by(AuditLog.id)
    if target_type is not None:
        query = query.where(AuditLog.target_type == target_type)
    if target_id is not None:
        query = query.where(AuditLog.target_id == target_id)
    if action is not None:
        query = query.where(AuditLog.action == action)
    if since is not None:
        query = query.where(AuditLog.at >= since)
    if after_id is not None:
        query = query.where(AuditLog.id > after_id)
    return session.scalars(query.limit(limit)).all()


def exists(session: Session, audit_id: int) -> bool:
    write_pending(session)
    return session.get(AuditLog, audit_id) is not None


def _encode(detail: Detail | None) -> str | None:
    return None if detail is None else _json(detail)


def _json(detail: Detail) -> str:
    """``detail`` as JSON, keys sorted, what JSON has no type for written by ``str`` (times,
    decimals, dataclasses: as the standard library's ``default=str`` writes them). orjson takes
    a tenth of the standard library's time, which showed on every admission (a lease's audit
    row, the usage rules' verdict, a ledger entry); an integer past 64 bits it cannot write is
    left to the standard library."""
    try:
        return orjson.dumps(detail, default=str, option=_ORJSON).decode()
    except orjson.JSONEncodeError:
        return json.dumps(detail, sort_keys=True, default=str)


def _line(row: Mapping[str, Any]) -> str:
    """An audit row as its log line: a JSON object, keys sorted, its detail (JSON already)
    written as stored rather than parsed and written again."""
    line = {**row, "at": row["at"].isoformat(), "detail": orjson.Fragment(row["detail"] or "null")}
    return orjson.dumps(line, option=orjson.OPT_SORT_KEYS).decode()


def _log_on_commit(session: Session, rows: list[dict[str, Any]]) -> None:
    def log() -> None:
        if not LOG.isEnabledFor(logging.INFO):  # the line would be dropped: skip its JSON
            return
        for row in rows:
            LOG.info(_line(row))

    session.info.setdefault(AFTER_COMMIT, []).append(log)
