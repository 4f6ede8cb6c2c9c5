"""The one exception tree of Climate.

Every error knows its HTTP status and a name for the logs (Blazar's body repeats the status as
``error_name``); only the API layer turns them into responses::

    ClimateError (500)
    ├── InvalidInput (400)          a field is missing, malformed or out of range
    │   └── MalformedQuery (400)    a resource_properties / hypervisor_properties query
    ├── NotAuthorized (401)         no or bad credentials
    ├── Forbidden (403)             the role may not do this
    ├── NotFound (404)              unknown lease, host, property (or one of another project)
    ├── Conflict (409)              the request is valid but the current state refuses it
    │   ├── NotEnoughCapacity (409) admission refused: not enough matching free resources
    │   │   └── UsageRuleBroken (403) admission refused by a usage rule or the external hook
    │   │       └── NotEnoughCredits (403) the project's balance cannot cover the lease's quote
    │   └── ResourceInUse (409)     a host with current or future allocations
    ├── PayloadTooLarge (413)
    └── BackendError (500)          a backend side effect failed (recorded on the event)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class ClimateError(Exception):
    status = 500
    name = "INTERNAL_SERVER_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ClimateError):
    status = 400
    name = "INVALID_INPUT"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class MalformedQuery(InvalidInput):
    name = "MALFORMED_REQUIREMENTS"


class NotAuthorized(ClimateError):
    status = 401
    name = "NOT_AUTHORIZED"


class Forbidden(ClimateError):
    status = 403
    name = "FORBIDDEN"


class NotFound(ClimateError):
    status = 404
    name = "NOT_FOUND"

    def __init__(self, kind: str, ident: object, blazar_key: str | None = None) -> None:
        """``blazar_key``: what Blazar's own 404 names the id by (``lease_id``, ``host_id``):
        its text, ``Object with {'host_id': '7'} not found``, follows ours, for the scripts
        that read it."""
        message = f"{kind} {ident} could not be found"
        if blazar_key is not None:
            message += f" (Object with { ({blazar_key: str(ident)}) } not found)"
        super().__init__(message)


class Conflict(ClimateError):
    status = 409
    name = "CONFLICT"


class NotEnoughCapacity(Conflict):
    name = "NOT_ENOUGH_RESOURCES_AVAILABLE"


class UsageRuleBroken(NotEnoughCapacity):
    """Admission refused by a usage rule (or the external admission hook), answered 403. It is
    a refusal of admission like too little capacity, so every path that handles those (the
    waiting queue, a series' skipped occurrences, offers tried as updates) handles it too."""

    status = 403
    name = "USAGE_RULE_BROKEN"

    def __init__(self, message: str, rules: Sequence[Mapping[str, Any]]) -> None:
        super().__init__(message)
        self.rules = tuple(rules)
        """Each rule broken (or the external service's decision), JSON-ready."""


class NotEnoughCredits(UsageRuleBroken):
    """Admission refused because the project's credits cannot cover the lease's quote
    (docs/credits.md); amounts are decimal strings to the cent."""

    name = "NOT_ENOUGH_CREDITS"

    def __init__(self, project_id: str, balance: str, quote: str, shortfall: str) -> None:
        super().__init__(
            f"not enough credits: project {project_id} has {balance}; the lease's quote is "
            f"{quote}, short by {shortfall}",
            [
                {
                    "rule": "credits",
                    "kind": "credits",
                    "allowed": False,
                    "balance": balance,
                    "quote": quote,
                    "shortfall": shortfall,
                }
            ],
        )
        self.balance, self.quote, self.shortfall = balance, quote, shortfall


class ResourceInUse(Conflict):
    name = "RESOURCE_IN_USE"


class PayloadTooLarge(ClimateError):
    status = 413
    name = "REQUEST_ENTITY_TOO_LARGE"


class BackendError(ClimateError):
    name = "BACKEND_ERROR"


def database_words(exc: BaseException) -> str:
    """What the database itself said under a SQLAlchemy error (its DBAPI exception, else the
    error), on one line: for an operator to read in a log line or an error message."""
    cause = getattr(exc, "orig", None) or exc
    return " ".join(str(cause).split()) or type(cause).__name__
