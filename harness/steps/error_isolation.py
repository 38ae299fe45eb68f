"""Step 3, stage 3: layer-by-layer error isolation, float against quantized, on the host and on the HTP.

Every intermediate tensor is compared in one inference pass per model and runtime:

* float side: onnxruntime's `qdq_loss_debug.modify_model_output_intermediate_tensors` exposes every
  float tensor of the converted model as an output, `collect_activations` runs it once per sample;
* quantized side: the QDQ model with the output of every activation's QuantizeLinear added to its
  graph outputs. No node is added, so the HTP compiles the same QDQ node units and computes exactly
  what the plain QDQ model computes (onnxruntime's augmenter would put float Reshape nodes after the
  DequantizeLinear nodes, which breaks the node units and makes the HTP run them in fp16). The same
  model runs on the host (CPU EP, graph optimizations off: onnxruntime's QDQ emulation) and on the
  device's `htp` runtime (CPU fallback disabled), and the integer tensors are dequantized here.

A tensor whose cosine similarity is below 0.9 on the HTP but not in the host emulation points at the
HTP (kernel, runtime); below 0.9 on both, at quantization.
"""

from __future__ import annotations

import json
import math
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.cache import ArtifactCache, content_key
from harness.data import Dataset, Feed
from harness.errors import StepError
from harness.metrics import as_flat, cosine_of, mean_abs, mean_square, sqnr_of
from harness.reporting import charts
from harness.runner.client import DeviceRunner, HtpRefusedError
from harness.steps.inference import host_qdq_run
from harness.steps.ptq import MATH_ERROR_COSINE
from harness.steps.report import StepReport

DEFAULT_SAMPLES = 4
WORST_NODES = 5
SENSITIVE_TENSORS = 8
_QUANT_INPUT_SUFFIX = "_QuantizeLinear_Input"
_ONNX_INT_TYPES = {2: (np.uint8, 8), 3: (np.int8, 8), 4: (np.uint16, 16), 5: (np.int16, 16)}


@dataclass(frozen=True)
class ExposedTensor:
    """A quantized activation made visible: float tensor name, exposed QuantizeLinear output, encoding."""

    tensor: str
    output: str
    scale: float
    zero_point: int
    bitwidth: int

    def dequantize(self, values: np.ndarray) -> np.ndarray:
        """Return the real values of the integer tensor `values`, flattened."""
        return ((np.asarray(values, dtype=np.float64).ravel() - self.zero_point) * self.scale).astype(np.float32)


@dataclass(frozen=True)
class LayerStats:
    """One compared tensor: where it sits in the graph and how far each runtime is from float."""

    index: int
    node: str
    op_type: str
    tensor: str
    bitwidth: int
    cosine_htp: float
    sqnr_htp_db: float
    mae_htp: float
    cosine_host: float
    sqnr_host_db: float
    mae_host: float
    cosine_htp_vs_host: float
    upstream_cosine: float
    cosine_drop: float
    fused_tensors: str  # float tensors folded into this one by the quantizer (e.g. a Conv output before Relu)
    upstream_tensors: str
    sensitivity_rank: int = 0


# ------------------------------------------------------------------------------------ capture

