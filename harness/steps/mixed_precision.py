"""Step 3, stage 5: the precision search, promoting the activations that matter most to 16 bits.

It starts from the best candidate of any kind (promotion_start says where promotion runs from); FP16 on
the HTP, each candidate's cost and the cheapest candidate meeting the KPI are harness.steps.precision's.
From an 8-bit recipe:

1. **Units.** Activations are promoted in *promotion units* (harness.steps.promotion): a tensor with
   the tensors folded into it, the tensors sharing its encoding, and the inputs and outputs of
   value-selecting ops such as Concat, all together.
2. **Measured ranking.** The units error isolation pre-ranks most sensitive (at most
   MEASURED_UNITS of them) are each promoted alone and the model's outputs measured against float
   on the host's QDQ emulation (onnxruntime CPU, graph optimizations off): one quantization and
   one pass over the evaluation samples per candidate, candidates in parallel, all cached. When
   the host's emulation of the start recipe already meets the KPI and only the device misses it,
   the loss is the HTP's own and the host cannot rank what fixes it: the top DEVICE_MEASURED_UNITS
   units are then measured on the device's `htp` runtime instead. Units are ranked by the output
   SQNR they reach (then cosine similarity, then pre-rank), those that helped first; a unit that
   was not measured, or whose candidate could not be quantized or run (the HTP refuses some ops
   with 16-bit inputs), is never promoted.
3. **Confirmed on the device.** The top 1, 2, 4, ... units are promoted through onnxruntime's QNN
   tensor overrides (`{"tensor": [{"quant_type": QUInt16}]}`; the QNN QDQ config inserts the 8↔16-bit
   conversions) and each configuration runs on the device's `htp` runtime, until the model's KPI
   is met or the budget is spent. `max_promoted_tensors` counts quantized activations: every tensor
   of a unit that has a QuantizeLinear in the QDQ model counts, also when it shares its encoding;
   a folded tensor (none of its own) counts with the tensor it is folded into. A unit larger than
   the whole budget is never tried.

The report's `pareto` table and chart give the accuracy / model size / simulated time trade-off per
promotion count, as AIMET's AMP Pareto curve does.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.reporting import charts
from harness.cache import ArtifactCache, content_key
from harness.data import Dataset, Feed, feeds_digest
from harness.errors import HarnessError
from harness.kpi import check_all
from harness.models import Thresholds
from harness.runner.client import DeviceRunner
from harness.steps.inference import host_qdq_run, task_metric
from harness.devices import SocSpec
from harness.steps import precision
from harness.steps.promotion import PromotionUnit
from harness.steps.ptq import QuantRecipe, compare_quantized, judge
from harness.steps.report import StepReport
from harness.steps.sweep import (Candidate, accuracy_limits, evaluate_all, evaluate_recipe, quantize_recipe, rank,
                                 undecidable)

PROMOTED_TYPE = "QUInt16"
MEASURED_UNITS = 16  # candidate units measured on the host per run (the top of error isolation's pre-rank)
DEVICE_MEASURED_UNITS = 8  # the same, when the loss is the HTP's own and candidates run on the device
HELPS_DB = 0.1  # a unit whose SQNR gain on the host is below this did not help on its own


@dataclass(frozen=True)
class UnitEffect:
    """One unit promoted alone from the start recipe: its KPIs (host QDQ emulation or device), or why
    it was not measured; `candidate` is the device evaluation when it ran on the device."""

    unit: PromotionUnit
    recipe: QuantRecipe
    kpis: dict[str, Any] | None = None
    error: str | None = None
    candidate: Candidate | None = None

    @property
    def measured(self) -> bool:
        """True when the host run gave KPIs."""
        return self.kpis is not None

    def sqnr_gain_db(self, start_sqnr_db: float) -> float | None:
        """Return the output SQNR gained over the start recipe on the host (None when not measured)."""
        if self.kpis is None:
            return None
        return float(self.kpis["sqnr_db"]) - start_sqnr_db


def promotion_schedule(budget: int, available: int) -> list[int]:
    """Return the cumulative numbers of units to promote: 1, 2, 4, ... capped by budget and available."""
    limit = min(budget, available)
    counts, k = [], 1
    while k < limit:
        counts.append(k)
        k *= 2
    if limit > 0:
        counts.append(limit)
    return counts


def units_within_budget(ranked: list[PromotionUnit], budget: int) -> int:
    """Return how many of the first ranked units fit in budget quantized activations."""
    spent = 0
    for n, unit in enumerate(ranked):
        spent += unit.size
        if spent > budget:
            return n
    return len(ranked)


def pinned_tensors(candidate: Candidate) -> set[str]:
    """Return the tensors whose encodings the user fixed with --quantization-overrides."""
    return set(candidate.recipe.encodings.get("activation_encodings", {}))


def promoted_recipe(start: QuantRecipe, units: list[PromotionUnit], label: str = "") -> QuantRecipe:
    """Return start with every tensor of units promoted to 16 bits, labelled `label` (default
    mp<number of units>)."""
    overrides = {**start.tensor_overrides,
                 **{t: [{"quant_type": PROMOTED_TYPE}] for unit in units for t in unit.tensors}}
    return replace(start, tensor_overrides=overrides, label=label or f"mp{len(units)}")


# ------------------------------------------------------------------------------ host measurement

def host_kpis(qdq_model: Path, dataset: Dataset, reference: list[Feed], cache: ArtifactCache,
              threads: int = 0) -> dict[str, Any]:
    """Return the KPIs of qdq_model on the host's QDQ emulation against the float reference (cached)."""
    labels = dataset.labels_key()
    key = content_key("mp-host-v2", qdq_model, feeds_digest(dataset.evaluation), feeds_digest(reference), labels)

    def build(out: Path) -> None:
        outputs = host_qdq_run(qdq_model, dataset.evaluation, threads=threads)
        kpis = compare_quantized(outputs, reference, dataset, task_metric(reference, dataset, reference))
        (out / "kpis.json").write_text(json.dumps(kpis, indent=1, default=float))

    return json.loads((cache.entry("mp_host_eval", key, build).path / "kpis.json").read_text())


