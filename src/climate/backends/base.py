"""The backend interface: typed actions in, typed results out, one method.

In the spirit of httpx's transport (``handle_request``): the manager and the services describe
what must happen in the world as ``Action`` values and hand a batch of them to
``Backend.handle``, which returns one ``Result`` per action. The backend never sees the
database: the caller writes what the results say (db/assignments.py for who holds what,
reservation params for what the backend made, such as a server group).
"""

from __future__ import annotations

import abc
import datetime as dt
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from climate.config import Settings
from climate.domain.status import EndPolicy, StartPolicy


@dataclass(frozen=True)
class Handover:
    """What a backend needs to hand one reservation's resources to a project, or take them
    back."""

    lease_id: str
    reservation_id: str
    project_id: str
    resource_type: str
    resource_ids: tuple[str, ...]
    at: dt.datetime
    start_policy: StartPolicy = StartPolicy.AUTO
    """The reservation's, as it is when the handover is made (docs/policies.md)."""
    end_policy: EndPolicy = EndPolicy.RELEASE
    hosts: Mapping[str, str] = field(default_factory=dict)
    """Host id -> host name (Nova's service host), for every host the resources lie on."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """The reservation's parameters (an instance reservation's size, affinity, ...)."""
    trust_id: str | None = None
    """The Keystone trust the lessee gave the service user when the lease was made (as in
    Blazar), through which the backend may act in the lessee's project; None: none was made."""


# -- actions -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """Hand a lease's reservations to its project at the lease's start. ``start_policy``
    ``auto``: the workload may run at once; ``manual``: only access is granted, the resources
    are held until ``StartManual``."""

    handovers: tuple[Handover, ...]


@dataclass(frozen=True)
class BeforeEnd:
    """Run each reservation's ``before_end`` action (``default`` does nothing)."""

    steps: tuple[tuple[Handover, str], ...]


@dataclass(frozen=True)
class End:
    """Take a lease's reservations back; each one's ``end_policy`` says what happens to the
    workload still on its resources: ``release`` the least needed to free them, ``delete``,
    ``suspend`` (shelve), ``snapshot`` then delete, ``keep-until-ack`` (kept stopped until
    ``Acknowledge``). The resources go back to the pool whatever the policy."""

    handovers: tuple[Handover, ...]


@dataclass(frozen=True)
class StartManual:
    """Start the workload of a manual reservation, held since its start."""

    handover: Handover


@dataclass(frozen=True)
class Acknowledge:
    """Discard what a keep-until-ack reservation's end kept."""

    handover: Handover


@dataclass(frozen=True)
class Migration:
    """Instances of a reservation moved from one host to another, from ``at`` on (a best-effort
    lease reclaims ``from_host``)."""

    lease_id: str
    reservation_id: str
    project_id: str
    resource_type: str
    from_host: int
    to_host: int
    count: int
    at: dt.datetime
    from_name: str = ""
    to_name: str = ""
    """The hosts' names (Nova's service hosts)."""


@dataclass(frozen=True)
class Migrate:
    """Move running workloads off a host a best-effort lease reclaims. A move of a reservation
    that has not started has nothing to move in the world."""

    moves: tuple[Migration, ...]


@dataclass(frozen=True)
class Enrol:
    """Look a resource up in the world before it is registered (``blazar host-create NAME``):
    the result is an ``Inspected`` with what the world knows of it, ``UnknownResource``, or
    with ``vacant``, ``ResourceInUse`` when something runs on it already (as Blazar refuses a
    host with servers: they would run on a reservable host, under another project's lease)."""

    resource_type: str
    name: str
    vacant: bool = False


@dataclass(frozen=True)
class Withdraw:
    """A registered resource deleted from Climate (``blazar host-delete``): the world stops
    offering it for reservations (a host leaves the freepool). A no-op when it is gone. With
    ``vacant``, ``ResourceInUse`` (nothing changed) when something runs on it (as Blazar
    refuses to delete a host with servers)."""

    resource_type: str
    name: str
    vacant: bool = False


@dataclass(frozen=True)
class Replace:
    """A running reservation's host failed (down, forced down or disabled): take ``old_host``
    from the project and hand it ``new_host`` in its place (for openstack: out of and into the
    reservation's aggregate). ``old_host`` None: a host is added to a reservation that lacked
    one; ``new_host`` None: no spare was free, the reservation goes on without it. Ids as in
    ``handover.resource_ids``, which lists the hosts the reservation holds after the change;
    ``handover.hosts`` names them and both hosts given here."""

    handover: Handover
    old_host: str | None
    new_host: str | None


@dataclass(frozen=True)
class PowerOff:
    """The power policy found a host with nothing allocated for a while: stop offering it and
    power it down where the world can (openstack: its nova-compute service disabled with
    ``reason``). Ids and names as in ``Handover.hosts``."""

    host_id: str
    name: str
    reason: str


@dataclass(frozen=True)
class PowerOn:
    """Wake a host ``PowerOff`` powered down, ahead of its next lease: a failure is a failed
    host (services/power.py marks it down, healing moves its reservations)."""

    host_id: str
    name: str


@dataclass(frozen=True)
class InspectUsage:
    """Is anything using these running reservations (idle reclamation, docs/idle.md)? The
    answer is a ``Usage``. Read-only: nothing changes in the world."""

    handovers: tuple[Handover, ...]


Action = (
    Start
    | BeforeEnd
    | End
    | StartManual
    | Acknowledge
    | Migrate
    | Enrol
    | Withdraw
    | Replace
    | PowerOff
    | PowerOn
    | InspectUsage
)

