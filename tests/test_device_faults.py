"""Faults: bounded retries with backoff, devices taken out of the session, the others going on."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.cache import ArtifactCache
from harness.devices import load_devices_file
from harness.errors import DeviceLostError, TransientTransportError, TransportError
from harness.session import DevicePool
from harness.transports.retry import Backoff, retry_call
from servers import ADB, adb_server, emulated_phone, write_devices_file

REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "suites"
FIRST_STEPS = [str(SUITES / name) for name in ("test_01_feasibility.py", "test_02_conversion.py",
                                               "test_03_float_baseline.py", "test_04_ptq.py")]


# --------------------------------------------------------------------------- retry


def test_backoff_delays_are_exponential_and_capped():
    assert Backoff(attempts=5, initial_s=0.5, factor=2, max_s=3).delays_s() == [0.5, 1.0, 2.0, 3.0]
    assert Backoff(attempts=1).delays_s() == [] and sum(Backoff(attempts=3, initial_s=1).delays_s()) == 3.0


def test_retry_call_retries_transient_errors_then_gives_up():
    calls, waits, reconnects = [], [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise TransientTransportError("connection reset")
        return "ok"

    assert retry_call(flaky, backoff=Backoff(attempts=3, initial_s=0.1), retry_on=(TransientTransportError,),
                      on_retry=lambda attempt, e: reconnects.append(attempt), sleep=waits.append) == "ok"
    assert (len(calls), waits, reconnects) == (3, [0.1, 0.2], [2, 3])

    def dead():
        raise TransientTransportError("connection refused")

    waits.clear()
    with pytest.raises(TransientTransportError, match="refused"):
        retry_call(dead, backoff=Backoff(attempts=4, initial_s=1, max_s=1.5), retry_on=(TransientTransportError,),
                   sleep=waits.append)
    assert waits == [1, 1.5, 1.5]


def test_retry_call_does_not_retry_other_errors():
    calls = []

    def broken():
        calls.append(1)
        raise TransportError("permission denied")

    with pytest.raises(TransportError):
        retry_call(broken, backoff=Backoff(attempts=5), retry_on=(TransientTransportError,), sleep=lambda s: None)
    assert len(calls) == 1


# --------------------------------------------------------------------------- the pool


def test_pool_takes_a_device_that_cannot_connect_out_of_the_session(tmp_path):
    devices = load_devices_file(write_devices_file(tmp_path / "devices.yaml", [
        {"id": "ghost", "soc": "sm8650", "transport": "ssh", "host": "127.0.0.1", "port": 1, "user": "u",
         "key_file": str(Path(__file__)), "known_hosts": str(tmp_path / "kh")},
        {"id": "emu", "soc": "sm8650", "transport": "emulator"}]))
    pool = DevicePool(ArtifactCache(tmp_path / "cache"))
    import harness.transports.ssh as ssh_module

    ssh_module.SshTransport.backoff = Backoff(attempts=1)
    try:
        with pytest.raises(TransportError, match="cannot connect to u@127.0.0.1:1"):
            pool.runner(devices.devices[0], devices)
    finally:
        del ssh_module.SshTransport.backoff
    assert pool.failure("ghost").startswith("connecting failed")
    with pytest.raises(DeviceLostError, match="device ghost was taken out of the session after: connecting failed"):
        pool.runner(devices.devices[0], devices)
    runner = pool.runner(devices.devices[1], devices)
    runner.transport.lost_reason = "stopped answering: test"
    assert pool.failure("emu") == "stopped answering: test"
    pool.close()  # a lost device is closed without cleanup, and nothing raises


# --------------------------------------------------------------------------- a session with a dying device

KILLER = '''
import os, signal

def pytest_runtest_setup(item):
    pid = os.environ.get("HARNESS_TEST_KILL_PID")
    if pid and "test_float_baseline[adb-dev" in item.nodeid:
        os.environ.pop("HARNESS_TEST_KILL_PID")
        os.kill(int(pid), signal.SIGKILL)  # the phone vanishes mid-session
'''


@pytest.mark.skipif(ADB is None, reason="the `adb` binary is not installed")
def test_a_device_that_disconnects_mid_run_errors_and_the_others_go_on(pytester, session_cache_dir, tmp_path,
                                                                       monkeypatch):
    with adb_server(tmp_path / "adbhome") as adb, \
            emulated_phone(adb, "sm8650", tmp_path / "phone", subprocess_mode=True) as phone:
        devices = write_devices_file(tmp_path / "devices.yaml", [
            phone.device_entry(), {"id": "emu", "soc": "sm8650", "transport": "emulator"}])
        pytester.makepyfile(killer=KILLER)
        monkeypatch.setenv("HARNESS_TEST_KILL_PID", str(phone.proc.pid))
        kpi, state = tmp_path / "kpi.json", tmp_path / "farm" / "state.json"
        result = pytester.runpytest_subprocess(
            *FIRST_STEPS, "-p", "killer", "-p", "no:cacheprovider", "--devices-file", str(devices),
            "--device", "adb-dev", "--device", "emu", "--cache-dir", str(session_cache_dir),
            "--kpi-json", str(kpi), "--telemetry-interval", "0.2", "--farm-state", str(state), "-rA")
        # the next CI run: the device stays quarantined (skipped without connecting) until released
        again = pytester.runpytest_subprocess(
            FIRST_STEPS[0], "-p", "no:cacheprovider", "--devices-file", str(devices), "--device", "adb-dev",
            "--device", "emu", "--cache-dir", str(session_cache_dir), "--farm-state", str(state), "-rA")
    result.assert_outcomes(passed=6, errors=1, skipped=1)
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_float_baseline[[]adb-dev-digits_cnn[]]*",
        "device adb-dev was taken out of the session after: disconnected*",
        "*snapdragon harness*",
        "device adb-dev (sm8650, adb): quarantined: disconnected*",
        "device emu (sm8650, emulator): healthy",
        "SKIPPED*test_04_ptq.py*device adb-dev is quarantined: disconnected*",
        "*6 passed, 1 skipped, 1 error*",
    ])
    records = {(r["device"], r["step"]): r for r in json.loads(kpi.read_text())["records"]}
    assert [records[("emu", s)]["outcome"] for s in ("feasibility", "conversion", "float_baseline", "ptq")] == \
        ["passed"] * 4
    assert records[("adb-dev", "feasibility")]["outcome"] == "passed"
    assert records[("adb-dev", "float_baseline")]["outcome"] == "error"
    assert "adb-dev" in records[("adb-dev", "float_baseline")]["message"]
    assert records[("adb-dev", "ptq")]["outcome"] == "skipped"
    assert records[("emu", "ptq")]["kpis"]["telemetry"]["source"] == "emulated"
    devices_json = {d["id"]: d for d in json.loads(kpi.read_text())["devices"]}
    assert devices_json["adb-dev"]["status"] == "quarantined" and devices_json["emu"]["status"] == "healthy"
    entry = json.loads(state.read_text())["devices"]["adb-dev"]
    assert entry["reason"].startswith("disconnected") and entry["expires"] > entry["since"]
    again.assert_outcomes(passed=1, skipped=1)
    again.stdout.fnmatch_lines(["SKIPPED*device adb-dev is quarantined: disconnected*--unquarantine adb-dev*"])


def test_farm_state_quarantine_expiry_release_and_bad_paths(tmp_path):
    from harness.errors import ConfigError
    from harness.errors import FarmError
    from harness.farm.state import FarmState

    state = FarmState(tmp_path / "state.json", quarantine_hours=1)
    q = state.quarantine("phone-1", "health check failed: free space: 12 MB free")
    assert state.quarantined() == {"phone-1": q} and q.active()
    assert FarmState(tmp_path / "state.json", quarantine_hours=0).quarantine("phone-2", "x").active() is False
    assert set(state.quarantined()) == {"phone-1"}  # phone-2's quarantine expired at once
    assert state.release(["phone-1", "nope"]) == ["phone-1"] and state.quarantined() == {}
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(FarmError, match=r"farm state .*state.json is not valid JSON"):
        state.quarantined()
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        import os

        if os.access(locked, os.W_OK):  # root ignores the mode: use a path under a file instead
            target = tmp_path / "state.json" / "nested.json"
            with pytest.raises(ConfigError, match="--farm-state"):
                FarmState(target)
        else:
            with pytest.raises(ConfigError, match=r"--farm-state .*: not writable"):
                FarmState(locked / "state.json")
    finally:
        locked.chmod(0o700)


def test_a_device_failing_its_health_check_is_quarantined_and_skipped(pytester, session_cache_dir, tmp_path):
    devices = write_devices_file(tmp_path / "devices.yaml", [{"id": "emu", "soc": "sm8650", "transport": "emulator"}])
    state = tmp_path / "state.json"
    result = pytester.runpytest_subprocess(
        FIRST_STEPS[0], FIRST_STEPS[1], "-p", "no:cacheprovider", "--devices-file", str(devices), "--device", "emu",
        "--cache-dir", str(session_cache_dir), "--device-min-free-mb", "1e12", "--farm-state", str(state), "-rA")
    result.assert_outcomes(skipped=2)
    # every test skipped, none failed: still not a pass, and the summary names the device and why
    assert result.ret == 6, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["device emu (sm8650, emulator): quarantined: health check failed*",
                                 "INCOMPLETE: device emu was out (quarantined: health check failed: free space: * MB "
                                 "free in the work directory, needs at least 1e+12 MB): 2 requested step test(s) did "
                                 "not run (conversion, feasibility); this is not a pass",
                                 "exit status 6: no test failed, but a device that was out kept requested steps from "
                                 "running",
                                 "SKIPPED*device emu was taken out of the session after: health check failed: "
                                 "free space: * MB free in the work directory, needs at least 1e+12 MB*"])
    assert json.loads(state.read_text())["devices"]["emu"]["reason"].startswith("health check failed: free space")
    released = pytester.runpytest_subprocess(
        FIRST_STEPS[0], "-p", "no:cacheprovider", "--devices-file", str(devices), "--device", "emu",
        "--cache-dir", str(session_cache_dir), "--farm-state", str(state), "--unquarantine", "emu")
    released.assert_outcomes(passed=1)
    assert released.ret == 0
    released.stdout.fnmatch_lines(["taken out of quarantine by --unquarantine: emu"])
    assert json.loads(state.read_text())["devices"] == {}


def test_a_device_quarantined_in_the_farm_state_makes_an_xdist_run_incomplete(pytester, session_cache_dir, tmp_path):
    """The only device quarantined by an earlier run: under pytest-xdist the workers skip its tests and report its
    state; the controller's exit status is not 0 and its summary names the device and the reason."""
    from harness.farm.state import FarmState

    devices = write_devices_file(tmp_path / "devices.yaml", [{"id": "emu", "soc": "sm8650", "transport": "emulator"}])
    state = tmp_path / "state.json"
    FarmState(state).quarantine("emu", "3 step tests in a row failed with transport errors, last: usb reset")
    kpi = tmp_path / "kpi.json"
    result = pytester.runpytest_subprocess(
        FIRST_STEPS[0], FIRST_STEPS[1], "-p", "no:cacheprovider", "--devices-file", str(devices), "--device", "emu",
        "--cache-dir", str(session_cache_dir), "--farm-state", str(state), "--kpi-json", str(kpi), "-n", "2",
        "--dist", "loadgroup")
    result.assert_outcomes(skipped=2)
    assert result.ret == 6, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["device emu (sm8650, emulator): quarantined: 3 step tests in a row failed with "
                                 "transport errors, last: usb reset (until *)",
                                 "INCOMPLETE: device emu was out (quarantined: 3 step tests in a row failed with "
                                 "transport errors, last: usb reset): 2 requested step test(s) did not run*"])
    assert [d["status"] for d in json.loads(kpi.read_text())["devices"]] == ["quarantined"]


