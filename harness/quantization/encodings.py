"""QAIRT / AIMET quantization encodings: the files read and validated (harness.quantization.overrides imports
them into onnxruntime, harness.quantization.export writes them from a QDQ model).

Three layouts are read, as `aimet-onnx` 2.42 `QuantizationSimModel.export(encoding_version=...)` writes
them and `qairt-converter --quantization_overrides` reads them:

* 0.6.1 -- sections map tensor names to lists of encodings (one, or one per channel)::

    {"version": "0.6.1",
     "activation_encodings": {"<tensor>": [{"bitwidth": 8, "dtype": "int", "is_symmetric": "False",
                                             "min": -2.1, "max": 2.6, "offset": -114, "scale": 0.0185}]},
     "param_encodings": {"<initializer>": [<one encoding, or one per output channel>]}}

* 1.0.0 (AIMET's default) -- sections are lists of entries that carry their name, arrays of scales
  and offsets and an encoding type::

    {"version": "1.0.0", "activation_encodings": [{"name": "<tensor>", "bw": 8, "dtype": "INT",
     "enc_type": "PER_TENSOR", "is_sym": false, "offset": [-114], "scale": [0.0185]}], "param_encodings": [...]}

* 2.x (2.0.0, 2.1.0) -- one flat list in ONNX QuantizeLinear terms, with no activation/parameter
  split (initializers of the graph are parameters)::

    {"version": "2.0.0", "encodings": [{"name": "<tensor>", "output_dtype": "uint8", "y_scale": 0.0185,
     "y_zero_point": 114}, {"name": "<weight>", "output_dtype": "int4", "y_scale": [...], "axis": 0}]}

Top-level metadata (`producer`, `quantizer_args`, `excluded_layers`, ...) is ignored. AIMET lists
some initializers (Gather tables, constants) under activation encodings: they are applied as
parameter encodings. A per-channel list without an axis (0.6.1, 1.0.0) takes the axis AIMET uses:
Conv 0, ConvTranspose 1, Gemm 0 with transB=1 and 1 without, MatMul the last axis, Gather the
gathered axis (the node's `axis`, 0 for embedding tables).

QNN dequantizes as ``real = (q + offset) * scale`` with ``q`` in ``[0, 2**bitwidth - 1]``, so for an
unsigned ONNX type ``offset = -zero_point`` and for a signed one ``offset = -(zero_point + 2**(bitwidth-1))``
(a symmetric signed 8-bit weight has offset -128). Bias encodings (32-bit) are not applied: QAIRT
and onnxruntime both derive them as input scale x weight scale.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import ConfigError

FORMAT_VERSION = "0.6.1"  # the layout this harness writes
ACTIVATION_BITWIDTHS = (8, 16)
PARAM_BITWIDTHS = (4, 8, 16)
BIAS_BITWIDTH = 32
VALID_BITWIDTHS = (4, 8, 16, 32)
METADATA_KEYS = ("version", "producer", "quantizer_args", "excluded_layers", "metadata")  # read, not applied
_BLOCK_TYPES = {"PER_BLOCK", "LPBQ", "VECTOR"}  # 1.0.0 enc_type values with no onnxruntime QDQ equivalent
_BLOCK_FIELDS = ("block_size", "per_block_int_scale", "per_channel_float_scale")  # 2.x blockwise / LPBQ
# What an encodings file's block-wise entries get instead (measured, onnxruntime-qnn 2.7.0 on the HTP simulator)
BLOCKWISE_REFUSAL = (
    "onnxruntime's QDQ quantizer, which applies these encodings, writes no block-wise DequantizeLinear. The QNN EP "
    "(onnxruntime-qnn 2.7.0) was measured running 4-bit block-wise MatMul weights on the HTP as LPBQ from the "
    "pattern DequantizeLinear(uint8 per-block integers 1..16, per-channel float scale, axis=1) -> "
    "DequantizeLinear(int4 weight, those scales, block_size >= 16) -> MatMul; the harness writes it for an LLM's "
    "w4a16 recipe (llm.weight_block_size), not from an encodings file: export these weights per-channel")


@dataclass(frozen=True)
class Encoding:
    """One QNN encoding: real = (q + offset) * scale, q unsigned of `bitwidth` bits.

    `axis` is the channel axis of a per-channel list when the file states it (2.x), else None.
    """

    bitwidth: int
    scale: float
    offset: int
    is_symmetric: bool = False
    dtype: str = "int"
    axis: int | None = None

    @property
    def min(self) -> float:
        """The smallest representable real value."""
        return self.offset * self.scale

    @property
    def max(self) -> float:
        """The largest representable real value."""
        return (2 ** self.bitwidth - 1 + self.offset) * self.scale

    def to_json(self) -> dict[str, Any]:
        """Return the encoding as a QAIRT/AIMET 0.6.1 JSON entry (plus `axis` when known)."""
        entry = {"bitwidth": self.bitwidth, "dtype": self.dtype, "is_symmetric": str(self.is_symmetric),
                 "max": float(self.max), "min": float(self.min), "offset": int(self.offset),
                 "scale": float(self.scale)}
        if self.axis is not None:
            entry["axis"] = self.axis
        return entry


@dataclass(frozen=True)
class Encodings:
    """Activation and parameter encodings by tensor name; `source` says where they came from.

    A 2.x file has no activation/parameter split: its per-channel entries are read as parameters,
    the rest as activations, and to_tensor_overrides sorts them by the graph.
    """

    activations: dict[str, list[Encoding]] = field(default_factory=dict)
    params: dict[str, list[Encoding]] = field(default_factory=dict)
    source: str = ""
    version: str = FORMAT_VERSION  # the layout the file used

    def to_json(self) -> dict[str, Any]:
        """Return the QAIRT `--quantization_overrides` document (0.6.1 layout)."""
        return {"version": FORMAT_VERSION,
                "activation_encodings": {k: [e.to_json() for e in v] for k, v in self.activations.items()},
                "param_encodings": {k: [e.to_json() for e in v] for k, v in self.params.items()}}

    def uses_int4(self) -> bool:
        """True when some tensor has a 4-bit encoding (the QDQ model then needs opset 21)."""
        return any(e.bitwidth == 4 for v in (*self.activations.values(), *self.params.values()) for e in v)


def load_encodings(path: Path) -> Encodings:
    """Return the encodings in a QAIRT/AIMET overrides file; raise ConfigError naming the file and entry."""
    path = Path(path).expanduser()
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (expected a QAIRT/AIMET encodings JSON file)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON: {e.msg} "
                          f"(line {e.lineno}, column {e.colno})") from None
    return parse_encodings(data, str(path))


def parse_encodings(data: Any, source: str) -> Encodings:
    """Return validated Encodings from a parsed overrides document (0.6.1, 1.0.0 or 2.x layout);
    raise ConfigError naming the entry."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object with 'activation_encodings' and/or "
                          f"'param_encodings' (0.6.1, 1.0.0) or 'encodings' (2.x), got {type(data).__name__}")
    sections = ("activation_encodings", "param_encodings", "encodings")
    unknown = sorted(set(data) - set(sections) - set(METADATA_KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {', '.join(unknown)} (expected "
                          f"{', '.join(repr(k) for k in sections)} and metadata {', '.join(METADATA_KEYS)})")
    version = data.get("version")
    if version is not None and not isinstance(version, str):
        raise ConfigError(f"{source}: 'version' {version!r} must be a string such as \"1.0.0\"")
    if "encodings" in data:
        if "activation_encodings" in data or "param_encodings" in data:
            raise ConfigError(f"{source}: 'encodings' (2.x) cannot be mixed with 'activation_encodings' / "
                              "'param_encodings' (0.6.1, 1.0.0)")
        if version is not None and not version.startswith("2."):
            raise ConfigError(f"{source}: version {version} files have 'activation_encodings' and "
                              "'param_encodings'; the flat 'encodings' list is the 2.x layout")
        return _parse_v2(data["encodings"], source, version or "2.0.0")
    if "activation_encodings" not in data and "param_encodings" not in data:
        raise ConfigError(f"{source}: neither 'activation_encodings', 'param_encodings' nor 'encodings' is present")
    if version is not None and version.startswith("2."):
        raise ConfigError(f"{source}: version {version} files have one flat 'encodings' list, "
                          "not 'activation_encodings' / 'param_encodings'")
    groups, layouts = {}, set()
    for group, kind in (("activation_encodings", "activation"), ("param_encodings", "param")):
        entries = data.get(group, {})
        if isinstance(entries, dict):  # 0.6.1: {name: [encoding, ...]}
            layouts.add("0.6.1")
            groups[kind] = {name: _parse_entry(value, f"{source}: {group}['{name}']", kind)
                            for name, value in entries.items()}
        elif isinstance(entries, list):  # 1.0.0: [{"name": ..., "bw": ..., "scale": [...], ...}]
            layouts.add("1.0.0")
            groups[kind] = _parse_v1_list(entries, f"{source}: {group}", kind)
        else:
            raise ConfigError(f"{source}: '{group}' must map tensor names to lists of encodings (0.6.1) or "
                              f"be a list of encodings with a 'name' (1.0.0), got {type(entries).__name__}")
    if len(layouts) > 1:
        raise ConfigError(f"{source}: 'activation_encodings' and 'param_encodings' use different layouts "
                          "(0.6.1: objects keyed by tensor name; 1.0.0: lists of entries with a 'name')")
    return Encodings(groups["activation"], groups["param"], source, version or layouts.pop())


def _parse_entry(value: Any, where: str, kind: str) -> list[Encoding]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(i, dict) for i in items):
        raise ConfigError(f"{where}: expected a non-empty list of encoding objects")
    if kind == "activation" and len(items) != 1:
        raise ConfigError(f"{where}: {len(items)} encodings given; an activation takes exactly one "
                          "(per-channel encodings are for parameters)")
    return [_parse_encoding(item, f"{where}[{i}]" if len(items) > 1 else where, kind)
            for i, item in enumerate(items)]


def _check_bitwidth(bitwidth: Any, where: str, kind: str) -> int:
    if isinstance(bitwidth, bool) or not isinstance(bitwidth, int) or bitwidth not in VALID_BITWIDTHS:
        raise ConfigError(f"{where}: bitwidth {bitwidth!r} is impossible on the HTP (one of "
                          f"{', '.join(map(str, VALID_BITWIDTHS))}: activations 8 or 16, weights 4, 8 or 16, "
                          "biases 32)")
    allowed = ACTIVATION_BITWIDTHS if kind == "activation" else (*PARAM_BITWIDTHS, BIAS_BITWIDTH)
    if bitwidth not in allowed:
        raise ConfigError(f"{where}: bitwidth {bitwidth} is not supported for {kind}s on the HTP "
                          f"(use {' or '.join(map(str, allowed))})")
    return bitwidth


def _parse_encoding(item: dict, where: str, kind: str) -> Encoding:
    dtype = str(item.get("dtype", "int")).lower()
    if dtype not in {"int", "float"}:
        raise ConfigError(f"{where}: dtype '{item.get('dtype')}' is not 'int' or 'float'")
    bitwidth = item.get("bitwidth", item.get("bw"))
    if isinstance(bitwidth, bool) or not isinstance(bitwidth, int) or bitwidth not in VALID_BITWIDTHS:
        _check_bitwidth(bitwidth, where, kind)
    if dtype == "float":
        raise ConfigError(f"{where}: dtype 'float' (float fallback) cannot be expressed in a QDQ model for "
                          "the HTP; give an int encoding or remove the entry")
    _check_bitwidth(bitwidth, where, kind)
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
    return _encoding(bitwidth, scale, offset, symmetric, where, _parse_axis(item.get("axis"), where))


def _encoding(bitwidth: int, scale: Any, offset: Any, symmetric: bool, where: str, axis: int | None) -> Encoding:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ConfigError(f"{where}: scale {scale!r} must be a positive finite number")
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or offset != int(offset):
        raise ConfigError(f"{where}: offset {offset!r} must be an integer")
    offset = int(offset)
    if bitwidth != BIAS_BITWIDTH and not -(2 ** bitwidth - 1) <= offset <= 0:
        raise ConfigError(f"{where}: offset {offset} is outside [-{2 ** bitwidth - 1}, 0] for {bitwidth}-bit "
                          "(QNN's offset is minus the zero point)")
    return Encoding(bitwidth=bitwidth, scale=float(scale), offset=offset, is_symmetric=symmetric, axis=axis)


def _parse_axis(axis: Any, where: str) -> int | None:
    if axis is None:
        return None
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ConfigError(f"{where}: axis {axis!r} must be an integer")
    return axis


def _parse_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {"true", "false"}:
        return value.lower() == "true"
    raise ConfigError(f"{where}: is_symmetric {value!r} must be \"True\" or \"False\"")


def _named(entries: list, where: str) -> list[tuple[str, dict]]:
    """Return (name, entry) pairs of a 1.0.0 / 2.x list; raise ConfigError for unnamed or repeated entries."""
    seen: set[str] = set()
    named = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise ConfigError(f"{where}[{i}]: expected an encoding object with a tensor 'name'")
        if entry["name"] in seen:
            raise ConfigError(f"{where}[{i}]: tensor '{entry['name']}' has a second encoding (one per tensor)")
        seen.add(entry["name"])
        named.append((entry["name"], entry))
    return named


def _numbers(value: Any, what: str, where: str) -> list:
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"{where}: '{what}' must be a number or a non-empty list of numbers, got {value!r}")
    return values


