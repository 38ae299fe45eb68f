"""Step 3, stage 5: what the precision search adds to promotion: FP16 on the HTP, cost, the choice, the budget.

* **FP16 on the HTP** (v69 and later): the float model run on the HTP in FP16 (the QNN EP's
  `enable_htp_fp16_precision`), evaluated like every quantized candidate; the last resort when no
  quantized candidate meets the KPI.
* **Cost beside accuracy**: each candidate's simulated HTP latency (the median 'Accelerator (execute)
  time' of its evaluation run's basic QNN profile; on the HTP simulator labelled `simulator`, not a
  phone's latency), its context binary's size (compiled on the host, cached: the one the context_binary
  step ships when the candidate is chosen) and its QDQ model's size, in one Pareto table.
* **The choice**: the cheapest candidate that meets the KPI decisively. With latencies measured on a
  device: the lowest latency, where latencies within LATENCY_TIE of it count as equal, then the lower
  precision (8-bit, mixed, 16-bit activations, FP16), then the smaller context. With the simulator's
  figures (its wall time, inflated by the candidates' overlapping runs and following the host's load: not a
  phone's latency) the lower precision decides first, as on the HTP, then the higher accuracy, the smaller
  context and the recipe's name: never the simulated latency, so an unchanged re-run ships the same candidate.
* **The budget** (`--precision-budget-s`): the search starts no new stage once it is spent, and names
  what it left untried. FP16 on the HTP (on the simulator it can take tens of seconds per inference) is
  first timed by one probe inference; when the probe's time over the evaluation samples and the fewest
  inferences shipping it costs (profile, runtime: SHIPPING_INFERENCES) exceeds the budget left, FP16
  stays untried and the report says what it would have cost.
* **The evidence** when FP16 misses too: float against FP16 on the HTP, and the first tensor (in
  topological order) whose FP16 value diverges from float.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.cache import ArtifactCache
from harness.data import Dataset, Feed
from harness.devices import SocSpec
from harness.errors import HarnessError
from harness.metrics import cosine_similarity
from harness.models import Thresholds
from harness.options import PRECISION_BUDGET_S
from harness.runner.client import DeviceRunner
from harness.sizing import measure_inference
from harness.steps.context_binary import compile_context
from harness.steps.profile import MIN_SLOW_BLOCKS
from harness.steps.runtime import MIN_RUNTIME_SAMPLES
from harness.steps.error_isolation import float_activations, float_debug_model
from harness.steps.ptq import QuantRecipe
from harness.steps.sweep import Candidate, candidate_kpis, judge_candidate

FP16_MIN_HTP_ARCH = 69  # the HTP runs FP16 from v69 (Snapdragon 8 Gen 1) on
LATENCY_TIE = 0.10  # latencies within 10 % of the lowest count as equal
DEFAULT_BUDGET_S = PRECISION_BUDGET_S
PRECISION_ORDER = {"a8": 0, "mixed": 1, "a16": 2, "fp16": 3}
# the fewest simulator inferences shipping a slow model costs: profile's slow plan (2 blocks of an outputs pass and
# one timed iteration, a detailed profile of an outputs pass and one execution) and runtime's 2 samples
SHIPPING_INFERENCES = 2 * MIN_SLOW_BLOCKS + 2 + MIN_RUNTIME_SAMPLES
DIVERGENCE_SAMPLES = 1  # samples of the float-vs-FP16 per-tensor comparison
_SAVED_POSTFIX = "_ReshapedSavedOutput"  # onnxruntime's qdq_loss_debug names each exposed tensor so


@dataclass
class SearchBudget:
    """The search's time budget (seconds from its start) and the stages it left untried."""

    budget_s: float
    start: float = field(default_factory=time.perf_counter)
    untried: list[str] = field(default_factory=list)

    def spent_s(self) -> float:
        """Return the seconds spent since the search started."""
        return time.perf_counter() - self.start

    def left_s(self) -> float:
        """Return the seconds of the budget left (0 when spent)."""
        return max(0.0, self.budget_s - self.spent_s())

    def allows(self, stage: str) -> bool:
        """Return whether stage may start; when the budget is spent, record stage as untried and return False."""
        if self.spent_s() < self.budget_s:
            return True
        self.untried.append(stage)
        return False


