"""Model loading, --input-shape / --freeze-input parsing and routing, per-position shape fixing and
model spec files."""

import re

import onnx
import pytest

from harness.errors import ConfigError, ModelError
from harness.models import (ModelInputs, fix_input_shapes, load_onnx, parse_freeze_input, parse_input_shape,
                            resolve_model, resolve_models, route_input_options)
from model_builders import conv_classifier, shared_dim_param
from real_models_helpers import real_model_path


def test_parse_input_shape():
    assert parse_input_shape("input=1,3,224,224") == ("input", (1, 3, 224, 224))
    assert parse_input_shape("a=b=1,2") == ("a=b", (1, 2))
    # the selector is kept whole: routing decides whether it is NAME or MODEL:NAME
    assert parse_input_shape("onnx::Flatten_0=1,16,96") == ("onnx::Flatten_0", (1, 16, 96))
    assert parse_input_shape("pnet:input_1=1,12,12,3") == ("pnet:input_1", (1, 12, 12, 3))


@pytest.mark.parametrize("text", ["input", "input=", "=1,2", "input=1,x", "input=0,3"])
def test_parse_input_shape_rejects(text):
    with pytest.raises(ConfigError, match="expected NAME=D0,D1"):
        parse_input_shape(text)


@pytest.mark.parametrize("text, expected", [
    ("sr=16000", ("sr", 16000)),
    ("x.1=0.5", ("x.1", 0.5)),
    ("silero_vad:sr=8000", ("silero_vad:sr", 8000)),
    ("flag=true", ("flag", True)),
    ("h=1,2.5,-3", ("h", [1, 2.5, -3])),
    ("mask=[[1, 0], [0, 1]]", ("mask", [[1, 0], [0, 1]])),
])
def test_parse_freeze_input(text, expected):
    assert parse_freeze_input(text) == expected


@pytest.mark.parametrize("text", ["sr", "sr=", "=1", "sr=abc", "sr=1,,2", "sr=[1, 'a']", "sr=[]", "sr={\"a\": 1}",
                                  "sr=[1, 2"])
def test_parse_freeze_input_rejects(text):
    with pytest.raises(ConfigError, match=r"--freeze-input .*expected NAME=VALUE or MODEL:NAME=VALUE"):
        parse_freeze_input(text)


# Input names as real exports spell them: openwakeword's 'x.1' and 'onnx::Flatten_0', Keras's 'input_1'.
WAKE = [ModelInputs("hey_jarvis", ("x.1",), "models/hey_jarvis.onnx"),
        ModelInputs("alexa", ("onnx::Flatten_0",)),
        ModelInputs("timer", ("onnx::Flatten_0", "state"))]


def test_bare_name_applies_to_every_model_that_has_it():
    routed = route_input_options("--input-shape", [("onnx::Flatten_0", (1, 16, 96)), ("x.1", (1, 16, 96))], WAKE)
    assert routed == {"hey_jarvis": {"x.1": (1, 16, 96)}, "alexa": {"onnx::Flatten_0": (1, 16, 96)},
                      "timer": {"onnx::Flatten_0": (1, 16, 96)}}


def test_model_selector_targets_one_model_and_wins_over_a_bare_name():
    given = [("timer:onnx::Flatten_0", (1, 34, 96)), ("onnx::Flatten_0", (1, 16, 96)),
             ("models/hey_jarvis.onnx:x.1", (1, 8, 96)), ("timer:state", (1,)), ("timer:state", (2,))]
    routed = route_input_options("--input-shape", given, WAKE)
    assert routed == {"hey_jarvis": {"x.1": (1, 8, 96)}, "alexa": {"onnx::Flatten_0": (1, 16, 96)},
                      "timer": {"onnx::Flatten_0": (1, 34, 96), "state": (2,)}}  # the last of equals wins


def test_a_whole_input_name_is_tried_before_a_model_prefix():
    models = [ModelInputs("a", ("b",)), ModelInputs("c", ("a:b",))]
    assert route_input_options("--freeze-input", [("a:b", 1)], models) == {"a": {}, "c": {"a:b": 1}}
    assert route_input_options("--freeze-input", [("c:a:b", 2)], models) == {"a": {}, "c": {"a:b": 2}}


@pytest.mark.parametrize("selector, expected", [
    ("nope", r"--input-shape 'nope=\.\.\.': no model has an input 'nope'\. Inputs per model: hey_jarvis: x\.1; "
             r"alexa: onnx::Flatten_0; timer: onnx::Flatten_0, state\."),
    ("rnet:input_2", r"no model has an input 'rnet:input_2', and 'rnet' names no model "
                     r"\(models: hey_jarvis, alexa, timer\)"),
    ("alexa:x.1", r"model 'alexa' has no input 'x\.1' \(its inputs: onnx::Flatten_0\)"),
    ("alexa:", r"model 'alexa' has no input '' "),
])
def test_selectors_that_match_nothing_are_config_errors(selector, expected):
    with pytest.raises(ConfigError, match=expected):
        route_input_options("--input-shape", [(selector, (1,))], WAKE)


def test_resolve_models_routes_shapes_and_frozen_inputs_on_real_exports():
    pnet, rnet = real_model_path("mtcnn_pnet"), real_model_path("mtcnn_rnet")
    models = resolve_models([str(pnet), str(rnet)],
                            [("input_1", (1, 12, 12, 3)), ("input_2", (1, 24, 24, 3)),
                             (f"{rnet.stem}:input_2", (2, 24, 24, 3))],
                            [("input_1", 0.5)], None)
    assert [(m.name, m.input_shapes, m.freeze_inputs) for m in models] == [
        (pnet.stem, {"input_1": (1, 12, 12, 3)}, {"input_1": 0.5}), (rnet.stem, {"input_2": (2, 24, 24, 3)}, {})]
    with pytest.raises(ConfigError, match=rf"two --model values share the name \['{pnet.stem}'\]"):
        resolve_models([str(pnet), str(pnet)], [], [], None)


def test_spec_file_shapes_and_frozen_inputs_are_overridden_by_the_command_line(tmp_path):
    pnet = real_model_path("mtcnn_pnet")
    spec = tmp_path / "face.yaml"
    spec.write_text(f"name: face\npath: {pnet}\ninput_shapes: {{input_1: [1, 12, 12, 3]}}\n"
                    "freeze_inputs: {input_1: 0.0}\n")
    (model,) = resolve_models([str(spec)], [], [], None)
    assert (model.input_shapes, model.freeze_inputs) == ({"input_1": (1, 12, 12, 3)}, {"input_1": 0.0})
    (model,) = resolve_models([str(spec)], [("face:input_1", (1, 24, 24, 3))], [("input_1", [1.0])], None)
    assert (model.input_shapes, model.freeze_inputs) == ({"input_1": (1, 24, 24, 3)}, {"input_1": [1.0]})
    spec.write_text(f"name: face\npath: {pnet}\nfreeze_inputs: {{sr: 16000}}\n")
    with pytest.raises(ConfigError, match=re.escape(f"model spec {spec} (model 'face'): freeze_inputs names 'sr', "
                                                    "which the model does not have (inputs: input_1)")):
        resolve_models([str(spec)], [], [], None)


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
