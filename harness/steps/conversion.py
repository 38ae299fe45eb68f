"""Step 2, conversion, as a real converter does it: frozen inputs and fixed shapes, the opset raised for
16-bit quantization, constant folding and simplification (onnxslim), mask sentinels made finite, layer
rewrites the HTP needs, QNN preprocessing; every transform checked against the source model's outputs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import onnx

from harness.cache import ArtifactCache, content_key
from harness.convert import constants, copy_model, opset, rewrites, rounding, simplify
from harness.convert.equivalence import Equivalence, RunFailed, check_feeds, compare, run
from harness.convert.freeze import freeze_inputs, frozen_array
from harness.convert.shapes import count_nodes, infer_shapes
from harness.data import input_infos, load_calibration_dir
from harness.errors import ConfigError, ModelError, StepError
from harness.models import ModelSpec, fix_input_shapes, load_onnx
from harness.steps.report import StepReport

REPORT_FILE = "conversion.json"
log = logging.getLogger(__name__)


def _where(spec: ModelSpec, source: Path) -> str:
    return f"model '{spec.name}' ({source})"


def fixed_shape_model(source: Path, spec: ModelSpec, cache: ArtifactCache) -> Path:
    """Return the cached copy of source with its frozen inputs replaced by constants and every other
    input dim fixed (raises ModelError naming the model and input otherwise)."""
    model = load_onnx(source)
    shapes = {k: list(v) for k, v in sorted(spec.input_shapes.items())}
    key = content_key("fixed-v2", source, shapes, spec.freeze_inputs)

    def build(out: Path) -> None:
        frozen, _ = freeze_inputs(model, spec.freeze_inputs, _where(spec, source),
                                  {k: v for k, v in spec.input_shapes.items() if k in spec.freeze_inputs})
        rest = {k: v for k, v in spec.input_shapes.items() if k not in spec.freeze_inputs}
        fixed = fix_input_shapes(frozen, rest, str(source))
        onnx.save(fixed, str(out / "model.onnx"))

    return cache.entry("fixed", key, build).path / "model.onnx"


@dataclass(frozen=True)
class TransformResult:
    """One transform of the conversion: whether it was kept, its effect, and its equivalence check."""

    transform: str
    applied: bool
    nodes_after: int
    target: str = ""  # the node or initializer a per-site transform changed
    max_abs_diff: float | None = None
    cosine: float | None = None
    note: str = ""


def _calibration_feeds(spec: ModelSpec, fixed: onnx.ModelProto, count: int = 1) -> list:
    """The first `count` samples of the spec's calibration data (real inputs give outputs that random
    ones may leave at 0, e.g. a text detector's probability map); none without calibration data."""
    if spec.calib_data is None:
        return []

    try:
        return load_calibration_dir(spec.calib_data, input_infos(fixed))[:count]
    except ConfigError:  # reported by the steps that use the data set
        return []


class _Checker:
    """Runs each candidate model on the check inputs and compares it with the source's outputs."""

    def __init__(self, source: onnx.ModelProto, fixed: onnx.ModelProto, spec: ModelSpec, where: str) -> None:
        self.where = where
        self.feeds = check_feeds(fixed, seed_text=spec.name) + _calibration_feeds(spec, fixed)
        frozen = {name: frozen_array(source, name, value, where) for name, value in spec.freeze_inputs.items()}
        self.reference = None
        self.envelope = None  # the source's outputs under its float rounding envelope (None: not measured)
        self.skipped = ""
        feeds = [{**feed, **frozen} for feed in self.feeds]
        try:
            self.reference = run(source, feeds)
        except RunFailed as e:
            self.skipped = f"the source model does not run on the check inputs in onnxruntime ({e})"
            return
        try:
            self.envelope = run(rounding.envelope_model(infer_shapes(fixed), seed=0)[0], self.feeds)
        except Exception as e:  # shape inference or the perturbed model failed: the fixed tolerance stays
            log.info("%s: no rounding envelope (%s); the fixed tolerance applies", where,
                     str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)

    def check(self, model: onnx.ModelProto) -> Equivalence | None:
        """Return the model's equivalence with the source (None when the source could not run)."""
        if self.reference is None:
            return None
        try:
            return compare(self.reference, run(model, self.feeds), self.envelope)
        except RunFailed as e:
            return Equivalence(float("inf"), 0.0, "", 0.0, f"onnxruntime cannot run it: {e}")

    def intermediates(self, model: onnx.ModelProto, names: tuple[str, ...]) -> list[dict]:
        """Return the named tensors (graph inputs or intermediates) for each check input."""
        inner = tuple(n for n in names if n not in self.feeds[0])
        outs = run(model, self.feeds, extra_outputs=inner) if inner else [{} for _ in self.feeds]
        return [{**feed, **out} for feed, out in zip(self.feeds, outs)]


