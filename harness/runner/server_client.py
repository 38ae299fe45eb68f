"""Host side of the persistent device runner: one `device_runner.py --serve` per device session.

The server is started on first use over the transport's stream (Transport.open_stream) and spoken to in
JSON lines (the protocol is in device_runner.py's docstring). A request that finds the server gone, or
loses it before the answer (end of its output: a crash, a kill), restarts it once and is sent again; a
second loss raises RunnerError with the server's stderr. Past its timeout a request kills the server and
raises DeviceTimeoutError (or DeviceLostError where the device no longer answers a probe), as a one-shot
run does. close() asks the server to exit, then kills it.
"""

from __future__ import annotations

import itertools
import json
import logging
import shlex
import time
from dataclasses import dataclass

from harness.errors import DeviceTimeoutError, RunnerError, TransportError
from harness.transports.base import RunnerStream, Transport

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # interpreter, numpy, onnxruntime and the QNN EP, on a slow phone
EXIT_TIMEOUT_S = 5.0


class ServerGone(Exception):
    """The server's output ended (or its stdin closed) before the answer came."""


@dataclass(frozen=True)
class Reply:
    """A request's outcome: the runner's exit code and the stderr it printed meanwhile."""

    rc: int
    stderr: str
    pid: int | None
    duration_s: float
    restarted: bool = False  # the server had died and was started again for this request


class RunnerServer:
    """One persistent device runner on a device; one request at a time (not thread-safe)."""

    def __init__(self, transport: Transport, command: list[str]) -> None:
        self.transport = transport
        self.command = command  # python + the runner's remote path; --serve is added
        self.stream: RunnerStream | None = None
        self.pid: int | None = None  # the server's own pid (its ping's), not the shell's
        self.info: dict = {}  # its self-check report
        self.starts = 0
        self._ids = itertools.count(1)

    def ping(self) -> dict:
        """Start the server if needed; return its self-check report (with `pid`)."""
        if self.alive():
            try:
                self.info = self._exchange({"op": "ping"}, START_TIMEOUT_S, self.command).get("info") or {}
                return {**self.info, "pid": self.pid}
            except ServerGone:
                self._stop()
        self._start()
        return {**self.info, "pid": self.pid}

    def run(self, argv: list[str], timeout_s: float) -> Reply:
        """Run the runner's argv (without python and script) on the server; return its Reply.

        Raises DeviceTimeoutError (the server killed) past timeout_s, RunnerError when the server is lost
        twice, TransportError (DeviceLostError) when the device cannot be reached.
        """
        argv = self.transport.device_args(argv)
        full = [*self.command, *argv]
        restarted = False
        for attempt in (1, 2):
            if not self.alive():
                if self.starts:
                    logger.info("[%s] the device runner server had ended; starting it again", self.transport.device_id)
                self._start()
            start = time.monotonic()
            self.stream.stderr(clear=True)  # type: ignore[union-attr]
            try:
                with self.transport.request_scope():
                    reply = self._exchange({"op": "run", "argv": argv, "cwd": "."}, timeout_s, full)
            except ServerGone as e:
                stderr = self._stop()
                if attempt == 2:
                    raise RunnerError(f"the device runner server ended twice while running {shlex.join(argv[:4])}"
                                      f"...: {e}", device=self.transport.device_id, argv=full,
                                      stderr=stderr) from None
                logger.warning("[%s] the device runner server ended during a request (%s); restarting it",
                               self.transport.device_id, e)
                restarted = True
                continue
            except BaseException:  # a timeout, or interrupted on the host: the request may still be running
                self._stop()
                raise
            return Reply(int(reply.get("rc", 3)), self.stream.stderr(), reply.get("pid"),  # type: ignore[union-attr]
                         time.monotonic() - start, restarted)
        raise AssertionError("unreachable")

    def alive(self) -> bool:
        """Return whether the server is running (as far as its stream knows)."""
        return self.stream is not None and self.stream.alive()

    def close(self) -> None:
        """Ask the server to exit, then kill it (and its children) whatever it answered."""
        if self.stream is None:
            return
        if self.stream.alive():
            try:
                self._exchange({"op": "exit"}, EXIT_TIMEOUT_S, self.command)
            except (ServerGone, TransportError):
                pass
        self._stop()

    # ------------------------------------------------------------------ internals

    def _start(self) -> None:
        self._stop()
        self.starts += 1
        self.stream = self.transport.open_stream([*self.command, "--serve"])
        try:
            reply = self._exchange({"op": "ping"}, START_TIMEOUT_S, self.command)
        except (ServerGone, DeviceTimeoutError) as e:
            stderr = self._stop()
            raise RunnerError(f"the device runner server did not start: {e}", device=self.transport.device_id,
                              argv=[*self.command, "--serve"], stderr=stderr) from None
        self.pid, self.info = reply.get("pid"), reply.get("info") or {}

    def _stop(self) -> str:
        """Kill the server; return its last stderr."""
        if self.stream is None:
            return ""
        stream, self.stream, self.pid = self.stream, None, None
        stderr = stream.stderr()
        stream.close()
        return stderr

    def _exchange(self, request: dict, timeout_s: float, argv: list[str]) -> dict:
        """Send request; return the reply with its id (lines that are not replies are logged and skipped)."""
        assert self.stream is not None
        request = {"id": next(self._ids), **request}
        try:
            self.stream.write_line(json.dumps(request))
        except EOFError as e:
            raise ServerGone(str(e)) from None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.stream.read_line(max(0.0, deadline - time.monotonic()))
            except DeviceTimeoutError as e:
                stderr = self._stop()
                error = DeviceTimeoutError(f"command timed out after {timeout_s:g} s: {shlex.join(argv[:5])}...",
                                           device=self.transport.device_id, argv=argv, stderr=stderr)
                raise self.transport.timeout_error(error, argv) from e
            if line is None:
                raise ServerGone("its output ended (exit or crash)")
            try:
                reply = json.loads(line)
            except ValueError:
                reply = None
            if isinstance(reply, dict) and reply.get("id") == request["id"]:
                return reply
            logger.debug("[%s] not a reply from the runner server: %r", self.transport.device_id, line[:200])
