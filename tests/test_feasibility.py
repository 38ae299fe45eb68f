"""Feasibility checks what ships: the converted float graph and its 8-bit QDQ form, both placed on
the emulated device's HTP (Qualcomm's HTP simulator); refused nodes named by PTQ and the sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from harness.errors import StepError
from harness.models import ModelSpec
from harness.pipeline import Onboarding, Target
from harness.placement import group_nodes
from harness.qnn_ops import CONTROL_FLOW_OPS, QNN_EP_OPS, outside_qnn_ep
from harness.reasons import summarize
from harness.runner.client import DeviceRunner, HtpRefusedError
from harness.steps import feasibility, ptq
from harness.steps.sweep import evaluate_recipe
from real_models_helpers import real_model_path


@pytest.fixture(scope="module")
def sm8650(devices):
    """The sm8650 emulated device and its SoC."""
    dev = devices.select(["sm8650-emu"])[0]
    return dev, devices.soc(dev.soc)


def onboarding(path: Path, shapes: dict, runner, cache, device) -> Onboarding:
    """An Onboarding of the model file at path (random calibration data) on device."""
    dev, soc = device
    spec = ModelSpec(name=path.stem, source=str(path), path=path, input_shapes=shapes)
    return Onboarding(Target(dev, soc, spec), runner, cache)


def conv_op_conv(path: Path, op: str) -> Path:
    """Conv -> op -> Conv on a [1, 8, 4, 4] input: the op between two quantizable convolutions."""
    w = numpy_helper.from_array(np.random.default_rng(0).uniform(0, 0.2, (8, 8, 1, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1"), helper.make_node(op, ["c"], ["o"], name="op1"),
             helper.make_node("Conv", ["o", "w"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "conv_op_conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def if_with_unknown_op(path: Path) -> Path:
    """An If whose then-branch holds an op of a domain onnxruntime does not know: no session loads it."""
    then = helper.make_graph([helper.make_node("Mystery", ["x"], ["y"], domain="com.example", name="mystery1")],
                             "then", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["y2"], name="relu_else")],
                              "else", [], [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="positive"),
             helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other, name="branch")]
    graph = helper.make_graph(nodes, "refused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


# --- the boundary Q/DQ fact the placement relies on ------------------------------------------------


def test_boundary_qdq_leave_the_htp_only_when_fallback_is_allowed(sm8650_runner, cache, tmp_path):
    """With fallback allowed the Q on the input and the DQ on the output land on the CPU; with it
    disabled the same QDQ model loads, every node on the HTP (onnxruntime-qnn 2.7.0, this machine)."""
    model = conv_op_conv(tmp_path / "relu.onnx", "Relu")
    calib = [{"x": np.random.default_rng(i).uniform(0, 1, (1, 8, 4, 4)).astype(np.float32)} for i in range(2)]
    qdq = ptq.quantize(model, calib, ptq.QuantRecipe(), cache)
    allowed = sm8650_runner.run(qdq, None, "htp", allow_cpu_fallback=True, placement_only=True)
    off = {p.op_type for p in allowed.placement if not p.on_htp}
    assert off == {"QuantizeLinear", "DequantizeLinear"}
    disabled = sm8650_runner.run(qdq, None, "htp", placement_only=True)
    assert disabled.placement and all(p.on_htp for p in disabled.placement)


# --- feasibility of both forms ---------------------------------------------------------------------


def test_real_model_runs_wholly_on_the_htp_in_both_forms(sm8650_runner, cache, sm8650):
    """MTCNN P-Net: every node on the HTP as a float graph and as its 8-bit QDQ form."""
    onb = onboarding(real_model_path("mtcnn_pnet"), {"input_1": (1, 64, 64, 3)}, sm8650_runner, cache, sm8650)
    report = onb.feasibility()
    kpis = report.kpis
    assert report.passed, report.problems()
    assert report.status == "passed"  # not marginal: htp_fraction 1 against >= 1 is the best value there is
    assert kpis["form_checked"] == "quantized"
    assert kpis["htp_fraction_float"] == kpis["htp_fraction_quantized"] == kpis["htp_fraction"] == 1.0
    assert kpis["nodes_on_htp_float"] == kpis["nodes_on_htp_quantized"] == 10
    assert kpis["unsupported_ops"] == kpis["unsupported_ops_float"] == kpis["unsupported_ops_quantized"] == []
    assert kpis["boundary_qdq_on_cpu"] >= 2  # the input's Q and the outputs' DQ: not counted, and confirmed
    assert kpis["boundary_qdq_confirmed_on_htp"] is True and not any("Q/DQ" in n for n in report.notes)
    assert [row["form"] for row in report.tables["placement_by_form"]] == ["float", "quantized"]
    # what was placed is what ships: the converted model and the QDQ model PTQ runs (same cache entry)
    assert onb.qdq_model() == ptq.quantize(onb.converted_model(), onb.calibration(), onb.recipe, cache)


def test_silero_vad_without_frozen_sr_fails_naming_its_if(sm8650_runner, cache, sm8650):
    """Silero VAD branches on its `sr` input (LSTMs inside): unfrozen, the If stays on the CPU."""
    onb = onboarding(real_model_path("silero_vad"), {"input": (1, 640), "h": (2, 1, 64), "c": (2, 1, 64)},
                     sm8650_runner, cache, sm8650)
    report = onb.feasibility()
    assert not report.passed
    assert report.kpis["unsupported_ops"] == ["If"] and report.kpis["unsupported_nodes"] == ["If_25"]
    assert report.kpis["unsupported_ops_float"] == report.kpis["unsupported_ops_quantized"] == ["If"]
    assert report.problems()[0].startswith("1 node(s) cannot run on the Snapdragon 8 Gen 3 HTP (v75): If_25 (If)")
    control = next(f for f in report.failures if "control flow" in f)
    assert "If_25 holds" in control and "LSTM" in control and "--freeze-input" in control
    # one headline (what failed, the value, the rule) under 200 characters over the details
    message = summarize("feasibility did not pass", report.problems())
    head, details = message.splitlines()[0], message.splitlines()[1:]
    assert len(head) < 200 and head.startswith("feasibility did not pass: 1 node(s) cannot run on the Snapdragon 8 "
                                               "Gen 3 HTP (v75): If_25 (If) (checked on the 8-bit QDQ form")
    assert head.endswith("(+2 more)") and details[-1] == "  - FAIL: htp_fraction = 0.5, rule htp_fraction >= 1"


def test_silero_vad_node_list_is_grouped_by_op_type_and_nesting():
    """Without a session, silero_vad's nodes outside the QNN EP's set, 27 of them down nested If branches, read
    as three groups, not 27 subgraph paths."""
    outside = outside_qnn_ep(onnx.load(str(real_model_path("silero_vad"))))
    assert len(outside) == 27
    placement = feasibility.FormPlacement("quantized", session_error="no session", outside=outside)
    assert placement.describe() == ("9 If nodes, nested up to 1 deep, under If_25; 14 Shape nodes, nested up to 2 "
                                    "deep, under If_25; 4 ConstantOfShape nodes, nested up to 2 deep, under If_25")
    few = [n for n in outside if n.op_type == "ConstantOfShape"]  # a few are still named one by one
    assert group_nodes(few) == "; ".join(f"{n.node} (ConstantOfShape) in {n.graph}" for n in few)


@pytest.fixture(scope="module")
def qcs6490(devices, tmp_path_factory):
    """A DeviceRunner on the emulated qcs6490 (HTP v68, no FP16) and the device and SoC."""
    from harness.transports import open_transport

    dev = devices.select(["qcs6490-emu"])[0]
    soc = devices.soc(dev.soc)
    transport = open_transport(dev, soc, tmp_path_factory.mktemp("emulator-qcs6490"))
    yield DeviceRunner(transport), (dev, soc)
    transport.close()


def test_hey_jarvis_fails_on_htp_v68_naming_its_if_first(qcs6490, cache):
    """On HTP v68 the QNN EP leaves hey_jarvis's If, and with it every node, to the CPU."""
    runner, device = qcs6490
    onb = onboarding(real_model_path("hey_jarvis"), {"x.1": (1, 16, 96)}, runner, cache, device)
    report = onb.feasibility()
    assert not report.passed and report.kpis["form_checked"] == "quantized"
    assert "If" in report.kpis["unsupported_ops"] and report.kpis["unsupported_nodes"][0] == "If_32"
    assert report.problems()[0].startswith(f"{len(report.kpis['unsupported_nodes'])} node(s) cannot run on the "
                                           "QCS6490 (RB3 Gen 2) HTP (v68): If_32 (If);")