class _Conversion:
    """The transforms applied in order to one model, each kept only when the model stays equivalent."""

    def __init__(self, model: onnx.ModelProto, checker: _Checker) -> None:
        self.model = model
        self.checker = checker
        self.results: list[TransformResult] = []
        self.rewrites: list[rewrites.Rewrite] = []
        self.constants: list[dict] = []
        self.last: Equivalence | None = None  # of the model kept last
        self.tried: Equivalence | None = None  # of the last candidate, kept or not

    def attempt(self, name: str, candidate: onnx.ModelProto, required: bool, note: str = "", target: str = "") -> bool:
        """Keep candidate when it is equivalent to the source; else skip it, or raise StepError if required."""
        eq = self.tried = self.checker.check(candidate)
        ok = eq is None or eq.passed
        if not ok and required:
            what = f"{name} on {target}" if target else name
            raise StepError(f"{self.checker.where}: conversion transform '{what}' changed the model's outputs: "
                            f"{eq} (the model before it was equivalent to the source)")
        if ok:
            self.model, self.last = candidate, eq
        self.results.append(TransformResult(
            name, ok, len(candidate.graph.node), target, None if eq is None else eq.max_abs_diff,
            None if eq is None else eq.cosine, note if ok else f"not applied: {eq}"))
        return ok

    def skip(self, name: str, why: str) -> None:
        self.results.append(TransformResult(name, False, len(self.model.graph.node), note=why))


def _raise_opset(conv: _Conversion) -> None:
    before = opset.opset_of(conv.model)
    name = f"raise_opset {before}->{opset.QDQ_16BIT_OPSET}"
    if before >= opset.QDQ_16BIT_OPSET:
        return
    try:
        candidate = opset.raise_opset(conv.model)
    except Exception as e:  # onnx's converter raises plain RuntimeErrors per node
        conv.skip(name, f"not applied: onnx.version_converter failed ({str(e).strip().splitlines()[0]}); "
                        "16-bit Q/DQ will use the com.microsoft domain")
        return
    conv.attempt(name, candidate, required=False, note="16-bit Q/DQ in the ai.onnx domain")


