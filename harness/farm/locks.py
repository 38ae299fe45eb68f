"""Per-device file locks (filelock) under a host-wide directory, held by a test while it uses the device, so two
measurements never share a device, across pytest-xdist workers and across separate pytest processes on one host.

Waiting is fair (first come, first served) and says who it waits for. For device D the directory holds:

* ``D.lock``: the file lock itself (the OS frees it when its process dies);
* ``D.queue/<time_ns>-<host>-<pid>-<nonce>``: one ticket per waiting process (JSON: who waits and for which test).
  A waiter tries the file lock only while its ticket is the oldest live one, so a holder that releases after a step
  and asks again goes behind the processes already waiting. A ticket whose process is gone (this host: no such pid;
  any host: not refreshed for STALE_TICKET_S) is removed by whoever sees it. A waiter removes its own ticket once it
  holds the lock, or when it gives up (timeout, interruption);
* ``D.holder.json``: who holds it (host, pid, user, run, test, since: UTC ISO time), written atomically once the lock
  is taken and removed before it is released. A waiter names the holder every NOTICE_EVERY_S (through the caller's
  ``progress`` function), and so does the FarmError of a wait past the timeout.

The run named in those records is the plugin's (harness.farm.identity.run_id: ``$HARNESS_RUN_ID``, a CI job's id or
a random one; pytest-xdist's workers take their controller's). ``$HARNESS_LOCK_LOG`` (a file path, for farm debugging): every hold appends one JSON
line to it (device, host, pid, run, test, asked_at, acquired_at, released_at: epoch seconds)."""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import re
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from harness.clock import now_iso
from harness.errors import FarmError
from harness.farm.identity import run_id
from harness.files import write_text_atomically
from harness.shutdown import pid_alive

POLL_S = 0.15  # how often a waiter looks at the queue and tries the lock
FIRST_NOTICE_S = 2.0  # a wait this long is reported through `progress`...
NOTICE_EVERY_S = 30.0  # ...and then again this often
HEARTBEAT_S = 5.0  # a waiter refreshes its ticket's mtime this often
STALE_TICKET_S = 60.0  # a ticket not refreshed this long belongs to a process that is gone (or stopped)

Progress = Callable[[str], None]
_TICKET = re.compile(r"(?P<ns>\d{20})-(?P<host>.+)-(?P<pid>\d+)-(?P<nonce>[0-9a-f]+)")


def default_lock_dir() -> Path:
    """Return the host-wide directory of device locks ($HARNESS_LOCK_DIR, else under the temp directory)."""
    return Path(os.environ.get("HARNESS_LOCK_DIR") or Path(tempfile.gettempdir()) / "snapdragon-harness-locks")


def _user() -> str:
    """Return the login name of this process's user, or "" when it has none."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def _safe(name: str) -> str:
    """Return name with every character but letters, digits, '_', '.' and '-' replaced by '_' (a file name)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _host() -> str:
    """Return this host's name as tickets and records carry it."""
    return _safe(socket.gethostname())


def _ordinal(n: int) -> str:
    """Return 1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st for n."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _local_time(iso: str) -> str:
    """Return the UTC ISO time iso as local HH:MM:SS (with the date when it is not today), or iso if unparsable."""
    try:
        at = dt.datetime.fromisoformat(iso).astimezone()
    except (TypeError, ValueError):
        return iso
    return at.strftime("%H:%M:%S" if at.date() == dt.date.today() else "%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True)
class Holder:
    """Who holds (or waits for) a device, as written beside its lock: a holder record or a queue ticket."""

    host: str
    pid: int
    user: str = ""
    run: str = ""
    test: str = ""
    since: str = ""  # UTC ISO time: when it took the lock (a ticket: when it asked)

    @classmethod
    def read(cls, path: Path) -> Holder | None:
        """Return the record in path, or None when there is none or it is not a record (a half-gone file)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(host=str(data["host"]), pid=int(data["pid"]), user=str(data.get("user", "")),
                       run=str(data.get("run", "")), test=str(data.get("test", "")), since=str(data.get("since", "")))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def alive(self) -> bool:
        """Return False when its process is known to be gone (this host, no such pid), else True."""
        return self.host != _host() or pid_alive(self.pid)

    def held_s(self) -> float:
        """Return the seconds since `since` (0 when unknown)."""
        try:
            return max(0.0, (dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(self.since)).total_seconds())
        except (TypeError, ValueError):
            return 0.0

    def describe(self) -> str:
        """Return e.g. 'ci-7/pid 1234 (user bob, run abc, test suites/test_04_ptq.py::test_ptq[...])'."""
        extra = ", ".join(f"{key} {value}" for key, value in
                          (("user", self.user), ("run", self.run), ("test", self.test)) if value)
        return f"{self.host}/pid {self.pid}" + (f" ({extra})" if extra else "")


