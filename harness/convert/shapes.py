"""Static shapes: which dims are dynamic, and shape inference that re-infers inside subgraphs too."""

from __future__ import annotations

from typing import Iterator

import onnx

from harness.convert import copy_model


def is_dynamic(dim: "onnx.TensorShapeProto.Dimension") -> bool:
    """True when a dim is not a fixed size: a dim_param, no value, or a value <= 0 (Paddle writes -1)."""
    return not dim.HasField("dim_value") or dim.dim_value <= 0


def dims_text(dims) -> list[int | str]:
    """Return dims as the user reads them: sizes, dim_params, or '?' for an unset dim."""
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]


def subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """Yield every subgraph (If/Loop/Scan bodies), depth first, nested ones too."""
    for node in graph.node:
        for attr in node.attribute:
            inner = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for g in inner:
                yield g
                yield from subgraphs(g)


def count_nodes(model: onnx.ModelProto) -> int:
    """Return the number of nodes in the graph and all its subgraphs."""
    return len(model.graph.node) + sum(len(g.node) for g in subgraphs(model.graph))


def _clear_shape(value: onnx.ValueInfoProto) -> None:
    if value.type.HasField("tensor_type"):
        value.type.tensor_type.ClearField("shape")


def strip_shape_info(model: onnx.ModelProto) -> None:
    """Remove every inferred shape that may be stale, in place: value_info of the graph and of every
    subgraph, the shapes of subgraph inputs and outputs, and the dynamic dims of graph outputs."""
    del model.graph.value_info[:]
    for out in model.graph.output:
        for d in out.type.tensor_type.shape.dim:
            if is_dynamic(d):
                d.Clear()
    for g in subgraphs(model.graph):
        del g.value_info[:]
        for value in [*g.input, *g.output]:
            _clear_shape(value)


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return model with stale shape information removed (subgraphs included) and shapes re-inferred
    (strict, with data propagation so that shape subgraphs resolve); raises onnx's error."""
    clean = copy_model(model)
    strip_shape_info(clean)
    return onnx.shape_inference.infer_shapes(clean, strict_mode=True, data_prop=True)