# --------------------------------------------------------------------------- device locks: fair, naming the holder

LOCK_USER = """
import sys, time
from pathlib import Path
from harness.farm.locks import DeviceLocks

directory, device, name = sys.argv[1:4]
hold_s, wait_for, rounds = float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
locks = DeviceLocks(Path(directory), timeout_s=60, run=name)
for r in range(rounds):
    hold = locks.acquire(device, test=f"{name} round {r}")
    deadline = time.monotonic() + 30
    while r == 0 and len([p for p in locks.paths(device).queue.iterdir() if not p.name.startswith(".")]) < wait_for:
        assert time.monotonic() < deadline, "the other waiters did not queue"
        time.sleep(0.05)
    time.sleep(hold_s)
    hold.release()
"""


def _lock_user(tmp_path: Path, name: str, hold_s: float, wait_for: int = 0, rounds: int = 1,
               device: str = "dev") -> subprocess.Popen:
    """Return a started process that takes device's lock under tmp_path/locks `rounds` times as run `name` (the
    first time holding it until `wait_for` others queue), holding it hold_s each time; its holds go to
    $HARNESS_LOCK_LOG."""
    script = tmp_path / "lock_user.py"
    script.write_text(LOCK_USER)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "locks"), device, name, str(hold_s),
                             str(wait_for), str(rounds)], env={**os.environ, "PYTHONPATH": str(REPO)})


