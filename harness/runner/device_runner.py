#!/usr/bin/env python3
"""Device-side runner: runs an ONNX model on a device runtime, laid out like qnn-net-run.

Self-contained on purpose: it needs only numpy and onnxruntime (plus onnxruntime-qnn for the
`htp` runtime) on the device, and is pushed there as one file.

Inputs:  --input_list FILE, one line per inference; each line holds space-separated `name:=path`
         items (or bare paths, in the model's input order) naming raw float32 files. A first line
         starting with '#' or '%' lists output names to keep (qnn-net-run's convention).
Outputs: OUTPUT_DIR/Result_<N>/<output name>.raw (float32), and OUTPUT_DIR/runner_report.json
         with timings, the real per-node execution-provider placement, the output shapes and the
         machine it ran on (`machine`, `system`: platform.machine()/system(); on x86-64 the QNN HTP
         backend is Qualcomm's simulator, on aarch64/ARM64 the SoC's HTP). When the HTP refuses a
         node with CPU fallback disabled, `refused_nodes` lists the nodes [{node, op_type, ep}] a second
         session, with fallback allowed, leaves off the HTP (the error names them too).
Timing:  --warmup N untimed runs, then one pass over the input list (its outputs are written), then,
         with --min_iterations/--min_duration, a measurement loop cycling over the inputs until at
         least that many iterations AND that many seconds have run (MLPerf's rule). Every iteration's
         time is reported (`iteration_s`); statistics are left to the host. `peak_rss_mb` is the
         process's peak resident memory.
Context binaries: a `context.json` beside an EPContext model records the SoC it was compiled for;
         a binary for another SoC than --soc_model/--htp_arch is refused (exit 2), never run.
Soak:    --soak_duration S (or --soak_iterations N) runs the inputs round-robin for that long after the
         outputs pass, timing every iteration; `soak` reports per --window_s window statistics
         (iterations, p50/p90/mean/max ms, throughput) on the soak's clock, and `iteration_s`/`iteration_end_s`
         every iteration. With --telemetry_interval the runner samples the device's thermal zones, battery
         (current_now, voltage_now, status) and, with --thermal_status dumpsys, Android's thermal status, in
         a thread on the same clock (`telemetry`: samples with the raw sysfs lines, the sampler's CPU time);
         --idle_s S samples that long with the model loaded and idle before the soak (phase "idle").
Concurrency: --sessions N with --concurrent_duration S runs N sessions at once (round-robin over --model and
         every --also MODEL INPUT_LIST), in threads of this process or (--concurrency_mode processes) in
         copies of this runner, after each model ran alone for --solo_duration S; `concurrency` reports each
         session's solo and concurrent latency, iterations and errors, and the aggregate throughput.
Emulated devices: where HARNESS_EMULATED_NPU_DIR is set (only the harness's emulators set it) the runner
         reports its inference busy time there and stretches inferences by the throttle factor the
         emulated device writes (harness.emulator.thermal); on a real device nothing changes.
Exit codes: 0 ok, 2 bad input or model, 3 runtime failure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
import traceback

RUNNER_VERSION = "4"  # 2: the machine it ran on; 3: the nodes the HTP refused; 4: soak, telemetry, concurrency


class RunnerFailure(Exception):
    def __init__(self, message, code=2):
        super().__init__(message)
        self.code = code


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--runtime", choices=["htp", "cpu"], required=True)
    p.add_argument("--input_list")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--htp_arch", type=int)
    p.add_argument("--soc_model", type=int)
    p.add_argument("--allow_cpu_fallback", action="store_true",
                   help="let nodes the HTP cannot run fall back to the CPU EP (off by default)")
    p.add_argument("--placement_only", action="store_true",
                   help="create the session, record the node placement, run nothing")
    p.add_argument("--profiling_level", choices=["off", "basic", "detailed"], default="off")
    p.add_argument("--warmup", type=int, default=0, help="untimed runs of the first input before timing")
    p.add_argument("--min_iterations", type=int, default=0,
                   help="measurement loop: at least this many timed iterations (0: no loop)")
    p.add_argument("--min_duration", type=float, default=0.0,
                   help="measurement loop: at least this many seconds (0: no minimum)")
    p.add_argument("--profiling_file", help="QNN profile CSV path (default: OUTPUT_DIR/qnn_profile.csv)")
    p.add_argument("--intra_op_threads", type=int, default=0,
                   help="onnxruntime intra-op threads for the CPU parts (0: onnxruntime's default)")
    p.add_argument("--soak_duration", type=float, default=0.0, help="soak: run for this many seconds")
    p.add_argument("--soak_iterations", type=int, default=0, help="soak: run exactly this many inferences")
    p.add_argument("--window_s", type=float, default=5.0, help="soak: window length for per-window statistics")
    p.add_argument("--idle_s", type=float, default=0.0, help="soak: sample telemetry this long, idle, first")
    p.add_argument("--telemetry_interval", type=float, default=0.0, help="soak: sample telemetry every S (0: off)")
    p.add_argument("--thermal_dir", default="/sys/class/thermal")
    p.add_argument("--power_supply", default="", help="battery directory (current_now, voltage_now, status)")
    p.add_argument("--thermal_status", choices=["none", "dumpsys"], default="none",
                   help="dumpsys: read Android's thermal status (dumpsys thermalservice) with each sample")
    p.add_argument("--sessions", type=int, default=0, help="concurrency: this many sessions at once")
    p.add_argument("--also", nargs=2, action="append", default=[], metavar=("MODEL", "INPUT_LIST"),
                   help="concurrency: another model (with its input list) whose sessions run beside --model's")
    p.add_argument("--concurrent_duration", type=float, default=0.0, help="concurrency: seconds all sessions run")
    p.add_argument("--solo_duration", type=float, default=0.0, help="concurrency: seconds each model runs alone first")
    p.add_argument("--concurrency_mode", choices=["threads", "processes"], default="threads")
    p.add_argument("--start_at", type=float, default=0.0, help=argparse.SUPPRESS)  # processes mode: start barrier
    args = p.parse_args(argv)
    if args.soak_duration and args.soak_iterations:
        p.error("give --soak_duration or --soak_iterations, not both")
    if (args.soak_duration or args.soak_iterations) and args.window_s <= 0:
        p.error("--window_s must be > 0")
    return args


CONTEXT_SIDECAR = "context.json"


def check_context_target(args, report):
    """Refuse a context binary whose sidecar names another SoC than the one this run targets."""
    sidecar = os.path.join(os.path.dirname(os.path.abspath(args.model)), CONTEXT_SIDECAR)
    if not os.path.isfile(sidecar):
        return
    with open(sidecar) as f:
        built = json.load(f)
    report["context_target"] = {k: built.get(k) for k in ("soc", "soc_name", "htp_arch", "soc_model")}
    if args.runtime != "htp":
        return
    if any(want and built.get(key) != want for key, want in (("soc_model", args.soc_model),
                                                              ("htp_arch", args.htp_arch))):
        raise RunnerFailure(
            f"context binary {os.path.basename(args.model)} was compiled for SoC {built.get('soc')} "
            f"({built.get('soc_name')}, soc_model {built.get('soc_model')}, v{built.get('htp_arch')}), but this "
            f"run targets soc_model {args.soc_model}, v{args.htp_arch}: recompile it for this device's SoC")


def peak_rss_mb():
    """Return this process's peak resident set size in MiB (Linux: VmHWM, which, unlike getrusage's maxrss,
    does not carry over the parent's peak across fork/exec), or None where neither can be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows on Snapdragon
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