@dataclass(frozen=True)
class LockPaths:
    """The files of one device's lock."""

    lock: Path
    holder: Path
    queue: Path


@dataclass
class _Held:
    """A lock this DeviceLocks holds: the file lock, how many acquires it answers, and the hold's times."""

    lock: FileLock
    record: Holder
    asked_at: float
    acquired_at: float
    count: int = 1


class DeviceHold:
    """One acquire of a device's lock: release() (or leaving a `with` block) gives it back, once."""

    def __init__(self, locks: DeviceLocks, device_id: str) -> None:
        self.locks, self.device_id, self._released = locks, device_id, False

    def release(self) -> None:
        """Give the hold back (a second call does nothing)."""
        if not self._released:
            self._released = True
            self.locks.release(self.device_id)

    def __enter__(self) -> DeviceHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class DeviceLocks:
    """One fair file lock per device id, shared by every process on this host that uses the same directory;
    reentrant within one DeviceLocks (a second acquire of a device it holds returns at once)."""

    def __init__(self, directory: Path | None = None, timeout_s: float = 1800.0, run: str | None = None,
                 log_path: Path | None = None) -> None:
        self.directory = Path(directory or default_lock_dir())
        self.timeout_s = timeout_s
        self.run_id = run_id() if run is None else run
        log = log_path or os.environ.get("HARNESS_LOCK_LOG")
        self.log_path = Path(log) if log else None
        self._held: dict[str, _Held] = {}

    def paths(self, device_id: str) -> LockPaths:
        """Return the lock file, holder record and queue directory of device_id."""
        safe = _safe(device_id)
        return LockPaths(self.directory / f"{safe}.lock", self.directory / f"{safe}.holder.json",
                         self.directory / f"{safe}.queue")

    def holder(self, device_id: str) -> Holder | None:
        """Return who holds device_id according to its holder record, or None (free, or a record left by a dead
        process, or a holder that writes none)."""
        record = Holder.read(self.paths(device_id).holder)
        return record if record is not None and record.alive() else None

    def acquire(self, device_id: str, test: str = "", progress: Progress | None = None) -> DeviceHold:
        """Take device_id's lock in turn (after the processes that asked before), waiting up to timeout_s and
        telling progress (a line) who it waits for; return the hold. Raise FarmError naming the holder on timeout."""
        held = self._held.get(device_id)
        if held is not None:
            held.count += 1
            return DeviceHold(self, device_id)
        paths = self.paths(device_id)
        paths.queue.mkdir(parents=True, exist_ok=True)
        me = Holder(_host(), os.getpid(), _user(), self.run_id, test, now_iso())
        asked_at = time.time()
        ticket = paths.queue / f"{time.time_ns():020d}-{me.host}-{me.pid}-{uuid.uuid4().hex[:8]}"
        lock = FileLock(str(paths.lock), thread_local=False)
        try:
            write_text_atomically(ticket, json.dumps(asdict(me)))
            self._wait_turn(device_id, paths, ticket, lock, me, progress)
        finally:
            ticket.unlink(missing_ok=True)
        record = Holder(me.host, me.pid, me.user, me.run, test, now_iso())
        try:
            write_text_atomically(paths.holder, json.dumps(asdict(record), indent=1))
        except BaseException:
            lock.release()
            raise
        self._held[device_id] = _Held(lock, record, asked_at, time.time())
        return DeviceHold(self, device_id)

    def release(self, device_id: str) -> None:
        """Give back one acquire of device_id; the last one removes the holder record and frees the lock."""
        held = self._held[device_id]
        held.count -= 1
        if held.count:
            return
        del self._held[device_id]
        try:
            self.paths(device_id).holder.unlink(missing_ok=True)  # before the lock: the next holder's is its own
        finally:
            held.lock.release()
            self._log(device_id, held, time.time())

    def _wait_turn(self, device_id: str, paths: LockPaths, ticket: Path, lock: FileLock, me: Holder,
                   progress: Progress | None) -> None:
        """Return once this process holds lock, having waited for the live tickets older than ticket; raise
        FarmError naming the holder past timeout_s."""
        start = time.monotonic()
        next_notice, next_beat = start + FIRST_NOTICE_S, start + HEARTBEAT_S
        while True:
            ahead = _tickets_ahead(paths.queue, ticket.name)
            if not ahead and _try_lock(lock):
                return
            now = time.monotonic()
            if now - start >= self.timeout_s:
                raise FarmError(self._timeout_message(device_id, paths, len(ahead), now - start))
            if progress is not None and now >= next_notice:
                progress(self._waiting_line(device_id, paths, len(ahead), now - start))
                next_notice = now + NOTICE_EVERY_S
            if now >= next_beat:
                _refresh_ticket(ticket, me)
                next_beat = now + HEARTBEAT_S
            time.sleep(max(0.0, min(POLL_S, start + self.timeout_s - now)))

    def _who(self, device_id: str, paths: LockPaths) -> tuple[str, Holder | None]:
        """Return how to name device_id's holder, and its record (None when it left none)."""
        holder = self.holder(device_id)
        if holder is None:
            return f"another process that left no holder record (lock {paths.lock})", None
        return holder.describe(), holder

    def _waiting_line(self, device_id: str, paths: LockPaths, ahead: int, waited_s: float) -> str:
        """Return the line a waiter shows: its place in line, who holds the device and for how long."""
        who, holder = self._who(device_id, paths)
        held = f" for {holder.held_s():.0f} s" if holder is not None else ""
        place = f"{_ordinal(ahead + 1)} in line, {int(waited_s)} s so far"
        return (f"harness: waiting for device {device_id} ({place}): held by {who}{held}; "
                f"--device-lock-timeout {self.timeout_s:g} s")

    def _timeout_message(self, device_id: str, paths: LockPaths, ahead: int, waited_s: float) -> str:
        """Return the one-line error of a wait past timeout_s: who holds the device since when, and what to do."""
        who, holder = self._who(device_id, paths)
        since = f" since {_local_time(holder.since)}" if holder is not None else ""
        queue = f"; {ahead} other process(es) waiting before this one" if ahead else ""
        return (f"device {device_id} is held by {who}{since} (waited {int(waited_s)} s, --device-lock-timeout "
                f"{self.timeout_s:g} s){queue}: wait longer with --device-lock-timeout or free the device")

    def _log(self, device_id: str, held: _Held, released_at: float) -> None:
        """Append the hold as one JSON line to log_path, when set."""
        if self.log_path is None:
            return
        line = json.dumps({"device": device_id, **asdict(held.record), "asked_at": held.asked_at,
                           "acquired_at": held.acquired_at, "released_at": released_at}) + "\n"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))  # one write of an O_APPEND file: lines of processes do not mix
        finally:
            os.close(fd)


