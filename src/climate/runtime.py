"""Assembly: settings -> database, services, manager, deliverer. Used by the CLI and tests."""

from __future__ import annotations

import datetime as dt
import gc
import logging
from dataclasses import dataclass, field

from fastapi import FastAPI

from climate import logs
from climate.api.app import create_app
from climate.backends import load_backend
from climate.config import Settings, load_settings
from climate.context import ServiceContext
from climate.db import migrate
from climate.db.engine import Database
from climate.db.wakeup import WakeWatcher
from climate.domain.clock import Clock, SystemClock
from climate.errors import ClimateError
from climate.keystone import Trusts, service_credentials
from climate.manager.liveness import Heartbeat, SoleManager, start_liveness
from climate.manager.monitor import HostMonitor
from climate.manager.service import Manager
from climate.notify.delivery import Deliverer
from climate.resources import load_resource_types

LOG = logging.getLogger(__name__)


class SchemaOutOfDate(ClimateError):
    pass


def open_database(settings: Settings, *, upgrade: bool) -> Database:
    """Connect; bring the schema to head if asked, else insist it is there already."""
    db = Database(settings.effective_database_url)
    if upgrade:
        migrate.upgrade(db)
    elif migrate.current_revision(db) != migrate.head_revision(db):
        raise SchemaOutOfDate(
            f"the database schema is not current; run 'climate db upgrade' for {db.url}"
        )
    return db


def build_context(settings: Settings, db: Database, clock: Clock | None = None) -> ServiceContext:
    trusts = None
    if settings.auth == "keystone" and settings.backend == "openstack":
        # As Blazar: the lessee's trust lets the backend act in its project (docs/openstack.md).
        trusts = Trusts(service_credentials(settings), settings.backend_timeout_seconds)
    return ServiceContext(
        settings=settings,
        db=db,
        clock=clock or SystemClock(),
        resource_types=load_resource_types(),
        trusts=trusts,
    )


@dataclass
class Workers:
    """The manager and the notification deliverer, with the watcher that wakes them."""

    manager: Manager
    deliverer: Deliverer
    watcher: WakeWatcher | None = None
    liveness: Heartbeat | SoleManager | None = None
    monitor: HostMonitor | None = None
    """Run when the backend watches host health (openstack: Nova's compute services)."""
    started: bool = field(default=False)

    def wake(self, earliest: dt.datetime | None = None) -> None:
        self.manager.wake(earliest)
        if self.manager.ctx.settings.notification_sinks:
            self.deliverer.wake()

    def start(self, *, watch: bool = True) -> None:
        ctx = self.manager.ctx
        self.liveness = start_liveness(ctx.db, self.manager.name, ctx.settings, ctx.clock)
        if watch:
            self.watcher = WakeWatcher(self.manager.ctx.db, self.wake)
            self.watcher.start()
        self.manager.start()
        self.deliverer.start()
        if self.monitor is not None:
            self.monitor.start()
        self.started = True

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self.monitor is not None:
            self.monitor.stop()
        self.manager.stop()
        self.deliverer.stop()
        if self.liveness is not None:
            self.liveness.stop()


def build_workers(ctx: ServiceContext) -> Workers:
    manager = Manager(ctx, load_backend(ctx.settings))
    backend = manager.handlers.backend
    monitor = HostMonitor(ctx, backend) if backend.inner.watches_hosts else None
    workers = Workers(manager, Deliverer(ctx), monitor=monitor)
    ctx.wake_manager = workers.wake
    return workers


def app_factory() -> FastAPI:
    """The API app for ``climate api --workers N`` (uvicorn imports this in each worker)."""
    settings = load_settings()
    logs.configure(settings)
    db = open_database(settings, upgrade=False)
    app = create_app(build_context(settings, db))
    settle_heap()
    return app


YOUNG_COLLECTION_THRESHOLD = 20_000
"""Allocations between two collections of the youngest generation (Python's default: 700)."""


def settle_heap() -> None:
    """For a long-running server, once everything it starts with is built: those objects
    (modules, the app, the ORM's mappings) leave the cyclic collector's view, and young
    collections run less often. A request makes thousands of short-lived objects (ORM rows,
    their states, response dicts); with Python's defaults, the collections they trigger, and
    the full ones that walk every object of the process, took more than half of listing a
    thousand leases."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)
