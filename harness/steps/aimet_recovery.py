"""Step 3, stage 6: AIMET recovery, for a model that PTQ, the sweep and mixed precision leave short of its KPI.

It starts from the recipe mixed precision reached (its 8-bit start, the sweep's best or PTQ's, with the
activations it promoted at 16 bits) and applies AIMET's post-training techniques one after the other, each
building on the one before:

1. ``recipe``: `QuantizationSimModel` configured as the harness's recipe (weight and activation bit widths,
   per-channel or per-tensor, symmetric weights, the promoted tensors at 16 bits), calibrated on the
   calibration data: the baseline, AIMET's view of where mixed precision ended.
2. ``bn_fold``: `fold_all_batch_norms_to_weight` (BatchNormalization folded into Conv/Gemm weights).
3. ``cle``: Cross-Layer Equalization (`equalize_model`): the weight ranges of consecutive layers equalized
   through the ReLU between them, so per-tensor and per-channel weight grids fit every channel.
4. ``adaround``: AdaRound on the calibration data (each weight rounded up or down to minimize the
   layer's output error), its encodings frozen.
5. ``amp``: AIMET's mixed precision: `analyze_mixed_precision_sensitivity` over the precisions the HTP runs
   (w8a8, w8a16; and the recipe's own when it differs), then `apply_amp` with the model's KPI as its
   acceptance test, on the sim after AdaRound.

AIMET's per-layer sensitivity analysis (`analyze_per_layer_sensitivity`, output SQNR with one layer's
quantizers enabled at a time) runs on the recipe's sim and on the sim AMP starts from; its HTML reports are
artifacts. Every technique's result is exported (``encoding_version="0.6.1"``, the QAIRT
``--quantization_overrides`` format) with its float model (equalized, AdaRound's weights), imported
through the harness's own overrides path (`QuantRecipe.encodings`, as ``--quantization-overrides``) and
run on the device's ``htp`` runtime like every other candidate (`sweep.evaluate_recipe`): AIMET's own
(host simulation) numbers are reported beside the HTP's but never decide. The step's model is that of the
last technique whose HTP run met the KPI, else the best-ranked one.

aimet-onnx is imported only here and only when the step runs (the optional ``aimet`` extra).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from harness.cache import ArtifactCache, content_key
from harness.data import Dataset, Feed, feeds_digest
from harness.errors import HarnessError, StepError
from harness.kpi import check_all
from harness.models import Thresholds
from harness.runner.client import DeviceRunner
from harness.steps.inference import task_metric
from harness.steps.ptq import QuantRecipe, compare_quantized, judge
from harness.steps.report import StepReport
from harness.steps.sweep import Candidate, accuracy_limits, evaluate_recipe, rank

TECHNIQUES = ("recipe", "bn_fold", "cle", "adaround", "amp")
ADAROUND_ITERATIONS = 500  # AIMET recommends 10k; 500 already settles a small CNN (FACTS: 7.5 s)
ENCODING_VERSION = "0.6.1"  # the QAIRT --quantization_overrides layout (harness.quantization reads 1.0.0/2.x too)
_SIXTEEN = ("QUInt16", "QInt16")


def aimet_missing() -> str | None:
    """Return why aimet-onnx cannot be used here (None when it is installed)."""
    if importlib.util.find_spec("aimet_onnx") is None:
        return ("the aimet extra is not installed (aimet-onnx; see the README's AIMET section for the CPU-only "
                "install)")
    return None


def skip_reason(mode: str, earlier_met: Callable[[], str | None],
                missing: Callable[[], str | None] = aimet_missing) -> str | None:
    """Return why the AIMET step does not run, or None when it runs: --aimet off; the extra missing; in auto
    mode, the earlier recovery (named by earlier_met, called only then) already met the KPI."""
    if mode == "off":
        return "--aimet off: the AIMET recovery step is not run"
    if (why := missing()) is not None:
        return f"{why}{' (asked for with --aimet on)' if mode == 'on' else ''}"
    if mode == "auto" and (met := earlier_met()) is not None:
        return f"the earlier recovery met the KPI ({met}): AIMET is not needed (--aimet on runs it anyway)"
    return None


def reached_recipe(start: QuantRecipe, mixed: StepReport | None) -> QuantRecipe:
    """Return the recipe mixed precision reached: start with the tensors it promoted at 16 bits."""
    promoted = (mixed.kpis.get("promoted_tensors") or []) if mixed is not None else []
    overrides = {**start.tensor_overrides, **{t: [{"quant_type": "QUInt16"}] for t in promoted}}
    return replace(start, tensor_overrides=overrides, label="+".join(filter(None, [start.label, f"mp{len(promoted)}"
                                                                                   if promoted else ""])))


# ------------------------------------------------------------------------------ AIMET, on the host

def _bits(quant_type: str) -> int:
    return int("".join(c for c in quant_type if c.isdigit()))


def sim_config(recipe: QuantRecipe) -> dict[str, Any]:
    """Return the AIMET quantsim config that mirrors recipe's onnxruntime QNN QDQ config (Conv/Gemm +
    Relu/Clip quantized at the activation's output, biases left to the converter, as onnxruntime does)."""
    signed_weights = recipe.weight_symmetric if recipe.weight_symmetric is not None else recipe.weight_type.startswith("QInt")
    return {"defaults": {"ops": {"is_output_quantized": "True",
                                 "is_symmetric": str(bool(recipe.activation_symmetric))},
                         "params": {"is_quantized": "True", "is_symmetric": str(bool(signed_weights))},
                         "strict_symmetric": "False", "unsigned_symmetric": "False",
                         "per_channel_quantization": str(bool(recipe.per_channel))},
            "params": {"bias": {"is_quantized": "False"}},
            "op_type": {"Cast": {"is_output_quantized": "False"}},
            "supergroups": [{"op_list": [a, b]} for a in ("Conv", "Gemm", "ConvTranspose", "MatMul")
                            for b in ("Relu", "Clip")],
            "model_input": {"is_input_quantized": "True"}, "model_output": {}}


