"""Promotion units for mixed precision: the groups of activations that must go to 16 bits together.

Promoting one activation to 16 bits gains nothing when its precision is bound to other tensors':

* **folded**: a tensor the quantizer folds into another (a Conv output feeding a Relu it removes)
  has no encoding of its own (error isolation records it in `fused_tensors`);
* **shared encoding**: onnxruntime's QDQ quantizer gives some ops' outputs their input's scale and
  zero point (`quantize_output_same_as_input`: Reshape, Transpose, Squeeze, Unsqueeze, Flatten,
  Slice, AveragePool, MaxPool, Resize, Pad, Split, Gather, TopK). These ties are read from the QDQ
  model itself — tensors whose QuantizeLinear nodes use the same scale initializer — so they follow
  whatever the installed quantizer does;
* **value-selecting ops**: an op whose outputs only select or rearrange its inputs' values (Concat,
  Max, Min, MaxPool, the data-movement ops) cannot be more precise than its inputs: promoting a
  Concat's output leaves an 8-bit input with a large range (the quantizer converts it from 8 to 16
  bits at the Concat) as coarse as before, so inputs and outputs go together.

The units are joined with a union-find over these ties and pre-ranked by error isolation's
sensitivity rank (the most sensitive member of the unit). Outputs of Constant nodes and non-float
tensors (shape arithmetic) are no activations and never promoted.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from harness.steps.error_isolation import ranked_promotion_units
from harness.steps.report import StepReport

VALUE_SELECTING_OPS = frozenset({
    "Concat", "Max", "Min", "MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice",
    "Split", "Gather", "GatherElements", "Identity", "DepthToSpace", "SpaceToDepth", "Tile", "Expand"})
_QUANT_INPUT_SUFFIX = "_QuantizeLinear_Input"


@dataclass(frozen=True)
class PromotionUnit:
    """Activations promoted to 16 bits together: all of them (topological order), those quantized in
    the QDQ model (a QuantizeLinear of their own), why they are tied, and the unit's pre-rank."""

    tensors: tuple[str, ...]
    quantized: tuple[str, ...]
    ties: tuple[str, ...] = ()
    pre_rank: int = 0

    @property
    def label(self) -> str:
        """The unit's name in reports: its last tensor in topological order."""
        return self.tensors[-1]

    @property
    def size(self) -> int:
        """How many quantized activations the unit promotes (what the budget counts; at least 1)."""
        return max(1, len(self.quantized))


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def add(self, x: str) -> None:
        self.parent.setdefault(x, x)

    def find(self, x: str) -> str:
        self.add(x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        self.parent[rb] = ra
        return True


def quantized_activations(qdq_model: Path) -> dict[str, str]:
    """Return {activation tensor: its scale initializer} for every activation QuantizeLinear of
    qdq_model (8-to-16-bit conversions skipped); tensors sharing a scale share an encoding."""
    import onnx

    model = onnx.load(str(qdq_model), load_external_data=False)
    producers = {o: n for n in model.graph.node for o in n.output}
    weights = {i.name for i in model.graph.initializer}
    scales: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in weights:
            continue
        source = node.input[0]
        if source in producers and producers[source].op_type == "DequantizeLinear":
            continue
        tensor = source[: -len(_QUANT_INPUT_SUFFIX)] if source.endswith(_QUANT_INPUT_SUFFIX) else source
        scales.setdefault(tensor, node.input[1])
    return scales


def _not_activations(model) -> set[str]:
    """Return the tensors that are no activations to promote: outputs of Constant nodes (weights a
    Paddle or TensorFlow export writes as nodes) and tensors shape inference types as non-float
    (shape arithmetic folded in between two activations)."""
    import onnx

    excluded = {o for n in model.graph.node if n.op_type in ("Constant", "ConstantOfShape") for o in n.output}
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # a graph onnx cannot infer keeps every tensor; the quantizer decides
        return excluded
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        elem = value.type.tensor_type.elem_type
        if elem and elem not in floats:
            excluded.add(value.name)
    return excluded


def promotion_units(float_model: Path, qdq_model: Path, isolation: StepReport) -> list[PromotionUnit]:
    """Return the promotion units of float_model, most sensitive first (error isolation's rank of the
    unit's most sensitive member), tied as the module docstring says, from qdq_model's encodings."""
    import onnx

    rows = isolation.tables.get("per_layer", [])
    model = onnx.load(str(float_model), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    order = [i.name for i in model.graph.input if i.name not in inits]
    order += [o for n in model.graph.node for o in n.output if o]
    position = {t: i for i, t in enumerate(order)}
    excluded = _not_activations(model)
    scales = {t: s for t, s in quantized_activations(qdq_model).items() if t not in excluded}
    rank = {r["tensor"]: int(r["sensitivity_rank"]) for r in rows if r["tensor"] not in excluded}
    known = set(scales) | set(rank)
    uf = _UnionFind()
    reasons: dict[str, list[str]] = defaultdict(list)  # keyed by a member; gathered per root at the end

    def tie(members: list[str], why: str) -> None:
        members = [m for m in members if m]
        for m in members:
            uf.add(m)
        joined = [uf.union(members[0], m) for m in members[1:]]
        if any(joined):
            reasons[members[0]].append(why)

    for *fused, tensor in ranked_promotion_units(isolation):
        fused = [t for t in fused if t not in excluded]
        if tensor in excluded:
            continue
        uf.add(tensor)
        if fused:
            tie([tensor, *fused], f"folded into {tensor}: {', '.join(fused)}")
    for tensor in scales:
        uf.add(tensor)
    by_scale: dict[str, list[str]] = defaultdict(list)
    for tensor, scale in scales.items():
        by_scale[scale].append(tensor)
    for scale, tensors in by_scale.items():
        if len(tensors) > 1:
            tie(sorted(tensors, key=lambda t: position.get(t, len(position))),
                f"one encoding ({scale}): {', '.join(tensors)}")
    for node in model.graph.node:
        if node.op_type not in VALUE_SELECTING_OPS:
            continue
        members = [t for t in [*node.input, *node.output] if t in known]
        if len(members) > 1:
            tie(members, f"{node.op_type} {node.name or node.output[0]}: inputs and output")

    groups: dict[str, list[str]] = defaultdict(list)
    for tensor in uf.parent:
        groups[uf.find(tensor)].append(tensor)
    why: dict[str, list[str]] = defaultdict(list)
    for member, items in reasons.items():
        why[uf.find(member)].extend(items)
    units = []
    for root, members in groups.items():
        members.sort(key=lambda t: position.get(t, len(position)))
        ranks = [rank[t] for t in members if t in rank]
        units.append(PromotionUnit(tensors=tuple(members), quantized=tuple(t for t in members if t in scales),
                                   ties=tuple(why[root]), pre_rank=min(ranks) if ranks else 0))
    unranked = 1 + max((u.pre_rank for u in units), default=0)
    return sorted(units, key=lambda u: (u.pre_rank or unranked, position.get(u.tensors[0], len(position))))
