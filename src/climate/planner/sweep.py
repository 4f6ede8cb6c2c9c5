"""How much of a pool is held at the busiest instant of a window: one sweep, in array
operations (the quick refusal of re-optimisation, planner/repack.py)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def as_arrays(
    held: Sequence[tuple[dt.datetime, dt.datetime, int]],
) -> tuple[FloatArray, FloatArray, IntArray]:
    """(start, end, how many) triples as three arrays, times in seconds since the epoch."""
    starts = np.array([s.timestamp() for s, _, _ in held], dtype=np.float64)
    ends = np.array([e.timestamp() for _, e, _ in held], dtype=np.float64)
    return starts, ends, np.array([n for _, _, n in held], dtype=np.int64)


def most_held(
    starts: FloatArray, ends: FloatArray, counts: IntArray, begin: float, finish: float
) -> int:
    """The most held at once at any instant of [begin, finish), ``counts[i]`` being held over
    [starts[i], ends[i]): at one instant, releases count before takes."""
    inside = (starts < finish) & (ends > begin)
    if not inside.any():
        return 0
    counts = counts[inside]
    when = np.concatenate((np.maximum(starts[inside], begin), ends[inside]))
    delta = np.concatenate((counts, -counts))
    order = np.lexsort((delta, when))
    when, held = when[order], np.cumsum(delta[order])
    # What is held once every change of an instant is made, at the instants in the window.
    last = np.append(when[1:] != when[:-1], True) & (when < finish)
    return int(held[last].max(initial=0))
