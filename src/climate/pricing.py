"""The service's one price table: what an hour of a resource costs, flat per resource type or a
premium for resources with a given property (the design's "flat fee or premium price").

Pure: no I/O. ``prices`` (a setting) maps a rule to a price per unit-hour, as a decimal string:

- ``"physical:host"``: every host-hour (the flat price of the type);
- ``"physical:host[gpu=a100]"``: an hour of a host whose property ``gpu`` is ``a100`` (a
  premium). Where several premiums match, the highest price applies; where none does, the flat
  price; with neither, the hour is free.

Each resource type is counted in its unit (``UNITS``): instances in vCPU-hours and in GB-hours of
memory (the types ``virtual:instance:vcpu`` and ``virtual:instance:memory_gb``), volumes in
GB-hours, hosts, floating IPs, devices and network segments in hours of one. Usage reports
price through :meth:`PriceTable.amount`; credits quote a lease through :func:`quote`, which also
weighs each resource by its factor property (Chameleon's ``su_factor``, docs/credits.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Context, Decimal, InvalidOperation
from typing import NamedTuple

from climate.errors import InvalidInput

UNITS: dict[str, str] = {
    "physical:host": "host-hours",
    "virtual:instance:vcpu": "vcpu-hours",
    "virtual:instance:memory_gb": "memory-gb-hours",
    "virtual:volume": "gb-hours",
    "virtual:floatingip": "ip-hours",
    "device": "device-hours",
    "network": "segment-hours",
}
"""The resource types a price can be set for, and the unit their hours are counted in."""
CENT = Decimal("0.01")
_EXACT = Context(prec=80)
"""Exact for the products a quote sums (its methods, not a local context: a quote runs at every
admission)."""
_FREE, _ONE = Decimal(0), Decimal(1)
MAX_PRICE = Decimal(10**9)
"""The highest price per unit-hour the table takes."""
MAX_FACTOR = Decimal(10**6)
"""The largest factor a resource's property may give (a larger one counts 1, as a malformed
one does): with ``MAX_PRICE`` it keeps every quote's digits within ``_EXACT``."""
MAX_CENTS = 2**63 - 1
"""The most cents a balance, an entry or an encumbrance can hold (a 64-bit column)."""
_RULE = re.compile(r"^(?P<type>[a-z_:]+)(?:\[(?P<name>[^=\]]+)=(?P<value>[^\]]*)\])?$")


@dataclass(frozen=True)
class Premium:
    name: str
    value: str
    price: Decimal


@dataclass(frozen=True)
class Rate:
    """The price per unit-hour that applies to one resource, and the rule it comes from."""

    price: Decimal
    rule: str
    """``physical:host``, ``physical:host[gpu=a100]``, or ``""`` when no rule applies (free)."""


@dataclass(frozen=True)
class PriceTable:
    flat: Mapping[str, Decimal]
    premiums: Mapping[str, tuple[Premium, ...]]

    @classmethod
    def parse(cls, prices: Mapping[str, str], field: str = "prices") -> PriceTable:
        """:raises InvalidInput: an unknown resource type, a malformed rule or price, or a
        negative price (named ``prices.<rule>``)."""
        flat: dict[str, Decimal] = {}
        premiums: dict[str, list[Premium]] = {}
        for rule, text in prices.items():
            match = _RULE.match(rule)
            where = f"{field}.{rule}"
            if match is None:
                raise InvalidInput(where, "a rule is 'TYPE' or 'TYPE[PROPERTY=VALUE]'")
            kind = match["type"]
            if kind not in UNITS:
                raise InvalidInput(where, f"unknown resource type; one of {', '.join(UNITS)}")
            price = _price(where, text)
            if match["name"] is None:
                flat[kind] = price
            else:
                premiums.setdefault(kind, []).append(Premium(match["name"], match["value"], price))
        return cls(flat, {k: tuple(v) for k, v in premiums.items()})

    def rate(self, resource_type: str, properties: Mapping[str, str]) -> Rate:
        """The price of one unit-hour of a resource of this type with these properties."""
        best = self._premium(resource_type, properties)
        if best is not None:
            return Rate(best.price, f"{resource_type}[{best.name}={best.value}]")
        if resource_type in self.flat:
            return Rate(self.flat[resource_type], resource_type)
        return Rate(_FREE, "")

    def price(self, resource_type: str, properties: Mapping[str, str]) -> Decimal:
        """``rate``'s price alone (every quote asks, per resource)."""
        best = self._premium(resource_type, properties)
        return best.price if best is not None else self.flat.get(resource_type, _FREE)

    def _premium(self, resource_type: str, properties: Mapping[str, str]) -> Premium | None:
        best: Premium | None = None
        for premium in self.premiums.get(resource_type, ()):
            if properties.get(premium.name) == premium.value and (
                best is None or premium.price > best.price
            ):
                best = premium
        return best

    def amount(
        self, resource_type: str, properties: Mapping[str, str], unit_hours: Decimal
    ) -> Decimal:
        """What ``unit_hours`` of such a resource cost, to the cent (half to even)."""
        return cost(self.price(resource_type, properties), unit_hours)


