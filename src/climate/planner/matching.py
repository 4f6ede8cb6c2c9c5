"""Bipartite matching for late binding (``planner/repack.py``): can several demands each get
their count of distinct hosts from their own sets?"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def can_match(
    wants: Sequence[tuple[int, frozenset[int]]], busy: Collection[int] = frozenset()
) -> bool:
    """Can each want (k, hosts) get k distinct hosts of its set but ``busy``, no host given
    twice? Augmenting paths over units (Ford-Fulkerson with unit capacities), after leaving out
    the wants that any assignment of the others leaves enough hosts (``_served_last``)."""
    short = (len(o) - len(busy) < k and len(o.difference(busy)) < k for k, o in wants)
    if any(short):
        return False
    left = sorted(_served_last(wants, len(busy)), key=lambda want: len(want[1]))
    owner: dict[int, int] = {}  # host -> index of the want holding it
    held: list[set[int]] = [set() for _ in left]

    def augment(i: int, seen: set[int]) -> bool:
        options = left[i][1]
        # A host nobody holds ends the path at once: try those before rerouting anyone.
        for host in options:
            if host not in owner and host not in busy and host not in seen:
                seen.add(host)
                owner[host] = i
                held[i].add(host)
                return True
        for host in options:
            if host in seen or host in held[i] or host in busy:
                continue
            seen.add(host)
            if reroute(owner[host], host, seen):
                owner[host] = i
                held[i].add(host)
                return True
        return False

    def reroute(j: int, host: int, seen: set[int]) -> bool:
        """Want j gives up ``host`` for another one."""
        held[j].discard(host)
        if augment(j, seen):
            return True
        held[j].add(host)
        return False

    units = [i for i, (k, _) in enumerate(left) for _ in range(k)]
    return all(augment(i, set()) for i in units)


def _served_last(
    wants: Sequence[tuple[int, frozenset[int]]], busy: int
) -> list[tuple[int, frozenset[int]]]:
    """The wants but those with at least as many usable hosts as all the rest's units and their
    own: whatever hosts the others get, enough of its own are left (Hall's condition holds for
    it), so it can be served last. Dropping one lowers the units, so repeat until none goes.
    ``busy`` hosts are counted as if each were among a want's own (a lower bound)."""
    left = list(wants)
    while left:
        units = sum(k for k, _ in left)
        kept = [want for want in left if len(want[1]) - busy < units]
        if len(kept) == len(left):
            break
        left = kept
    return left
