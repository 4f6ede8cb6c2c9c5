"""Backends: the side effects of starting and ending reservations in a given cloud (or none)."""

from __future__ import annotations

from importlib.metadata import entry_points

from climate.backends.base import Backend
from climate.config import Settings
from climate.errors import InvalidInput


def load_backend(settings: Settings) -> Backend:
    """The backend plugin named by ``settings.backend`` (entry point group ``climate.backends``),
    built from the settings."""
    for entry in entry_points(group="climate.backends"):
        if entry.name == settings.backend:
            backend: Backend = entry.load().from_settings(settings)
            return backend
    raise InvalidInput("backend", f"no backend named {settings.backend!r} is installed")
