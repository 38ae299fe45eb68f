"""End-to-end tests of the emulated adb device against the real adb server.

A dedicated adb server is started on a free port (ANDROID_ADB_SERVER_PORT) so a
user's server on 5037 is never touched; it is killed at teardown.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.emulator import adb_protocol as proto
from harness.emulator.adbd import (
    EmulatedAdbDevice,
    UnknownSocError,
    rewrite_device_paths,
    sandbox_path,
)

ADB = shutil.which("adb")
pytestmark = pytest.mark.skipif(ADB is None, reason="the `adb` binary is not on PATH")
adbutils = pytest.importorskip("adbutils", reason="the adbutils package is not installed")

REPO_ROOT = Path(__file__).resolve().parents[1]
ADB_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class AdbEnv:
    """A running emulated device connected to a private adb server."""

    device: EmulatedAdbDevice
    server_port: int
    env: dict[str, str]

    def adb(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Return the completed `adb -s SERIAL ARGS...` run."""
        return subprocess.run(
            [ADB, "-s", self.device.serial, *args], env=self.env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=ADB_TIMEOUT_S, check=check)

    def client_device(self):  # type: ignore[no-untyped-def]
        """Return the adbutils AdbDevice for the emulated device."""
        client = adbutils.AdbClient(host="127.0.0.1", port=self.server_port)
        return client.device(self.device.serial)


@pytest.fixture(scope="module")
def adb_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdbEnv]:
    sandbox = tmp_path_factory.mktemp("sandbox")
    device = EmulatedAdbDevice("sm8650", sandbox)
    device.start()
    server_port = _free_port()
    env = {**os.environ, "ANDROID_ADB_SERVER_PORT": str(server_port),
           "ANDROID_SDK_HOME": str(tmp_path_factory.mktemp("adbhome"))}
    assert ADB is not None
    try:
        # The server daemon may inherit pipes: do not capture start-server output.
        subprocess.run([ADB, "start-server"], env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=ADB_TIMEOUT_S, check=True)
        out = subprocess.run([ADB, "connect", device.serial], env=env, capture_output=True,
                             text=True, timeout=ADB_TIMEOUT_S, check=True).stdout
        assert "connected to" in out, out
        result = AdbEnv(device, server_port, env)
        dev = result.client_device()
        deadline = time.monotonic() + 10
        while True:
            try:
                if dev.get_state() == "device":
                    break
            except Exception:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                pytest.fail("emulated device never reached state 'device'")
            time.sleep(0.1)
        yield result
    finally:
        subprocess.run([ADB, "kill-server"], env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=ADB_TIMEOUT_S)
        device.stop()


# --------------------------------------------------------------------------- adbutils


def test_getprop_reports_soc_and_platform(adb_env: AdbEnv) -> None:
    dev = adb_env.client_device()
    assert dev.shell("getprop ro.soc.model") == "SM8650"
    assert dev.shell("getprop ro.board.platform") == "pineapple"
    assert dev.prop.get("ro.soc.manufacturer") == "QTI"
    listing = dev.shell("getprop")
    assert "[ro.product.cpu.abi]: [arm64-v8a]" in listing.splitlines()
    assert "[ro.build.version.sdk]: [34]" in listing.splitlines()
    assert dev.shell("getprop no.such.prop fallback") == "fallback"
    assert "shell_v2" in dev.get_features().split(",")


def test_shell2_exit_codes_and_stderr(adb_env: AdbEnv) -> None:
    dev = adb_env.client_device()
    assert dev.shell2("exit 3", v2=True).returncode == 3
    assert dev.shell2("true", v2=True).returncode == 0
    assert dev.shell2("false").returncode == 1  # legacy shell, adbutils' echo trick
    result = dev.shell2("echo out; echo err >&2; exit 7", v2=True)
    assert (result.returncode, result.stdout, result.stderr) == (7, "out\n", "err\n")
    # Legacy shell merges stderr into stdout, like adbd's raw non-v2 shell.
    assert sorted(dev.shell("echo a; echo b >&2").split()) == ["a", "b"]


