"""Lease requests: a new lease (fixed dates or a flexible window) and a lease update."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    WithJsonSchema,
    model_validator,
)

from climate import inputs
from climate.api import parsing
from climate.api.schemas import (
    REQUEST_DATE,
    Duration,
    Flag,
    NoEvents,
    OptionalDate,
    OptionalDuration,
    RequestDate,
    SignedInt,
    StartDate,
    component,
    durations,
)
from climate.db.tables import NAME_LENGTH
from climate.domain.lease_rules import MAX_REMINDERS
from climate.domain.requests import LeaseChanges, LeaseRequest, ReservationRequest
from climate.domain.status import LeaseType
from climate.errors import InvalidInput

FLEXIBLE_FIELDS = ("earliest_start", "latest_end", "duration")
_ANY_CREATE = component("AnyReservationCreate")
_ANY_UPDATE = component("AnyReservationUpdate")
# Each resource type validates its own reservation fields (resources/*).
NewReservations = Annotated[
    list[dict[str, Any]] | None, WithJsonSchema({"type": "array", "items": _ANY_CREATE})
]
ChangedReservations = Annotated[
    list[dict[str, Any]] | None, WithJsonSchema({"type": "array", "items": _ANY_UPDATE})
]
Reminders = durations(MAX_REMINDERS)
# The service checks the name (length, blanks, control characters) with its own messages.
_NAME: dict[str, Any] = {"minLength": 1, "maxLength": NAME_LENGTH}


def _lease_type(value: object) -> LeaseType:
    if value is None:
        return LeaseType.SCHEDULED
    try:
        return LeaseType(str(value))
    except ValueError:
        raise InvalidInput(
            "lease_type", f"must be one of {', '.join(t.value for t in LeaseType)}, not {value!r}"
        ) from None


Kind = Annotated[
    LeaseType,
    PlainValidator(_lease_type),
    WithJsonSchema(
        {
            "type": "string",
            "enum": [t.value for t in LeaseType],
            "description": "scheduled (default), immediate, retry or best_effort "
            "(docs/lease-types.md)",
        }
    ),
]


def _reservations(
    found: list[dict[str, Any]] | None, *, creating: bool
) -> list[ReservationRequest]:
    requests = []
    for i, item in enumerate(found or ()):
        fields = dict(item)
        resource_type = fields.pop("resource_type", None)
        reservation_id = fields.pop("id", None)
        if creating and resource_type is None:
            raise InvalidInput(
                f"reservations[{i}].resource_type", "Missing parameter resource_type"
            )
        if reservation_id is not None and not isinstance(reservation_id, str):
            raise InvalidInput(f"reservations[{i}].id", "must be a string")
        requests.append(ReservationRequest(resource_type, fields, reservation_id))
    return requests


class LeaseFields(BaseModel):
    """What a new lease and a lease update share."""

    model_config = ConfigDict(extra="forbid")

    before_end_date: OptionalDate = None
    before_end_offset: OptionalDuration = Field(
        None,
        description="the before-end event this long before the end (not with before_end_date)",
    )
    reminders: Reminders = Field(  # type: ignore[valid-type]
        None,
        description="extra notifications (lease.before_end), each this long before the end; "
        "they move with it (docs/lease-types.md)",
    )
    events: NoEvents = []

    @model_validator(mode="before")
    @classmethod
    def _one_before_end(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and data.get("before_end_offset") is not None
            and data.get("before_end_date") not in (None, "")
        ):
            raise InvalidInput(
                "before_end_offset", "give either before_end_date or before_end_offset, not both"
            )
        return data


def _seconds(value: object) -> int:
    if value is None:
        raise InvalidInput("hold.expires_in", "required whole number of seconds")
    return inputs.integer("hold.expires_in", value, minimum=-inputs.MAX_INT)


Seconds = Annotated[
    int, PlainValidator(_seconds), WithJsonSchema({"type": "integer", "minimum": 1})
]


def _now_or_date(field: str) -> Callable[[object], dt.datetime | Literal["now"] | None]:
    """An update's date as Blazar reads it: ``now`` (a running lease ends now; a start moves
    to now), a date, or nothing to change; an empty text is not a date."""

    def read(value: object) -> dt.datetime | Literal["now"] | None:
        if value in ("now", None):
            return "now" if value == "now" else None
        return parsing.parse_date(field, value)

    return read


UpdateStart = Annotated[
    dt.datetime | Literal["now"] | None,
    PlainValidator(_now_or_date("start_date")),
    WithJsonSchema({"anyOf": [{"const": "now"}, REQUEST_DATE]}),
]
UpdateEnd = Annotated[
    dt.datetime | Literal["now"] | None,
    PlainValidator(_now_or_date("end_date")),
    WithJsonSchema({"anyOf": [{"const": "now"}, REQUEST_DATE]}),
]


class Hold(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expires_in: Seconds = Field(description="seconds")


class LeaseCreate(LeaseFields):
    """Fixed dates (start_date, end_date) or a flexible window (earliest_start, latest_end,
    duration), not both."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": [{"required": ["end_date"]}, {"required": ["latest_end", "duration"]}],
            "examples": [
                {
                    "name": "gpu-training",
                    "start_date": "2031-06-01 09:00",
                    "end_date": "2031-06-01 17:00",
                    "reservations": [
                        {
                            "resource_type": "physical:host",
                            "min": 1,
                            "max": 1,
                            "hypervisor_properties": "",
                            "resource_properties": "",
                        }
                    ],
                    "events": [],
                }
            ],
        },
    )

    name: str = Field(json_schema_extra=_NAME)
    start_date: StartDate = None
    end_date: RequestDate | None = None
    reservations: NewReservations = None
    earliest_start: StartDate = None
    latest_end: RequestDate | None = None
    duration: Duration | None = None
    dry_run: Flag = Field(False, description="as the query's dry_run")
    lease_type: Kind = LeaseType.SCHEDULED
    priority: SignedInt = Field(
        None, description="place in the waiting queue, higher first; above 0 for admins only"
    )
    retries: SignedInt = Field(
        None, description="retry leases: at most this many attempts (not above retry_max_attempts)"
    )
    deadline: OptionalDate = Field(None, description="best_effort leases: stop hunting then")
    hold: Hold | None = Field(
        None,
        description="create the lease HELD, its resources allocated, until confirmed "
        "(POST /v1/leases/{id}/confirm) or lapsed after expires_in seconds",
    )
    hold_minutes: SignedInt = Field(None, description="as hold, in minutes")

    @model_validator(mode="before")
    @classmethod
    def _one_window(cls, data: Any) -> Any:
        """Blazar's ``Missing parameter name, start_date`` (a lease of a type that starts now
        may leave its start out); a flexible window is complete."""
        if not isinstance(data, dict):
            return data
        if any(f in data for f in FLEXIBLE_FIELDS):
            for fixed, instead in (("start_date", "earliest_start"), ("end_date", "latest_end")):
                if fixed in data:
                    raise InvalidInput(instead, f"cannot be combined with {fixed}")
            for required in ("latest_end", "duration"):
                if data.get(required) is None:
                    raise InvalidInput(required, "required with a flexible window")
        else:
            starts_now = data.get("lease_type", LeaseType.SCHEDULED) != LeaseType.SCHEDULED
            fields = ("name", "end_date") if starts_now else ("name", "start_date", "end_date")
            missing = [f for f in fields if data.get(f) is None]
            if missing:
                raise InvalidInput(missing[0], f"Missing parameter {', '.join(missing)}")
            if data["end_date"] == "now":  # Blazar reads it as now: never after the start
                raise InvalidInput(
                    "end_date", "End date must be later than start date. (now is not after it)"
                )
        if "hold" in data and "hold_minutes" in data:
            raise InvalidInput("hold_minutes", "give either hold or hold_minutes")
        return data

    def request(self, dry_run: bool = False) -> LeaseRequest:
        """The service's request; a dry run if the query's ``dry_run`` or the body's says so."""
        flexible = self.latest_end is not None
        end = self.latest_end if flexible else self.end_date
        assert end is not None  # _one_window
        hold = None
        if self.hold_minutes is not None:
            hold = dt.timedelta(minutes=self.hold_minutes)
        elif self.hold is not None:
            assert self.hold.expires_in is not None
            hold = dt.timedelta(seconds=self.hold.expires_in)
        return LeaseRequest(
            name=self.name,
            start=self.earliest_start if flexible else self.start_date,
            end=end,
            before_end=self.before_end_date,
            reservations=_reservations(self.reservations, creating=True),
            duration=self.duration,
            dry_run=dry_run or self.dry_run,
            lease_type=self.lease_type,
            priority=self.priority,
            retries=self.retries,
            deadline=self.deadline,
            hold=hold,
            hold_field="hold.expires_in" if self.hold_minutes is None else "hold_minutes",
            before_end_offset=self.before_end_offset,
            reminders=self.reminders,
        )


class LeaseUpdate(LeaseFields):
    """Only the fields to change (Blazar's documented update carries ``"events": []`` too)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"minProperties": 1, "examples": [{"end_date": "2031-06-01 18:00"}]},
    )

    name: str | None = Field(None, json_schema_extra=_NAME)
    start_date: UpdateStart = None
    end_date: UpdateEnd = None
    reservations: ChangedReservations = None

    def changes(self) -> LeaseChanges:
        """What to change; none at all for an empty body (Blazar answers with the lease)."""
        return LeaseChanges(
            name=self.name,
            start=None if self.start_date == "now" else self.start_date,
            start_now=self.start_date == "now",
            end=None if self.end_date == "now" else self.end_date,
            end_now=self.end_date == "now",
            before_end=self.before_end_date,
            reservations=_reservations(self.reservations, creating=False),
            before_end_offset=self.before_end_offset,
            reminders=self.reminders,
        )


class ForceEnd(BaseModel):
    """An operator's force-end of a lease (an empty body: the defaults)."""

    model_config = ConfigDict(extra="forbid")

    skip_backend: StrictBool = Field(
        False, description="end the lease without asking the backend to release anything"
    )
