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
Exit codes: 0 ok, 2 bad input or model, 3 runtime failure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
import traceback

RUNNER_VERSION = "3"  # 2: the report names the machine it ran on; 3: and the nodes the HTP refused


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
    return p.parse_args(argv)


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
    """Return this process's peak resident set size in MiB, or None where getrusage is missing."""
    try:
        import resource
    except ImportError:  # Windows on Snapdragon
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def measure(session, out_names, feeds, min_iterations, min_duration_s):
    """Run feeds round-robin until both minimums are met; return (per-iteration seconds, loop seconds)."""
    times = []
    clock = time.perf_counter
    start = clock()
    i = 0
    while i < min_iterations or clock() - start < min_duration_s:
        feed = feeds[i % len(feeds)]
        t = clock()
        session.run(out_names, feed)
        times.append(clock() - t)
        i += 1
    return times, clock() - start


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


def make_session(ort, args, report):
    so = _session_options(ort, args)
    if args.runtime == "cpu":
        t0 = time.perf_counter()
        session = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
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
        session = ort.InferenceSession(args.model, so)
        report["session_create_s"] = time.perf_counter() - t0  # the model's load (and JIT compile) alone
        return session
    except Exception as e:
        msg = str(e)
        if "fallback to CPU EP has been explicitly disabled" in msg:
            report["refused_nodes"] = off_htp_nodes(ort, args, devices, options)
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


def off_htp_nodes(ort, args, devices, options):
    """Return the nodes a session with CPU fallback allowed leaves off the HTP ([] if it fails too)."""
    so = _session_options(ort, args)
    so.add_provider_for_devices(devices, {k: v for k, v in options.items() if not k.startswith("profiling")})
    try:
        session = ort.InferenceSession(args.model, so)
    except Exception:
        return []
    return [row for row in placement(session) if row["ep"] != "QNNExecutionProvider"]


def placement(session):
    rows = []
    for subgraph in session.get_provider_graph_assignment_info():
        for node in subgraph.get_nodes():
            rows.append({"node": node.name, "op_type": node.op_type, "ep": subgraph.ep_name})
    return rows


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.output_dir, exist_ok=True)
    report = {"runner_version": RUNNER_VERSION, "runtime": args.runtime, "model": args.model, "error": None,
              "machine": platform.machine(), "system": platform.system()}
    report_path = os.path.join(args.output_dir, "runner_report.json")
    code = 0
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
                session.run(out_names, feeds[0])
            times, outputs_meta = [], []
            for i, feed in enumerate(feeds):
                t = time.perf_counter()
                outs = session.run(out_names, feed)
                times.append(time.perf_counter() - t)
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
                loop, loop_s = measure(session, out_names, feeds, args.min_iterations, args.min_duration)
                report["iteration_s"] = loop
                report["measurement"] = {"warmup": args.warmup, "min_iterations": args.min_iterations,
                                         "min_duration_s": args.min_duration, "iterations": len(loop),
                                         "duration_s": loop_s}
        del session  # the QNN EP writes its profile when the session is released
    except RunnerFailure as e:
        report["error"], code = str(e), e.code
    except Exception as e:  # report anything the runtime raised, with its own words
        report["error"], code = f"{type(e).__name__}: {e}", 3
        report["traceback"] = traceback.format_exc()
    report["peak_rss_mb"] = peak_rss_mb()
    with open(report_path + ".part", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(report_path + ".part", report_path)
    if report["error"]:
        print(f"runner: {report['error']}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
