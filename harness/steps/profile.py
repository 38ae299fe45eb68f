"""Step 5, performance profiling: latency on the device's runtime, QNN's per-op profile, peak
memory, and an analytic estimate of on-device latency.

Latency follows a rule like MLPerf's: warm-up runs, then at least N iterations and at least D
seconds, every iteration timed on the device; statistics are computed here. The per-op table
comes from a separate, short run with QNN detailed profiling (profiling slows execution, so
it never overlaps the timed loop). Where the runner ran on an x86-64 machine (the emulator, an
x86-64 SSH host, the emulated adb phone) every number comes from the HTP simulator and is
labelled `latency_source: simulator` (RunResult.latency_source of the timed run). The simulator
takes seconds per inference on a real model, so there, unless the user set --min-iterations, the
iteration count is sized by the per-inference cost measured in the warm-up (sized_rule).

The timed iterations are measured in independent blocks (PROFILE_BLOCKS separate runner invocations, each
contributing one sample: its median), because the iterations of one run share its process, host load and
thermal state: `latency_blocks_ms` and their spread `latency_noise_pct` (harness.repeats) are what the
regression step compares. On an emulated device the runner also reports the modelled device time per
iteration (RunResult.emulated_s): `device_latency_ms` and its blocks, labelled `emulated`.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from harness.reporting import charts
from harness.data import Feed
from harness.devices import SocSpec
from harness.errors import StepError
from harness.estimate import estimate_latency, graph_cost
from harness.files import sha256_file
from harness.kpi import INTERVALS_KEY, Limit
from harness.models import Thresholds
from harness.profiling import QnnProfile, median_execute, op_table, parse_profile_csv
from harness.repeats import summary
from harness.runner.base import RunResult, latency_source
from harness.runner.client import DeviceRunner
from harness.steps.context_binary import ContextBinary
from harness.steps.report import StepReport

PROFILE_ITERATIONS = 3  # executions recorded by the detailed-profiling run (medians are taken)
TOP_OPS = 5


@dataclass(frozen=True)
class MeasureRule:
    """How long to measure: warm-up runs, then at least min_iterations and at least min_duration_s.
    budget_s: on the HTP simulator, fewer iterations (at least SIMULATOR_MIN_ITERATIONS) so that
    they take about budget_s at the cost the warm-up measured (None: the rule as is)."""

    min_iterations: int
    min_duration_s: float
    warmup: int
    budget_s: float | None = None

    def __str__(self) -> str:
        return (f"{self.warmup} warm-up runs, then at least {self.min_iterations} iterations "
                f"and at least {self.min_duration_s:g} s")


EMULATOR_RULE = MeasureRule(min_iterations=20, min_duration_s=1.0, warmup=3)
DEVICE_RULE = MeasureRule(min_iterations=100, min_duration_s=10.0, warmup=10)
SIMULATOR_BUDGET_S = 15.0  # timed-loop time on the HTP simulator when the user gave no iteration count
SIMULATOR_MIN_ITERATIONS = 5
PROFILE_BLOCKS = 5  # independent measurement blocks (runner invocations), each one median
# the step's simulator time (probe, blocks, detailed profile) for a slow shipped model (16-bit activations, FP16):
# past it, no probe (the shipped model's measured cost sizes it), fewer blocks of one timed iteration each
PROFILE_STEP_BUDGET_S = 60.0
MIN_SLOW_BLOCKS = 2


def default_rule(transport: str, min_iterations: int | None = None, min_duration_s: float | None = None,
                 warmup: int | None = None) -> MeasureRule:
    """Return the measurement rule for a device transport (small on the emulator, larger on
    hardware reached over adb/ssh), with any given value overriding the default; without a
    given iteration count the count is sized on the HTP simulator (budget_s, see sized_rule)."""
    base = EMULATOR_RULE if transport == "emulator" else DEVICE_RULE
    return MeasureRule(base.min_iterations if min_iterations is None else min_iterations,
                       base.min_duration_s if min_duration_s is None else min_duration_s,
                       base.warmup if warmup is None else warmup,
                       SIMULATOR_BUDGET_S if min_iterations is None else None)


def sized_rule(rule: MeasureRule, inference_s: float) -> tuple[MeasureRule, str]:
    """Return rule with its iteration count cut to what fits rule.budget_s at inference_s per
    iteration (at least SIMULATOR_MIN_ITERATIONS, never more than rule's), and the sentence why."""
    budget_s = rule.budget_s if rule.budget_s is not None else float("inf")
    fit = int(min(budget_s // inference_s, rule.min_iterations)) if inference_s > 0 else rule.min_iterations
    count = max(min(SIMULATOR_MIN_ITERATIONS, rule.min_iterations), min(rule.min_iterations, fit))
    sized = replace(rule, min_iterations=count, budget_s=None)
    if count == rule.min_iterations:
        why = (f"{count} iterations (the rule's): one warm HTP-simulator inference took {inference_s:.3g} s, "
               f"{rule.min_iterations} fit the simulator budget of {rule.budget_s:g} s")
    else:
        why = (f"{count} iterations instead of {rule.min_iterations}: one warm HTP-simulator inference took "
               f"{inference_s:.3g} s, so {count} fit the simulator budget of {rule.budget_s:g} s "
               f"(minimum {SIMULATOR_MIN_ITERATIONS}); simulator wall time is not a phone latency, and "
               "--min-iterations sets the count")
    return sized, why


@dataclass(frozen=True)
class LatencyStats:
    """Latency statistics over the timed iterations, in milliseconds."""

    min: float
    p50: float
    p90: float
    p99: float
    max: float
    mean: float
    std: float
    iterations: int

    def as_dict(self) -> dict[str, float]:
        """The statistics as the `latency_ms` KPI object."""
        return {"min": self.min, "p50": self.p50, "p90": self.p90, "p99": self.p99, "max": self.max,
                "mean": self.mean, "std": self.std}


def latency_stats(times_s: Sequence[float]) -> LatencyStats:
    """Return min, p50, p90, p99, max, mean and sample standard deviation of times_s, in ms
    (numpy's linear-interpolation percentiles). Raises StepError for no times."""
    ms = np.asarray(times_s, dtype=np.float64) * 1000.0
    if ms.size == 0:
        raise StepError("no timed iterations to compute latency statistics from")
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return LatencyStats(float(ms.min()), float(p50), float(p90), float(p99), float(ms.max()), float(ms.mean()),
                        float(ms.std(ddof=1)) if ms.size > 1 else 0.0, int(ms.size))


@dataclass(frozen=True)
class Measurement:
    """A timed run on the device: statistics, every iteration in ms, loop wall time, peak memory."""

    stats: LatencyStats
    times_ms: list[float]
    duration_s: float
    peak_rss_mb: float | None
    run: RunResult


def measure_latency(runner: DeviceRunner, model: Path, feeds: list[Feed], runtime: str,
                    rule: MeasureRule, intra_op_threads: int = 0) -> Measurement:
    """Time model on the device's runtime over feeds under rule; return the measurement
    (intra_op_threads: onnxruntime's CPU threads, 0 for its default)."""
    run = runner.run(model, feeds, runtime, warmup=rule.warmup, min_iterations=rule.min_iterations,
                     min_duration_s=rule.min_duration_s, intra_op_threads=intra_op_threads)
    return Measurement(latency_stats(run.iteration_s), [t * 1000.0 for t in run.iteration_s], run.measured_s,
                       run.peak_rss_mb, run)


@dataclass(frozen=True)
class Blocked:
    """A timed measurement in independent blocks (one runner invocation each, under `rule`), and why the
    iteration count was sized for the HTP simulator (None: it was not)."""

    blocks: list[Measurement]
    rule: MeasureRule
    sized_why: str | None = None
    slow: bool = False  # sized by slow_plan (a one-execution detailed profile follows)

    @property
    def times_ms(self) -> list[float]:
        """Every timed iteration of every block, in ms."""
        return [t for b in self.blocks for t in b.times_ms]

    @property
    def stats(self) -> LatencyStats:
        """Statistics over every timed iteration."""
        return latency_stats([t / 1000.0 for t in self.times_ms])

    @property
    def medians_ms(self) -> list[float]:
        """One sample per block: its median latency, ms."""
        return [round(b.stats.p50, 4) for b in self.blocks]

    @property
    def emulated_ms(self) -> list[float] | None:
        """Per block, the median modelled device time (RunResult.emulated_s), ms; None unless every block has it."""
        times = [getattr(b.run, "emulated_s", None) for b in self.blocks]
        if not times or any(not t for t in times):
            return None
        return [round(float(np.median(t)) * 1000.0, 6) for t in times]

    @property
    def peak_rss_mb(self) -> list[float] | None:
        """Per block, the runner's peak resident memory (None unless every block reported it)."""
        peaks = [b.peak_rss_mb for b in self.blocks]
        return None if any(p is None for p in peaks) else peaks

    @property
    def duration_s(self) -> float:
        """Timed-loop wall time summed over the blocks."""
        return sum(b.duration_s for b in self.blocks)


def block_rule(rule: MeasureRule, blocks: int) -> MeasureRule:
    """Return the rule of one of `blocks` blocks that together meet rule: ceil(min_iterations / blocks)
    iterations (at least 1) and min_duration_s / blocks seconds each, rule's warm-up in every block."""
    return MeasureRule(max(1, math.ceil(rule.min_iterations / blocks)), rule.min_duration_s / blocks, rule.warmup)


def planned_inferences(rule: MeasureRule, blocks: int, inference_s: float) -> int:
    """Return the simulator inferences the profile step runs at inference_s each under rule: the probe (its
    warm-ups and one timed), each block's outputs pass and timed iterations (sized_rule's count), and the
    detailed profile."""
    count = sized_rule(rule, inference_s)[0].min_iterations
    return rule.warmup + 1 + blocks * (1 + math.ceil(count / blocks)) + PROFILE_ITERATIONS


def slow_plan(rule: MeasureRule, blocks: int, inference_s: float) -> tuple[MeasureRule, int, str]:
    """Return the rule, block count and why for a model whose planned_inferences exceed PROFILE_STEP_BUDGET_S:
    one timed iteration in each of as many blocks (an outputs pass and a timed one each) as fit the budget with
    a one-execution detailed profile, at least MIN_SLOW_BLOCKS, never more than blocks."""
    fit = int((PROFILE_STEP_BUDGET_S / inference_s - 2) // 2) if inference_s > 0 else blocks
    count = max(min(MIN_SLOW_BLOCKS, blocks), min(blocks, fit))
    planned = planned_inferences(rule, blocks, inference_s)
    why = (f"{count} blocks of 1 timed iteration and no probe run (the rule's plan, {planned} inferences, would "
           f"take about {planned * inference_s:.0f} s): one HTP-simulator "
           f"inference of the shipped model took {inference_s:.3g} s, and the step's simulator budget is "
           f"{PROFILE_STEP_BUDGET_S:g} s (minimum {MIN_SLOW_BLOCKS} blocks; {2 * count + 2} inferences with the "
           "detailed profile's outputs pass and one execution); simulator wall time is not a phone latency")
    return replace(rule, min_iterations=count, min_duration_s=0.0, warmup=0, budget_s=None), count, why


def measure_blocks(runner: DeviceRunner, model: Path, feed: Feed, rule: MeasureRule,
                   blocks: int = PROFILE_BLOCKS, inference_s: float | None = None) -> Blocked:
    """Time model on the device's `htp` runtime in `blocks` separate runner invocations that together meet
    rule. A rule without budget_s, or a device whose HTP is real (aarch64), runs as is; otherwise, when
    inference_s (the model's measured cost) makes the plan exceed PROFILE_STEP_BUDGET_S, slow_plan sizes it
    without a probe; else a first session runs the warm-ups and times one warm inference, the count is cut by
    sized_rule, and each block is warmed by its outputs pass only."""
    why = None
    simulated = rule.budget_s is not None and latency_source("htp", runner.device_platform()[0]) != "device"
    if simulated and inference_s and planned_inferences(rule, blocks, inference_s) * inference_s > \
            PROFILE_STEP_BUDGET_S:
        rule, blocks, why = slow_plan(rule, blocks, inference_s)
        return Blocked([measure_latency(runner, model, [feed], "htp", block_rule(rule, blocks))
                        for _ in range(blocks)], block_rule(rule, blocks), why, slow=True)
    if simulated:
        probe = runner.run(model, [feed], "htp", warmup=rule.warmup)
        if probe.latency_source == "simulator" and probe.inference_s:
            rule, why = sized_rule(rule, probe.inference_s[0])
            rule = replace(rule, warmup=0)
    per_block = block_rule(replace(rule, budget_s=None), blocks)
    return Blocked([measure_latency(runner, model, [feed], "htp", per_block) for _ in range(blocks)], per_block, why)


def context_sha256(ctx: ContextBinary) -> str:
    """Return one sha256 over every file the context binary ships (each file's name and sha256, in order)."""
    import hashlib

    lines = "".join(f"{p.name} {sha256_file(p)}\n" for p in ctx.files)
    return hashlib.sha256(lines.encode()).hexdigest()


def detailed_profile(runner: DeviceRunner, model: Path, feed: Feed, keep_dir: Path,
                     iterations: int = PROFILE_ITERATIONS) -> QnnProfile:
    """Run model on the device's HTP with QNN detailed profiling (iterations executions); return the parsed
    profile."""
    runner.run(model, [feed], "htp", profiling_level="detailed", min_iterations=iterations, keep_dir=keep_dir)
    csv_path = keep_dir / "qnn_profile.csv"
    if not csv_path.is_file():
        raise StepError(f"the device runner wrote no QNN profile for {model.name}")
    return parse_profile_csv(csv_path)


def _op_types(model: Path) -> dict[str, str]:
    import onnx

    return {n.name: n.op_type for n in onnx.load(str(model), load_external_data=False).graph.node if n.name}


def profile(ctx: ContextBinary, qdq_model: Path, feed: Feed, runner: DeviceRunner, soc: SocSpec,
            thresholds: Thresholds, rule: MeasureRule, out_dir: Path, label: str,
            placement: list[dict] | None = None, blocks: int = PROFILE_BLOCKS,
            inference_s: float | None = None) -> StepReport:
    """Return the Step 5 report for the context binary on the device's `htp` runtime, its latency timed in
    `blocks` independent blocks (fewer, and a one-execution detailed profile, for a slow model: inference_s,
    its measured cost, see measure_blocks).

    Writes a latency histogram, a per-op bar chart and the raw QNN profile CSV into out_dir and
    lists them in the report's artifacts.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    timed = measure_blocks(runner, ctx.model, feed, rule, blocks, inference_s)
    rule, sized_why = timed.rule, timed.sized_why
    source = timed.blocks[0].run.latency_source
    histogram = charts.latency_histogram(  # queued now: drawn on the chart thread while the detailed profile runs
        timed.times_ms, timed.stats.as_dict(), f"{label}: latency ({source}, {timed.stats.iterations} iterations)",
        out_dir / "latency_histogram.png")
    per_op_source = "context_binary"
    executions = 1 if timed.slow else PROFILE_ITERATIONS
    qnn = detailed_profile(runner, ctx.model, feed, out_dir / "profile_run", executions)
    if not qnn.has_node_rows:
        per_op_source = "qdq_model (the context binary's profile had no per-node rows)"
        shutil.rmtree(out_dir / "profile_run", ignore_errors=True)
        qnn = detailed_profile(runner, qdq_model, feed, out_dir / "profile_run", executions)
    rows = [r.as_dict() for r in op_table(qnn, _op_types(qdq_model))]
    per_op_chart = charts.per_op_bars(rows, f"{label}: top ops by cycles ({source})", out_dir / "per_op_cycles.png")
    csv_path = out_dir / "qnn_profile.csv"
    shutil.copyfile(qnn.path, csv_path)
    execute = median_execute(qnn)
    estimate = estimate_latency(graph_cost(qdq_model), soc)
    report = StepReport("profile")
    report.kpis = {
        "runtime": "htp",
        "artifact": "context_binary",
        "latency_source": source,
        "latency_ms": timed.stats.as_dict(),
        "latency_samples_ms": [round(t, 4) for t in timed.times_ms],  # every timed iteration (the histogram's)
        "iterations": timed.stats.iterations,
        "duration_s": timed.duration_s,
        "warmup_iterations": rule.warmup,
        "measurement_rule": f"{len(timed.blocks)} blocks (separate runner invocations), each: {rule}",
        "block_rule": {"min_iterations": rule.min_iterations, "min_duration_s": rule.min_duration_s,
                       "warmup": rule.warmup},
        "iterations_reason": sized_why or f"the measurement rule ({rule.min_iterations} iterations at least "
                                          "per block)",
        "peak_rss_mb": max(timed.peak_rss_mb) if timed.peak_rss_mb else None,
        # what the regression step compares: the artifact measured, independent blocks and their spread
        "artifact_path": str(ctx.model),
        "artifact_key": ctx.directory.name,
        "artifact_sha256": context_sha256(ctx),
        **_repeats("latency", "ms", timed.medians_ms),
        **(_repeats("peak_rss", "mb", timed.peak_rss_mb) if timed.peak_rss_mb else {}),
        "top_ops": [{k: r[k] for k in ("node", "op_type", "cycles", "share")} for r in rows[:TOP_OPS]],
        "per_op_source": per_op_source,
        "profiled_executions": len(qnn.executions),
        "ops_profiled": len(rows),
        "total_op_cycles": sum(r["cycles"] for r in rows),
        # the accelerator's own execute time per inference while detailed profiling ran (which slows it)
        "profiled_accelerator_us": execute["accelerator_us"],
        "estimated_latency_ms": estimate.latency_ms,
        "estimated_latency_basis": estimate.basis,
    }
    report.kpis[INTERVALS_KEY] = {"latency_ms.p50": summary(timed.medians_ms).interval.as_dict()}
    emulated = timed.emulated_ms
    if emulated:
        repeats = summary(emulated)
        report.kpis.update({"device_latency_ms": round(repeats.value, 6), "device_latency_source": "emulated",
                            **_repeats("device_latency", "ms", emulated)})
        report.kpis[INTERVALS_KEY]["device_latency_ms"] = repeats.interval.as_dict()
    if source == "simulator":
        report.kpis["cycles_note"] = "simulated HTP cycles and times (HTP simulator), not a phone's"
    if placement:
        report.kpis["placement"] = {k: sum(r["placement"] == k for r in placement)
                                    for k in sorted({r["placement"] for r in placement})}
        report.tables["placement"] = placement
    report.tables["per_op"] = rows
    _budget(report, thresholds, source, timed.stats, estimate.latency_ms, soc)
    report.artifacts["latency_histogram"] = histogram
    report.artifacts["per_op_cycles"] = per_op_chart
    report.artifacts["qnn_profile_csv"] = csv_path
    return report


def _repeats(name: str, unit: str, values: list[float]) -> dict[str, object]:
    """Return the KPIs of a figure measured in blocks: `<name>_blocks_<unit>` (one value per block) and
    `<name>_noise_pct` (their relative spread, see harness.repeats.summary)."""
    return {f"{name}_blocks_{unit}": values, f"{name}_noise_pct": summary(values).noise_pct}


def _budget(report: StepReport, thresholds: Thresholds, source: str, stats: LatencyStats,
            estimate_ms: float | None, soc: SocSpec) -> None:
    """Hold the latency budget (when the model spec gives one) against the right number:
    p90 measured on a real device's HTP; elsewhere (the HTP simulator) the analytic estimate,
    because simulator wall time is not a phone latency (a failure there means even the
    estimate misses it)."""
    budget = thresholds.latency_budget_ms
    if budget is None:
        return
    report.kpis["latency_budget_ms"] = budget
    if source == "device":
        value, basis = stats.p90, "p90 of the latency measured on the device"
    else:
        value = estimate_ms
        basis = (f"estimated_latency_ms (the measured latency is latency_source '{source}', not a phone's HTP; "
                 "the estimate is optimistic, so only a failure is conclusive)")
    report.kpis["budget_latency_ms"] = value
    report.kpis["budget_latency_basis"] = basis
    if value is None:
        report.failures.append(f"latency budget {budget:g} ms cannot be checked without a device measurement "
                               f"(latency_source '{source}'): the catalog has "
                               f"neither int8_tops nor ddr_bandwidth_gbps for {soc.id} (add them to devices.yaml)")
        return
    report.limits.append(Limit("budget_latency_ms", maximum=budget))