def _queued(tmp_path: Path, device: str = "dev") -> int:
    """Return how many tickets wait in device's queue."""
    queue = tmp_path / "locks" / f"{device}.queue"
    return len([p for p in queue.iterdir() if not p.name.startswith(".")]) if queue.is_dir() else 0


def _wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    """Return once condition() is true; fail naming what after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def _holds(log: Path) -> list[dict]:
    """Return the holds of $HARNESS_LOCK_LOG, in the order they were taken."""
    return sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda h: h["acquired_at"])


def test_device_lock_waiters_are_served_in_the_order_they_asked(tmp_path, monkeypatch):
    """P1 holds; P2 then P3 queue; P1 releases and asks again at once: it goes behind them."""
    log = tmp_path / "holds.jsonl"
    monkeypatch.setenv("HARNESS_LOCK_LOG", str(log))
    p1 = _lock_user(tmp_path, "P1", 0.2, wait_for=2, rounds=2)
    _wait_until(lambda: (tmp_path / "locks" / "dev.holder.json").exists(), "P1 holds the device")
    p2 = _lock_user(tmp_path, "P2", 0.3)
    _wait_until(lambda: _queued(tmp_path) == 1, "P2 waits")
    p3 = _lock_user(tmp_path, "P3", 0.3)
    assert [p.wait(timeout=60) for p in (p1, p2, p3)] == [0, 0, 0]
    holds = _holds(log)
    assert [h["run"] for h in holds] == ["P1", "P2", "P3", "P1"], holds
    assert all(a["released_at"] <= b["acquired_at"] for a, b in zip(holds, holds[1:])), holds  # one at a time
    assert _queued(tmp_path) == 0 and not (tmp_path / "locks" / "dev.holder.json").exists()


def test_a_dead_waiters_ticket_does_not_block_the_device(tmp_path, monkeypatch):
    """A waiter killed with SIGKILL leaves its ticket; the next waiter removes it and takes the device."""
    from harness.farm.locks import DeviceLocks

    log = tmp_path / "holds.jsonl"
    monkeypatch.setenv("HARNESS_LOCK_LOG", str(log))
    hold = DeviceLocks(tmp_path / "locks", run="test").acquire("dev", test="the test itself")
    dead = _lock_user(tmp_path, "dead", 0.1)
    _wait_until(lambda: _queued(tmp_path) == 1, "the doomed waiter waits")
    queue = tmp_path / "locks" / "dev.queue"
    [dead_ticket] = [p for p in queue.iterdir() if not p.name.startswith(".")]
    assert f"-{dead.pid}-" in dead_ticket.name
    dead.kill()
    dead.wait()  # reaped: its pid is gone, not a zombie
    assert dead_ticket.exists()  # SIGKILL: no finally ran
    next_waiter = _lock_user(tmp_path, "next", 0.1)
    _wait_until(lambda: not dead_ticket.exists() and _queued(tmp_path) == 1,
                "the next waiter removes the dead one's ticket and waits")
    hold.release()
    assert next_waiter.wait(timeout=30) == 0
    assert [h["run"] for h in _holds(log)] == ["test", "next"]  # the test's own hold, then the next waiter
    assert _queued(tmp_path) == 0


def test_a_device_held_by_another_process_is_waited_for_then_named(pytester, session_cache_dir, tmp_path):
    """A wait says live who holds the device; past --device-lock-timeout the test errors with one line naming the
    holder, without a traceback; once it is free the next run takes it."""
    holder = _lock_user(tmp_path, "nightly-7", 60, device="sm8650-emu")  # another process measuring on the device
    try:
        _wait_until(lambda: (tmp_path / "locks" / "sm8650-emu.holder.json").exists(), "the holder holds the device")
        result = pytester.runpytest_subprocess(
            FIRST_STEPS[0], "-p", "no:cacheprovider", "--device", "sm8650", "--cache-dir", str(session_cache_dir),
            "--device-lock-dir", str(tmp_path / "locks"), "--device-lock-timeout", "3", "-rA")
    finally:
        holder.kill()
        holder.wait()
    result.assert_outcomes(errors=1)
    who = f"*/pid {holder.pid} (user *, run nightly-7, test nightly-7 round 0)"
    result.stderr.fnmatch_lines([f"harness: waiting for device sm8650-emu (1st in line, ? s so far): held by {who} "
                                 "for * s; --device-lock-timeout 3 s"])  # live, past pytest's capture
    out = result.stdout.str()
    section = out.split(" ERROR at setup of test_feasibility[sm8650-emu-digits_cnn] ")[1].splitlines()[1:]
    section = section[:next(i for i, line in enumerate(section) if line.startswith(("=", "_")))]
    message = [line for line in section if line.strip()]
    assert len(message) == 1 and fnmatch.fnmatch(
        message[0], f"device sm8650-emu is held by {who} since ??:??:?? (waited ? s, --device-lock-timeout 3 s): "
                    "wait longer with --device-lock-timeout or free the device"), section
    result.stdout.fnmatch_lines(["*short test summary info*", "ERROR *test_feasibility[[]sm8650-emu-digits_cnn[]]*"])
    assert "Traceback" not in out and "harness/farm" not in out and "locks.py" not in out, out
    again = pytester.runpytest_subprocess(
        FIRST_STEPS[0], "-p", "no:cacheprovider", "--device", "sm8650", "--cache-dir", str(session_cache_dir),
        "--device-lock-dir", str(tmp_path / "locks"))
    again.assert_outcomes(passed=1)  # the holder died: the OS freed its lock, and its stale record is not a holder


SMALL = ["--sweep", "off", "--skip-validation", "-p", "no:cacheprovider"]
SLOW_STEP = """
import os, time
from pathlib import Path

