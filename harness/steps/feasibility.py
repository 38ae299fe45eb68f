"""Step 1, architecture feasibility: real HTP node placement, static shapes, memory footprint."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from harness.devices import SocSpec
from harness.errors import DeviceLostError, DeviceTimeoutError, RunnerError
from harness.kpi import Limit
from harness.models import Thresholds
from harness.placement import QDQ_OPS, group_nodes, refused_nodes
from harness.qnn_ops import (CONTROL_FLOW_OPS, QNN_EP_OPS_SOURCE, REMOVED_BEFORE_PLACEMENT, GraphNode, outside_qnn_ep,
                             walk_nodes)
from harness.quantization.prequantized import InexactQuantization
from harness.runner.base import NodePlacement
from harness.runner.client import DeviceRunner, HtpRefusedError, QnnFinalizeError
from harness.steps.report import StepReport

_TOKEN_SUFFIX = re.compile(r"^(?P<base>.+?)(_token_\d+)+$")
_RUNNER_PREFIX = re.compile(r"^(\[[^\]]*\] )?device runner \(\w+\) on [^:]+: ")  # RunnerError's framing
_EXIT_SUFFIX = re.compile(r" \(exit code -?\d+\)$")


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
FORM_LABELS = {"float": "float graph (FP16 on the HTP)", "quantized": "8-bit QDQ form that PTQ produces",
               "own": "model's own QDQ form, as given"}


def needs_quantized_placement(soc: SocSpec) -> bool:
    """True when the SoC's HTP runs no float math, so op support must be checked on a QDQ model."""
    return soc.htp_arch < FIRST_FP16_HTP_ARCH


@dataclass
class FormPlacement:
    """The placement of one form of the model (float or quantized) on the device's HTP."""

    form: str  # 'float' | 'quantized'
    label: str = ""  # what was placed, for messages (FORM_LABELS[form] unless set)
    rows: list[dict] = field(default_factory=list)  # per node of the float graph (+ refused Q/DQ nodes)
    session_error: str | None = None  # onnxruntime refused to build a session even with fallback allowed
    outside: list[GraphNode] = field(default_factory=list)  # then: nodes whose op type the QNN EP lacks
    boundary_qdq_on_cpu: int = 0  # Q/DQ nodes at inputs/outputs on the CPU with fallback allowed (not counted)
    boundary_qdq_checked: bool = False  # a fallback-disabled session confirmed they run on the HTP
    finalize_failed: bool = False  # session_error is the HTP backend's finalization failure, explained

    @property
    def unsupported(self) -> list[dict]:
        """Rows of the nodes that would not run on the HTP."""
        if self.session_error is not None:
            rows = [{"node": n.node, "op_type": n.op_type, "placement": "no session", "graph": n.graph}
                    for n in self.outside]
        else:
            rows = [r for r in self.rows if r["placement"] in ("CPU", "HTP+CPU")]
        return sorted(rows, key=lambda r: r["op_type"] not in CONTROL_FLOW_OPS)  # control flow first: the cause

    @property
    def on_htp(self) -> int:
        """Nodes the HTP runs."""
        return sum(r["placement"] == "HTP" for r in self.rows)

    @property
    def placed(self) -> int:
        """Nodes placed on an EP (not removed by graph optimisation)."""
        return sum(r["placement"] not in ("eliminated",) for r in self.rows)

    @property
    def htp_fraction(self) -> float:
        """Share of the placed nodes the HTP runs (0 when no session could be built)."""
        return self.on_htp / self.placed if self.placed else 0.0

    def describe(self) -> str:
        """Return the unsupported nodes, named when few, grouped by op type when many (placement.group_nodes)."""
        return group_nodes([GraphNode(r["node"], r["op_type"], r.get("graph") or "") for r in self.unsupported])


