"""Backends: the side effects of starting and ending reservations in a given cloud (or none)."""

from __future__ import annotations

from importlib.metadata import entry_points

from climate.backends.base import Backend
from climate.errors import InvalidInput


def load_backend(name: str) -> Backend:
    """The backend plugin named ``name`` (entry point group ``climate.backends``)."""
    for entry in entry_points(group="climate.backends"):
        if entry.name == name:
            backend: Backend = entry.load()()
            return backend
    raise InvalidInput("backend", f"no backend named {name!r} is installed")