NPU_DIR_ENV = "HARNESS_EMULATED_NPU_DIR"
NPU_SYNC_S = 0.1


class EmulatedNpu:
    """The emulated device's side channel (HARNESS_EMULATED_NPU_DIR, set only by the harness's emulators).

    The runner adds each inference's time to its busy seconds, written to `busy.<pid>` at most every
    NPU_SYNC_S (the emulated thermal model turns busy time into power), and reads `throttle`, the factor
    by which the emulated HTP is slowed while it is above its trip point: each inference is stretched to
    factor x its time (a sleep), as a throttled NPU takes longer. Thread-safe.
    """

    def __init__(self, directory):
        self.directory = directory
        self.path = os.path.join(directory, "busy.%d" % os.getpid())
        self.busy_s = 0.0
        self.factor = 1.0
        self._next_sync = 0.0
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls):
        """Return the hooks of an emulated device, or None on a real one."""
        directory = os.environ.get(NPU_DIR_ENV)
        return cls(directory) if directory and os.path.isdir(directory) else None

    def account(self, elapsed_s):
        """Account elapsed_s of inference; return the inference's time on the (possibly throttled) NPU."""
        extra = (self.factor - 1.0) * elapsed_s
        if extra > 0:
            time.sleep(extra)
        with self._lock:
            self.busy_s += elapsed_s + extra
            now = time.monotonic()
            if now >= self._next_sync:
                self._next_sync = now + NPU_SYNC_S
                self._sync()
        return elapsed_s + extra

    def _sync(self):
        tmp = "%s.%d.part" % (self.path, threading.get_ident())
        try:
            with open(tmp, "w") as f:
                f.write("%.6f\n" % self.busy_s)
            os.replace(tmp, self.path)
            with open(os.path.join(self.directory, "throttle")) as f:
                self.factor = max(1.0, float(f.read().strip() or 1.0))
        except (OSError, ValueError):
            pass

    def close(self):
        """Write the final busy time."""
        with self._lock:
            self._sync()


