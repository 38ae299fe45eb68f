"""The results database's URL and engine: which URLs are accepted, the password masked wherever a URL is shown,
and SQLite opened for several writing processes (WAL, a busy timeout, write transactions that wait their turn)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from harness.errors import ConfigError, HarnessError

OFF = "none"  # --results-db none: nothing is recorded
RESULTS_DB_VARIABLE = "HARNESS_RESULTS_DB"
DEFAULT_FILE = "results.db"
BUSY_TIMEOUT_S = 30.0  # an SQLite writer waits this long for another process's transaction
CONNECT_TIMEOUT_S = 10  # a PostgreSQL server that does not answer
BACKENDS = ("sqlite", "postgresql")
POSTGRES_EXTRA = "pip install 'snapdragon-onboarding-harness[history-postgres]'"


class HistoryError(HarnessError):
    """The results database cannot be reached, read or written, or its schema is newer than this harness's; the
    message names the database (password masked) and why."""


class RejectedEventsError(HistoryError):
    """The database refused events for what they hold (a constraint, a value of the wrong type, an event that is
    not the harness's), not because it could not be reached: replaying them again would fail again."""


def default_url(cache_root: Path) -> str:
    """Return the default results database: an SQLite file in the cache directory."""
    return f"sqlite:///{Path(cache_root).expanduser().resolve() / DEFAULT_FILE}"


def results_url(given: str | None, cache_root: Path) -> str | None:
    """Return the results database a run records into: given (--results-db), else $HARNESS_RESULTS_DB, else
    default_url(cache_root); None when it is `none` (recording off)."""
    url = (given or os.environ.get(RESULTS_DB_VARIABLE) or default_url(cache_root)).strip()
    return None if url.lower() == OFF else url


def parse_url(text: str) -> URL:
    """Return the SQLAlchemy URL of a --results-db value (postgresql:// means the psycopg 3 driver); ConfigError
    for a malformed URL or a database other than SQLite and PostgreSQL."""
    try:
        url = make_url(text)
    except ArgumentError:
        raise ConfigError(f"--results-db {text!r}: not a database URL (sqlite:///PATH or "
                          "postgresql://USER:PASSWORD@HOST/DB, or `none`)") from None
    if url.get_backend_name() not in BACKENDS:
        raise ConfigError(f"--results-db {mask(text)}: the run history is kept in SQLite or PostgreSQL, not "
                          f"{url.get_backend_name()}")
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return url


def mask(url: str | URL) -> str:
    """Return url as text with its password, if any, shown as ***."""
    try:
        return (make_url(url) if isinstance(url, str) else url).render_as_string(hide_password=True)
    except ArgumentError:
        return str(url)


def url_key(url: str) -> str:
    """Return a short stable name for a database (its masked URL's digest): the spool's folder for it."""
    return hashlib.sha256(mask(url).encode()).hexdigest()[:16]


def sqlite_file(url: URL) -> Path | None:
    """Return the file of an SQLite URL (None for other databases and for an in-memory one)."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def create_engine(text: str) -> sa.Engine:
    """Return the engine of a --results-db URL (no connection is made yet). ConfigError for a URL parse_url
    refuses or a driver that is not installed."""
    url = parse_url(text)
    try:
        if url.get_backend_name() == "sqlite":
            engine = sa.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})
            _sqlite_for_many_writers(engine)
            return engine
        return sa.create_engine(url, connect_args={"connect_timeout": CONNECT_TIMEOUT_S})
    except ImportError as e:
        raise ConfigError(f"--results-db {mask(text)}: its driver is not installed ({e.name or e}); "
                          f"{POSTGRES_EXTRA}") from None


def _sqlite_for_many_writers(engine: sa.Engine) -> None:
    """Make each transaction on engine's SQLite file take the write lock when it begins (BEGIN IMMEDIATE: a
    second process waits up to the busy timeout instead of failing on a lock it cannot upgrade), in WAL mode
    (readers never wait for the writer), committing without an fsync per transaction (a killed process loses
    nothing; a power cut may lose the last commits, never the file)."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" below emits the BEGIN
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection) -> None:  # type: ignore[no-untyped-def]
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def reason(error: BaseException) -> str:
    """Return the first line of what a database error says (the driver's message, without SQLAlchemy's SQL
    text and links)."""
    orig = getattr(error, "orig", None)
    text = str(orig if orig is not None else error).strip()
    return (text.splitlines() or [type(error).__name__])[0]