def _parse_v1_list(entries: list, where: str, kind: str) -> dict[str, list[Encoding]]:
    """1.0.0: {name, dtype INT|FLOAT, bw, enc_type PER_TENSOR|PER_CHANNEL, is_sym, scale [...], offset [...]}."""
    result: dict[str, list[Encoding]] = {}
    for name, entry in _named(entries, where):
        at = f"{where}['{name}']"
        dtype = str(entry.get("dtype", "INT")).upper()
        if dtype not in {"INT", "FLOAT"}:
            raise ConfigError(f"{at}: dtype '{entry.get('dtype')}' is not 'INT' or 'FLOAT'")
        if dtype == "FLOAT":
            raise ConfigError(f"{at}: dtype 'FLOAT' (float fallback) cannot be expressed in a QDQ model for "
                              "the HTP; give an INT encoding or remove the entry")
        bitwidth = _check_bitwidth(entry.get("bw", entry.get("bitwidth")), at, kind)
        enc_type = str(entry.get("enc_type", "PER_TENSOR")).upper()
        if enc_type in _BLOCK_TYPES:
            raise ConfigError(f"{at}: enc_type {enc_type} (blockwise) is not supported: {BLOCKWISE_REFUSAL}")
        if enc_type not in {"PER_TENSOR", "PER_CHANNEL"}:
            raise ConfigError(f"{at}: enc_type {entry.get('enc_type')!r} is not PER_TENSOR or PER_CHANNEL")
        if "scale" not in entry or "offset" not in entry:
            raise ConfigError(f"{at}: needs 'scale' and 'offset' (lists, one per channel)")
        scales, offsets = _numbers(entry["scale"], "scale", at), _numbers(entry["offset"], "offset", at)
        if len(offsets) == 1 and len(scales) > 1:
            offsets = offsets * len(scales)
        if len(scales) != len(offsets):
            raise ConfigError(f"{at}: {len(scales)} scales but {len(offsets)} offsets")
        if enc_type == "PER_TENSOR" and len(scales) != 1:
            raise ConfigError(f"{at}: enc_type PER_TENSOR with {len(scales)} scales (expected one)")
        if kind == "activation" and len(scales) != 1:
            raise ConfigError(f"{at}: {len(scales)} encodings given; an activation takes exactly one "
                              "(per-channel encodings are for parameters)")
        symmetric = _parse_bool(entry.get("is_sym", entry.get("is_symmetric", False)), at)
        result[name] = [_encoding(bitwidth, s, o, symmetric, f"{at}[{i}]" if len(scales) > 1 else at, None)
                        for i, (s, o) in enumerate(zip(scales, offsets))]
    return result


