"""QAIRT / AIMET quantization encodings: export them from a QDQ model, import them as quantization overrides.

The file format is the one `qairt-converter --quantization_overrides`, `qnn-onnx-converter
--quantization_overrides` and AIMET's `QuantizationSimModel.export` use (AIMET encoding spec 0.6.1)::

    {"version": "0.6.1",
     "activation_encodings": {"<tensor>": [{"bitwidth": 8, "dtype": "int", "is_symmetric": "False",
                                             "min": -2.1, "max": 2.6, "offset": -114, "scale": 0.0185}]},
     "param_encodings": {"<initializer>": [<one encoding, or one per output channel>]}}

QNN dequantizes as ``real = (q + offset) * scale`` with ``q`` in ``[0, 2**bitwidth - 1]``, so for an
unsigned ONNX type ``offset = -zero_point`` and for a signed one ``offset = -(zero_point + 2**(bitwidth-1))``
(a symmetric signed 8-bit weight has offset -128). Bias encodings (32-bit) are not exported: QAIRT
and onnxruntime both derive them as input scale × weight scale.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.cache import ArtifactCache, content_key
from harness.errors import ConfigError

FORMAT_VERSION = "0.6.1"
ACTIVATION_BITWIDTHS = (8, 16)
PARAM_BITWIDTHS = (4, 8, 16)
BIAS_BITWIDTH = 32
VALID_BITWIDTHS = (4, 8, 16, 32)
_QUANT_SUFFIX = "_quantized"  # onnxruntime's TENSOR_NAME_QUANT_SUFFIX
_QUANT_INPUT_SUFFIX = "_QuantizeLinear_Input"  # onnxruntime's name for a quantized graph output's producer
_PER_CHANNEL_AXIS = {"Conv": 0, "ConvTranspose": 1}
_REMOVABLE_ACTIVATIONS = {"Relu", "Clip"}  # onnxruntime's QDQ quantizer folds these into their producer


@dataclass(frozen=True)
class Encoding:
    """One QNN encoding: real = (q + offset) * scale, q unsigned of `bitwidth` bits."""

    bitwidth: int
    scale: float
    offset: int
    is_symmetric: bool = False
    dtype: str = "int"

    @property
    def min(self) -> float:
        """The smallest representable real value."""
        return self.offset * self.scale

    @property
    def max(self) -> float:
        """The largest representable real value."""
        return (2 ** self.bitwidth - 1 + self.offset) * self.scale

    def to_json(self) -> dict[str, Any]:
        """Return the encoding as a QAIRT/AIMET JSON entry."""
        return {"bitwidth": self.bitwidth, "dtype": self.dtype, "is_symmetric": str(self.is_symmetric),
                "max": float(self.max), "min": float(self.min), "offset": int(self.offset),
                "scale": float(self.scale)}


@dataclass(frozen=True)
class Encodings:
    """Activation and parameter encodings by tensor name; `source` says where they came from."""

    activations: dict[str, list[Encoding]] = field(default_factory=dict)
    params: dict[str, list[Encoding]] = field(default_factory=dict)
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return the QAIRT `--quantization_overrides` document."""
        return {"version": FORMAT_VERSION,
                "activation_encodings": {k: [e.to_json() for e in v] for k, v in self.activations.items()},
                "param_encodings": {k: [e.to_json() for e in v] for k, v in self.params.items()}}


# --------------------------------------------------------------------------------------------- parsing

def load_encodings(path: Path) -> Encodings:
    """Return the encodings in a QAIRT/AIMET overrides file; raise ConfigError naming the file and entry."""
    path = Path(path).expanduser()
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON: {e.msg} "
                          f"(line {e.lineno}, column {e.colno})") from None
    return parse_encodings(data, str(path))


