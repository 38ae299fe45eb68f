"""The ONNX op types the QNN execution provider can hand to the HTP, for when no session can be built.

When onnxruntime refuses to create a session for a model (a kernel it lacks, a graph it cannot
type, the QNN EP failing to compile a partition), there is no real placement to read; the
feasibility step then names, from the model's graph and every subgraph (If/Loop/Scan bodies),
the op types outside this set.

Source: the op builders the QNN EP registers, `OpBuilderRegistrations` in
onnxruntime/core/providers/qnn/builder/op_builder_factory.cc of github.com/onnxruntime/onnxruntime-qnn
(commit cee6c0d, 2026-03-13, the QNN EP 2.x plugin line this project installs as onnxruntime-qnn).
The installed onnxruntime-qnn 2.7.0 (QNN 2.51) may register more; a registered op can still be
refused for an attribute, type or rank the HTP does not take, which only a real session shows —
so this set is the fallback, never a substitute for the device's placement. Seen on the v75 HTP
simulator: Softplus and Selu (not listed) ran on the HTP, Asin (listed) only in its 8-bit form,
Erf and Softsign (not listed) on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import onnx

QNN_EP_OPS_SOURCE = ("onnxruntime-qnn op_builder_factory.cc (github.com/onnxruntime/onnxruntime-qnn, "
                     "commit cee6c0d, 2026-03)")

QNN_EP_OPS = frozenset("""
Abs Add And ArgMax ArgMin Asin Atan AveragePool BatchNormalization Cast Ceil Clip Concat Conv ConvTranspose
Cos CumSum DepthToSpace DequantizeLinear Div Einsum Elu Equal Exp Expand Flatten Floor FusedMatMul Gather
GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual GridSample
GroupNormalization HardSigmoid HardSwish InstanceNormalization Inverse IsNaN LRN LSTM LayerNormalization
LeakyRelu Less LessOrEqual Log LogSoftmax LpNormalization MatMul MatMulNBits Max MaxPool Mean Min Mod Mul
Neg Not Or PRelu Pad Pow QuantizeLinear QuickGelu RMSNormalization RandomUniformLike Reciprocal ReduceMax
ReduceMean ReduceMin ReduceProd ReduceSum Relu Reshape Resize RoiAlign Round STFT ScatterElements ScatterND
Sigmoid Sign SimplifiedLayerNormalization Sin Slice Softmax SpaceToDepth Split Sqrt Squeeze Sub Sum Tan
Tanh ThresholdedRelu Tile TopK Transpose Unsqueeze Upsample Where
""".split())

QNN_EP_DOMAINS = frozenset({"", "ai.onnx", "com.microsoft"})  # the domains of the ops above
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})  # the CPU EP runs them where the QNN EP does not (v68)
# Removed by onnxruntime's graph optimisation before any EP is asked (so never placed anywhere).
REMOVED_BEFORE_PLACEMENT = frozenset({"Constant", "Identity", "Dropout"})


@dataclass(frozen=True)
class GraphNode:
    """A node of a model's graph or of one of its subgraphs."""

    node: str  # the node's name, or OpType_<index> when it has none
    op_type: str  # domain-qualified outside the default domains, e.g. 'com.example:Mystery'
    graph: str = ""  # '' for the main graph, else the path of the subgraph, e.g. 'If_25/then_branch'

    def __str__(self) -> str:
        where = f" in {self.graph}" if self.graph else ""
        return f"{self.node} ({self.op_type}){where}"


def walk_nodes(graph: onnx.GraphProto, path: str = "") -> Iterator[GraphNode]:
    """Yield every node of graph and, depth first, of the subgraphs its nodes hold."""
    for index, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{index}"
        op = node.op_type if node.domain in QNN_EP_DOMAINS else f"{node.domain}:{node.op_type}"
        yield GraphNode(name, op, path)
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                yield from walk_nodes(sub, f"{path}/{name}/{attr.name}".lstrip("/"))


def outside_qnn_ep(model: onnx.ModelProto) -> list[GraphNode]:
    """Return the nodes of model (graph and subgraphs) whose op type the QNN EP has no builder for
    (control flow included; the ops onnxruntime removes before placement excluded)."""
    return [n for n in walk_nodes(model.graph)
            if n.op_type not in QNN_EP_OPS and n.op_type not in REMOVED_BEFORE_PLACEMENT]