def _quant_scheme(recipe: QuantRecipe) -> tuple[str, str | None]:
    scheme = {"MinMax": "min_max", "Percentile": "percentile"}.get(recipe.calibrate_method)
    if scheme is not None:
        return scheme, None
    return "tf_enhanced", (f"calibration {recipe.calibrate_method} has no AIMET equivalent: AIMET calibrated "
                           "with tf_enhanced (SQNR-searched ranges)")


def _weight_bits(recipe: QuantRecipe) -> int:
    """The recipe's weight bit width (4 when its tensor overrides pin weights to 4 bits)."""
    pinned = {_bits(e[0]["quant_type"]) for e in recipe.tensor_overrides.values()
              if e and str(e[0].get("quant_type", "")).endswith("4")}
    return min(pinned) if pinned else _bits(recipe.weight_type)


def amp_precisions(recipe: QuantRecipe) -> list[tuple[int, int]]:
    """Return the (weight bits, activation bits) AMP chooses from: the recipe's own, w8a8 and w8a16."""
    own = (_weight_bits(recipe), _bits(recipe.activation_type))
    return sorted({own, (8, 8), (8, 16)}, key=lambda p: (p[1], p[0]))


class _SimEvaluator:
    """The harness's KPIs of an AIMET sim's onnxruntime session over the evaluation data (host)."""

    def __init__(self, dataset: Dataset, reference: list[Feed], thresholds: Thresholds) -> None:
        self.dataset, self.reference = dataset, reference
        self.float_metric = task_metric(reference, dataset, reference)
        self.limits = accuracy_limits(thresholds)

    def kpis(self, session) -> dict[str, Any]:
        # by position: AIMET's sim renames a graph output it quantizes (PaddleOCR's fetch_name_0 becomes
        # fetch_name_0_updated), and keeps the outputs in the model's order
        names = list(self.reference[0])
        if len(session.get_outputs()) != len(names):
            raise StepError(f"AIMET's sim has {len(session.get_outputs())} outputs, the model {len(names)} "
                            f"({', '.join(names)})")
        outputs = [dict(zip(names, session.run(None, feed))) for feed in self.dataset.evaluation]
        return compare_quantized(outputs, self.reference, self.dataset, self.float_metric)

    def sqnr(self, session) -> float:
        return float(self.kpis(session)["sqnr_db"])

    def meets(self, session) -> bool:  # decisively: every limit passed on its KPI's interval
        return all(v.passed for v in check_all(self.kpis(session), self.limits))


