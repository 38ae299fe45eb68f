"""Models that arrive quantized: recognised, their encodings read and checked for the HTP, used as they are
(never quantized twice), their float model built exactly; QOperator models rewritten to QDQ where exact, run-time
quantization named; every QDQ model the harness generates checked valid (harness.quantization.prequantized).

The quantized models here are onnxruntime's quantizer applied to small graphs (QDQ and QOperator formats, dynamic
quantization); the real export of the corpus is tests/test_real_models.py's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from harness.errors import ModelError, StepError
from harness.models import ModelSpec
from harness.pipeline import Onboarding, Target
from harness.quantization.prequantized import analyse, check_generated, float_form, htp_problems, read_encodings, to_qdq
from harness.steps import ptq


def cnn(path: Path) -> Path:
    """Conv-Relu-MaxPool-Conv-Add-Sigmoid-GlobalAveragePool-Flatten-Gemm on a [1, 3, 16, 16] input."""
    rng = np.random.default_rng(0)

    def w(name, shape, s=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Add", ["c2", "p1"], ["a2"], name="add2"),
             helper.make_node("Sigmoid", ["a2"], ["s2"], name="sig2"),
             helper.make_node("GlobalAveragePool", ["s2"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1, name="fc")]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                              [w("w1", (8, 3, 3, 3)), w("b1", (8,), 0.1), w("w2", (8, 8, 3, 3), 0.1),
                               w("b2", (8,), 0.1),
                               w("fc_w", (10, 8)), w("fc_b", (10,), 0.1)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def feeds(n: int = 8) -> list[dict]:
    return [{"input": np.random.default_rng(i).random((1, 3, 16, 16), dtype=np.float32)} for i in range(n)]


def quantized(path: Path, fmt: str, tmp: Path, **options) -> Path:
    """path quantized by onnxruntime's quantize_static (int8 per-channel weights, uint8 activations) in fmt."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds())

        def get_next(self):
            return next(self.it, None)

    out = tmp / f"{path.stem}_{fmt.lower()}.onnx"
    quantize_static(str(path), str(out), Reader(), quant_format=QuantFormat[fmt],
                    **{"per_channel": True, "weight_type": QuantType.QInt8, "activation_type": QuantType.QUInt8,
                       **options})
    return out


def outputs(model, feed: dict) -> np.ndarray:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feed)[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("prequantized")
    source = cnn(tmp / "cnn.onnx")
    return {"float": source, "QDQ": quantized(source, "QDQ", tmp), "QOperator": quantized(source, "QOperator", tmp)}


def test_qdq_model_is_recognised_and_its_encodings_read(models, cache):
    own = analyse(models["QDQ"], models["QDQ"], cache, "cnn")
    assert own.form == "QDQ" and own.problems == () and own.rewritten == ()
    by_tensor = {e.tensor: e for e in own.encodings}
    w1 = by_tensor["w1_quantized"]
    assert (w1.kind, w1.dtype, w1.bits, w1.axis, w1.channels, w1.symmetric) == ("weight", "int8", 8, 0, 8, True)
    assert w1.consumer == "Conv conv1"
    assert by_tensor["fc_w_quantized"].axis == 0 and by_tensor["fc_w_quantized"].consumer == "Gemm fc"  # transB=1
    assert by_tensor["b1_quantized"].kind == "bias" and by_tensor["b1_quantized"].bits == 32
    acts = [e for e in own.encodings if e.kind == "activation"]
    assert {e.tensor for e in acts} >= {"input", "r1", "p1", "c2", "a2", "s2"} and {e.dtype for e in acts} == {"uint8"}
    kpis = own.kpis()
    assert kpis["quantization_form"] == "QDQ" and kpis["encodings_by_kind"]["weight"] == {"int8": 3}
    assert kpis["per_channel_weights"] == 3 and kpis["encoding_problems"] == []


def test_float_model_dequantizes_constants_exactly_and_drops_every_qdq_pair(models):
    qdq = onnx.load(str(models["QDQ"]))
    floats = float_form(qdq)
    assert not [n for n in floats.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    # each dequantized constant equals what onnxruntime's DequantizeLinear computes from the quantized one
    weights = {n.output[0]: n for n in qdq.graph.node if n.op_type == "DequantizeLinear"
               and n.input[0] in {i.name for i in qdq.graph.initializer}}
    probe = onnx.ModelProto.FromString(qdq.SerializeToString())
    probe.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in weights)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds(1)[0])))
    inits = {i.name: numpy_helper.to_array(i) for i in floats.graph.initializer}
    for name in weights:
        np.testing.assert_array_equal(inits[name], got[name])
    # the float model is the source up to the weights' rounding, and the QDQ model is it quantized
    x = feeds(1)[0]
    assert np.abs(outputs(floats, x) - outputs(models["float"], x)).max() < 0.05


