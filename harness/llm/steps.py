"""The LLM path's steps (kind-llm models): plain functions from the graph pair's artifacts to StepReports.

llm_feasibility   both graphs' placement on the HTP (quantized form, CPU fallback disabled and allowed),
                  weights, KV cache and activations against the spec's and the SoC's memory budgets (estimate)
llm_conversion    both graphs converted (shape fixing, folding, the Erf GELU fused), the pair's convention
llm_accuracy      perplexity of held-out text on the host (float, QDQ emulation) and the HTP, greedy-token
                  agreement with the float model, and the recipe sweep (w8a16, w8a8, w4a16)
llm_context_binary  both graphs compiled into context binaries for the SoC
(genie_runtime and genie_stress are in harness.llm.genie_steps)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.kpi import INTERVALS_KEY, Interval, Limit
from harness.devices import SocSpec
from harness.llm import convention, memory
from harness.llm.device import FloatJudge, device_nll, matched_prefix
from harness.llm.text import TokenizedPrompt
from harness.models import Thresholds
from harness.runner.base import latency_source
from harness.runner.client import DeviceRunner
from harness.steps.context_binary import ContextBinary
from harness.steps.report import StepReport
from harness.stats import bootstrap, bootstrap_of_sums, floored, unresolved

GRAPHS = ("prefill", "decode")


@dataclass(frozen=True)
class Pair:
    """One form of the graph pair (float, a QDQ recipe, or context binaries)."""

    prefill: Path
    decode: Path

    def graph(self, name: str) -> Path:
        """Return the 'prefill' or 'decode' graph."""
        return getattr(self, name)


def kv_cache_bytes(pair: convention.PairInfo, element_bytes: int) -> int:
    """Return the KV cache's size: keys and values of every layer over the whole context."""
    return 2 * pair.layers * pair.heads * pair.head_dim * pair.context_length * element_bytes


