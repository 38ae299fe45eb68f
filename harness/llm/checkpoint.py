"""A published decoder checkpoint read into one typed form: a GGUF file (read with `gguf`) or a Hugging Face
directory (config.json, safetensors, tokenizer.json).

A :class:`Checkpoint` (harness.llm.importer.read_checkpoint reads one) holds the decoder's shape
(:class:`LlamaConfig`), the weights as float32 arrays under Hugging Face's Llama names ([out, in] matrices, Q/K
rows in Hugging Face's rotate-half order; GPT-2's mapped onto them by harness.llm.gpt2_names), and the tokenizer
as a `tokenizers` JSON with its chat template. Each bad input is a ModelError naming the file and the key: an
architecture the importer does not build, a quantization type the reader cannot dequantize, a directory without
config.json, a tokenizer whose vocabulary does not fit the embedding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.errors import ModelError

__all__ = ["ARCHITECTURES", "Checkpoint", "LlamaConfig", "check_tokenizer", "check_weights", "weight_names"]

# GGUF general.architecture or Hugging Face model_type -> the graph harness.llm.llama builds
ARCHITECTURES = ("llama", "mistral", "qwen2", "gpt2")
_SUPPORTED_TEXT = ("the Llama family: llama (Llama 2/3, SmolLM, TinyLlama), mistral, qwen2 (RMSNorm, RoPE, "
                   "grouped-query attention, SwiGLU); and gpt2 (LayerNorm, learned positions, GELU)")


@dataclass(frozen=True)
class LlamaConfig:
    """A decoder's dimensions and block kind: the Llama family's (the defaults) or GPT-2's (norm "layer",
    positions "learned", mlp "gelu_tanh")."""

    architecture: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    rms_eps: float  # the norms' epsilon (RMSNorm's, or LayerNorm's when norm is "layer")
    rope_theta: float
    tied_embeddings: bool
    max_positions: int
    rope_scaling: tuple[tuple[str, float | str], ...] = ()  # sorted (key, value) pairs of HF's rope_scaling
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    norm: str = "rms"  # "rms" (RMSNorm, weight only) or "layer" (LayerNorm with bias: GPT-2)
    positions: str = "rope"  # "rope" (rotary, rope_theta) or "learned" (an absolute position table: GPT-2)
    mlp: str = "swiglu"  # "swiglu" (gate, up, down) or "gelu_tanh" (up, GELU's tanh form, down, with biases: GPT-2)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's shape, float32 weights under Hugging Face names, and tokenizer."""

    path: Path
    config: LlamaConfig
    weights: dict[str, np.ndarray] = field(repr=False)
    tokenizer_json: str = field(repr=False)
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None

    def weight(self, name: str) -> np.ndarray:
        """Return the float32 weight `name`; ModelError naming the file and tensor when it is missing."""
        try:
            return self.weights[name]
        except KeyError:
            raise ModelError(f"{self.path}: no tensor '{name}' (a {self.config.architecture} checkpoint of "
                             f"{self.config.layers} blocks needs it)") from None


def weight_names(config: LlamaConfig) -> list[str]:
    """Return the Hugging Face names of every weight the graphs use (lm_head only when not tied)."""
    gpt2 = config.mlp == "gelu_tanh"
    norm = ["weight", "bias"] if config.norm == "layer" else ["weight"]
    names = [f"model.norm.{n}" for n in norm] + ["model.embed_tokens.weight"]
    names += ["model.embed_positions.weight"] if config.positions == "learned" else []
    names += [] if config.tied_embeddings else ["lm_head.weight"]
    for i in range(config.layers):
        p = f"model.layers.{i}"
        names += [f"{p}.{ln}.{n}" for ln in ("input_layernorm", "post_attention_layernorm") for n in norm]
        names += [f"{p}.self_attn.{n}_proj.weight" for n in "qkvo"]
        names += [f"{p}.mlp.{n}_proj.weight" for n in (("up", "down") if gpt2 else ("gate", "up", "down"))]
        if config.attention_bias:
            names += [f"{p}.self_attn.{n}_proj.bias" for n in "qkv"]
        if gpt2:  # GPT-2's output projection and MLP carry biases too
            names += [f"{p}.self_attn.o_proj.bias", f"{p}.mlp.up_proj.bias", f"{p}.mlp.down_proj.bias"]
    return names


