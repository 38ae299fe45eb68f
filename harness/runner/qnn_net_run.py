"""Qualcomm's qnn-net-run as a device's runner: the SDK files it needs, its command line, what a context binary
needs, the input list, reading the outputs (QnnNetRun; DeviceRunner.run calls it for such a device).

A device whose devices.yaml entry has no ``python:`` (adb) runs ``qnn-net-run`` (pushed with the HTP
libraries from the QAIRT SDK, ``qairt_sdk:`` or ``$QNN_SDK_ROOT``) instead of the harness's runner. It knows
nothing of ONNX, so what the harness runner reports itself is derived here:

* which files to run: the EPContext wrapper (``*_ctx.onnx``) names its serialized context
  (``ep_cache_context``), the ``.bin`` beside it, which is what ``--retrieve_context`` loads;
* output names and shapes: the wrapper's graph outputs; qnn-net-run writes
  ``Result_<N>/<output name>.raw`` in float32, with characters a file name cannot hold replaced,
  so files are matched to outputs by exact name first, then by a normalised name;
* placement: every node of the wrapper is an EPContext node, i.e. runs on the HTP;
* timings: only from qnn-net-run's profiling log (``qnn-profiling-data_<N>.log``), read on the
  host with the SDK's ``qnn-profile-viewer`` into the CSV the harness parses.

The input list is written in the job directory (qnn-net-run's cwd) with paths relative to it:
qnn-net-run opens the listed paths as given, i.e. relative to its working directory, not to
the list's, so a list there works whichever of the two a given SDK version uses.
"""

from __future__ import annotations

import json
import posixpath
import re
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from harness.data import Feed
from harness.errors import ConfigError, DeviceLostError, DeviceTimeoutError, RunnerError, TransportError
from harness.profiling import ProfileFormatError, parse_profile_csv
from harness.runner.base import HTP_EP, NodePlacement, RunResult, input_paths, keep_outputs, push_feeds, push_model
from harness.transports.base import CommandResult, PushResult, Transport

