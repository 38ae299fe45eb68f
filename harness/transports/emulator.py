"""The local emulator backend: a sandbox directory stands for the device's filesystem.

The device-side runner is executed as a separate process inside the sandbox, exactly as it is
over adb or SSH; only the wire differs.

Like the emulated adb device, the sandbox holds sysfs-shaped thermal and battery files
(``<sandbox>/sys/class/...``) and a ``dumpsys`` (``<sandbox>/system/bin``, first on every command's
PATH: the platform is "android") driven by the SoC's thermal model (harness.emulator.thermal).
Every command gets ``HARNESS_EMULATED_NPU_DIR``, where the device runner reports its NPU busy
time; that, not the mere running of a command, heats the model. While a command runs the files
are refreshed in the background; a telemetry read refreshes them first. Command arguments that
are device-absolute ``/sys/`` paths are mapped into the sandbox, so telemetry reads the same
paths as on a phone. open_stream keeps a process (the persistent device runner) in its own process group
with a command's environment; each request to it counts as load (request_scope), as a run() does.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import time
import uuid
import weakref
from pathlib import Path, PurePosixPath
from typing import Iterator

from harness.emulator.thermal import EmulatedSensors, ThermalParams
from harness.errors import DeviceTimeoutError, TransportError
from harness.files import copy_atomically, link_or_copy, sha256_file
from harness.shutdown import GROUPS, kill_group, pid_alive, run_in_group
from harness.transports.base import CommandResult, RunnerStream, Transport

SYSFS_PREFIX = "/sys/"
SYSTEM_BIN = "system/bin"


EMULATOR_DIR_ENV = "HARNESS_EMULATOR_DIR"


def emulator_root(cache_root: Path) -> Path:
    """Return the directory holding the emulated devices' sandboxes: $HARNESS_EMULATOR_DIR, else <cache>/emulator.
    Two runs that share an artifact cache but set different directories have different emulated devices (own
    filesystems, thermal state and locks under their own HARNESS_LOCK_DIR), the way two test workers do."""
    return Path(os.environ.get(EMULATOR_DIR_ENV) or Path(cache_root) / "emulator").expanduser()


class EmulatorTransport(Transport):
    """A device whose filesystem is a local directory and whose CPU is the host's."""

    platform = "android"
    telemetry_source = "emulated"

    def __init__(self, device, soc, sandbox_root: Path) -> None:
        super().__init__(device, soc)
        root = Path(device.sandbox).expanduser() if device.sandbox else Path(sandbox_root) / device.id
        self.root = root.resolve()
        self.workdir = self.root / "data" / "local" / "tmp" / "harness"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sensors = EmulatedSensors(self.root, ThermalParams.from_spec(getattr(soc, "thermal", None)))
        self._session_marker = self.workdir / ".sessions" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._session_marker.parent.mkdir(exist_ok=True)
        self._session_marker.touch()

    def _device_arg(self, arg: str) -> str:
        """Map a device-absolute /sys/ path into the sandbox; leave other arguments alone."""
        return str(self.root / arg.lstrip("/")) if arg.startswith(SYSFS_PREFIX) else arg

    @property
    def python(self) -> list[str]:
        return [sys.executable]

    def _local(self, remote: str) -> Path:
        rel = PurePosixPath(remote)
        if rel.is_absolute() or ".." in rel.parts:
            raise TransportError(f"remote path '{remote}' must be relative to the work directory "
                                 "and must not contain '..'", device=self.device_id)
        return self.workdir / rel

    def run(self, argv: list[str], timeout_s: float, cwd: str = ".") -> CommandResult:
        self.sensors.refresh()  # the throttle file is current when the runner starts
        with self.sensors.load():
            return self._exec(argv, timeout_s, cwd)

    def read_command(self, argv: list[str], timeout_s: float) -> CommandResult:
        self.sensors.refresh()
        return self._exec(argv, timeout_s, ".")

    def device_args(self, argv: list[str]) -> list[str]:
        return [self._device_arg(str(a)) for a in argv]

    can_stream = True

    def open_stream(self, argv: list[str], cwd: str = ".") -> RunnerStream:
        """Start argv as a local process in its own process group, with a command's environment and cwd."""
        self._check_alive()
        argv = self.device_args(argv)
        try:
            proc = subprocess.Popen(argv, cwd=self._local(cwd), env=self._environment(), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise TransportError(f"cannot start {argv[0]}: {e.strerror}", device=self.device_id,
                                 argv=argv) from None
        return _LocalStream(proc, self.device_id)

    @contextlib.contextmanager
    def request_scope(self) -> Iterator[None]:
        """A request counts as load for the thermal model, as a run() does (the throttle file current first)."""
        self._check_alive()
        self.sensors.refresh()
        with self.sensors.load():
            yield

    def _exec(self, argv: list[str], timeout_s: float, cwd: str) -> CommandResult:
        argv = self.device_args(argv)
        env = self._environment()
        start = time.monotonic()
        try:
            proc = run_in_group(argv, timeout_s, cwd=self._local(cwd), text=True, env=env,
                                stdin=subprocess.DEVNULL)  # interrupted: its whole process group is killed
        except subprocess.TimeoutExpired as e:
            raise DeviceTimeoutError(f"command timed out after {timeout_s:g} s: {argv[:3]}...",
                                     device=self.device_id, argv=argv,
                                     stderr=(e.stderr or b"").decode(errors="replace")
                                     if isinstance(e.stderr, bytes) else (e.stderr or "")) from None
        except OSError as e:
            raise TransportError(f"cannot start {argv[0]}: {e.strerror}", device=self.device_id,
                                 argv=argv) from None
        return CommandResult(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)

    def _environment(self) -> dict[str, str]:
        """Return the environment of a device command: the host's, the device's ids, the NPU directory,
        and ``<sandbox>/system/bin`` (dumpsys) first on PATH."""
        path = os.pathsep.join([str(self.root / SYSTEM_BIN), os.environ.get("PATH", os.defpath)])
        return {**os.environ, "HARNESS_DEVICE_ID": self.device_id, "HARNESS_SOC": self.soc.id,
                **self.sensors.environment(), "PATH": path}

    def _push_file(self, local: Path, remote: str) -> None:
        copy_atomically(local, self._local(remote))  # an interrupted copy leaves no partial file

    def pull(self, remote: str, local: Path) -> None:
        src = self._local(remote)
        if not src.exists():
            raise TransportError(f"no such file on device: {remote}", device=self.device_id)
        local = Path(local)
        if src.is_dir():
            shutil.copytree(src, local, dirs_exist_ok=True, copy_function=link_or_copy)
        else:
            local.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, local)

    def sha256(self, remote: str) -> str | None:
        p = self._local(remote)
        return sha256_file(p) if p.is_file() else None

    def cleanup(self) -> None:
        """Remove leftover jobs unless another session uses the sandbox; pushed models and data stay,
        as the sandbox lives in the cache."""
        self._session_marker.unlink(missing_ok=True)
        markers = self._session_marker.parent
        if markers.is_dir() and any(_alive(m.name.split("-")[0]) for m in markers.iterdir()):
            return
        self.remove("jobs")

    def remove(self, remote: str) -> None:
        p = self._local(remote)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink()
        if remote == ".":
            self.workdir.mkdir(parents=True, exist_ok=True)


