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

from harness.qnn_ops import walk_nodes

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


class Named(Protocol):
    """A node by name and op type (a NodePlacement, a qnn_ops.GraphNode with its subgraph path `graph`)."""

    node: str
    op_type: str


class Placed(Named, Protocol):
    """A node as a placement reports it (harness.runner.base.NodePlacement)."""

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


GROUP_AFTER = 5  # more nodes than this are listed by op type, not one by one


def _depth(graph: str) -> int:
    """Return how many control-flow nodes deep a subgraph path is ('If_25/else_branch/If_651/else_branch': 2)."""
    return len(graph.split("/")) // 2 if graph else 0


def group_nodes(nodes: Sequence[Named], names: int = 3) -> str:
    """Return a node list a reader takes in at a glance: up to GROUP_AFTER nodes as 'name (Op); ...' (with
    the subgraph they are in), more grouped by op type in the order given, as '41 If nodes, nested up to 4
    deep, under If_0' or '12 Reshape nodes: Reshape_1, Reshape_2, Reshape_7, and 9 more' (names: how many to
    name)."""
    if len(nodes) <= GROUP_AFTER:
        return "; ".join(f"{n.node} ({n.op_type})" + (f" in {n.graph}" if getattr(n, "graph", "") else "")
                         for n in nodes)
    by_op: dict[str, list[Named]] = {}
    for n in nodes:
        by_op.setdefault(n.op_type, []).append(n)
    parts = []
    for op, group in by_op.items():
        graphs = [getattr(n, "graph", "") or "" for n in group]
        if len(group) == 1:
            parts.append(f"{group[0].node} ({op})" + (f" in {graphs[0]}" if graphs[0] else ""))
            continue
        text = f"{len(group)} {op} nodes"
        deepest = max(_depth(g) for g in graphs)
        if deepest:
            roots = list(dict.fromkeys(g.split("/")[0] if g else n.node for n, g in zip(group, graphs)))
            text += f", nested up to {deepest} deep, under {', '.join(roots[:names])}"
            text += f" and {len(roots) - names} more" if len(roots) > names else ""
        else:
            text += ": " + ", ".join(n.node for n in group[:names])
            text += f", and {len(group) - names} more" if len(group) > names else ""
        parts.append(text)
    return "; ".join(parts)


def refusal_message(model_path: Path, cpu: Sequence[Placed], soc_label: str) -> tuple[str, list[Placed]]:
    """Return (message, refused nodes) for a model the HTP refused with CPU fallback disabled, given
    the nodes a fallback-allowed session put on the CPU; Q/DQ nodes beside a refused node are
    counted, not listed."""
    refused = refused_nodes(onnx.load(str(model_path), load_external_data=False), cpu)
    primary = [p for p in refused if p.op_type not in QDQ_OPS] or refused
    beside = len(refused) - len(primary)
    if primary:
        what = (f"{len(primary)} node(s) cannot run on the {soc_label} HTP: {group_nodes(primary)} "
                f"(op types: {', '.join(sorted({p.op_type for p in primary}))})")
        what += f", with {beside} Q/DQ node(s) beside them" if beside else ""
    else:
        what = (f"the {soc_label} HTP refused it although with CPU fallback allowed only Q/DQ nodes at the "
                f"graph's inputs/outputs leave the HTP: {group_nodes(list(cpu)) or 'none reported'}")
    return (f"{what}; CPU fallback is disabled, so the model cannot run on the HTP as it is: run the "
            "feasibility step for the full placement", refused)