def test_qoperator_model_is_rewritten_to_qdq_with_identical_outputs(models, cache):
    own = analyse(models["QOperator"], models["QOperator"], cache, "cnn")
    assert own.form == "QOperator, rewritten to QDQ" and own.problems == ()
    assert {r.split()[0] for r in own.rewritten} == {"QLinearConv", "QLinearAdd", "QLinearSigmoid",
                                                     "QLinearGlobalAveragePool", "QGemm"}
    rewritten = onnx.load(str(own.model))
    assert not [n for n in rewritten.graph.node if n.op_type.startswith("QLinear") or n.op_type == "QGemm"]
    check_generated(own.model, "test")
    for x in feeds(4):
        np.testing.assert_array_equal(outputs(own.model, x), outputs(models["QOperator"], x))
        # and it is the same quantization as onnxruntime's QDQ format of the same model and data
        np.testing.assert_allclose(outputs(own.model, x), outputs(models["QDQ"], x), atol=1e-6)


def test_run_time_quantization_is_named_with_what_to_do(models, tmp_path, devices, sm8650_runner, cache):
    from onnxruntime.quantization import quantize_dynamic

    # a MatMul model: quantize_dynamic writes DynamicQuantizeLinear + MatMulInteger
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w])
    source = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    quantize_dynamic(str(source), str(tmp_path / "mm_dynamic.onnx"))
    with pytest.raises(ModelError) as e:
        to_qdq(onnx.load(str(tmp_path / "mm_dynamic.onnx")), "model 'mm'")
    message = str(e.value)
    assert "model 'mm' is quantized at run time" in message and "DynamicQuantizeLinear" in message
    assert "MatMulInteger" in message and "Onboard the float model" in message
    # feasibility fails naming the nodes and op types; conversion cannot start from a float model
    dev = devices.select(["sm8650-emu"])[0]
    path = tmp_path / "mm_dynamic.onnx"
    spec = ModelSpec(name="mm", source=str(path), path=path, input_shapes={"x": (4, 16)})
    onb = Onboarding(Target(dev, devices.soc(dev.soc), spec), sm8650_runner, cache)
    report = onb.feasibility()
    assert not report.passed and report.kpis["unsupported_ops"] == ["DynamicQuantizeLinear", "MatMulInteger"]
    with pytest.raises(ModelError, match="quantized at run time"):
        onb.conversion()


def _edited(path: Path, tmp: Path, edit) -> onnx.ModelProto:
    model = onnx.load(str(path))
    edit(model, {i.name: i for i in model.graph.initializer})
    return model


def test_bad_encodings_name_the_tensor_and_the_rule(models, tmp_path):
    def asymmetric(model, inits):  # int8 weight with a zero point of 3 on every channel
        zp = inits["w1_zero_point"]
        zp.CopyFrom(numpy_helper.from_array(np.full(numpy_helper.to_array(zp).shape, 3, np.int8), zp.name))

    problems = htp_problems(read_encodings(_edited(models["QDQ"], tmp_path, asymmetric)))
    assert len(problems) == 1 and "weight 'w1_quantized'" in problems[0] and "Conv conv1" in problems[0]
    assert "only symmetric (zero point 0)" in problems[0]

    def four_bit_activation(model, inits):  # an activation quantized to uint4
        zp = inits["r1_zero_point"]
        zp.CopyFrom(numpy_helper.from_array(np.array(0, dtype=np.uint8), zp.name))
        zp.data_type = TensorProto.UINT4

    problems = htp_problems(read_encodings(_edited(models["QDQ"], tmp_path, four_bit_activation)))
    assert "activation 'r1' (uint4 per tensor)" in problems[0]  # and p1, which MaxPool ties to it
    assert all("8 or 16 bits, not uint4" in p for p in problems)

    def wrong_axis(model, inits):  # per-channel along the input channels of conv2 (8 x 8 weight: both fit)
        next(n for n in model.graph.node if n.name == "w2_DequantizeLinear").attribute[0].i = 1

    problems = htp_problems(read_encodings(_edited(models["QDQ"], tmp_path, wrong_axis)))
    assert problems == ["weight 'w2_quantized' (int8 per channel (axis 1, 8 channels) symmetric, feeding Conv conv2): "
                        "quantized per channel on axis 1, but Conv conv2 has its output channels on axis 0: the HTP "
                        "quantizes weights per output channel"]


def test_generated_qdq_model_is_checked_naming_the_node(models, tmp_path):
    model = onnx.load(str(models["QDQ"]))
    model.graph.node[-2].name = model.graph.node[-1].name  # two nodes of one name, as onnxruntime refuses
    onnx.save(model, str(tmp_path / "twice.onnx"))
    with pytest.raises(StepError, match="two nodes are named 'logits_DequantizeLinear'.*bug in the harness"):
        check_generated(tmp_path / "twice.onnx", "a test")
    model = onnx.load(str(models["QDQ"]))
    # a Transpose of a rank-4 permutation on the rank-2 Flatten output, as the tf2onnx-style 1-D convolutions got
    index = next(i for i, n in enumerate(model.graph.node) if n.name == "flatten")
    model.graph.node.insert(index + 1, helper.make_node("Transpose", ["f"], ["f_t"], perm=[0, 2, 3, 1],
                                                        name="transpose_bad"))
    for n in model.graph.node[index + 2:]:
        n.input[:] = ["f_t" if i == "f" else i for i in n.input]
    onnx.save(model, str(tmp_path / "perm.onnx"))
    with pytest.raises(StepError, match="(?s)invalid QDQ model.*transpose_bad.*bug in the harness"):
        check_generated(tmp_path / "perm.onnx", "a test")


