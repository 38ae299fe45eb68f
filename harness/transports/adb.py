"""adb transport (adbutils, through the real adb server) for Android phones.

* The device is picked by ``serial`` (a USB serial, or ``host:port`` for adb over TCP, which is
  ``adb connect``-ed on demand); the server is ``adb_host``:``adb_port`` (default
  ``$ANDROID_ADB_SERVER_PORT`` or 5037) and is started with ``adb -P PORT start-server`` when it is
  not running on this machine.
* Commands use the shell v2 protocol (separate stdout/stderr, the real exit code) as
  ``cd <workdir> && <quoted argv>`` with an overall timeout; past it the shell's stream is closed
  and its process group killed.
* Files go through one ``sync:`` session per push or pull (SEND/RECV/LIST), with socket timeouts;
  a push skips files whose SHA-256 on the device matches (one ``sha256sum`` per batch).
* The work directory is under /data/local/tmp/. The runner is the harness's own Python runner
  where the entry names a ``python:`` on the device, else Qualcomm's ``qnn-net-run`` from the
  user's QAIRT SDK (``qairt_sdk:`` or ``$QNN_SDK_ROOT``), pushed with its HTP libraries and run on
  a context binary (see harness.runner.qnn_net_run).
"""

from __future__ import annotations

import logging
import os
import posixpath
import select
import shlex
import shutil
import socket
import stat
import struct
import subprocess
import time
from pathlib import Path

import adbutils
from adbutils.errors import AdbError

from harness.errors import ConfigError, DeviceTimeoutError, TransientTransportError, TransportError
from harness.files import replacing
from harness.transports.shell import (CommandInterrupted, ShellStream, ShellTransport, kill_line, split_pid,
                                      with_pid_marker)

logger = logging.getLogger(__name__)

EMULATED_PROPERTY = "ro.harness.emulated"
CONNECT_WAIT_S = 3.0
SERVER_START_TIMEOUT_S = 30.0
_SYNC_DATA_BYTES = 64 * 1024
_EXIT_MAGIC = "X4HARNESS-EXIT:"


