"""Usage rules as the settings give them (``usage_rules``), parsed and checked once: known keys,
kinds, units, scopes and property queries, positive limits and spans, unique names, and no rule
contradicting another (docs/fair-share.md)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence

from climate.errors import MalformedQuery
from climate.fairshare.rules import (
    COUNTED_KINDS,
    DAY,
    DURATION_KINDS,
    RESOURCE_TYPES,
    UNITS,
    Kind,
    Rule,
    RuleError,
    span,
)
from climate.planner.query import parse_query

COMMON_KEYS = frozenset({"name", "kind", "limit", "resource_type", "properties", "exempt_projects"})
KEYS: Mapping[Kind, frozenset[str]] = {
    **dict.fromkeys(DURATION_KINDS, COMMON_KEYS),
    Kind.CONCURRENT: COMMON_KEYS | {"unit", "per"},
    Kind.BUDGET: COMMON_KEYS | {"unit", "per", "window"},
    Kind.STACKING: COMMON_KEYS | {"per", "gap", "window"},
}
STACKING_LOOKAROUND = 7 * DAY
"""How far before and after a lease a stacking rule follows its chain by default."""

MAX_SPAN = 36_500 * DAY
"""The longest duration a rule may name (about a century): a window reaching further would
take its reads past the dates a datetime can hold."""

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])")
_ISO = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?")


def parse_span(where: str, value: object) -> float:
    """A positive duration in seconds: a number of seconds, ``"30d"``, ``"1d12h"``, ``"90m"``
    or an ISO 8601 duration of days, hours, minutes and seconds (``"P30D"``, ``"PT12H"``).

    :raises RuleError: naming ``where``.
    """
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        iso = _ISO.fullmatch(text.upper())
        if text.upper().startswith("P") and iso is not None and text.upper() not in ("P", "PT"):
            d, h, m, s = (int(part or 0) for part in iso.groups())
            seconds = float(d * 86_400 + h * 3600 + m * 60 + s)
        elif text and "".join(m.group(0) for m in _PART.finditer(text)) == text:
            factor = {"d": DAY, "h": 3600.0, "m": 60.0, "s": 1.0}
            seconds = sum(float(n) * factor[u] for n, u in _PART.findall(text))
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise RuleError(
            f"{where}: must be a positive duration (seconds, '30d', '12h', 'P30D'), not {value!r}"
        )
    if seconds > MAX_SPAN:
        raise RuleError(f"{where}: must be at most {span(MAX_SPAN)}, not {value!r}")
    return seconds


def parse_rules(raw: Sequence[object]) -> tuple[Rule, ...]:
    """Every rule of the settings, checked: known keys, kinds, units, per, resource types and
    property queries, positive limits, unique names, and nothing contradicting another rule.

    :raises RuleError: naming the rule (``usage_rules[i]`` when it has no name yet).
    """
    rules: list[Rule] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        rule = _parse_rule(i, item)
        if rule.name in seen:
            raise RuleError(f"rule {rule.name!r}: the name is used by an earlier rule")
        seen.add(rule.name)
        rules.append(rule)
    _check_coherent(rules)
    return tuple(rules)


_PARSED: dict[int, tuple[Sequence[object], tuple[Rule, ...]]] = {}


def parsed(raw: Sequence[object]) -> tuple[Rule, ...]:
    """``parse_rules(raw)``, once per settings' list of rules (they never change)."""
    found = _PARSED.get(id(raw))
    if found is None or found[0] is not raw:
        found = _PARSED[id(raw)] = (raw, parse_rules(raw))
    return found[1]


