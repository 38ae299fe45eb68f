"""Encodings as aimet-onnx 2.42 really writes them, through the harness's --quantization-overrides path.

Two kinds of tests:

* on the exports kept in tests/data/aimet (made once by tests/data/aimet/make.py, which says how):
  every run checks the loaders, the per-channel axes and the refusals on genuine files, and runs
  the quantized models on the HTP simulator;
* marked `aimet` (deselected by default; `pytest tests/ -m aimet` after `bash scripts/install-aimet.sh`):
  AIMET's QuantizationSimModel + compute_encodings + export on a CNN and a transformer graph, in the
  0.6.1, 1.0.0 and 2.0.0 layouts at w8a8, w8a16, w4a8 and w4a16 (per-channel weights), each file
  loaded unchanged, quantized with and run on the HTP simulator against the float model.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from harness.cache import ArtifactCache
from harness.errors import ConfigError, HarnessError
from harness.metrics import cosine_similarity
from harness.quantization.encodings import load_encodings
from harness.quantization.export import export_encodings
from harness.quantization.overrides import aimet_channel_axis, model_for_encodings, to_tensor_overrides
from harness.steps.ptq import QuantRecipe, quantize

DATA = Path(__file__).resolve().parent / "data" / "aimet"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
_spec = importlib.util.spec_from_file_location("aimet_test_data_make", DATA / "make.py")
make = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make)

QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}


def min_cosine(model: str, param_type: str, activation_type: str) -> float:
    """The closeness each model and bit width must reach against the float model on the HTP (measured:
    CNN 0.9996 w8a8, 0.996 w4a16; GPT 0.95 with 8-bit activations, whose attention loses the most,
    0.999 w8a16, 0.99 w4a16)."""
    if model == "gpt" and activation_type == "int8":
        return 0.93
    return {("int8", "int8"): 0.99, ("int8", "int16"): 0.995,
            ("int4", "int8"): 0.95, ("int4", "int16"): 0.98}[(param_type, activation_type)]


def quantize_and_run(model: Path, path: Path, cache: ArtifactCache, runner) -> dict:
    """Load the encodings file unchanged as --quantization-overrides does, quantize model with it, run the QDQ
    model on the HTP simulator; return what the tests assert on."""
    doc = load_encodings(path).to_json()  # what the plugin stores for PTQ
    source = str(path)
    calibration = make.calibration(model, 2, seed=9)  # not AIMET's data: only the file can fix the encodings
    qdq = quantize(model_for_encodings(model, doc, source, cache), calibration,
                   QuantRecipe(encodings=doc, encodings_file=source), cache)
    graph = onnx.load(str(qdq)).graph
    feeds = make.calibration(model, 4, seed=7)
    run = runner.run(qdq, feeds, "htp")
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    output = session.get_outputs()[0].name
    reference = [session.run([output], feed)[0] for feed in feeds]
    return {"qdq": qdq, "qdq_nodes": sum(n.op_type in QDQ_OPS for n in graph.node),
            "opset": next(o.version for o in onnx.load(str(qdq)).opset_import if o.domain in ("", "ai.onnx")),
            "on_htp": bool(run.placement) and all(p.on_htp for p in run.placement),
            "cosine": cosine_similarity(np.stack(reference), np.stack([o[output] for o in run.outputs]))}


def assert_file_encodings_applied(path: Path, model: Path, qdq: Path) -> None:
    """The QDQ model's scales and offsets are the file's (by tensor name, parameters and activations)."""
    given = load_encodings(path)
    inits = {i.name for i in onnx.load(str(model), load_external_data=False).graph.initializer}
    applied = export_encodings(qdq)
    compared = 0
    for name, encs in {**given.activations, **given.params}.items():
        if encs[0].bitwidth == 32:
            continue  # biases are derived from input and weight scales
        found = applied.params.get(name) if name in inits else applied.activations.get(name)
        if found is None:
            continue  # e.g. the input of a folded Relu, or a tensor onnxruntime leaves unquantized
        compared += 1
        assert len(found) == len(encs), name
        for e, f in zip(encs, found):
            assert (f.bitwidth, f.offset) == (e.bitwidth, e.offset), name
            assert f.scale == pytest.approx(e.scale, rel=1e-5), name
    assert compared >= 0.6 * len([e for e in {**given.activations, **given.params}.values() if e[0].bitwidth != 32])


# ------------------------------------------------------------------------- the kept exports (every run)

@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_kept_aimet_exports_load_in_their_layout(name):
    info, path = MANIFEST[name], DATA / name
    raw = json.loads(path.read_text())
    assert raw["producer"]["package"] == "aimet-onnx" and raw["version"] == info["encoding_version"]
    enc = load_encodings(path)
    assert enc.version == info["encoding_version"]
    weight_bits = int(info["param_type"][3:])
    weights = {n: e for n, e in enc.params.items() if e[0].bitwidth != 32 and len(e) > 1}
    assert weights and all(e[0].bitwidth == weight_bits and all(x.is_symmetric for x in e)
                           for e in weights.values())
    act_bits = int(info["activation_type"][3:])
    assert {e[0].bitwidth for n, e in enc.activations.items() if not n.endswith(".weight")
            and not n.startswith("const.")} == {act_bits}


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_kept_aimet_exports_quantize_and_run_on_the_htp(name, cache, sm8650_runner):
    info, path = MANIFEST[name], DATA / name
    model = DATA / info["model"]
    result = quantize_and_run(model, path, cache, sm8650_runner)
    assert result["qdq_nodes"] > 0  # a QDQ model that really holds Q/DQ nodes
    assert result["on_htp"]
    assert result["cosine"] >= min_cosine(info["model"][:-5], info["param_type"], info["activation_type"])
    assert_file_encodings_applied(path, model, result["qdq"])
    if info["param_type"] == "int4":
        assert result["opset"] >= 21  # tensor(int4) DequantizeLinear


def test_gather_tables_listed_as_activations_become_parameters():
    path = DATA / "gpt_w8a16_1.0.0.encodings"
    names = [e["name"] for e in json.loads(path.read_text())["activation_encodings"]]
    assert {"tok_emb.weight", "pos_emb.weight"} <= set(names)  # as AIMET writes them
    plan = to_tensor_overrides(load_encodings(path), DATA / "gpt.onnx", "QUInt16")
    table = plan.tensor_overrides["tok_emb.weight"][0]
    assert table["quant_type"] == "QUInt16" and "axis" not in table  # AIMET quantizes Gather tables per tensor


def test_square_matmul_and_gemm_weights_take_aimets_axes():
    """[16, 16] attention weights: only the op's convention can tell the channel axis."""
    model = onnx.load(str(DATA / "gpt.onnx"))
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    consumer = {i: n for n in model.graph.node for i in n.input}
    plan = to_tensor_overrides(load_encodings(DATA / "gpt_w8a16_1.0.0.encodings"), DATA / "gpt.onnx", "QUInt16")
    square = [n for n, entries in plan.tensor_overrides.items() if "axis" in entries[0]
              and len(set(inits[n])) == 1 and len(inits[n]) == 2]
    assert square  # the q/k/v/o projections
    for name in square:
        node = consumer[name]
        expected = {"MatMul": 1, "Gemm": 0 if any(a.name == "transB" and a.i for a in node.attribute) else 1}
        assert plan.tensor_overrides[name][0]["axis"] == expected[node.op_type], name


