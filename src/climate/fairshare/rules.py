"""Usage rules: parsed once from the settings (``rule_config``), then evaluated against a lease
being admitted and the consumption figures of its owner (docs/fair-share.md). Pure: no
database, no clock.

Times are seconds since the epoch (floats), amounts are per unit (``UNITS``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from climate.planner.query import MATCH_ALL, Properties, Query

DAY = 86_400.0
HOSTS, INSTANCES = "physical:host", "virtual:instance"
FLOATING_IPS, VOLUMES = "virtual:floatingip", "virtual:volume"
RESOURCE_TYPES = frozenset({HOSTS, INSTANCES, FLOATING_IPS, VOLUMES, "device", "network"})
SINGULAR = {"hosts": "host", "vcpus": "vCPU", "gpus": "GPU", "ips": "IP", "gb": "GB"}
UNITS: Mapping[str, frozenset[str]] = {
    "hosts": frozenset({HOSTS}),
    "vcpus": frozenset({HOSTS, INSTANCES}),
    "gpus": frozenset({HOSTS}),
    "ips": frozenset({FLOATING_IPS}),
    "gb": frozenset({VOLUMES}),
}
"""Each unit a rule may count, with the resource types that hold it: whole hosts count one
host and their ``vcpus``; their GPUs are the host property named by ``usage_gpu_property``;
instances count their vCPUs; floating IPs one IP each; volumes their GB."""


class Kind(enum.StrEnum):
    MAX_LENGTH = "max_length"
    MAX_ADVANCE = "max_advance"
    EXTENSION_WINDOW = "extension_window"
    MAX_EXTENSION = "max_extension"
    CONCURRENT = "concurrent"
    BUDGET = "budget"
    STACKING = "stacking"


DURATION_KINDS = frozenset(
    {Kind.MAX_LENGTH, Kind.MAX_ADVANCE, Kind.EXTENSION_WINDOW, Kind.MAX_EXTENSION}
)
COUNTED_KINDS = frozenset({Kind.CONCURRENT, Kind.BUDGET})


class RuleError(ValueError):
    """A rule that cannot be used; the message names it."""


@dataclass(frozen=True)
class Rule:
    name: str
    kind: Kind
    limit: float
    """Seconds for the duration kinds, units for ``concurrent``, unit-days for ``budget``,
    leases for ``stacking``."""
    unit: str | None = None
    per: str = "user"
    window: float = 0.0
    """``budget``: the rolling window; ``stacking``: how far its chain is followed."""
    gap: float = 0.0
    resource_type: str | None = None
    properties: Query = MATCH_ALL
    properties_text: str = ""
    exempt_projects: frozenset[str] = frozenset()

    def covers(self, resource_type: str, properties: Properties) -> bool:
        """Whether a resource of this type with these properties is in the rule's scope."""
        if self.resource_type is not None and resource_type != self.resource_type:
            return False
        if self.unit is not None and resource_type not in UNITS[self.unit]:
            return False
        return self.properties is MATCH_ALL or self.properties.matches(properties)

    def scoped(self, resource_type: str, properties: Properties) -> bool:
        """Whether a resource is in the rule's resource type and properties (whatever it
        holds)."""
        if self.resource_type is not None and resource_type != self.resource_type:
            return False
        return self.properties is MATCH_ALL or self.properties.matches(properties)

    def describe(self) -> str:
        """What the rule allows, in words: ``at most 32 gpu-days per user per 30 days``."""
        scope = "" if self.resource_type is None else f" of {self.resource_type}"
        if self.properties_text:
            scope += f" matching {self.properties_text}"
        if self.kind == Kind.MAX_LENGTH:
            return f"a lease{scope} may last at most {span(self.limit)}"
        if self.kind == Kind.MAX_ADVANCE:
            return f"a lease{scope} may start at most {span(self.limit)} ahead"
        if self.kind == Kind.EXTENSION_WINDOW:
            return f"a lease{scope} may be extended only in its last {span(self.limit)}"
        if self.kind == Kind.MAX_EXTENSION:
            return f"a lease{scope} may be extended by at most {span(self.limit)} at a time"
        if self.kind == Kind.CONCURRENT:
            return f"at most {number(self.limit)} {self.unit}{scope} at once per {self.per}"
        if self.kind == Kind.BUDGET:
            return (
                f"at most {number(self.limit)} {unit_of(self)}{scope} per {self.per} "
                f"in any {span(self.window)}"
            )
        return (
            f"at most {number(self.limit)} overlapping or back-to-back leases{scope} per "
            f"{self.per}, with gaps of at least {span(self.gap)} between chains"
        )


