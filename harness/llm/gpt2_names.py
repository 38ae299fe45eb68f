"""GPT-2 checkpoints onto the importer's one form: a Hugging Face GPT-2 config (n_embd, n_layer, ...) or a GGUF's
`gpt2.*` keys into a LlamaConfig of GPT-2's kind (LayerNorm with bias, learned absolute positions, GELU in its
tanh form, tied lm_head), and GPT-2's tensors under the Llama names harness.llm.llama builds from.

Hugging Face stores GPT-2's projections as Conv1D weights, [in, out] (the transpose of a Linear's [out, in]),
with Q, K and V fused in c_attn ([D, 3D]); llama.cpp's converter writes them transposed to [out, in] (attn_qkv
[3D, D]) and duplicates the tied token embedding as output.weight. Both are split and laid out as Linear
weights here; lm_head stays tied to the token embedding, as GPT-2 (and transformers' GGUF loader) has it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from harness.errors import ModelError
from harness.llm.checkpoint import LlamaConfig

__all__ = ["from_gguf", "from_hf", "gguf_config", "gguf_name", "hf_config"]

# GPT-2's GELU as Hugging Face names it: the tanh approximation (gelu_new is GPT-2's own); exact-erf "gelu" is not it
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
_HF_LAYER = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.c_proj": "self_attn.o_proj",
             "mlp.c_fc": "mlp.up_proj", "mlp.c_proj": "mlp.down_proj"}
_GGUF_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_output": "self_attn.o_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_GGUF_TOP = {"token_embd.weight": "model.embed_tokens.weight", "position_embd.weight": "model.embed_positions.weight",
             "output_norm.weight": "model.norm.weight", "output_norm.bias": "model.norm.bias"}


def _config(vocab: int, hidden: int, layers: int, heads: int, ffn: int | None, eps: float, positions: int) -> LlamaConfig:
    """Return the LlamaConfig of a GPT-2 of these dimensions."""
    return LlamaConfig(architecture="gpt2", vocab=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=heads,
                       head_dim=hidden // heads, ffn=ffn or 4 * hidden, rms_eps=eps, rope_theta=0.0,
                       tied_embeddings=True, max_positions=positions, attention_bias=True, norm="layer",
                       positions="learned", mlp="gelu_tanh")


def hf_config(file: Path, data: dict) -> LlamaConfig:
    """Return the LlamaConfig of a Hugging Face GPT-2 config.json (ModelError naming the file and key for a
    variant the graph does not build)."""
    def need(key: str) -> int | float:
        if key not in data:
            raise ModelError(f"{file}: key '{key}' is missing (a gpt2 config needs it)")
        return data[key]

    activation = data.get("activation_function", "gelu_new")
    if activation not in TANH_GELU:
        raise ModelError(f"{file}: key 'activation_function' is '{activation}'; the importer builds GPT-2's tanh "
                         f"GELU ({', '.join(TANH_GELU)})")
    for key, default in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                         ("reorder_and_upcast_attn", False)):
        if bool(data.get(key, default)) != default:
            raise ModelError(f"{file}: key '{key}' is {data[key]}; the importer builds GPT-2's attention with "
                             f"{key} = {default}")
    if data.get("tie_word_embeddings", True) is False:
        raise ModelError(f"{file}: key 'tie_word_embeddings' is false; the importer builds GPT-2 with lm_head tied to "
                         "the token embedding")
    hidden, heads = int(need("n_embd")), int(need("n_head"))
    return _config(int(need("vocab_size")), hidden, int(need("n_layer")), heads, data.get("n_inner"),
                   float(data.get("layer_norm_epsilon", 1e-5)), int(need("n_positions")))


def from_hf(weights: dict[str, np.ndarray], config: LlamaConfig) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Return a Hugging Face GPT-2's tensors (with or without the `transformer.` prefix) under the Llama names,
    Conv1D weights transposed to [out, in] and c_attn split into Q, K, V; and each name's tensor in the file."""
    prefix = "transformer." if "transformer.wte.weight" in weights else ""
    out, key_of = {}, {}

    def put(name: str, file_name: str, value: Callable[[np.ndarray], np.ndarray]) -> None:
        if file_name in weights:
            out[name], key_of[name] = np.ascontiguousarray(value(weights[file_name]), dtype=np.float32), file_name

    put("model.embed_tokens.weight", f"{prefix}wte.weight", lambda w: w)
    put("model.embed_positions.weight", f"{prefix}wpe.weight", lambda w: w)
    for n in ("weight", "bias"):
        put(f"model.norm.{n}", f"{prefix}ln_f.{n}", lambda w: w)
    d = config.hidden
    for i in range(config.layers):
        src, dst = f"{prefix}h.{i}", f"model.layers.{i}"
        for hf, ours in _HF_LAYER.items():
            conv = hf not in ("ln_1", "ln_2")
            put(f"{dst}.{ours}.weight", f"{src}.{hf}.weight", (lambda w: w.T) if conv else (lambda w: w))
            put(f"{dst}.{ours}.bias", f"{src}.{hf}.bias", lambda w: w)
        for k, part in enumerate("qkv"):  # c_attn [D, 3D] (Conv1D) -> q/k/v [D, D] as Linear weights
            put(f"{dst}.self_attn.{part}_proj.weight", f"{src}.attn.c_attn.weight", lambda w, k=k: w[:, k * d:(k + 1) * d].T)
            put(f"{dst}.self_attn.{part}_proj.bias", f"{src}.attn.c_attn.bias", lambda w, k=k: w[k * d:(k + 1) * d])
    return out, key_of


