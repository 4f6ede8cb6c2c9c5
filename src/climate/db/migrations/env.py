"""Alembic environment: runs on the connection that ``climate.db.migrate`` hands over."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from climate.db.tables import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=Base.metadata)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=Base.metadata)
    with context.begin_transaction():
        context.run_migrations()
