"""What every service needs, built once at the entry point."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, object_session

from climate.backends.base import Handover
from climate.config import Settings
from climate.db import leases as lease_rows
from climate.db.engine import AFTER_COMMIT, Database
from climate.db.tables import Host, Lease, Reservation
from climate.domain.actor import Actor
from climate.domain.clock import Clock
from climate.errors import InvalidInput
from climate.keystone import Trusts
from climate.policy import Policy, load_policy
from climate.resources.base import ResourceType, end_policy_of, start_policy_of
from climate.resources.capabilities import item_kinds

log = logging.getLogger(__name__)


def _nothing(_earliest: dt.datetime) -> None:
    return None


@dataclass
class ServiceContext:
    settings: Settings
    db: Database
    clock: Clock
    resource_types: dict[str, ResourceType]
    wake_manager: Callable[[dt.datetime], None] = field(default=_nothing)
    """Called after a commit that added or moved events, with the earliest of them (an
    in-process manager wakes at once if that is before what it is waiting for)."""
    trusts: Trusts | None = None
    """Keystone trusts from lessees (``auth = "keystone"`` with the ``openstack`` backend)."""
    policy: Policy = field(init=False)
    """The defaults with the operator's ``policy_file`` on top; a bad file fails here."""

    def __post_init__(self) -> None:
        inventories = [kind.rules for kind in item_kinds(self.resource_types).values()]
        self.policy = load_policy(self.settings.admin_role, self.settings.policy_file, inventories)
        for resource_type in self.resource_types.values():
            resource_type.configure(self.settings)
        unknown = [t for t in self.settings.idle_resource_types if t not in self.resource_types]
        if self.settings.idle_reclaim and unknown:
            raise InvalidInput(
                "idle_resource_types",
                f"no resource type {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(self.resource_types))}",
            )

    def handover(self, lease: Lease, reservation: Reservation, at: dt.datetime) -> Handover:
        """What the backend needs to hand ``reservation``'s resources over or take them back."""
        resource_type = self.resource_types[reservation.resource_type]
        resource_ids = tuple(resource_type.resource_ids(reservation))
        return Handover(
            lease_id=lease.id,
            reservation_id=reservation.id,
            project_id=lease.project_id,
            resource_type=reservation.resource_type,
            resource_ids=resource_ids,
            at=at,
            start_policy=start_policy_of(reservation.params),
            end_policy=end_policy_of(reservation.params),
            hosts=_host_names(reservation, resource_ids),
            params=dict(reservation.params),
            trust_id=lease.trust_id,
        )

    def delegate(self, actor: Actor, resource_types: Iterable[str | None]) -> str | None:
        """A trust from ``actor`` to the service user, made where a lease of these resource
        types has the backend act in the lessee's project (``ResourceType.acts_for_lessee``) and
        the actor came with a Keystone token; None otherwise. A trust Keystone refuses is
        logged and the lease goes on without one, as with no Keystone at all."""
        if self.trusts is None or actor.token is None:
            return None
        kinds = [self.resource_types.get(t or "") for t in resource_types]
        if not any(kind is not None and kind.acts_for_lessee for kind in kinds):
            return None
        try:
            return self.trusts.create(actor.token, actor.user_id, actor.project_id, actor.roles)
        except Exception:
            log.warning("no Keystone trust from user %s", actor.user_id, exc_info=True)
            return None

    def forget_trust(self, trust_id: str | None) -> None:
        """Drop a trust the lease no longer needs; a failure is logged, nothing more."""
        if self.trusts is None or trust_id is None:
            return
        try:
            self.trusts.delete(trust_id)
        except Exception:
            log.warning("Keystone trust %s not deleted", trust_id, exc_info=True)

    def events_changed(self, session: Session, earliest: dt.datetime) -> None:
        """Events now wait from ``earliest`` on: at commit, tell the managers of other processes
        (NOTIFY) and of this one. Other processes are told only of an event within
        ``max_wait_seconds``: no manager sleeps longer before reading the queue again, and on
        PostgreSQL every transaction that notifies commits one after the other."""
        horizon = self.clock.now() + dt.timedelta(seconds=self.settings.max_wait_seconds)
        if earliest <= horizon:
            lease_rows.signal_event_change(session, earliest)
        session.info.setdefault(AFTER_COMMIT, []).append(lambda: self.wake_manager(earliest))


HOST_BASED = frozenset({"physical:host", "virtual:instance"})
"""Resource types whose resource ids start with a host id (``"<host>"``, ``"<host>:<slot>"``)."""


def _host_names(reservation: Reservation, resource_ids: tuple[str, ...]) -> dict[str, str]:
    """Host id -> service host name of the hosts ``resource_ids`` lie on (the session's
    identity map serves hosts already loaded)."""
    session = object_session(reservation)
    if reservation.resource_type not in HOST_BASED or session is None:
        return {}
    names: dict[str, str] = {}
    for host_id in {r.partition(":")[0] for r in resource_ids}:
        host = session.get(Host, int(host_id))
        if host is not None:
            names[host_id] = host.service_name or host.hypervisor_hostname
    return names


@dataclass(frozen=True)
class Page:
    """Which slice of a list to return: at most ``limit`` items after the one with id
    ``marker``, in ``sort_key`` order (``sort_dir`` "asc" or "desc"), ties broken by id."""

    limit: int | None = None
    marker: str | None = None
    sort_key: str | None = None
    sort_dir: str = "asc"

    def size(self, cap: int) -> int:
        """The page size: ``limit`` clamped to ``cap`` (the ``max_page_size`` setting)."""
        return cap if self.limit is None else min(self.limit, cap)

    def blazar_size(self, cap: int) -> int | None:
        """The page size of a list Blazar has (leases, hosts, the other inventories): without
        ``limit`` every item (None), as Blazar lists them all and its client finds a name in
        that list (``blazar lease-show NAME``); else ``limit`` clamped to ``cap``."""
        return None if self.limit is None else min(self.limit, cap)

    def key(self, allowed: tuple[str, ...]) -> str:
        """The sort key, the first of ``allowed`` by default.

        :raises InvalidInput: a key not in ``allowed``.
        """
        if self.sort_key is None:
            return allowed[0]
        if self.sort_key not in allowed:
            raise InvalidInput("sort_key", f"must be one of {', '.join(allowed)}")
        return self.sort_key


FIRST_PAGE = Page()
"""The first page in the default order: a list Blazar has whole, another the first
``max_page_size`` items."""
