"""Step 3, stage 4: a sweep of quantization strategies, each run on the device's HTP and ranked.

The matrix (`full`): calibration MinMax / Entropy / Percentile × per-tensor / per-channel weights ×
asymmetric / symmetric × 8- / 16-bit activations. `quick` picks four candidates that cover the
axes cheaply. Each candidate is quantized (cached by recipe, like every artifact), run on `htp` over
the evaluation data and ranked: candidates meeting the model's KPI first, then by task metric, then
by cosine similarity. A candidate meets the KPI only decisively: every limit passes on its KPI's 95 %
interval over the evaluation samples (one whose interval straddles a limit is *undecided*). Host-side quantization always runs in parallel; device runs do too when the
first candidate's run says it ran on the HTP simulator (RunResult.latency_source 'simulator': an
x86-64 machine's cores), and one at a time on a device's single HTP.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from harness.cache import ArtifactCache, content_key
from harness.data import Dataset, Feed, feeds_digest
from harness.errors import HarnessError, StepError
from harness.files import link_or_copy
from harness import stats
from harness.kpi import check_all
from harness.models import Thresholds
from harness.options import SWEEP_MODES
from harness.profiling import ProfileFormatError, parse_profile_csv
from harness.runner.base import push_feeds, push_model
from harness.runner.client import DeviceRunner, HtpRefusedError
from harness.runner.device_runner import RUNNER_VERSION
from harness.steps.inference import accuracy_limits, task_metric
from harness.steps.ptq import QuantRecipe, compare_quantized, judge, quantize
from harness.steps.report import StepReport

CALIBRATION_METHODS = ("MinMax", "Entropy", "Percentile")
FP16_NAME = "FP16-htp"
EIGHT_BIT = ("QUInt8", "QInt8")
# onnxruntime's quantize_static runs entropy calibration with 128 histogram bins for 128 quantized
# bins, which leaves one candidate threshold (the full range) and so equals MinMax. Entropy
# candidates therefore get their ranges from onnxruntime's EntropyCalibrater run with 2048 bins
# (as TensorRT's entropy calibration does), passed to the quantizer as rmin/rmax overrides.
ENTROPY_NUM_BINS = 2048
ENTROPY_QUANTIZED_BINS = 128


@dataclass
class Candidate:
    """One quantization strategy tried: its recipe, QDQ model and KPIs on the HTP, or why it failed."""

    recipe: QuantRecipe
    model: Path | None = None
    kpis: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    meets: bool = False  # every limit decisively passed (on its KPI's interval)
    undecided: bool = False  # not meeting, but no limit decisively failed: an interval straddles one
    fp16: bool = False  # the float model on the HTP in FP16 (model is the float model, recipe unused)

    @property
    def name(self) -> str:
        """The recipe's readable id ('FP16-htp' for the float model on the HTP)."""
        return FP16_NAME if self.fp16 else self.recipe.name

    @property
    def precision(self) -> str:
        """Return the candidate's precision kind: 'a8' (8-bit activations), 'mixed' (8-bit with activations
        promoted to 16 bits), 'a16' (16-bit activations) or 'fp16' (the float model on the HTP)."""
        if self.fp16:
            return "fp16"
        if self.recipe.activation_type not in EIGHT_BIT:
            return "a16"
        promoted = any(o.get("quant_type") in ("QUInt16", "QInt16")
                       for overrides in self.recipe.tensor_overrides.values() for o in overrides)
        return "mixed" if promoted else "a8"

    def summary(self) -> dict[str, Any]:
        """Return the candidate as one row of the sweep's KPIs."""
        return {"name": self.name, "task_metric": self.kpis.get("task_metric"),
                "cosine_similarity": self.kpis.get("cosine_similarity"), "sqnr_db": self.kpis.get("sqnr_db"),
                "task_metric_drop": self.kpis.get("task_metric_drop"),
                **_interval_columns(self.kpis, "task_metric_drop"), "meets_kpi": self.meets,
                "verdict": self.verdict,
                "model_bytes": self.kpis.get("model_bytes"), "mean_inference_ms": self.kpis.get("mean_inference_ms"),
                "htp_latency_ms": self.kpis.get("htp_latency_ms"), "latency_source": self.kpis.get("latency_source"),
                "error": self.error}

    @property
    def verdict(self) -> str:
        """Return 'meets', 'undecided', 'fails' or 'error'."""
        return "error" if self.error else "meets" if self.meets else "undecided" if self.undecided else "fails"

    def describe(self) -> str:
        """Return a one-line account of the candidate, for failure messages."""
        if self.error:
            return f"{self.name}: error: {self.error.splitlines()[0]}"
        k = self.kpis
        drop = (k.get("intervals") or {}).get("task_metric_drop")
        within = f" [{drop['low']:.3g}, {drop['high']:.3g}] n={drop['samples']}" if drop else ""
        return (f"{self.name}: {k['task_metric_name']} {k['task_metric']:.4g} (drop {k['task_metric_drop']:.4g}"
                f"{within}), cosine {k['cosine_similarity']:.4f}, SQNR {k['sqnr_db']:.1f} dB"
                f"{' (undecided)' if self.undecided else ''}")