def measure_units(units: list[PromotionUnit], start: QuantRecipe, model: Path, dataset: Dataset,
                  reference: list[Feed], cache: ArtifactCache, max_workers: int | None = None) -> list[UnitEffect]:
    """Return each unit promoted alone from start and measured on the host's QDQ emulation, in
    parallel where the machine allows; a unit that cannot be quantized or run records why."""
    workers = max(1, min(len(units), max_workers or os.cpu_count() or 1))
    labels = {unit: f"mp1.{i + 1}" for i, unit in enumerate(units)}

    def one(unit: PromotionUnit) -> UnitEffect:
        recipe = promoted_recipe(start, [unit], labels[unit])
        try:
            _, qdq = quantize_recipe(recipe, model, dataset, cache)
            return UnitEffect(unit, recipe, host_kpis(qdq, dataset, reference, cache, 1 if workers > 1 else 0))
        except HarnessError as e:
            return UnitEffect(unit, recipe, error=str(e).splitlines()[0])

    if workers == 1:
        return [one(u) for u in units]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mp-host") as pool:
        return list(pool.map(one, units))


def measure_units_on_device(units: list[PromotionUnit], start: QuantRecipe, model: Path, dataset: Dataset,
                            reference: list[Feed], runner: DeviceRunner, thresholds: Thresholds,
                            cache: ArtifactCache) -> list[UnitEffect]:
    """Return each unit promoted alone from start and run on the device's `htp` runtime (the sweep's
    parallel evaluation: overlapping runs on the HTP simulator, one at a time on a device)."""
    recipes = [promoted_recipe(start, [unit], f"mp1.{i + 1}") for i, unit in enumerate(units)]
    candidates, _ = evaluate_all(recipes, model, dataset, reference, runner, thresholds, cache)
    by_label = {c.recipe.label: c for c in candidates}
    effects = []
    for unit, recipe in zip(units, recipes):
        c = by_label[recipe.label]
        effects.append(UnitEffect(unit, c.recipe, c.kpis if c.error is None else None,
                                  c.error.splitlines()[0] if c.error else None, c))
    return effects