FIRST = []

def pytest_runtest_call(item):
    time.sleep(1)  # each step at least this long: the other run asks for the device while it is held
    if not FIRST:  # this run's first hold lasts until the other run waits for the device (a loaded host may start
        FIRST.append(item)  # it seconds late), so that "within one step" does not depend on start-up times
        deadline = time.monotonic() + 60
        queues = Path(item.config.option.device_lock_dir).glob("*.queue/*")
        while time.monotonic() < deadline and not any(f"-{os.getpid()}-" not in q.name for q in queues):
            time.sleep(0.1)
            queues = Path(item.config.option.device_lock_dir).glob("*.queue/*")
"""


def test_two_runs_on_one_device_interleave_fairly(pytester, session_cache_dir, tmp_path, monkeypatch):
    """Two runs on one device, the second started a moment after the first: the second's first step starts within
    one step of the first's, each step waits for at most one step of the other run, and no two holds overlap
    (the holds come from $HARNESS_LOCK_LOG)."""
    pytester.makepyfile(slowstep=SLOW_STEP)
    log = tmp_path / "holds.jsonl"
    monkeypatch.setenv("HARNESS_LOCK_LOG", str(log))
    common = ["--pyargs", "harness.suites", "-k", "(feasibility or conversion) and not llm", *SMALL,
              "-p", "slowstep", "--device", "sm8650", "--cache-dir", str(session_cache_dir),
              "--device-lock-dir", str(tmp_path / "locks")]
    runs = []
    for name in ("first", "second"):
        monkeypatch.setenv("HARNESS_RUN_ID", name)
        with open(tmp_path / f"{name}.out", "w") as out:
            runs.append(pytester.popen([sys.executable, "-m", "pytest", *common, "--kpi-json",
                                        str(tmp_path / f"{name}.json")], stdout=out, stderr=subprocess.STDOUT))
        time.sleep(0.3)
    for name, run in zip(("first", "second"), runs):
        assert run.wait(timeout=300) == 0, (tmp_path / f"{name}.out").read_text()[-3000:]
    holds = _holds(log)
    assert sorted(h["run"] for h in holds) == ["first"] * 2 + ["second"] * 2, holds
    assert all(a["released_at"] <= b["acquired_at"] for a, b in zip(holds, holds[1:])), holds  # one at a time
    for hold in holds:  # while a run waited, the other took the device at most once
        overtaken = [h for h in holds if h["run"] != hold["run"] and hold["asked_at"] < h["acquired_at"] <
                     hold["acquired_at"]]
        assert len(overtaken) <= 1, (hold, holds)
    runs_in_order = [h["run"] for h in holds]  # whichever run asked first took the device first
    assert runs_in_order[1] != runs_in_order[0], runs_in_order  # the other's first step came right after its first
    for name in ("first", "second"):
        records = json.loads((tmp_path / f"{name}.json").read_text())["records"]
        assert [r["outcome"] for r in records] == ["passed"] * 2, records


def test_a_device_command_past_its_timeout_is_an_error_of_the_bench_not_a_failed_model(pytester, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setenv("HARNESS_RUNNER", "oneshot")  # each command starts the runner: longer than 0.2 s
    kpi = tmp_path / "kpi.json"
    result = pytester.runpytest_subprocess(
        FIRST_STEPS[0], FIRST_STEPS[3], "-p", "no:cacheprovider", "--device", "sm8650",
        "--cache-dir", str(tmp_path / "cache"), "--command-timeout", "0.2", "--kpi-json", str(kpi), "--alluredir", str(tmp_path / "allure"), "-rA")
    assert result.ret != 0  # the step did not run: not green
    result.assert_outcomes(errors=1, skipped=1)  # an error in pytest's terms too (and JUnit's), not a failure
    result.stdout.fnmatch_lines(["*feasibility*error*a device command ran past its time limit "
                                 "(`--command-timeout SECONDS` sets it): [[]sm8650-emu[]] command timed out after 0.2 s*"])
    record, ptq = json.loads(kpi.read_text())["records"]
    assert record["step"] == "feasibility" and record["outcome"] == "error"
    assert ptq["outcome"] == "skipped" and "prerequisite step 'feasibility' errored" in ptq["message"]
    assert "command timed out after 0.2 s" in record["message"] and "`--command-timeout SECONDS`" in record["message"]
    allure = {r["name"]: r for r in (json.loads(f.read_text()) for f in (tmp_path / "allure").glob("*-result.json"))}
    assert [r["status"] for r in allure.values() if "feasibility" in r["fullName"]] == ["broken"]  # Allure's status for a test the bench stopped, apart from `failed`
    bad = pytester.runpytest_subprocess(FIRST_STEPS[0], "--device", "sm8650", "--command-timeout", "0")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--command-timeout*'0' is not a duration in seconds (more than 0)*"])
