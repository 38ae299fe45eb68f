"""An emulated adb device (the adbd side of adb's transport) over loopback TCP.

Run it::

    python -m harness.emulator.adbd --port 5600 --soc sm8650 [--sandbox DIR]
    adb connect 127.0.0.1:5600
    adb -s 127.0.0.1:5600 shell getprop ro.soc.model      # -> SM8650

or in-process with :class:`EmulatedAdbDevice` (``start()`` returns the port).

What the device offers
----------------------
* ``CNXN`` with a ``device::`` banner (``ro.product.*`` and ``features=``); no AUTH.
* ``shell:CMD`` (legacy: stdout and stderr merged, exit code not reported),
  ``shell,v2,...:CMD`` (shell protocol: separate stdout/stderr, real exit code,
  stdin and close-stdin) and ``exec:CMD`` (raw, like legacy shell). Commands run
  with ``/bin/sh -c`` without a pty; an empty command (interactive shell) is
  refused with a message and exit code 1. As on a real device the stream ends
  when the command's stdout and stderr close (a background child that keeps them
  open keeps the shell open). A shell still running when the host closes its
  stream is killed (its whole process group), and so are all shells' process
  groups at stop().
* ``sync:`` with STAT, STA2, LST2, LIST, LIS2, SEND, RECV and QUIT.

How the device filesystem is presented (no root needed)
-------------------------------------------------------
The device's filesystem is a *sandbox* directory on the host. Sync paths are
device-absolute and map below the sandbox: ``/data/local/tmp/harness/x.bin`` is
``<sandbox>/data/local/tmp/harness/x.bin``; paths that would leave the sandbox
(through ``..`` or a symlink) are refused.

Shell commands are ordinary host processes, so before a command is passed to
``/bin/sh -c`` the device rewrites **device-absolute path prefixes**: each
occurrence of ``/data/``, ``/sdcard/`` or ``/sys/`` at the start of a shell word
(at the start of the command or after whitespace, ``=``, a single or double
quote, ``:``, or one of the shell operator characters ``<``, ``>``, ``;``,
``|``, ``&``, ``(`` and the backtick, so ``echo x >/data/local/tmp/f`` works)
becomes ``<sandbox>/data/`` etc. Nothing else is rewritten: ``/proc``, ``/system`` or a
bare ``/data`` without the trailing slash keep their host meaning, and paths
built at run time (``d=/da; ls ${d}ta/``) are not seen. Commands run with cwd
``<sandbox>/data/local/tmp`` and with ``<sandbox>/system/bin`` first on PATH,
where the device's ``getprop`` and ``dumpsys`` live (``getprop`` lists ``[key]: [value]``
lines; ``getprop KEY [DEFAULT]`` prints one value). ``ro.harness.emulated`` is ``1``, so
the harness labels what it reads from this device ``emulated``.

Thermal zones, battery and dumpsys
----------------------------------
``<sandbox>/sys/class/thermal/thermal_zone<N>/{type,temp,trip_point_*}``,
``<sandbox>/sys/class/power_supply/battery/{current_now,voltage_now,status}`` and
``<sandbox>/system/bin/dumpsys`` (``dumpsys thermalservice``) are written by the SoC's thermal
and power model (harness.emulator.thermal, parameters from the SoC catalog). Every shell gets
``HARNESS_EMULATED_NPU_DIR`` (``<sandbox>/dev/harness-npu``, a host path), where the device
runner reports its NPU busy time: that heats the model, a shell that runs no inference (``cat``,
``sha256sum``) does not. The files are brought up to date before every shell starts and before
every sync request on a ``/sys/`` path; the thermal ones also every 0.25 s while a shell runs. The
sandbox path may only contain ``[A-Za-z0-9_./+-]`` so that the rewrite never needs quoting.

Protocol notes (observed with Debian's adb 29.0.6)
---------------------------------------------------
Streams are in lockstep: one WRTE in flight per stream until the host's OKAY;
a WRTE larger than min(host maxdata, device maxdata) is never acknowledged, so
writes are split. Host WRTEs are acknowledged at once and queued. A sync STA2
request must never be answered with FAIL (the adb client crashes); a missing
file is reported through the errno field instead.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import selectors
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

from harness.emulator import adb_protocol as proto
from harness.emulator.thermal import EmulatedSensors, catalog_params

logger = logging.getLogger(__name__)

DEVICE_FEATURES: tuple[str, ...] = (
    "shell_v2", "cmd", "stat_v2", "ls_v2", "fixed_push_mkdir",
    "fixed_push_symlink_timestamp",
)
"""Features advertised in the CNXN banner."""

SANDBOX_DIRS: tuple[str, ...] = ("data/local/tmp", "sdcard", "system/bin")
_SAFE_SANDBOX = re.compile(r"^[A-Za-z0-9_./+-]+$")
_PATH_PREFIX = re.compile(r"(^|[\s=:'\"<>;|&(`])(/(?:data|sdcard|sys)/)")
_READ_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class SocDefaults:
    """Android identity of one SoC: board platform and marketing name."""

    board_platform: str
    name: str


DEFAULT_SOCS: dict[str, SocDefaults] = {
    "sm8450": SocDefaults("taro", "Snapdragon 8 Gen 1"),
    "sm8550": SocDefaults("kalama", "Snapdragon 8 Gen 2"),
    "sm8650": SocDefaults("pineapple", "Snapdragon 8 Gen 3"),
    "sm8750": SocDefaults("sun", "Snapdragon 8 Elite"),
    "sm8850": SocDefaults("canoe", "Snapdragon 8 Elite Gen 5"),
    "qcs6490": SocDefaults("qcm6490", "QCS6490"),
    "qcs8550": SocDefaults("kalama", "QCS8550"),
    "sc8380xp": SocDefaults("hamoa", "Snapdragon X Elite"),
    "sa8295p": SocDefaults("sa8295p", "SA8295P"),
}
"""Fallback SoC table, used when `harness.devices.load_catalog()` is unavailable."""


class UnknownSocError(ValueError):
    """The requested SoC is in neither the harness catalog nor DEFAULT_SOCS."""


# --------------------------------------------------------------------------- SoC / properties


def _catalog_socs() -> dict[str, SocDefaults]:
    """Return SoCs from `harness.devices.load_catalog()`, or {} if it is absent."""
    try:
        from harness.devices import load_catalog  # type: ignore[attr-defined]
    except ImportError:
        return {}
    try:
        socs = load_catalog().socs
        found: dict[str, SocDefaults] = {}
        for soc_id, entry in socs.items():
            platform = getattr(entry, "board_platform", None)
            name = getattr(entry, "name", None)
            if platform and name:
                found[str(soc_id).lower()] = SocDefaults(str(platform), str(name))
        return found
    except Exception as exc:  # a broken catalog must not take the emulator down
        logger.warning("harness.devices.load_catalog() failed (%s); using built-in SoC table", exc)
        return {}


def known_socs() -> dict[str, SocDefaults]:
    """Return every SoC id the emulator knows, catalog entries taking precedence."""
    return {**DEFAULT_SOCS, **_catalog_socs()}


def soc_properties(soc: str) -> dict[str, str]:
    """Return the Android system properties of an emulated device with `soc`.

    Raises UnknownSocError listing the known ids.
    """
    socs = known_socs()
    soc_id = soc.lower()
    if soc_id not in socs:
        raise UnknownSocError(
            f"unknown SoC {soc!r}; known SoCs: {', '.join(sorted(socs))}")
    info = socs[soc_id]
    return {
        "ro.soc.manufacturer": "QTI",
        "ro.soc.model": soc_id.upper(),
        "ro.board.platform": info.board_platform,
        "ro.hardware": "qcom",
        "ro.product.model": f"Emulated {info.name}",
        "ro.product.name": f"emulated_{info.board_platform}",
        "ro.product.device": info.board_platform,
        "ro.product.manufacturer": "QTI",
        "ro.product.cpu.abi": "arm64-v8a",
        "ro.build.version.sdk": "34",
        "ro.build.version.release": "14",
        "ro.harness.emulated": "1",
    }


def getprop_script(properties: Mapping[str, str]) -> str:
    """Return the text of a POSIX sh `getprop` printing `properties`.

    With no argument it prints `[key]: [value]` lines sorted by key; with
    `KEY [DEFAULT]` it prints the value (or DEFAULT, or an empty line).
    """
    lines = []
    for key, value in sorted(properties.items()):
        if not key or any(c in key for c in "=\n\r") or any(c in value for c in "\n\r"):
            raise ValueError(f"property {key!r}={value!r} cannot be represented")
        lines.append(f"{key}={value}")
    body = "\n".join(lines)
    return (
        "#!/bin/sh\n"
        "# getprop of the emulated adb device (harness.emulator.adbd)\n"
        "props() {\n"
        "cat <<'__HARNESS_PROPS__'\n"
        f"{body}\n"
        "__HARNESS_PROPS__\n"
        "}\n"
        'if [ "$#" -eq 0 ]; then\n'
        '  props | while IFS= read -r line; do\n'
        """    printf '[%s]: [%s]\\n' "${line%%=*}" "${line#*=}"\n"""
        "  done\n"
        "  exit 0\n"
        "fi\n"
        "props | while IFS= read -r line; do\n"
        '  if [ "${line%%=*}" = "$1" ]; then printf \'%s\\n\' "${line#*=}"; exit 3; fi\n'
        "done\n"
        '[ "$?" -eq 3 ] && exit 0\n'
        """printf '%s\\n' "${2-}"\n"""
    )


def connect_banner(properties: Mapping[str, str], features: tuple[str, ...] = DEVICE_FEATURES
                   ) -> bytes:
    """Return the CNXN banner `device::ro.product.name=..;...;features=..`."""
    def clean(value: str) -> str:
        return value.replace(";", "_").replace("\0", "")

    keys = ("ro.product.name", "ro.product.model", "ro.product.device")
    items = [f"{key}={clean(properties.get(key, ''))}" for key in keys]
    items.append("features=" + ",".join(features))
    return ("device::" + ";".join(items)).encode("utf-8")


# --------------------------------------------------------------------------- paths


def rewrite_device_paths(command: str, sandbox: Path) -> str:
    """Return `command` with `/data/`, `/sdcard/`, `/sys/` word prefixes moved into `sandbox`."""
    root = str(sandbox)
    return _PATH_PREFIX.sub(lambda m: m.group(1) + root + m.group(2), command)


def sandbox_path(sandbox: Path, device_path: str) -> Path:
    """Return the host path for `device_path` inside `sandbox`.

    Relative device paths are taken from `/` (adbd's cwd). Raises
    PermissionError when the path, `..` or a symlink, would leave the sandbox.
    """
    parts: list[str] = []
    for part in device_path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise PermissionError(errno.EACCES, "path escapes the device sandbox", device_path)
            parts.pop()
        else:
            parts.append(part)
    candidate = sandbox.joinpath(*parts)
    # The final component may be a symlink (lstat, LIST); resolve its parent.
    resolved_parent = Path(os.path.realpath(candidate.parent))
    if resolved_parent != sandbox and sandbox not in resolved_parent.parents:
        raise PermissionError(errno.EACCES, "path escapes the device sandbox", device_path)
    return candidate


def _resolved_inside(sandbox: Path, path: Path) -> bool:
    """Return whether `path` with all symlinks resolved stays in `sandbox`."""
    resolved = Path(os.path.realpath(path))
    return resolved == sandbox or sandbox in resolved.parents


# --------------------------------------------------------------------------- streams


class StreamClosed(Exception):
    """The stream was closed (by the host, by the device, or with its connection)."""


class _Stream:
    """One adb stream: host-to-device bytes queued, device writes in lockstep."""

    def __init__(self, conn: "_Connection", local_id: int, remote_id: int) -> None:
        self.conn = conn
        self.local_id = local_id
        self.remote_id = remote_id
        self._cond = threading.Condition()
        self._inbox: deque[bytes] = deque()
        self._closed = False
        self._write_ready = True
        self._write_lock = threading.Lock()
        self._on_remote_close: list[Callable[[], None]] = []

    # Called from the connection's reader thread.
    def deliver(self, data: bytes) -> None:
        with self._cond:
            self._inbox.append(data)
            self._cond.notify_all()

    def acknowledge(self) -> None:
        with self._cond:
            self._write_ready = True
            self._cond.notify_all()

    def remote_closed(self) -> None:
        """Mark closed by the host (or connection loss) and run close callbacks."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            callbacks = list(self._on_remote_close)
            self._cond.notify_all()
        for callback in callbacks:
            callback()

    # Service API.
    @property
    def closed(self) -> bool:
        """Return whether the stream is closed."""
        with self._cond:
            return self._closed

    def on_remote_close(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from the reader thread) if the host closes the stream."""
        with self._cond:
            already_closed = self._closed
            if not already_closed:
                self._on_remote_close.append(callback)
        if already_closed:
            callback()

    def recv(self) -> bytes:
        """Return the next chunk the host wrote, or b"" once the stream is closed."""
        with self._cond:
            while not self._inbox and not self._closed:
                self._cond.wait()
            return self._inbox.popleft() if self._inbox else b""

    def write(self, data: bytes) -> None:
        """Send `data` as WRTE messages no larger than the negotiated payload.

        Waits for the host's OKAY after each; raises StreamClosed.
        """
        view = memoryview(data)
        with self._write_lock:
            step = self.conn.max_payload_bytes
            for offset in range(0, len(view), step):
                with self._cond:
                    while not self._write_ready and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        raise StreamClosed()
                    self._write_ready = False
                self.conn.send(proto.A_WRTE, self.local_id, self.remote_id,
                               bytes(view[offset:offset + step]))

    def close(self) -> None:
        """Close from the device side: send CLSE once and forget the stream."""
        with self._cond:
            if self._closed:
                already = True
            else:
                already = False
                self._closed = True
                self._cond.notify_all()
        self.conn.forget(self)
        if not already:
            self.conn.send(proto.A_CLSE, self.local_id, self.remote_id)


class _StreamReader:
    """Byte-exact reads over a stream's WRTE chunks."""

    def __init__(self, stream: _Stream) -> None:
        self._stream = stream
        self._buf = bytearray()
        self._pos = 0

    def read_exact(self, size: int) -> bytes:
        """Return exactly `size` bytes; raises EOFError when the stream ends first."""
        while len(self._buf) - self._pos < size:
            chunk = self._stream.recv()
            if not chunk:
                raise EOFError()
            del self._buf[:self._pos]
            self._pos = 0
            self._buf += chunk
        out = bytes(self._buf[self._pos:self._pos + size])
        self._pos += size
        return out


# --------------------------------------------------------------------------- connection


class _Connection:
    """One host TCP connection: reader thread, message dispatch, stream table."""

    def __init__(self, device: "EmulatedAdbDevice", sock: socket.socket, peer: str) -> None:
        self.device = device
        self.sock = sock
        self.peer = peer
        self.max_payload_bytes = proto.MAX_PAYLOAD_BYTES
        self._with_checksum = False
        self._send_lock = threading.Lock()
        self._streams: dict[int, _Stream] = {}
        self._streams_lock = threading.Lock()
        self._next_id = 1
        self._alive = True

    def send(self, command: int, arg0: int, arg1: int, payload: bytes = b"") -> None:
        """Send one message; a dead socket is ignored (the reader tears down)."""
        data = proto.Message(command, arg0, arg1, payload).encode(self._with_checksum)
        with self._send_lock:
            if not self._alive:
                return
            try:
                self.sock.sendall(data)
            except OSError:
                self._alive = False

    def forget(self, stream: _Stream) -> None:
        with self._streams_lock:
            if self._streams.get(stream.local_id) is stream:
                del self._streams[stream.local_id]

    def serve(self) -> None:
        """Read and dispatch messages until the host disconnects; then clean up."""
        logger.info("connection from %s opened", self.peer)
        try:
            while True:
                msg = proto.read_message(self.sock)
                if msg is None:
                    break
                self._dispatch(msg)
        except (OSError, proto.ProtocolError) as exc:
            logger.debug("connection from %s: %s", self.peer, exc)
        finally:
            self.shutdown()
            logger.info("connection from %s closed", self.peer)
            self.device._forget_connection(self)

    def shutdown(self) -> None:
        """Close the socket and every stream (killing their shells)."""
        with self._send_lock:
            self._alive = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._close_all_streams()

    def _close_all_streams(self) -> None:
        with self._streams_lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            stream.remote_closed()

    def _dispatch(self, msg: proto.Message) -> None:
        if msg.command == proto.A_CNXN:
            self._close_all_streams()  # a new CNXN resets the transport
            self.max_payload_bytes = min(msg.arg1 or 4096, proto.MAX_PAYLOAD_BYTES)
            version = min(msg.arg0, proto.A_VERSION)
            self._with_checksum = version < proto.A_VERSION_SKIP_CHECKSUM
            self.send(proto.A_CNXN, proto.A_VERSION, proto.MAX_PAYLOAD_BYTES,
                      self.device.banner)
        elif msg.command == proto.A_OPEN:
            self._open(msg.arg0, msg.payload.rstrip(b"\0").decode("utf-8", "surrogateescape"))
        elif msg.command in (proto.A_OKAY, proto.A_WRTE, proto.A_CLSE):
            with self._streams_lock:
                stream = self._streams.get(msg.arg1)
            if stream is None or (msg.arg0 and stream.remote_id != msg.arg0):
                return  # stale message for a stream already closed
            if msg.command == proto.A_OKAY:
                stream.acknowledge()
            elif msg.command == proto.A_WRTE:
                stream.deliver(msg.payload)
                self.send(proto.A_OKAY, stream.local_id, stream.remote_id)
            else:
                self.forget(stream)
                stream.remote_closed()
        else:
            logger.debug("ignoring %s from %s", msg.name, self.peer)

    def _open(self, remote_id: int, service: str) -> None:
        handler = self.device._service_for(service)
        if handler is None or remote_id == 0:
            logger.debug("refusing service %r", service)
            self.send(proto.A_CLSE, 0, remote_id)
            return
        with self._streams_lock:
            local_id = self._next_id
            self._next_id += 1
            stream = _Stream(self, local_id, remote_id)
            self._streams[local_id] = stream
        self.send(proto.A_OKAY, local_id, remote_id)
        threading.Thread(target=self._run_service, args=(handler, stream),
                         name=f"adbd-{service[:24]}", daemon=True).start()

    @staticmethod
    def _run_service(handler: Callable[[_Stream], None], stream: _Stream) -> None:
        try:
            handler(stream)
        except (StreamClosed, EOFError):
            pass
        except Exception:
            logger.exception("service failed")
        finally:
            stream.close()


# --------------------------------------------------------------------------- shell service


@dataclass(frozen=True)
class ShellRequest:
    """A parsed `shell[,args]:command` or `exec:command` service name."""

    command: str
    protocol_v2: bool = False
    term: str | None = None


def parse_shell_service(service: str) -> ShellRequest | None:
    """Return the ShellRequest for a shell/exec service name, or None if it is not one."""
    if service.startswith("exec:"):
        return ShellRequest(command=service[len("exec:"):])
    head, sep, command = service.partition(":")
    if not sep or not (head == "shell" or head.startswith("shell,")):
        return None
    v2 = False
    term = None
    for arg in head.split(",")[1:]:
        if arg == "v2":
            v2 = True
        elif arg.startswith("TERM="):
            term = arg[len("TERM="):]
    return ShellRequest(command=command, protocol_v2=v2, term=term)


@dataclass
class _ShellSession:
    """Runs one shell command for one stream."""

    device: "EmulatedAdbDevice"
    stream: _Stream
    request: ShellRequest
    proc: subprocess.Popen[bytes] | None = None
    finished: threading.Event = field(default_factory=threading.Event)
    load_released: bool = False

    def _send(self, packet_id: int, data: bytes) -> None:
        if self.request.protocol_v2:
            self.stream.write(proto.shell_packet(packet_id, data))
        else:
            self.stream.write(data)

    def run(self) -> None:
        if not self.request.command.strip():
            self._send(proto.SHELL_STDERR,
                       b"emulated adbd: interactive shells are not supported; pass a command\n")
            if self.request.protocol_v2:
                self._send(proto.SHELL_EXIT, b"\x01")
            return
        self.device.refresh_sensors()
        self.proc = self.device._spawn_shell(self.request)
        self.device._shell_started()
        try:
            self._run_started()
        finally:
            self._release_load()

    def _release_load(self) -> None:
        """End this shell's share of the device load (once; before the exit code is sent)."""
        if not self.load_released:
            self.load_released = True
            self.device._shell_ended()

    def _run_started(self) -> None:
        assert self.proc is not None
        self.stream.on_remote_close(self._kill)
        pumps = [threading.Thread(target=self._pump_output, daemon=True,
                                  args=(self.proc.stdout, proto.SHELL_STDOUT))]
        if self.proc.stderr is not None:
            pumps.append(threading.Thread(target=self._pump_output, daemon=True,
                                          args=(self.proc.stderr, proto.SHELL_STDERR)))
        for pump in pumps:
            pump.start()
        threading.Thread(target=self._pump_input, daemon=True).start()
        returncode = self.proc.wait()
        for pump in pumps:
            pump.join()
        self._release_load()
        self.finished.set()
        if self.request.protocol_v2 and not self.stream.closed:
            code = returncode if returncode >= 0 else 128 - returncode
            self._send(proto.SHELL_EXIT, bytes([code & 0xFF]))

    def _kill(self) -> None:
        if self.proc is not None and not self.finished.is_set():
            _kill_group(self.proc.pid)

    def _pump_output(self, pipe, packet_id: int) -> None:  # type: ignore[no-untyped-def]
        chunk_bytes = max(1, min(_READ_CHUNK_BYTES, self.stream.conn.max_payload_bytes - 5))
        fd = pipe.fileno()
        try:
            while True:
                data = os.read(fd, chunk_bytes)
                if not data:
                    return
                self._send(packet_id, data)
        except StreamClosed:
            self._kill()
        finally:
            pipe.close()

    def _pump_input(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        stdin = self.proc.stdin
        try:
            if self.request.protocol_v2:
                reader = _StreamReader(self.stream)
                while True:
                    packet_id, length = proto.SHELL_HEADER.unpack(
                        reader.read_exact(proto.SHELL_HEADER.size))
                    data = reader.read_exact(length) if length else b""
                    if packet_id == proto.SHELL_STDIN and data:
                        stdin.write(data)
                        stdin.flush()
                    elif packet_id == proto.SHELL_CLOSE_STDIN:
                        stdin.close()
            else:
                while data := self.stream.recv():
                    stdin.write(data)
                    stdin.flush()
        except (EOFError, OSError, ValueError):
            pass  # stream ended, or the process closed/finished with its stdin
        finally:
            try:
                stdin.close()
            except OSError:
                pass


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by `pid` (ignoring one that is gone)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------- sync service


def _stat_v1(st: os.stat_result | None) -> bytes:
    if st is None:
        return proto.SYNC_STAT_V1.pack(proto.SYNC_STAT, 0, 0, 0)
    return proto.SYNC_STAT_V1.pack(proto.SYNC_STAT, st.st_mode & 0xFFFFFFFF,
                                   st.st_size & 0xFFFFFFFF, int(st.st_mtime) & 0xFFFFFFFF)


def _stat_v2_fields(st: os.stat_result | None, error: int) -> tuple[int, ...]:
    if st is None:
        return (error, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    return (0, st.st_dev, st.st_ino, st.st_mode, st.st_nlink, st.st_uid, st.st_gid,
            st.st_size, int(st.st_atime), int(st.st_mtime), int(st.st_ctime))


class _SyncSession:
    """Serves one `sync:` stream."""

    def __init__(self, device: "EmulatedAdbDevice", stream: _Stream) -> None:
        self.device = device
        self.stream = stream
        self.reader = _StreamReader(stream)
        self._out = bytearray()

    def _emit(self, data: bytes) -> None:
        self._out += data
        if len(self._out) >= self.stream.conn.max_payload_bytes:
            self._flush()

    def _flush(self) -> None:
        if self._out:
            data, self._out = bytes(self._out), bytearray()
            self.stream.write(data)

    def _path(self, device_path: str) -> Path:
        return sandbox_path(self.device.sandbox, device_path)

    def run(self) -> None:
        while True:
            try:
                request_id, length = proto.SYNC_REQUEST.unpack(
                    self.reader.read_exact(proto.SYNC_REQUEST.size))
            except EOFError:
                return
            if request_id == proto.SYNC_QUIT:
                return
            if length > proto.SYNC_PATH_MAX_BYTES:
                self._emit(proto.sync_fail(f"path too long ({length} bytes)"))
                self._flush()
                return
            path = self.reader.read_exact(length).decode("utf-8", "surrogateescape")
            if path.startswith("/sys/"):
                self.device.refresh_sensors()
            handler = {
                proto.SYNC_STAT: self._stat_v1, proto.SYNC_STA2: self._stat_v2,
                proto.SYNC_LST2: self._lstat_v2, proto.SYNC_LIST: self._list_v1,
                proto.SYNC_LIS2: self._list_v2, proto.SYNC_RECV: self._recv,
                proto.SYNC_SEND: self._send,
            }.get(request_id)
            if handler is None:
                self._emit(proto.sync_fail(f"unknown sync request {request_id!r}"))
                self._flush()
                return
            keep_going = handler(path)
            self._flush()
            if keep_going is False:
                return

    def _lookup(self, device_path: str, follow: bool) -> tuple[os.stat_result | None, int]:
        try:
            path = self._path(device_path)
            if follow and not _resolved_inside(self.device.sandbox, path):
                raise PermissionError(errno.EACCES, "outside the sandbox")
            return (os.stat(path) if follow else os.lstat(path)), 0
        except OSError as exc:
            return None, exc.errno or errno.EIO

    def _stat_v1(self, device_path: str) -> None:
        self._emit(_stat_v1(self._lookup(device_path, follow=False)[0]))

    def _stat_v2(self, device_path: str, follow: bool = True) -> None:
        st, error = self._lookup(device_path, follow=follow)
        self._emit(proto.SYNC_STAT_V2.pack(proto.SYNC_STA2, *_stat_v2_fields(st, error)))

    def _lstat_v2(self, device_path: str) -> None:
        self._stat_v2(device_path, follow=False)

    def _entries(self, device_path: str) -> Iterator[tuple[bytes, os.stat_result | None, int]]:
        try:
            directory = self._path(device_path)
            if not _resolved_inside(self.device.sandbox, directory):
                return
            names = [".", ".."] + sorted(os.listdir(directory))
        except OSError:
            return
        for name in names:
            try:
                yield os.fsencode(name), os.lstat(directory / name), 0
            except OSError as exc:
                yield os.fsencode(name), None, exc.errno or errno.EIO

    def _list_v1(self, device_path: str) -> None:
        for name, st, _error in self._entries(device_path):
            if st is None:
                continue
            self._emit(proto.SYNC_DENT_V1.pack(
                proto.SYNC_DENT, st.st_mode & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF,
                int(st.st_mtime) & 0xFFFFFFFF, len(name)) + name)
        self._emit(proto.SYNC_DENT_V1.pack(proto.SYNC_DONE, 0, 0, 0, 0))

    def _list_v2(self, device_path: str) -> None:
        for name, st, error in self._entries(device_path):
            self._emit(proto.SYNC_DENT_V2.pack(
                proto.SYNC_DNT2, *_stat_v2_fields(st, error), len(name)) + name)
        self._emit(proto.SYNC_DENT_V2.pack(proto.SYNC_DONE, *([0] * 11), 0))

    def _recv(self, device_path: str) -> None:
        try:
            path = self._path(device_path)
            if not _resolved_inside(self.device.sandbox, path):
                raise PermissionError(errno.EACCES, "path escapes the device sandbox")
            handle = open(path, "rb")
        except OSError as exc:
            self._emit(proto.sync_fail(f"open failed: {exc.strerror or exc}"))
            return
        with handle:
            while chunk := handle.read(proto.SYNC_DATA_MAX_BYTES):
                self._emit(proto.SYNC_REQUEST.pack(proto.SYNC_DATA, len(chunk)) + chunk)
        self._emit(proto.SYNC_REQUEST.pack(proto.SYNC_DONE, 0))

    def _send(self, spec: str) -> bool:
        """Receive one file; returns False when the session must end (after FAIL)."""
        device_path, comma, mode_text = spec.rpartition(",")
        if not comma:
            device_path, mode_text = spec, "0"
        error: str | None = None
        handle = None
        created = False
        path: Path | None = None
        try:
            mode = int(mode_text)
        except ValueError:
            mode, error = 0, f"bad mode {mode_text!r}"
        if error is None and stat.S_ISLNK(mode):
            error = "symlinks are not supported by the emulated device"
        if error is None:
            try:
                path = self._path(device_path)
                path.parent.mkdir(parents=True, exist_ok=True)  # fixed_push_mkdir
                if path.is_symlink() or path.is_file():
                    path.unlink()  # like adbd: replace, even if read-only
                handle = open(path, "wb")
                created = True
            except OSError as exc:
                error = f"couldn't create file: {exc.strerror or exc}"
        mtime = 0
        while True:
            chunk_id, length = proto.SYNC_REQUEST.unpack(
                self.reader.read_exact(proto.SYNC_REQUEST.size))
            if chunk_id == proto.SYNC_DONE:
                mtime = length
                break
            if chunk_id != proto.SYNC_DATA or length > 16 * proto.SYNC_DATA_MAX_BYTES:
                error = error or f"unexpected {chunk_id!r} ({length} bytes) during SEND"
                break
            data = self.reader.read_exact(length)
            if handle is not None:
                try:
                    handle.write(data)
                except OSError as exc:
                    error = f"write failed: {exc.strerror or exc}"
                    handle.close()
                    handle = None
        if handle is not None:
            handle.close()
        if error is None and path is not None:
            try:
                os.chmod(path, (mode & 0o777) or 0o644)
                os.utime(path, (mtime, mtime))
            except OSError as exc:
                error = f"couldn't set attributes: {exc.strerror or exc}"
        if error is not None:
            if created and path is not None:
                path.unlink(missing_ok=True)  # no partial files
            self._emit(proto.sync_fail(error))
            return False
        self._emit(proto.SYNC_REQUEST.pack(proto.SYNC_OKAY, 0))
        return True


# --------------------------------------------------------------------------- device


class EmulatedAdbDevice:
    """An adb device emulated over TCP; see the module docstring.

    ``with EmulatedAdbDevice("sm8650", sandbox) as dev: ...`` starts it and
    stops it; ``dev.serial`` is what ``adb connect`` takes.
    """

    def __init__(self, soc: str, sandbox: Path, host: str = "127.0.0.1", port: int = 0,
                 properties: dict[str, str] | None = None) -> None:
        self.soc = soc.lower()
        self.properties: dict[str, str] = {**soc_properties(soc), **(properties or {})}
        self._sandbox = Path(os.path.realpath(sandbox))
        if not _SAFE_SANDBOX.match(str(self._sandbox)):
            raise ValueError(
                f"sandbox path {str(self._sandbox)!r} may only contain [A-Za-z0-9_./+-]")
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self.banner = connect_banner(self.properties)
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._accept_thread: threading.Thread | None = None
        self._connections: set[_Connection] = set()
        self._pgids: set[int] = set()
        self._lock = threading.Lock()
        self.sensors: EmulatedSensors | None = None

    @property
    def sandbox(self) -> Path:
        """Return the host directory that is the device's filesystem."""
        return self._sandbox

    @property
    def port(self) -> int:
        """Return the bound TCP port (after start())."""
        if self._port is None:
            raise RuntimeError("device not started")
        return self._port

    @property
    def serial(self) -> str:
        """Return the adb serial, `HOST:PORT`."""
        return f"{self.host}:{self.port}"

    def prepare_sandbox(self) -> None:
        """Create the sandbox layout, write `system/bin/getprop` and start the sensors (which write
        `system/bin/dumpsys` and the sysfs files)."""
        for rel in SANDBOX_DIRS:
            (self._sandbox / rel).mkdir(parents=True, exist_ok=True)
        getprop = self._sandbox / "system/bin/getprop"
        getprop.write_text(getprop_script(self.properties))
        getprop.chmod(0o755)
        if self.sensors is None:
            self.sensors = EmulatedSensors(self._sandbox, catalog_params(self.soc))

    def refresh_sensors(self) -> None:
        """Bring the sysfs thermal and battery files up to date."""
        if self.sensors is not None:
            self.sensors.refresh()

    def _shell_started(self) -> None:
        """Mark a shell as running (the sensors refresh in the background until the last ends)."""
        if self.sensors is not None:
            self.sensors.begin_load()

    def _shell_ended(self) -> None:
        if self.sensors is not None:
            self.sensors.end_load()

    def start(self) -> int:
        """Prepare the sandbox, bind, and serve in background threads.

        Returns the bound port. Raises OSError (e.g. EADDRINUSE) from bind.
        """
        if self._listener is not None:
            return self.port
        self.prepare_sandbox()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self._requested_port))
            listener.listen(16)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._stop.clear()
        self._accept_thread = threading.Thread(target=self._accept_loop,
                                               name="adbd-accept", daemon=True)
        self._accept_thread.start()
        return self._port

    def stop(self) -> None:
        """Stop listening, drop every connection and kill every shell still running."""
        self._stop.set()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
            self._accept_thread = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            connections = list(self._connections)
            pgids = list(self._pgids)
            self._pgids.clear()
        for conn in connections:
            conn.shutdown()
        for pgid in pgids:
            _kill_group(pgid)

    def __enter__(self) -> "EmulatedAdbDevice":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                if not selector.select(timeout=0.2):
                    continue
                try:
                    sock, addr = self._listener.accept()
                except OSError:
                    continue
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn = _Connection(self, sock, f"{addr[0]}:{addr[1]}")
                with self._lock:
                    self._connections.add(conn)
                threading.Thread(target=conn.serve, name="adbd-conn", daemon=True).start()

    def _forget_connection(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _service_for(self, service: str) -> Callable[[_Stream], None] | None:
        shell = parse_shell_service(service)
        if shell is not None:
            return lambda stream: _ShellSession(self, stream, shell).run()
        if service == "sync:":
            return lambda stream: _SyncSession(self, stream).run()
        return None

    def _spawn_shell(self, request: ShellRequest) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["PATH"] = f"{self._sandbox / 'system/bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
        env["HARNESS_DEVICE_ROOT"] = str(self._sandbox)  # the persistent runner maps its requests' paths with it
        if self.sensors is not None:
            env.update(self.sensors.environment())  # HARNESS_EMULATED_NPU_DIR
        if request.term:
            env["TERM"] = request.term
        command = rewrite_device_paths(request.command, self._sandbox)
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=self._sandbox / "data/local/tmp", env=env, bufsize=0,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if request.protocol_v2 else subprocess.STDOUT,
            start_new_session=True,
        )
        with self._lock:
            self._pgids.add(proc.pid)
        return proc


# --------------------------------------------------------------------------- CLI


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m harness.emulator.adbd",
        description="Emulated adb device on loopback TCP (adb connect HOST:PORT).")
    parser.add_argument("--port", type=int, required=True, help="TCP port (0: any free port)")
    parser.add_argument("--soc", required=True, help="SoC id, e.g. sm8650")
    parser.add_argument("--sandbox", type=Path, default=None,
                        help="directory used as the device filesystem (default: a temp dir)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the emulated device in the foreground until SIGINT/SIGTERM.

    Returns the process exit code: 0 after a signal, 2 for a bad SoC or port.
    """
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s adbd %(levelname)s %(message)s")
    temp_dir: tempfile.TemporaryDirectory[str] | None = None
    if args.sandbox is None:
        temp_dir = tempfile.TemporaryDirectory(prefix="adbd-sandbox-")
        sandbox = Path(temp_dir.name)
    else:
        sandbox = args.sandbox  # created by start()
    try:
        try:
            device = EmulatedAdbDevice(args.soc, sandbox, host=args.host, port=args.port)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            device.start()
        except OSError as exc:
            reason = "port already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            print(f"error: cannot listen on {args.host}:{args.port}: {reason}", file=sys.stderr)
            return 2
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        print(f"emulated adbd ({device.soc}) listening on {device.serial}, "
              f"sandbox {device.sandbox}", flush=True)
        try:
            while not stop.wait(0.5):
                pass
        finally:
            device.stop()
        return 0
    finally:
        if temp_dir is not None:
            temp_dir.cleanup()


if __name__ == "__main__":
    sys.exit(main())
