"""Host side of the device runner: stage inputs in qnn-net-run's layout, run, collect outputs."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.data import Feed, feeds_digest
from harness.errors import ContextMismatchError, RunnerError
from harness.transports.base import Transport, sha256_file

RUNNER_SOURCE = Path(__file__).with_name("device_runner.py")
RUNNER_REMOTE = "bin/device_runner.py"
CONTEXT_SIDECAR = "context.json"  # beside a compiled EPContext model: the SoC it was built for


@dataclass(frozen=True)
class ContextTarget:
    """The SoC a context binary was compiled for, as recorded when it was built."""

    soc: str
    soc_name: str
    htp_arch: int
    soc_model: int

    def __str__(self) -> str:
        return f"{self.soc} ({self.soc_name}, v{self.htp_arch}, soc_model {self.soc_model})"


def context_target(model: Path) -> ContextTarget | None:
    """Return the SoC a context binary was compiled for (sidecar first, then the model's
    metadata_props), or None when model is not a harness-compiled context binary."""
    model = Path(model)
    sidecar = model.parent / CONTEXT_SIDECAR
    if sidecar.is_file():
        data = json.loads(sidecar.read_text())
    elif model.name.endswith("_ctx.onnx"):
        import onnx

        props = {p.key: p.value for p in onnx.load(str(model), load_external_data=False).metadata_props}
        if "harness.soc" not in props:
            return None
        data = {k: props.get(f"harness.{k}") for k in ("soc", "soc_name", "htp_arch", "soc_model")}
    else:
        return None
    return ContextTarget(str(data["soc"]), str(data.get("soc_name") or data["soc"]), int(data["htp_arch"]),
                         int(data["soc_model"]))


def check_context_target(model: Path, soc, device_id: str) -> ContextTarget | None:
    """Raise ContextMismatchError, naming both SoCs, when model is a context binary compiled for
    another SoC than soc (a SocSpec); return its recorded target (None for a plain model)."""
    built = context_target(model)
    if built is None:
        return None
    if (built.soc_model, built.htp_arch) != (soc.soc_model, soc.htp_arch):
        raise ContextMismatchError(
            f"context binary {Path(model).name} was compiled for {built}, but device {device_id} is "
            f"{soc.id} ({soc.name}, v{soc.htp_arch}, soc_model {soc.soc_model}): refusing to run it; "
            f"compile it for {soc.id} (the context_binary step does, for the device under test)")
    return built



@dataclass(frozen=True)
class NodePlacement:
    """Which execution provider a node of the (optimised) graph was assigned to."""

    node: str
    op_type: str
    ep: str

    @property
    def on_htp(self) -> bool:
        """True when the QNN EP (HTP) runs this node."""
        return self.ep == "QNNExecutionProvider"


@dataclass
class RunResult:
    """Outputs of a runner invocation, one dict per input line, plus its report."""

    outputs: list[Feed]
    runtime: str
    load_s: float
    inference_s: list[float]
    placement: list[NodePlacement]
    report: dict = field(repr=False)
    workdir: Path | None = None
    iteration_s: list[float] = field(default_factory=list)  # the measurement loop's iterations
    measured_s: float = 0.0  # wall time of the measurement loop
    peak_rss_mb: float | None = None  # the runner process's peak resident memory


def write_input_list(feeds: list[Feed], directory: Path) -> Path:
    """Write feeds as raw float32 files plus a qnn-net-run input list; return the list's path."""
    lines = []
    for i, feed in enumerate(feeds):
        items = []
        for name, value in feed.items():
            rel = f"inputs/{i}/{_safe(name)}.raw"
            (directory / rel).parent.mkdir(parents=True, exist_ok=True)
            np.ascontiguousarray(value, dtype=np.float32).tofile(directory / rel)
            items.append(f"{name}:={rel}")
        lines.append(" ".join(items))
    path = directory / "input_list.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def read_results(out_dir: Path, report: dict) -> list[Feed]:
    """Read Result_N/<output>.raw files back into arrays shaped as the report says."""
    metas = report.get("outputs") or []
    results = []
    for i in range(len(report.get("inference_s") or [])):
        rdir = out_dir / f"Result_{i}"
        results.append({m["name"]: np.fromfile(rdir / m["file"], dtype=np.float32).reshape(m["shape"])
                        for m in metas})
    return results


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in name) or "input"