def _fold(conv: _Conversion, label: str = "fold") -> None:
    name = f"{label} ({simplify.library_version()})"
    try:
        candidate = simplify.fold(conv.model)
    except Exception as e:
        raise StepError(f"{conv.checker.where}: conversion transform '{name}' failed: "
                        f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
    conv.attempt(name, candidate, required=True)


def _finite_constants(conv: _Conversion) -> None:
    for huge in constants.find_huge_constants(conv.model):
        row = {"initializer": huge.name, "elements": huge.elements, "values": list(huge.values),
               "consumers": ", ".join(huge.consumers), "replacement": "", "applied": False}
        try:
            scale = constants.data_range(conv.checker.intermediates(conv.model, huge.other_inputs),
                                         huge.other_inputs) if conv.checker.reference is not None else 1.0
        except RunFailed:
            scale = 1.0
        for factor in constants.SCALES:
            magnitude = float(factor * scale)
            candidate = constants.replace_huge(conv.model, huge.name, magnitude)
            signs = {"-" if v < 0 else "+" for v in huge.values if v == v}
            shown = f"{'±' if len(signs) > 1 else signs.pop() if signs else ''}{magnitude:.6g}".lstrip("+")
            if conv.attempt("finite_constants", candidate, required=False, note=shown, target=huge.name):
                row.update(replacement=shown, applied=True)
                break
        conv.constants.append(row)


def _builtin_rewrites(conv: _Conversion, rules: tuple[rewrites.BuiltinRewrite, ...]) -> None:
    for rule in rules:
        for site in rule.sites(conv.model):
            node = next(n for n in conv.model.graph.node if n.name == site)
            candidate, replacement = rule.apply(conv.model, site)
            ok = conv.attempt(rule.name, candidate, required=False, note=rule.why, target=site)
            conv.rewrites.append(rewrites.Rewrite(rule.name, site, node.op_type, replacement, ok,
                                                  "" if ok else f"not applied: {conv.tried}"))


def _user_rewrites(conv: _Conversion, references: tuple[str, ...]) -> None:
    for reference in references:
        if reference in rewrites.OPTIONAL:
            _builtin_rewrites(conv, (rewrites.OPTIONAL[reference],))
            continue
        candidate, rows = rewrites.apply_user_rewrite(conv.model, reference)
        conv.attempt(f"rewrite {reference}", candidate, required=True)
        conv.rewrites.extend(rows)


def _qnn_preprocess(conv: _Conversion, work: Path) -> None:
    from onnxruntime.quantization.execution_providers.qnn import qnn_preprocess_model

    model = copy_model(conv.model)
    # onnxruntime's preprocessing crashes on models that carry metadata_props (it calls dict.update
    # on the protobuf list); strip them for the call and put them back after.
    metadata = {p.key: p.value for p in model.metadata_props}
    del model.metadata_props[:]
    target = work / "preprocessed.onnx"
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # it warns once per unnamed node it names
    try:
        changed = bool(qnn_preprocess_model(model, str(target)))
    except Exception as e:
        raise ModelError(f"{conv.checker.where}: QNN preprocessing failed: {type(e).__name__}: {e}") from None
    finally:
        root.setLevel(level)
    if not changed:
        conv.skip("qnn_preprocess_model", "nothing to fuse")
        return
    result = onnx.load(str(target))
    target.unlink()
    onnx.helper.set_model_props(result, {**metadata, **{p.key: p.value for p in result.metadata_props}})
    conv.attempt("qnn_preprocess_model", result, required=True)


def _cache_key(source: Path, fixed_model: Path, spec: ModelSpec) -> str:
    import onnxruntime

    files = [Path(r.rpartition(":")[0]) for r in spec.rewrites if r.rpartition(":")[0].endswith(".py")]
    return content_key("converted-v3", source, fixed_model, spec.freeze_inputs, list(spec.rewrites),
                       str(spec.calib_data or ""),
                       [f for f in files if f.is_file()], simplify.library_version(),
                       onnx.__version__, onnxruntime.__version__)


def convert(source: Path, fixed_model: Path, spec: ModelSpec, cache: ArtifactCache) -> StepReport:
    """Return the conversion report; its artifact 'model' is the converted float model.

    Raises StepError naming the transform that changed the outputs, ModelError when QNN
    preprocessing fails, ConfigError for a user rewrite that cannot be loaded or run.
    """
    where = _where(spec, source)

    def build(out: Path) -> None:
        source_model = onnx.load(str(source))
        fixed = onnx.load(str(fixed_model))
        checker = _Checker(source_model, fixed, spec, where)
        conv = _Conversion(fixed, checker)
        conv.attempt("freeze_inputs + fix_input_shapes" if spec.freeze_inputs else "fix_input_shapes", fixed,
                     required=True)
        _raise_opset(conv)
        nodes_before_fold = count_nodes(conv.model)
        _fold(conv)
        folded = nodes_before_fold - count_nodes(conv.model)
        _finite_constants(conv)
        conv.model = rewrites.named(conv.model)  # the same graph, its unnamed nodes named for the tables
        _builtin_rewrites(conv, rewrites.BUILTIN)
        _user_rewrites(conv, spec.rewrites)
        if any(r.applied for r in conv.rewrites):  # what a rewrite left constant folds too
            _fold(conv, "fold after rewrites")
        _qnn_preprocess(conv, out)
        final = conv.model
        try:
            final = infer_shapes(final)
        except Exception as e:  # the model still runs; value_info is only used for sizing
            conv.skip("infer_shapes", f"final shape inference failed: {str(e).strip().splitlines()[0]}")
        onnx.save(final, str(out / "model.onnx"))
        summary = {
            "transforms": [asdict(t) for t in conv.results],
            "rewrites": [asdict(r) for r in conv.rewrites],
            "constants": conv.constants,
            "equivalence": None if conv.last is None else asdict(conv.last),
            "equivalence_skipped": checker.skipped,
            "opset_before": opset.opset_of(source_model),
            "nodes_fixed_all": count_nodes(fixed),
            "folded": folded,
        }
        (out / REPORT_FILE).write_text(json.dumps(summary, indent=1, default=str))

    entry = cache.entry("converted", _cache_key(source, fixed_model, spec), build)
    report = _report(entry.path, fixed_model, spec, entry.hit)
    if entry.healed:
        report.notes.append(f"the cached converted model was damaged ({entry.healed}); it was converted again")
    return report


def _applied(transforms: list[dict]) -> list[str]:
    """Return the kinds of transforms kept, in order, with a count for per-site ones ('erf_gelu x10')."""
    counts: dict[str, int] = {}
    for t in transforms:
        if t["applied"]:
            counts[t["transform"]] = counts.get(t["transform"], 0) + 1
    return [f"{name} x{n}" if n > 1 else name for name, n in counts.items()]


def _report(entry: Path, fixed_model: Path, spec: ModelSpec, hit: bool) -> StepReport:
    converted = entry / "model.onnx"
    summary = json.loads((entry / REPORT_FILE).read_text())
    before, after = onnx.load(str(fixed_model)), onnx.load(str(converted))
    report = StepReport("conversion")
    inits = {x.name for x in after.graph.initializer}
    report.kpis = {
        "nodes_before": len(before.graph.node),
        "nodes_after": len(after.graph.node),
        "nodes_before_with_subgraphs": summary["nodes_fixed_all"],
        "folded": summary["folded"],
        "ops_removed": simplify.removed_ops(before, after),
        "opset_before": summary["opset_before"],
        "opset_after": opset.opset_of(after),
        "transforms": _applied(summary["transforms"]),
        "input_shapes": {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
                         for i in after.graph.input if i.name not in inits},
        "frozen_inputs": dict(spec.freeze_inputs),
        "rewrites_applied": sum(1 for r in summary["rewrites"] if r["applied"]),
        "model_bytes": converted.stat().st_size,
        "cache_hit": hit,
    }
    eq = summary["equivalence"]
    if eq is not None:
        report.kpis["equivalence_max_abs_diff"] = eq["max_abs_diff"]
        report.kpis["equivalence_cosine"] = eq["cosine"]
        if not eq["cosine_required"]:
            report.notes.append(f"equivalence: the worst case is output '{eq['worst_output']}' on a check input "
                                f"where it is ~0 everywhere (largest difference {eq['max_abs_diff']:.3g}); a "
                                "cosine there would measure float32 rounding, so 1.0 is reported")
    else:
        report.notes.append(f"equivalence not checked: {summary['equivalence_skipped']}")
    report.tables["transforms"] = summary["transforms"]
    if summary["rewrites"]:
        report.tables["rewrites"] = summary["rewrites"]
    if summary["constants"]:
        report.tables["constants"] = summary["constants"]
        report.notes += [f"initializer '{c['initializer']}' ({c['elements']} elements of {c['values']}, read by "
                         f"{c['consumers']}): " + (f"replaced by {c['replacement']}" if c["applied"] else
                                                   "kept: no finite replacement kept the outputs")
                         for c in summary["constants"]]
    report.notes += [f"{t['transform']}{' on ' + t['target'] if t['target'] else ''}: {t['note']}"
                     for t in summary["transforms"] if t["note"].startswith("not applied")]
    report.notes += sorted({f"rewrite {t['transform']}: {t['note']}" for t in summary["transforms"]
                            if t["applied"] and t["target"] and t["transform"] != "finite_constants"})
    report.artifacts["model"] = converted
    return report
