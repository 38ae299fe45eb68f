"""Export a :class:`~harness.llm.gpt.GptWeights` as Genie's static-shape graph pair (prefill AR-N, decode AR-1).

Both graphs are built by one function from the same weights, so they hold the same initializers and the
same intermediate tensor names (only the shapes differ): quantization encodings computed on one apply to
the other. The I/O follows :mod:`harness.llm.convention` (Qualcomm AI Hub's Genie bundles):

    input_ids          [1, AR]            int32
    attention_mask     [1, 1, AR, CL]     float32, additive (0 attend, -1000 masked); columns: CL-AR past slots,
                                          then the AR new tokens
    position_ids       [1, AR]            int32, absolute (rows of the learned position table)
    past_key_{l}_in    [H, 1, Dh, CL-AR]  float32
    past_value_{l}_in  [H, 1, CL-AR, Dh]  float32
  ->
    logits             [1, AR, V]         float32
    past_key_{l}_out   [H, 1, Dh, AR]     float32, only the AR new entries
    past_value_{l}_out [H, 1, AR, Dh]     float32

Inside each block: keys = Concat(past_key_in, new_key, axis=3), values = Concat(past_value_in, new_value,
axis=2), scores = Q @ keys * (1/sqrt(Dh)) + attention_mask, Softmax, @ values. The MLP's GELU is written
in the Erf form PyTorch exports (x * 0.5 * (1 + Erf(x / sqrt 2))): onnxruntime's ``qnn_preprocess_model``
fuses it into one Gelu, which the HTP runs (a lone Erf it refuses).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from harness.files import write_atomically
from harness.llm import convention as cv
from harness.llm.gpt import LN_EPS, GptWeights

__all__ = ["DECODE_FILE", "IR_VERSION", "OPSET", "PREFILL_FILE", "build_graph", "export_graph", "export_pair"]

OPSET = 17
IR_VERSION = 8  # the IR version of opset 17: loads in older onnxruntime builds on devices too
PREFILL_FILE = "prefill.onnx"
DECODE_FILE = "decode.onnx"
PRODUCER = "harness.llm.export"


class _Builder:
    """Accumulates nodes and initializers with deterministic names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        """Add an initializer; return its name."""
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str, **attrs: object) -> str:
        """Add a node named after its output; return the output name."""
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=f"{output}/{op_type}", **attrs))
        return output


def _shared_constants(b: _Builder, weights: GptWeights) -> dict[str, str]:
    """Add the constants every block uses (the same values at any AR); return their names by role."""
    cfg = weights.config
    return {
        "split_heads": b.const("const.split_heads_shape", np.array([1, -1, cfg.heads, cfg.head_dim], np.int64)),
        "merge_heads": b.const("const.merge_heads_shape", np.array([1, -1, cfg.hidden], np.int64)),
        "scale": b.const("const.attn_scale", np.array(1.0 / math.sqrt(cfg.head_dim), np.float32)),
        "sqrt2": b.const("const.sqrt2", np.array(math.sqrt(2.0), np.float32)),
        "one": b.const("const.one", np.array(1.0, np.float32)),
        "half": b.const("const.half", np.array(0.5, np.float32)),
    }


def _linear(b: _Builder, x: str, w: np.ndarray, bias: np.ndarray, prefix: str) -> str:
    """Return x @ w + bias (MatMul then Add)."""
    y = b.op("MatMul", [x, b.const(f"{prefix}.weight", w)], f"{prefix}.matmul")
    return b.op("Add", [y, b.const(f"{prefix}.bias", bias)], f"{prefix}.out")


def _layer_norm(b: _Builder, x: str, g: np.ndarray, beta: np.ndarray, prefix: str) -> str:
    """Return LayerNormalization(x) over the last axis."""
    return b.op("LayerNormalization", [x, b.const(f"{prefix}.weight", g), b.const(f"{prefix}.bias", beta)],
                f"{prefix}.out", axis=-1, epsilon=LN_EPS)


def _gelu_erf(b: _Builder, x: str, c: dict[str, str], prefix: str) -> str:
    """Return x * (1 + Erf(x / sqrt 2)) * 0.5, the node sequence PyTorch exports for the exact GELU."""
    d = b.op("Div", [x, c["sqrt2"]], f"{prefix}.div")
    e = b.op("Erf", [d], f"{prefix}.erf")
    a = b.op("Add", [e, c["one"]], f"{prefix}.add")
    m = b.op("Mul", [x, a], f"{prefix}.mul")
    return b.op("Mul", [m, c["half"]], f"{prefix}.out")


