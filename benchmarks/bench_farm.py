"""Farm scaling: the same device work on 1, 2 and 4 emulated devices at once, side by side in one run.

Per device count it prints the throughput against one device (goal: 2 devices >= 1.6 x one on this 2-core
machine), and where the time goes: the CPU time of the harness (each device's host process: staging inputs,
reading outputs) and of the device runners (the HTP simulator), the device time (the runners' own session and
inference time, summed), the CPU time other processes on the host took meanwhile (/proc/stat minus ours), and
the simulator's CPU time per inference, which rises when simulators slow each other.

Workloads:
* `device` (default): a workload whose device time dominates. One host process per device, as a farm has one
  pytest-xdist worker per device: each builds (from the cache, warmed first) the model's context binary for its
  emulated device, then, once every device is ready, runs it --runs times with --iterations timed iterations
  through the harness's DeviceRunner.
* `suites`: Steps 1-6 without the sweep (`--sweep off`) on the model, with pytest-xdist's `-n` equal to the
  device count (`--dist loadgroup`): the farm's real path, dominated by host work (pytest, imports, staging).

The cause of simulators slowing each other, found with this benchmark: Qualcomm's HTP simulator runs 11 threads
per process (thr_hvx_0..7, thr_hmx_0, thr_hlx_0..1) that wait by calling sched_yield in a loop (about 17 000 calls
per second); spread over both cores they take the CPU another simulator needs. The device runner now pins each
simulator process to one core, the one fewest other runners hold (device_runner._pin_simulator), and turns off
onnxruntime's thread-pool spinning. `--compare-pinning` runs every count a second time with
HARNESS_SIMULATOR_CPUS=off (the old behaviour) beside it. Last figures: docs/benchmarks.md.

    python benchmarks/bench_farm.py [--devices 1,2,4] [--workload device|suites] [--model digits_cnn]
        [--runs 2] [--iterations 3000] [--repeat 3] [--compare-pinning] [--cache-dir DIR]

`--labgrid`: two orchestrators (two CI jobs) against one labgrid farm: a real labgrid-coordinator and two
labgrid-exporters on loopback exporting three SSH boards (sshd on loopback, this host's HTP simulator) and an
emulated phone (tests/servers.labgrid_farm). Each job is `pytest suites/ --device soc=sm8650,transport=ssh
--skip-validation`; the benchmark times one job alone, the two back to back and the two started together
(interleaved over --repeat rounds), and prints the throughput of the pair against one job and against the pair back
to back (goal: together in under 0.8 x back to back), with the lease overhead per run and per step (reserve and
acquire when no one else waits, release) from the jobs' lease records ($HARNESS_LOCK_LOG).

    python benchmarks/bench_farm.py --labgrid [--repeat 2] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITES = [f"harness/suites/test_{name}.py" for name in ("01_feasibility", "02_conversion", "03_float_baseline",
                                                         "04_ptq", "08_context_binary", "09_profile", "10_runtime")]
PIN_ENV = "HARNESS_SIMULATOR_CPUS"  # device_runner.SIM_CPUS_ENV


@dataclass
class Measure:
    """One configuration's run: devices, wall seconds, work done, CPU and device seconds, host load."""

    devices: int
    pinned: bool
    wall_s: float
    work: float  # inferences (device workload) or suites runs
    harness_cpu_s: float
    runner_cpu_s: float
    device_s: float
    calls_s: float  # wall time inside the harness's runner calls (device time + runner start, staging, transport)
    others_cpu_s: float
    load: tuple[float, float]

    @property
    def throughput(self) -> float:
        """Work per second."""
        return self.work / self.wall_s


def loadavg() -> float:
    """Return the host's 1-minute load average."""
    return os.getloadavg()[0]


