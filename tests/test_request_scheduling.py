"""Which requests of one API process run at once, and in what order (``api/scheduling.py``):
changes first, then the cheapest reads unless one has waited too long, a slow request lending its
slot, bodies read before a slot is taken; checked against a brute-force model of the rules, and
through the middleware over HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from sqlalchemy import text
from starlette.types import Message, Receive, Scope, Send

from climate.api.scheduling import MAX_RUNNING, Queue, RequestScheduler, is_change, kind
from climate.config import load_settings
from climate.errors import InvalidInput
from tests.conftest import LiveServer, serve

NEVER = 1e9
"""A ``lend_after`` no test waits for."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Model:
    """The rules written the slow, obvious way: every decision looks at every waiting request."""

    slots: int
    max_wait: float
    running: dict[int, tuple[float, str]] = field(default_factory=dict)
    waiting: list[tuple[int, bool, str, float, float]] = field(default_factory=list)
    """number, change, kind, arrived, estimate"""
    costs: dict[str, float] = field(default_factory=dict)

    def enter(self, number: int, change: bool, what: str, now: float) -> None:
        if len(self.running) < self.slots and not self.waiting:
            self.running[number] = (now, what)
        else:
            self.waiting.append((number, change, what, now, self.costs.get(what, 0.0)))
            self._admit(now)

    def leave(self, number: int, now: float) -> None:
        started, what = self.running.pop(number)
        took = now - started
        old = self.costs.get(what)
        self.costs[what] = took if old is None else old + (took - old) * 0.1
        self._admit(now)

    def _admit(self, now: float) -> None:
        while len(self.running) < self.slots and self.waiting:
            changes = [w for w in self.waiting if w[1]]
            reads = [w for w in self.waiting if not w[1]]
            if changes:
                chosen = min(changes, key=lambda w: w[0])
            elif now - min(r[3] for r in reads) >= self.max_wait:
                chosen = min(reads, key=lambda w: (w[3], w[0]))
            else:
                chosen = min(reads, key=lambda w: (w[4], w[0]))
            self.waiting.remove(chosen)
            self.running[chosen[0]] = (now, chosen[2])


KINDS = ["GET /v1/leases", "GET /v1/leases/*", "GET /v1/os-hosts/allocations"]
Step = tuple[str, int, float]
"""("enter" with a kind index, or "change" with one, or "leave" with a running index) and
seconds the clock moves before the step."""
steps = st.lists(
    st.tuples(
        st.sampled_from(["enter", "change", "leave", "leave"]),
        st.integers(0, 10),
        st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.3]),
    ),
    min_size=10,
    max_size=80,
)


async def _replay(queue: Queue, clock: Clock, model: Model, plan: list[Step]) -> None:
    tasks: dict[int, asyncio.Task[int]] = {}
    number = 0
    for action, pick, pause in plan:
        clock.now += pause
        if action == "leave":
            if not model.running:
                continue
            chosen = sorted(model.running)[pick % len(model.running)]
            queue.leave(chosen, model.running[chosen][1])
            model.leave(chosen, clock.now)
        else:
            number += 1
            what = KINDS[pick % len(KINDS)]
            tasks[number] = asyncio.ensure_future(queue.enter(action == "change", what))
            await asyncio.sleep(0)  # the task runs up to its wait, taking its number
            model.enter(number, action == "change", what, clock.now)
        await asyncio.sleep(0)
        assert set(queue.running) == set(model.running), plan
        assert queue.waiting() == len(model.waiting)
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)


@settings(max_examples=150, deadline=None)
@given(slots=st.integers(1, 3), plan=steps)
def test_requests_start_in_the_order_the_rules_give(slots: int, plan: list[Step]) -> None:
    clock = Clock()
    queue = Queue(slots, lend_after=NEVER, max_wait=1.0, clock=clock)
    asyncio.run(_replay(queue, clock, Model(slots, 1.0), plan))