def _node(op, inputs, **attrs):
    return onnx.helper.make_node(op, inputs, ["y"], **attrs)


@pytest.mark.parametrize("node, index, rank, axis", [
    (_node("Conv", ["x", "w"]), 1, 4, 0),
    (_node("ConvTranspose", ["x", "w"]), 1, 4, 1),
    (_node("Gemm", ["x", "w"], transB=1), 1, 2, 0),
    (_node("Gemm", ["x", "w"]), 1, 2, 1),
    (_node("MatMul", ["x", "w"]), 1, 2, 1),
    (_node("MatMul", ["x", "w"]), 1, 3, 2),
    (_node("Gather", ["table", "ids"]), 0, 2, 0),
    (_node("Gather", ["table", "ids"], axis=1), 0, 2, 1),
    (_node("Add", ["x", "w"]), 1, 2, None),
], ids=["conv", "convtranspose", "gemm-transB", "gemm", "matmul", "matmul-3d", "gather", "gather-axis1", "add"])
def test_per_channel_axes_follow_aimet(node, index, rank, axis):
    assert aimet_channel_axis(node, index, rank) == axis


def test_4bit_encodings_raise_the_model_to_opset_21(cache):
    model = DATA / "cnn.onnx"
    assert onnx.load(str(model)).opset_import[0].version == 17
    w4 = DATA / "cnn_w4a16_2.0.0.encodings"
    raised = model_for_encodings(model, load_encodings(w4).to_json(), str(w4), cache)
    assert raised != model and onnx.load(str(raised)).opset_import[0].version == 21
    assert model_for_encodings(model, load_encodings(w4).to_json(), str(w4), cache) == raised  # cached
    w8 = DATA / "cnn_w8a8_1.0.0.encodings"
    assert model_for_encodings(model, load_encodings(w8).to_json(), str(w8), cache) == model


