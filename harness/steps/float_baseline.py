"""Step 3, stage 1: the float model on the device's CPU runtime against the host reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.data import Dataset, Feed
from harness.kpi import Limit
from harness.metrics import cosine_similarity, max_abs_diff
from harness.models import Thresholds
from harness.runner.client import DeviceRunner
from harness.steps.inference import stacked, task_metric
from harness.steps.report import StepReport


def float_baseline(model: Path, dataset: Dataset, reference: list[Feed], runner: DeviceRunner,
                   thresholds: Thresholds) -> StepReport:
    """Return the float-baseline report: device `cpu` outputs vs host reference, and the task metric."""
    run = runner.run(model, dataset.evaluation, "cpu")
    worst = 0.0
    mismatched = 0
    for ref, out in zip(reference, run.outputs):
        for name, r in ref.items():
            o = out[name]
            excess = np.abs(o - r) - (thresholds.float_atol + thresholds.float_rtol * np.abs(r))
            worst = max(worst, float(excess.max(initial=0.0)))
            mismatched += int(np.count_nonzero(excess > 0))
    name, value = task_metric(run.outputs, dataset, reference)
    ref_name, ref_value = task_metric(reference, dataset, reference)
    report = StepReport("float_baseline")
    report.kpis = {
        "runtime": "cpu",
        "samples": len(run.outputs),
        "max_abs_diff": max_abs_diff(stacked(reference), stacked(run.outputs, reference)),
        "elements_out_of_tolerance": mismatched,
        "cosine_similarity": cosine_similarity(stacked(reference), stacked(run.outputs, reference)),
        "task_metric_name": name,
        "task_metric": value,
        "host_task_metric": ref_value,
        "tolerance": {"atol": thresholds.float_atol, "rtol": thresholds.float_rtol},
        "mean_inference_ms": 1000 * float(np.mean(run.inference_s)) if run.inference_s else None,
    }
    lower_is_better = dataset.task is not None and not dataset.task.metric.higher_is_better  # cer: at most host's
    report.limits = [Limit("elements_out_of_tolerance", maximum=0, marginal=0.0),
                     Limit("task_metric", minimum=None if lower_is_better else ref_value - 1e-9,
                           maximum=ref_value + 1e-9 if lower_is_better else None, marginal=0.0)]
    report.notes.extend(dataset.warnings)
    return report