def place_form(form: str, model_path: Path, float_model: onnx.ModelProto, runner: DeviceRunner) -> FormPlacement:
    """Return the real placement of model_path (the float graph, or its QDQ form) on the device's HTP,
    CPU fallback allowed, mapped onto float_model's nodes; when onnxruntime builds no session, the
    nodes (graph and subgraphs) whose op type the QNN EP has no builder for."""
    try:
        run = runner.run(model_path, None, "htp", allow_cpu_fallback=True, placement_only=True)
    except (DeviceLostError, DeviceTimeoutError):
        raise
    except QnnFinalizeError as e:  # every op has a builder; the backend could not prepare the graph
        return FormPlacement(form, session_error=e.summary, finalize_failed=True)
    except RunnerError as e:
        source = onnx.load(str(model_path), load_external_data=False)
        said = _RUNNER_PREFIX.sub("", str(e).splitlines()[0])
        return FormPlacement(form, session_error=_EXIT_SUFFIX.sub("", said), outside=outside_qnn_ep(source))
    placement = FormPlacement(form, rows=map_placement(float_model, run.placement))
    if form == "quantized":
        _add_quantized_nodes(placement, model_path, run.placement, runner)
    return placement


def _add_quantized_nodes(placement: FormPlacement, qdq_path: Path, placed: list[NodePlacement],
                         runner: DeviceRunner) -> None:
    """Add the QDQ form's own Q/DQ nodes that left the HTP; Q/DQ nodes at the graph's inputs/outputs
    are not counted (fallback-allowed sessions put them on the CPU; PTQ's fallback-disabled session
    runs them on the HTP, which a second session confirms when nothing else left the HTP)."""
    qdq = onnx.load(str(qdq_path), load_external_data=False)
    known = {r["node"] for r in placement.rows}
    cpu_qdq = [p for p in placed if p.op_type in QDQ_OPS and not p.on_htp and p.node not in known]
    refused = refused_nodes(qdq, cpu_qdq)
    placement.boundary_qdq_on_cpu = len(cpu_qdq) - len(refused)
    if cpu_qdq and not refused and not placement.unsupported:
        try:
            runner.run(qdq_path, None, "htp", placement_only=True)  # CPU fallback disabled, as PTQ runs it
            placement.boundary_qdq_checked = True
        except HtpRefusedError as e:  # the HTP refuses them after all: count them
            refused = list(e.nodes) or cpu_qdq
            placement.boundary_qdq_on_cpu = 0
        except (DeviceLostError, DeviceTimeoutError):
            raise
        except QnnFinalizeError as e:  # the whole graph on the HTP does not fit: not the Q/DQ nodes' doing
            placement.session_error, placement.finalize_failed = e.summary, True
            return
        except RunnerError:  # no fallback-disabled session at all: they are what kept it from loading
            refused, placement.boundary_qdq_on_cpu = cpu_qdq, 0
    # Q/DQ nodes beside a node that left the HTP follow it to the CPU: listed, but the op to act on is that node
    where = "CPU (beside a CPU node)" if placement.unsupported else "CPU"
    placement.rows.extend({"node": p.node, "op_type": p.op_type, "placement": where} for p in refused)