def _interval_columns(kpis: dict[str, Any], kpi: str) -> dict[str, Any]:
    """Return the low/high/n columns of kpi's interval in kpis (None when it has none)."""
    interval = (kpis.get("intervals") or {}).get(kpi) or {}
    return {f"{kpi}_low": interval.get("low"), f"{kpi}_high": interval.get("high"), "n": interval.get("samples")}


def judge_candidate(candidate: Candidate, thresholds: Thresholds) -> Candidate:
    """Set candidate.meets (every accuracy limit decisively passed on its KPI's interval) and .undecided (not
    meeting, but no limit decisively failed); return it."""
    verdicts = check_all(candidate.kpis, accuracy_limits(thresholds))
    candidate.meets = all(v.passed for v in verdicts)
    candidate.undecided = not candidate.meets and all(v.passed or v.inconclusive for v in verdicts)
    return candidate


def undecidable(start: Candidate, thresholds: Thresholds,
                best_case: dict | None) -> tuple[list[str], int | None, list[str]] | None:
    """Return (the undecided KPIs, the evaluation samples, one sentence per unresolved limit) when no candidate
    could be decided on these samples, else None: start fails no limit, and even a candidate identical to float
    (best_case: its KPIs on these samples, ptq.best_case) leaves every limit start leaves undecided undecided too
    (a drop finer than the samples resolve; any KPI on fewer than stats' minimum samples), so every candidate would
    be undecided."""
    if start.meets or start.error is not None or not start.undecided or best_case is None:
        return None
    limits = accuracy_limits(thresholds)
    states = {v.limit.kpi: v.state for v in check_all(start.kpis, limits)}
    undecided = sorted(kpi for kpi, state in states.items() if state == "inconclusive")
    if not undecided or "failed" in states.values():
        return None
    undecided_limits = [lim for lim in limits if lim.kpi in undecided]
    if any(not v.inconclusive for v in check_all(best_case, undecided_limits)):
        return None
    best = {**best_case, "intervals": dict(best_case.get("intervals") or {})}  # unresolved sets `needed` in it
    samples = next(iter(best["intervals"].get(kpi, {}).get("samples") for kpi in undecided), None)
    return undecided, samples, stats.unresolved(best, undecided_limits)


def candidate_recipes(mode: str, base: QuantRecipe) -> list[QuantRecipe]:
    """Return the recipes a sweep mode tries, derived from base (its overrides are kept)."""
    def recipe(method: str, per_channel: bool, symmetric: bool, act16: bool) -> QuantRecipe:
        signed_weights = per_channel or symmetric  # the HTP wants per-channel weights signed-symmetric
        return replace(base, calibrate_method=method, per_channel=per_channel, activation_symmetric=symmetric,
                       activation_type="QUInt16" if act16 else "QUInt8",
                       weight_type="QInt8" if signed_weights else "QUInt8",
                       weight_symmetric=True if signed_weights else None)

    if mode == "quick":
        # the 16-bit-activation candidate has per-channel weights (w8a16 as AI Hub ships it): with per-tensor 8-bit
        # weights, folded BatchNorm's spread scales cost more than 16-bit activations win (layout_cdla: map50 0
        # per tensor against float's 0.88 per channel, in host QDQ)
        return [recipe("MinMax", False, False, False), recipe("MinMax", True, False, False),
                recipe("Percentile", False, False, False), recipe("MinMax", True, False, True)]
    if mode == "full":
        return [recipe(m, pc, sym, a16) for a16 in (False, True) for m in CALIBRATION_METHODS
                for pc in (False, True) for sym in (False, True)]
    raise HarnessError(f"sweep mode '{mode}' has no candidates (choose one of {', '.join(SWEEP_MODES)})")


