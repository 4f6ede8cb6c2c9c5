"""Which requests of one API process run at once, and in what order (docs/limits.md#scheduling).

Python runs one thread at a time. Thirty requests running at once each run at a thirtieth of the
speed, and the writer holding SQLite's one write turn is slowed by every reader beside it: under
32 busy clients a creation held the turn 12 ms for 5 ms of its own work, and waited 400 ms for
it. So requests wait here, on the event loop, and ``slots`` of them run at a time:

1. changes (any method but GET, HEAD and OPTIONS, save the searches and dry runs that POST
   only to ask: ``is_change``) first, in arrival order: they are short, and they are what a
   full cloud's users wait on;
2. then reads, the cheapest first by the running average of their kind (method and path, ids
   left out), unless one has waited ``max_wait`` seconds: then the oldest first.

A request that runs longer than ``lend_after`` seconds (a report over many leases, a call to a
slow Nova, a client reading its answer slowly) lends its slot: when every running request has
run that long, one more waiting request starts, and another ``lend_after`` later, up to
``MAX_RUNNING``. So one slow request costs the others at most ``lend_after``.

A request's body is read before it waits for a slot (up to ``max_body`` bytes, past which the
route refuses it anyway), and its slot is given back as soon as its answer is complete, before it
is written out: a client sending its body or reading its answer slowly holds no slot.
``/healthz`` never waits.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from climate import metrics
from climate.api.parsing import flag
from climate.errors import InvalidInput

MAX_RUNNING = 40
"""Never more at once than anyio's threads for the routes' blocking work."""
READS = frozenset({"GET", "HEAD", "OPTIONS"})
SEARCHES = frozenset({"/v1/availability"})
"""Paths whose POST only asks (a body too rich for a query string) and changes nothing."""
UNQUEUED = frozenset({"/healthz"})
MAX_KINDS = 1000
"""Kinds of request whose cost is remembered; past that, unknown ones are estimated at 0
(paths with random words in them must not grow this process's memory)."""
_AVERAGE_WEIGHT = 0.1


def kind(method: str, path: str) -> str:
    """What a request is, for its cost: the method and the path with ids (segments of digits,
    or of eight characters or more holding one: lease ids, host ids and names) as ``*``."""
    return method + " " + "/".join("*" if _is_id(s) else s for s in path.split("/"))


def is_change(method: str, path: str, query: bytes) -> bool:
    """Whether a request may change something: not a read, a search or a dry run."""
    if method in READS:
        return False
    if method == "POST" and (path in SEARCHES or _dry_run(query)):
        return False
    return True


def _dry_run(query: bytes) -> bool:
    """Whether the query asks for a dry run, as the route reads ``dry_run`` (its last value)."""
    if b"dry_run" not in query:
        return False
    values = parse_qs(query.decode("latin-1")).get("dry_run", [])
    try:
        return bool(values) and flag("dry_run", values[-1])
    except InvalidInput:
        return False  # the route refuses it


def _is_id(segment: str) -> bool:
    return segment.isdigit() or (len(segment) >= 8 and any(c.isdigit() for c in segment))


@dataclass(order=True)
class _Waiting:
    estimate: float
    number: int
    arrived: float = field(compare=False)
    ready: asyncio.Future[None] = field(compare=False)
    taken: bool = field(default=False, compare=False)


class Queue:
    """The scheduler's state. Every method runs on the event loop's thread."""

    def __init__(
        self,
        slots: int,
        lend_after: float,
        max_wait: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slots = slots
        self._clock = clock
        self.lend_after = lend_after
        self.max_wait = max_wait
        self.running: dict[int, float] = {}
        """Started at (monotonic), by request number."""
        self._changes: deque[_Waiting] = deque()
        self._reads_by_cost: list[_Waiting] = []
        self._reads_by_age: deque[_Waiting] = deque()
        self._costs: dict[str, float] = {}
        self._numbers = 0
        self._waiting = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def waiting(self) -> int:
        return self._waiting

    async def enter(self, change: bool, what: str) -> int:
        """Wait for a slot; the number to ``leave`` with."""
        self._numbers += 1
        number = self._numbers
        now = self._clock()
        if len(self.running) < self.slots and not self._waiting:
            self.running[number] = now
            return number
        loop = asyncio.get_running_loop()
        waiting = _Waiting(self._costs.get(what, 0.0), number, now, loop.create_future())
        self._waiting += 1
        if change:
            self._changes.append(waiting)
        else:
            heapq.heappush(self._reads_by_cost, waiting)
            self._reads_by_age.append(waiting)
        self._admit(loop)
        try:
            await waiting.ready
        except asyncio.CancelledError:
            if waiting.taken:  # admitted just as it was cancelled
                self.leave(number, what)
            else:
                self._take(waiting)
                if change:
                    self._changes.remove(waiting)
            raise
        metrics.REQUEST_QUEUE_SECONDS.observe(self._clock() - now)
        return number

    def leave(self, number: int, what: str) -> None:
        took = self._clock() - self.running.pop(number)
        if what in self._costs:
            self._costs[what] += (took - self._costs[what]) * _AVERAGE_WEIGHT
        elif len(self._costs) < MAX_KINDS:
            self._costs[what] = took
        self._admit(asyncio.get_running_loop())

    def _admit(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            now = self._clock()
            if len(self.running) >= self.slots and not self._lending(now):
                break
            waiting = self._next(now)
            if waiting is None:
                break
            self._take(waiting)
            self.running[waiting.number] = now
            waiting.ready.set_result(None)
        self._arm(loop)

    def _take(self, waiting: _Waiting) -> None:
        waiting.taken = True
        self._waiting -= 1
        # A read taken by its age, or gone, stays in the cost heap until it reaches the top:
        # rebuild the heap once such reads are most of it, or a queue that never empties grows.
        heap = self._reads_by_cost
        if len(heap) > 64 and len(heap) > 2 * self._waiting:
            self._reads_by_cost = [w for w in heap if not w.taken]
            heapq.heapify(self._reads_by_cost)

    def held(self) -> int:
        """Entries this queue holds, waiting or already taken and not yet dropped."""
        return len(self._changes) + len(self._reads_by_cost) + len(self._reads_by_age)

    def _lending(self, now: float) -> bool:
        return len(self.running) < MAX_RUNNING and all(
            now - started >= self.lend_after for started in self.running.values()
        )

    def _next(self, now: float) -> _Waiting | None:
        if self._changes:
            return self._changes.popleft()
        by_age = self._reads_by_age
        while by_age and by_age[0].taken:
            by_age.popleft()
        if not by_age:
            self._reads_by_cost.clear()
            return None
        if now - by_age[0].arrived >= self.max_wait:
            return by_age.popleft()
        while True:
            waiting = heapq.heappop(self._reads_by_cost)
            if not waiting.taken:
                return waiting

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake up when the youngest running request has run ``lend_after``, if any wait."""
        if self._timer is not None and self._timer_loop is loop:
            return
        if not self.running or not self._waiting:
            return
        youngest = max(self.running.values())
        self._timer_loop = loop
        self._timer = loop.call_later(
            max(0.0, youngest + self.lend_after - self._clock()), self._lend, loop
        )

    def _lend(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._admit(loop)


class RequestScheduler:
    """The ASGI middleware around the routes (inside the access log and Blazar's headers, so
    that a request's logged time includes its wait)."""

    def __init__(
        self, app: ASGIApp, *, slots: int, lend_after: float, max_wait: float, max_body: int
    ) -> None:
        self.app = app
        self.queue = Queue(slots, lend_after, max_wait)
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNQUEUED:
            await self.app(scope, receive, send)
            return
        received = await self._body(receive)

        async def replay() -> Message:
            return received.popleft() if received else await receive()

        method, what = scope["method"], kind(scope["method"], scope["path"])
        change = is_change(method, scope["path"], scope.get("query_string", b""))
        number = await self.queue.enter(change, what)
        done = False

        def leave() -> None:
            nonlocal done
            if not done:
                done = True
                self.queue.leave(number, what)

        async def answer(message: Message) -> None:
            # The answer is complete: writing it out waits on the client, not on this process.
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                leave()
            await send(message)

        try:
            await self.app(scope, replay, answer)
        finally:
            leave()

    async def _body(self, receive: Receive) -> deque[Message]:
        """The request's messages up to its last body part, a disconnection or ``max_body``."""
        messages: deque[Message] = deque()
        size = 0
        while size <= self.max_body:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
            size += len(message.get("body", b""))
        return messages