def unsupported_architecture(path: Path, key: str, architecture: str) -> ModelError:
    """Return the error for an architecture out of the family, naming the file, key and what is supported."""
    return ModelError(f"{path}: {key} is '{architecture}', which the importer does not build; supported: "
                      f"{_SUPPORTED_TEXT}")


def check_tokenizer(path: Path, key: str, tokenizer_json: str, vocab: int) -> None:
    """Raise ModelError naming the file and key when the tokenizer does not load or its ids exceed the
    embedding's `vocab` rows."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(tokenizer_json)
    except Exception as e:  # tokenizers raises its own Exception type
        raise ModelError(f"{path}: the tokenizer ({key}) does not load: {str(e).splitlines()[0]}") from None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > vocab:
        raise ModelError(f"{path}: the tokenizer ({key}) has {size} tokens but the embedding has {vocab} rows: "
                         "the tokenizer does not belong to these weights")


def check_weights(checkpoint: Checkpoint, key_of: dict[str, str] | None = None) -> Checkpoint:
    """Return checkpoint after checking every weight is present with its expected shape (ModelError naming
    the file and the tensor, under its name in the file (`key_of`) when it differs)."""
    cfg, key_of = checkpoint.config, key_of or {}
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    shapes = {"model.embed_tokens.weight": (cfg.vocab, cfg.hidden), "lm_head.weight": (cfg.vocab, cfg.hidden),
              "model.norm.weight": (cfg.hidden,), "model.norm.bias": (cfg.hidden,),
              "model.embed_positions.weight": (cfg.max_positions, cfg.hidden)}
    per_layer = {"input_layernorm.weight": (cfg.hidden,), "post_attention_layernorm.weight": (cfg.hidden,),
                 "input_layernorm.bias": (cfg.hidden,), "post_attention_layernorm.bias": (cfg.hidden,),
                 "self_attn.q_proj.weight": (q, cfg.hidden), "self_attn.k_proj.weight": (kv, cfg.hidden),
                 "self_attn.v_proj.weight": (kv, cfg.hidden), "self_attn.o_proj.weight": (cfg.hidden, q),
                 "self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,),
                 "self_attn.o_proj.bias": (cfg.hidden,), "mlp.up_proj.bias": (cfg.ffn,), "mlp.down_proj.bias": (cfg.hidden,),
                 "mlp.gate_proj.weight": (cfg.ffn, cfg.hidden), "mlp.up_proj.weight": (cfg.ffn, cfg.hidden),
                 "mlp.down_proj.weight": (cfg.hidden, cfg.ffn)}
    for name in weight_names(cfg):
        want = shapes.get(name) or per_layer[name.split(".", 3)[3]]
        got = checkpoint.weight(name).shape
        if tuple(got) != want:
            raise ModelError(f"{checkpoint.path}: tensor '{key_of.get(name, name)}' has shape {list(got)}; the "
                             f"config's dimensions need {list(want)}")
    return checkpoint


def rope_scaling_items(scaling: dict | None) -> tuple[tuple[str, float | str], ...]:
    """Return a Hugging Face rope_scaling dict as sorted hashable items (() for none or the default type)."""
    kind = (scaling.get("rope_type") or scaling.get("type")) if scaling else None
    if kind in (None, "default"):
        return ()
    items = {k: v if isinstance(v, str) else float(v) for k, v in scaling.items()
             if isinstance(v, (str, int, float)) and not isinstance(v, bool) and k not in ("type", "rope_type",
                                                                                          "rope_theta")}
    return tuple(sorted({**items, "rope_type": str(kind)}.items()))


def json_file(path: Path, what: str) -> dict:
    """Return the JSON object in path; ModelError naming the file when it is missing or malformed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path.parent}: no {path.name} ({what})") from None
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a JSON object ({what})")
    return data