def test_a_change_goes_before_reads_that_came_first() -> None:
    async def scenario() -> list[str]:
        queue = Queue(1, lend_after=NEVER, max_wait=NEVER)
        order: list[str] = []
        first = await queue.enter(False, "GET /a")

        async def request(name: str, change: bool) -> None:
            number = await queue.enter(change, name)
            order.append(name)
            queue.leave(number, name)

        waiting = [asyncio.ensure_future(request(f"GET /{i}", False)) for i in range(3)]
        waiting.append(asyncio.ensure_future(request("POST /v1/leases", True)))
        await asyncio.sleep(0)
        queue.leave(first, "GET /a")
        await asyncio.gather(*waiting)
        return order

    assert asyncio.run(scenario()) == ["POST /v1/leases", "GET /0", "GET /1", "GET /2"]


def test_a_slow_request_lends_its_slot_after_lend_after() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        queue = Queue(1, lend_after=0.05, max_wait=NEVER)
        await queue.enter(False, "GET /slow")
        began = loop.time()
        await asyncio.wait_for(queue.enter(False, "GET /next"), timeout=2)
        return loop.time() - began

    waited = asyncio.run(scenario())
    assert 0.04 <= waited < 1.0


def test_lending_stops_at_max_running() -> None:
    async def scenario() -> tuple[int, int]:
        queue = Queue(1, lend_after=0.001, max_wait=NEVER)
        tasks = [asyncio.ensure_future(queue.enter(False, "GET /slow")) for _ in range(60)]
        await asyncio.sleep(0.5)
        running, waiting = len(queue.running), queue.waiting()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return running, waiting

    assert asyncio.run(scenario()) == (MAX_RUNNING, 60 - MAX_RUNNING)


