"""Signals: a run ended by SIGTERM (the way a CI timeout ends it) or SIGINT (Ctrl-C) during Step 7's soak
leaves no device-runner process and no half-written file behind, and does not exit green; a command a
transport runs dies on the device when the host's wait for it is interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.shutdown import Interrupted, install

REPO = Path(__file__).resolve().parent.parent
RUNNER_MARK = "device_runner.py"  # the one-shot runner and the persistent one (`device_runner.py --serve`)
REACH_SOAK_TIMEOUT_S = 600.0
EXIT_TIMEOUT_S = 60.0
LEFTOVER_PATTERNS = ("*.part", ".tmp-*", "*.tmp")

# Loaded into the run under test with -p: marks the moment the harness starts the soak (whatever form the
# device runner has), so that the signal surely arrives during it. It does not change what the run does.
PROBE = '''
import os
from harness.runner import client

_soak = client.DeviceRunner.soak


def _marked_soak(self, *args, **kwargs):
    open(os.environ["SIGNALS_PROBE_MARK"], "w").close()
    return _soak(self, *args, **kwargs)


client.DeviceRunner.soak = _marked_soak
'''


def _processes_under(root: Path) -> dict[int, str]:
    """Return {pid: cmdline} of the processes working under root (cwd or an argument there), or running the
    device runner with root in their environment's cache dir."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone, or not ours to read
            continue
        if cwd.startswith(str(root)) or str(root) in cmdline:
            found[int(entry.name)] = cmdline
    return found


def _runners_under(root: Path) -> dict[int, str]:
    return {pid: cmd for pid, cmd in _processes_under(root).items() if RUNNER_MARK in cmd}


def _leftovers(*roots: Path) -> list[Path]:
    """Return the temporary files of interrupted atomic writes under roots."""
    return sorted(p for root in roots if root.exists() for pattern in LEFTOVER_PATTERNS for p in root.rglob(pattern))


def _wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout_s:g} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def run_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs' own artifact cache (the second run reuses what the first built)."""
    return tmp_path_factory.mktemp("signals-cache")


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT], [signal.SIGTERM, signal.SIGTERM]],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-twice"])
def test_signal_during_the_soak_leaves_no_runner_and_no_partial_file(signals, run_cache, tmp_path):
    probe_dir, allure, kpi_json, mark, log = (tmp_path / "probe", tmp_path / "allure", tmp_path / "kpi" / "kpi.json",
                                              tmp_path / "soak-started", tmp_path / "pytest.log")
    probe_dir.mkdir()
    (probe_dir / "signals_probe.py").write_text(PROBE)
    env = {**os.environ, "HARNESS_CACHE_DIR": str(run_cache), "HARNESS_LOCK_DIR": str(tmp_path / "locks"),
           "HARNESS_EMULATOR_DIR": str(run_cache / "emulator"),
           "SIGNALS_PROBE_MARK": str(mark),
           "PYTHONPATH": os.pathsep.join(p for p in [str(probe_dir), os.environ.get("PYTHONPATH")] if p)}
    cmd = [sys.executable, "-m", "pytest", str(REPO / "suites" / "test_12_sustained.py"), "--device", "sm8650",
           "--soak-duration", "600", "--cooldown-max-s", "0", "-p", "signals_probe", "-p", "no:cacheprovider",
           f"--alluredir={allure}", f"--kpi-json={kpi_json}", "-q"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _wait_for(mark.exists, REACH_SOAK_TIMEOUT_S, "soak", proc, log)
        _wait_for(lambda: _runners_under(run_cache), 60, "device runner under the run's cache", proc, log)
        time.sleep(3)  # into the soak (the runner has loaded its session)
        assert proc.poll() is None, log.read_text()[-3000:]
        for signum in signals:
            os.kill(proc.pid, signum)
            time.sleep(0.3)
        try:
            rc = proc.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"pytest still runs {EXIT_TIMEOUT_S:g} s after {signals}:\n{log.read_text()[-3000:]}")
        output = log.read_text()
        assert rc == pytest.ExitCode.INTERRUPTED, output[-3000:]
        assert "received: stopping the run" in output, output[-3000:]
        deadline = time.monotonic() + 3  # killed processes may take a moment to be reaped
        while _processes_under(run_cache) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_under(run_cache) == {}
        assert _leftovers(run_cache, allure, kpi_json.parent) == []
        assert json.loads(kpi_json.read_text())["devices"][0]["id"] == "sm8650-emu"  # sessionfinish ran
        jobs = run_cache / "emulator" / "sm8650-emu" / "data" / "local" / "tmp" / "harness" / "jobs"
        assert not jobs.exists()  # the device pool cleaned the device up
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in _processes_under(run_cache):  # what the run left is not left on this machine
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --------------------------------------------------------------------------- transports


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _interrupt_when(path: Path, signum: int = signal.SIGTERM) -> threading.Thread:
    """Start a thread that sends signum to this process once path exists (the command has started)."""

    def wait_then_signal() -> None:
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=wait_then_signal, daemon=True)
    thread.start()
    return thread


