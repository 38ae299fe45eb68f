"""The regression step: this run's KPIs for one device × model against a saved baseline (--baseline DIR).

Which KPI is compared by which rule (each step's `rules` in harness.steps.table; the rules themselves are in
harness.baseline):

* accuracy by an absolute tolerance: ptq's and validation_accuracy's ``task_metric`` in its metric's direction
  (the step's ``task_metric_higher_is_better``: cer regresses when it rises; a baseline of another metric is
  inconclusive), ``cosine_similarity`` (``regression_accuracy_tolerance``) and ``sqnr_db``
  (``regression_sqnr_tolerance_db``), higher is better;
* context_binary's ``context_bytes``, lower is better, by a relative threshold (``regression_size_threshold``);
* figures measured in independent blocks (kind 'blocks', compare_blocks): profile's ``device_latency_ms``
  (the emulated device's modelled time), ``latency_ms.p50`` (wall time: simulator or device), ``peak_rss_mb``,
  energy's ``energy_per_inference_mj``: regressed only when significant on the blocks AND beyond
  max(threshold, ``regression_noise_k`` x the baseline's noise floor); else unchanged or inconclusive;
* every step's ``outcome``: one that passed in the baseline and fails now regresses.

Simulator wall time of two sessions cannot separate the host's load from a regression, so it never regresses
on recorded figures: where the baseline's artifact differs from this run's and is still in the cache, an
interleaved A/B on this device decides it (harness.latency_ab); with the same artifact, the emulated device
time decides. A regressed KPI fails the step, its message giving both values and the evidence; an
inconclusive one makes the step inconclusive (never failed); `new` and `missing` KPIs do neither.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from harness.baseline import (VERDICTS, BaselineError, Evidence, KpiVerdict, Snapshot, _fmt, compare_blocks,
                              compare_absolute, compare_lower, compare_outcome, compare_paired, load_baseline,
                              model_sha256, snapshot)
from harness.errors import ContextMismatchError, RunnerError
from harness.models import Thresholds
from harness.repeats import min_unpaired_p, summary
from harness.steps.report import StepReport
from harness.steps.table import WALL, KpiRule, rules
from harness.versions import toolchain_versions

if TYPE_CHECKING:
    from harness.cache import ArtifactCache
    from harness.latency_ab import Bench
    from harness.reporting.records import StepRecord
    from harness.target import Target

def _get(kpis: dict[str, Any] | None, dotted: str) -> Any:
    value: Any = kpis
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _kpis(snap: Snapshot, step: str) -> dict[str, Any]:
    result = snap.steps.get(step)
    return result.kpis if result is not None and result.outcome != "skipped" else {}


def _kpi_value(snap: Snapshot, step: str, key: str, where: str, listed: bool = False) -> Any:
    """Return the KPI step.key of snap (None when the step or KPI is absent, or the step was skipped).
    Raises BaselineError naming `where` when the value is there but is not a number (or, listed, a list of
    numbers)."""
    value = _get(_kpis(snap, step), key)
    if value is None:
        return None
    ok = (isinstance(value, list) and all(_number(v) for v in value)) if listed else _number(value)
    if not ok:
        kind = "a list of numbers" if listed else "a number"
        raise BaselineError(f"{where}: {step} KPI '{key}' is {str(value)[:80]!r}, not {kind}")
    return (value or None) if listed else value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _evidence(snap: Snapshot, rule: KpiRule, where: str) -> Evidence | None:
    """The figure of rule in snap: the median of its blocks where it has blocks, else the KPI's value."""
    value = _kpi_value(snap, rule.step, rule.kpi, where)
    if value is None:
        return None
    blocks = _kpi_value(snap, rule.step, rule.blocks, where, listed=True)
    if blocks:
        value = round(summary(blocks).value, 6)
    return Evidence(value, blocks, _kpi_value(snap, rule.step, rule.noise, where))


def _weaker(baseline: Snapshot, base: Evidence | None, rule: KpiRule) -> str:
    """Why the baseline's evidence of rule's figure is weaker than blocks on both sides ('' when it is not)."""
    if base is None or (base.blocks and min_unpaired_p(len(base.blocks), 5) < 0.05):
        return ""
    if baseline.format < 2:
        return (f"the baseline is format {baseline.format} (harness {baseline.harness_version or 'unknown'}), from "
                "before independent blocks and noise floors were recorded, so the threshold alone compares it "
                "(weaker evidence); save the baseline again with this harness")
    if rule.step != "profile":
        return f"the {rule.step} step records no repeats of {rule.kpi}, so the threshold alone compares it"
    return (f"the baseline has {len(base.blocks or [])} block(s), too few repeats to test a change; save it with "
            "at least 4 (--latency-blocks)")


