"""Lease series: recurring leases from an iCalendar RRULE, one ordinary lease per occurrence
(docs/series.md)."""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dateutil.rrule import rrulestr
from sqlalchemy.orm import Session

from climate import inputs
from climate.context import ServiceContext
from climate.db import audit
from climate.db import series as series_rows
from climate.db.engine import ADMISSION_LOCK, retry_transient
from climate.db.tables import NAME_LENGTH, Lease, LeaseSeries, new_id
from climate.domain.actor import Actor
from climate.domain.admission import AdmissionRefused, Refused, SeriesRefused, Skipped
from climate.domain.formats import lease_date
from climate.domain.requests import Conflicts, LeaseRequest, ReservationRequest, SeriesRequest
from climate.errors import Conflict, InvalidInput, NotEnoughCapacity, NotFound
from climate.services import demand_record as demand
from climate.services.leases import Checked, LeaseService, offers

MAX_OCCURRENCES = 100
"""The most occurrences a series may have (after its exdates)."""
FREQUENCIES = ("DAILY", "WEEKLY", "MONTHLY", "YEARLY")
RULE_PARTS = frozenset(
    {"FREQ", "INTERVAL", "COUNT", "UNTIL", "BYDAY", "BYMONTHDAY", "BYMONTH", "WKST"}
)
"""What a series' RRULE may say: times of day come from its start_date, and the parts left out
(BYSETPOS, BYYEARDAY, BYWEEKNO, BYHOUR...) can describe rules that take very long to expand."""
_LONGEST_MONTH = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31}
_LONGEST_MONTH |= {11: 30, 12: 31}
_NUMBERED_WEEKDAY = re.compile(r"([+-]?\d+)(?:MO|TU|WE|TH|FR|SA|SU)")
OCCURRENCE_SUFFIX = "-%Y%m%dT%H%M%SZ"
"""An occurrence's lease is named after its series and its instant."""
NAME_ROOM = NAME_LENGTH - len(dt.datetime(2030, 1, 1, tzinfo=dt.UTC).strftime(OCCURRENCE_SUFFIX))


@dataclass(frozen=True)
class SeriesView:
    series: LeaseSeries
    leases: Sequence[Lease]
    """Every lease made for it, cancelled ones included, in occurrence order."""
    skipped: Sequence[Skipped] = ()


class _Refused(Exception):
    """One occurrence did not fit: its transaction is rolled back and run again without it."""

    def __init__(self, index: int, error: NotEnoughCapacity) -> None:
        super().__init__(index)
        self.index = index
        self.error = error


class _Rejected(Exception):
    """Some occurrences did not fit and the series is all or nothing: roll everything back."""


