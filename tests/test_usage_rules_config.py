"""Usage rules in the config file: what stops start-up, naming the rule; and the pure figures
(peak, rolling window, chains) against hand-worked cases, the rolling window also against a
brute force."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from climate.config import load_settings
from climate.errors import InvalidInput
from climate.fairshare.rule_config import parse_span
from climate.fairshare.rules import DAY, Span, chain, held_over, peak, rolling


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "climate.toml"
    path.write_text(text)
    return load_settings(str(path), env={})


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(InvalidInput) as caught:
        load(tmp_path, text)
    return str(caught.value)


GOOD = """
[climate]
usage_gpu_property = "gpus"

[[climate.usage_rules]]
name = "gpu-budget"
kind = "budget"
unit = "gpus"
per = "user"
limit = 32
window = "30d"
resource_type = "physical:host"
properties = '["==", "$gpu", "a100"]'
exempt_projects = ["ops"]

[[climate.usage_rules]]
name = "week"
kind = "max_length"
limit = "P7D"
"""


def test_rules_from_the_config_file(tmp_path: Path) -> None:
    settings = load(tmp_path, GOOD)
    budget, week = settings.rules  # type: ignore[attr-defined]
    assert budget.window == 30 * DAY and budget.limit == 32 and budget.exempt_projects == {"ops"}
    assert week.limit == 7 * DAY
    assert budget.describe() == (
        'at most 32 GPU-days of physical:host matching ["==", "$gpu", "a100"] per user '
        "in any 30 days"
    )


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ('kind = "budget"\nunit = "gpuz"\nlimit = 1\nwindow = "1d"', "unit must be one of hosts"),
        ('kind = "quota"\nlimit = 1', "kind must be one of max_length"),
        ('kind = "max_length"\nlimit = "forever"', "limit: must be a positive duration"),
        ('kind = "max_length"\nlimit = -5', "must be a positive duration"),
        ('kind = "max_advance"\nlimit = 1e30', "limit: must be at most 36500 days, not 1e+30"),
        (
            'kind = "budget"\nunit = "hosts"\nlimit = 1\nwindow = "99999999d"',
            "window: must be at most 36500 days, not '99999999d'",
        ),
        ('kind = "concurrent"\nunit = "hosts"\nlimit = 1.5', "limit must be a whole number"),
        ('kind = "concurrent"\nunit = "hosts"\nlimit = 0', "limit must be positive"),
        ('kind = "concurrent"\nunit = "hosts"', "needs a limit"),
        ('kind = "budget"\nunit = "hosts"\nlimit = 1', "a budget needs a window"),
        ('kind = "stacking"\nlimit = 1', "needs a gap"),
        ('kind = "stacking"\nlimit = 1\ngap = "2d"\nwindow = "1d"', "is shorter than gap"),
        (
            'kind = "concurrent"\nunit = "hosts"\nlimit = 1\nproperties = \'["~", "$gpu", 1]\'',
            'unknown operator "~"',
        ),
        (
            'kind = "concurrent"\nunit = "hosts"\nlimit = 1\nproperties = "[gpu"',
            "properties: Malformed requirements [gpu (not valid JSON",
        ),
        (
            'kind = "concurrent"\nunit = "gpus"\nlimit = 1\nresource_type = "virtual:volume"',
            "virtual:volume holds no gpus",
        ),
        (
            'kind = "concurrent"\nunit = "hosts"\nlimit = 1\nresource_type = "physical:hots"',
            "resource_type must be one of",
        ),
        (
            'kind = "max_length"\nlimit = "1d"\nunit = "hosts"',
            "'unit' is not a key of a max_length",
        ),
        ('kind = "concurrent"\nunit = "hosts"\nlimit = 1\nper = "team"', "per must be 'user'"),
        ('kind = "max_length"\nlimit = "1d"\nexempt_projects = "ops"', "exempt_projects must be"),
    ],
)
def test_a_bad_rule_stops_start_up_naming_it(tmp_path: Path, rule: str, problem: str) -> None:
    message = refused(tmp_path, f'[[climate.usage_rules]]\nname = "bad"\n{rule}\n')
    assert message.startswith(f"usage_rules in {tmp_path / 'climate.toml'}: rule 'bad': ")
    assert problem in message


def test_rules_that_contradict_each_other_stop_start_up(tmp_path: Path) -> None:
    message = refused(
        tmp_path,
        """
[[climate.usage_rules]]
name = "week"
kind = "max_length"
limit = "7d"

