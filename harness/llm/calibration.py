"""Quantizing a prefill/decode pair: calibration feeds from the float KV loop, and encodings both graphs share.

The two graphs exchange their KV cache (Genie writes a graph's past_*_out into the next call's past_*_in,
whichever graph makes it), so those tensors — and the attention mask and logits Genie reads and writes —
must have one encoding in both graphs. Each graph's internal activations are calibrated on its own feeds;
the weights are the same initializers in both, so MinMax gives them the same encodings anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.errors import ModelError
from harness.host_sessions import host_session_options
from harness.llm import convention
from harness.runner import llm_runner
from harness.steps.ptq import QuantRecipe

Feed = dict[str, np.ndarray]
QMAX = {"QUInt8": 255, "QUInt16": 65535}

# The recipes of the LLM path: weights x activations, as AI Hub names them.
LLM_RECIPES = {
    "w8a16": QuantRecipe(activation_type="QUInt16", weight_type="QUInt8", per_channel=False, label="llm"),
    "w8a8": QuantRecipe(activation_type="QUInt8", weight_type="QUInt8", per_channel=False, label="llm"),
    # 4-bit only where AI Hub's w4a16 puts it, the linear layers' weights (per output channel, symmetric);
    # LayerNorm parameters and embedding tables stay 8-bit (the HTP refuses a LayerNorm with 4-bit weights)
    "w4a16": QuantRecipe(activation_type="QUInt16", weight_type="QUInt8", per_channel=False, label="llm"),
}
FOUR_BIT_WEIGHTS = {"w4a16"}
KV_TYPES = {8: "QUInt8", 16: "QUInt16"}  # the KV cache's encoding by its width (the spec's llm.kv_bits)


def activation_bytes(recipe: str) -> int:
    """Return the bytes of one activation element under recipe."""
    return 2 if LLM_RECIPES[recipe].activation_type == "QUInt16" else 1


def kv_bytes_of(quantized: Path) -> int:
    """Return the bytes of one KV cache element in a quantized graph: the width of the encoding its first layer's
    past keys are quantized with (what the graph ships, whatever the recipe asked); raises ModelError when the
    graph quantizes no past_key_0_in."""
    import onnx

    model = onnx.load(str(quantized), load_external_data=False)
    zero_points = {i.name: i.data_type for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] == convention.past_key_in(0) and len(node.input) > 2:
            return 2 if zero_points.get(node.input[2]) in (onnx.TensorProto.UINT16, onnx.TensorProto.INT16) else 1
    raise ModelError(f"{quantized}: no QuantizeLinear on {convention.past_key_in(0)}: the KV cache is not quantized")


@dataclass
class PairCalibration:
    """Recorded float-loop calls of both graphs: (feed, outputs) pairs."""

    prefill: list[tuple[Feed, Feed]]
    decode: list[tuple[Feed, Feed]]

    def feeds(self, graph: str) -> list[Feed]:
        """Return the recorded feeds of 'prefill' or 'decode'."""
        return [feed for feed, _ in getattr(self, graph)]


class _Recording(llm_runner.Graph):
    """A host CPU graph that keeps a copy of every call's feed and outputs."""

    def __init__(self, path: Path, label: str) -> None:
        import onnxruntime as ort

        options = host_session_options()
        super().__init__(ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]), label)
        self.calls: list[tuple[Feed, Feed]] = []

    def run(self, feed):
        outs, elapsed = super().run(feed)
        self.calls.append(({k: v.copy() for k, v in feed.items()}, outs))
        return outs, elapsed