class SeriesService:
    def __init__(self, ctx: ServiceContext, leases: LeaseService) -> None:
        self.ctx = ctx
        self.leases = leases

    def create(self, actor: Actor, request: SeriesRequest) -> SeriesView:
        """Create a series and a lease per occurrence, admitted in one transaction under the
        admission lock: all or nothing (``reject``), or those that fit (``skip``).

        :raises InvalidInput: a field is wrong (named in the message; an occurrence's lease
            fields are named as in a lease body).
        :raises NotEnoughCapacity: ``reject`` and some occurrences do not fit, or none fits;
            its details list each with its refusal. Nothing was written.
        :raises Conflict: a live series or lease of the project has the name already.
        """
        self.ctx.policy.enforce(actor, "climate:series:create", actor.owner())
        now = self.ctx.clock.now()
        _check_name(request.name)
        if request.duration <= dt.timedelta(0):
            raise InvalidInput("duration", "must be positive (end_date after start_date)")
        instants = occurrences(request.rrule, request.start, request.exdates)
        series = self._row(actor, request, now)
        checks = [
            self.leases.check(actor, _lease_request(request, series.id, at), now) for at in instants
        ]
        refused: dict[int, NotEnoughCapacity] = {}
        while True:
            try:
                made = self._write(actor, series, checks, refused, request.conflicts, now)
                break
            except _Refused as one:
                refused[one.index] = one.error
            except _Rejected:
                made = None
                break
        skipped = [self._explain(checks[i], error) for i, error in sorted(refused.items())]
        demand.series_skipped(self.ctx, actor, skipped)
        if made is None:
            message = f"{len(skipped)} of {len(checks)} occurrences do not fit; nothing was created"
            raise AdmissionRefused(SeriesRefused(message, tuple(skipped)))
        return SeriesView(series, made, skipped)

    @retry_transient
    def _write(
        self,
        actor: Actor,
        series: LeaseSeries,
        checks: Sequence[Checked],
        refused: dict[int, NotEnoughCapacity],
        conflicts: Conflicts,
        now: dt.datetime,
    ) -> list[Lease]:
        """One attempt to write the series and admit its occurrences, those in ``refused``
        left out.

        :raises _Refused: another occurrence does not fit (everything is rolled back).
        :raises _Rejected: all or nothing and some occurrences do not fit, or none fits.
        """
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            if series_rows.name_taken(session, actor.project_id, series.name):
                raise Conflict(f"name: a series named {series.name!r} already exists")
            series_rows.insert_new(session, series)
            made = []
            for i, checked in enumerate(checks):
                if i in refused:
                    continue
                try:
                    made.append(self.leases.write(session, actor, checked, now))
                except NotEnoughCapacity as error:
                    raise _Refused(i, error) from error
            if refused and (conflicts == Conflicts.REJECT or not made):
                raise _Rejected
            _audit(
                session,
                now,
                actor,
                "series.create",
                series,
                {
                    "name": series.name,
                    "rrule": series.rrule,
                    "leases": [lease.id for lease in made],
                    "skipped": [lease_date(checks[i].start) for i in sorted(refused)],
                },
            )
        return made

    def _explain(self, checked: Checked, error: NotEnoughCapacity) -> Skipped:
        request = checked.request
        assert request.occurrence is not None
        refused = offers.refuse(
            self.ctx, Refused(str(error)), request, checked.start, checked.params
        )
        return Skipped(request.occurrence, request.end, refused)

    def _row(self, actor: Actor, request: SeriesRequest, now: dt.datetime) -> LeaseSeries:
        return LeaseSeries(
            id=new_id(),
            name=request.name,
            project_id=actor.project_id,
            user_id=actor.user_id,
            rrule=normalised_rule(request.rrule),
            exdates=[at.isoformat() for at in sorted(request.exdates)],
            first_start=request.start,
            duration_seconds=int(request.duration.total_seconds()),
            body={
                "reservations": [self._asked(r) for r in request.reservations],
                "before_end_offset": _seconds(request.before_end_offset),
                "reminders": None
                if request.reminders is None
                else [_seconds(o) for o in request.reminders],
                "conflicts": request.conflicts.value,
            },
            created_at=now,
            updated_at=None,
            deleted_at=None,
        )

    def _asked(self, reservation: ReservationRequest) -> dict[str, Any]:
        """A reservation as the series keeps it for its leases: the fields its type takes
        (an unknown type is refused with the occurrences' checks)."""
        kind = self.ctx.resource_types.get(str(reservation.resource_type))
        fields = reservation.fields if kind is None else kind.known(reservation.fields)
        return {"resource_type": reservation.resource_type, **fields}

    def get(self, actor: Actor, series_id: str) -> SeriesView:
        """The series with every lease made for it.

        :raises NotFound: no such live series visible to the caller.
        """
        with self.ctx.db.reader() as session:
            series = self._load(session, actor, series_id, "climate:series:get")
            return SeriesView(series, series_rows.occurrences(session, series.id))

    def list_all(self, actor: Actor, *, project_id: str | None = None) -> Sequence[LeaseSeries]:
        """Live series of the caller's project (of every project, or the one asked for, to
        those the ``admin`` rule allows), oldest first, at most ``max_page_size``."""
        self.ctx.policy.enforce(actor, "climate:series:get", actor.owner())
        scope = self.ctx.policy.scope(actor)
        if scope is not None:
            if project_id not in (None, scope):
                return []
            project_id = scope
        with self.ctx.db.reader() as session:
            return series_rows.list_live(
                session, project_id=project_id, limit=self.ctx.settings.max_page_size
            )

    @retry_transient
    def delete(self, actor: Actor, series_id: str) -> None:
        """Cancel every occurrence that has not ended (as deleting each lease would) and
        delete the series, in one transaction. Ended occurrences stay, for the record.

        :raises NotFound: no such live series visible to the caller.
        """
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            series = self._load(session, actor, series_id, "climate:series:delete")
            cancelled = series_rows.cancellable(session, series.id, now)
            for lease_id in cancelled:
                self.leases.cancel(session, actor, lease_id, now)
            series.deleted_at = series.updated_at = now
            _audit(session, now, actor, "series.delete", series, {"cancelled": cancelled})

    def _load(self, session: Session, actor: Actor, series_id: str, rule: str) -> LeaseSeries:
        """The series if the caller may see it and ``rule`` allows the action on it; another
        project's series is not found (404), as for leases."""
        series = series_rows.get(session, series_id, project_id=self.ctx.policy.scope(actor))
        if series is None:
            raise NotFound("Lease series", series_id)
        self.ctx.policy.enforce(
            actor, rule, {"project_id": series.project_id, "user_id": series.user_id}
        )
        return series


