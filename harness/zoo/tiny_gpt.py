"""``tiny_gpt``: the built-in small language model, trained in pure numpy on Python's own documentation.

The LLM path needs a decoder whose generations mean something, built without downloading anything:
this one learns the text of CPython's ``pydoc_data.topics`` (the help() topics, ~79 documents,
~465k characters) and is scored on topics it never saw.

Data
    The topics are sorted by name; every ``HELDOUT_EVERY``-th one (index 0, 10, 20, ...) is held out,
    the rest is training text.  Each split is its topics' texts in sorted order, each followed by
    ``EOT_TOKEN`` (documents are separated by end-of-text, GPT-2 style).
Tokenizer
    Byte-level BPE (GPT-2 pre-tokenizer regex, no prefix space, byte-level decoder), vocabulary
    ``VOCAB_SIZE`` = 1024, trained with Hugging Face ``tokenizers`` on the training topics only.
    ``EOT_TOKEN`` ("<|endoftext|>") is its only special token and has id ``EOT_ID`` = 0; ids 1..256 are
    the 256 byte symbols, so any text round-trips through encode/decode.  Saved as ``tokenizer.json``.
Model
    :class:`harness.llm.gpt.GptConfig` defaults (4 pre-LN blocks, 4 heads, hidden 128, MLP 512,
    context 128, untied lm_head: 1.07 M parameters).  The training forward here keeps activations for
    its hand-written backward but computes the same function as :func:`harness.llm.gpt.forward`, which
    is what every evaluation uses.
Training
    Random windows of ``SEQ_LEN`` tokens from the training ids, batches of ``BATCH_SIZE``, softmax
    cross-entropy, AdamW (decoupled weight decay on matrices and embeddings) with linear warmup and
    cosine decay, global gradient-norm clipping.  Deterministic: float32 throughout, all randomness
    from one ``np.random.default_rng(seed)``, BLAS pinned to one thread while training.

Bundle (:func:`build_bundle`): ``tokenizer.json``, ``weights.npz``, ``heldout.txt``, ``prompts.json``
and ``summary.json`` (written last), each written atomically.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import platform
import time
import zipfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
from scipy.special import erf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from harness.llm.gpt import LN_EPS, GptConfig, GptWeights, LayerWeights, forward, random_weights
from harness.files import write_atomically, write_text_atomically
from harness.zoo.digits_cnn import _single_blas_thread

__all__ = [
    "BATCH_SIZE",
    "DEFAULT_STEPS",
    "EOT_ID",
    "EOT_TOKEN",
    "HELDOUT_EVERY",
    "INPUT_NAMES",
    "SEQ_LEN",
    "TEXT_SOURCE",
    "VOCAB_SIZE",
    "TinyGptSummary",
    "TrainingSummary",
    "batch_forward",
    "build_bundle",
    "encode",
    "load_weights",
    "loss_and_grads",
    "perplexity",
    "prompts",
    "save_weights",
    "split_topics",
    "text_splits",
    "train",
    "train_tokenizer",
    "unigram_perplexity",
]

# The graph inputs of the exported pair (harness.llm.export), for --input-shape/--freeze-input routing.
INPUT_NAMES = ("input_ids", "attention_mask", "position_ids",
               *(f"past_{kv}_{layer}_in" for layer in range(GptConfig().layers) for kv in ("key", "value")))
TEXT_SOURCE = "pydoc_data.topics"
EOT_TOKEN = "<|endoftext|>"
EOT_ID = 0
VOCAB_SIZE = 1024
HELDOUT_EVERY = 10
SPLIT_RULE = f"topics sorted by name; index % {HELDOUT_EVERY} == 0 held out, the rest trains"
PROMPT_MIN_TOKENS = 8
PROMPT_MAX_TOKENS = 24

DEFAULT_STEPS = 600
BATCH_SIZE = 16
SEQ_LEN = 128
LEARNING_RATE = 3e-3
WARMUP_STEPS = 30
MIN_LR_FRACTION = 0.1
WEIGHT_DECAY = 0.1
GRAD_CLIP_NORM = 1.0
ADAM_BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
FINAL_LOSS_STEPS = 20  # TrainingSummary.final_loss averages the last this many steps

_F32 = np.float32
_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)

Params = dict[str, np.ndarray]


# --------------------------------------------------------------------------- text and tokenizer


def split_topics() -> tuple[list[str], list[str]]:
    """Return (training topic names, held-out topic names), each sorted; every 10th sorted topic is held out."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    heldout = [n for i, n in enumerate(names) if i % HELDOUT_EVERY == 0]
    return [n for i, n in enumerate(names) if i % HELDOUT_EVERY != 0], heldout


