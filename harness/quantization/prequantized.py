"""Models that arrive already quantized (onnxruntime's quantizer, AIMET, a framework's QAT export).

A model holding QuantizeLinear/DequantizeLinear pairs carries its own encodings: they are read per tensor
(scale, zero point, bit width, per-channel axis), checked against what the HTP takes, and the model is used
as it is. Its float model is the same graph with the Q/DQ pairs removed and the quantized constants
dequantized exactly as DequantizeLinear computes them. A QOperator model (QLinearConv, QLinearMatMul and
onnxruntime's com.microsoft QLinear* ops) is rewritten to the equivalent QDQ form; a model quantized at run
time (DynamicQuantizeLinear, MatMulInteger, ...) has no static encodings to give the HTP and is named.
Every QDQ model the harness writes is checked here too (check_generated): onnx's checker, strict shape
inference and unique node names, a failure naming the node as the harness's bug.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from harness.cache import ArtifactCache, content_key
from harness.errors import ModelError, StepError
from harness.quantization.encodings import ACTIVATION_BITWIDTHS, PARAM_BITWIDTHS
from harness.quantization.overrides import aimet_channel_axis

QDQ = {"QuantizeLinear", "DequantizeLinear"}
# QOperator ops rewritten to DQ -> float op -> Q (inputs: data triples, then the output's scale and zero point)
QLINEAR = {"QLinearConv": "Conv", "QLinearMatMul": "MatMul", "QLinearAdd": "Add", "QLinearMul": "Mul",
           "QLinearSigmoid": "Sigmoid", "QLinearLeakyRelu": "LeakyRelu", "QLinearAveragePool": "AveragePool",
           "QLinearGlobalAveragePool": "GlobalAveragePool", "QLinearConcat": "Concat", "QGemm": "Gemm"}
# ops that move or select values: on a quantized tensor they are exact between a DQ and a Q of the same encoding
VALUE_OPS = {"MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Gather", "Split",
             "Identity", "DepthToSpace", "SpaceToDepth"}
# quantized at run time or fused beyond what a QDQ graph expresses exactly
NOT_EXACT = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM",
             "MatMulIntegerToFloat", "QAttention", "QEmbedLayerNormalization", "QLinearSoftmax",
             "QLinearWhere", "QLinearReduceMean", "QOrderedMatMul", "QOrderedAttention", "QuantizeBFP",
             "DequantizeBFP", "MatMulNBits", "GatherBlockQuantized"}
_TYPES = {TensorProto.UINT8: ("uint8", 8, False), TensorProto.INT8: ("int8", 8, True),
          TensorProto.UINT16: ("uint16", 16, False), TensorProto.INT16: ("int16", 16, True),
          TensorProto.UINT4: ("uint4", 4, False), TensorProto.INT4: ("int4", 4, True),
          TensorProto.INT32: ("int32", 32, True), TensorProto.UINT2: ("uint2", 2, False),
          TensorProto.INT2: ("int2", 2, True)}


class InexactQuantization(ModelError):
    """A model quantized in a form no static QDQ model expresses exactly; `nodes` are (name, op type) pairs."""

    def __init__(self, message: str, nodes: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.nodes = nodes


@dataclass(frozen=True)
class TensorEncoding:
    """The encoding of one quantized tensor of a model: real = (q - zero_point) * scale."""

    tensor: str  # the float tensor's name (a DequantizeLinear output for weights)
    kind: str  # 'activation' | 'weight' | 'bias' | 'block_scale' (LPBQ's per-block integers)
    dtype: str  # 'uint8', 'int8', 'uint16', 'int16', 'uint4', 'int4', 'int32', ... ('float8e4m3fn', ...)
    bits: int  # 0 for a non-integer type
    signed: bool
    scale_min: float
    scale_max: float
    zero_points: tuple[int, ...]  # distinct zero points
    axis: int | None = None  # the per-channel axis (None: one encoding for the tensor)
    channels: int = 1
    block_size: int = 0
    consumer: str = ""  # 'Conv conv1' for a weight: the op it feeds
    output_axis: int | None = None  # for a weight: its consumer's output-channel axis, where known

    @property
    def symmetric(self) -> bool:
        """True when the zero point is the middle of the range (0 signed, 2**(bits-1) unsigned)."""
        middle = 0 if self.signed else 2 ** (self.bits - 1)
        return set(self.zero_points) == {middle}

    def describe(self) -> str:
        """Return 'uint8 per tensor' / 'int8 per channel (axis 0, 16 channels) symmetric'."""
        scope = f"per channel (axis {self.axis}, {self.channels} channels)" if self.axis is not None else "per tensor"
        return f"{self.dtype} {scope}{' symmetric' if self.symmetric else ''}"


@dataclass(frozen=True)
class Prequantized:
    """What a model's own quantization is: its form, its encodings, and what the HTP cannot take of them."""

    form: str  # 'QDQ' | 'QOperator, rewritten to QDQ'
    encodings: tuple[TensorEncoding, ...]
    rewritten: tuple[str, ...] = ()  # QOperator nodes rewritten ('QLinearConv conv1')
    problems: tuple[str, ...] = ()  # one sentence per tensor the HTP cannot take, naming the tensor and the rule
    model: Path | None = None  # the QDQ model, used as it is
    float_model: Path | None = None  # the same graph with Q/DQ removed, constants dequantized

    def kpis(self) -> dict:
        """Return the KPIs of the model's own quantization (bit widths counted per kind)."""
        counts: dict[str, dict[str, int]] = {}
        for e in self.encodings:
            counts.setdefault(e.kind, {}).setdefault(e.dtype, 0)
            counts[e.kind][e.dtype] += 1
        return {"prequantized": True, "quantization_form": self.form, "quantized_tensors": len(self.encodings),
                "encodings_by_kind": counts,
                "per_channel_weights": sum(e.kind == "weight" and e.axis is not None for e in self.encodings),
                "encoding_problems": list(self.problems)}

    def add_to(self, report) -> None:
        """Add the model's own quantization to a step report (feasibility's, PTQ's): its KPIs, the `encodings`
        table, a failure naming each tensor whose encoding the HTP cannot take and the rule, the rewritten nodes."""
        report.kpis.update(self.kpis())
        if "recipe" in report.kpis:
            report.kpis["recipe"] = f"the model's own encodings ({self.form})"
        report.tables["encodings"] = self.table()
        if self.problems:
            report.failures.append(self.problem_text())
        if self.rewritten:
            report.notes.append(f"{len(self.rewritten)} QOperator node(s) rewritten to their exact QDQ form "
                                f"(DequantizeLinear -> float op -> QuantizeLinear): {', '.join(self.rewritten[:6])}"
                                f"{' ...' if len(self.rewritten) > 6 else ''}")

    def problem_text(self) -> str:
        """Return the encodings the HTP cannot take, one line per tensor naming the rule ('' when none)."""
        if not self.problems:
            return ""
        more = f"\n... and {len(self.problems) - 10} more" if len(self.problems) > 10 else ""
        return (f"{len(self.problems)} of the model's own encodings cannot run on the HTP:\n"
                + "\n".join(self.problems[:10]) + more)

    def table(self) -> list[dict]:
        """Return one row per quantized tensor (the report's `encodings` table)."""
        return [{**asdict(e), "zero_points": " ".join(map(str, e.zero_points[:8]))} for e in self.encodings]