EP_CONTEXT = "EPContext"
HOST_SDK_BIN = "x86_64-linux-clang"  # the SDK's host tools for this (x86-64 Linux) host
PROFILE_VIEWER_TIMEOUT_S = 120.0
LOAD_EVENT = "QNN (load binary) time"  # the profile's context load from the binary
PYTHON_ENTRY_HINT = ("or give the device a `python:` entry in devices.yaml (an interpreter on the device with "
                     "onnxruntime-qnn) so that the harness's own runner is used")


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output of the wrapper model: its name and shape (None for a symbolic dim)."""

    name: str
    shape: tuple[int | None, ...]


@dataclass(frozen=True)
class QnnContextModel:
    """A compiled EPContext wrapper that qnn-net-run can run: its context file and graph I/O."""

    model: Path
    context_file: Path
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    node: str  # the EPContext node's name


def _tensor_specs(values) -> tuple[TensorSpec, ...]:  # type: ignore[no-untyped-def]
    specs = []
    for v in values:
        dims = v.type.tensor_type.shape.dim
        specs.append(TensorSpec(v.name, tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)))
    return tuple(specs)


def not_runnable(device_id: str, model: Path, reason: str) -> RunnerError:
    """Return the RunnerError for a model or run qnn-net-run cannot do, saying what to do instead."""
    return RunnerError(
        f"device {device_id} runs Qualcomm's qnn-net-run (its devices.yaml entry has no `python:`), which runs "
        f"compiled context binaries only: {Path(model).name} {reason}. Run the context_binary step's "
        f"`*_ctx.onnx` (with its .bin beside it) on this device, {PYTHON_ENTRY_HINT}", device=device_id)


def qnn_context_model(model: Path, device_id: str) -> QnnContextModel:
    """Return the context binary that model (an EPContext wrapper) runs.

    Raises RunnerError (see not_runnable) for a QDQ or float model, a wrapper with nodes outside
    the HTP context (compiled with CPU fallback), several contexts, an embedded context, or a
    missing .bin.
    """
    import onnx

    model = Path(model)
    graph = onnx.load(str(model), load_external_data=False).graph
    contexts = [n for n in graph.node if n.op_type == EP_CONTEXT]
    others = sorted({n.op_type for n in graph.node if n.op_type != EP_CONTEXT})
    if not contexts:
        raise not_runnable(device_id, model, "is not one (it has no EPContext node: a QDQ or float model)")
    if others:
        raise not_runnable(device_id, model, f"also has nodes outside the HTP context ({', '.join(others)}: "
                                             "compiled with CPU fallback), which qnn-net-run cannot run")
    if len(contexts) != 1:
        raise not_runnable(device_id, model, f"holds {len(contexts)} EPContext nodes; qnn-net-run loads one context")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in contexts[0].attribute}
    if int(attrs.get("embed_mode", 1)) != 0:
        raise not_runnable(device_id, model, "embeds its context inside the model; qnn-net-run needs it as a "
                                             ".bin file (compile with ep.context_embed_mode=0, as the "
                                             "context_binary step does)")
    name = attrs.get("ep_cache_context", b"")
    name = name.decode() if isinstance(name, bytes) else str(name)
    context_file = model.parent / name
    if not name or not context_file.is_file():
        raise not_runnable(device_id, model, f"names its context file '{name}', which is not beside it")
    initializers = {i.name for i in graph.initializer}
    return QnnContextModel(model, context_file, _tensor_specs(v for v in graph.input if v.name not in initializers),
                           _tensor_specs(graph.output), contexts[0].name or contexts[0].op_type)


def job_input_list(item_paths: list[list[tuple[str, str]]], data_dir: str, job_dir: str) -> str:
    """Return qnn-net-run's input list text for staged feeds.

    item_paths holds, per inference, (input name, path under data_dir) pairs; the list is read in
    job_dir (qnn-net-run's cwd), so paths are made relative to it. One input: bare paths (the
    form every qnn-net-run version reads, free of tensor-name spelling); several: `name:=path`.
    """
    lines = []
    for items in item_paths:
        paths = [(name, posixpath.relpath(posixpath.join(data_dir, rel), job_dir)) for name, rel in items]
        lines.append(paths[0][1] if len(paths) == 1 else " ".join(f"{n}:={p}" for n, p in paths))
    return "\n".join(lines) + "\n"


def _normalised(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_").lower()


def match_output_files(result_dir: Path, outputs: tuple[TensorSpec, ...], device_id: str) -> dict[str, Path]:
    """Return {output name: its .raw file} in one Result_<N> directory.

    Exact `<name>.raw` first, then names compared with every run of characters other than
    letters and digits taken as one '_' (qnn-net-run's sanitised file names, including a name
    with '/' written as sub-directories); a single output takes the single .raw file. Raises
    RunnerError naming the files found when an output has no file.
    """
    files = sorted(p for p in result_dir.rglob("*.raw") if p.is_file())
    by_key: dict[str, list[Path]] = {}
    for p in files:
        by_key.setdefault(_normalised(p.relative_to(result_dir).with_suffix("").as_posix()), []).append(p)
    found: dict[str, Path] = {}
    for out in outputs:
        exact = result_dir / f"{out.name}.raw"
        candidates = [exact] if exact.is_file() else by_key.get(_normalised(out.name), [])
        if len(candidates) == 1:
            found[out.name] = candidates[0]
        elif len(outputs) == 1 and len(files) == 1:
            found[out.name] = files[0]
    missing = [o.name for o in outputs if o.name not in found]
    if missing:
        listed = ", ".join(p.relative_to(result_dir).as_posix() for p in files) or "none"
        raise RunnerError(f"qnn-net-run wrote no file for output(s) {', '.join(missing)} in {result_dir.name}/ "
                          f"(files: {listed})", device=device_id)
    return found


def _shaped(data: np.ndarray, spec: TensorSpec, file: Path, device_id: str) -> np.ndarray:
    known = [d for d in spec.shape if d is not None]
    expected = int(np.prod(known)) if known else 1
    if None not in spec.shape:
        if data.size != expected:
            raise RunnerError(f"{file.parent.name}/{file.name} holds {data.size} float32 values, output '{spec.name}' "
                              f"has shape {list(spec.shape)} ({expected} values): qnn-net-run must write float32 "
                              "outputs (no --use_native_output_files)", device=device_id)
        return data.reshape(spec.shape)
    if spec.shape.count(None) == 1 and expected and data.size % expected == 0:
        return data.reshape([-1 if d is None else d for d in spec.shape])
    return data


def read_qnn_results(out_dir: Path, ctx: QnnContextModel, count: int, device_id: str) -> list[Feed]:
    """Return the outputs of count inferences from out_dir/Result_<N>/, shaped as the wrapper's outputs.

    Raises RunnerError when a Result_<N> directory or an output file is missing or has the wrong size.
    """
    results = []
    for i in range(count):
        rdir = out_dir / f"Result_{i}"
        if not rdir.is_dir():
            raise RunnerError(f"qnn-net-run wrote no Result_{i}/ for input line {i + 1} of {count}", device=device_id)
        files = match_output_files(rdir, ctx.outputs, device_id)
        results.append({o.name: _shaped(np.fromfile(files[o.name], dtype=np.float32), o, files[o.name], device_id)
                        for o in ctx.outputs})
    return results


@dataclass(frozen=True)
class ProfileTimings:
    """What qnn-net-run's profiling log gave: per-inference seconds, the CSV, or why there is none."""

    inference_s: list[float]
    csv: Path | None
    note: str | None
    load_s: float = 0.0  # the profile's `QNN (load binary) time`, when it has one


