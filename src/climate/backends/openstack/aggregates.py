"""Nova host aggregates as Blazar keeps them: the freepool of reservable hosts, and one
aggregate per reservation. A host always joins its new aggregate before it leaves the old one,
so a failure never leaves it outside every aggregate."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from typing import Any

GENERATION_ATTEMPTS = 8


class Aggregates:
    """The aggregates through an openstacksdk connection; ``freepool``: the freepool's name."""

    def __init__(self, conn: Any, freepool: str) -> None:
        self.compute = conn.compute
        self.freepool = freepool

    def find(self, name: str, *, create: bool = False, az: str | None = None) -> Any:
        """The aggregate called ``name``: None when missing, or made (in ``az``) with ``create``."""
        for aggregate in self.compute.aggregates():
            if aggregate.name == name:
                return aggregate
        if not create:
            return None
        from openstack.exceptions import HttpException

        try:
            return self.compute.create_aggregate(name=name, availability_zone=az)
        except HttpException:
            # Made meanwhile by a reservation started beside this one: a 409, or a 500 when
            # both got past Nova's check for the name before either inserted it.
            made = self.find(name)
            if made is None:
                raise
            return made

    def move_in(self, aggregate: Any, hosts: Iterable[str], *, leave_freepool: bool) -> None:
        """Each host into ``aggregate`` (first), then out of the freepool if it leaves it."""
        freepool = self.find(self.freepool, create=True)
        for host in hosts:
            if host not in (aggregate.hosts or []):
                aggregate = self.compute.add_host_to_aggregate(aggregate, host)
            if leave_freepool and host in (freepool.hosts or []):
                freepool = self.remove_host(freepool, host)

    def dissolve(self, name: str) -> None:
        """Hosts of aggregate ``name`` back into the freepool (first), then out of it; the
        aggregate deleted. Nothing to do when it is gone already."""
        aggregate = self.find(name)
        if aggregate is None:
            return
        freepool = self.find(self.freepool, create=True)
        for host in list(aggregate.hosts or []):
            if host not in (freepool.hosts or []):
                freepool = self.compute.add_host_to_aggregate(freepool, host)
            aggregate = self.remove_host(aggregate, host)
        self.compute.delete_aggregate(aggregate, ignore_missing=True)

    def drop(self, name: str) -> None:
        """Aggregate ``name`` emptied and deleted; its hosts stay where else they are."""
        aggregate = self.find(name)
        if aggregate is not None:
            for host in list(aggregate.hosts or []):
                aggregate = self.remove_host(aggregate, host)
            self.compute.delete_aggregate(aggregate, ignore_missing=True)

    def remove_host(self, aggregate: Any, host: str) -> Any:
        """``host`` out of ``aggregate``; the aggregate as Nova then has it. Nova first takes
        the compute's provider out of the mirrored Placement aggregate and answers 409 when
        another change moved that provider's generation meanwhile (two reservations of one
        compute ending side by side), leaving the host where it was: ask again after a short
        random pause. Other conflicts (servers that would change zone) are real refusals."""
        from openstack.exceptions import ConflictException

        attempt = 1
        while True:
            try:
                return self.compute.remove_host_from_aggregate(aggregate, host)
            except ConflictException as error:
                said = f"{error} {error.details or ''}".lower()
                if "generation" not in said or attempt == GENERATION_ATTEMPTS:
                    raise
            time.sleep(random.uniform(0, 0.05 * attempt))
            attempt += 1
