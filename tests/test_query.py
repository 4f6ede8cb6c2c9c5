"""The resource property query language: parsing, matching and every way a query can be wrong."""

from __future__ import annotations

import json

import pytest

from climate.errors import MalformedQuery
from climate.planner.query import MATCH_ALL, MAX_DEPTH, parse_query

FIELD = "reservations[0].resource_properties"


def matches(query: object, props: dict[str, object]) -> bool:
    return parse_query(FIELD, query).matches(props)  # type: ignore[arg-type]


def nested(levels: int) -> list[object]:
    """A comparison wrapped in ``levels`` "not" operators (depth of the comparison: ``levels``)."""
    query: list[object] = ["==", "$gpu", "a100"]
    for _ in range(levels):
        query = ["not", query]
    return query


# -- operators -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "actual", "expected"),
    [
        ("==", "4096", True),
        ("==", "2048", False),
        ("=", "4096", True),
        ("=", "2048", False),
        ("!=", "2048", True),
        ("!=", "4096", False),
        ("<", "2048", True),
        ("<", "4096", False),
        ("<", "8192", False),
        ("<=", "2048", True),
        ("<=", "4096", True),
        ("<=", "8192", False),
        (">", "8192", True),
        (">", "4096", False),
        (">", "2048", False),
        (">=", "8192", True),
        (">=", "4096", True),
        (">=", "2048", False),
    ],
)
def test_operator_compares_property_with_value(op: str, actual: str, expected: bool) -> None:
    assert matches([op, "$memory_mb", "4096"], {"memory_mb": actual}) is expected


@pytest.mark.parametrize("raw", [["=", "$gpu", "a100"], '["=", "$gpu", "a100"]'])
def test_single_equals_is_parsed_as_double_equals(raw: object) -> None:
    assert parse_query(FIELD, raw) == parse_query(FIELD, ["==", "$gpu", "a100"])


# -- numbers and strings ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "props", "expected"),
    [
        # Blazar compares these as strings, where "10000" < "4096".
        ([">=", "$memory_mb", "4096"], {"memory_mb": "10000"}, True),
        (["<", "$memory_mb", "4096"], {"memory_mb": "10000"}, False),
        ([">", "$vcpus", "9"], {"vcpus": "10"}, True),
        (["==", "$memory_mb", "4096"], {"memory_mb": "4096.0"}, True),
        (["==", "$local_gb", "1e3"], {"local_gb": "1000"}, True),
        (["<", "$temp", "0"], {"temp": "-5"}, True),
        (["<", "$ratio", "1"], {"ratio": "0.25"}, True),
        # Integer columns (memory_mb, vcpus...) come from the database as ints.
        ([">=", "$memory_mb", "4096"], {"memory_mb": 10000}, True),
        (["==", "$vcpus", "8"], {"vcpus": 8}, True),
        # A JSON number as the value is the same as its text.
        ([">=", "$memory_mb", 4096], {"memory_mb": "10000"}, True),
        (["==", "$memory_mb", 4096.0], {"memory_mb": "4096"}, True),
    ],
    ids=json.dumps,
)
def test_numbers_compare_numerically_when_both_sides_are_numbers(
    query: list[object], props: dict[str, object], expected: bool
) -> None:
    assert matches(query, props) is expected


@pytest.mark.parametrize(
    ("query", "props", "expected"),
    [
        (["==", "$gpu", "a100"], {"gpu": "a100"}, True),
        (["==", "$gpu", "a100"], {"gpu": "A100"}, False),
        (["<", "$gpu", "v100"], {"gpu": "a100"}, True),
        ([">", "$gpu", "a100"], {"gpu": "h100"}, True),
        # One side is not a number: both compare as text, and "abc" > "10" as text.
        ([">", "$rack", "10"], {"rack": "abc"}, True),
        (["==", "$rack", "10"], {"rack": "ten"}, False),
        # Words that float() would read are not numbers to an operator: "nan" equals itself.
        (["==", "$model", "nan"], {"model": "nan"}, True),
        (["==", "$model", "inf"], {"model": "inf"}, True),
        ([">", "$model", "inf"], {"model": "12"}, False),
    ],
    ids=json.dumps,
)
def test_strings_compare_as_text_when_either_side_is_not_a_number(
    query: list[object], props: dict[str, object], expected: bool
) -> None:
    assert matches(query, props) is expected


@pytest.mark.parametrize("op", ["==", "!=", "<", "<=", ">", ">="])
@pytest.mark.parametrize("props", [{}, {"gpu": None}, {"other": "a100"}], ids=str)
def test_comparison_never_matches_when_property_is_missing(
    op: str, props: dict[str, object]
) -> None:
    assert matches([op, "$gpu", "a100"], props) is False


def test_not_matches_when_property_is_missing() -> None:
    # "not" negates the comparison, so a host without the property matches ["not", ...].
    assert matches(["not", ["==", "$gpu", "a100"]], {}) is True


@pytest.mark.parametrize(
    ("value", "actual"),
    [
        ("True", "true"),
        ("true", "True"),
        ("TRUE", "true"),
        ("true", True),
        ("True", True),
        ("False", "false"),
        ("false", "FALSE"),
        ("false", False),
    ],
)
def test_boolean_words_are_equal_whatever_their_case(value: str, actual: object) -> None:
    assert matches(["==", "$ssd", value], {"ssd": actual}) is True
    assert matches(["!=", "$ssd", value], {"ssd": actual}) is False


def test_boolean_words_do_not_equal_the_opposite_word() -> None:
    assert matches(["==", "$ssd", "True"], {"ssd": "false"}) is False
    assert matches(["==", "$ssd", "true"], {"ssd": False}) is False