def occurrences(
    rule: str, first: dt.datetime, exdates: Sequence[dt.datetime] = ()
) -> list[dt.datetime]:
    """The starts of a series: the rule's expansion from ``first`` (which must be its first
    instant) without ``exdates`` (each must be one of its instants), at most
    ``MAX_OCCURRENCES``.

    :raises InvalidInput: naming ``rrule``, ``start_date``, ``exdates`` or ``exdates[i]``.
    """
    text = normalised_rule(rule)
    if len(exdates) > MAX_OCCURRENCES:
        raise InvalidInput("exdates", f"at most {MAX_OCCURRENCES}, not {len(exdates)}")
    try:
        expansion = rrulestr(text, dtstart=first)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput("rrule", f"{exc}") from None
    limit = MAX_OCCURRENCES + len(exdates)
    try:
        instants = list(itertools.islice(expansion, limit + 1))
    except (ValueError, OverflowError) as exc:
        raise InvalidInput("rrule", f"{exc}") from None
    if len(instants) > limit:
        raise InvalidInput(
            "rrule", f"more than {MAX_OCCURRENCES} occurrences; lower COUNT or UNTIL"
        )
    if not instants or instants[0] != first:
        found = f"its first is {instants[0].isoformat()}" if instants else "it has none"
        raise InvalidInput("start_date", f"must be the rule's first occurrence ({found})")
    excluded: dict[dt.datetime, int] = {}
    taken = set(instants)
    for i, at in enumerate(exdates):
        if at in excluded:
            raise InvalidInput(f"exdates[{i}]", f"repeats exdates[{excluded[at]}]")
        if at not in taken:
            raise InvalidInput(f"exdates[{i}]", f"{at.isoformat()} is not an occurrence of rrule")
        excluded[at] = i
    kept = [at for at in instants if at not in excluded]
    if not kept:
        raise InvalidInput("exdates", "exclude every occurrence")
    return kept


def normalised_rule(rule: str) -> str:
    """The RRULE's value in upper case, parts in the order given, checked for what a series
    supports (``RULE_PARTS``, a bounded rule, a BYMONTHDAY some BYMONTH has).

    :raises InvalidInput: naming ``rrule``.
    """
    text = rule.strip()
    if text.upper().startswith("RRULE:"):
        text = text[len("RRULE:") :]
    if not text or "\n" in text or "\r" in text:
        raise InvalidInput("rrule", "one RRULE value, like 'FREQ=WEEKLY;BYDAY=TU;COUNT=8'")
    parts: dict[str, str] = {}
    for item in text.split(";"):
        key, sep, value = (s.strip().upper() for s in item.partition("="))
        if not sep or not key or not value:
            raise InvalidInput("rrule", f"{item!r} is not NAME=VALUE")
        if key not in RULE_PARTS:
            raise InvalidInput(
                "rrule",
                f"{key} is not supported; use {', '.join(sorted(RULE_PARTS))} "
                "(the time of day comes from start_date)",
            )
        if key in parts:
            raise InvalidInput("rrule", f"{key} is given twice")
        parts[key] = value
    if parts.get("FREQ") not in FREQUENCIES:
        raise InvalidInput("rrule", f"FREQ must be one of {', '.join(FREQUENCIES)}")
    if ("COUNT" in parts) == ("UNTIL" in parts):
        raise InvalidInput("rrule", "a series needs COUNT or UNTIL (not both): it must end")
    if "UNTIL" in parts and not parts["UNTIL"].endswith("Z"):
        raise InvalidInput("rrule", "UNTIL must be in UTC, like 20310101T000000Z")
    _check_month_days(parts)
    _check_positive(parts)
    _check_weekday_ordinals(parts)
    return ";".join(f"{key}={value}" for key, value in parts.items())