def calibrate_pair(prefill: Path, decode: Path, ids: np.ndarray, sequences: int = 8,
                   decode_every: int = 8) -> PairCalibration:
    """Return the float pair's calls on `sequences` spans of ids, teacher-forced through the KV loop as
    generation uses it: a prefill of 8..AR tokens from an empty cache (every other span then a second
    prefill chunk after it), then the decode graph one token at a time to the full context; every
    `decode_every`-th decode call is kept."""
    pre, dec = _Recording(prefill, "prefill"), _Recording(decode, "decode")
    loop = llm_runner.KvLoop(np, pre, dec)
    context, ar = loop.context, pre.ar
    if len(ids) < context:
        raise ValueError(f"calibration text of {len(ids)} tokens: need at least the context length {context}")
    starts = np.linspace(0, len(ids) - context, num=sequences).astype(np.int64)
    kept_decode: list[tuple[Feed, Feed]] = []
    for k, start in enumerate(starts):
        span = [int(t) for t in ids[start:start + context]]
        first = min(ar, 8 + k * max(1, (ar - 8) // max(1, sequences - 1)))
        loop.reset()
        dec.calls.clear()
        loop.prefill(span[:first])
        n = first
        if k % 2 == 1 and n + ar <= loop.slots:
            loop.prefill(span[n:n + ar])
            n += ar
        for token in span[n:context]:
            loop.decode(token)
        kept_decode += dec.calls[::decode_every]
    return PairCalibration(prefill=pre.calls, decode=kept_decode)


def _shared_names(pair: convention.PairInfo) -> list[str]:
    """The float tensors both graphs exchange with the runtime: the mask, the KV cache in and out, the logits."""
    names = [convention.ATTENTION_MASK, convention.LOGITS]
    for layer in range(pair.layers):
        names += [convention.past_key_in(layer), convention.past_key_out(layer),
                  convention.past_value_in(layer), convention.past_value_out(layer)]
    return names


def _kv_group(name: str) -> str:
    """past_key_3_in and past_key_3_out share one encoding (the cache holds what the outputs wrote)."""
    match = convention.KV_NAME.match(name)
    return f"past_{match.group(1)}_{match.group(2)}" if match else name


def shared_overrides(calibration: PairCalibration, pair: convention.PairInfo,
                     activation_type: str, kv_type: str | None = None) -> dict[str, list[dict]]:
    """Return tensor overrides (scale, zero point, type) giving the exchanged tensors one asymmetric MinMax
    encoding over both graphs' calls, a KV layer's input and output tied together; the KV cache's tensors of
    kv_type when given, the others (and without kv_type, those too) of activation_type."""
    ranges: dict[str, tuple[float, float]] = {}
    for feed, outs in calibration.prefill + calibration.decode:
        for name in _shared_names(pair):
            value = feed.get(name, outs.get(name))
            if value is None:
                continue
            group = _kv_group(name)
            lo, hi = ranges.get(group, (0.0, 0.0))
            ranges[group] = (min(lo, float(value.min())), max(hi, float(value.max())))
    overrides = {}
    for name in _shared_names(pair):
        quant_type = kv_type if kv_type is not None and convention.KV_NAME.match(name) else activation_type
        qmax = QMAX[quant_type]
        lo, hi = ranges[_kv_group(name)]
        scale = (hi - lo) / qmax if hi > lo else 1.0
        overrides[name] = [{"quant_type": quant_type, "scale": scale,
                            "zero_point": int(np.clip(round(-lo / scale), 0, qmax))}]
    return overrides


def linear_weight_overrides(float_model: Path, quant_type: str = "QInt4") -> dict[str, list[dict]]:
    """Return overrides making every Gemm/MatMul weight (a 2-D initializer as input B) `quant_type` (4-bit by
    default) symmetric per output channel (axis 1, or 0 for a Gemm with transB)."""
    import onnx

    model = onnx.load(str(float_model), load_external_data=False)
    inits = {i.name: len(i.dims) for i in model.graph.initializer}
    overrides = {}
    for node in model.graph.node:
        if node.op_type in ("Gemm", "MatMul") and inits.get(node.input[1]) == 2:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            overrides[node.input[1]] = [{"quant_type": quant_type, "symmetric": True, "axis": 0 if trans_b else 1}]
    return overrides


def pair_recipe(name: str, calibration: PairCalibration, pair: convention.PairInfo,
                float_model: Path, per_channel_weights: bool = False, kv_bits: int | None = None) -> QuantRecipe:
    """Return the recipe `name` (w8a16, w8a8, w4a16) with the pair's shared encodings as tensor overrides
    (and, for 4-bit weights, the linear layers' weights of float_model, the same names in both graphs; with
    per_channel_weights, 8-bit ones per output channel too, as a published checkpoint needs: SmolLM2's w8a16
    host perplexity was +27% over float with one scale per matrix, +3% with one per channel); with kv_bits, the
    KV cache's tensors (each layer's past keys and values in and out) encoded at that width (AI Hub ships its
    w4a16 LLMs with an 8-bit KV cache: half the cache's memory and bandwidth), label suffix `-kv8`/`-kv16`."""
    from dataclasses import replace

    base = LLM_RECIPES[name]
    kv_type = KV_TYPES[kv_bits] if kv_bits is not None else None
    overrides = shared_overrides(calibration, pair, base.activation_type, kv_type)
    label = f"llm-{name}" + (f"-kv{kv_bits}" if kv_type not in (None, base.activation_type) else "")
    if name in FOUR_BIT_WEIGHTS:
        overrides.update(linear_weight_overrides(float_model))
    elif per_channel_weights:
        overrides.update(linear_weight_overrides(float_model, "QInt8"))
    return replace(base, tensor_overrides=overrides, label=label)
