"""A small CNN with one deliberately precision-hostile activation, for the accuracy-recovery tests.

    x [1,3,8,8] -> conv1 -> relu1 -> outlier_act [1,8,8,8]
                                        |-> conv2 (reads channels 0-5) -> relu2 --\\
                                        '-> conv3 (1x1, reads channels 6-7, bias -150) -> concat -> flatten -> fc -> logits

Channels 6 and 7 of `outlier_act` sit near +150 (a bias of 150) while channels 0-5 carry the signal
in about [0, 2]. With per-tensor 8-bit activations the scale is set by the outliers (150/255 ≈ 0.6),
so the signal channels and the small variations of the outlier channels (which conv3 recovers by
subtracting 150) are lost: PTQ misses its KPI. Clipping the outliers (entropy/percentile
calibration) does not help, because conv3 needs them; giving `outlier_act` 16 bits does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HOSTILE_TENSOR = "outlier_act"
HOSTILE_FUSED_TENSOR = "conv1_out"  # the Conv output the quantizer folds the Relu into
CONSUMER_NODES = ("relu2", "conv3")  # the first nodes whose output shows the damage
OUTLIER = 100.0
INPUT_SHAPE = (1, 3, 8, 8)


@dataclass(frozen=True)
class OutlierModel:
    """The demonstration model on disk and the names a test checks."""

    path: Path
    hostile_tensor: str = HOSTILE_TENSOR
    fused_tensor: str = HOSTILE_FUSED_TENSOR
    consumer_nodes: tuple[str, ...] = CONSUMER_NODES


def _save(path: Path, nodes: list, name: str, output: tuple[str, list[int]], inits: list) -> Path:
    """Check the graph of nodes (input `x` of INPUT_SHAPE, one float output) and write it to path; return path."""
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(INPUT_SHAPE))],
                              [helper.make_tensor_value_info(output[0], TensorProto.FLOAT, output[1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def build_outlier_model(path: Path, outlier: float = OUTLIER, seed: int = 0) -> OutlierModel:
    """Write the demonstration model to path (deterministic for a seed); return its description."""
    rng = np.random.default_rng(seed)
    c_in, c1, c2 = INPUT_SHAPE[1], 8, 8
    w1 = (rng.normal(size=(c1, c_in, 3, 3)) * 0.25).astype(np.float32)
    b1 = np.zeros(c1, np.float32)
    w1[6:] *= 0.3  # the outlier channels vary by well under one 8-bit step around +outlier
    b1[6:] = outlier
    w2 = (rng.normal(size=(c2, c1, 3, 3)) * 0.25).astype(np.float32)
    w2[:, 6:] = 0.0
    w3 = np.zeros((2, c1, 1, 1), np.float32)
    w3[0, 6] = w3[1, 7] = 1.0
    b3 = np.full(2, -outlier, np.float32)
    wf = (rng.normal(size=(10, (c2 + 2) * 8 * 8)) * 0.1).astype(np.float32)
    arrays = {"conv1_w": w1, "conv1_b": b1, "conv2_w": w2, "conv2_b": np.zeros(c2, np.float32),
              "conv3_w": w3, "conv3_b": b3, "fc_w": wf, "fc_b": np.zeros(10, np.float32)}
    nodes = [
        helper.make_node("Conv", ["x", "conv1_w", "conv1_b"], [HOSTILE_FUSED_TENSOR], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", [HOSTILE_FUSED_TENSOR], [HOSTILE_TENSOR], name="relu1"),
        helper.make_node("Conv", [HOSTILE_TENSOR, "conv2_w", "conv2_b"], ["conv2_out"], name="conv2", pads=[1] * 4),
        helper.make_node("Relu", ["conv2_out"], ["relu2_out"], name="relu2"),
        helper.make_node("Conv", [HOSTILE_TENSOR, "conv3_w", "conv3_b"], ["conv3_out"], name="conv3"),
        helper.make_node("Concat", ["relu2_out", "conv3_out"], ["concat_out"], name="concat", axis=1),
        helper.make_node("Flatten", ["concat_out"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
    ]
    return OutlierModel(_save(path, nodes, "outlier_cnn", ("logits", [1, 10]),
                              [numpy_helper.from_array(a, n) for n, a in arrays.items()]))


def build_deep_model(path: Path, blocks: int = 40, channels: int = 8, seed: int = 0) -> Path:
    """Write a residual CNN of `blocks` Conv-Relu-Conv-Add-Relu blocks (5 nodes each) to path."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    prev = "x"
    nodes.append(helper.make_node("Conv", ["x", "stem_w", "stem_b"], ["stem"], name="stem", pads=[1] * 4))
    inits += [numpy_helper.from_array((rng.normal(size=(channels, 3, 3, 3)) * 0.3).astype(np.float32), "stem_w"),
              numpy_helper.from_array(np.zeros(channels, np.float32), "stem_b")]
    prev = "stem"
    for b in range(blocks):
        for k in ("a", "b"):
            inits += [numpy_helper.from_array(
                (rng.normal(size=(channels, channels, 3, 3)) * (0.5 / np.sqrt(9 * channels))).astype(np.float32),
                f"b{b}{k}_w"), numpy_helper.from_array(np.zeros(channels, np.float32), f"b{b}{k}_b")]
        nodes += [
            helper.make_node("Conv", [prev, f"b{b}a_w", f"b{b}a_b"], [f"b{b}_c1"], name=f"b{b}_conv1", pads=[1] * 4),
            helper.make_node("Relu", [f"b{b}_c1"], [f"b{b}_r1"], name=f"b{b}_relu1"),
            helper.make_node("Conv", [f"b{b}_r1", f"b{b}b_w", f"b{b}b_b"], [f"b{b}_c2"], name=f"b{b}_conv2", pads=[1] * 4),
            helper.make_node("Add", [prev, f"b{b}_c2"], [f"b{b}_sum"], name=f"b{b}_add"),
            helper.make_node("Relu", [f"b{b}_sum"], [f"b{b}_out"], name=f"b{b}_relu2"),
        ]
        prev = f"b{b}_out"
    nodes.append(helper.make_node("GlobalAveragePool", [prev], ["pooled"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten", axis=1))
    inits += [numpy_helper.from_array((rng.normal(size=(10, channels)) * 0.3).astype(np.float32), "fc_w"),
              numpy_helper.from_array(np.zeros(10, np.float32), "fc_b")]
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1))
    return _save(path, nodes, "deep_cnn", ("logits", [1, 10]), inits)



CONCAT_BIG_TENSOR = "big"  # the Concat input holding one channel near CONCAT_OUTLIER
CONCAT_FEATURE_TENSOR = "feat"  # the ordinary feature map it is concatenated with
CONCAT_OUTPUT_TENSOR = "cat"
CONCAT_OUTLIER = 1000.0


def build_concat_outlier_model(path: Path, outlier: float = CONCAT_OUTLIER, depth: int = 12,
                               big_gain: float = 0.5, spread: float = 1.0, seed: int = 0) -> Path:
    """Write a CNN whose one Concat joins an ordinary feature map with a channel near `outlier`; return path.

        x [1,3,8,8] -> conv1 -> relu1 -> feat [1,8,8,8] (about [0, 3]) --------------------------\\
        x -> conv_big (1x1) -> big_raw (+-`spread`) -> add (+outlier) -> big [1,1,8,8] -> concat -> cat [1,9,8,8]
        cat -> head (1x1: feat and big_gain * (big - outlier)) -> depth x (conv 3x3 -> relu) -> maxpool -> conv -> out

    In 8 bits `big`'s scale (outlier/255) erases its variations, and `cat`'s erases `feat`. `cat`'s
    cosine similarity stays near 1 (its big channel dominates it), so the damage shows from the
    head on. Promoting `cat` and what follows recovers `feat` but not `big`, which is 8-bit at the
    Concat's input already: only promoting the Concat's inputs and output together recovers the
    model. The head's weights lie on the 8-bit weight grid, so weight rounding times `outlier`
    does not mask the activations' loss.

    The default outlier is 1000: with a channel near 5000 the host's QDQ emulation recovers to
    32 dB, but the HTP simulator's 16-bit convolution loses the big channel's variations
    (12 dB even with every activation at 16 bits).
    """
    rng = np.random.default_rng(seed)
    c = 8
    arrays = {
        "conv1_w": (rng.normal(size=(c, 3, 3, 3)) * 0.3).astype(np.float32),
        "conv1_b": np.full(c, 0.1, np.float32),
        "big_w": (rng.normal(size=(1, 3, 1, 1)) * spread).astype(np.float32),
        "big_b": np.zeros(1, np.float32),
        "offset": np.array(outlier, np.float32),
    }
    step = 2.0 ** -7  # the 8-bit weight grid of the head: its weights span [-128, 127] steps exactly
    head = np.clip(np.round(rng.normal(size=(c, c + 1, 1, 1)) * 0.4 / step), -128, 127)
    head[:, c] = rng.choice([-1.0, 1.0], size=(c, 1, 1)) * round(big_gain / step)
    head[0, 0], head[1, 0] = -128, 127
    arrays["head_w"] = (head * step).astype(np.float32)
    arrays["head_b"] = (-arrays["head_w"][:, c, 0, 0] * outlier).astype(np.float32)  # the head reads big - outlier
    nodes = [
        helper.make_node("Conv", ["x", "conv1_w", "conv1_b"], ["conv1_out"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["conv1_out"], [CONCAT_FEATURE_TENSOR], name="relu1"),
        helper.make_node("Conv", ["x", "big_w", "big_b"], ["big_raw"], name="conv_big"),
        helper.make_node("Add", ["big_raw", "offset"], [CONCAT_BIG_TENSOR], name="add_offset"),
        helper.make_node("Concat", [CONCAT_FEATURE_TENSOR, CONCAT_BIG_TENSOR], [CONCAT_OUTPUT_TENSOR],
                         name="concat", axis=1),
        helper.make_node("Conv", [CONCAT_OUTPUT_TENSOR, "head_w", "head_b"], ["h0"], name="head"),
    ]
    for k in range(depth):
        arrays[f"c{k}_w"] = (rng.normal(size=(c, c, 3, 3)) * (1.4 / np.sqrt(9 * c))).astype(np.float32)
        arrays[f"c{k}_b"] = np.zeros(c, np.float32)
        nodes += [helper.make_node("Conv", [f"h{k}", f"c{k}_w", f"c{k}_b"], [f"c{k}_out"], name=f"conv{k + 2}",
                                   pads=[1] * 4),
                  helper.make_node("Relu", [f"c{k}_out"], [f"h{k + 1}"], name=f"relu{k + 2}")]
    arrays["out_w"] = (rng.normal(size=(4, c, 1, 1)) * 0.5).astype(np.float32)
    arrays["out_b"] = np.zeros(4, np.float32)
    nodes += [helper.make_node("MaxPool", [f"h{depth}"], ["pooled"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
              helper.make_node("Conv", ["pooled", "out_w", "out_b"], ["out"], name="out")]
    return _save(path, nodes, "concat_outlier_cnn", ("out", [1, 4, 4, 4]),
                 [numpy_helper.from_array(a, n) for n, a in arrays.items()])