def test_shell_runs_in_sandbox_with_rewritten_paths(adb_env: AdbEnv) -> None:
    dev = adb_env.client_device()
    sandbox = adb_env.device.sandbox
    assert dev.shell("pwd") == str(sandbox / "data/local/tmp")
    dev.shell("mkdir -p /sdcard/x && echo v >/sdcard/x/f.txt")
    assert (sandbox / "sdcard/x/f.txt").read_text() == "v\n"


def test_push_pull_large_file_roundtrip(adb_env: AdbEnv, tmp_path: Path) -> None:
    dev = adb_env.client_device()
    payload = os.urandom(3 * 1024 * 1024 + 123)  # > 1 MiB maxdata: split WRTEs
    local = tmp_path / "big.bin"
    local.write_bytes(payload)
    remote = "/data/local/tmp/harness/big.bin"  # parent does not exist yet
    assert dev.sync.push(local, remote) == len(payload)
    info = dev.sync.stat(remote)
    assert info.size == len(payload) and dev.sync.exists(remote)
    assert (adb_env.device.sandbox / "data/local/tmp/harness/big.bin").read_bytes() == payload
    back = tmp_path / "back.bin"
    assert dev.sync.pull(remote, back) == len(payload)
    assert back.read_bytes() == payload
    digest = dev.shell(f"sha256sum {shlex.quote(remote)}").split()[0]
    assert digest == hashlib.sha256(payload).hexdigest()


def test_stat_of_missing_file(adb_env: AdbEnv) -> None:
    dev = adb_env.client_device()
    info = dev.sync.stat("/data/local/tmp/does-not-exist")
    assert info.mode == 0 and info.size == 0 and info.mtime is None
    assert not dev.sync.exists("/data/local/tmp/does-not-exist")
    with pytest.raises(adbutils.AdbError, match="No such file"):
        dev.sync.read_bytes("/data/local/tmp/does-not-exist")


def test_paths_escaping_the_sandbox_are_refused(adb_env: AdbEnv) -> None:
    dev = adb_env.client_device()
    assert not dev.sync.exists("/../../etc/passwd")
    with pytest.raises(adbutils.AdbError):
        dev.sync.read_bytes("/../etc/passwd")
    with pytest.raises(adbutils.AdbError):
        dev.sync.push(b"x", "/data/../../escaped.txt")
    assert not (adb_env.device.sandbox.parent / "escaped.txt").exists()


def test_odd_file_names_push_and_list(adb_env: AdbEnv) -> None:
    dev = adb_env.client_device()
    directory = "/data/local/tmp/odd names"
    names = ["with space.txt", "it's.txt", "semi;colon.txt"]
    for name in names:
        dev.sync.push(name.encode(), f"{directory}/{name}")
    listed = {f.path for f in dev.sync.list(directory)} - {".", ".."}
    assert listed == set(names)
    assert sorted(dev.shell(f"ls {shlex.quote(directory)}").splitlines()) == sorted(names)
    for name in names:
        path = shlex.quote(f"{directory}/{name}")
        assert dev.shell(f"cat {path}") == name


def test_concurrent_shells(adb_env: AdbEnv) -> None:
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            dev = adb_env.client_device()
            for round_index in range(5):
                result = dev.shell2(f"sleep 0.05; echo {index}-{round_index}; exit {index}",
                                    v2=True)
                assert result.stdout == f"{index}-{round_index}\n"
                assert result.returncode == index
        except BaseException as exc:  # reported from the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors


def test_host_closing_the_stream_kills_the_shell(adb_env: AdbEnv) -> None:
    dev = adb_env.client_device()
    pid_file = adb_env.device.sandbox / "data/local/tmp/sleeper.pid"
    pid_file.unlink(missing_ok=True)
    conn = dev.shell("echo $$ > /data/local/tmp/sleeper.pid; exec sleep 60", stream=True)
    deadline = time.monotonic() + 5
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "shell never started"
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    conn.close()
    deadline = time.monotonic() + 5
    while _alive(pid):
        assert time.monotonic() < deadline, f"shell {pid} still alive after the host closed"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie awaiting its reaper counts as gone
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# --------------------------------------------------------------------------- adb CLI


