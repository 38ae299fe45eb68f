"""The shell-based transports' shared half (adb and SSH): remote command lines built with shlex,
batched hash checks, tar-stream pulls, retries with backoff, and the session markers that keep one
session's cleanup from deleting a work directory another live session still uses."""

from __future__ import annotations

import abc
import io
import logging
import os
import posixpath
import shlex
import socket
import tarfile
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

from harness.errors import (ConfigError, DeviceTimeoutError, TransientTransportError,
                            TransportError)
from harness.transports.retry import Backoff, retry_call

if TYPE_CHECKING:
    from harness.devices import DeviceSpec, SocSpec

T = TypeVar("T")
logger = logging.getLogger(__name__)

from harness.transports.base import CommandResult, RunnerStream, Transport



class CommandInterrupted(TransientTransportError):
    """The connection dropped while a command was running: its result is unknown."""


class ShellTransport(Transport):
    """A device reached through a remote POSIX shell (adb, SSH).

    A command is sent as ``cd <workdir>/<cwd> && <shlex.join(argv)>``: every argument is quoted.
    Connection-level failures (TransientTransportError) are retried with backoff after a
    reconnect; once the retries are spent the device is lost. A command that runs past its
    timeout is followed by a short ``true`` probe: a device that does not answer it is lost.
    A command is never re-run after its connection dropped mid-way (it may have had effects).
    """

    backoff: Backoff = Backoff()
    probe_timeout_s: float = 10.0
    io_timeout_s: float = 300.0
    max_command_bytes: int = 32_000

    def __init__(self, device: "DeviceSpec", soc: "SocSpec", workdir: str) -> None:
        super().__init__(device, soc)
        self.workdir = check_workdir(device.id, workdir)
        # Hashes of work-directory files this transport pushed or checked, so a later push of the same
        # content costs no remote command. remove()/cleanup() forget what they delete; a pushed file altered
        # behind the transport's back is noticed by verify_pushed() (called when the device fails to load it).
        self._known_hashes: dict[str, str] = {}
        self._known_lock = threading.Lock()
        self.session_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    # ---------------------------------------------------------------- what implementations provide

    @abc.abstractmethod
    def _exec_bytes(self, command: str, timeout_s: float) -> tuple[int, bytes, str]:
        """Run a shell command line; return (rc, stdout bytes, stderr text).

        Raises TransientTransportError when it could not be started, CommandInterrupted when the
        connection dropped while it ran, DeviceTimeoutError past timeout_s (having stopped it).
        """

    def _exec(self, command: str, timeout_s: float) -> tuple[int, str, str]:
        """Run a shell command line; return (rc, stdout, stderr) as text (see _exec_bytes)."""
        rc, out, err = self._exec_bytes(command, timeout_s)
        return rc, out.decode(errors="replace"), err

    def _open_stream(self, command: str) -> RunnerStream:
        """Start a shell command line as a kept process; return its stream (TransientTransportError when it
        could not be started)."""
        raise TransportError(f"device {self.device_id} cannot keep a process running", device=self.device_id)

    @abc.abstractmethod
    def _reconnect(self) -> None:
        """Drop and re-open the connection; raise TransientTransportError when that fails."""

    @abc.abstractmethod
    def _send_files(self, pairs: list[tuple[Path, str]]) -> None:
        """Copy (local file, absolute device path) pairs, creating parents and keeping the exec bit."""

    @abc.abstractmethod
    def _receive(self, remote_abs: str, local: Path) -> None:
        """Copy an absolute device file or tree to local; raise TransportError when it is absent."""

    # ---------------------------------------------------------------- paths and command lines

    def remote_path(self, remote: str) -> str:
        """Return the absolute device path of a path relative to the work directory."""
        rel = posixpath.normpath(remote or ".")
        if rel.startswith("/") or rel == ".." or rel.startswith("../"):
            raise TransportError(f"remote path '{remote}' must be relative to the work directory "
                                 "and must not contain '..'", device=self.device_id)
        return self.workdir if rel == "." else posixpath.join(self.workdir, rel)

    def command_line(self, argv: list[str], cwd: str = ".") -> str:
        """Return the quoted shell command line that runs argv in cwd (relative to the work dir)."""
        if not argv:
            raise TransportError("empty command", device=self.device_id)
        line = f"cd {shlex.quote(self.remote_path(cwd))} && {shlex.join(argv)}"
        if len(line.encode()) > 60_000:
            raise TransportError(f"command line of {len(line)} bytes is too long for the device shell",
                                 device=self.device_id, argv=argv[:5])
        return line

    # ---------------------------------------------------------------- fault handling

    def _retrying(self, fn: Callable[[], T], what: str, argv: list[str] | None = None) -> T:
        """Return fn(), retrying transient errors after reconnecting; a device still gone is lost."""
        self._check_alive()
        try:
            return retry_call(fn, backoff=self.backoff, retry_on=(TransientTransportError,),
                              on_retry=lambda _attempt, _e: self._reconnect(), what=f"[{self.device_id}] {what}")
        except TransientTransportError as e:
            raise self._lose(f"disconnected ({what} failed {self.backoff.attempts} times, last: {_short(e)})",
                             argv=argv) from e

    def _connect_first(self, connect: Callable[[], None], where: str) -> None:
        """Open the first connection, retrying transient failures; raise TransportError naming where."""
        try:
            retry_call(connect, backoff=self.backoff, retry_on=(TransientTransportError,),
                       what=f"[{self.device_id}] connecting to {where}")
        except TransientTransportError as e:
            raise TransportError(f"cannot connect to {where} after {self.backoff.attempts} tries: {_short(e)}",
                                 device=self.device_id) from None

    def _timed_out(self, e: DeviceTimeoutError, argv: list[str]) -> TransportError:
        """Return the error for a timeout: DeviceLostError when the device no longer answers."""
        try:
            rc, _out, _err = self._exec("true", self.probe_timeout_s)
            if rc == 0:
                return e
            reason = f"the probe `true` exited with {rc}"
        except TransportError as probe_error:
            reason = f"it did not answer a probe within {self.probe_timeout_s:g} s ({_short(probe_error)})"
        return self._lose(f"stopped answering: {_short(e)}, and {reason}", argv=argv, stderr=e.stderr)

    def _guarded(self, fn: Callable[[], T], what: str, argv: list[str]) -> T:
        """Run an idempotent operation with retries and the timeout probe."""
        start = time.monotonic()
        try:
            return self._retrying(fn, what, argv)
        except DeviceTimeoutError as e:
            raise self._timed_out(e, argv) from e
        finally:
            logger.debug("[%s] %.3f s %s", self.device_id, time.monotonic() - start, what)

    # ---------------------------------------------------------------- Transport

    def run(self, argv: list[str], timeout_s: float, cwd: str = ".") -> CommandResult:
        argv = [str(a) for a in argv]
        return self._run_line(self.command_line(argv, cwd), argv, timeout_s)

    def _run_line(self, command: str, argv: list[str], timeout_s: float) -> CommandResult:
        """Run a prepared command line with the retry, timeout-probe and dropped-connection rules."""
        start = time.monotonic()

        def once() -> tuple[int, str, str] | CommandInterrupted:
            try:
                return self._exec(command, timeout_s)
            except CommandInterrupted as e:  # not retried: the command may have had effects
                return e

        try:
            outcome = self._retrying(once, f"starting {argv[0]}", argv)
        except DeviceTimeoutError as e:
            err = self._timed_out(e, argv)
            if err is e:
                raise DeviceTimeoutError(f"command timed out after {timeout_s:g} s: {shlex.join(argv[:4])}...",
                                         device=self.device_id, argv=argv, stderr=e.stderr) from None
            raise err from e
        if isinstance(outcome, CommandInterrupted):
            self._retrying(self._reconnect, "reconnecting", argv)
            raise TransportError(f"the connection dropped while `{shlex.join(argv[:4])}` ran; the device "
                                 "answers again but the command's result is unknown: re-run the step",
                                 device=self.device_id, argv=argv) from outcome
        rc, out, err_text = outcome
        duration_s = time.monotonic() - start
        logger.debug("[%s] %.3f s rc=%d %s", self.device_id, duration_s, rc, shlex.join(argv)[:200])
        return CommandResult(argv, rc, out, err_text, duration_s)

    def open_stream(self, argv: list[str], cwd: str = ".") -> RunnerStream:
        """Start argv in cwd as a kept process (its shell leads a process group; close() kills that group),
        with the retries of a command start."""
        argv = [str(a) for a in argv]
        command = with_pid_marker(self.command_line(argv, cwd))
        return self._retrying(lambda: self._open_stream(command), f"starting {argv[0]}", argv)

    def timeout_error(self, error: DeviceTimeoutError, argv: list[str]) -> TransportError:
        return self._timed_out(error, argv)

    def read_command(self, argv: list[str], timeout_s: float) -> CommandResult:
        self._check_alive()
        start = time.monotonic()
        try:
            rc, out, err = self._exec(self.command_line([str(a) for a in argv]), timeout_s)
        except DeviceTimeoutError:
            raise
        except TransientTransportError as e:
            raise TransportError(f"cannot read from device: {_short(e)}", device=self.device_id, argv=argv) from e
        return CommandResult(list(argv), rc, out, err, time.monotonic() - start)

    def _check(self, argv: list[str], timeout_s: float, ok: tuple[int, ...] = (0,)) -> CommandResult:
        result = self.run(argv, timeout_s=timeout_s)
        if result.rc not in ok:
            raise TransportError(f"`{shlex.join(argv[:4])}` failed on the device", device=self.device_id,
                                 argv=argv, rc=result.rc, stdout=result.stdout, stderr=result.stderr)
        return result

    def _push_file(self, local: Path, remote: str) -> None:
        self._push_files([(Path(local), remote)])

    def _push_files(self, pairs: list[tuple[Path, str]]) -> None:
        absolute = [(src, self.remote_path(dst)) for src, dst in pairs]
        self._guarded(lambda: self._send_files(absolute), f"pushing {len(pairs)} file(s)",
                      ["push", *(dst for _, dst in pairs[:3])])

    def pull(self, remote: str, local: Path) -> None:
        remote_abs = self.remote_path(remote)
        self._guarded(lambda: self._pull_now(remote_abs, Path(local)), f"pulling {remote}", ["pull", remote])

    def _pull_now(self, remote_abs: str, local: Path) -> None:
        """Pull a directory as one tar stream (one command, however many files); files one by one."""
        line = (f"if [ -d {shlex.quote(remote_abs)} ]; then cd {shlex.quote(remote_abs)} && exec tar -cf - .; "
                f"elif [ -e {shlex.quote(remote_abs)} ]; then exit 3; else exit 4; fi")
        rc, data, err = self._exec_bytes(line, self.io_timeout_s)
        if rc == 4:
            raise TransportError(f"no such file on device: {remote_abs}", device=self.device_id)
        if rc != 0 or not data:  # a file (3), or no tar on the device (127)
            self._receive(remote_abs, local)
            return
        local.mkdir(parents=True, exist_ok=True)
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
                tar.extractall(local, filter="data")
        except (tarfile.TarError, OSError) as e:
            raise TransportError(f"pulling {remote_abs}: bad tar stream from the device ({e})",
                                 device=self.device_id, stderr=err) from None

    def sha256(self, remote: str) -> str | None:
        return self.sha256_many([remote])[remote]

    def _remember(self, hashes: dict[str, str]) -> None:
        with self._known_lock:
            self._known_hashes.update({posixpath.normpath(k): v for k, v in hashes.items()})

    def _remembered(self, remotes: list[str]) -> dict[str, str]:
        rels = [posixpath.normpath(r) for r in remotes]
        with self._known_lock:
            return {k: v for k, v in self._known_hashes.items() if any(_is_under(k, rel) for rel in rels)}

    def _forget(self, remote: str) -> None:
        rel = posixpath.normpath(remote)
        with self._known_lock:
            for key in [k for k in self._known_hashes if _is_under(k, rel)]:
                del self._known_hashes[key]

    def sha256_many(self, remotes: list[str]) -> dict[str, str | None]:
        """Return {remote: SHA-256 or None}: one `sha256sum` command per batch of paths not known yet."""
        found: dict[str, str | None] = {r: None for r in remotes}
        rels = [posixpath.normpath(r) for r in remotes]
        for r in rels:
            self.remote_path(r)  # validates
        with self._known_lock:
            known = {rel: self._known_hashes[rel] for rel in rels if rel in self._known_hashes}
        for original, rel in zip(remotes, rels):
            if rel in known:
                found[original] = known[rel]
        unknown = sorted({rel for rel in rels if rel not in known})
        for batch in _batches(unknown, self.max_command_bytes):
            result = self.run(["sha256sum", "--", *batch], timeout_s=self.io_timeout_s)
            if result.rc == 127:  # no sha256sum on the device
                result = self._hash_with_python(batch)
            elif result.rc not in (0, 1):  # 1: some files are absent
                raise TransportError("sha256sum failed on the device", device=self.device_id,
                                     argv=result.argv[:4], rc=result.rc, stderr=result.stderr)
            hashes = parse_sha256sum(result.stdout)
            self._remember({rel: hashes[rel] for rel in batch if rel in hashes})
            for original, rel in zip(remotes, rels):
                if rel in hashes:
                    found[original] = hashes[rel]
        return found

    def _hash_with_python(self, batch: list[str]) -> CommandResult:
        """Hash with the device's Python when it has no sha256sum (output in sha256sum's format)."""
        script = ("import hashlib,sys\nfor p in sys.argv[1:]:\n try: d=hashlib.sha256(open(p,'rb').read())"
                  ".hexdigest()\n except OSError: continue\n print(d+'  '+p)")
        try:
            python = self.python
        except ConfigError as e:
            raise TransportError(f"the device has no working sha256sum and no Python to hash files: {e}",
                                 device=self.device_id) from None
        return self._check([*python, "-c", script, *batch], timeout_s=self.io_timeout_s)

    def remove(self, remote: str) -> None:
        self._forget(remote)
        target = self.remote_path(remote)
        argv = ["rm", "-rf", "--", target]
        if target == self.workdir:  # empty it, keeping the session markers
            argv = ["find", target, "-mindepth", "1", "-maxdepth", "1", "!", "-name", SESSIONS_DIR,
                    "-exec", "rm", "-rf", "--", "{}", "+"]
        self._check(argv, timeout_s=self.io_timeout_s)

    def cleanup(self) -> None:
        """Delete the work directory from the device, unless another harness session still uses it.

        Each session marks itself in <workdir>/.sessions/ on connect (see make_workdir), so two
        sessions (e.g. pytest-xdist workers) on one device do not delete each other's files. Markers
        left by dead processes of this host (a crash, --keep-device-files) do not count.
        """
        self._forget(".")
        sessions = posixpath.join(self.workdir, SESSIONS_DIR)
        listing = self._run_line(f"ls -A -- {shlex.quote(sessions)} 2>/dev/null; true", ["ls", sessions],
                                 self.probe_timeout_s)
        others = [n for n in listing.stdout.split() if n != self.session_id and not _stale_marker(n)]
        if others:
            gone = [posixpath.join(sessions, n) for n in [self.session_id, *(set(listing.stdout.split()) - set(others))]]
            self._run_line(shlex.join(["rm", "-f", "--", *gone]), ["rm", "-f", *gone], self.io_timeout_s)
            logger.info("[%s] %d other session(s) still use %s: left in place", self.device_id, len(others),
                        self.workdir)
            return
        argv = ["rm", "-rf", "--", self.workdir]
        result = self._run_line(f"cd / && {shlex.join(argv)}", argv, self.io_timeout_s)
        if result.rc != 0:
            raise TransportError("cannot delete the work directory", device=self.device_id, argv=argv,
                                 rc=result.rc, stderr=result.stderr)

    def make_workdir(self) -> None:
        """Create the work directory on the device and mark this session as using it."""
        sessions = posixpath.join(self.workdir, SESSIONS_DIR)
        argv = ["mkdir", "-p", "--", self.workdir, sessions]
        line = f"{shlex.join(argv)} && : > {shlex.quote(posixpath.join(sessions, self.session_id))}"
        result = self._run_line(line, argv, self.probe_timeout_s)
        if result.rc != 0:
            raise TransportError(f"cannot create the work directory {self.workdir}", device=self.device_id,
                                 argv=argv, rc=result.rc, stderr=result.stderr)


