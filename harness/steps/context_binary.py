"""Step 4, compilation: the deployable QDQ model compiled into a QNN context binary for one SoC.

The host compiles (as qnn-context-binary-generator or an AI Hub compile job would) through the
QNN EP's EP-context generation: `ep.context_enable=1` writes `model_ctx.onnx`, an EPContext
wrapper, and `model_ctx_qnn.bin`, the serialized HTP context. The pair is cached per
(model content, SoC, options, toolchain) with a `context.json` sidecar recording the SoC it
was built for; the same record goes into the wrapper's metadata_props. The runner client and
the device runner refuse to run a binary on a device of another SoC. A cached binary the device runner
cannot load is discarded and compiled again once (reported in the step's notes).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from harness.cache import ArtifactCache, content_key
from harness.devices import SocSpec
from harness.emulator.device_time import record_graph_cost
from harness.errors import RunnerError, StepError
from harness.files import sha256_file
from harness.kpi import Limit
from harness.runner.base import CONTEXT_SIDECAR, RunResult
from harness.runner.client import ContextTarget, DeviceRunner, HtpRefusedError
from harness.steps.feasibility import map_placement
from harness.steps.report import StepReport

CONTEXT_FORMAT = "harness-context-v1"
CONTEXT_MODEL = "model_ctx.onnx"  # the QNN EP names the binary <stem>_qnn.bin beside it
QNN_EP = "QNNExecutionProvider"
LOAD_REPEATS = 3  # load-time measurements per model; the median is reported


@dataclass(frozen=True)
class ContextBinary:
    """A compiled context binary in the cache: its directory, sidecar record, whether it was reused, what was
    wrong with the cached one when it was rebuilt, and how to rebuild it (discarding the cached one) for a reason."""

    directory: Path
    info: dict[str, Any]
    hit: bool
    healed: str | None = None
    rebuild: Callable[[str], "ContextBinary"] | None = field(default=None, compare=False, repr=False)

    @property
    def model(self) -> Path:
        """The EPContext wrapper model to load (it names the .bin beside it)."""
        return self.directory / self.info["context_model"]

    @property
    def files(self) -> list[Path]:
        """Every file that ships to the device: the wrapper and the serialized context(s)."""
        return [self.directory / name for name in self.info["files"]]

    @property
    def context_bytes(self) -> int:
        """Total size of the shipped files, bytes."""
        return sum(p.stat().st_size for p in self.files)

    @property
    def compile_s(self) -> float:
        """Seconds the compilation took when the binary was built."""
        return float(self.info["compile_s"])

    @property
    def target(self) -> ContextTarget:
        """The SoC the binary was compiled for."""
        return ContextTarget(self.info["soc"], self.info["soc_name"], self.info["htp_arch"], self.info["soc_model"])


def qnn_provider_options(soc: SocSpec) -> dict[str, str]:
    """Return the QNN EP provider options for soc's HTP, as the device runner sets them."""
    return {"backend_type": "htp", "enable_htp_fp16_precision": "1", "htp_arch": str(soc.htp_arch),
            "soc_model": str(soc.soc_model)}


def toolchain() -> dict[str, str]:
    """Return the versions that shape a compiled binary (part of its cache key)."""
    import onnxruntime as ort

    return {"onnxruntime": ort.__version__, "onnxruntime_qnn": metadata.version("onnxruntime-qnn")}


def host_htp_session(model: Path, soc: SocSpec, config: dict[str, str] | None = None,
                     extra_options: dict[str, str] | None = None):
    """Return an in-process onnxruntime session of model on the host's QNN EP (the HTP simulator
    on x86-64), with the provider options the device runner uses for soc."""
    import onnxruntime as ort
    import onnxruntime_qnn

    try:
        ort.register_execution_provider_library(QNN_EP, onnxruntime_qnn.get_library_path())
    except Exception as e:  # registered before in this process
        if "already" not in str(e).lower():
            raise StepError(f"cannot register the QNN execution provider: {e}") from None
    devices = [d for d in ort.get_ep_devices() if d.ep_name == QNN_EP]
    if not devices:
        raise StepError("the QNN execution provider registered no device on the host")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    for key, value in (config or {}).items():
        so.add_session_config_entry(key, value)
    so.add_provider_for_devices(devices, {**qnn_provider_options(soc), **(extra_options or {})})
    return ort.InferenceSession(str(model), so)