class DeviceRunner:
    """Runs models on one device through its transport with the device-side runner."""

    def __init__(self, transport: Transport, timeout_s: float = 900.0) -> None:
        self.transport = transport
        self.timeout_s = timeout_s
        self._deployed = False

    def deploy(self) -> None:
        """Push the runner program to the device (skipped when it is already there)."""
        if not self._deployed:
            self.transport.push(RUNNER_SOURCE, RUNNER_REMOTE)
            self._deployed = True

    def push_model(self, model: Path) -> str:
        """Push a model (and its external-data or context-binary siblings); return its remote path."""
        model = Path(model)
        digest = sha256_file(model)[:16]
        remote_dir = f"models/{digest}"
        self.transport.push(model, f"{remote_dir}/{model.name}")
        for sibling in model.parent.glob(model.stem + "*"):
            if sibling != model and sibling.suffix in {".bin", ".data"}:
                self.transport.push(sibling, f"{remote_dir}/{sibling.name}")
        if (model.parent / CONTEXT_SIDECAR).is_file():
            self.transport.push(model.parent / CONTEXT_SIDECAR, f"{remote_dir}/{CONTEXT_SIDECAR}")
        return f"{remote_dir}/{model.name}"

    def push_feeds(self, feeds: list[Feed], staging: Path) -> str:
        """Stage feeds as raw files + input list on the device once per content; return the list's path.

        The data directory is keyed by the feeds' digest and completed by a marker file pushed
        last, so a re-run (or another step on the same data) transfers nothing.
        """
        remote = f"data/{feeds_digest(feeds)}"
        if not self.transport.exists(f"{remote}/.complete"):
            write_input_list(feeds, staging)
            self.transport.push(staging, remote)
            (staging / ".complete").write_text("ok\n")
            self.transport.push(staging / ".complete", f"{remote}/.complete")
        return f"{remote}/input_list.txt"

    def run(self, model: Path, feeds: list[Feed] | None, runtime: str, *,
            allow_cpu_fallback: bool = False, placement_only: bool = False,
            profiling_level: str = "off", warmup: int = 0, keep_dir: Path | None = None,
            min_iterations: int = 0, min_duration_s: float = 0.0, intra_op_threads: int = 0) -> RunResult:
        """Run model on the device runtime ('htp' or 'cpu') over feeds; return outputs and report.

        With min_iterations/min_duration_s, after the outputs pass the runner times a loop over the
        feeds until both minimums are met (RunResult.iteration_s).
        Raises ContextMismatchError for a context binary compiled for another SoC than the device's
        (before anything is pushed), and RunnerError with the runner's own message when the model
        cannot be loaded or run.
        """
        soc = self.transport.soc
        check_context_target(model, soc, self.transport.device_id)
        self.deploy()
        remote_model = self.push_model(model)
        job = f"jobs/{uuid.uuid4().hex[:12]}"
        argv = [*self.transport.python, RUNNER_REMOTE, "--model", remote_model, "--runtime", runtime,
                "--output_dir", f"{job}/out", "--htp_arch", str(soc.htp_arch),
                "--soc_model", str(soc.soc_model), "--profiling_level", profiling_level,
                "--warmup", str(warmup)]
        if min_iterations or min_duration_s:
            argv += ["--min_iterations", str(min_iterations), "--min_duration", repr(float(min_duration_s))]
        if intra_op_threads:
            argv += ["--intra_op_threads", str(intra_op_threads)]
        if allow_cpu_fallback:
            argv.append("--allow_cpu_fallback")
        if placement_only:
            argv.append("--placement_only")
        with tempfile.TemporaryDirectory(prefix="harness-job-") as tmp:
            tmp_dir = Path(tmp)
            if feeds is not None and not placement_only:
                argv += ["--input_list", self.push_feeds(feeds, tmp_dir / "in")]
            try:
                result = self.transport.run(argv, timeout_s=self.timeout_s)
                out_dir = tmp_dir / "out"
                try:
                    self.transport.pull(f"{job}/out", out_dir)
                    report = json.loads((out_dir / "runner_report.json").read_text())
                except (OSError, ValueError, RunnerError, Exception) as e:
                    if result.rc == 0:
                        raise RunnerError(f"runner produced no report: {e}", device=self.transport.device_id,
                                          argv=argv, rc=result.rc, stderr=result.stderr) from None
                    raise RunnerError("device runner failed before writing its report",
                                      device=self.transport.device_id, argv=argv, rc=result.rc,
                                      stdout=result.stdout, stderr=result.stderr) from None
            finally:
                self.transport.remove(job)
            if report.get("error"):
                raise RunnerError(f"device runner ({runtime}) on {Path(model).name}: {report['error']}",
                                  device=self.transport.device_id, argv=argv, rc=result.rc)
            outputs = read_results(out_dir, report)
            if keep_dir is not None:
                keep_dir.mkdir(parents=True, exist_ok=True)
                for name in ("runner_report.json", "qnn_profile.csv"):
                    if (out_dir / name).exists():
                        shutil.copyfile(out_dir / name, keep_dir / name)
        return RunResult(outputs=outputs, runtime=runtime, load_s=float(report.get("load_s", 0.0)),
                         inference_s=[float(t) for t in report.get("inference_s") or []],
                         placement=[NodePlacement(**p) for p in report.get("placement") or []],
                         report=report, workdir=keep_dir,
                         iteration_s=[float(t) for t in report.get("iteration_s") or []],
                         measured_s=float((report.get("measurement") or {}).get("duration_s", 0.0)),
                         peak_rss_mb=report.get("peak_rss_mb"))