def check_feasibility(model_path: Path, soc: SocSpec, runner: DeviceRunner, thresholds: Thresholds,
                      quantized_model: Path | None = None, own_quantization: bool = False) -> StepReport:
    """Return the feasibility report of the model that ships on the device's HTP.

    model_path is the (converted) float model; quantized_model its 8-bit QDQ form as PTQ builds it.
    Both are placed by a real QNN EP session on the device with CPU fallback allowed (so every
    unsupported node is found in one pass): the float graph where the HTP has FP16 (v69 and later),
    the QDQ form always. The step fails naming every node and op type the quantized form (the one
    that ships; the float graph when no QDQ form could be built) would not run on the HTP, or, when
    onnxruntime builds no session, every op type outside the QNN EP's set, graph and subgraphs.
    With own_quantization, quantized_model is the model's own QDQ form (it arrived quantized): placed as it is.
    """
    model = onnx.load(str(model_path))
    forms: dict[str, FormPlacement] = {}
    if not needs_quantized_placement(soc):
        forms["float"] = place_form("float", model_path, model, runner)
    if quantized_model is not None:
        forms["quantized"] = place_form("quantized", quantized_model, model, runner)
        forms["quantized"].label = FORM_LABELS["own" if own_quantization else "quantized"]
    report = StepReport("feasibility")
    if not forms:
        report.failures.append(f"the {soc.name} HTP (v{soc.htp_arch}) has no FP16 and no 8-bit QDQ form of the "
                               "model could be built: op placement could not be checked")
        return report
    ships = forms.get("quantized") or forms["float"]
    rows = ships.rows
    act_name, act_bytes = largest_activation(model)
    w_bytes = weights_bytes(model)
    elem = max((_elem_bytes(v.type.tensor_type.elem_type) for v in model.graph.input), default=4)
    act_bytes_int8 = act_bytes // elem
    unsupported = ships.unsupported
    report.kpis = {
        "nodes_total": len(model.graph.node),
        "form_checked": ships.form,
        "nodes_on_htp": ships.on_htp,
        "nodes_eliminated": sum(r["placement"] == "eliminated" for r in rows),
        "htp_fraction": ships.htp_fraction,
        "unsupported_ops": sorted({r["op_type"] for r in unsupported}),
        "unsupported_nodes": [r["node"] for r in unsupported],
    }
    for form, placement in forms.items():
        report.kpis.update({f"nodes_on_htp_{form}": placement.on_htp, f"htp_fraction_{form}": placement.htp_fraction,
                            f"unsupported_ops_{form}": sorted({r["op_type"] for r in placement.unsupported})})
        if placement.session_error is not None:
            report.kpis[f"session_error_{form}"] = placement.session_error
    if "quantized" in forms:
        report.kpis["boundary_qdq_on_cpu"] = forms["quantized"].boundary_qdq_on_cpu
        report.kpis["qdq_nodes_beside_cpu_nodes"] = sum(r["placement"] == "CPU (beside a CPU node)"
                                                         for r in forms["quantized"].rows)
    report.kpis.update({
        "op_histogram": dict(Counter(n.op_type for n in model.graph.node).most_common()),
        "largest_activation": act_name,
        "largest_activation_bytes": act_bytes,
        "largest_activation_bytes_int8": act_bytes_int8,
        "weights_bytes": w_bytes,
        "memory_footprint_bytes": w_bytes + act_bytes,
        "vtcm_bytes": soc.vtcm_bytes,
        "fits_vtcm": act_bytes_int8 <= soc.vtcm_bytes,
        "static_shapes": True,
    })
    report.limits = [Limit("htp_fraction", minimum=thresholds.min_htp_fraction, marginal=0.0),
                     Limit("memory_footprint_bytes", maximum=thresholds.memory_budget_mb * 1024 * 1024)]
    report.tables["op_placement"] = rows
    report.tables["placement_by_form"] = [
        {"form": p.form, "checked_on": p.label or FORM_LABELS[p.form], "nodes_on_htp": p.on_htp,
         "nodes_placed": p.placed,
         "htp_fraction": round(p.htp_fraction, 4),
         "unsupported_ops": " ".join(sorted({r["op_type"] for r in p.unsupported})),
         "session_error": p.session_error or ""} for p in forms.values()]
    if "float" in forms and ships is not forms["float"]:
        report.tables["op_placement_float"] = forms["float"].rows
    _explain(report, model, forms, ships, soc)
    if act_bytes_int8 > soc.vtcm_bytes:
        report.notes.append(f"largest activation '{act_name}' is {act_bytes_int8 / 2**20:.1f} MiB at 8 bits, "
                            f"more than the {soc.vtcm_mb:g} MiB VTCM: expect tiling and DDR traffic")
    return report


def inexact_quantization(error: InexactQuantization) -> StepReport:
    """Return the feasibility report of a model quantized in a form the HTP cannot run and no static QDQ model
    expresses exactly (run-time quantization): failed, naming its nodes and op types."""
    report = StepReport("feasibility")
    report.kpis = {"prequantized": True, "quantization_form": "not static QDQ",
                   "unsupported_ops": sorted({op for _, op in error.nodes}),
                   "unsupported_nodes": [name for name, _ in error.nodes]}
    report.failures.append(str(error))
    return report


