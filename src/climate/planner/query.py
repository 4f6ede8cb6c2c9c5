"""Blazar's resource property query language, parsed once and evaluated against property maps.

A query is JSON: a comparison ``["<op>", "$<property>", "<value>"]`` with op one of ``== = != < <=
> >=``, or ``["and", q1, q2, ...]``. We also accept ``["or", ...]`` and ``["not", q]``, which
Blazar lacks. An empty string or ``[]`` matches everything. Values compare as numbers when both
sides are numbers (Blazar compares strings, so "10000" < "4096" there) and as strings otherwise.
A host that lacks the property never matches a comparison on it.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from climate.errors import MalformedQuery

PropertyValue = str | int | float | bool | None
Properties = Mapping[str, PropertyValue]

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
MAX_DEPTH = 16


def _as_number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value) if isinstance(value, int | float) else float(str(value))
    except ValueError:
        return None
    # "nan" and "inf" are words to an operator, not numbers ("nan" == "nan" must hold).
    return number if math.isfinite(number) else None


def _text(value: object) -> str:
    text = str(value)
    # "True", "true" and a JSON true are one value to an operator typing a query.
    return text.lower() if text.lower() in {"true", "false"} else text


@dataclass(frozen=True)
class Comparison:
    op: str
    prop: str
    value: str
    # The value as each side of a comparison needs it, worked out once (matching runs per host).
    number: float | None = field(init=False, repr=False, compare=False)
    text: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "number", _as_number(self.value))
        object.__setattr__(self, "text", _text(self.value))

    def matches(self, props: Properties) -> bool:
        actual = props.get(self.prop)
        if actual is None:
            return False
        compare = _OPS[self.op]
        if self.number is not None:
            left = _as_number(actual)
            if left is not None:
                return compare(left, self.number)
        return compare(_text(actual), self.text)

    def properties(self) -> frozenset[str]:
        return frozenset({self.prop})


@dataclass(frozen=True)
class AllOf:
    parts: tuple[Query, ...]

    def matches(self, props: Properties) -> bool:
        return all(p.matches(props) for p in self.parts)

    def properties(self) -> frozenset[str]:
        return frozenset().union(*(p.properties() for p in self.parts))


@dataclass(frozen=True)
class AnyOf:
    parts: tuple[Query, ...]

    def matches(self, props: Properties) -> bool:
        return any(p.matches(props) for p in self.parts)

    def properties(self) -> frozenset[str]:
        return frozenset().union(*(p.properties() for p in self.parts))


@dataclass(frozen=True)
class Not:
    part: Query

    def matches(self, props: Properties) -> bool:
        return not self.part.matches(props)

    def properties(self) -> frozenset[str]:
        return self.part.properties()


Query = Comparison | AllOf | AnyOf | Not
MATCH_ALL: Query = AllOf(())


def parse_query(field: str, raw: object) -> Query:
    """Parse a query given as a JSON string or an already decoded list.

    :raises MalformedQuery: naming ``field`` and what is wrong, after Blazar's words
        (``Malformed requirements <what it could not read>``).
    """
    if raw is None or raw == "":
        return MATCH_ALL
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _malformed(field, raw, f"not valid JSON ({exc.msg} at {exc.pos})") from exc
        except ValueError as exc:  # an integer literal longer than Python converts
            raise _malformed(field, raw, f"not valid JSON ({exc})") from exc
        except RecursionError as exc:
            raise _malformed(field, raw, f"nested deeper than {MAX_DEPTH} levels") from exc
    return _parse(field, raw, 0)


def _malformed(field: str, node: object, problem: str) -> MalformedQuery:
    """Blazar names the part it could not read as Python shows it (a text as it came)."""
    shown = node if isinstance(node, str) else str(node)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return MalformedQuery(field, f"Malformed requirements {shown} ({problem})")


def _parse(field: str, node: object, depth: int) -> Query:
    if depth > MAX_DEPTH:
        raise _malformed(field, node, f"nested deeper than {MAX_DEPTH} levels")
    if not isinstance(node, list):
        raise _malformed(field, node, f"expected a JSON list, got {json.dumps(node)}")
    if not node:
        return MATCH_ALL
    head = node[0]
    if head in ("and", "or"):
        if len(node) < 2:
            raise _malformed(field, node, f"'{head}' needs at least one operand")
        parts = tuple(_parse(field, part, depth + 1) for part in node[1:])
        return AllOf(parts) if head == "and" else AnyOf(parts)
    if head == "not":
        if len(node) != 2:
            raise _malformed(field, node, "'not' takes exactly one operand")
        return Not(_parse(field, node[1], depth + 1))
    if isinstance(head, str) and head in _OPS:
        if len(node) != 3:
            raise _malformed(
                field, node, f"'{head}' takes a $property and a value: {json.dumps(node)}"
            )
        prop, value = node[1], node[2]
        if not isinstance(prop, str) or len(prop) < 2 or not prop.startswith("$"):
            raise _malformed(
                field, node, f'expected a property like "$memory_mb", got {json.dumps(prop)}'
            )
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise _malformed(
                field, node, f"the value compared with {prop} must be a string or number"
            )
        return Comparison("==" if head == "=" else head, prop[1:], str(value))
    raise _malformed(
        field,
        node,
        f"unknown operator {json.dumps(head)}; use and, or, not, ==, !=, <, <=, >, >=",
    )
