"""The regression step: this run's KPIs for one device × model against a saved baseline (--baseline DIR).

Which KPI is compared by which rule (RULES; the rules themselves are in harness.baseline):

* accuracy, higher is better, by an absolute tolerance: ptq's and validation_accuracy's ``task_metric``
  and ``cosine_similarity`` (``regression_accuracy_tolerance``), ``sqnr_db`` (``regression_sqnr_tolerance_db``);
* latency: profile's ``latency_samples_ms``, Mann-Whitney U at ``regression_alpha`` and the medians'
  relative change beyond ``regression_latency_threshold`` (reported as ``latency_ms.p50``);
* lower is better, by a relative threshold: profile's ``peak_rss_mb`` (``regression_memory_threshold``),
  context_binary's ``context_bytes`` (``regression_size_threshold``), energy's ``energy_per_inference_mj``
  (``regression_energy_threshold``);
* every step's ``outcome``: one that passed in the baseline and fails now regresses.

A regressed KPI fails the step, its message giving both values; `new` and `missing` KPIs (on one side only)
do not. A baseline of another model file or SoC is compared where both have a KPI, with a note saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from harness.baseline import (VERDICTS, BaselineError, KpiVerdict, Snapshot, compare_higher, compare_lower,
                              compare_outcome, compare_samples, load_baseline, model_sha256, snapshot)
from harness.models import Thresholds
from harness.steps.report import StepReport

if TYPE_CHECKING:
    from harness.cache import ArtifactCache
    from harness.pipeline import Target
    from harness.session import StepRecord


@dataclass(frozen=True)
class KpiRule:
    """How one KPI of one step is compared: kind is 'higher' (absolute tolerance), 'lower' (relative
    threshold) or 'samples' (Mann-Whitney U and a relative threshold); setting names the Thresholds field."""

    step: str
    kpi: str
    kind: str
    setting: str
    unit: str = ""
    source: str = ""  # the KPI holding the values when it is not kpi itself (latency: the samples)


_ACCURACY = [KpiRule(step, kpi, "higher", setting, unit)
             for step in ("ptq", "validation_accuracy")
             for kpi, setting, unit in (("task_metric", "regression_accuracy_tolerance", ""),
                                        ("cosine_similarity", "regression_accuracy_tolerance", ""),
                                        ("sqnr_db", "regression_sqnr_tolerance_db", "dB"))]
RULES: tuple[KpiRule, ...] = (
    *_ACCURACY,
    KpiRule("context_binary", "context_bytes", "lower", "regression_size_threshold", "bytes"),
    KpiRule("profile", "latency_ms.p50", "samples", "regression_latency_threshold", "ms",
            source="latency_samples_ms"),
    KpiRule("profile", "peak_rss_mb", "lower", "regression_memory_threshold", "MB"),
    KpiRule("energy", "energy_per_inference_mj", "lower", "regression_energy_threshold", "mJ"),
)


def _get(kpis: dict[str, Any] | None, dotted: str) -> Any:
    value: Any = kpis
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _kpi_value(snap: Snapshot, step: str, key: str, where: str, samples: bool = False) -> Any:
    """Return the KPI step.key of snap (None when the step or KPI is absent, or the step was skipped).
    Raises BaselineError naming `where` when the value is there but is not a number (or, for samples, a
    list of numbers)."""
    result = snap.steps.get(step)
    if result is None or result.outcome == "skipped":
        return None
    value = _get(result.kpis, key)
    if value is None:
        return None
    ok = (isinstance(value, list) and all(_number(v) for v in value)) if samples else _number(value)
    if not ok:
        kind = "a list of numbers" if samples else "a number"
        raise BaselineError(f"{where}: {step} KPI '{key}' is {str(value)[:80]!r}, not {kind}")
    return (value or None) if samples else value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _latency(baseline: Snapshot, current: Snapshot, rule: KpiRule, base_where: str,
             thresholds: Thresholds) -> KpiVerdict | None:
    """Latency: the samples' rule where both sides have samples; where both have latency_ms.p50 but a side
    has no samples (a baseline from before they were recorded), the relative threshold on p50 alone."""
    threshold = getattr(thresholds, rule.setting)
    base = _kpi_value(baseline, rule.step, rule.source, base_where, samples=True)
    cur = _kpi_value(current, rule.step, rule.source, "this run", samples=True)
    base_p50 = _kpi_value(baseline, rule.step, rule.kpi, base_where)
    cur_p50 = _kpi_value(current, rule.step, rule.kpi, "this run")
    if (base is None or cur is None) and base_p50 is not None and cur_p50 is not None:
        lacking = ("neither side has" if base is None and cur is None else
                   "the baseline has no" if base is None else "this run has no")
        return compare_lower(rule.step, rule.kpi, base_p50, cur_p50, threshold, rule.unit,
                             why=f"{lacking} {rule.source}, so the threshold alone decides")
    return compare_samples(rule.step, rule.kpi, base, cur, thresholds.regression_alpha, threshold, rule.unit)


def compare(baseline: Snapshot, current: Snapshot, thresholds: Thresholds,
            baseline_where: str = "the baseline") -> list[KpiVerdict]:
    """Return the verdicts of every KPI of RULES and every step's outcome that either side has, in step order
    (this run's steps first). Raises BaselineError naming baseline_where for a baseline KPI of the wrong type."""
    verdicts: list[KpiVerdict] = []
    for rule in RULES:
        setting = getattr(thresholds, rule.setting)
        if rule.kind == "samples":
            verdict = _latency(baseline, current, rule, baseline_where, thresholds)
        else:
            base = _kpi_value(baseline, rule.step, rule.kpi, baseline_where)
            cur = _kpi_value(current, rule.step, rule.kpi, "this run")
            compare_kind = compare_higher if rule.kind == "higher" else compare_lower
            verdict = compare_kind(rule.step, rule.kpi, base, cur, setting, rule.unit)
        if verdict is not None:
            verdicts.append(verdict)
    for step in [*current.steps, *(s for s in baseline.steps if s not in current.steps)]:
        base_step, cur_step = baseline.steps.get(step), current.steps.get(step)
        verdict = compare_outcome(step, base_step.outcome if base_step else None,
                                  cur_step.outcome if cur_step else None)
        if verdict is not None:
            verdicts.append(verdict)
    order = {step: i for i, step in enumerate([*current.steps, *baseline.steps])}
    return sorted(verdicts, key=lambda v: order.get(v.step, len(order)))  # stable: a step's rules keep their order


def mismatch_notes(baseline: Snapshot, current: Snapshot, path: Path) -> list[str]:
    """Return a note for each way the baseline is not of this device × model: another model file (by content
    hash), SoC, device or model name; the KPIs are still compared where both have them."""
    notes = []
    if baseline.model_sha256 != current.model_sha256:
        notes.append(f"the baseline {path} was saved from another model file (sha256 {baseline.model_sha256}; this "
                     f"run's is {current.model_sha256}): KPIs are compared only where both have them, and a changed "
                     "model may explain any difference")
    if baseline.soc != current.soc:
        notes.append(f"the baseline {path} was saved on SoC {baseline.soc}, this run is on {current.soc}: KPIs are "
                     "compared only where both have them, and the SoC may explain any difference")
    for what, base, cur in (("device", baseline.device, current.device), ("model", baseline.model, current.model)):
        if base != cur:
            notes.append(f"the baseline {path} names {what} '{base}', this run's is '{cur}'")
    return notes


def regression(baseline: Snapshot, path: Path, current: Snapshot, thresholds: Thresholds) -> StepReport:
    """Return the regression step's report for current against baseline (read from path): a `verdicts` KPI and
    table, the `regressed` KPI names, `counts` per verdict, and a failure per regressed KPI (or when no step of
    this run ran, so nothing could be compared)."""
    verdicts = compare(baseline, current, thresholds, baseline_where=f"the baseline {path}")
    report = StepReport("regression")
    rows = [v.as_dict() for v in verdicts]
    regressed = [v for v in verdicts if v.verdict == "regressed"]
    report.kpis = {
        "baseline_file": str(path),
        "baseline_saved_at": baseline.saved_at,
        "baseline_harness_version": baseline.harness_version,
        "baseline_soc": baseline.soc,
        "baseline_model_sha256": baseline.model_sha256,
        "model_sha256": current.model_sha256,
        "verdicts": rows,
        "regressed": [f"{v.step} {v.kpi}" for v in regressed],
        "counts": {name: sum(v.verdict == name for v in verdicts) for name in VERDICTS},
    }
    report.tables["verdicts"] = rows
    report.artifacts["baseline"] = path
    report.notes.extend(mismatch_notes(baseline, current, path))
    profile = current.steps.get("profile")
    if profile is not None and profile.kpis.get("latency_source") == "simulator" and any(
            v.step == "profile" and v.kpi == "latency_ms.p50" for v in regressed):
        report.notes.append("this run's latency is HTP-simulator wall time on the host, which moves with the host's "
                            "load from run to run: on an emulated device, a larger regression_latency_threshold in "
                            "the model spec keeps that noise from failing the gate")
    if not current.ran():
        report.failures.append(f"nothing to compare: no step ran on {current.device} x {current.model} in this run "
                               "(select the steps to compare together with the regression step)")
    report.failures.extend(v.message() for v in regressed)
    return report


def regression_against(path: Path, target: "Target", records: Sequence["StepRecord"],
                       cache: "ArtifactCache") -> StepReport:
    """Return the regression step's report for target: the baseline file at path against this run's step
    records of the same device and model. Raises BaselineError for an unreadable or corrupt baseline."""
    baseline = load_baseline(path)
    current = snapshot(records, target.device.id, target.soc.id, target.model.name,
                       model_sha256(target.model, cache))
    return regression(baseline, path, current, target.model.thresholds)