def fp16_unavailable(soc: SocSpec | None) -> str | None:
    """Return why FP16 on soc's HTP is no candidate (None: it is one)."""
    if soc is None:
        return "FP16 on the HTP was not tried: no SoC was given"
    if soc.htp_arch < FP16_MIN_HTP_ARCH:
        return (f"FP16 on the HTP was not tried: {soc.id}'s HTP is v{soc.htp_arch}; the HTP runs FP16 from "
                f"v{FP16_MIN_HTP_ARCH} on")
    return None


def fp16_fits(model: Path, dataset: Dataset, runner: DeviceRunner, cache: ArtifactCache,
              search: SearchBudget) -> tuple[bool, dict[str, Any]]:
    """Return whether FP16 on the HTP fits the search's budget left (after its probe), and the estimate
    {probe_inference_s, samples, shipping_inferences, estimate_s, budget_left_s}: one probe inference of the float
    model on the HTP (cached, harness.sizing.measure_inference) times the evaluation samples and the
    SHIPPING_INFERENCES shipping it would cost (trying it commits the run to shipping it when it meets the KPI).
    When it does not fit, the stage is recorded as untried with what it would cost. A probe that cannot run
    leaves it to the evaluation, which records the failure."""
    samples = len(dataset.evaluation)
    try:
        probe = measure_inference(model, dataset.evaluation[0], runner, cache, repeats=1)
    except HarnessError:
        return True, {"probe_inference_s": None, "samples": samples, "shipping_inferences": SHIPPING_INFERENCES,
                      "estimate_s": None, "budget_left_s": search.left_s()}
    left, estimate = search.left_s(), probe.inference_s * (samples + SHIPPING_INFERENCES)
    info = {"probe_inference_s": probe.inference_s, "samples": samples, "shipping_inferences": SHIPPING_INFERENCES,
            "estimate_s": estimate, "budget_left_s": left, "latency_source": probe.latency_source}
    if estimate <= left:
        return True, info
    search.untried.append(f"FP16 on the HTP (one probe inference took {probe.inference_s:.3g} s "
                          f"({probe.latency_source}): its {samples} evaluation samples and the {SHIPPING_INFERENCES} "
                          f"inferences shipping it costs (profile, runtime) would take about {estimate:.0f} s, "
                          f"{left:.0f} s of the budget left)")
    return False, info


def evaluate_fp16(model: Path, dataset: Dataset, reference: list[Feed], runner: DeviceRunner,
                  thresholds: Thresholds, cache: ArtifactCache) -> Candidate:
    """Return the float model run on the HTP in FP16 as a judged Candidate (a failed run recorded in it)."""
    candidate = Candidate(QuantRecipe(label="fp16"), model, fp16=True)
    try:
        candidate.kpis = candidate_kpis(model, candidate.name, dataset, reference, runner, cache)
    except HarnessError as e:
        candidate.error = str(e)
        return candidate
    return judge_candidate(candidate, thresholds)


def context_bytes(candidate: Candidate, soc: SocSpec, cache: ArtifactCache, allow_cpu_fallback: bool) -> int | None:
    """Return the size of candidate's context binary for soc (compiled and cached; None when it cannot compile)."""
    if candidate.error is not None or candidate.model is None:
        return None
    try:
        return compile_context(candidate.model, soc, cache, allow_cpu_fallback=allow_cpu_fallback).context_bytes
    except HarnessError:
        return None


def accuracy(candidate: Candidate) -> float | None:
    """Return the accuracy the table compares: the task metric's ratio to float (an evaluation section), else
    the output cosine similarity."""
    k = candidate.kpis
    if candidate.error is not None or not k:
        return None
    return k.get("task_metric_ratio", k.get("cosine_similarity"))


def cheapest(candidates: list[Candidate], sizes: dict[int, int | None]) -> Candidate | None:
    """Return the cheapest candidate meeting the KPI (see the module docstring), None when none meets it;
    sizes maps id(candidate) to its context bytes."""
    meeting = [c for c in candidates if c.meets and c.error is None]
    if not meeting:
        return None
    latencies = [c.kpis.get("htp_latency_ms") for c in meeting]
    known = [x for x in latencies if x is not None]
    fastest = min(known) if known else None

    measured = all(c.kpis.get("latency_source") == "device" for c in meeting)

    def key(c: Candidate):
        latency = c.kpis.get("htp_latency_ms")
        tier, size = PRECISION_ORDER[c.precision], sizes.get(id(c)) or 0
        if not measured:  # the simulator's wall time follows the host's load: it never decides
            score = accuracy(c)
            return (tier, -score if score is not None else float("inf"), size, c.name)
        tied = fastest is None or (latency is not None and latency <= fastest * (1 + LATENCY_TIE))
        return (not tied, tier, size, latency or 0.0)

    return min(meeting, key=key)


