"""The farm state file (`--farm-state`): devices quarantined with their time, reason and expiry, so the next run
skips a device until then (or `--unquarantine ID`). A device is quarantined when it fails its health check, its
transport lost it, or its step tests failed with transport errors MAX_TRANSPORT_FAILURES times in a row."""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from harness.clock import utc_now
from harness.errors import ConfigError, FarmError
from harness.files import write_text_atomically

MAX_TRANSPORT_FAILURES = 2
DEFAULT_QUARANTINE_HOURS = 24.0
STATE_FORMAT = 1


@dataclass(frozen=True)
class Quarantine:
    """Why and since when a device is kept out, and until when."""

    device: str
    reason: str
    since: str
    expires: str

    def active(self, at: dt.datetime | None = None) -> bool:
        """Return whether the quarantine has not expired at `at` (now by default)."""
        return dt.datetime.fromisoformat(self.expires) > (at or dt.datetime.now(dt.timezone.utc))

    def __str__(self) -> str:
        return f"{self.reason} (quarantined since {self.since}, until {self.expires})"


class FarmState:
    """The farm state file: devices quarantined by earlier runs (JSON, written atomically under a lock)."""

    def __init__(self, path: Path | None, quarantine_hours: float = DEFAULT_QUARANTINE_HOURS) -> None:
        self.path = Path(path).expanduser() if path else None
        self.quarantine_hours = quarantine_hours
        if self.path is not None:
            self._check_writable()

    def _check_writable(self) -> None:
        assert self.path is not None
        parent = self.path.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--farm-state {self.path}: cannot create its directory: {e.strerror}") from None
        target = self.path if self.path.exists() else parent
        if not os.access(target, os.W_OK) or (self.path.exists() and not self.path.is_file()):
            raise ConfigError(f"--farm-state {self.path}: not writable (the farm state must be a file this user can "
                              "write; choose another path)")

    def _lock(self) -> FileLock:
        assert self.path is not None
        return FileLock(str(self.path) + ".lock", timeout=60)

    def _read(self) -> dict:
        assert self.path is not None
        if not self.path.exists():
            return {"format": STATE_FORMAT, "devices": {}}
        try:
            data = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError) as e:
            raise FarmError(f"farm state {self.path} is not valid JSON ({e}): fix or delete it") from None
        if not isinstance(data, dict) or not isinstance(data.get("devices", {}), dict):
            raise FarmError(f"farm state {self.path}: expected {{\"devices\": {{ID: ...}}}}, got something else")
        data.setdefault("devices", {})
        return data

    def _write(self, data: dict) -> None:
        assert self.path is not None
        write_text_atomically(self.path, json.dumps(data, indent=2, sort_keys=True))

    def quarantined(self) -> dict[str, Quarantine]:
        """Return the active quarantines by device id (none without a state file)."""
        if self.path is None:
            return {}
        with self._lock():
            entries = self._read()["devices"]
        result = {}
        for device, entry in entries.items():
            try:
                q = Quarantine(device, str(entry["reason"]), str(entry["since"]), str(entry["expires"]))
                q.active()
            except (KeyError, TypeError, ValueError):
                raise FarmError(f"farm state {self.path}: entry {device!r} needs reason, since and expires "
                                "(ISO 8601 times)") from None
            if q.active():
                result[device] = q
        return result

    def quarantine(self, device: str, reason: str) -> Quarantine:
        """Record device as quarantined now, for quarantine_hours; return the entry."""
        since = utc_now()
        q = Quarantine(device, reason, since.isoformat(),
                       (since + dt.timedelta(hours=self.quarantine_hours)).isoformat())
        if self.path is not None:
            with self._lock():
                data = self._read()
                data["devices"][device] = {"reason": reason, "since": q.since, "expires": q.expires}
                self._write(data)
        return q

    def release(self, devices: list[str]) -> list[str]:
        """Remove devices from the state file (--unquarantine); return those that were in it."""
        if self.path is None or not devices:
            return []
        with self._lock():
            data = self._read()
            released = [d for d in devices if data["devices"].pop(d, None) is not None]
            if released:
                self._write(data)
        return released
