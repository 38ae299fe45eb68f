"""How many evaluation samples a model gets, from its measured cost on the device's HTP, and how
many calibration samples fit in memory.

Every accuracy step runs the evaluation set on the HTP (PTQ, each sweep candidate, each mixed-
precision step, runtime), and on the HTP simulator a real model takes from milliseconds to
seconds per inference. So the pipeline times the default 8-bit model on the device (the
faster of two inferences, so that a load spike on a busy host does not shrink the set; cached per
model, data and device, so a re-run picks the same count and reuses its artifacts) and evaluates
on as many samples as fit in EVAL_BUDGET_S per pass, at least MIN_EVAL_SAMPLES (the fewest on which any verdict
is possible: fewer would make every step of a slow model inconclusive by construction); Step 7's
validation_accuracy, one pass, gets VALIDATION_BUDGET_S. Labelled data sets (the zoo's) are never cut: their task metric needs them. The count decides what the accuracy limits
can resolve (harness.stats: 189 samples resolve a 0.02 drop of an agreement with none changed), and
the data set's description says it before any step runs.

A run may set both budgets in the environment (HARNESS_EVAL_BUDGET_S, HARNESS_VALIDATION_BUDGET_S, read
when a process imports this module): a CI job over many slow models keeps each step's device time bounded
that way, and the description names the variable beside the count and what it resolves.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.cache import ArtifactCache, content_key
from harness.data import Feed, feeds_digest
from harness.errors import ConfigError
from harness.runner.client import DeviceRunner
from harness.runner.device_runner import RUNNER_VERSION
from harness.stats import MIN_BOOTSTRAP_SAMPLES, resolvable_drop

EVAL_BUDGET_ENV = "HARNESS_EVAL_BUDGET_S"
VALIDATION_BUDGET_ENV = "HARNESS_VALIDATION_BUDGET_S"


def budget_from_env(name: str, default_s: float) -> float:
    """Return the budget in seconds the environment variable name sets (more than 0), else default_s."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default_s
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ConfigError(f"{name}={text!r}: expected a device-time budget in seconds, more than 0 "
                          f"(unset, the default is {default_s:g} s)")
    return value


EVAL_BUDGET_S = budget_from_env(EVAL_BUDGET_ENV, 8.0)  # device time for one pass over the evaluation samples
# device time for Step 7's one pass of the context binary (validation_accuracy)
VALIDATION_BUDGET_S = budget_from_env(VALIDATION_BUDGET_ENV, 30.0)
BUDGETS_FROM_ENV = {name: value for name, value in ((EVAL_BUDGET_ENV, EVAL_BUDGET_S),
                                                     (VALIDATION_BUDGET_ENV, VALIDATION_BUDGET_S))
                    if os.environ.get(name, "").strip()}  # the budgets this run set, named in the descriptions
# fewer evaluation samples than a verdict needs decide nothing (harness.stats.bootstrap: below MIN_BOOTSTRAP_SAMPLES
# every KPI's interval spans its whole range), so a slow model gets at least that many, whatever its cost
MIN_EVAL_SAMPLES = MIN_BOOTSTRAP_SAMPLES
COST_REPEATS = 2  # inferences timed for a model's cost; the fastest counts (harness.sizing.measure_inference)
# onnxruntime's calibrators keep every intermediate tensor of every calibration sample in memory
# before computing ranges (the histogram ones always; MinMax by default), and the sweep runs two
# calibrations at once: calibration samples are capped so that one calibration holds at most this.
CALIB_MEMORY_BUDGET_BYTES = 4 * 2**30


@dataclass(frozen=True)
class InferenceCost:
    """One timed HTP inference of a model on a device: on the HTP simulator its CPU time (cpu_time True), which a
    busy host does not inflate, so that the evaluation count, and with it what a verdict can resolve, does not follow
    the host's load; elsewhere its wall time."""

    inference_s: float
    load_s: float
    latency_source: str
    cached: bool = False
    cpu_time: bool = False