def timed_run(session, out_names, feed, npu):
    """Run one inference; return (outputs, seconds it took on the device's NPU)."""
    t = time.perf_counter()
    outs = session.run(out_names, feed)
    elapsed = time.perf_counter() - t
    return outs, (npu.account(elapsed) if npu is not None else elapsed)


def measure(session, out_names, feeds, min_iterations, min_duration_s, npu=None):
    """Run feeds round-robin until both minimums are met; return (per-iteration seconds, loop seconds)."""
    times = []
    clock = time.perf_counter
    start = clock()
    i = 0
    while i < min_iterations or clock() - start < min_duration_s:
        times.append(timed_run(session, out_names, feeds[i % len(feeds)], npu)[1])
        i += 1
    return times, clock() - start


def soak(session, out_names, feeds, duration_s, iterations, npu, t0, errors=None):
    """Run feeds round-robin for duration_s (or exactly `iterations` inferences); return (per-iteration
    seconds, each iteration's end on the soak clock, which starts at t0 = time.perf_counter()). With an
    errors list, a failed inference is counted there instead of raised."""
    times, ends = [], []
    clock = time.perf_counter
    i = 0
    while (i < iterations) if iterations else (clock() - t0 < duration_s):
        feed = feeds[i % len(feeds)]
        i += 1
        try:
            times.append(timed_run(session, out_names, feed, npu)[1])
        except Exception as e:
            if errors is None:
                raise
            errors.append("%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
            continue
        ends.append(clock() - t0)
    return times, ends


def percentile(sorted_values, q):
    """Return the q-th percentile (0..100, linear interpolation as numpy's default) of sorted values."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def latency_summary(times_s, span_s):
    """Return {iterations, p50_ms, p90_ms, mean_ms, max_ms, throughput_ips} of times over span_s seconds."""
    ms = sorted(t * 1000.0 for t in times_s)
    return {"iterations": len(ms), "p50_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90),
            "mean_ms": sum(ms) / len(ms) if ms else None, "max_ms": ms[-1] if ms else None,
            "throughput_ips": len(ms) / span_s if span_s > 0 else None}


def window_stats(times, ends, window_s, total_s):
    """Return per-window statistics of the iterations ending in [k*window_s, (k+1)*window_s) (a last window
    shorter than half a window is folded into the one before it); throughput_ips is 1000 / mean_ms."""
    count = max(1, int(total_s // window_s))
    if total_s - count * window_s >= window_s / 2:
        count += 1
    bounds = [(k * window_s, min((k + 1) * window_s, total_s) if k < count - 1 else total_s) for k in range(count)]
    groups = [[] for _ in bounds]
    for t, end in zip(times, ends):
        k = min(int(end // window_s), count - 1)
        groups[k].append(t)
    windows = []
    for k, ((lo, hi), group) in enumerate(zip(bounds, groups)):
        stats = latency_summary(group, hi - lo)
        # back-to-back iterations: throughput is 1 / mean latency (a slow model's iteration count per window
        # is too coarse); a window in which no iteration ended has none
        stats["throughput_ips"] = 1000.0 / stats["mean_ms"] if stats["mean_ms"] else None
        windows.append(dict(index=k, t_start_s=lo, t_end_s=hi, **stats))
    return windows


STATUS_INTERVAL_S = 2.0  # dumpsys thermalservice is a process per read: at most this often
_STATUS_LINE = re.compile(r"Thermal Status:\s*(\d+)")


class Sampler(threading.Thread):
    """Samples thermal zones and the battery every interval_s and (optionally) Android's thermal status every
    STATUS_INTERVAL_S at most (dumpsys is a process per read: it would cost the device more than the rest), on the
    soak clock (t0 = time.perf_counter() at the soak's start); each sample keeps the raw lines in the
    host's `grep -H` form (zone/type:..., zone/temp:..., current_now:..., voltage_now:..., status:...)."""

    def __init__(self, args, t0):
        super().__init__(name="telemetry", daemon=True)
        self.interval_s = args.telemetry_interval
        self.thermal_dir = args.thermal_dir
        self.power_supply = args.power_supply
        self.dumpsys = args.thermal_status == "dumpsys"
        self.t0 = t0
        self.phase = "idle"
        self.samples = []
        self.errors = []
        self.cpu_s = 0.0
        self._stop_event = threading.Event()
        self._last_status_t = float("-inf")
        times = os.times()
        self._children_cpu0 = times.children_user + times.children_system

    def _zones(self):
        try:
            return sorted((z for z in os.listdir(self.thermal_dir) if z.startswith("thermal_zone")),
                          key=lambda z: int(z[len("thermal_zone"):]) if z[len("thermal_zone"):].isdigit() else 1 << 30)
        except OSError:
            return []

    def static_lines(self):
        """Return the zones' type and trip-point lines (read once)."""
        lines = []
        for zone in self._zones():
            base = os.path.join(self.thermal_dir, zone)
            try:
                names = sorted(n for n in os.listdir(base) if n == "type" or n.startswith("trip_point_"))
            except OSError:
                continue
            for name in names:
                value = _read(os.path.join(base, name))
                if value is not None:
                    lines.append("%s/%s:%s" % (zone, name, value))
        return lines

    def read(self):
        """Return one sample: {t_s, phase, raw, thermal_status}."""
        t = time.perf_counter() - self.t0
        lines = []
        for zone in self._zones():
            value = _read(os.path.join(self.thermal_dir, zone, "temp"))
            if value is not None:
                lines.append("%s/temp:%s" % (zone, value))
        if self.power_supply:
            for name in ("current_now", "voltage_now", "status"):
                value = _read(os.path.join(self.power_supply, name))
                if value is not None:
                    lines.append("%s:%s" % (name, value))
        status = None
        if self.dumpsys and t - self._last_status_t >= STATUS_INTERVAL_S:
            self._last_status_t = t
            try:
                out = subprocess.run(["dumpsys", "thermalservice"], capture_output=True, text=True, timeout=5).stdout
                match = _STATUS_LINE.search(out)
                status = int(match.group(1)) if match else None
            except (OSError, subprocess.SubprocessError) as e:
                if len(self.errors) < 5:
                    self.errors.append("dumpsys thermalservice: %s" % e)
        return {"t_s": round(t, 4), "phase": self.phase, "raw": "\n".join(lines), "thermal_status": status}

    def run(self):
        next_t = time.perf_counter()
        while True:
            self.samples.append(self.read())
            self.cpu_s = time.thread_time()
            next_t += self.interval_s
            if self._stop_event.wait(max(0.0, next_t - time.perf_counter())):
                return

    def stop(self):
        """Stop sampling after one last sample; return the `telemetry` report entry."""
        self._stop_event.set()
        self.join(timeout=10)
        self.samples.append(self.read())
        times = os.times()
        return {"interval_s": self.interval_s, "samples": self.samples, "static": self.static_lines(),
                "sampler_cpu_s": self.cpu_s, "status_interval_s": STATUS_INTERVAL_S if self.dumpsys else None,
                # dumpsys processes (the only children the runner starts during a soak)
                "sampler_children_cpu_s": times.children_user + times.children_system - self._children_cpu0,
                "errors": self.errors}


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def session_loop(session, out_names, feeds, until, npu, errors):
    """Run feeds round-robin until time.perf_counter() >= until, counting (not raising) failed inferences
    in errors (a list of messages); return the per-iteration seconds of the inferences that succeeded."""
    times = []
    i = 0
    while time.perf_counter() < until:
        try:
            times.append(timed_run(session, out_names, feeds[i % len(feeds)], npu)[1])
        except Exception as e:  # counted per session, as qnn-throughput-net-run does
            errors.append("%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
            time.sleep(0.01)
        i += 1
    return times


def load_plan(np, ort, args, model, input_list, report):
    """Return (session, output names, feeds) for model over its input list."""
    session = make_session(ort, args, report, model)
    metas = session.get_inputs()
    lines, keep = _read_input_list(input_list, [m.name for m in metas])
    out_names = keep or [o.name for o in session.get_outputs()]
    by_name = {m.name: m for m in metas}
    return session, out_names, [{n: _load_input(np, f, by_name[n]) for n, f in e.items()} for e in lines]


def run_concurrency(np, ort, args, npu, report):
    """Each model alone for --solo_duration, then --sessions sessions at once for --concurrent_duration;
    return the `concurrency` report entry."""
    models = [(args.model, args.input_list)] + [tuple(pair) for pair in args.also]
    assign = [models[i % len(models)] for i in range(args.sessions)]
    solo = {}
    plans = {}
    for model, input_list in models:
        session, out_names, feeds = load_plan(np, ort, args, model, input_list, {})
        if feeds:
            timed_run(session, out_names, feeds[0], npu)  # warm-up
        errors = []
        t0 = time.perf_counter()
        times = session_loop(session, out_names, feeds, t0 + args.solo_duration, npu, errors)
        solo[model] = dict(latency_summary(times, time.perf_counter() - t0), errors=len(errors))
        plans[model] = (session, out_names, feeds)
    if args.concurrency_mode == "processes":
        plans.clear()  # each copy of the runner loads its own session
        sessions = _concurrent_processes(args, assign)
    else:
        sessions = _concurrent_threads(np, ort, args, assign, plans, npu)
    for entry, (model, _) in zip(sessions, assign):
        entry["model"] = model
        entry["solo"] = solo[model]
    span = max((e["span_s"] for e in sessions), default=0.0)
    total = sum(e["concurrent"]["iterations"] for e in sessions)
    return {"mode": args.concurrency_mode, "sessions": sessions, "duration_s": span,
            "solo_duration_s": args.solo_duration, "aggregate_throughput_ips": total / span if span > 0 else None,
            "errors": sum(e["errors"] for e in sessions)}


def _concurrent_threads(np, ort, args, assign, plans, npu):
    """Run one session per assignment in its own thread, all starting together."""
    loaded, reused = [], set()
    for model, input_list in assign:
        if model in plans and model not in reused:  # the first session of each model is its solo session
            reused.add(model)
            loaded.append(plans[model])
        else:
            loaded.append(load_plan(np, ort, args, model, input_list, {}))
    results = [None] * len(assign)
    barrier = threading.Barrier(len(assign) + 1)
    until = [0.0]

    def worker(k):
        session, out_names, feeds = loaded[k]
        errors = []
        barrier.wait()
        t0 = time.perf_counter()
        times = session_loop(session, out_names, feeds, until[0], npu, errors)
        results[k] = {"index": k, "concurrent": latency_summary(times, time.perf_counter() - t0),
                      "span_s": time.perf_counter() - t0, "errors": len(errors), "first_error": errors[0] if errors else None}

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(len(assign))]
    for t in threads:
        t.start()
    until[0] = time.perf_counter() + args.concurrent_duration
    barrier.wait()
    for t in threads:
        t.join()
    return results


def _concurrent_processes(args, assign):
    """Run one copy of this runner per assignment, each with one session, released at one start time."""
    start_at = time.monotonic() + max(5.0, 2.0 * len(assign))
    procs = []
    for k, (model, input_list) in enumerate(assign):
        out = os.path.join(args.output_dir, "session_%d" % k)
        argv = [sys.executable, os.path.abspath(__file__), "--model", model, "--runtime", args.runtime,
                "--input_list", input_list, "--output_dir", out, "--soak_duration", repr(args.concurrent_duration),
                "--window_s", repr(max(args.concurrent_duration, 1e-3)), "--start_at", repr(start_at)]
        for name in ("htp_arch", "soc_model"):
            if getattr(args, name):
                argv += ["--" + name, str(getattr(args, name))]
        if args.allow_cpu_fallback:
            argv.append("--allow_cpu_fallback")
        procs.append((k, out, subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    results = []
    for k, out, proc in procs:
        _, stderr = proc.communicate()
        try:
            with open(os.path.join(out, "runner_report.json")) as f:
                child = json.load(f)
        except (OSError, ValueError):
            child = {"error": (stderr or b"").decode(errors="replace").strip() or "exit code %d" % proc.returncode}
        soaked = child.get("soak") or {}
        times = child.get("iteration_s") or []
        span = soaked.get("duration_s") or 0.0
        errors = list(soaked.get("errors") or []) + ([child["error"]] if child.get("error") else [])
        results.append({"index": k, "concurrent": latency_summary(times, span), "span_s": span,
                        "errors": len(errors), "first_error": errors[0] if errors else None, "pid": proc.pid})
    return results


def run_soak(session, out_names, feeds, args, npu, report):
    """The soak: (with telemetry) an idle phase of --idle_s, then the timed soak; fills report's `soak`,
    `iteration_s`, `iteration_end_s` and `telemetry`."""
    sampler = None
    t0 = time.perf_counter() + (args.idle_s if args.telemetry_interval > 0 else 0.0)
    if args.telemetry_interval > 0:
        sampler = Sampler(args, t0)
        sampler.start()
    if args.start_at:  # a copy of the runner in a multi-process concurrency run: start with the others
        time.sleep(max(0.0, args.start_at - time.monotonic()))
        t0 = time.perf_counter()
    time.sleep(max(0.0, t0 - time.perf_counter()))
    if sampler is not None:
        sampler.phase = "soak"
    errors = [] if args.start_at else None
    times, ends = soak(session, out_names, feeds, args.soak_duration, args.soak_iterations, npu, t0, errors)
    total = time.perf_counter() - t0
    report["iteration_s"] = times
    report["iteration_end_s"] = ends
    report["soak"] = {"duration_s": total, "iterations": len(times), "window_s": args.window_s,
                      "requested_duration_s": args.soak_duration, "requested_iterations": args.soak_iterations,
                      "windows": window_stats(times, ends, args.window_s, total), "errors": errors or [],
                      "throttle_factor_last": npu.factor if npu is not None else None}
    if sampler is not None:
        report["telemetry"] = sampler.stop()


def _sanitize(name):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "output"


def _read_input_list(path, input_names):
    base = os.path.dirname(os.path.abspath(path))
    keep_outputs = None
    lines = []
    with open(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            if lineno == 1 and line[0] in "#%":
                keep_outputs = line[1:].split()
                continue
            items = line.split()
            entry = {}
            for pos, item in enumerate(items):
                if ":=" in item:
                    name, file = item.split(":=", 1)
                else:
                    if pos >= len(input_names):
                        raise RunnerFailure(f"{path}:{lineno}: more files than the model's {len(input_names)} inputs")
                    name, file = input_names[pos], item
                if name not in input_names:
                    raise RunnerFailure(f"{path}:{lineno}: '{name}' is not an input of the model "
                                        f"(inputs: {', '.join(input_names)})")
                entry[name] = file if os.path.isabs(file) else os.path.join(base, file)
            missing = [n for n in input_names if n not in entry]
            if missing:
                raise RunnerFailure(f"{path}:{lineno}: no file for input(s) {', '.join(missing)}")
            lines.append(entry)
    return lines, keep_outputs


_NP_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
             "tensor(int32)": "int32", "tensor(uint8)": "uint8", "tensor(int8)": "int8",
             "tensor(uint16)": "uint16", "tensor(int16)": "int16", "tensor(bool)": "bool"}


def _load_input(np, file, meta):
    if not os.path.isfile(file):
        raise RunnerFailure(f"input file not found: {file}")
    data = np.fromfile(file, dtype=np.float32)
    shape = [d if isinstance(d, int) else -1 for d in meta.shape]
    expected = 1
    for d in shape:
        expected *= d if d > 0 else 1
    if -1 not in shape and data.size != expected:
        raise RunnerFailure(f"input '{meta.name}' from {file}: {data.size} float32 values, "
                            f"the model expects shape {shape} ({expected} values)")
    return data.reshape(shape).astype(_NP_TYPES.get(meta.type, "float32"))


def make_session(ort, args, report, model=None):
    model = model or args.model
    so = _session_options(ort, args)
    if args.runtime == "cpu":
        t0 = time.perf_counter()
        session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        report["session_create_s"] = time.perf_counter() - t0
        return session
    try:
        import onnxruntime_qnn
    except ImportError:
        raise RunnerFailure("runtime 'htp' needs the onnxruntime-qnn package on the device "
                            "(pip install onnxruntime-qnn)", 3)
    try:
        ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    except Exception as e:  # already registered in this process
        if "already" not in str(e).lower():
            raise
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    if not devices:
        raise RunnerFailure("the QNN execution provider registered no device", 3)
    options = {"backend_type": "htp", "enable_htp_fp16_precision": "1"}
    if args.htp_arch:
        options["htp_arch"] = str(args.htp_arch)
    if args.soc_model:
        options["soc_model"] = str(args.soc_model)
    if args.profiling_level != "off":
        options["profiling_level"] = args.profiling_level
        options["profiling_file_path"] = os.path.abspath(args.profiling_file or
                                                         os.path.join(args.output_dir, "qnn_profile.csv"))
        report["profile_csv"] = args.profiling_file or "qnn_profile.csv"
    report["provider_options"] = options
    if not args.allow_cpu_fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(devices, options)
    try:
        t0 = time.perf_counter()
        session = ort.InferenceSession(model, so)
        report["session_create_s"] = time.perf_counter() - t0  # the model's load (and JIT compile) alone
        return session
    except Exception as e:
        msg = str(e)
        if "fallback to CPU EP has been explicitly disabled" in msg:
            report["refused_nodes"] = off_htp_nodes(ort, args, devices, options, model)
            named = "; ".join(f"{n['node']} ({n['op_type']})" for n in report["refused_nodes"][:20])
            raise RunnerFailure("some nodes cannot run on the HTP and CPU fallback is disabled; with fallback "
                                f"allowed the CPU would run {len(report['refused_nodes'])} node(s): "
                                f"{named or 'none reported'}; run the feasibility step for the full placement", 3)
        raise


def _session_options(ort, args):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if args.intra_op_threads > 0:
        so.intra_op_num_threads = args.intra_op_threads
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    return so


def off_htp_nodes(ort, args, devices, options, model):
    """Return the nodes a session with CPU fallback allowed leaves off the HTP ([] if it fails too)."""
    so = _session_options(ort, args)
    so.add_provider_for_devices(devices, {k: v for k, v in options.items() if not k.startswith("profiling")})
    try:
        session = ort.InferenceSession(model, so)
    except Exception:
        return []
    return [row for row in placement(session) if row["ep"] != "QNNExecutionProvider"]


def placement(session):
    rows = []
    for subgraph in session.get_provider_graph_assignment_info():
        for node in subgraph.get_nodes():
            rows.append({"node": node.name, "op_type": node.op_type, "ep": subgraph.ep_name})
    return rows


def self_check():
    """Print what this device's runner can use (numpy, onnxruntime, the QNN EP) as JSON; return the exit code."""
    info = {"runner_version": RUNNER_VERSION, "machine": platform.machine(), "system": platform.system(),
            "python": platform.python_version(), "qnn_ep": False, "error": None}
    try:
        import numpy
        import onnxruntime as ort

        info["numpy"], info["onnxruntime"] = numpy.__version__, ort.__version__
        import onnxruntime_qnn

        info["onnxruntime_qnn"] = getattr(onnxruntime_qnn, "__version__", "unknown")
        try:
            ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
        except Exception as e:  # already registered
            if "already" not in str(e).lower():
                raise
        info["qnn_ep"] = any(d.ep_name == "QNNExecutionProvider" for d in ort.get_ep_devices())
    except Exception as e:  # reported, not raised: the host decides what is missing
        info["error"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(info))
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--self_check"]:
        return self_check()
    args = parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    report = {"runner_version": RUNNER_VERSION, "runtime": args.runtime, "model": args.model, "error": None,
              "machine": platform.machine(), "system": platform.system()}
    report_path = os.path.join(args.output_dir, "runner_report.json")
    code = 0
    npu = EmulatedNpu.from_env()
    try:
        import numpy as np
        import onnxruntime as ort

        ort.set_default_logger_severity(3)
        report["onnxruntime_version"] = ort.__version__
        if not os.path.isfile(args.model):
            raise RunnerFailure(f"model not found: {args.model}")
        check_context_target(args, report)
        t0 = time.perf_counter()
        session = make_session(ort, args, report)
        report["load_s"] = time.perf_counter() - t0
        report["placement"] = placement(session)
        if not args.placement_only:
            if not args.input_list:
                raise RunnerFailure("--input_list is required unless --placement_only")
            metas = session.get_inputs()
            lines, keep = _read_input_list(args.input_list, [m.name for m in metas])
            out_names = [o.name for o in session.get_outputs()]
            if keep:
                unknown = [n for n in keep if n not in out_names]
                if unknown:
                    raise RunnerFailure(f"{args.input_list}: unknown output(s) {', '.join(unknown)}")
                out_names = keep
            by_name = {m.name: m for m in metas}
            feeds = [{n: _load_input(np, f, by_name[n]) for n, f in e.items()} for e in lines]
            for _ in range(args.warmup if feeds else 0):
                timed_run(session, out_names, feeds[0], npu)
            times, outputs_meta = [], []
            for i, feed in enumerate(feeds):
                outs, elapsed = timed_run(session, out_names, feed, npu)
                times.append(elapsed)
                rdir = os.path.join(args.output_dir, f"Result_{i}")
                os.makedirs(rdir, exist_ok=True)
                for name, value in zip(out_names, outs):
                    fname = _sanitize(name) + ".raw"
                    np.asarray(value, dtype=np.float32).tofile(os.path.join(rdir, fname))
                    if i == 0:
                        outputs_meta.append({"name": name, "file": fname, "shape": list(np.shape(value)),
                                             "dtype": str(np.asarray(value).dtype)})
            report["inference_s"] = times
            report["outputs"] = outputs_meta
            if feeds and (args.min_iterations > 0 or args.min_duration > 0):
                loop, loop_s = measure(session, out_names, feeds, args.min_iterations, args.min_duration, npu)
                report["iteration_s"] = loop
                report["measurement"] = {"warmup": args.warmup, "min_iterations": args.min_iterations,
                                         "min_duration_s": args.min_duration, "iterations": len(loop),
                                         "duration_s": loop_s}
            if feeds and (args.soak_duration > 0 or args.soak_iterations > 0):
                run_soak(session, out_names, feeds, args, npu, report)
            if feeds and args.sessions > 0:
                report["concurrency"] = run_concurrency(np, ort, args, npu, report)
        del session  # the QNN EP writes its profile when the session is released
    except RunnerFailure as e:
        report["error"], code = str(e), e.code
    except Exception as e:  # report anything the runtime raised, with its own words
        report["error"], code = f"{type(e).__name__}: {e}", 3
        report["traceback"] = traceback.format_exc()
    if npu is not None:
        npu.close()
    report["peak_rss_mb"] = peak_rss_mb()
    with open(report_path + ".part", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(report_path + ".part", report_path)
    if report["error"]:
        print(f"runner: {report['error']}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