def _consts(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Initializers and Constant-node values by name."""
    consts = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = n.attribute[0].t
    return consts


def quantized_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Return the nodes that make a model quantized: Q/DQ, QOperator and run-time quantization ops."""
    return [n for n in model.graph.node if n.op_type in QDQ or n.op_type in QLINEAR or n.op_type in NOT_EXACT
            or n.op_type.startswith("QLinear")]


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _qtype(node: onnx.NodeProto, consts: dict) -> int:
    """The integer type a Q/DQ node works in: its zero point's, else output_dtype, else its constant input's."""
    if len(node.input) > 2 and node.input[2] in consts:
        return consts[node.input[2]].data_type
    if node.op_type == "DequantizeLinear" and node.input[0] in consts:
        return consts[node.input[0]].data_type
    return _attr(node, "output_dtype", 0) or TensorProto.UINT8


def read_encodings(model: onnx.ModelProto) -> list[TensorEncoding]:
    """Return the encoding of every quantized tensor of a QDQ model: activations from their QuantizeLinear
    (or the DequantizeLinear of a quantized graph input), weights and biases from the Q/DQ of their constant,
    with the per-channel axis, the op each weight feeds and that op's output-channel axis."""
    consts = _consts(model)
    produced = {o for n in model.graph.node for o in n.output}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in model.graph.node:
        for index, i in enumerate(n.input):
            consumers.setdefault(i, []).append((n, index))
    result = []
    for node in model.graph.node:
        data = node.input[0] if node.op_type in QDQ else ""
        if not data or node.op_type == "DequantizeLinear" and data in produced and data not in consts:
            continue  # not Q/DQ, or an activation's DQ: its QuantizeLinear carries the encoding
        scale = numpy_helper.to_array(consts[node.input[1]]) if node.input[1] in consts else np.array([np.nan])
        zero = (numpy_helper.to_array(consts[node.input[2]]).astype(np.int64)
                if len(node.input) > 2 and node.input[2] in consts else np.zeros(1, np.int64))
        qtype = _qtype(node, consts)
        dtype, bits, signed = _TYPES.get(qtype, (helper.tensor_dtype_to_string(qtype).split(".")[-1].lower(), 0,
                                                  True))
        rank = len(consts[data].dims) if data in consts else 0
        axis = _attr(node, "axis", 1) % max(rank, 1) if scale.size > 1 else None
        kind, consumer, output_axis = "activation", "", None
        if data in consts:  # a weight: follow a Q -> DQ pair on it to the op it feeds
            after = consumers.get(node.output[0], [])
            if node.op_type == "QuantizeLinear" and after:
                after = consumers.get(after[0][0].output[0], [])
            kind = "bias" if bits == 32 else "weight"
            if after and after[0][0].op_type == "DequantizeLinear" and after[0][1] == 1:
                kind = "block_scale"  # LPBQ: integers dequantized per channel into a block-wise weight's scales
            if after:
                consumer = f"{after[0][0].op_type} {after[0][0].name}"
                output_axis = aimet_channel_axis(after[0][0], after[0][1], rank)
        result.append(TensorEncoding(
            data, kind, dtype, bits, signed, *((float(np.nanmin(scale)), float(np.nanmax(scale)))
                                               if not np.isnan(scale).all() else (np.nan, np.nan)),
            tuple(sorted({int(z) for z in zero.ravel()})), axis, int(scale.size), int(_attr(node, "block_size", 0)),
            consumer, output_axis))
    return result


def htp_problems(encodings: list[TensorEncoding]) -> list[str]:
    """Return one sentence per encoding the HTP cannot take, naming the tensor and the rule broken."""
    problems = []
    for e in encodings:
        what = f"{e.kind} '{e.tensor}' ({e.describe()}{', feeding ' + e.consumer if e.consumer else ''})"
        if e.kind == "activation" and e.bits not in ACTIVATION_BITWIDTHS:
            problems.append(f"{what}: the HTP quantizes activations to 8 or 16 bits, not {e.dtype}")
        elif e.kind == "weight" and e.bits not in PARAM_BITWIDTHS:
            problems.append(f"{what}: the HTP takes weights of {', '.join(map(str, PARAM_BITWIDTHS))} bits, "
                            f"not {e.dtype}")
        elif e.kind == "weight" and e.signed and not e.symmetric:
            problems.append(f"{what}: zero point {', '.join(map(str, e.zero_points[:4]))}: the HTP takes signed "
                            "weights only symmetric (zero point 0); quantize them symmetric, or as unsigned")
        elif e.kind == "weight" and e.axis is not None and not (e.signed and e.symmetric):
            problems.append(f"{what}: the HTP takes per-channel weights only signed and symmetric (zero point 0)")
        elif e.block_size and not (e.consumer.startswith("MatMul ") and e.bits == 4 and e.signed and e.symmetric
                                   and e.block_size >= 16):
            problems.append(f"{what}: blockwise quantization (block_size {e.block_size}): block-wise weights are "
                            "taken only in the form measured on the HTP with onnxruntime-qnn 2.7.0: int4, "
                            "symmetric, block_size >= 16 (8 gave wrong results), feeding a MatMul; quantize this "
                            "one per channel")
        if e.kind == "weight" and e.axis is not None and e.output_axis not in (None, e.axis):
            problems.append(f"{what}: quantized per channel on axis {e.axis}, but {e.consumer} has its output "
                            f"channels on axis {e.output_axis}: the HTP quantizes weights per output channel")
    return problems


# ------------------------------------------------------------------------------------- float model

def _dequantize(node: onnx.NodeProto, consts: dict) -> np.ndarray:
    """Return DequantizeLinear(node) of constant inputs as onnxruntime computes it: float32((q - zp)) * scale."""
    q = numpy_helper.to_array(consts[node.input[0]]).astype(np.int64)
    scale = numpy_helper.to_array(consts[node.input[1]])
    zero = (numpy_helper.to_array(consts[node.input[2]]).astype(np.int64)
            if len(node.input) > 2 and node.input[2] in consts else np.zeros_like(scale, dtype=np.int64))
    if scale.size > 1 or scale.ndim > 0 and q.ndim > 1 and scale.ndim == q.ndim:
        axis = _attr(node, "axis", 1) % max(q.ndim, 1)
        block = _attr(node, "block_size", 0)
        if block:  # blocked: each scale covers block_size elements along axis
            scale = np.repeat(scale, block, axis=axis).take(range(q.shape[axis]), axis=axis)
            zero = np.repeat(zero, block, axis=axis).take(range(q.shape[axis]), axis=axis)
        else:
            shape = [1] * q.ndim
            shape[axis] = -1
            scale, zero = scale.reshape(shape), zero.reshape(shape)
    return ((q - zero).astype(np.float32) * scale.astype(np.float32)).astype(scale.dtype)


def float_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return the float model of a QDQ model: each DequantizeLinear of a constant replaced by its dequantized
    value, each QuantizeLinear -> DequantizeLinear pair on an activation removed (its consumers read the float
    tensor). Q/DQ on a quantized graph input or output stay (the interface is the model's)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    consts = _consts(model)
    outputs = {o.name for o in graph.output}
    rename: dict[str, str] = {}
    drop: set[int] = set()  # ids of the nodes removed
    new_inits = []
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and all(i in consts for i in node.input if i) \
                and node.output[0] not in outputs:
            new_inits.append(numpy_helper.from_array(_dequantize(node, consts), node.output[0]))
            consts[node.output[0]] = new_inits[-1]  # a DQ computing another's scales (LPBQ) folds first
            drop.add(id(node))
        elif node.op_type == "QuantizeLinear" and node.output[0] not in outputs:
            deqs = consumers.get(node.output[0], [])
            if deqs and all(d.op_type == "DequantizeLinear" for d in deqs):
                drop.update(id(d) for d in (node, *deqs))
                for d in deqs:
                    rename[d.output[0]] = node.input[0]

    def resolve(name: str) -> str:
        while name in rename:
            name = rename[name]
        return name

    nodes = []
    for n in graph.node:
        if id(n) in drop:
            continue
        n.input[:] = [resolve(i) if i else i for i in n.input]
        nodes.append(n)
    for out in graph.output:
        if out.name in rename:  # a dequantized graph output keeps its name
            nodes.append(helper.make_node("Identity", [resolve(out.name)], [out.name], name=f"{out.name}_float"))
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(new_inits)
    used = {i for n in graph.node for i in n.input} | outputs
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.value_info[:]
    return model


# ------------------------------------------------------------------------------- QOperator -> QDQ

class _Rewriter:
    """Rewrites QOperator nodes of a model to DQ -> float op -> Q, sharing one DQ per quantized tensor."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.consts = _consts(model)
        self.params: dict[str, tuple[str, str]] = {}  # quantized tensor -> (scale, zero point) names
        self.dequantized: dict[str, str] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rewritten: list[str] = []
        self.names = {n.name for n in model.graph.node}

    def _name(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        return name

    def dq(self, tensor: str, scale: str, zero: str, axis: int | None = None) -> str:
        if tensor not in self.dequantized:
            out = self.dequantized[tensor] = f"{tensor}_dequantized"
            extra = {"axis": axis} if axis is not None else {}
            self.nodes.append(helper.make_node("DequantizeLinear", [tensor, scale, zero], [out],
                                               name=self._name(f"{tensor}_DequantizeLinear"), **extra))
        return self.dequantized[tensor]

    def q(self, float_tensor: str, out: str, scale: str, zero: str) -> None:
        self.nodes.append(helper.make_node("QuantizeLinear", [float_tensor, scale, zero], [out],
                                           name=self._name(f"{out}_QuantizeLinear")))
        self.params[out] = (scale, zero)

    def weight_axis(self, scale: str, axis: int) -> int | None:
        size = int(np.prod(self.consts[scale].dims)) if scale in self.consts else 1
        return axis if size > 1 else None

    def qlinear(self, node: onnx.NodeProto) -> None:
        op, ins = QLINEAR[node.op_type], list(node.input)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "channels_last"}
        if _attr(node, "channels_last", 0):
            raise ModelError(f"{node.op_type} '{node.name}' works channels-last, which no standard float op "
                             "expresses without Transposes")
        if node.op_type == "QLinearConcat":
            (ys, yz), triples = ins[:2], [ins[i:i + 3] for i in range(2, len(ins), 3)]
            floats = [self.dq(*t) for t in triples]
        elif node.op_type in ("QLinearConv", "QLinearMatMul"):
            (x, xs, xz, w, ws, wz, ys, yz), bias = ins[:8], ins[8:]
            rank = len(self.consts[w].dims) if w in self.consts else 2
            axis = 0 if op == "Conv" else rank - 1
            floats = [self.dq(x, xs, xz), self.dq(w, ws, wz, self.weight_axis(ws, axis))]
            if bias and bias[0]:
                floats.append(self._bias(bias[0], xs, ws))
        elif node.op_type == "QGemm":  # A, B, C (int32 bias at A x B scale), then the output's (absent: float)
            (a, as_, az, b, bs, bz), rest = ins[:6], ins[6:] + ["", "", ""]
            floats = [self.dq(a, as_, az), self.dq(b, bs, bz, self.weight_axis(bs, 1 - attrs.get("transB", 0)))]
            if rest[0]:
                floats.append(self._bias(rest[0], as_, bs))
            ys, yz = rest[1], rest[2]
        elif node.op_type in ("QLinearAdd", "QLinearMul"):
            (a, as_, az, b, bs, bz, ys, yz) = ins[:8]
            floats = [self.dq(a, as_, az), self.dq(b, bs, bz)]
        else:  # one quantized input, then the output's scale and zero point
            (x, xs, xz, ys, yz) = ins[:5]
            floats = [self.dq(x, xs, xz)]
        out = node.output[0]
        result = f"{out}_float" if ys else out  # QGemm without an output scale gives float
        self.names.discard(node.name)  # the float op takes the QOperator node's name
        self.nodes.append(helper.make_node(op, floats, [result], name=self._name(node.name or op), **attrs))
        if ys:
            self.q(result, out, ys, yz)
        self.rewritten.append(f"{node.op_type} {node.name}")

    def _bias(self, bias: str, xs: str, ws: str) -> str:
        if xs not in self.consts or ws not in self.consts:
            raise ModelError(f"bias '{bias}': its scale (input scale x weight scale) is not constant")
        scale = (numpy_helper.to_array(self.consts[xs]) * numpy_helper.to_array(self.consts[ws])).astype(np.float32)
        name = f"{bias}_scale"
        self.inits.append(numpy_helper.from_array(scale.reshape(-1) if scale.size > 1 else scale.reshape(()), name))
        self.consts[name] = self.inits[-1]
        return self.dq(bias, name, "", 0 if scale.size > 1 else None)

    def value_op(self, node: onnx.NodeProto) -> None:
        scale, zero = self.params[node.input[0]]
        data = self.dq(node.input[0], scale, zero)
        outs = [f"{o}_float" for o in node.output]
        self.names.discard(node.name)
        self.nodes.append(helper.make_node(node.op_type, [data, *node.input[1:]], outs, name=self._name(node.name),
                                           domain=node.domain, **{a.name: helper.get_attribute_value(a)
                                                                  for a in node.attribute}))
        for f, o in zip(outs, node.output):
            self.q(f, o, scale, zero)

    def run(self) -> onnx.ModelProto:
        for node in self.model.graph.node:
            if node.op_type in QLINEAR:
                self.qlinear(node)
            elif node.op_type in VALUE_OPS and node.input and node.input[0] in self.params:
                self.value_op(node)
            else:
                if node.op_type == "QuantizeLinear":
                    self.params[node.output[0]] = (node.input[1], node.input[2] if len(node.input) > 2 else "")
                self.nodes.append(node)
        model = onnx.ModelProto.FromString(self.model.SerializeToString())
        del model.graph.node[:]
        model.graph.node.extend(_topological(self.nodes, model))
        model.graph.initializer.extend(self.inits)
        kept = [o for o in model.opset_import if o.domain != "com.microsoft" or _uses(model, o.domain)]
        del model.opset_import[:]
        model.opset_import.extend(kept)
        del model.graph.value_info[:]
        return model


def _uses(model: onnx.ModelProto, domain: str) -> bool:
    return any(n.domain == domain for n in model.graph.node)


def _topological(nodes: list[onnx.NodeProto], model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Return nodes ordered so each comes after the producers of its inputs."""
    ready = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer} | {""}
    pending, ordered = list(nodes), []
    while pending:
        rest = [n for n in pending if not all(i in ready for i in n.input)]
        done = [n for n in pending if all(i in ready for i in n.input)]
        if not done:  # inputs from outer scopes or missing: keep the given order
            return ordered + rest
        for n in done:
            ready.update(n.output)
        ordered.extend(done)
        pending = rest
    return ordered


def to_qdq(model: onnx.ModelProto, where: str) -> tuple[onnx.ModelProto, list[str]]:
    """Return the QDQ form of a QOperator model and the nodes rewritten (the model itself when it is QDQ
    already); raise ModelError naming the nodes quantized in a way no static QDQ form expresses exactly."""
    inexact = [n for n in model.graph.node if n.op_type in NOT_EXACT or
               (n.op_type.startswith("QLinear") and n.op_type not in QLINEAR)]
    if inexact:
        ops = sorted({n.op_type for n in inexact})
        dynamic = sorted({n.op_type for n in inexact} & {"DynamicQuantizeLinear", "DynamicQuantizeLSTM",
                                                         "DynamicQuantizeMatMul", "MatMulInteger", "ConvInteger"})
        why = ("quantized at run time (dynamic quantization: the activation scales are computed on every "
               "inference), which the HTP's static encodings cannot express exactly" if dynamic else
               "quantized with operators that have no exact QDQ form the HTP takes")
        names = ", ".join(f"{n.name or '?'} ({n.op_type})" for n in inexact[:8])
        raise InexactQuantization(
            f"{where} is {why}: {len(inexact)} node(s) of op types {', '.join(ops)}: {names}"
            f"{' ...' if len(inexact) > 8 else ''}. Onboard the float model it was quantized from (the harness "
            "quantizes it statically for the HTP), or export a static QDQ model (onnxruntime's quantize_static "
            "with QuantFormat.QDQ, AIMET, a QAT export)", [(n.name, n.op_type) for n in inexact])
    if not any(n.op_type in QLINEAR for n in model.graph.node):
        return model, []
    rewriter = _Rewriter(model)
    try:
        qdq = rewriter.run()
    except ModelError as e:
        raise ModelError(f"{where}: its QOperator form cannot be rewritten to QDQ exactly: {e}") from None
    return qdq, rewriter.rewritten


# --------------------------------------------------------------------------------------- checks

def check_generated(path: Path, made_by: str) -> None:
    """Raise StepError naming the node when a QDQ model the harness generated is not a valid ONNX model
    (onnx's checker, strict shape inference, unique node names): that is the harness's bug, not the model's."""
    model = onnx.load(str(path), load_external_data=False)
    seen: dict[str, int] = {}
    for n in model.graph.node:
        seen[n.name] = seen.get(n.name, 0) + 1 if n.name else 0
    problem = next((f"two nodes are named '{name}'" for name, k in seen.items() if k > 1), None)
    if problem is None:
        try:
            onnx.checker.check_model(str(path), full_check=True)
        except Exception as e:  # onnx raises ValidationError / InferenceError with the node in the text
            problem = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if problem is not None:
        raise StepError(f"the harness generated an invalid QDQ model ({made_by}: {path}): {problem}. This is a bug "
                        "in the harness, not in the model: please report it with the model")


def analyse(fixed_model: Path, source_model: Path, cache: ArtifactCache, where: str) -> Prequantized | None:
    """Return the model's own quantization (None for a float model): its QDQ form used as it is (a QOperator
    model rewritten, checked valid), its float model and the float model of source_model (for the conversion's
    equivalence check), both cached; raise ModelError naming the nodes quantized in an inexact form."""
    fixed = onnx.load(str(fixed_model))
    if not quantized_nodes(fixed):
        return None
    key = content_key("prequantized-v2", fixed_model, source_model, onnx.__version__)

    def build(out: Path) -> None:
        qdq, rewritten = to_qdq(fixed, where)
        onnx.save(qdq, str(out / "model.onnx"))
        if rewritten:
            check_generated(out / "model.onnx", "QOperator model rewritten to QDQ")
        onnx.save(float_form(qdq), str(out / "float.onnx"))
        source = onnx.load(str(source_model))
        onnx.save(float_form(to_qdq(source, where)[0]), str(out / "float_source.onnx"))
        encodings = read_encodings(qdq)
        (out / "encodings.json").write_text(json.dumps({
            "form": "QOperator, rewritten to QDQ" if rewritten else "QDQ", "rewritten": rewritten,
            "encodings": [asdict(e) for e in encodings], "problems": htp_problems(encodings)}, indent=1))

    entry = cache.entry("prequantized", key, build).path
    saved = json.loads((entry / "encodings.json").read_text())
    encodings = tuple(TensorEncoding(**{**e, "zero_points": tuple(e["zero_points"])}) for e in saved["encodings"])
    return Prequantized(saved["form"], encodings, tuple(saved["rewritten"]), tuple(saved["problems"]),
                        entry / "model.onnx", entry / "float.onnx")


def float_source(analysis: Prequantized) -> Path:
    """Return the float model of the source model as given (beside the analysis' float model)."""
    return analysis.float_model.with_name("float_source.onnx")
