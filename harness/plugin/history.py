"""pytest option and hooks of the run history (harness/history/): `--results-db URL` (default
$HARNESS_RESULTS_DB, else an SQLite file in the cache directory; `none`: off). The controller (not an xdist
worker: it receives the workers' reports) checks the URL at configure; when the first step record arrives it
opens the database, replays what earlier runs spooled and writes the run's identity; then each step's record
as its report arrives, and the run's end at sessionfinish. What cannot be written is spooled, and one warning
says so."""

from __future__ import annotations

import datetime as dt
import time
import warnings
from typing import Any

import pytest

from harness.plugin import RECORD_PROPERTY, SESSION_KEY, HarnessWarning

RECORDER_KEY = pytest.StashKey[Any]()


class ResultsDbWarning(HarnessWarning):
    """The results database could not be written: the run's records were spooled (or lost), and why."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("snapdragon")
    group.addoption("--results-db", default=None, metavar="URL",
                    help="record the run, each step as it ends, in this database: sqlite:///PATH or "
                         "postgresql://USER:PASSWORD@HOST/DB (default: $HARNESS_RESULTS_DB, else "
                         "sqlite:///<cache dir>/results.db; `none`: do not record). What cannot be written is "
                         "spooled in the cache and written by the next run that reaches the database")


@pytest.hookimpl(trylast=True)  # after harness.plugin's pytest_configure has built the session
def pytest_configure(config: pytest.Config) -> None:
    from harness.errors import ConfigError
    from harness.history.database import results_url
    from harness.history.identity import run_event
    from harness.history.recorder import Recorder
    from harness.history.spool import SPOOL_DIR
    from harness.plugin.farm import run_of

    session = config.stash.get(SESSION_KEY, None)
    if session is None or hasattr(config, "workerinput"):
        return
    url = results_url(config.option.results_db, session.cache.root)
    if url is None:
        return
    try:
        recorder = Recorder(url, session.cache.root / SPOOL_DIR,
                            lambda: run_event(run_of(config), session.started_at, session.targets, session.cache))
    except ConfigError as e:
        raise pytest.UsageError(str(e)) from None
    config.stash[RECORDER_KEY] = recorder
    config.pluginmanager.register(_HistoryHooks(recorder, session), "harness-history")


def pytest_unconfigure(config: pytest.Config) -> None:
    recorder = config.stash.get(RECORDER_KEY, None)
    if recorder is not None:
        recorder.close()


def _iso(epoch_s: float | None) -> str | None:
    return dt.datetime.fromtimestamp(epoch_s, dt.timezone.utc).isoformat(timespec="milliseconds") \
        if epoch_s else None


class _HistoryHooks:
    """Writes each step record as its report arrives (from the xdist workers too) and the run's end."""

    def __init__(self, recorder: Any, session: Any) -> None:
        self.recorder = recorder
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        from harness.reporting.records import StepRecord

        for name, value in report.user_properties:
            if name == RECORD_PROPERTY:
                record = StepRecord.from_json(value, f"{report.nodeid}'s step record")
                self.recorder.step(record, report.nodeid, _iso(getattr(report, "stop", None)))

    @pytest.hookimpl(trylast=True)  # after harness.plugin's has set the run's exit status
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from harness.clock import now_iso
        from harness.history.identity import missing_digests

        hs = self.session
        if self.recorder.start is None:  # no step recorded: nothing was written, nothing to finish
            return
        self.recorder.finish(now_iso(), time.monotonic() - hs.started_monotonic, int(session.exitstatus),
                             hs.device_summary(), missing_digests(self.recorder.start, hs.targets, hs.cache))
        message = self.recorder.warning()
        if message is not None:
            warnings.warn(ResultsDbWarning(f"run history: {message}"), stacklevel=1)