def compile_context(model: Path, soc: SocSpec, cache: ArtifactCache, *,
                    allow_cpu_fallback: bool = False) -> ContextBinary:
    """Return the cached context binary of model for soc, compiling it on the host when absent.

    Raises StepError naming the model and SoC when the QNN EP cannot compile it.
    """
    options = {"embed_mode": 0, "allow_cpu_fallback": allow_cpu_fallback, **qnn_provider_options(soc)}
    tools = toolchain()
    key = content_key(CONTEXT_FORMAT, model, soc.id, options, tools)

    def build(out: Path) -> None:
        ctx = out / CONTEXT_MODEL
        config = {"ep.context_enable": "1", "ep.context_file_path": str(ctx), "ep.context_embed_mode": "0"}
        if not allow_cpu_fallback:
            config["session.disable_cpu_ep_fallback"] = "1"
        start = time.perf_counter()
        try:
            session = host_htp_session(model, soc, config=config)
        except StepError:
            raise
        except Exception as e:
            hint = ("; some nodes cannot run on the HTP: run the feasibility step to see which"
                    if "fallback to CPU EP has been explicitly disabled" in str(e) else "")
            raise StepError(f"compiling {model.name} into a context binary for {soc.id} (v{soc.htp_arch}) "
                            f"failed: {type(e).__name__}: {str(e).strip().splitlines()[0]}{hint}") from None
        compile_s = time.perf_counter() - start
        del session
        blobs = sorted(p.name for p in out.glob(ctx.stem + "*.bin"))
        if not ctx.is_file() or not blobs:
            raise StepError(f"the QNN EP wrote no context binary for {model.name} in {out} "
                            f"(found: {sorted(p.name for p in out.iterdir())})")
        info = {"format": CONTEXT_FORMAT, "soc": soc.id, "soc_name": soc.name, "htp_arch": soc.htp_arch,
                "soc_model": soc.soc_model, "model_sha256": sha256_file(model), "options": options, **tools,
                "qnn_sdk": _ep_sdk_version(ctx), "compile_s": compile_s, "context_model": ctx.name,
                "files": [ctx.name, *blobs], "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        _record_target(ctx, info)
        (out / CONTEXT_SIDECAR).write_text(json.dumps(info, indent=1) + "\n")

    entry = cache.entry("context_binary", key, build)

    record_graph_cost(entry.path, model)  # the graph's cost, for an emulated device's modelled time

    def rebuild(reason: str) -> ContextBinary:
        cache.invalidate("context_binary", key, reason)
        return compile_context(model, soc, cache, allow_cpu_fallback=allow_cpu_fallback)

    return ContextBinary(entry.path, json.loads((entry.path / CONTEXT_SIDECAR).read_text()), entry.hit,
                         entry.healed, rebuild)


def _ep_sdk_version(ctx: Path) -> str | None:
    import onnx

    for node in onnx.load(str(ctx), load_external_data=False).graph.node:
        for attr in node.attribute:
            if node.op_type == "EPContext" and attr.name == "ep_sdk_version":
                return attr.s.decode()
    return None


def _record_target(ctx: Path, info: dict[str, Any]) -> None:
    """Write the SoC the binary was built for into the wrapper's metadata_props."""
    import onnx

    model = onnx.load(str(ctx), load_external_data=False)
    props = {p.key: p.value for p in model.metadata_props}
    props.update({f"harness.{k}": str(info[k]) for k in ("soc", "soc_name", "htp_arch", "soc_model", "model_sha256")})
    onnx.helper.set_model_props(model, props)
    onnx.save(model, str(ctx))


def context_binary(ctx: ContextBinary, qdq_model: Path, runner: DeviceRunner) -> StepReport:
    """Return the Step 4 report: size and compile time of the context binary, and its load time on
    the device's runtime against loading (JIT-compiling) the QDQ model there (session creation
    only, median of LOAD_REPEATS runs each)."""
    import onnx

    fallback = bool(ctx.info["options"]["allow_cpu_fallback"])
    loads: dict[str, list[float]] = {"context": [], "jit": []}
    ctx, first = _load_or_rebuild(ctx, qdq_model, runner)
    for i in range(LOAD_REPEATS):  # alternating, so that a busy moment on the device hits both alike
        loaded = first if i == 0 else runner.run(ctx.model, None, "htp", placement_only=True)
        jit = runner.run(qdq_model, None, "htp", placement_only=True, allow_cpu_fallback=fallback)
        loads["context"].append(float(loaded.report.get("session_create_s", loaded.load_s)))
        loads["jit"].append(float(jit.report.get("session_create_s", jit.load_s)))
    load_s, jit_load_s = statistics.median(loads["context"]), statistics.median(loads["jit"])
    placement = map_placement(onnx.load(str(qdq_model)), jit.placement)
    report = StepReport("context_binary")
    report.kpis = {
        "soc": ctx.info["soc"], "htp_arch": ctx.info["htp_arch"], "soc_model": ctx.info["soc_model"],
        "context_bytes": ctx.context_bytes,
        "context_files": {p.name: p.stat().st_size for p in ctx.files},
        "compile_s": ctx.compile_s,
        "cache_hit": ctx.hit,
        "load_s": load_s,
        "jit_load_s": jit_load_s,
        "load_speedup": jit_load_s / load_s if load_s > 0 else None,
        "load_samples_s": loads["context"],
        "jit_load_samples_s": loads["jit"],
        "qnn_sdk": ctx.info.get("qnn_sdk"),
        "nodes_on_htp": sum(r["placement"] == "HTP" for r in placement),
        "nodes_total": len(placement),
    }
    # Shipping a binary that loads slower than compiling the QDQ model on the device buys nothing.
    report.limits = [Limit("load_speedup", minimum=1.0, marginal=0.2)]
    if ctx.healed:
        report.notes.append(f"the cached context binary in {ctx.directory} was damaged ({ctx.healed}); "
                            "it was discarded and compiled again")
    report.tables["placement"] = placement
    report.artifacts.update({"context_model": ctx.model, "context_sidecar": ctx.directory / CONTEXT_SIDECAR})
    return report


def _load_or_rebuild(ctx: ContextBinary, qdq_model: Path, runner: DeviceRunner) -> tuple[ContextBinary, RunResult]:
    """Load ctx on the device (session creation only); when the runner cannot load it, discard the cached
    binary, compile it again and load that once. Return the binary loaded and its run.

    Raises StepError naming the files when the rebuilt binary cannot be loaded either (or cannot be rebuilt).
    """
    def load(binary: ContextBinary) -> tuple[RunResult | None, str]:
        """Return the load's run, or None and why the runner could not load it (an HTP refusal propagates)."""
        try:
            return runner.run(binary.model, None, "htp", placement_only=True), ""
        except HtpRefusedError:
            raise
        except RunnerError as e:
            return None, _first_line(e)

    run, why = load(ctx)
    if run is not None:
        return ctx, run
    files = ", ".join(p.name for p in ctx.files)
    if ctx.rebuild is None:
        raise StepError(f"the device runner could not load the context binary {ctx.model} ({files}): {why}; "
                        f"delete {ctx.directory} to have it compiled again")
    rebuilt = ctx.rebuild(f"the device runner could not load it: {why}")
    run, again = load(rebuilt)
    if run is not None:
        return rebuilt, run
    raise StepError(f"the device runner could not load the context binary {ctx.model} ({files}), neither as "
                    f"cached nor compiled again from {Path(qdq_model).name}: {again}"
                    + ("" if again == why else f" (the cached one: {why})"))


def _first_line(error: Exception) -> str:
    """Return the first line of an error's message."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
