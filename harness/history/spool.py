"""The local spool: the events a run could not write to its results database, one JSON line each, in
`<cache dir>/results-spool/<database key>/<run uid>.jsonl` (one folder per database, so that they are replayed
into the database they were meant for), until a run that reaches that database replays them.

A line is appended with one write on a file opened for appending (a reader never sees half a line, and a line
cut short by a killed process is skipped), under the folder's lock, which a replay holds from reading a file to
deleting it: a run still spooling into it then starts a new file. Each file begins with its run's start event,
so a file replays on its own."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock

from harness.history.database import RejectedEventsError, mask, url_key
from harness.json_values import json_default

SPOOL_DIR = "results-spool"
LOCK_TIMEOUT_S = 60.0


class Spool:
    """The spool of one database (url, shown masked) under root."""

    def __init__(self, root: Path, url: str) -> None:
        self.directory = Path(root) / url_key(url)
        self.url = mask(url)

    def _lock(self) -> FileLock:
        self.directory.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.directory / ".lock"), timeout=LOCK_TIMEOUT_S)

    def path(self, run: str) -> Path:
        return self.directory / f"{run}.jsonl"

    def append(self, run: str, event: dict[str, Any], header: dict[str, Any]) -> Path:
        """Append event to run's file, header (the run's start event) first when the file is new; return the
        file. OSError (or filelock's Timeout) when it cannot be written."""
        with self._lock():
            if not (self.directory / "url").exists():  # which database the folder is for, for a reader
                (self.directory / "url").write_text(self.url + "\n")
            path = self.path(run)
            lines = ([] if path.exists() else [header]) + [event]
            data = "".join(json.dumps(e, default=json_default, allow_nan=True) + "\n" for e in lines).encode()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        return path

    def files(self) -> list[Path]:
        """Return the spooled files, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob("*.jsonl"), key=lambda p: (p.stat().st_mtime_ns, p.name))

    def replay(self, write: Callable[[list[dict[str, Any]]], int], reject: Callable[[Path, Exception], None]) \
            -> tuple[int, int]:
        """Write each spooled file's events with write (one call per file) and delete the file; return (files
        replayed, rows written). A file whose events write() refuses for what they hold (RejectedEventsError) is
        renamed `*.rejected` and passed to reject; any other error (the database went away) stops the replay
        and propagates, leaving that file and the later ones."""
        if not self.directory.is_dir():
            return 0, 0
        done = rows = 0
        with self._lock():
            for path in self.files():
                events = list(_events(path))
                try:
                    rows += write(events) if events else 0
                except RejectedEventsError as e:
                    with contextlib.suppress(OSError):
                        path.rename(path.with_suffix(".rejected"))
                    reject(path, e)
                    continue
                path.unlink(missing_ok=True)
                done += 1
        return done, rows


def _events(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the events of a spool file, skipping a line that is not a whole JSON object (a killed writer's)."""
    with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                yield event
