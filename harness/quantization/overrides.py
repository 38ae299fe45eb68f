"""The onnxruntime bridge: QAIRT / AIMET encodings (harness.quantization.encodings) as the tensor overrides of
onnxruntime's QDQ quantizer, checked against the model being quantized."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.cache import ArtifactCache, content_key
from harness.errors import ConfigError, ModelError
from harness.files import content_digest
from harness.quantization.encodings import ACTIVATION_BITWIDTHS, BIAS_BITWIDTH, Encoding, Encodings, parse_encodings

if TYPE_CHECKING:
    import onnx

INT4_OPSET = 21  # DequantizeLinear takes tensor(int4) from opset 21
_REMOVABLE_ACTIVATIONS = {"Relu", "Clip"}  # onnxruntime's QDQ quantizer folds these into their producer


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
    tensor's bitwidth). Initializers listed as activations (AIMET does so for Gather tables and
    constants) get parameter overrides. Raises ConfigError naming tensors the model does not have,
    activations given as parameters and per-channel lists whose length does not match the weight.
    """
    import onnx

    model = onnx.load(str(float_model), load_external_data=False)
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    activations = {i.name for i in model.graph.input if i.name not in inits}
    activations |= {o for n in model.graph.node for o in n.output if o}
    consumers: dict[str, onnx.NodeProto] = {}
    consumer_nodes: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, n)
            consumer_nodes.setdefault(i, []).append(n)
    where = encodings.source or "quantization overrides"
    unknown = [f"activation '{n}'" for n in encodings.activations if n not in activations and n not in inits]
    unknown += [f"param '{n}'" for n in encodings.params if n not in inits and n not in activations]
    if unknown:
        total = len(encodings.activations) + len(encodings.params)
        raise ConfigError(f"{where}: {len(unknown)} of {total} tensor(s) not in the model {float_model.name}: "
                          f"{', '.join(unknown[:10])}{' ...' if len(unknown) > 10 else ''} (expected the tensor "
                          "names of the model being quantized: were these encodings computed on another model, "
                          "or on the model before a conversion that renamed them?)")
    misplaced = []
    for n, encs in encodings.params.items():
        if n not in inits:
            bits = encs[0].bitwidth
            misplaced.append(f"'{n}' is an activation and takes one {'/'.join(map(str, ACTIVATION_BITWIDTHS))}-bit "
                             f"encoding, not {len(encs)} {bits}-bit one(s)" if len(encs) > 1 or
                             bits not in ACTIVATION_BITWIDTHS else
                             f"'{n}' is an activation (move it to activation_encodings)")
    if misplaced:
        raise ConfigError(f"{where}: {'; '.join(misplaced)}")
    # AIMET lists initializers it quantizes like activations (Gather tables, constants) under
    # activation_encodings: they are parameters of the QDQ model.
    params = {**{n: e for n, e in encodings.activations.items() if n in inits}, **encodings.params}
    graph_activations = {n: e for n, e in encodings.activations.items() if n not in inits}
    overrides: dict[str, list[dict[str, Any]]] = {}
    skipped: list[str] = []
    default_bits = int("".join(c for c in default_activation_type if c.isdigit()) or 8)
    activations_enc = {**_folded_activation_encodings(model, graph_activations, consumer_nodes),
                       **graph_activations}
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
    for name, encs in params.items():
        if encs[0].bitwidth == BIAS_BITWIDTH:
            skipped.append(name)  # derived by the quantizer from input and weight scales
            continue
        signed = all(e.is_symmetric and e.offset == -(2 ** (e.bitwidth - 1)) for e in encs)
        entries = [_override(e, signed) for e in encs]
        if len(encs) > 1:
            entries[0]["axis"] = _channel_axis(name, inits[name], encs, consumers.get(name), where)
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


def aimet_channel_axis(node: "onnx.NodeProto | None", input_index: int, rank: int) -> int | None:
    """Return the per-channel axis AIMET uses for a weight of rank `rank` at input `input_index` of node:
    Conv 0, ConvTranspose 1, Gemm 0 with transB=1 (weight [N, K]) and 1 without, MatMul the last axis
    (the output features of a [.., K, N] weight), Gather the gathered axis (`axis`, 0 for embedding
    tables); None for other ops."""
    if node is None:
        return None
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm":
        trans = attrs["transB"].i if "transB" in attrs else 0
        if input_index == 0:
            trans = 1 - (attrs["transA"].i if "transA" in attrs else 0)
        return 0 if trans else 1
    if node.op_type == "MatMul":
        return rank - 1 if input_index == 1 else max(rank - 2, 0)
    if node.op_type == "Gather" and input_index == 0:
        axis = attrs["axis"].i if "axis" in attrs else 0
        return axis % rank if rank else 0
    return None


