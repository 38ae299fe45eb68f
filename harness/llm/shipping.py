"""Which LLM recipe ships: the smallest one whose host QDQ run decidedly meets the spec's limits.

The recipes (w4a16, w8a8, w8a16) are tried in order of their footprint, weight bits first (a decoded token reads
every weight: the weights' bytes bound the token rate), then activation bits, as AI Hub ships an LLM at the
narrowest encoding that holds its accuracy. Each is judged on its host QDQ emulation by the accuracy step's own
KPIs: perplexity against the float pair's on the same held-out windows (the paired bootstrap interval over
windows) and, where that does not already fail, greedy agreement with the float model's answers, teacher-forced
(the bootstrap over prompts). The first that passes every limit decidedly ships; when none does, the most
accurate (by perplexity). llm_accuracy then judges the shipped recipe on the HTP. A spec's `llm.recipe` pins the
choice."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from harness.kpi import Interval, Limit
from harness.llm import calibration
from harness.llm.steps import agreement_interval, perplexity_intervals
from harness.models import Thresholds

RULE_PINNED = "the spec's llm.recipe"
RULE_SMALLEST = ("the smallest recipe (weight bits, then activation bits) whose host QDQ perplexity and greedy "
                 "agreement decidedly meet the limits")
RULE_MOST_ACCURATE = ("none decidedly meets the limits on the host: the one with the lowest host QDQ perplexity")


@dataclass(frozen=True)
class RecipeChoice:
    """The recipe that ships, the rule that chose it and each recipe's host figures (perplexity_qdq_host,
    perplexity_increase, its interval and verdict), in the order tried."""

    recipe: str
    rule: str
    host: dict[str, dict] = field(default_factory=dict)

    def host_failed(self, recipe: str) -> bool:
        """Return whether the host's QDQ emulation already decides that recipe fails a limit."""
        return self.host.get(recipe, {}).get("verdict") == "failed"


def footprint_order(recipes=None) -> list[str]:
    """Return the recipes by footprint: weight bits, then activation bits."""
    def bits(name: str) -> tuple[int, int]:
        return 4 if name in calibration.FOUR_BIT_WEIGHTS else 8, 8 * calibration.activation_bytes(name)
    return sorted(recipes or calibration.LLM_RECIPES, key=bits)


def host_limits(thresholds: Thresholds) -> list[Limit]:
    """Return the limits a recipe's host QDQ run must meet (the spec's limits on the shipped recipe)."""
    limits = [Limit("perplexity_increase", maximum=thresholds.max_perplexity_increase),
              Limit("greedy_agreement", minimum=thresholds.min_greedy_agreement)]
    if thresholds.max_perplexity is not None:
        limits.append(Limit("perplexity", maximum=thresholds.max_perplexity))
    return limits


def _verdict(states: list[str]) -> str:
    return next((s for s in ("failed", "inconclusive") if s in states), "passed")


def judge_recipe(float_nll: dict, qdq_nll: dict, thresholds: Thresholds,
                 agreement: Callable[[], dict] | None = None) -> dict:
    """Return one recipe's host figures: perplexity_qdq_host, perplexity_increase and its interval, greedy agreement
    and its interval (agreement() gives agreement_kpis of the host QDQ run, asked only when perplexity does not
    already fail), and the verdict over the limits ('passed', 'failed' or 'inconclusive': the worst of them)."""
    increase = qdq_nll["perplexity"] / float_nll["perplexity"] - 1.0
    intervals = perplexity_intervals(float_nll, qdq_nll)
    values = {"perplexity_increase": (increase, intervals.get("perplexity_increase")),
              "perplexity": (qdq_nll["perplexity"], intervals.get("perplexity_htp"))}
    row = {"perplexity_qdq_host": round(qdq_nll["perplexity"], 4), "perplexity_increase": round(increase, 5),
           "interval": intervals.get("perplexity_increase")}

    def states() -> list[str]:
        return [limit.check(values[limit.kpi][0], Interval.from_dict(values[limit.kpi][1])
                            if values[limit.kpi][1] else None).state
                for limit in host_limits(thresholds) if limit.kpi in values]

    if agreement is not None and _verdict(states()) != "failed":
        kpis = agreement()
        interval = agreement_interval(kpis)
        values["greedy_agreement"] = (kpis["greedy_agreement"], interval.as_dict())
        row |= {"greedy_agreement": kpis["greedy_agreement"], "greedy_agreement_interval": interval.as_dict()}
    return row | {"verdict": _verdict(states())}


def choose_recipe(float_nll: dict, qdq_nlls: dict[str, dict], thresholds: Thresholds, pinned: str | None = None,
                  agreement_of: Callable[[str], dict] | None = None) -> RecipeChoice:
    """Return the RecipeChoice over the host's QDQ runs (host_nll results by recipe) against the float pair's, with
    agreement_of(recipe) its host greedy agreement (agreement_kpis), asked in footprint order until one ships."""
    host, chosen = {}, None
    for name in footprint_order(qdq_nlls):
        ask = (lambda n=name: agreement_of(n)) if agreement_of is not None and chosen is None and not pinned else None
        host[name] = judge_recipe(float_nll, qdq_nlls[name], thresholds, ask)
        if chosen is None and host[name]["verdict"] == "passed":
            chosen = name
    if pinned is not None:
        return RecipeChoice(pinned, RULE_PINNED, host)
    if chosen is not None:
        return RecipeChoice(chosen, RULE_SMALLEST, host)
    return RecipeChoice(min(host, key=lambda n: host[n]["perplexity_increase"]), RULE_MOST_ACCURATE, host)
