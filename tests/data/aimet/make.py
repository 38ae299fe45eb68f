"""Small models and their real aimet-onnx exports, for tests/test_aimet_encodings.py.

Regenerate the files kept here (needs AIMET: `bash scripts/install-aimet.sh`), from the repository root:

    python tests/data/aimet/make.py

It writes, for a CNN (Conv -> BatchNormalization -> Relu -> MaxPool -> Flatten -> Gemm) and a one-layer
GPT prefill graph (Gather embeddings, MatMul projections, LayerNormalization, Gelu, attention):

* `<model>.onnx`: the float model the encodings belong to (AIMET's exported model: for the CNN
  after AIMET folded the batch norm into the Conv; for the GPT after the harness's conversion step,
  which fuses the Erf GELU the HTP cannot run), saved as one file;
* `<model>_<bits>_<version>.encodings`: the encodings file exactly as
  `QuantizationSimModel.export(encoding_version=...)` wrote it (aimet-onnx 2.42.0).

The same functions build the models and run AIMET in the `aimet`-marked tests, on other bit widths.
Everything is deterministic (fixed seeds); files are a few KB.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
CNN_SHAPE = (1, 3, 8, 8)
GPT_CONFIG = dict(vocab=64, context=16, prefill_ar=4, layers=1, heads=2, hidden=16, mlp=32)
# (model, param_type, activation_type, encoding_version) kept as test data: every layout, and 4-bit weights
KEPT = [("cnn", "int8", "int8", "0.6.1"), ("cnn", "int8", "int8", "1.0.0"), ("cnn", "int4", "int16", "2.0.0"),
        ("gpt", "int8", "int16", "1.0.0"), ("gpt", "int4", "int16", "2.0.0")]


def build_cnn(path: Path, seed: int = 0) -> Path:
    """Write the float CNN (opset 17, input 'input' [1, 3, 8, 8], output 'logits' [1, 10]); return path."""
    rng = np.random.default_rng(seed)
    c = 8
    arrays = {"conv1.weight": rng.standard_normal((c, 3, 3, 3)) * 0.3, "conv1.bias": rng.standard_normal(c) * 0.1,
              "bn1.weight": 1 + 0.1 * rng.standard_normal(c), "bn1.bias": 0.1 * rng.standard_normal(c),
              "bn1.running_mean": 0.1 * rng.standard_normal(c), "bn1.running_var": 1 + 0.1 * rng.random(c),
              "fc.weight": rng.standard_normal((10, c * 4 * 4)) * 0.1, "fc.bias": rng.standard_normal(10) * 0.05}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
    nodes = [helper.make_node("Conv", ["input", "conv1.weight", "conv1.bias"], ["conv1_out"], pads=[1, 1, 1, 1],
                              name="conv1"),
             helper.make_node("BatchNormalization", ["conv1_out", "bn1.weight", "bn1.bias", "bn1.running_mean",
                                                     "bn1.running_var"], ["bn1_out"], name="bn1"),
             helper.make_node("Relu", ["bn1_out"], ["relu1_out"], name="relu1"),
             helper.make_node("MaxPool", ["relu1_out"], ["pool_out"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Flatten", ["pool_out"], ["flat"], name="flatten"),
             helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], transB=1, name="fc")]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("input", TensorProto.FLOAT, CNN_SHAPE)],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def build_gpt(path: Path, cache) -> Path:
    """Write the GPT prefill graph (harness.llm.export) as the harness's conversion step leaves it; return path."""
    sys.path.insert(0, str(REPO))
    from harness.llm.export import export_graph
    from harness.llm.gpt import GptConfig, random_weights
    from harness.models import ModelSpec
    from harness.steps import conversion

    config = GptConfig(**GPT_CONFIG)
    with tempfile.TemporaryDirectory() as tmp:
        source = export_graph(random_weights(config, seed=0, scale=0.2), config.prefill_ar, Path(tmp) / "gpt.onnx")
        spec = ModelSpec(name="gpt", source=str(source), path=source)
        report = conversion.convert(source, conversion.fixed_shape_model(source, spec, cache), spec, cache)
        shutil.copyfile(report.artifacts["model"], path)
    return path


