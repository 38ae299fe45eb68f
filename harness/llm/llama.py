"""Author a Llama-family checkpoint as Genie's static graph pair (prefill AR-N, decode AR-1) with onnx-ir.

The I/O is :mod:`harness.llm.convention`'s, as harness.llm.export writes it for the built-in GPT (H is the
number of KV heads): input_ids [1, AR], attention_mask [1, 1, AR, CL] additive, position_ids [1, AR] absolute,
past_key_{l}_in [H, 1, Dh, CL-AR], past_value_{l}_in [H, 1, CL-AR, Dh] -> logits [1, AR, V] and the new
entries past_key_{l}_out [H, 1, Dh, AR], past_value_{l}_out [H, 1, AR, Dh]. Positions index cos/sin tables of
the rotary embedding inside the graph, so Genie feeds them as it does learned positions ("absolute").

Each block (Hugging Face's LlamaDecoderLayer): RMSNorm as LpNormalization(x) * (w * sqrt(D)) (opset 21 has no
RMSNormalization; the written-out x^2 / mean / sqrt has a range a quantized activation cannot hold: the residual
stream's outlier tokens square to ~1e6 and every ordinary token's mean square rounds to 0, which made w8a16
perplexity ~1e6; the unit-norm output stays in [-1, 1], and the HTP runs LpNormalization as its L2Norm; eps
enters exactly as one padded element sqrt(D eps), sliced off after), Q/K/V projections (+ biases for Qwen2), RoPE in rotate-half form (q * cos + swap_halves(q)
* sin_signed), grouped-query attention over the cache (each KV head's G query heads stacked along the rows of
one MatMul, so no MatMul broadcasts), SwiGLU (gate * Sigmoid(gate) * up), residuals. Both graphs hold the same
initializers and intermediate names (reshape constants use -1 for AR), so encodings computed on one apply to
the other.

GPT-2 (a config with norm "layer", positions "learned", mlp "gelu_tanh") takes the same blocks with three
swaps: LayerNormalization with its bias for RMSNorm; no rotation, the position table gathered at position_ids
and added to the token embedding instead ("embed.out" is their sum, as transformers' GPT-2 has it); and an MLP
of up -> GELU -> down with biases, GELU written out in GPT-2's tanh form (0.5 x (1 + tanh(sqrt(2/pi) (x +
0.044715 x^3))), as the HTP runs Tanh).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from harness.errors import ModelError
from harness.files import write_atomically
from harness.llm import convention as cv
from harness.llm.checkpoint import Checkpoint, LlamaConfig

__all__ = ["OPSET", "LlamaGraphs", "build_graph", "block_output", "rope_tables"]

OPSET = 21  # what 16-bit Q/DQ needs: onnxruntime's quantizer would raise it, which no graph past 2 GiB survives
IR_VERSION = 10  # opset 21's
PRODUCER = "harness.llm.llama"
# weights from this size on go to ONNX external data beside the graph: protobuf cannot serialize a message of 2 GiB
# (a 0.5B-parameter model's float32 weights are 2.5 GB); below it the graph stays one file
EXTERNAL_DATA_BYTES = 2**31 - 2**27


def block_output(layer: int) -> str:
    """Return the name of block `layer`'s output tensor (the residual stream after its MLP)."""
    return f"l{layer}.resid_mlp"


def _inv_freq(config: LlamaConfig, freq_factors: np.ndarray | None) -> np.ndarray:
    """Return the rotary inverse frequencies [Dh/2] (float64) with the checkpoint's scaling applied."""
    dh = config.head_dim
    inv = 1.0 / config.rope_theta ** (np.arange(0, dh, 2, dtype=np.float64) / dh)
    if freq_factors is not None:  # llama3 scaling as GGUF stores it (llama.cpp divides theta by the factors)
        return inv / freq_factors.astype(np.float64)
    scaling = dict(config.rope_scaling)
    kind = scaling.get("rope_type")
    if kind is None:
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":  # Hugging Face's _compute_llama3_parameters
        factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(medium, smoothed, scaled)
    raise ModelError(f"rope_scaling type '{kind}' is not supported (none, linear, llama3 are)")