def cost(price: Decimal, unit_hours: Decimal) -> Decimal:
    return (price * unit_hours).quantize(CENT, rounding=ROUND_HALF_EVEN)


def hours(unit_seconds: int) -> Decimal:
    """Unit-seconds as unit-hours, exact to the microsecond-hour."""
    return (Decimal(unit_seconds) / 3600).quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN)


class Use(NamedTuple):
    """``units`` of one resource of ``resource_type`` (a type of ``UNITS``) with these
    properties, held for ``microseconds`` (a tuple: every quote builds one per allocation)."""

    resource_type: str
    properties: Mapping[str, str]
    units: Decimal
    microseconds: int


MICROSECONDS_PER_HOUR = 3_600_000_000


def factor(properties: Mapping[str, str], name: str) -> Decimal:
    """A resource's price factor: its property ``name`` as a decimal number from 0 to
    ``MAX_FACTOR``; 1 when it has none, or one that is not such a number."""
    text = properties.get(name)
    if text is None:
        return _ONE
    try:
        found = Decimal(str(text).strip())
    except InvalidOperation:
        return _ONE
    return found if found.is_finite() and 0 <= found <= MAX_FACTOR else _ONE


def quote(table: PriceTable, factor_name: str, uses: Iterable[Use]) -> Decimal:
    """What ``uses`` cost: the sum over them of unit-hours x the table's rate x the resource's
    factor (property ``factor_name``), computed exactly and rounded once, to the cent (half to
    even). Rounding once makes the quote monotone in time: a use cut short never costs more."""
    multiply, add = _EXACT.multiply, _EXACT.add
    total = _FREE
    for use in uses:
        rate = table.price(use.resource_type, use.properties)
        if rate and use.microseconds > 0:
            weight = factor(use.properties, factor_name)
            total = add(
                total, multiply(multiply(multiply(rate, weight), use.units), use.microseconds)
            )
    hours = _EXACT.divide(total, MICROSECONDS_PER_HOUR)
    return hours.quantize(CENT, rounding=ROUND_HALF_EVEN, context=_EXACT)


def cents(amount: Decimal) -> int:
    """An amount to the cent as whole cents."""
    return int(_EXACT.multiply(amount.quantize(CENT, context=_EXACT), 100))


def from_cents(count: int) -> Decimal:
    return (Decimal(count) / 100).quantize(CENT)


def _price(where: str, text: str) -> Decimal:
    try:
        price = Decimal(str(text).strip())
    except InvalidOperation:
        raise InvalidInput(where, f"must be a decimal number, not {text!r}") from None
    if not price.is_finite() or not 0 <= price <= MAX_PRICE:
        raise InvalidInput(where, f"must be a number from 0 to {MAX_PRICE}, not {text!r}")
    return price
