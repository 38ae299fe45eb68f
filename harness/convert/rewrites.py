"""Layer replacement: rewrites that turn a node the HTP refuses into equivalent nodes it takes.

Built-in rewrites name the nodes they apply to (`sites`) and rewrite one node at a time, so that the
conversion step keeps each replacement only where the model stays equivalent. A user's rewrite is a
Python function named in the model spec (`rewrites: ["pkg.module:fn"]` or `["path/to/file.py:fn"]`):

    def fn(model: onnx.ModelProto) -> onnx.ModelProto | list | None

It returns the rewritten model, or changes `model` in place and returns None or a list of what it
changed (each item a string, or a dict with `node`, `op`, `replacement`). When it returns a model or
None, the changes listed in the report are the nodes it removed and the op types it added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx

from harness.convert import copy_model
from harness.convert.opset import opset_of
from harness.errors import ConfigError
from harness.user_code import load_function

FLOAT_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Rewrite:
    """One row of the conversion report's `rewrites` table."""

    rewrite: str  # the built-in's name or the user's reference
    node: str
    op: str
    replacement: str
    applied: bool = True
    note: str = ""


@dataclass(frozen=True)
class BuiltinRewrite:
    """A general rewrite: the nodes it applies to, and how to rewrite one of them."""

    name: str
    why: str
    sites: Callable[[onnx.ModelProto], list[str]]
    apply: Callable[[onnx.ModelProto, str], tuple[onnx.ModelProto, str]]  # -> (model, replacement text)


def _constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}