# A shell that starts a child in the background and waits: both must die with the interrupted wait.
FAMILY = ["sh", "-c", "sleep 300 & echo $! > child.new; echo $$ > shell.pid; mv child.new child.pid; wait"]


def _check_interrupted_command_dies(transport, workdir: Path) -> None:
    guard = install()  # this test's own handlers: the first SIGTERM raises Interrupted
    try:
        thread = _interrupt_when(workdir / "child.pid")
        with pytest.raises(Interrupted, match="SIGTERM received"):
            transport.run(FAMILY, timeout_s=120)
        thread.join()
    finally:
        guard.restore()
    pids = [int((workdir / name).read_text()) for name in ("shell.pid", "child.pid")]
    deadline = time.monotonic() + 5  # the remote kill does not wait
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)]
    assert transport.run(["true"], timeout_s=30).rc == 0  # the device is still in the session


def test_interrupted_emulator_command_dies_with_its_children(devices, tmp_path):
    from harness.transports import open_transport

    dev = devices.select(["sm8650-emu"])[0]
    transport = open_transport(dev, devices.soc(dev.soc), tmp_path)
    try:
        _check_interrupted_command_dies(transport, transport.workdir)
    finally:
        transport.close()


def test_interrupted_ssh_command_is_killed_on_the_device(tmp_path_factory, devices, tmp_path):
    from harness.devices import SshDevice
    from harness.transports import open_transport
    from servers import SSHD, ssh_server

    if not Path(SSHD).exists():
        pytest.skip("openssh-server is not installed")
    with ssh_server(tmp_path_factory.mktemp("sshd")) as sshd:
        entry = SshDevice(**sshd.device_entry(soc="sm8650", workdir=str(tmp_path / "workdir"), soc_detect="off"))
        transport = open_transport(entry, devices.soc("sm8650"), tmp_path)
        try:
            _check_interrupted_command_dies(transport, Path(transport.workdir))
        finally:
            transport.close()


def test_interrupted_adb_command_is_killed_on_the_device(tmp_path_factory, devices, tmp_path):
    from harness.devices import AdbDevice
    from harness.transports import open_transport
    from servers import ADB, adb_server, emulated_phone

    if ADB is None:
        pytest.skip("the `adb` binary is not installed")
    with adb_server(tmp_path_factory.mktemp("adbhome")) as adb, \
            emulated_phone(adb, "sm8650", tmp_path_factory.mktemp("phone")) as phone:
        transport = open_transport(AdbDevice(**phone.device_entry()), devices.soc("sm8650"), tmp_path)
        try:
            _check_interrupted_command_dies(transport, phone.sandbox / transport.workdir.lstrip("/"))
        finally:
            transport.cleanup()
            transport.close()