def gguf_config(path: Path, get: Callable[[str], object], vocab: int) -> LlamaConfig:
    """Return the LlamaConfig of a GGUF of architecture gpt2 (its `gpt2.*` keys, read by `get`)."""
    hidden, heads = int(get("gpt2.embedding_length")), int(get("gpt2.attention.head_count"))
    if hidden % heads:
        raise ModelError(f"{path}: GGUF key 'gpt2.embedding_length' ({hidden}) is not a multiple of "
                         f"'gpt2.attention.head_count' ({heads})")
    return _config(vocab, hidden, int(get("gpt2.block_count")), heads, int(get("gpt2.feed_forward_length")),
                   float(get("gpt2.attention.layer_norm_epsilon")), int(get("gpt2.context_length")))


def gguf_name(gguf_name: str) -> str | None:
    """Return the Llama name of a gpt2 GGUF tensor (blk.N.attn_qkv.* as self_attn.qkv_proj.*, split by from_gguf);
    None for one the graphs do not use (output.weight: GPT-2's lm_head is the token embedding)."""
    if gguf_name in _GGUF_TOP:
        return _GGUF_TOP[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk":
        if parts[2] == "attn_qkv":
            return f"model.layers.{parts[1]}.self_attn.qkv_proj.{parts[3]}"
        if parts[2] in _GGUF_LAYER:
            return f"model.layers.{parts[1]}.{_GGUF_LAYER[parts[2]]}.{parts[3]}"
    return None


def from_gguf(path: Path, weights: dict[str, np.ndarray], key_of: dict[str, str], config: LlamaConfig) -> None:
    """Split each fused qkv_proj ([3D, D] rows q, k, v, as llama.cpp writes attn_qkv) into q/k/v_proj, in place."""
    d = config.hidden
    for name in [n for n in weights if ".self_attn.qkv_proj." in n]:
        fused = weights.pop(name)
        if fused.shape[0] != 3 * d:
            raise ModelError(f"{path}: tensor '{key_of[name]}' has {fused.shape[0]} rows; GPT-2 of hidden size {d} needs "
                             f"{3 * d} (Q, K and V)")
        for k, part in enumerate("qkv"):
            split = name.replace(".qkv_proj.", f".{part}_proj.")
            weights[split], key_of[split] = np.ascontiguousarray(fused[k * d:(k + 1) * d]), key_of[name]