def _topic_texts(names: list[str]) -> list[str]:
    from pydoc_data.topics import topics

    return [topics[name] for name in names]


def text_splits() -> tuple[str, str]:
    """Return (training text, held-out text): each split's topics in sorted order, each followed by EOT_TOKEN."""
    train_names, heldout_names = split_topics()
    return tuple("".join(t + EOT_TOKEN for t in _topic_texts(names)) for names in (train_names, heldout_names))


def train_tokenizer() -> Tokenizer:
    """Return the byte-level BPE tokenizer (vocab 1024, EOT_TOKEN = id 0) trained on the training topics."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=[EOT_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_topic_texts(split_topics()[0]), trainer=trainer)
    if tokenizer.get_vocab_size() != VOCAB_SIZE or tokenizer.token_to_id(EOT_TOKEN) != EOT_ID:
        raise RuntimeError(f"tokenizer has {tokenizer.get_vocab_size()} tokens and EOT id "
                           f"{tokenizer.token_to_id(EOT_TOKEN)}, expected {VOCAB_SIZE} and {EOT_ID}")
    return tokenizer


def encode(tokenizer: Tokenizer, text: str) -> np.ndarray:
    """Return the token ids of ``text`` as int64 [N] (EOT_TOKEN in the text becomes EOT_ID)."""
    return np.asarray(tokenizer.encode(text).ids, dtype=np.int64)


def _prompt_of(tokenizer: Tokenizer, text: str) -> str:
    """Return the longest prefix of ``text`` ending with a whole word that encodes to <= PROMPT_MAX_TOKENS."""
    best = ""
    for i in range(1, len(text)):
        if not (text[i].isspace() and not text[i - 1].isspace()):
            continue
        if len(tokenizer.encode(text[:i]).ids) > PROMPT_MAX_TOKENS:
            break
        best = text[:i]
    if len(tokenizer.encode(best).ids) < PROMPT_MIN_TOKENS:
        raise ValueError(f"no prompt of {PROMPT_MIN_TOKENS}-{PROMPT_MAX_TOKENS} tokens at the start of {text[:40]!r}")
    return best


def prompts(tokenizer: Tokenizer | None = None) -> list[str]:
    """Return two prompts per held-out topic (16 of them; greedy agreement on fewer than 12 cannot show 0.75,
    see harness.stats.floored): the topic's start and the start of its first paragraph past the middle, whole
    words, 8-24 tokens each."""
    tokenizer = tokenizer or train_tokenizer()
    found = []
    for text in _topic_texts(split_topics()[1]):
        middle = text.find("\n\n", len(text) // 2)
        if middle < 0:  # no paragraph past the middle: the first whole word there
            middle = len(text) // 2 + len(text[len(text) // 2:].split(maxsplit=1)[0])
        found += [_prompt_of(tokenizer, text), _prompt_of(tokenizer, text[middle:].lstrip())]
    return found


# --------------------------------------------------------------------------- parameters

_LAYER_FIELDS = tuple(f.name for f in fields(LayerWeights))
_TOP_FIELDS = ("tok_emb", "pos_emb", "lnf_g", "lnf_b", "lm_head")


def _to_params(weights: GptWeights) -> Params:
    """Flatten weights into {"tok_emb": ..., "layers.0.w_qkv": ..., ...} (the arrays themselves, not copies)."""
    params = {name: getattr(weights, name) for name in _TOP_FIELDS}
    for i, layer in enumerate(weights.layers):
        params.update({f"layers.{i}.{name}": getattr(layer, name) for name in _LAYER_FIELDS})
    return params


def _from_params(config: GptConfig, params: Params) -> GptWeights:
    layers = tuple(LayerWeights(**{name: params[f"layers.{i}.{name}"] for name in _LAYER_FIELDS})
                   for i in range(config.layers))
    return GptWeights(config, layers=layers, **{name: params[name] for name in _TOP_FIELDS})


def _decays(name: str, value: np.ndarray) -> bool:
    """Weight decay applies to matrices and embeddings, not to biases and LayerNorm parameters."""
    return value.ndim == 2


# --------------------------------------------------------------------------- forward and backward


@dataclass
class _NormCache:
    xhat: np.ndarray  # [B, T, D]
    std: np.ndarray  # [B, T, 1]


@dataclass
class _BlockCache:
    ln1: _NormCache
    a: np.ndarray  # ln1 output [B, T, D]
    q: np.ndarray  # [B, H, T, Dh]
    k: np.ndarray
    v: np.ndarray
    p: np.ndarray  # attention probabilities [B, H, T, T]
    o: np.ndarray  # attention output, heads merged [B, T, D]
    ln2: _NormCache
    c: np.ndarray  # ln2 output [B, T, D]
    u: np.ndarray  # fc pre-activation [B, T, M]
    e: np.ndarray  # erf(u / sqrt 2)
    g: np.ndarray  # gelu(u)


def _norm_forward(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, _NormCache]:
    """LayerNorm as harness.llm.gpt.layer_norm computes it; also return what the backward needs."""
    xc = x - x.mean(-1, keepdims=True)
    std = np.sqrt((xc**2).mean(-1, keepdims=True) + LN_EPS)
    xhat = xc / std
    return xhat * g + b, _NormCache(xhat, std)


def _norm_backward(dy: np.ndarray, cache: _NormCache, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (dx, dg, db) of LayerNorm."""
    d = dy.shape[-1]
    dxhat = dy * g
    dx = (dxhat - dxhat.mean(-1, keepdims=True) - cache.xhat * (dxhat * cache.xhat).mean(-1, keepdims=True)) / cache.std
    return dx, (dy * cache.xhat).reshape(-1, d).sum(0), dy.reshape(-1, d).sum(0)


