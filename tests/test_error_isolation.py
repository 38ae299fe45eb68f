"""Error isolation on the real HTP simulator: the demonstration model's hostile tensor is named."""

from __future__ import annotations

import csv
import io

import numpy as np
import onnx
import pytest

from accuracy_helpers import demo_onboarding
from harness.reporting import charts
from harness.steps import error_isolation as ei
from harness.steps.report import StepReport
from models_outlier import CONSUMER_NODES, HOSTILE_FUSED_TENSOR, HOSTILE_TENSOR


@pytest.fixture(scope="module")
def demo(tmp_path_factory, devices, sm8650_runner, cache):
    return demo_onboarding(tmp_path_factory.mktemp("ei"), devices, sm8650_runner, cache)


@pytest.fixture(scope="module")
def report(demo) -> StepReport:
    return demo.error_isolation()


def test_ptq_of_the_demonstration_model_misses_its_kpi(demo):
    assert not demo.ptq().passed


def test_names_the_hostile_tensor_and_where_the_loss_shows(report):
    k = report.kpis
    assert k["samples"] == 4 and k["layers_compared"] == 7 and k["runtime"] == "htp"
    assert k["first_divergent_node"] in CONSUMER_NODES
    assert k["divergence_cause"] == "quantization"
    assert k["min_cosine_similarity"] < ei.MATH_ERROR_COSINE
    assert k["sensitive_tensors"][0] == HOSTILE_TENSOR
    assert k["worst_nodes"][0]["node"] in CONSUMER_NODES
    assert [sorted(w) for w in k["worst_nodes"]][0] == sorted(
        ["node", "op_type", "tensor", "cosine_similarity", "sqnr_db", "cosine_drop"])
    drops = [w["cosine_drop"] for w in k["worst_nodes"]]
    assert drops == sorted(drops, reverse=True)
    first = next(r for r in report.tables["per_layer"] if r["node"] == k["first_divergent_node"])
    assert first["upstream_tensors"] == HOSTILE_TENSOR  # the consumer reads the hostile tensor
    assert ei.ranked_promotion_units(report)[0] == [HOSTILE_FUSED_TENSOR, HOSTILE_TENSOR]


def test_fails_because_ptq_failed_and_says_where(report):
    assert not report.passed
    (failure,) = report.failures
    assert "PTQ missed its KPI" in failure and "the loss starts at node" in failure
    assert HOSTILE_TENSOR in failure and "caused by quantization" in failure


def test_passes_when_ptq_passed_whatever_it_finds(demo, cache, sm8650_runner):
    passed_ptq = StepReport("ptq")
    assert passed_ptq.passed
    again = ei.isolate_errors(demo.converted_model(), demo.qdq_model(), demo.dataset(), sm8650_runner,
                              passed_ptq, cache, samples=2)
    assert again.passed and again.kpis["samples"] == 2
    assert again.kpis["first_divergent_node"] in CONSUMER_NODES


def test_table_and_plot_are_written(report):
    from harness.reporting.allure import table_csv

    rows = list(csv.DictReader(io.StringIO(table_csv(report.tables["per_layer"]))))  # as attached to Allure
    assert [r["tensor"] for r in rows][:2] == ["x", HOSTILE_TENSOR]
    assert {"node", "op_type", "cosine_htp", "sqnr_htp_db", "mae_htp", "cosine_host", "sqnr_host_db"} <= set(rows[0])
    assert charts.ready(report.artifacts["sqnr_plot"]) and report.artifacts["sqnr_plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_exposing_intermediates_does_not_change_what_the_htp_computes(demo, cache, sm8650_runner):
    exposed, tensors = ei.expose_quantized_tensors(demo.qdq_model(), cache)
    plain_graph, exposed_graph = onnx.load(str(demo.qdq_model())).graph, onnx.load(str(exposed)).graph
    assert [n.name for n in exposed_graph.node] == [n.name for n in plain_graph.node]  # no node added
    assert len(exposed_graph.output) == len(plain_graph.output) + len(tensors)
    feeds = demo.dataset().evaluation[:2]
    plain = sm8650_runner.run(demo.qdq_model(), feeds, "htp")
    run = sm8650_runner.run(exposed, feeds, "htp")  # CPU fallback disabled: all on the HTP
    assert all(p.on_htp for p in run.placement)
    for a, b in zip(plain.outputs, run.outputs):
        np.testing.assert_array_equal(a["logits"], b["logits"])


def test_an_htp_only_divergence_is_told_apart(demo, cache):
    exposed, tensors = ei.expose_quantized_tensors(demo.qdq_model(), cache)
    feeds = demo.dataset().evaluation[:2]
    float_acts = ei.float_activations(demo.converted_model(), feeds, cache)
    host = {t: list(v) for t, v in float_acts.items()}  # a perfect host emulation
    rng = np.random.default_rng(0)
    htp = {t: [v + rng.normal(size=v.shape).astype(np.float32) * (10 * np.abs(v).mean() + 1)
               if t == "relu2_out" else v for v in vals] for t, vals in float_acts.items()}
    rows, _ = ei.compare_layers(demo.converted_model(), float_acts, host, htp, tensors)
    first, first_host, cause = ei.divergence(rows)
    assert (first.tensor, first_host, cause) == ("relu2_out", None, "htp")


def test_exposures_beside_refused_nodes_and_their_repeats_are_dropped(tmp_path):
    """When the HTP refuses a node once its neighbours are graph outputs (an attention's Transpose -> MatMul), error
    isolation drops the exposed tensors beside it and beside the same pattern in the next layer, and nothing else."""
    from onnx import TensorProto, helper, numpy_helper

    from harness.steps.error_isolation import ExposedTensor, _beside_refused

    nodes, inits, exposed = [], [], []

    def qdq(name: str) -> str:
        inits.extend([numpy_helper.from_array(np.array(0.1, np.float32), f"{name}_s"),
                      numpy_helper.from_array(np.array(128, np.uint8), f"{name}_z")])
        nodes.append(helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"], name=f"{name}_Q"))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"],
                                      name=f"{name}_DQ"))
        exposed.append(ExposedTensor(name, f"{name}_q", 0.1, 128, 8))
        return f"{name}_dq"

    nodes.append(helper.make_node("Relu", [qdq("x")], ["rin"], name="ReluIn"))
    x = qdq("rin")
    for layer in (0, 1):
        t = qdq(f"t{layer}")
        nodes.insert(len(nodes) - 2, helper.make_node("Transpose", [x], [f"t{layer}"], name=f"T{layer}", perm=[1, 0]))
        nodes.append(helper.make_node("MatMul", [x, t], [f"m{layer}"], name=f"MatMul{layer}"))
        x = qdq(f"m{layer}")
        nodes.append(helper.make_node("Relu", [x], [f"r{layer}"], name=f"Relu{layer}"))
        x = qdq(f"r{layer}")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [4, 4])], inits)
    path = tmp_path / "exposed.onnx"
    onnx.save(helper.make_model(graph), str(path))
    dropped = _beside_refused(path, exposed, {"MatMul0"})
    assert dropped == {"rin_q", "t0_q", "m0_q", "r0_q", "t1_q", "m1_q"}  # both MatMuls' inputs and outputs
    assert _beside_refused(path, exposed, {"not-in-the-graph"}) == set()
