"""The persistent device runner (device_runner.py --serve) on the real HTP simulator: on the emulator, over a
real sshd and through the real adb server to the emulated phone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from harness.devices import AdbDevice, SshDevice, load_devices_file
from harness.errors import DeviceTimeoutError, RunnerError
from harness.models import fix_input_shapes
from harness.runner.base import push_model
from harness.runner.client import RUNNER_MODE_ENV, RUNNER_SOURCE, DeviceRunner
from harness.transports import open_transport
from model_builders import conv_classifier
from real_models_helpers import real_model_path
from servers import ADB, SSHD, adb_server, emulated_phone, ssh_server

CALIB = "calib/mtcnn_pnet/mtcnn_pnet.npz"


def feeds(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [{"input": rng.random((1, 3, 8, 8), dtype=np.float32)} for _ in range(n)]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    return conv_classifier(tmp_path_factory.mktemp("m") / "clf.onnx")


@pytest.fixture(scope="module")
def catalog():
    return load_devices_file()


@pytest.fixture
def emu(catalog, tmp_path):
    """A DeviceRunner on a fresh emulated sm8650 (closed after the test)."""
    dev = catalog.select(["sm8650-emu"])[0]
    runner = DeviceRunner(open_transport(dev, catalog.soc(dev.soc), tmp_path / "emulator"))
    yield runner
    runner.close()
    runner.transport.close()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    if not Path(SSHD).exists():
        pytest.skip("openssh-server is not installed")
    with ssh_server(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(scope="module")
def phone(tmp_path_factory):
    if ADB is None:
        pytest.skip("the `adb` binary is not installed")
    with adb_server(tmp_path_factory.mktemp("adbhome")) as adb:
        with emulated_phone(adb, "sm8650", tmp_path_factory.mktemp("phone")) as p:
            yield p


@pytest.fixture(params=["emulator", "ssh", "adb"])
def any_runner(request, catalog, tmp_path):
    """A DeviceRunner on each kind of transport whose device keeps a process."""
    if request.param == "emulator":
        transport = open_transport(catalog.select(["sm8650-emu"])[0], catalog.soc("sm8650"), tmp_path / "emu")
    elif request.param == "ssh":
        sshd = request.getfixturevalue("sshd")
        fields = sshd.device_entry(soc="sm8650", workdir=str(tmp_path / "workdir"), soc_detect="off")
        transport = open_transport(SshDevice(**fields), catalog.soc("sm8650"), tmp_path)
    else:
        phone = request.getfixturevalue("phone")
        transport = open_transport(AdbDevice(**phone.device_entry()), catalog.soc("sm8650"), tmp_path)
    runner = DeviceRunner(transport)
    yield runner
    runner.close()
    transport.cleanup()
    transport.close()


def _runner_pids() -> set[int]:
    """Return the pids of this machine's device_runner.py --serve processes (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--serve" in cmdline and any(part.endswith(b"device_runner.py") for part in cmdline):
            found.add(int(entry.name))
    return found


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    """Return whether process pid has ended (or is a zombie) within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


# --------------------------------------------------------------------------- one server, cached sessions


def test_runs_share_one_server_and_reuse_its_session(any_runner, classifier):
    assert any_runner.persistent
    first = any_runner.run(classifier, feeds(2), "htp")
    second = any_runner.run(classifier, feeds(2), "htp")
    pid = first.report["pid"]
    assert first.report["served"] and second.report["pid"] == pid == any_runner.server_pid
    assert (first.report["session_cached"], second.report["session_cached"]) == (False, True)
    # a reused session's load KPI is its creation time, not 0 s; load_s is this call's (a look-up)
    assert second.report["session_create_s"] == first.report["session_create_s"] > 0
    assert second.load_s < first.report["session_create_s"]
    for a, b in zip(first.outputs, second.outputs):
        np.testing.assert_array_equal(a["logits"], b["logits"])
    check = any_runner.self_check()  # the health check pings the same server
    assert check["pid"] == pid and check["qnn_ep"] and check["runner_version"] == "6"
    any_runner.close()
    assert any_runner.server_pid is None
    assert _gone(pid), "the runner server outlived DeviceRunner.close()"


def test_profiling_and_other_options_never_reuse_a_session(emu, classifier):
    emu.run(classifier, feeds(1), "htp")
    other = emu.run(classifier, feeds(1), "htp", allow_cpu_fallback=True)
    profiled = emu.run(classifier, feeds(1), "htp", profiling_level="basic")
    placed = emu.run(classifier, None, "htp", placement_only=True)  # always created: it measures the load
    assert [r.report["session_cached"] for r in (other, profiled, placed)] == [False, False, False]
    assert emu.run(classifier, feeds(1), "cpu").report["session_cached"] is False
    assert emu.run(classifier, feeds(1), "htp").report["session_cached"] is True


def test_a_changed_model_file_is_loaded_again(emu, tmp_path):
    (tmp_path / "a").mkdir()
    model = conv_classifier(tmp_path / "a" / "clf.onnx")
    emu.run(model, feeds(1), "htp")
    assert emu.run(model, feeds(1), "htp").report["session_cached"] is True
    remote = emu.transport.workdir / push_model(emu.transport, model)
    os.utime(remote, ns=(0, remote.stat().st_mtime_ns + 10**9))  # as a re-pushed copy would be
    assert emu.run(model, feeds(1), "htp").report["session_cached"] is False


# --------------------------------------------------------------------------- same results as one-shot


def test_a_corpus_model_gives_the_one_shot_outputs_bit_for_bit(emu, tmp_path, monkeypatch):
    source = real_model_path("mtcnn_pnet")
    model = tmp_path / "mtcnn_pnet.onnx"
    onnx.save(fix_input_shapes(onnx.load(str(source)), {"input_1": (1, 64, 64, 3)}, source.name), str(model))
    samples = np.load(source.parent.parent / CALIB)["input_1"][:3]
    data = [{"input_1": s} for s in samples]
    served = [emu.run(model, data, "htp") for _ in range(2)]
    assert served[1].report["session_cached"]
    monkeypatch.setenv(RUNNER_MODE_ENV, "oneshot")
    assert not emu.persistent
    oneshot = emu.run(model, data, "htp")
    assert not oneshot.report["served"] and oneshot.report["pid"] != served[0].report["pid"]
    for run in served:
        assert len(run.outputs) == 3
        for got, want in zip(run.outputs, oneshot.outputs):
            assert got.keys() == want.keys()
            for name in want:
                assert np.array_equal(got[name], want[name]), name


# --------------------------------------------------------------------------- crashes, timeouts, no orphans


def test_a_killed_server_is_restarted_for_the_next_run(any_runner, classifier):
    pid = any_runner.run(classifier, feeds(1), "htp").report["pid"]
    os.kill(pid, signal.SIGKILL)
    assert _gone(pid)
    deadline = time.monotonic() + 10
    while any_runner.server_pid is not None and time.monotonic() < deadline:  # until its stream reports the end
        time.sleep(0.05)
    again = any_runner.run(classifier, feeds(1), "htp")
    assert again.report["pid"] not in (pid, None) and again.report["session_cached"] is False
    assert not again.report.get("runner_restarted")  # it ended between calls: nothing was run twice
    assert len(again.outputs) == 1


def _kill_servers(runner: DeviceRunner, count: int, after_s: float = 1.0) -> tuple[threading.Thread, list[int]]:
    """Start a thread that SIGKILLs the runner's server after_s after each of the next `count` servers is seen
    running (the one running now first); return it and the list of the pids it killed."""
    killed: list[int] = []

    def kill() -> None:
        deadline = time.monotonic() + 120
        while len(killed) < count and time.monotonic() < deadline:
            pid = runner.server_pid
            if pid is not None and pid not in killed:
                time.sleep(after_s)
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.02)

    thread = threading.Thread(target=kill)
    thread.start()
    return thread, killed


def test_a_server_killed_during_a_run_is_restarted_and_the_run_retried(emu, classifier):
    emu.self_check()
    killer, killed = _kill_servers(emu, 1)
    result = emu.run(classifier, feeds(2), "htp", min_duration_s=3.0)
    killer.join()
    assert len(killed) == 1 and result.report["pid"] not in killed
    assert result.report["runner_restarted"] and any("restarted" in note for note in result.notes)
    assert result.measured_s >= 3.0 and len(result.outputs) == 2


def test_a_server_that_dies_twice_fails_the_run(emu, classifier):
    emu.self_check()
    killer, killed = _kill_servers(emu, 2)
    with pytest.raises(RunnerError, match="the device runner server ended twice"):
        emu.run(classifier, feeds(1), "htp", min_duration_s=5.0)
    killer.join()
    assert len(killed) == 2 and emu.server_pid is None
    assert emu.run(classifier, feeds(1), "htp").report["pid"] not in killed  # the next call starts afresh


def test_a_run_past_its_timeout_kills_the_server(emu, classifier):
    pid = emu.self_check()["pid"]
    emu.timeout_s = 2.0
    with pytest.raises(DeviceTimeoutError, match="timed out after 2 s"):
        emu.run(classifier, feeds(1), "htp", min_duration_s=30.0)
    assert _gone(pid) and emu.server_pid is None
    emu.timeout_s = 900.0
    assert emu.run(classifier, feeds(1), "htp").report["pid"] != pid


def test_no_runner_process_is_left_after_the_session(tmp_path, classifier):
    from harness.cache import ArtifactCache
    from harness.session import DevicePool

    catalog = load_devices_file()
    pool = DevicePool(ArtifactCache(tmp_path / "cache"))
    runner = pool.runner(catalog.select(["sm8650-emu"])[0], catalog)
    assert pool.health["sm8650-emu"]["ok"]
    pid = runner.server_pid
    assert pid is not None and runner.run(classifier, feeds(1), "htp").report["pid"] == pid
    pool.close()
    assert _gone(pid)
    assert pid not in _runner_pids()


def test_the_protocol_survives_stdout_noise_and_bad_requests(tmp_path):
    """Whatever prints to stdout during a request (argparse's --help here, QNN's native logs on a device)
    goes to stderr: the replies stay parseable; bad lines get an error reply; `exit` ends the server."""
    proc = subprocess.Popen([sys.executable, str(RUNNER_SOURCE), "--serve"], cwd=tmp_path, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for line in ['{"id": 1, "op": "run", "argv": ["--help"]}', "not json", '{"id": 2, "op": "nope"}',
                     '{"id": 3, "op": "run", "argv": ["--model", "missing.onnx", "--runtime", "cpu", '
                     '"--output_dir", "out"]}', '{"id": 4, "op": "exit"}']:
            proc.stdin.write(line.encode() + b"\n")
        proc.stdin.flush()
        replies = [json.loads(proc.stdout.readline()) for _ in range(5)]
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert [(r["id"], r["rc"]) for r in replies] == [(1, 0), (None, 2), (2, 2), (3, 2), (4, 0)]
    assert "unknown op 'nope'" in replies[2]["error"]
    assert json.loads((tmp_path / "out" / "runner_report.json").read_text())["error"] == "model not found: missing.onnx"
    assert b"usage:" in proc.stderr.read()


def test_a_runner_dropped_without_close_ends_its_server(catalog, tmp_path, classifier):
    transport = open_transport(catalog.select(["sm8650-emu"])[0], catalog.soc("sm8650"), tmp_path / "emu")
    runner = DeviceRunner(transport)
    pid = runner.run(classifier, feeds(1), "htp").report["pid"]
    del runner  # its server's stdin closes: end of input ends it
    assert _gone(pid)


def test_a_model_truncated_on_the_device_after_its_push_is_pushed_again_and_the_run_passes(sshd, catalog, tmp_path,
                                                                                           classifier):
    # over SSH the transport remembers what it pushed and skips re-hashing; a load failure makes it look again
    fields = sshd.device_entry(soc="sm8650", workdir=str(tmp_path / "workdir"), soc_detect="off")
    runner = DeviceRunner(open_transport(SshDevice(**fields), catalog.soc("sm8650"), tmp_path))
    try:
        first = runner.run(classifier, feeds(2), "cpu")
        on_device = Path(fields["workdir"]) / push_model(runner.transport, classifier)
        on_device.write_bytes(on_device.read_bytes()[:100])  # behind the transport's back
        runner.close()  # a fresh server, so no cached session hides the damage
        again = runner.run(classifier, feeds(2), "cpu")
        assert on_device.read_bytes() == classifier.read_bytes()
        for a, b in zip(first.outputs, again.outputs):
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    finally:
        runner.close()
        runner.transport.close()
