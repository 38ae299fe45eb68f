"""SSH transport (paramiko) for Linux Snapdragon boards, e.g. QCS6490 dev kits.

* Key authentication only (``key_file``; no agent, no password prompts).
* Host keys are checked against ``known_hosts``; an unknown or changed key is refused with a
  message saying how to trust it. ``trust_on_first_use: true`` accepts an unknown key once and
  records it in known_hosts (a changed key is always refused).
* Files go over SFTP (written to ``<name>.part`` then renamed); a push skips files whose SHA-256
  on the device already matches (one ``sha256sum`` command per batch).
* Commands run as ``cd <workdir> && <quoted argv>`` with a timeout; past it the command's
  process group is killed on the device (sshd makes each session's shell a group leader).
* The device-side runner runs with the device entry's ``python:`` (split like a shell would).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import posixpath
import select
import shlex
import socket
import stat
import threading
import time
from pathlib import Path

import paramiko

from harness.errors import (ConfigError, DeviceTimeoutError, HostKeyError, TransientTransportError,
                            TransportError)
from harness.transports.shell import (CommandInterrupted, ShellStream, ShellTransport, _batches, kill_line,
                                      split_pid, with_pid_marker)

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 16


def fingerprint(key: paramiko.PKey) -> str:
    """Return the OpenSSH-style SHA256 fingerprint of a public key."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    """Return the name a host has in known_hosts: `host`, or `[host]:port` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):
    """Refuses an unknown host key, saying how to trust it."""

    def __init__(self, transport: "SshTransport") -> None:
        self.transport = transport

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        d = self.transport.device
        known = self.transport.known_hosts
        raise HostKeyError(
            f"the host key of {hostname} ({key.get_name()} {fingerprint(key)}) is not in {known}: refusing to "
            f"connect. Check the fingerprint on the device (ssh-keygen -lf /etc/ssh/ssh_host_{_key_file_kind(key)}"
            f"_key.pub), then trust it with `ssh-keyscan -p {d.port} {d.host} >> {known}`, or set "
            f"`trust_on_first_use: true` on device '{d.id}' in devices.yaml", device=d.id)