class Span(NamedTuple):
    """One resource (or a bundle of one type) a lease of the owner holds over [start, end)
    (a tuple: admission builds one per allocation row it reads)."""

    lease_id: str
    user_id: str
    resource_type: str
    properties: Properties
    amounts: Mapping[str, float]
    start: float
    end: float


@dataclass(frozen=True)
class Admission:
    """The lease being admitted, as it would be."""

    lease_id: str
    project_id: str
    user_id: str
    now: float
    start: float
    end: float
    resource_types: frozenset[str]
    previous: tuple[float, float] | None = None
    """An update: the lease's window before it."""


@dataclass(frozen=True)
class Decision:
    rule: Rule
    allowed: bool
    figure: float
    """What the rule measured (same unit as its limit)."""
    exempt: bool = False
    project: str = ""
    """An exempt decision's project."""

    @property
    def what(self) -> str:
        """The figure in words (made when shown: most decisions never are)."""
        if self.exempt:
            return f"project {self.project} is exempt"
        rule, figure = self.rule, self.figure
        if rule.kind == Kind.MAX_LENGTH:
            return f"this lease lasts {span(figure)}"
        if rule.kind == Kind.MAX_ADVANCE:
            return f"this lease starts {span(figure)} ahead"
        if rule.kind == Kind.MAX_EXTENSION:
            return f"this update extends it by {span(figure)}"
        if rule.kind == Kind.EXTENSION_WINDOW:
            return f"it is asked {span(figure)} before the lease ends"
        if rule.kind == Kind.CONCURRENT:
            return f"with this lease the {rule.per} would hold {number(figure)} {rule.unit} at once"
        if rule.kind == Kind.BUDGET:
            return (
                f"with this lease the {rule.per} would use {number(figure)} {unit_of(rule)} "
                f"in {span(rule.window)}"
            )
        return f"this lease would make {number(figure)} leases less than {span(rule.gap)} apart"

    @property
    def message(self) -> str:
        """``usage rule 'x' (kind: what it allows): the figure; within or breaks the limit``
        (made when shown: most decisions never are)."""
        if self.exempt:
            return f"usage rule {self.rule.name!r}: {self.what}"
        verdict = "within" if self.allowed else "breaks"
        rule = self.rule
        allows = f"{rule.kind}: {rule.describe()}"
        return f"usage rule {rule.name!r} ({allows}): {self.what}; {verdict} the limit"

    def summary(self) -> dict[str, object]:
        """The decision in short, as the audit log keeps an admission's decisions."""
        return {
            "rule": self.rule.name,
            "figure": shown_figure(self.rule, self.figure),
            "limit": shown_limit(self.rule),
            "exempt": self.exempt,
        }

    def body(self) -> dict[str, object]:
        """The decision as the API, the audit log and notifications show it."""
        return {
            "rule": self.rule.name,
            "kind": self.rule.kind.value,
            "limit": shown_limit(self.rule),
            "figure": shown_figure(self.rule, self.figure),
            "unit": unit_of(self.rule),
            "allowed": self.allowed,
            "exempt": self.exempt,
            "message": self.message,
        }


def unit_of(rule: Rule) -> str:
    if rule.kind in DURATION_KINDS:
        return "seconds"
    if rule.kind == Kind.BUDGET:
        return f"{SINGULAR[str(rule.unit)]}-days"
    if rule.kind == Kind.STACKING:
        return "leases"
    return str(rule.unit)


def shown_limit(rule: Rule) -> float:
    return rule.limit if rule.kind not in DURATION_KINDS else int(rule.limit)


def shown_figure(rule: Rule, figure: float) -> float:
    if rule.kind in DURATION_KINDS:
        return int(figure)
    return round(figure, 6) if rule.kind == Kind.BUDGET else figure


# -- evaluation ------------------------------------------------------------------------------


def reach(rules: Iterable[Rule], admission: Admission, per: str) -> tuple[float, float] | None:
    """The time range [start, end) of the consumption the rules counting per ``per`` (user or
    project) need to judge ``admission``; None when none does."""
    found: tuple[float, float] | None = None
    for rule in rules:
        if rule.per != per or rule.kind in DURATION_KINDS:
            continue
        pad = rule.window if rule.kind in (Kind.BUDGET, Kind.STACKING) else 0.0
        low, high = admission.start - pad, admission.end + pad
        found = (low, high) if found is None else (min(found[0], low), max(found[1], high))
    return found