def calibration(model: Path, count: int = 8, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """Return deterministic feeds for build_cnn's or build_gpt's model (token ids within the vocabulary,
    a causal mask, positions after the past, unit-scale past keys and values)."""
    rng = np.random.default_rng(seed)
    graph = onnx.load(str(model), load_external_data=False).graph
    inputs = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    if "input" in inputs:
        return [{"input": rng.standard_normal(CNN_SHAPE).astype(np.float32)} for _ in range(count)]
    ar, cl, vocab = GPT_CONFIG["prefill_ar"], GPT_CONFIG["context"], GPT_CONFIG["vocab"]
    feeds = []
    for _ in range(count):
        mask = np.zeros((1, 1, ar, cl), np.float32)
        for row in range(ar):  # the past (cl - ar slots) and the new tokens up to this one
            mask[0, 0, row, cl - ar + row + 1:] = -1000.0
        feed = {"input_ids": rng.integers(0, vocab, (1, ar)).astype(np.int32), "attention_mask": mask,
                "position_ids": (np.arange(ar) + cl - ar).astype(np.int32)[None]}
        for name, dims in inputs.items():
            if name.startswith("past_"):
                feed[name] = rng.standard_normal(dims).astype(np.float32)
        feeds.append(feed)
    return feeds


def aimet_export(model: Path, out_dir: Path, prefix: str, param_type: str, activation_type: str,
                 versions: tuple[str, ...], feeds: list[dict[str, np.ndarray]]) -> tuple[Path, dict[str, Path]]:
    """Run AIMET on model: fold batch norms, QuantizationSimModel (HTP v75 config, per-channel weights for
    Conv, Gemm and MatMul), compute_encodings on feeds, export in each encoding version.

    Return (the exported float model as one .onnx file, {version: .encodings file})."""
    import warnings

    from aimet_onnx.batch_norm_fold import fold_all_batch_norms_to_weight
    from aimet_onnx.common.quantsim_config.utils import get_path_for_per_channel_config  # noqa: F401 (exists)
    from aimet_onnx.quantsim import QuantizationSimModel
    import aimet_onnx.common.quantsim_config as qc

    config = Path(qc.__file__).parent / "htp_quantsim_config_v75_per_channel_linear.json"
    proto = onnx.load(str(model))
    if any(n.op_type == "BatchNormalization" for n in proto.graph.node):
        fold_all_batch_norms_to_weight(proto)
    sim = QuantizationSimModel(proto, param_type=param_type, activation_type=activation_type,
                               config_file=str(config))
    sim.compute_encodings(feeds)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 0.6.1 is deprecated, still written and read
        for version in versions:
            sim.export(str(out_dir), f"{prefix}_{version}", encoding_version=version)
            files[version] = out_dir / f"{prefix}_{version}.encodings"
    exported = out_dir / f"{prefix}_{versions[0]}.onnx"
    single = out_dir / f"{prefix}.onnx"
    onnx.save(onnx.load(str(exported)), str(single))  # one file: AIMET writes weights to a .data file
    return single, files


def bits_tag(param_type: str, activation_type: str) -> str:
    """'int4', 'int16' -> 'w4a16'."""
    return f"w{param_type[3:]}a{activation_type[3:]}"


def main() -> None:
    sys.path.insert(0, str(REPO))
    from harness.cache import ArtifactCache

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cache = ArtifactCache(tmp / "cache")
        models = {"cnn": build_cnn(tmp / "cnn_float.onnx"), "gpt": build_gpt(tmp / "gpt_float.onnx", cache)}
        for name, float_model in models.items():
            feeds = calibration(float_model)
            for model, param_type, activation_type, version in KEPT:
                if model != name:
                    continue
                tag = bits_tag(param_type, activation_type)
                exported, files = aimet_export(float_model, tmp / f"{name}_{tag}", f"{name}_{tag}",
                                               param_type, activation_type, (version,), feeds)
                shutil.copyfile(files[version], HERE / files[version].name)
                target = HERE / f"{name}.onnx"
                if target.exists() and target.read_bytes() != exported.read_bytes():
                    raise SystemExit(f"{target}: AIMET exported a different model for {tag} {version}")
                shutil.copyfile(exported, target)
    manifest = {f"{m}_{bits_tag(p, a)}_{v}.encodings": {"model": f"{m}.onnx", "param_type": p,
                                                         "activation_type": a, "encoding_version": v}
                for m, p, a, v in KEPT}
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for path in sorted(HERE.iterdir()):
        print(f"{path.stat().st_size:8d}  {path.name}")


if __name__ == "__main__":
    main()
