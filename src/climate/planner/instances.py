"""Placing instances on hosts that share their capacity over time.

A host of (ratio-scaled) ``vcpus``, ``memory_mb`` and ``disk_gb`` holds instances of several
reservations at once, as long as at every instant the sizes of those running on it add up to at
most its capacity, per resource. All instances of one reservation share its window, so they fit
on a host if the peak of what others use there within the window leaves room for them: the
host has ``slots`` for that many. Where they go follows ``affinity``: all on one host (true),
on distinct hosts (false) or anywhere (null).

Rule (docs/planning.md, "Instances"): best fit. With affinity true, the host that can take them
all and keeps the fewest slots spare; with false, the ``amount`` hosts with the fewest spare
slots; with null, the host that takes the rest with the fewest slots spare if one can, else the
host with the most slots is filled and the rest placed again. Ties go to the host whose free
time around the window is shortest (as for whole hosts), then the lowest id. A refusal is exact:
the request fits somewhere iff it fits by this rule.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from climate.errors import Conflict, InvalidInput, NotEnoughCapacity

RESOURCES = ("vcpus", "memory_mb", "disk_gb")
UNITS = {"vcpus": "vCPUs", "memory_mb": "MB of memory", "disk_gb": "GB of disk"}
OPEN_GAP = 10 * 365 * 86400.0
"""A free gap with nothing on the other side (seconds): scores as very loose."""


@dataclass(frozen=True)
class Size:
    vcpus: int
    memory_mb: int
    disk_gb: int

    def times(self, count: int) -> Size:
        return Size(self.vcpus * count, self.memory_mb * count, self.disk_gb * count)

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.vcpus, self.memory_mb, self.disk_gb)

    def __str__(self) -> str:
        return f"{self.vcpus} vCPU / {self.memory_mb} MB / {self.disk_gb} GB"


Use = tuple[dt.datetime, dt.datetime, Size]
"""What another reservation uses on a host over [start, end)."""


@dataclass(frozen=True)
class HostRoom:
    """A matching host: its capacity (allocation ratios applied) and what others use on it
    around the window (instances; a host reserved whole is not a candidate at all)."""

    id: int
    name: str
    capacity: Size
    uses: Sequence[Use] = ()


@dataclass(frozen=True)
class InstanceDemand:
    start: dt.datetime
    end: dt.datetime
    amount: int
    size: Size
    affinity: bool | None
    keep: Mapping[int, int] = field(default_factory=dict)
    """Instances per host that cannot move (the lease is active): they stay where they are."""


def slots(
    hosts: Sequence[HostRoom], size: Size, start: dt.datetime, end: dt.datetime
) -> npt.NDArray[np.int64]:
    """How many instances of ``size`` each host can take for the whole window."""
    if not hosts:
        return np.zeros(0, dtype=np.int64)
    capacity = np.array([h.capacity.as_tuple() for h in hosts], dtype=np.int64)
    free = capacity - _peaks(hosts, start, end)
    wanted = np.array(size.as_tuple(), dtype=np.int64)
    sized = wanted > 0  # vcpus and memory are at least 1; disk may be 0
    room = np.maximum(free[:, sized], 0) // wanted[sized]
    return np.asarray(room.min(axis=1), dtype=np.int64)


def _peaks(
    hosts: Sequence[HostRoom], start: dt.datetime, end: dt.datetime
) -> npt.NDArray[np.int64]:
    """Per host, the largest use of each resource at one instant of [start, end): one sweep
    over every host's uses together (a host's running level starts and ends at zero, so one
    cumulative sum serves all of them)."""
    s0, e0 = start.timestamp(), end.timestamp()
    listed = [
        (k, max(s.timestamp(), s0), min(e.timestamp(), e0), *used.as_tuple())
        for k, host in enumerate(hosts)
        for s, e, used in host.uses
    ]
    peaks = np.zeros((len(hosts), len(RESOURCES)), dtype=np.int64)
    table = np.array(listed, dtype=np.float64).reshape(-1, 3 + len(RESOURCES))
    table = table[table[:, 1] < table[:, 2]]
    if not len(table):
        return peaks
    at = table[:, 0].astype(np.int64)
    used = table[:, 3:].astype(np.int64)
    hosts_of = np.concatenate((at, at))
    times = np.concatenate((table[:, 1], table[:, 2]))
    # Releases (kind 0) sort before takes at the same instant: touching uses do not add up.
    kinds = np.concatenate((np.ones(len(at)), np.zeros(len(at))))
    deltas = np.concatenate((used, -used))
    order = np.lexsort((kinds, times, hosts_of))
    levels = np.cumsum(deltas[order], axis=0)
    np.maximum.at(peaks, hosts_of[order], levels)
    return peaks


def _time_fit(host: HostRoom, start: dt.datetime, end: dt.datetime) -> float:
    """The free time around the window on ``host``: less is tighter."""
    before = [e for _, e, _ in host.uses if e <= start]
    after = [s for s, _, _ in host.uses if s >= end]
    gap_before = (start - max(before)).total_seconds() if before else OPEN_GAP
    gap_after = (min(after) - end).total_seconds() if after else OPEN_GAP
    return gap_before + gap_after


def check_possible(demand: InstanceDemand, hosts: Sequence[HostRoom]) -> None:
    """Refuse what no matching host could ever hold, even empty.

    :raises InvalidInput: an instance is larger than every matching host (naming the resource).
    :raises Conflict: affinity true and ``amount`` instances are more than one host holds.
    """
    wanted = demand.size
    if not hosts:
        raise NotEnoughCapacity(
            f"Not enough hosts available: {demand.amount} instance(s) of {wanted} "
            "requested, but no reservable host with a size (vcpus, memory_mb, local_gb) "
            "matches the properties"
        )
    capacity = np.array([h.capacity.as_tuple() for h in hosts], dtype=np.int64)
    asked = np.array(wanted.as_tuple(), dtype=np.int64)
    for k, name in enumerate(RESOURCES):
        largest = int(capacity[:, k].max())
        if asked[k] > largest:
            raise InvalidInput(
                name,
                f"no host has {asked[k]} {UNITS[name]} (the largest matching host has {largest})",
            )
    sized = asked > 0  # as ``slots`` counts them, on empty hosts
    most = int((capacity[:, sized] // asked[sized]).min(axis=1).max())
    if most == 0:
        raise InvalidInput(
            "vcpus",
            f"no matching host holds one instance of {wanted} (each falls short in some resource)",
        )
    if demand.affinity is True and demand.amount > most:
        raise Conflict(
            f"affinity: {demand.amount} instances of {wanted} on one host are more than one "
            f"host's worth (a matching host holds at most {most})"
        )


def place(demand: InstanceDemand, hosts: Sequence[HostRoom]) -> dict[int, int]:
    """Instances per host for ``demand`` (see the module doc for the rule).

    :raises NotEnoughCapacity: not enough room for the whole window, with how much there is.
    :raises Conflict: an active reservation would lose instances it runs.
    """
    kept = sum(demand.keep.values())
    if demand.amount < kept:
        raise Conflict(
            "amount: Instance reservation doesn't allow to reduce/replace reserved instance "
            f"slots when the reservation is in active status (it runs {kept} instances, "
            f"{demand.amount} asked)"
        )
    if demand.affinity is True and len(demand.keep) > 1:
        raise Conflict("affinity: the reservation runs instances on several hosts already")
    if demand.affinity is False and any(c > 1 for c in demand.keep.values()):
        raise Conflict("affinity: the reservation runs several instances on one host already")
    room = slots(hosts, demand.size, demand.start, demand.end)
    position = {h.id: k for k, h in enumerate(hosts)}
    for host_id, count in demand.keep.items():
        k = position.get(host_id)
        if k is None or room[k] < count:
            raise NotEnoughCapacity(
                f"the reservation runs {count} instance(s) on host {host_id}, which no longer "
                f"has room for them (or no longer matches) for the whole window "
                f"{_window(demand)}; running instances cannot move"
            )
        room[k] -= count
    fits = [_time_fit(h, demand.start, demand.end) for h in hosts]
    ids = np.array([h.id for h in hosts], dtype=np.int64)
    placed = dict(demand.keep)
    rest = demand.amount - kept
    if rest == 0:
        return placed
    if demand.affinity is True:
        candidates = [position[h] for h in demand.keep] or list(range(len(hosts)))
        able = [k for k in candidates if room[k] >= rest]
        if not able:
            most = max((int(room[k]) for k in candidates), default=0)
            raise NotEnoughCapacity(_refusal(demand, hosts, f"at most {most} on one host"))
        best = min(able, key=lambda k: (int(room[k]) - rest, fits[k], int(ids[k])))
        placed[int(ids[best])] = placed.get(int(ids[best]), 0) + rest
        return placed
    if demand.affinity is False:
        able = [k for k in range(len(hosts)) if room[k] >= 1 and int(ids[k]) not in placed]
        if len(able) < rest:
            raise NotEnoughCapacity(
                _refusal(demand, hosts, f"{len(able)} more distinct host(s) with room")
            )
        able.sort(key=lambda k: (int(room[k]), fits[k], int(ids[k])))
        for k in able[:rest]:
            placed[int(ids[k])] = 1
        return placed
    total = int(room.sum())
    if total < rest:
        raise NotEnoughCapacity(_refusal(demand, hosts, f"room for {total} more"))
    open_hosts = [k for k in range(len(hosts)) if room[k] > 0]
    while rest:
        whole = [k for k in open_hosts if room[k] >= rest]
        if whole:
            best = min(whole, key=lambda k: (int(room[k]) - rest, fits[k], int(ids[k])))
            take = rest
        else:
            best = max(open_hosts, key=lambda k: (int(room[k]), -fits[k], -int(ids[k])))
            take = int(room[best])
        open_hosts.remove(best)
        placed[int(ids[best])] = placed.get(int(ids[best]), 0) + take
        rest -= take
    return placed


def _window(demand: InstanceDemand) -> str:
    return f"{demand.start.isoformat()} to {demand.end.isoformat()}"


def _refusal(demand: InstanceDemand, hosts: Sequence[HostRoom], room: str) -> str:
    rule = {True: "all on one host", False: "each on a distinct host", None: "anywhere"}
    return (
        f"Not enough hosts available: {demand.amount} instance(s) of {demand.size} requested "
        f"({rule[demand.affinity]}), {len(hosts)} host(s) match the properties and are not "
        f"reserved whole, {room} for the whole window {_window(demand)}"
    )