def parse_encodings(data: Any, source: str) -> Encodings:
    """Return validated Encodings from a parsed overrides document; raise ConfigError naming the entry."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object with 'activation_encodings' and/or "
                          f"'param_encodings', got {type(data).__name__}")
    unknown = sorted(set(data) - {"version", "activation_encodings", "param_encodings", "quantizer_args"})
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {', '.join(unknown)} (expected "
                          "'activation_encodings', 'param_encodings', 'version', 'quantizer_args')")
    if "activation_encodings" not in data and "param_encodings" not in data:
        raise ConfigError(f"{source}: neither 'activation_encodings' nor 'param_encodings' is present")
    groups = {}
    for group, kind in (("activation_encodings", "activation"), ("param_encodings", "param")):
        entries = data.get(group, {})
        if not isinstance(entries, dict):
            raise ConfigError(f"{source}: '{group}' must map tensor names to lists of encodings")
        groups[kind] = {name: _parse_entry(value, f"{source}: {group}['{name}']", kind)
                        for name, value in entries.items()}
    return Encodings(groups["activation"], groups["param"], source)


def _parse_entry(value: Any, where: str, kind: str) -> list[Encoding]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(i, dict) for i in items):
        raise ConfigError(f"{where}: expected a non-empty list of encoding objects")
    if kind == "activation" and len(items) != 1:
        raise ConfigError(f"{where}: {len(items)} encodings given; an activation takes exactly one "
                          "(per-channel encodings are for parameters)")
    return [_parse_encoding(item, f"{where}[{i}]" if len(items) > 1 else where, kind)
            for i, item in enumerate(items)]


def _parse_encoding(item: dict, where: str, kind: str) -> Encoding:
    dtype = str(item.get("dtype", "int")).lower()
    if dtype not in {"int", "float"}:
        raise ConfigError(f"{where}: dtype '{item.get('dtype')}' is not 'int' or 'float'")
    bitwidth = item.get("bitwidth", item.get("bw"))
    if isinstance(bitwidth, bool) or not isinstance(bitwidth, int) or bitwidth not in VALID_BITWIDTHS:
        raise ConfigError(f"{where}: bitwidth {bitwidth!r} is impossible (one of {', '.join(map(str, VALID_BITWIDTHS))})")
    if dtype == "float":
        raise ConfigError(f"{where}: dtype 'float' (float fallback) cannot be expressed in a QDQ model for "
                          "the HTP; give an int encoding or remove the entry")
    allowed = ACTIVATION_BITWIDTHS if kind == "activation" else (*PARAM_BITWIDTHS, BIAS_BITWIDTH)
    if bitwidth not in allowed:
        raise ConfigError(f"{where}: bitwidth {bitwidth} is not supported for {kind}s on the HTP "
                          f"(use {' or '.join(map(str, allowed))})")
    symmetric = _parse_bool(item.get("is_symmetric", item.get("is_sym", False)), where)
    scale, offset = item.get("scale"), item.get("offset")
    if scale is None or offset is None:
        lo, hi = item.get("min"), item.get("max")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lo, hi)):
            raise ConfigError(f"{where}: needs 'scale' and 'offset', or 'min' and 'max'")
        if not hi > lo:
            raise ConfigError(f"{where}: max {hi} must be greater than min {lo}")
        scale = (hi - lo) / (2 ** bitwidth - 1)
        offset = round(lo / scale)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ConfigError(f"{where}: scale {scale!r} must be a positive finite number")
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or offset != int(offset):
        raise ConfigError(f"{where}: offset {offset!r} must be an integer")
    offset = int(offset)
    if bitwidth != BIAS_BITWIDTH and not -(2 ** bitwidth - 1) <= offset <= 0:
        raise ConfigError(f"{where}: offset {offset} is outside [-{2 ** bitwidth - 1}, 0] for {bitwidth}-bit "
                          "(QNN's offset is minus the zero point)")
    return Encoding(bitwidth=bitwidth, scale=float(scale), offset=offset, is_symmetric=symmetric)


def _parse_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {"true", "false"}:
        return value.lower() == "true"
    raise ConfigError(f"{where}: is_symmetric {value!r} must be \"True\" or \"False\"")


# ----------------------------------------------------------------------------- import as overrides

@dataclass(frozen=True)
class OverridesPlan:
    """Encodings translated to onnxruntime tensor overrides (JSON-friendly), plus what was skipped."""

    tensor_overrides: dict[str, list[dict[str, Any]]]
    skipped: list[str]


def to_tensor_overrides(encodings: Encodings, float_model: Path,
                        default_activation_type: str = "QUInt8") -> OverridesPlan:
    """Return onnxruntime tensor overrides (scale/zero_point/quant_type) for encodings on float_model.

    A tensor whose bitwidth differs from the default activation type and whose consumer produces an
    output of another bitwidth gets a `convert` to that bitwidth for that consumer (QAIRT inserts a
    Convert op there; onnxruntime's mixed-precision fixer would otherwise give the consumer the
    tensor's bitwidth). Raises ConfigError naming tensors the model does not have, activations given
    as parameters (or the reverse) and per-channel lists whose length does not match the weight.
    """
    import onnx

    model = onnx.load(str(float_model), load_external_data=False)
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    activations = {i.name for i in model.graph.input if i.name not in inits}
    activations |= {o for n in model.graph.node for o in n.output if o}
    consumers: dict[str, str] = {}
    consumer_nodes: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, n.op_type)
            consumer_nodes.setdefault(i, []).append(n)
    where = encodings.source or "quantization overrides"
    unknown = [f"activation '{n}'" for n in encodings.activations if n not in activations and n not in inits]
    unknown += [f"param '{n}'" for n in encodings.params if n not in inits and n not in activations]
    if unknown:
        raise ConfigError(f"{where}: {len(unknown)} tensor(s) not in the model {float_model.name}: "
                          f"{', '.join(unknown[:10])}{' ...' if len(unknown) > 10 else ''}")
    misplaced = [f"'{n}' is a parameter (move it to param_encodings)" for n in encodings.activations if n in inits]
    misplaced += [f"'{n}' is an activation (move it to activation_encodings)"
                  for n in encodings.params if n not in inits]
    if misplaced:
        raise ConfigError(f"{where}: {'; '.join(misplaced)}")
    overrides: dict[str, list[dict[str, Any]]] = {}
    skipped: list[str] = []
    default_bits = int("".join(c for c in default_activation_type if c.isdigit()) or 8)
    activations_enc = {**_folded_activation_encodings(model, encodings.activations, consumer_nodes),
                       **encodings.activations}
    declared = {name: encs[0].bitwidth for name, encs in activations_enc.items()}
    for name, (enc,) in activations_enc.items():
        overrides[name] = [_override(enc, signed=False)]
        if enc.bitwidth == default_bits:
            continue
        receivers = {}
        for node in consumer_nodes.get(name, []):
            bits = {declared[o] for o in node.output if o in declared}
            if len(bits) == 1 and enc.bitwidth not in bits:
                receivers.setdefault(bits.pop(), set()).add(node.name)
        if len(receivers) > 1:
            raise ConfigError(f"{where}: the consumers of activation '{name}' ({enc.bitwidth}-bit) produce "
                              f"outputs of several bitwidths {sorted(receivers)}; one conversion per tensor is supported")
        for bits, nodes in receivers.items():
            overrides[name][0]["convert"] = {"quant_type": f"QUInt{bits}", "recv_nodes": sorted(nodes)}
    for name, encs in encodings.params.items():
        if encs[0].bitwidth == BIAS_BITWIDTH:
            skipped.append(name)  # derived by the quantizer from input and weight scales
            continue
        signed = all(e.is_symmetric and e.offset == -(2 ** (e.bitwidth - 1)) for e in encs)
        entries = [_override(e, signed) for e in encs]
        if len(encs) > 1:
            entries[0]["axis"] = _channel_axis(name, inits[name], len(encs), consumers.get(name), where)
        overrides[name] = entries
    return OverridesPlan(overrides, skipped)


def _folded_activation_encodings(model, activations: dict[str, list[Encoding]],
                                 consumer_nodes: dict[str, list]) -> dict[str, list[Encoding]]:
    """Return encodings for the inputs of Relu/Clip nodes that have none, copied from the node's output.

    QAIRT and AIMET fold a Conv/Gemm followed by Relu or Clip into one op quantized at the
    activation's output, so a file names only the output; onnxruntime needs the producer's output
    too, or it would quantize it with the default type before the activation.
    """
    produced = {o for n in model.graph.node for o in n.output}
    folded: dict[str, list[Encoding]] = {}
    for node in model.graph.node:
        if node.op_type in _REMOVABLE_ACTIVATIONS and node.output[0] in activations:
            source = node.input[0]
            if source in produced and source not in activations and len(consumer_nodes.get(source, [])) == 1:
                folded[source] = activations[node.output[0]]
    return folded


def _override(enc: Encoding, signed: bool) -> dict[str, Any]:
    if signed:
        return {"quant_type": f"QInt{enc.bitwidth}", "scale": enc.scale, "zero_point": 0}
    return {"quant_type": f"QUInt{enc.bitwidth}", "scale": enc.scale, "zero_point": -enc.offset}


def _channel_axis(name: str, dims: tuple[int, ...], channels: int, consumer: str | None, where: str) -> int:
    axis = _PER_CHANNEL_AXIS.get(consumer or "")
    if axis is not None and axis < len(dims) and dims[axis] == channels:
        return axis
    matches = [a for a, d in enumerate(dims) if d == channels]
    if len(matches) == 1:
        return matches[0]
    raise ConfigError(f"{where}: param_encodings['{name}'] has {channels} per-channel encodings but the weight "
                      f"has shape {list(dims)}: cannot tell the channel axis")


def recipe_overrides(model: Path, encodings: dict, encodings_file: str,
                     tensor_overrides: dict[str, list[dict[str, Any]]],
                     activation_type: str = "QUInt8") -> dict[str, list[dict[str, Any]]]:
    """Return onnxruntime tensor overrides for a recipe: its QAIRT encodings (checked against model),
    then its own tensor overrides on top. Raises ConfigError naming bad entries."""
    plain: dict[str, list[dict[str, Any]]] = {}
    if encodings:
        parsed = parse_encodings(encodings, encodings_file or "quantization overrides")
        plain.update(to_tensor_overrides(parsed, Path(model), activation_type).tensor_overrides)
    plain.update(tensor_overrides)
    return ort_overrides(plain)


def ort_overrides(plain: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Return JSON-friendly tensor overrides as onnxruntime wants them (QuantType, numpy scale/zero_point)."""
    from onnxruntime.quantization import QuantType

    result: dict[str, list[dict[str, Any]]] = {}
    for name, entries in plain.items():
        converted = []
        qtype = None
        for entry in entries:
            out = dict(entry)
            if isinstance(out.get("quant_type"), str):
                out["quant_type"] = QuantType[out["quant_type"]]
            qtype = out.get("quant_type", qtype)
            if "scale" in out:
                out["scale"] = np.array(out["scale"], dtype=np.float32)
                out["zero_point"] = np.array(out["zero_point"], dtype=_zp_dtype(qtype))
            for bound in ("rmin", "rmax"):
                if bound in out:
                    out[bound] = np.array(out[bound], dtype=np.float32)
            if "convert" in out:
                conv = dict(out["convert"])
                if isinstance(conv.get("quant_type"), str):
                    conv["quant_type"] = QuantType[conv["quant_type"]]
                if "recv_nodes" in conv:
                    conv["recv_nodes"] = set(conv["recv_nodes"])
                out["convert"] = conv
            converted.append(out)
        result[name] = converted
    return result


def _zp_dtype(qtype) -> type:
    name = getattr(qtype, "name", "QUInt8")
    return {"QInt8": np.int8, "QUInt8": np.uint8, "QInt16": np.int16, "QUInt16": np.uint16,
            "QInt4": np.int8, "QUInt4": np.uint8}.get(name, np.uint8)


# ----------------------------------------------------------------------------------------- export

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
