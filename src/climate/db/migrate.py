"""Schema migrations: ``climate db upgrade`` and the automatic upgrade at ``climate serve``."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from climate.db.engine import Database

MIGRATIONS = Path(__file__).parent / "migrations"


def _config(db: Database) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", db.url)
    return config


def upgrade(db: Database, revision: str = "head") -> None:
    """Bring the schema to ``revision`` in one transaction (PostgreSQL DDL is transactional)."""
    config = _config(db)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(db: Database) -> str | None:
    with db.engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision(db: Database) -> str | None:
    return ScriptDirectory.from_config(_config(db)).get_current_head()
