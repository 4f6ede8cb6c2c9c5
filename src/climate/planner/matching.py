"""Bipartite matching for late binding (``planner/repack.py``): can several demands each get
their count of distinct hosts from their own sets?"""

from __future__ import annotations

from collections.abc import Sequence


def can_match(wants: Sequence[tuple[int, frozenset[int]]]) -> bool:
    """Can each want (k, hosts) get k distinct hosts of its set, no host given twice?
    Augmenting paths over units (Ford-Fulkerson with unit capacities)."""
    if any(len(options) < k for k, options in wants):
        return False
    owner: dict[int, int] = {}  # host -> index of the want holding it
    held: list[set[int]] = [set() for _ in wants]

    def augment(i: int, seen: set[int]) -> bool:
        for host in wants[i][1]:
            if host in seen or host in held[i]:
                continue
            seen.add(host)
            j = owner.get(host)
            if j is None or reroute(j, host, seen):
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

    units = [i for i, (k, _) in enumerate(wants) for _ in range(k)]
    return all(augment(i, set()) for i in units)