def _refused(model: Path, path: Path, tmp_path: Path) -> str:
    cache = ArtifactCache(tmp_path / "cache")
    with pytest.raises(HarnessError) as err:
        doc = load_encodings(path).to_json()
        quantize(model_for_encodings(model, doc, str(path), cache), make.calibration(model, 1),
                 QuantRecipe(encodings=doc, encodings_file=str(path)), cache)
    leftovers = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] if (tmp_path / "cache").exists() else []
    assert leftovers == []  # nothing half-written to the cache
    assert str(path) in str(err.value)
    return str(err.value)


def test_encodings_of_another_model_are_refused(tmp_path):
    message = _refused(DATA / "gpt.onnx", DATA / "cnn_w8a8_1.0.0.encodings", tmp_path)
    assert "not in the model gpt.onnx" in message and "'conv1.weight'" in message and "another model" in message


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["activation_encodings"][0].update(bw=6), "activation_encodings['input']: bitwidth 6 is impossible"),
    (lambda d: d["activation_encodings"][0].update(bw=32),
     "activation_encodings['input']: bitwidth 32 is not supported for activations"),
    (lambda d: d["param_encodings"][0].update(bw=3), "param_encodings['conv1.weight']: bitwidth 3 is impossible"),
], ids=["6-bit", "32-bit-activation", "3-bit-weight"])
def test_unsupported_bit_widths_in_a_real_export_are_refused(edit, expected, tmp_path):
    data = json.loads((DATA / "cnn_w8a8_1.0.0.encodings").read_text())
    edit(data)
    path = tmp_path / "edited.encodings"
    path.write_text(json.dumps(data))
    assert expected in _refused(DATA / "cnn.onnx", path, tmp_path)


def test_a_truncated_export_is_refused_as_invalid_json(tmp_path):
    path = tmp_path / "truncated.encodings"
    path.write_text((DATA / "cnn_w8a8_0.6.1.encodings").read_text()[:700])
    with pytest.raises(ConfigError, match="not valid JSON") as err:
        load_encodings(path)
    assert str(path) in str(err.value)


# ------------------------------------------------------------------- fresh AIMET runs (pytest -m aimet)

AIMET_BITS = [("int8", "int8"), ("int8", "int16"), ("int4", "int8"), ("int4", "int16")]
VERSIONS = ("0.6.1", "1.0.0", "2.0.0")


@pytest.fixture(scope="module")
def aimet_exports(tmp_path_factory, cache):
    """{(model, bits): (the model the encodings belong to, {version: encodings file})}, exported by AIMET."""
    pytest.importorskip("aimet_onnx", reason="AIMET is not installed: bash scripts/install-aimet.sh")
    root = tmp_path_factory.mktemp("aimet")
    floats = {"cnn": make.build_cnn(root / "cnn_float.onnx"), "gpt": make.build_gpt(root / "gpt_float.onnx", cache)}
    exports = {}
    for model, float_model in floats.items():
        feeds = make.calibration(float_model)
        for param_type, activation_type in AIMET_BITS:
            tag = make.bits_tag(param_type, activation_type)
            exports[model, tag] = make.aimet_export(float_model, root / f"{model}_{tag}", f"{model}_{tag}",
                                                    param_type, activation_type, VERSIONS, feeds)
    return exports


@pytest.mark.aimet
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("bits", AIMET_BITS, ids=[make.bits_tag(*b) for b in AIMET_BITS])
@pytest.mark.parametrize("model", ["cnn", "gpt"])
def test_aimet_export_quantizes_and_runs_on_the_htp(model, bits, version, aimet_exports, cache, sm8650_runner):
    exported, files = aimet_exports[model, make.bits_tag(*bits)]
    path = files[version]
    assert json.loads(path.read_text())["version"] == version
    result = quantize_and_run(exported, path, cache, sm8650_runner)
    assert result["qdq_nodes"] > 0 and result["on_htp"]
    assert result["cosine"] >= min_cosine(model, *bits), result
    assert_file_encodings_applied(path, exported, result["qdq"])


@pytest.mark.aimet
def test_every_layout_of_one_sim_gives_the_same_encodings(aimet_exports):
    for (model, tag), (exported, files) in aimet_exports.items():
        loaded = {v: load_encodings(p) for v, p in files.items()}
        inits = {i.name for i in onnx.load(str(exported), load_external_data=False).graph.initializer}

        def flat(enc):
            return {n: [(e.bitwidth, e.offset, round(e.scale, 9)) for e in es]
                    for n, es in {**enc.activations, **enc.params}.items()
                    if es[0].bitwidth != 32 and (n in inits or n in enc.activations)}

        base = flat(loaded["1.0.0"])
        for version in ("0.6.1", "2.0.0"):
            other = flat(loaded[version])
            common = set(base) & set(other)  # 2.x adds data-movement outputs, 1.0.0 lists no biases
            assert len(common) >= 0.8 * len(base), (model, tag, version)
            assert {n: base[n] for n in common} == {n: other[n] for n in common}, (model, tag, version)