def evaluate(
    rules: Sequence[Rule],
    admission: Admission,
    spans: Sequence[Span] | None,
    project: Sequence[Span] | None = None,
) -> list[Decision]:
    """A decision for every rule whose scope the lease falls in (an exempt project's rules are
    decided allowed and marked ``exempt``). ``spans``: what the owner's project holds in the
    ``reach`` of the rules, the lease's own resources included (``lease_id``), or only what
    its user holds when ``project`` gives the project's; None when its resources are not
    chosen yet: rules that need them, or a property scope, are left out."""
    decisions: list[Decision] = []
    pool = _Pool(spans or (), project, admission)
    for rule in rules:
        if spans is None and (rule.kind not in DURATION_KINDS or rule.properties is not MATCH_ALL):
            continue
        if not _in_scope(rule, admission, pool, spans is None):
            continue
        if admission.project_id in rule.exempt_projects:
            decisions.append(Decision(rule, True, 0.0, True, admission.project_id))
            continue
        decision = _decide(rule, admission, pool)
        if decision is not None:
            decisions.append(decision)
    return decisions


class _Pool:
    """The spans grouped by resource type and properties (spans of one resource share their
    properties), so that each rule tests its scope once per group, not once per span."""

    def __init__(
        self, spans: Sequence[Span], project: Sequence[Span] | None, admission: Admission
    ) -> None:
        groups: dict[tuple[str, int], tuple[str, Properties, list[Span], list[Span]]] = {}
        owned: set[tuple[str, int]] = set()
        user, lease = admission.user_id, admission.lease_id
        for s in spans:
            key = (s.resource_type, id(s.properties))
            group = groups.get(key)
            if group is None:
                group = groups[key] = (s.resource_type, s.properties, [], [])
            if project is None:
                group[2].append(s)
            if s.user_id == user:
                group[3].append(s)
            if s.lease_id == lease:
                owned.add(key)
        for s in project or ():
            key = (s.resource_type, id(s.properties))
            group = groups.get(key)
            if group is None:
                group = groups[key] = (s.resource_type, s.properties, [], [])
            group[2].append(s)
        self.groups = list(groups.values())
        self.owned = [(groups[key][0], groups[key][1]) for key in owned]

    def select(self, test: Callable[[str, Properties], bool], per: str) -> list[Span]:
        """The spans of the groups passing ``test``: the project's, or the user's."""
        chosen: list[Span] = []
        for resource_type, properties, everyone, users in self.groups:
            if test(resource_type, properties):
                chosen.extend(everyone if per == "project" else users)
        return chosen

    def own(self, test: Callable[[str, Properties], bool]) -> bool:
        """Whether the lease itself holds a resource passing ``test``."""
        return any(test(resource_type, properties) for resource_type, properties in self.owned)


def _in_scope(rule: Rule, admission: Admission, pool: _Pool, unchosen: bool) -> bool:
    if rule.kind in COUNTED_KINDS and not unchosen:
        return pool.own(rule.covers)
    if rule.properties is MATCH_ALL:
        return rule.resource_type is None or rule.resource_type in admission.resource_types
    return pool.own(rule.scoped)


def _decide(rule: Rule, admission: Admission, pool: _Pool) -> Decision | None:
    start, end = admission.start, admission.end
    if rule.kind == Kind.MAX_LENGTH:
        return _judge(rule, end - start)
    if rule.kind == Kind.MAX_ADVANCE:
        return _judge(rule, max(0.0, start - admission.now))
    previous = admission.previous
    if rule.kind in (Kind.EXTENSION_WINDOW, Kind.MAX_EXTENSION):
        if previous is None or end <= previous[1]:
            return None  # not an extension
        if rule.kind == Kind.MAX_EXTENSION:
            return _judge(rule, end - previous[1])
        return _judge(rule, max(0.0, previous[1] - admission.now))
    if rule.kind == Kind.CONCURRENT:
        return _judge(rule, peak(pool.select(rule.covers, rule.per), str(rule.unit), start, end))
    if rule.kind == Kind.BUDGET:
        mine = pool.select(rule.covers, rule.per)
        return _judge(rule, rolling(mine, str(rule.unit), rule.window, start, end) / DAY)
    if not pool.own(rule.scoped):
        return None
    # Only as far as its own window: the spans read may reach further for another rule.
    low, high = start - rule.window, end + rule.window
    near = [s for s in pool.select(rule.scoped, rule.per) if s.start < high and s.end > low]
    return _judge(rule, float(chain(near, admission.lease_id, rule.gap)))