class _LocalStream(RunnerStream):
    """A kept local process (its own process group, tracked for the signal handlers) with piped stdio."""

    def __init__(self, proc: subprocess.Popen, device_id: str) -> None:
        super().__init__(device_id)
        self.proc = proc
        self.pid = proc.pid
        self._ended = False
        GROUPS.add(proc.pid)
        # subprocess keeps a running Popen (and its pipes) alive: close stdin when this stream is dropped unclosed,
        # which ends the process (end of input)
        weakref.finalize(self, proc.stdin.close)

    def _send(self, data: bytes) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (OSError, ValueError) as e:
            raise EOFError(f"the process's stdin is closed ({e})") from None

    def _recv(self, timeout_s: float) -> bytes | None:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        deadline = time.monotonic() + timeout_s
        while True:
            watched = [out, err] if not self.proc.stderr.closed else [out]
            ready, _, _ = select.select(watched, [], [], max(0.0, deadline - time.monotonic()))
            if err in ready:
                data = os.read(err, 65536)
                if data:
                    self._note_stderr(data)
                else:
                    self.proc.stderr.close()
            if out in ready:
                data = os.read(out, 65536)
                self._ended = self._ended or not data
                return data
            if time.monotonic() >= deadline:
                return None

    def alive(self) -> bool:
        return not self._ended and self.proc.poll() is None

    def close(self) -> None:
        kill_group(self.proc.pid)
        self.proc.wait()
        GROUPS.discard(self.proc.pid)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._ended = True


def _alive(pid_text: str) -> bool:
    """Return whether the local process with this pid exists (a stale session marker's does not)."""
    return pid_text.isdigit() and pid_alive(int(pid_text))
