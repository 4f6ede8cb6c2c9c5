"""Request dates: ISO 8601 is read first, Blazar's ``strptime`` formats after it; every text
reads as the formats tried in Blazar's order read it (the reference below), or fails alike."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from climate.api.parsing import parse_date
from climate.errors import InvalidInput

BLAZAR_FORMATS = ("%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f")


def reference(text: str) -> dt.datetime | None:
    """Blazar's formats, then ISO 8601; None where neither reads the text."""
    text = text.strip()
    for fmt in BLAZAR_FORMATS:
        try:
            return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.UTC)
        except ValueError:
            continue
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)


def number(low: int, high: int) -> st.SearchStrategy[str]:
    """A number as text, zero-padded to two digits or not."""
    return st.tuples(st.integers(low, high), st.booleans()).map(
        lambda p: f"{p[0]:02d}" if p[1] else str(p[0])
    )


OFFSETS = st.sampled_from(["", "", "Z", "+00:00", "-05:00", "+05:30", "+0100", "z"])
FRACTIONS = st.sampled_from(["", "", ".5", ".123", ".123456", ".1234567", "."])


@st.composite
def date_texts(draw: st.DrawFn) -> str:
    year = draw(st.sampled_from(["2030", "1999", "8999", "0030", "30"]))
    day = f"{year}-{draw(number(0, 13))}-{draw(number(0, 32))}"
    if draw(st.integers(0, 9)) == 0:
        return day
    clock = f"{draw(number(0, 25))}:{draw(number(0, 61))}"
    if draw(st.booleans()):
        clock += f":{draw(number(0, 61))}{draw(FRACTIONS)}"
    separator = draw(st.sampled_from([" ", " ", "T", "t", "  "]))
    padding = draw(st.sampled_from(["", "", " ", "\t"]))
    return f"{padding}{day}{separator}{clock}{draw(OFFSETS)}{padding}"


@settings(max_examples=1500, deadline=None)
@given(date_texts())
def test_a_date_reads_as_blazars_formats_then_iso_8601_read_it(text: str) -> None:
    expected = reference(text)
    if expected is None:
        with pytest.raises(InvalidInput, match="is an invalid date") as refused:
            parse_date("start_date", text)
        assert refused.value.field == "start_date"
    else:
        assert parse_date("start_date", text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2030-01-31 12:00", dt.datetime(2030, 1, 31, 12, 0, tzinfo=dt.UTC)),
        ("2030-1-5 3:04", dt.datetime(2030, 1, 5, 3, 4, tzinfo=dt.UTC)),
        ("2030-01-31T12:00:00.250+02:00", dt.datetime(2030, 1, 31, 10, 0, 0, 250000, dt.UTC)),
        ("2030-01-31T12:00Z", dt.datetime(2030, 1, 31, 12, 0, tzinfo=dt.UTC)),
    ],
)
def test_blazar_and_iso_forms_are_read_as_utc(text: str, expected: dt.datetime) -> None:
    assert parse_date("start_date", text) == expected


def test_a_date_past_the_end_of_time_in_utc_is_out_of_range() -> None:
    with pytest.raises(InvalidInput, match="out of range"):
        parse_date("end_date", "9999-12-31T23:00-05:00")


def test_a_date_that_is_no_date_names_the_field() -> None:
    with pytest.raises(InvalidInput, match="2031-13-01 10:00 is an invalid date") as refused:
        parse_date("end_date", "2031-13-01 10:00")
    assert refused.value.field == "end_date"