def test_hey_jarvis_if_runs_on_htp_v75_as_onnxruntime_does(sm8650_runner, cache, sm8650):
    """Observed with onnxruntime-qnn 2.7.0: once conversion has folded its constants, the QNN EP takes
    hey_jarvis's If (its condition depends on the input) onto the v75 HTP, and both branches give
    onnxruntime's CPU outputs; feasibility therefore passes it, in both forms."""
    import onnxruntime as ort

    onb = onboarding(real_model_path("hey_jarvis"), {"x.1": (1, 16, 96)}, sm8650_runner, cache, sm8650)
    report = onb.feasibility()
    placed = {r["node"]: r["placement"] for r in report.tables["op_placement"]}
    assert placed["If_32"] == "HTP" and report.passed, report.problems()
    assert report.kpis["htp_fraction_float"] == report.kpis["htp_fraction_quantized"] == 1.0
    model = onnx.load(str(onb.converted_model()))
    score = onnx.helper.make_tensor_value_info("p1.1", TensorProto.FLOAT, [1, 1])  # what the If's condition tests
    model.graph.output.append(score)
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds, branches = [], set()
    for scale in np.geomspace(0.1, 20, 60):
        feed = {"x.1": (rng.standard_normal((1, 16, 96)) * scale).astype(np.float32)}
        branch = cpu.run(["p1.1"], feed)[0].item() >= 0.5  # the If's condition: then-branch when >= 0.5
        if branch not in branches:
            feeds.append(feed)
            branches.add(branch)
    assert branches == {True, False}
    htp = sm8650_runner.run(onb.converted_model(), feeds, "htp")
    for feed, out in zip(feeds, htp.outputs):
        np.testing.assert_allclose(out["53"], cpu.run(["53"], feed)[0], atol=0.01)


