"""Real servers for the transport tests, all on 127.0.0.1 and all stopped afterwards.

* ``ssh_server(dir)``: OpenSSH's sshd (``/usr/sbin/sshd -D -e -f <dir>/sshd_config``) on a free
  port with a generated ed25519 host key and one authorized client key.
* ``adb_server(dir)``: Debian's adb server on a private port (ANDROID_ADB_SERVER_PORT), so a
  user's server on 5037 is never touched; ``kill-server`` at the end.
* ``emulated_phone(adb, soc, sandbox)``: the emulated adb device (in-process, or as a
  ``python -m harness.emulator.adbd`` subprocess that a test can kill), connected to that server.

Import these from test modules (``from servers import ...``; tests/ is on sys.path under pytest's
rootdir-relative imports) or from benchmarks (add tests/ to sys.path).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

REPO_ROOT = Path(__file__).resolve().parents[1]
SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen")
ADB = shutil.which("adb")
START_TIMEOUT_S = 20.0


def free_port() -> int:
    """Return a TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen | None = None, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"server exited with {proc.returncode}: {err}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


def ssh_keygen(path: Path) -> str:
    """Generate an unencrypted ed25519 key pair at path (+ .pub); return the public key line."""
    assert SSH_KEYGEN, "ssh-keygen is not installed (apt-get install openssh-client)"
    for old in (path, path.with_name(path.name + ".pub")):
        old.unlink(missing_ok=True)
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "harness-test", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    return path.with_name(path.name + ".pub").read_text().strip()


@dataclass
class SshServer:
    """A running sshd and what a client needs to reach it."""

    root: Path
    port: int
    host_public_key: str  # "ssh-ed25519 AAAA... comment"
    client_key: Path
    proc: subprocess.Popen

    def known_hosts_line(self) -> str:
        """Return the known_hosts line that trusts this server's host key."""
        key_type, key_b64 = self.host_public_key.split()[:2]
        return f"[127.0.0.1]:{self.port} {key_type} {key_b64}\n"

    def write_known_hosts(self, path: Path) -> Path:
        """Write a known_hosts file trusting this server; return its path."""
        path.write_text(self.known_hosts_line())
        return path

    def device_entry(self, device_id: str = "ssh-dev", soc: str = "qcs6490", **extra: Any) -> dict[str, Any]:
        """Return a devices.yaml entry for this server (known_hosts written under root)."""
        entry: dict[str, Any] = {
            "id": device_id, "soc": soc, "transport": "ssh", "host": "127.0.0.1", "port": self.port,
            "user": getpass.getuser(), "key_file": str(self.client_key),
            "known_hosts": str(self.write_known_hosts(self.root / "known_hosts")), "python": sys.executable,
            "workdir": str(self.root / "device-workdir")}
        entry.update(extra)
        return entry


@contextmanager
def ssh_server(root: Path) -> Iterator[SshServer]:
    """Run sshd on 127.0.0.1 (key auth only) for the duration of the block."""
    root.mkdir(parents=True, exist_ok=True)
    host_key, client_key = root / "host_ed25519", root / "client_ed25519"
    host_pub = ssh_keygen(host_key)
    (root / "authorized_keys").write_text(ssh_keygen(client_key) + "\n")
    port = free_port()
    config = root / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}", "PubkeyAuthentication yes",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
        "StrictModes no", "UsePAM no", f"PidFile {root / 'sshd.pid'}", "Subsystem sftp internal-sftp",
        "MaxSessions 64", "MaxStartups 64", "LogLevel ERROR", ""]))
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # root's sshd chroots its privsep child here
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_port(port, proc)
        yield SshServer(root, port, host_pub, client_key, proc)
    finally:
        _stop(proc)


@dataclass
class AdbServer:
    """A private adb server."""

    port: int
    env: dict[str, str]

    def adb(self, *args: str, check: bool = True, timeout_s: float = START_TIMEOUT_S) -> subprocess.CompletedProcess:
        """Return the completed `adb ARGS...` run against this server."""
        assert ADB is not None
        return subprocess.run([ADB, *args], env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout_s, check=check)

    def connect(self, serial: str) -> None:
        """`adb connect serial` and wait until the device is in state 'device'."""
        out = self.adb("connect", serial).stdout
        if "connected to" not in out:
            raise RuntimeError(f"adb connect {serial}: {out}")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            state = self.adb("-s", serial, "get-state", check=False)
            if state.stdout.strip() == "device":
                return
            time.sleep(0.1)
        raise RuntimeError(f"{serial} never reached state 'device'")


