"""Block-wise 4-bit weights for the HTP: a per-channel w4a16 graph's linear weights re-encoded as LPBQ.

LPBQ (low-power block quantization, what AI Hub ships as w4a16) gives each output channel a float scale and each
block of `block` input rows of that channel a small integer multiplier: weight = q * (int_scale * channel_scale),
q signed 4-bit, symmetric. The QNN EP of onnxruntime-qnn 2.7.0 builds it on the HTP from one QDQ pattern
(onnxruntime's qnn_node_group/lpbqmatmul_fusion.cc, LowPowerBlockQuantizedMatMulFusion):

    DequantizeLinear(int_scales uint8 [K/B, N], channel_scales float [N], zero uint8 [N], axis=1) -> scales
    DequantizeLinear(q int4 [K, N], scales, zero int4 [K/B, N], axis=0, block_size=B) -> MatMul input B

and gives its QNN MatMul the BLOCKWISE_EXPANSION encoding (measured: the HTP's output agrees with onnxruntime's
CPU run of the same QDQ graph to 80 dB, every node on the HTP with CPU fallback disabled). The integers are read
as 4-bit block scales: 1..16 agree with the host, 20 and above gave garbage (-8 dB), so they stay in 1..16.
onnxruntime's quantizer writes no block-wise DequantizeLinear; this module writes the pattern from the float
weights, into the graph onnxruntime's quantizer made per channel (activations, KV cache and every other tensor
keep its encodings). MatMul weights only: the EP's Gemm form (lpbqgemm_fusion.cc) ran exact without a bias but
24.7 dB from the host with one (the EP quantizes the float bias itself) and refused onnxruntime's int32 bias
DequantizeLinear, so a Gemm (a linear layer with a bias, after the conversion) keeps its per-channel weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from harness.cache import ArtifactCache, content_key
from harness.errors import ConfigError

BLOCK_SCALE_MAX = 16  # the HTP's 4-bit block-scale expansion: per-block integer multipliers 1..16
INT4_MIN, INT4_MAX = -8, 7
SUFFIX = "_lpbq"  # names of the tensors the pattern adds: <weight>_lpbq_scales, ...


def lpbq_encode(weight: np.ndarray, block: int, search: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (q int8 [K, N] in -8..7, int_scales uint8 [K/block, N] in 1..16, channel_scales float32 [N]) of a
    MatMul weight [K, N], blocks of `block` rows along K: symmetric, each channel's scale its largest block's
    magnitude over 7 * 16, each block's scale an integer multiple of it: the largest magnitude in the block over 7
    rounded, or with `search` the multiple (of those for 60..100% of that magnitude) whose 4-bit values come
    closest to the block's weights (least squares). Not the default: on SmolLM2-135M (8 windows, host QDQ) it took
    blocks of 32 from perplexity 116.2 to 95.9 but blocks of 64 from 142.8 to 173.0."""
    k, n = weight.shape
    w = weight.astype(np.float32).reshape(k // block, block, n)
    peak = np.maximum(np.abs(w).max(axis=1), np.finfo(np.float32).tiny) / INT4_MAX  # [K/block, N]
    channel = (peak.max(axis=0) / BLOCK_SCALE_MAX).astype(np.float32)
    best, best_error = None, None
    for ratio in (np.linspace(0.6, 1.0, 9) if search else (1.0,)):
        ints = np.clip(np.round(peak * ratio / channel), 1, BLOCK_SCALE_MAX)
        scales = (ints * channel).astype(np.float32)[:, None, :]
        error = ((np.clip(np.round(w / scales), INT4_MIN, INT4_MAX) * scales - w) ** 2).sum(axis=1)
        if best is None:
            best, best_error = ints, error
        else:
            better = error < best_error
            best, best_error = np.where(better, ints, best), np.where(better, error, best_error)
    ints = best.astype(np.uint8)
    scales = ints.astype(np.float32) * channel  # as DequantizeLinear computes them
    q = np.clip(np.round(weight / np.repeat(scales, block, axis=0)), INT4_MIN, INT4_MAX).astype(np.int8)
    return q, ints, channel


def lpbq_weights(model: onnx.ModelProto) -> list[str]:
    """Return the MatMul weights of a QDQ model given as the LPBQ pattern (a block-wise int4 DequantizeLinear whose
    scales a per-channel DequantizeLinear of uint8 integers computes), by the name of the MatMul's input."""
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    matmul_inputs = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
    found = []
    for node in model.graph.node:
        block = next((a.i for a in node.attribute if a.name == "block_size"), 0)
        scale = producers.get(node.input[1]) if len(node.input) > 1 else None
        if node.op_type == "DequantizeLinear" and block and node.output[0] in matmul_inputs \
                and inits.get(node.input[0]) is not None and inits[node.input[0]].data_type == TensorProto.INT4 \
                and scale is not None and scale.op_type == "DequantizeLinear" \
                and inits.get(scale.input[0]) is not None and inits[scale.input[0]].data_type == TensorProto.UINT8:
            found.append(node.output[0])
    return found


def _per_channel_int4(node: onnx.NodeProto, inits: dict, matmul_weights: set[str]) -> bool:
    """True for a DequantizeLinear of an int4 per-channel initializer (axis 1) feeding a MatMul's input B."""
    if node.op_type != "DequantizeLinear" or node.output[0] not in matmul_weights:
        return False
    data = inits.get(node.input[0])
    scale = inits.get(node.input[1]) if len(node.input) > 1 else None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    return (data is not None and data.data_type == TensorProto.INT4 and len(data.dims) == 2 and scale is not None
            and len(scale.dims) == 1 and scale.dims[0] == data.dims[1] and axis in (1, -1)
            and not any(a.name == "block_size" and a.i for a in node.attribute))


def float_names(node: onnx.NodeProto) -> tuple[str, str]:
    """Return the names the float weight of a weight's DequantizeLinear has in the float model, as onnxruntime's
    quantizer names its tensors (<w>_quantized -> DequantizeLinear -> <w>_DequantizeLinear_Output)."""
    return (node.input[0].removesuffix("_quantized"), node.output[0].removesuffix("_DequantizeLinear_Output"))


def to_lpbq(qdq: onnx.ModelProto, float_weights: dict[str, np.ndarray], block: int, where: str,
            search: bool = False) -> int:
    """Rewrite, in place, every int4 per-channel MatMul weight of qdq into the LPBQ pattern with `block` rows per
    block, re-encoded from its float value (lpbq_encode, with or without its search); return how many. Raise
    ConfigError naming the weight when its input dimension is not a multiple of block (float_weights holds the
    float model's initializers named as float_names gives them)."""
    graph = qdq.graph
    inits = {i.name: i for i in graph.initializer}
    matmul_weights = {n.input[1] for n in graph.node if n.op_type == "MatMul"}
    nodes, added, count = [], [], 0
    for node in graph.node:
        if not _per_channel_int4(node, inits, matmul_weights):
            nodes.append(node)
            continue
        name = node.output[0]
        weight = next((float_weights[w] for w in float_names(node) if w in float_weights), None)
        if weight is None:
            raise ConfigError(f"{where}: the float model has no weight {' or '.join(float_names(node))} to encode "
                              "block-wise")
        k, n = weight.shape
        if k % block:
            raise ConfigError(f"{where}: llm.weight_block_size {block} does not divide weight '{name}''s input "
                              f"dimension {k} ([{k}, {n}]): choose a block size dividing every linear layer's "
                              "input dimension (64 or 32 for most LLMs)")
        q, ints, channel = lpbq_encode(weight, block, search)
        base = name + SUFFIX
        added += [helper.make_tensor(node.input[0], TensorProto.INT4, [k, n], q.ravel().tolist()),
                  numpy_helper.from_array(ints, f"{base}_int_scales"),
                  numpy_helper.from_array(channel, f"{base}_channel_scales"),
                  numpy_helper.from_array(np.zeros(n, np.uint8), f"{base}_scale_zero"),
                  helper.make_tensor(f"{base}_zero", TensorProto.INT4, [k // block, n], [0] * (k // block * n))]
        nodes.append(helper.make_node("DequantizeLinear", [f"{base}_int_scales", f"{base}_channel_scales",
                                                           f"{base}_scale_zero"], [f"{base}_scales"],
                                      name=f"{base}_scales_dq", axis=1))
        nodes.append(helper.make_node("DequantizeLinear", [node.input[0], f"{base}_scales", f"{base}_zero"],
                                      [name], name=node.name or f"{base}_dq", axis=0, block_size=block))
        count += 1
    replaced = {t.name for t in added}
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    kept = [i for i in graph.initializer if i.name in used and i.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    return count


def lpbq_graph(qdq: Path, float_model: Path, block: int, cache: ArtifactCache, search: bool = False) -> Path:
    """Return the cached copy of the QDQ graph qdq with its int4 per-channel MatMul weights as LPBQ blocks of
    `block` rows, encoded from float_model's weights (lpbq_encode); raise ConfigError when it has none to
    re-encode."""
    def build(out: Path) -> None:
        model = onnx.load(str(qdq))
        source = onnx.load(str(float_model))
        wanted = {w for n in model.graph.node if n.op_type == "DequantizeLinear" for w in float_names(n)}
        floats = {i.name: numpy_helper.to_array(i) for i in source.graph.initializer if i.name in wanted}
        del source
        if not to_lpbq(model, floats, block, str(qdq), search):
            raise ConfigError(f"{qdq}: no 4-bit per-channel MatMul weight to encode block-wise "
                              f"(llm.weight_block_size {block} applies to the w4a16 recipe's linear layers)")
        large = model.ByteSize() > 2**30
        onnx.save(model, str(out / "model.onnx"), save_as_external_data=large, location="model.onnx.data")

    return cache.entry("lpbq", content_key("lpbq-v2", qdq, float_model, block, search), build).path / "model.onnx"
