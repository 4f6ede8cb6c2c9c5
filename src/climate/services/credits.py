"""Credits of a project (docs/credits.md): its balance and ledger, read by its members and the
admins; credits granted (or taken back) by an admin. What admission and a lease's end do with
them is ``fairshare.credits``."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from climate import inputs, pricing
from climate.context import ServiceContext
from climate.db import credits as credit_rows
from climate.domain.actor import Actor
from climate.errors import Conflict, InvalidInput
from climate.fairshare import credits

LEDGER_PAGE = 1000
"""The most ledger entries one read returns."""
PROJECT_ID_LENGTH = 255
MAX_AMOUNT = Decimal("1000000000000")
"""The largest amount one grant may add or take (a typo guard, far beyond any budget)."""
MAX_BALANCE = Decimal(10**15)
"""The most grants may lift a balance to: far below what its 64-bit column holds, so that
refunds of what its leases encumbered always fit."""


@dataclass(frozen=True)
class Account:
    project_id: str
    enabled: bool
    """Credits are on (the setting ``credits``)."""
    balance: Decimal
    """What the project may still encumber."""
    encumbered: Decimal
    """What its leases hold encumbered, not yet settled."""


class CreditsService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def account(self, actor: Actor, project_id: str) -> Account:
        """:raises Forbidden: a member asks about another project."""
        self._may_read(actor, project_id)
        with self.ctx.db.reader() as session:
            balance = credit_rows.balance(session, project_id) or 0
            _, encumbered = credit_rows.totals(session, project_id)
        return Account(
            project_id,
            self.ctx.settings.credits,
            pricing.from_cents(balance),
            pricing.from_cents(encumbered),
        )

    def ledger(
        self, actor: Actor, project_id: str, limit: int | None = None, marker: int | None = None
    ) -> list[credit_rows.Written]:
        """The project's ledger, oldest first, at most ``limit`` entries after entry ``marker``.

        :raises Forbidden: a member asks about another project.
        :raises InvalidInput: ``limit`` is not between 1 and ``LEDGER_PAGE``."""
        self._may_read(actor, project_id)
        if limit is not None and not 1 <= limit <= LEDGER_PAGE:
            raise InvalidInput("limit", f"must be between 1 and {LEDGER_PAGE}")
        with self.ctx.db.reader() as session:
            return credit_rows.entries(session, project_id, limit or LEDGER_PAGE, marker)

    def grant(
        self, actor: Actor, project_id: str, amount: Decimal, note: str | None = None
    ) -> credit_rows.Written:
        """Add ``amount`` to the project's balance (negative: take it back).

        :raises Forbidden: the caller is not an admin.
        :raises InvalidInput: the amount is zero, not to the cent, or too large; the project
            id is blank, too long or has a control character.
        :raises Conflict: taking it back would leave the balance below zero, or granting
            it lift the balance above ``MAX_BALANCE``.
        """
        self.ctx.policy.enforce(actor, "climate:credits:grant", {"project_id": project_id})
        if not project_id.strip() or len(project_id) > PROJECT_ID_LENGTH:
            raise InvalidInput("project_id", f"from 1 to {PROJECT_ID_LENGTH} characters, not blank")
        inputs.name_text("project_id", project_id)
        if not amount or abs(amount) > MAX_AMOUNT or amount != amount.quantize(pricing.CENT):
            raise InvalidInput(
                "amount", f"must be a non-zero amount to the cent, at most {MAX_AMOUNT} either way"
            )
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            have = pricing.from_cents(credit_rows.balance(session, project_id) or 0)
            if amount > 0 and have + amount > MAX_BALANCE:
                raise Conflict(
                    f"amount: project {project_id} has {have} credits; "
                    f"granting {amount} would lift it above {MAX_BALANCE}"
                )
            written = credits.grant(self.ctx, session, actor, project_id, amount, now, note)
            if written is None:
                have = pricing.from_cents(credit_rows.balance(session, project_id) or 0)
                raise Conflict(
                    f"amount: project {project_id} has {have} credits; "
                    f"taking {-amount} would leave it below zero"
                )
        return written

    def _may_read(self, actor: Actor, project_id: str) -> None:
        self.ctx.policy.enforce(actor, "climate:credits:get", {"project_id": project_id})
