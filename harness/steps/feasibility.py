"""Step 1, architecture feasibility: real HTP node placement, static shapes, memory footprint."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from harness.devices import SocSpec
from harness.kpi import Limit
from harness.models import Thresholds
from harness.runner.client import DeviceRunner, NodePlacement
from harness.steps.report import StepReport

_TOKEN_SUFFIX = re.compile(r"^(?P<base>.+?)(_token_\d+)+$")


def _elem_bytes(elem_type: int) -> int:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize


def largest_activation(model: onnx.ModelProto) -> tuple[str, int]:
    """Return (tensor name, bytes as stored) of the largest inferred activation of a shape-fixed model."""
    best = ("", 0)
    values = [*model.graph.input, *model.graph.value_info, *model.graph.output]
    inits = {i.name for i in model.graph.initializer}
    for v in values:
        if v.name in inits or not v.type.HasField("tensor_type"):
            continue
        dims = v.type.tensor_type.shape.dim
        if not dims or any(not d.HasField("dim_value") for d in dims):
            continue
        size = int(np.prod([d.dim_value for d in dims])) * _elem_bytes(v.type.tensor_type.elem_type)
        if size > best[1]:
            best = (v.name, size)
    return best


def weights_bytes(model: onnx.ModelProto) -> int:
    """Return the total size of the model's initializers as stored."""
    return sum(int(np.prod(i.dims)) * _elem_bytes(i.data_type) for i in model.graph.initializer)


def map_placement(model: onnx.ModelProto, placement: list[NodePlacement]) -> list[dict]:
    """Return one row per original node: its op type and the EP(s) its optimised form landed on.

    The QNN EP's layout transformation renames nodes (`conv1` → `conv1_token_1`) and inserts
    Transposes; those are folded back onto the original node. Nodes removed by graph
    optimisation before partitioning are marked 'eliminated'.
    """
    eps: dict[str, set[str]] = {}
    for p in placement:
        m = _TOKEN_SUFFIX.match(p.node)
        for name in {p.node, m.group("base") if m else p.node}:
            eps.setdefault(name, set()).add(p.ep)
    rows = []
    for index, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{index}"
        landed = eps.get(name, set())
        if not landed:
            placed = "eliminated"
        elif landed == {"QNNExecutionProvider"}:
            placed = "HTP"
        else:
            placed = "CPU" if "QNNExecutionProvider" not in landed else "HTP+CPU"
        rows.append({"node": name, "op_type": node.op_type, "placement": placed})
    return rows


FIRST_FP16_HTP_ARCH = 69  # HTP v68 has no FP16: float graphs cannot be placed on it as they are


def needs_quantized_placement(soc: SocSpec) -> bool:
    """True when the SoC's HTP runs no float math, so op support must be checked on a QDQ model."""
    return soc.htp_arch < FIRST_FP16_HTP_ARCH


def check_feasibility(model_path: Path, soc: SocSpec, runner: DeviceRunner, thresholds: Thresholds,
                      placement_model: Path | None = None) -> StepReport:
    """Return the feasibility report of a shape-fixed float model on the device's HTP.

    Placement comes from a real QNN EP session on the device (CPU fallback allowed, so every
    unsupported node is found in one pass), on placement_model when given (an 8-bit QDQ form of
    the same graph, for HTPs without FP16), else on the float model.
    """
    model = onnx.load(str(model_path))
    run = runner.run(placement_model or model_path, None, "htp", allow_cpu_fallback=True, placement_only=True)
    rows = map_placement(model, run.placement)
    unsupported = [r for r in rows if r["placement"] in ("CPU", "HTP+CPU")]
    on_htp = sum(r["placement"] == "HTP" for r in rows)
    counted = sum(r["placement"] != "eliminated" for r in rows)
    act_name, act_bytes = largest_activation(model)
    w_bytes = weights_bytes(model)
    elem = max((_elem_bytes(v.type.tensor_type.elem_type) for v in model.graph.input), default=4)
    act_bytes_int8 = act_bytes // elem
    report = StepReport("feasibility")
    report.kpis = {
        "nodes_total": len(rows),
        "nodes_on_htp": on_htp,
        "nodes_eliminated": len(rows) - counted,
        "htp_fraction": on_htp / counted if counted else 0.0,
        "unsupported_ops": sorted({r["op_type"] for r in unsupported}),
        "unsupported_nodes": [r["node"] for r in unsupported],
        "op_histogram": dict(Counter(r["op_type"] for r in rows).most_common()),
        "largest_activation": act_name,
        "largest_activation_bytes": act_bytes,
        "largest_activation_bytes_int8": act_bytes_int8,
        "weights_bytes": w_bytes,
        "memory_footprint_bytes": w_bytes + act_bytes,
        "vtcm_bytes": soc.vtcm_bytes,
        "fits_vtcm": act_bytes_int8 <= soc.vtcm_bytes,
        "static_shapes": True,
    }
    report.limits = [Limit("htp_fraction", minimum=thresholds.min_htp_fraction, marginal=0.0),
                     Limit("memory_footprint_bytes", maximum=thresholds.memory_budget_mb * 1024 * 1024)]
    report.tables["op_placement"] = rows
    if unsupported:
        report.failures.append(
            f"{len(unsupported)} node(s) cannot run on the {soc.name} HTP (v{soc.htp_arch}): " +
            "; ".join(f"{r['node']} ({r['op_type']})" for r in unsupported) +
            ". Replace these ops, or package them as custom ops (qnn-op-package-generator).")
    if placement_model is not None:
        report.notes.append(f"the {soc.name} HTP (v{soc.htp_arch}) has no FP16: op placement was checked on an "
                            "8-bit QDQ form of the model")
    if act_bytes_int8 > soc.vtcm_bytes:
        report.notes.append(f"largest activation '{act_name}' is {act_bytes_int8 / 2**20:.1f} MiB at 8 bits, "
                            f"more than the {soc.vtcm_mb:g} MiB VTCM: expect tiling and DDR traffic")
    return report