def expose_quantized_tensors(qdq_model: Path, cache: ArtifactCache) -> tuple[Path, list[ExposedTensor]]:
    """Return a copy of qdq_model with every activation's QuantizeLinear output as a graph output,
    and what was exposed (cached)."""
    def build(out: Path) -> None:
        import onnx
        from onnx import numpy_helper

        model = onnx.load(str(qdq_model))
        inits = {i.name: i for i in model.graph.initializer}
        producers = {o: n for n in model.graph.node for o in n.output}
        outputs = {o.name for o in model.graph.output}
        exposed: list[ExposedTensor] = []
        seen: set[str] = set()
        for node in model.graph.node:
            if node.op_type != "QuantizeLinear":
                continue
            source = node.input[0]
            if source in producers and producers[source].op_type == "DequantizeLinear":
                continue  # a precision conversion of an already exposed tensor
            tensor = source[: -len(_QUANT_INPUT_SUFFIX)] if source.endswith(_QUANT_INPUT_SUFFIX) else source
            scale = numpy_helper.to_array(inits[node.input[1]]) if node.input[1] in inits else None
            zp_init = inits.get(node.input[2]) if len(node.input) > 2 else None
            if scale is None or scale.size != 1 or tensor in seen:
                continue
            elem = zp_init.data_type if zp_init is not None else onnx.TensorProto.UINT8
            if elem not in _ONNX_INT_TYPES:
                continue
            zero = int(numpy_helper.to_array(zp_init).ravel()[0]) if zp_init is not None else 0
            seen.add(tensor)
            exposed.append(ExposedTensor(tensor, node.output[0], float(scale.ravel()[0]), zero,
                                         _ONNX_INT_TYPES[elem][1]))
            if node.output[0] not in outputs:
                model.graph.output.append(onnx.helper.make_tensor_value_info(node.output[0], elem, None))
        onnx.save(model, str(out / "model.onnx"))
        (out / "tensors.json").write_text(json.dumps([asdict(e) for e in exposed], indent=1))

    entry = cache.entry("exposed", content_key("exposed-v1", qdq_model), build)
    tensors = [ExposedTensor(**e) for e in json.loads((entry.path / "tensors.json").read_text())]
    return entry.path / "model.onnx", tensors


def float_debug_model(float_model: Path, cache: ArtifactCache) -> Path:
    """Return a cached copy of float_model with every intermediate tensor as a graph output (qdq_loss_debug)."""
    from onnxruntime.quantization.qdq_loss_debug import modify_model_output_intermediate_tensors

    def build(out: Path) -> None:
        source = out / "float.onnx"  # the tool writes a shape-inferred copy beside its input
        shutil.copyfile(float_model, source)
        modify_model_output_intermediate_tensors(str(source), str(out / "model.onnx"))
        source.unlink()

    return cache.entry("debug_float", content_key("debug-float-v1", float_model), build).path / "model.onnx"


def float_activations(float_model: Path, feeds: list[Feed], cache: ArtifactCache) -> dict[str, list[np.ndarray]]:
    """Return every float tensor of float_model on feeds (flattened), from one pass per sample,
    with onnxruntime's qdq_loss_debug."""
    from onnxruntime.quantization.qdq_loss_debug import collect_activations

    from harness.quantization.calibration import FeedReader

    augmented = float_debug_model(float_model, cache)
    try:
        return collect_activations(str(augmented), FeedReader(feeds))
    except Exception as e:
        raise StepError(f"float intermediate capture of {float_model.name} failed: {type(e).__name__}: {e}") from None


def host_quantized_activations(exposed_model: Path, tensors: list[ExposedTensor],
                               feeds: list[Feed]) -> dict[str, list[np.ndarray]]:
    """Return the dequantized activations of the exposed QDQ model on the host's QDQ emulation."""
    runs = host_qdq_run(exposed_model, feeds, [t.output for t in tensors])
    return {t.tensor: [t.dequantize(r[t.output]) for r in runs] for t in tensors}


RETRIES_ON_REFUSAL = 4  # exposed models rebuilt without the tensors beside nodes the HTP refused


def _beside_refused(exposed_model: Path, tensors: list[ExposedTensor], refused: set[str]) -> set[str]:
    """Return the exposed outputs next to the refused nodes and to the nodes of the same pattern (op type and the op
    types producing its inputs through Q/DQ: the same block repeated in the next layer): the QuantizeLinear outputs
    their inputs are dequantized from, and those quantizing their outputs."""
    import onnx

    nodes = onnx.load(str(exposed_model), load_external_data=False).graph.node
    producer = {o: n for n in nodes for o in n.output}

    def source(name: str) -> str:
        node = producer.get(name)
        while node is not None and node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            node = producer.get(node.input[0])
        return node.op_type if node is not None else "input"

    def pattern(node) -> tuple:
        return node.op_type, tuple(source(i) for i in node.input if i)

    patterns = {pattern(n) for n in nodes if n.name in refused}
    near: set[str] = set()
    for node in (n for n in nodes if n.name in refused or pattern(n) in patterns):
        for name in node.input:  # x_q -> DequantizeLinear -> node
            dq = producer.get(name)
            if dq is not None and dq.op_type == "DequantizeLinear":
                near.add(dq.input[0])
        near |= {q.output[0] for q in nodes if q.op_type == "QuantizeLinear" and q.input[0] in node.output}
    return near & {t.output for t in tensors}


