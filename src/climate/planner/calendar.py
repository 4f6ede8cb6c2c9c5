"""Per-host busy spans as sorted arrays: what overlaps a window, and its neighbours, in O(log n).

Spans of one host never overlap (that is the invariant admission keeps), so sorted by start they
are sorted by end too, and both searches are bisections. Times are float seconds since the epoch:
compact, and compared without timezone arithmetic.
"""

from __future__ import annotations

import datetime as dt
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from climate.planner.hosts import HostCalendar


def seconds(when: dt.datetime) -> float:
    return when.timestamp()


def moment(value: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(value, dt.UTC)


@dataclass
class _HostSpans:
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)

    def insert(self, start: float, end: float, owner: str) -> None:
        i = bisect_left(self.starts, start)
        self.starts.insert(i, start)
        self.ends.insert(i, end)
        self.owners.insert(i, owner)

    def remove(self, start: float, owner: str) -> None:
        i = bisect_left(self.starts, start)
        while i < len(self.starts) and self.starts[i] == start:
            if self.owners[i] == owner:
                del self.starts[i], self.ends[i], self.owners[i]
                return
            i += 1


@dataclass(frozen=True)
class Span:
    host_id: int
    start: float
    end: float
    owner: str
    """The reservation holding the host."""


class Calendar:
    """Busy spans of every host, with their owning reservation."""

    def __init__(self) -> None:
        self._hosts: dict[int, _HostSpans] = {}
        self._by_owner: dict[str, list[Span]] = {}

    def __len__(self) -> int:
        return sum(len(spans) for spans in self._by_owner.values())

    def add(self, span: Span) -> None:
        self._hosts.setdefault(span.host_id, _HostSpans()).insert(span.start, span.end, span.owner)
        self._by_owner.setdefault(span.owner, []).append(span)

    def drop_owner(self, owner: str) -> list[Span]:
        """Remove every span of ``owner``; returns them (to put back on rollback)."""
        spans = self._by_owner.pop(owner, [])
        for span in spans:
            self._hosts[span.host_id].remove(span.start, owner)
        return spans

    def owned_by(self, owner: str) -> list[Span]:
        return list(self._by_owner.get(owner, ()))

    def overlapping(self, host_id: int, start: float, end: float) -> list[Span]:
        """The spans of ``host_id`` overlapping [start, end)."""
        spans = self._hosts.get(host_id)
        if spans is None:
            return []
        first = bisect_right(spans.ends, start)
        after = bisect_left(spans.starts, end)
        return [
            Span(host_id, spans.starts[i], spans.ends[i], spans.owners[i])
            for i in range(first, after)
        ]

    def view(
        self,
        hosts: Iterable[tuple[int, str]],
        start: dt.datetime,
        end: dt.datetime,
        exclude: Collection[str] = (),
        lookaround: float = 86400.0,
    ) -> list[HostCalendar]:
        """The planner's view of ``hosts`` (id, name) around [start, end), ignoring ``exclude``."""
        s, e = seconds(start), seconds(end)
        found = []
        for host_id, name in hosts:
            spans = self._hosts.get(host_id)
            if spans is None or not spans.starts:
                found.append(HostCalendar(host_id, name))
                continue
            starts, ends, owners = spans.starts, spans.ends, spans.owners
            first = bisect_right(ends, s)  # first span ending after the window starts
            after = bisect_left(starts, e)  # first span starting at or after its end
            busy = tuple(
                (moment(starts[i]), moment(ends[i]))
                for i in range(first, after)
                if owners[i] not in exclude
            )
            before = first - 1
            while before >= 0 and owners[before] in exclude:
                before -= 1
            following = after
            while following < len(starts) and owners[following] in exclude:
                following += 1
            near_before = before >= 0 and s - ends[before] <= lookaround
            near_after = following < len(starts) and starts[following] - e <= lookaround
            found.append(
                HostCalendar(
                    host_id=host_id,
                    name=name,
                    busy=busy,
                    previous_end=moment(ends[before]) if near_before else None,
                    next_start=moment(starts[following]) if near_after else None,
                )
            )
        return found