class AdbTransport(ShellTransport):
    """An Android device behind the adb server."""

    platform = "android"
    open_timeout_s: float = 20.0

    def __init__(self, device, soc) -> None:  # type: ignore[no-untyped-def]
        super().__init__(device, soc, device.workdir)
        self.server_host = device.adb_host
        self.server_port = int(device.adb_port or os.environ.get("ANDROID_ADB_SERVER_PORT") or 5037)
        self.qairt_sdk = resolve_qairt_sdk(device.qairt_sdk)
        if device.python is None and self.qairt_sdk is None:
            raise ConfigError(
                f"device '{device.id}' (adb) has no way to run models: it has no `python:` (an interpreter on the "
                "phone with onnxruntime-qnn, for the harness's runner) and no QAIRT SDK for qnn-net-run. Set "
                "`qairt_sdk: /path/to/qairt/<version>` on its devices.yaml entry or export QNN_SDK_ROOT, "
                "or set `python:`")
        self._client = adbutils.AdbClient(host=self.server_host, port=self.server_port)
        self._dev: adbutils.AdbDevice | None = None
        self._shell_v2 = True
        self.properties: dict[str, str] = {}
        self._connect_first(self._connect, f"{device.serial} (adb server {self.server_host}:{self.server_port})")
        self.telemetry_source = "emulated" if self.properties.get(EMULATED_PROPERTY) == "1" else "measured"
        self.make_workdir()

    @property
    def python(self) -> list[str]:
        if self.device.python is None:
            raise ConfigError(f"device '{self.device_id}' has no `python:`: it runs qnn-net-run from the QAIRT SDK "
                              f"at {self.qairt_sdk} on context binaries (see harness.runner.qnn_net_run)")
        return shlex.split(self.device.python)

    @property
    def runner_kind(self) -> str:
        """Return 'python' (the harness's runner) or 'qnn-net-run' (the QAIRT SDK's)."""
        return "python" if self.device.python is not None else "qnn-net-run"

    # ---------------------------------------------------------------- connection

    def _ensure_server(self) -> None:
        if _server_up(self.server_host, self.server_port):
            return
        adb = shutil.which("adb")
        if adb is None or self.server_host not in ("127.0.0.1", "localhost"):
            raise TransientTransportError(
                f"no adb server at {self.server_host}:{self.server_port}"
                + (" and no `adb` on PATH to start one (apt-get install adb)" if adb is None else ""),
                device=self.device_id)
        logger.info("starting an adb server on port %d", self.server_port)
        subprocess.run([adb, "-P", str(self.server_port), "start-server"], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=SERVER_START_TIMEOUT_S)
        if not _server_up(self.server_host, self.server_port):
            raise TransientTransportError(f"could not start an adb server on port {self.server_port}",
                                          device=self.device_id)

    def _state(self) -> str | None:
        """Return the device's adb state ('device', 'offline', ...) or None when the server does not list it."""
        try:
            for info in self._client.list():
                if info.serial == self.device.serial:
                    return info.state
        except (AdbError, OSError) as e:
            raise TransientTransportError(f"adb server {self.server_host}:{self.server_port}: {e}",
                                          device=self.device_id) from None
        return None

    def _connect(self) -> None:
        serial = self.device.serial
        self._ensure_server()
        state = self._state()
        if state != "device" and _is_network_serial(serial):
            try:
                reply = self._client.connect(serial, timeout=self.open_timeout_s)
            except (AdbError, OSError) as e:
                raise TransientTransportError(f"adb connect {serial}: {e}", device=self.device_id) from None
            if "connected" not in reply or "unable" in reply or "failed" in reply:
                raise TransientTransportError(f"adb connect {serial}: {reply.strip()}", device=self.device_id)
        deadline = time.monotonic() + CONNECT_WAIT_S
        while (state := self._state()) != "device" and time.monotonic() < deadline:
            time.sleep(0.1)
        if state != "device":
            raise TransientTransportError(
                f"device {serial} is {state or 'not attached'} (see `adb -P {self.server_port} devices`)",
                device=self.device_id)
        dev = self._client.device(serial)
        try:
            features = set(dev.get_features().split(","))
        except (AdbError, OSError) as e:
            raise TransientTransportError(f"cannot talk to {serial}: {e}", device=self.device_id) from None
        self._dev, self._shell_v2 = dev, "shell_v2" in features
        rc, out, _err = self._exec(f"getprop {EMULATED_PROPERTY}", self.open_timeout_s)
        self.properties[EMULATED_PROPERTY] = out.strip() if rc == 0 else ""

    def _reconnect(self) -> None:
        self._dev = None
        self._connect()

    def _device(self) -> adbutils.AdbDevice:
        if self._dev is None:
            raise TransientTransportError("not connected", device=self.device_id)
        return self._dev

    def _open(self, service: str, timeout_s: float):  # type: ignore[no-untyped-def]
        """Return an AdbConnection to service on the device; TransientTransportError when that fails."""
        try:
            conn = self._device().open_transport(timeout=min(timeout_s, self.open_timeout_s))
            conn.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # else ~40 ms per sync reply
            conn.send_command(service)
            conn.check_okay()
        except (AdbError, OSError, EOFError) as e:
            raise TransientTransportError(f"cannot open {service.split(':')[0]} on {self.device.serial}: {e}",
                                          device=self.device_id) from None
        return conn

    # ---------------------------------------------------------------- commands

    def _exec_bytes(self, command: str, timeout_s: float) -> tuple[int, bytes, str]:
        if not self._shell_v2:
            return self._exec_legacy(command, timeout_s)
        conn = self._open(f"shell,v2,raw:{with_pid_marker(command)}", timeout_s)
        deadline = time.monotonic() + timeout_s
        out, err = bytearray(), bytearray()
        try:
            while True:
                header = _read_exact(conn.conn, 5, deadline)
                kind, length = header[0], struct.unpack("<I", header[1:])[0]
                data = _read_exact(conn.conn, length, deadline) if length else b""
                if kind == 1:
                    out += data
                elif kind == 2:
                    err += data
                elif kind == 3:
                    _pid, stderr = split_pid(err.decode(errors="replace"))
                    return (data[0] if data else 255), bytes(out), stderr
        except socket.timeout:
            pid, stderr = split_pid(err.decode(errors="replace"))
            _close(conn)  # the device ends the shell with its stream
            if pid is not None:
                self._kill(pid)
            raise DeviceTimeoutError(f"command timed out after {timeout_s:g} s", device=self.device_id,
                                     stderr=stderr) from None
        except (EOFError, OSError) as e:
            raise CommandInterrupted(f"the adb stream closed while the command ran ({e})",
                                     device=self.device_id) from None
        except BaseException as e:
            if not isinstance(e, TransportError):  # interrupted here (Ctrl-C, SIGTERM): stop it on the device
                self._kill_interrupted(conn, err)
            raise
        finally:
            _close(conn)

    def _kill_interrupted(self, conn, err: bytearray) -> None:  # type: ignore[no-untyped-def]
        """Kill the process group of a command whose wait was interrupted on the host, reading up to 2 s
        more of its stream when its pid line has not arrived yet."""
        deadline = time.monotonic() + 2.0
        try:
            while b"\n" not in err:
                header = _read_exact(conn.conn, 5, deadline)
                data = _read_exact(conn.conn, struct.unpack("<I", header[1:])[0], deadline)
                if header[0] == 2:
                    err += data
                elif header[0] == 3:
                    return  # it has exited
        except (socket.timeout, EOFError, OSError):
            pass
        _close(conn)
        pid, _stderr = split_pid(err.decode(errors="replace"))
        if pid is not None:
            self._kill(pid)

    def _exec_legacy(self, command: str, timeout_s: float) -> tuple[int, bytes, str]:
        """Old devices without shell v2: stdout and stderr merged, exit code echoed after a marker."""
        conn = self._open(f"shell:{command}; echo {_EXIT_MAGIC}$?", timeout_s)
        deadline = time.monotonic() + timeout_s
        data = bytearray()
        try:
            while True:
                conn.conn.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = conn.conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            raise DeviceTimeoutError(f"command timed out after {timeout_s:g} s", device=self.device_id) from None
        except OSError as e:
            raise CommandInterrupted(f"the adb stream closed while the command ran ({e})",
                                     device=self.device_id) from None
        finally:
            conn.close()
        head, sep, tail = bytes(data).rpartition(_EXIT_MAGIC.encode())
        if not sep:
            raise CommandInterrupted("the adb stream closed before the command finished", device=self.device_id)
        code = tail.strip().decode(errors="replace")
        return (int(code) if code.isdigit() else 255), head, ""

    @property
    def can_stream(self) -> bool:
        """Return whether a process can be kept here: with the shell v2 protocol (stdin packets) only."""
        return self._shell_v2

    def _open_stream(self, command: str) -> "_AdbStream":
        return _AdbStream(self, self._open(f"shell,v2,raw:{command}", self.open_timeout_s))

    def _kill(self, pid: int) -> None:
        try:
            self._exec(kill_line(pid), self.probe_timeout_s)
        except TransportError as e:  # the device may be gone; the probe that follows will tell
            logger.debug("[%s] could not kill pid %s: %s", self.device_id, pid, e)

    # ---------------------------------------------------------------- files

    def _sync(self) -> "_SyncSession":
        return _SyncSession(self._open("sync:", self.io_timeout_s), self.io_timeout_s, self.device_id)

    def _send_files(self, pairs: list[tuple[Path, str]]) -> None:
        with self._sync() as sync:
            for src, dst in pairs:
                sync.send(src, dst, 0o755 if os.stat(src).st_mode & 0o111 else 0o644)

    def _receive(self, remote_abs: str, local: Path) -> None:
        with self._sync() as sync:
            mode = sync.stat(remote_abs)
            if mode == 0:
                raise TransportError(f"no such file on device: {remote_abs}", device=self.device_id)
            if stat.S_ISDIR(mode):
                self._receive_tree(sync, remote_abs, local)
            else:
                local.parent.mkdir(parents=True, exist_ok=True)
                sync.recv(remote_abs, local)

    def _receive_tree(self, sync: "_SyncSession", remote: str, local: Path) -> None:
        local.mkdir(parents=True, exist_ok=True)
        for name, mode in sync.list(remote):
            if stat.S_ISDIR(mode):
                self._receive_tree(sync, posixpath.join(remote, name), local / name)
            elif stat.S_ISREG(mode):
                sync.recv(posixpath.join(remote, name), local / name)

    def close(self) -> None:
        self._dev = None


