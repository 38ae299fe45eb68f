"""The device farm: one user of a device at a time, a health check before first use, and quarantine.

* **Locks**: a file lock per device (filelock) under a host-wide directory, held by a test while it uses
  the device, so two measurements never share a device, across pytest-xdist workers and across separate
  pytest processes on one host.
* **Health check** (before a device's first use in a session): it connects (the transport checks the SoC
  against devices.yaml), has free space in its work directory, the device runner starts there and imports
  onnxruntime (and the QNN EP), and its thermal status is below SEVERE (Android's `dumpsys thermalservice`,
  else the hottest zone below 100 °C).
* **Quarantine**: a device that fails its health check, that its transport lost, or whose step tests failed
  with transport errors MAX_TRANSPORT_FAILURES times in a row is quarantined: its remaining tests are
  skipped naming the reason, and with a farm state file (`--farm-state`) the quarantine is written there
  with its time, reason and expiry, so the next run skips the device until then (or `--unquarantine ID`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout

from harness.clock import utc_now
from harness.farm.cooldown import read_temps
from harness.errors import ConfigError, HarnessError, TransportError
from harness.files import write_text_atomically

if TYPE_CHECKING:
    from harness.runner.client import DeviceRunner

MAX_TRANSPORT_FAILURES = 2
DEFAULT_QUARANTINE_HOURS = 24.0
DEFAULT_MIN_FREE_MB = 200.0
SEVERE_STATUS = 3  # Android's THERMAL_STATUS_SEVERE
SEVERE_TEMP_C = 100.0  # Qualcomm's thermal HAL: NPU SEVERE
STATE_FORMAT = 1


class FarmError(HarnessError):
    """The farm state file cannot be read or written, or a device lock cannot be taken."""


def _parse_iso(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


# ------------------------------------------------------------------ farm state


@dataclass(frozen=True)
class Quarantine:
    """Why and since when a device is kept out, and until when."""

    device: str
    reason: str
    since: str
    expires: str

    def active(self, at: dt.datetime | None = None) -> bool:
        """Return whether the quarantine has not expired at `at` (now by default)."""
        return _parse_iso(self.expires) > (at or dt.datetime.now(dt.timezone.utc))

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


# ------------------------------------------------------------------ locks


def default_lock_dir() -> Path:
    """Return the host-wide directory of device locks ($HARNESS_LOCK_DIR, else under the temp directory)."""
    return Path(os.environ.get("HARNESS_LOCK_DIR") or Path(tempfile.gettempdir()) / "snapdragon-harness-locks")


class DeviceLocks:
    """One file lock per device id, shared by every process on this host that uses the same directory."""

    def __init__(self, directory: Path | None = None, timeout_s: float = 1800.0) -> None:
        self.directory = Path(directory or default_lock_dir())
        self.timeout_s = timeout_s
        self._locks: dict[str, FileLock] = {}

    def lock(self, device_id: str) -> FileLock:
        """Return the (reentrant) lock of device_id."""
        if device_id not in self._locks:
            self.directory.mkdir(parents=True, exist_ok=True)
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", device_id)
            self._locks[device_id] = FileLock(str(self.directory / f"{safe}.lock"), timeout=self.timeout_s)
        return self._locks[device_id]

    def acquire(self, device_id: str) -> FileLock:
        """Take device_id's lock, waiting up to timeout_s; raise FarmError naming the lock file on timeout."""
        lock = self.lock(device_id)
        try:
            lock.acquire()
        except Timeout:
            raise FarmError(f"device {device_id} is in use by another process for more than {self.timeout_s:g} s "
                            f"(lock {lock.lock_file})") from None
        return lock


# ------------------------------------------------------------------ health check


@dataclass(frozen=True)
class Check:
    """One health check: its name, whether it passed, and what it saw."""

    name: str
    ok: bool
    detail: str


@dataclass
class Health:
    """A device's health check before first use."""

    device: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return all(c.ok for c in self.checks)

    @property
    def reason(self) -> str:
        """The failed checks, as one line."""
        return "; ".join(f"{c.name}: {c.detail}" for c in self.checks if not c.ok)

    def as_dict(self) -> dict:
        """Return the checks as plain data."""
        return {"device": self.device, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


_STATUS = re.compile(r"Thermal Status:\s*(\d+)")


def check_health(runner: "DeviceRunner", min_free_mb: float = DEFAULT_MIN_FREE_MB) -> Health:
    """Return the health of runner's (connected) device: free space, runner start-up, thermal status."""
    transport = runner.transport
    health = Health(transport.device_id, [Check("connect", True, f"{transport.device_id} connected, SoC "
                                                 f"{transport.soc.id} as devices.yaml says")])
    health.checks.append(_free_space(transport, min_free_mb))
    health.checks.append(_runner_starts(runner))
    health.checks.append(_thermal(transport))
    return health


def _free_space(transport, min_free_mb: float) -> Check:  # type: ignore[no-untyped-def]
    try:
        result = transport.read_command(["df", "-Pk", "."], timeout_s=30.0)
        fields = result.stdout.strip().splitlines()[-1].split()
        free_mb = int(fields[3]) / 1024.0
    except (TransportError, IndexError, ValueError) as e:
        return Check("free space", False, f"could not read it with `df -Pk` in the work directory: {e}")
    ok = free_mb >= min_free_mb
    return Check("free space", ok, f"{free_mb:.0f} MB free in the work directory"
                 + ("" if ok else f", needs at least {min_free_mb:g} MB"))


def _runner_starts(runner: "DeviceRunner") -> Check:
    if runner.transport.runner_kind == "qnn-net-run":
        return Check("runner", True, "qnn-net-run device: the SDK is pushed and checked at its first run")
    try:
        info = runner.self_check()
    except HarnessError as e:
        return Check("runner", False, f"the device runner does not start: {str(e).splitlines()[0]}")
    if not info.get("qnn_ep"):
        return Check("runner", False, f"the device runner started but the QNN execution provider is missing "
                                      f"({info.get('error') or 'pip install onnxruntime-qnn on the device'})")
    served = f", persistent (pid {info['pid']})" if info.get("pid") else ""
    return Check("runner", True, f"runner {info.get('runner_version')}{served}, onnxruntime {info.get('onnxruntime')}, "
                                 f"onnxruntime-qnn {info.get('onnxruntime_qnn')} on {info.get('machine')}")


def _thermal(transport) -> Check:  # type: ignore[no-untyped-def]
    if transport.platform == "android":
        try:
            out = transport.read_command(["dumpsys", "thermalservice"], timeout_s=30.0).stdout
        except TransportError:
            out = ""
        match = _STATUS.search(out)
        if match:
            status = int(match.group(1))
            return Check("thermal", status < SEVERE_STATUS, f"Android thermal status {status}"
                         + ("" if status < SEVERE_STATUS else " (SEVERE or worse: let it cool down)"))
    temps = read_temps(transport)
    if not temps:
        return Check("thermal", True, "no thermal status or zones to read")
    zone = max(temps, key=temps.get)
    ok = temps[zone] < SEVERE_TEMP_C
    return Check("thermal", ok, f"hottest zone {zone} at {temps[zone]:.1f} °C"
                 + ("" if ok else f" (>= {SEVERE_TEMP_C:g} °C: let it cool down)"))