def _write_export(sim, out: Path) -> dict[str, Any]:
    """Export sim into out/ (model.onnx in one file, quantization_overrides.json); return the bit widths."""
    import onnx

    raw = out / "aimet_export"
    raw.mkdir()
    sim.export(str(raw), "model", encoding_version=ENCODING_VERSION)
    model = onnx.load(str(raw / "model.onnx"))  # external data (model.data) read back into one file
    onnx.save(model, str(out / "model.onnx"))
    document = json.loads((raw / "model.encodings").read_text())  # kept as AIMET wrote it (harness.quantization reads it)
    (out / "quantization_overrides.json").write_text(json.dumps(document, indent=1))
    for p in raw.iterdir():
        p.unlink()
    raw.rmdir()
    return bit_widths(document)


def bit_widths(document: dict[str, Any]) -> dict[str, Any]:
    """Return the bit widths of an overrides document: counts per bit width for activations and weights."""
    def count(group: str) -> dict[str, int]:
        bits = Counter(int((e[0] if isinstance(e, list) else e)["bitwidth"])
                       for e in document.get(group, {}).values())
        return {str(b): n for b, n in sorted(bits.items())}

    acts, params = count("activation_encodings"), count("param_encodings")
    label = " ".join([*(f"a{b}x{n}" for b, n in acts.items()), *(f"w{b}x{n}" for b, n in params.items())])
    return {"activations": acts, "weights": params, "label": label}


