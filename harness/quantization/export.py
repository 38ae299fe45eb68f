"""Export: the encodings of a QDQ model, written as a QAIRT `--quantization_overrides` file (0.6.1 layout)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from harness.cache import ArtifactCache, content_key
from harness.quantization.encodings import BIAS_BITWIDTH, Encoding, Encodings

_QUANT_SUFFIX = "_quantized"  # onnxruntime's TENSOR_NAME_QUANT_SUFFIX
_QUANT_INPUT_SUFFIX = "_QuantizeLinear_Input"  # onnxruntime's name for a quantized graph output's producer
_BITS = {2: (8, False), 3: (8, True), 4: (16, False), 5: (16, True), 6: (32, True),
         21: (4, False), 22: (4, True)}  # onnx TensorProto elem type -> (bitwidth, signed)


def export_encodings(qdq_model: Path) -> Encodings:
    """Return the encodings of a QDQ model: one per quantized activation, per-channel lists for weights.

    Names are those of the float model the QDQ model was made from. A tensor converted between
    precisions (mixed precision) reports the encoding its producer writes.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(qdq_model))
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    activations: dict[str, list[Encoding]] = {}
    params: dict[str, list[Encoding]] = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear":
            source = node.input[0]
            if source in producers and producers[source].op_type == "DequantizeLinear":
                continue  # a precision conversion, not the tensor's own encoding
            name = source[: -len(_QUANT_INPUT_SUFFIX)] if source.endswith(_QUANT_INPUT_SUFFIX) else source
            if name not in activations:
                activations[name] = _encodings_of(inits, node, None, numpy_helper)
        elif node.op_type == "DequantizeLinear" and node.input[0] in inits:
            data = inits[node.input[0]]
            if _BITS.get(data.data_type, (0,))[0] == BIAS_BITWIDTH:
                continue
            name = node.input[0][: -len(_QUANT_SUFFIX)] if node.input[0].endswith(_QUANT_SUFFIX) else node.input[0]
            params[name] = _encodings_of(inits, node, data.data_type, numpy_helper)
    return Encodings(activations, params, str(qdq_model))


def _encodings_of(inits, node, data_type, numpy_helper) -> list[Encoding]:
    scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64).ravel()
    if len(node.input) > 2 and node.input[2]:
        zp_init = inits[node.input[2]]
        zero = numpy_helper.to_array(zp_init).astype(np.int64).ravel()
        data_type = zp_init.data_type
    else:
        zero = np.zeros_like(scale, dtype=np.int64)
        data_type = data_type or 2
    bits, signed = _BITS[data_type]
    zero = np.broadcast_to(zero, scale.shape)
    half = 2 ** (bits - 1)
    return [Encoding(bitwidth=bits, scale=float(s), offset=int(-(z + half) if signed else -z),
                     is_symmetric=bool((signed and z == 0) or (not signed and z == half)))
            for s, z in zip(scale, zero)]


def write_encodings(encodings: Encodings, path: Path) -> Path:
    """Write encodings as a QAIRT overrides JSON file; return path."""
    Path(path).write_text(json.dumps(encodings.to_json(), indent=2) + "\n")
    return Path(path)


def exported_encodings(qdq_model: Path, cache: ArtifactCache) -> Path:
    """Return the cached QAIRT overrides file exported from qdq_model."""
    def build(out: Path) -> None:
        write_encodings(export_encodings(qdq_model), out / "quantization_overrides.json")

    return cache.entry("encodings", content_key("encodings-v1", qdq_model), build).path / "quantization_overrides.json"