def _blocks(baseline: Snapshot, current: Snapshot, rule: KpiRule, where: str, thresholds: Thresholds,
            bench: "Bench | None", device_judged: bool) -> KpiVerdict | None:
    """Compare a figure measured in blocks; the simulator's wall time through _simulator_wall."""
    base, cur = _evidence(baseline, rule, where), _evidence(current, rule, "this run")
    threshold, k = getattr(thresholds, rule.setting), thresholds.regression_noise_k
    weaker = _weaker(baseline, base, rule)
    source = _get(_kpis(current, rule.step), rule.source) or _get(_kpis(baseline, rule.step), rule.source)
    if rule.kpi != WALL or source != "simulator":
        return compare_blocks(rule.step, rule.kpi, base, cur, thresholds.regression_alpha, threshold, k, rule.unit,
                              weaker=weaker)
    return _simulator_wall(baseline, current, rule, base, cur, thresholds, weaker, bench, device_judged)


def _simulator_wall(baseline: Snapshot, current: Snapshot, rule: KpiRule, base: Evidence | None,
                    cur: Evidence | None, thresholds: Thresholds, weaker: str, bench: "Bench | None",
                    device_judged: bool) -> KpiVerdict | None:
    """Simulator wall time: an interleaved A/B where this run's artifact differs from the baseline's and the
    baseline's is in the cache; otherwise the recorded figures, which decide only `unchanged` (beyond the
    noise floor: inconclusive, saying why and how to decide)."""
    threshold, k, alpha = thresholds.regression_latency_threshold, thresholds.regression_noise_k, \
        thresholds.regression_alpha
    b_kpis, c_kpis = _kpis(baseline, "profile"), _kpis(current, "profile")
    same = b_kpis.get("artifact_sha256") is not None and b_kpis.get("artifact_sha256") == c_kpis.get("artifact_sha256")
    why_not = ""
    if base is not None and cur is not None and not same and bench is not None and _comparable(baseline, current):
        from harness.latency_ab import cached_artifact

        artifact, why_not = cached_artifact(b_kpis, bench.cache_root)
        if artifact is not None and isinstance(c_kpis.get("artifact_path"), str):
            try:
                return _ab(bench, artifact, Path(c_kpis["artifact_path"]), c_kpis, rule, base, cur, thresholds)
            except (ContextMismatchError, RunnerError) as e:  # a lost device (other TransportErrors) propagates
                why_not = f"the A/B could not run ({str(e).splitlines()[0]})"
    elif bench is None:
        why_not = "no device to run it on"
    elif not _comparable(baseline, current):
        why_not = "the baseline is of another model or SoC"
    if same:
        undecidable = (f"the same artifact as the baseline (sha256 {c_kpis['artifact_sha256'][:12]}), so no A/B can "
                       "tell it apart; one compiled model's simulator wall time moves only with the host and the "
                       "emulated device")
    else:
        undecidable = ("simulator wall time of two sessions cannot separate the host's load from a regression; to "
                       "decide, keep the baseline's artifact in this cache so the gate runs an interleaved A/B"
                       + (f" (no A/B: {why_not})" if why_not else ""))
    verdict = compare_blocks(rule.step, rule.kpi, base, cur, alpha, threshold, k, rule.unit, decides=False,
                             undecidable=undecidable, weaker=weaker)
    if same and device_judged and verdict is not None and verdict.verdict == "inconclusive":
        return replace(verdict, verdict="unchanged",
                       detail=f"{verdict.detail}; the device's latency is judged on device_latency_ms (emulated)")
    return verdict


def _comparable(baseline: Snapshot, current: Snapshot) -> bool:
    return baseline.soc == current.soc and not another_model(baseline, current)


def _ab(bench: "Bench", artifact: Path, candidate: Path, c_kpis: dict[str, Any], rule: KpiRule, base: Evidence,
        cur: Evidence, thresholds: Thresholds) -> KpiVerdict:
    from harness.latency_ab import AB_MAX_PAIRS, interleaved
    from harness.steps.profile import MeasureRule

    block = MeasureRule(**(c_kpis.get("block_rule") or {"min_iterations": 4, "min_duration_s": 0.2,
                                                          "warmup": 3}))
    recorded = f"{_fmt(base.value)} -> {_fmt(cur.value)} ms in the two sessions"

    def decide(a: list[float], b: list[float], final: bool) -> KpiVerdict | None:
        verdict = compare_paired(rule.step, rule.kpi, a, b, thresholds.regression_alpha,
                                 thresholds.regression_latency_threshold, thresholds.regression_noise_k,
                                 base.noise_pct, rule.unit, final, recorded)
        if verdict is not None and verdict.verdict == "inconclusive":
            return replace(verdict, detail=f"{verdict.detail} (measured up to the bound of {AB_MAX_PAIRS} pairs)")
        return verdict

    return interleaved(bench, artifact, candidate, block, decide)