def rank_by_effect(effects: list[UnitEffect], start_sqnr_db: float) -> list[PromotionUnit]:
    """Return the measured units in promotion order: those that helped when promoted alone (best
    output SQNR first, then cosine, then pre-rank), then those that did not (they may still help
    together). A unit whose candidate could not be quantized or run is left out."""
    def helped(e: UnitEffect) -> bool:
        return e.sqnr_gain_db(start_sqnr_db) >= HELPS_DB

    def key(e: UnitEffect):
        return (-e.kpis["sqnr_db"], -e.kpis["cosine_similarity"], e.unit.pre_rank)

    runnable = [e for e in effects if e.measured]
    return ([e.unit for e in sorted((e for e in runnable if helped(e)), key=key)]
            + [e.unit for e in sorted((e for e in runnable if not helped(e)), key=key)])


# ------------------------------------------------------------------------------ the step

def promotion_start(best: Candidate, pool: list[Candidate]) -> tuple[Candidate | None, str | None]:
    """Return the candidate promotion to 16 bits starts from, or None and why it does not run.

    best (the best candidate of any kind) when its activations are 8-bit. When they are 16-bit: if best misses
    the KPI, none (promoting an 8-bit recipe's activations to 16 bits cannot beat holding them all in 16 bits);
    if it meets it and no 8-bit candidate does, the best 8-bit candidate (a cheaper configuration may lie
    between the two)."""
    if best.error is not None or best.precision in ("a8", "mixed"):
        return best, None
    if not best.meets:
        return None, (f"the best candidate, {best.name}, already holds every activation in 16 bits and misses the "
                      "KPI: promoting an 8-bit recipe's activations to 16 bits cannot do better, so no promotion "
                      "was searched")
    eight = [c for c in rank(pool) if c.error is None and c.precision in ("a8", "mixed")]
    if not eight or any(c.meets for c in eight):
        return None, None
    return eight[0], None


