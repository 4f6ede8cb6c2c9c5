"""Bodies of /v1/projects/{project_id}/credits and /ledger (docs/credits.md). Amounts are decimal
strings to the cent, never floats."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationInfo, WithJsonSchema

from climate.db.credits import Written
from climate.errors import InvalidInput
from climate.fairshare.credits import entry_body
from climate.services.credits import MAX_AMOUNT, Account

AMOUNT_PATTERN = r"-?\d{1,13}(\.\d{1,2})?"
MAX_NOTE = 255


def _amount(value: object, info: ValidationInfo) -> Decimal:
    field = info.field_name or "amount"
    if isinstance(value, bool):
        raise InvalidInput(
            field, f"is a boolean ({str(value).lower()}) where an amount is required"
        )
    if not isinstance(value, str | int):
        raise InvalidInput(field, "must be a decimal string such as '100.00' (or a whole number)")
    if isinstance(value, int) and abs(value) > MAX_AMOUNT:
        raise InvalidInput(field, f"must be at most {MAX_AMOUNT} either way")
    text = str(value).strip()
    if not re.fullmatch(AMOUNT_PATTERN, text, re.ASCII):
        raise InvalidInput(
            field,
            f"must be a decimal amount to the cent such as '-5' or '100.25', not {text[:40]!r}",
        )
    return Decimal(text)


Amount = Annotated[
    Decimal,
    PlainValidator(_amount),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": f"^{AMOUNT_PATTERN}$"},
                {"type": "integer"},
            ],
            "description": "a decimal amount to the cent, as a string ('100.00'); negative "
            "takes credits back",
        }
    ),
]


class CreditGrant(BaseModel):
    """Grant credits to a project (admin; ``climate credits grant PROJECT AMOUNT``)."""

    model_config = ConfigDict(extra="forbid")

    amount: Amount
    note: str | None = Field(None, max_length=MAX_NOTE, description="why, kept in the ledger")


class CreditAccount(BaseModel):
    project_id: str
    enabled: bool = Field(description="credits are on: admissions are priced and encumbered")
    balance: str = Field(description="what the project may still encumber")
    encumbered: str = Field(description="what its leases hold, not settled yet")


class CreditsAnswer(BaseModel):
    credits: CreditAccount


class LedgerEntry(BaseModel):
    id: int
    project_id: str
    lease_id: str | None
    kind: Literal["grant", "encumber", "adjust", "settle", "refund"]
    amount: str = Field(description="added to the balance (negative: taken from it)")
    encumbered: str = Field(description="added to what the lease holds encumbered")
    balance: str = Field(description="the project's balance after this entry")
    actor: str
    at: str
    note: str | None = Field(description="a grant's note, or the admission step")


class LedgerAnswer(BaseModel):
    ledger: list[LedgerEntry]


class EntryAnswer(BaseModel):
    entry: LedgerEntry


def account_answer(account: Account) -> CreditsAnswer:
    return CreditsAnswer(
        credits=CreditAccount(
            project_id=account.project_id,
            enabled=account.enabled,
            balance=str(account.balance),
            encumbered=str(account.encumbered),
        )
    )


def entry(written: Written) -> LedgerEntry:
    return LedgerEntry.model_validate(entry_body(written))
