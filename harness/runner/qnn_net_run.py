"""Host side of a qnn-net-run job: what a context binary needs, the input list, reading the outputs.

A device whose devices.yaml entry has no ``python:`` runs Qualcomm's ``qnn-net-run`` (pushed from
the QAIRT SDK, see harness.transports.adb.QnnNetRun) instead of the harness's runner. It knows
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

import posixpath
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.data import Feed
from harness.errors import RunnerError
from harness.profiling import ProfileFormatError, parse_profile_csv

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
