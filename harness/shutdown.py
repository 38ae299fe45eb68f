"""Ending a run on a signal without leaving processes behind.

SIGTERM (how a CI timeout or `kill` ends a job) stops a run the way Ctrl-C does: the first SIGINT or
SIGTERM raises Interrupted, a KeyboardInterrupt, so pytest tears its fixtures down, runs sessionfinish and
unconfigure (where the device pool cleans and closes every device) and exits with its interrupted status
(2). A second signal while that cleanup runs kills the local process groups the harness started at once
and lets the cleanup finish (aborting it is what would leave device processes running); a third one raises
Interrupted again.

Local device commands run in a process group of their own (run_in_group), killed whole when the wait
for them is interrupted or times out: a runner's own children (concurrency mode 'processes') die with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

SIGNALS = (signal.SIGINT, signal.SIGTERM)
REAP_TIMEOUT_S = 5.0


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal; pytest treats it as Ctrl-C (exit status 2)."""


class ProcessGroups:
    """The ids of the local process groups the harness started and has not finished with (a second signal
    kills them). Process-wide, like signal handlers; set operations only, so that a signal handler
    running between two bytecodes of the main thread never waits on a lock."""

    def __init__(self) -> None:
        self._pgids: set[int] = set()

    def add(self, pgid: int) -> None:
        """Track pgid."""
        self._pgids.add(pgid)

    def discard(self, pgid: int) -> None:
        """Stop tracking pgid."""
        self._pgids.discard(pgid)

    def kill_all(self) -> list[int]:
        """SIGKILL every tracked group; return their ids."""
        pgids = list(self._pgids)
        for pgid in pgids:
            kill_group(pgid)
        return pgids


GROUPS = ProcessGroups()


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send sig to process group pgid (no error when it is gone)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def pid_alive(pid: int) -> bool:
    """Return whether the local process pid exists (os.kill(pid, 0))."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def run_in_group(argv: list[str], timeout_s: float, **popen_kwargs: Any) -> subprocess.CompletedProcess:
    """Return subprocess.run(argv, capture_output=True, timeout=timeout_s, **popen_kwargs)'s result, the
    command started in a new session (its own process group) that is SIGKILLed whole when it times out
    (subprocess.TimeoutExpired, with its output so far), when the wait is interrupted (KeyboardInterrupt or
    any other exception, re-raised) and after it exits (children it left behind)."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                          **popen_kwargs) as proc:
        GROUPS.add(proc.pid)
        try:
            try:
                stdout, stderr = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                try:
                    stdout, stderr = proc.communicate(timeout=REAP_TIMEOUT_S)
                except subprocess.TimeoutExpired:  # a process that left the group holds the pipes
                    stdout, stderr = None, None
                raise subprocess.TimeoutExpired(argv, timeout_s, stdout, stderr) from None
            except BaseException:
                kill_group(proc.pid)
                _reap(proc)
                raise
            return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
        finally:
            kill_group(proc.pid)  # the leader is gone; what it left in its group is not
            GROUPS.discard(proc.pid)


def _reap(proc: subprocess.Popen) -> None:
    """Wait (briefly) for a killed process, so that no zombie is left."""
    try:
        proc.wait(timeout=REAP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass


@dataclass
class SignalGuard:
    """The handlers installed for SIGINT and SIGTERM and the ones they replaced; `received` lists the signals
    caught so far."""

    previous: dict[int, Any] = field(default_factory=dict)
    received: list[int] = field(default_factory=list)

    def handle(self, signum: int, _frame: object) -> None:
        """First signal: raise Interrupted; second: kill the tracked process groups and let the cleanup
        finish; later ones: raise Interrupted again."""
        self.received.append(signum)
        name = signal.Signals(signum).name
        if len(self.received) == 2:
            GROUPS.kill_all()
            return
        raise Interrupted(f"{name} received: stopping the run and cleaning up the devices"
                          + ("" if len(self.received) == 1 else " (again: cleanup aborted)"))

    def restore(self) -> None:
        """Put the replaced handlers back (main thread only; a no-op when none were installed)."""
        for signum, handler in self.previous.items():
            if handler is not None:  # None: not installed from Python, nothing to put back
                signal.signal(signum, handler)
        self.previous.clear()


def install() -> SignalGuard:
    """Return a SignalGuard whose handler now serves SIGINT and SIGTERM (installed only in the main thread,
    where Python runs signal handlers; elsewhere the guard installs nothing)."""
    guard = SignalGuard()
    if threading.current_thread() is not threading.main_thread():
        return guard
    handler: Callable[[int, object], None] = guard.handle
    for signum in SIGNALS:
        guard.previous[signum] = signal.signal(signum, handler)
    return guard
