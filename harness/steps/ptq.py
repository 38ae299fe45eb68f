"""Step 3, stage 2: post-training quantization with onnxruntime's QNN QDQ config, run on the HTP."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx

from harness import stats
from harness.cache import ArtifactCache, content_key
from harness.files import content_digest
from harness.data import Dataset, Feed, feeds_digest
from harness.errors import StepError
from harness.kpi import INTERVALS_KEY, Interval, Limit
from harness.metrics import cosine_from_sums, cosine_similarity, mean_abs_error, sample_sums, sqnr_db, sqnr_from_sums
from harness.models import Thresholds
from harness.quantization.overrides import recipe_overrides
from harness.quantization.prequantized import check_generated, quantized_nodes
from harness.runner.client import DeviceRunner, HtpRefusedError
from harness.steps.inference import (accuracy_limits, host_qdq_run, judged, reference_warning, stacked,
                                     task_metric, task_outcomes)
from harness.steps.report import StepReport

MATH_ERROR_COSINE = 0.9  # the seed's rule: below, a math/graph error; above, precision loss


@dataclass(frozen=True)
class QuantRecipe:
    """How to quantize: the knobs of onnxruntime's get_qnn_qdq_config."""

    calibrate_method: str = "MinMax"  # MinMax | Entropy | Percentile | Distribution
    activation_type: str = "QUInt8"  # QUInt8 | QUInt16 | QInt8 | QInt16
    weight_type: str = "QUInt8"
    per_channel: bool = False
    activation_symmetric: bool = False
    weight_symmetric: bool | None = None
    tensor_overrides: dict = field(default_factory=dict)  # JSON-friendly: {"t": [{"quant_type": "QUInt16"}]}
    encodings: dict = field(default_factory=dict)  # a QAIRT --quantization_overrides document to apply
    encodings_file: str = ""  # where `encodings` came from, for error messages
    label: str = ""  # appended to the name, e.g. 'mp2' for a mixed-precision step

    @property
    def name(self) -> str:
        """A readable id, e.g. 'MinMax-a8-w8-pt'."""
        bits = {"QUInt8": "8", "QInt8": "8s", "QUInt16": "16", "QInt16": "16s", "QUInt4": "4", "QInt4": "4s"}
        return (f"{self.calibrate_method}-a{bits[self.activation_type]}-w{bits[self.weight_type]}-"
                f"{'pc' if self.per_channel else 'pt'}{'-sym' if self.activation_symmetric else ''}"
                f"{'+overrides' if self.encodings else ''}{'+' + self.label if self.label else ''}")


def quantize(model: Path, calibration: list[Feed], recipe: QuantRecipe, cache: ArtifactCache) -> Path:
    """Return the cached QDQ model quantized from model with recipe and the calibration feeds, checked valid
    (prequantized.check_generated); raise StepError for a model that is quantized already (never twice)."""
    overrides = recipe_overrides(model, recipe.encodings, recipe.encodings_file, recipe.tensor_overrides,
                                 recipe.activation_type, recipe.weight_type)
    key = content_key("qdq-v2", model, feeds_digest(calibration), asdict(recipe))

    def build(out: Path) -> None:
        from onnxruntime.quantization import CalibrationMethod, QuantType
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

        from harness.quantization.calibration import FeedReader

        try:
            config = get_qnn_qdq_config(
                str(model), FeedReader(calibration),
                calibrate_method=CalibrationMethod[recipe.calibrate_method],
                activation_type=QuantType[recipe.activation_type], weight_type=QuantType[recipe.weight_type],
                per_channel=recipe.per_channel, activation_symmetric=recipe.activation_symmetric,
                weight_symmetric=recipe.weight_symmetric, init_overrides=overrides or None)
            with _quiet_preprocess_hint():
                _quantize_static(model, out / "model.onnx", config, calibration, cache)
        except Exception as e:
            raise StepError(f"quantizing {model.name} with {recipe.name} failed: {type(e).__name__}: {e}") from None
        check_generated(out / "model.onnx", f"{model.name} quantized with {recipe.name}")

    if quantized := _quantized_nodes(content_digest(model), str(model)):
        raise StepError(f"{model} is quantized already ({len(quantized)} node(s) such as {quantized[0][0]} "
                        f"({quantized[0][1]})): the harness quantizes nothing twice; its own encodings are used")
    return cache.entry("qdq", key, build).path / "model.onnx"