class ShellStream(RunnerStream):
    """A kept process started through a shell with with_pid_marker: the shell's pid (its process group) is
    taken from stderr's first line; close() releases the connection and kills that group."""

    def __init__(self, transport: ShellTransport) -> None:
        super().__init__(transport.device_id)
        self.transport = transport
        self._head: bytearray | None = bytearray()  # stderr until the pid line is complete

    def _note_stderr(self, data: bytes) -> None:
        if self._head is None:
            super()._note_stderr(data)
            return
        self._head += data
        if b"\n" in self._head or not PID_MARK.encode().startswith(bytes(self._head[:len(PID_MARK)])):
            self.pid, rest = split_pid(self._head.decode(errors="replace"))
            self._head = None
            super()._note_stderr(rest.encode())

    @abc.abstractmethod
    def _release(self) -> None:
        """Close the connection's channel or stream."""

    def close(self) -> None:
        self._release()
        if self.pid is not None:
            self.transport._kill(self.pid)
            self.pid = None


SESSIONS_DIR = ".sessions"


def _stale_marker(name: str) -> bool:
    """Return whether a session marker `<host>-<pid>-<random>` belongs to a dead process of this host."""
    host, _, pid_text = name.rpartition("-")[0].rpartition("-")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


PID_MARK = "harness-pid:"


