"""DeviceRunner, the one runner interface of a device: stage inputs in qnn-net-run's layout, run, collect outputs.

Two runners exist on a device: the harness's own Python runner (device_runner.py, where the
device has a `python:`, run from here) and Qualcomm's qnn-net-run (adb devices without one; context binaries
only, harness.runner.qnn_net_run). Both leave a RunResult (harness.runner.base); RunResult.latency_source says
whether its timings come from the HTP simulator or a device.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.data import Feed
from harness.emulator.device_time import modelled_latency
from harness.errors import ContextMismatchError, DeviceLostError, DeviceTimeoutError, RunnerError, TransportError
from harness.placement import refusal_message
from harness.qnn_errors import explain as explain_qnn
from harness.runner.base import (CONTEXT_SIDECAR, NodePlacement, RunResult, keep_outputs, push_feeds, push_model,
                                 remote_model_path)
from harness.runner.qnn_net_run import PYTHON_ENTRY_HINT, QnnNetRun
from harness.runner.server_client import RunnerServer
from harness.telemetry import TelemetryPaths
from harness.transports.base import CommandResult, Transport

logger = logging.getLogger(__name__)

RUNNER_SOURCE = Path(__file__).with_name("device_runner.py")
RUNNER_REMOTE = "bin/device_runner.py"
RUNNER_MODE_ENV = "HARNESS_RUNNER"  # "oneshot": a fresh runner process per call (debugging, benchmarks)


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



class HtpRefusedError(RunnerError):
    """The HTP refused nodes of a model run with CPU fallback disabled; `nodes` are the refused ones
    (NodePlacement, as a fallback-allowed session placed them, boundary Q/DQ nodes left out)."""

    def __init__(self, message: str, nodes: list[NodePlacement], **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.nodes = nodes
        self.summary = message  # the message without device, exit code and stderr

    @classmethod
    def from_report(cls, model: Path, report: dict, transport: Transport, argv: list[str],
                    rc: int | None) -> "HtpRefusedError":
        """Return the error for a runner report with `refused_nodes`, naming the refused nodes."""
        cpu = [NodePlacement(**p) for p in report["refused_nodes"]]
        soc = transport.soc
        message, refused = refusal_message(Path(model), cpu, f"{soc.name} (v{soc.htp_arch})")
        return cls(f"{Path(model).name}: {message}", refused, device=transport.device_id, argv=argv, rc=rc)


class QnnFinalizeError(RunnerError):
    """The QNN HTP backend could not finalize the model's graph; `summary` says what that means for the model
    (its largest tensors against the SoC's VTCM and graph memory) and what to try (harness.qnn_errors)."""

    def __init__(self, message: str, summary: str, **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.summary = summary


@dataclass(frozen=True)
class SoakSpec:
    """A soak run: duration_s seconds (or exactly `iterations` inferences), statistics per window_s, and
    telemetry sampled on the device every telemetry_interval_s (0: none) after idle_s seconds idle."""

    duration_s: float = 0.0
    iterations: int = 0
    window_s: float = 5.0
    telemetry_interval_s: float = 0.0
    idle_s: float = 0.0
    warmup: int = 1
    thermal_status: bool = True  # read Android's thermal status with each sample (dumpsys: costly on a phone)
    tail_s: float = 0.0  # keep sampling this long after the soak (phase "tail"): power readings lag the load


def read_results(out_dir: Path, report: dict) -> list[Feed]:
    """Read Result_N/<output>.raw files back into arrays shaped as the report says."""
    metas = report.get("outputs") or []
    results = []
    for i in range(len(report.get("inference_s") or [])):
        rdir = out_dir / f"Result_{i}"
        results.append({m["name"]: np.fromfile(rdir / m["file"], dtype=np.float32).reshape(m["shape"])
                        for m in metas})
    return results


DEFAULT_COMMAND_TIMEOUT_S = 900.0  # a device command's limit (--command-timeout); the simulator runs a 0.5B LLM
                                   # call in about 30 s and a 1-hour budget step in its budget plus 300 s

class DeviceRunner:
    """Runs models on one device through its transport with the device-side runner.

    Where the transport can keep a process (Transport.can_stream) and the device runs the Python runner,
    runs, soaks, concurrency runs and the self-check go to one persistent runner per device
    (harness.runner.server_client, started on first use, restarted once when it dies during a call);
    HARNESS_RUNNER=oneshot (or a call made while another is running) starts a fresh process instead.
    close() stops the server.
    """

    def __init__(self, transport: Transport, timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S) -> None:
        self.transport = transport
        self.timeout_s = timeout_s
        self._server: RunnerServer | None = None
        self._server_lock = threading.Lock()
        self._deployed = False
        self._platform: tuple[str | None, str | None] | None = None  # the device's (machine, system)
        self.qnn_net_run = QnnNetRun(transport)  # runs models where runner_kind is 'qnn-net-run'
        self.idle_temps_c: dict[str, float] = {}  # the device's zones when it connected (harness.farm.cooldown)

    def deploy(self) -> None:
        """Push the runner program to the device (skipped when it is already there)."""
        if not self._deployed:
            self.transport.push(RUNNER_SOURCE, RUNNER_REMOTE)
            self._deployed = True

    @property
    def persistent(self) -> bool:
        """Return whether runner calls go to a persistent runner on the device (see the class docstring)."""
        return (os.environ.get(RUNNER_MODE_ENV, "") != "oneshot" and self.transport.runner_kind == "python"
                and self.transport.can_stream)

    @property
    def server_pid(self) -> int | None:
        """Return the device-side pid of the persistent runner while it runs, else None."""
        return self._server.pid if self._server is not None and self._server.alive() else None

    def close(self) -> None:
        """Stop the persistent runner (an `exit` request, then a kill); the next call would start another."""
        with self._server_lock:
            if self._server is not None:
                self._server.close()
                self._server = None

    def self_check(self) -> dict:
        """Deploy the runner and run its self-check (a ping of the persistent runner, which starts it, or
        --self_check); return what it reports (versions, QNN EP present, the server's `pid`).
        Raises RunnerError when it does not start or prints no report."""
        self.deploy()
        if self.persistent:
            with self._server_lock:
                return self._runner_server().ping()
        argv = [*self.transport.python, RUNNER_REMOTE, "--self_check"]
        result = self.transport.run(argv, timeout_s=120.0)
        try:
            return json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RunnerError("the device runner's --self_check printed no report", device=self.transport.device_id,
                              argv=argv, rc=result.rc, stdout=result.stdout, stderr=result.stderr) from None

    def run(self, model: Path, feeds: list[Feed] | None, runtime: str, *,
            allow_cpu_fallback: bool = False, placement_only: bool = False,
            profiling_level: str = "off", warmup: int = 0, keep_dir: Path | None = None,
            min_iterations: int = 0, min_duration_s: float = 0.0, intra_op_threads: int = 0) -> RunResult:
        """Run model on the device runtime ('htp' or 'cpu') over feeds; return outputs and report.

        With min_iterations/min_duration_s, after the outputs pass the runner times a loop over the
        feeds until both minimums are met (RunResult.iteration_s).
        On a device whose transport runs qnn-net-run (runner_kind 'qnn-net-run'), only a compiled
        context binary runs, on `htp`, without a measurement loop (see QnnNetRun.run).
        Raises ContextMismatchError for a context binary compiled for another SoC than the device's
        (before anything is pushed), and RunnerError with the runner's own message when the model
        cannot be loaded or run. DeviceLostError and DeviceTimeoutError from the transport propagate.
        """
        check_context_target(model, self.transport.soc, self.transport.device_id)
        if self.transport.runner_kind == "qnn-net-run":
            return self.qnn_net_run.run(model, feeds, runtime, timeout_s=self.timeout_s, platform=self.device_platform,
                                        placement_only=placement_only, profiling_level=profiling_level,
                                        warmup=warmup, keep_dir=keep_dir, min_iterations=min_iterations,
                                        min_duration_s=min_duration_s)
        for attempt in (1, 2):
            argv = self._runner_argv(model, runtime, allow_cpu_fallback=allow_cpu_fallback,
                                     placement_only=placement_only, profiling_level=profiling_level, warmup=warmup,
                                     min_iterations=min_iterations, min_duration_s=min_duration_s,
                                     intra_op_threads=intra_op_threads)
            try:
                return self._execute(model, runtime, argv, None if placement_only else feeds, keep_dir)
            except HtpRefusedError:
                raise
            except RunnerError:
                if attempt == 2 or not self._altered_on_device(model):
                    raise
        raise AssertionError("unreachable")

    def _altered_on_device(self, model: Path) -> bool:
        """Return whether the files pushed for model (or the runner itself) were altered on the device since
        they were pushed; their remembered hashes are forgotten, so the next push sends them again."""
        altered = self.transport.verify_pushed([posixpath.dirname(remote_model_path(model)), RUNNER_REMOTE])
        if RUNNER_REMOTE in altered:
            self._deployed = False
        if altered:
            logger.warning("[%s] %s changed on the device since they were pushed; pushing them again",
                           self.transport.device_id, ", ".join(altered))
        return bool(altered)

    def soak(self, model: Path, feeds: list[Feed], spec: "SoakSpec", runtime: str = "htp") -> RunResult:
        """Run model over feeds for spec's duration or iteration count in one runner process (after
        spec.warmup untimed runs and the outputs pass), with per-window statistics and, when
        spec.telemetry_interval_s > 0, the device's thermal zones, battery and thermal status sampled on the
        runner's own clock (RunResult.report['soak'], ['telemetry'], ['iteration_end_s'])."""
        self._refuse_without_python("a soak")
        argv = self._runner_argv(model, runtime, allow_cpu_fallback=False, placement_only=False,
                                 profiling_level="off", warmup=spec.warmup, min_iterations=0, min_duration_s=0.0,
                                 intra_op_threads=0)
        argv += ["--window_s", repr(float(spec.window_s))]
        argv += (["--soak_iterations", str(spec.iterations)] if spec.iterations
                 else ["--soak_duration", repr(float(spec.duration_s))])
        if spec.telemetry_interval_s > 0:
            paths = TelemetryPaths.for_transport(self.transport)
            argv += ["--telemetry_interval", repr(float(spec.telemetry_interval_s)), "--idle_s", repr(float(spec.idle_s)),
                     "--tail_s", repr(float(spec.tail_s)),
                     "--thermal_dir", paths.thermal_dir, "--power_supply", paths.power_supply or "",
                     "--thermal_status",
                     "dumpsys" if spec.thermal_status and self.transport.platform == "android" else "none"]
        # an emulated device's iterations are its modelled HTP's (milliseconds each), not the simulator's
        per_iteration_s = 0.1 if "--emulated_latency_ms" in argv else 60.0
        budget_s = spec.duration_s + spec.idle_s + spec.tail_s + spec.iterations * per_iteration_s
        return self._execute(model, runtime, argv, feeds, None,
                             timeout_s=max(self.timeout_s, min(budget_s, 7 * 86400.0) + 300.0))

    def concurrent(self, plans: list[tuple[Path, list[Feed]]], sessions: int, duration_s: float,
                   solo_duration_s: float, mode: str = "threads", rounds: int = 1) -> RunResult:
        """Run `sessions` sessions at once on the device's HTP, round-robin over plans' (model, feeds), for
        duration_s in all, and each model alone for solo_duration_s in all, the solo and the shared phases
        alternating `rounds` times (RunResult.report['concurrency'], with each round's p50s)."""
        self._refuse_without_python("a concurrency run")
        (model, feeds), others = plans[0], plans[1:]
        argv = self._runner_argv(model, "htp", allow_cpu_fallback=False, placement_only=False,
                                 profiling_level="off", warmup=0, min_iterations=0, min_duration_s=0.0,
                                 intra_op_threads=0)
        with tempfile.TemporaryDirectory(prefix="harness-also-") as tmp:
            for k, (other, other_feeds) in enumerate(others):
                argv += ["--also", push_model(self.transport, other),
                         push_feeds(self.transport, other_feeds, Path(tmp) / str(k))]
        argv += self._emulated_argv([other for other, _ in others])
        argv += ["--sessions", str(sessions), "--concurrent_duration", repr(float(duration_s)),
                 "--solo_duration", repr(float(solo_duration_s)), "--concurrency_mode", mode, "--rounds", str(rounds)]
        budget_s = duration_s + solo_duration_s * len(plans) + 60.0 * sessions * (rounds if mode == "processes" else 1)
        return self._execute(model, "htp", argv, feeds, None, timeout_s=max(self.timeout_s, budget_s + 300.0))

    def run_tool(self, script: Path, command: list[str], *, timeout_s: float | None = None,
                 keep_dir: Path | None = None, raise_on_error: bool = True) -> dict:
        """Run a device-side tool (a script beside device_runner.py in the device's bin/, e.g. llm_runner.py or
        genie_runner.py) with `command` in a fresh job directory; return the result.json it writes.

        Remote paths in `command` are the caller's (push files first with base.push_model / push_dir). Raises
        RunnerError with the tool's own message when it writes no result, or (raise_on_error) reports an error.
        """
        self._refuse_without_python(f"{script.name}")
        self.deploy()
        remote_script = f"bin/{script.name}"
        self.transport.push(script, remote_script)
        job = f"jobs/{uuid.uuid4().hex[:12]}"
        argv = [*self.transport.python, remote_script, *command, "--output_dir", f"{job}/out"]
        with tempfile.TemporaryDirectory(prefix="harness-tool-") as tmp:
            out_dir = Path(tmp) / "out"
            try:
                result = self.transport.run(argv, timeout_s=timeout_s or self.timeout_s)
                report = self._pull_report(f"{job}/out", out_dir, argv, result, report_file="result.json")
            finally:
                self.transport.remove(job)
            if keep_dir is not None:
                shutil.copytree(out_dir, keep_dir, dirs_exist_ok=True)
        if report.get("error") and raise_on_error:
            raise RunnerError(f"{script.name} {command[0]}: {report['error']}", device=self.transport.device_id,
                              argv=argv, rc=result.rc)
        return report

    def push_dir(self, local: Path, remote: str) -> str:
        """Push a directory once per content (keyed by remote name, completed by a marker); return remote."""
        if not self.transport.exists(f"{remote}/.complete"):
            self.transport.push(local, remote)
            with tempfile.TemporaryDirectory(prefix="harness-mark-") as tmp:
                marker = Path(tmp) / ".complete"
                marker.write_text("ok\n")
                self.transport.push(marker, f"{remote}/.complete")
        return remote

    def _refuse_without_python(self, what: str) -> None:
        """Raise RunnerError when the device runs qnn-net-run, which has no such mode."""
        if self.transport.runner_kind == "qnn-net-run":
            raise RunnerError(f"device {self.transport.device_id} runs Qualcomm's qnn-net-run (no `python:` in its "
                              f"devices.yaml entry), which cannot run {what}; {PYTHON_ENTRY_HINT}",
                              device=self.transport.device_id)

    def _execute(self, model: Path, runtime: str, argv: list[str], feeds: list[Feed] | None,
                 keep_dir: Path | None, timeout_s: float | None = None) -> RunResult:
        """Run the runner argv in a fresh job directory over feeds; return its RunResult (see run())."""
        job = f"jobs/{uuid.uuid4().hex[:12]}"
        argv = [*argv, "--output_dir", f"{job}/out"]
        with tempfile.TemporaryDirectory(prefix="harness-job-") as tmp:
            tmp_dir = Path(tmp)
            if feeds is not None:
                argv += ["--input_list", push_feeds(self.transport, feeds, tmp_dir / "in")]
            out_dir = tmp_dir / "out"
            try:
                result, restarted = self._invoke(argv, timeout_s or self.timeout_s)
                report = self._pull_report(f"{job}/out", out_dir, argv, result)
            finally:
                self.transport.remove(job)
            if restarted:
                report["runner_restarted"] = True
            if report.get("refused_nodes") is not None:
                raise HtpRefusedError.from_report(model, report, self.transport, argv, result.rc)
            if report.get("error"):
                explained = explain_qnn(Path(model), self.transport.soc, report["error"], result.stderr)
                if explained is not None:
                    raise QnnFinalizeError(f"device runner ({runtime}) on {Path(model).name}: {explained}",
                                           explained, device=self.transport.device_id, argv=argv, rc=result.rc)
                raise RunnerError(f"device runner ({runtime}) on {Path(model).name}: {report['error']}",
                                  device=self.transport.device_id, argv=argv, rc=result.rc)
            outputs = read_results(out_dir, report)
            keep_outputs(out_dir, keep_dir)
        return RunResult(outputs=outputs, runtime=runtime, load_s=float(report.get("load_s", 0.0)),
                         inference_s=[float(t) for t in report.get("inference_s") or []],
                         inference_cpu_s=[float(t) for t in report.get("inference_cpu_s") or []],
                         placement=[NodePlacement(**p) for p in report.get("placement") or []],
                         report=report, workdir=keep_dir,
                         iteration_s=[float(t) for t in report.get("iteration_s") or []],
                         measured_s=float((report.get("measurement") or report.get("soak") or {}).get("duration_s", 0.0)),
                         peak_rss_mb=report.get("peak_rss_mb"), machine=report.get("machine"),
                         system=report.get("system"), notes=_emulated_notes(report) + _restart_notes(report),
                         emulated_s=([float(t) for t in report["emulated_iteration_s"]]
                                     if report.get("emulated_iteration_s") is not None else None))

    def _invoke(self, argv: list[str], timeout_s: float) -> tuple[CommandResult, bool]:
        """Run the runner's argv: a request to the persistent runner (see the class docstring), else a fresh
        process; return its result and whether the persistent runner had to be restarted for it."""
        if self.persistent and self._server_lock.acquire(blocking=False):
            try:
                reply = self._runner_server().run(argv[len(self.transport.python) + 1:], timeout_s)
            finally:
                self._server_lock.release()
            return CommandResult(argv, reply.rc, "", reply.stderr, reply.duration_s), reply.restarted
        return self.transport.run(argv, timeout_s=timeout_s), False

    def _runner_server(self) -> RunnerServer:
        """Return the device's persistent runner (created, not yet started, on first use; lock held)."""
        if self._server is None:
            self._server = RunnerServer(self.transport, [*self.transport.python, RUNNER_REMOTE])
        return self._server

    def _runner_argv(self, model: Path, runtime: str, *, allow_cpu_fallback: bool, placement_only: bool,
                     profiling_level: str, warmup: int, min_iterations: int, min_duration_s: float,
                     intra_op_threads: int) -> list[str]:
        """Deploy the runner and the model; return the runner's argv (without output dir and input list)."""
        soc = self.transport.soc
        self.deploy()
        remote_model = push_model(self.transport, model)
        argv = [*self.transport.python, RUNNER_REMOTE, "--model", remote_model, "--runtime", runtime,
                "--htp_arch", str(soc.htp_arch), "--soc_model", str(soc.soc_model),
                "--profiling_level", profiling_level, "--warmup", str(warmup)]
        if min_iterations or min_duration_s:
            argv += ["--min_iterations", str(min_iterations), "--min_duration", repr(float(min_duration_s))]
        if intra_op_threads:
            argv += ["--intra_op_threads", str(intra_op_threads)]
        if allow_cpu_fallback:
            argv.append("--allow_cpu_fallback")
        if placement_only:
            argv.append("--placement_only")
        return argv if placement_only else argv + self._emulated_argv([model])

    def _emulated_argv(self, models: list[Path]) -> list[str]:
        """Return --emulated_latency_ms for each model (in order) on an emulated device, [] on a real one."""
        if getattr(self.transport, "telemetry_source", "measured") != "emulated":
            return []

        argv = []
        for model in models:
            argv += ["--emulated_latency_ms", repr(modelled_latency(Path(model), self.transport.soc).latency_ms)]
        return argv

    def _pull_report(self, remote_out: str, out_dir: Path, argv: list[str], result: CommandResult,
                     report_file: str = "runner_report.json") -> dict:
        """Pull the runner's output directory; return its report (runner_report.json, or a tool's report_file).

        Raises RunnerError when the report is missing or unreadable (naming the runner's exit code
        and output); a device lost or timing out during the pull propagates as it is.
        """
        try:
            self.transport.pull(remote_out, out_dir)
            return json.loads((out_dir / report_file).read_text())
        except (DeviceLostError, DeviceTimeoutError):
            raise
        except (TransportError, OSError, ValueError) as e:
            if result.rc == 0:
                raise RunnerError(f"runner produced no report: {e}", device=self.transport.device_id,
                                  argv=argv, rc=result.rc, stderr=result.stderr) from None
            raise RunnerError("device runner failed before writing its report",
                              device=self.transport.device_id, argv=argv, rc=result.rc,
                              stdout=result.stdout, stderr=result.stderr) from None

    def device_platform(self) -> tuple[str | None, str | None]:
        """Return the device's (machine, system) from `uname -m -s` (asked once; (None, None) when
        it cannot say)."""
        if self._platform is None:
            machine = system = None
            try:
                result = self.transport.read_command(["uname", "-s", "-m"], timeout_s=30.0)
                words = result.stdout.split()
                if result.rc == 0 and len(words) == 2:
                    system, machine = words
            except (DeviceLostError, DeviceTimeoutError):
                raise
            except TransportError:
                pass
            self._platform = (machine, system)
        return self._platform


def _emulated_notes(report: dict) -> list[str]:
    """Return what an emulated device's runner report says about the basis of its modelled time."""
    emulated = report.get("emulated")
    if emulated and emulated.get("basis") == "simulator":
        return ["the emulated HTP had no modelled latency (--emulated_latency_ms): its modelled time is the "
                "simulator's, which follows the host's speed"]
    return []


def _restart_notes(report: dict) -> list[str]:
    """Return what a runner report says about a persistent runner restarted for its call."""
    if report.get("runner_restarted"):
        return ["the device's persistent runner ended during this call (a crash or a kill); it was restarted "
                "and the call ran again"]
    return []