def named(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return model with every unnamed main-graph node named '<op>_<index>' (rewrites address nodes by name)."""
    if all(n.name for n in model.graph.node):
        return model
    result = copy_model(model)
    taken = {n.name for n in result.graph.node}
    for index, node in enumerate(result.graph.node):
        if not node.name:
            name = f"{node.op_type}_{index}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)
    return result


def _computed_clip_sites(model: onnx.ModelProto) -> list[str]:
    consts = _constant_values(model)
    return [n.name for n in model.graph.node
            if n.op_type == "Clip" and n.name and any(b and b not in consts for b in n.input[1:3])]


def _clip_to_max_min(model: onnx.ModelProto, node_name: str) -> tuple[onnx.ModelProto, str]:
    """Clip(x, lo, hi) -> Min(Max(x, lo), hi); a constant hi of +inf or float32's max is dropped."""
    result = copy_model(model)
    consts = _constant_values(result)
    index, node = next((k, n) for k, n in enumerate(result.graph.node) if n.name == node_name)
    x, lo, hi = (list(node.input) + ["", ""])[:3]
    if hi and hi in consts and float(np.min(consts[hi])) >= FLOAT_MAX:
        hi = ""
    steps, current = [], x
    for op, bound in (("Max", lo), ("Min", hi)):
        if bound:
            out = f"{node_name}_{op.lower()}_out"
            steps.append(onnx.helper.make_node(op, [current, bound], [out], name=f"{node_name}_{op.lower()}"))
            current = out
    if not steps:
        steps.append(onnx.helper.make_node("Identity", [x], [node.output[0]], name=f"{node_name}_identity"))
    steps[-1].output[0] = node.output[0]
    del result.graph.node[index]
    for offset, new in enumerate(steps):
        result.graph.node.insert(index + offset, new)
    return result, " -> ".join(f"{s.op_type}({', '.join(s.input)})" for s in steps)


def _scalar_const(consts: dict[str, np.ndarray], name: str, value: float) -> bool:
    return name in consts and consts[name].size == 1 and abs(float(consts[name].ravel()[0]) - value) < 1e-4 * abs(value)


@dataclass(frozen=True)
class _Gelu:
    x: str
    output: str
    nodes: tuple[str, ...]  # the nodes the Gelu replaces


def _erf_gelus(model: onnx.ModelProto) -> dict[str, _Gelu]:
    """Find 0.5·x·(1 + erf(x/√2)) written with Erf: Div(x, √2) or Mul(x, 1/√2) -> Erf -> Add(1) ->
    Mul(x, .) -> Mul(0.5), or Mul(Mul(x, 0.5), .); keyed by the Erf node's name."""
    consts = _constant_values(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    outputs = {o.name for o in model.graph.output}

    def only_user(tensor: str) -> onnx.NodeProto | None:
        found = users.get(tensor, [])
        return found[0] if len(found) == 1 and tensor not in outputs else None

    def other(node: onnx.NodeProto, tensor: str) -> str:
        rest = [i for i in node.input if i != tensor]
        return rest[0] if len(rest) == 1 else ""

    found = {}
    for erf in model.graph.node:
        scale = producer.get(erf.input[0]) if erf.op_type == "Erf" and erf.name else None
        if scale is None or only_user(scale.output[0]) is not erf:
            continue
        if scale.op_type == "Div" and _scalar_const(consts, scale.input[1], 2 ** 0.5):
            x = scale.input[0]
        elif scale.op_type == "Mul" and any(_scalar_const(consts, i, 2 ** -0.5) for i in scale.input):
            x = next(i for i in scale.input if not _scalar_const(consts, i, 2 ** -0.5))
        else:
            continue
        add = only_user(erf.output[0])
        if add is None or add.op_type != "Add" or not _scalar_const(consts, other(add, erf.output[0]), 1.0):
            continue
        mul = only_user(add.output[0])
        if mul is None or mul.op_type != "Mul":
            continue
        partner = other(mul, add.output[0])
        half = only_user(mul.output[0])
        if partner == x and half is not None and half.op_type == "Mul" and \
                _scalar_const(consts, other(half, mul.output[0]), 0.5):
            found[erf.name] = _Gelu(x, half.output[0], (scale.name, erf.name, add.name, mul.name, half.name))
            continue
        pre = producer.get(partner)
        if pre is not None and pre.op_type == "Mul" and x in pre.input and \
                _scalar_const(consts, other(pre, x), 0.5) and only_user(pre.output[0]) is mul:
            found[erf.name] = _Gelu(x, mul.output[0], (scale.name, erf.name, add.name, pre.name, mul.name))
    return found


def _erf_gelu_sites(model: onnx.ModelProto) -> list[str]:
    return list(_erf_gelus(model))


def _erf_gelu_to_gelu(model: onnx.ModelProto, erf_name: str) -> tuple[onnx.ModelProto, str]:
    """The Erf-written GELU around node erf_name -> one Gelu (ai.onnx Gelu from opset 20, else com.microsoft)."""
    gelu = _erf_gelus(model)[erf_name]
    result = copy_model(model)
    domain = "" if opset_of(result) >= 20 else "com.microsoft"
    if domain and not any(o.domain == domain for o in result.opset_import):
        result.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    position = min(k for k, n in enumerate(result.graph.node) if n.name in gelu.nodes)
    kept = [n for n in result.graph.node if n.name not in gelu.nodes]
    del result.graph.node[:]
    result.graph.node.extend(kept[:position])
    result.graph.node.append(onnx.helper.make_node("Gelu", [gelu.x], [gelu.output], name=f"{erf_name}_gelu",
                                                   domain=domain))
    result.graph.node.extend(kept[position:])
    return result, f"Gelu({gelu.x}) [{', '.join(gelu.nodes)}]"


BUILTIN: tuple[BuiltinRewrite, ...] = (
    BuiltinRewrite("clip_computed_bounds", "the QNN EP takes a Clip only with constant min/max",
                   _computed_clip_sites, _clip_to_max_min),
    BuiltinRewrite("erf_gelu", "a lone Erf is refused by the HTP in 8-bit form; GELU written with Erf is "
                   "one Gelu op (qnn_preprocess_model misses this form)", _erf_gelu_sites, _erf_gelu_to_gelu),
)


_CONTROL_FLOW = {"If", "Loop", "Scan"}


def _branch_free_ifs(model: onnx.ModelProto) -> list[str]:
    """If nodes whose branches hold no control flow of their own."""
    sites = []
    for node in model.graph.node:
        if node.op_type != "If" or not node.name:
            continue
        branches = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
        if all(not any(n.op_type in _CONTROL_FLOW for n in g.node) and len(g.output) == len(node.output)
               for g in branches):
            sites.append(node.name)
    return sites


def _inline_branch(graph: onnx.GraphProto,
                   prefix: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], list[str]]:
    """Return a branch's nodes and initializers with its own tensors renamed under prefix, and its outputs."""
    own = {i.name for i in graph.initializer} | {o for n in graph.node for o in n.output if o}
    rename = {name: f"{prefix}{name}" for name in own}
    nodes = []
    for n in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        copy.name = f"{prefix}{n.name or n.op_type}"
        copy.input[:] = [rename.get(i, i) for i in n.input]
        copy.output[:] = [rename.get(o, o) for o in n.output]
        nodes.append(copy)
    inits = []
    for init in graph.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = rename[init.name]
        inits.append(copy)
    return nodes, inits, [rename.get(o.name, o.name) for o in graph.output]


def _if_to_where(model: onnx.ModelProto, node_name: str) -> tuple[onnx.ModelProto, str]:
    """If(cond) -> both branches computed, each output selected by Where(cond, then, else)."""
    result = copy_model(model)
    index, node = next((k, n) for k, n in enumerate(result.graph.node) if n.name == node_name)
    branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    then_nodes, then_inits, then_outs = _inline_branch(branches["then_branch"], f"{node_name}/then/")
    else_nodes, else_inits, else_outs = _inline_branch(branches["else_branch"], f"{node_name}/else/")
    selects = [onnx.helper.make_node("Where", [node.input[0], t, e], [out], name=f"{node_name}/where_{k}")
               for k, (t, e, out) in enumerate(zip(then_outs, else_outs, node.output))]
    del result.graph.node[index]
    for offset, new in enumerate([*then_nodes, *else_nodes, *selects]):
        result.graph.node.insert(index + offset, new)
    result.graph.initializer.extend([*then_inits, *else_inits])
    return result, (f"then ({len(then_nodes)} nodes) and else ({len(else_nodes)} nodes) both computed, "
                    f"{len(selects)} Where")


# Built-ins a model spec enables by name (`rewrites: [if_to_where]`): they change the cost of the
# model (both branches of an If run), so they are not applied unasked.
OPTIONAL: dict[str, BuiltinRewrite] = {
    "if_to_where": BuiltinRewrite(
        "if_to_where", "the HTP runs no If; both branches computed and selected with Where (XLA's "
        "conditional-to-select)", _branch_free_ifs, _if_to_where),
}


def load_rewrite(reference: str) -> Callable[[onnx.ModelProto], object]:
    """Return the function a rewrite reference names ('pkg.module:fn' or 'path/to/file.py:fn');
    raises ConfigError naming the reference when it cannot be imported or is not callable."""
    return load_function(reference, "rewrite", f"a built-in name ({', '.join(OPTIONAL)})")


def apply_user_rewrite(model: onnx.ModelProto, reference: str) -> tuple[onnx.ModelProto, list[Rewrite]]:
    """Return the model after the user's rewrite and the changes it made (see the module docstring).

    Raises ConfigError naming the reference when it cannot be loaded, raises, or returns something else.
    """
    fn = load_rewrite(reference)
    work = copy_model(model)
    try:
        returned = fn(work)
    except Exception as e:
        raise ConfigError(f"rewrite '{reference}' raised {type(e).__name__}: {e}") from None
    if isinstance(returned, onnx.ModelProto):
        result, listed = returned, None
    elif returned is None or isinstance(returned, list):
        result, listed = work, returned
    else:
        raise ConfigError(f"rewrite '{reference}' returned a {type(returned).__name__}; expected an "
                          "onnx.ModelProto, a list of changes or None")
    if listed:
        rows = [Rewrite(reference, str(c.get("node", "")), str(c.get("op", "")), str(c.get("replacement", "")))
                if isinstance(c, dict) else Rewrite(reference, "", "", str(c)) for c in listed]
    else:
        rows = _diff_rows(model, result, reference)
    return result, rows


def _diff_rows(before: onnx.ModelProto, after: onnx.ModelProto, reference: str) -> list[Rewrite]:
    after_names = {n.name for n in after.graph.node}
    before_names = {n.name for n in before.graph.node}
    added = sorted({n.op_type for n in after.graph.node if n.name not in before_names})
    return [Rewrite(reference, n.name, n.op_type, ", ".join(added) or "(removed)")
            for n in before.graph.node if n.name not in after_names]