def simulate(model: Path, dataset: Dataset, reference: list[Feed], thresholds: Thresholds, recipe: QuantRecipe,
             out: Path, adaround_iterations: int = ADAROUND_ITERATIONS) -> dict[str, Any]:
    """Run AIMET's techniques on model from recipe, writing out/<technique>/ (model.onnx,
    quantization_overrides.json) and the per-layer sensitivity HTML reports; return the record of what was
    applied, AIMET's own (host) KPIs and the wall time of each technique."""
    import onnx
    import torch

    import aimet_onnx
    from aimet_onnx import QuantizationSimModel, analyze_per_layer_sensitivity, apply_adaround
    from aimet_onnx.batch_norm_fold import fold_all_batch_norms_to_weight
    from aimet_onnx.cross_layer_equalization import equalize_model
    from aimet_onnx.mixed_precision import analyze_mixed_precision_sensitivity, apply_amp

    torch.manual_seed(0)
    np.random.seed(0)
    qtypes = {4: aimet_onnx.int4, 8: aimet_onnx.int8, 16: aimet_onnx.int16}
    evaluator = _SimEvaluator(dataset, reference, thresholds)
    calibration = list(dataset.calibration)
    config = out / "quantsim_config.json"
    config.write_text(json.dumps(sim_config(recipe), indent=1))
    scheme, scheme_note = _quant_scheme(recipe)
    promoted = sorted(t for t, e in recipe.tensor_overrides.items() if e and e[0].get("quant_type") in _SIXTEEN)
    notes = [n for n in [scheme_note] if n]
    if recipe.encodings:
        notes.append("the recipe's --quantization-overrides encodings are not given to AIMET: it computes its own")
    record: dict[str, Any] = {"aimet_onnx": getattr(aimet_onnx, "__version__", "?"), "techniques": [],
                              "notes": notes, "quant_scheme": scheme, "adaround_iterations": adaround_iterations,
                              "amp_precisions": [f"w{w}a{a}" for w, a in amp_precisions(recipe)]}

    def new_sim(proto):
        started = time.perf_counter()
        sim = QuantizationSimModel(copy.deepcopy(proto), param_type=qtypes[_weight_bits(recipe)],
                                   activation_type=qtypes[_bits(recipe.activation_type)],
                                   quant_scheme=scheme, config_file=str(config))
        if promoted:
            sim.set_tensor_precision(promoted, aimet_onnx.int16, strict=False)
        sim.compute_encodings(calibration)
        return sim, time.perf_counter() - started

    def done(name: str, sim, seconds: float, applied: bool, detail: str) -> None:
        (out / name).mkdir()
        started = time.perf_counter()
        bits = _write_export(sim, out / name)
        host = evaluator.kpis(sim.session)
        record["techniques"].append({"technique": name, "applied": applied, "detail": detail,
                                     "aimet_s": seconds, "export_s": time.perf_counter() - started, "bits": bits,
                                     "sim": {k: host[k] for k in ("task_metric", "cosine_similarity", "sqnr_db")}})

    def attempt(name: str, technique: Callable[[], Any]) -> Any:
        """Run one technique; when AIMET raises on this model, record it as failed and return None (the
        techniques after it go on from the last one that worked)."""
        started = time.perf_counter()
        try:
            return technique()
        except Exception as e:  # AIMET's own failure on this graph, in its words
            said = f"{type(e).__name__}: {str(e)[:300]}"
            record["techniques"].append({"technique": name, "applied": False, "failed": said,
                                         "detail": f"AIMET raised {said}", "aimet_s": time.perf_counter() - started,
                                         "export_s": 0.0, "bits": {"label": ""},
                                         "sim": {"task_metric": None, "cosine_similarity": None, "sqnr_db": None}})
            return None

    def sensitivity(sim, filename: str) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            per_layer = analyze_per_layer_sensitivity(sim, evaluator.sqnr, filename=str(out / filename))
            return {"seconds": time.perf_counter() - started, "sqnr_db": per_layer}
        except Exception as e:
            return {"seconds": time.perf_counter() - started, "sqnr_db": {}, "error": f"{type(e).__name__}: {e}"}

    float_model = onnx.load(str(model))
    sim, seconds = new_sim(float_model)
    done("recipe", sim, seconds, True, f"QuantizationSimModel as {recipe.name}"
         + (f" ({len(promoted)} tensor(s) at 16 bits)" if promoted else ""))
    record["sensitivity_recipe"] = sensitivity(sim, "per_layer_sensitivity_recipe.html")

    def bn_fold():
        started = time.perf_counter()
        folded = copy.deepcopy(float_model)
        pairs, _ = fold_all_batch_norms_to_weight(folded)
        folded_sim, _ = new_sim(folded)
        done("bn_fold", folded_sim, time.perf_counter() - started, bool(pairs),
             f"{len(pairs)} BatchNormalization folded" if pairs else "no BatchNormalization to fold")
        return folded, folded_sim

    folded, sim = attempt("bn_fold", bn_fold) or (float_model, sim)

    def cle():
        started = time.perf_counter()
        equalized = copy.deepcopy(folded)
        equalize_model(equalized)
        changed = any(not np.array_equal(onnx.numpy_helper.to_array(a), onnx.numpy_helper.to_array(b))
                      for a, b in zip(folded.graph.initializer, equalized.graph.initializer))
        equalized_sim, _ = new_sim(equalized)
        done("cle", equalized_sim, time.perf_counter() - started, changed,
             "weight ranges equalized across consecutive layers" if changed else "no layer pair to equalize")
        return equalized, equalized_sim

    equalized, sim = attempt("cle", cle) or (folded, sim)

    def adaround():
        started = time.perf_counter()
        apply_adaround(sim, calibration, num_iterations=adaround_iterations)
        done("adaround", sim, time.perf_counter() - started, True,
             f"{adaround_iterations} iterations per layer on {len(calibration)} calibration samples")
        return sim

    sim = attempt("adaround", adaround) or new_sim(equalized)[0]  # a failed AdaRound may leave the sim half-done
    record["sensitivity"] = sensitivity(sim, "per_layer_sensitivity.html")

    def amp():
        started = time.perf_counter()
        precisions = [(qtypes[w], qtypes[a]) for w, a in amp_precisions(recipe)]
        mixed = analyze_mixed_precision_sensitivity(sim, precisions, evaluator.sqnr, calibration)
        apply_amp(sim, mixed, evaluator.meets)
        done("amp", sim, time.perf_counter() - started, True,
             f"AMP over {', '.join(record['amp_precisions'])} against the KPI (AIMET's host simulation)")
        return True

    attempt("amp", amp)
    (out / "aimet.json").write_text(json.dumps(record, indent=1, default=float))
    return record


