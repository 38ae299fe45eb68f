"""The step table: one declaration per onboarding step, in the sign-off order.

A Step names the Onboarding method it calls (its own name unless `run` says otherwise), its prerequisites and
how a failed one skips it, its extra skip condition, its suite's markers, its headline KPIs and its regression
rules. The plugin's step fixtures, the terminal summary's headlines, the regression gate's rules, LLM_STEPS and
the sign-off's step order are derived from it. Adding a step is one entry in STEPS (or `register(Step(...))`
from a conftest or plugin) plus its function. This module imports neither pytest nor the pipeline.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness.baseline import baseline_path
from harness.errors import HarnessError

PASSED = "passed"  # Outcome.require(): skipped unless the prerequisite passed (an inconclusive one counts)
RAN = "ran"  # Outcome.require_value(): skipped only when the prerequisite raised
GROUPS = ("onboarding", "validation", "llm")
WALL = "latency_ms.p50"  # the wall-time latency figure: simulator or device


@dataclass(frozen=True)
class StepOptions:
    """What a step's callables see besides its Onboarding: the target, the parsed command line (pytest's
    config.option), the run's HarnessSession (targets, records, cache) and the target's Onboarding, built on
    first call (a skip condition may decide before the device is connected)."""

    target: Any
    option: argparse.Namespace
    session: Any
    onboarding: Callable[[], Any]


@dataclass(frozen=True)
class Prerequisite:
    """A step this one needs: mode PASSED skips it unless that step passed, RAN only when that step raised;
    when (None: always) says whether the prerequisite applies to this run."""

    step: str
    mode: str = PASSED
    when: Callable[[StepOptions], bool] | None = None


@dataclass(frozen=True)
class KpiRule:
    """How one KPI of one step is compared: kind is 'higher' (absolute tolerance), 'task' (absolute tolerance in
    the task metric's direction, see harness.steps.regression), 'lower' (relative threshold) or 'blocks'
    (independent blocks, see compare_blocks); setting names the Thresholds field;
    blocks and noise name the KPIs holding its block values and their spread, source its label's KPI."""

    step: str
    kpi: str
    kind: str
    setting: str
    unit: str = ""
    blocks: str = ""
    noise: str = ""
    source: str = ""


@dataclass(frozen=True)
class Step:
    """One onboarding step: run(onboarding, options) returns its StepReport (None: the Onboarding method of
    its name); requires its prerequisites in order; skip(options) a reason not to run (None: it runs); markers
    its suite's pytest markers besides step(name); headline(kpis) the summary's short text; page_kpis the KPIs
    the sign-off page shows (None: its scalar KPIs); rules the regression gate's KPI rules; scope its fixture's
    pytest scope."""

    name: str
    doc: str
    group: str = "onboarding"
    requires: tuple[Prerequisite, ...] = ()
    run: Callable[[Any, StepOptions], Any] | None = None
    skip: Callable[[StepOptions], str | None] | None = None
    markers: tuple[str, ...] = ()
    headline: Callable[[dict], str] | None = None
    page_kpis: tuple[str, ...] | None = None
    rules: tuple[KpiRule, ...] = ()
    scope: str = "session"

    def call(self, onboarding: Any, options: StepOptions) -> Any:
        """Return the step's report for onboarding (its run, else the Onboarding method of its name)."""
        return self.run(onboarding, options) if self.run is not None else getattr(onboarding, self.name)()


def passed(step: str) -> Prerequisite:
    """Return a prerequisite that must have passed (Outcome.require)."""
    return Prerequisite(step, PASSED)


def ran(step: str, when: Callable[[StepOptions], bool] | None = None) -> Prerequisite:
    """Return a prerequisite that must have run without raising (Outcome.require_value)."""
    return Prerequisite(step, RAN, when)


def num(value: Any, fmt: str) -> str:
    """Return value formatted with fmt, or '-' when it is not a number."""
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _mib(k: dict, key: str) -> str:
    return num((k.get(key) or 0) / 2**20, ".2f")


# --- what some steps need of the run besides the Onboarding method --------------------------------------

def _sweep_off(options: StepOptions) -> bool:
    return options.session.accuracy.sweep == "off"


def _context_binary(onboarding: Any, options: StepOptions) -> Any:
    """The context binary's report; when PTQ missed its accuracy limits the deployable model is still compiled
    (its size and load time are worth knowing), with a note saying so."""
    report = onboarding.context_binary()
    problems = onboarding.ptq().problems()
    if problems:
        report.notes.append(f"PTQ did not pass ({problems[0]}); compiled the deployable model the "
                            "pipeline chose (mixed precision's when it met the KPIs, else PTQ's)")
    return report


def _profile(onboarding: Any, options: StepOptions) -> Any:
    """The profile measured under the rule of --min-iterations, --min-duration, --warmup-iterations in
    --latency-blocks blocks."""
    from harness.steps.profile import PROFILE_BLOCKS, default_rule

    opt = options.option
    rule = default_rule(onboarding.target.device.transport, opt.min_iterations, opt.min_duration,
                        opt.warmup_iterations)
    return onboarding.profile(rule, opt.latency_blocks or PROFILE_BLOCKS)


def _concurrency(onboarding: Any, options: StepOptions) -> Any:
    """N sessions at once, with the run's other models on the same device (those whose context binary builds)."""
    others = []
    for target in options.session.targets:
        # a language model (kind llm) has no single context binary to run beside
        if (target.device.id == onboarding.target.device.id and target.model.name != onboarding.target.model.name
                and not target.model.is_llm):
            other = options.session.onboarding(target)
            try:
                other.context_artifact()
            except HarnessError:
                continue
            others.append(other)
    return onboarding.concurrency(others)


def option_dir(value: str | None) -> Path | None:
    """Return the directory an option names, absolute (None without the option)."""
    return Path(value).expanduser().absolute() if value else None


def _regression_skip(options: StepOptions) -> str | None:
    root, target = option_dir(options.option.baseline), options.target
    if root is None:
        return "no --baseline DIR given: there is no baseline to compare this run with"
    path = baseline_path(root, target.device.id, target.model.name)
    if not path.is_file():
        return (f"no baseline for {target.device.id} x {target.model.name}: expected {path} "
                f"(write it with --save-baseline {root})")
    return None


def _regression(onboarding: Any, options: StepOptions) -> Any:
    """This run's records of the target against its baseline file, with an interleaved A/B on the target's
    device where the baseline's artifact is in the cache."""
    from harness.latency_ab import Bench
    from harness.steps.regression import regression_against

    target, session = options.target, options.session
    path = baseline_path(option_dir(options.option.baseline), target.device.id, target.model.name)
    bench = Bench(onboarding.runner, lambda: onboarding.dataset().evaluation[0], session.cache.root)
    return regression_against(path, target, session.records, session.cache, bench)


def _accuracy_rules(step: str) -> tuple[KpiRule, ...]:
    return (KpiRule(step, "task_metric", "task", "regression_accuracy_tolerance"),
            *(KpiRule(step, kpi, "higher", setting, unit)
              for kpi, setting, unit in (("cosine_similarity", "regression_accuracy_tolerance", ""),
                                         ("sqnr_db", "regression_sqnr_tolerance_db", "dB"))))


# --- the table --------------------------------------------------------------------------------------------

STEPS: tuple[Step, ...] = (
    Step("feasibility", "Step 1 outcome.",
         page_kpis=("nodes_total", "nodes_on_htp", "htp_fraction", "unsupported_ops", "unsupported_nodes",
                    "largest_activation_bytes", "weights_bytes", "fits_vtcm"),
         headline=lambda k: f"HTP share {num(k.get('htp_fraction'), '.0%')}"
         + (f", unsupported {', '.join(k['unsupported_ops'])}" if k.get("unsupported_ops") else "")),
    Step("conversion", "Step 2 outcome.",
         page_kpis=("nodes_before", "nodes_after", "folded", "opset_before", "opset_after", "transforms",
                    "rewrites_applied", "equivalence_max_abs_diff", "equivalence_cosine", "input_shapes"),
         headline=lambda k: f"{k.get('nodes_before', '?')} -> {k.get('nodes_after', '?')} nodes, "
                            f"equivalence cosine {num(k.get('equivalence_cosine'), '.6f')}"),
    Step("float_baseline", "Step 3 stage 1 outcome (needs conversion).", requires=(passed("conversion"),),
         page_kpis=("runtime", "max_abs_diff", "elements_out_of_tolerance", "task_metric_name", "task_metric"),
         headline=lambda k: f"max |diff| {num(k.get('max_abs_diff'), '.3g')}"),
    Step("ptq", "Step 3 stage 2 outcome (needs feasibility and conversion).",
         requires=(passed("feasibility"), passed("conversion")), rules=_accuracy_rules("ptq"),
         page_kpis=("recipe", "task_metric_name", "task_metric", "float_task_metric", "task_metric_drop",
                    "task_metric_ratio", "cosine_similarity", "sqnr_db", "runtime"),
         headline=lambda k: f"PTQ cosine {num(k.get('cosine_similarity'), '.4f')}, "
                            f"SQNR {num(k.get('sqnr_db'), '.1f')} dB"),
    Step("error_isolation", "Step 3 stage 3 outcome (runs for every model; fails only when PTQ missed its KPI).",
         requires=(ran("ptq"),),
         page_kpis=("layers_compared", "first_divergent_node", "divergence_cause", "min_cosine_similarity",
                    "worst_nodes"),
         headline=lambda k: f"first divergent node {k.get('first_divergent_node') or 'none'}"),
    Step("sweep", "Step 3 stage 4 outcome (skipped with --sweep off).",
         requires=(passed("feasibility"), passed("conversion")),
         skip=lambda o: ("--sweep off: no quantization sweep; mixed precision starts from the PTQ recipe"
                         if _sweep_off(o) else None),
         page_kpis=("best", "best_meets_kpi", "candidates_meeting_kpi", "candidates", "task_metric",
                    "cosine_similarity", "sqnr_db"),
         headline=lambda k: f"best {k.get('best', '-')}"),
    Step("mixed_precision", "Step 3 stage 5 outcome (needs error isolation's ranking, and the sweep unless "
         "--sweep off).", requires=(ran("error_isolation"), ran("sweep", when=lambda o: not _sweep_off(o))),
         page_kpis=("met_threshold", "promoted_tensor_count", "promoted_units", "task_metric", "cosine_similarity",
                    "sqnr_db", "model_bytes_increase_pct"),
         headline=lambda k: f"{k.get('promoted_tensor_count', 0)} promoted, met KPI {k.get('met_threshold')}"),
    Step("aimet", "Step 3 stage 6 outcome: AIMET recovery after mixed precision; skipped saying why when --aimet "
         "off, when the aimet extra is not installed, or (auto) when PTQ or mixed precision met the KPI.",
         requires=(ran("ptq"),), skip=lambda o: o.onboarding().aimet_skip_reason(),
         headline=lambda k: f"met KPI {k.get('met_threshold')}"),
    Step("context_binary", "Step 4 outcome. Needs a quantized model, so PTQ must have run without error; when "
         "PTQ missed its accuracy limits the deployable model is still compiled, with a note saying so.",
         requires=(ran("ptq"),), run=_context_binary,
         rules=(KpiRule("context_binary", "context_bytes", "lower", "regression_size_threshold", "bytes"),),
         page_kpis=("context_bytes", "compile_s", "load_s", "jit_load_s", "load_speedup", "qnn_sdk", "cache_hit"),
         headline=lambda k: f"{_mib(k, 'context_bytes')} MiB, load {num(k.get('load_s'), '.3g')} s"),
    Step("profile", "Step 5 outcome (needs the compiled context binary).", requires=(ran("context_binary"),),
         run=_profile,
         rules=(KpiRule("profile", "device_latency_ms", "blocks", "regression_latency_threshold", "ms",
                        "device_latency_blocks_ms", "device_latency_noise_pct", "device_latency_source"),
                KpiRule("profile", WALL, "blocks", "regression_latency_threshold", "ms", "latency_blocks_ms",
                        "latency_noise_pct", "latency_source"),
                KpiRule("profile", "peak_rss_mb", "blocks", "regression_memory_threshold", "MB",
                        "peak_rss_blocks_mb", "peak_rss_noise_pct")),
         page_kpis=("latency_ms", "latency_source", "iterations", "peak_rss_mb", "estimated_latency_ms", "top_ops"),
         headline=lambda k: f"p50 {num((k.get('latency_ms') or {}).get('p50'), '.3g')} ms, "
                            f"p90 {num((k.get('latency_ms') or {}).get('p90'), '.3g')} ms "
                            f"({k.get('latency_source', '?')})"),
    Step("runtime", "Step 6 outcome (needs the compiled context binary).", requires=(ran("context_binary"),),
         page_kpis=("cosine_similarity", "max_abs_diff", "bit_exact", "executed_on"),
         headline=lambda k: f"cosine {num(k.get('cosine_similarity'), '.6f')}"),
    Step("validation_accuracy", "Step 7 outcome: end-to-end task accuracy of the context binary (needs the "
         "compiled binary).", group="validation", requires=(passed("context_binary"),), markers=("validation",),
         rules=_accuracy_rules("validation_accuracy"),
         page_kpis=("deployed_model", "samples", "task_metric_name", "task_metric", "task_metric_drop",
                    "task_metric_ratio", "cosine_similarity"),
         headline=lambda k: f"{k.get('task_metric_name', 'metric')} {num(k.get('task_metric'), '.4g')}, "
                            f"cosine {num(k.get('cosine_similarity'), '.4f')}"),
    Step("sustained", "Step 7 outcome: cooldown, soak, thermals (needs the compiled binary).", group="validation",
         requires=(passed("context_binary"),), markers=("validation",),
         page_kpis=("stability_pct", "sustained_to_peak", "throttling_onset_s", "max_temp_c", "max_temp_zone",
                    "max_skin_temp_c", "thermal_status_max_name", "latency_ms", "telemetry_source"),
         headline=lambda k: f"stability {num(k.get('stability_pct'), '.0f')}%, "
                            f"onset {num(k.get('throttling_onset_s'), 'g')} s, "
                            f"max {num(k.get('max_temp_c'), '.1f')} °C {k.get('max_temp_zone') or ''} "
                            f"({k.get('telemetry_source', '?')})"),
    Step("energy", "Step 7 outcome: energy per inference (needs the compiled binary).", group="validation",
         requires=(passed("context_binary"),), markers=("validation",),
         rules=(KpiRule("energy", "energy_per_inference_mj", "blocks", "regression_energy_threshold", "mJ",
                        "energy_blocks_mj", "energy_noise_pct"),),
         page_kpis=("energy_per_inference_mj", "inferences_per_joule", "mean_power_w", "idle_power_w", "inferences",
                    "sampling_interval_s", "power_source"),
         headline=lambda k: f"{num(k.get('energy_per_inference_mj'), '.3g')} mJ/inference "
                            f"({k.get('power_source', '?')})"),
    Step("concurrency", "Step 7 outcome: N sessions at once, with the run's other models on the same device when "
         "there are several (those whose context binary builds).", group="validation",
         requires=(passed("context_binary"),), run=_concurrency, markers=("validation",),
         page_kpis=("sessions", "mode", "aggregate_throughput_ips", "latency_degradation", "errors"),
         headline=lambda k: f"{k.get('sessions', '?')} sessions, "
                            f"degradation x{num(k.get('latency_degradation'), '.2f')}, errors {k.get('errors', '-')}"),
    Step("regression", "The regression step's outcome: this run's records of the target against its baseline file "
         "(function scope: it reads the records of the steps that ran before it), with an interleaved A/B on the "
         "target's device where the baseline's artifact is in the cache. Skipped without --baseline, or when the "
         "baseline directory has no file for this device x model.", skip=_regression_skip, run=_regression,
         scope="function", headline=lambda k: f"regressed: {', '.join(k.get('regressed') or []) or 'none'}"),
    Step("llm_conversion", "LLM Step 2 outcome: both graphs converted.", group="llm", markers=("llm",),
         page_kpis=("layers", "context_length", "prefill_ar", "vocab", "prefill_nodes_after", "decode_nodes_after",
                    "prefill_equivalence_cosine", "decode_equivalence_cosine", "reference", "reference_top1_agreement",
                    "reference_cosine_min", "import_s"),
         headline=lambda k: f"prefill {k.get('prefill_nodes_after', '?')} / decode {k.get('decode_nodes_after', '?')} "
                            f"nodes, AR-{k.get('prefill_ar', '?')} CL-{k.get('context_length', '?')}"),
    Step("llm_feasibility", "LLM Step 1 outcome (needs conversion: placement is checked on what ships).",
         group="llm", requires=(passed("llm_conversion"),), markers=("llm",),
         page_kpis=("prefill_htp_fraction", "decode_htp_fraction", "weights_bytes", "kv_cache_bytes",
                    "activation_bytes", "memory_footprint_bytes",
                    "memory_of_soc_budget", "max_context_length_in_budget", "trained_context_length", "memory_basis"),
         headline=lambda k: f"HTP share {num(k.get('prefill_htp_fraction'), '.0%')} / "
                            f"{num(k.get('decode_htp_fraction'), '.0%')}, KV cache {_mib(k, 'kv_cache_bytes')} MiB, "
                            f"largest context in the SoC's memory {k.get('max_context_length_in_budget', '-')} "
                            "(estimate)"),
    Step("llm_accuracy", "LLM Step 3 outcome (needs feasibility).", group="llm",
         requires=(passed("llm_feasibility"),), markers=("llm",),
         page_kpis=("recipe", "perplexity_float_host", "perplexity_qdq_host", "perplexity_htp",
                    "perplexity_increase", "greedy_agreement", "greedy_exact_agreement", "source"),
         headline=lambda k: f"{k.get('recipe', '?')} perplexity HTP {num(k.get('perplexity_htp'), '.2f')} vs float "
                            f"{num(k.get('perplexity_float_host'), '.2f')}, "
                            f"greedy {num(k.get('greedy_agreement'), '.0%')}"),
    Step("llm_context_binary", "LLM Step 4 outcome (needs feasibility).", group="llm",
         requires=(passed("llm_feasibility"),), markers=("llm",),
         headline=lambda k: f"{_mib(k, 'context_bytes')} MiB"),
    Step("genie_runtime", "LLM Step 5 outcome (needs the context binaries, and the float model's tokens from "
         "accuracy).", group="llm", requires=(passed("llm_context_binary"), ran("llm_accuracy")), markers=("llm",),
         page_kpis=("driver", "context_length", "init_time_ms", "time_to_first_token_ms_min",
                    "time_to_first_token_ms_max", "prompt_tokens_per_s", "tokens_per_s", "genie_prefix_tokens_min",
                    "source", "decode_bandwidth_ceiling_tokens_per_s", "tokens_per_s_of_bandwidth_ceiling"),
         headline=lambda k: f"{num(k.get('tokens_per_s'), '.1f')} tokens/s, first token "
                            f"{num(k.get('time_to_first_token_ms_min'), '.0f')}-"
                            f"{num(k.get('time_to_first_token_ms_max'), '.0f')} ms ({k.get('source', '?')})"),
    Step("genie_stress", "LLM Step 7 outcome (needs Genie to run at all).", group="llm",
         requires=(ran("genie_runtime"),), markers=("llm", "validation"),
         page_kpis=("queries", "errors", "rss_growth_mb", "tokens_per_s_mean", "last_round_vs_first_tokens_per_s",
                    "source"),
         headline=lambda k: f"{k.get('queries', '?')} queries, errors {k.get('errors', '-')}, "
                            f"RSS +{num(k.get('rss_growth_mb'), '.0f')} MB"),
)

_registered: list[Step] = []


def register(step: Step) -> None:
    """Add a step after the table's (from a conftest or plugin, before pytest_configure: the plugin makes its
    fixture then). Raises ValueError for a name the table already has."""
    if any(s.name == step.name for s in steps()):
        raise ValueError(f"step '{step.name}' is declared already")
    if step.group not in GROUPS:
        raise ValueError(f"step '{step.name}': group '{step.group}' is not one of {', '.join(GROUPS)}")
    _registered.append(step)


def steps() -> tuple[Step, ...]:
    """Return every step in the sign-off order: the table's, then the registered ones."""
    return (*STEPS, *_registered)


def find(name: str) -> Step | None:
    """Return the step of that name (None when no step has it)."""
    return next((s for s in steps() if s.name == name), None)


def names(group: str | None = None) -> tuple[str, ...]:
    """Return the step names in order (of one group when given)."""
    return tuple(s.name for s in steps() if group is None or s.group == group)


def rules() -> tuple[KpiRule, ...]:
    """Return the regression rules of every step, in step order."""
    return tuple(rule for s in steps() for rule in s.rules)
