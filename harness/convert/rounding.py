"""The rounding envelope of a graph: the source model with every reduction's terms perturbed by the most
that floating-point summation in any order may perturb them.

Why (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 3.1): a sum of K products
computed in floating point, in any order, equals the exact sum with each term multiplied by (1 + t_i),
|t_i| <= gamma_K = K u / (1 - K u), u being the format's unit roundoff (2^-24 for float32). A folding library
(onnxslim, onnxsim) or a rewrite that re-associates a Conv, MatMul, Gemm, reduction or softmax therefore
moves the outputs by no more than such perturbations can; a change of function moves them by more. The
envelope model applies one such perturbation (random signs, magnitude gamma_K of each node's own K) to the
weights (or first input) of every reducing node, so running it on the check inputs measures how far float
re-association can move THIS graph's outputs: a softmax over large logits is far more sensitive than the
logits are, and a fixed tolerance relative to the output cannot know that (issue 22: a converted ResNet's
softmax moved by 0.00245, 2.7e-3 of its scale, by onnxslim's folding alone).

A graph that computes in float16 or bfloat16 somewhere (a Cast to it, a tensor of it) rounds at that
format's unit roundoff, so u is the coarsest float format the graph holds.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from harness.convert import copy_model

UNIT_ROUNDOFF = {TensorProto.FLOAT: 2.0 ** -24, TensorProto.DOUBLE: 2.0 ** -53,
                 TensorProto.FLOAT16: 2.0 ** -11, TensorProto.BFLOAT16: 2.0 ** -8}
MAX_GAMMA = 0.5  # gamma_K past this means the format cannot sum K terms meaningfully; capped
_REDUCE = {"ReduceSum", "ReduceMean", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
           "ReduceLogSumExp", "GlobalAveragePool", "GlobalLpPool"}
_LAST_AXES = {"Softmax": -1, "LogSoftmax": -1, "LayerNormalization": -1}


def unit_roundoff(model: onnx.ModelProto) -> float:
    """Return the unit roundoff of the coarsest float format the graph computes in (float32's 2^-24 when
    it holds only float32)."""
    g = model.graph
    types = {v.type.tensor_type.elem_type for v in [*g.input, *g.output, *g.value_info]}
    types |= {t.data_type for t in g.initializer}
    types |= {a.i for n in g.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"}
    return max([UNIT_ROUNDOFF[t] for t in types if t in UNIT_ROUNDOFF] or [UNIT_ROUNDOFF[TensorProto.FLOAT]])


def gamma(k: int, u: float) -> float:
    """Return Higham's gamma_k = k u / (1 - k u): the relative perturbation of each term that summing k
    terms in floating point may cause, capped at MAX_GAMMA."""
    ku = k * u
    return MAX_GAMMA if ku >= MAX_GAMMA / (1 + MAX_GAMMA) else ku / (1 - ku)


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _reduction(node: onnx.NodeProto, shapes: dict[str, list[int]]) -> tuple[int, int] | None:
    """Return (index of the input to perturb, number of terms each output sums), or None when the node
    sums nothing (elementwise) or its shapes are unknown."""
    op, ins = node.op_type, list(node.input)
    s = [shapes.get(x) for x in ins]
    if op in ("Conv", "ConvTranspose") and len(ins) > 1 and s[1]:
        w = s[1]
        k = math.prod(w[1:]) if op == "Conv" else w[0] * math.prod(w[2:]) // max(1, _attr(node, "group", 1))
        return 1, k
    if op in ("MatMul", "Gemm") and len(ins) > 1 and s[0] and s[1]:
        a = s[0]
        k = (a[0] if _attr(node, "transA", 0) else a[-1]) if op == "Gemm" else a[-1]
        return 1, k
    if op in _REDUCE and s[0] and node.output[0] in shapes:
        return 0, max(1, math.prod(s[0]) // max(1, math.prod(shapes[node.output[0]])))
    if op in ("AveragePool", "LpPool"):
        return 0, math.prod(_attr(node, "kernel_shape", [1]))
    if op in _LAST_AXES and s[0]:
        axis = _attr(node, "axis", _LAST_AXES[op])
        return 0, (s[0][axis] if op != "LayerNormalization" else math.prod(s[0][axis:]))
    if op in ("InstanceNormalization", "GroupNormalization") and s[0]:
        return 0, math.prod(s[0][2:])
    if op == "Sum" and len(ins) > 2:
        return 0, len(ins)
    return None


def _float_shapes(model: onnx.ModelProto) -> dict[str, tuple[list[int], int]]:
    g = model.graph
    out = {t.name: (list(t.dims), t.data_type) for t in g.initializer}
    for v in [*g.input, *g.value_info, *g.output]:
        tt = v.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0 for d in tt.shape.dim):
            out.setdefault(v.name, ([d.dim_value for d in tt.shape.dim], tt.elem_type))
    return {k: v for k, v in out.items() if v[1] in UNIT_ROUNDOFF}


def envelope_model(model: onnx.ModelProto, seed: int) -> tuple[onnx.ModelProto, int]:
    """Return (model with every reducing node's weights or first input multiplied by 1 +- gamma_K,
    number of nodes perturbed). model must carry inferred shapes (harness.convert.shapes.infer_shapes)."""
    u = unit_roundoff(model)
    typed = _float_shapes(model)
    shapes = {k: v[0] for k, v in typed.items()}
    rng = np.random.default_rng(seed)
    out = copy_model(model)
    inits = {t.name: t for t in out.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    perturbed = 0
    for node in out.graph.node:
        found = _reduction(node, shapes)
        name = node.input[found[0]] if found else ""
        if found and name in typed:
            dims, elem = typed[name]
            g = gamma(found[1], u)
            signs = rng.integers(0, 2, dims).astype(np.float64) * 2 - 1
            if name in inits:  # a weight: perturb its copy in place
                w = numpy_helper.to_array(inits[name])
                inits[name].CopyFrom(numpy_helper.from_array((w * (1 + g * signs)).astype(w.dtype), name))
            else:  # an activation: multiply it by a constant of its shape
                factor = (1 + g * signs).astype(onnx.helper.tensor_dtype_to_np_dtype(elem))
                fname, pname = f"{name}__rounding_factor_{perturbed}", f"{name}__rounded_{perturbed}"
                out.graph.initializer.append(numpy_helper.from_array(factor, fname))
                nodes.append(onnx.helper.make_node("Mul", [name, fname], [pname], name=f"rounding_{perturbed}"))
                node.input[found[0]] = pname
            perturbed += 1
        nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, perturbed
