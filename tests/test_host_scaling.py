"""Device runners beside each other on one host (a farm of emulated devices): each HTP-simulator process is pinned
to its own CPU, so that the simulator's yielding threads do not take the cores other simulators need (real
simulator; see benchmarks/bench_farm.py for the throughput)."""

import ast
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from harness.runner.client import RUNNER_SOURCE
from model_builders import conv_classifier

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64") or len(os.sched_getaffinity(0)) < 2,
    reason="the HTP backend is the simulator on x86-64 only, and pinning needs 2 CPUs")


def start_runner(tmp_path: Path, name: str, env: dict[str, str]) -> subprocess.Popen:
    """Start the device runner on a float classifier on the HTP, timing for minutes (it is killed)."""
    model = conv_classifier(tmp_path / "clf.onnx")
    np.random.default_rng(0).random((1, 3, 8, 8), dtype=np.float32).tofile(tmp_path / "in.raw")
    (tmp_path / "list.txt").write_text(f"input:={tmp_path / 'in.raw'}\n")
    argv = [sys.executable, str(RUNNER_SOURCE), "--model", str(model), "--runtime", "htp", "--htp_arch", "75",
            "--soc_model", "57", "--input_list", str(tmp_path / "list.txt"), "--output_dir", str(tmp_path / name),
            "--min_duration", "600"]
    # the CPU slots live under the temp directory: a private one, apart from other runners on this host
    return subprocess.Popen(argv, env={**os.environ, "TMPDIR": str(tmp_path), **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def simulator_cpus(proc: subprocess.Popen, timeout_s: float = 120.0) -> set[str]:
    """Return the CPU lists the simulator's 8 HVX threads (thr_hvx_*) of proc may run on, once they exist."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the runner ended (rc {proc.returncode}): {proc.stderr.read()[-2000:]}"
        cpus = {}
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            try:
                name, status = (task / "comm").read_text().strip(), (task / "status").read_text()
            except OSError:  # the thread ended
                continue
            if name.startswith("thr_hvx"):
                cpus[name] = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                                  if line.startswith("Cpus_allowed_list"))
        if len(cpus) == 8:
            return set(cpus.values())
        time.sleep(0.1)
    raise AssertionError(f"runner {proc.pid} started no HTP simulator threads within {timeout_s:g} s")


def test_two_runners_pin_their_simulators_to_different_cpus(tmp_path):
    procs = [start_runner(tmp_path, f"out{k}", {}) for k in range(2)]
    try:
        pinned = [simulator_cpus(p) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert all(len(cpus) == 1 and "," not in next(iter(cpus)) and "-" not in next(iter(cpus)) for cpus in pinned), \
        f"each simulator's threads should share one CPU, got {pinned}"
    assert pinned[0] != pinned[1], f"both simulators were pinned to CPU {pinned[0]}"


def test_pinning_is_off_with_the_environment_switch(tmp_path):
    proc = start_runner(tmp_path, "out", {"HARNESS_SIMULATOR_CPUS": "off"})
    try:
        cpus = simulator_cpus(proc)
    finally:
        proc.kill()
        proc.wait()
    allowed = sorted(os.sched_getaffinity(0))
    assert len(cpus) == 1 and next(iter(cpus)) in (f"{allowed[0]}-{allowed[-1]}", ",".join(map(str, allowed))), \
        f"unpinned simulator threads should keep this process's CPUs {allowed}, got {cpus}"


def test_a_cpu_session_of_a_pinned_runner_gets_every_cpu_back(tmp_path):
    # a persistent runner serves HTP and CPU-runtime runs: the CPU runtime's thread pool should use every core
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); import device_runner as d; "
            "print([(d._pin_simulator(htp), sorted(os.sched_getaffinity(0))) for htp in (True, False, True)])")
    out = subprocess.run([sys.executable, "-c", code, str(RUNNER_SOURCE.parent)],
                         env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, check=True).stdout
    (cpu, pinned), (_, cpu_session), (_, again) = ast.literal_eval(out)
    assert pinned == again == [cpu] and cpu_session == sorted(os.sched_getaffinity(0)), out
