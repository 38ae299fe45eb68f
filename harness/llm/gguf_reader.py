"""Read a GGUF checkpoint (llama.cpp's format) with the `gguf` package: its metadata into a LlamaConfig, its
tensors dequantized to float32 under Hugging Face names, its GPT-2-style BPE tokenizer (vocabulary, merges,
special tokens, pre-tokenizer) rebuilt as a `tokenizers` JSON with the chat template beside it.

llama.cpp's converter permutes the rows of Q and K (its rotary pairs are interleaved) for the llama
architecture; they are permuted back to Hugging Face's rotate-half order here, so one graph serves both
sources. Qwen2 keeps Hugging Face's order (llama.cpp rotates it NeoX-style). GPT-2's config and tensors are
mapped by harness.llm.gpt2_names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.errors import ModelError
from harness.llm import gpt2_names
from harness.llm.checkpoint import (ARCHITECTURES, Checkpoint, LlamaConfig, check_tokenizer, check_weights,
                                    unsupported_architecture)

__all__ = ["read_gguf"]

_PERMUTED = ("llama", "mistral")  # architectures whose Q/K rows llama.cpp's converter interleaves
_LAYER_TENSORS = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
                  "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
                  "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
                  "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
                  "attn_v.bias": "self_attn.v_proj.bias", "ffn_gate.weight": "mlp.gate_proj.weight",
                  "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight"}
_TOP_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight", "rope_freqs.weight": "rope_freq_factors"}
# the pre-tokenizer regexes llama.cpp names in tokenizer.ggml.pre (llama-vocab.cpp), GPT-2's being the default
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
_DIGIT_SPLIT = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
_PRE = {"default": [_GPT2_SPLIT], "gpt2": [_GPT2_SPLIT], "gpt-2": [_GPT2_SPLIT], "llama-bpe": [_LLAMA3_SPLIT],
        "llama3": [_LLAMA3_SPLIT], "qwen2": [_QWEN2_SPLIT], **{p: [r"\p{N}", _GPT2_SPLIT] for p in _DIGIT_SPLIT}}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


def _reader(path: Path):
    """Return gguf's GGUFReader over path, slicing a plain ndarray view of its memmap: np.memmap's bookkeeping on
    every slice made parsing a 49k-token vocabulary and its merges (100k strings) take 10 s of the import."""
    import gguf

    class Reader(gguf.GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):
            data = self.__dict__.get("_plain")
            if data is None:
                data = self.__dict__["_plain"] = self.data.view(np.ndarray)
            count = int(count)
            arr = data[offset:offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    return Reader(str(path))


class _Fields:
    """A GGUF file's metadata, read by key with errors naming the file and key."""

    def __init__(self, path: Path, reader) -> None:
        self.path, self.reader = path, reader

    def get(self, key: str, default: object = ModelError) -> object:
        """Return the value under key; the default (or ModelError naming the key) when absent."""
        field = self.reader.fields.get(key)
        if field is None:
            if default is ModelError:
                raise ModelError(f"{self.path}: GGUF key '{key}' is missing (the importer needs it)")
            return default
        try:
            return field.contents()
        except Exception as e:  # gguf raises plain errors on malformed fields
            raise ModelError(f"{self.path}: GGUF key '{key}' is not readable ({type(e).__name__}: {e})") from None