def measure_inference(model: Path, feed: Feed, runner: DeviceRunner, cache: ArtifactCache,
                      repeats: int = COST_REPEATS) -> InferenceCost:
    """Return the time of one `htp` inference of model on feed on the runner's device (cached): the faster of
    `repeats` inferences in one session (COST_REPEATS; 1 for a probe of a slow candidate), so that a spike or a
    first run's warm-up does not shrink the evaluation set, and with it what the accuracy verdicts can resolve; on the HTP simulator the runner's CPU time, so that a
    busy host does not either (at a load average of 13 a 300-sample set was cut to 146 by wall time)."""
    device = runner.transport.device
    key = content_key("htp-cost-v3", model, feeds_digest([feed]), device.id, runner.transport.soc.id, RUNNER_VERSION,
                      repeats)

    def build(out: Path) -> None:
        run = runner.run(model, [feed] * repeats, "htp")
        cpu_time = run.latency_source == "simulator" and len(run.inference_cpu_s) == len(run.inference_s) > 0
        times = run.inference_cpu_s if cpu_time else run.inference_s
        record = {"inference_s": float(min(times)) if times else 0.0, "load_s": run.load_s,
                  "latency_source": run.latency_source, "cpu_time": cpu_time}
        (out / "cost.json").write_text(json.dumps(record))

    entry = cache.entry("htp_cost", key, build)
    return InferenceCost(**json.loads((entry.path / "cost.json").read_text()), cached=entry.hit)


def evaluation_count(cost_s: float, available: int, budget_s: float = EVAL_BUDGET_S,
                     minimum: int = MIN_EVAL_SAMPLES) -> int:
    """Return how many evaluation samples fit in budget_s at cost_s each (at least minimum, at most available)."""
    fit = int(budget_s // cost_s) if cost_s > 0 else available
    return max(min(minimum, available), min(available, fit))


def isolation_count(cost_s: float | None, requested: int, budget_s: float = EVAL_BUDGET_S) -> int:
    """Return how many evaluation samples error isolation compares layer by layer: the requested count, fewer when
    they do not fit one evaluation pass's budget_s at cost_s per inference, at least 1. It locates where the loss
    starts (no verdict rests on its count), and exposing every activation as an output makes a slow model's
    inference slower still (layout_cdla: 4 pages took 100 s of the simulator for what 1 shows)."""
    if not cost_s or cost_s <= 0:
        return requested
    return max(1, min(requested, int(budget_s // cost_s)))


def count_reason(cost: InferenceCost, device_id: str, count: int, budget_s: float = EVAL_BUDGET_S) -> str:
    """Return the sentence the data set's description carries about its evaluation count and what it resolves."""
    source = next((f" (set by {name})" for name, value in BUDGETS_FROM_ENV.items() if value == budget_s), "")
    took = f"took {cost.inference_s:.3g} s" + (" of CPU time" if cost.cpu_time else "")
    return (f"one HTP inference of the 8-bit model {took} on {device_id} "
            f"({cost.latency_source}); {count} fit the evaluation budget of {budget_s:g} s per pass{source}, "
            f"minimum {MIN_EVAL_SAMPLES}; {count} samples resolve a drop of an agreement of at best "
            f"{resolvable_drop(count):.3g}")


def activation_bytes(model: Path) -> int:
    """Return the bytes of one sample's intermediate and output tensors of a shape-fixed model (float32;
    tensors whose shapes cannot be inferred are not counted)."""
    import onnx

    inferred = onnx.load(str(model), load_external_data=False)
    try:
        inferred = onnx.shape_inference.infer_shapes(inferred)
    except Exception:  # noqa: BLE001 - shapes it cannot infer are simply not counted
        pass
    total = 0
    for value in list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if all(d > 0 for d in dims):
            total += 4 * int(np.prod(dims, dtype=np.int64))
    return total


def calibration_count(bytes_per_sample: int, available: int, budget_bytes: int = CALIB_MEMORY_BUDGET_BYTES) -> int:
    """Return how many calibration samples fit in budget_bytes of activations (at least 1, at most available)."""
    fit = budget_bytes // bytes_per_sample if bytes_per_sample > 0 else available
    return max(min(1, available), min(available, int(fit)))
