"""The LLM path's Genie steps: the pair's context binaries run by Qualcomm's Genie on the device.

genie_runtime  Genie dialogs over the prompts: Genie's own profile (init time, time to first token, prompt and
               generation rates) and its tokens checked against the float model's greedy choice
genie_stress   the seed's genie-to-qnn-stress: dialogs in sequence and concurrently, prompts of increasing
               length up to the full context (a few new tokens each, the longest generating to the context's end);
               errors, the runner's memory growth, token rate over time
The driver is harness/runner/genie_runner.py (ctypes over libGenie.so, or a device's genie-t2t-run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.errors import ConfigError
from harness.reporting import charts
from harness.kpi import Limit
from harness.llm.device import BUDGET_OF_TIMEOUT, FloatJudge, _push_data, run_paced
from harness.llm.steps import agreement_kpis
from harness.llm.text import TokenizedPrompt
from harness.models import Thresholds
from harness.runner import genie_runner
from harness.runner.base import latency_source
from harness.runner.client import DeviceRunner
from harness.steps.report import StepReport

GENIE_RUNNER = Path(genie_runner.__file__)
DIALOG_PROMPTS = 4  # Genie's dialog takes the first prompts: each costs a prefill and a decode call per token


@dataclass(frozen=True)
class GenieDevice:
    """Where Genie runs: the bundle's remote folder and the driver's extra flags (genie-t2t-run, its libGenie)."""

    config: str  # remote path of genie_config.json
    flags: tuple[str, ...] = ()


def push_bundle(runner: DeviceRunner, bundle: Path, key: str) -> GenieDevice:
    """Push a Genie bundle folder once per content; on a device with a QAIRT SDK (adb `qairt_sdk:`), push its
    genie-t2t-run and libGenie.so for aarch64 Android too and run through them. Return where it runs."""
    remote = runner.push_dir(bundle, f"genie/{key}")
    flags: tuple[str, ...] = ()
    sdk = getattr(runner.transport, "qairt_sdk", None)
    if sdk is not None and runner.transport.platform == "android":
        binary = Path(sdk) / "bin" / "aarch64-android" / "genie-t2t-run"
        lib = Path(sdk) / "lib" / "aarch64-android" / "libGenie.so"
        if binary.is_file() and lib.is_file():
            runner.transport.push(binary, "qnn/genie-t2t-run")
            runner.transport.push(lib, "qnn/libGenie.so")
            flags = ("--t2t_run", "qnn/genie-t2t-run", "--lib", "qnn/libGenie.so")
    return GenieDevice(f"{remote}/genie_config.json", flags)


def _prompts_file(runner: DeviceRunner, prompts: list[list[int]] | list[str]) -> str:
    return _push_data(runner, "prompts.json", json.dumps(prompts).encode())


def paced_dialog(runner: DeviceRunner, device: GenieDevice, given: list[list[int]] | list[str], max_new: int,
                 out_dir: Path) -> dict:
    """Return genie_runner's `dialog` result over the given prompts, paced as device_nll is: each command gets
    BUDGET_OF_TIMEOUT of the runner's time limit, stops before a prompt likely to pass it, and the rest go in
    further commands (a new dialog each; `commands` says how many; init figures are the first's)."""
    budget = runner.timeout_s * BUDGET_OF_TIMEOUT

    def rest(so_far: dict | None) -> dict:
        done = len(so_far["prompts"]) if so_far else 0
        return runner.run_tool(GENIE_RUNNER, ["dialog", "--config", device.config, "--prompts",
                                              _prompts_file(runner, given[done:]), "--max_new", str(max_new),
                                              "--budget_s", f"{budget:.3f}", *device.flags],
                               keep_dir=out_dir / ("genie_dialog" if not done else f"genie_dialog_{done}"))

    return run_paced(rest, lambda r: len(r["prompts"]), len(given),
                     lambda a, b: dict(a, prompts=a["prompts"] + b["prompts"], remaining=b.get("remaining")),
                     "genie_runner dialog", runner)


def genie_runtime(runner: DeviceRunner, device: GenieDevice, prompts: list[TokenizedPrompt], max_new: int,
                  judge: FloatJudge, float_tokens: list[list[int]], tokenizer, context_length: int,
                  thresholds: Thresholds, out_dir: Path) -> StepReport:
    """Return the Genie runtime report: one dialog over the prompts (as token ids, so Genie's tokens are
    compared exactly), Genie's profile KPIs and the agreement of its tokens with the float model; the first
    DIALOG_PROMPTS prompts (llm_accuracy's agreement covers them all)."""
    given_count = len(prompts)
    prompts, float_tokens = prompts[:DIALOG_PROMPTS], float_tokens[:DIALOG_PROMPTS]
    text_mode = bool(device.flags)  # genie-t2t-run takes text prompts
    given = [p.text for p in prompts] if text_mode else [list(p.ids) for p in prompts]
    result = paced_dialog(runner, device, given, max_new, out_dir)
    rows = result["prompts"]
    for row, prompt in zip(rows, prompts):
        if row.get("generated_ids") is None:  # text out: its ids by the model's tokenizer
            row["generated_ids"] = tokenizer.encode(row.get("text") or "").ids
    agreement = agreement_kpis(judge, prompts, float_tokens, [r["generated_ids"] for r in rows])
    exact, agreeing = agreement["exact_tokens"], agreement["agreeing_tokens"]
    ttft = [r["time_to_first_token_ms"] for r in rows if r.get("time_to_first_token_ms") is not None]
    rates = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s")]
    prompt_rates = [r["prompt_tokens_per_s"] for r in rows if r.get("prompt_tokens_per_s")]
    report = StepReport("genie_runtime")
    report.kpis = {
        "driver": "genie-t2t-run" if text_mode else "libGenie (ctypes)",
        "genie_api_version": result.get("genie_api_version"), "context_length": result.get("context_length")
        or context_length, "prompts": len(rows), "prompts_given": given_count, "max_new_tokens": max_new,
        "init_time_ms": result.get("init_time_ms"), "dialog_commands": result["commands"],
        "time_to_first_token_ms_min": min(ttft) if ttft else None,
        "time_to_first_token_ms_max": max(ttft) if ttft else None,
        "time_to_first_token_range_ms": {"min": min(ttft), "max": max(ttft)} if ttft else None,
        "prompt_tokens_per_s": float(np.mean(prompt_rates)) if prompt_rates else None,
        "tokens_per_s": float(np.mean(rates)) if rates else None,
        "tokens_per_s_min": min(rates) if rates else None,
        "genie_prefix_tokens_min": min(agreeing), "genie_exact_prefix_tokens_min": min(exact),
        "genie_agreeing_tokens": agreeing, "genie_exact_tokens": exact,
        "peak_rss_mb": result.get("peak_rss_mb"),
        "source": latency_source("htp", result.get("machine")),
    }
    report.limits = [Limit("genie_prefix_tokens_min", minimum=min(thresholds.min_genie_prefix_tokens, max_new),
                           marginal=0.0)]
    if thresholds.max_time_to_first_token_ms is not None:
        report.limits.append(Limit("time_to_first_token_ms_max", maximum=thresholds.max_time_to_first_token_ms))
    if thresholds.min_tokens_per_s is not None:
        report.limits.append(Limit("tokens_per_s_min", minimum=thresholds.min_tokens_per_s))
    source = report.kpis["source"]
    report.tables["genie_performance"] = [
        {"prompt": p.text[:60], "prompt_tokens": r.get("num_prompt_tokens"), "generated_tokens": r.get("num_generated_tokens"),
         "time_to_first_token_ms": r.get("time_to_first_token_ms"), "prompt_tokens_per_s": r.get("prompt_tokens_per_s"),
         "tokens_per_s": r.get("tokens_per_s"), "source": source} for p, r in zip(prompts, rows)]
    report.tables["genie_generations"] = [
        {"prompt": p.text, "genie_text": tokenizer.decode(r["generated_ids"]), "float_text": tokenizer.decode(f),
         "exact_tokens": m, "agreeing_tokens": a, "of": len(f)}
        for p, r, f, m, a in zip(prompts, rows, float_tokens, exact, agreeing)]
    report.kpis["generations"] = [{k: row[k] for k in ("prompt", "genie_text", "float_text", "agreeing_tokens")}
                                  for row in report.tables["genie_generations"]]
    if min(exact) < min(agreeing):
        report.notes.append(f"Genie left the float model's greedy path at a near-tie on some prompt (top two float "
                            f"logits within {thresholds.greedy_tie_margin:g}): genie_exact_tokens has the exact counts")
    if source == "simulator":
        report.notes.append("timings are the HTP simulator's on this host, not a phone's")
    if given_count > len(prompts):
        report.notes.append(f"Genie's dialog ran the first {len(prompts)} of the {given_count} prompts; llm_accuracy's "
                            "greedy agreement covers all of them")
    return report


def stress_prompts(ids: np.ndarray, context_length: int, prefill_ar: int, new_tokens: int,
                   count: int = 3) -> list[list[int]]:
    """Return `count` prompts of increasing length cut one after another from ids (repeated when too short): the
    shortest 8 tokens (fewer in a smaller context), the longest context_length - new_tokens, or the most Genie
    takes (context_length - prefill_ar + 1: Genie 1.21 answers a longer prompt GENIE_STATUS_WARNING_CONTEXT_EXCEEDED
    with nothing generated) when that is less. The context is filled through the prompt (a prefill call takes
    prefill_ar tokens at once, a decode call one): each query generates new_tokens but the longest, which the
    runner lets generate to the context's end (at most prefill_ar - 1 tokens more than new_tokens)."""
    if not 1 <= new_tokens < context_length:
        raise ConfigError(f"--genie-stress-new-tokens {new_tokens}: the stress queries generate at least 1 token and "
                          f"leave at least 1 prompt token in the {context_length}-token context (at most "
                          f"{context_length - 1} new tokens)")
    if len(ids) == 0:
        raise ConfigError("the evaluation text has no tokens to cut the stress prompts from")
    longest = max(1, min(context_length - new_tokens, context_length - prefill_ar + 1))
    lengths = np.linspace(min(8, longest), longest, num=count).round().astype(int)
    stream = np.resize(ids, int(lengths.sum()))
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [[int(t) for t in stream[a:b]] for a, b in zip(bounds[:-1], bounds[1:])]


STRESS_TIME_MARGIN = 3.0  # the stress command's time limit: this many times its work at genie_runtime's pace


def stress_time_limit_s(pace: dict, prompts: list[list[int]], new_tokens: int, context_length: int, rounds: int,
                        concurrent: int, floor_s: float) -> float:
    """Return the stress command's time limit: STRESS_TIME_MARGIN times its work at the pace genie_runtime
    measured on this device (its slowest prompt and token rates, its init time), the workers taking turns on
    one NPU, and never under floor_s (the runner's command time limit); floor_s when the pace is unknown."""
    prompt_rate, token_rate = pace.get("prompt_tokens_per_s"), pace.get("tokens_per_s_min")
    if not prompt_rate or not token_rate:
        return floor_s
    longest = max(map(len, prompts))
    generated = [context_length - len(p) if len(p) == longest else new_tokens for p in prompts]
    round_s = sum(len(p) / prompt_rate + g / token_rate for p, g in zip(prompts, generated))
    init_s = (pace.get("init_time_ms") or 0.0) / 1e3
    return max(floor_s, STRESS_TIME_MARGIN * concurrent * (rounds * round_s + init_s))


def genie_stress(runner: DeviceRunner, device: GenieDevice, prompts: list[list[int]], new_tokens: int, rounds: int,
                 concurrent: int, thresholds: Thresholds, out_dir: Path, pace: dict | None = None) -> StepReport:
    """Return the Genie stress report: `concurrent` workers each running `rounds` dialogs over prompts of
    increasing length (stress_prompts), each query generating new_tokens but the longest, which the runner lets
    generate to the context's end; errors, memory growth, token rate over time, and how far the queries reached
    into the context. pace: genie_runtime's KPIs, which set the command's time limit (stress_time_limit_s)."""
    if device.flags:  # genie-t2t-run is one process per prompt: stress the C API driver it shares the config with
        device = GenieDevice(device.config, ())
    out_dir.mkdir(parents=True, exist_ok=True)
    limit_s = stress_time_limit_s(pace or {}, prompts, new_tokens, (pace or {}).get("context_length") or 0, rounds,
                                  concurrent, runner.timeout_s)
    result = runner.run_tool(GENIE_RUNNER, ["stress", "--config", device.config, "--prompts",
                                            _prompts_file(runner, prompts), "--rounds", str(rounds),
                                            "--concurrent", str(concurrent),  # workers as processes (the default)
                                            "--max_new", str(new_tokens)],
                             keep_dir=out_dir / "genie_stress", raise_on_error=False, timeout_s=limit_s)
    queries = result.get("queries") or []
    rates = [q["tokens_per_s"] for q in queries if q.get("tokens_per_s")]
    by_round = {}
    for q in queries:
        if q.get("tokens_per_s"):
            by_round.setdefault(q["round"], []).append(q["tokens_per_s"])
    first, last = (by_round[min(by_round)], by_round[max(by_round)]) if by_round else ([], [])
    context = result.get("context_length")
    reached = [(q.get("num_prompt_tokens") or q.get("prompt_tokens") or 0) + (q.get("num_generated_tokens") or 0)
               for q in queries if not q.get("error")]
    report = StepReport("genie_stress")
    report.kpis = {
        "rounds": rounds, "concurrent": concurrent, "mode": result.get("mode"), "queries": len(queries),
        "time_limit_s": round(limit_s, 1),
        "dialogs": result.get("dialogs"), "errors": result.get("errors", 0 if queries else None),
        "error_names": result.get("error_names") or {},
        "context_length": context, "new_tokens": new_tokens,
        "prompt_tokens": [len(p) for p in prompts], "generated_tokens": sum(q.get("num_generated_tokens") or 0
                                                                            for q in queries),
        "context_tokens_max": max(reached) if reached else None,
        "context_filled": max(reached) / context if reached and context else None,
        "rss_start_mb": result.get("rss_start_mb"), "rss_end_mb": result.get("rss_end_mb"),
        "rss_growth_mb": result.get("rss_growth_mb"), "rss_peak_mb": result.get("rss_peak_mb"),
        "rss_release": result.get("rss_release"),
        "tokens_per_s_mean": float(np.mean(rates)) if rates else None,
        "tokens_per_s_min": min(rates) if rates else None,
        "last_round_vs_first_tokens_per_s": float(np.mean(last) / np.mean(first)) if first else None,
        "source": latency_source("htp", result.get("machine")),
    }
    if result.get("error") and not queries:
        report.failures.append(f"the stress run failed: {result['error']}")
    report.limits = [Limit("errors", maximum=0, marginal=0.0),
                     Limit("rss_growth_mb", maximum=thresholds.max_stress_memory_growth_mb)]
    report.tables["stress_queries"] = [
        {k: q.get(k) for k in ("worker", "round", "prompt_index", "prompt_tokens", "max_new", "num_generated_tokens",
                               "start_s", "end_s", "time_to_first_token_ms", "tokens_per_s", "status_name",
                               "error_name")} for q in queries]
    lengths = ", ".join(str(n) for n in sorted(map(len, prompts)))
    fill = f"{context - max(map(len, prompts))} tokens, to the context's end" if context else "to the context's end"
    report.notes.append(f"the context is filled mostly by the prompt (a prefill call takes the prefill graph's AR "
                        f"tokens at once): prompts of {lengths} tokens, each query generating {new_tokens} tokens but "
                        f"the longest, which generates {fill} (Genie takes at most context - AR + 1 prompt tokens)")
    if reached and context and max(reached) < context:
        report.notes.append(f"no query reached the context's end: at most {max(reached)} of {context} tokens (a query "
                            "ends early at the end-of-text token)")
    if result.get("token_rate_series"):
        report.artifacts["token_rate_chart"] = charts.token_rate_chart(
            result["token_rate_series"], result.get("rss_series") or [],
            f"Genie stress: {concurrent} worker(s) x {rounds} dialog(s), token rate and memory "
            f"({report.kpis['source']})", out_dir / "genie_stress_token_rate.png")
    return report
