"""Late binding: move pending reservations among equivalent hosts to admit a new request.

A reservation is promised a window, a number of hosts and properties, not particular hosts. While
its lease is pending and has not started, the hosts it holds may be exchanged for other hosts that
match its properties and are free for its window: the owner keeps the same window and the same
count, and every host it gets matches. When ``choose_hosts`` refuses a request because too few
matching hosts are free, :func:`plan` looks for such exchanges that free enough hosts (rule in
docs/planning.md, "Re-optimisation of pending leases").

It reads the calendar through a :class:`World` (the service's in-memory calendar, or the
benchmark's), host by host, only where the search goes.

- **Quick refusal.** Most refusals are plain lack of capacity: at some instant of the window the
  candidate hosts are all taken by reservations that could not go elsewhere. A sweep over the
  window counts that, and when few reservations are involved a bipartite matching per instant
  checks it exactly (ignoring that a moved reservation needs one host for its whole window).
- **Moves straight to free hosts.** A one-host request first tries the hosts holding at most
  ``DIRECT`` units in its window, fewest first: it takes the host if each of those units can move
  to a host free over its own window. A solution moving one unit is always of this kind (the
  unit lands where it evicts nothing), so the first one found moves the fewest units of any
  solution when that is ``DIRECT`` or less. It costs one read of the counts, or for a ``closed``
  demand one pass of array operations over the calendar that names those hosts (``straight``),
  where the search below may examine hundreds of hosts before reaching one. When every
  reservable host is a candidate (``closed``) and there are more than ``WIDE``, a request the
  direct step cannot place is refused there: the search examines few of so many hosts per unit,
  and in ``bench --scenario create`` it placed none of the 102 requests the direct step left,
  even given its whole ``BUDGET`` (about 50 ms each), while each one cost about 5 ms.
- **Search.** Every unit (one host of one reservation) that needs a host is *homeless*: at first
  the new request's ``count`` units. A homeless unit may take a host that matches its reservation,
  that the reservation does not already hold, and whose allocations overlapping its window all
  belong to movable units not placed by the search: those are evicted and become homeless in
  turn. A unit placed by the search is pinned and never evicted again, so moves never cycle.
  Units of one reservation are placed together (a set of hosts, not an order); the reservation
  with the fewest spare choices goes first, hosts costing fewer evictions first. Iterative
  deepening on the number of units moved finds a solution with few moves.
- **Completeness.** Every valid reassignment can be reached by evicting exactly the units it
  moves, so the search finds one whenever one exists (tests/test_repack.py checks this against a
  brute force), except for what it deliberately leaves out: more than ``max_moves`` units moved,
  more than ``budget`` steps (hosts examined), and, where a unit may go to more than ``WIDE``
  hosts, the hosts beyond the first that give ``need + SPARE`` usable choices, in order of fewest
  allocations in the window, and a closed one-host request over more than ``WIDE`` candidates
  that the direct step cannot place. Then the request is refused as it would have been without
  re-optimisation.
"""

from __future__ import annotations

import datetime as dt
import time
from bisect import insort
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from climate.planner.matching import can_match
from climate.planner.sweep import as_arrays, most_held

MAX_MOVES = 12
"""Units (one host of one reservation) that one admission may move."""
BUDGET = 4_000
"""Search steps (one host examined for one unit) over all the deepening rounds."""
WIDE = 64
"""A unit with more hosts than this to choose from examines them lazily (see the module doc)."""
SPARE = 4
"""How many usable hosts beyond the ones needed a lazy examination looks for."""
COUNT_LIMIT = 1000
"""Above this many reservations on the candidates in the window, no quick refusal (but by
counting idle hosts, for a request without filter)."""
MATCH_LIMIT = 200
"""Above this many, the quick refusal only counts."""
BATCH = 32
"""Hosts examined between two reads of the reservations found on them."""
LEARN = 128
"""Reservations read at once."""
UNTIMED = 256
"""Steps never cut by the deadline: a small search answers the same however busy the machine."""
DIRECT = 2
"""A one-host request first tries the hosts holding at most this many units in its window, each
unit moved straight to a host free over its own window (see the module doc)."""

