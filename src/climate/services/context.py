"""What every service needs, built once at the entry point."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from climate.config import Settings
from climate.db.engine import Database
from climate.domain.clock import Clock
from climate.resources.base import ResourceType


def _nothing() -> None:
    return None


@dataclass
class ServiceContext:
    settings: Settings
    db: Database
    clock: Clock
    resource_types: dict[str, ResourceType]
    wake_manager: Callable[[], None] = field(default=_nothing)
    """Called after a commit that added or moved events (in-process managers wake at once)."""
