"""The transport interface every device backend implements (emulator, adb, SSH).

Remote paths are POSIX strings relative to the transport's work directory on the device.
Commands are argument lists, never shell strings; every command has a timeout.
"""

from __future__ import annotations

import abc
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.devices import DeviceSpec, SocSpec


@dataclass(frozen=True)
class CommandResult:
    """What a command on the device did."""

    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    duration_s: float


@dataclass(frozen=True)
class PushResult:
    """What a push transferred: files sent vs skipped because the device already had them."""

    files_sent: int
    files_skipped: int
    bytes_sent: int


def sha256_file(path: Path) -> str:
    """Return the hex SHA-256 of a local file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Transport(abc.ABC):
    """A connection to one device."""

    def __init__(self, device: "DeviceSpec", soc: "SocSpec") -> None:
        self.device = device
        self.soc = soc

    @property
    def device_id(self) -> str:
        """The device's id from devices.yaml."""
        return self.device.id

    @property
    @abc.abstractmethod
    def python(self) -> list[str]:
        """The argv prefix that starts the device-side Python interpreter."""

    @abc.abstractmethod
    def run(self, argv: list[str], timeout_s: float, cwd: str = ".") -> CommandResult:
        """Run argv on the device (cwd relative to the work directory); return its result.

        Raises DeviceTimeoutError past timeout_s, TransportError when the device cannot be reached.
        A non-zero exit code is returned, not raised.
        """

    @abc.abstractmethod
    def _push_file(self, local: Path, remote: str) -> None:
        """Copy one local file to remote, creating parent directories."""

    @abc.abstractmethod
    def pull(self, remote: str, local: Path) -> None:
        """Copy a remote file or directory tree to local."""

    @abc.abstractmethod
    def sha256(self, remote: str) -> str | None:
        """Return the SHA-256 of a remote file, or None when it does not exist."""

    @abc.abstractmethod
    def remove(self, remote: str) -> None:
        """Delete a remote file or directory tree (no error if absent)."""

    def exists(self, remote: str) -> bool:
        """Return whether a remote file exists."""
        return self.sha256(remote) is not None

    def push(self, local: Path, remote: str) -> PushResult:
        """Copy a local file or directory tree to remote, skipping files the device already has
        with the same content; return what was transferred."""
        local = Path(local)
        pairs = ([(local, remote)] if local.is_file() else
                 [(p, f"{remote}/{p.relative_to(local).as_posix()}") for p in sorted(local.rglob("*")) if p.is_file()])
        sent = skipped = nbytes = 0
        for src, dst in pairs:
            if self.sha256(dst) == sha256_file(src):
                skipped += 1
                continue
            self._push_file(src, dst)
            sent += 1
            nbytes += src.stat().st_size
        return PushResult(sent, skipped, nbytes)

    def cleanup(self) -> None:
        """Remove the harness's work directory from the device."""
        self.remove(".")

    def close(self) -> None:
        """Release the connection."""

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_transport(device: "DeviceSpec", soc: "SocSpec", sandbox_root: Path) -> Transport:
    """Return a connected transport for a device entry."""
    if device.transport == "emulator":
        from harness.transports.emulator import EmulatorTransport

        return EmulatorTransport(device, soc, sandbox_root)
    from harness.errors import ConfigError

    raise ConfigError(f"device '{device.id}': transport '{device.transport}' is not available in this version")