def llm_feasibility(placements: dict[str, StepReport], pair: convention.PairInfo, weights_bytes: int,
                    element_bytes: int, kv_element_bytes: int, soc: SocSpec, thresholds: Thresholds,
                    trained_context: int | None = None) -> StepReport:
    """Return the LLM feasibility report from each graph's Step 1 placement report (harness.steps.feasibility),
    with the weights, the KV cache (at kv_element_bytes) and the largest activation (at the activations' width,
    element_bytes) held to the spec's memory budget and, as an estimate, to the SoC's (with the largest context
    that fits it)."""
    report = StepReport("llm_feasibility")
    kv = kv_cache_bytes(pair, kv_element_bytes)
    # the float graphs' activations are float32: the largest at the shipped recipe's activation width
    act_name, act_bytes = max(((s.kpis.get("largest_activation", ""), s.kpis.get("largest_activation_bytes", 0))
                               for s in placements.values()), key=lambda a: a[1], default=("", 0))
    report.kpis = {"layers": pair.layers, "heads": pair.heads, "head_dim": pair.head_dim,
                   "context_length": pair.context_length, "prefill_ar": pair.prefill_ar, "vocab": pair.vocab,
                   "kv_cache_bytes": kv, "kv_cache_bits": 8 * kv_element_bytes, "weights_bytes": weights_bytes,
                   "largest_activation": act_name}
    report.kpis |= memory.memory_kpis(pair, weights_bytes, kv, act_bytes // 4 * element_bytes, soc, trained_context)
    for name, sub in placements.items():
        for key in ("htp_fraction", "nodes_on_htp", "nodes_total", "unsupported_ops", "boundary_qdq_on_cpu",
                    "form_checked"):
            if key in sub.kpis:
                report.kpis[f"{name}_{key}"] = sub.kpis[key]
        report.failures += [f"{name} graph: {p}" for p in sub.failures]
        report.notes += [f"{name} graph: {n}" for n in sub.notes]
        report.tables[f"{name}_op_placement"] = sub.tables.get("op_placement", [])
        report.limits.append(Limit(f"{name}_htp_fraction", minimum=thresholds.min_htp_fraction, marginal=0.0))
    # the spec's memory_budget_mb where it sets one; else the SoC's LLM budget (the default 256 MB is a
    # single-graph model's: Qwen2.5-0.5B's w8a16 pair, 780 MB, is a fifth of sm8650's)
    if "memory_budget_mb" in thresholds.model_fields_set or "memory_of_soc_budget" not in report.kpis:
        report.limits.append(Limit("memory_footprint_bytes", maximum=thresholds.memory_budget_mb * 1024 * 1024))
    if "memory_of_soc_budget" in report.kpis:
        report.limits.append(Limit("memory_of_soc_budget", maximum=1.0, detail=f"estimate, {soc.id}'s LLM budget"))
    return report


def as_built(graph: Path, weights_bytes: int) -> StepReport:
    """Return a graph's Step 2 report when the harness built it from a checkpoint and its weights are past
    protobuf's 2 GiB: the graph kept as built (static shapes, Genie's convention, nothing to fold or fuse), its
    equivalence left to the independent reference (llm_conversion's)."""
    import onnx

    nodes = len(onnx.load(str(graph), load_external_data=False).graph.node)
    report = StepReport("conversion")
    report.kpis = {"nodes_before": nodes, "nodes_after": nodes, "transforms": ["kept as built"]}
    report.artifacts["model"] = graph
    report.notes.append(f"kept as the importer built it: its {weights_bytes / 1e9:.2f} GB of float32 weights are "
                        "past protobuf's 2 GiB, beyond which the graph simplifier and the equivalence checker cannot "
                        "hold it; its graphs are static and in Genie's convention already (the simplifier's only "
                        "effect on a smaller import is merging reshapes), and their equivalence is the reference's")
    return report


def llm_conversion(conversions: dict[str, StepReport], pair: convention.PairInfo) -> StepReport:
    """Return the LLM conversion report: both graphs' Step 2 reports and the pair's convention dims."""
    report = StepReport("llm_conversion")
    report.kpis = {"layers": pair.layers, "context_length": pair.context_length, "prefill_ar": pair.prefill_ar,
                   "vocab": pair.vocab, "kv_layout": "key [H, 1, Dh, CL-AR], value [H, 1, CL-AR, Dh]"}
    for name, sub in conversions.items():
        for key in ("nodes_before", "nodes_after", "transforms", "equivalence_max_abs_diff", "equivalence_cosine"):
            if key in sub.kpis:
                report.kpis[f"{name}_{key}"] = sub.kpis[key]
        report.failures += [f"{name} graph: {p}" for p in sub.problems()]
        report.notes += [f"{name} graph: {n}" for n in sub.notes]
        report.artifacts[name] = sub.artifacts["model"]
        report.tables[f"{name}_transforms"] = sub.tables.get("transforms", [])
    return report


def agreement_kpis(judge: FloatJudge, prompts: list[TokenizedPrompt], reference: list[list[int]],
                   generated: list[list[int]], teacher_forced: bool = False) -> dict:
    """Return greedy agreement KPIs of generated token lists against the float model: exact (the same tokens as
    the float greedy loop's `reference`) and up to near-ties (tokens the float model ranks within the margin of
    its top), each prompt's share of its reference's length; with teacher_forced, `generated` are a model's
    choices after each prefix of the reference rather than after its own tokens."""
    exact = [matched_prefix(r, g) for r, g in zip(reference, generated)]
    consistent = [judge.consistent_prefix(p.ids, g, forced=r if teacher_forced else None)
                  for p, r, g in zip(prompts, reference, generated)]
    of = [max(1, len(r)) for r in reference]
    return {"greedy_agreement": round(float(np.mean([c / n for c, n in zip(consistent, of)])), 4),
            "greedy_exact_agreement": round(float(np.mean([m / n for m, n in zip(exact, of)])), 4),
            "min_agreeing_tokens": min(consistent), "min_exact_tokens": min(exact),
            "agreeing_tokens": consistent, "exact_tokens": exact, "of_tokens": of}


def agreement_interval(agreement: dict) -> Interval:
    """Return greedy agreement's 95 % interval from agreement_kpis: a bootstrap over prompts of their agreeing share
    (tokens of one prompt are not independent: one that leaves the float path early loses the rest), floored."""
    shares = (np.array(agreement["agreeing_tokens"], dtype=np.float64)
              / np.array(agreement["of_tokens"], dtype=np.float64))
    interval = bootstrap(lambda idx: float(shares[idx].mean()), len(shares), bounds=(0.0, 1.0))
    return floored(interval, float(shares.mean()), 0.0, 1.0)


# The fewest prompts a look judges greedy agreement on: 16 all agreeing are the fewest whose floored interval
# clears 0.75 (harness.stats.floored); fewer prompts are judged in one look.
MIN_LOOK_PROMPTS = 16


def agreement_looks(prompts: int) -> list[int]:
    """Return the prompt counts greedy agreement is judged at, in order: the first half of the prompts, then all of
    them (asked only when the first half leaves the verdict undecided); all at once when half would be fewer
    than MIN_LOOK_PROMPTS."""
    return [prompts // 2, prompts] if prompts >= 2 * MIN_LOOK_PROMPTS else [prompts]


def staged_agreement(judge: FloatJudge, prompts: list[TokenizedPrompt], reference: list[list[int]],
                     minimum: float, top1_of) -> tuple[dict, list[list[int]]]:
    """Return agreement_kpis (teacher-forced) judged in agreement_looks, and the choices they judged:
    top1_of(start, end) gives a model's choices after each prefix of the float answers of prompts[start:end]; a
    look's prompts are run only when the 95 % interval over the prompts before them straddles `minimum`. Each look
    decides only when its two-sided 95 % interval clears the limit: a wrong decided verdict has at most a 2.5 %
    chance per look, 5 % over two. Adds agreement_looks (the counts looked at) and prompts_given."""
    looks, top1, limit = agreement_looks(len(prompts)), [], Limit("greedy_agreement", minimum=minimum)
    for k, n in enumerate(looks):
        top1 += top1_of(len(top1), n)
        kpis = agreement_kpis(judge, prompts[:n], reference[:n], top1, teacher_forced=True)
        if not limit.check(kpis["greedy_agreement"], agreement_interval(kpis)).inconclusive:
            break
    return kpis | {"agreement_looks": looks[:k + 1], "prompts_given": len(prompts)}, top1


def forced_sequences(prompts: list[TokenizedPrompt], reference: list[list[int]]) -> list[tuple[list[int], int]]:
    """Return the teacher-forced (ids, from) sequences: each prompt with its float answer but the last token."""
    return [([*p.ids, *r[:-1]], len(p.ids)) for p, r in zip(prompts, reference)]


FORCED_METHOD = ("teacher-forced: the HTP's argmax after each prefix of the float model's greedy answer (Genie's "
                 "step checks free-running generation)")


def llm_accuracy(judge: FloatJudge, reference: list[list[int]], quantized: dict[str, Path], shipped_pair: Pair, choice,
                 host: dict[str, dict], windows: np.ndarray, prompts: list[TokenizedPrompt], max_new: int, tokenizer,
                 runner: DeviceRunner, thresholds: Thresholds) -> StepReport:
    """Return the LLM accuracy report: held-out perplexity of the float pair (host) and of each quantized recipe
    (`quantized`: each recipe's prefill graph; in the host's QDQ emulation, `host`'s host_nll results by recipe
    and "float", and on the device's HTP where the host has not already decided the recipe fails), the shipped
    recipe (`choice`, a shipping.RecipeChoice) and why, its greedy agreement on the HTP with the float model's
    greedy answers (`reference`, judged by `judge`; teacher-forced through `shipped_pair`: one pass over each
    prompt and answer, after the prompts' shared leading tokens), and limits on the shipped recipe."""
    shipped = choice.recipe
    float_nll = host["float"]
    float_ppl = float_nll["perplexity"]
    forced = forced_sequences(prompts, reference)
    first = agreement_looks(len(prompts))[0]  # the first look's prompts go with the perplexity windows
    rows, nlls, top1, agreement = [], {}, [], {}
    for name, prefill in quantized.items():  # the others swept by perplexity: the shipped one's answers too
        judged = choice.host.get(name, {})
        row = {"recipe": name, "shipped": name == shipped, "perplexity_float_host": round(float_ppl, 4),
               "perplexity_qdq_host": round(host[name]["perplexity"], 4), "host_verdict": judged.get("verdict"),
               "perplexity_htp": None, "perplexity_increase": None}
        if name != shipped and choice.host_failed(name):  # the HTP's figure could not change the verdict
            rows.append(row)
            continue
        nll = nlls[name] = device_nll(runner, prefill, windows, forced=forced[:first] if name == shipped else None,
                                      decode=shipped_pair.decode if name == shipped else None)
        row |= {"perplexity_htp": round(nll["perplexity"], 4),
                "perplexity_increase": round(nll["perplexity"] / float_ppl - 1.0, 5)}
        if name == shipped:
            def top1_of(start: int, end: int) -> list[list[int]]:
                if start == 0:  # the first look's answers came with the perplexity windows
                    return [s["top1"] for s in nll["forced"]["sequences"]]
                more = device_nll(runner, prefill, windows[:0], forced=forced[start:end], decode=shipped_pair.decode)
                return [s["top1"] for s in more["forced"]["sequences"]]

            agreement, top1 = staged_agreement(judge, prompts, reference, thresholds.min_greedy_agreement, top1_of)
            row |= {k: v for k, v in agreement.items() if not isinstance(v, list)}
        rows.append(row)
    ship = next(r for r in rows if r["recipe"] == shipped)
    report = StepReport("llm_accuracy")
    report.kpis = {
        "recipe": shipped, "eval_windows": int(len(windows)), "eval_tokens": int(windows.shape[0] * (windows.shape[1] - 1)),
        "window_tokens": int(windows.shape[1]), "prompts": len(top1), "max_new_tokens": max_new,
        "perplexity_float_host": float_ppl, "perplexity_qdq_host": ship["perplexity_qdq_host"],
        "perplexity_htp": ship["perplexity_htp"], "perplexity_increase": ship["perplexity_increase"],
        "host_htp_perplexity_gap": abs(ship["perplexity_htp"] - ship["perplexity_qdq_host"]) / ship["perplexity_qdq_host"],
        **agreement, "greedy_tie_margin": thresholds.greedy_tie_margin,
        "greedy_agreement_method": FORCED_METHOD, "forced_shared_tokens": nlls[shipped]["forced"]["shared_tokens"],
        "sweep": {r["recipe"]: {"perplexity_htp": r["perplexity_htp"], "perplexity_qdq_host": r["perplexity_qdq_host"],
                                "host_verdict": r["host_verdict"]} for r in rows},
        "recipe_rule": choice.rule, "recipe_host": choice.host,
        "source": latency_source("htp", runner.device_platform()[0]),
    }
    report.kpis[INTERVALS_KEY] = {"greedy_agreement": agreement_interval(agreement).as_dict(),
                                  **perplexity_intervals(float_nll, nlls[shipped], host[shipped])}
    report.limits = [Limit("perplexity_increase", maximum=thresholds.max_perplexity_increase),
                     Limit("host_htp_perplexity_gap", maximum=thresholds.max_host_htp_perplexity_gap),
                     Limit("greedy_agreement", minimum=thresholds.min_greedy_agreement, marginal=0.0)]
    if thresholds.max_perplexity is not None:
        report.limits.append(Limit("perplexity_htp", maximum=thresholds.max_perplexity))
    report.inconclusive.extend(unresolved(report.kpis, report.limits))
    report.tables["perplexity_by_recipe"] = rows
    report.tables["generations"] = [  # the HTP's choice after each prefix of the float answer
        {"prompt": p.text, "float_text": tokenizer.decode(r), "htp_forced_text": tokenizer.decode(g),
         "exact_tokens": m, "agreeing_tokens": c, "of": len(r)}
        for p, r, g, m, c in zip(prompts, reference, top1, agreement["exact_tokens"], agreement["agreeing_tokens"])]
    if agreement["greedy_exact_agreement"] < agreement["greedy_agreement"]:
        report.notes.append(f"{shipped}: some prompts leave the float model's greedy path at a near-tie (its top two "
                            f"logits within {thresholds.greedy_tie_margin:g}); those tokens count as agreeing, the "
                            "exact figures are greedy_exact_agreement and exact_tokens")
    skipped = [r["recipe"] for r in rows if r["perplexity_htp"] is None]
    if skipped:
        report.notes.append(f"not run on the HTP: {', '.join(skipped)} (the host's QDQ perplexity already fails the "
                            "limits decidedly)")
    report.notes.append(f"{shipped} ships: {choice.rule}")
    report.kpis["float_generations"] = reference
    return report


def _paired_window_sums(first: dict, second: dict) -> np.ndarray | None:
    """Return [N, 4] rows (first's summed NLL and token count, then second's) of two runs over the same held-out
    windows, or None when either has no per-window figures."""
    pairs = list(zip(first.get("windows") or [], second.get("windows") or []))
    if not pairs or len(pairs) != len(second["windows"]):
        return None
    return np.array([[f["nll"], f["count"], q["nll"], q["count"]] for f, q in pairs], dtype=np.float64)


def perplexity_intervals(floating: dict, quantized: dict, host_qdq: dict | None = None) -> dict[str, dict]:
    """Return the 95 % intervals of perplexity_htp and perplexity_increase (and with host_qdq, the host's QDQ run
    of the same graph, of host_htp_perplexity_gap): a paired bootstrap over the held-out windows (each window's
    summed NLL and token count, both runs resampled together), as Interval.as_dict(); {} when a run has no
    per-window figures."""
    sums = _paired_window_sums(floating, quantized)
    if sums is None:
        return {}
    def increase(t: np.ndarray) -> float:  # the second run's perplexity over the first's, minus 1
        return float(np.exp(t[2] / t[3] - t[0] / t[1]) - 1.0)

    out = {"perplexity_htp": bootstrap_of_sums(sums, lambda t: float(np.exp(t[2] / t[3]))).as_dict(),
           "perplexity_increase": bootstrap_of_sums(sums, increase).as_dict()}
    gap = _paired_window_sums(host_qdq, quantized) if host_qdq is not None else None
    if gap is not None:  # |HTP / host QDQ perplexity - 1|: what one window more or less moves, not a point
        out["host_htp_perplexity_gap"] = bootstrap_of_sums(gap, lambda t: abs(increase(t))).as_dict()
    return out


def llm_context_binary(binaries: dict[str, ContextBinary], soc_id: str) -> StepReport:
    """Return the report of both graphs' context binaries for one SoC."""
    report = StepReport("llm_context_binary")
    report.kpis = {"soc": soc_id, "context_bytes": sum(b.context_bytes for b in binaries.values())}
    for name, binary in binaries.items():
        report.kpis[f"{name}_context_bytes"] = binary.context_bytes
        report.kpis[f"{name}_compile_s"] = binary.info.get("compile_s")
        report.kpis[f"{name}_cached"] = binary.hit
        report.artifacts[f"{name}_context"] = binary.model
    return report