def mixed_precision(model: Path, dataset: Dataset, reference: list[Feed], runner: DeviceRunner,
                    thresholds: Thresholds, cache: ArtifactCache, start: Candidate, units: list[PromotionUnit],
                    measure_limit: int = MEASURED_UNITS, best_case: dict | None = None,
                    pool: list[Candidate] = (), soc: SocSpec | None = None,
                    budget_s: float = precision.DEFAULT_BUDGET_S, allow_cpu_fallback: bool = False) -> StepReport:
    """Return the precision search's report: start is the best candidate of any kind (pool: the sweep's other
    candidates); which units were promoted to 16 bits from an 8-bit start (promotion_start), how each candidate
    unit measured, the KPIs reached on the device and what each promotion count cost (the `pareto` table and
    chart); then FP16 on soc's HTP when no quantized candidate meets the KPI, every candidate's cost (the
    `precision_pareto` table) and the cheapest one meeting the KPI (harness.steps.precision), within budget_s
    seconds. artifacts['model'] is the chosen model.

    best_case holds the KPIs a candidate identical to float gets on these samples (ptq.best_case): when the start
    is undecided only on task-metric limits that even it leaves undecided, no candidate could be shown to meet
    the KPI, so the search is not run and the step is inconclusive, saying how many samples would decide; it offers
    the start's model (undecided, with its latency against the fastest 8-bit candidate's), which ships when PTQ
    failed decisively."""
    if not start.kpis and start.error is None:
        start = evaluate_recipe(start.recipe, model, dataset, reference, runner, thresholds, cache)
    futile = unresolvable_search(start, thresholds, best_case)
    if futile is not None:
        return _search_not_run(start, thresholds, futile, pool)
    search = precision.SearchBudget(budget_s)
    best = start
    pool = [c for c in pool if c is not best]
    promo, why_not = promotion_start(best, pool)
    start = promo or best
    pinned = pinned_tensors(start)
    units = [u for u in units if not pinned.intersection(u.tensors)]
    budget = thresholds.max_promoted_tensors
    fitting = [u for u in units if u.size <= budget]
    report = StepReport("mixed_precision")
    report.limits = accuracy_limits(thresholds)
    tried: list[tuple[list[PromotionUnit], Candidate]] = [([], start)]
    effects: list[UnitEffect] = []
    start_host: dict[str, Any] = {}
    ranked: list[PromotionUnit] = []
    ranking_runtime = None
    if why_not:
        report.notes.append(why_not)
    if promo is not None and not start.meets and start.error is None and fitting \
            and search.allows("measuring the promotion units"):
        try:
            start_host = host_kpis(start.model, dataset, reference, cache)
        except HarnessError as e:  # ranked on the device, where the start did run
            report.notes.append(f"the host's QDQ emulation could not run the start recipe ({e}); "
                                "candidates are ranked on the device")
        if not start_host or all(v.passed for v in check_all(start_host, report.limits)):  # the HTP's own loss
            ranking_runtime, measure_limit = "htp", min(measure_limit, DEVICE_MEASURED_UNITS)
            effects = measure_units_on_device(fitting[:measure_limit], start.recipe, model, dataset, reference,
                                              runner, thresholds, cache)
            baseline = start.kpis["sqnr_db"]
        else:
            ranking_runtime = "host_qdq"
            effects = measure_units(fitting[:measure_limit], start.recipe, model, dataset, reference, cache)
            baseline = start_host["sqnr_db"]
        ranked = rank_by_effect(effects, baseline)
        measured = {e.unit: e for e in effects}
        usable = units_within_budget(ranked, budget)
        schedule = promotion_schedule(usable, usable)
        for i, count in enumerate(schedule):
            if not search.allows(f"promoting {', '.join(map(str, schedule[i:]))} unit(s)"):
                break
            chosen = ranked[:count]
            alone = measured[chosen[0]] if count == 1 else None
            if alone is not None and alone.candidate is not None:
                candidate = alone.candidate  # already run on the device
            else:
                recipe = alone.recipe if alone is not None else promoted_recipe(start.recipe, chosen)
                candidate = evaluate_recipe(recipe, model, dataset, reference, runner, thresholds, cache)
            tried.append((chosen, candidate))
            if candidate.meets:
                break
    evaluated = _unique([best, *pool, *(c for _, c in tried)])
    fp16, fp16_estimate = None, None
    if not any(c.meets for c in evaluated):
        if (unavailable := precision.fp16_unavailable(soc)) is not None:
            report.notes.append(unavailable)
        elif search.allows("FP16 on the HTP"):
            fits, fp16_estimate = precision.fp16_fits(model, dataset, runner, cache, search)
            if fits:
                fp16 = precision.evaluate_fp16(model, dataset, reference, runner, thresholds, cache)
                evaluated.append(fp16)
    sizes = ({id(c): precision.context_bytes(c, soc, cache, allow_cpu_fallback) for c in evaluated}
             if soc is not None else {})
    final = precision.cheapest(evaluated, sizes) or rank(evaluated)[0]
    promoted = next((u for u, c in tried if c is final), [])
    metric = "task_metric_ratio" if "task_metric_ratio" in (final.kpis or {}) else "cosine_similarity"
    report.tables["precision_pareto"] = precision.pareto_rows(evaluated, sizes, final, metric)
    report.tables["pareto"] = [_pareto_row(u, c) for u, c in tried]
    baseline_sqnr = start.kpis.get("sqnr_db") if ranking_runtime == "htp" else start_host.get("sqnr_db")
    report.tables["candidates"] = _candidate_rows(effects, ranked, baseline_sqnr, ranking_runtime)
    if final.error is not None:
        report.failures.append(f"mixed precision could not evaluate any recipe: {final.describe()}")
        return report
    base, k = start.kpis, final.kpis
    report.kpis = {
        "runtime": "htp", "ranking_runtime": ranking_runtime, "start_recipe": start.name, "final_recipe": final.name,
        "promoted": [u.label for u in promoted], "promoted_units": [list(u.tensors) for u in promoted],
        "promoted_tensors": [t for u in promoted for t in u.tensors],
        "promoted_count": len(promoted), "promoted_tensor_count": sum(u.size for u in promoted),
        "budget": budget, "budget_counts": "quantized activations",
        "units_total": len(units), "units_over_budget": len(units) - len(fitting),
        "units_measured": len(effects), "measure_limit": measure_limit,
        "met_threshold": final.meets, "start_met_threshold": start.meets,
        "task_metric_name": k["task_metric_name"], "task_metric": k["task_metric"],
        "task_metric_drop": k["task_metric_drop"], **_ratio(k), "cosine_similarity": k["cosine_similarity"],
        "sqnr_db": k["sqnr_db"], "intervals": k.get("intervals"), "undecided": final.undecided,
        "start_task_metric": base.get("task_metric"),
        "start_cosine_similarity": base.get("cosine_similarity"), "start_sqnr_db": base.get("sqnr_db"),
        "start_host_sqnr_db": start_host.get("sqnr_db"),
        "start_host_cosine_similarity": start_host.get("cosine_similarity"),
        "model_bytes": k["model_bytes"], "model_bytes_start": base.get("model_bytes"),
        "model_bytes_increase_pct": _pct(k["model_bytes"], base.get("model_bytes")),
        "mean_inference_ms": k["mean_inference_ms"], "mean_inference_ms_start": base.get("mean_inference_ms"),
        "inference_time_increase_pct": _pct(k["mean_inference_ms"], base.get("mean_inference_ms")),
        "latency_source": k.get("latency_source"),  # the final candidate's run (RunResult.latency_source)
        "pareto": [{key: row[key] for key in ("promoted_units", "promoted_tensors", "sqnr_db", "cosine_similarity",
                                              "model_bytes", "simulated_ms")} for row in report.tables["pareto"]],
        "best_candidate": best.name, "precision": final.precision, "htp_latency_ms": k.get("htp_latency_ms"),
        "context_bytes": sizes.get(id(final)), "candidates_evaluated": len(evaluated),
        "candidates_meeting_kpi": sum(c.meets for c in evaluated), "precision_budget_s": budget_s,
        "search_s": search.spent_s(), "untried": list(search.untried),
        "fp16": _fp16_kpis(fp16, evaluated), "fp16_estimate": fp16_estimate,
        **{key: value for key, value in _latency_against_8bit(final, evaluated).items()
           if key in ("eight_bit_candidate", "eight_bit_latency_ms", "latency_vs_8bit")},
    }
    evidence = _evidence(final, fp16, evaluated, effects, units, model, dataset, runner, cache, thresholds, report)
    if effects:
        where = ("the host's QDQ emulation" if ranking_runtime == "host_qdq" else
                 "the device's htp runtime (the host's QDQ emulation of the start recipe meets the KPI: "
                 "the loss is the HTP's own)")
        report.notes.append(
            f"ranked {len(effects)} of {len(fitting)} promotion units within the budget by their measured effect "
            f"on {where}, at most {measure_limit} measured; {len(units) - len(fitting)} unit(s) larger than the "
            f"budget of {budget}; each promotion count confirmed on the device's htp runtime")
    if search.untried:
        report.notes.append(f"the precision budget of {budget_s:g} s (--precision-budget-s), {search.spent_s():.0f} s "
                            f"spent, left untried: {'; '.join(search.untried)}")
    if not final.meets:
        tried_text = " | ".join([*(f"{len(u)} unit(s) {[x.label for x in u]}: {c.describe()}" for u, c in tried),
                                 *(c.describe() for c in evaluated if not any(c is t for _, t in tried))])
        if final.undecided:
            report.inconclusive.append(
                f"promoting up to {budget} quantized activations to 16 bits in {len(ranked)} ranked unit(s) met the "
                f"KPI on no candidate decisively; the best, {final.name}, could not be decided on "
                f"{len(dataset.evaluation)} samples{evidence}; tried: {tried_text}")
        else:
            report.failures.append(
                f"promoting up to {budget} quantized activations to 16 bits in {len(ranked)} ranked unit(s) did not "
                f"meet the KPI{evidence}; tried: {tried_text}")
    judge(report)
    report.notes.extend(dataset.warnings)
    report.artifacts["model"] = final.model
    report.artifacts["pareto_plot"] = _pareto_plot(report.tables["pareto"], thresholds, start.name, cache)
    return report