def evaluate_recipe(recipe: QuantRecipe, model: Path, dataset: Dataset, reference: list[Feed],
                    runner: DeviceRunner, thresholds: Thresholds, cache: ArtifactCache,
                    device_lock: threading.Lock | None = None, push_lock: threading.Lock | None = None) -> Candidate:
    """Quantize model with recipe, run it on `htp` over the evaluation data; return the Candidate.

    A HarnessError (quantization failed, the HTP rejected the model) is recorded in the candidate.
    """
    candidate = Candidate(recipe)
    try:
        recipe, candidate.model = quantize_recipe(recipe, model, dataset, cache)
        candidate.recipe = recipe
        candidate.kpis = candidate_kpis(candidate.model, recipe.name, dataset, reference, runner, cache,
                                        device_lock, push_lock)
    except HarnessError as e:
        candidate.error = str(e)
        return candidate
    return judge_candidate(candidate, thresholds)


def quantize_recipe(recipe: QuantRecipe, model: Path, dataset: Dataset,
                    cache: ArtifactCache) -> tuple[QuantRecipe, Path]:
    """Return the recipe as applied (Entropy resolved to explicit ranges) and its cached QDQ model,
    quantized from a private copy of model (so that quantizations may run in parallel)."""
    if recipe.calibrate_method == "Entropy":
        recipe = with_entropy_ranges(recipe, model, dataset.calibration, cache)
    with _private_copy(model, cache) as own:
        return recipe, quantize(own, dataset.calibration, recipe, cache)


def candidate_kpis(model: Path, name: str, dataset: Dataset, reference: list[Feed],
                   runner: DeviceRunner, cache: ArtifactCache, device_lock: threading.Lock | None = None,
                   push_lock: threading.Lock | None = None) -> dict[str, Any]:
    """Return a candidate's KPIs from its `htp` run over the evaluation data, with its HTP latency
    (`htp_latency_ms`: the median 'Accelerator (execute) time' of the run's basic QNN profile, labelled by
    `latency_source`: 'simulator' on the HTP simulator, where it is not a phone's latency).

    The result is cached per (candidate model, data, float reference, device, runner), like the
    candidate model itself, so a re-run of the sweep ranks from the cache; the chosen model is
    run again by the steps after it.
    """
    labels = dataset.labels_key()
    key = content_key("sweep-eval-v3", model, feeds_digest(dataset.evaluation), feeds_digest(reference), labels,
                      runner.transport.device.id, runner.transport.soc.id, RUNNER_VERSION)

    def build(out: Path) -> None:
        with push_lock or contextlib.nullcontext():
            push_model(runner.transport, model)
        with device_lock or contextlib.nullcontext():
            try:
                run = runner.run(model, dataset.evaluation, "htp", profiling_level="basic", keep_dir=out / "run")
            except HtpRefusedError as e:  # name the refused nodes, not the runner's exit code
                raise StepError(f"{name}: {e.summary}") from None
        float_metric = task_metric(reference, dataset, reference)
        kpis = {"recipe": name, **compare_quantized(run.outputs, reference, dataset, float_metric),
                "model_bytes": model.stat().st_size,
                "mean_inference_ms": 1000 * float(np.mean(run.inference_s)) if run.inference_s else None,
                "htp_latency_ms": _profiled_latency_ms(out / "run" / "qnn_profile.csv"),
                "latency_source": run.latency_source}
        (out / "kpis.json").write_text(json.dumps(kpis, indent=1, default=float))

    entry = cache.entry("sweep_eval", key, build)
    return {**json.loads((entry.path / "kpis.json").read_text()), "cached": entry.hit}


def _profiled_latency_ms(csv_path: Path) -> float | None:
    """Return the median accelerator execute time (ms) of a basic QNN profile CSV (None when there is none)."""
    try:
        times = [e.accelerator_us for e in parse_profile_csv(csv_path).executions if e.accelerator_us is not None]
    except ProfileFormatError:
        return None
    return float(np.median(times)) / 1000 if times else None