def profile_timings(out_dir: Path, sdk_root: Path | None, expected: int) -> ProfileTimings:
    """Return the per-inference execute times from qnn-net-run's profiling log in out_dir.

    The log is converted on the host by the SDK's qnn-profile-viewer into out_dir/qnn_profile.csv
    and parsed with harness.profiling; each execution's `QNN (execute) time` (else its
    accelerator time) is one inference. Without a log or a viewer, or when the CSV cannot be read,
    inference_s is empty and note says why.
    """
    logs = sorted(out_dir.glob("qnn-profiling-data*.log"))
    if not logs:
        return ProfileTimings([], None, "qnn-net-run wrote no profiling log (qnn-profiling-data_0.log): no timings")
    viewer = sdk_root / "bin" / HOST_SDK_BIN / "qnn-profile-viewer" if sdk_root else None
    if viewer is None or not viewer.is_file():
        return ProfileTimings([], None, f"qnn-net-run's profile {logs[0].name} was not read: no qnn-profile-viewer "
                                        f"at {viewer or '<QAIRT SDK>/bin/' + HOST_SDK_BIN} on this host; no timings")
    csv = out_dir / "qnn_profile.csv"
    argv = [str(viewer), "--input_log", str(logs[0]), "--output", str(csv)]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=PROFILE_VIEWER_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return ProfileTimings([], None, f"`{' '.join(argv)}` failed ({e}); no timings")
    if proc.returncode != 0 or not csv.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return ProfileTimings([], None, f"qnn-profile-viewer exited with {proc.returncode} on {logs[0].name} "
                                        f"({tail[0]}); no timings")
    try:
        profile = parse_profile_csv(csv)
    except ProfileFormatError as e:
        return ProfileTimings([], csv, f"{e}; no timings")
    times = [(e.qnn_execute_us if e.qnn_execute_us is not None else e.accelerator_us) for e in profile.executions]
    seconds = [t / 1e6 for t in times if t is not None]
    note = None if len(seconds) == expected else (
        f"qnn-net-run's profile holds {len(seconds)} timed execution(s) for {expected} input line(s)")
    return ProfileTimings(seconds, csv, note, profile.events_us.get(LOAD_EVENT, 0.0) / 1e6)


@dataclass(frozen=True)
class QnnNetRunFiles:
    """The SDK files qnn-net-run needs on an Android device, as (local path, path under the work dir)."""

    sdk_root: Path
    htp_arch: int
    files: tuple[tuple[Path, str], ...]


QNN_REMOTE_DIR = "qnn"
ANDROID_DSP_DIRS = ("/vendor/dsp/cdsp", "/vendor/lib/rfsa/adsp", "/system/lib/rfsa/adsp", "/dsp")


def qnn_net_run_files(sdk_root: Path, htp_arch: int) -> QnnNetRunFiles:
    """Return the qnn-net-run binary and HTP libraries of the SDK for htp_arch (e.g. 75).

    Raises ConfigError naming every missing file.
    """
    arch = f"V{htp_arch}"
    wanted = [
        sdk_root / "bin" / "aarch64-android" / "qnn-net-run",
        sdk_root / "lib" / "aarch64-android" / "libQnnHtp.so",
        sdk_root / "lib" / "aarch64-android" / f"libQnnHtp{arch}Stub.so",
        sdk_root / "lib" / f"hexagon-v{htp_arch}" / "unsigned" / f"libQnnHtp{arch}Skel.so",
    ]
    missing = [str(p) for p in wanted if not p.is_file()]
    if missing:
        raise ConfigError(f"the QAIRT SDK at {sdk_root} lacks what qnn-net-run needs on an HTP v{htp_arch} phone: "
                          + ", ".join(missing) + " (check qairt_sdk / QNN_SDK_ROOT and the SoC's htp_arch)")
    optional = sdk_root / "lib" / "aarch64-android" / "libQnnSystem.so"  # reads context binary metadata
    if optional.is_file():
        wanted.append(optional)
    return QnnNetRunFiles(sdk_root, htp_arch, tuple((p, f"{QNN_REMOTE_DIR}/{p.name}") for p in wanted))


