"""Per-device file locks (filelock) under a host-wide directory, held by a test while it uses the device, so two
measurements never share a device, across pytest-xdist workers and across separate pytest processes on one host."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from filelock import FileLock, Timeout

from harness.errors import FarmError


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