def pareto_rows(candidates: list[Candidate], sizes: dict[int, int | None], chosen: Candidate | None,
                metric_name: str) -> list[dict[str, Any]]:
    """Return one row per candidate (accuracy, simulated latency, context and model size, verdict), marking
    those no other candidate beats on all three (`pareto`) and the one chosen; fastest first."""
    points = {id(c): (accuracy(c), c.kpis.get("htp_latency_ms"), sizes.get(id(c))) for c in candidates}

    def dominated(c: Candidate) -> bool:
        a, t, s = points[id(c)]
        if a is None or t is None:
            return False
        for other in candidates:
            b, u, z = points[id(other)]
            if other is c or b is None or u is None:
                continue
            if b >= a and u <= t and (z or 0) <= (s or 0) and (b > a or u < t or (z or 0) < (s or 0)):
                return True
        return False

    rows = []
    for c in candidates:
        k = c.kpis
        rows.append({"candidate": c.name, "precision": c.precision, "accuracy_metric": metric_name,
                     "accuracy": accuracy(c), "task_metric": k.get("task_metric"),
                     "cosine_similarity": k.get("cosine_similarity"), "sqnr_db": k.get("sqnr_db"),
                     "htp_latency_ms": k.get("htp_latency_ms"), "latency_source": k.get("latency_source"),
                     "context_bytes": sizes.get(id(c)), "model_bytes": k.get("model_bytes"),
                     "verdict": c.verdict, "meets_kpi": c.meets, "pareto": c.error is None and not dominated(c),
                     "chosen": c is chosen, "error": c.error.splitlines()[0] if c.error else None})
    return sorted(rows, key=lambda r: (r["htp_latency_ms"] is None, r["htp_latency_ms"] or 0.0))


def first_fp16_divergence(model: Path, feeds: list[Feed], runner: DeviceRunner, cache: ArtifactCache,
                          min_cosine: float) -> dict[str, Any]:
    """Return the first float tensor (topological order) whose FP16 value on the HTP has a cosine similarity
    to float below min_cosine (or is not finite), over the first DIVERGENCE_SAMPLES feeds, with every tensor
    exposed as an output: {tensor, node, op_type, cosine, compared, lowest_tensor, lowest_cosine}; tensor is
    None when none diverges (the lowest one is then named). Raises HarnessError when the exposed model cannot run."""
    import onnx

    feeds = feeds[:DIVERGENCE_SAMPLES]
    reference = float_activations(model, feeds, cache)
    run = runner.run(float_debug_model(model, cache), feeds, "htp")
    graph = onnx.load(str(model), load_external_data=False).graph
    compared, lowest = 0, (None, 1.0)
    for node in graph.node:
        for tensor in node.output:
            got = [out.get(tensor + _SAVED_POSTFIX, out.get(tensor)) for out in run.outputs]
            want = reference.get(tensor)
            if want is None or any(g is None for g in got) or not np.issubdtype(np.asarray(got[0]).dtype,
                                                                                 np.floating):
                continue
            if sum(np.size(w) for w in want) != sum(np.size(g) for g in got):
                continue
            with np.errstate(all="ignore"):
                cosine = cosine_similarity([np.ravel(w) for w in want], [np.ravel(g) for g in got])
            compared += 1
            if not np.isfinite(cosine) or cosine < min_cosine:
                return {"tensor": tensor, "node": node.name or tensor, "op_type": node.op_type, "cosine": cosine,
                        "compared": compared, "lowest_tensor": tensor, "lowest_cosine": cosine}
            if cosine < lowest[1]:
                lowest = (tensor, cosine)
    return {"tensor": None, "node": None, "op_type": None, "cosine": None, "compared": compared,
            "lowest_tensor": lowest[0], "lowest_cosine": lowest[1]}