class _TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Accepts an unknown host key and appends it to known_hosts."""

    def __init__(self, transport: "SshTransport") -> None:
        self.transport = transport

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        known = self.transport.known_hosts
        known.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        prefix = "" if not known.exists() or known.read_bytes().endswith(b"\n") or known.stat().st_size == 0 else "\n"
        with open(known, "a") as f:
            f.write(f"{prefix}{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
        logger.warning("[%s] trusting the new host key of %s (%s %s) on first use; recorded in %s",
                       self.transport.device_id, hostname, key.get_name(), fingerprint(key), known)


def _key_file_kind(key: paramiko.PKey) -> str:
    name = key.get_name()
    return "ed25519" if "ed25519" in name else "ecdsa" if "ecdsa" in name else "rsa"


class SshTransport(ShellTransport):
    """A Linux device reached over SSH: commands over exec channels, files over SFTP."""

    platform = "linux"
    telemetry_source = "measured"
    connect_timeout_s: float = 15.0

    def __init__(self, device, soc) -> None:  # type: ignore[no-untyped-def]
        super().__init__(device, soc, device.workdir)
        self.key_file = Path(device.key_file).expanduser()
        self.known_hosts = Path(device.known_hosts).expanduser()
        if not self.key_file.is_file():
            raise ConfigError(f"device '{device.id}': key_file {self.key_file} does not exist "
                              "(create one with `ssh-keygen -t ed25519 -f <path>` and install its .pub on the device)")
        self._lock = threading.RLock()
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._connect_first(self._connect, f"{device.user}@{device.host}:{device.port}")
        self.make_workdir()

    @property
    def python(self) -> list[str]:
        return shlex.split(self.device.python)

    # ---------------------------------------------------------------- connection

    def _connect(self) -> None:
        d = self.device
        client = paramiko.SSHClient()
        if self.known_hosts.is_file():
            try:
                client.load_host_keys(str(self.known_hosts))
            except (OSError, paramiko.SSHException) as e:
                raise ConfigError(f"device '{d.id}': cannot read known_hosts {self.known_hosts}: {e}") from None
        client.set_missing_host_key_policy(_TrustOnFirstUse(self) if d.trust_on_first_use else _RefuseUnknown(self))
        try:
            sock = socket.create_connection((d.host, d.port), timeout=self.connect_timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # else ~40 ms per channel request
            _keepalive(sock)
        except OSError as e:
            raise TransientTransportError(f"cannot connect to {d.host}:{d.port}: {e}", device=d.id) from None
        try:
            client.connect(d.host, port=d.port, username=d.user, key_filename=str(self.key_file), sock=sock,
                           timeout=self.connect_timeout_s, banner_timeout=self.connect_timeout_s,
                           auth_timeout=self.connect_timeout_s, allow_agent=False, look_for_keys=False)
        except HostKeyError:
            client.close()
            sock.close()
            raise
        except paramiko.BadHostKeyException as e:
            client.close()
            name = known_hosts_name(d.host, d.port)
            raise HostKeyError(
                f"the host key of {name} has CHANGED: the device offered {e.key.get_name()} {fingerprint(e.key)}, "
                f"{self.known_hosts} holds {fingerprint(e.expected_key)}. Refusing to connect: someone may be "
                f"intercepting the connection. If the device was reinstalled, remove the old key with "
                f"`ssh-keygen -R '{name}' -f {self.known_hosts}` and trust the new one", device=d.id) from None
        except paramiko.AuthenticationException as e:
            client.close()
            raise TransportError(
                f"authentication as {d.user}@{d.host}:{d.port} with key_file {self.key_file} failed ({e}): add the "
                f"public key (`ssh-keygen -y -f {self.key_file}`) to ~{d.user}/.ssh/authorized_keys on the device",
                device=d.id) from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            client.close()
            sock.close()
            raise TransientTransportError(f"cannot connect to {d.host}:{d.port}: {e}", device=d.id) from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)
        with self._lock:
            self._client, self._sftp = client, None

    def _reconnect(self) -> None:
        self._drop()
        self._connect()

    def _drop(self) -> None:
        with self._lock:
            client, sftp = self._client, self._sftp
            self._client = self._sftp = None
        for closable in (sftp, client):
            if closable is not None:
                try:
                    closable.close()
                except Exception:  # closing a dead connection may fail in many ways
                    pass

    def close(self) -> None:
        self._drop()

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            client = self._client
        transport = client.get_transport() if client is not None else None
        if transport is None or not transport.is_active():
            raise TransientTransportError("the SSH connection is closed", device=self.device_id)
        return transport

    def _sftp_client(self) -> paramiko.SFTPClient:
        with self._lock:
            if self._sftp is None:
                try:
                    self._sftp = paramiko.SFTPClient.from_transport(self._transport())
                except (paramiko.SSHException, OSError, EOFError) as e:
                    raise TransientTransportError(f"cannot open SFTP: {e}", device=self.device_id) from None
                if self._sftp is None:
                    raise TransientTransportError("cannot open SFTP", device=self.device_id)
                self._sftp.get_channel().settimeout(self.io_timeout_s)
            return self._sftp

    def _translate(self, e: BaseException, what: str) -> TransportError:
        """Return the harness error for a paramiko/socket error raised during `what`."""
        if isinstance(e, TransportError):
            return e
        if isinstance(e, socket.timeout):
            return DeviceTimeoutError(f"{what} timed out after {self.io_timeout_s:g} s", device=self.device_id)
        try:
            alive = self._transport() is not None
        except TransientTransportError:
            alive = False
        if not alive or isinstance(e, (EOFError, paramiko.SSHException, ConnectionError)):
            with self._lock:
                self._sftp = None
            return TransientTransportError(f"{what}: connection lost ({e})", device=self.device_id)
        return TransportError(f"{what}: {e}", device=self.device_id)

    # ---------------------------------------------------------------- commands

    def _exec_bytes(self, command: str, timeout_s: float) -> tuple[int, bytes, str]:
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=min(timeout_s, self.connect_timeout_s))
            chan.exec_command(with_pid_marker(command))
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise TransientTransportError(f"cannot start a command: {e}", device=self.device_id) from None
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                progressed = False
                while chan.recv_ready():
                    out += chan.recv(_CHUNK_BYTES)
                    progressed = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(_CHUNK_BYTES)
                    progressed = True
                drained = not chan.recv_ready() and not chan.recv_stderr_ready()
                # sshd may send the exit status before the last output: wait for EOF too.
                if drained and chan.eof_received and chan.exit_status_ready():
                    break
                if drained and chan.closed:
                    if not transport.is_active():
                        raise CommandInterrupted("the SSH connection dropped while the command ran",
                                                 device=self.device_id)
                    break  # closed without an exit status: killed by a signal
                if progressed:
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    pid, stderr = split_pid(err.decode(errors="replace"))
                    self._kill(pid)
                    raise DeviceTimeoutError(f"command timed out after {timeout_s:g} s", device=self.device_id,
                                             stderr=stderr)
                if not transport.is_active():
                    raise CommandInterrupted("the SSH connection dropped while the command ran",
                                             device=self.device_id)
                select.select([chan], [], [], min(0.02 if chan.eof_received else 0.25, remaining))
        except BaseException as e:
            if not isinstance(e, TransportError):  # interrupted here (Ctrl-C, SIGTERM): stop it on the device
                self._kill_interrupted(chan, err)
            raise
        finally:
            chan.close()
        rc = chan.recv_exit_status() if chan.exit_status_ready() else -1
        _pid, stderr = split_pid(err.decode(errors="replace"))
        return rc, bytes(out), stderr

    can_stream = True

    def _open_stream(self, command: str) -> "_SshStream":
        try:
            chan = self._transport().open_session(timeout=self.connect_timeout_s)
            chan.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise TransientTransportError(f"cannot start a command: {e}", device=self.device_id) from None
        return _SshStream(self, chan)

    def _kill(self, pid: int | None) -> None:
        """Kill a timed-out command's process group on the device (best effort, not waiting)."""
        if pid is None:
            return
        try:
            chan = self._transport().open_session(timeout=self.probe_timeout_s)
            chan.exec_command(kill_line(pid))
            chan.recv_exit_status()
            chan.close()
        except Exception as e:  # the device may be gone; the probe that follows will tell
            logger.debug("[%s] could not kill pid %s: %s", self.device_id, pid, e)

    def _kill_interrupted(self, chan: paramiko.Channel, err: bytearray) -> None:
        """Kill the process group of a command whose wait was interrupted on the host (closing a channel
        without a pty does not stop it), waiting up to 2 s for its pid line when it has not arrived yet."""
        deadline = time.monotonic() + 2.0
        while b"\n" not in err and not chan.closed and time.monotonic() < deadline:
            if chan.recv_stderr_ready():
                err += chan.recv_stderr(_CHUNK_BYTES)
            else:
                time.sleep(0.02)
        self._kill(split_pid(err.decode(errors="replace"))[0])

    # ---------------------------------------------------------------- files

    def _send_files(self, pairs: list[tuple[Path, str]]) -> None:
        sftp = self._sftp_client()
        made_dirs = False
        for index, (src, dst) in enumerate(pairs):
            tmp = f"{dst}.part"
            try:
                try:
                    sftp.put(str(src), tmp)
                except FileNotFoundError:  # a parent directory is missing: create them all, once
                    if made_dirs:
                        raise
                    self._make_dirs(sorted({posixpath.dirname(d) for _, d in pairs[index:]}))
                    made_dirs = True
                    sftp.put(str(src), tmp)
                if os.stat(src).st_mode & 0o111:
                    sftp.chmod(tmp, 0o755)
                sftp.posix_rename(tmp, dst)
            except TransportError:
                raise
            except Exception as e:
                raise self._translate(e, f"pushing {src.name} to {dst}") from None

    def _make_dirs(self, dirs: list[str]) -> None:
        for batch in _batches(dirs, self.max_command_bytes):
            rc, _out, err = self._exec(shlex.join(["mkdir", "-p", "--", *batch]), self.io_timeout_s)
            if rc != 0:
                raise TransportError("cannot create directories on the device", device=self.device_id,
                                     argv=["mkdir", "-p", *batch[:3]], rc=rc, stderr=err)

    def _receive(self, remote_abs: str, local: Path) -> None:
        sftp = self._sftp_client()
        try:
            attrs = sftp.stat(remote_abs)
        except FileNotFoundError:
            raise TransportError(f"no such file on device: {remote_abs}", device=self.device_id) from None
        except Exception as e:
            raise self._translate(e, f"pulling {remote_abs}") from None
        try:
            if stat.S_ISDIR(attrs.st_mode or 0):
                self._get_tree(sftp, remote_abs, local)
            else:
                local.parent.mkdir(parents=True, exist_ok=True)
                sftp.get(remote_abs, str(local))
        except Exception as e:
            raise self._translate(e, f"pulling {remote_abs}") from None

    def _get_tree(self, sftp: paramiko.SFTPClient, remote: str, local: Path) -> None:
        local.mkdir(parents=True, exist_ok=True)
        for entry in sftp.listdir_attr(remote):
            src = posixpath.join(remote, entry.filename)
            if stat.S_ISDIR(entry.st_mode or 0):
                self._get_tree(sftp, src, local / entry.filename)
            elif stat.S_ISREG(entry.st_mode or 0):
                sftp.get(src, str(local / entry.filename))


class _SshStream(ShellStream):
    """A kept command on an SSH exec channel: stdin, stdout and stderr are the channel's."""

    def __init__(self, transport: SshTransport, chan: paramiko.Channel) -> None:
        super().__init__(transport)
        self.chan = chan

    def _send(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise EOFError(f"the SSH channel is closed ({e})") from None

    def _recv(self, timeout_s: float) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        while True:
            while self.chan.recv_stderr_ready():
                self._note_stderr(self.chan.recv_stderr(_CHUNK_BYTES))
            if self.chan.recv_ready():
                return self.chan.recv(_CHUNK_BYTES)
            if not self.alive():
                return b""
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            select.select([self.chan], [], [], min(0.25, remaining))

    def alive(self) -> bool:
        transport = self.chan.get_transport()
        return not (self.chan.eof_received or self.chan.closed or transport is None or not transport.is_active())

    def _release(self) -> None:
        self.chan.close()


def _keepalive(sock: socket.socket, idle_s: int = 15, interval_s: int = 5, probes: int = 4) -> None:
    """Make the kernel notice a vanished device (powered off, network gone) within about 35 s."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", idle_s), ("TCP_KEEPINTVL", interval_s), ("TCP_KEEPCNT", probes)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
