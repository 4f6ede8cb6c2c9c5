"""The backend interface: one small class, called by the manager inside the event's transaction."""

from __future__ import annotations

import abc
import datetime as dt
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Self, TypeVar

from sqlalchemy.orm import Session

from climate.config import Settings
from climate.domain.status import EndPolicy, StartPolicy


@dataclass(frozen=True)
class Handover:
    """What a backend needs to hand resources to a project, or take them back."""

    lease_id: str
    reservation_id: str
    project_id: str
    resource_type: str
    resource_ids: tuple[str, ...]
    at: dt.datetime
    start_policy: StartPolicy = StartPolicy.AUTO
    """The reservation's, as it is when the handover is made (see ``Backend``)."""
    end_policy: EndPolicy = EndPolicy.RELEASE


Outcome = BaseException | None
"""Per item of a batch: None when it succeeded, else the exception that made it fail."""

_Step = TypeVar("_Step")
_Item = TypeVar("_Item")


class BackendTimeout(TimeoutError):
    """A backend call did not return within ``backend_timeout_seconds``; it was abandoned."""


class Backend(abc.ABC):
    """Side effects in the world when reservations start, near their end, and end.

    Every method must be idempotent: the manager may call it again for the same handover after
    a crash or a failed attempt, and the second call must not hand out resources twice. Raise any
    exception to report a failure; the manager retries with backoff and finally marks the event
    and the lease ERROR with the exception's message.

    Each step has two parts, run in this order for every batch:

    - the *remote* part (``start_remote``, ``before_end_remote``, ``end_remote``) talks to the
      world (a cloud's API). It gets no session and must touch nothing of the manager's: the
      manager runs it in a worker thread and gives up on it after ``backend_timeout_seconds``,
      failing every item of the call with ``BackendTimeout`` (retried with backoff as any
      failure). An abandoned call may still be running, and may still succeed, when the manager
      has moved on and even when the retry runs: idempotence covers that too. The default has
      nothing to do.
    - the *record* part (``start``, ``before_end``, ``end`` and their ``*_batch``) runs in the
      manager's thread only for the items whose remote part succeeded. ``session`` is the
      event's transaction: a backend records there (standalone: who holds what), so that its
      record and the lease status commit together. It must not wait on the world: it is not
      timed, and the transaction (on SQLite, the database's write lock) is held while it runs.

    The manager runs the events due together in batches and calls the ``*_batch`` methods, one
    item per event (the handovers of that event's lease). Their default implementations call the
    per-handover methods, each item in a savepoint of its own, so a backend needs only the three
    abstract methods; one that can do a batch's work in bulk overrides the ``*_batch`` methods.

    Every handover carries its reservation's policies (docs/policies.md):

    - ``start_policy`` (at ``start``): ``auto``, the backend hands the resources over and starts
      the project's workload on them (boots the servers, attaches the volumes, associates the
      addresses); ``manual``, it only grants the project access and holds the resources. The
      project starts them later through ``POST .../reservations/{id}/start``, which calls
      ``start_manual_remote`` then ``start_manual`` (from the API, not the manager).
    - ``end_policy`` (at ``end``): what happens to the workload when the resources go back to
      the pool, which they do whatever the policy. ``release``: access is revoked and the
      backend does the least it must to free the resources; ``delete``: the workload is deleted;
      ``suspend``: it is suspended (shelved) so that the project can resume it elsewhere;
      ``snapshot``: it is snapshotted, then deleted; ``keep-until-ack``: it is kept (stopped)
      until the project acknowledges the end through ``POST .../reservations/{id}/acknowledge``,
      which calls ``acknowledge_remote`` then ``acknowledge`` to discard it. A resource type
      offers only the end policies that make sense for it (``ResourceType.end_policies``).

    ``start_manual`` and ``acknowledge`` (and their remote parts) do nothing by default: a
    backend with nothing to start or keep needs no code for them. They must be idempotent too.
    """

    name: str = "base"

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        """The backend as the entry point builds it; one with settings of its own reads them."""
        return cls()

    # -- remote ------------------------------------------------------------------------------

    def start_remote(self, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        """Hand the resources of every item to its project in the world; one outcome per item
        (or raise, failing them all)."""
        return [None] * len(items)

    def before_end_remote(self, items: Sequence[Sequence[tuple[Handover, str]]]) -> list[Outcome]:
        """Run each item's ``before_end`` actions in the world; as ``start_remote``."""
        return [None] * len(items)

    def end_remote(self, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        """Take the resources of every item back in the world; as ``start_remote``."""
        return [None] * len(items)

    def start_manual_remote(self, handover: Handover) -> None:
        """Start the project's workload of a manual reservation, held since its start, in the
        world (raise to fail; the API answers 500 and changes nothing)."""
        return None

    def acknowledge_remote(self, handover: Handover) -> None:
        """Discard in the world what a keep-until-ack reservation's end kept; as
        ``start_manual_remote``."""
        return None

    # -- record ------------------------------------------------------------------------------

    @abc.abstractmethod
    def start(self, session: Session, handover: Handover) -> None:
        """Hand the resources to the project."""

    @abc.abstractmethod
    def before_end(self, session: Session, handover: Handover, action: str) -> None:
        """Run the reservation's ``before_end`` action (``default`` does nothing)."""

    @abc.abstractmethod
    def end(self, session: Session, handover: Handover) -> None:
        """Take the resources back from the project."""

    def start_manual(self, session: Session, handover: Handover) -> None:
        """Record that the project started its manual reservation (after
        ``start_manual_remote`` succeeded), in the API's transaction."""
        return None

    def acknowledge(self, session: Session, handover: Handover) -> None:
        """Record that what the reservation's end kept is discarded; as ``start_manual``."""
        return None

    # -- batches -----------------------------------------------------------------------------

    def start_batch(self, session: Session, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        """``start`` every handover of every item; returns one outcome per item.

        An override must keep items apart: a failed item leaves nothing behind and does not
        fail the others (report it in its outcome). It may also raise, failing the whole batch:
        the manager then rolls the batch back and calls again with one item at a time.
        """
        return each_in_savepoint(session, items, lambda h: self.start(session, h))

    def before_end_batch(
        self, session: Session, items: Sequence[Sequence[tuple[Handover, str]]]
    ) -> list[Outcome]:
        """``before_end`` for every (handover, action) of every item; as ``start_batch``."""
        return each_in_savepoint(session, items, lambda step: self.before_end(session, *step))

    def end_batch(self, session: Session, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        """``end`` every handover of every item; as ``start_batch``."""
        return each_in_savepoint(session, items, lambda h: self.end(session, h))

    # -- migration (reclaim) -----------------------------------------------------------------

    can_migrate: bool = False
    """Whether this backend moves running workloads (instances) between hosts: best-effort
    leases reclaim hosts (docs/lease-types.md) only through a backend that can."""

    def migrate_remote(self, moves: Sequence[Migration]) -> list[Outcome]:
        """Move each ``Migration``'s instances in the world; one outcome per move (or raise,
        failing them all). Any failure cancels the whole reclaim, whose moves are then all
        rolled back in Climate's records: a backend should undo (or be able to redo) the moves
        that did succeed. A move of a reservation that has not started has nothing to move in
        the world. The default has nothing to do."""
        return [None] * len(moves)

    def migrate(self, session: Session, moves: Sequence[Migration]) -> None:
        """Record the moves in ``session`` (the reclaim's transaction), after ``migrate_remote``
        succeeded for all of them. Idempotent like every backend method.

        :raises NotImplementedError: the backend cannot migrate (``can_migrate`` is False).
        """
        raise NotImplementedError(f"backend {self.name} cannot migrate workloads")


def each_in_savepoint(
    session: Session, items: Sequence[Sequence[_Step]], call: Callable[[_Step], None]
) -> list[Outcome]:
    """``call`` each step of each item, an item per savepoint: a failing item is rolled back
    alone and its exception is its outcome."""
    outcomes: list[Outcome] = []
    for item in items:
        try:
            with session.begin_nested():
                for step in item:
                    call(step)
        except Exception as exc:
            outcomes.append(exc)
        else:
            outcomes.append(None)
    return outcomes


class Timeboxed(Backend):
    """A backend as the manager calls it: each batch's remote part in a worker thread, given
    up after ``timeout`` seconds, then the record part, in the caller's thread, for the items
    whose remote part succeeded. The API's reservation actions call the remote parts of
    ``start_manual`` and ``acknowledge`` through it too (and their record parts themselves)."""

    def __init__(self, inner: Backend, timeout: float) -> None:
        self.inner = inner
        self.timeout = timeout
        self.name = inner.name
        self.can_migrate = inner.can_migrate

    def start(self, session: Session, handover: Handover) -> None:
        self._raise_first(self.start_batch(session, [[handover]]))

    def before_end(self, session: Session, handover: Handover, action: str) -> None:
        self._raise_first(self.before_end_batch(session, [[(handover, action)]]))

    def end(self, session: Session, handover: Handover) -> None:
        self._raise_first(self.end_batch(session, [[handover]]))

    def start_manual_remote(self, handover: Handover) -> None:
        self._raise_first(
            self._remote("start_manual", [handover], self._each(self.inner.start_manual_remote))
        )

    def acknowledge_remote(self, handover: Handover) -> None:
        self._raise_first(
            self._remote("acknowledge", [handover], self._each(self.inner.acknowledge_remote))
        )

    def start_manual(self, session: Session, handover: Handover) -> None:
        self.inner.start_manual(session, handover)

    def acknowledge(self, session: Session, handover: Handover) -> None:
        self.inner.acknowledge(session, handover)

    def start_batch(self, session: Session, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        return self._both(
            "start", items, self.inner.start_remote, lambda ok: self.inner.start_batch(session, ok)
        )

    def before_end_batch(
        self, session: Session, items: Sequence[Sequence[tuple[Handover, str]]]
    ) -> list[Outcome]:
        return self._both(
            "before_end",
            items,
            self.inner.before_end_remote,
            lambda ok: self.inner.before_end_batch(session, ok),
        )

    def end_batch(self, session: Session, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        return self._both(
            "end", items, self.inner.end_remote, lambda ok: self.inner.end_batch(session, ok)
        )

    def _both(
        self,
        what: str,
        items: Sequence[_Item],
        remote: Callable[[Sequence[_Item]], list[Outcome]],
        record: Callable[[Sequence[_Item]], list[Outcome]],
    ) -> list[Outcome]:
        outcomes = self._remote(what, items, remote)
        done = [i for i, outcome in enumerate(outcomes) if outcome is None]
        if done:
            recorded = record([items[i] for i in done])
            for i, outcome in zip(done, recorded, strict=True):
                outcomes[i] = outcome
        return outcomes

    def _remote(
        self,
        what: str,
        items: Sequence[_Item],
        remote: Callable[[Sequence[_Item]], list[Outcome]],
    ) -> list[Outcome]:
        """The remote call's outcomes, or the exception it raised; on timeout, every item fails.
        The worker thread keeps only its own result box: once abandoned, it reaches nothing."""
        box: list[list[Outcome] | BaseException] = []
        finished = threading.Event()

        def run() -> None:
            try:
                box.append(remote(items))
            except BaseException as exc:  # handed to the caller, which raises it
                box.append(exc)
            finally:
                finished.set()

        worker = threading.Thread(target=run, name=f"climate-backend-{what}", daemon=True)
        worker.start()
        if not finished.wait(self.timeout):
            timeout = BackendTimeout(f"backend {what} timed out after {self.timeout:g} s")
            return [timeout] * len(items)
        result = box[0]
        if isinstance(result, BaseException):
            raise result
        if len(result) != len(items):
            raise RuntimeError(
                f"backend {self.name} {what} returned {len(result)} outcomes for {len(items)} items"
            )
        return list(result)

    @staticmethod
    def _each(call: Callable[[Handover], None]) -> Callable[[Sequence[Handover]], list[Outcome]]:
        """A per-handover remote call as a batch one (raising fails them all)."""

        def batch(items: Sequence[Handover]) -> list[Outcome]:
            for handover in items:
                call(handover)
            return [None] * len(items)

        return batch

    @staticmethod
    def _raise_first(outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if outcome is not None:
                raise outcome

    def migrate(self, session: Session, moves: Sequence[Migration]) -> None:
        """All moves in the world (timed), then their record; any failure raises."""
        self._raise_first(self._remote("migrate", moves, self.inner.migrate_remote))
        self.inner.migrate(session, moves)


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