def _bodies(model: onnx.ModelProto, ships: FormPlacement) -> str:
    """Return ' (If_25 holds 150 nodes: Conv, LSTM, ...)' for the control-flow nodes that stay off the HTP."""
    names = {r["node"] for r in ships.unsupported if r["op_type"] in CONTROL_FLOW_OPS}
    parts = []
    for node in model.graph.node:
        if node.name in names:
            inner = [n for a in node.attribute if a.type == onnx.AttributeProto.GRAPH for n in walk_nodes(a.g)]
            ops = sorted({n.op_type for n in inner} - REMOVED_BEFORE_PLACEMENT)
            more = f", and {len(ops) - 8} more op types" if len(ops) > 8 else ""
            parts.append(f"{node.name} holds {len(inner)} node(s): {', '.join(ops[:8]) or 'none'}{more}")
    return f" ({'; '.join(parts)})" if parts else ""


def _explain(report: StepReport, model: onnx.ModelProto, forms: dict[str, FormPlacement], ships: FormPlacement,
             soc: SocSpec) -> None:
    """Record the failure naming what would not run, and notes on the other form and boundary Q/DQ."""
    htp = f"the {soc.name} HTP (v{soc.htp_arch})"
    checked = ships.label or FORM_LABELS[ships.form]
    if ships.finalize_failed:
        float_form = forms.get("float")
        prepared = float_form is not None and float_form is not ships and float_form.session_error is None
        report.failures.append(f"the {checked} cannot be prepared for {htp}: {ships.session_error}" + (
            f"\nthe float graph is prepared on {htp} in FP16 ({float_form.on_htp} of {float_form.placed} nodes on "
            "the HTP): it is the quantized graph QNN cannot prepare, not the model's size" if prepared else ""))
    elif ships.session_error is not None:
        ops = sorted({n.op_type for n in ships.outside})
        report.failures.append(
            f"onnxruntime could not build a session for the {checked} on {htp}, even with CPU fallback "
            f"allowed: {len(ships.outside)} node(s) of op types outside the QNN EP's set ({', '.join(ops) or 'none'})"
            f"\nnodes, graph and subgraphs: {ships.describe()}\nonnxruntime said: {ships.session_error}"
            f"\nthe QNN EP's set: {QNN_EP_OPS_SOURCE}")
    elif ships.unsupported:
        report.failures.append(
            f"{len(ships.unsupported)} node(s) cannot run on {htp}: {ships.describe()} (checked on the {checked})"
            "\nReplace these ops (the conversion step's layer replacements), or package them as custom ops "
            "(qnn-op-package-generator).")
    control = sorted({r["op_type"] for r in ships.unsupported} & CONTROL_FLOW_OPS)
    if control:
        report.failures.append(
            f"{'/'.join(control)} (control flow) stays off this HTP{_bodies(model, ships)}\nThe other nodes "
            "listed may be refused only with it (on HTP v68 the QNN EP left all of hey_jarvis's nodes to the CPU "
            "with its If, none without). When the condition depends on an input that is constant in deployment, "
            "freeze it (--freeze-input NAME=VALUE) so conversion folds the branch away; otherwise run the branches "
            "as separate models and choose between them in the application.")
    other = forms.get("float")
    if other is not None and other is not ships and other.unsupported and not ships.unsupported:
        shipped = "model's own QDQ form" if ships.label == FORM_LABELS["own"] else "8-bit QDQ form"
        report.notes.append(f"the float graph would not run wholly on {htp} in FP16 ({other.describe()}); "
                            f"the {shipped} is what ships, and it was checked")
    if needs_quantized_placement(soc):
        report.notes.append(f"{htp} has no FP16: op placement was checked on an 8-bit QDQ form of the model")
    quantized = forms.get("quantized")
    if quantized is not None and quantized.boundary_qdq_on_cpu:
        # Expected and confirmed: a KPI, not a warning. Unconfirmed: say what the count rests on.
        report.kpis["boundary_qdq_confirmed_on_htp"] = quantized.boundary_qdq_checked
        if not quantized.boundary_qdq_checked:
            report.notes.append(f"{quantized.boundary_qdq_on_cpu} Q/DQ node(s) at the graph's inputs/outputs land on "
                                "the CPU when fallback is allowed and are not counted: with CPU fallback disabled, "
                                "as PTQ runs, the HTP runs them (observed with onnxruntime-qnn 2.7.0)")