def _judge(rule: Rule, figure: float) -> Decision:
    return Decision(rule, figure <= rule.limit + 1e-9, figure)


def peak(spans: Sequence[Span], unit: str, start: float, end: float) -> float:
    """The most of ``unit`` held at once at any instant of [start, end)."""
    # Comparisons, not min() and max(): this runs over every span at every admission.
    changes: list[tuple[float, float]] = []
    for s in spans:
        amount = s.amounts.get(unit)
        if not amount:
            continue
        low = s.start if s.start > start else start
        high = s.end if s.end < end else end
        if low < high:
            changes.append((low, amount))
            changes.append((high, -amount))
    changes.sort()  # at one instant the ends (negative) come before the starts
    held = best = 0.0
    for _, amount in changes:
        held += amount
        if held > best:
            best = held
    return best


def held_over(spans: Sequence[Span], unit: str, low: float, high: float) -> float:
    """Unit-seconds of ``unit`` held within [low, high)."""
    return sum(
        s.amounts.get(unit, 0.0) * max(0.0, min(s.end, high) - max(s.start, low)) for s in spans
    )


def rolling(spans: Sequence[Span], unit: str, window: float, start: float, end: float) -> float:
    """The most unit-seconds held in any window of length ``window`` that overlaps [start,
    end). What the window starting at t holds, W(t) = F(t + window) - F(t) with F the running
    total of unit-seconds, is piecewise linear in t, its slope changing only where t or
    t + window meets a span's start or end: W is read at the range's start, then carried from
    one such instant to the next along its slope (a sum of amounts), the fullest kept. Spans in
    no window are left out: the figure is the same, bit for bit, whatever else was read."""
    low, high = start - window, end
    last = high + window  # the end of the last window
    held = slope = 0.0  # W(low), and its slope just after low
    changes: list[tuple[float, float]] = []  # where the slope changes within the range
    add = changes.append
    for s in spans:
        amount = s.amounts.get(unit)
        a, b = s.start, s.end
        if not amount or a >= b or b <= low or a >= last:
            continue  # in no window: read for another rule, it moves no figure of this one
        overlap = (b if b < start else start) - (a if a > low else low)  # of [low, start)
        if overlap > 0:
            held += amount * overlap
        # The window's end enters the span at a - window and leaves it at b - window; its
        # start enters at a and leaves at b. (Unrolled: a loop over the four costs twice as
        # much, and this runs for every span of every budget at every admission.)
        at = a - window
        if at <= low:
            slope += amount
        elif at < high:
            add((at, amount))
        if a <= low:
            slope -= amount
        elif a < high:
            add((a, -amount))
        at = b - window
        if at <= low:
            slope -= amount
        elif at < high:
            add((at, -amount))
        if b <= low:
            slope += amount
        elif b < high:
            add((b, amount))
    changes.sort()
    best, t = held, low
    for at, change in changes:
        held += slope * (at - t)
        if held > best:
            best = held
        slope += change
        t = at
    return max(best, held + slope * (high - t))


def chain(spans: Sequence[Span], lease_id: str, gap: float) -> int:
    """How many leases form the chain ``lease_id`` is in: leases whose windows overlap or are
    less than ``gap`` apart, one after another."""
    windows: dict[str, list[float]] = {}
    for s in spans:
        w = windows.setdefault(s.lease_id, [s.start, s.end])
        w[0], w[1] = min(w[0], s.start), max(w[1], s.end)
    ordered = sorted(windows.items(), key=lambda item: item[1][0])
    groups: list[list[str]] = []
    reach_end = -math.inf
    for lid, (begin, finish) in ordered:
        if not groups or begin >= reach_end + gap:
            groups.append([])
            reach_end = finish
        groups[-1].append(lid)
        reach_end = max(reach_end, finish)
    return next((len(g) for g in groups if lease_id in g), 0)


# -- words -----------------------------------------------------------------------------------


def span(seconds: float) -> str:
    """``2 days 3 hours``: a duration in words, to the minute (seconds when under one)."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole} seconds"
    days, rest = divmod(whole // 60, 1440)
    hours, minutes = divmod(rest, 60)
    parts = [(days, "day"), (hours, "hour"), (minutes, "minute")]
    return " ".join(f"{n} {word}{'s' if n != 1 else ''}" for n, word in parts if n)


def number(value: float) -> str:
    return f"{value:.6g}" if value != int(value) else str(int(value))
