"""What a QNN HTP failure at graph finalization means for the model that met it.

onnxruntime's QNN EP reports a graph the HTP backend could not finalize as one line (`Failed to finalize QNN
graph. Error: QNN_COMMON_ERROR_MEM_ALLOC: Memory allocation related error., Code: 1002`) that names neither a
tensor of the model nor what to change. explain() turns it into what it means for this model: its largest
activations (at the HTP's precision: float32 runs as float16) and weights against the SoC's VTCM (the device
catalog's vtcm_mb) and the HTP's per-graph memory limit, the node QNN names when its log does, and what to try.
onnxruntime's text stays as the last line, never alone.

The HTP backend's own logs say what the codes mean at finalization (QnnCommon.h numbers them from 1000):
* 1002 QNN_COMMON_ERROR_MEM_ALLOC: the graph's memory plan does not fit. Either one op needs more tightly
  coupled memory than the VTCM has (`A single op ... requires 0x2400000 bytes of TCM, which is greater than the
  TCM size of 0x800000`, an InstanceNorm; pytorch/executorch#1430) or the graph's allocation passes the
  per-graph limit (`graph requires estimated allocation of 4176043 KB, limit is 2097152 KB`, 2 GiB;
  qualcomm/ai-hub-models#22, #274). On the simulator here a Softmax over 4,194,304 elements (8 MiB in float16,
  the whole 8 MiB VTCM of an SM8650) fails with 1002; 2,097,152 elements finalize
  (tests/test_qnn_errors.py).
* 1000 QNN_COMMON_ERROR_NOT_SUPPORTED, 1004 QNN_COMMON_ERROR_INVALID_ARGUMENT: an op's parameters (a type,
  a rank, an attribute value) that the backend accepted when the graph was built but not when it was prepared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

HTP_GRAPH_LIMIT_BYTES = 2 * 1024 ** 3  # QNN HTP: "graph requires estimated allocation of ... KB, limit is 2097152 KB"
QNN_CODES = {1000: "QNN_COMMON_ERROR_NOT_SUPPORTED", 1001: "QNN_COMMON_ERROR_BACKEND_NOT_INITIALIZED",
             1002: "QNN_COMMON_ERROR_MEM_ALLOC", 1003: "QNN_COMMON_ERROR_SYSTEM",
             1004: "QNN_COMMON_ERROR_INVALID_ARGUMENT", 1005: "QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED",
             1006: "QNN_COMMON_ERROR_PLATFORM_NOT_SUPPORTED", 1007: "QNN_COMMON_ERROR_SYSTEM_COMMUNICATION",
             1100: "QNN_COMMON_ERROR_GENERAL"}
_FINALIZE = re.compile(r"Failed to finali[sz]e (QNN )?graph|graph prepare failed|Graph Finali[sz]e failure", re.I)
_CODE = re.compile(r"(?:Code|err(?:or)?)[:= ]+(\d{4})\b")
_NAMED = (re.compile(r'"([^"]+)" generated:'), re.compile(r"node `([^`]+)`"))
_SHOWN = 3  # tensors and weights named in the message
# ops whose whole tensor (along the reduced axis) the HTP holds in VTCM at once: the likely culprit among equals
_UNTILED = {"Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization", "GroupNormalization", "TopK",
            "ArgMax", "ArgMin", "CumSum", "ReduceMax", "ReduceMean", "ReduceSum", "NonMaxSuppression"}


@dataclass(frozen=True)
class Tensor:
    """One tensor of the model as the HTP holds it: name, the node producing it, bytes at its HTP precision."""

    name: str
    node: str
    op_type: str
    htp_bytes: int

    def __str__(self) -> str:
        made = f" ({self.op_type} '{self.node}')" if self.node else ""
        return f"'{self.name}'{made} {_mib(self.htp_bytes)}"


def _mib(n: int) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _htp_bytes(elem_type: int, count: int) -> int:
    """Bytes of count elements as the HTP holds them: float32 runs as float16 (enable_htp_fp16_precision)."""
    if elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        return 2 * count
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize * count


def is_finalize_failure(text: str) -> bool:
    """True when onnxruntime's (or QNN's) text says the HTP backend could not finalize (prepare) the graph."""
    return bool(_FINALIZE.search(text or ""))


def model_tensors(model: onnx.ModelProto) -> tuple[list[Tensor], list[Tensor]]:
    """Return (activations, weights) of a model, largest first, sized as the HTP holds them (shapes inferred
    where the model carries none; tensors with unknown dims are left out)."""
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # sizes from what the model already carries
        pass
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {t.name for t in g.initializer}
    acts = []
    for v in [*g.input, *g.value_info, *g.output]:
        tt = v.type.tensor_type
        if v.name in inits or not tt.HasField("shape") or not tt.shape.dim:
            continue
        if any(not d.HasField("dim_value") or d.dim_value <= 0 for d in tt.shape.dim):
            continue
        node = producer.get(v.name)
        acts.append(Tensor(v.name, node.name if node else "", node.op_type if node else "input",
                           _htp_bytes(tt.elem_type, int(np.prod([d.dim_value for d in tt.shape.dim])))))
    weights = [Tensor(t.name, "", "", _htp_bytes(t.data_type, int(np.prod(t.dims)))) for t in g.initializer]
    # largest first; among equals, untiled ops' outputs, then other nodes' outputs, then graph inputs
    rank = lambda t: (-t.htp_bytes, t.op_type not in _UNTILED, not t.node)  # noqa: E731
    return sorted({t.name: t for t in acts}.values(), key=rank), sorted(weights, key=rank)


def explain(model_path: Path, soc, text: str, log: str = "") -> str | None:
    """Return what a QNN finalization failure (onnxruntime's text) means for the model at model_path on soc
    (a devices.SocSpec) and what to try, ending with onnxruntime's text; None when text is not one. log (the
    runner's stderr, where QNN's own log lines go) is searched for the node QNN names."""
    if not is_finalize_failure(text):
        return None
    model = onnx.load(str(model_path), load_external_data=False)
    acts, weights = model_tensors(model)
    quantized = any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    if quantized:  # a weight's DequantizeLinear output is the weight, not an activation
        inits = {t.name for t in model.graph.initializer}
        dequantized = {o for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
                       for o in n.output}
        acts = [a for a in acts if a.name not in dequantized]
    m = _CODE.search(text)
    code = int(m.group(1)) if m else None
    status = f"{QNN_CODES.get(code, 'QNN error')} ({code})" if code else "no QNN status code given"
    htp = f"{soc.name} (v{soc.htp_arch})"
    nodes = {n.name: n for n in model.graph.node}
    named = next((m.group(1) for p in _NAMED for m in p.finditer(f"{text}\n{log}") if m.group(1)), "")
    lines = [f"the QNN HTP backend could not finalize (prepare) the graph of {Path(model_path).name} for {htp}: "
             f"{status}"]
    if named:
        node = nodes.get(named)
        lines.append(f"QNN names node '{named}'" + (f" ({node.op_type})" if node else " (not a node of this graph: "
                                                     "an op the backend generated from it)"))
    total_w = sum(w.htp_bytes for w in weights)
    biggest = acts[0] if acts else None
    lines.append("largest activations: " + (", ".join(map(str, acts[:_SHOWN])) or "unknown (shapes not inferred)")
                 + ("; a QDQ graph: the HTP holds them at their quantized width, sized here as float16" if quantized
                    else "; float32 is held as float16 on the HTP"))
    lines.append(f"weights: {_mib(total_w)} in {len(weights)} initializer(s)"
                 + (f", largest {', '.join(map(str, weights[:_SHOWN]))}" if weights else ""))
    fits_vtcm = biggest is None or biggest.htp_bytes < soc.vtcm_bytes
    lines.append(f"against the {htp}: {soc.vtcm_mb:g} MiB VTCM (device catalog), which "
                 + ("every activation fits" if fits_vtcm else
                    f"'{biggest.name}' fills {biggest.htp_bytes / soc.vtcm_bytes:.0%} of alone")
                 + f"; a {_mib(HTP_GRAPH_LIMIT_BYTES)} per-graph memory limit, against weights plus the largest "
                   f"activation of {_mib(total_w + (biggest.htp_bytes if biggest else 0))}")
    lines.append("what to try: " + "; ".join(_advice(code, biggest, total_w, soc, named, quantized)))
    lines.append(f"onnxruntime said: {' '.join(text.split())}")
    return "\n".join(lines)


def _advice(code: int | None, biggest: Tensor | None, total_w: int, soc, named: str, quantized: bool = False
            ) -> list[str]:
    """Return what to try for this failure, the most likely cause first."""
    advice = []
    if code in (1000, 1004):
        advice.append(f"the backend refused a parameter of {('node ' + repr(named)) if named else 'an op'}: check "
                      "its attributes and types against the QNN HTP op definitions, or replace it (the conversion "
                      "step's `rewrites:`)")
    if biggest is not None and biggest.htp_bytes >= soc.vtcm_bytes // 2:
        where = f"{biggest.op_type} '{biggest.node}'" if biggest.node else f"input '{biggest.name}'"
        advice.append(f"smaller input shapes (`input_shapes:` in the model spec), so that '{biggest.name}' (from "
                      f"{where}) fits the {soc.vtcm_mb:g} MiB VTCM: an op that cannot be tiled (a Softmax, a "
                      "normalisation over a long axis) must hold its whole tensor there")
        advice.append(f"split {where} along its long axis into parts (a Split, the op per part, a Concat), or "
                      "split the graph there and run the parts as separate models")
    if total_w + (biggest.htp_bytes if biggest else 0) >= HTP_GRAPH_LIMIT_BYTES // 2:
        advice.append(f"split the graph into parts under {_mib(HTP_GRAPH_LIMIT_BYTES)} each (Qualcomm's LLM "
                      "exports do), or quantize the weights (16-bit from float32 halves them, 8-bit quarters them)")
    if quantized:
        advice.append("this graph is quantized already: another quantization of it (per-channel weights, 16-bit "
                      "activations: the sweep's candidates) or the float graph in FP16, where the HTP has it")
    else:
        advice.append("8-bit activations (the ptq step's QDQ model) halve every float16 activation")
    return advice
