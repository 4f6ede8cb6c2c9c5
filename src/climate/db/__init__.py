"""The only place that speaks SQL: tables, engine and sessions, repository queries, migrations."""

from climate.db import records as records  # every table in Base.metadata (see records.py)
