"""Reading a Blazar database, and writing what was made of it into Climate's.

Blazar's tables are read by reflection (SQLAlchemy Core, no Blazar code): whatever Blazar 18's
models made, on MySQL/MariaDB, PostgreSQL or SQLite. The writer adds Climate rows in the
caller's transaction and logs the imported allocations for the in-memory calendars.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import DateTime, MetaData, String, create_engine, inspect, select, text, type_coerce
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from climate.db import allocations as allocation_rows
from climate.db import hosts as host_rows
from climate.db import instances as instance_rows
from climate.db.tables import Host, Item, Lease, ResourceProperty
from climate.errors import InvalidInput

REQUIRED = ("leases", "reservations", "events", "computehosts")
OPTIONAL = (
    "resource_properties",
    "computehost_extra_capabilities",
    "computehost_reservations",
    "computehost_allocations",
    "instance_reservations",
    "floatingips",
    "floatingip_reservations",
    "required_floatingips",
    "floatingip_allocations",
)
Row = dict[str, Any]


@dataclass(frozen=True)
class Unreadable:
    """A date column's value that is not a date (text edited by hand into an SQLite file, a
    MySQL zero date): read as it is, for the mapping to name its row."""

    text: str


@dataclass(frozen=True)
class BlazarRows:
    """Every row of Blazar's tables that Climate maps, by table (a table the database lacks,
    such as floating IPs before Blazar had them, reads as empty)."""

    tables: dict[str, list[Row]]

    def of(self, table: str) -> list[Row]:
        return self.tables.get(table, [])


def engine_url(url: str) -> str:
    """``mysql://`` means PyMySQL (the driver Climate ships), as in Blazar's own configs."""
    if url.startswith("mysql://"):
        return "mysql+pymysql://" + url[len("mysql://") :]
    return url


def read(url: str) -> BlazarRows:
    """Every row of the Blazar database at ``url``, read in one transaction (one snapshot).

    :raises InvalidInput: ``--database-url`` cannot be opened or is not a Blazar database.
    """
    try:
        engine = create_engine(engine_url(url), poolclass=NullPool)
    except (SQLAlchemyError, ValueError, ImportError) as exc:
        raise InvalidInput("--database-url", f"cannot open {url!r}: {exc}") from exc
    try:
        with engine.connect() as connection, connection.begin():
            present = set(inspect(connection).get_table_names())
            missing = [t for t in REQUIRED if t not in present]
            if missing:
                raise InvalidInput(
                    "--database-url",
                    f"not a Blazar database: it has no table {', '.join(missing)}",
                )
            wanted = [t for t in (*REQUIRED, *OPTIONAL) if t in present]
            meta = MetaData()
            meta.reflect(connection, only=wanted)
            tables: dict[str, list[Row]] = {}
            for name in wanted:
                table = meta.tables[name]
                dates = [c.name for c in table.columns if isinstance(c.type, DateTime)]
                # Dates are read raw and parsed here: the driver's parser would raise on the
                # first odd value, naming neither its table nor its row.
                columns = [
                    type_coerce(c, String).label(c.name) if c.name in dates else c
                    for c in table.columns
                ]
                query = select(*columns).order_by(*table.primary_key.columns)
                rows = [dict(r._mapping) for r in connection.execute(query)]
                for row in rows:
                    for column in dates:
                        row[column] = _date(row[column])
                tables[name] = rows
            return BlazarRows(tables)
    except SQLAlchemyError as exc:
        raise InvalidInput("--database-url", f"cannot read {url!r}: {exc}") from exc
    finally:
        engine.dispose()


def _date(value: object) -> dt.datetime | Unreadable | None:
    """A date column's value as SQLAlchemy would read it, or ``Unreadable``."""
    if value is None or isinstance(value, dt.datetime):
        return value
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value)
        except ValueError:
            pass
    return Unreadable(str(value))


@dataclass(frozen=True)
class Present:
    """What of the import Climate has already: lease ids, the (project, name) of its live
    leases, hosts by name (and their names by id), floating IPs by (network, address), host
    property settings by name."""

    lease_ids: set[str]
    lease_names: set[tuple[str, str]]
    hosts: dict[str, Host]
    host_names: dict[int, str]
    items: dict[tuple[str, str], Item]
    property_names: set[str]


def present(session: Session, lease_ids: Collection[str], item_kind: str) -> Present:
    found = set(session.scalars(select(Lease.id).where(Lease.id.in_(list(lease_ids)))))
    hosts = {h.hypervisor_hostname: h for h in session.scalars(select(Host))}
    items = {
        (i.pool, i.name): i for i in session.scalars(select(Item).where(Item.kind == item_kind))
    }
    names = set(
        session.scalars(
            select(ResourceProperty.property_name).where(
                ResourceProperty.resource_type == host_rows.RESOURCE_TYPE
            )
        )
    )
    live = session.execute(select(Lease.project_id, Lease.name).where(Lease.deleted_at.is_(None)))
    return Present(
        found,
        {(project, name) for project, name in live},
        hosts,
        {h.id: name for name, h in hosts.items()},
        items,
        names,
    )


def add_inventory(
    session: Session,
    hosts: Sequence[Host],
    items: Sequence[Item],
    settings: Sequence[ResourceProperty],
) -> None:
    """Add hosts (with their properties), floating IPs and property settings; the new rows get
    their ids (hosts keep any id given)."""
    session.add_all([*hosts, *items, *settings])
    session.flush()
    if hosts and session.get_bind().dialect.name == "postgresql":
        # Hosts that keep Blazar's id were inserted with it: move the id sequence past them.
        session.execute(
            text("SELECT setval(pg_get_serial_sequence('hosts', 'id'), max(id)) FROM hosts")
        )
    if hosts or items:
        host_rows.bump_inventory(session)


def add_leases(
    session: Session,
    leases: Iterable[Lease],
    version: int,
    instance_hosts: Collection[int],
) -> None:
    """Add leases with their reservations, events and allocations, and log every imported
    reservation (and the instance usage of ``instance_hosts``) as changed at admission
    ``version``, so that every process's calendar loads them before it next admits."""
    added = list(leases)
    session.add_all(added)
    session.flush()
    changed = [r.id for lease in added for r in lease.reservations]
    changed += [instance_rows.usage_owner(h) for h in sorted(instance_hosts)]
    if changed:
        allocation_rows.record_changes(session, version, changed)


def utc(value: dt.datetime | None) -> dt.datetime | None:
    """Blazar stores naive UTC."""
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