def entropy_ranges(model: Path, calibration: list[Feed], cache: ArtifactCache,
                   symmetric: bool) -> dict[str, list[float]]:
    """Return {tensor: [rmin, rmax]} from onnxruntime's EntropyCalibrater with ENTROPY_NUM_BINS bins (cached)."""
    def build(out: Path) -> None:
        from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

        from harness.quantization.calibration import FeedReader

        with _private_copy(model, cache) as own:
            try:
                calibrator = create_calibrator(
                    own, None, augmented_model_path=str(own.parent / "augmented.onnx"),
                    calibrate_method=CalibrationMethod.Entropy,
                    extra_options={"num_bins": ENTROPY_NUM_BINS, "num_quantized_bins": ENTROPY_QUANTIZED_BINS,
                                   "symmetric": symmetric})
                calibrator.collect_data(FeedReader(calibration))
                data = calibrator.compute_data()
            except Exception as e:
                raise StepError(f"entropy calibration of {model.name} failed: {type(e).__name__}: {e}") from None
        ranges = {name: [float(np.asarray(v).ravel()[0]) for v in data[name].range_value] for name in data}
        (out / "ranges.json").write_text(json.dumps(ranges, indent=1, sort_keys=True))

    key = content_key("entropy-ranges-v1", model, feeds_digest(calibration), ENTROPY_NUM_BINS,
                      ENTROPY_QUANTIZED_BINS, symmetric)
    return json.loads((cache.entry("entropy_ranges", key, build).path / "ranges.json").read_text())


def with_entropy_ranges(recipe: QuantRecipe, model: Path, calibration: list[Feed],
                        cache: ArtifactCache) -> QuantRecipe:
    """Return recipe with the entropy ranges of every activation as rmin/rmax overrides; tensors the
    recipe already overrides (user encodings, 16-bit promotions) keep their overrides."""
    pinned = set(recipe.tensor_overrides) | set(recipe.encodings.get("activation_encodings", {}))
    ranges = entropy_ranges(model, calibration, cache, recipe.activation_symmetric)
    extra = {t: [{"rmin": lo, "rmax": hi}] for t, (lo, hi) in ranges.items() if t not in pinned and hi > lo}
    return replace(recipe, tensor_overrides={**extra, **recipe.tensor_overrides})


@contextlib.contextmanager
def _private_copy(model: Path, cache: ArtifactCache):
    """Yield a hard link (or copy) of model and its siblings in a directory of its own.

    onnxruntime's quantizer writes `<model>-inferred.onnx` beside its input and deletes it, so
    quantizations of one model path in parallel would race; the cache key is content-based, so the
    copy quantizes to the same cache entry.
    """
    with tempfile.TemporaryDirectory(prefix=".sweep-", dir=cache.root) as tmp:
        for src in Path(model).parent.iterdir():
            if src.is_file() and src.suffix != ".lock":
                link_or_copy(src, Path(tmp) / src.name)
        yield Path(tmp) / Path(model).name


def rank(candidates: list[Candidate]) -> list[Candidate]:
    """Return candidates best first: meeting the KPI (decisively), then undecided ones (an interval straddles a
    limit), then failing ones, each by the task metric's ratio to float where it has one, else by its drop from
    float (both in the metric's direction: a lower cer ranks first), then by cosine similarity."""
    def key(c: Candidate):
        if c.error is not None:
            return (3, 0.0, 0.0)
        ratio = c.kpis.get("task_metric_ratio")
        return (0 if c.meets else 1 if c.undecided else 2,
                c.kpis["task_metric_drop"] if ratio is None else -ratio, -c.kpis["cosine_similarity"])

    return sorted(candidates, key=key)


def evaluate_all(recipes: list[QuantRecipe], model: Path, dataset: Dataset, reference: list[Feed],
                 runner: DeviceRunner, thresholds: Thresholds, cache: ArtifactCache,
                 max_workers: int | None = None) -> tuple[list[Candidate], int]:
    """Evaluate recipes in parallel where the machine allows; return the ranked candidates and the
    number of workers used.

    The first recipe is evaluated alone: its run's latency_source decides whether the others'
    device runs overlap ('simulator': the HTP simulator runs on the machine's cores) or take turns
    (a device's single HTP, or when the first run told nothing).
    """
    runner.deploy()
    with tempfile.TemporaryDirectory(prefix="harness-sweep-") as tmp:
        push_feeds(runner.transport, dataset.evaluation, Path(tmp))  # staged once, before the threads share it
    push_lock = threading.Lock()
    first = evaluate_recipe(recipes[0], model, dataset, reference, runner, thresholds, cache, None, push_lock)
    device_lock = None if first.kpis.get("latency_source") == "simulator" else threading.Lock()
    rest = recipes[1:]
    workers = max(1, min(len(rest), max_workers or os.cpu_count() or 1))

    def one(recipe: QuantRecipe) -> Candidate:
        return evaluate_recipe(recipe, model, dataset, reference, runner, thresholds, cache, device_lock, push_lock)

    if workers == 1:
        return rank([first, *(one(r) for r in rest)]), 1
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sweep") as pool:
        return rank([first, *pool.map(one, rest)]), workers


