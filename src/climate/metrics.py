"""Prometheus metrics: what each process counts, and the exposition that ``/metrics`` serves.

Counters and histograms live in the process that counts them: the API processes (requests,
admissions, refusals) and the manager (event lag, deliveries). Under ``climate api --workers N``,
or wherever ``metrics_dir`` is set, prometheus-client's multiprocess mode keeps them in files of
one directory (``PROMETHEUS_MULTIPROC_DIR``) and any process's ``/metrics`` sums them all; the
variable must be set before this module is first imported (``serving.metrics_directory``).
Gauges of the service's state (leases by status, outbox backlog, heartbeat age) are not counted
anywhere: they are read from the database at each scrape (``services/health.py``).

No label holds a lease, project or user id, nor a raw path: routes are templates
(``/v1/leases/{lease_id}``), so a scrape says nothing about who uses the service.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # serving.MULTIPROC_ENV, without importing uvicorn
CONTENT_TYPE = CONTENT_TYPE_LATEST
UNMATCHED = "unmatched"
"""The route label of a request that matched no route (its path is never a label)."""

REQUESTS = Counter(
    "climate_http_requests",
    "HTTP requests answered, by route template, method and status",
    ["route", "method", "status"],
)
REQUEST_SECONDS = Histogram(
    "climate_http_request_seconds",
    "Time to answer an HTTP request, by route template",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
ROUTE_CPU_SECONDS = Counter(
    "climate_http_route_cpu_seconds",
    "CPU time of the worker thread running each blocking route handler (parsing the request "
    "and writing the answer out, on the event loop, are not in it), by route template and method",
    ["route", "method"],
)
REQUEST_QUEUE_SECONDS = Histogram(
    "climate_http_request_queue_seconds",
    "Time an HTTP request waited for one of its API process's slots (api/scheduling.py); "
    "requests that found one free are not counted",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
ADMISSION_SECONDS = Histogram(
    "climate_admission_seconds",
    "Time to decide a lease creation (admitted or refused), counter-offers included",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
REFUSALS = Counter(
    "climate_admission_refusals",
    "Lease creations and updates refused, by reason (for want of capacity, the first failing "
    "rule: too_few_match, too_few_free, shared, unexplained; else usage_rule or credits) and "
    "resource type (capacity only)",
    ["reason", "resource_type"],
)
CATCH_UPS = Counter(
    "climate_calendar_catch_ups",
    "In-memory calendars brought up to other processes' changes on PostgreSQL, by where the "
    "changes came from (feed: told by NOTIFY; log: read from allocation_changes)",
    ["source"],
)
EVENT_LAG = Histogram(
    "climate_event_lag_seconds",
    "How long after its time a lease event was done, by event type",
    ["event_type"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
)
DELIVERIES = Counter(
    "climate_notification_deliveries",
    "Notifications delivered, by sink kind (webhook or bus)",
    ["sink"],
)
DELIVERY_FAILURES = Counter(
    "climate_notification_delivery_failures",
    "Failed notification delivery attempts, by sink kind (webhook or bus)",
    ["sink"],
)


def refused(details: Mapping[str, Any] | None) -> None:
    """Count one refusal from its error details (``wire.refusal``): the first reservation
    whose rule is not ``fits`` names the reason; a usage rule's or the credits' refusal (its
    ``rules``) is ``usage_rule`` or ``credits``, never a capacity refusal."""
    rules = (details or {}).get("rules")
    if rules:
        REFUSALS.labels("credits" if rules[0].get("kind") == "credits" else "usage_rule", "").inc()
        return
    reasons = (details or {}).get("reason", {}).get("reservations", [])
    first = next((r for r in reasons if r.get("rule") != "fits"), None)
    if first is None:
        REFUSALS.labels("unexplained", "").inc()
        return
    REFUSALS.labels(str(first.get("rule")), str(first.get("resource_type") or "")).inc()


def exposition(state: Iterable[Collector]) -> bytes:
    """The text format of every process's counters (or this one's) and of ``state``, the
    collectors that read the database at scrape time."""
    if MULTIPROC_ENV in os.environ:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        counted = generate_latest(registry)
    else:
        counted = generate_latest(REGISTRY)
    scraped = CollectorRegistry()
    for collector in state:
        scraped.register(collector)
    return counted + generate_latest(scraped)


def gauge(
    name: str,
    documentation: str,
    values: Mapping[tuple[str, ...], float],
    labels: list[str] | None = None,
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=labels or [])
    for key, value in values.items():
        family.add_metric(list(key), value)
    return family
