"""Step 7, end-to-end task accuracy: the deployable context binary on the device over the evaluation set
(sized by its own, larger budget than the accuracy steps'), its task metric and its drop against the float
model's on the host, each limit judged on its KPI's 95 % interval."""

from __future__ import annotations

from harness.data import Dataset, Feed
from harness.models import Thresholds
from harness.runner.client import DeviceRunner
from harness.steps.context_binary import ContextBinary
from harness.steps.inference import accuracy_limits, task_metric
from harness.steps.ptq import best_case, compare_quantized, interval_rows, judge, resolution_note, resolvable_drop
from harness.steps.report import StepReport


def validation_accuracy(ctx: ContextBinary, dataset: Dataset, reference: list[Feed], runner: DeviceRunner,
                        thresholds: Thresholds, deployed: str, inference_s: float | None = None) -> StepReport:
    """Return the report of the context binary run on the device's HTP over every evaluation sample of dataset
    against the float reference (deployed: which quantized model the binary was compiled from), each limit
    judged on its KPI's interval; inference_s (one inference's device time) sizes the resolution note."""
    run = runner.run(ctx.model, dataset.evaluation, "htp")
    report = StepReport("validation_accuracy")
    report.kpis = {"artifact": ctx.model.name, "deployed_model": deployed, "runtime": "htp",
                   "samples": len(run.outputs), "dataset": dataset.description,
                   **compare_quantized(run.outputs, reference, dataset, task_metric(reference, dataset, reference)),
                   "executed_on": run.latency_source}
    report.kpis.pop("diagnosis", None)
    best = best_case(dataset, reference)
    report.kpis["resolvable_drop"] = resolvable_drop(best)
    report.limits = accuracy_limits(thresholds, sqnr=False)
    if (note := resolution_note(best, report.limits, inference_s)):
        report.notes.append(note)
    report.notes.extend(dataset.warnings)
    report.notes.extend(run.notes)
    judge(report)
    report.tables["intervals"] = interval_rows(report.kpis)
    return report
