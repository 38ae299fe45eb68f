"""Which nodes of a QDQ model the HTP refuses, from a placement with CPU fallback allowed.

With CPU fallback allowed, the QNN EP leaves the QuantizeLinear nodes that read the graph's
inputs and the DequantizeLinear nodes that write its outputs to the CPU; with fallback disabled
(as PTQ and the later steps run) the HTP runs them (observed with onnxruntime-qnn 2.7.0, see
tests/test_feasibility.py). Those boundary Q/DQ nodes are not refused nodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

import onnx

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


class Placed(Protocol):
    """A node as a placement reports it (harness.runner.client.NodePlacement)."""

    node: str
    op_type: str
    ep: str


def boundary_qdq(model: onnx.ModelProto) -> set[str]:
    """Return the names of the Q nodes reading a graph input and the DQ nodes writing a graph output."""
    inputs = {i.name for i in model.graph.input}
    outputs = {o.name for o in model.graph.output}
    return {n.name for n in model.graph.node
            if (n.op_type == "QuantizeLinear" and n.input and n.input[0] in inputs)
            or (n.op_type == "DequantizeLinear" and any(o in outputs for o in n.output))}


def subgraph_node_names(model: onnx.ModelProto) -> set[str]:
    """Return the names of the nodes inside the model's subgraphs (If/Loop/Scan bodies)."""
    from harness.qnn_ops import walk_nodes

    return {n.node for n in walk_nodes(model.graph) if n.graph}


def refused_nodes(model: onnx.ModelProto, cpu: Sequence[Placed]) -> list[Placed]:
    """Return the nodes among cpu (placed off the HTP with fallback allowed) that the HTP refuses:
    all but the boundary Q/DQ nodes, the Q/DQ nodes onnxruntime's layout optimisation made itself at
    the boundary (named after no node of model), and the nodes inside the bodies of a control-flow
    node (they run where their If/Loop/Scan runs, which is itself listed)."""
    boundary = boundary_qdq(model)
    names = {n.name for n in model.graph.node}
    inner = subgraph_node_names(model)
    return [p for p in cpu if p.node not in inner or p.node in names
            if p.op_type not in QDQ_OPS or (p.node in names and p.node not in boundary)]


def describe(nodes: Sequence[Placed], limit: int = 20) -> str:
    """Return 'name (Op); name (Op); ...', at most limit nodes, then how many more."""
    shown = "; ".join(f"{p.node} ({p.op_type})" for p in nodes[:limit])
    return shown + (f"; and {len(nodes) - limit} more" if len(nodes) > limit else "")


def refusal_message(model_path: Path, cpu: Sequence[Placed], soc_label: str) -> tuple[str, list[Placed]]:
    """Return (message, refused nodes) for a model the HTP refused with CPU fallback disabled, given
    the nodes a fallback-allowed session put on the CPU; Q/DQ nodes beside a refused node are
    counted, not listed."""
    refused = refused_nodes(onnx.load(str(model_path), load_external_data=False), cpu)
    primary = [p for p in refused if p.op_type not in QDQ_OPS] or refused
    beside = len(refused) - len(primary)
    if primary:
        what = (f"{len(primary)} node(s) cannot run on the {soc_label} HTP: {describe(primary)} "
                f"(op types: {', '.join(sorted({p.op_type for p in primary}))})")
        what += f", with {beside} Q/DQ node(s) beside them" if beside else ""
    else:
        what = (f"the {soc_label} HTP refused it although with CPU fallback allowed only Q/DQ nodes at the "
                f"graph's inputs/outputs leave the HTP: {describe(list(cpu)) or 'none reported'}")
    return (f"{what}; CPU fallback is disabled, so the model cannot run on the HTP as it is: run the "
            "feasibility step for the full placement", refused)