def sweep(model: Path, dataset: Dataset, reference: list[Feed], runner: DeviceRunner, thresholds: Thresholds,
          cache: ArtifactCache, base: QuantRecipe, mode: str, max_workers: int | None = None,
          ptq_result: Candidate | None = None, best_case: dict | None = None) -> tuple[StepReport, list[Candidate]]:
    """Return the sweep report and the ranked candidates; the step fails, listing what was tried,
    when no candidate meets the model's KPI. When even a candidate identical to float could not be shown to meet
    it on these samples (undecidable: ptq_result, base's PTQ candidate, against best_case), no candidate is
    evaluated and the step is inconclusive, saying how many samples would decide."""
    why = undecidable(ptq_result, thresholds, best_case) if ptq_result is not None else None
    if why is not None:
        return _sweep_not_run(mode, len(dataset.evaluation), ptq_result, thresholds, why), []
    recipes = candidate_recipes(mode, base)
    start = time.perf_counter()
    candidates, workers = evaluate_all(recipes, model, dataset, reference, runner, thresholds, cache, max_workers)
    report = StepReport("sweep")
    best = next((c for c in candidates if c.error is None), None)
    report.kpis = {"mode": mode, "runtime": "htp", "samples": len(dataset.evaluation),
                   "candidates": [c.summary() for c in candidates],
                   "best": best.name if best else None,
                   "best_meets_kpi": bool(best and best.meets),
                   "candidates_meeting_kpi": sum(c.meets for c in candidates),
                   "candidates_failed": sum(c.error is not None for c in candidates),
                   "candidates_from_cache": sum(bool(c.kpis.get("cached")) for c in candidates),
                   "parallel_workers": workers, "wall_s": time.perf_counter() - start}
    if best is not None:
        report.kpis.update(headline_kpis(best.kpis))
    report.kpis["candidates_undecided"] = sum(c.undecided for c in candidates)
    report.limits = accuracy_limits(thresholds)
    report.tables["candidates"] = [c.summary() for c in candidates]
    if not any(c.meets for c in candidates):
        tried = " | ".join(c.describe() for c in candidates)
        rules = "; ".join(str(lim) for lim in report.limits)
        if any(c.undecided for c in candidates):
            report.inconclusive.append(
                f"no candidate of the '{mode}' sweep met the KPI decisively ({rules}); "
                f"{sum(c.undecided for c in candidates)} could not be decided on {len(dataset.evaluation)} "
                f"samples; tried: {tried}")
        else:
            report.failures.append(f"no candidate of the '{mode}' sweep met the KPI ({rules}); tried: {tried}")
    judge(report)
    report.notes.extend(dataset.warnings)
    if best is not None:
        report.artifacts["best_model"] = best.model
    return report, candidates


def headline_kpis(kpis: dict[str, Any]) -> dict[str, Any]:
    """Return the accuracy KPIs a sweep report carries from one candidate's (the best's, or PTQ's when the sweep
    did not run): the task metric, its drop (and ratio, with an evaluation section only), cosine, SQNR, intervals."""
    return {name: kpis.get(name) for name in ("task_metric_name", "task_metric", "float_task_metric",
                                               "task_metric_drop", "task_metric_ratio", "cosine_similarity",
                                               "sqnr_db", "intervals")
            if name in kpis or name != "task_metric_ratio"}


def _sweep_not_run(mode: str, samples: int, ptq_result: Candidate, thresholds: Thresholds,
                   why: tuple[list[str], int | None, list[str]]) -> StepReport:
    """Return the inconclusive report of a sweep whose candidates no evaluation here could decide (PTQ's KPIs)."""
    undecided, _, sentences = why
    report = StepReport("sweep")
    report.limits = accuracy_limits(thresholds)
    report.kpis = {"mode": mode, "runtime": "htp", "samples": samples, "candidates": [], "best": None,
                   "best_meets_kpi": False, "candidates_meeting_kpi": 0, "candidates_failed": 0,
                   "candidates_undecided": 0, "search": "not run", **headline_kpis(ptq_result.kpis)}
    report.inconclusive.append(
        f"the '{mode}' sweep did not run: on {samples} evaluation samples even a model identical to float leaves "
        f"{', '.join(undecided)} undecided, so no candidate could be shown to meet it (PTQ's {ptq_result.name} "
        f"fails no limit): " + "; ".join(sentences))
    return report