def test_a_request_gone_while_waiting_leaves_no_trace() -> None:
    async def scenario() -> tuple[int, list[int]]:
        queue = Queue(1, lend_after=NEVER, max_wait=NEVER)
        first = await queue.enter(True, "POST /a")
        gone = asyncio.ensure_future(queue.enter(True, "POST /b"))
        stays = asyncio.ensure_future(queue.enter(False, "GET /c"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        waiting = queue.waiting()
        queue.leave(first, "POST /a")
        await stays
        return waiting, sorted(queue.running)

    assert asyncio.run(scenario()) == (1, [3])


def test_a_queue_that_never_empties_does_not_grow() -> None:
    """Reads all taken by their age (``max_wait`` 0) under a load that never lets the queue
    empty: what the queue holds stays bounded by what waits."""

    async def scenario() -> tuple[int, int]:
        clock = Clock()
        queue = Queue(1, lend_after=NEVER, max_wait=0.0, clock=clock)
        running = await queue.enter(False, "GET /v1/leases")
        waiting = [asyncio.ensure_future(queue.enter(False, "GET /v1/leases")) for _ in range(5)]
        await asyncio.sleep(0)
        most = 0
        for _ in range(5000):
            waiting.append(asyncio.ensure_future(queue.enter(False, "GET /v1/leases")))
            await asyncio.sleep(0)
            clock.now += 0.001
            queue.leave(running, "GET /v1/leases")
            (running,) = queue.running
            most = max(most, queue.held())
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return queue.waiting(), most

    waiting, most = asyncio.run(scenario())
    assert waiting == 0
    assert most < 200


def test_kinds_leave_ids_out() -> None:
    assert kind("GET", "/v1/leases/4f1c5e02-aaaa") == "GET /v1/leases/*"
    assert kind("GET", "/v1/os-hosts/17/allocation") == "GET /v1/os-hosts/*/allocation"
    assert kind("GET", "/v1/os-hosts/allocations") == "GET /v1/os-hosts/allocations"


@pytest.mark.parametrize(
    ("method", "path", "query", "changes"),
    [
        ("GET", "/v1/leases", b"", False),
        ("HEAD", "/v1/leases", b"", False),
        ("POST", "/v1/availability", b"", False),  # a search: POST only for its body
        ("POST", "/v1/leases", b"dry_run=true", False),
        ("POST", "/v1/leases", b"name=x&dry_run=Yes", False),
        ("POST", "/v1/leases", b"dry_run=true&dry_run=false", True),  # the route reads the last
        ("POST", "/v1/leases", b"dry_run=maybe", True),  # refused by the route, as a change
        ("POST", "/v1/leases", b"", True),
        ("POST", "/v1/availability/timeline", b"", True),
        ("PUT", "/v1/leases/4f1c5e02-aaaa", b"dry_run=true", True),
        ("DELETE", "/v1/leases/4f1c5e02-aaaa", b"", True),
    ],
)
def test_searches_and_dry_runs_wait_as_reads(
    method: str, path: str, query: bytes, changes: bool
) -> None:
    assert is_change(method, path, query) is changes


def _toy(
    started: list[str], slow: asyncio.Event
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """An ASGI app that notes each request as it starts; ``/slow`` holds until ``slow`` is set."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        started.append(f"{scope['method']} {scope['path']} {body.decode()}".strip())
        if scope["path"] == "/slow":
            await slow.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def _one_at_a_time(started: list[str], slow: asyncio.Event | None = None) -> RequestScheduler:
    """The middleware over ``_toy``, one slot, no lending, no age bound."""
    return RequestScheduler(
        _toy(started, slow or asyncio.Event()),
        slots=1,
        lend_after=NEVER,
        max_wait=NEVER,
        max_body=1000,
    )


def _scope(method: str, path: str) -> Scope:
    return {"type": "http", "method": method, "path": path, "headers": []}


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _read_at_once(message: Message) -> None:
    pass


def _queued() -> float:
    return REGISTRY.get_sample_value("climate_http_request_queue_seconds_count") or 0.0


def _order_behind_slow(requests: list[tuple[str, str]]) -> list[str]:
    """The order the ``requests`` (method, path; POSTs with the body ``{}``), sent one after
    the other while ``/slow`` holds the one slot, start in once it ends."""

    async def scenario() -> list[str]:
        started: list[str] = []
        slow = asyncio.Event()
        app = _one_at_a_time(started, slow)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://climate") as http:
            first = asyncio.ensure_future(http.get("/slow"))
            later = []
            for method, path in requests:
                await asyncio.sleep(0.02)
                content = b"{}" if method == "POST" else None
                later.append(asyncio.ensure_future(http.request(method, path, content=content)))
            await asyncio.sleep(0.05)
            assert started == ["GET /slow"]
            slow.set()
            answers = await asyncio.gather(first, *later)
        assert all(answer.status_code == 200 for answer in answers)
        return started

    return asyncio.run(scenario())


def test_through_the_middleware_changes_overtake_queued_reads() -> None:
    """The four requests that came while ``/slow`` ran waited, and ``/metrics`` counts them."""
    queued_before = _queued()
    reads = [("GET", f"/read{i}") for i in range(3)]
    order = _order_behind_slow([*reads, ("POST", "/v1/leases")])
    assert _queued() - queued_before == 4
    assert order == [
        "GET /slow",
        "POST /v1/leases {}",
        "GET /read0",
        "GET /read1",
        "GET /read2",
    ]


def test_through_the_middleware_a_search_does_not_overtake_queued_reads() -> None:
    order = _order_behind_slow(
        [
            ("GET", "/read"),
            ("POST", "/v1/availability"),
            ("POST", "/v1/leases?dry_run=true"),
            ("POST", "/v1/leases"),
        ]
    )
    assert order == [
        "GET /slow",
        "POST /v1/leases {}",
        "GET /read",
        "POST /v1/availability {}",
        "POST /v1/leases {}",  # the dry run
    ]


def test_a_body_sent_slowly_holds_no_slot() -> None:
    async def scenario() -> list[str]:
        started: list[str] = []
        app = _one_at_a_time(started)
        rest = asyncio.Event()
        parts: list[Message] = [
            {"type": "http.request", "body": b'{"na', "more_body": True},
            {"type": "http.request", "body": b'me": 1}', "more_body": False},
        ]

        async def trickle() -> Message:
            if len(parts) == 1:
                await rest.wait()
            return parts.pop(0)

        posting = asyncio.ensure_future(app(_scope("POST", "/v1/leases"), trickle, _read_at_once))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(app(_scope("GET", "/v1/leases"), _no_body, _read_at_once), timeout=1)
        rest.set()
        await posting
        return started

    assert asyncio.run(scenario()) == ["GET /v1/leases", 'POST /v1/leases {"name": 1}']


def test_an_answer_read_slowly_holds_no_slot() -> None:
    """The slot is given back once the answer is complete, while the client still reads it."""

    async def scenario() -> list[str]:
        started: list[str] = []
        app = _one_at_a_time(started)
        read = asyncio.Event()

        async def slow_reader(message: Message) -> None:
            if message["type"] == "http.response.body":
                await read.wait()

        reading = asyncio.ensure_future(app(_scope("GET", "/v1/leases"), _no_body, slow_reader))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(
            app(_scope("GET", "/v1/leases/1"), _no_body, _read_at_once), timeout=1
        )
        assert not reading.done()
        read.set()
        await reading
        assert app.queue.running == {}
        return started

    assert asyncio.run(scenario()) == ["GET /v1/leases", "GET /v1/leases/1"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("CLIMATE_REQUEST_SLOTS", "0"),
        ("CLIMATE_REQUEST_SLOTS", "41"),
        ("CLIMATE_REQUEST_LEND_MS", "0"),
    ],
)
def test_bad_scheduling_settings_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(InvalidInput, match=variable):
        load_settings(env={variable: value})


# -- on a real server: a request waiting on the cloud lends its slot -----------------------------

STUCK = 2.0
"""How long the slow request runs: an immediate lease's creation waits this long for a start the
cloud never finishes (every backend call hangs)."""


def _slow_then_listed(sqlite_url: str, lend_ms: float) -> tuple[float, bool]:
    """One slot; an immediate lease's creation holding it for ``STUCK`` seconds; then a lease
    listing. How long the listing took, and whether the creation was still running then."""
    settings = load_settings(
        env={},
        request_slots=1,
        request_lend_ms=lend_ms,
        backend="faulty",
        fault_hang_rate=1.0,
        backend_timeout_seconds=STUCK + 1,
        immediate_wait_seconds=STUCK,
    )
    lease = {
        "name": "now",
        "start_date": "now",
        "end_date": "2099-01-01 00:00",
        "lease_type": "immediate",
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
    }
    with serve(settings, sqlite_url) as server, httpx.Client(base_url=server.url) as client:
        assert client.post("/v1/os-hosts", json={"name": "slow-1"}).status_code == 201
        with ThreadPoolExecutor(1) as pool:
            creating = pool.submit(client.post, "/v1/leases", json=lease, timeout=30)
            _until_written(server, "now")  # then the creation holds the slot, waiting
            began = time.monotonic()
            listing = client.get("/v1/leases", timeout=30)
            took = time.monotonic() - began
            still_running = not creating.done()
            created = creating.result()
    assert created.status_code == 201, created.text
    assert created.json()["lease"]["status"] != "ACTIVE"  # the cloud never started it
    assert listing.status_code == 200, listing.text
    return took, still_running


def _until_written(server: LiveServer, name: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        with server.ctx.db.reader() as session:
            found = session.execute(
                text("SELECT count(*) FROM leases WHERE name = :n"), {"n": name}
            )
            if found.scalar_one():
                return
        assert time.monotonic() < deadline, f"lease {name!r} not written in 10 s"
        time.sleep(0.02)


def test_on_a_real_server_a_request_waiting_on_the_cloud_lends_its_slot(sqlite_url: str) -> None:
    took, still_running = _slow_then_listed(sqlite_url, lend_ms=100)
    assert still_running
    assert took < STUCK / 2


def test_on_a_real_server_a_slot_not_lent_makes_the_next_request_wait(sqlite_url: str) -> None:
    took, _ = _slow_then_listed(sqlite_url, lend_ms=60_000)
    # The listing waited for the creation's slot. Whether the creation's answer had reached
    # the client's other thread by then is a race of the client's (the slot is given back
    # once the answer is complete, before it is written out), so it is not asserted.
    assert took > STUCK - 0.8