@functools.lru_cache(maxsize=256)
def _quantized_nodes(digest: str, model: str) -> tuple[tuple[str, str], ...]:
    """Return (name, op type) of the quantized nodes of the model at path model whose content has digest: once per
    content (the sweep's and the precision search's candidates quantize the same float model, 90 MB for
    paraphrase_minilm, whose parse took 0.2 s each time)."""
    return tuple((n.name, n.op_type) for n in quantized_nodes(onnx.load(model, load_external_data=False)))


# onnxruntime's calibrator options that change the ranges it computes (quantize_static's calib_extra_options)
_CALIBRATION_OPTIONS = ("CalibTensorRangeSymmetric", "CalibMovingAverage", "CalibMovingAverageConstant",
                        "CalibPercentile", "CalibStridedMinMax", "SmoothQuant", "SmoothQuantAlpha")


def _quantize_static(model: Path, output: Path, config, calibration: list[Feed], cache: ArtifactCache) -> None:
    """Quantize model to output with onnxruntime's StaticQuantConfig, calibrating once per (model, data, method,
    calibrator options): the ranges go to onnxruntime's own calibration cache (calibration_cache_path) in the
    artifact cache, so recipes that differ only in bit widths, per-channel weights or tensor overrides (the
    sweep's, mixed precision's candidates) reuse them instead of running the calibration data again."""
    from filelock import FileLock
    from onnxruntime.quantization import quantize_static

    options = config.extra_options or {}
    key = content_key("calibration-ranges-v1", model, feeds_digest(calibration), str(config.calibrate_method),
                      {k: options[k] for k in _CALIBRATION_OPTIONS if k in options},
                      sorted(config.op_types_to_quantize or []))
    ranges = cache.root / "calibration_ranges" / f"{key}.json"
    ranges.parent.mkdir(parents=True, exist_ok=True)

    def run(calibration_cache: Path) -> None:
        quantize_static(str(model), str(output), config.calibration_data_reader,
                        calibrate_method=config.calibrate_method, quant_format=config.quant_format,
                        activation_type=config.activation_type, weight_type=config.weight_type,
                        op_types_to_quantize=config.op_types_to_quantize,
                        nodes_to_quantize=config.nodes_to_quantize, nodes_to_exclude=config.nodes_to_exclude,
                        per_channel=config.per_channel, reduce_range=config.reduce_range,
                        use_external_data_format=config.use_external_data_format,
                        calibration_providers=config.calibration_providers, extra_options=config.extra_options,
                        calibration_cache_path=str(calibration_cache))

    if ranges.is_file():
        return run(ranges)
    with FileLock(str(ranges) + ".lock"):
        if ranges.is_file():
            return run(ranges)
        part = ranges.with_name(f".{key}.{os.getpid()}.part")  # onnxruntime writes it in place: renamed when whole
        try:
            run(part)
            os.replace(part, ranges)
        finally:
            part.unlink(missing_ok=True)


@contextlib.contextmanager
def _quiet_preprocess_hint():
    """Drop onnxruntime's 'consider pre-processing' hint: conversion already ran QNN preprocessing."""
    class _Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "pre-process" not in record.getMessage()

    drop = _Drop()
    root = logging.getLogger()
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)