class _AdbStream(ShellStream):
    """A kept command on a shell v2 stream: stdin goes as stdin packets, stdout/stderr/exit come as packets."""

    def __init__(self, transport: AdbTransport, conn) -> None:  # type: ignore[no-untyped-def]
        super().__init__(transport)
        self.conn = conn
        self._raw = bytearray()
        self._ended = False

    def _send(self, data: bytes) -> None:
        try:
            self.conn.conn.settimeout(self.transport.io_timeout_s)  # not the last read's remainder
            for at in range(0, len(data), _SYNC_DATA_BYTES):
                chunk = data[at:at + _SYNC_DATA_BYTES]
                self.conn.conn.sendall(struct.pack("<BI", 0, len(chunk)) + chunk)  # 0: stdin
        except OSError as e:
            raise EOFError(f"the adb stream is closed ({e})") from None

    def _recv(self, timeout_s: float) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        while True:
            out = bytearray()
            while len(self._raw) >= 5:
                kind, length = self._raw[0], struct.unpack("<I", self._raw[1:5])[0]
                if len(self._raw) < 5 + length:
                    break
                data = bytes(self._raw[5:5 + length])
                del self._raw[:5 + length]
                if kind == 1:
                    out += data
                elif kind == 2:
                    self._note_stderr(data)
                elif kind == 3:  # exit
                    self._ended = True
            if out:
                return bytes(out)
            if self._ended:
                return b""
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                self.conn.conn.settimeout(remaining)
                chunk = self.conn.conn.recv(1 << 16)
            except socket.timeout:
                return None
            except OSError:
                chunk = b""
            if not chunk:
                self._ended = True
            self._raw += chunk

    def alive(self) -> bool:
        if not self._ended and select.select([self.conn.conn], [], [], 0)[0]:
            self._out += self._recv(0.2) or b""  # what arrived since (an exit packet ends the stream)
        return not self._ended

    def _release(self) -> None:
        self._ended = True
        _close(self.conn)