# -- and, or, not ----------------------------------------------------------------------------

BIG_A100 = {"memory_mb": "8192", "gpu": "a100"}
BIG_V100 = {"memory_mb": "8192", "gpu": "v100"}
SMALL_A100 = {"memory_mb": "2048", "gpu": "a100"}
SMALL_PLAIN = {"memory_mb": "2048"}
BIG = [">=", "$memory_mb", "4096"]
A100 = ["==", "$gpu", "a100"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (["and", BIG, A100], [True, False, False, False]),
        (["and", BIG], [True, True, False, False]),
        (["or", BIG, A100], [True, True, True, False]),
        (["or", A100], [True, False, True, False]),
        (["not", A100], [False, True, False, True]),
        (["not", ["and", BIG, A100]], [False, True, True, True]),
        (["and", BIG, ["not", A100]], [False, True, False, False]),
        (["or", ["and", BIG, A100], ["not", BIG]], [True, False, True, True]),
        (["and", BIG, []], [True, True, False, False]),
    ],
    ids=json.dumps,
)
def test_and_or_not_combine_comparisons(query: list[object], expected: list[bool]) -> None:
    parsed = parse_query(FIELD, query)
    hosts = [BIG_A100, BIG_V100, SMALL_A100, SMALL_PLAIN]
    assert [parsed.matches(h) for h in hosts] == expected


def test_properties_lists_every_property_the_query_tests() -> None:
    query = parse_query(FIELD, ["and", BIG, ["or", A100, ["not", ["==", "$rack", "r1"]]]])
    assert query.properties() == {"memory_mb", "gpu", "rack"}


@pytest.mark.parametrize("raw", ["", None, [], "[]", " [ ] "], ids=repr)
def test_empty_query_matches_everything(raw: object) -> None:
    query = parse_query(FIELD, raw)
    assert query == MATCH_ALL
    assert query.properties() == frozenset()
    assert query.matches({}) is True
    assert query.matches(BIG_A100) is True


def test_json_text_and_decoded_list_parse_alike() -> None:
    query = ["and", BIG, ["or", A100, ["not", [">", "$vcpus", 4]]]]
    assert parse_query(FIELD, json.dumps(query)) == parse_query(FIELD, query)


@pytest.mark.parametrize("levels", [0, 1, MAX_DEPTH])
def test_nesting_is_accepted_up_to_max_depth(levels: int) -> None:
    query = parse_query(FIELD, nested(levels))
    assert query.matches({"gpu": "a100"}) is (levels % 2 == 0)


# -- malformed queries -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        # invalid JSON
        ('["==", "$gpu", "a100"', "not valid JSON"),
        ("[==, $gpu, a100]", "not valid JSON"),
        ("gpu == a100", "not valid JSON"),
        (" ", "not valid JSON"),
        ('["==", "$gpu", ' + "1" * 5000 + "]", "not valid JSON"),
        # not a list
        ('{"gpu": "a100"}', "expected a JSON list"),
        ('"$gpu"', "expected a JSON list"),
        ("4096", "expected a JSON list"),
        ("null", "expected a JSON list"),
        ({"gpu": "a100"}, "expected a JSON list"),
        (["and", "$gpu"], "expected a JSON list"),
        (["not", {"gpu": "a100"}], "expected a JSON list"),
        # unknown operator
        (["~=", "$gpu", "a100"], "unknown operator"),
        (["AND", BIG, A100], "unknown operator"),
        (["eq", "$gpu", "a100"], "unknown operator"),
        ([4096, "$gpu", "a100"], "unknown operator"),
        ([None, "$gpu", "a100"], "unknown operator"),
        ([BIG, A100], "unknown operator"),
        ([{"op": "=="}, "$gpu", "a100"], "unknown operator"),
        # wrong arity
        (["==", "$gpu"], "takes a $property and a value"),
        (["==", "$gpu", "a100", "v100"], "takes a $property and a value"),
        ([">="], "takes a $property and a value"),
        (["and"], "needs at least one operand"),
        (["or"], "needs at least one operand"),
        (["not"], "exactly one operand"),
        (["not", A100, BIG], "exactly one operand"),
        # property without "$"
        (["==", "gpu", "a100"], "expected a property"),
        (["==", "$", "a100"], "expected a property"),
        (["==", "", "a100"], "expected a property"),
        (["==", 4096, "a100"], "expected a property"),
        (["==", ["$gpu"], "a100"], "expected a property"),
        (["==", "a100", "$gpu"], "expected a property"),
        # non-scalar value
        (["==", "$gpu", ["a100"]], "must be a string or number"),
        (["==", "$gpu", {"model": "a100"}], "must be a string or number"),
        (["==", "$gpu", None], "must be a string or number"),
        (["==", "$ssd", True], "must be a string or number"),
        # too deep
        (nested(MAX_DEPTH + 1), f"nested deeper than {MAX_DEPTH} levels"),
        (json.dumps(nested(MAX_DEPTH + 1)), f"nested deeper than {MAX_DEPTH} levels"),
        ("[" * 100_000, f"nested deeper than {MAX_DEPTH} levels"),
    ],
    ids=lambda v: v[:40] if isinstance(v, str) else json.dumps(v)[:40],
)
def test_malformed_query_is_rejected_naming_the_field(raw: object, problem: str) -> None:
    with pytest.raises(MalformedQuery) as caught:
        parse_query(FIELD, raw)
    error = caught.value
    assert (error.status, error.name) == (400, "MALFORMED_REQUIREMENTS")
    assert error.field == FIELD
    assert error.message.startswith(f"{FIELD}: ")
    assert problem in error.message