Occupant = tuple[dt.datetime, dt.datetime, str]
"""An allocation of a host: start, end, reservation id."""
Taken = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int64]]
"""The allocations of the candidates that overlap the window (``Calendar.taken``): starts and
ends (seconds since the epoch), and their reservations as codes, equal for one reservation."""

Straight = Callable[[int], Sequence[int]]
"""For a ``closed`` demand: the candidates holding at most that many allocations in its window,
each of which some candidate is free for over its own window, fewest allocations first (then by
id): the only hosts where moving units straight to free hosts can make room (``direct``)."""

_DEMAND = "\x00demand"  # the new request among the search's reservations


@dataclass(frozen=True)
class Holder:
    """A reservation as the search sees it."""

    id: str
    lease_id: str
    start: dt.datetime
    end: dt.datetime
    hosts: frozenset[int]
    eligible: frozenset[int]
    """Reservable hosts matching its properties now: where its units may be moved to."""
    pending: bool
    """Its lease and itself are PENDING (and not the lease being admitted)."""
    uniform: bool = True
    """All its allocations have the same window (not so once cut short): else it is fixed."""

    def movable(self, now: dt.datetime) -> bool:
        return self.pending and self.uniform and self.start > now and bool(self.eligible)


class World(Protocol):
    def occupants(self, host: int, start: dt.datetime, end: dt.datetime) -> Sequence[Occupant]:
        """The allocations of ``host`` overlapping [start, end) (but the request's own)."""
        ...

    def holders(self, ids: Collection[str]) -> Mapping[str, Holder]:
        """What is known of these reservations; one missing is taken as fixed."""
        ...

    def counts(
        self, hosts: Collection[int], start: dt.datetime, end: dt.datetime
    ) -> Mapping[int, int]:
        """How many allocations each host has overlapping [start, end), in one read: the
        order in which a wide choice is examined, nothing the search relies on."""
        ...


@dataclass(frozen=True)
class RepackDemand:
    """``count`` hosts among ``candidates`` free over [start, end), ``required`` among them."""

    start: dt.datetime
    end: dt.datetime
    count: int
    candidates: frozenset[int]
    required: frozenset[int] = field(default_factory=frozenset)
    closed: bool = False
    """The candidates are every reservable host: no unit in the window can go elsewhere."""


@dataclass(frozen=True)
class Move:
    """``reservation_id`` gives up ``removed``, keeps ``kept`` and takes ``added``, same window."""

    reservation_id: str
    lease_id: str
    start: dt.datetime
    end: dt.datetime
    removed: frozenset[int]
    added: frozenset[int]
    kept: frozenset[int]


@dataclass(frozen=True)
class Repack:
    moves: tuple[Move, ...]
    hosts: frozenset[int]
    """Candidates free for the demand once the moves are made (``count`` of them)."""
    steps: int
    """Search steps spent."""


class _OutOfBudget(Exception):
    """The search spent its steps or its time."""


