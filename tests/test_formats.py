"""Dates on the wire are written by ``isoformat`` for speed; ``strftime`` with the documented
format is the oracle."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from climate import wire
from climate.domain.formats import LEASE_DATE_FORMAT, lease_date, lease_dates

ZONES = st.sampled_from(
    [dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(-dt.timedelta(hours=8))]
)
INSTANTS = st.datetimes(
    min_value=dt.datetime(1000, 1, 2),  # noqa: DTZ001 (hypothesis wants naive bounds)
    max_value=dt.datetime(9999, 12, 30),  # noqa: DTZ001
    timezones=ZONES,
)


@given(INSTANTS)
def test_a_lease_date_is_naive_utc_with_microseconds(value: dt.datetime) -> None:
    assert lease_date(value) == value.astimezone(dt.UTC).strftime(LEASE_DATE_FORMAT)


@given(INSTANTS)
def test_a_stamp_is_naive_utc_to_the_second(value: dt.datetime) -> None:
    assert wire.stamp(value) == value.astimezone(dt.UTC).strftime(wire.STAMP_FORMAT)


def test_no_stamp_for_no_instant() -> None:
    assert wire.stamp(None) is None


@given(INSTANTS, st.integers(min_value=1, max_value=86_400 * 31), st.integers(0, 50))
def test_a_series_of_lease_dates_is_each_written_alone(
    start: dt.datetime, step_seconds: int, count: int
) -> None:
    step = dt.timedelta(seconds=step_seconds)
    expected = [lease_date(start + step * i) for i in range(count)]
    if not expected or start + step * count <= dt.datetime(9999, 12, 31, tzinfo=dt.UTC):
        assert lease_dates(start, step, count) == expected
