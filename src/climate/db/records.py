"""Tables of what happened and what it cost, beside the models they refer to (``tables.py``):
the audit log, hosts' power periods, refused demand, the credits balances and ledger, and idle
leases. ``climate.db`` imports this module, so that ``Base.metadata`` always holds them."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from climate.db.tables import (
    ID_LENGTH,
    NAME_LENGTH,
    Base,
)


class AuditLog(Base):
    """One change: who (``actor_*``), what (``action`` on ``target_*``, ``detail`` as JSON text)
    and when (``at``), written in the transaction of the change itself."""

    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_log_target", "target_type", "target_id"),
        Index("ix_audit_log_at", "at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[dt.datetime]
    actor_user: Mapped[str | None] = mapped_column(Text)
    actor_project: Mapped[str | None] = mapped_column(Text)
    action: Mapped[str] = mapped_column(Text)
    target_type: Mapped[str] = mapped_column(Text)
    target_id: Mapped[str] = mapped_column(Text)
    detail: Mapped[str | None] = mapped_column(Text)


class HostPower(Base):
    """Host ``host_id`` was powered down from ``off_at`` until ``on_at`` (None: it still is),
    by the power policy (services/power.py)."""

    __tablename__ = "host_power"
    __table_args__ = (
        Index("ix_host_power_host", "host_id", "on_at"),
        Index("ix_host_power_off", "off_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"))
    off_at: Mapped[dt.datetime]
    on_at: Mapped[dt.datetime | None] = mapped_column(default=None)


class RefusedDemand(Base):
    """One reservation of a request Climate did not serve (docs/demand.md): refused at
    admission, timed out or given up in the waiting queue, or a hold left to lapse; what was
    asked (``resource_type``, ``count_min``-``count_max`` of ``properties``, ``params`` as
    validated, over [start_date, end_date)), when (``at``), why (``outcome``, ``reason``,
    ``message``) and the best counter-offer (``offer``: kind, start, end, min, max)."""

    __tablename__ = "refused_demand"
    __table_args__ = (
        Index("ix_refused_demand_window", "start_date", "end_date"),
        Index("ix_refused_demand_project", "project_id", "start_date"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[dt.datetime]
    project_id: Mapped[str] = mapped_column(String(255))
    user_id: Mapped[str] = mapped_column(String(255))
    lease_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    lease_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    step: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    resource_type: Mapped[str] = mapped_column(String(64))
    count_min: Mapped[int] = mapped_column(Integer)
    count_max: Mapped[int] = mapped_column(Integer)
    properties: Mapped[str] = mapped_column(Text)
    params: Mapped[dict[str, Any]]
    start_date: Mapped[dt.datetime]
    end_date: Mapped[dt.datetime]
    offer: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class CreditBalance(Base):
    """A project's credits, in whole cents: what it may still encumber (docs/credits.md). Only
    ever changed with a ledger entry (``db/credits.post``), never below zero."""

    __tablename__ = "credit_balances"
    project_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    balance_cents: Mapped[int] = mapped_column(BigInteger, default=0)


class CreditEntry(Base):
    """One line of a project's append-only ledger: ``amount_cents`` added to its balance (a
    debit is negative) and ``encumbered_cents`` added to what lease ``lease_id`` holds
    encumbered, by ``kind`` (grant, encumber, adjust, settle, refund)."""

    __tablename__ = "credit_ledger"
    __table_args__ = (
        Index("ix_credit_ledger_project", "project_id", "id"),
        Index("ix_credit_ledger_lease", "lease_id"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(String(255))
    lease_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    kind: Mapped[str] = mapped_column(String(16))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    encumbered_cents: Mapped[int] = mapped_column(BigInteger)
    balance_cents: Mapped[int] = mapped_column(BigInteger)
    """The project's balance after this entry."""
    actor: Mapped[str] = mapped_column(Text)
    at: Mapped[dt.datetime]
    note: Mapped[str | None] = mapped_column(Text)


class LeaseIdle(Base):
    """Idle reclamation's record of a lease (services/idle.py): when it was last seen in use
    (a heartbeat, or the backend's probe), when it was last warned, whether an admin exempted
    it. A lease without a row was never seen in use nor warned: it is idle since its start."""

    __tablename__ = "lease_idle"
    lease_id: Mapped[str] = mapped_column(
        ForeignKey("leases.id", ondelete="CASCADE"), primary_key=True
    )
    last_used_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    warned_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    exempt: Mapped[bool] = mapped_column(Boolean, default=False)
    """Set by an admin: never warned nor released, whatever its idleness."""