def _attention(b: _Builder, x: str, layer_index: int, weights: GptWeights, c: dict[str, str]) -> str:
    """Add one block's attention with Genie's KV convention; return the attention output [1, AR, D]."""
    layer, d, p = weights.layers[layer_index], weights.config.hidden, f"l{layer_index}.attn"
    q, k, v = (_linear(b, x, layer.w_qkv[:, i * d:(i + 1) * d], layer.b_qkv[i * d:(i + 1) * d], f"{p}.{n}")
               for i, n in enumerate("qkv"))
    q = b.op("Transpose", [b.op("Reshape", [q, c["split_heads"]], f"{p}.q_heads")], f"{p}.q_t", perm=[2, 0, 1, 3])
    k_new = b.op("Transpose", [b.op("Reshape", [k, c["split_heads"]], f"{p}.k_heads")],
                 cv.past_key_out(layer_index), perm=[2, 0, 3, 1])  # [H, 1, Dh, AR]
    v_new = b.op("Transpose", [b.op("Reshape", [v, c["split_heads"]], f"{p}.v_heads")],
                 cv.past_value_out(layer_index), perm=[2, 0, 1, 3])  # [H, 1, AR, Dh]
    keys = b.op("Concat", [cv.past_key_in(layer_index), k_new], f"{p}.keys", axis=3)  # [H, 1, Dh, CL]
    values = b.op("Concat", [cv.past_value_in(layer_index), v_new], f"{p}.values", axis=2)  # [H, 1, CL, Dh]
    scores = b.op("Mul", [b.op("MatMul", [q, keys], f"{p}.qk"), c["scale"]], f"{p}.scores")
    masked = b.op("Add", [scores, cv.ATTENTION_MASK], f"{p}.masked_scores")
    probs = b.op("Softmax", [masked], f"{p}.probs", axis=-1)
    ctx = b.op("MatMul", [probs, values], f"{p}.context")  # [H, 1, AR, Dh]
    ctx = b.op("Transpose", [ctx], f"{p}.context_t", perm=[1, 2, 0, 3])  # [1, AR, H, Dh]
    ctx = b.op("Reshape", [ctx, c["merge_heads"]], f"{p}.context_merged")
    return _linear(b, ctx, layer.w_o, layer.b_o, f"{p}.o")


def _block(b: _Builder, x: str, layer_index: int, weights: GptWeights, c: dict[str, str]) -> str:
    """Add one pre-LN transformer block; return its output [1, AR, D]."""
    layer, p = weights.layers[layer_index], f"l{layer_index}"
    attn = _attention(b, _layer_norm(b, x, layer.ln1_g, layer.ln1_b, f"{p}.ln1"), layer_index, weights, c)
    x = b.op("Add", [x, attn], f"{p}.resid_attn")
    h = _linear(b, _layer_norm(b, x, layer.ln2_g, layer.ln2_b, f"{p}.ln2"), layer.w_fc, layer.b_fc, f"{p}.mlp.fc")
    h = _linear(b, _gelu_erf(b, h, c, f"{p}.mlp.gelu"), layer.w_proj, layer.b_proj, f"{p}.mlp.proj")
    return b.op("Add", [x, h], f"{p}.resid_mlp")


def _io(weights: GptWeights, ar: int) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """Return the graph's inputs and outputs for AR tokens per call."""
    cfg = weights.config
    h, dh, cl, past = cfg.heads, cfg.head_dim, cfg.context, cfg.context - ar
    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    inputs = [helper.make_tensor_value_info(cv.INPUT_IDS, i32, [1, ar]),
              helper.make_tensor_value_info(cv.ATTENTION_MASK, f32, [1, 1, ar, cl]),
              helper.make_tensor_value_info(cv.POSITION_IDS, i32, [1, ar])]
    outputs = [helper.make_tensor_value_info(cv.LOGITS, f32, [1, ar, cfg.vocab])]
    for layer in range(cfg.layers):
        inputs += [helper.make_tensor_value_info(cv.past_key_in(layer), f32, [h, 1, dh, past]),
                   helper.make_tensor_value_info(cv.past_value_in(layer), f32, [h, 1, past, dh])]
        outputs += [helper.make_tensor_value_info(cv.past_key_out(layer), f32, [h, 1, dh, ar]),
                    helper.make_tensor_value_info(cv.past_value_out(layer), f32, [h, 1, ar, dh])]
    return inputs, outputs


def build_graph(weights: GptWeights, ar: int) -> onnx.ModelProto:
    """Return the checked model taking AR tokens per call (1 <= AR < context)."""
    cfg = weights.config
    if not 1 <= ar < cfg.context:
        raise ValueError(f"AR {ar} must be at least 1 and below the context length {cfg.context}")
    b = _Builder()
    c = _shared_constants(b, weights)
    tok = b.op("Gather", [b.const("tok_emb.weight", weights.tok_emb), cv.INPUT_IDS], "tok_emb.out", axis=0)
    pos = b.op("Gather", [b.const("pos_emb.weight", weights.pos_emb), cv.POSITION_IDS], "pos_emb.out", axis=0)
    x = b.op("Add", [tok, pos], "embed.out")  # [1, AR, D]
    for layer in range(cfg.layers):
        x = _block(b, x, layer, weights, c)
    x = _layer_norm(b, x, weights.lnf_g, weights.lnf_b, "lnf")
    b.op("MatMul", [x, b.const("lm_head.weight", weights.lm_head)], cv.LOGITS)
    inputs, outputs = _io(weights, ar)
    graph = helper.make_graph(b.nodes, f"gpt_ar{ar}_cl{cfg.context}", inputs, outputs, b.initializers)
    model = helper.make_model(graph, producer_name=PRODUCER, producer_version="1",
                              opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return model


def export_graph(weights: GptWeights, ar: int, path: Path) -> Path:
    """Write the AR-token graph to path (deterministic bytes, atomically); return path."""
    path = Path(path)
    write_atomically(path, build_graph(weights, ar).SerializeToString(deterministic=True))
    return path


def export_pair(weights: GptWeights, out_dir: Path) -> tuple[Path, Path]:
    """Write out_dir/prefill.onnx (AR = config.prefill_ar) and out_dir/decode.onnx (AR = 1); return
    (prefill path, decode path)."""
    out_dir = Path(out_dir)
    return (export_graph(weights, weights.config.prefill_ar, out_dir / PREFILL_FILE),
            export_graph(weights, 1, out_dir / DECODE_FILE))