def _unique(candidates: list[Candidate]) -> list[Candidate]:
    """Return candidates without repeats (by identity), in order."""
    seen: set[int] = set()
    return [c for c in candidates if not (id(c) in seen or seen.add(id(c)))]


def _fastest_quantized(evaluated: list[Candidate]) -> Candidate | None:
    """Return the quantized candidate with the lowest HTP latency (None when none has one)."""
    timed = [c for c in evaluated if not c.fp16 and c.error is None and c.kpis.get("htp_latency_ms") is not None]
    return min(timed, key=lambda c: c.kpis["htp_latency_ms"]) if timed else None


def _fp16_kpis(fp16: Candidate | None, evaluated: list[Candidate]) -> dict[str, Any] | None:
    """Return FP16's row of KPIs (None when it was not tried): accuracy, latency and its ratio to the fastest
    quantized candidate's."""
    if fp16 is None:
        return None
    k, fastest = fp16.kpis, _fastest_quantized(evaluated)
    latency = k.get("htp_latency_ms")
    ratio = latency / fastest.kpis["htp_latency_ms"] if latency and fastest and fastest.kpis["htp_latency_ms"] else None
    return {"verdict": fp16.verdict, "meets_kpi": fp16.meets, "error": fp16.error,
            "cosine_similarity": k.get("cosine_similarity"), "sqnr_db": k.get("sqnr_db"),
            "task_metric": k.get("task_metric"), "htp_latency_ms": latency, "latency_source": k.get("latency_source"),
            "fastest_quantized": fastest.name if fastest else None, "latency_vs_fastest_quantized": ratio}