def test_forms_differ_float_refused_quantized_runs(sm8650_runner, cache, sm8650, tmp_path):
    """Asin: the HTP takes its 8-bit form but not its FP16 one; the quantized form ships, so the step
    passes and says the float graph would not run wholly on the HTP."""
    onb = onboarding(conv_op_conv(tmp_path / "asin.onnx", "Asin"), {}, sm8650_runner, cache, sm8650)
    report = onb.feasibility()
    assert report.passed, report.problems()
    assert report.kpis["unsupported_ops_float"] == ["Asin"] and report.kpis["htp_fraction_float"] < 1.0
    assert report.kpis["unsupported_ops_quantized"] == [] and report.kpis["htp_fraction_quantized"] == 1.0
    assert any("float graph would not run wholly" in n and "op1 (Asin)" in n for n in report.notes)
    assert {r["node"]: r["placement"] for r in report.tables["op_placement_float"]}["op1"] == "CPU"


def test_erf_is_refused_in_both_forms_with_its_qdq_neighbours_counted(sm8650_runner, cache, sm8650, tmp_path):
    onb = onboarding(conv_op_conv(tmp_path / "erf.onnx", "Erf"), {}, sm8650_runner, cache, sm8650)
    report = onb.feasibility()
    assert report.kpis["unsupported_ops"] == ["Erf"] and report.kpis["unsupported_nodes"] == ["op1"]
    assert report.kpis["qdq_nodes_beside_cpu_nodes"] == 2
    assert "op1 (Erf)" in report.problems()[0]


# --- no session at all: op types named from the graph and its subgraphs ------------------------------


