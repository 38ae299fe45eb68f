"""Step 5: the measurement rule, latency statistics, QNN profile parsing, the estimate, the budget."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from harness.reporting import charts
from harness.devices import SocSpec
from harness.errors import ConfigError, StepError
from harness.estimate import estimate_latency, graph_cost
from harness.models import Thresholds, resolve_model
from harness.profiling import ProfileFormatError, op_table, parse_profile_csv
from harness.steps.profile import (DEVICE_RULE, EMULATOR_RULE, PROFILE_ITERATIONS, SIMULATOR_BUDGET_S,
                                   MeasureRule, default_rule, detailed_profile,
                                   block_rule, latency_stats, measure_blocks, measure_latency, profile, sized_rule,
                                   PROFILE_STEP_BUDGET_S, planned_inferences, slow_plan)
from model_builders import conv_classifier
from perf_helpers import random_feeds

HEADER = "Msg Timestamp,Message,Time,Unit of Measurement,Timing Source,Event Level,Event Identifier\n"


@pytest.fixture(scope="module")
def real_profile(ctx, sm8650_runner, tmp_path_factory):
    """A QNN profile CSV written by the real QNN EP (detailed) for the tiny context binary."""
    return detailed_profile(sm8650_runner, ctx.model, random_feeds(1)[0], tmp_path_factory.mktemp("prof"))


def test_latency_statistics_match_numpy():
    times_s = [t / 1000 for t in range(1, 101)]  # 1..100 ms
    s = latency_stats(times_s)
    assert (s.min, s.max, s.iterations) == (1.0, 100.0, 100)
    assert (s.p50, s.p90, s.p99) == pytest.approx((50.5, 90.1, 99.01))
    assert s.mean == pytest.approx(50.5) and s.std == pytest.approx(np.std(np.arange(1, 101), ddof=1))
    assert set(s.as_dict()) == {"min", "p50", "p90", "p99", "max", "mean", "std"}
    assert latency_stats([0.002]).std == 0.0
    with pytest.raises(StepError, match="no timed iterations"):
        latency_stats([])


def test_default_rules_are_small_on_the_emulator_and_options_override():
    sized = {"budget_s": SIMULATOR_BUDGET_S}
    assert default_rule("emulator") == replace(EMULATOR_RULE, **sized)
    assert default_rule("adb") == replace(DEVICE_RULE, **sized) == default_rule("ssh")
    assert EMULATOR_RULE.min_iterations < DEVICE_RULE.min_iterations
    # an iteration count the user gives is kept, even on the simulator
    assert default_rule("adb", min_iterations=7, min_duration_s=0.5) == MeasureRule(7, 0.5, DEVICE_RULE.warmup)
    assert "at least 20 iterations and at least 1 s" in str(EMULATOR_RULE)


@pytest.mark.parametrize("inference_s, count", [(4.5, 5), (1.0, 15), (0.5, 20), (0.001, 20), (60.0, 5)])
def test_the_simulator_count_fits_the_budget(inference_s, count):
    rule, why = sized_rule(default_rule("emulator"), inference_s)
    assert rule == MeasureRule(count, EMULATOR_RULE.min_duration_s, EMULATOR_RULE.warmup)
    assert f"{inference_s:.3g} s" in why and f"{count} iterations" in why
    assert ("instead of 20" in why) == (count < 20)


def test_profile_sizes_its_count_on_the_simulator_from_the_warm_up_and_times_independent_blocks(ctx, sm8650_runner):
    rule = MeasureRule(20, 0.0, 3, budget_s=0.0)  # nothing fits the budget: the minimum count, over the blocks
    timed = measure_blocks(sm8650_runner, ctx.model, random_feeds(1)[0], rule, blocks=5)
    assert [b.run.latency_source for b in timed.blocks] == ["simulator"] * 5
    assert timed.rule == MeasureRule(1, 0.0, 0) and "instead of 20" in timed.sized_why  # 5 iterations, 1 per block
    assert timed.stats.iterations == 5 == len(timed.medians_ms)
    assert timed.emulated_ms is not None and len(timed.emulated_ms) == 5  # the emulated device's modelled time
    explicit = MeasureRule(6, 0.0, 1)  # --min-iterations given: run as is, no probe session
    timed = measure_blocks(sm8650_runner, ctx.model, random_feeds(1)[0], explicit, blocks=2)
    assert timed.rule == MeasureRule(3, 0.0, 1) and timed.sized_why is None and timed.stats.iterations == 6


@pytest.mark.parametrize("inference_s, blocks", [(10.0, 2), (28.0, 2), (5.0, 5), (6.0, 4)])
def test_a_slow_model_gets_fewer_blocks_of_one_iteration_within_the_step_budget(inference_s, blocks):
    rule = default_rule("emulator")
    assert planned_inferences(rule, 5, inference_s) * inference_s > PROFILE_STEP_BUDGET_S
    sized, count, why = slow_plan(rule, 5, inference_s)
    assert count == blocks and sized == MeasureRule(blocks, 0.0, 0)
    assert f"{inference_s:.3g} s" in why and f"{blocks} blocks of 1 timed iteration" in why
    # an 8-bit model at a few ms keeps the rule (and its probe): 32 inferences well within the budget
    assert planned_inferences(rule, 5, 0.05) * 0.05 <= PROFILE_STEP_BUDGET_S


def test_a_slow_shipped_model_is_profiled_without_a_probe_in_fewer_blocks(ctx, sm8650_runner):
    timed = measure_blocks(sm8650_runner, ctx.model, random_feeds(1)[0], default_rule("emulator"), blocks=5,
                           inference_s=28.0)  # FP16's cost on ppocrv5_rec, given as the shipped model's
    assert timed.slow and len(timed.blocks) == 2 and timed.stats.iterations == 2
    assert [b.run.latency_source for b in timed.blocks] == ["simulator"] * 2 and "28 s" in timed.sized_why
    fast = measure_blocks(sm8650_runner, ctx.model, random_feeds(1)[0], default_rule("emulator"), blocks=5,
                          inference_s=0.001)
    assert not fast.slow and len(fast.blocks) == 5


def test_a_block_rule_shares_the_iterations_and_duration():
    assert block_rule(MeasureRule(20, 1.0, 3), 5) == MeasureRule(4, 0.2, 3)
    assert block_rule(MeasureRule(5, 0.0, 0), 5) == MeasureRule(1, 0.0, 0)
    assert block_rule(MeasureRule(7, 0.0, 0), 5) == MeasureRule(2, 0.0, 0)  # at least the rule's count in all


def test_the_runner_times_at_least_n_iterations_and_at_least_d_seconds(sm8650_runner, tmp_path):
    model = conv_classifier(tmp_path / "clf.onnx")
    feeds = random_feeds(3)
    by_count = measure_latency(sm8650_runner, model, feeds, "cpu", MeasureRule(7, 0.0, 2))
    assert by_count.stats.iterations == 7 and len(by_count.run.outputs) == 3  # the outputs pass is kept
    by_time = measure_latency(sm8650_runner, model, feeds, "cpu", MeasureRule(1, 0.3, 0))
    assert by_time.duration_s >= 0.3 and by_time.stats.iterations > 1
    assert by_time.peak_rss_mb > 10 and by_time.run.report["measurement"]["min_duration_s"] == 0.3


def test_a_real_detailed_profile_parses_into_a_per_op_table(real_profile, qdq):
    assert len(real_profile.executions) == 1 + PROFILE_ITERATIONS  # the outputs pass, then the loop
    assert all(e.node_cycles and e.accelerator_us > 0 for e in real_profile.executions)
    import onnx
    types = {n.name: n.op_type for n in onnx.load(str(qdq)).graph.node}
    rows = op_table(real_profile, types)
    assert [r.cycles for r in rows] == sorted((r.cycles for r in rows), reverse=True)
    assert sum(r.share for r in rows) == pytest.approx(1.0) and rows[-1].cumulative == pytest.approx(1.0)
    by_type = {r.op_type for r in rows}
    assert {"Conv", "Gemm", "Input", "Output"} <= by_type
    assert next(r for r in rows if r.op_type == "Conv").node.startswith("conv")


@pytest.mark.parametrize("body, message", [
    ("node,cycles\nconv,12\n", "not a QNN profile CSV"),
    (HEADER + "0,NODE,twelve,CYCLES,BACKEND,SUB-EVENT,conv:OpId_3 (cycles)\n", ":2: Time 'twelve' is not a number"),
    (HEADER + "0,NODE,12,CYCLES,BACKEND,SUB-EVENT,garbage\n", ":2: NODE row 'garbage'"),
    (HEADER + "0,FINALIZE,11906,US,BACKEND,ROOT,QNN (finalize) time\n", "no execute events"),
    (HEADER + "0,NODE,12,CYCLES\n", ":2: expected 7 columns"),
], ids=["header", "number", "node-name", "no-executions", "short-row"])
def test_malformed_profiles_are_named(tmp_path, body, message):
    path = tmp_path / "p.csv"
    path.write_text(body)
    with pytest.raises(ProfileFormatError, match=message):
        parse_profile_csv(path)


def test_a_basic_level_profile_has_no_per_op_table(tmp_path):
    path = tmp_path / "basic.csv"
    path.write_text(HEADER + "0,BACKEND,244802,CYCLES,BACKEND,ROOT,Accelerator (execute) time (cycles)\n"
                    "0,BACKEND,10255,US,BACKEND,ROOT,Accelerator (execute) time\n")
    with pytest.raises(ProfileFormatError, match="profiling_level=detailed"):
        op_table(parse_profile_csv(path))


def test_graph_cost_counts_macs_and_8bit_bytes(tmp_path, qdq):
    cost = graph_cost(conv_classifier(tmp_path / "clf.onnx"))  # Conv 3->4, 3x3, 8x8; Gemm 256->10
    assert cost.macs == 4 * 8 * 8 * 27 + 10 * 256
    assert cost.weight_bytes == 4 * 27 + 4 + 10 * 256 + 10
    assert cost.activation_bytes == 3 * 64 + 3 * 4 * 64 + 10  # input, conv, relu, flatten, logits
    assert graph_cost(qdq).macs == cost.macs  # Q/DQ nodes add no work


def test_estimate_is_the_larger_bound_and_states_its_basis():
    from harness.estimate import GraphCost
    soc = SocSpec(name="Test SoC", soc_model=1, htp_arch=75, vtcm_mb=8, board_platform="t", int8_tops=10,
                  ddr_bandwidth_gbps=10, perf_source="made up", id="t1")
    cost = GraphCost(macs=10**9, weight_bytes=10**6, activation_bytes=0)
    e = estimate_latency(cost, soc, compute_utilization=1.0, bandwidth_utilization=1.0)
    assert e.compute_ms == pytest.approx(0.2) and e.memory_ms == pytest.approx(0.1)
    assert e.latency_ms == pytest.approx(0.2) and e.bound == "compute"
    assert "ESTIMATE" in e.basis and "10 INT8 TOPS" in e.basis and "made up" in e.basis
    bare = estimate_latency(cost, soc.model_copy(update={"int8_tops": None, "ddr_bandwidth_gbps": None}))
    assert bare.latency_ms is None and "compute bound omitted" in bare.basis


@pytest.mark.parametrize("value", [0, -5, True, "10", float("nan")])
def test_a_latency_budget_must_be_a_positive_number(value):
    with pytest.raises(ValueError):
        Thresholds(latency_budget_ms=value)


def test_a_bad_budget_in_a_spec_is_a_spec_error_naming_the_model(tmp_path):
    conv_classifier(tmp_path / "clf.onnx")
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: my_net\npath: clf.onnx\nthresholds: {latency_budget_ms: -2}\n")
    with pytest.raises(ConfigError, match=r"spec\.yaml: thresholds\.latency_budget_ms: Input should be greater than 0 \(model 'my_net'\)"):
        resolve_model(str(spec), {}, None)
    spec.write_text("path: clf.onnx\nthresholds: {latency_budget_ms: 2.5}\n")
    assert resolve_model(str(spec), {}, None).thresholds.latency_budget_ms == 2.5


def test_profile_step_reports_statistics_ops_charts_and_holds_the_budget(ctx, qdq, sm8650_runner, devices, tmp_path):
    rule = MeasureRule(5, 0.0, 1)
    ok = profile(ctx, qdq, random_feeds(1)[0], sm8650_runner, devices.soc("sm8650"),
                 Thresholds(latency_budget_ms=50.0), rule, tmp_path / "ok", "sm8650-emu x clf")
    k = ok.kpis
    assert k["latency_source"] == "simulator" and k["iterations"] >= 5 and k["peak_rss_mb"] > 0
    assert k["iterations_reason"] == "the measurement rule (1 iterations at least per block)"
    # independent blocks: one median each, their spread, the interval of the median; the emulated device's time
    assert len(k["latency_blocks_ms"]) == 5 and k["latency_noise_pct"] >= 0
    assert k["intervals"]["latency_ms.p50"]["method"] == "repeats" and k["intervals"]["latency_ms.p50"]["samples"] == 5
    assert k["device_latency_source"] == "emulated" and len(k["device_latency_blocks_ms"]) == 5
    assert k["device_latency_ms"] > 0 and k["measurement_rule"].startswith("5 blocks (separate runner invocations)")
    assert k["peak_rss_mb"] == max(k["peak_rss_blocks_mb"])
    assert k["artifact_path"] == str(ctx.model) and k["artifact_key"] == ctx.directory.name
    assert len(k["artifact_sha256"]) == 64
    assert k["latency_ms"]["min"] <= k["latency_ms"]["p50"] <= k["latency_ms"]["p99"] <= k["latency_ms"]["max"]
    assert k["per_op_source"] == "context_binary" and k["top_ops"][0]["share"] >= k["top_ops"][-1]["share"]
    assert k["estimated_latency_ms"] > 0 and k["budget_latency_ms"] == k["estimated_latency_ms"]
    for name in ("latency_histogram", "per_op_cycles"):
        assert charts.ready(ok.artifacts[name]) and ok.artifacts[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ok.artifacts["qnn_profile_csv"].read_text().startswith("Msg Timestamp,")
    assert ok.passed, ok.problems()
    tight = profile(ctx, qdq, random_feeds(1)[0], sm8650_runner, devices.soc("sm8650"),
                    Thresholds(latency_budget_ms=1e-9), rule, tmp_path / "tight", "sm8650-emu x clf")
    assert [str(v) for v in tight.verdicts if not v.passed] == [
        f"FAIL: budget_latency_ms = {tight.kpis['budget_latency_ms']:.6g}, rule budget_latency_ms <= 1e-09"]