def plan(
    demand: RepackDemand,
    now: dt.datetime,
    world: World,
    *,
    max_moves: int = MAX_MOVES,
    budget: int = BUDGET,
    busy: Taken | None = None,
    straight: Straight | None = None,
    deadline: float | None = None,
) -> Repack | None:
    """Moves of pending, not started reservations that free ``demand.count`` candidates, or
    None if there are none within the bounds.

    :param busy: if the caller has them (``Calendar.taken``), the allocations of the
        candidates overlapping the window: spares reading them host by host for the quick
        refusal.
    :param straight: if the caller has it, for a ``closed`` demand: spares reading the hosts
        and reservations where units could not move straight to free hosts anyway.
    :param deadline: a ``time.monotonic()`` after which a search past ``UNTIMED`` steps gives
        up, as when it runs out of ``budget`` (None: the budget alone bounds it, and the answer
        depends on nothing but the calendar).
    """
    if len(demand.candidates) < demand.count or not demand.required <= demand.candidates:
        return None
    if demand.count < len(demand.required):
        return None
    search = _Search(demand, now, world, budget, busy, deadline)
    search.straight = straight if demand.closed else None
    try:
        if not search.instants_fit():
            return None
        if demand.count == 1:
            if search.direct():
                return search.result()
            if demand.closed and len(demand.candidates) > WIDE:
                return None  # the search rarely finds more here (module doc)
        floor = search.fewest_evictions(max_moves)
        for limit in (m for m in _deepening(max_moves) if m >= floor):
            search.reset()
            if search.solve(limit):
                return search.result()
    except _OutOfBudget:
        return None
    return None


