"""Genie bundles: the dialog config (genie_config.json), the HTP backend extensions and the folder holding both
with the context binaries and the tokenizer, as Qualcomm AI Hub's Genie bundles lay them out.

The keys are the ones Genie 1.21's config validation accepts (Dialog.cpp of the QAIRT Genie sources):
``dialog.context`` needs version, size, n-vocab, bos-token and eos-token (eot-token optional); ``QnnHtp`` needs
version, spill-fill-bufsize, mmap-budget, use-mmap, cpu-mask and poll; ``model.binary`` needs version and
ctx-bins. Unknown keys are refused by Genie (GENIE_STATUS_ERROR_JSON_SCHEMA). Learned from running it on the HTP
simulator: graphs with learned absolute positions need ``model.positional-encoding = {"type": "absolute"}``
(the default expects RoPE inputs); ``sampler.top-k = 1`` decodes greedily (``greedy: true`` alone still samples).

Paths inside the config are relative names: Genie resolves them from the process's working directory, so the
bundle folder is pushed to a device as a whole and run with cwd = the folder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.files import copy_atomically, write_atomically

__all__ = ["CONFIG_FILE", "EXTENSIONS_FILE", "NO_BOS", "TOKENIZER_FILE", "genie_config", "htp_backend_ext_config",
           "tokenizer_vocab_size", "write_bundle"]

CONFIG_FILE = "genie_config.json"
EXTENSIONS_FILE = "htp_backend_ext_config.json"
TOKENIZER_FILE = "tokenizer.json"
NO_BOS = -1  # bos-token is mandatory; -1 (no token has it) makes Genie prepend nothing to a prompt
PERF_PROFILES = ("burst", "sustained_high_performance", "high_performance", "balanced", "low_balanced",
                 "high_power_saver", "power_saver", "low_power_saver", "extreme_power_saver")


def genie_config(*, context_length: int, n_vocab: int, ctx_bins: Sequence[str], eot_id: int, kv_dim: int,
                 tokenizer: str = TOKENIZER_FILE, bos_id: int = NO_BOS,
                 stop_sequences: Sequence[str] = (), seed: int = 42, top_k: int = 1, temp: float = 1.0,
                 top_p: float = 1.0, max_num_tokens: int | None = None, extensions: str | None = EXTENSIONS_FILE,
                 n_threads: int = 1, use_mmap: bool = False, poll: bool = False, cpu_mask: str = "0x0",
                 positional_encoding: str = "absolute") -> dict[str, Any]:
    """Return a basic-dialog Genie config over QnnHtp context binaries (relative names, in graph order).

    eot_id is both the eos-token and the eot-token (generation stops after it); stop_sequences stop on text.
    kv_dim is the head dimension of the graphs' KV tensors (QnnHtp "kv-dim"; without it GenieDialog_create
    failed on this harness's 32-dim pair with GENIE_STATUS_ERROR_GENERAL and nothing logged).
    """
    if context_length < 2:
        raise ConfigError(f"context_length {context_length}: a dialog needs at least 2 tokens of context")
    if not ctx_bins:
        raise ConfigError("a Genie config needs at least one context binary")
    if not 0 <= eot_id < n_vocab:
        raise ConfigError(f"eot_id {eot_id} is not a token id of a {n_vocab}-token vocabulary")
    if top_k < 1:
        raise ConfigError(f"top_k {top_k}: must be at least 1 (1 decodes greedily)")
    if positional_encoding not in ("absolute", "rope", "alibi"):
        raise ConfigError(f"positional_encoding {positional_encoding!r}: Genie knows absolute, rope and alibi")
    if kv_dim < 1:
        raise ConfigError(f"kv_dim {kv_dim}: give the graphs' head dimension")
    htp: dict[str, Any] = {"version": 1, "use-mmap": use_mmap, "spill-fill-bufsize": 0, "mmap-budget": 0,
                           "poll": poll, "cpu-mask": cpu_mask, "kv-dim": int(kv_dim)}
    backend: dict[str, Any] = {"version": 1, "type": "QnnHtp", "QnnHtp": htp}
    if extensions:
        backend["extensions"] = extensions
    dialog: dict[str, Any] = {
        "version": 1,
        "type": "basic",
        "context": {"version": 1, "size": int(context_length), "n-vocab": int(n_vocab), "bos-token": int(bos_id),
                    "eos-token": int(eot_id), "eot-token": int(eot_id)},
        "sampler": {"version": 1, "seed": int(seed), "temp": float(temp), "top-k": int(top_k), "top-p": float(top_p)},
        "tokenizer": {"version": 1, "path": tokenizer},
        "engine": {"version": 1, "n-threads": int(n_threads), "backend": backend,
                   "model": {"version": 1, "type": "binary",
                             "binary": {"version": 1, "ctx-bins": list(ctx_bins)},
                             "positional-encoding": {"type": positional_encoding}}},
    }
    if stop_sequences:
        dialog["stop-sequence"] = list(stop_sequences)
    if max_num_tokens is not None:
        dialog["max-num-tokens"] = int(max_num_tokens)
    return {"dialog": dialog}


def htp_backend_ext_config(soc_model: int, dsp_arch: str | None, *, perf_profile: str = "burst",
                           rpc_control_latency_us: int = 100, weight_sharing: bool = False,
                           shared_buffers: bool = True) -> dict[str, Any]:
    """Return the QNN HTP backend extensions config AI Hub's bundles ship (htp_backend_ext_config.json).

    dsp_arch is "v75"-style (None leaves it out: the HTP derives it from soc_model, and warns when both are
    given that the arch is deprecated in favour of the SoC id). weight_sharing must match how the context
    binaries were compiled (the QNN EP's EP-context binaries of this harness share no weights).
    """
    if dsp_arch is not None and not (dsp_arch.startswith("v") and dsp_arch[1:].isdigit()):
        raise ConfigError(f"dsp_arch {dsp_arch!r}: expected the HTP arch as 'v' and a number, e.g. 'v75'")
    if perf_profile not in PERF_PROFILES:
        raise ConfigError(f"perf_profile {perf_profile!r}: expected one of {', '.join(PERF_PROFILES)}")
    device: dict[str, Any] = {"soc_model": int(soc_model)}
    if dsp_arch is not None:
        device["dsp_arch"] = dsp_arch
    device["cores"] = [{"core_id": 0, "perf_profile": perf_profile, "rpc_control_latency": int(rpc_control_latency_us)}]
    config: dict[str, Any] = {"devices": [device], "context": {"weight_sharing_enabled": bool(weight_sharing)}}
    if shared_buffers:
        config["memory"] = {"mem_type": "shared_buffer"}
    return config


def tokenizer_vocab_size(tokenizer: Path) -> int:
    """Return 1 + the largest token id of a Hugging Face tokenizer.json (its model vocab and added tokens)."""
    try:
        data = json.loads(Path(tokenizer).read_text(encoding="utf-8"))
        ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data.get("added_tokens", [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"tokenizer {tokenizer}: not a readable tokenizer.json with a model vocab "
                          f"({type(e).__name__}: {e})") from None
    return max(ids) + 1


def bundle_names(context_binaries: Sequence[Path]) -> list[str]:
    """Return the bundle's names of the binaries: their own when distinct, else part_<i>_of_<n>.bin."""
    names = [Path(p).name for p in context_binaries]
    if len(set(names)) == len(names) and TOKENIZER_FILE not in names:
        return names
    n = len(names)
    return [f"part_{i + 1}_of_{n}.bin" for i in range(n)]


def write_bundle(out_dir: Path, context_binaries: Sequence[Path], tokenizer: Path, *, context_length: int,
                 soc_model: int, dsp_arch: str | None, eot_id: int, kv_dim: int, n_vocab: int | None = None,
                 stop_sequences: Sequence[str] = (), seed: int = 42,
                 perf_profile: str = "burst", **config_options: Any) -> Path:
    """Write a Genie bundle into out_dir and return the path of its genie_config.json.

    The .bin files (prefill first, as Genie expects the graphs in order) and the tokenizer are copied in and
    named relatively (binaries with the same file name, as the QNN EP names every context model_ctx_qnn.bin,
    become part_<i>_of_<n>.bin); htp_backend_ext_config.json is written beside them. Every file is written
    atomically. n_vocab defaults to the tokenizer's size. config_options go to genie_config().
    """
    out_dir = Path(out_dir)
    binaries = [Path(p) for p in context_binaries]
    for p in binaries:
        if not p.is_file():
            raise ConfigError(f"context binary {p} not found: give the *_qnn.bin files the QNN EP wrote")
    if not Path(tokenizer).is_file():
        raise ConfigError(f"tokenizer {tokenizer} not found: give a Hugging Face tokenizer.json")
    vocab = n_vocab if n_vocab is not None else tokenizer_vocab_size(Path(tokenizer))
    names = bundle_names(binaries)
    config = genie_config(context_length=context_length, n_vocab=vocab, ctx_bins=names, eot_id=eot_id,
                          kv_dim=kv_dim, stop_sequences=stop_sequences, seed=seed, **config_options)
    extensions = htp_backend_ext_config(soc_model, dsp_arch, perf_profile=perf_profile)
    out_dir.mkdir(parents=True, exist_ok=True)
    for src, name in zip(binaries, names):
        copy_atomically(src, out_dir / name)
    copy_atomically(Path(tokenizer), out_dir / TOKENIZER_FILE)
    write_atomically(out_dir / EXTENSIONS_FILE, (json.dumps(extensions, indent=2) + "\n").encode())
    path = out_dir / CONFIG_FILE
    write_atomically(path, (json.dumps(config, indent=2) + "\n").encode())
    return path
