"""How often does the concurrency step's verdict follow the host's load? False alarms and detection, measured.

On a device whose figures are wall time (here the SSH transport to a real sshd on 127.0.0.1, this host's HTP
simulator as the "board", as tests/test_suites_remote.py runs it), the concurrency step compares each session's
latency beside the others with its latency alone. When the solo phase and the shared phase run one after the
other, a change of the host's load between them moves the ratio. The benchmark runs the step `--trials` times
with a load beside it. `--load bursts` (the default): `--burst`: CPU-bound processes, each pinned to one core as the HTP simulator's
processes pin themselves, on and off for `--burst-s` LOW,HIGH seconds each (uniform; 1-10 s by default), as
another pytest-xdist worker's steps come and go); `--load step`: the same processes start `--step-at` seconds
into each run (by default the solo duration plus 0.5 s for loading, so a one-phase run's solo phase is quiet
and its shared phase loaded, the case of a CI run whose other worker started a heavy step) and run to its end;
`--load quiet`: none. Side by side in one run: one phase each (`rounds 1`) and the
step's alternated rounds (`rounds 9`, the default), in alternating order. From each run's latency_degradation
and its interval it reads two verdicts:

* the default limit (1.5 x 2 sessions = 3): the ratio here is about 2 (two sessions share the simulator's one
  pinned core), so a failure is a false alarm;
* a planted limit (`--planted-limit`, 1.5): the ratio is above it, so a failure is a detection.

    python benchmarks/bench_concurrency_verdict.py [--trials 10] [--duration 4] [--burst 4] [--burst-s 1,10]
        [--model digits_cnn]

It prints per method the outcomes against both limits (passed / inconclusive / failed) with the false-alarm and
detection rates and their Wilson intervals, and the median and spread of the degradations.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from harness.cache import DEFAULT_CACHE_DIR, ArtifactCache  # noqa: E402
from harness.devices import load_devices_file  # noqa: E402
from harness.kpi import Limit, interval_of  # noqa: E402
from harness.models import Thresholds, resolve_model  # noqa: E402
from harness.options import ConcurrencyOptions  # noqa: E402
from harness.pipeline import Onboarding  # noqa: E402
from harness.runner.client import DeviceRunner  # noqa: E402
from harness.stats import wilson  # noqa: E402
from harness.steps.concurrency import DEGRADATION_PER_SESSION, concurrency  # noqa: E402
from harness.target import Target  # noqa: E402
from harness.transports import open_transport  # noqa: E402
from servers import ssh_server, write_devices_file  # noqa: E402

BURSTS = """
import multiprocessing, os, random, sys, time
def alive(pid):
    return os.path.exists("/proc/%d" % pid)
def spin(cpu, until, bench):
    os.sched_setaffinity(0, {cpu})
    while time.monotonic() < until and alive(bench):  # the benchmark killed: stop
        pass
bench = os.getppid()
rng = random.Random(int(sys.argv[2]))
cpus = sorted(os.sched_getaffinity(0))
low, high = float(sys.argv[3]), float(sys.argv[4])
while alive(bench):  # the benchmark gone (killed), the load goes too
    until = time.monotonic() + rng.uniform(low, high)
    procs = [multiprocessing.Process(target=spin, args=(cpus[k % len(cpus)], until, bench))
             for k in range(int(sys.argv[1]))]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    pause = time.monotonic() + rng.uniform(low, high)
    while time.monotonic() < pause and alive(bench):
        time.sleep(0.2)
"""


def start_load(argv: list[str]) -> subprocess.Popen:
    """Start the load script in its own process group (its pinned children are stopped with it)."""
    return subprocess.Popen([sys.executable, "-c", BURSTS, *argv], start_new_session=True)


def stop_load(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def verdict(kpis: dict, maximum: float) -> str:
    """Return the step's verdict of latency_degradation against maximum (judged on its interval)."""
    v = Limit("latency_degradation", maximum=maximum).check(kpis["latency_degradation"],
                                                            interval_of(kpis, "latency_degradation"))
    return v.state


