"""Model loading, --input-shape parsing, per-position shape fixing and model spec files."""

import onnx
import pytest

from harness.errors import ConfigError, ModelError
from harness.models import fix_input_shapes, load_onnx, parse_input_shape, resolve_model
from model_builders import conv_classifier, shared_dim_param


def test_parse_input_shape():
    assert parse_input_shape("input=1,3,224,224") == ("input", (1, 3, 224, 224))
    assert parse_input_shape("a=b=1,2") == ("a=b", (1, 2))


@pytest.mark.parametrize("text", ["input", "input=", "=1,2", "input=1,x", "input=0,3"])
def test_parse_input_shape_rejects(text):
    with pytest.raises(ConfigError, match="expected NAME=D0,D1"):
        parse_input_shape(text)


def test_missing_and_non_onnx_files(tmp_path):
    with pytest.raises(ModelError, match="no such file, and not a built-in model"):
        resolve_model(str(tmp_path / "nope.onnx"), {}, None)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a protobuf\xff" * 10)
    with pytest.raises(ModelError, match=r"junk\.onnx is not an ONNX model"):
        load_onnx(junk)


def test_shared_dim_param_is_fixed_per_position(tmp_path):
    model = onnx.load(str(shared_dim_param(tmp_path / "dyn.onnx")))
    fixed = fix_input_shapes(model, {"x": (1, 3, 16, 20), "x2": (1, 3, 16, 20)}, "dyn.onnx")
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in fixed.graph.input}
    assert dims == {"x": [1, 3, 16, 20], "x2": [1, 3, 16, 20]}
    assert [d.dim_value for d in fixed.graph.output[0].type.tensor_type.shape.dim] == [1, 3, 16, 20]


def test_unfixed_dynamic_dim_names_input_and_dims(tmp_path):
    model = onnx.load(str(shared_dim_param(tmp_path / "dyn.onnx")))
    with pytest.raises(ModelError, match=r"input 'x2' has dynamic dim\(s\) 0 \('\?'\), 2 \('\?'\), 3 \('\?'\).*"
                                         r"--input-shape x2=N,3,N,N"):
        fix_input_shapes(model, {"x": (1, 3, 4, 4)}, "dyn.onnx")


def test_wrong_rank_unknown_input_and_conflicting_fixed_dim(tmp_path):
    model = onnx.load(str(conv_classifier(tmp_path / "m.onnx")))
    with pytest.raises(ModelError, match="rank 4, --input-shape gives 2 dims"):
        fix_input_shapes(model, {"input": (1, 3)}, "m.onnx")
    with pytest.raises(ModelError, match="names nope, which the model does not have"):
        fix_input_shapes(model, {"nope": (1,)}, "m.onnx")
    with pytest.raises(ModelError, match="has fixed dims"):
        fix_input_shapes(model, {"input": (2, 3, 8, 8)}, "m.onnx")


def test_spec_file_sets_shapes_thresholds_and_resolves_paths(tmp_path):
    conv_classifier(tmp_path / "net.onnx")
    spec_file = tmp_path / "net.yaml"
    spec_file.write_text("name: mynet\npath: net.onnx\ninput_shapes: {input: [1, 3, 8, 8]}\n"
                         "thresholds: {min_cosine_similarity: 0.999, max_task_metric_drop: 0.0}\n")
    spec = resolve_model(str(spec_file), {}, None)
    assert spec.name == "mynet" and spec.path == (tmp_path / "net.onnx").resolve()
    assert spec.thresholds.min_cosine_similarity == 0.999
    assert spec.thresholds.min_sqnr_db == 15.0  # default kept


def test_spec_file_errors_name_the_key(tmp_path):
    conv_classifier(tmp_path / "net.onnx")
    spec_file = tmp_path / "net.yaml"
    spec_file.write_text("path: net.onnx\nthresholds: {min_cosine: 0.9}\n")
    with pytest.raises(ConfigError, match=r"net\.yaml: thresholds\.min_cosine: Extra inputs"):
        resolve_model(str(spec_file), {}, None)
    spec_file.write_text("path: other.onnx\n")
    with pytest.raises(ModelError, match="path 'other.onnx' does not exist"):
        resolve_model(str(spec_file), {}, None)