def qnn_net_run_argv(workdir: str, context_binary: str, input_list: str, output_dir: str,
                     profiling_level: str = "off") -> list[str]:
    """Return the argv that runs qnn-net-run on a context binary (paths relative to the cwd of the run)."""
    qnn_dir = posixpath.join(workdir, QNN_REMOTE_DIR)
    argv = ["env", f"LD_LIBRARY_PATH={qnn_dir}", "ADSP_LIBRARY_PATH=" + ";".join([qnn_dir, *ANDROID_DSP_DIRS]),
            posixpath.join(qnn_dir, "qnn-net-run"), "--backend", posixpath.join(qnn_dir, "libQnnHtp.so"),
            "--retrieve_context", context_binary, "--input_list", input_list, "--output_dir", output_dir]
    if profiling_level != "off":
        argv += ["--profiling_level", profiling_level]
    return argv


class QnnNetRun:
    """Qualcomm's qnn-net-run on a device: the SDK files pushed once, then compiled context binaries run over input
    files. The output layout is the harness runner's (OUTPUT_DIR/Result_<N>/<output>.raw, float32)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.files: QnnNetRunFiles | None = None  # once deployed (the SDK's files pushed)

    def deploy(self) -> PushResult:
        """Push qnn-net-run and the HTP libraries (skipping those already there); return the totals."""
        sdk = getattr(self.transport, "qairt_sdk", None)
        if sdk is None:
            raise ConfigError(f"device '{self.transport.device_id}': no QAIRT SDK (set qairt_sdk: or QNN_SDK_ROOT)")
        files = qnn_net_run_files(sdk, self.transport.soc.htp_arch)
        sent = skipped = nbytes = 0
        for local, remote in files.files:
            r = self.transport.push(local, remote)
            sent, skipped, nbytes = sent + r.files_sent, skipped + r.files_skipped, nbytes + r.bytes_sent
        self.files = files
        return PushResult(sent, skipped, nbytes)

    def argv(self, context_binary: str, input_list: str, output_dir: str, profiling_level: str = "off") -> list[str]:
        """Return the command line for one run (remote paths relative to the run's cwd)."""
        workdir = self.transport.workdir  # type: ignore[attr-defined]  # adb devices only
        return qnn_net_run_argv(workdir, context_binary, input_list, output_dir, profiling_level)

    def run(self, model: Path, feeds: list[Feed] | None, runtime: str, *, timeout_s: float,
            platform: Callable[[], tuple[str | None, str | None]], placement_only: bool = False,
            profiling_level: str = "off", warmup: int = 0, keep_dir: Path | None = None, min_iterations: int = 0,
            min_duration_s: float = 0.0) -> RunResult:
        """Run a compiled context binary with qnn-net-run on the device; return its RunResult (platform() gives the
        device's machine and system for it).

        Pushes qnn-net-run and the HTP libraries (once), the wrapper with its .bin, the feeds, and
        an input list in the job directory; runs `qnn-net-run --retrieve_context <bin>` with the job
        directory as cwd and reads Result_<N>/*.raw back with the wrapper's output names and shapes.
        Placement is the EPContext node on the HTP; inference_s comes from qnn-net-run's profile
        when profiling_level is not 'off' (else it is empty, with a note in RunResult.notes).
        Raises RunnerError, saying what to do instead, for anything but a context binary on `htp`
        over feeds (a QDQ/float model, the `cpu` runtime, placement_only, warm-up or a measurement
        loop), and when qnn-net-run fails or leaves no outputs.
        """
        device_id = self.transport.device_id
        refused = _qnn_refusal(runtime, feeds, placement_only, warmup, min_iterations, min_duration_s)
        if refused:
            raise RunnerError(f"device {device_id} runs Qualcomm's qnn-net-run (its devices.yaml entry has no "
                              f"`python:`), which runs compiled context binaries on the HTP over input files "
                              f"only: {refused} is not available; {PYTHON_ENTRY_HINT}", device=device_id)
        ctx = qnn_context_model(model, device_id)
        feeds = list(feeds or [])  # not empty: _qnn_refusal refuses a run without inputs
        if self.files is None:
            self.deploy()
        remote_dir = posixpath.dirname(push_model(self.transport, model))
        job = f"jobs/{uuid.uuid4().hex[:12]}"
        with tempfile.TemporaryDirectory(prefix="harness-job-") as tmp:
            tmp_dir = Path(tmp)
            data_dir = posixpath.dirname(push_feeds(self.transport, feeds, tmp_dir / "in"))
            self._push_job_list(feeds, data_dir, job, tmp_dir)
            argv = self.argv(posixpath.relpath(f"{remote_dir}/{ctx.context_file.name}", job), "input_list.txt",
                             "out", profiling_level)
            out_dir = tmp_dir / "out"
            try:
                result = self.transport.run(argv, timeout_s=timeout_s, cwd=job)
                self._pull_qnn_outputs(f"{job}/out", out_dir, argv, result)
            finally:
                self.transport.remove(job)
            outputs = read_qnn_results(out_dir, ctx, len(feeds), device_id)
            notes: list[str] = []
            timings = profile_timings(out_dir, self.files.sdk_root, len(feeds)) if profiling_level != "off" else None
            inference_s, load_s = (timings.inference_s, timings.load_s) if timings else ([], 0.0)
            if timings is None:
                notes.append("qnn-net-run ran without profiling: no per-inference timings (pass profiling_level)")
            elif timings.note:
                notes.append(timings.note)
            machine, system = platform()
            report = _qnn_report(ctx, remote_dir, outputs, inference_s, load_s, notes, machine, system, argv)
            (out_dir / "runner_report.json").write_text(json.dumps(report, indent=1))
            keep_outputs(out_dir, keep_dir)
        return RunResult(outputs=outputs, runtime="htp", load_s=load_s, inference_s=inference_s,
                         placement=[NodePlacement(ctx.node, "EPContext", HTP_EP)], report=report,
                         workdir=keep_dir, machine=machine, system=system, runner="qnn-net-run", notes=notes)

    def _push_job_list(self, feeds: list[Feed], data_dir: str, job: str, tmp_dir: Path) -> None:
        """Write qnn-net-run's input list for feeds staged in data_dir and push it to job/input_list.txt."""
        local = tmp_dir / "job_input_list.txt"
        local.write_text(job_input_list(input_paths(feeds), data_dir, job))
        self.transport.push(local, f"{job}/input_list.txt")

    def _pull_qnn_outputs(self, remote_out: str, out_dir: Path, argv: list[str], result: CommandResult) -> None:
        """Pull qnn-net-run's output directory; raise RunnerError when it failed or left none."""
        if result.rc != 0:
            raise RunnerError("qnn-net-run failed on the device", device=self.transport.device_id, argv=argv,
                              rc=result.rc, stdout=result.stdout, stderr=result.stderr)
        try:
            self.transport.pull(remote_out, out_dir)
        except (DeviceLostError, DeviceTimeoutError):
            raise
        except TransportError as e:
            raise RunnerError(f"qnn-net-run exited 0 but left no output directory: {e}",
                              device=self.transport.device_id, argv=argv, rc=result.rc,
                              stdout=result.stdout, stderr=result.stderr) from None


def _qnn_refusal(runtime: str, feeds: list[Feed] | None, placement_only: bool, warmup: int,
                 min_iterations: int, min_duration_s: float) -> str | None:
    """Return what a qnn-net-run device was asked for and cannot do, or None."""
    if runtime != "htp":
        return f"the `{runtime}` runtime"
    if placement_only:
        return "a placement-only run (load without inputs)"
    if warmup or min_iterations or min_duration_s:
        return "a warm-up or timed measurement loop (qnn-net-run runs each input line once)"
    if not feeds:
        return "a run without inputs"
    return None


def _qnn_report(ctx: "QnnContextModel", remote_dir: str, outputs: list[Feed], inference_s: list[float],
                load_s: float, notes: list[str], machine: str | None, system: str | None, argv: list[str]) -> dict:
    """Return a runner_report.json-shaped record of a qnn-net-run job, built on the host."""
    first = outputs[0] if outputs else {}
    return {"runner": "qnn-net-run", "runtime": "htp", "model": f"{remote_dir}/{ctx.model.name}",
            "context_binary": f"{remote_dir}/{ctx.context_file.name}", "argv": argv, "error": None,
            "machine": machine, "system": system, "load_s": load_s, "inference_s": inference_s,
            "placement": [{"node": ctx.node, "op_type": "EPContext", "ep": HTP_EP}],
            "outputs": [{"name": n, "shape": list(np.shape(v)), "dtype": "float32"} for n, v in first.items()],
            "notes": notes}