def simulated(model: Path, dataset: Dataset, reference: list[Feed], thresholds: Thresholds, recipe: QuantRecipe,
              cache: ArtifactCache, adaround_iterations: int = ADAROUND_ITERATIONS) -> tuple[Path, dict[str, Any], bool]:
    """Return the cached AIMET run (its directory, its record, whether it came from the cache)."""
    import aimet_onnx

    labels = dataset.labels_key()
    key = content_key("aimet-v3", model, feeds_digest(dataset.calibration), feeds_digest(dataset.evaluation),
                      feeds_digest(reference), labels, asdict(recipe), thresholds.max_task_metric_drop,
                      thresholds.min_cosine_similarity, thresholds.min_sqnr_db, adaround_iterations,
                      getattr(aimet_onnx, "__version__", "?"))

    def build(out: Path) -> None:
        try:
            simulate(model, dataset, reference, thresholds, recipe, out, adaround_iterations)
        except HarnessError:
            raise
        except Exception as e:  # AIMET's own errors, translated at the boundary
            raise StepError(f"AIMET failed on {model.name} from {recipe.name}: {type(e).__name__}: {e}") from e

    entry = cache.entry("aimet", key, build)
    return entry.path, json.loads((entry.path / "aimet.json").read_text()), entry.hit


# ------------------------------------------------------------------------------ the step

def technique_recipe(base: QuantRecipe, directory: Path, name: str) -> QuantRecipe:
    """Return the recipe that imports a technique's AIMET encodings (the file as AIMET exported it) through the
    harness's overrides path, as --quantization-overrides does."""
    document = json.loads((directory / "quantization_overrides.json").read_text())
    return replace(base, tensor_overrides={}, encodings=document,
                   encodings_file=str(directory / "quantization_overrides.json"), label=f"aimet-{name}")


_ROW_EXTRA = ("applied", "detail", "bits", "aimet_s", "htp_s", "sim_sqnr_db", "sim_cosine_similarity", "error")


def _row(stage: str, kpis: dict[str, Any], meets: bool | None, **extra: Any) -> dict[str, Any]:
    """One row of the before/after table (every row has the same columns, for the CSV)."""
    return {"stage": stage, "task_metric": kpis.get("task_metric"), "cosine_similarity": kpis.get("cosine_similarity"),
            "sqnr_db": kpis.get("sqnr_db"), "meets_kpi": meets, **{k: extra.get(k) for k in _ROW_EXTRA}}