def compare(baseline: Snapshot, current: Snapshot, thresholds: Thresholds,
            baseline_where: str = "the baseline", bench: "Bench | None" = None) -> list[KpiVerdict]:
    """Return the verdicts of every step's KPI rules (harness.steps.table) and of every step's outcome that
    either side has, in step order (this run's steps first); bench: where an A/B can run (None: nowhere). Raises BaselineError naming
    baseline_where for a baseline KPI of the wrong type."""
    verdicts: list[KpiVerdict] = []
    for rule in rules():
        if rule.kind == "blocks":
            judged = any(v.kpi == "device_latency_ms" and v.verdict not in ("new", "missing") for v in verdicts)
            verdict = _blocks(baseline, current, rule, baseline_where, thresholds, bench, judged)
        else:
            base = _kpi_value(baseline, rule.step, rule.kpi, baseline_where)
            cur = _kpi_value(current, rule.step, rule.kpi, "this run")
            setting = getattr(thresholds, rule.setting)
            if rule.kind == "task":
                verdict = _task(baseline, current, rule, base, cur, setting)
            elif rule.kind == "higher":
                verdict = compare_absolute(rule.step, rule.kpi, base, cur, setting, rule.unit)
            else:
                verdict = compare_lower(rule.step, rule.kpi, base, cur, setting, rule.unit)
        if verdict is not None:
            verdicts.append(verdict)
    for step in [*current.steps, *(s for s in baseline.steps if s not in current.steps)]:
        base_step, cur_step = baseline.steps.get(step), current.steps.get(step)
        verdict = compare_outcome(step, base_step.outcome if base_step else None,
                                  cur_step.outcome if cur_step else None)
        if verdict is not None:
            verdicts.append(verdict)
    if another_model(baseline, current):
        verdicts = [replace(v, verdict="inconclusive", detail=f"{v.detail + '; ' if v.detail else ''}another model")
                    if v.verdict in ("regressed", "improved") else v for v in verdicts]
    order = {step: i for i, step in enumerate([*current.steps, *baseline.steps])}
    return sorted(verdicts, key=lambda v: order.get(v.step, len(order)))  # stable: a step's rules keep their order


def _task_metric(snap: Snapshot, step: str) -> tuple[str | None, bool]:
    """The task metric a step of snap reports: its name and direction (the step's task_metric_higher_is_better;
    True without one: accuracy, agreement and cosine, and every metric of a baseline saved before it was kept)."""
    kpis = _kpis(snap, step)
    return kpis.get("task_metric_name"), kpis.get("task_metric_higher_is_better") is not False


def _task(baseline: Snapshot, current: Snapshot, rule: KpiRule, base: Any, cur: Any,
          tolerance: float) -> KpiVerdict | None:
    """Compare the task metric in its own direction (cer: lower is better); a change between two different
    metrics (another name or direction in the baseline) is inconclusive, never regressed or improved."""
    (base_name, base_higher), (name, higher) = _task_metric(baseline, rule.step), _task_metric(current, rule.step)
    if cur is None:
        name, higher = base_name, base_higher
    verdict = compare_absolute(rule.step, rule.kpi, base, cur, tolerance, rule.unit, higher, name or "")
    if (verdict is not None and verdict.verdict in ("regressed", "improved") and base is not None and cur is not None
            and (base_name, base_higher) != (name, higher)):
        return replace(verdict, verdict="inconclusive",
                       detail=f"{verdict.detail}; another task metric: the baseline's is {base_name or 'unnamed'} "
                              f"({'higher' if base_higher else 'lower'} is better), this run's {name or 'unnamed'} "
                              f"({'higher' if higher else 'lower'} is better)")
    return verdict


def another_model(baseline: Snapshot, current: Snapshot) -> bool:
    """True when the baseline is of another model: another name and another model file (by content hash)."""
    return baseline.model != current.model and baseline.model_sha256 != current.model_sha256