def _evidence(final: Candidate, fp16: Candidate | None, evaluated: list[Candidate], effects: list[UnitEffect],
              units: list[PromotionUnit], model: Path, dataset: Dataset, runner: DeviceRunner, cache: ArtifactCache,
              thresholds: Thresholds, report: StepReport) -> str:
    """Add to report what FP16 on the HTP proves; return the clause the failure message carries ('' if none).

    Only FP16 meets the KPI: the tensors that hold the quantization loss and FP16's latency cost, as a note.
    FP16 misses it too: float against FP16 on the HTP and the first diverging tensor (KPI `fp16_divergence`)."""
    if fp16 is None or fp16.error is not None:
        return f"; FP16 on the HTP could not run: {fp16.error.splitlines()[0]}" if fp16 is not None else ""
    info = report.kpis["fp16"]
    cost = (f"FP16 takes {info['htp_latency_ms']:.3g} ms against {info['fastest_quantized']}'s "
            f"{_fastest_quantized(evaluated).kpis['htp_latency_ms']:.3g} ms ({info['latency_vs_fastest_quantized']:.2g}x, "
            f"{info['latency_source']})" if info["latency_vs_fastest_quantized"] else "FP16's latency is unknown")
    if fp16.meets:
        if final is fp16:
            helped = [e.unit.label for e in sorted((e for e in effects if e.measured),
                                                   key=lambda e: -e.kpis["sqnr_db"])][:3]
            holders = helped or [u.label for u in units[:3]]
            report.notes.append(
                f"only FP16 on the HTP meets the KPI ({fp16.describe()}): no quantized candidate does; the "
                f"quantization loss is held in {', '.join(holders) or 'tensors error isolation did not rank'} "
                f"(error isolation's and the promotion search's most sensitive); {cost}")
        return ""
    try:
        first = precision.first_fp16_divergence(model, dataset.evaluation, runner, cache,
                                                 thresholds.min_cosine_similarity or 0.99)
    except HarnessError as e:
        first = {"tensor": None, "error": str(e).splitlines()[0]}
    report.kpis["fp16_divergence"] = first
    where = (f"the first diverging tensor is {first['tensor']} (node {first['node']}, {first['op_type']}, cosine "
             f"{first['cosine']:.4f} against float)" if first.get("tensor") else
             f"the per-tensor comparison could not run ({first['error']})" if "error" in first else
             f"yet with every tensor exposed as an output none of {first['compared']} diverges below cosine "
             f"{thresholds.min_cosine_similarity or 0.99:g} (lowest {first['lowest_cosine']:.4f} at "
             f"{first['lowest_tensor']}): the loss appears only in the graph as the HTP compiles it whole (its "
             "fused ops), not in one tensor")
    return (f"; even FP16 on the HTP misses it (float against FP16 on the HTP: cosine "
            f"{fp16.kpis['cosine_similarity']:.4f}, SQNR {fp16.kpis['sqnr_db']:.1f} dB over "
            f"{len(dataset.evaluation)} samples; {where}): the model cannot run accurately on this HTP as it is; "
            f"{cost}")


