"""The task metric of each device × model × precision beside float's (the KPI a model spec's `evaluation:`
section sets): one row per accuracy step that measured it, with the ratio to float, its interval and sample
count, from the step records alone; for a language model (kind llm) its held-out perplexity on the HTP per
recipe beside float's, the ratio float / quantized (lower is better), the shipped recipe's with its interval."""

from __future__ import annotations

from dataclasses import dataclass

from harness.kpi import Interval, interval_of
from harness.signoff.inputs import RunSet

# The steps that measure a quantized model's task metric on the device, in pipeline order, and what names the
# precision each measured (a KPI of its record)
TASK_STEPS = {"ptq": "recipe", "sweep": "best", "mixed_precision": "promoted_tensor_count",
              "aimet_recovery": "technique", "validation_accuracy": "deployed_model"}


@dataclass(frozen=True)
class TaskRow:
    """One device × model × precision: the task metric quantized and float, the ratio with its interval."""

    device: str
    soc: str
    model: str
    step: str
    precision: str
    metric: str
    value: float | None
    float_value: float | None
    ratio: float | None
    interval: Interval | None
    samples: int | None
    outcome: str


def _precision(step: str, kpis: dict) -> str:
    """What the step measured: the recipe, the sweep's best candidate, the promoted tensors, the deployed model."""
    named = kpis.get(TASK_STEPS[step])
    if step == "mixed_precision":
        return f"mixed ({named} activations at 16 bits)" if named is not None else "mixed"
    return str(named) if named not in (None, "") else step


def task_rows(runs: RunSet) -> list[TaskRow]:
    """Return a row per device × model × accuracy step whose record carries a task metric (none without an
    evaluation section), float first: the float model on the device's CPU against the host's."""
    rows = []
    for device, soc, model in runs.targets():
        baseline = runs.result(device, model, "float_baseline")
        host_float = baseline.kpis.get("host_task_metric") if baseline is not None else None
        if baseline is not None and baseline.kpis.get("task_metric_name"):
            k = baseline.kpis
            rows.append(TaskRow(device, soc, model, "float_baseline", "float (device CPU)", k["task_metric_name"],
                                k.get("task_metric"), host_float, None, None, k.get("samples"), baseline.outcome))
        for step in TASK_STEPS:
            record = runs.result(device, model, step)
            if record is None or not record.kpis.get("task_metric_name"):
                continue
            k = record.kpis
            ratio = interval_of(k, "task_metric_ratio")
            rows.append(TaskRow(device, soc, model, step, _precision(step, k), k["task_metric_name"],
                                k.get("task_metric"), k.get("float_task_metric", host_float),
                                k.get("task_metric_ratio"), ratio,
                                ratio.samples if ratio is not None else k.get("samples"), record.outcome))
        rows.extend(_perplexity_rows(runs, device, soc, model))
    return rows


def _perplexity_rows(runs: RunSet, device: str, soc: str, model: str) -> list[TaskRow]:
    """Return the llm_accuracy record's perplexity rows: one per recipe (those the host's QDQ run
    already failed not run on the HTP), the shipped one's
    ratio interval from its perplexity_increase interval (ratio = 1 / (1 + increase))."""
    record = runs.result(device, model, "llm_accuracy")
    if record is None or record.kpis.get("perplexity_float_host") is None:
        return []
    k, rows = record.kpis, []
    floating, windows = k["perplexity_float_host"], k.get("eval_windows")
    increase = interval_of(k, "perplexity_increase")
    for recipe, figures in (k.get("sweep") or {k.get("recipe"): {"perplexity_htp": k.get("perplexity_htp")}}).items():
        value = figures.get("perplexity_htp")
        shipped = recipe == k.get("recipe")
        interval = (Interval(1.0 / (1.0 + increase.high), 1.0 / (1.0 + increase.low), increase.samples,
                             increase.method, increase.confidence) if shipped and increase is not None else None)
        rows.append(TaskRow(device, soc, model, "llm_accuracy", f"{recipe}{' (shipped)' if shipped else ''}",
                            "perplexity", value, floating, floating / value if value else None, interval,
                            windows, record.outcome if shipped else "measured" if value else "host QDQ failed"))
    return rows
