"""Heat flavors: the sizes a stack template's servers may name (the ``flavors`` setting)."""

from __future__ import annotations

from dataclasses import dataclass

from climate.errors import InvalidInput


@dataclass(frozen=True)
class Flavor:
    vcpus: int
    memory_mb: int
    disk_gb: int


def parse_flavors(text: str) -> dict[str, Flavor]:
    """The ``flavors`` setting, ``name=vcpus:memory_mb:disk_gb`` separated by commas."""
    flavors = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, _, size = entry.partition("=")
        numbers = size.split(":")
        if not name.strip() or len(numbers) != 3 or not all(n.strip().isdigit() for n in numbers):
            raise InvalidInput("flavors", f"{entry!r} is not name=vcpus:memory_mb:disk_gb")
        vcpus, memory_mb, disk_gb = (int(n) for n in numbers)
        if vcpus < 1 or memory_mb < 1:
            raise InvalidInput("flavors", f"{entry!r}: vcpus and memory_mb must be at least 1")
        flavors[name.strip()] = Flavor(vcpus, memory_mb, disk_gb)
    return flavors
