"""Step 2, conversion: fix input shapes, apply QNN preprocessing, save the converted model."""

from __future__ import annotations

from pathlib import Path

import onnx

from harness.cache import ArtifactCache, content_key
from harness.errors import ModelError
from harness.models import ModelSpec, fix_input_shapes, load_onnx
from harness.steps.report import StepReport


def fixed_shape_model(source: Path, spec: ModelSpec, cache: ArtifactCache) -> Path:
    """Return the cached copy of source with every input dim fixed (raises ModelError otherwise)."""
    model = load_onnx(source)
    shapes = {k: list(v) for k, v in sorted(spec.input_shapes.items())}
    key = content_key("fixed-v1", source, shapes)

    def build(out: Path) -> None:
        fixed = fix_input_shapes(model, spec.input_shapes, str(source))
        onnx.save(fixed, str(out / "model.onnx"))

    return cache.entry("fixed", key, build).path / "model.onnx"


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    clone = onnx.ModelProto()
    clone.CopyFrom(model)
    return clone


def convert(fixed_model: Path, cache: ArtifactCache) -> StepReport:
    """Return the conversion report; its artifact 'model' is the QNN-preprocessed float model."""
    from onnxruntime.quantization.execution_providers.qnn import qnn_preprocess_model

    key = content_key("converted-v1", fixed_model)
    state: dict[str, bool] = {}

    def build(out: Path) -> None:
        target = out / "model.onnx"
        model = onnx.load(str(fixed_model))
        # onnxruntime's preprocessing crashes on models that carry metadata_props (it calls
        # dict.update on the protobuf list); strip them for the call and put them back after.
        metadata = {p.key: p.value for p in model.metadata_props}
        del model.metadata_props[:]
        try:
            state["modified"] = bool(qnn_preprocess_model(_copy(model), str(target)))
        except Exception as e:
            raise ModelError(f"{fixed_model}: QNN preprocessing failed: {type(e).__name__}: {e}") from None
        result = onnx.load(str(target)) if target.exists() else model
        onnx.helper.set_model_props(result, {**metadata, **{p.key: p.value for p in result.metadata_props}})
        onnx.save(result, str(target))

    entry = cache.entry("converted", key, build)
    converted = entry.path / "model.onnx"
    before, after = onnx.load(str(fixed_model)), onnx.load(str(converted))
    report = StepReport("conversion")
    report.kpis = {
        "nodes_before": len(before.graph.node),
        "nodes_after": len(after.graph.node),
        "input_shapes": {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
                         for i in after.graph.input if i.name not in {x.name for x in after.graph.initializer}},
        "model_bytes": converted.stat().st_size,
        "cache_hit": entry.hit,
    }
    if "modified" in state:
        report.kpis["preprocessing_changed_graph"] = state["modified"]
    report.artifacts["model"] = converted
    return report