def _channel_axis(name: str, dims: tuple[int, ...], encs: list[Encoding], consumer, where: str) -> int:
    channels = len(encs)
    stated = encs[0].axis
    if stated is not None:  # 2.x files say which axis
        axis = stated + len(dims) if stated < 0 else stated
        if 0 <= axis < len(dims) and dims[axis] == channels:
            return axis
        raise ConfigError(f"{where}: param_encodings['{name}'] has {channels} per-channel encodings on axis "
                          f"{stated} but the weight has shape {list(dims)} (expected {channels} along that axis)")
    index = list(consumer.input).index(name) if consumer is not None else 1
    axis = aimet_channel_axis(consumer, index, len(dims))
    if axis is not None and axis < len(dims) and dims[axis] == channels:
        return axis
    matches = [a for a, d in enumerate(dims) if d == channels]
    if len(matches) == 1:
        return matches[0]
    op = f"its consumer {consumer.op_type} '{consumer.name}'" if consumer is not None else "no consumer"
    raise ConfigError(f"{where}: param_encodings['{name}'] has {channels} per-channel encodings but the weight "
                      f"has shape {list(dims)} and {op}: cannot tell the channel axis (expected {channels} "
                      "channels along the op's output-channel axis: Conv 0, ConvTranspose 1, Gemm 0 with "
                      "transB=1, MatMul the last axis, Gather its axis)")


def recipe_overrides(model: Path, encodings: dict, encodings_file: str,
                     tensor_overrides: dict[str, list[dict[str, Any]]],
                     activation_type: str = "QUInt8", weight_type: str = "QUInt8") -> dict[str, list[dict[str, Any]]]:
    """Return onnxruntime tensor overrides for a recipe: what the HTP needs of its weights (htp_weight_overrides),
    then its QAIRT encodings (checked against model), then its own tensor overrides on top. Raises ConfigError
    naming bad entries."""
    plain: dict[str, list[dict[str, Any]]] = htp_weight_overrides(model, weight_type)
    if encodings:
        parsed = parse_encodings(encodings, encodings_file or "quantization overrides")
        plain.update(to_tensor_overrides(parsed, Path(model), activation_type).tensor_overrides)
    plain.update(tensor_overrides)
    return ort_overrides(plain)


def htp_weight_overrides(model: Path, weight_type: str) -> dict[str, list[dict[str, Any]]]:
    """Return the overrides keeping every LayerNormalization's constant scale unsigned and asymmetric at 8 bits when
    the recipe's weights are signed 8-bit ({} otherwise).

    Signed 8-bit weights (per-channel or symmetric recipes, the HTP's preferred form for Conv and Gemm) make
    onnxruntime's quantizer give LayerNormalization's scale signed symmetric 8 bits too, and the HTP refuses such a
    LayerNormalization (onnxruntime-qnn's simulator, v75: ppocrv5_rec's five; with the scale unsigned 8-bit they run
    and the model reads as float does). onnxruntime's QNN config adjusts LayerNormalization only for per-tensor
    recipes."""
    if weight_type != "QInt8":
        return {}
    return {scale: [{"quant_type": "QUInt8", "symmetric": False}]
            for scale in _layernorm_scales(content_digest(model), str(model))}


@functools.lru_cache(maxsize=64)
def _layernorm_scales(digest: str, model: str) -> tuple[str, ...]:
    """Return the constant scales of the LayerNormalization nodes of the model at path model (content digest): parsed
    once per content, as every candidate of a search quantizes the same float model."""
    import onnx

    graph = onnx.load(model, load_external_data=False).graph
    constants = {i.name for i in graph.initializer}
    return tuple(node.input[1] for node in graph.node
                 if node.op_type == "LayerNormalization" and len(node.input) > 1 and node.input[1] in constants)


def model_for_encodings(model: Path, encodings: dict, encodings_file: str, cache: ArtifactCache) -> Path:
    """Return the model to quantize with encodings: model itself, or a cached copy raised to opset 21
    when some encoding is 4-bit (DequantizeLinear takes tensor(int4) from opset 21; below it
    onnxruntime writes an int4 DequantizeLinear the model's opset refuses).

    16-bit encodings need nothing here: below opset 21 onnxruntime's get_qnn_qdq_config writes their
    QuantizeLinear/DequantizeLinear in the com.microsoft domain, which the QNN EP runs. The harness's
    conversion step already raises models to opset 21. Raises ModelError when onnx's version
    converter cannot convert the model (nothing is written to the cache then).
    """
    import onnx

    from harness.convert.opset import opset_of, raise_opset

    if not encodings or not parse_encodings(encodings, encodings_file or "quantization overrides").uses_int4():
        return Path(model)
    proto = onnx.load(str(model), load_external_data=False)
    if opset_of(proto) >= INT4_OPSET:
        return Path(model)

    def build(out: Path) -> None:
        try:
            raised = raise_opset(onnx.load(str(model)), INT4_OPSET)
        except Exception as e:
            raise ModelError(f"{model}: 4-bit encodings in {encodings_file or 'the overrides'} need opset "
                             f"{INT4_OPSET} (tensor(int4) DequantizeLinear), but onnx's version converter failed "
                             f"from opset {opset_of(proto)}: {type(e).__name__}: {e}") from None
        onnx.save(raised, str(out / Path(model).name))

    key = content_key("int4-opset-v1", Path(model), Path(model).name, INT4_OPSET, onnx.__version__)
    return cache.entry("opset", key, build).path / Path(model).name


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
