"""The transport interface every device backend implements (emulator, adb, SSH).

Remote paths are POSIX strings relative to the transport's work directory on the device.
Commands are argument lists, never shell strings; every command has a timeout.

Faults: a transport that loses its device for good (disconnected after the retries, or not
answering a probe after a timeout) raises DeviceLostError, remembers why in ``lost_reason`` and
refuses every later call with "device X was taken out of the session after: ...".
"""

from __future__ import annotations

import abc
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ContextManager

from harness.errors import DeviceLostError, DeviceTimeoutError, TransportError
from harness.files import content_digest

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


class RunnerStream(abc.ABC):
    """A process kept running on the device (Transport.open_stream): lines to its stdin, lines from its stdout;
    its stderr is kept (the last STDERR_KEEP_BYTES) for error messages. close() kills it and its children."""

    STDERR_KEEP_BYTES = 64 * 1024

    def __init__(self, device_id: str) -> None:
        self.device_id = device_id
        self.pid: int | None = None  # the device-side process (or its shell) leading its process group
        self._out = bytearray()
        self._err = bytearray()

    def write_line(self, line: str) -> None:
        """Send one line to the process's stdin; raise EOFError when it has gone."""
        self._send((line + "\n").encode())

    def read_line(self, timeout_s: float) -> str | None:
        """Return the next line of its stdout (without the newline), None at its end; raise DeviceTimeoutError
        when none is complete within timeout_s."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._out:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeviceTimeoutError(f"no answer from the device process within {timeout_s:g} s",
                                         device=self.device_id, stderr=self.stderr())
            chunk = self._recv(remaining)
            if chunk == b"":
                return None
            if chunk:
                self._out += chunk
        line, _, rest = bytes(self._out).partition(b"\n")
        self._out = bytearray(rest)
        return line.decode(errors="replace")

    def stderr(self, clear: bool = False) -> str:
        """Return the stderr kept so far (and forget it with clear)."""
        text = self._err.decode(errors="replace")
        if clear:
            self._err.clear()
        return text

    def _note_stderr(self, data: bytes) -> None:
        self._err += data
        del self._err[:-self.STDERR_KEEP_BYTES]

    @abc.abstractmethod
    def _send(self, data: bytes) -> None:
        """Write data to the process's stdin; raise EOFError when it has gone."""

    @abc.abstractmethod
    def _recv(self, timeout_s: float) -> bytes | None:
        """Return stdout bytes (b"" at its end, None when none came within timeout_s), keeping stderr bytes."""

    @abc.abstractmethod
    def alive(self) -> bool:
        """Return whether the process may still answer (its output has not ended)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Kill the process and its children (if still running) and release the stream."""


