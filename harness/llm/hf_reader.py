"""Read a Hugging Face checkpoint directory: config.json into a LlamaConfig, *.safetensors (with `safetensors`)
into float32 arrays (GPT-2's mapped by harness.llm.gpt2_names), tokenizer.json as it is and the chat template
from tokenizer_config.json or chat_template.jinja."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from harness.errors import ModelError
from harness.llm import gpt2_names
from harness.llm.checkpoint import (ARCHITECTURES, Checkpoint, LlamaConfig, check_tokenizer, check_weights, json_file,
                                    rope_scaling_items, unsupported_architecture)

__all__ = ["read_hf"]


def _config(path: Path) -> LlamaConfig:
    """Return the LlamaConfig of config.json in the directory path."""
    file = path / "config.json"
    data = json_file(file, "the model's config: a Hugging Face checkpoint directory needs config.json")
    arch = str(data.get("model_type"))
    if arch not in ARCHITECTURES:
        raise unsupported_architecture(file, "key 'model_type'", arch)
    if arch == "gpt2":
        return gpt2_names.hf_config(file, data)

    def need(key: str) -> int | float:
        if key not in data:
            raise ModelError(f"{file}: key '{key}' is missing (a {arch} config needs it)")
        return data[key]

    rope = data.get("rope_parameters") or {}
    heads, hidden = int(need("num_attention_heads")), int(need("hidden_size"))
    return LlamaConfig(
        architecture=arch, vocab=int(need("vocab_size")), hidden=hidden, layers=int(need("num_hidden_layers")),
        heads=heads, kv_heads=int(data.get("num_key_value_heads") or heads),
        head_dim=int(data.get("head_dim") or hidden // heads), ffn=int(need("intermediate_size")),
        rms_eps=float(need("rms_norm_eps")),
        rope_theta=float(data.get("rope_theta") or rope.get("rope_theta") or 10000.0),
        tied_embeddings=bool(data.get("tie_word_embeddings", False)),
        max_positions=int(data.get("max_position_embeddings", 2048)),
        rope_scaling=rope_scaling_items(data.get("rope_scaling") or rope),
        attention_bias=arch == "qwen2" or bool(data.get("attention_bias", False)))


def _bf16(file: Path, names: list[str]) -> dict[str, np.ndarray]:
    """Return the BF16 tensors `names` of a safetensors file as float32 (numpy has no bfloat16)."""
    with open(file, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    data = np.memmap(file, dtype=np.uint8, mode="r", offset=8 + size)
    out = {}
    for name in names:
        begin, end = header[name]["data_offsets"]
        bits = np.frombuffer(data[begin:end].tobytes(), dtype="<u2").astype(np.uint32) << 16
        out[name] = bits.view(np.float32).reshape(header[name]["shape"])
    return out


def _weights(path: Path) -> dict[str, np.ndarray]:
    """Return every tensor of the directory's *.safetensors files as float32."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{path}: no *.safetensors file (the weights of a Hugging Face checkpoint directory)")
    weights: dict[str, np.ndarray] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="numpy") as f:
                bf16 = [n for n in f.keys() if f.get_slice(n).get_dtype() == "BF16"]
                weights |= {n: np.asarray(f.get_tensor(n), dtype=np.float32) for n in f.keys() if n not in bf16}
            weights |= _bf16(file, bf16)
        except ModelError:
            raise
        except Exception as e:  # safetensors raises SafetensorError and others
            raise ModelError(f"{file}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    return weights


def _token(value: object) -> str | None:
    """Return a tokenizer_config token entry (a string or {content: ...}) as its text."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_hf(path: Path) -> Checkpoint:
    """Return the Hugging Face checkpoint in directory path (ModelError naming the file and key otherwise)."""
    config = _config(path)
    tokenizer_file = path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ModelError(f"{path}: no tokenizer.json (the tokenizer of a Hugging Face checkpoint directory)")
    tokenizer_json = tokenizer_file.read_text(encoding="utf-8")
    check_tokenizer(tokenizer_file, "model.vocab", tokenizer_json, config.vocab)
    extra = json_file(path / "tokenizer_config.json", "") if (path / "tokenizer_config.json").is_file() else {}
    template = extra.get("chat_template")
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    weights, key_of = _weights(path), {}
    if config.architecture == "gpt2":
        weights, key_of = gpt2_names.from_hf(weights, config)
    if config.tied_embeddings:
        weights.pop("lm_head.weight", None)
    checkpoint = Checkpoint(path, config, weights, tokenizer_json, chat_template=template if isinstance(template, str) else None,
                            bos_token=_token(extra.get("bos_token")), eos_token=_token(extra.get("eos_token")))
    return check_weights(checkpoint, key_of)