def _check_month_days(parts: dict[str, str]) -> None:
    """Every BYMONTHDAY falls in one of the BYMONTH months: else the rule never matches, and
    finding that out means expanding it to the year 9999."""
    months = [_number(m, 1, 12) for m in parts.get("BYMONTH", "").split(",") if m]
    longest = max((_LONGEST_MONTH[m] for m in months or range(1, 13)), default=31)
    for text in (d for d in parts.get("BYMONTHDAY", "").split(",") if d):
        day = _number(text, -31, 31)
        if day == 0 or abs(day) > longest:
            raise InvalidInput("rrule", f"BYMONTHDAY={day} is in none of its months")


def _check_positive(parts: dict[str, str]) -> None:
    """INTERVAL and COUNT are whole numbers from 1: dateutil repeats one instant for INTERVAL=0
    and expands COUNT=0 to nothing."""
    for key in ("INTERVAL", "COUNT"):
        value = parts.get(key)
        if value is not None and not (value.isascii() and value.isdigit() and int(value) >= 1):
            raise InvalidInput("rrule", f"{key} must be a whole number from 1, not {value!r}")


def _check_weekday_ordinals(parts: dict[str, str]) -> None:
    """A numbered BYDAY (2TU, -1FR) counts within the month (at most 5), or within the year
    for a YEARLY rule without BYMONTH (at most 53): a larger number never matches, and dateutil
    fails on some and expands others to the year 9999 to find nothing."""
    bound = 5 if parts["FREQ"] == "MONTHLY" or "BYMONTH" in parts else 53
    for text in (d for d in parts.get("BYDAY", "").split(",") if d):
        numbered = _NUMBERED_WEEKDAY.fullmatch(text)
        if numbered and not 1 <= abs(int(numbered[1])) <= bound:
            raise InvalidInput(
                "rrule", f"BYDAY={text}: a weekday's number is from 1 to {bound} or -1 to -{bound}"
            )


def _number(text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidInput("rrule", f"{text!r} is not a number") from None
    if not low <= value <= high:
        raise InvalidInput("rrule", f"{value} is not between {low} and {high}")
    return value


def _lease_request(request: SeriesRequest, series_id: str, at: dt.datetime) -> LeaseRequest:
    return LeaseRequest(
        name=request.name + at.strftime(OCCURRENCE_SUFFIX),
        start=at,
        end=at + request.duration,
        reservations=request.reservations,
        before_end_offset=request.before_end_offset,
        reminders=request.reminders,
        series_id=series_id,
        occurrence=at,
    )


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("name", "a series needs a non-empty name")
    if len(name) > NAME_ROOM:
        raise InvalidInput(
            "name", f"at most {NAME_ROOM} characters (its leases add their date), not {len(name)}"
        )
    inputs.name_text("name", name)


def _seconds(value: dt.timedelta | None) -> int | None:
    return None if value is None else int(value.total_seconds())


def _audit(
    session: Session,
    now: dt.datetime,
    actor: Actor,
    action: str,
    series: LeaseSeries,
    detail: dict[str, object],
) -> None:
    audit.record(
        session,
        at=now,
        actor=actor,
        action=action,
        target_type="lease_series",
        target_id=series.id,
        detail={"project_id": series.project_id, **detail},
    )