class _SyncSession:
    """One `sync:` stream: STAT, SEND, RECV, LIST; socket errors become harness errors."""

    def __init__(self, conn, timeout_s: float, device_id: str) -> None:  # type: ignore[no-untyped-def]
        self.conn = conn
        self.sock: socket.socket = conn.conn
        self.sock.settimeout(timeout_s)
        self.timeout_s = timeout_s
        self.device_id = device_id

    def __enter__(self) -> "_SyncSession":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.sock.sendall(b"QUIT" + struct.pack("<I", 0))
        except OSError:
            pass
        _close(self.conn)

    def _guard(self, what: str, fn):  # type: ignore[no-untyped-def]
        try:
            return fn()
        except socket.timeout:
            raise DeviceTimeoutError(f"{what} stalled for {self.timeout_s:g} s", device=self.device_id) from None
        except (EOFError, OSError, AdbError) as e:
            raise TransientTransportError(f"{what}: connection lost ({e})", device=self.device_id) from None

    def _request(self, cmd: bytes, path: str) -> None:
        raw = path.encode("utf-8", "surrogateescape")
        self.sock.sendall(cmd + struct.pack("<I", len(raw)) + raw)

    def _read(self, n: int) -> bytes:
        return _read_exact(self.sock, n, None)

    def stat(self, remote: str) -> int:
        """Return the mode of remote (0 when it does not exist)."""
        def go() -> int:
            self._request(b"STAT", remote)
            reply = self._read(16)
            if reply[:4] != b"STAT":
                raise EOFError(f"unexpected sync reply {reply[:4]!r}")
            return struct.unpack("<III", reply[4:])[0]
        return self._guard(f"stat {remote}", go)

    def send(self, local: Path, remote: str, mode: int) -> None:
        """Write local to remote with mode (parents are created by the device)."""
        def go() -> None:
            spec = f"{remote},{stat.S_IFREG | mode}".encode("utf-8", "surrogateescape")
            out = bytearray(b"SEND" + struct.pack("<I", len(spec)) + spec)
            with open(local, "rb") as f:
                while chunk := f.read(_SYNC_DATA_BYTES):
                    out += b"DATA" + struct.pack("<I", len(chunk)) + chunk
                    if len(out) >= 4 * _SYNC_DATA_BYTES:
                        self.sock.sendall(out)
                        out.clear()
            out += b"DONE" + struct.pack("<I", int(time.time()))
            self.sock.sendall(out)  # small files go in one write
            reply = self._read(8)
            if reply[:4] == b"FAIL":
                message = self._read(struct.unpack("<I", reply[4:])[0]).decode(errors="replace")
                raise TransportError(f"push of {local.name} to {remote} failed: {message}", device=self.device_id)
            if reply[:4] != b"OKAY":
                raise EOFError(f"unexpected sync reply {reply[:4]!r}")
        self._guard(f"push {remote}", go)

    def recv(self, remote: str, local: Path) -> None:
        """Copy remote to local (written to a temporary file beside it, then renamed)."""
        def go() -> None:
            self._request(b"RECV", remote)
            with replacing(local) as tmp, open(tmp, "wb") as f:
                while True:
                    head = self._read(8)
                    kind, length = head[:4], struct.unpack("<I", head[4:])[0]
                    if kind == b"DATA":
                        f.write(self._read(length))
                    elif kind == b"DONE":
                        break
                    elif kind == b"FAIL":
                        message = self._read(length).decode(errors="replace")
                        raise TransportError(f"pull of {remote} failed: {message}", device=self.device_id)
                    else:
                        raise EOFError(f"unexpected sync reply {kind!r}")
        self._guard(f"pull {remote}", go)

    def list(self, remote: str) -> list[tuple[str, int]]:
        """Return (name, mode) of the entries of directory remote, without '.' and '..'."""
        def go() -> list[tuple[str, int]]:
            self._request(b"LIST", remote)
            entries = []
            while True:
                head = self._read(20)
                if head[:4] == b"DONE":
                    return entries
                if head[:4] != b"DENT":
                    raise EOFError(f"unexpected sync reply {head[:4]!r}")
                mode, _size, _mtime, name_len = struct.unpack("<IIII", head[4:])
                name = self._read(name_len).decode("utf-8", "surrogateescape")
                if name not in (".", ".."):
                    entries.append((name, mode))
        return self._guard(f"list {remote}", go)


def _read_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    """Return n bytes from sock; socket.timeout past deadline (or the socket's timeout), EOFError at EOF."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("deadline passed")
            sock.settimeout(remaining)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"stream closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _close(conn) -> None:  # type: ignore[no-untyped-def]
    """Close an AdbConnection's socket at once (AdbConnection.close() sleeps 10 ms)."""
    try:
        conn.conn.close()
    except (AdbError, OSError):
        pass


def _server_up(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _is_network_serial(serial: str) -> bool:
    host, sep, port = serial.rpartition(":")
    return bool(sep and host and port.isdigit())


def resolve_qairt_sdk(configured: str | None) -> Path | None:
    """Return the QAIRT SDK root from the device entry's qairt_sdk or $QNN_SDK_ROOT, or None."""
    value = configured or os.environ.get("QNN_SDK_ROOT")
    return Path(value).expanduser() if value else None