def _without_outputs(exposed_model: Path, dropped: set[str], cache: ArtifactCache) -> Path:
    """Return a copy of the exposed model without the graph outputs dropped (cached)."""
    def build(out: Path) -> None:
        import onnx

        model = onnx.load(str(exposed_model))
        kept = [o for o in model.graph.output if o.name not in dropped]
        del model.graph.output[:]
        model.graph.output.extend(kept)
        onnx.save(model, str(out / "model.onnx"))

    return cache.entry("exposed", content_key("exposed-without-v1", exposed_model, sorted(dropped)), build).path \
        / "model.onnx"


def device_quantized_activations(exposed_model: Path, tensors: list[ExposedTensor], feeds: list[Feed],
                                 runner: DeviceRunner, cache: ArtifactCache
                                 ) -> tuple[dict[str, list[np.ndarray]], int, list[ExposedTensor]]:
    """Return the dequantized activations of the exposed QDQ model on the device's `htp` runtime, how many graph
    nodes the HTP ran (CPU fallback is disabled, so that is all of them), and the tensors left unexposed: a tensor
    made a graph output can stop QNN from fusing the nodes around it (an attention's Transpose into its MatMul),
    so when the HTP refuses nodes of the exposed model the tensors beside them are not exposed (up to
    RETRIES_ON_REFUSAL times)."""
    dropped: set[str] = set()
    model = exposed_model
    for attempt in range(RETRIES_ON_REFUSAL + 1):
        try:
            run = runner.run(model, feeds, "htp")
            break
        except HtpRefusedError as e:
            more = _beside_refused(exposed_model, tensors, {n.node for n in e.nodes}) - dropped
            if not more or attempt == RETRIES_ON_REFUSAL:
                raise
            dropped |= more
            model = _without_outputs(exposed_model, dropped, cache)
    left_out = [t for t in tensors if t.output in dropped]
    tensors = [t for t in tensors if t.output not in dropped]
    missing = [t.output for t in tensors if run.outputs and t.output not in run.outputs[0]]
    if missing:
        raise StepError(f"the device runner returned no output for {len(missing)} exposed tensor(s), "
                        f"e.g. {missing[0]}")
    acts = {t.tensor: [t.dequantize(o[t.output]) for o in run.outputs] for t in tensors}
    return acts, sum(p.on_htp for p in run.placement), left_out


# ------------------------------------------------------------------------------------ compare

@dataclass(frozen=True)
class HostSide:
    """One tensor's host QDQ emulation against float, and the float side's parts the HTP's comparison reuses."""

    cosine_host: float
    sqnr_host_db: float
    mae_host: float
    norm_float: float
    norm_host: float
    signal: float  # the float activation's mean square


def host_side_stats(float_acts: dict[str, list[np.ndarray]], host_acts: dict[str, list[np.ndarray]],
                    tensors: list[ExposedTensor]) -> dict[str, HostSide]:
    """Return HostSide per exposed tensor that has a float and a host QDQ activation of the same size: what
    compare_layers needs before the device's activations arrive, so it can be computed while the device runs."""
    names = [t.tensor for t in tensors if t.tensor in float_acts and t.tensor in host_acts
             and _same_size(float_acts[t.tensor], host_acts[t.tensor])]
    with ThreadPoolExecutor(2, thread_name_prefix="compare-layers") as pool:  # numpy releases the GIL: 2 cores
        return dict(zip(names, pool.map(lambda t: _host_side(float_acts[t], host_acts[t]), names)))


def _host_side(float_act: list[np.ndarray], host_act: list[np.ndarray]) -> HostSide:
    f, h = as_flat(float_act), as_flat(host_act)
    norm_f, norm_h, diff, signal = np.linalg.norm(f), np.linalg.norm(h), f - h, mean_square(f)
    return HostSide(cosine_of(f, h, norm_f, norm_h), sqnr_of(signal, mean_square(diff)), mean_abs(diff),
                    norm_f, norm_h, signal)


