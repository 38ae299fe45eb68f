"""A run's writes to its results database: its start, each step's record as the step ends and its end, each in
one short transaction; or, from the first write that fails (or when the database cannot be opened), to the local
spool, so that nothing is lost and nothing stops the run.

The database is opened, and what earlier runs spooled for it replayed, when the run's first step record comes:
a session that records no step (`--collect-only`, `--help`, every test deselected) writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import Timeout

from harness.errors import HarnessError
from harness.history.database import create_engine, mask
from harness.history.spool import Spool
from harness.history.store import FINISH_EVENT, RECORD_EVENT, ResultsStore
from harness.reporting.records import StepRecord


class Recorder:
    """Records one run into the database at url (identify() returns its start event, harness.history.identity's
    run_event), spooling under spool_root what it cannot write there. ConfigError at once for a URL that is not
    an SQLite or PostgreSQL database's, or whose driver is not installed."""

    def __init__(self, url: str, spool_root: Path, identify: Callable[[], dict[str, Any]]) -> None:
        create_engine(url).dispose()  # the URL and its driver, checked before the run starts
        self.url = url
        self.spool = Spool(spool_root, url)
        self._identify = identify
        self.store: ResultsStore | None = None
        self.start: dict[str, Any] | None = None  # the run's start event, once its first record came
        self.problem: str | None = None  # why the database is not written (the first failure)
        self.spooled = 0  # events spooled by this run
        self.spooled_records = 0  # of which step records
        self.lost = 0  # events neither written nor spooled
        self.replayed = (0, 0)  # (spool files, rows) replayed from earlier runs
        self.rejected: list[str] = []  # spool files the database refused, set aside

    def _open(self) -> None:
        """Connect and migrate, then replay the spool; on failure record the problem (the run spools)."""
        try:
            self.store = ResultsStore.open(self.url)
            self.replayed = self.spool.replay(self.store.apply_all,
                                              lambda path, e: self.rejected.append(f"{path.name}: {e}"))
        except HarnessError as e:
            self._down(str(e).splitlines()[0])
        except (OSError, Timeout) as e:  # the spool cannot be read: the database is still written
            self.problem = self.problem or f"the spool {self.spool.directory} cannot be replayed: {e}"

    def step(self, record: StepRecord, nodeid: str, finished_at: str | None) -> None:
        """Write one step test's record (the run's start first, when it is the first)."""
        if self.start is None:
            self._open()
            self.start = self._identify()
            self._write(self.start)
        self._write({"event": RECORD_EVENT, "run": self.start["uid"], "record": record.to_json(), "nodeid": nodeid,
                     "finished_at": finished_at})

    def finish(self, finished_at: str, duration_s: float, exit_status: int, devices: list[dict[str, Any]],
               digests: dict[str, str]) -> None:
        """Write the run's end (when it recorded a step): its exit status, duration, devices' farm status and
        the digests of models built during it."""
        if self.start is None:
            return
        self._write({"event": FINISH_EVENT, "run": self.start["uid"], "finished_at": finished_at,
                     "duration_s": round(duration_s, 3), "exit_status": exit_status, "devices": devices,
                     "digests": digests})

    def _write(self, event: dict[str, Any]) -> None:
        if self.store is not None:
            try:
                self.store.apply(event)
                return
            except HarnessError as e:
                self._down(str(e).splitlines()[0])
        assert self.start is not None
        try:
            self.spool.append(self.start["uid"], event, header=self.start)
            self.spooled += 1
            self.spooled_records += event.get("event") == RECORD_EVENT
        except (OSError, Timeout) as e:
            self.lost += 1
            self.problem = f"{self.problem or 'results database ' + mask(self.url)}; the spool cannot be written: {e}"

    def _down(self, problem: str) -> None:
        """Stop writing to the database (the rest of the run goes to the spool)."""
        self.problem = self.problem or problem
        self.close()

    def warning(self) -> str | None:
        """Return the one-line warning the run shows about its history, or None when all went to the database."""
        parts = []
        if self.problem is not None:
            parts.append(self.problem)
        if self.spooled:
            parts.append(f"this run's {self.spooled_records} step record(s) and {self.spooled - self.spooled_records} "
                         f"other event(s) (its start, its end) spooled to {self.spool.directory}, for the next run "
                         "that reaches the database to write")
        if self.lost:
            parts.append(f"{self.lost} event(s) of this run lost")
        if self.rejected:
            parts.append(f"the database refused {len(self.rejected)} spooled file(s), set aside as *.rejected "
                         f"({self.rejected[0]})")
        return "; ".join(parts) or None

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None