@contextmanager
def adb_server(home: Path) -> Iterator[AdbServer]:
    """Run an adb server on a free port for the duration of the block; kill it afterwards."""
    assert ADB is not None, "adb is not installed (apt-get install adb)"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "ANDROID_ADB_SERVER_PORT": str(port), "ANDROID_SDK_HOME": str(home), "HOME": str(home)}
    server = AdbServer(port, env)
    # The server daemon inherits pipes: do not capture start-server's output.
    subprocess.run([ADB, "start-server"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=START_TIMEOUT_S, check=True)
    try:
        yield server
    finally:
        subprocess.run([ADB, "kill-server"], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=START_TIMEOUT_S)


@dataclass
class EmulatedPhone:
    """An emulated adb device connected to an AdbServer."""

    serial: str
    sandbox: Path
    soc: str
    adb: AdbServer
    device: Any = None  # EmulatedAdbDevice when in-process
    proc: subprocess.Popen | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def device_entry(self, device_id: str = "adb-dev", soc: str | None = None, **extra: Any) -> dict[str, Any]:
        """Return a devices.yaml entry for this phone (the host Python runs the harness runner)."""
        entry: dict[str, Any] = {"id": device_id, "soc": soc or self.soc, "transport": "adb",
                                 "serial": self.serial, "adb_port": self.adb.port, "python": sys.executable}
        entry.update(extra)
        return entry

    def kill(self) -> None:
        """Stop the device abruptly (SIGKILL for a subprocess)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        elif self.device is not None:
            self.device.stop()


@contextmanager
def emulated_phone(adb: AdbServer, soc: str, sandbox: Path, subprocess_mode: bool = False,
                   properties: dict[str, str] | None = None) -> Iterator[EmulatedPhone]:
    """Run an emulated adb device (in-process, or as a killable subprocess) connected to adb."""
    sandbox.mkdir(parents=True, exist_ok=True)
    if subprocess_mode:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen([sys.executable, "-m", "harness.emulator.adbd", "--port", "0", "--soc", soc,
                                 "--sandbox", str(sandbox)], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "127.0.0.1:" not in line:
            proc.kill()
            raise RuntimeError(f"emulated adbd did not start: {line!r}")
        port = int(line.split("127.0.0.1:")[1].split(",")[0].split()[0])
        phone = EmulatedPhone(f"127.0.0.1:{port}", sandbox, soc, adb, proc=proc)
    else:
        from harness.emulator.adbd import EmulatedAdbDevice

        device = EmulatedAdbDevice(soc, sandbox, properties=properties)
        device.start()
        phone = EmulatedPhone(device.serial, sandbox, soc, adb, device=device)
    try:
        adb.connect(phone.serial)
        yield phone
    finally:
        adb.adb("disconnect", phone.serial, check=False)
        if phone.proc is not None:
            if phone.proc.poll() is None:
                phone.proc.send_signal(signal.SIGTERM)
                try:
                    phone.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    phone.proc.kill()
                    phone.proc.wait()
        elif phone.device is not None:
            phone.device.stop()


def write_devices_file(path: Path, entries: list[dict[str, Any]], catalog: Path | None = None) -> Path:
    """Write a devices file holding the repository's SoC catalog and entries; return its path."""
    import yaml

    data = yaml.safe_load((catalog or REPO_ROOT / "devices.yaml").read_text())
    data["devices"] = entries
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


LABGRID_COORDINATOR = shutil.which("labgrid-coordinator") or str(Path(sys.executable).with_name("labgrid-coordinator"))


@dataclass
class LabgridCoordinator:
    """A running labgrid-coordinator on 127.0.0.1, and labgrid-client against it."""

    root: Path
    port: int
    proc: subprocess.Popen

    @property
    def url(self) -> str:
        """Return the coordinator as the harness's --farm takes it."""
        return f"labgrid://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Return an environment naming this coordinator (LG_COORDINATOR), as labgrid's tools read it."""
        return {**os.environ, "LG_COORDINATOR": f"127.0.0.1:{self.port}"}

    def client(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Return the completed `labgrid-client ARGS...` run against this coordinator."""
        client = Path(LABGRID_COORDINATOR).with_name("labgrid-client")
        result = subprocess.run([str(client), *args], env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=START_TIMEOUT_S * 3)
        if check and result.returncode != 0:
            raise RuntimeError(f"labgrid-client {' '.join(args)}: {result.stderr or result.stdout}")
        return result

    def add_place(self, name: str, match: str, **tags: str) -> None:
        """Create a place matching the resources `match` (exporter/group/class) with tags."""
        self.client("-p", name, "create")
        self.client("-p", name, "add-match", match)
        if tags:
            self.client("-p", name, "set-tags", *[f"{k}={v}" for k, v in tags.items()])

    def place(self, name: str) -> Any:
        """Return the place as the coordinator describes it now (harness.farm.labgrid_client.PlaceView)."""
        from harness.farm.labgrid_client import Coordinator

        with Coordinator(self.url) as coordinator:
            return coordinator.places()[name]


@contextmanager
def labgrid_coordinator(root: Path) -> Iterator[LabgridCoordinator]:
    """Run labgrid-coordinator on a free port of 127.0.0.1 (its places file under root) for the block."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = subprocess.Popen([LABGRID_COORDINATOR, "-l", f"127.0.0.1:{port}"], cwd=root, stdin=subprocess.DEVNULL,
                            stdout=(root / "coordinator.log").open("w"), stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, proc)
        yield LabgridCoordinator(root, port, proc)
    finally:
        _stop(proc)


@contextmanager
def labgrid_exporter(coordinator: LabgridCoordinator, name: str, resources: dict[str, Any],
                     root: Path) -> Iterator[subprocess.Popen]:
    """Run labgrid-exporter `name` (standing for one host) exporting resources ({group: {class: params}})."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    config = root / f"{name}.yaml"
    config.write_text(yaml.safe_dump(resources, sort_keys=False))
    exporter = Path(LABGRID_COORDINATOR).with_name("labgrid-exporter")
    proc = subprocess.Popen([str(exporter), "-c", f"127.0.0.1:{coordinator.port}", "--name", name, str(config)],
                            cwd=root, stdin=subprocess.DEVNULL, stdout=(root / f"{name}.log").open("w"),
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:  # its resources are known to the coordinator
            out = coordinator.client("resources", check=False).stdout
            if all(f"{name}/{group}/" in out for group in resources):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"labgrid-exporter {name} exited: {(root / f'{name}.log').read_text()}")
            time.sleep(0.2)
        else:
            raise RuntimeError(f"labgrid-exporter {name}'s resources never reached the coordinator")
        yield proc
    finally:
        _stop(proc)


@contextmanager
def labgrid_farm(root: Path, lease_ttl_s: float = 30.0) -> Iterator[tuple[LabgridCoordinator, Path]]:
    """Run a farm of two "hosts" for the block: a coordinator and exporters host-a (SSH boards board-a1, board-a2)
    and host-b (board-b1 and the phone phone-b1, an emulated adbd behind a real adb server), every place sm8650;
    the boards are one real sshd on loopback, each with a work directory of its own. Yield the coordinator and a
    devices file naming it (its farm: section holds the boards' key and known_hosts)."""
    import yaml

    with labgrid_coordinator(root / "coordinator") as coordinator, ssh_server(root / "sshd") as sshd, \
            adb_server(root / "adbhome") as adb, emulated_phone(adb, "sm8650", root / "phone") as phone:
        board = {"address": "127.0.0.1", "port": sshd.port, "username": sshd.device_entry()["user"]}
        # copies: YAML would write one dict twice as an alias, and the exporter adds its keys to the shared object
        host_a = {"board1": {"NetworkService": dict(board)}, "board2": {"NetworkService": dict(board)}}
        host_b = {"board1": {"NetworkService": dict(board)},
                  "phone1": {"AdbDevice": {"serial": phone.serial, "address": "127.0.0.1", "port": adb.port}}}
        with labgrid_exporter(coordinator, "host-a", host_a, root / "exporter-a"), \
                labgrid_exporter(coordinator, "host-b", host_b, root / "exporter-b"):
            for name, match in (("board-a1", "host-a/board1/NetworkService"),
                                ("board-a2", "host-a/board2/NetworkService"),
                                ("board-b1", "host-b/board1/NetworkService")):
                coordinator.add_place(name, match, soc="sm8650", transport="ssh", python=sys.executable,
                                      workdir=str(root / "workdirs" / name))
            coordinator.add_place("phone-b1", "host-b/phone1/AdbDevice", soc="sm8650", transport="adb",
                                  python=sys.executable)
            devices_file = root / "devices.yaml"
            devices_file.write_text(yaml.safe_dump({"farm": {
                "coordinator": coordinator.url, "ssh_key_file": str(sshd.client_key),
                "known_hosts": str(sshd.write_known_hosts(root / "known_hosts")), "lease_ttl_s": lease_ttl_s}}))
            yield coordinator, devices_file


def _stop(proc: subprocess.Popen) -> None:
    """Stop a server: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
