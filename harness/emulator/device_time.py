"""The emulated device's modelled time: what one inference of a model costs on the SoC the device models.

An emulated device runs the HTP simulator on the host for real outputs and errors, but its latency, throughput,
heat and energy come from this model, never from the simulator's wall time (which follows the host's speed and
load). One inference costs::

    latency = roofline estimate (harness.estimate, labelled `estimate`) + DISPATCH_MS

times the throttle factor the thermal model (harness.emulator.thermal) holds at that moment. N sessions sharing
the HTP take turns: each sees the sum of the sessions' latencies plus CONTEXT_SWITCH_MS per session
(the device runner's shared_latency_s).

DISPATCH_MS is the fixed per-inference cost the roofline leaves out (the CPU-to-HTP call, graph-execute set-up,
cache maintenance). It is calibrated on one published figure, Qualcomm AI Hub's MobileNet-v2 w8a8
(qai_hub_models/models/mobilenet_v2/perf.yaml, QAIRT 2.41): 0.316 ms (qnn_dlc; 0.30 ms tflite) on a Galaxy S24
(sm8650), where the roofline of a 224x224 MobileNet-v2 QDQ graph gives 0.196 ms (memory-bound: 10.5 MB over
76.8 GB/s at 70 %); the 0.12 ms residual is rounded down to 0.1 ms. Against the same table the modelled latency
of that graph is 0.296 ms on sm8650 (-6 % vs 0.316), 0.278 ms on sm8750 (+25 % vs 0.222 on a Galaxy S25) and
0.324 ms on sm8550 (-29 % vs 0.458 on the QCS8550 proxy): about +-30 % for a convolutional network on the phones
of the catalog. For other graphs the error is not known: the roofline counts only Conv/Gemm/MatMul MACs and
8-bit bytes, so graphs dominated by other ops (attention, LayerNorm, large Softmax) or by 16-bit activations
run slower on a phone than modelled. CONTEXT_SWITCH_MS (the HTP switching between two sessions' contexts) is an
assumption, not a measurement.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.estimate import GraphCost, estimate_latency, graph_cost
from harness.files import write_text_atomically

DISPATCH_MS = 0.1
CONTEXT_SWITCH_MS = 0.01
GRAPH_COST_FILE = "graph_cost.json"  # beside a context binary: the cost of the graph it was compiled from
_COSTS: dict[tuple[str, int, int], GraphCost | None] = {}


@dataclass(frozen=True)
class ModelledLatency:
    """One inference's modelled time on the emulated HTP (unthrottled), its parts and what it rests on."""

    latency_ms: float
    estimate_ms: float | None
    dispatch_ms: float
    basis: str

    def as_dict(self) -> dict:
        """The modelled latency as a KPI object."""
        return asdict(self)


def record_graph_cost(directory: Path, source_model: Path) -> None:
    """Write GRAPH_COST_FILE (the cost of source_model) into a context binary's directory, once."""
    path = Path(directory) / GRAPH_COST_FILE
    if path.is_file():
        return

    cost = graph_cost(Path(source_model))
    write_text_atomically(path, json.dumps({"source_model": Path(source_model).name, **asdict(cost)}, indent=1) + "\n")


def graph_cost_of(model: Path) -> GraphCost | None:
    """Return the cost of model's graph: GRAPH_COST_FILE beside a context binary, else the model's own graph;
    None for a context binary without that file (its graph is opaque)."""
    model = Path(model)
    stat = model.stat()
    key = (str(model.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _COSTS:
        _COSTS[key] = _graph_cost(model)
    return _COSTS[key]


def _graph_cost(model: Path) -> GraphCost | None:
    sidecar = model.parent / GRAPH_COST_FILE
    if sidecar.is_file():
        data = json.loads(sidecar.read_text())
        return GraphCost(int(data["macs"]), int(data["weight_bytes"]), int(data["activation_bytes"]))
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    if any(node.op_type == "EPContext" for node in graph.node):
        return None
    return graph_cost(model)


def modelled_latency(model: Path, soc) -> ModelledLatency:
    """Return the modelled (unthrottled) latency of one inference of model on soc (a SocSpec)."""
    cost = graph_cost_of(model)
    if cost is None:
        return ModelledLatency(DISPATCH_MS, None, DISPATCH_MS,
                               f"{Path(model).name} is a context binary without {GRAPH_COST_FILE}: its graph's cost "
                               f"is unknown, so only the dispatch cost ({DISPATCH_MS:g} ms) is modelled")
    estimate = estimate_latency(cost, soc)
    if estimate.latency_ms is None:
        return ModelledLatency(DISPATCH_MS, None, DISPATCH_MS,
                               f"the catalog has no INT8 TOPS or DRAM bandwidth for {soc.id}: only the dispatch cost "
                               f"({DISPATCH_MS:g} ms) is modelled")
    return ModelledLatency(estimate.latency_ms + DISPATCH_MS, estimate.latency_ms, DISPATCH_MS,
                           f"roofline estimate {estimate.latency_ms:.4g} ms ({estimate.bound}-bound, {soc.id}) + "
                           f"{DISPATCH_MS:g} ms dispatch (harness.emulator.device_time: about +-30 % against "
                           "AI Hub's MobileNet-v2 w8a8; unknown for other graphs)")
