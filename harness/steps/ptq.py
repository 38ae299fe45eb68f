"""Step 3, stage 2: post-training quantization with onnxruntime's QNN QDQ config, run on the HTP."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from harness.cache import ArtifactCache, content_key
from harness.data import Dataset, Feed, feeds_digest
from harness.errors import StepError
from harness.kpi import Limit
from harness.metrics import cosine_similarity, mean_abs_error, sqnr_db
from harness.models import Thresholds
from harness.runner.client import DeviceRunner, HtpRefusedError
from harness.steps.inference import reference_warning, stacked, task_metric
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
    """Return the cached QDQ model quantized from model with recipe and the calibration feeds."""
    from harness.encodings import recipe_overrides

    overrides = recipe_overrides(model, recipe.encodings, recipe.encodings_file, recipe.tensor_overrides,
                                 recipe.activation_type)
    key = content_key("qdq-v1", model, feeds_digest(calibration), asdict(recipe))

    def build(out: Path) -> None:
        from onnxruntime.quantization import CalibrationMethod, QuantType, quantize as ort_quantize
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

        from harness.calibration import FeedReader

        try:
            config = get_qnn_qdq_config(
                str(model), FeedReader(calibration),
                calibrate_method=CalibrationMethod[recipe.calibrate_method],
                activation_type=QuantType[recipe.activation_type], weight_type=QuantType[recipe.weight_type],
                per_channel=recipe.per_channel, activation_symmetric=recipe.activation_symmetric,
                weight_symmetric=recipe.weight_symmetric, init_overrides=overrides or None)
            with _quiet_preprocess_hint():
                ort_quantize(str(model), str(out / "model.onnx"), config)
        except Exception as e:
            raise StepError(f"quantizing {model.name} with {recipe.name} failed: {type(e).__name__}: {e}") from None

    return cache.entry("qdq", key, build).path / "model.onnx"


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
    """Return the KPIs of quantized outputs against the float reference."""
    name, value = task_metric(outputs, dataset, reference)
    float_name, float_value = float_metric
    cos = cosine_similarity(stacked(reference), stacked(outputs))
    return {
        "task_metric_name": name,
        "task_metric": value,
        "float_task_metric": float_value,
        "task_metric_drop": float_value - value,
        "cosine_similarity": cos,
        "sqnr_db": sqnr_db(stacked(reference), stacked(outputs)),
        "mae": mean_abs_error(stacked(reference), stacked(outputs)),
        "diagnosis": ("likely math/graph error (cosine similarity < 0.9): isolate layer by layer"
                      if cos < MATH_ERROR_COSINE else "precision loss (cosine similarity >= 0.9): tune encodings"),
    }


def ptq(qdq_model: Path, recipe: QuantRecipe, dataset: Dataset, reference: list[Feed], runner: DeviceRunner,
        thresholds: Thresholds) -> StepReport:
    """Return the PTQ report: the QDQ model on the device's `htp` runtime against the float reference."""
    try:
        run = runner.run(qdq_model, dataset.evaluation, "htp")
    except HtpRefusedError as e:  # name the refused nodes, not the runner's exit code
        raise StepError(f"the quantized model {e.summary}") from None
    report = StepReport("ptq")
    float_metric = task_metric(reference, dataset, reference)
    report.kpis = {"runtime": "htp", "recipe": recipe.name, "samples": len(run.outputs),
                   **compare_quantized(run.outputs, reference, dataset, float_metric),
                   "latency_source": run.latency_source,
                   "mean_inference_ms": 1000 * float(np.mean(run.inference_s)) if run.inference_s else None,
                   "htp_nodes": sum(p.on_htp for p in run.placement)}
    report.limits = [Limit("task_metric_drop", maximum=thresholds.max_task_metric_drop),
                     Limit("cosine_similarity", minimum=thresholds.min_cosine_similarity),
                     Limit("sqnr_db", minimum=thresholds.min_sqnr_db)]
    report.notes.extend(dataset.warnings)
    if (degenerate := reference_warning(reference)) is not None:
        report.notes.append(degenerate)
    if report.kpis["cosine_similarity"] < MATH_ERROR_COSINE:
        report.notes.append(report.kpis["diagnosis"])
    report.artifacts["qdq_model"] = qdq_model
    return report
