"""The interface every resource type implements."""

from __future__ import annotations

import abc
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from sqlalchemy.orm import Session

from climate import inputs
from climate.config import Settings
from climate.db.tables import Reservation
from climate.domain.status import EndPolicy, StartPolicy
from climate.domain.views import ReservationView
from climate.errors import InvalidInput
from climate.planner.query import parse_query
from climate.resources.wire_fields import WireFields

POLICY_FIELDS = frozenset({"start_policy", "end_policy"})
"""Reservation fields of every resource type (docs/policies.md)."""
STARTED_AT = "started_at"
"""Params key: when the project started a manual reservation (ISO 8601)."""
ACKNOWLEDGED_AT = "acknowledged_at"
"""Params key: when the project acknowledged a keep-until-ack reservation's end."""


class ResourceType(abc.ABC):
    """Knows what "N of these with those properties" means over time; never calls a cloud.

    The backend does the side effects; a resource type validates requests, admits them against
    capacity (through the pure planner) and records allocations, all inside the caller's
    transaction.
    """

    name: ClassVar[str]
    before_end_actions: ClassVar[frozenset[str]] = frozenset({"", "default"})
    end_policies: ClassVar[frozenset[EndPolicy]] = frozenset({EndPolicy.RELEASE, EndPolicy.DELETE})
    """The end policies that mean something for this type's resources."""
    acts_for_lessee: ClassVar[bool] = False
    """The backend makes things in the lessee's project for it (an instance reservation's
    server group): a lease of this type carries a Keystone trust (``ServiceContext.delegate``)."""
    wire: ClassVar[WireFields | None] = None
    """Its reservation fields on the wire, for the API's document (None: not described)."""
    fields: ClassVar[frozenset[str]]
    """The reservation fields this type takes (``resource_type`` and ``id`` aside). Others are
    ignored, not stored: Blazar's plugins read only theirs, and the blazar CLI and scripts may
    send more."""
    books_per_resource: ClassVar[bool] = False
    """A new reservation can be admitted beside other admissions in the shared mode
    (``db/locking.py``): ``admit`` then locks the resources it books and raises
    ``locking.Contended`` where it would need more than that (moving other leases)."""

    def configure(self, settings: Settings) -> None:
        """Take the operator's settings (called once, when the service context is built);
        most types need none."""
        return None

    def known(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """``raw`` without the fields this type does not take."""
        return {key: value for key, value in raw.items() if key in self.fields}

    def check_running_change(self, raw: Mapping[str, Any], field: str) -> None:
        """Refuse a change of fields ``raw`` that this type's running reservations do not take
        (each type's ``admit`` checks what it can keep; this is for what it never takes). Most
        types take any change their ``admit`` can keep."""
        return None

    @abc.abstractmethod
    def validate(
        self, raw: Mapping[str, Any], current: Mapping[str, Any] | None, field: str
    ) -> dict[str, Any]:
        """Check and normalise reservation fields.

        :param raw: the fields as the client sent them (``resource_type`` and ``id`` removed).
        :param current: the stored fields when updating, None when creating; ``raw`` is merged on.
        :param field: where in the request these fields are, to name in errors.
        :returns: the parameters to store.
        :raises InvalidInput: naming the offending field.
        """

    @abc.abstractmethod
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
        """Allocate resources for ``reservation`` over [start, end), replacing what it had.

        :param active: the lease runs already; resources it holds now may not move.
        :param now: the current time: pending leases starting after it may exchange their
            resources for equivalent ones to make room (None: nothing else moves).
        :raises NotEnoughCapacity: with the reason.
        """

    @abc.abstractmethod
    def release(self, session: Session, reservation: Reservation, at: dt.datetime) -> None:
        """Give back the reservation's resources from ``at`` on."""

    @abc.abstractmethod
    def resource_ids(self, reservation: Reservation) -> list[str]:
        """Identifiers of the allocated resources, as the backend knows them."""

    def shown(self, reservation: ReservationView) -> dict[str, Any]:
        """Fields of its own a reservation of this type shows on the wire after the common
        ones (``wire.reservation``): none unless the type says so."""
        return {}


def in_request(index: int, bad: InvalidInput) -> InvalidInput:
    """``bad`` said of the ``index``-th reservation of a request: ``reservations[2].pool``."""
    problem = str(bad).removeprefix(f"{bad.field}: ")
    return InvalidInput(f"reservations[{index}].{bad.field}", problem)


COUNT_TOO_SMALL = "Malformed parameter min and max (must be greater than or equal to 1)"
INVALID_RANGE = "Invalid values for min/max of hosts. Max must be equal to or larger than min."
"""Blazar's words for a count range's bounds (its host plugin's)."""


def changed_while_running(
    active: bool, now: dt.datetime | None, start: dt.datetime, end: dt.datetime
) -> dt.datetime | None:
    """``now`` when a running reservation over [start, end) is being changed, else None: what
    it holds keeps its dates, and what it gains is held from ``now``, as healing dates a spare,
    so it need only be free from then on."""
    return now if active and now is not None and start < now < end else None


def int_field(
    raw: Mapping[str, Any], key: str, field: str, *, minimum: int, too_small: str = ""
) -> int:
    """An integer from ``minimum`` to ``inputs.MAX_INT``, given as a number or an integer-like
    string (the blazar CLI sends strings). Refused in Blazar's words first (``Missing parameter
    amount``, ``Malformed parameter amount``), or ``too_small``'s for one below ``minimum``."""
    where = f"{field}.{key}"
    value = raw.get(key)
    if value is None:
        raise InvalidInput(where, f"Missing parameter {key} (a required integer)")
    try:
        number = inputs.integer(where, value, minimum=-inputs.MAX_INT)
    except InvalidInput as exc:
        problem = exc.message.removeprefix(f"{where}: ")
        raise InvalidInput(where, f"Malformed parameter {key} ({problem})") from None
    if number < minimum:
        blazar = too_small or f"Malformed parameter {key} must be >= {minimum}"
        raise InvalidInput(where, f"{blazar} (not {inputs.shown(value)})")
    return number


def text_field(field_name: str, value: object) -> str:
    """A name: a non-empty one-line string (or a number), at most 255 characters."""
    if isinstance(value, bool) or not isinstance(value, str | int) or not str(value).strip():
        raise InvalidInput(field_name, f"must be a non-empty string, not {inputs.shown(value)}")
    text = inputs.name_text(field_name, str(value).strip())
    if len(text) > 255:
        raise InvalidInput(field_name, "at most 255 characters")
    return text


def before_end_field(actions: frozenset[str], merged: Mapping[str, Any], field_name: str) -> str:
    """The action before the end: ``default`` when not given; kept as given, as Blazar keeps
    it (its ``""`` stays ``""``)."""
    before_end = merged.get("before_end", "default")
    if not isinstance(before_end, str) or before_end not in actions:
        offered = ", ".join(repr(a) for a in sorted(actions))
        raise InvalidInput(
            f"{field_name}.before_end",
            f"Malformed parameter before_end (one of {offered}, not {inputs.shown(before_end)})",
        )
    return before_end


def query_field(merged: Mapping[str, Any], key: str, field_name: str) -> str:
    value = merged.get(key) or ""
    if not isinstance(value, str | list):
        raise InvalidInput(f"{field_name}.{key}", "must be a JSON query string")
    parse_query(f"{field_name}.{key}", value)
    return value if isinstance(value, str) else json.dumps(value)


def merged_fields(
    resource_type: ResourceType, raw: Mapping[str, Any], current: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The stored fields with those given merged on, those the type does not take left out
    (``ResourceType.fields``)."""
    merged: dict[str, Any] = dict(current or {})
    merged.update(resource_type.known(raw))
    return merged


def policy_fields(
    resource_type: ResourceType, merged: Mapping[str, Any], field_name: str
) -> dict[str, Any]:
    """``start_policy`` and ``end_policy`` as stored: only when given (absent or null means the
    default), the end policy one that ``resource_type`` offers; with the state the
    reservation's actions recorded (``started_at``, ``acknowledged_at``), which an update
    keeps and a client cannot send (it is not among the fields)."""
    params: dict[str, Any] = {}
    if merged.get("start_policy") is not None:
        params["start_policy"] = _choice(
            StartPolicy, merged["start_policy"], f"{field_name}.start_policy"
        )
    if merged.get("end_policy") is not None:
        end = _choice(EndPolicy, merged["end_policy"], f"{field_name}.end_policy")
        if end not in resource_type.end_policies:
            offered = ", ".join(p for p in EndPolicy if p in resource_type.end_policies)
            raise InvalidInput(
                f"{field_name}.end_policy",
                f"{end} is not offered for {resource_type.name} reservations; use one of {offered}",
            )
        params["end_policy"] = end
    params.update({key: merged[key] for key in (STARTED_AT, ACKNOWLEDGED_AT) if key in merged})
    return params


def _choice(values: type[StartPolicy] | type[EndPolicy], value: object, field_name: str) -> str:
    offered = [v.value for v in values]
    if not isinstance(value, str) or value not in offered:
        raise InvalidInput(field_name, f"must be one of {', '.join(offered)}, not {value!r}")
    return value


def start_policy_of(params: Mapping[str, Any]) -> StartPolicy:
    return StartPolicy(params.get("start_policy") or StartPolicy.AUTO)


def end_policy_of(params: Mapping[str, Any]) -> EndPolicy:
    return EndPolicy(params.get("end_policy") or EndPolicy.RELEASE)
