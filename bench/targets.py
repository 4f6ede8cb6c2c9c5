"""Targets: a measured figure against its goal, printed as PASS or MISS."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    name: str
    measured: float | None
    goal: float
    unit: str
    higher_is_better: bool = False
    note: str = ""

    @property
    def verdict(self) -> str:
        if self.measured is None:
            return "MISS (not measured)"
        ok = self.measured >= self.goal if self.higher_is_better else self.measured <= self.goal
        return "PASS" if ok else "MISS"

    def row(self) -> list[object]:
        sign = ">=" if self.higher_is_better else "<="
        measured = "-" if self.measured is None else f"{self.measured:,.2f}"
        return [
            self.name,
            f"{measured} {self.unit}",
            f"{sign} {self.goal:,g} {self.unit}",
            self.verdict,
            self.note,
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "measured": self.measured,
            "goal": self.goal,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "verdict": self.verdict,
            "note": self.note,
        }