def _config(f: _Fields, embedding_rows: int, tied: bool) -> LlamaConfig:
    """Return the LlamaConfig from the GGUF metadata."""
    arch = str(f.get("general.architecture"))
    if arch not in ARCHITECTURES:
        raise unsupported_architecture(f.path, "GGUF key 'general.architecture'", arch)
    if arch == "gpt2":
        return gpt2_names.gguf_config(f.path, f.get, embedding_rows)
    heads, hidden = int(f.get(f"{arch}.attention.head_count")), int(f.get(f"{arch}.embedding_length"))
    head_dim = int(f.get(f"{arch}.attention.key_length", hidden // heads))
    rope_dims = int(f.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ModelError(f"{f.path}: GGUF key '{arch}.rope.dimension_count' is {rope_dims}, below the head dim "
                         f"{head_dim}: partial rotary embeddings are not supported")
    scaling = str(f.get(f"{arch}.rope.scaling.type", "none"))
    if scaling not in ("none", "linear"):
        raise ModelError(f"{f.path}: GGUF key '{arch}.rope.scaling.type' is '{scaling}'; the importer reads "
                         "none and linear (llama3 scaling through the rope_freqs tensor)")
    rope_scaling = (("factor", float(f.get(f"{arch}.rope.scaling.factor"))), ("rope_type", "linear")) \
        if scaling == "linear" else ()
    return LlamaConfig(
        architecture=arch, vocab=embedding_rows, hidden=hidden, layers=int(f.get(f"{arch}.block_count")),
        heads=heads, kv_heads=int(f.get(f"{arch}.attention.head_count_kv", heads)), head_dim=head_dim,
        ffn=int(f.get(f"{arch}.feed_forward_length")),
        rms_eps=float(f.get(f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_theta=float(f.get(f"{arch}.rope.freq_base", 10000.0)), tied_embeddings=tied,
        max_positions=int(f.get(f"{arch}.context_length", 2048)), rope_scaling=rope_scaling,
        attention_bias=arch == "qwen2")


def _hf_name(gguf_name: str, arch: str) -> str | None:
    """Return the Hugging Face name of a GGUF tensor (None for one the graphs do not use)."""
    if arch == "gpt2":
        return gpt2_names.gguf_name(gguf_name)
    if gguf_name in _TOP_TENSORS:
        return _TOP_TENSORS[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}"
    return None


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Return Q or K rows [heads * Dh, ...] from llama.cpp's interleaved rotary order back to rotate-half."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(path: Path, reader, arch: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Return the used tensors dequantized to float32 [numpy order] by HF name, and their GGUF names."""
    from gguf import quants

    weights, key_of = {}, {}
    for t in reader.tensors:
        name = _hf_name(t.name, arch)
        if name is None:
            continue
        try:
            values = quants.dequantize(t.data, t.tensor_type)
        except (NotImplementedError, ValueError) as e:
            raise ModelError(f"{path}: tensor '{t.name}' is of quantization type {t.tensor_type.name}, which the "
                             f"importer cannot dequantize ({type(e).__name__}: {e}); requantize the model to "
                             "Q4_0/Q4_1/Q5_x/Q8_0, a K-quant or F16") from None
        weights[name] = np.ascontiguousarray(values.reshape(tuple(int(d) for d in reversed(t.shape))),
                                             dtype=np.float32)
        key_of[name] = t.name
    return weights, key_of


def _pre_tokenizer(f: _Fields):
    """Return the byte-level pre-tokenizer llama.cpp uses for tokenizer.ggml.pre."""
    from tokenizers import Regex, pre_tokenizers

    pre = str(f.get("tokenizer.ggml.pre", "default"))
    if pre not in _PRE:
        raise ModelError(f"{f.path}: GGUF key 'tokenizer.ggml.pre' is '{pre}', a pre-tokenizer the importer does "
                         f"not know; known: {', '.join(sorted(_PRE))}")
    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in _PRE[pre]]
    return pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _tokenizer_json(f: _Fields) -> tuple[str, list[str]]:
    """Return the byte-level BPE tokenizer in the GGUF metadata as a tokenizers JSON, and its tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = str(f.get("tokenizer.ggml.model"))
    if kind != "gpt2":
        raise ModelError(f"{f.path}: GGUF key 'tokenizer.ggml.model' is '{kind}'; the importer rebuilds byte-level "
                         "BPE tokenizers ('gpt2'); for a SentencePiece model use its Hugging Face directory "
                         "(tokenizer.json)")
    tokens = [str(t) for t in f.get("tokenizer.ggml.tokens")]
    merges = [tuple(str(m).split(" ", 1)) for m in f.get("tokenizer.ggml.merges", [])]
    types = list(f.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                     fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(f)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, k in zip(tokens, types) if k == _CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, k in zip(tokens, types) if k == _USER_DEFINED])
    bos = f.get("tokenizer.ggml.bos_token_id", None)
    if bool(f.get("tokenizer.ggml.add_bos_token", False)) and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tokens[int(bos)]} $A", pair=f"{tokens[int(bos)]} $A $B", special_tokens=[(tokens[int(bos)], int(bos))])
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer.to_str(), tokens


def read_gguf(path: Path) -> Checkpoint:
    """Return the GGUF checkpoint at path (ModelError naming the file and key when it cannot be imported)."""
    try:
        reader = _reader(path)
    except Exception as e:  # gguf raises ValueError and others on a damaged file
        raise ModelError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    f = _Fields(path, reader)
    arch = str(f.get("general.architecture"))
    if arch not in ARCHITECTURES:
        raise unsupported_architecture(path, "GGUF key 'general.architecture'", arch)
    weights, key_of = _tensors(path, reader, arch)
    if "model.embed_tokens.weight" not in weights:
        raise ModelError(f"{path}: no tensor 'token_embd.weight' (the token embedding)")
    config = _config(f, weights["model.embed_tokens.weight"].shape[0], "lm_head.weight" not in weights)
    if arch == "gpt2":
        gpt2_names.from_gguf(path, weights, key_of, config)
    if arch in _PERMUTED:
        for name in [n for n in weights if n.endswith(("q_proj.weight", "k_proj.weight"))]:
            weights[name] = _unpermute(weights[name], config.heads if "q_proj" in name else config.kv_heads)
    tokenizer_json, tokens = _tokenizer_json(f)
    check_tokenizer(path, "GGUF key 'tokenizer.ggml.tokens'", tokenizer_json, config.vocab)

    def token(key: str) -> str | None:
        value = f.get(key, None)
        return tokens[int(value)] if value is not None and 0 <= int(value) < len(tokens) else None

    checkpoint = Checkpoint(path, config, weights, tokenizer_json, chat_template=f.get("tokenizer.chat_template", None),
                            bos_token=token("tokenizer.ggml.bos_token_id"), eos_token=token("tokenizer.ggml.eos_token_id"))
    return check_weights(checkpoint, key_of)
