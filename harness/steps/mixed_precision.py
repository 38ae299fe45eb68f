"""Step 3, stage 5: mixed precision, promoting the most sensitive activations to 16 bits.

Starting from an 8-bit recipe, the activations error isolation ranked most sensitive are given
16 bits through onnxruntime's QNN tensor overrides (`{"tensor": [{"quant_type": QUInt16}]}`; the
QNN QDQ config inserts the 8↔16-bit conversions around them) in steps of 1, 2, 4, ... tensors,
until the model's KPI is met or the budget of promoted tensors is spent. A tensor the quantizer
folds into another (a Conv output feeding a removed Relu) is promoted with it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness.cache import ArtifactCache
from harness.data import Dataset, Feed
from harness.models import Thresholds
from harness.runner.client import DeviceRunner
from harness.steps.report import StepReport
from harness.steps.sweep import Candidate, accuracy_limits, evaluate_recipe, rank

PROMOTED_TYPE = "QUInt16"


def promotion_schedule(budget: int, available: int) -> list[int]:
    """Return the cumulative numbers of tensors to promote: 1, 2, 4, ... capped by budget and available."""
    limit = min(budget, available)
    counts, k = [], 1
    while k < limit:
        counts.append(k)
        k *= 2
    if limit > 0:
        counts.append(limit)
    return counts


def pinned_tensors(candidate: Candidate) -> set[str]:
    """Return the tensors whose encodings the user fixed with --quantization-overrides."""
    return set(candidate.recipe.encodings.get("activation_encodings", {}))


def mixed_precision(model: Path, dataset: Dataset, reference: list[Feed], runner: DeviceRunner,
                    thresholds: Thresholds, cache: ArtifactCache, start: Candidate,
                    units: list[list[str]]) -> StepReport:
    """Return the mixed-precision report: which tensors were promoted from start's 8-bit recipe, the
    KPIs reached and what it cost (model size, simulated run time). artifacts['model'] is the result."""
    if not start.kpis and start.error is None:
        start = evaluate_recipe(start.recipe, model, dataset, reference, runner, thresholds, cache)
    pinned = pinned_tensors(start)
    units = [u for u in units if not pinned.intersection(u)]
    budget = thresholds.max_promoted_tensors
    tried: list[tuple[list[list[str]], Candidate]] = [([], start)]
    if not start.meets:
        for count in promotion_schedule(budget, len(units)):
            chosen = units[:count]
            overrides = {**start.recipe.tensor_overrides,
                         **{t: [{"quant_type": PROMOTED_TYPE}] for unit in chosen for t in unit}}
            recipe = replace(start.recipe, tensor_overrides=overrides, label=f"mp{count}")
            candidate = evaluate_recipe(recipe, model, dataset, reference, runner, thresholds, cache)
            tried.append((chosen, candidate))
            if candidate.meets:
                break
    met = [(u, c) for u, c in tried if c.meets]
    promoted, final = met[0] if met else _best(tried)
    report = StepReport("mixed_precision")
    report.tables["steps"] = [_step_row(u, c) for u, c in tried]
    report.limits = accuracy_limits(thresholds)
    if final.error is not None:
        report.failures.append(f"mixed precision could not evaluate any recipe: {final.describe()}")
        return report
    base, k = start.kpis, final.kpis
    report.kpis = {
        "runtime": "htp", "start_recipe": start.name, "final_recipe": final.name,
        "promoted": [u[-1] for u in promoted], "promoted_tensors": [t for u in promoted for t in u],
        "promoted_count": len(promoted), "budget": budget, "met_threshold": final.meets,
        "start_met_threshold": start.meets,
        "task_metric_name": k["task_metric_name"], "task_metric": k["task_metric"],
        "task_metric_drop": k["task_metric_drop"], "cosine_similarity": k["cosine_similarity"],
        "sqnr_db": k["sqnr_db"], "start_task_metric": base.get("task_metric"),
        "start_cosine_similarity": base.get("cosine_similarity"),
        "model_bytes": k["model_bytes"], "model_bytes_start": base.get("model_bytes"),
        "model_bytes_increase_pct": _pct(k["model_bytes"], base.get("model_bytes")),
        "mean_inference_ms": k["mean_inference_ms"], "mean_inference_ms_start": base.get("mean_inference_ms"),
        "inference_time_increase_pct": _pct(k["mean_inference_ms"], base.get("mean_inference_ms")),
        "latency_source": k.get("latency_source"),  # the final candidate's run (RunResult.latency_source)
    }
    if not final.meets:
        report.failures.append(
            f"promoting up to {min(budget, len(units))} of the most sensitive activations to 16 bits "
            f"(budget {budget}) did not meet the KPI; tried: "
            + " | ".join(f"{len(u)} promoted {[x[-1] for x in u]}: {c.describe()}" for u, c in tried))
    report.notes.extend(dataset.warnings)
    report.artifacts["model"] = final.model
    return report


def _best(tried: list[tuple[list[list[str]], Candidate]]) -> tuple[list[list[str]], Candidate]:
    ranked = rank([c for _, c in tried])
    return next((u, c) for u, c in tried if c is ranked[0])


def _pct(value: float | None, start: float | None) -> float | None:
    if value is None or not start:
        return None
    return 100.0 * (value - start) / start


def _step_row(units: list[list[str]], c: Candidate) -> dict:
    return {"promoted_count": len(units), "promoted": ";".join(u[-1] for u in units), **c.summary()}
