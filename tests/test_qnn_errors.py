"""QNN finalization failures explained for the model that met them (issue 22 item 4): a real
QNN_COMMON_ERROR_MEM_ALLOC on the HTP simulator names the model's largest tensor against the SoC's VTCM and
what to try, with onnxruntime's text as a detail line only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from harness.models import Thresholds
from harness.qnn_errors import explain, is_finalize_failure
from harness.runner.client import QnnFinalizeError
from harness.steps.feasibility import check_feasibility

ORT_MEM_ALLOC = ("[ONNXRuntimeError] : 11 : EP_FAIL : Failed to finalize QNN graph. Error: QNN_COMMON_ERROR_MEM_ALLOC: "
                 "Memory allocation related error., Code: 1002")


def long_softmax(path: Path, length: int) -> Path:
    """x [1, length] * 2 -> Softmax over the whole length: an op the HTP cannot tile, holding its tensor in VTCM."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["logits"], name="scale"),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="long_softmax")]
    graph = helper.make_graph(nodes, "long_softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, length])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, length])],
                              [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def test_a_softmax_filling_the_vtcm_fails_finalization_and_names_the_tensor_and_what_to_try(tmp_path, sm8650_runner):
    path = long_softmax(tmp_path / "long_softmax.onnx", 4 * 1024 * 1024)  # 8 MiB in float16: the whole VTCM
    with pytest.raises(QnnFinalizeError) as raised:
        sm8650_runner.run(path, None, "htp", placement_only=True)
    message = raised.value.summary
    lines = message.splitlines()
    assert "could not finalize (prepare) the graph of long_softmax.onnx for Snapdragon 8 Gen 3 (v75): " \
           "QNN_COMMON_ERROR_MEM_ALLOC (1002)" in lines[0]
    assert "largest activations: 'probs' (Softmax 'long_softmax') 8.0 MiB, 'logits' (Mul 'scale') 8.0 MiB" in message
    assert "8 MiB VTCM (device catalog), which 'probs' fills 100% of alone" in message
    assert "smaller input shapes (`input_shapes:` in the model spec)" in message
    assert "split Softmax 'long_softmax' along its long axis" in message
    assert lines[-1].startswith("onnxruntime said: ") and "QNN_COMMON_ERROR_MEM_ALLOC" in lines[-1]
    assert not any("QNN_COMMON_ERROR_MEM_ALLOC" in line for line in lines[1:-1])  # explained, not repeated

    soc = sm8650_runner.transport.soc
    report = check_feasibility(path, soc, sm8650_runner, Thresholds())
    assert not report.passed
    failure = report.failures[0]
    assert failure.startswith("the float graph (FP16 on the HTP) cannot be prepared for the Snapdragon 8 Gen 3 HTP (v75): the "
                              "QNN HTP backend could not finalize")
    assert "outside the QNN EP's set" not in failure and "'probs'" in failure


def test_a_refused_parameter_names_the_node_qnn_logged(tmp_path):
    from harness.devices import load_catalog

    path = long_softmax(tmp_path / "small.onnx", 64)
    soc = load_catalog().socs["sm8650"]
    log = '<E> "long_softmax" generated: could not create op\n<E> RouterX86 graph prepare failed 12'
    text = "Failed to finalize QNN graph. Error: QNN_COMMON_ERROR_INVALID_ARGUMENT, Code: 1004"
    message = explain(path, soc, text, log)
    assert "QNN_COMMON_ERROR_INVALID_ARGUMENT (1004)" in message
    assert "QNN names node 'long_softmax' (Softmax)" in message
    assert "the backend refused a parameter of node 'long_softmax'" in message
    assert "smaller input shapes" not in message  # 128 bytes: memory is not the cause
    assert explain(path, soc, "fallback to CPU EP has been explicitly disabled") is None
    assert is_finalize_failure(ORT_MEM_ALLOC)
