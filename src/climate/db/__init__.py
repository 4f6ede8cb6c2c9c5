"""The only place that speaks SQL: tables, engine and sessions, repository queries, migrations."""