def test_adb_cli_shell_push_pull(adb_env: AdbEnv, tmp_path: Path) -> None:
    assert adb_env.adb("shell", "echo", "hi").stdout == "hi\n"
    assert adb_env.adb("shell", "exit 5", check=False).returncode == 5
    payload = os.urandom(2 * 1024 * 1024 + 7)
    local = tmp_path / "cli.bin"
    local.write_bytes(payload)
    adb_env.adb("push", str(local), "/data/local/tmp/cli/cli.bin")
    back = tmp_path / "cli_back.bin"
    adb_env.adb("pull", "/data/local/tmp/cli/cli.bin", str(back))
    assert back.read_bytes() == payload
    missing = adb_env.adb("pull", "/data/local/tmp/cli/missing.bin", str(tmp_path / "m"),
                          check=False)
    assert missing.returncode != 0 and "No such file" in missing.stdout + missing.stderr
    local_dir = tmp_path / "tree"
    (local_dir / "sub").mkdir(parents=True)
    (local_dir / "a.txt").write_text("a")
    (local_dir / "sub" / "b.txt").write_text("b")
    adb_env.adb("push", str(local_dir), "/data/local/tmp/")
    adb_env.adb("pull", "/data/local/tmp/tree", str(tmp_path / "tree_back"))
    assert (tmp_path / "tree_back" / "sub" / "b.txt").read_text() == "b"


# --------------------------------------------------------------------------- raw protocol


def parse_banner(payload: bytes) -> tuple[str, dict[str, str], set[str]]:
    """Return (kind, properties, features) of a CNXN banner `kind:serial:k=v;k=v;features=a,b`."""
    text = payload.rstrip(b"\0").decode("utf-8", "replace")
    kind, _, rest = text.partition(":")
    props = dict(item.partition("=")[::2] for item in rest.partition(":")[2].split(";") if "=" in item)
    return kind, props, {f for f in props.pop("features", "").split(",") if f}