def _parse_rule(index: int, item: object) -> Rule:
    if not isinstance(item, Mapping):
        raise RuleError(f"usage_rules[{index}]: must be a table, not {item!r}")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        raise RuleError(f"usage_rules[{index}]: needs a name (a non-empty string)")
    where = f"rule {name!r}"
    try:
        kind = Kind(str(item.get("kind")))
    except ValueError:
        kinds = ", ".join(k.value for k in Kind)
        raise RuleError(f"{where}: kind must be one of {kinds}, not {item.get('kind')!r}") from None
    unknown = sorted(set(item) - KEYS[kind])
    if unknown:
        allowed = ", ".join(sorted(KEYS[kind]))
        raise RuleError(f"{where}: {unknown[0]!r} is not a key of a {kind} rule ({allowed})")
    if "limit" not in item:
        raise RuleError(f"{where}: needs a limit")
    if kind in DURATION_KINDS:
        limit = parse_span(f"{where}: limit", item["limit"])
    else:
        limit = _positive(where, item["limit"], whole=kind != Kind.BUDGET)
    unit = None
    if kind in COUNTED_KINDS:
        unit = item.get("unit")
        if unit not in UNITS:
            raise RuleError(
                f"{where}: unit must be one of {', '.join(UNITS)}, not {item.get('unit')!r}"
            )
    per = item.get("per", "user")
    if per not in ("user", "project"):
        raise RuleError(f"{where}: per must be 'user' or 'project', not {per!r}")
    resource_type = item.get("resource_type")
    if resource_type is not None:
        if resource_type not in RESOURCE_TYPES:
            known = ", ".join(sorted(RESOURCE_TYPES))
            raise RuleError(f"{where}: resource_type must be one of {known}, not {resource_type!r}")
        if unit is not None and resource_type not in UNITS[unit]:
            holders = ", ".join(sorted(UNITS[unit]))
            raise RuleError(
                f"{where}: {resource_type} holds no {unit}; {unit} are counted on {holders}"
            )
    text = item.get("properties", "")
    try:
        query = parse_query(f"{where}: properties", text)
    except MalformedQuery as bad:
        raise RuleError(str(bad)) from None
    window = 0.0
    if kind == Kind.BUDGET:
        if "window" not in item:
            raise RuleError(f"{where}: a budget needs a window (like '30d')")
        window = parse_span(f"{where}: window", item["window"])
    gap = 0.0
    if kind == Kind.STACKING:
        if "gap" not in item:
            raise RuleError(f"{where}: a stacking rule needs a gap (like '1h')")
        gap = parse_span(f"{where}: gap", item["gap"])
        window = parse_span(f"{where}: window", item.get("window", STACKING_LOOKAROUND))
        if window < gap:
            raise RuleError(f"{where}: window ({span(window)}) is shorter than gap ({span(gap)})")
    exempt = item.get("exempt_projects", [])
    if not isinstance(exempt, list) or not all(isinstance(p, str) and p for p in exempt):
        raise RuleError(f"{where}: exempt_projects must be a list of project ids")
    return Rule(
        name=name,
        kind=kind,
        limit=limit,
        unit=unit,
        per=per,
        window=window,
        gap=gap,
        resource_type=resource_type,
        properties=query,
        properties_text=text if isinstance(text, str) else json.dumps(text),
        exempt_projects=frozenset(exempt),
    )


def _positive(where: str, value: object, *, whole: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RuleError(f"{where}: limit must be a number, not {value!r}")
    if whole and value != int(value):
        raise RuleError(f"{where}: limit must be a whole number, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise RuleError(f"{where}: limit must be positive, not {value!r}")
    return float(value)


def _check_coherent(rules: Sequence[Rule]) -> None:
    """Rules that cannot both hold as meant: an extension longer than a lease of the same
    scope may last."""
    for rule in rules:
        for other in rules:
            same_scope = (rule.resource_type, rule.properties_text) == (
                other.resource_type,
                other.properties_text,
            )
            if not same_scope or rule is other:
                continue
            if (
                rule.kind == Kind.MAX_EXTENSION
                and other.kind == Kind.MAX_LENGTH
                and rule.limit > other.limit
            ):
                raise RuleError(
                    f"rule {rule.name!r}: an extension of {span(rule.limit)} is longer than "
                    f"rule {other.name!r} lets a lease last ({span(other.limit)})"
                )
