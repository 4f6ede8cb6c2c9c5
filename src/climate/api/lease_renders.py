"""Leases as ``GET /v1/leases`` shows them, kept as JSON per revision of their rows (and queue
place): a listing renders again only the leases that changed since this process last showed
them (``LeaseService.list_revised``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from climate import wire
from climate.jsontext import encode
from climate.services.leases.listing import Shown

KEPT_BYTES = 32 * 1024 * 1024
"""What is kept, least recently shown dropped first (a page of a thousand leases is about
2.3 MB)."""


class Renders:
    """Each lease's JSON at one revision and queue place."""

    def __init__(self, limit: int = KEPT_BYTES) -> None:
        self.limit = limit
        self._kept: OrderedDict[str, tuple[int, int | None, bytes]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, lease_id: str, revision: int, place: int | None) -> bytes | None:
        # Without the lock: a listing asks once per lease (a thousand times a page), and two
        # listings at once queued on it. Each OrderedDict call is atomic under the GIL; the
        # entry read is a tuple, whole, and answers only for its revision and place.
        found = self._kept.get(lease_id)
        if found is None or found[0] != revision or found[1] != place:
            return None
        try:
            self._kept.move_to_end(lease_id)
        except KeyError:  # a put or a drop took it out meanwhile
            pass
        return found[2]

    def put(self, lease_id: str, revision: int, place: int | None, rendered: bytes) -> None:
        with self._lock:
            before = self._kept.pop(lease_id, None)
            if before is not None:
                self._size -= len(before[2])
            self._kept[lease_id] = (revision, place, rendered)
            self._size += len(rendered)
            while self._size > self.limit:
                _, dropped = self._kept.popitem(last=False)
                self._size -= len(dropped[2])

    @property
    def size(self) -> int:
        """Bytes kept."""
        return self._size

    def body(self, shown: Sequence[Shown[bytes]]) -> bytes:
        """``{"leases": [...]}`` of a page, keeping each lease rendered here."""
        pieces = [self.one(lease) for lease in shown]
        if not pieces:
            return b'{"leases":[]}'
        # One join of the whole: adding the brackets to it afterwards copied the megabytes of a
        # full page twice more, into fresh memory each time (2.4 ms against 0.08 for a page).
        pieces[0] = b'{"leases":[' + pieces[0]
        pieces[-1] += b"]}"
        return b",".join(pieces)

    def one(self, lease: Shown[bytes]) -> bytes:
        """The lease's JSON, kept if it was rendered here."""
        if lease.kept is not None:
            return lease.kept
        assert lease.lease is not None
        rendered = encode(wire.lease(lease.lease, lease.place))
        if lease.revision is not None:
            self.put(lease.id, lease.revision, lease.place, rendered)
        return rendered
