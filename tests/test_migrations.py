"""The migrations build exactly the schema the models describe, on every database."""

from __future__ import annotations

import datetime as dt

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from climate.db import migrate
from climate.db.engine import Database
from climate.db.tables import Base, Host, HostAllocation, Item, ItemAllocation, Lease, Reservation


def test_migrated_schema_matches_the_models(db: Database) -> None:
    with db.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []


def test_database_is_at_head_and_upgrade_again_is_a_no_op(db: Database) -> None:
    assert migrate.current_revision(db) == migrate.head_revision(db)
    migrate.upgrade(db)
    assert migrate.current_revision(db) == migrate.head_revision(db)
    with db.reader() as session:
        locks = session.execute(text("SELECT name FROM locks ORDER BY name")).scalars().all()
    assert locks == ["admission", "calendar_pruned", "inventory"]


def test_the_series_index_holds_only_leases_of_a_series(db: Database) -> None:
    # Every admission wrote a page of the whole-table index, for leases with no series.
    catalog = {
        "sqlite": "SELECT sql FROM sqlite_master WHERE name = 'ix_leases_series'",
        "postgresql": "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_leases_series'",
    }[db.dialect]
    with db.reader() as session:
        definition = session.execute(text(catalog)).scalar_one()
    assert "WHERE series_id IS NOT NULL" in definition.replace("(", "").replace(")", "")
    if db.dialect == "sqlite":
        with db.reader() as session:
            plan = session.execute(
                text("EXPLAIN QUERY PLAN SELECT id FROM leases WHERE series_id = 'x'")
            ).all()
        assert "USING INDEX ix_leases_series" in " ".join(str(row[-1]) for row in plan)


def test_the_database_keeps_a_live_lease_name_to_one_lease_of_its_project(db: Database) -> None:
    def lease(project: str, deleted: dt.datetime | None = None) -> Lease:
        at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
        return Lease(
            name="n",
            project_id=project,
            user_id="u",
            start_date=at,
            end_date=at,
            status="PENDING",
            created_at=at,
            deleted_at=deleted,
        )

    with db.transaction() as session:
        session.add_all(
            [lease("p"), lease("q"), lease("p", dt.datetime(2029, 1, 1, tzinfo=dt.UTC))]
        )
    with pytest.raises(IntegrityError), db.transaction() as session:
        session.add(lease("p"))


def test_postgresql_refuses_overlapping_allocations_of_one_host(pg_url: str) -> None:
    """The exclusion constraint is the last line: even a planner bug cannot double-book."""
    from tests.conftest import T0, _reset_pg

    _reset_pg(pg_url)
    db = Database(pg_url)
    hour = dt.timedelta(hours=1)
    try:
        with db.transaction() as session:
            host = Host(hypervisor_hostname="h", created_at=T0)
            lease = Lease(
                name="l",
                project_id="p",
                user_id="u",
                start_date=T0,
                end_date=T0 + 2 * hour,
                status="PENDING",
                created_at=T0,
            )
            session.add_all([host, lease])
            session.flush()
            reservation = Reservation(
                lease_id=lease.id,
                resource_type="physical:host",
                status="pending",
                params={},
                created_at=T0,
            )
            session.add(reservation)
            session.flush()
            ids = (reservation.id, lease.id, host.id)
        with db.transaction() as session:
            _allocate(session, ids, T0, T0 + hour)
            _allocate(session, ids, T0 + hour, T0 + 2 * hour)  # touching is fine
        with pytest.raises(IntegrityError, match="host_allocations_no_overlap"):
            with db.transaction() as session:
                _allocate(session, ids, T0 + hour / 2, T0 + hour + hour / 2)
    finally:
        db.dispose()


def _allocate(
    session: Session, ids: tuple[str, str, int], start: dt.datetime, end: dt.datetime
) -> None:
    reservation_id, lease_id, host_id = ids
    session.add(
        HostAllocation(
            reservation_id=reservation_id,
            lease_id=lease_id,
            host_id=host_id,
            start_date=start,
            end_date=end,
        )
    )
    session.flush()


def test_audit_log_revision_goes_down_and_up_again(db: Database) -> None:
    config = migrate._config(db)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0002")
        assert "audit_log" not in inspect(connection).get_table_names()
    migrate.upgrade(db)
    with db.engine.connect() as connection:
        indexes = {i["name"] for i in inspect(connection).get_indexes("audit_log")}
    assert indexes == {"ix_audit_log_target", "ix_audit_log_at"}
    assert migrate.current_revision(db) == migrate.head_revision(db)


