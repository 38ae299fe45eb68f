"""Small ONNX models built with onnx.helper for the harness's own tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def conv_classifier(path: Path, channels: int = 4, size: int = 8, batch: int | str = 1, seed: int = 0) -> Path:
    """A Conv-Relu-Flatten-Gemm classifier with 10 outputs; input 'input' [batch, 3, size, size]."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array((rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(channels, np.float32), "b")
    fc = numpy_helper.from_array((rng.standard_normal((10, channels * size * size)) * 0.1).astype(np.float32), "fc_w")
    fcb = numpy_helper.from_array(np.zeros(10, np.float32), "fc_b")
    nodes = [helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1, name="fc")]
    graph = helper.make_graph(nodes, "conv_classifier",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, size, size])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])],
                              [w, b, fc, fcb])
    return _save(graph, path)


def with_unsupported_op(path: Path) -> Path:
    """Relu -> Det -> Relu: Det has no QNN HTP implementation."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu1"),
             helper.make_node("Det", ["r"], ["d"], name="det1"),
             helper.make_node("Relu", ["d"], ["y"], name="relu2")]
    graph = helper.make_graph(nodes, "unsupported",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return _save(graph, path)


def shared_dim_param(path: Path) -> Path:
    """Two inputs whose dynamic dims all share the dim_param '?', as real exports do."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "x2"], ["y"], name="add")]
    dims = ["?", 3, "?", "?"]
    graph = helper.make_graph(nodes, "dynamic",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims),
                               helper.make_tensor_value_info("x2", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    return _save(graph, path)
