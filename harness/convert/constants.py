"""Constants that no 8- or 16-bit encoding can hold, replaced by finite values that keep the outputs.

JAX, TensorFlow and PyTorch exports write attention and padding masks as ±inf, float32's extremes
(±3.4e38) or ±1e30 and add or select them into logits. An encoding over such a tensor (or over the
sum) has a scale so large that every ordinary value rounds to zero. Real converters clamp them to
a large finite value relative to the data (e.g. -1e4 for logits of magnitude ~10). Here each such
initializer's huge elements become ±(SCALES[k] × R), R the largest magnitude of the other data
inputs of its consumers on the check inputs (at least 1), with the first k that keeps the model
equivalent; the harness.steps.conversion step checks each replacement.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from harness.convert import copy_model

HUGE = 1e30  # at or above this magnitude (or non-finite) a constant is a mask sentinel
SCALES = (100.0, 1e4)  # replacement magnitude: this times the data range of the consumers
_BOUND_INPUTS = {"Clip": {1, 2}}  # inputs that are bounds, not data: never quantized, left alone


@dataclass(frozen=True)
class HugeConstant:
    """A float initializer holding mask sentinels, and the nodes that read it as data."""

    name: str
    elements: int  # how many elements are non-finite or >= HUGE in magnitude
    values: tuple[float, ...]  # the distinct sentinel values (up to 4)
    consumers: tuple[str, ...]  # node names
    other_inputs: tuple[str, ...]  # the consumers' other data inputs (tensors giving the data range)


def _node_name(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def find_huge_constants(model: onnx.ModelProto) -> list[HugeConstant]:
    """Return the main graph's float initializers with non-finite or |x| >= HUGE elements that some
    node reads as data (Clip bounds excluded)."""
    inits = {i.name: i for i in model.graph.initializer}
    found = []
    for name, init in inits.items():
        if init.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
            continue
        values = onnx.numpy_helper.to_array(init).astype(np.float64)
        huge = ~np.isfinite(values) | (np.abs(values) >= HUGE)
        if not huge.any():
            continue
        consumers, others = [], []
        for index, node in enumerate(model.graph.node):
            bounds = _BOUND_INPUTS.get(node.op_type, set())
            data = [pos for pos, i in enumerate(node.input) if i == name and pos not in bounds]
            if data:
                consumers.append(_node_name(node, index))
                others += [i for pos, i in enumerate(node.input)
                           if i and i != name and i not in inits and pos not in bounds]
        if consumers:
            distinct = tuple(float(v) for v in np.unique(values[huge])[:4])
            found.append(HugeConstant(name, int(huge.sum()), distinct, tuple(consumers), tuple(dict.fromkeys(others))))
    return found


def replace_huge(model: onnx.ModelProto, name: str, magnitude: float) -> onnx.ModelProto:
    """Return a copy of model whose initializer `name` has its huge elements set to ±magnitude
    (the sign kept; NaN is left alone)."""
    copy = copy_model(model)
    for index, init in enumerate(copy.graph.initializer):
        if init.name == name:
            values = onnx.numpy_helper.to_array(init)
            wide = values.astype(np.float64)
            huge = (np.isinf(wide) | (np.abs(wide) >= HUGE)) & ~np.isnan(wide)
            wide[huge] = np.sign(wide[huge]) * magnitude
            copy.graph.initializer[index].CopyFrom(onnx.numpy_helper.from_array(wide.astype(values.dtype), name))
    return copy


def data_range(intermediates: list[dict[str, np.ndarray]], names: tuple[str, ...]) -> float:
    """Return the largest finite magnitude of the named tensors over all feeds (at least 1)."""
    largest = 1.0
    for feed in intermediates:
        for name in names:
            if name in feed:
                values = np.asarray(feed[name], dtype=np.float64)
                finite = values[np.isfinite(values)]
                if finite.size:
                    largest = max(largest, float(np.max(np.abs(finite))))
    return largest
