"""Resource types: what a reservation of each kind means over time. Registered by entry point."""

from __future__ import annotations

import functools
from importlib.metadata import entry_points
from typing import Any

from climate.domain.views import ReservationView
from climate.errors import InvalidInput
from climate.resources.base import ResourceType
from climate.resources.capabilities import SharedHosts, WholeHosts


def load_resource_types() -> dict[str, ResourceType]:
    """Every installed resource type plugin (entry point group ``climate.resources``)."""
    found: dict[str, ResourceType] = {}
    for entry in entry_points(group="climate.resources"):
        plugin = entry.load()()
        found[plugin.name] = plugin
    whole = [t for t in found.values() if isinstance(t, WholeHosts)]
    for shared in (t for t in found.values() if isinstance(t, SharedHosts)):
        if whole:
            shared.calendar = whole[0].calendar
    return found


@functools.cache
def _installed() -> dict[str, ResourceType]:
    return load_resource_types()


def shown(reservation: ReservationView) -> dict[str, Any]:
    """The fields of its own the reservation's resource type shows on the wire
    (``ResourceType.shown``); none for a type not installed."""
    rtype = _installed().get(reservation.resource_type)
    return {} if rtype is None else rtype.shown(reservation)


def pick(types: dict[str, ResourceType], name: object, field: str) -> ResourceType:
    if not isinstance(name, str) or name not in types:
        known = ", ".join(sorted(types))
        raise InvalidInput(  # Blazar's words, then ours
            field, f"The {name} resource type is not supported; this service offers {known}"
        )
    return types[name]
