"""The results database's schema versions: numbered steps applied in order when a database is opened, each
recorded as a row of `schema_version`. A database whose schema is newer than the steps this harness has is
refused, naming both versions.

Each step takes a connection inside the migration's one transaction. Step 1 creates the tables of
harness.history.schema; a later version adds a step here (ALTER TABLE ... ADD COLUMN, CREATE INDEX, ...) and
changes schema.py with it, and moves a frozen copy of the version-1 tables into step 1 when schema.py's no
longer are version 1's (tests/test_history.py checks that a database built by the steps has schema.py's
columns, so a step 1 left creating the new columns fails there)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import sqlalchemy as sa

from harness.clock import now_iso
from harness.history import schema
from harness.history.database import HistoryError, mask

LOCK_KEY = 40_0401  # PostgreSQL: the advisory lock two sessions migrating one database at once take in turn


class Migration(NamedTuple):
    version: int
    description: str
    apply: Callable[[sa.Connection], None]


def _create_version_1(conn: sa.Connection) -> None:
    schema.metadata.create_all(conn, tables=[schema.runs, schema.run_models, schema.run_devices, schema.records,
                                             schema.kpi_values, schema.tags])


MIGRATIONS = (
    Migration(1, "runs, their models and devices, step records, KPI values, tags", _create_version_1),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def current_version(conn: sa.Connection) -> int:
    """Return the schema version of conn's database (0: no schema yet)."""
    if not sa.inspect(conn).has_table(schema.schema_version.name):
        return 0
    return conn.execute(sa.select(sa.func.max(schema.schema_version.c.version))).scalar() or 0


def migrate(conn: sa.Connection, url: str) -> tuple[int, int]:
    """Bring conn's database to SCHEMA_VERSION in one transaction (two processes migrating one database take
    turns); return (the version found, the version now). HistoryError naming the database (url, password
    masked) and both versions when its schema is newer than this harness knows."""
    with conn.begin():
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
        found = current_version(conn)
        if found > SCHEMA_VERSION:
            raise HistoryError(f"results database {mask(url)} has schema version {found}, newer than this "
                               f"harness's {SCHEMA_VERSION}: upgrade the harness, or give --results-db another "
                               "database")
        if found == SCHEMA_VERSION:
            return found, found
        schema.schema_version.create(conn, checkfirst=True)
        for step in MIGRATIONS[found:]:
            step.apply(conn)
            conn.execute(schema.schema_version.insert().values(version=step.version, description=step.description,
                                                              applied_at=now_iso()))
    return found, SCHEMA_VERSION