def _parse_v2(entries: Any, source: str, version: str) -> Encodings:
    """2.x: {name, output_dtype (u)int4|8|16|32 or a float type, y_scale, y_zero_point?, axis?}."""
    where = f"{source}: encodings"
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: must be a list of encodings with a 'name' (2.x layout), "
                          f"got {type(entries).__name__}")
    activations: dict[str, list[Encoding]] = {}
    params: dict[str, list[Encoding]] = {}
    for name, entry in _named(entries, where):
        at = f"{where}['{name}']"
        dtype = entry.get("output_dtype")
        if not isinstance(dtype, str):
            raise ConfigError(f"{at}: needs 'output_dtype' such as \"uint8\", \"int4\" or \"uint16\"")
        if any(k in entry for k in _BLOCK_FIELDS):
            raise ConfigError(f"{at}: blockwise / LPBQ encodings are not supported: {BLOCKWISE_REFUSAL}")
        signed = dtype.startswith("int")
        bits = dtype[3:] if signed else dtype[4:] if dtype.startswith("uint") else ""
        if not bits.isdigit():
            raise ConfigError(f"{at}: output_dtype '{dtype}' (float fallback) cannot be expressed in a QDQ "
                              "model for the HTP; give an integer type (uint8, uint16, int4, int8, ...)")
        bitwidth = int(bits)
        if "y_scale" not in entry:
            raise ConfigError(f"{at}: needs 'y_scale'")
        scales = _numbers(entry["y_scale"], "y_scale", at)
        zeros = _numbers(entry.get("y_zero_point", 0), "y_zero_point", at)
        if len(zeros) == 1 and len(scales) > 1:
            zeros = zeros * len(scales)
        if len(scales) != len(zeros):
            raise ConfigError(f"{at}: {len(scales)} y_scale values but {len(zeros)} y_zero_point values")
        axis = _parse_axis(entry.get("axis"), at) if len(scales) > 1 else None
        if len(scales) > 1 and axis is None:
            raise ConfigError(f"{at}: {len(scales)} y_scale values need an 'axis'")
        kind = "param" if len(scales) > 1 or bitwidth in (4, BIAS_BITWIDTH) else "activation"
        _check_bitwidth(bitwidth, at, kind)
        half = 2 ** (bitwidth - 1)
        group = []
        for i, (s, z) in enumerate(zip(scales, zeros)):
            here = f"{at}[{i}]" if len(scales) > 1 else at
            if z != int(z):
                raise ConfigError(f"{here}: y_zero_point {z!r} must be an integer")
            offset = -(int(z) + half) if signed else -int(z)
            symmetric = int(z) == 0 if signed else int(z) == half
            group.append(_encoding(bitwidth, s, offset, symmetric, here, axis))
        (params if kind == "param" else activations)[name] = group
    return Encodings(activations, params, source, version)