def mismatch_notes(baseline: Snapshot, current: Snapshot, path: Path) -> list[str]:
    """Return a note for each way the baseline is not of this device × model: another model file (by content
    hash), SoC, device or model name, another toolchain (the packages both recorded), an older format; the
    KPIs are still compared where both have them."""
    notes = []
    if another_model(baseline, current):
        notes.append(f"the baseline {path} is of another model ('{baseline.model}', sha256 {baseline.model_sha256}; "
                     f"this run is '{current.model}', sha256 {current.model_sha256}): its KPIs are shown beside this "
                     "run's, but a difference between two models is not a regression, so none is gated (save a "
                     f"baseline of '{current.model}' with --save-baseline)")
    elif baseline.model_sha256 != current.model_sha256:
        notes.append(f"the baseline {path} was saved from another model file (sha256 {baseline.model_sha256}; this "
                     f"run's is {current.model_sha256}): KPIs are compared only where both have them, and a changed "
                     "model may explain any difference")
    if baseline.soc != current.soc:
        notes.append(f"the baseline {path} was saved on SoC {baseline.soc}, this run is on {current.soc}: KPIs are "
                     "compared only where both have them, and the SoC may explain any difference")
    for what, base, cur in (("device", baseline.device, current.device), ("model", baseline.model, current.model)):
        if base != cur and not (what == "model" and another_model(baseline, current)):
            notes.append(f"the baseline {path} names {what} '{base}', this run's is '{cur}'")
    changed = [f"{name} {base} -> {current.toolchain.get(name)}" for name, base in baseline.toolchain.items()
               if name in current.toolchain and current.toolchain[name] != base]
    if changed:
        notes.append(f"the baseline {path} was saved on another toolchain ({', '.join(changed)}): a difference may "
                     "be the toolchain's, not the model's or the device's (save a baseline on this one to tell)")
    if baseline.format < 2:
        notes.append(f"the baseline {path} is format {baseline.format} (harness "
                     f"{baseline.harness_version or 'unknown'}): it has no independent latency blocks, noise floor "
                     "or artifact, so latency is compared by the threshold alone and a change beyond it is "
                     "inconclusive; save the baseline again with this harness")
    return notes


def regression(baseline: Snapshot, path: Path, current: Snapshot, thresholds: Thresholds,
               bench: "Bench | None" = None) -> StepReport:
    """Return the regression step's report for current against baseline (read from path): a `verdicts` KPI and
    table, the `regressed` and `inconclusive` KPI names, `counts` per verdict, a failure per regressed KPI (or
    when no step of this run ran, so nothing could be compared) and an inconclusive reason per undecided one.
    bench: where an interleaved A/B can run (see harness.latency_ab)."""
    verdicts = compare(baseline, current, thresholds, baseline_where=f"the baseline {path}", bench=bench)
    report = StepReport("regression")
    rows = [v.as_dict() for v in verdicts]
    regressed = [v for v in verdicts if v.verdict == "regressed"]
    undecided = [v for v in verdicts if v.verdict == "inconclusive"]
    report.kpis = {
        "baseline_file": str(path),
        "baseline_saved_at": baseline.saved_at,
        "baseline_harness_version": baseline.harness_version,
        "baseline_format": baseline.format,
        "baseline_soc": baseline.soc,
        "baseline_model": baseline.model,
        "baseline_model_sha256": baseline.model_sha256,
        "model_sha256": current.model_sha256,
        "baseline_toolchain": baseline.toolchain,
        "toolchain": current.toolchain,
        "verdicts": rows,
        "regressed": [f"{v.step} {v.kpi}" for v in regressed],
        "inconclusive": [f"{v.step} {v.kpi}" for v in undecided],
        "counts": {name: sum(v.verdict == name for v in verdicts) for name in VERDICTS},
    }
    report.tables["verdicts"] = rows
    report.artifacts["baseline"] = path
    report.notes.extend(mismatch_notes(baseline, current, path))
    if not current.ran():
        report.failures.append(f"nothing to compare: no step ran on {current.device} x {current.model} in this run "
                               "(select the steps to compare together with the regression step)")
    report.failures.extend(v.message() for v in regressed)
    report.inconclusive.extend(v.message() for v in undecided)
    return report


def regression_against(path: Path, target: "Target", records: Sequence["StepRecord"], cache: "ArtifactCache",
                       bench: "Bench | None" = None) -> StepReport:
    """Return the regression step's report for target: the baseline file at path against this run's step
    records of the same device and model (an A/B on bench where one can decide). Raises BaselineError for an
    unreadable or corrupt baseline."""
    baseline = load_baseline(path)
    current = snapshot(records, target.device.id, target.soc.id, target.model.name,
                       model_sha256(target.model, cache), toolchain=toolchain_versions())
    return regression(baseline, path, current, target.model.thresholds, bench)
