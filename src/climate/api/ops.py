"""The operator's endpoints, without authentication (they reveal no project unless
``metrics_show_projects``): ``/healthz``, ``/readyz`` and ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from climate import metrics
from climate.api.rendering import JSONResponse
from climate.api.schemas.answers import ANYONE, answers
from climate.api.schemas.ops import Health, Readiness, ReadinessCheck
from climate.domain.status import LeaseStatus
from climate.services.health import HealthService

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health, responses=answers(200, Health, ANYONE))
async def healthz() -> Health:
    """200 as long as the process serves HTTP."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses=answers(200, Readiness, ANYONE, also={503: Readiness}),
)
def readyz(request: Request) -> JSONResponse:
    """200 when the database answers, a manager's heartbeat is fresh and the outbox backlog is
    under ``ready_max_outbox_backlog``; 503 naming the failing checks otherwise."""
    health: HealthService = request.app.state.health
    checks = health.readiness()
    failed: list[str] = [c.name for c in checks if not c.ok]
    body = Readiness(
        status="not ready" if failed else "ready",
        failed=failed,
        checks=[ReadinessCheck(name=c.name, ok=c.ok, detail=c.detail) for c in checks],
    )
    return JSONResponse(body.model_dump(), status_code=503 if failed else 200)


class StateCollector(Collector):
    """The service's state as gauges, read from the database at each scrape."""

    def __init__(self, health: HealthService) -> None:
        self.health = health

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_project = self.health.ctx.settings.metrics_show_projects
        state = self.health.state(by_project=by_project)
        if by_project:
            yield metrics.gauge(
                "climate_project_leases",
                "Live leases by project and status",
                state.leases,
                ["project", "status"],
            )
            totals: dict[tuple[str, ...], float] = {}
            for (_, status), count in state.leases.items():
                totals[(status,)] = totals.get((status,), 0) + count
        else:
            totals = {key: float(count) for key, count in state.leases.items()}
        for status in LeaseStatus:
            totals.setdefault((status.value,), 0.0)
        yield metrics.gauge("climate_leases", "Live leases by status", totals, ["status"])
        yield metrics.gauge(
            "climate_outbox_backlog",
            "Notifications waiting to be delivered",
            {(): state.outbox_backlog},
        )
        yield metrics.gauge(
            "climate_outbox_dead_letters",
            "Notifications given up after webhook_max_attempts",
            {(): state.dead_letters},
        )
        if state.heartbeat_age is not None:
            yield metrics.gauge(
                "climate_manager_heartbeat_age_seconds",
                "Seconds since a manager of this database last showed it is alive",
                {(): state.heartbeat_age},
            )


@router.get(
    "/metrics",
    response_class=Response,
    responses=answers(
        200,
        None,
        ANYONE,
        description="Prometheus's text exposition format",
        media={"text/plain": {"schema": {"type": "string"}}},
    ),
)
async def prometheus_metrics(request: Request) -> Response:
    """Prometheus's text format: this process's counters (every process's, in multiprocess
    mode) and the state read from the database now."""
    collector = StateCollector(request.app.state.health)
    body = await run_in_threadpool(metrics.exposition, [collector])
    return Response(body, media_type=metrics.CONTENT_TYPE)