def with_pid_marker(command: str) -> str:
    """Return command prefixed so that its shell's pid is the first line of stderr."""
    return f"printf '{PID_MARK}%s\\n' \"$$\" >&2; {command}"


def split_pid(stderr: str) -> tuple[int | None, str]:
    """Return (pid from with_pid_marker's line, stderr without that line)."""
    if stderr.startswith(PID_MARK):
        line, _, rest = stderr.partition("\n")
        value = line[len(PID_MARK):].strip()
        return (int(value) if value.isdigit() else None), rest
    return None, stderr


def kill_line(pid: int) -> str:
    """Return a shell line that stops process group pid (TERM, then KILL after 2 s) without waiting."""
    return (f"kill -TERM -- -{pid} 2>/dev/null || kill -TERM {pid} 2>/dev/null; "
            f"(sleep 2; kill -KILL -- -{pid} || kill -KILL {pid}) >/dev/null 2>&1 </dev/null &")


def check_workdir(device_id: str, workdir: str) -> str:
    """Return workdir normalised; raise ConfigError unless it is an absolute path at least two deep.

    The work directory is deleted at the end of a session, so '/', '/tmp' or '~' are refused.
    """
    norm = posixpath.normpath(workdir)
    parts = [p for p in norm.split("/") if p]
    if not norm.startswith("/") or len(parts) < 2 or ".." in parts:
        raise ConfigError(f"device '{device_id}': workdir '{workdir}' must be an absolute path at least two "
                          "levels deep (e.g. /data/local/tmp/harness): it is deleted at the end of the session")
    return norm


def parse_sha256sum(stdout: str) -> dict[str, str]:
    """Return {path: hex digest} from `sha256sum` output (GNU's backslash-escaped names included)."""
    hashes: dict[str, str] = {}
    for line in stdout.splitlines():
        escaped = line.startswith("\\")
        body = line[1:] if escaped else line
        digest, sep, name = body[:64], body[64:66], body[66:]
        if len(digest) != 64 or sep not in ("  ", " *"):
            continue
        if escaped:
            name = name.replace("\\\\", "\0").replace("\\n", "\n").replace("\0", "\\")
        hashes[posixpath.normpath(name)] = digest.lower()
    return hashes


def _batches(items: list[str], max_bytes: int) -> list[list[str]]:
    batches: list[list[str]] = []
    current: list[str] = []
    size = 0
    for item in items:
        quoted = len(shlex.quote(item)) + 1
        if current and size + quoted > max_bytes:
            batches.append(current)
            current, size = [], 0
        current.append(item)
        size += quoted
    if current:
        batches.append(current)
    return batches


def _short(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _is_under(path: str, root: str) -> bool:
    """Return whether the normalised remote path is root or lies under it ('.': the whole work directory)."""
    return root == "." or path == root or path.startswith(root + "/")