def compare_layers(float_model: Path, float_acts: dict[str, list[np.ndarray]],
                   host_acts: dict[str, list[np.ndarray]], htp_acts: dict[str, list[np.ndarray]],
                   tensors: list[ExposedTensor],
                   host_side: dict[str, HostSide] | None = None) -> tuple[list[LayerStats], int]:
    """Return per-tensor statistics in topological order (ranked for sensitivity), and how many
    float tensors have no quantized counterpart (folded away by the quantizer). host_side: host_side_stats of
    these activations, when already computed (the tensors it lacks are computed here)."""
    import onnx

    model = onnx.load(str(float_model), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    bits = {t.tensor: t.bitwidth for t in tensors}
    order = [i.name for i in model.graph.input if i.name not in inits]
    order += [o for n in model.graph.node for o in n.output if o]
    compared = [t for t in order if t in bits and t in float_acts and t in htp_acts and t in host_acts
                and _same_size(float_acts[t], htp_acts[t])]
    compared_set = set(compared)
    host_side = host_side or {}

    def tensor_stats(t: str) -> dict:
        host = host_side.get(t) or _host_side(float_acts[t], host_acts[t])
        return _tensor_stats(float_acts[t], htp_acts[t], host_acts[t], host)

    with ThreadPoolExecutor(2, thread_name_prefix="compare-layers") as pool:  # numpy releases the GIL: 2 cores
        stats = dict(zip(compared, pool.map(tensor_stats, compared)))
    upstream_memo: dict[str, tuple[frozenset, frozenset]] = {}

    def upstream(tensor: str) -> tuple[frozenset, frozenset]:
        """(compared tensors feeding tensor's producer, uncompared tensors folded in between)."""
        if tensor not in upstream_memo:
            ups, fused = set(), set()
            node = producer.get(tensor)
            for name in (node.input if node is not None else []):
                if not name or name in inits:
                    continue
                if name in compared_set:
                    ups.add(name)
                elif name in producer:
                    u, f = upstream(name)
                    ups |= u
                    fused |= f | {name}
            upstream_memo[tensor] = (frozenset(ups), frozenset(fused))
        return upstream_memo[tensor]

    rows = []
    for index, tensor in enumerate(compared):
        ups, fused = upstream(tensor)
        node = producer.get(tensor)
        up_cos = min((stats[u]["cosine_htp"] for u in ups), default=1.0)
        rows.append(LayerStats(
            index=index, node=(node.name or tensor) if node is not None else f"input:{tensor}",
            op_type=node.op_type if node is not None else "Input", tensor=tensor, bitwidth=bits[tensor],
            **stats[tensor], upstream_cosine=up_cos,
            cosine_drop=up_cos - stats[tensor]["cosine_htp"],
            fused_tensors=";".join(t for t in order if t in fused),
            upstream_tensors=";".join(t for t in order if t in ups)))
    not_compared = sum(1 for t in order if t not in compared_set)
    return _rank(rows), not_compared


def _tensor_stats(float_act: list[np.ndarray], htp_act: list[np.ndarray], host_act: list[np.ndarray],
                  host: HostSide) -> dict:
    """Return one tensor's LayerStats metrics (HTP and host QDQ against float, HTP against host), each tensor
    flattened once, each norm and difference computed once (host: the host side's, see host_side_stats)."""
    f, q, h = as_flat(float_act), as_flat(htp_act), as_flat(host_act)
    norm_q, diff = np.linalg.norm(q), f - q
    return {"cosine_htp": cosine_of(f, q, host.norm_float, norm_q),
            "sqnr_htp_db": sqnr_of(host.signal, mean_square(diff)), "mae_htp": mean_abs(diff),
            "cosine_host": host.cosine_host, "sqnr_host_db": host.sqnr_host_db, "mae_host": host.mae_host,
            "cosine_htp_vs_host": cosine_of(h, q, host.norm_host, norm_q)}


def _same_size(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.size(x) == np.size(y) for x, y in zip(a, b))


def _rank(rows: list[LayerStats]) -> list[LayerStats]:
    """Set sensitivity_rank: the nodes that lose most cosine similarity first, each preceded by the
    compared inputs it amplifies (a precision-hostile tensor shows in its consumers, not itself)."""
    by_tensor = {r.tensor: r for r in rows}
    order: list[str] = []
    for row in sorted(rows, key=lambda r: (-r.cosine_drop, r.index)):
        ups = sorted((t for t in row.upstream_tensors.split(";") if t), key=lambda t: by_tensor[t].cosine_htp)
        for t in [*ups, row.tensor]:
            if t not in order:
                order.append(t)
    rank = {t: i + 1 for i, t in enumerate(order)}
    return [LayerStats(**{**asdict(r), "sensitivity_rank": rank[r.tensor]}) for r in rows]


# ------------------------------------------------------------------------------------ the step

def isolate_errors(float_model: Path, qdq_model: Path, dataset: Dataset, runner: DeviceRunner,
                   ptq_report: StepReport, cache: ArtifactCache, samples: int = DEFAULT_SAMPLES) -> StepReport:
    """Return the error-isolation report: per-layer float-vs-quantized statistics on the host's QDQ
    emulation and the device's `htp` runtime; it fails only when ptq_report failed (a limit decisively missed),
    and is inconclusive with it when PTQ's evidence could not decide."""
    feeds = dataset.evaluation[:samples]
    if not feeds:
        raise StepError("error isolation needs at least one evaluation sample")
    exposed_model, tensors = expose_quantized_tensors(qdq_model, cache)
    with ThreadPoolExecutor(1, thread_name_prefix="htp-activations") as pool:  # the host's runs overlap the device's
        device = pool.submit(device_quantized_activations, exposed_model, tensors, feeds, runner, cache)
        float_acts = float_activations(float_model, feeds, cache)
        host_acts = host_quantized_activations(exposed_model, tensors, feeds)
        host_side = host_side_stats(float_acts, host_acts, tensors)  # the host's half of the comparison, meanwhile
        htp_acts, htp_nodes, left_out = device.result()
    rows, not_compared = compare_layers(float_model, float_acts, host_acts, htp_acts, tensors, host_side)
    if not rows:
        raise StepError(f"no quantized activation of {qdq_model.name} matches a tensor of {float_model.name}")
    report = StepReport("error_isolation")
    first, first_host, cause = divergence(rows)
    worst = sorted(rows, key=lambda r: (-r.cosine_drop, r.index))[:WORST_NODES]
    ranked = sorted(rows, key=lambda r: r.sensitivity_rank)
    report.kpis = {
        "runtime": "htp", "reference_runtime": "host_qdq", "samples": len(feeds),
        "layers_compared": len(rows), "tensors_not_compared": not_compared,
        "first_divergent_node": first.node if first else None,
        "first_divergent_tensor": first.tensor if first else None,
        "first_divergent_node_host": first_host.node if first_host else None,
        "divergence_cause": cause,
        "worst_nodes": [{"node": r.node, "op_type": r.op_type, "tensor": r.tensor,
                         "cosine_similarity": r.cosine_htp, "sqnr_db": r.sqnr_htp_db,
                         "cosine_drop": r.cosine_drop} for r in worst],
        "min_cosine_similarity": min(r.cosine_htp for r in rows),
        "min_cosine_similarity_host": min(r.cosine_host for r in rows),
        "min_cosine_htp_vs_host": min(r.cosine_htp_vs_host for r in rows),
        "sensitive_tensors": [r.tensor for r in ranked[:SENSITIVE_TENSORS]],
        "htp_nodes": htp_nodes, "ptq_passed": ptq_report.passed, "ptq_status": ptq_report.status,
        "math_error_cosine": MATH_ERROR_COSINE,
    }
    report.tables["per_layer"] = [_table_row(r) for r in rows]
    if left_out:
        report.kpis["tensors_not_exposed_on_htp"] = [t.tensor for t in left_out]
        report.notes.append(f"{len(left_out)} activation(s) beside nodes the HTP refused once their neighbours were "
                            f"graph outputs were not compared on the HTP: {', '.join(t.tensor for t in left_out[:6])}")
    if cause == "htp":
        report.notes.append(f"{first.node} ({first.op_type}) diverges on the HTP (cosine {first.cosine_htp:.3f}) but "
                            f"not in host QDQ emulation ({first.cosine_host:.3f}): an HTP kernel/runtime issue, "
                            "not quantization")
    if ptq_report.problems():
        report.failures.append(_failure(ptq_report, first, worst, cause))
    elif ptq_report.undecided():
        report.inconclusive.append(f"PTQ could not be decided ({ptq_report.undecided()[0]}); "
                                   f"{_diagnosis(first, worst, cause)}")
    report.artifacts.update(_write_artifacts(rows, first, cache))
    return report


def divergence(rows: list[LayerStats]) -> tuple[LayerStats | None, LayerStats | None, str | None]:
    """Return the first tensor below cosine 0.9 on the HTP, the first in host QDQ emulation, and the
    cause: 'quantization' (both diverge there, or the HTP stays closer to the host emulation than the
    emulation is to float: a borderline 0.89 against 0.91), 'htp' (only the HTP does), 'host_only', or None."""
    first = next((r for r in rows if r.cosine_htp < MATH_ERROR_COSINE), None)
    first_host = next((r for r in rows if r.cosine_host < MATH_ERROR_COSINE), None)
    if first is not None:
        htp_own = first.cosine_host >= MATH_ERROR_COSINE and first.cosine_htp_vs_host < first.cosine_host
        cause = "htp" if htp_own else "quantization"
    else:
        cause = "host_only" if first_host is not None else None
    return first, first_host, cause


def _failure(ptq_report: StepReport, first: LayerStats | None, worst: list[LayerStats], cause: str | None) -> str:
    why = ptq_report.problems()[0] if ptq_report.problems() else "PTQ did not pass"
    return f"PTQ missed its KPI ({why}); {_diagnosis(first, worst, cause)}"


def _diagnosis(first: LayerStats | None, worst: list[LayerStats], cause: str | None) -> str:
    sensitive = ", ".join(f"{r.node} ({r.op_type}, cosine {r.cosine_htp:.3f}, -{r.cosine_drop:.3f})"
                          for r in worst[:3])
    if first is None:
        return (f"no layer drops below cosine {MATH_ERROR_COSINE} on the HTP: "
                f"precision loss spread over the graph; most sensitive nodes: {sensitive}")
    where = "the HTP only (host QDQ emulation is fine)" if cause == "htp" else "quantization"
    return (f"the loss starts at node {first.node} ({first.op_type}, tensor "
            f"'{first.tensor}', inputs {first.upstream_tensors.replace(';', ', ') or '-'}): cosine "
            f"{first.cosine_htp:.3f} on the HTP, {first.cosine_host:.3f} in host QDQ emulation, caused by {where}; "
            f"most sensitive nodes: {sensitive}")


def _table_row(r: LayerStats) -> dict:
    row = asdict(r)
    return {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in row.items()}


def ranked_promotion_units(report: StepReport) -> list[list[str]]:
    """Return each compared tensor with the tensors folded into it ([*folded, tensor]), most sensitive
    first, from an error-isolation report (harness.steps.promotion ties these into promotion units)."""
    rows = sorted(report.tables.get("per_layer", []), key=lambda r: r["sensitivity_rank"])
    return [[t for t in r["fused_tensors"].split(";") if t] + [r["tensor"]] for r in rows]


def _write_artifacts(rows: list[LayerStats], first: LayerStats | None, cache: ArtifactCache) -> dict[str, Path]:
    """Queue the SQNR plot (cached by the table's content, drawn on the chart thread); the table itself goes out as
    CSV with the report."""
    key = content_key("error-isolation-plot-v1", [_table_row(r) for r in rows])
    rows_drawn = [(r.index, r.node, r.sqnr_host_db, r.sqnr_htp_db, r.cosine_host, r.cosine_htp) for r in rows]
    marked = (first.index, first.node, first.sqnr_htp_db) if first is not None else None
    return {"sqnr_plot": charts.in_cache(cache, "error_isolation", key, "sqnr_along_graph.png", charts.sqnr_along_graph,
                                         rows_drawn, marked, MATH_ERROR_COSINE)}