ACTION_NAMES: dict[type[Action], str] = {
    Start: "start",
    BeforeEnd: "before_end",
    End: "end",
    StartManual: "start_manual",
    Acknowledge: "acknowledge",
    Migrate: "migrate",
    Enrol: "enrol",
    Withdraw: "withdraw",
    Replace: "replace",
    PowerOff: "power_off",
    PowerOn: "power_on",
    InspectUsage: "inspect_usage",
}


# -- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    """The action succeeded. ``params``: per reservation id, parameters the caller records on
    the reservation (what the backend made for it, such as ``server_group_id``)."""

    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Inspected:
    """What the world knows of an enrolled resource: inventory fields (``vcpus``,
    ``memory_mb``, ``local_gb``, ``service_name``, ...) and extra properties (traits)."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Usage:
    """The answer to ``InspectUsage``, per reservation id: True when something uses its
    resources now (openstack: an ACTIVE server on its hosts or of its flavor), False when
    nothing does, None when the backend cannot tell (standalone: the consumer's heartbeats,
    ``POST /v1/leases/{id}/heartbeat``, are the only sign of use)."""

    in_use: Mapping[str, bool | None] = field(default_factory=dict)


Result = Done | Inspected | Usage | BaseException
"""Per action: what it did, or the exception that made it fail (nothing of it stays done)."""

Outcome = BaseException | None
"""Per event of a manager batch: None when it succeeded, else why it failed."""


@dataclass(frozen=True)
class HostState:
    """How the world sees a host's compute service: ``up`` False when it is down, forced
    down or disabled, with ``reason`` saying which."""

    up: bool
    reason: str | None = None


class UnknownResource(LookupError):
    """``Enrol`` of a resource the world does not know (the API answers 404)."""


class ResourceInUse(RuntimeError):
    """``Enrol`` or ``Withdraw`` (``vacant=True``) of a resource something runs on (the API
    answers 409)."""


class BackendTimeout(TimeoutError):
    """A backend call did not return within ``backend_timeout_seconds``; it was abandoned."""


class Backend(abc.ABC):
    """Side effects in the world when reservations start, near their end, and end.

    ``handle`` gets a batch of actions (the manager's events due together, one action per
    event; or one action from the API) and returns one result per action, in order. It may
    raise, failing the whole batch: the manager then calls again with one action at a time.

    Every action must be idempotent: after a crash, a failed attempt or a timeout the caller
    sends the same action again, and the second run must not hand out resources twice nor fail
    because the first one did part of the work. A failed action must leave nothing behind
    half-done (a host outside every pool, a leaked flavor). The caller runs ``handle`` in a
    worker thread and gives up on it after ``backend_timeout_seconds``; an abandoned call may
    still be running, and may still succeed, when the retry runs: idempotence covers that too.
    """

    name: str = "base"
    can_migrate: bool = False
    """Whether ``Migrate`` moves running workloads: best-effort leases reclaim hosts
    (docs/lease-types.md) only through a backend that can."""

    watches_hosts: bool = False
    """Whether ``host_states`` reports the world's view of host health: the manager then runs
    a host monitor (manager/monitor.py) that marks hosts down and up as the world says."""

    def host_states(self) -> Mapping[str, HostState]:
        """Host (service) name -> its state, for every host the world knows; only called when
        ``watches_hosts``."""
        raise NotImplementedError(f"backend {self.name} does not watch hosts")

    def on_host_change(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``wake`` whenever the world says a host's state may have changed (openstack:
        Nova's ``service.update`` notifications), from a thread of the backend's own. Returns
        how to stop listening, or None when the backend hears nothing (the monitor then only
        polls)."""
        return None

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        """The backend as the entry point builds it; one with settings of its own reads them
        and names any that is missing or wrong (``InvalidInput``)."""
        return cls()

    @abc.abstractmethod
    def handle(self, actions: Sequence[Action]) -> list[Result]:
        """Do each action in the world; one result per action."""


class Timeboxed:
    """A backend as its callers use it: each batch in a worker thread, given up after
    ``timeout`` seconds (every action of it then fails with ``BackendTimeout``)."""

    def __init__(self, inner: Backend, timeout: float) -> None:
        self.inner = inner
        self.timeout = timeout
        self.name = inner.name
        self.can_migrate = inner.can_migrate

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        """The results of ``actions``; raises what the backend raised for the whole batch.
        The worker thread keeps only its own result box: once abandoned, it reaches nothing."""
        if not actions:
            return []
        what = ACTION_NAMES[type(actions[0])]
        box: list[list[Result] | BaseException] = []
        finished = threading.Event()

        def run() -> None:
            try:
                box.append(self.inner.handle(actions))
            except BaseException as exc:  # handed to the caller, which raises it
                box.append(exc)
            finally:
                finished.set()

        worker = threading.Thread(target=run, name=f"climate-backend-{what}", daemon=True)
        worker.start()
        if not finished.wait(self.timeout):
            timeout = BackendTimeout(f"backend {what} timed out after {self.timeout:g} s")
            return [timeout] * len(actions)
        result = box[0]
        if isinstance(result, BaseException):
            raise result
        if len(result) != len(actions):
            raise RuntimeError(
                f"backend {self.name} returned {len(result)} results for {len(actions)} actions"
            )
        return list(result)

    def one(self, action: Action) -> Done | Inspected | Usage:
        """The result of one action; raises its failure."""
        (result,) = self.handle([action])
        if isinstance(result, BaseException):
            raise result
        return result