def rope_tables(config: LlamaConfig, context: int, freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return (cos, sin_signed) [CL, 1, Dh] float32 for positions 0..CL-1: x rotated = x * cos +
    swap_halves(x) * sin_signed (sin_signed = [-sin, sin] over the two halves)."""
    freqs = np.outer(np.arange(context, dtype=np.float64), _inv_freq(config, freq_factors))  # [CL, Dh/2]
    cos = np.concatenate([np.cos(freqs)] * 2, axis=-1)
    sin = np.concatenate([-np.sin(freqs), np.sin(freqs)], axis=-1)
    return cos[:, None, :].astype(np.float32), sin[:, None, :].astype(np.float32)


@dataclass
class _Author:
    """A tape of nodes and initializers with deterministic names."""

    tape: ir.tape.Tape

    def const(self, name: str, value: np.ndarray) -> ir.Value:
        """Add an initializer; return its value."""
        return self.tape.initializer(ir.tensor(np.ascontiguousarray(value), name=name), name=name)

    def op(self, op_type: str, inputs: list[ir.Value], output: str, **attrs: object) -> ir.Value:
        """Add a node named after its output; return the output."""
        value = self.tape.op(op_type, inputs, attrs or None, name=f"{output}/{op_type}")
        value.name = output
        return value


class LlamaGraphs:
    """Builds the prefill and decode graphs of one checkpoint at one context length (shared constants)."""

    def __init__(self, checkpoint: Checkpoint, context: int) -> None:
        cfg = checkpoint.config
        if cfg.heads % cfg.kv_heads:
            raise ModelError(f"{checkpoint.path}: {cfg.heads} query heads are not a multiple of {cfg.kv_heads} KV "
                             "heads")
        if context < 2:
            raise ModelError(f"context length {context}: must be at least 2")
        if cfg.positions == "learned" and context > cfg.max_positions:
            raise ModelError(f"{checkpoint.path}: context length {context} exceeds the {cfg.max_positions} learned "
                             "positions of the checkpoint")
        self.checkpoint, self.config, self.context = checkpoint, cfg, context
        if cfg.positions == "rope":
            self.cos, self.sin = rope_tables(cfg, context, checkpoint.weights.get("rope_freq_factors"))
        self._t: dict[str, np.ndarray] = {}  # matrices transposed to [in, out] once for both graphs

    def _matrix(self, name: str) -> np.ndarray:
        """Return weight `name` transposed to [in, out] (computed once)."""
        if name not in self._t:
            self._t[name] = np.ascontiguousarray(self.checkpoint.weight(name).T)
        return self._t[name]

    def _linear(self, a: _Author, x: ir.Value, hf: str, out: str) -> ir.Value:
        y = a.op("MatMul", [x, a.const(f"{out}.weight", self._matrix(f"{hf}.weight"))], f"{out}.matmul")
        if f"{hf}.bias" in self.checkpoint.weights:
            y = a.op("Add", [y, a.const(f"{out}.bias", self.checkpoint.weight(f"{hf}.bias"))], f"{out}.out")
        return y

    def _rms_norm(self, a: _Author, x: ir.Value, hf: str, out: str, c: dict[str, ir.Value]) -> ir.Value:
        """Return RMSNorm(x) * w exactly, as LpNormalization: x / sqrt(mean(x^2) + eps) = sqrt(D) x / |[x, e]| with
        e = sqrt(D eps) padded on as one more element (and sliced off after), times w * sqrt(D)."""
        padded = a.op("Pad", [x, c["eps_pad"], c["eps_value"]], f"{out}.padded")
        normed = a.op("LpNormalization", [padded], f"{out}.normed_padded", axis=-1, p=2)
        normed = a.op("Slice", [normed, c["zero"], c["hidden"], c["axis2"]], f"{out}.normed")
        weight = self.checkpoint.weight(hf) * np.float32(math.sqrt(self.config.hidden))
        return a.op("Mul", [normed, a.const(f"{out}.weight", weight)], f"{out}.out")

    def _norm(self, a: _Author, x: ir.Value, hf: str, out: str, c: dict[str, ir.Value]) -> ir.Value:
        """Return the config's norm of x: RMSNorm (weight `hf`.weight) or LayerNorm (with `hf`.bias)."""
        if self.config.norm == "rms":
            return self._rms_norm(a, x, f"{hf}.weight", out, c)
        return a.op("LayerNormalization", [x, a.const(f"{out}.weight", self.checkpoint.weight(f"{hf}.weight")),
                                           a.const(f"{out}.bias", self.checkpoint.weight(f"{hf}.bias"))],
                    f"{out}.out", axis=-1, epsilon=self.config.rms_eps)

    def _gelu_tanh(self, a: _Author, x: ir.Value, out: str, c: dict[str, ir.Value]) -> ir.Value:
        """Return GPT-2's GELU of x: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
        cubed = a.op("Mul", [a.op("Mul", [x, x], f"{out}.x2"), x], f"{out}.x3")
        inner = a.op("Add", [x, a.op("Mul", [cubed, c["gelu_cubic"]], f"{out}.cubic")], f"{out}.inner")
        tanh = a.op("Tanh", [a.op("Mul", [inner, c["gelu_scale"]], f"{out}.scaled")], f"{out}.tanh")
        half = a.op("Mul", [x, c["half_one"]], f"{out}.half_x")
        return a.op("Mul", [half, a.op("Add", [tanh, c["one"]], f"{out}.one_plus_tanh")], f"{out}.out")

    def _rope(self, a: _Author, x: ir.Value, out: str, c: dict[str, ir.Value]) -> ir.Value:
        """Return x [1, AR, heads, Dh] rotated by its positions."""
        first = a.op("Slice", [x, c["zero"], c["half"], c["axis3"]], f"{out}.first_half")
        second = a.op("Slice", [x, c["half"], c["dh"], c["axis3"]], f"{out}.second_half")
        swapped = a.op("Concat", [second, first], f"{out}.swapped", axis=3)
        return a.op("Add", [a.op("Mul", [x, c["cos"]], f"{out}.x_cos"),
                            a.op("Mul", [swapped, c["sin"]], f"{out}.swapped_sin")], f"{out}.out")

    def _attention(self, a: _Author, x: ir.Value, i: int, c: dict[str, ir.Value]) -> ir.Value:
        cfg, p, hf = self.config, f"l{i}.attn", f"model.layers.{i}.self_attn"
        group = cfg.heads // cfg.kv_heads
        q = a.op("Reshape", [self._linear(a, x, f"{hf}.q_proj", f"{p}.q"), c["q_heads"]], f"{p}.q_heads")
        k = a.op("Reshape", [self._linear(a, x, f"{hf}.k_proj", f"{p}.k"), c["kv_heads"]], f"{p}.k_heads")
        v = a.op("Reshape", [self._linear(a, x, f"{hf}.v_proj", f"{p}.v"), c["kv_heads"]], f"{p}.v_heads")
        if cfg.positions == "rope":
            q, k = self._rope(a, q, f"{p}.q_rope", c), self._rope(a, k, f"{p}.k_rope", c)  # [1, AR, heads, Dh]
        k_new = a.op("Transpose", [k], cv.past_key_out(i), perm=[2, 0, 3, 1])  # [Hkv, 1, Dh, AR]
        v_new = a.op("Transpose", [v], cv.past_value_out(i), perm=[2, 0, 1, 3])  # [Hkv, 1, AR, Dh]
        keys = a.op("Concat", [c[cv.past_key_in(i)], k_new], f"{p}.keys", axis=3)  # [Hkv, 1, Dh, CL]
        values = a.op("Concat", [c[cv.past_value_in(i)], v_new], f"{p}.values", axis=2)  # [Hkv, 1, CL, Dh]
        q = a.op("Transpose", [q], f"{p}.q_t", perm=[2, 0, 1, 3])  # [Hq, 1, AR, Dh]
        if group > 1:  # each KV head's query heads as rows of one matrix: [Hkv, 1, G*AR, Dh]
            q = a.op("Reshape", [q, c["grouped_rows"]], f"{p}.q_grouped")
        scores = a.op("Mul", [a.op("MatMul", [q, keys], f"{p}.qk"), c["scale"]], f"{p}.scores")
        if group > 1:
            scores = a.op("Reshape", [scores, c["grouped_scores"]], f"{p}.scores_grouped")  # [Hkv, G, AR, CL]
        probs = a.op("Softmax", [a.op("Add", [scores, c[cv.ATTENTION_MASK]], f"{p}.masked_scores")], f"{p}.probs",
                     axis=-1)
        if group > 1:
            probs = a.op("Reshape", [probs, c["grouped_rows_cl"]], f"{p}.probs_rows")
        ctx = a.op("MatMul", [probs, values], f"{p}.context")
        if group > 1:
            ctx = a.op("Reshape", [ctx, c["query_heads_t"]], f"{p}.context_heads")  # [Hq, 1, AR, Dh]
        ctx = a.op("Transpose", [ctx], f"{p}.context_t", perm=[1, 2, 0, 3])  # [1, AR, Hq, Dh]
        ctx = a.op("Reshape", [ctx, c["merge_heads"]], f"{p}.context_merged")
        return self._linear(a, ctx, f"{hf}.o_proj", f"{p}.o")

    def _block(self, a: _Author, x: ir.Value, i: int, c: dict[str, ir.Value]) -> ir.Value:
        p, hf = f"l{i}", f"model.layers.{i}"
        attn = self._attention(a, self._norm(a, x, f"{hf}.input_layernorm", f"{p}.norm1", c), i, c)
        x = a.op("Add", [x, attn], f"{p}.resid_attn")
        h = self._norm(a, x, f"{hf}.post_attention_layernorm", f"{p}.norm2", c)
        if self.config.mlp == "gelu_tanh":
            up = self._linear(a, h, f"{hf}.mlp.up_proj", f"{p}.mlp.up")
            gelu = self._gelu_tanh(a, up, f"{p}.mlp.gelu", c)
            return a.op("Add", [x, self._linear(a, gelu, f"{hf}.mlp.down_proj", f"{p}.mlp.down")], block_output(i))
        gate = self._linear(a, h, f"{hf}.mlp.gate_proj", f"{p}.mlp.gate")
        silu = a.op("Mul", [gate, a.op("Sigmoid", [gate], f"{p}.mlp.gate_sigmoid")], f"{p}.mlp.silu")
        up = self._linear(a, h, f"{hf}.mlp.up_proj", f"{p}.mlp.up")
        down = self._linear(a, a.op("Mul", [silu, up], f"{p}.mlp.swiglu"), f"{hf}.mlp.down_proj", f"{p}.mlp.down")
        return a.op("Add", [x, down], block_output(i))

    def _inputs(self, ar: int) -> list[ir.Value]:
        cfg, past = self.config, self.context - ar
        f32, i32 = ir.DataType.FLOAT, ir.DataType.INT32
        inputs = [ir.val(cv.INPUT_IDS, i32, [1, ar]), ir.val(cv.ATTENTION_MASK, f32, [1, 1, ar, self.context]),
                  ir.val(cv.POSITION_IDS, i32, [1, ar])]
        for i in range(cfg.layers):
            inputs += [ir.val(cv.past_key_in(i), f32, [cfg.kv_heads, 1, cfg.head_dim, past]),
                       ir.val(cv.past_value_in(i), f32, [cfg.kv_heads, 1, past, cfg.head_dim])]
        return inputs

    def _constants(self, a: _Author, inputs: list[ir.Value]) -> dict[str, ir.Value]:
        cfg, i64 = self.config, np.int64
        hq, hkv, dh = cfg.heads, cfg.kv_heads, cfg.head_dim
        c = {v.name: v for v in inputs}
        c |= {"eps_pad": a.const("const.rms_eps_pads", np.array([0, 0, 0, 0, 0, 1], i64)),
              "eps_value": a.const("const.rms_eps_value", np.array(math.sqrt(cfg.hidden * cfg.rms_eps), np.float32)),
              "hidden": a.const("const.hidden", np.array([cfg.hidden], i64)),
              "axis2": a.const("const.axis2", np.array([2], i64)),
              "scale": a.const("const.attn_scale", np.array(1.0 / math.sqrt(dh), np.float32)),
              "q_heads": a.const("const.q_heads_shape", np.array([1, -1, hq, dh], i64)),
              "kv_heads": a.const("const.kv_heads_shape", np.array([1, -1, hkv, dh], i64)),
              "merge_heads": a.const("const.merge_heads_shape", np.array([1, -1, hq * dh], i64)),
              "grouped_rows": a.const("const.grouped_rows_shape", np.array([hkv, 1, -1, dh], i64)),
              "grouped_scores": a.const("const.grouped_scores_shape", np.array([hkv, hq // hkv, -1, self.context], i64)),
              "grouped_rows_cl": a.const("const.grouped_rows_cl_shape", np.array([hkv, 1, -1, self.context], i64)),
              "query_heads_t": a.const("const.query_heads_t_shape", np.array([hq, 1, -1, dh], i64)),
              "zero": a.const("const.zero", np.array([0], i64)), "half": a.const("const.half_dim", np.array([dh // 2], i64)),
              "dh": a.const("const.head_dim", np.array([dh], i64)), "axis3": a.const("const.axis3", np.array([3], i64))}
        if cfg.mlp == "gelu_tanh":
            c |= {"gelu_cubic": a.const("const.gelu_cubic", np.array(0.044715, np.float32)),
                  "gelu_scale": a.const("const.gelu_scale", np.array(math.sqrt(2.0 / math.pi), np.float32)),
                  "half_one": a.const("const.half", np.array(0.5, np.float32)),
                  "one": a.const("const.one", np.array(1.0, np.float32))}
        if cfg.positions == "rope":  # cos/sin at the positions: [1, AR, 1, Dh], broadcast over heads
            c["cos"] = a.op("Gather", [a.const("rope.cos", self.cos), c[cv.POSITION_IDS]], "rope.cos_pos", axis=0)
            c["sin"] = a.op("Gather", [a.const("rope.sin_signed", self.sin), c[cv.POSITION_IDS]], "rope.sin_pos", axis=0)
        return c

    def build(self, ar: int) -> ir.Model:
        """Return the graph taking AR tokens per call (1 <= AR < context)."""
        cfg = self.config
        if not 1 <= ar < self.context:
            raise ModelError(f"prefill AR {ar}: must be at least 1 and below the context length {self.context}")
        a = _Author(ir.tape.Tape())
        inputs = self._inputs(ar)
        c = self._constants(a, inputs)
        learned = cfg.positions == "learned"
        x = a.op("Gather", [a.const("embed.weight", self.checkpoint.weight("model.embed_tokens.weight")),
                            c[cv.INPUT_IDS]], "embed.tokens" if learned else "embed.out", axis=0)
        if learned:  # the position table's first CL rows, gathered at the positions and added
            table = self.checkpoint.weight("model.embed_positions.weight")[:self.context]
            positions = a.op("Gather", [a.const("embed.positions_weight", table), c[cv.POSITION_IDS]],
                             "embed.positions", axis=0)
            x = a.op("Add", [x, positions], "embed.out")
        for i in range(cfg.layers):
            x = self._block(a, x, i, c)
        x = self._norm(a, x, "model.norm", "norm", c)
        head = "model.embed_tokens.weight" if cfg.tied_embeddings else "lm_head.weight"
        logits = a.op("MatMul", [x, a.const("lm_head.weight", self._matrix(head))], cv.LOGITS)
        outputs = [logits]
        logits.dtype, logits.shape = ir.DataType.FLOAT, ir.Shape([1, ar, cfg.vocab])
        by_name = {n.outputs[0].name: n.outputs[0] for n in a.tape.nodes}
        for i in range(cfg.layers):
            for name, shape in ((cv.past_key_out(i), [cfg.kv_heads, 1, cfg.head_dim, ar]),
                                (cv.past_value_out(i), [cfg.kv_heads, 1, ar, cfg.head_dim])):
                value = by_name[name]
                value.dtype, value.shape = ir.DataType.FLOAT, ir.Shape(shape)
                outputs.append(value)
        used = [v for v in a.tape.initializers if v.uses()]  # the constants of a block kind the config does not use go
        graph = ir.Graph(inputs, outputs, nodes=a.tape.nodes, initializers=used,
                         opset_imports={"": OPSET}, name=f"{cfg.architecture}_ar{ar}_cl{self.context}")
        return ir.Model(graph, ir_version=IR_VERSION, producer_name=PRODUCER, producer_version="1")

    def write(self, ar: int, path: Path) -> Path:
        """Write the AR-token graph to path (deterministic bytes, atomically), its weights in `<file>.data` beside
        it when they reach EXTERNAL_DATA_BYTES; return path."""
        model, path = self.build(ar), Path(path)
        if sum(v.const_value.nbytes for v in model.graph.initializers.values()) < EXTERNAL_DATA_BYTES:
            write_atomically(path, ir.to_proto(model).SerializeToString(deterministic=True))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            ir.save(model, path, external_data=f"{path.name}.data")
        return path


def build_graph(checkpoint: Checkpoint, context: int, ar: int) -> ir.Model:
    """Return one graph of the checkpoint's pair (AR tokens per call, context CL)."""
    return LlamaGraphs(checkpoint, context).build(ar)