def _split_heads(h: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[B, T, 3D] -> q, k, v each [B, H, T, Dh] (q, k, v are consecutive D-column blocks, heads within)."""
    b, t, d3 = h.shape
    qkv = h.reshape(b, t, 3, heads, d3 // (3 * heads)).transpose(2, 0, 3, 1, 4)
    return qkv[0], qkv[1], qkv[2]


def _merge_heads(x: np.ndarray) -> np.ndarray:
    """[B, H, T, Dh] -> [B, T, H * Dh]."""
    b, h, t, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * dh)


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return x @ w + b


def _block_forward(x: np.ndarray, p: Params, prefix: str, cfg: GptConfig,
                   causal: np.ndarray) -> tuple[np.ndarray, _BlockCache]:
    """One pre-LN block on x [B, T, D], as harness.llm.gpt.forward computes it."""
    a, ln1 = _norm_forward(x, p[prefix + "ln1_g"], p[prefix + "ln1_b"])
    q, k, v = _split_heads(_linear(a, p[prefix + "w_qkv"], p[prefix + "b_qkv"]), cfg.heads)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(cfg.head_dim) + causal
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    o = _merge_heads(probs @ v)
    x = x + _linear(o, p[prefix + "w_o"], p[prefix + "b_o"])
    c, ln2 = _norm_forward(x, p[prefix + "ln2_g"], p[prefix + "ln2_b"])
    u = _linear(c, p[prefix + "w_fc"], p[prefix + "b_fc"])
    e = erf(u / _SQRT_2).astype(u.dtype)
    g = 0.5 * u * (1.0 + e)
    x = x + _linear(g, p[prefix + "w_proj"], p[prefix + "b_proj"])
    return x, _BlockCache(ln1, a, q, k, v, probs, o, ln2, c, u, e, g)


def _linear_backward(dy: np.ndarray, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (dx, dw, db) of y = x @ w + b for x [B, T, I]."""
    dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
    return dy @ w.T, x2.T @ dy2, dy2.sum(0)


def _attention_backward(do: np.ndarray, cache: _BlockCache, cfg: GptConfig) -> np.ndarray:
    """Return d(qkv pre-split) [B, T, 3D] from d(attention output) [B, T, D]."""
    b, t, d = do.shape
    do = do.reshape(b, t, cfg.heads, cfg.head_dim).transpose(0, 2, 1, 3)
    dp = do @ cache.v.transpose(0, 1, 3, 2)
    dv = cache.p.transpose(0, 1, 3, 2) @ do
    ds = cache.p * (dp - (dp * cache.p).sum(-1, keepdims=True)) / math.sqrt(cfg.head_dim)
    dq, dk = ds @ cache.k, ds.transpose(0, 1, 3, 2) @ cache.q
    return np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(b, t, 3 * d)


def _block_backward(dx: np.ndarray, cache: _BlockCache, p: Params, prefix: str, cfg: GptConfig,
                    grads: Params) -> np.ndarray:
    """Accumulate the block's parameter gradients into ``grads``; return d(block input)."""
    dg, grads[prefix + "w_proj"], grads[prefix + "b_proj"] = _linear_backward(dx, cache.g, p[prefix + "w_proj"])
    du = dg * (0.5 * (1.0 + cache.e) + cache.u * np.exp(-0.5 * cache.u * cache.u) * _INV_SQRT_2PI)
    dc, grads[prefix + "w_fc"], grads[prefix + "b_fc"] = _linear_backward(du, cache.c, p[prefix + "w_fc"])
    dn, grads[prefix + "ln2_g"], grads[prefix + "ln2_b"] = _norm_backward(dc, cache.ln2, p[prefix + "ln2_g"])
    dx = dx + dn
    do, grads[prefix + "w_o"], grads[prefix + "b_o"] = _linear_backward(dx, cache.o, p[prefix + "w_o"])
    dh = _attention_backward(do, cache, cfg)
    da, grads[prefix + "w_qkv"], grads[prefix + "b_qkv"] = _linear_backward(dh, cache.a, p[prefix + "w_qkv"])
    dn, grads[prefix + "ln1_g"], grads[prefix + "ln1_b"] = _norm_backward(da, cache.ln1, p[prefix + "ln1_g"])
    return dx + dn


@dataclass
class _Activations:
    ids: np.ndarray  # [B, T]
    blocks: list[_BlockCache]
    lnf: _NormCache
    f: np.ndarray  # final LN output [B, T, D]
    logits: np.ndarray  # [B, T, V]


def _forward(p: Params, cfg: GptConfig, ids: np.ndarray) -> _Activations:
    b, t = ids.shape
    if t > cfg.context:
        raise ValueError(f"{t} tokens exceed the context length {cfg.context}")
    x = p["tok_emb"][ids] + p["pos_emb"][:t]
    causal = np.triu(np.full((t, t), -np.inf, x.dtype), k=1)
    blocks = []
    for i in range(cfg.layers):
        x, cache = _block_forward(x, p, f"layers.{i}.", cfg, causal)
        blocks.append(cache)
    f, lnf = _norm_forward(x, p["lnf_g"], p["lnf_b"])
    return _Activations(ids, blocks, lnf, f, f @ p["lm_head"])


def _cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Return (mean softmax cross-entropy, d loss / d logits) for logits [B, T, V] and targets [B, T]."""
    v = logits.shape[-1]
    flat, tgt = logits.reshape(-1, v), targets.reshape(-1)
    shifted = flat - flat.max(-1, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(-1, keepdims=True)
    rows = np.arange(tgt.size)
    loss = float(np.mean(np.log(total[:, 0]) - shifted[rows, tgt], dtype=np.float64))
    dlogits = exp / total
    dlogits[rows, tgt] -= 1.0
    dlogits *= dlogits.dtype.type(1.0 / tgt.size)
    return loss, dlogits.reshape(logits.shape)


def _backward(p: Params, cfg: GptConfig, acts: _Activations, dlogits: np.ndarray) -> Params:
    grads: Params = {}
    d = cfg.hidden
    grads["lm_head"] = acts.f.reshape(-1, d).T @ dlogits.reshape(-1, cfg.vocab)
    dx, grads["lnf_g"], grads["lnf_b"] = _norm_backward(dlogits @ p["lm_head"].T, acts.lnf, p["lnf_g"])
    for i in reversed(range(cfg.layers)):
        dx = _block_backward(dx, acts.blocks[i], p, f"layers.{i}.", cfg, grads)
    t = acts.ids.shape[1]
    grads["pos_emb"] = np.zeros_like(p["pos_emb"])
    grads["pos_emb"][:t] = dx.sum(0)
    grads["tok_emb"] = np.zeros_like(p["tok_emb"])
    np.add.at(grads["tok_emb"], acts.ids.reshape(-1), dx.reshape(-1, d))
    return grads


def _loss_and_grads(p: Params, cfg: GptConfig, inputs: np.ndarray, targets: np.ndarray) -> tuple[float, Params]:
    acts = _forward(p, cfg, inputs)
    loss, dlogits = _cross_entropy(acts.logits, targets)
    return loss, _backward(p, cfg, acts, dlogits)


def batch_forward(weights: GptWeights, ids: np.ndarray) -> np.ndarray:
    """Return logits [B, T, V] for a batch of sequences ids [B, T]: the training forward (same function as gpt.forward)."""
    return _forward(_to_params(weights), weights.config, np.asarray(ids)).logits


def loss_and_grads(weights: GptWeights, inputs: np.ndarray, targets: np.ndarray) -> tuple[float, GptWeights]:
    """Return (mean next-token cross-entropy of inputs [B, T] against targets [B, T], its gradient as GptWeights)."""
    loss, grads = _loss_and_grads(_to_params(weights), weights.config, np.asarray(inputs), np.asarray(targets))
    return loss, _from_params(weights.config, grads)


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainingSummary:
    """How :func:`train` ran. Everything but ``wall_s`` is deterministic for a seed and settings."""

    seed: int
    steps: int
    batch_size: int
    seq_len: int
    learning_rate: float
    warmup_steps: int
    weight_decay: float
    train_tokens: int  # tokens in the training ids
    tokens_seen: int  # steps * batch_size * seq_len
    initial_loss: float  # first step's batch loss (nats / token)
    final_loss: float  # mean batch loss of the last FINAL_LOSS_STEPS steps (nats / token)
    losses: tuple[float, ...]  # every step's batch loss
    wall_s: float


def learning_rate_at(step: int, steps: int, peak: float = LEARNING_RATE, warmup: int = WARMUP_STEPS) -> float:
    """Return the learning rate of 0-based ``step``: linear warmup to ``peak``, then cosine decay to 10% of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (MIN_LR_FRACTION + (1.0 - MIN_LR_FRACTION) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _clip(grads: Params, max_norm: float) -> None:
    """Scale all gradients in place so their global L2 norm is at most ``max_norm``."""
    norm = math.sqrt(sum(float(np.sum(np.square(g), dtype=np.float64)) for g in grads.values()))
    if norm > max_norm:
        scale = _F32(max_norm / norm)
        for g in grads.values():
            g *= scale


class _AdamW:
    """AdamW over a parameter dict, float32 state, updating the parameters in place."""

    def __init__(self, params: Params, weight_decay: float) -> None:
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.weight_decay = weight_decay
        self.t = 0

    def step(self, params: Params, grads: Params, lr: float) -> None:
        self.t += 1
        b1, b2 = ADAM_BETAS
        step_size = _F32(lr * math.sqrt(1.0 - b2**self.t) / (1.0 - b1**self.t))
        for k, g in grads.items():
            m, v, p = self.m[k], self.v[k], params[k]
            m *= _F32(b1)
            m += _F32(1.0 - b1) * g
            v *= _F32(b2)
            v += _F32(1.0 - b2) * (g * g)
            if _decays(k, p):
                p *= _F32(1.0 - lr * self.weight_decay)
            p -= step_size * m / (np.sqrt(v) + _F32(ADAM_EPS))


def _sample_batch(ids: np.ndarray, rng: np.random.Generator, batch_size: int,
                  seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (inputs, targets) [batch_size, seq_len]: random windows and the same windows shifted by one."""
    starts = rng.integers(0, ids.size - seq_len, size=batch_size)
    index = starts[:, None] + np.arange(seq_len)
    return ids[index], ids[index + 1]


def train(config: GptConfig, train_ids: np.ndarray, seed: int = 0, steps: int = DEFAULT_STEPS, *,
          batch_size: int = BATCH_SIZE, seq_len: int = SEQ_LEN, learning_rate: float = LEARNING_RATE,
          warmup_steps: int = WARMUP_STEPS, weight_decay: float = WEIGHT_DECAY) -> tuple[GptWeights, TrainingSummary]:
    """Train a GPT of ``config`` on ``train_ids`` [N] (int token ids) deterministically for ``seed``.

    Returns (float32 weights, TrainingSummary).  The same arguments always give identical weights.
    """
    train_ids = np.asarray(train_ids, dtype=np.int64)
    if steps < 1 or not 1 <= seq_len <= config.context or train_ids.size <= seq_len:
        raise ValueError(f"need steps >= 1 (got {steps}), 1 <= seq_len <= {config.context} (got {seq_len}) "
                         f"and more than seq_len training tokens (got {train_ids.size})")
    if train_ids.min() < 0 or train_ids.max() >= config.vocab:
        raise ValueError(f"token ids must be in [0, {config.vocab})")
    rng = np.random.default_rng(seed)
    params = {k: v.copy() for k, v in _to_params(random_weights(config, seed=int(rng.integers(2**31)))).items()}
    optimizer = _AdamW(params, weight_decay)
    losses: list[float] = []
    started = time.perf_counter()
    with _single_blas_thread():
        for step in range(steps):
            inputs, targets = _sample_batch(train_ids, rng, batch_size, seq_len)
            loss, grads = _loss_and_grads(params, config, inputs, targets)
            _clip(grads, GRAD_CLIP_NORM)
            optimizer.step(params, grads, learning_rate_at(step, steps, learning_rate, warmup_steps))
            losses.append(loss)
    wall_s = time.perf_counter() - started
    summary = TrainingSummary(seed=seed, steps=steps, batch_size=batch_size, seq_len=seq_len,
                              learning_rate=learning_rate, warmup_steps=warmup_steps, weight_decay=weight_decay,
                              train_tokens=int(train_ids.size), tokens_seen=steps * batch_size * seq_len,
                              initial_loss=losses[0], final_loss=float(np.mean(losses[-FINAL_LOSS_STEPS:])),
                              losses=tuple(losses), wall_s=wall_s)
    return _from_params(config, params), summary


# --------------------------------------------------------------------------- evaluation


def _nll_sum(logits: np.ndarray, targets: np.ndarray) -> float:
    """Return the summed negative log-likelihood (nats, float64) of targets [T] under logits [T, V]."""
    z = logits.astype(np.float64)
    z -= z.max(-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-log_probs[np.arange(targets.size), targets].sum())


def perplexity(weights: GptWeights, ids: np.ndarray, window: int = 128) -> float:
    """Return exp(mean NLL) of ids[1:] under harness.llm.gpt.forward over non-overlapping windows.

    Window w feeds ids[s:s+w] and scores ids[s+1:s+w+1] for s = 0, w, 2w, ...: every token but the
    first is scored once, seeing the 0..w-1 tokens before it in its window.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if not 1 <= window <= weights.config.context or ids.size < 2:
        raise ValueError(f"need 1 <= window <= {weights.config.context} (got {window}) and >= 2 ids")
    total = 0.0
    for start in range(0, ids.size - 1, window):
        inputs = ids[start:min(start + window, ids.size - 1)]
        total += _nll_sum(forward(weights, inputs), ids[start + 1:start + 1 + inputs.size])
    return math.exp(total / (ids.size - 1))


def unigram_perplexity(train_ids: np.ndarray, ids: np.ndarray, vocab: int) -> float:
    """Return the perplexity of ids[1:] under add-one-smoothed unigram frequencies of train_ids (the baseline)."""
    counts = np.bincount(np.asarray(train_ids), minlength=vocab).astype(np.float64) + 1.0
    log_probs = np.log(counts / counts.sum())
    return math.exp(-float(log_probs[np.asarray(ids)[1:]].mean()))


# --------------------------------------------------------------------------- files


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """Return an .npz archive of ``arrays`` with fixed member timestamps (same arrays, same bytes)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), member.getvalue())
    return buffer.getvalue()


def save_weights(weights: GptWeights, path: Path) -> None:
    """Write weights (and their config, as JSON under "config") to ``path`` as .npz, atomically, byte-reproducibly."""
    arrays = {"config": np.array(json.dumps(asdict(weights.config), sort_keys=True))}
    arrays.update(_to_params(weights))
    write_atomically(Path(path), _npz_bytes(arrays))


def load_weights(path: Path) -> GptWeights:
    """Return the GptWeights stored by :func:`save_weights` at ``path`` (exact arrays and config)."""
    with np.load(Path(path), allow_pickle=False) as archive:
        config = GptConfig(**json.loads(archive["config"].item()))
        return _from_params(config, {name: archive[name] for name in archive.files if name != "config"})


@dataclass(frozen=True)
class TinyGptSummary:
    """What :func:`build_bundle` trained, measured and wrote (also written as summary.json)."""

    out_dir: Path
    files: tuple[str, ...]  # names inside out_dir
    seed: int
    parameters: int
    vocab: int
    eot_token: str
    eot_id: int
    train_tokens: int
    heldout_tokens: int
    training: TrainingSummary
    train_loss: float  # = training.final_loss (nats / token)
    heldout_perplexity: float  # window 128 (the full context)
    heldout_perplexity_w32: float  # window 32 (the prefill graph's AR)
    unigram_heldout_perplexity: float  # baseline: add-one unigram of the training ids
    text_source: str
    text_sha256: str  # of train text + held-out text
    split_rule: str
    train_topics: int
    heldout_topics: int

    def as_json(self) -> dict:
        """Return the summary as JSON-ready data (per-step losses left out)."""
        data = asdict(self)
        data["out_dir"] = str(self.out_dir)
        data["training"].pop("losses")
        return data


def build_bundle(out_dir: Path, seed: int = 0, steps: int = DEFAULT_STEPS) -> TinyGptSummary:
    """Train tiny_gpt and write tokenizer.json, weights.npz, heldout.txt, prompts.json, then summary.json.

    Each file is written atomically (temp file + rename); summary.json comes last, so its presence
    means the bundle is complete.  Returns the TinyGptSummary that summary.json holds.
    """
    out_dir = Path(out_dir)
    tokenizer = train_tokenizer()
    train_text, heldout_text = text_splits()
    train_ids, heldout_ids = encode(tokenizer, train_text), encode(tokenizer, heldout_text)
    config = GptConfig(vocab=tokenizer.get_vocab_size())
    weights, training = train(config, train_ids, seed=seed, steps=steps)
    train_names, heldout_names = split_topics()
    summary = TinyGptSummary(
        out_dir=out_dir, files=("tokenizer.json", "weights.npz", "heldout.txt", "prompts.json", "summary.json"),
        seed=seed, parameters=weights.parameter_count(), vocab=config.vocab, eot_token=EOT_TOKEN, eot_id=EOT_ID,
        train_tokens=int(train_ids.size), heldout_tokens=int(heldout_ids.size), training=training,
        train_loss=training.final_loss, heldout_perplexity=perplexity(weights, heldout_ids, 128),
        heldout_perplexity_w32=perplexity(weights, heldout_ids, 32),
        unigram_heldout_perplexity=unigram_perplexity(train_ids, heldout_ids, config.vocab),
        text_source=f"{TEXT_SOURCE} (CPython {platform.python_version()})",
        text_sha256=hashlib.sha256((train_text + heldout_text).encode("utf-8")).hexdigest(),
        split_rule=SPLIT_RULE, train_topics=len(train_names), heldout_topics=len(heldout_names))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out_dir / "tokenizer.json", tokenizer.to_str(pretty=True))
    save_weights(weights, out_dir / "weights.npz")
    write_text_atomically(out_dir / "heldout.txt", heldout_text)
    write_text_atomically(out_dir / "prompts.json", json.dumps(prompts(tokenizer), indent=2, ensure_ascii=False) + "\n")
    write_text_atomically(out_dir / "summary.json", json.dumps(summary.as_json(), indent=2, sort_keys=True) + "\n")
    return summary
