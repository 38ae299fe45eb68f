"""QAIRT/AIMET encodings: export from QDQ models, import as overrides, round trip, and bad files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from harness.data import input_infos, random_dataset
from harness.errors import ConfigError
from harness.quantization.encodings import Encoding, load_encodings, parse_encodings
from harness.quantization.export import export_encodings, write_encodings
from harness.steps.ptq import QuantRecipe, quantize
from models_outlier import HOSTILE_FUSED_TENSOR, HOSTILE_TENSOR, build_outlier_model

REPO = Path(__file__).resolve().parent.parent
MIXED = {HOSTILE_TENSOR: [{"quant_type": "QUInt16"}], HOSTILE_FUSED_TENSOR: [{"quant_type": "QUInt16"}]}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_outlier_model(tmp_path_factory.mktemp("enc") / "outlier_cnn.onnx").path


@pytest.fixture(scope="module")
def datasets(model):
    infos = input_infos(onnx.load(str(model)))
    return random_dataset(infos, "calib-a"), random_dataset(infos, "calib-b")


def _same(a, b) -> list[str]:
    diffs = []
    for group in ("activations", "params"):
        x, y = getattr(a, group), getattr(b, group)
        if set(x) != set(y):
            diffs.append(f"{group}: {sorted(set(x) ^ set(y))}")
        for name in set(x) & set(y):
            for e, f in zip(x[name], y[name]):
                if (e.bitwidth, e.offset) != (f.bitwidth, f.offset) or not np.isclose(e.scale, f.scale, rtol=1e-6):
                    diffs.append(f"{group} {name}: {e} != {f}")
    return diffs


@pytest.mark.parametrize("recipe", [
    QuantRecipe(),
    QuantRecipe(per_channel=True, weight_type="QInt8", weight_symmetric=True),
    QuantRecipe(tensor_overrides=MIXED),
], ids=["per-tensor", "per-channel", "mixed-precision"])
def test_export_then_import_reproduces_the_encodings(recipe, model, datasets, cache, tmp_path):
    calib_a, calib_b = datasets
    exported = export_encodings(quantize(model, calib_a.calibration, recipe, cache))
    path = write_encodings(exported, tmp_path / "overrides.json")
    # Other calibration data: only the file's encodings can make the result equal.
    again = quantize(model, calib_b.calibration,
                     QuantRecipe(encodings=load_encodings(path).to_json(), encodings_file=str(path)), cache)
    assert _same(exported, export_encodings(again)) == []
    assert _same(exported, export_encodings(quantize(model, calib_b.calibration, recipe, cache))) != []


def test_file_follows_the_qairt_overrides_format(model, datasets, cache, tmp_path):
    qdq = quantize(model, datasets[0].calibration, QuantRecipe(tensor_overrides=MIXED), cache)
    data = json.loads(write_encodings(export_encodings(qdq), tmp_path / "o.json").read_text())
    assert set(data) == {"version", "activation_encodings", "param_encodings"}
    act = data["activation_encodings"]
    assert {"x", HOSTILE_TENSOR, "logits"} <= set(act)  # float-model names, not QDQ-internal ones
    entry = act[HOSTILE_TENSOR][0]
    assert set(entry) == {"bitwidth", "dtype", "is_symmetric", "max", "min", "offset", "scale"}
    assert entry["bitwidth"] == 16 and entry["dtype"] == "int" and entry["is_symmetric"] in {"True", "False"}
    assert act["logits"][0]["bitwidth"] == 8
    for e in (e for entries in act.values() for e in entries):  # real = (q + offset) * scale
        assert e["min"] == pytest.approx(e["offset"] * e["scale"])
        assert e["max"] == pytest.approx((2 ** e["bitwidth"] - 1 + e["offset"]) * e["scale"])
    assert set(data["param_encodings"]) == {"conv1_w", "conv2_w", "conv3_w", "fc_w"}  # biases are derived


def test_offset_is_minus_the_zero_point(model, datasets, cache):
    qdq = quantize(model, datasets[0].calibration,
                   QuantRecipe(per_channel=True, weight_type="QInt8", weight_symmetric=True), cache)
    graph = onnx.load(str(qdq)).graph
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    enc = export_encodings(qdq)
    x_zp = int(inits["x_zero_point"])
    assert enc.activations["x"][0].offset == -x_zp
    weights = enc.params["conv1_w"]
    assert len(weights) == 8  # per output channel
    assert all(e.offset == -128 and e.is_symmetric for e in weights)  # signed symmetric int8


def test_min_max_entries_and_bias_entries_are_accepted(model):
    from harness.quantization.overrides import to_tensor_overrides

    enc = parse_encodings({"activation_encodings": {"x": [{"bitwidth": 8, "min": 0.0, "max": 1.0}]},
                           "param_encodings": {"conv1_b": [{"bitwidth": 32, "scale": 1e-5, "offset": 0}]}}, "t")
    plan = to_tensor_overrides(enc, model)
    assert plan.tensor_overrides["x"] == [{"quant_type": "QUInt8", "scale": pytest.approx(1 / 255), "zero_point": 0}]
    assert plan.skipped == ["conv1_b"]


def test_an_initializer_listed_as_an_activation_is_a_parameter(model):
    """AIMET lists Gather tables and constants under activation_encodings."""
    from harness.quantization.overrides import to_tensor_overrides

    enc = parse_encodings({"activation_encodings": {"conv1_w": [Encoding(8, 0.01, -128, True).to_json()]}}, "t")
    plan = to_tensor_overrides(enc, model)
    assert plan.tensor_overrides["conv1_w"] == [{"quant_type": "QInt8", "scale": 0.01, "zero_point": 0}]


def _bad(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, message", [
    ('{"activation_encodings": {', "not valid JSON"),
    ('[1, 2]', "expected a JSON object"),
    ('{"activation_encodings": {"x": [{"bitwidth": 7, "scale": 0.1, "offset": 0}]}}',
     "activation_encodings['x']: bitwidth 7 is impossible"),
    ('{"activation_encodings": {"x": [{"bitwidth": 32, "scale": 0.1, "offset": 0}]}}',
     "activation_encodings['x']: bitwidth 32 is not supported for activations"),
    ('{"param_encodings": {"w": [{"bitwidth": 8, "dtype": "float"}]}}', "param_encodings['w']: dtype 'float'"),
    ('{"activation_encodings": {"x": [{"bitwidth": 8, "scale": -1, "offset": 0}]}}', "scale -1 must be a positive"),
    ('{"activation_encodings": {"x": [{"bitwidth": 8, "scale": 0.1, "offset": 12}]}}', "offset 12 is outside"),
    ('{"activation_encodings": {"x": [{"bitwidth": 8}]}}', "needs 'scale' and 'offset', or 'min' and 'max'"),
    ('{"activation_encodings": {"x": [{"bitwidth": 8, "scale": 0.1, "offset": 0, "is_symmetric": "maybe"}]}}',
     "is_symmetric 'maybe'"),
    ('{"encodings": {}}', "encodings: must be a list of encodings with a 'name' (2.x layout)"),
    ('{"activation_encodings": {}, "extra": 1}', "unknown top-level key(s) extra"),
    ('{"activation_encodings": {"x": [{"bitwidth": 3, "scale": 0.1, "offset": 0}]}}', "bitwidth 3 is impossible"),
    ('{"activation_encodings": {"x": [{"bitwidth": 4, "scale": 0.1, "offset": 0}]}}',
     "bitwidth 4 is not supported for activations"),
    ('{"activation_encodings": [{"name": "x", "bw": 6, "dtype": "INT", "enc_type": "PER_TENSOR", "is_sym": false,'
     ' "scale": [0.1], "offset": [0]}]}', "activation_encodings['x']: bitwidth 6 is impossible"),
    ('{"activation_encodings": [{"name": "x", "bw": 32, "dtype": "INT", "enc_type": "PER_TENSOR",'
     ' "is_sym": false, "scale": [0.1], "offset": [0]}]}', "bitwidth 32 is not supported for activations"),
    ('{"param_encodings": [{"name": "w", "bw": 4, "dtype": "INT", "enc_type": "PER_BLOCK", "is_sym": true,'
     ' "scale": [0.1], "offset": [-8], "block_size": 16}]}', "enc_type PER_BLOCK (blockwise) is not supported"),
    ('{"param_encodings": [{"name": "w", "bw": 16, "dtype": "FLOAT", "enc_type": "PER_TENSOR"}]}',
     "param_encodings['w']: dtype 'FLOAT'"),
    ('{"activation_encodings": [{"bw": 8, "dtype": "INT", "scale": [0.1], "offset": [0]}]}',
     "activation_encodings[0]: expected an encoding object with a tensor 'name'"),
    ('{"param_encodings": [{"name": "w", "bw": 8, "dtype": "INT", "enc_type": "PER_TENSOR", "is_sym": true,'
     ' "scale": [0.1, 0.2], "offset": [-128, -128]}]}', "enc_type PER_TENSOR with 2 scales"),
    ('{"version": "2.0.0", "encodings": [{"name": "x", "output_dtype": "uint6", "y_scale": 0.1}]}',
     "encodings['x']: bitwidth 6 is impossible"),
    ('{"version": "2.0.0", "encodings": [{"name": "x", "output_dtype": "float16"}]}',
     "encodings['x']: output_dtype 'float16' (float fallback)"),
    ('{"version": "2.1.0", "encodings": [{"name": "w", "output_dtype": "int4", "y_scale": [0.1, 0.2], "axis": 0,'
     ' "block_size": 16}]}', "encodings['w']: blockwise / LPBQ encodings are not supported"),
    ('{"version": "2.0.0", "encodings": [{"name": "w", "output_dtype": "int8", "y_scale": [0.1, 0.2]}]}',
     "2 y_scale values need an 'axis'"),
    ('{"version": "2.0.0", "encodings": [{"name": "x", "output_dtype": "uint8", "y_scale": 0.1},'
     ' {"name": "x", "output_dtype": "uint8", "y_scale": 0.2}]}', "tensor 'x' has a second encoding"),
    ('{"version": "1.0.0", "encodings": []}', "the flat 'encodings' list is the 2.x layout"),
    ('{"version": "2.0.0", "activation_encodings": {}}', "version 2.0.0 files have one flat 'encodings' list"),
])
def test_malformed_files_name_the_entry(tmp_path, text, message):
    path = _bad(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_encodings(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_unknown_or_misplaced_tensors_are_named_when_quantizing(model, datasets, cache):
    doc = {"activation_encodings": {"no_such_act": [Encoding(8, 0.1, 0).to_json()]},
           "param_encodings": {"no_such_weight": [Encoding(8, 0.1, -128, True).to_json()]}}
    with pytest.raises(ConfigError, match=r"2 tensor\(s\) not in the model outlier_cnn.onnx: "
                                          r"activation 'no_such_act', param 'no_such_weight'"):
        quantize(model, datasets[0].calibration, QuantRecipe(encodings=doc, encodings_file="f.json"), cache)
    doc = {"param_encodings": {"x": [Encoding(8, 0.1, 0).to_json()]}}
    with pytest.raises(ConfigError, match="'x' is an activation"):
        quantize(model, datasets[0].calibration, QuantRecipe(encodings=doc, encodings_file="f.json"), cache)
    doc = {"version": "2.0.0", "encodings": [{"name": "x", "output_dtype": "int32", "y_scale": 0.1}]}
    with pytest.raises(ConfigError, match="'x' is an activation and takes one 8/16-bit encoding, not 1 32-bit"):
        quantize(model, datasets[0].calibration, QuantRecipe(encodings=doc, encodings_file="f.json"), cache)
    doc = {"param_encodings": {"conv1_w": [Encoding(8, 0.1, -128, True).to_json()] * 3}}
    with pytest.raises(ConfigError, match="3 per-channel encodings but the weight has shape"):
        quantize(model, datasets[0].calibration, QuantRecipe(encodings=doc, encodings_file="f.json"), cache)


def test_bad_overrides_file_is_a_usage_error(pytester: pytest.Pytester, tmp_path):
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]')
    pytester.makepyfile("def test_nothing():\n    pass\n")
    path = _bad(tmp_path, '{"activation_encodings": {"x": [{"bitwidth": 12, "scale": 1, "offset": 0}]}}')
    result = pytester.runpytest_subprocess("--devices-file", str(REPO / "devices.yaml"),
                                           "--quantization-overrides", str(path), "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--quantization-overrides: {path}: activation_encodings['x']: bitwidth 12 is impossible" in result.stderr.str()