def compare_quantized(outputs: list[Feed], reference: list[Feed], dataset: Dataset,
                      float_metric: tuple[str, float]) -> dict:
    """Return the KPIs of quantized outputs against the float reference, with the 95 % intervals of the
    task metric, its drop, cosine similarity and SQNR over the samples (kpis["intervals"], see
    accuracy_intervals); with the model spec's evaluation section, the task metric is its metric on its labels,
    with its ratio to float (harness.evaluation.task)."""
    ref, out = stacked(reference), stacked(outputs, reference)
    cos = cosine_similarity(ref, out)
    if dataset.task is not None:
        task = dataset.task.compare(outputs, reference, dataset.labels)
        intervals = {**task.pop(INTERVALS_KEY), **output_intervals(outputs, reference)}
    else:
        name, value = task_metric(outputs, dataset, reference)
        task = {"task_metric_name": name, "task_metric": value, "float_task_metric": float_metric[1],
                "task_metric_drop": float_metric[1] - value}
        intervals = accuracy_intervals(outputs, reference, dataset)
    return {
        **task,
        "cosine_similarity": cos,
        "sqnr_db": sqnr_db(ref, out),
        "mae": mean_abs_error(ref, out),
        "diagnosis": ("likely math/graph error (cosine similarity < 0.9): isolate layer by layer"
                      if cos < MATH_ERROR_COSINE else "precision loss (cosine similarity >= 0.9): tune encodings"),
        INTERVALS_KEY: intervals,
    }


def output_intervals(outputs: list[Feed], reference: list[Feed]) -> dict[str, dict]:
    """Return {kpi: Interval.as_dict()} of cosine similarity and SQNR: a bootstrap over samples."""
    sums = sample_sums([list(r.values()) for r in judged(reference)],
                       [list(o.values()) for o in judged(outputs, reference)])
    return {"cosine_similarity": stats.bootstrap_of_sums(sums, cosine_from_sums, bounds=(-1.0, 1.0)).as_dict(),
            "sqnr_db": stats.bootstrap_of_sums(sums, sqnr_from_sums).as_dict()}


def accuracy_intervals(outputs: list[Feed], reference: list[Feed], dataset: Dataset) -> dict[str, dict]:
    """Return {kpi: Interval.as_dict()} over the evaluation samples: Wilson for a task metric that is a share of
    samples (accuracy, agreement), its drop as 1 - agreement or, with labels, Newcombe's paired difference of the
    float and quantized accuracies; a bootstrap over samples for cosine similarity and SQNR (and for the task
    metric when it is the cosine)."""
    n = len(outputs)
    intervals = output_intervals(outputs, reference)
    name, outcomes = task_outcomes(outputs, dataset, reference)
    if outcomes is None:
        cosine = Interval.from_dict(intervals["cosine_similarity"])
        metric, drop = cosine, stats.complement(cosine)
    elif name == "top1_accuracy":
        metric = stats.wilson(int(outcomes.sum()), n)
        drop = stats.difference_of_proportions(task_outcomes(reference, dataset, reference)[1], outcomes)
    else:
        metric = stats.wilson(int(outcomes.sum()), n)
        drop = stats.complement(metric)
    return {"task_metric": metric.as_dict(), "task_metric_drop": drop.as_dict(), **intervals}


def best_case(dataset: Dataset, reference: list[Feed]) -> dict:
    """Return the KPIs, with their intervals, of a quantized model whose outputs equal float's on every sample:
    the best evidence these samples can give (a limit it leaves undecided, no candidate can decide)."""
    return compare_quantized(reference, reference, dataset, task_metric(reference, dataset, reference))


def resolvable_drop(best: dict) -> float | None:
    """Return the smallest task-metric drop the evaluation samples can resolve: the upper bound of the drop's
    interval for a model identical to float (best: best_case's KPIs), or None without one."""
    interval = (best.get(INTERVALS_KEY) or {}).get("task_metric_drop")
    return None if interval is None else float(interval["high"])