class RawHost:
    """A minimal host side of the transport, for checks adb cannot make."""

    def __init__(self, port: int, max_payload_bytes: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.send(proto.A_CNXN, proto.A_VERSION, max_payload_bytes, b"host::features=shell_v2\0")
        reply = self.recv()
        assert reply.command == proto.A_CNXN
        self.banner = reply.payload

    def send(self, command: int, arg0: int, arg1: int, payload: bytes = b"") -> None:
        self.sock.sendall(proto.Message(command, arg0, arg1, payload).encode())

    def recv(self) -> proto.Message:
        msg = proto.read_message(self.sock)
        assert msg is not None, "device closed the connection"
        return msg

    def run_shell_v2(self, local_id: int, command: str) -> tuple[bytes, int, list[int]]:
        """Return (stdout, exit code, WRTE sizes) of one shell,v2 stream."""
        self.send(proto.A_OPEN, local_id, 0, f"shell,v2,raw:{command}\0".encode())
        okay = self.recv()
        assert okay.command == proto.A_OKAY and okay.arg1 == local_id
        device_id = okay.arg0
        close_stdin = proto.shell_packet(proto.SHELL_CLOSE_STDIN, b"")
        self.send(proto.A_WRTE, local_id, device_id, close_stdin)
        data, sizes = bytearray(), []
        while True:
            msg = self.recv()
            if msg.command == proto.A_WRTE:
                sizes.append(len(msg.payload))
                data += msg.payload
                self.send(proto.A_OKAY, local_id, device_id)
            elif msg.command == proto.A_CLSE:
                break
        stdout, exit_code, pos = bytearray(), -1, 0
        while pos < len(data):
            packet_id, length = proto.SHELL_HEADER.unpack_from(data, pos)
            body = bytes(data[pos + 5:pos + 5 + length])
            pos += 5 + length
            if packet_id == proto.SHELL_STDOUT:
                stdout += body
            elif packet_id == proto.SHELL_EXIT:
                exit_code = body[0]
        return bytes(stdout), exit_code, sizes

    def close(self) -> None:
        self.sock.close()


def test_raw_protocol_small_maxdata_and_two_connections(tmp_path: Path) -> None:
    with EmulatedAdbDevice("sm8550", tmp_path / "sb") as device:
        first, second = RawHost(device.port, 4096), RawHost(device.port, 1 << 20)
        try:
            kind, props, features = parse_banner(first.banner)
            assert kind == "device" and props["ro.product.device"] == "kalama"
            assert {"shell_v2", "stat_v2", "ls_v2"} <= features
            stdout, code, sizes = first.run_shell_v2(1, "head -c 100000 /dev/zero; exit 9")
            assert (len(stdout), code) == (100000, 9)
            assert max(sizes) <= 4096  # never larger than the host's maxdata
            stdout, code, _ = second.run_shell_v2(7, "getprop ro.board.platform")
            assert (stdout, code) == (b"kalama\n", 0)
            first.send(proto.A_OPEN, 2, 0, b"no-such-service:\0")
            refused = first.recv()
            assert (refused.command, refused.arg0, refused.arg1) == (proto.A_CLSE, 0, 2)
        finally:
            first.close()
            second.close()


# --------------------------------------------------------------------------- units and CLI


def test_path_rewrite_and_mapping(tmp_path: Path) -> None:
    root = Path("/sb")
    assert rewrite_device_paths("cat /data/x '/sdcard/y' a=/sys/z >/data/o /proc/p /datax/",
                                root) == \
        "cat /sb/data/x '/sb/sdcard/y' a=/sb/sys/z >/sb/data/o /proc/p /datax/"
    assert sandbox_path(tmp_path, "/data/local/tmp/x") == tmp_path / "data/local/tmp/x"
    with pytest.raises(PermissionError):
        sandbox_path(tmp_path, "/data/../../x")


def test_unknown_soc_and_properties_override(tmp_path: Path) -> None:
    with pytest.raises(UnknownSocError, match="sm8650"):
        EmulatedAdbDevice("sm0000", tmp_path)
    device = EmulatedAdbDevice("qcs6490", tmp_path, properties={"ro.build.version.sdk": "33"})
    assert device.properties["ro.board.platform"] == "qcm6490"
    assert device.properties["ro.build.version.sdk"] == "33"


def _cli(*args: str, **kwargs) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "harness.emulator.adbd", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_cli_errors_exit_2(tmp_path: Path) -> None:
    proc = _cli("--port", "0", "--soc", "sm0000", "--sandbox", str(tmp_path / "a"))
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 2 and "known SoCs" in err and "sm8650" in err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = _cli("--port", str(port), "--soc", "sm8650", "--sandbox", str(tmp_path / "b"))
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 2 and "in use" in err and "Traceback" not in err


def test_cli_runs_until_sigterm(tmp_path: Path) -> None:
    proc = _cli("--port", "0", "--soc", "sm8650", "--sandbox", str(tmp_path / "c"))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in line
        port = int(line.split("127.0.0.1:")[1].split(",")[0])
        host = RawHost(port, 1 << 20)
        assert parse_banner(host.banner)[1]["ro.product.device"] == "pineapple"
        host.close()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert "connection from" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_harness_catalog_is_preferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    @dataclass
    class FakeSoc:
        board_platform: str
        name: str

    fake = types.ModuleType("harness.devices")
    fake.load_catalog = lambda: types.SimpleNamespace(  # type: ignore[attr-defined]
        socs={"sm8650": FakeSoc("pineapple-x", "Gen 3 X"), "sm9999": FakeSoc("future", "F")})
    monkeypatch.setitem(sys.modules, "harness.devices", fake)
    assert EmulatedAdbDevice("sm8650", tmp_path).properties["ro.board.platform"] == "pineapple-x"
    future = EmulatedAdbDevice("sm9999", tmp_path).properties
    assert (future["ro.soc.model"], future["ro.product.model"]) == ("SM9999", "Emulated F")
    assert EmulatedAdbDevice("sm8850", tmp_path).properties["ro.board.platform"] == "canoe"