def _deepening(max_moves: int) -> list[int]:
    limits = [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    return [m for m in limits if m < max_moves] + [max_moves]


_Option = tuple[int, int, list[Occupant]]  # (units evicted, host, evicted)


class _Search:
    def __init__(
        self,
        demand: RepackDemand,
        now: dt.datetime,
        world: World,
        budget: int,
        busy: Taken | None = None,
        deadline: float | None = None,
    ) -> None:
        self.demand = demand
        self.busy = busy
        self.straight: Straight | None = None
        self.deadline = deadline
        self.now = now
        self.world = world
        self.budget = budget
        self.steps = 0
        self.seen: dict[tuple[int, dt.datetime, dt.datetime], Sequence[Occupant]] = {}
        self.info: dict[str, Holder] = {}
        self.order: dict[str, list[int]] = {}
        self.movable: dict[str, bool] = {}
        # The demand: one pseudo-reservation per required host, one for the rest.
        self.demand_ids: list[str] = []
        self.demand_need: dict[str, int] = {}
        for host in sorted(demand.required):
            self._pseudo(f"{_DEMAND}:{host}", frozenset({host}), 1)
        rest = demand.count - len(demand.required)
        if rest > 0:
            self._pseudo(_DEMAND, demand.candidates - demand.required, rest)
        self.reset()

    def _pseudo(self, key: str, eligible: frozenset[int], need: int) -> None:
        d = self.demand
        self.info[key] = Holder(key, key, d.start, d.end, frozenset(), eligible, pending=False)
        self.movable[key] = False
        self.demand_ids.append(key)
        self.demand_need[key] = need

    def reset(self) -> None:
        self.removed: set[tuple[str, int]] = set()
        self.added: dict[int, list[Occupant]] = {}
        self.hosts_of: dict[str, set[int]] = {}
        self.pinned: set[tuple[str, int]] = set()
        self.homeless: dict[str, int] = dict(self.demand_need)

    # -- reading the world -------------------------------------------------------------------

    def _base(self, host: int, start: dt.datetime, end: dt.datetime) -> Sequence[Occupant]:
        key = (host, start, end)
        found = self.seen.get(key)
        if found is None:
            self.spend(1)
            found = self.seen[key] = self.world.occupants(host, start, end)
        return found

    def _counts(
        self, hosts: Collection[int], start: dt.datetime, end: dt.datetime
    ) -> Mapping[int, int]:
        """How many allocations each host has in the window, as the calendar stands: one
        read, spent as a batch of hosts examined."""
        self.spend(-(-len(hosts) // BATCH))
        return self.world.counts(hosts, start, end)

    def spend(self, steps: int) -> None:
        self.steps += steps
        if self.steps > self.budget:
            raise _OutOfBudget
        if self.deadline is not None and self.steps > UNTIMED and time.monotonic() > self.deadline:
            raise _OutOfBudget

    def occupants(self, host: int, start: dt.datetime, end: dt.datetime) -> list[Occupant]:
        """As the world has it, with the search's moves so far."""
        found = [o for o in self._base(host, start, end) if (o[2], host) not in self.removed]
        found.extend(o for o in self.added.get(host, ()) if o[0] < end and start < o[1])
        return found

    def learn(self, ids: Collection[str]) -> None:
        unknown = [i for i in ids if i not in self.info]
        if not unknown:
            return
        known: dict[str, Holder] = {}
        for i in range(0, len(unknown), LEARN):
            self.spend(0)  # reading many reservations takes a while: mind the deadline
            known.update(self.world.holders(unknown[i : i + LEARN]))
        for rid in unknown:
            holder = known.get(rid)
            if holder is None:  # unknown to the world: fixed where it is
                holder = Holder(rid, rid, self.now, self.now, frozenset(), frozenset(), False)
            self.info[rid] = holder
            self.movable[rid] = holder.movable(self.now)

    def current(self, rid: str) -> set[int]:
        hosts = self.hosts_of.get(rid)
        if hosts is None:
            hosts = self.hosts_of[rid] = set(self.info[rid].hosts)
        return hosts

    # -- the quick refusal -------------------------------------------------------------------

    def instants_fit(self) -> bool:
        """A necessary condition at each instant of the window (see the module doc)."""
        d = self.demand
        if d.closed:
            # Whatever is on a candidate can only be on a candidate: count the idle ones.
            if self.busy is None:
                spans = [o for h in d.candidates for o in self._base(h, d.start, d.end)]
                starts, ends, _ = as_arrays([(s, e, 1) for s, e, _ in spans])
            else:
                starts, ends, _ = self.busy
            if not _room_everywhere(starts, ends, np.ones(len(starts), dtype=np.int64), d):
                return False
        # Closed, the count below is the one above (every movable reservation is forced onto
        # the candidates): reading them all would only feed the matching.
        if self.busy is not None:  # counted without reading every candidate
            held_by = len(np.unique(self.busy[2]))
            if held_by > COUNT_LIMIT or (d.closed and held_by > MATCH_LIMIT):
                return True
        on = {h: self._base(h, d.start, d.end) for h in sorted(d.candidates)}
        owners = {o[2] for occupants in on.values() for o in occupants}
        if len(owners) > COUNT_LIMIT or (d.closed and len(owners) > MATCH_LIMIT):
            return True
        self.learn(owners)
        taken: list[tuple[dt.datetime, dt.datetime, int]] = []
        forced: set[str] = set()
        for occupants in on.values():
            for s, e, rid in occupants:
                holder = self.info[rid]
                if not self.movable[rid]:
                    taken.append((s, e, 1))
                elif holder.eligible | holder.hosts <= d.candidates and rid not in forced:
                    forced.add(rid)
                    taken.append((holder.start, holder.end, len(holder.hosts)))
        if not _room_everywhere(*as_arrays(taken), d):
            return False
        if len(owners) > MATCH_LIMIT:
            return True
        instants = {d.start} | {s for occupants in on.values() for s, _, _ in occupants}
        mine = [(self.demand_need[k], self.info[k].eligible) for k in self.demand_ids]
        options: dict[str, tuple[int, frozenset[int]]] = {}
        checked: set[tuple[frozenset[str], frozenset[int]]] = set()
        for t in sorted(i for i in instants if d.start <= i < d.end):
            busy: set[int] = set()
            wants: set[str] = set()
            for host, occupants in on.items():
                for s, e, rid in occupants:
                    if s <= t < e:
                        if self.movable[rid]:
                            wants.add(rid)
                        else:
                            busy.add(host)
            seen = (frozenset(wants), frozenset(busy))
            if seen in checked:  # the same reservations as at an earlier instant
                continue
            checked.add(seen)
            for rid in wants - options.keys():
                h = self.info[rid]
                options[rid] = (len(h.hosts), h.eligible | h.hosts)
            if not can_match([*(options[rid] for rid in wants), *mine], busy):
                return False
        return True

    # -- moves straight to free hosts ---------------------------------------------------------

    def direct(self) -> bool:
        """The demand's one unit on a host whose units in the window (at most ``DIRECT``) each
        move to a host free over their own window: hosts fewest units first, so the first found
        moves the fewest units of any solution when that is ``DIRECT`` or less (module doc)."""
        (key,) = self.demand_ids
        r = self.info[key]
        if self.straight is not None:
            # Closed: a unit can only go to a candidate, so one no candidate is free for cannot
            # move straight, and its host need not be examined.
            self.spend(-(-len(r.eligible) // BATCH))
            hosts = [h for h in self.straight(DIRECT) if h in r.eligible]
        else:
            counts = self._counts(r.eligible, r.start, r.end)
            hosts = sorted(
                (h for h in r.eligible if counts.get(h, 0) <= DIRECT),
                key=lambda h: (counts.get(h, 0), h),
            )
        for i in range(0, len(hosts), BATCH):
            batch = hosts[i : i + BATCH]
            self.spend(len(batch))
            on = {h: self.occupants(h, r.start, r.end) for h in batch}
            self.learn({o[2] for occupants in on.values() for o in occupants})
            for host, evicted in on.items():
                if len(evicted) > DIRECT or not all(self.movable[o[2]] for o in evicted):
                    continue
                self.apply(key, [(len(evicted), host, evicted)])
                if all(self._rehouse(rid) for rid in list(self.homeless)):
                    return True
                self.reset()
        return False

    def _rehouse(self, rid: str) -> bool:
        """Move the evicted unit of ``rid`` to a host free over its window, if there is one."""
        r = self.info[rid]
        held = self.current(rid)
        counts = self._counts(r.eligible - held, r.start, r.end)
        for host in sorted(h for h in r.eligible - held if not counts.get(h, 0)):
            if not self.occupants(host, r.start, r.end):
                self.apply(rid, [(0, host, [])])
                return True
        return False

    # -- the search ----------------------------------------------------------------------------

    def fewest_evictions(self, max_moves: int) -> int:
        """A lower bound on the units any solution moves: each unit of the demand evicts at least
        what its cheapest hosts hold (for a wide choice, what the first hosts found hold)."""
        floor = 0
        for rid, need in self.demand_need.items():
            costs = sorted(o[0] for o in self.options(rid, need))
            floor += sum(costs[:need]) if len(costs) >= need else max_moves + 1
        return floor

    def options(self, rid: str, need: int) -> list[_Option]:
        """Where units of ``rid`` could go, with the units each host would evict."""
        r = self.info[rid]
        held = self.current(rid)
        wide = len(r.eligible) > WIDE
        if wide:
            order = self.order.get(rid)
            if order is None:
                # Fewest allocations in the window first (as the calendar stands: the moves made
                # by the search change this little).
                counts = self._counts(r.eligible, r.start, r.end)
                order = sorted(r.eligible, key=lambda h: (counts.get(h, 0), h))
                self.order[rid] = order
            hosts = [h for h in order if h not in held]
        else:
            hosts = sorted(r.eligible - held)
        found: list[_Option] = []
        for i in range(0, len(hosts), BATCH if wide else max(1, len(hosts))):
            batch = hosts[i : i + BATCH] if wide else hosts
            self.spend(len(batch))
            on = {h: self.occupants(h, r.start, r.end) for h in batch}
            self.learn({o[2] for occupants in on.values() for o in occupants})
            for host in batch:
                evicted = on[host]
                if all(self.movable[o[2]] and (o[2], host) not in self.pinned for o in evicted):
                    found.append((len(evicted), host, evicted))
            if wide and len(found) >= need + SPARE:
                break
        found.sort(key=lambda o: (o[0], o[1]))
        return found

    def solve(self, moves_left: int) -> bool:
        if not self.homeless:
            return True
        # The reservation with the fewest spare choices first.
        best: tuple[int, str, list[_Option]] | None = None
        for rid, need in self.homeless.items():
            opts = [o for o in self.options(rid, need) if o[0] <= moves_left]
            slack = len(opts) - need
            if slack < 0:
                return False
            if best is None or slack < best[0]:
                best = (slack, rid, opts)
        assert best is not None
        _, rid, opts = best
        for combo in _cheap_combinations(opts, self.homeless[rid], moves_left):
            trail = self.apply(rid, combo)
            if self.solve(moves_left - sum(o[0] for o in combo)):
                return True
            self.undo(rid, combo, trail)
        return False

    def apply(self, rid: str, combo: Sequence[_Option]) -> list[tuple[int, str]]:
        r = self.info[rid]
        trail: list[tuple[int, str]] = []
        for _, host, evicted in combo:
            for _, _, other in evicted:
                self.removed.add((other, host))
                self.current(other).discard(host)
                self.homeless[other] = self.homeless.get(other, 0) + 1
                trail.append((host, other))
            insort(self.added.setdefault(host, []), (r.start, r.end, rid))
            self.current(rid).add(host)
            self.pinned.add((rid, host))
        self.homeless[rid] -= len(combo)
        if not self.homeless[rid]:
            del self.homeless[rid]
        return trail

    def undo(self, rid: str, combo: Sequence[_Option], trail: list[tuple[int, str]]) -> None:
        r = self.info[rid]
        self.homeless[rid] = self.homeless.get(rid, 0) + len(combo)
        for _, host, _ in combo:
            self.added[host].remove((r.start, r.end, rid))
            self.current(rid).discard(host)
            self.pinned.discard((rid, host))
        for host, other in trail:
            self.removed.discard((other, host))
            self.current(other).add(host)
            self.homeless[other] -= 1
            if not self.homeless[other]:
                del self.homeless[other]

    def result(self) -> Repack:
        moves = []
        for rid, hosts in sorted(self.hosts_of.items()):
            if rid in self.demand_need:
                continue
            holder = self.info[rid]
            if hosts != holder.hosts:
                moves.append(
                    Move(
                        reservation_id=rid,
                        lease_id=holder.lease_id,
                        start=holder.start,
                        end=holder.end,
                        removed=holder.hosts - hosts,
                        added=frozenset(hosts - holder.hosts),
                        kept=holder.hosts & hosts,
                    )
                )
        mine = frozenset(h for k in self.demand_ids for h in self.current(k))
        return Repack(moves=tuple(moves), hosts=mine, steps=self.steps)


def _cheap_combinations(
    options: Sequence[_Option], k: int, allowance: int
) -> Iterator[list[_Option]]:
    """``k``-subsets of ``options`` (sorted by cost) whose total cost fits ``allowance``."""
    chosen: list[_Option] = []

    def walk(i: int, left: int) -> Iterator[list[_Option]]:
        if len(chosen) == k:
            yield list(chosen)
            return
        for j in range(i, len(options) - (k - len(chosen)) + 1):
            cost = options[j][0]
            # Sorted by cost: the cheapest completion from j on costs at least this.
            if cost * (k - len(chosen)) > left:
                return
            chosen.append(options[j])
            yield from walk(j + 1, left - cost)
            chosen.pop()

    return walk(0, allowance)


def _room_everywhere(
    starts: npt.NDArray[np.float64],
    ends: npt.NDArray[np.float64],
    counts: npt.NDArray[np.int64],
    demand: RepackDemand,
) -> bool:
    """With ``counts`` candidates out of play over [starts, ends), are ``demand.count`` left
    at every instant of the window?"""
    held = most_held(starts, ends, counts, demand.start.timestamp(), demand.end.timestamp())
    return len(demand.candidates) - held >= demand.count
