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
         --idle_s S samples that long with the model loaded and idle before the soak (phase "idle"), --tail_s S
         that long after it (phase "tail": power readings lag the load).
Concurrency: --sessions N with --concurrent_duration S runs N sessions at once (round-robin over --model and
         every --also MODEL INPUT_LIST), in threads of this process or (--concurrency_mode processes) in
         copies of this runner, and each model alone for --solo_duration S; --rounds R alternates the solo
         and the shared phases R times (each 1/R of its duration); `concurrency` reports each session's solo
         and concurrent latency, iterations and errors, its p50s per round, and the aggregate throughput.
Emulated devices: where HARNESS_EMULATED_NPU_DIR is set (only the harness's emulators set it) the runner keeps
         a modelled device time (EmulatedNpu): each inference costs --emulated_latency_ms (the host's model,
         harness.emulator.device_time) times the throttle factor the emulated thermal model writes; during a
         timed loop the modelled HTP is busy back to back on the wall clock and that busy time goes to the
         thermal model. The simulator still runs every inference (outputs, errors) and its times stay in
         `iteration_s`; `emulated_iteration_s` holds the modelled time of each of those iterations, a soak's
         `windows`/`iterations` and a concurrency run's `solo`/`concurrent` are the modelled HTP's (labelled
         `latency_source: emulated`; the simulator's under `simulator_*`). Nothing sleeps to stretch a throttled
         inference. `host` records the machine's 1-minute load average at start and end. On a real device
         nothing changes (no emulated_* keys).
Serving: `device_runner.py --serve` keeps one process alive for a device session (the host starts it over the
         transport: a local process, an SSH exec channel, an adb shell v2 stream) and answers requests, one
         JSON object per line on stdin, one reply per line on stdout:
           {"id": N, "op": "run", "argv": [...], "cwd": "."} -> {"id": N, "rc": exit code, "pid": P}
               does what `device_runner.py ARGV` does (cwd relative to the server's start directory): the same
               OUTPUT_DIR/runner_report.json, the same exit code;
           {"id": N, "op": "ping"} -> {"id": N, "rc": 0, "pid": P, "info": {--self_check's report}};
           {"id": N, "op": "exit"} -> {"id": N, "rc": 0, "pid": P}, then the server exits.
         A line that is not a request gets {"id": null, "rc": 2, "error": ...}. Replies go to a private copy of
         the original stdout; fd 1 is pointed at stderr at start, so that native libraries printing to stdout
         (QNN's logs) cannot corrupt them. End of stdin (the host went away) ends the server, at once even in
         the middle of a request (its children, the processes-mode copies, with it). Served runs cache their
         InferenceSessions (an LRU of SESSION_CACHE_SIZE) by content: the model's path, the size and mtime of
         the files beside it named after it (.bin/.data siblings) and context.json, runtime, htp_arch,
         soc_model, CPU fallback and intra-op threads. A profiling session is never cached (the QNN EP writes its
         profile when the session is released); --placement_only always creates its session (it is how load time
         is measured) and leaves it in the cache; a run that fails drops its session. The report says
         `session_cached` (true: reused); `load_s` is this call's time to have a session (a reused one: ~0),
         while `session_create_s` stays the session's creation time (a reused session's, from when it was
         created: load KPIs read it, never 0 s for a reuse). `peak_rss_mb` is this request's peak (the peak is
         reset per request where /proc/self/clear_refs allows; else the server's). `pid` is the runner's process.
Exit codes: 0 ok, 2 bad input or model, 3 runtime failure.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
import traceback

RUNNER_VERSION = "7"  # 2: the machine it ran on; 3: the nodes the HTP refused; 4: soak, telemetry, concurrency;
# 5: an emulated device's modelled time (--emulated_latency_ms, emulated_iteration_s), the host's load;
# 6: --serve (one persistent process per device session), sessions cached by content (session_cached), pid;
# 7: inference_cpu_s (the process's CPU seconds per inference: the simulator's cost whatever the host's load)


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
    p.add_argument("--tail_s", type=float, default=0.0,
                   help="soak: keep sampling telemetry this long after the soak (phase 'tail'), for readings that lag")
    p.add_argument("--thermal_dir", default="/sys/class/thermal")
    p.add_argument("--power_supply", default="", help="battery directory (current_now, voltage_now, status)")
    p.add_argument("--thermal_status", choices=["none", "dumpsys"], default="none",
                   help="dumpsys: read Android's thermal status (dumpsys thermalservice) with each sample")
    p.add_argument("--sessions", type=int, default=0, help="concurrency: this many sessions at once")
    p.add_argument("--also", nargs=2, action="append", default=[], metavar=("MODEL", "INPUT_LIST"),
                   help="concurrency: another model (with its input list) whose sessions run beside --model's")
    p.add_argument("--concurrent_duration", type=float, default=0.0, help="concurrency: seconds all sessions run")
    p.add_argument("--solo_duration", type=float, default=0.0, help="concurrency: seconds each model runs alone")
    p.add_argument("--rounds", type=int, default=1,
                   help="concurrency: alternate the solo and the shared phases this many times (each its share)")
    p.add_argument("--concurrency_mode", choices=["threads", "processes"], default="threads")
    p.add_argument("--start_at", type=float, default=0.0, help=argparse.SUPPRESS)  # processes mode: start barrier
    p.add_argument("--emulated_latency_ms", type=float, action="append", default=[],
                   help="emulated devices only: the modelled latency of one inference of --model (then of each "
                        "--also model, in order) on the emulated HTP; ignored on a real device")
    p.add_argument("--emulated_share", type=float, default=1.0, help=argparse.SUPPRESS)  # processes mode: HTP share
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


def proc_status_mb(field):
    """Return a /proc/self/status memory field (VmHWM, VmRSS) in MiB, or None where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) / 1024.0 for line in f if line.startswith(field + ":")), None)
    except (OSError, ValueError, IndexError):
        return None


def past_budget(started, budget_s, item_s):
    """True when one more item as long as item_s (twice it, for safety) would likely end past budget_s seconds
    from started (a time.perf_counter()); never without a budget. The paced commands of llm_runner and
    genie_runner (--budget_s) stop there and report what is left."""
    return budget_s is not None and time.perf_counter() - started + 2.0 * item_s > budget_s


def peak_rss_mb():
    """Return this process's peak resident set size in MiB (Linux: VmHWM, which, unlike getrusage's maxrss,
    does not carry over the parent's peak across fork/exec), or None where neither can be read."""
    peak = proc_status_mb("VmHWM")
    if peak is not None:
        return peak
    try:
        import resource
    except ImportError:  # Windows on Snapdragon
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


NPU_DIR_ENV = "HARNESS_EMULATED_NPU_DIR"
NPU_SYNC_S = 0.1


class EmulatedNpu:
    """The emulated device's HTP (HARNESS_EMULATED_NPU_DIR, set only by the harness's emulators): a modelled time.

    Each inference costs latency_s (--emulated_latency_ms: the host's model of this model on this SoC,
    harness.emulator.device_time) times `throttle`, the factor the emulated thermal model writes (1 unless
    throttled); the simulator still runs every inference for its outputs and errors, but its wall time is only
    the `simulator` figure. While a timed loop runs (begin/end) the modelled HTP is busy back to back on the wall
    clock, as a phone's NPU runs inferences back to back: a thread adds the loop's wall time (x share, the part
    of a shared HTP that is this process's) to the busy seconds written to `busy.<pid>` every NPU_SYNC_S (the
    thermal model turns them into power) and records each change of the throttle factor, so the modelled
    inferences of a span are its length / (latency x factor), whatever the simulator's speed. A single inference
    outside a loop adds its modelled time. Nothing sleeps: throttling changes modelled time, not wall time.
    Without --emulated_latency_ms the simulator's own time stands in (basis "simulator"). Thread-safe.
    `busy.<pid>` is cumulative over the process: a served runner's next request continues from the last
    one's total (carried_s), so the thermal model never sees it go back.
    """

    carried_s = 0.0  # the busy seconds this process's earlier requests wrote (a served runner's)

    def __init__(self, directory, latency_s=None, share=1.0):
        self.directory = directory
        self.path = os.path.join(directory, "busy.%d" % os.getpid())
        self.latency_s = latency_s
        self.share = share
        self.busy_s = self.start_busy_s = EmulatedNpu.carried_s
        self.factor = 1.0
        self._active = 0
        self._since = time.perf_counter()
        self._sim_s = []  # simulator times, the stand-in latency without --emulated_latency_ms
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._read_throttle()
        self.changes = [(self._since, self.factor)]  # (time.perf_counter(), throttle factor from then on)
        self._thread = threading.Thread(target=self._tick, name="emulated-htp", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, latency_s=None, share=1.0):
        """Return the modelled HTP of an emulated device, or None on a real one."""
        directory = os.environ.get(NPU_DIR_ENV)
        return cls(directory, latency_s, share) if directory and os.path.isdir(directory) else None

    @property
    def basis(self):
        """Return what a modelled inference's time rests on: 'model' or 'simulator'."""
        return "model" if self.latency_s is not None else "simulator"

    def base_s(self):
        """Return one unthrottled inference's modelled time."""
        if self.latency_s is not None:
            return self.latency_s
        return sum(self._sim_s) / len(self._sim_s) if self._sim_s else NPU_SYNC_S

    def modelled_s(self, elapsed_s):
        """Note a simulator inference of elapsed_s; return its modelled time on the emulated HTP now."""
        if self.latency_s is None:
            self._sim_s.append(elapsed_s)
        return self.base_s() * self.factor

    def account(self, elapsed_s):
        """Account one inference run outside a timed loop (a loop's HTP is busy all along); return its
        modelled time."""
        modelled = self.modelled_s(elapsed_s)
        with self._lock:
            if not self._active:
                self.busy_s += modelled * self.share
        return modelled

    def begin(self):
        """Mark a timed loop as running: the modelled HTP is busy back to back from now."""
        with self._lock:
            self._accrue()
            self._active += 1

    def end(self):
        """Mark a timed loop as finished."""
        with self._lock:
            self._accrue()
            self._active = max(0, self._active - 1)
        self.sync()

    def _accrue(self):
        now = time.perf_counter()
        if self._active:
            self.busy_s += (now - self._since) * self.share
        self._since = now

    def _tick(self):
        while not self._stop.wait(NPU_SYNC_S):
            self.sync()

    def sync(self):
        """Write the busy seconds and read the throttle factor (recording a change)."""
        with self._lock:
            self._accrue()
            tmp = "%s.%d.part" % (self.path, threading.get_ident())
            try:
                with open(tmp, "w") as f:
                    f.write("%.6f\n" % self.busy_s)
                os.replace(tmp, self.path)
            except OSError:
                pass
            before = self.factor
            self._read_throttle()
            if self.factor != before:
                self.changes.append((time.perf_counter(), self.factor))

    def _read_throttle(self):
        try:
            with open(os.path.join(self.directory, "throttle")) as f:
                self.factor = max(1.0, float(f.read().strip() or 1.0))
        except (OSError, ValueError):
            pass

    def segments(self, t_start, t_end, base_s=None):
        """Return [(start, end, modelled latency s)] of constant throttle covering [t_start, t_end)
        (time.perf_counter() values), on a clock starting at t_start; base_s: the unthrottled latency."""
        base_s = self.base_s() if base_s is None else base_s
        with self._lock:
            changes = list(self.changes)
        out = []
        for k, (t, factor) in enumerate(changes):
            a = max(t, t_start)
            b = min(changes[k + 1][0] if k + 1 < len(changes) else t_end, t_end)
            if b > a:
                out.append((a - t_start, b - t_start, base_s * factor))
        return out

    def time_of(self, t_start, count, base_s=None):
        """Return when (perf_counter) the count-th back-to-back modelled inference from t_start ends."""
        base_s = self.base_s() if base_s is None else base_s
        with self._lock:
            changes = list(self.changes)
        t, done = t_start, 0.0
        for k, (_t, factor) in enumerate(changes):
            seg_end = changes[k + 1][0] if k + 1 < len(changes) else float("inf")
            if seg_end <= t:
                continue
            latency = base_s * factor
            if done + (seg_end - t) / latency >= count:
                return t + (count - done) * latency
            done += (seg_end - t) / latency
            t = seg_end
        return t

    def close(self):
        """Stop the thread; write the final busy time."""
        self._stop.set()
        self._thread.join(timeout=2 * NPU_SYNC_S + 1)
        self.sync()
        EmulatedNpu.carried_s = self.busy_s


def modelled_count(segments):
    """Return the number of back-to-back modelled inferences in segments (fractional)."""
    return sum((b - a) / latency for a, b, latency in segments)


def weighted_summary(pieces, span_s, base_s=None):
    """Return latency_summary's fields (plus min_ms, p99_ms, std_ms, base_ms) of modelled inferences given as
    (latency s, count) pieces over span_s seconds; throughput_ips is 1000 / mean_ms."""
    pieces = sorted((lat * 1000.0, c) for lat, c in pieces if c > 0)
    n = sum(c for _, c in pieces)
    out = {"iterations": int(round(n)), "p50_ms": None, "p90_ms": None, "p99_ms": None, "mean_ms": None,
           "max_ms": None, "min_ms": None, "std_ms": None, "throughput_ips": None,
           "base_ms": base_s * 1000.0 if base_s is not None else None}
    if not pieces:
        return out

    def at(index):
        cum = 0.0
        for value, c in pieces:
            cum += c
            if index < cum:
                return value
        return pieces[-1][0]

    def quantile(q):
        pos = max(0.0, (n - 1) * q / 100.0)
        lo = int(pos)
        return at(lo) + (at(lo + 1) - at(lo)) * (pos - lo)

    mean = sum(v * c for v, c in pieces) / n
    out.update(p50_ms=quantile(50), p90_ms=quantile(90), p99_ms=quantile(99), mean_ms=mean, max_ms=pieces[-1][0],
               min_ms=pieces[0][0], std_ms=(sum(c * (v - mean) ** 2 for v, c in pieces) / n) ** 0.5,
               throughput_ips=1000.0 / mean if mean else None)
    return out


def segment_pieces(segments, lo, hi):
    """Return the (latency, count) pieces of the segments' inferences within [lo, hi)."""
    return [(latency, (min(b, hi) - max(a, lo)) / latency) for a, b, latency in segments if min(b, hi) > max(a, lo)]


def window_bounds(window_s, total_s):
    """Return the [start, end) of each window of a run of total_s (a last window shorter than half a window
    is folded into the one before it)."""
    count = max(1, int(total_s // window_s))
    if total_s - count * window_s >= window_s / 2:
        count += 1
    return [(k * window_s, min((k + 1) * window_s, total_s) if k < count - 1 else total_s) for k in range(count)]


def segment_windows(segments, window_s, total_s, base_s=None):
    """Return per-window statistics (window_stats' shape) of back-to-back modelled inferences."""
    return [dict(index=k, t_start_s=lo, t_end_s=hi, **weighted_summary(segment_pieces(segments, lo, hi), hi - lo,
                                                                         base_s))
            for k, (lo, hi) in enumerate(window_bounds(window_s, total_s))]


def timed_run(session, out_names, feed, npu):
    """Run one inference; return (outputs, the simulator's (or the device's) seconds for it)."""
    t = time.perf_counter()
    outs = session.run(out_names, feed)
    elapsed = time.perf_counter() - t
    if npu is not None:
        npu.account(elapsed)
    return outs, elapsed


def measure(session, out_names, feeds, min_iterations, min_duration_s, npu=None):
    """Run feeds round-robin until both minimums are met; return (per-iteration seconds, loop seconds, per-iteration
    modelled seconds on an emulated HTP, else None)."""
    times, modelled = [], []
    clock = time.perf_counter
    if npu is not None:
        npu.begin()
    start = clock()
    i = 0
    try:
        while i < min_iterations or clock() - start < min_duration_s:
            elapsed = timed_run(session, out_names, feeds[i % len(feeds)], npu)[1]
            times.append(elapsed)
            if npu is not None:
                modelled.append(npu.modelled_s(elapsed))
            i += 1
    finally:
        if npu is not None:
            npu.end()
    return times, clock() - start, (modelled if npu is not None else None)


def soak(session, out_names, feeds, duration_s, iterations, npu, t0, errors=None):
    """Run feeds round-robin for duration_s (or exactly `iterations` inferences: on an emulated HTP, until that
    many modelled inferences have run, and at least one simulator inference); return (per-iteration seconds,
    each iteration's end on the soak clock, which starts at t0 = time.perf_counter(), per-iteration modelled
    seconds or None). With an errors list, a failed inference is counted there instead of raised."""
    times, ends, modelled = [], [], []
    clock = time.perf_counter
    i = 0
    if npu is not None:
        npu.begin()
    try:
        while True:
            if not iterations:
                more = clock() - t0 < duration_s
            elif npu is None:
                more = i < iterations
            else:
                more = not times or clock() < npu.time_of(t0, iterations)
            if not more:
                break
            feed = feeds[i % len(feeds)]
            i += 1
            try:
                elapsed = timed_run(session, out_names, feed, npu)[1]
            except Exception as e:
                if errors is None:
                    raise
                errors.append("%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
                continue
            times.append(elapsed)
            ends.append(clock() - t0)
            if npu is not None:
                modelled.append(npu.modelled_s(elapsed))
    finally:
        if npu is not None:
            npu.end()
    return times, ends, (modelled if npu is not None else None)


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
    bounds = window_bounds(window_s, total_s)
    groups = [[] for _ in bounds]
    for t, end in zip(times, ends):
        k = min(int(end // window_s), len(bounds) - 1)
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


def emulated_latencies(args, models):
    """Return each model's modelled latency in s (--emulated_latency_ms, in --model then --also order), or None
    where it was not given."""
    given = args.emulated_latency_ms or []
    return {model: (given[k] / 1000.0 if k < len(given) else None) for k, (model, _) in enumerate(models)}


def shared_latency_s(latencies_s):
    """Return one round of an HTP shared by sessions of these latencies (plus a context switch each if several)."""
    switch_s = CONTEXT_SWITCH_S * len(latencies_s) if len(latencies_s) > 1 else 0.0
    return sum(latencies_s) + switch_s


CONTEXT_SWITCH_S = 0.00001  # harness.emulator.device_time.CONTEXT_SWITCH_MS


def run_concurrency(np, ort, args, npu, report):
    """Return the `concurrency` report entry: --rounds rounds, each running every model alone for its share of
    --solo_duration, then --sessions sessions at once for its share of --concurrent_duration, so the solo and the
    shared phases alternate and a drift of the device's (or the host's) speed reaches both. Each session's
    `solo` and `concurrent` summarise every round, `rounds` holds each round's p50s. On an emulated HTP they are
    the modelled figures (the sessions take turns on the one HTP) and `simulator_solo`/`simulator_concurrent`
    the simulator's."""
    models = [(args.model, args.input_list)] + [tuple(pair) for pair in args.also]
    assign = [models[i % len(models)] for i in range(args.sessions)]
    latencies = emulated_latencies(args, models)
    rounds = max(1, args.rounds)
    solo_s, shared_s = args.solo_duration / rounds, args.concurrent_duration / rounds
    plans = {}
    for model, input_list in models:
        plans[model] = load_plan(np, ort, args, model, input_list, {})
        if plans[model][2]:
            timed_run(plans[model][0], plans[model][1], plans[model][2][0], npu)  # warm-up
    loaded = _shared_plans(np, ort, args, assign, plans) if args.concurrency_mode == "threads" else None
    solo = {model: [] for model, _ in models}
    shared = []  # per round: one phase per session
    cycle = None
    for _ in range(rounds):
        for model, _ in models:
            solo[model].append(_solo_phase(plans[model], solo_s, npu, latencies[model]))
            if npu is not None and latencies[model] is None:
                latencies[model] = _mean(solo[model][0]["times"])
        if npu is not None and cycle is None:
            cycle = shared_latency_s([latencies[m] for m, _ in assign])
        if loaded is not None:
            shared.append(_threads_round(loaded, shared_s, npu, cycle))
        else:
            shared.append(_processes_round(args, assign, shared_s, latencies if npu is not None else None, cycle))
    sessions = []
    for k, (model, _) in enumerate(assign):
        mine = [phases[k] for phases in shared]
        entry = {"index": k, "model": model, "solo": _phases_summary(solo[model], npu, latencies[model]),
                 "concurrent": _phases_summary(mine, npu, cycle), "span_s": sum(p["span"] for p in mine),
                 "errors": sum(len(p["errors"]) for p in mine),
                 "first_error": next((p["errors"][0] for p in mine if p["errors"]), None),
                 "rounds": [_round_entry(a, b, npu, latencies[model], cycle) for a, b in zip(solo[model], mine)]}
        entry["solo"]["errors"] = sum(len(p["errors"]) for p in solo[model])
        if npu is not None:
            entry["simulator_solo"] = _phases_summary(solo[model], None, None)
            entry["simulator_concurrent"] = _phases_summary(mine, None, None)
            entry["simulator_span_s"] = sum(p.get("simulator_span", p["span"]) for p in mine)
        sessions.append(entry)
    span = max((e["span_s"] for e in sessions), default=0.0)
    total = sum(e["concurrent"]["iterations"] for e in sessions)
    out = {"mode": args.concurrency_mode, "sessions": sessions, "duration_s": span, "rounds": rounds,
           "solo_duration_s": args.solo_duration, "aggregate_throughput_ips": total / span if span > 0 else None,
           "errors": sum(e["errors"] for e in sessions), "latency_source": "emulated" if npu is not None else None}
    if npu is not None:
        out["emulated"] = {"basis": npu.basis, "shared_latency_ms": cycle * 1000.0,
                           "solo_latency_ms": {m: latencies[m] * 1000.0 for m, _ in models},
                           "context_switch_ms": CONTEXT_SWITCH_S * 1000.0}
    return out


def _solo_phase(plan, duration_s, npu, base_s):
    """Run one model alone for duration_s; return the phase (times, errors, span, modelled pieces)."""
    session, out_names, feeds = plan
    errors = []
    if npu is not None:
        npu.begin()
    t0 = time.perf_counter()
    times = session_loop(session, out_names, feeds, t0 + duration_s, npu, errors)
    t1 = time.perf_counter()
    phase = {"times": times, "errors": errors, "span": t1 - t0, "pieces": None}
    if npu is not None:
        npu.end()
        base = base_s if base_s is not None else _mean(times)
        phase["pieces"] = segment_pieces(npu.segments(t0, t1, base), 0.0, t1 - t0)
    return phase


def _phases_summary(phases, npu, base_s):
    """Return the latency summary of phases taken together: the modelled inferences' on an emulated HTP (npu),
    else the measured ones'."""
    span = sum(p["span"] for p in phases)
    if npu is not None:
        return weighted_summary([piece for p in phases for piece in p["pieces"]], span, base_s)
    return latency_summary([t for p in phases for t in p["times"]], span)


def _round_entry(solo, shared, npu, base_s, cycle):
    """Return one round's figures of a session: its solo and shared p50 (and unthrottled modelled ms)."""
    a, b = _phases_summary([solo], npu, base_s), _phases_summary([shared], npu, cycle)
    return {"solo_p50_ms": a["p50_ms"], "concurrent_p50_ms": b["p50_ms"], "solo_base_ms": a.get("base_ms"),
            "concurrent_base_ms": b.get("base_ms"), "solo_iterations": a["iterations"],
            "concurrent_iterations": b["iterations"]}


def _mean(values):
    return sum(values) / len(values) if values else NPU_SYNC_S


def _shared_plans(np, ort, args, assign, plans):
    """Return one (session, output names, feeds) per assignment: the first session of each model is its solo
    session, the others are loaded here."""
    loaded, reused = [], set()
    for model, input_list in assign:
        if model in plans and model not in reused:
            reused.add(model)
            loaded.append(plans[model])
        else:
            loaded.append(load_plan(np, ort, args, model, input_list, {}))
    return loaded


def _threads_round(loaded, duration_s, npu, cycle):
    """Run one thread per loaded session, all starting together, for duration_s; return a phase per session."""
    results = [None] * len(loaded)
    barrier = threading.Barrier(len(loaded) + 1)
    until = [0.0]

    def worker(k):
        session, out_names, feeds = loaded[k]
        errors = []
        barrier.wait()
        t0 = time.perf_counter()
        times = session_loop(session, out_names, feeds, until[0], npu, errors)
        results[k] = {"times": times, "errors": errors, "span": time.perf_counter() - t0, "pieces": None}

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(len(loaded))]
    for t in threads:
        t.start()
    if npu is not None:
        npu.begin()
    start = time.perf_counter()
    until[0] = start + duration_s
    barrier.wait()
    for t in threads:
        t.join()
    end = time.perf_counter()
    if npu is not None:
        npu.end()
        pieces = segment_pieces(npu.segments(start, end, cycle), 0.0, end - start)
        for phase in results:  # round-robin on one HTP: every session completes one inference per round
            phase.update(pieces=pieces, simulator_span=phase["span"], span=end - start)
    return results


def _processes_round(args, assign, duration_s, latencies, cycle):
    """Run one copy of this runner per assignment, each with one session, released at one start time, for
    duration_s; return a phase per session (on an emulated HTP each copy models its turn on the shared HTP:
    latency one round, busy its share of it)."""
    start_at = time.monotonic() + max(5.0, 2.0 * len(assign))
    procs = []
    for k, (model, input_list) in enumerate(assign):
        out = os.path.join(args.output_dir, "session_%d" % k)
        argv = [sys.executable, os.path.abspath(__file__), "--model", model, "--runtime", args.runtime,
                "--input_list", input_list, "--output_dir", out, "--soak_duration", repr(duration_s),
                "--window_s", repr(max(duration_s, 1e-3)), "--start_at", repr(start_at)]
        for name in ("htp_arch", "soc_model"):
            if getattr(args, name):
                argv += ["--" + name, str(getattr(args, name))]
        if args.allow_cpu_fallback:
            argv.append("--allow_cpu_fallback")
        if latencies is not None:
            argv += ["--emulated_latency_ms", repr(cycle * 1000.0), "--emulated_share", repr(latencies[model] / cycle)]
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
        span = soaked.get("duration_s") or 0.0
        errors = list(soaked.get("errors") or []) + ([child["error"]] if child.get("error") else [])
        phase = {"times": child.get("iteration_s") or [], "errors": errors, "span": span, "pieces": None}
        if latencies is not None:  # the copy's modelled turns: its throttle segments over its span
            marks = soaked.get("throttle") or [[0.0, 1.0]]
            segments = [(a, marks[i + 1][0] if i + 1 < len(marks) else span, cycle * factor)
                        for i, (a, factor) in enumerate(marks)]
            phase.update(pieces=segment_pieces(segments, 0.0, span),
                         simulator_span=soaked.get("simulator_duration_s", span))
        results.append(phase)
    return results


def run_soak(session, out_names, feeds, args, npu, report):
    """The soak: (with telemetry) an idle phase of --idle_s, then the timed soak; fills report's `soak`,
    `iteration_s`, `iteration_end_s`, `emulated_iteration_s` (on an emulated HTP) and `telemetry`. On an
    emulated HTP the soak's windows and iterations are the modelled HTP's (back to back over the soak's wall
    time); `simulator_windows` are the simulator's."""
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
    times, ends, modelled = soak(session, out_names, feeds, args.soak_duration, args.soak_iterations, npu, t0, errors)
    total = time.perf_counter() - t0
    if sampler is not None and args.tail_s > 0:
        sampler.phase = "tail"
        time.sleep(args.tail_s)
    report["iteration_s"] = times
    report["iteration_end_s"] = ends
    windows = window_stats(times, ends, args.window_s, total)
    report["soak"] = {"duration_s": total, "iterations": len(times), "window_s": args.window_s,
                      "requested_duration_s": args.soak_duration, "requested_iterations": args.soak_iterations,
                      "windows": windows, "errors": errors or [], "latency_source": None,
                      "throttle_factor_last": npu.factor if npu is not None else None}
    if npu is not None:
        end = min(npu.time_of(t0, args.soak_iterations), t0 + total) if args.soak_iterations else t0 + total
        span = end - t0
        segments = npu.segments(t0, end)
        report["emulated_iteration_s"] = modelled
        report["soak"].update(
            duration_s=span, iterations=int(round(modelled_count(segments))), latency_source="emulated",
            windows=segment_windows(segments, args.window_s, span, npu.base_s()),
            emulated_summary=weighted_summary(segment_pieces(segments, 0.0, span), span, npu.base_s()),
            throttle=[[round(a, 4), round(lat / npu.base_s(), 4)] for a, _b, lat in segments],
            simulator_windows=windows, simulator_duration_s=total, simulator_iterations=len(times))
    if sampler is not None:
        report["telemetry"] = sampler.stop()


def host_load():
    """Return the 1-minute load average of the machine the runner runs on, or None where it cannot be read."""
    try:
        return round(os.getloadavg()[0], 3)
    except (AttributeError, OSError):
        return None


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


SESSION_CACHE_SIZE = 8
_SESSIONS = collections.OrderedDict()  # a served runner's sessions by session_key, least recently used first
_serving = False  # set by serve(): only a persistent runner caches sessions


def session_key(args):
    """Return the cache key of args' session (see the module docstring), or None when it must not be cached."""
    if not _serving or args.profiling_level != "off":
        return None
    model = os.path.abspath(args.model)
    directory, stem = os.path.dirname(model), os.path.splitext(os.path.basename(model))[0]
    files = []
    for name in sorted(os.listdir(directory)):  # the model, its .bin/.data siblings, context.json
        path = os.path.join(directory, name)
        if (name.startswith(stem) or name == CONTEXT_SIDECAR) and os.path.isfile(path):
            st = os.stat(path)
            files.append((name, st.st_size, st.st_mtime_ns))
    return (model, tuple(files), args.runtime, args.htp_arch, args.soc_model, args.allow_cpu_fallback,
            args.intra_op_threads)


def session_for(ort, args, report):
    """Return args' session: a served runner's cached one when it has it (report: session_cached, the cached
    session's session_create_s and provider options), else a new one (cached when session_key allows)."""
    key = session_key(args)
    t0 = time.perf_counter()
    if key is not None and key in _SESSIONS and not args.placement_only:
        _SESSIONS.move_to_end(key)
        session, created = _SESSIONS[key]
        report.update(created)
        report["session_cached"] = True
    else:
        session = make_session(ort, args, report)
        report["session_cached"] = False
        if key is not None:
            _SESSIONS.pop(key, None)
            _SESSIONS[key] = (session, {k: report[k] for k in ("session_create_s", "provider_options") if k in report})
            while len(_SESSIONS) > SESSION_CACHE_SIZE:
                _SESSIONS.popitem(last=False)
    report["load_s"] = time.perf_counter() - t0
    return session


def forget_session(args):
    """Drop args' cached session (after the runtime failed on it)."""
    try:
        key = session_key(args)
    except OSError:
        return
    _SESSIONS.pop(key, None)


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
    # idle thread-pool threads sleep instead of spinning, so they leave the cores to other runners on the host
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if _pin_simulator(args.runtime == "htp") is not None and args.runtime == "htp":
        so.intra_op_num_threads = 1  # the CPU parts share the simulator's one core
    if args.intra_op_threads > 0:
        so.intra_op_num_threads = args.intra_op_threads
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    return so


SIM_CPUS_ENV = "HARNESS_SIMULATOR_CPUS"  # the CPUs the simulators of this host share ("0,1"); "off": no pinning
_sim_slot = []  # [open slot file, CPU, the shared CPUs] once this process is pinned


def _pin_simulator(htp=True):
    """Pin this process to one CPU where the HTP backend is Qualcomm's simulator (x86-64); return the CPU or None.

    The simulator runs 11 threads per process (thr_hvx_0..7, thr_hmx_0, thr_hlx_0..1) that wait by calling
    sched_yield in a loop: spread over every core they burn the CPU time other simulators on the host need (two
    runners on 2 cores: 1.19x one runner's throughput unpinned, 1.80x pinned; one runner is no slower pinned;
    benchmarks/bench_farm.py). The CPU is the one fewest other runners hold: a flock per (CPU, holder) under the
    temp directory, released when this process exits. Sessions take the calling thread's CPUs: for a CPU-runtime
    session (htp False) of a pinned process (a persistent runner) the calling thread gets the shared CPUs back, so
    that its thread pool uses every core, and the next HTP session pins it again."""
    if _sim_slot:
        try:
            os.sched_setaffinity(0, {_sim_slot[1]} if htp else set(_sim_slot[2]))  # 0: the calling thread
        except OSError:
            pass
        return _sim_slot[1]
    if not htp or platform.machine().lower() not in ("x86_64", "amd64") or not hasattr(os, "sched_setaffinity"):
        return None
    import fcntl
    import tempfile

    shared = os.environ.get(SIM_CPUS_ENV) or ",".join(map(str, sorted(os.sched_getaffinity(0))))
    cpus = [int(c) for c in shared.split(",")] if shared != "off" else []
    if len(cpus) < 2:
        return None
    os.environ[SIM_CPUS_ENV] = shared  # copies of this runner (--concurrency_mode processes) spread over them too
    directory = os.path.join(tempfile.gettempdir(), "htp-simulator-cpus")
    try:
        os.makedirs(directory, exist_ok=True)
        for holder in range(64):
            for cpu in cpus:
                slot = open(os.path.join(directory, "cpu%d.%d.lock" % (cpu, holder)), "a")
                try:
                    fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    slot.close()
                    continue
                for tid in os.listdir("/proc/self/task"):  # every thread; the ones started later inherit it
                    try:
                        os.sched_setaffinity(int(tid), {cpu})
                    except OSError:  # the thread has ended
                        pass
                _sim_slot[:] = [slot, cpu, cpus]
                return cpu
    except OSError:
        pass
    return None


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
    """Print what this device's runner can use (self_check_info) as JSON; return the exit code."""
    print(json.dumps(self_check_info()))
    return 0


def self_check_info():
    """Return what this device's runner can use: numpy, onnxruntime, the QNN EP (an error is reported, not raised)."""
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
    return info


DEVICE_ROOT_ENV = "HARNESS_DEVICE_ROOT"  # set by the emulated adb phone only: where its /data, /sdcard, /sys live


def _device_path(arg):
    """Return a request's argument as this device's filesystem sees it: on the emulated adb phone, which moves
    /data/, /sdcard/ and /sys/ prefixes of a shell command into its sandbox, the same prefixes of a request's
    arguments (which never pass through a shell command) move there too; anywhere else, arg unchanged."""
    root = os.environ.get(DEVICE_ROOT_ENV)
    if root and arg.startswith(("/data/", "/sdcard/", "/sys/")):
        return os.path.join(root, arg[1:])
    return arg


def serve(stdin=None):
    """Answer requests on stdin until `exit` or end of input (protocol: the module docstring); never returns."""
    global _serving
    _serving = True
    frames = os.fdopen(os.dup(1), "w", buffering=1)  # the private channel for replies
    os.dup2(2, 1)  # anything printing to stdout (Python or native) goes to stderr
    stdin = stdin or sys.stdin.buffer
    start_dir = os.getcwd()
    requests = []
    arrived = threading.Condition()
    busy = threading.Event()

    def read():
        for line in iter(stdin.readline, b""):
            with arrived:
                requests.append(line)
                arrived.notify()
        if busy.is_set():  # the host went away in the middle of a request: nobody waits for its answer
            _abandon()
        with arrived:
            requests.append(None)
            arrived.notify()

    threading.Thread(target=read, name="requests", daemon=True).start()
    while True:
        with arrived:
            while not requests:
                arrived.wait()
            line = requests.pop(0)
        if line is None:
            _exit(frames)
        try:
            request = json.loads(line)
            op = request.get("op", "run")
        except (ValueError, AttributeError) as e:
            _reply(frames, {"id": None, "rc": 2, "error": "not a request: %s" % e})
            continue
        reply = {"id": request.get("id"), "rc": 0, "pid": os.getpid()}
        if op == "ping":
            reply["info"] = self_check_info()
        elif op == "run":
            busy.set()
            _reset_peak_rss()
            try:
                os.chdir(os.path.join(start_dir, request.get("cwd") or "."))
                reply["rc"] = main([_device_path(str(a)) for a in request.get("argv") or []])
            except SystemExit as e:  # argparse's usage errors
                reply["rc"] = e.code if isinstance(e.code, int) else 2
            except Exception as e:
                print("runner: %s: %s" % (type(e).__name__, e), file=sys.stderr)
                reply["rc"] = 3
            finally:
                os.chdir(start_dir)
                busy.clear()
                sys.stderr.flush()
        elif op != "exit":
            reply.update(rc=2, error="unknown op %r" % op)
        _reply(frames, reply)
        if op == "exit":
            _exit(frames)


def _exit(frames):
    """End the server now (the request reader may hold stdin: no interpreter shutdown to wait on it)."""
    frames.close()
    sys.stderr.flush()
    os._exit(0)


def _reply(frames, reply):
    frames.write(json.dumps(reply) + "\n")
    frames.flush()


def _reset_peak_rss():
    """Reset this process's peak RSS (VmHWM) where Linux allows it, so that a request reports its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _abandon():
    """End this process at once, with its process group when it leads one (the processes-mode copies)."""
    sys.stderr.flush()
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(1)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--self_check"]:
        return self_check()
    if argv[:1] == ["--serve"]:
        return serve()
    args = parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    report = {"runner_version": RUNNER_VERSION, "runtime": args.runtime, "model": args.model, "error": None,
              "machine": platform.machine(), "system": platform.system(), "pid": os.getpid(), "served": _serving}
    report_path = os.path.join(args.output_dir, "runner_report.json")
    code = 0
    latency_ms = args.emulated_latency_ms[0] if args.emulated_latency_ms else None
    npu = EmulatedNpu.from_env(latency_ms / 1000.0 if latency_ms is not None else None, args.emulated_share)
    report["host"] = {"cpu_count": os.cpu_count(), "loadavg_1m": [host_load()]}
    if npu is not None:
        report["emulated"] = {"latency_ms": npu.base_s() * 1000.0 if latency_ms is not None else None,
                              "basis": npu.basis, "share": args.emulated_share, "throttle_start": npu.factor}
        report["emulated_iteration_s"] = []
    try:
        import numpy as np
        import onnxruntime as ort

        ort.set_default_logger_severity(3)
        report["onnxruntime_version"] = ort.__version__
        if not os.path.isfile(args.model):
            raise RunnerFailure(f"model not found: {args.model}")
        check_context_target(args, report)
        session = session_for(ort, args, report)
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
            times, cpu_times, outputs_meta = [], [], []
            for i, feed in enumerate(feeds):
                cpu0 = time.process_time()
                outs, elapsed = timed_run(session, out_names, feed, npu)
                cpu_times.append(time.process_time() - cpu0)
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
            report["inference_cpu_s"] = cpu_times
            report["outputs"] = outputs_meta
            if feeds and (args.min_iterations > 0 or args.min_duration > 0):
                loop, loop_s, modelled = measure(session, out_names, feeds, args.min_iterations,
                                                 args.min_duration, npu)
                report["iteration_s"] = loop
                if modelled is not None:
                    report["emulated_iteration_s"] = modelled
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
        forget_session(args)
    if npu is not None:
        npu.close()
        report["emulated"]["busy_s"] = npu.busy_s - npu.start_busy_s
    report["host"]["loadavg_1m"].append(host_load())
    report["peak_rss_mb"] = peak_rss_mb()
    with open(report_path + ".part", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(report_path + ".part", report_path)
    if report["error"]:
        print(f"runner: {report['error']}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
