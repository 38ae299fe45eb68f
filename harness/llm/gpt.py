"""A GPT-style decoder (pre-LayerNorm, learned absolute positions, exact GELU): its shape, weights and a
numpy reference forward pass.

The same weights are trained (harness.zoo.tiny_gpt), exported as Genie's graph pair (harness.llm.export)
and used as the float reference the exported graphs are checked against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

LN_EPS = 1e-5


@dataclass(frozen=True)
class GptConfig:
    """The model's dimensions and the graph pair's static shapes."""

    vocab: int = 1024
    context: int = 128  # CL: the KV cache holds context - ar entries of the past
    prefill_ar: int = 32  # AR-N of the prefill graph (the decode graph is AR-1)
    layers: int = 4
    heads: int = 4
    hidden: int = 128
    mlp: int = 512

    @property
    def head_dim(self) -> int:
        """Dh = hidden / heads."""
        return self.hidden // self.heads


@dataclass(frozen=True)
class LayerWeights:
    """One transformer block: x += attn(ln1(x)); x += mlp(ln2(x)). Matrices are [in, out]."""

    ln1_g: np.ndarray  # [D]
    ln1_b: np.ndarray  # [D]
    w_qkv: np.ndarray  # [D, 3D]: q, k, v, each [D] split into heads of Dh
    b_qkv: np.ndarray  # [3D]
    w_o: np.ndarray  # [D, D]
    b_o: np.ndarray  # [D]
    ln2_g: np.ndarray  # [D]
    ln2_b: np.ndarray  # [D]
    w_fc: np.ndarray  # [D, M]
    b_fc: np.ndarray  # [M]
    w_proj: np.ndarray  # [M, D]
    b_proj: np.ndarray  # [D]


@dataclass(frozen=True)
class GptWeights:
    """All parameters (float32)."""

    config: GptConfig
    tok_emb: np.ndarray  # [V, D]
    pos_emb: np.ndarray  # [CL, D]
    layers: tuple[LayerWeights, ...]
    lnf_g: np.ndarray  # [D]
    lnf_b: np.ndarray  # [D]
    lm_head: np.ndarray  # [D, V]

    def parameter_count(self) -> int:
        """Return the number of scalar parameters."""
        count = self.tok_emb.size + self.pos_emb.size + self.lnf_g.size + self.lnf_b.size + self.lm_head.size
        return int(count + sum(getattr(layer, f.name).size for layer in self.layers for f in fields(layer)))


def random_weights(config: GptConfig, seed: int = 0, scale: float = 0.02) -> GptWeights:
    """Return GPT-2-style initial weights (normal(0, scale), LayerNorm gains 1)."""
    rng = np.random.default_rng(seed)
    d, m = config.hidden, config.mlp

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    ones, zeros = (lambda n: np.ones(n, np.float32)), (lambda n: np.zeros(n, np.float32))
    proj_scale = scale / math.sqrt(2 * config.layers)
    layers = tuple(LayerWeights(ln1_g=ones(d), ln1_b=zeros(d), w_qkv=normal(d, 3 * d), b_qkv=zeros(3 * d),
                                w_o=(rng.standard_normal((d, d)) * proj_scale).astype(np.float32), b_o=zeros(d),
                                ln2_g=ones(d), ln2_b=zeros(d), w_fc=normal(d, m), b_fc=zeros(m),
                                w_proj=(rng.standard_normal((m, d)) * proj_scale).astype(np.float32),
                                b_proj=zeros(d))
                   for _ in range(config.layers))
    return GptWeights(config, tok_emb=normal(config.vocab, d), pos_emb=normal(config.context, d), layers=layers,
                      lnf_g=ones(d), lnf_b=zeros(d), lm_head=normal(d, config.vocab))


def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return LayerNormalization over the last axis (epsilon LN_EPS)."""
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LN_EPS) * g + b


def gelu(x: np.ndarray) -> np.ndarray:
    """Return the exact (erf) GELU, as PyTorch exports it."""
    from scipy.special import erf

    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype)


def forward(weights: GptWeights, ids: np.ndarray) -> np.ndarray:
    """Return logits [T, V] for one token sequence ids [T] (T <= context), with causal attention."""
    cfg = weights.config
    t = len(ids)
    if t > cfg.context:
        raise ValueError(f"{t} tokens exceed the context length {cfg.context}")
    x = weights.tok_emb[ids] + weights.pos_emb[:t]
    causal = np.triu(np.full((t, t), -np.inf, np.float32), k=1)
    for layer in weights.layers:
        h = layer_norm(x, layer.ln1_g, layer.ln1_b) @ layer.w_qkv + layer.b_qkv
        q, k, v = (h[:, i * cfg.hidden:(i + 1) * cfg.hidden].reshape(t, cfg.heads, cfg.head_dim).transpose(1, 0, 2)
                   for i in range(3))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(cfg.head_dim) + causal
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attn = (scores / scores.sum(-1, keepdims=True)) @ v  # [H, T, Dh]
        x = x + attn.transpose(1, 0, 2).reshape(t, cfg.hidden) @ layer.w_o + layer.b_o
        h = gelu(layer_norm(x, layer.ln2_g, layer.ln2_b) @ layer.w_fc + layer.b_fc)
        x = x + h @ layer.w_proj + layer.b_proj
    return (layer_norm(x, weights.lnf_g, weights.lnf_b) @ weights.lm_head).astype(np.float32)