def rate(count: int, n: int) -> str:
    i = wilson(count, n)
    return f"{count}/{n} = {count / n:.0%} [{i.low:.0%}, {i.high:.0%}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--duration", type=float, default=4.0, help="concurrent (and solo) seconds per run")
    parser.add_argument("--burst", type=int, default=4,
                        help="CPU-bound processes in the load, spread over the cores")
    parser.add_argument("--load", choices=["bursts", "step", "quiet"], default="bursts")
    parser.add_argument("--burst-s", default="1,10", help="LOW,HIGH: seconds a burst lasts, and a pause")
    parser.add_argument("--step-at", type=float, default=None, help="--load step: seconds into each run")
    parser.add_argument("--planted-limit", type=float, default=1.5)
    parser.add_argument("--model", default="digits_cnn")
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop the load, the runner and sshd

    cache = ArtifactCache(Path(args.cache_dir).expanduser())
    default_limit = DEGRADATION_PER_SESSION * 2
    results: dict[int, list[tuple[float, str, str]]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="bench-concurrency-") as tmp, ssh_server(Path(tmp) / "sshd") as sshd:
        devices = load_devices_file(write_devices_file(Path(tmp) / "devices.yaml",
                                                       [sshd.device_entry("ssh-dev", soc="sm8650")]))
        device = devices.select(["ssh-dev"])[0]
        soc = devices.soc(device.soc)
        runner = DeviceRunner(open_transport(device, soc, Path(tmp) / "session"))
        onboarding = Onboarding(Target(device, soc, resolve_model(args.model, {}, None)), runner, cache)
        plans = [(args.model, onboarding.context_artifact().model, onboarding.dataset().evaluation)]
        bursts = [str(args.burst), "0", *args.burst_s.split(",")]
        load = start_load(bursts) if args.load == "bursts" else None
        step_at = args.step_at if args.step_at is not None else args.duration + 0.5
        try:
            for trial in range(args.trials):
                order = (1, 9) if trial % 2 == 0 else (9, 1)
                for rounds in order:
                    options = ConcurrencyOptions(2, args.duration, args.duration, rounds=rounds)
                    step: list[subprocess.Popen] = []
                    timer = threading.Timer(step_at, lambda: step.append(start_load([str(args.burst), "0", "1e9", "1e9"])))
                    if args.load == "step":
                        timer.start()
                    try:
                        report = concurrency(plans, runner, Thresholds(), options,
                                             Path(tmp) / f"out{trial}-{rounds}", "ssh-dev")
                    finally:
                        if args.load == "step":
                            timer.cancel()
                            timer.join()
                        stop_load(step[0] if step else None)
                    k = report.kpis
                    results[rounds].append((k["latency_degradation"], verdict(k, default_limit),
                                            verdict(k, args.planted_limit)))
                    print(f"trial {trial + 1} rounds {rounds}: degradation {k['latency_degradation']:.3f} "
                          f"{interval_of(k, 'latency_degradation')} -> limit {default_limit:g}: {results[rounds][-1][1]}, "
                          f"planted {args.planted_limit:g}: {results[rounds][-1][2]}", flush=True)
        finally:
            stop_load(load)
            runner.close()
    beside = {"bursts": f" in bursts of {args.burst_s} s", "step": f" from {step_at:g} s into each run"}
    print(f"\n{args.trials} trials, {args.duration:g} s solo and {args.duration:g} s shared per run, load {args.load}: "
          + (f"{args.burst} CPU-bound processes{beside[args.load]} beside them" if args.load in beside else "none")
          + f" (2 sessions of {args.model} on ssh-dev)")
    for rounds, rows in sorted(results.items()):
        values = [d for d, _, _ in rows]
        at_default = collections.Counter(v for _, v, _ in rows)
        at_planted = collections.Counter(v for _, _, v in rows)
        print(f"rounds {rounds}: degradation median {statistics.median(values):.3f}, range "
              f"[{min(values):.3f}, {max(values):.3f}]")
        print(f"  limit {default_limit:g} (an unchanged device): {dict(at_default)}; false alarms "
              f"{rate(at_default['failed'], len(rows))}")
        print(f"  planted limit {args.planted_limit:g} (a degradation above it): {dict(at_planted)}; detected "
              f"{rate(at_planted['failed'], len(rows))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