def test_items_revision_goes_down_and_up_again(db: Database) -> None:
    new_tables = {
        "items",
        "item_properties",
        "item_allocations",
        "volume_pools",
        "volume_pool_properties",
        "volume_allocations",
    }
    config = migrate._config(db)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0003")
        assert new_tables.isdisjoint(inspect(connection).get_table_names())
    migrate.upgrade(db)
    with db.engine.connect() as connection:
        assert new_tables <= set(inspect(connection).get_table_names())
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []


def test_postgresql_refuses_overlapping_allocations_of_one_item(pg_url: str) -> None:
    from tests.conftest import T0, _reset_pg

    _reset_pg(pg_url)
    db = Database(pg_url)
    hour = dt.timedelta(hours=1)
    try:
        with db.transaction() as session:
            item = Item(kind="device", pool="", name="gpu-0", created_at=T0)
            lease = Lease(
                name="l",
                project_id="p",
                user_id="u",
                start_date=T0,
                end_date=T0 + 2 * hour,
                status="PENDING",
                created_at=T0,
            )
            session.add_all([item, lease])
            session.flush()
            reservation = Reservation(
                lease_id=lease.id,
                resource_type="device",
                status="pending",
                params={},
                created_at=T0,
            )
            session.add(reservation)
            session.flush()
            ids = (reservation.id, lease.id, item.id)

        def allocate(session: Session, start: dt.datetime, end: dt.datetime) -> None:
            rid, lid, item_id = ids
            session.add(
                ItemAllocation(
                    reservation_id=rid,
                    lease_id=lid,
                    item_id=item_id,
                    start_date=start,
                    end_date=end,
                )
            )
            session.flush()

        with db.transaction() as session:
            allocate(session, T0, T0 + hour)
            allocate(session, T0 + hour, T0 + 2 * hour)
        with pytest.raises(IntegrityError, match="item_allocations_no_overlap"):
            with db.transaction() as session:
                allocate(session, T0 + hour / 2, T0 + hour + hour / 2)
    finally:
        db.dispose()


def test_instances_revision_goes_down_and_up_again(db: Database) -> None:
    config = migrate._config(db)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0004")
        assert "instance_allocations" not in inspect(connection).get_table_names()
        assert "items" in inspect(connection).get_table_names()
    migrate.upgrade(db)
    with db.engine.connect() as connection:
        assert "instance_allocations" in inspect(connection).get_table_names()
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []


def test_lease_revisions_go_down_and_up_again_with_their_triggers(db: Database) -> None:
    def triggers() -> int:
        if db.dialect != "sqlite":
            return 0
        with db.engine.connect() as connection:
            found = connection.execute(
                text(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' "
                    "AND name GLOB 'lease_revision_*'"
                )
            )
            return int(found.scalar_one())

    counted = 3 + 6 * 3 if db.dialect == "sqlite" else 0  # leases, and 6 tables of its rows
    assert triggers() == counted
    config = migrate._config(db)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0022")
        assert "lease_revisions" not in inspect(connection).get_table_names()
    assert triggers() == 0
    migrate.upgrade(db)
    assert triggers() == counted


def test_sqlite_times_stored_in_the_short_form_get_their_microseconds(sqlite_url: str) -> None:
    """Times written without their microseconds (below the ORM, before 0022) compare as text
    with the long form wrongly at equal instants: the migration lengthens them."""
    fresh = Database(sqlite_url)  # at head: taken back to 0022, then to 0021 by hand
    config = migrate._config(fresh)
    with fresh.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0022")
    with fresh.engine.begin() as connection:
        connection.execute(text("DELETE FROM alembic_version"))
        connection.execute(text("INSERT INTO alembic_version VALUES ('0021')"))
        connection.execute(
            text(
                "INSERT INTO managers (name, started_at, heartbeat_at) VALUES "
                "('m', '2030-01-01 12:00:00', '2030-01-01 12:00:00.250000')"
            )
        )
    migrate.upgrade(fresh)
    with fresh.engine.connect() as connection:
        stored = connection.execute(text("SELECT started_at, heartbeat_at FROM managers")).one()
    assert tuple(stored) == ("2030-01-01 12:00:00.000000", "2030-01-01 12:00:00.250000")
    fresh.dispose()