def resolution_note(best: dict, limits: list[Limit], inference_s: float | None = None) -> str | None:
    """Return the note that the evaluation samples leave a limit undecided even for a model identical to float
    (best: best_case's KPIs), with about how many samples would decide it and their device time per pass at
    inference_s; None when the samples can decide every limit."""
    best = {**best, INTERVALS_KEY: dict(best.get(INTERVALS_KEY) or {})}
    sentences = stats.unresolved(best, limits)
    if not sentences:
        return None
    needed = max((i.get("needed") or 0 for i in best[INTERVALS_KEY].values()), default=0)
    cost = (f"; {needed} samples are about {needed * inference_s:.0f} s of device time per pass at "
            f"{inference_s:.3g} s per inference" if needed and inference_s else "")
    return ("even a model identical to float on every evaluation sample would leave a limit undecided (a result "
            "within it shows as inconclusive): " + "; ".join(sentences) + cost)


def judge(report: StepReport) -> StepReport:
    """Add to report's inconclusive reasons one sentence per limit its KPI's interval straddles (with the samples
    needed) and return it."""
    report.inconclusive.extend(stats.unresolved(report.kpis, report.limits))
    return report


def interval_rows(kpis: dict) -> list[dict]:
    """Return one table row per KPI with an interval: value, low, high, samples n, method and samples needed."""
    return [{"kpi": kpi, "value": kpis.get(kpi), "low": i["low"], "high": i["high"], "n": i["samples"],
             "method": i["method"], "needed": i.get("needed")}
            for kpi, i in (kpis.get(INTERVALS_KEY) or {}).items()]


def ptq(qdq_model: Path, recipe: QuantRecipe, dataset: Dataset, reference: list[Feed], runner: DeviceRunner,
        thresholds: Thresholds, inference_s: float | None = None, best: dict | None = None) -> StepReport:
    """Return the PTQ report: the QDQ model on the device's `htp` runtime against the float reference, each
    limit judged on its KPI's 95 % interval (inconclusive, saying how many samples would resolve it, when the
    interval straddles the limit); inference_s (one inference's device time) sizes the resolution note; best is
    best_case(dataset, reference) when the caller has it."""
    with ThreadPoolExecutor(1, thread_name_prefix="host-qdq") as pool:  # the host's QDQ run overlaps the device's
        host_run = pool.submit(host_qdq_run, qdq_model, dataset.evaluation) if dataset.task is not None else None
        try:
            run = runner.run(qdq_model, dataset.evaluation, "htp")
        except HtpRefusedError as e:  # name the refused nodes, not the runner's exit code
            raise StepError(f"the quantized model {e.summary}") from None
        host_outputs = host_run.result() if host_run is not None else None
    report = StepReport("ptq")
    float_metric = task_metric(reference, dataset, reference)
    best = best if best is not None else best_case(dataset, reference)
    report.kpis = {"runtime": "htp", "recipe": recipe.name, "samples": len(run.outputs),
                   **compare_quantized(run.outputs, reference, dataset, float_metric),
                   "resolvable_drop": resolvable_drop(best),
                   "latency_source": run.latency_source,
                   "mean_inference_ms": 1000 * float(np.mean(run.inference_s)) if run.inference_s else None,
                   "htp_nodes": sum(p.on_htp for p in run.placement)}
    report.limits = accuracy_limits(thresholds)
    if host_outputs is not None:  # the loss in the host's QDQ emulation beside the HTP's: is a miss the HTP's own?
        host = dataset.task.compare(host_outputs, reference, dataset.labels)
        report.kpis.update({"host_qdq_task_metric": host["task_metric"],
                            "host_qdq_task_metric_ratio": host["task_metric_ratio"],
                            "host_qdq_cosine_similarity": cosine_similarity(stacked(reference),
                                                                            stacked(host_outputs, reference))})
    if (note := resolution_note(best, report.limits, inference_s)) is not None:
        report.notes.append(note)
    report.notes.extend(dataset.warnings)
    if (degenerate := reference_warning(reference)) is not None:
        report.notes.append(degenerate)
    if report.kpis["cosine_similarity"] < MATH_ERROR_COSINE:
        report.notes.append(report.kpis["diagnosis"])
    judge(report)
    report.tables["intervals"] = interval_rows(report.kpis)
    report.artifacts["qdq_model"] = qdq_model
    return report