[[climate.usage_rules]]
name = "extend"
kind = "max_extension"
limit = "8d"
""",
    )
    assert "rule 'extend': an extension of 8 days is longer than rule 'week' lets a lease last" in (
        message
    )


def test_a_repeated_name_and_a_nameless_rule_stop_start_up(tmp_path: Path) -> None:
    twice = '[[climate.usage_rules]]\nname = "a"\nkind = "max_length"\nlimit = 60\n'
    assert "rule 'a': the name is used by an earlier rule" in refused(tmp_path, twice * 2)
    nameless = '[[climate.usage_rules]]\nkind = "max_length"\nlimit = 60\n'
    assert "usage_rules[0]: needs a name" in refused(tmp_path, nameless)


def test_a_rules_file_that_does_not_parse_stops_start_up(tmp_path: Path) -> None:
    message = refused(tmp_path, '[[climate.usage_rules]]\nname = "a\n')
    assert "is not valid TOML" in message


def test_a_rule_from_the_environment(tmp_path: Path) -> None:
    env = {"CLIMATE_USAGE_RULES": '[{"name": "e", "kind": "max_advance", "limit": "2h"}]'}
    assert load_settings(env=env).rules[0].limit == 7200
    with pytest.raises(InvalidInput) as caught:
        load_settings(env={"CLIMATE_USAGE_RULES": '[{"name": "e", "kind": "max_advance"}]'})
    assert str(caught.value) == "CLIMATE_USAGE_RULES: rule 'e': needs a limit"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 30 * DAY), ("1d12h", 1.5 * DAY), ("90m", 5400), ("PT12H", 43200), (45, 45)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_span("x", text) == seconds


def span(lease: str, start: float, end: float, hosts: float = 1, user: str = "u") -> Span:
    return Span(lease, user, "physical:host", {}, {"hosts": hosts}, start, end)


def test_peak_counts_what_is_held_at_one_instant() -> None:
    spans = [span("a", 0, 10, 2), span("b", 5, 15), span("c", 10, 20, 4)]
    assert peak(spans, "hosts", 0, 20) == 5  # b and c at 10: a has ended
    assert peak(spans, "hosts", 0, 9) == 3
    assert peak(spans, "hosts", 20, 30) == 0


def test_rolling_finds_the_fullest_window() -> None:
    spans = [span("a", 0, 10), span("b", 30, 40), span("c", 45, 50)]
    # Windows of 20 overlapping [30, 40): [30, 50) holds b (10) and c (5).
    assert rolling(spans, "hosts", 20, 30, 40) == 15
    assert rolling(spans, "hosts", 100, 30, 40) == 25


def test_rolling_reads_a_level_stretch_between_rising_and_falling() -> None:
    # Windows of 10 overlapping [0, 30): full of a (2 hosts) from t = 0 to 2, then less.
    spans = [span("a", 0, 12, 2), span("b", 14, 16, 3), span("c", 25, 27)]
    assert rolling(spans, "hosts", 10, 0, 30) == 20
    # Overlapping [20, 30) only: [16, 26) takes 1 of c, [10, 20) 2 * 2 of a and 3 * 2 of b.
    assert rolling(spans, "hosts", 10, 20, 30) == 10


@st.composite
def windows(draw: st.DrawFn) -> tuple[list[Span], float, float, float]:
    """Spans to the millisecond with whole amounts, a window length and a range."""
    ms = st.integers(0, 2_000_000).map(lambda v: v / 1000)
    spans = []
    for i in range(draw(st.integers(0, 30))):
        begin = draw(ms)
        length = draw(st.integers(1, 500_000)) / 1000
        spans.append(span(f"l{i}", begin, begin + length, draw(st.sampled_from([1, 2, 4, 32]))))
    start = draw(ms)
    return spans, draw(st.sampled_from([1.0, 60.0, 300.0, 1_000.0])), start, start + draw(ms)


@settings(max_examples=400, deadline=None)
@given(case=windows())
def test_rolling_is_the_fullest_window_a_brute_force_finds(
    case: tuple[list[Span], float, float, float],
) -> None:
    """Every window that can be fullest (its start or end on a span's start or end, or at an
    end of the range), each summed span by span."""
    spans, window, start, end = case
    low, high = start - window, end
    edges = {t for s in spans for t in (s.start, s.end, s.start - window, s.end - window)}
    starts = {low, high} | {t for t in edges if low <= t <= high}
    brute = max(held_over(spans, "hosts", t, t + window) for t in starts)
    assert rolling(spans, "hosts", window, start, end) == pytest.approx(brute, rel=1e-12, abs=1e-6)


def test_chains_join_leases_less_than_the_gap_apart() -> None:
    spans = [span("a", 0, 10), span("b", 12, 20), span("c", 25, 30), span("d", 5, 8)]
    assert chain(spans, "a", 3) == 3  # a, d inside it, b 2 after
    assert chain(spans, "c", 3) == 1  # 5 after b
    assert chain(spans, "c", 5) == 1  # exactly the gap: a chain of its own
    assert chain(spans, "c", 6) == 4