def test_refused_session_names_ops_outside_the_qnn_set_from_subgraphs(sm8650_runner, cache, sm8650, tmp_path):
    onb = onboarding(if_with_unknown_op(tmp_path / "refused.onnx"), {}, sm8650_runner, cache, sm8650)
    report = onb.feasibility()
    assert not report.passed
    assert report.kpis["unsupported_ops"] == ["If", "com.example:Mystery"]
    assert report.kpis["unsupported_nodes"] == ["branch", "mystery1"]
    assert "is not a registered function/op" in report.kpis["session_error_float"]
    first = report.problems()[0]
    assert first.startswith("onnxruntime could not build a session for the float graph")
    assert "mystery1 (com.example:Mystery) in branch/then_branch" in first and "branch (If)" in first
    assert any("no 8-bit QDQ form could be built" in n for n in report.notes)  # the quantizer cannot load it either
    assert any(n.startswith("conversion failed (") and "checked on the shape-fixed model" in n for n in report.notes)


def test_static_set_names_silero_vad_control_flow_and_its_bodies():
    """Without a session, silero_vad (sr not frozen) is named by its If and the ops in its branches."""
    model = onnx.load(str(real_model_path("silero_vad")))
    outside = outside_qnn_ep(model)
    top = [n for n in outside if not n.graph]
    assert [(n.node, n.op_type) for n in top] == [("If_25", "If")]
    inner_ops = {n.op_type for n in outside if n.graph}
    assert {"If", "Shape"} <= inner_ops and "LSTM" not in inner_ops and "Conv" not in inner_ops
    assert all(n.graph.startswith("If_25/") for n in outside if n.graph)


@pytest.mark.parametrize("op, in_set", [("Relu", True), ("Erf", False), ("Softsign", False)])
def test_static_set_agrees_with_the_installed_qnn_ep(sm8650_runner, tmp_path, op, in_set):
    """The QNN EP's op list agrees with the device's real placement for these ops."""
    model = conv_op_conv(tmp_path / f"{op}.onnx", op)
    placed = sm8650_runner.run(model, None, "htp", allow_cpu_fallback=True, placement_only=True)
    assert {p.node: p.on_htp for p in placed.placement}["op1"] is in_set
    assert (op in QNN_EP_OPS) is in_set and not CONTROL_FLOW_OPS & QNN_EP_OPS


# --- PTQ and the sweep name the node the HTP refuses --------------------------------------------------


def test_ptq_and_sweep_name_the_node_the_htp_refuses(sm8650_runner, cache, sm8650, tmp_path):
    onb = onboarding(conv_op_conv(tmp_path / "erf.onnx", "Erf"), {}, sm8650_runner, cache, sm8650)
    with pytest.raises(StepError, match=r"1 node\(s\) cannot run on the Snapdragon 8 Gen 3 \(v75\) HTP: op1 \(Erf\) "
                                        r"\(op types: Erf\), with 2 Q/DQ node\(s\) beside them; "
                                        r"CPU fallback is disabled"):
        onb.ptq()
    with pytest.raises(HtpRefusedError) as refused:
        sm8650_runner.run(onb.qdq_model(), onb.dataset().evaluation[:1], "htp")
    assert [(p.node, p.op_type) for p in refused.value.nodes if p.op_type == "Erf"] == [("op1", "Erf")]
    candidate = evaluate_recipe(ptq.QuantRecipe(per_channel=True), onb.converted_model(), onb.dataset(),
                                onb.float_reference(), sm8650_runner, onb.thresholds, cache)
    assert candidate.error and "op1 (Erf)" in candidate.error.splitlines()[0]
    assert candidate.error.startswith("MinMax-a8-w8-pc: ")


def test_needs_quantized_placement_follows_fp16():
    from harness.devices import load_devices_file
    from conftest import REPO

    socs = load_devices_file(REPO / "devices.yaml")
    assert feasibility.needs_quantized_placement(socs.soc("qcs6490"))
    assert not feasibility.needs_quantized_placement(socs.soc("sm8650"))