def _ratio(kpis: dict[str, Any]) -> dict[str, Any]:
    """Return the task metric's ratio to float of a candidate's KPIs, where it has one (an evaluation section)."""
    return {"task_metric_ratio": kpis["task_metric_ratio"]} if "task_metric_ratio" in kpis else {}


def unresolvable_search(start: Candidate, thresholds: Thresholds, best_case: dict | None) -> str | None:
    """Return why a search from start could not decide anything (None when it could): see sweep.undecidable."""
    why = undecidable(start, thresholds, best_case)
    if why is None:
        return None
    undecided, samples, sentences = why
    return (f"mixed precision did not search: on {samples or 'the'} evaluation samples even a model identical to "
            f"float leaves {', '.join(undecided)} undecided, so no candidate could be shown to meet it (the "
            f"start recipe {start.name} fails no limit): " + "; ".join(sentences))


def _search_not_run(start: Candidate, thresholds: Thresholds, reason: str, pool: list[Candidate] = ()) -> StepReport:
    """Return the inconclusive report of a search that could decide nothing: the start's KPIs, and its model when it
    has one (the best candidate evaluated, undecided: what ships when PTQ failed decisively, harness.pipeline's
    deployable), with its precision and its HTP latency against the fastest 8-bit candidate's (pool: the sweep's)."""
    report = StepReport("mixed_precision")
    report.limits = accuracy_limits(thresholds)
    k = start.kpis
    report.kpis = {"runtime": "htp", "start_recipe": start.name, "final_recipe": start.name, "promoted": [],
                   "promoted_count": 0, "met_threshold": False, "start_met_threshold": False, "undecided": True,
                   "search": "not run", "task_metric_name": k.get("task_metric_name"),
                   **{kpi: k.get(kpi) for kpi in ("task_metric", "task_metric_drop", "cosine_similarity", "sqnr_db")},
                   **_ratio(k),
                   "intervals": k.get("intervals")}
    report.inconclusive.append(reason)
    if start.model is not None and start.error is None:
        cost = _latency_against_8bit(start, [start, *pool])
        report.kpis.update(cost)
        report.artifacts["model"] = start.model
        against = (f"; HTP latency {cost['htp_latency_ms']:.3g} ms against {cost['eight_bit_candidate']}'s "
                   f"{cost['eight_bit_latency_ms']:.3g} ms ({cost['latency_vs_8bit']:.2g}x, {cost['latency_source']})"
                   if cost["latency_vs_8bit"] else "")
        report.notes.append(f"the best candidate evaluated, {start.name} ({cost['precision']}), is the model this "
                            f"step offers, undecided: it ships when PTQ's failed decisively{against}")
    return report