def test_quantize_never_quantizes_twice(models, cache):
    with pytest.raises(StepError, match="quantized already.*quantizes nothing twice"):
        ptq.quantize(models["QDQ"], feeds(2), ptq.QuantRecipe(), cache)


def onboarding(path: Path, devices, runner, cache) -> Onboarding:
    dev = devices.select(["sm8650-emu"])[0]
    spec = ModelSpec(name=path.stem, source=str(path), path=path, input_shapes={"input": (1, 3, 16, 16)})
    return Onboarding(Target(dev, devices.soc(dev.soc), spec), runner, cache)


def test_quantized_model_is_placed_and_evaluated_as_it_is(models, devices, sm8650_runner, cache):
    onb = onboarding(models["QDQ"], devices, sm8650_runner, cache)
    feasibility = onb.feasibility()
    assert feasibility.passed and feasibility.kpis["quantization_form"] == "QDQ"
    assert feasibility.kpis["htp_fraction"] == 1.0 and feasibility.tables["encodings"]
    assert feasibility.tables["placement_by_form"][-1]["checked_on"] == "model's own QDQ form, as given"
    assert onb.qdq_model() == onb.own_quantization().model  # nothing quantized again
    assert "arrives quantized" in onb.conversion().notes[0]
    report = onb.ptq()
    assert report.kpis["recipe"] == "the model's own encodings (QDQ)" and report.kpis["cosine_similarity"] > 0.99


def test_bad_encodings_fail_feasibility_and_ptq_naming_the_tensor(models, devices, sm8650_runner, cache, tmp_path):
    def asymmetric(model, inits):
        zp = inits["w2_zero_point"]
        zp.CopyFrom(numpy_helper.from_array(np.full(numpy_helper.to_array(zp).shape, 5, np.int8), zp.name))

    path = tmp_path / "asymmetric.onnx"
    onnx.save(_edited(models["QDQ"], tmp_path, asymmetric), str(path))
    onb = onboarding(path, devices, sm8650_runner, cache)
    feasibility = onb.feasibility()
    assert any("weight 'w2_quantized'" in f and "only symmetric" in f for f in feasibility.failures)
    # the QNN EP cannot run it ('was not selected by that EP'): PTQ says which encoding first
    with pytest.raises(StepError, match="(?s)weight 'w2_quantized'.*only symmetric.*the HTP run failed"):
        onb.ptq()


def test_a_real_graph_quantized_by_onnxruntime_is_taken_as_it_is(devices, sm8650_runner, cache, tmp_path):
    """mtcnn_onet (a real Caffe-era export, NHWC, PReLU) quantized by onnxruntime's QNN config at 16-bit activations:
    not a real quantized export, but a real graph; given back to the harness, its encodings are its own."""
    from real_models_helpers import real_model_path

    shapes = {"input_3": (1, 48, 48, 3)}
    dev = devices.select(["sm8650-emu"])[0]
    source = real_model_path("mtcnn_onet")
    spec = ModelSpec(name="mtcnn_onet", source=str(source), path=source, input_shapes=shapes)
    float_onb = Onboarding(Target(dev, devices.soc(dev.soc), spec), sm8650_runner, cache)
    recipe = ptq.QuantRecipe(activation_type="QUInt16", per_channel=True, weight_type="QInt8")
    given = tmp_path / "onet_a16.onnx"
    quantized_by_ort = ptq.quantize(float_onb.converted_model(), float_onb.calibration()[:4], recipe, cache)
    given.write_bytes(quantized_by_ort.read_bytes())
    spec = ModelSpec(name="onet_a16", source=str(given), path=given, input_shapes=shapes)
    onb = Onboarding(Target(dev, devices.soc(dev.soc), spec), sm8650_runner, cache)
    feasibility = onb.feasibility()
    assert feasibility.passed, feasibility.failures
    assert feasibility.kpis["encodings_by_kind"]["activation"] == {"uint16": feasibility.kpis["encodings_by_kind"]
                                                                   ["activation"]["uint16"]}
    assert feasibility.kpis["per_channel_weights"] > 0 and feasibility.kpis["encoding_problems"] == []
    report = onb.ptq()
    assert report.kpis["recipe"] == "the model's own encodings (QDQ)" and report.kpis["cosine_similarity"] > 0.99