def busy_cpu_s() -> float:
    """Return the CPU seconds every process on the host has used since boot (/proc/stat, all but idle/iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """Return the user+sys CPU seconds of this process's waited-for descendants."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def proc_cpu_s(pid: int | None) -> float:
    """Return the user+sys CPU seconds process pid has used so far (0 without one)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def devices_file(path: Path, count: int, sandbox: Path) -> Path:
    """Write a devices file with `count` emulated sm8650 devices (each its own sandbox); return its path."""
    lines = ["devices:"] + [f"  - {{id: farm-{i}, soc: sm8650, transport: emulator, sandbox: '{sandbox / str(i)}'}}"
                            for i in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------ device workload: one host process per device


def worker(args: argparse.Namespace) -> None:
    """Prepare the device's context binary, wait for --go, run it; print the timed section's figures as JSON."""
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    sys.path[:0] = [str(REPO)]
    from harness.cache import ArtifactCache
    from harness.devices import load_devices_file
    from harness.models import resolve_model
    from harness.pipeline import Onboarding, Target
    from harness.runner.client import DeviceRunner
    from harness.transports import open_transport

    devices = load_devices_file(args.devices_file)
    dev = devices.select([args.worker])[0]
    soc = devices.soc(dev.soc)
    transport = open_transport(dev, soc, Path(args.work) / "emulator")
    runner = DeviceRunner(transport)
    ob = Onboarding(Target(dev, soc, resolve_model(args.model, {}, None)), runner, ArtifactCache(Path(args.cache_dir)))
    model, feeds = ob.context_artifact().model, ob.dataset().evaluation[:1]
    Path(args.go + f".ready-{args.worker}").touch()
    while not os.path.exists(args.go):
        time.sleep(0.01)
    start, self0 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    kids0 = children_cpu_s() + proc_cpu_s(runner.server_pid)  # the persistent runner's CPU before now not counted
    device_s = calls_s = 0.0
    try:
        for _ in range(args.runs):
            t = time.perf_counter()
            result = runner.run(model, feeds, "htp", min_iterations=args.iterations)
            calls_s += time.perf_counter() - t
            device_s += result.load_s + sum(result.inference_s) + result.measured_s
    finally:
        runner.close()  # the persistent runner exits and is waited for: its CPU time counts as a child's
        transport.close()
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"start": start, "end": time.time(), "busy_end": busy_cpu_s(), "device_s": device_s,
                      "calls_s": calls_s,
                      "harness_cpu_s": self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime,
                      "runner_cpu_s": children_cpu_s() - kids0,
                      "inferences": args.runs * (args.iterations + len(feeds))}))


def run_device(count: int, pinned: bool, args: argparse.Namespace, cache: Path, tmp: Path) -> Measure:
    """Run the device workload on `count` devices at once; return its Measure."""
    devices = devices_file(tmp / f"devices-{count}.yaml", count, tmp / "sandbox")
    go = Path(tempfile.mkdtemp(dir=tmp, prefix=f"go-{count}-")) / "go"  # a fresh start signal per run
    env = {**os.environ} if pinned else {**os.environ, PIN_ENV: "off"}
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", f"farm-{i}", "--devices-file", str(devices),
                               "--work", str(tmp), "--cache-dir", str(cache), "--model", args.model, "--go", str(go),
                               "--runs", str(args.runs), "--iterations", str(args.iterations)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(count)]
    while sum(Path(f"{go}.ready-farm-{i}").exists() for i in range(count)) < count:
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.01)
    load0, busy0, start = loadavg(), busy_cpu_s(), time.time()
    go.touch()
    outs = [p.communicate() for p in procs]
    failed = [(p.returncode, err) for p, (_, err) in zip(procs, outs) if p.returncode]
    if failed:
        raise SystemExit(f"{count} device(s): a worker failed (rc {failed[0][0]}):\n{failed[0][1][-3000:]}")
    rows = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    wall, busy = max(r["end"] for r in rows) - start, max(r["busy_end"] for r in rows) - busy0
    harness = sum(r["harness_cpu_s"] for r in rows)
    runner = sum(r["runner_cpu_s"] for r in rows)
    return Measure(count, pinned, wall, sum(r["inferences"] for r in rows), harness, runner,
                   sum(r["device_s"] for r in rows), sum(r["calls_s"] for r in rows), max(0.0, busy - harness - runner),
                   (load0, loadavg()))


# ------------------------------------------------------------------ suites workload: pytest -n N


def run_suites(count: int, pinned: bool, args: argparse.Namespace, cache: Path, tmp: Path) -> Measure:
    """Run the suites on `count` devices with -n count; return its Measure (device time is not collected)."""
    devices = devices_file(tmp / f"devices-{count}.yaml", count, tmp / "sandbox")
    argv = [sys.executable, "-m", "pytest", *SUITES, "-q", "-p", "no:cacheprovider", "--devices-file", str(devices),
            *[a for i in range(count) for a in ("--device", f"farm-{i}")], "--cache-dir", str(cache),
            "--model", args.model, "--sweep", "off", "--device-lock-dir", str(tmp / "locks")]
    if count > 1:
        argv += ["-n", str(count), "--dist", "loadgroup"]
    env = {**os.environ} if pinned else {**os.environ, PIN_ENV: "off"}
    load0, busy0, cpu0, start = loadavg(), busy_cpu_s(), children_cpu_s(), time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env)
    wall, cpu, busy = time.monotonic() - start, children_cpu_s() - cpu0, busy_cpu_s() - busy0
    if proc.returncode != 0:
        raise SystemExit(f"{count} device(s) failed:\n{proc.stdout[-3000:]}")
    return Measure(count, pinned, wall, count, cpu, 0.0, 0.0, 0.0, max(0.0, busy - cpu), (load0, loadavg()))


# ------------------------------------------------------------------ report


def report(rows: list[Measure], workload: str, spread: dict[tuple[int, bool], list[float]]) -> None:
    """Print each configuration's (median) throughput against one device, the spread of its repeats, and where
    its time went."""
    cores = os.cpu_count() or 1
    print(f"machine: {cores} cores; workload {workload}; loads are the 1-minute load average before -> after; "
          f"each configuration's median run of {len(next(iter(spread.values())))}")
    for m in rows:
        one = next((r for r in rows if r.devices == 1 and r.pinned == m.pinned), rows[0])
        speedup = m.throughput / one.throughput
        capacity = cores * m.wall_s
        idle = max(0.0, capacity - m.harness_cpu_s - m.runner_cpu_s - m.others_cpu_s)
        label = "pinned" if m.pinned else "unpinned (HARNESS_SIMULATOR_CPUS=off)"
        print(f"\n  {m.devices} device(s), simulators {label}, load {m.load[0]:.2f} -> {m.load[1]:.2f}: "
              f"{m.wall_s:.1f} s wall, throughput {speedup:.2f} x one device ({speedup / m.devices:.2f} of the ideal "
              f"{m.devices}x)")
        if len(spread[(m.devices, m.pinned)]) > 1:
            print("    throughput of each repeat against the median one device: "
                  + ", ".join(f"{t / one.throughput:.2f}" for t in spread[(m.devices, m.pinned)]))
        if workload == "device":
            per = m.wall_s * m.devices
            print(f"    per device: device time (the runner's own session and inference time) {m.device_s / per:.0%} "
                  f"of the wall, runner start, staging and transport {(m.calls_s - m.device_s) / per:.0%}, between "
                  f"calls and waiting for the slowest device {(per - m.calls_s) / per:.0%}; device runners' CPU per "
                  f"inference "
                  f"{1000 * m.runner_cpu_s / m.work:.2f} ms (one device: {1000 * one.runner_cpu_s / one.work:.2f} ms)")
            one_cores = (one.runner_cpu_s + one.harness_cpu_s) / one.wall_s  # the cores one device kept busy
            busy = min(cores, m.devices * one_cores)
            alone = busy / ((m.runner_cpu_s + m.harness_cpu_s) / m.work)  # inferences per s with no other load
            print(f"    estimate with the host to ourselves ({busy:.1f} cores busy at this CPU time per inference, "
                  f"as one device kept {one_cores:.1f} busy): {alone / one.throughput:.2f} x one device")
        ours = (f"device runners {m.runner_cpu_s:.1f}, harness {m.harness_cpu_s:.1f}" if workload == "device" else
                f"pytest workers and their device runners {m.harness_cpu_s:.1f}")
        print(f"    where the {cores} cores x {m.wall_s:.1f} s = {capacity:.1f} core-s went: {ours}, other processes "
              f"on the host {m.others_cpu_s:.1f}, idle {idle:.1f}")


def labgrid_jobs(args: argparse.Namespace, cache: Path, tmp: Path) -> None:
    """Time two suites jobs against a labgrid farm alone, back to back and together; print the ratios and the lease
    overhead."""
    sys.path.insert(0, str(REPO / "tests"))
    from servers import labgrid_farm

    def start(devices_file: Path, host: str, log: Path) -> subprocess.Popen:
        env = {**os.environ, "LG_HOSTNAME": host, "HARNESS_LOCK_LOG": str(log)}
        env.pop("LG_COORDINATOR", None)
        return subprocess.Popen([sys.executable, "-m", "pytest", "suites/", "-p", "no:cacheprovider", "-q",
                                 "--kpi-json", str(tmp / f"kpi-{host}.json"),
                                 "--devices-file", str(devices_file), "--device", "soc=sm8650,transport=ssh",
                                 "--skip-validation", "--cache-dir", str(cache)], cwd=REPO, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def jobs(devices_file: Path, hosts: list[list[str]], log: Path) -> float:
        started = time.monotonic()
        for together in hosts:  # each inner list starts together; the lists run one after the other
            procs = [start(devices_file, host, log) for host in together]
            codes = [p.wait() for p in procs]
            if any(codes):
                raise SystemExit(f"a job failed (exit {codes}); run it by hand to see why")
        return time.monotonic() - started

    log = tmp / "leases.jsonl"
    with labgrid_farm(tmp / "farm") as (_, devices_file):
        jobs(devices_file, [["host-a"]], tmp / "warm.jsonl")  # warm the cache: the model and its artifacts
        times: dict[str, list[float]] = {"one job": [], "two back to back": [], "two together": []}
        for _ in range(args.repeat):  # interleaved, so that other load hits every configuration alike
            times["one job"].append(jobs(devices_file, [["host-a"]], log))
            times["two back to back"].append(jobs(devices_file, [["host-a"], ["host-b"]], log))
            times["two together"].append(jobs(devices_file, [["host-a", "host-b"]], log))
    median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    print(f"machine: {os.cpu_count()} cores; each figure the median of {args.repeat} interleaved rounds")
    for name, wall in median.items():
        print(f"  {name:18s} {wall:7.1f} s  (rounds: {', '.join(f'{t:.1f}' for t in times[name])})")
    print(f"  two together / two back to back: {median['two together'] / median['two back to back']:.2f} "
          f"(goal < 0.8); throughput of two together: {2 * median['one job'] / median['two together']:.2f} x one job")
    leases = [json.loads(line) for line in log.read_text().splitlines()]
    records = json.loads((tmp / "kpi-host-a.json").read_text())["records"]
    steps = sum(1 for r in records if r["outcome"] != "skipped")  # the step tests a job ran
    acquire = sorted(l["acquired_at"] - l["asked_at"] for l in leases)
    release = sorted(l["release_s"] for l in leases)
    print(f"  lease overhead per run over {len(leases)} leases: reserve + acquire median {acquire[len(acquire) // 2]:.3f} s "
          f"(max {acquire[-1]:.3f} s, with waiting), release median {release[len(release) // 2]:.3f} s; per step "
          f"({steps} step tests ran in a job): {(acquire[len(acquire) // 2] + release[len(release) // 2]) / steps:.4f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="1,2,4")
    parser.add_argument("--workload", choices=["device", "suites"], default="device")
    parser.add_argument("--model", default="digits_cnn", help="zoo model, ONNX file or model spec YAML")
    parser.add_argument("--runs", type=int, default=2, help="device workload: runner calls per device")
    parser.add_argument("--iterations", type=int, default=3000, help="device workload: timed iterations per call")
    parser.add_argument("--compare-pinning", action="store_true",
                        help="also run every count with the simulators unpinned (HARNESS_SIMULATOR_CPUS=off)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="run every configuration this many times, interleaved; report the median")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--labgrid", action="store_true",
                        help="two suites jobs against one labgrid farm: alone, back to back and together")
    for name in ("--worker", "--devices-file", "--work", "--go"):  # a device's host process (internal)
        parser.add_argument(name, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.labgrid:
        with tempfile.TemporaryDirectory(prefix="bench-farm-") as tmp:
            cache = Path(args.cache_dir) if args.cache_dir else Path(tmp) / "cache"
            return labgrid_jobs(args, cache, Path(tmp))
    counts = [int(c) for c in args.devices.split(",")]
    if 1 not in counts:
        counts.insert(0, 1)
    run = run_device if args.workload == "device" else run_suites
    with tempfile.TemporaryDirectory(prefix="bench-farm-") as tmp:
        cache = Path(args.cache_dir) if args.cache_dir else Path(tmp) / "cache"
        run(1, True, args, cache, Path(tmp))  # warm the cache: model, conversion, QDQ model, context binary
        runs: dict[tuple[int, bool], list[Measure]] = {}
        for _ in range(args.repeat):  # interleaved, so that a burst of other load hits every configuration alike
            for c in counts:
                for pinned in ((True, False) if args.compare_pinning else (True,)):
                    runs.setdefault((c, pinned), []).append(run(c, pinned, args, cache, Path(tmp)))
    report([sorted(ms, key=lambda m: m.wall_s)[len(ms) // 2] for ms in runs.values()], args.workload,
           {key: [m.throughput for m in ms] for key, ms in runs.items()})


if __name__ == "__main__":
    main()
