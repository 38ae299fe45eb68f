"""An analytic (roofline) estimate of on-device latency: MACs and bytes moved against the SoC's
published (or estimated) INT8 throughput and DRAM bandwidth from the catalog.

It is an estimate, labelled so, and a lower bound in spirit: it ignores per-inference fixed costs
(host-to-NPU dispatch, VTCM acquisition, power-up), which dominate for tiny models.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.devices import SocSpec
from harness.files import content_digest

COMPUTE_UTILIZATION = 0.5  # assumed share of peak INT8 MAC throughput a real graph reaches
BANDWIDTH_UTILIZATION = 0.7  # assumed share of peak DRAM bandwidth
_QDQ = {"QuantizeLinear", "DequantizeLinear"}


@dataclass(frozen=True)
class GraphCost:
    """The work in a graph: multiply-accumulates of Conv/ConvTranspose/Gemm/MatMul, and bytes at 8 bits."""

    macs: int
    weight_bytes: int
    activation_bytes: int

    @property
    def bytes_moved(self) -> int:
        """Weights read once plus every activation written once, at 1 byte per element."""
        return self.weight_bytes + self.activation_bytes


@dataclass(frozen=True)
class LatencyEstimate:
    """The estimate in ms (None when the catalog lacks both figures), its two bounds and its basis."""

    latency_ms: float | None
    compute_ms: float | None
    memory_ms: float | None
    bound: str
    basis: str


def graph_cost(model_path: Path) -> GraphCost:
    """Return the MACs and 8-bit bytes of a shape-fixed ONNX model (float or QDQ), worked out once per file
    content in a process (the context binary's record and the profile step's estimate read the same model).

    Shapes come from ONNX shape inference; Quantize/DequantizeLinear nodes are not counted as
    activations (in a QDQ graph they only mark where tensors are 8-bit).
    """
    return _graph_cost(content_digest(model_path), str(model_path))


@functools.lru_cache(maxsize=64)
def _graph_cost(digest: str, model_path: str) -> GraphCost:
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(model_path)))
    graph = model.graph
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = tuple(d.dim_value for d in dims)
    for init in graph.initializer:
        shapes[init.name] = tuple(init.dims)
    # a DequantizeLinear of an initializer stands for that (weight) initializer
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in shapes:
            shapes.setdefault(node.output[0], shapes[node.input[0]])
    inits = {i.name for i in graph.initializer}
    weight_bytes = sum(int(np.prod(i.dims)) for i in graph.initializer if int(np.prod(i.dims)) > 1)
    activation_bytes = sum(int(np.prod(shapes[i.name])) for i in graph.input
                           if i.name not in inits and i.name in shapes)
    macs = 0
    for node in graph.node:
        macs += _node_macs(node, shapes)
        if node.op_type in _QDQ:
            continue
        activation_bytes += sum(int(np.prod(shapes[o])) for o in node.output if o in shapes)
    return GraphCost(macs, weight_bytes, activation_bytes)


def _node_macs(node, shapes: dict[str, tuple[int, ...]]) -> int:
    out = shapes.get(node.output[0]) if node.output else None
    if out is None:
        return 0
    if node.op_type == "Conv" and len(node.input) > 1 and node.input[1] in shapes:
        w = shapes[node.input[1]]  # (Cout, Cin/group, k...): each output element is prod(w[1:]) MACs
        return int(np.prod(out)) * int(np.prod(w[1:]))
    if node.op_type == "ConvTranspose" and node.input[0] in shapes and node.input[1] in shapes:
        x, w = shapes[node.input[0]], shapes[node.input[1]]  # w: (Cin, Cout/group, k...)
        return x[0] * int(np.prod(x[2:])) * int(np.prod(w))
    if node.op_type in ("Gemm", "MatMul") and node.input[0] in shapes:
        a = shapes[node.input[0]]
        trans_a = any(attr.name == "transA" and attr.i for attr in node.attribute)
        k = a[-2] if (node.op_type == "Gemm" and trans_a) else a[-1]
        return int(np.prod(out)) * int(k)
    return 0


def estimate_latency(cost: GraphCost, soc: SocSpec, compute_utilization: float = COMPUTE_UTILIZATION,
                     bandwidth_utilization: float = BANDWIDTH_UTILIZATION) -> LatencyEstimate:
    """Return max(compute time, memory time) for cost on soc, with the assumptions stated."""
    compute_ms = (2 * cost.macs / (soc.int8_tops * 1e12 * compute_utilization) * 1e3
                  if soc.int8_tops else None)
    memory_ms = (cost.bytes_moved / (soc.ddr_bandwidth_gbps * 1e9 * bandwidth_utilization) * 1e3
                 if soc.ddr_bandwidth_gbps else None)
    bounds = {"compute": compute_ms, "memory": memory_ms}
    known = {k: v for k, v in bounds.items() if v is not None}
    bound = max(known, key=known.get) if known else "none"
    parts = [f"ESTIMATE (analytic roofline, not a measurement) for {soc.id} ({soc.name}): "
             f"max(compute, memory) with {cost.macs:,} MACs (Conv/Gemm/MatMul) x 2 ops over "]
    parts.append(f"{soc.int8_tops:g} INT8 TOPS at {compute_utilization:.0%} utilization"
                 if soc.int8_tops else "no INT8 TOPS in the catalog (compute bound omitted)")
    parts.append(f", and {cost.bytes_moved:,} bytes (weights once + every activation once, 8-bit) over ")
    parts.append(f"{soc.ddr_bandwidth_gbps:g} GB/s DRAM at {bandwidth_utilization:.0%}"
                 if soc.ddr_bandwidth_gbps else "no DRAM bandwidth in the catalog (memory bound omitted)")
    parts.append(f"; {bound}-bound; excludes fixed per-inference costs (dispatch, VTCM acquire)")
    if soc.perf_source:
        parts.append(f"; catalog figures: {soc.perf_source}")
    return LatencyEstimate(max(known.values()) if known else None, compute_ms, memory_ms, bound, "".join(parts))