def _latency_against_8bit(candidate: Candidate, evaluated: list[Candidate]) -> dict[str, Any]:
    """Return candidate's precision and HTP latency beside the fastest 8-bit candidate's (its name, latency and the
    ratio; None where a latency is unknown), as the report of the model the search offers carries them."""
    eight = _fastest_quantized([c for c in evaluated if c.precision == "a8"])
    latency = candidate.kpis.get("htp_latency_ms")
    base = eight.kpis["htp_latency_ms"] if eight is not None else None
    return {"precision": candidate.precision, "htp_latency_ms": latency,
            "latency_source": candidate.kpis.get("latency_source"), "model_bytes": candidate.kpis.get("model_bytes"),
            "eight_bit_candidate": eight.name if eight is not None else None, "eight_bit_latency_ms": base,
            "latency_vs_8bit": latency / base if latency and base else None}


def _pct(value: float | None, start: float | None) -> float | None:
    if value is None or not start:
        return None
    return 100.0 * (value - start) / start


def _pareto_row(units: list[PromotionUnit], c: Candidate) -> dict[str, Any]:
    k = c.kpis
    return {"promoted_units": len(units), "promoted_tensors": sum(u.size for u in units),
            "units": ";".join(u.label for u in units), "cosine_similarity": k.get("cosine_similarity"),
            "sqnr_db": k.get("sqnr_db"), "task_metric_name": k.get("task_metric_name"),
            "task_metric": k.get("task_metric"), "model_bytes": k.get("model_bytes"),
            "simulated_ms": k.get("mean_inference_ms"), "latency_source": k.get("latency_source"),
            "meets_kpi": c.meets, "verdict": c.verdict, "recipe": c.name, "error": c.error}


def _candidate_rows(effects: list[UnitEffect], ranked: list[PromotionUnit], start_sqnr_db: float | None,
                    runtime: str | None) -> list[dict[str, Any]]:
    order = {u: i + 1 for i, u in enumerate(ranked)}
    rows = []
    for e in sorted(effects, key=lambda e: order.get(e.unit, len(order) + 1)):
        k = e.kpis or {}
        gain = e.sqnr_gain_db(start_sqnr_db) if start_sqnr_db is not None else None
        rows.append({"rank": order.get(e.unit), "unit": e.unit.label, "pre_rank": e.unit.pre_rank,
                     "quantized_tensors": e.unit.size, "tensors": ";".join(e.unit.tensors),
                     "ties": " | ".join(e.unit.ties), "measured_on": runtime, "sqnr_db": k.get("sqnr_db"),
                     "sqnr_gain_db": gain, "cosine_similarity": k.get("cosine_similarity"),
                     "task_metric": k.get("task_metric"), "error": e.error})
    return rows


def _pareto_plot(rows: list[dict[str, Any]], thresholds: Thresholds, start_name: str,
                 cache: ArtifactCache) -> Path:
    """Queue the accuracy-vs-promotions chart, cached by the table's content; return its path."""
    key = content_key("mp-pareto-plot-v1", rows, thresholds.min_sqnr_db, thresholds.min_cosine_similarity, start_name)
    return charts.in_cache(cache, "mixed_precision_plot", key, "pareto.png", charts.pareto_curve, rows,
                           f"Mixed precision from {start_name}: accuracy vs 16-bit promotions",
                           min_sqnr_db=thresholds.min_sqnr_db, min_cosine=thresholds.min_cosine_similarity)