class Transport(abc.ABC):
    """A connection to one device."""

    platform: str = "android"
    """'android' or 'linux': decides how the SoC is detected and the telemetry defaults."""

    telemetry_source: str = "measured"
    """'emulated' or 'measured': the label on telemetry read from this device."""

    def __init__(self, device: "DeviceSpec", soc: "SocSpec") -> None:
        self.device = device
        self.soc = soc
        self.lost_reason: str | None = None

    @property
    def device_id(self) -> str:
        """The device's id from devices.yaml."""
        return self.device.id

    @property
    @abc.abstractmethod
    def python(self) -> list[str]:
        """The argv prefix that starts the device-side Python interpreter."""

    @property
    def runner_kind(self) -> str:
        """Return which runner runs models here: 'python' (the harness's device_runner.py under
        `python`) or 'qnn-net-run' (Qualcomm's, on context binaries only; adb devices without
        `python:`)."""
        return "python"

    @abc.abstractmethod
    def run(self, argv: list[str], timeout_s: float, cwd: str = ".") -> CommandResult:
        """Run argv on the device (cwd relative to the work directory); return its result.

        Raises DeviceTimeoutError past timeout_s, TransportError when the device cannot be reached.
        A non-zero exit code is returned, not raised.
        """

    @property
    def can_stream(self) -> bool:
        """Return whether open_stream can keep a process running on this device."""
        return False

    def open_stream(self, argv: list[str], cwd: str = ".") -> RunnerStream:
        """Start argv on the device as a kept process (cwd relative to the work directory); return its stream.

        Raises TransportError where the device cannot keep one, or cannot be reached.
        """
        raise TransportError(f"device {self.device_id} cannot keep a process running", device=self.device_id)

    def request_scope(self) -> ContextManager[None]:
        """Return the context a request to a kept process runs in: it checks the device is still in the
        session; an emulated device counts it as load (as it does a run())."""
        self._check_alive()
        return contextlib.nullcontext()

    def device_args(self, argv: list[str]) -> list[str]:
        """Return argv as the device's commands see it (the emulator maps /sys/ paths into its sandbox)."""
        return [str(a) for a in argv]

    def timeout_error(self, error: DeviceTimeoutError, argv: list[str]) -> TransportError:
        """Return the error to raise for a command past its timeout (DeviceLostError where the device no
        longer answers a probe)."""
        return error

    def read_command(self, argv: list[str], timeout_s: float) -> CommandResult:
        """Run a short read-only command (telemetry, identification) and return its result.

        Unlike run(): no retries, a failure never takes the device out of the session, and an
        emulated device does not count it as load.
        """
        return self.run(argv, timeout_s=timeout_s)

    @abc.abstractmethod
    def _push_file(self, local: Path, remote: str) -> None:
        """Copy one local file to remote, creating parent directories."""

    def _push_files(self, pairs: list[tuple[Path, str]]) -> None:
        """Copy (local file, remote path) pairs; transports batch this where they can."""
        for src, dst in pairs:
            self._push_file(src, dst)

    @abc.abstractmethod
    def pull(self, remote: str, local: Path) -> None:
        """Copy a remote file or directory tree to local."""

    @abc.abstractmethod
    def sha256(self, remote: str) -> str | None:
        """Return the SHA-256 of a remote file, or None when it does not exist."""

    def sha256_many(self, remotes: list[str]) -> dict[str, str | None]:
        """Return {remote: SHA-256 or None when absent}; remote transports do this in one command."""
        return {r: self.sha256(r) for r in remotes}

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
        if not local.exists():
            raise TransportError(f"cannot push {local}: no such local file", device=self.device_id)
        pairs = ([(local, remote)] if local.is_file() else
                 [(p, f"{remote}/{p.relative_to(local).as_posix()}") for p in sorted(local.rglob("*")) if p.is_file()])
        remote_hashes = self.sha256_many([dst for _, dst in pairs]) if pairs else {}
        local_hashes = {dst: content_digest(src) for src, dst in pairs}
        todo = [(src, dst) for src, dst in pairs if remote_hashes.get(dst) != local_hashes[dst]]
        if todo:
            self._push_files(todo)
            self._remember({dst: local_hashes[dst] for _, dst in todo})
        return PushResult(len(todo), len(pairs) - len(todo), sum(src.stat().st_size for src, _ in todo))

    def _remember(self, hashes: dict[str, str]) -> None:
        """Note the hashes of files just pushed (remote transports skip re-checking them)."""

    def _remembered(self, remotes: list[str]) -> dict[str, str]:
        """Return the remembered hashes of pushed files at or under remotes (transports that remember none: {})."""
        return {}

    def _forget(self, remote: str) -> None:
        """Drop what is remembered about remote, a file or a tree (transports that remember nothing: no-op)."""

    def verify_pushed(self, remotes: list[str]) -> list[str]:
        """Return the pushed files at or under remotes whose content on the device no longer matches what was
        pushed (altered or deleted there), forgetting their remembered hashes so the next push re-sends them.

        Call it when the device fails to load a pushed model: the files a push skipped on a remembered hash
        are hashed on the device again. A transport that remembers nothing re-hashes on every push anyway.
        """
        expected = self._remembered(remotes)
        for remote in remotes:
            self._forget(remote)
        now = self.sha256_many(sorted(expected)) if expected else {}
        return sorted(r for r, digest in expected.items() if now.get(r) != digest)

    def cleanup(self) -> None:
        """Remove the harness's work directory from the device."""
        self.remove(".")

    def close(self) -> None:
        """Release the connection."""

    def _check_alive(self) -> None:
        """Raise DeviceLostError when this device was already taken out of the session."""
        if self.lost_reason is not None:
            raise DeviceLostError(f"device {self.device_id} was taken out of the session after: {self.lost_reason}",
                                  device=self.device_id)

    def _lose(self, reason: str, argv: list[str] | None = None, stderr: str = "") -> DeviceLostError:
        """Mark the device lost for the rest of the session; return the error to raise."""
        if self.lost_reason is None:
            self.lost_reason = reason
        return DeviceLostError(f"device {self.device_id} {reason}; it is taken out of this session",
                               device=self.device_id, argv=argv, stderr=stderr)

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