def _try_lock(lock: FileLock) -> bool:
    """Return whether one non-blocking attempt took lock."""
    try:
        lock.acquire(blocking=False)
    except Timeout:
        return False
    return True


def _ticket_live(path: Path) -> bool:
    """Return whether the ticket at path belongs to a live waiter (refreshed lately, and on this host its pid is
    alive); False too when it is gone."""
    match = _TICKET.fullmatch(path.name)
    try:
        refreshed = path.stat().st_mtime
    except FileNotFoundError:
        return False
    if time.time() - refreshed > STALE_TICKET_S:
        return False
    return match is None or match["host"] != _host() or pid_alive(int(match["pid"]))


def _tickets_ahead(queue: Path, mine: str) -> list[Path]:
    """Return the live tickets in queue older than mine (oldest first), removing the dead ones."""
    ahead = []
    for path in sorted(queue.iterdir()):
        if path.name >= mine or not _TICKET.fullmatch(path.name):
            continue  # ours, a later one, or an atomic write's temporary file
        if _ticket_live(path):
            ahead.append(path)
        else:
            path.unlink(missing_ok=True)
    return ahead


def _refresh_ticket(ticket: Path, me: Holder) -> None:
    """Mark ticket as live (its mtime now); rewrite it when another process took it for a dead one's."""
    try:
        os.utime(ticket)
    except FileNotFoundError:
        write_text_atomically(ticket, json.dumps(asdict(me)))