def aimet_recovery(model: Path, dataset: Dataset, reference: list[Feed], runner: DeviceRunner,
                   thresholds: Thresholds, cache: ArtifactCache, recipe: QuantRecipe,
                   earlier: list[tuple[str, dict[str, Any], bool]] = (),
                   adaround_iterations: int = ADAROUND_ITERATIONS) -> StepReport:
    """Return the AIMET recovery report from recipe (the one mixed precision reached): each technique's
    AIMET export imported as overrides and run on the device's `htp` runtime; `earlier` (stage, KPIs, met)
    rows open the before/after table. artifacts['model'] is the chosen QDQ model."""
    directory, record, hit = simulated(model, dataset, reference, thresholds, recipe, cache, adaround_iterations)
    report = StepReport("aimet")
    report.limits = accuracy_limits(thresholds)
    report.notes.extend(record["notes"])
    rows = [_row(stage, k, met) for stage, k, met in earlier]
    candidates: list[tuple[dict[str, Any], Candidate]] = []
    for tech in record["techniques"]:
        name = tech["technique"]
        if tech.get("failed"):
            report.notes.append(f"aimet {name}: AIMET failed on this model ({tech['failed']}); the techniques after "
                                "it went on from the last one that worked")
            rows.append(_row(f"aimet {name}", {}, None, applied=False, detail=tech["detail"], bits="",
                             aimet_s=tech["aimet_s"], error=tech["failed"]))
            continue
        started = time.perf_counter()
        candidate = evaluate_recipe(technique_recipe(recipe, directory / name, name), directory / name / "model.onnx",
                                    dataset, reference, runner, thresholds, cache)
        htp_s = time.perf_counter() - started
        candidates.append((tech, candidate))
        if candidate.error is not None:
            report.notes.append(f"aimet {name}: the HTP could not run it: {candidate.error.splitlines()[0]}")
        rows.append(_row(f"aimet {name}", candidate.kpis, candidate.meets if candidate.error is None else None,
                         applied=tech["applied"], detail=tech["detail"], bits=tech["bits"]["label"],
                         aimet_s=tech["aimet_s"], htp_s=htp_s, sim_sqnr_db=tech["sim"]["sqnr_db"],
                         sim_cosine_similarity=tech["sim"]["cosine_similarity"], error=candidate.error))
    met = [(t, c) for t, c in candidates if c.meets]
    final_tech, final = met[-1] if met else next((t, c) for t, c in candidates if c is rank([c for _, c in candidates])[0])
    report.tables["techniques"] = rows
    per_layer = record["sensitivity"]["sqnr_db"]
    before = record["sensitivity_recipe"]["sqnr_db"]
    report.tables["per_layer_sensitivity"] = [
        {"layer": layer, "sqnr_db_recipe": before.get(layer), "sqnr_db_final": per_layer.get(layer)}
        for layer in sorted(set(before) | set(per_layer), key=lambda n: before.get(n, float("inf")))]
    if final.error is not None:
        report.failures.append(f"the HTP ran none of AIMET's models: {final.describe()}")
        return report
    k = final.kpis
    first = candidates[0][1].kpis
    report.kpis = {
        "runtime": "htp", "start_recipe": recipe.name, "final_technique": final_tech["technique"],
        "final_recipe": final.name, "applied": [t["technique"] for t, _ in candidates if t["applied"]],
        "met_threshold": final.meets, "met_by": next((t["technique"] for t, c in candidates if c.meets), None),
        "task_metric_name": k["task_metric_name"], "task_metric": k["task_metric"],
        "task_metric_drop": k["task_metric_drop"],
        **({"task_metric_ratio": k["task_metric_ratio"]} if "task_metric_ratio" in k else {}),
        "cosine_similarity": k["cosine_similarity"], "sqnr_db": k["sqnr_db"],
        "intervals": k.get("intervals"), "undecided": final.undecided,
        "start_task_metric": first.get("task_metric"), "start_cosine_similarity": first.get("cosine_similarity"),
        "start_sqnr_db": first.get("sqnr_db"), "final_bit_widths": final_tech["bits"],
        "techniques": {t["technique"]: {"applied": t["applied"], "task_metric": c.kpis.get("task_metric"),
                                        "cosine_similarity": c.kpis.get("cosine_similarity"),
                                        "sqnr_db": c.kpis.get("sqnr_db"), "meets_kpi": c.meets,
                                        "bits": t["bits"]["label"], "aimet_s": t["aimet_s"],
                                        "sim_sqnr_db": t["sim"]["sqnr_db"], "error": c.error}
                       for t, c in candidates},
        "sensitivity_s": record["sensitivity"]["seconds"] + record["sensitivity_recipe"]["seconds"],
        "failed_techniques": {t["technique"]: t["failed"] for t in record["techniques"] if t.get("failed")},
        "aimet_s": sum(t["aimet_s"] for t in record["techniques"]), "aimet_cached": hit,
        "aimet_onnx": record["aimet_onnx"], "adaround_iterations": record["adaround_iterations"],
        "amp_precisions": record["amp_precisions"], "encodings_file": str(directory / final_tech["technique"]
                                                                          / "quantization_overrides.json"),
        "latency_source": k.get("latency_source"), "model_bytes": k.get("model_bytes"),
    }
    report.notes.append("each technique's encodings were exported by AIMET, imported through the harness's "
                        "overrides path and run on the device's htp runtime; sim_* columns are AIMET's host "
                        "simulation, for comparison only")
    if not final.meets:
        tried = " | ".join(f"{t['technique']}: {c.describe()}" for t, c in candidates)
        if final.undecided:
            report.inconclusive.append(f"no AIMET technique met the KPI on the HTP decisively; the best, "
                                       f"{final_tech['technique']}, could not be decided on {len(dataset.evaluation)} "
                                       f"samples; tried: {tried}")
        else:
            report.failures.append(f"no AIMET technique met the KPI on the HTP; tried: {tried}")
    judge(report)
    report.notes.extend(dataset.warnings)
    report.artifacts["model"] = final.model
    report.artifacts["encodings"] = directory / final_tech["technique"] / "quantization_overrides.json"
    report.artifacts["per_layer_sensitivity"] = directory / "per_layer_sensitivity.html"
    report.artifacts["per_layer_sensitivity_recipe"] = directory / "per_layer_sensitivity_recipe.html"
    return report
