"""Quantization sweep and mixed precision on the real HTP simulator, and the suites end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accuracy_helpers import REPO, demo_onboarding
from harness.encodings import load_encodings
from harness.models import Thresholds
from harness.steps import mixed_precision as mp
from harness.steps import sweep as sw
from harness.steps.ptq import QuantRecipe
from models_outlier import HOSTILE_FUSED_TENSOR, HOSTILE_TENSOR, build_outlier_model

SUITES = REPO / "suites"
ACCURACY_SUITES = ("test_04_ptq.py", "test_05_error_isolation.py", "test_06_sweep.py", "test_07_mixed_precision.py")


@pytest.fixture(scope="module")
def demo(tmp_path_factory, devices, sm8650_runner, cache):
    return demo_onboarding(tmp_path_factory.mktemp("mp"), devices, sm8650_runner, cache)


def test_candidate_matrix():
    quick = sw.candidate_recipes("quick", QuantRecipe())
    full = sw.candidate_recipes("full", QuantRecipe())
    assert [r.name for r in quick] == ["MinMax-a8-w8-pt", "MinMax-a8-w8s-pc", "Percentile-a8-w8-pt", "MinMax-a16-w8-pt"]
    assert len(full) == len({r.name for r in full}) == 3 * 2 * 2 * 2
    assert {r.calibrate_method for r in full} == {"MinMax", "Entropy", "Percentile"}
    assert all(r.weight_type == "QInt8" for r in full if r.per_channel)  # the HTP's per-channel weights


def test_promotion_schedule():
    assert mp.promotion_schedule(8, 20) == [1, 2, 4, 8]
    assert mp.promotion_schedule(8, 5) == [1, 2, 4, 5]
    assert mp.promotion_schedule(3, 7) == [1, 2, 3]
    assert mp.promotion_schedule(0, 7) == []


def test_quick_sweep_ranks_candidates_run_on_the_htp(demo):
    report = demo.sweep()
    k = report.kpis
    assert report.passed and k["mode"] == "quick" and k["runtime"] == "htp"
    assert [c["name"] for c in k["candidates"]][0] == k["best"] == "MinMax-a16-w8-pt"
    assert all({"name", "task_metric", "cosine_similarity", "sqnr_db"} <= set(c) for c in k["candidates"])
    assert [c["meets_kpi"] for c in k["candidates"]] == [True, False, False, False]
    eight = [c for c in k["candidates"] if c["meets_kpi"] is False]
    assert [c["task_metric"] for c in eight] == sorted((c["task_metric"] for c in eight), reverse=True)
    assert k["parallel_workers"] >= 1


def test_mixed_precision_recovers_the_kpi_by_promoting_the_hostile_tensor(demo):
    report = demo.mixed_precision()
    k = report.kpis
    assert report.passed and k["met_threshold"]
    assert k["start_recipe"].startswith("MinMax-a8") and not k["start_recipe"].endswith("mp1")
    assert k["promoted"] == [HOSTILE_TENSOR]
    assert k["promoted_tensors"] == [HOSTILE_FUSED_TENSOR, HOSTILE_TENSOR]
    assert k["task_metric_drop"] <= demo.thresholds.max_task_metric_drop
    assert k["cosine_similarity"] > k["start_cosine_similarity"]
    assert k["model_bytes"] > k["model_bytes_start"] and k["mean_inference_ms"] > 0
    assert k["latency_source"] == "simulator"
    assert [s["promoted_count"] for s in report.tables["steps"]] == [0, 1]
    # PTQ missed its KPI and mixed precision met it: the mixed-precision model ships
    assert demo.deployable_model() == report.artifacts["model"] != demo.qdq_model()
    assert k["encodings_of"] == "mixed_precision"
    encodings = load_encodings(report.artifacts["encodings"])
    assert encodings.activations[HOSTILE_TENSOR][0].bitwidth == 16
    assert encodings.activations["logits"][0].bitwidth == 8


def test_every_candidate_failing_ends_in_a_failed_step_listing_what_was_tried(demo, cache, sm8650_runner):
    impossible = Thresholds(min_sqnr_db=200.0, max_promoted_tensors=2)
    report, candidates = sw.sweep(demo.converted_model(), demo.dataset(), demo.float_reference(), sm8650_runner,
                                  impossible, cache, QuantRecipe(), "quick")
    assert not report.passed and report.kpis["best"] == "MinMax-a16-w8-pt"
    (failure,) = report.failures
    assert "no candidate of the 'quick' sweep met the KPI" in failure
    assert all(c.name in failure for c in candidates)
    start = next(c for c in candidates if c.recipe.activation_type == "QUInt8")
    report = mp.mixed_precision(demo.converted_model(), demo.dataset(), demo.float_reference(), sm8650_runner,
                                impossible, cache, start, [[HOSTILE_FUSED_TENSOR, HOSTILE_TENSOR], ["relu2_out"]])
    assert not report.passed and report.kpis["met_threshold"] is False
    assert "did not meet the KPI" in report.failures[0] and HOSTILE_TENSOR in report.failures[0]
    assert [s["promoted_count"] for s in report.tables["steps"]] == [0, 1, 2]


def test_candidates_that_cannot_be_quantized_are_recorded_not_raised(demo, cache, sm8650_runner):
    bad = QuantRecipe(encodings={"activation_encodings": {"missing": [
        {"bitwidth": 8, "scale": 0.1, "offset": 0}]}}, encodings_file="bad.json")
    report, candidates = sw.sweep(demo.converted_model(), demo.dataset(), demo.float_reference(), sm8650_runner,
                                  demo.thresholds, cache, bad, "quick")
    assert not report.passed and report.kpis["best"] is None
    assert all("'missing'" in c.error for c in candidates)
    assert "error: bad.json: 1 tensor(s) not in the model" in report.failures[0]


# ------------------------------------------------------------------------- the suites, end to end

@pytest.fixture
def run_accuracy_suites(pytester: pytest.Pytester, session_cache_dir: Path):
    """Run the PTQ and accuracy suites on a model in a subprocess; return (result, records by step)."""
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]')
    model = build_outlier_model(pytester.path / "outlier_cnn.onnx").path

    def _run(*args: str):
        kpi = pytester.path / "kpi.json"
        result = pytester.runpytest_subprocess(
            *(str(SUITES / s) for s in ACCURACY_SUITES), "--devices-file", str(REPO / "devices.yaml"),
            "--device", "sm8650", "--model", str(model), "--cache-dir", str(session_cache_dir),
            "--kpi-json", str(kpi), "-p", "no:cacheprovider", "-rA", *args)
        records = json.loads(kpi.read_text())["records"] if kpi.exists() else []
        return result, {r["step"]: r for r in records}

    return _run


def test_suites_explain_and_recover_the_demonstration_model(run_accuracy_suites):
    result, steps = run_accuracy_suites()
    result.assert_outcomes(passed=2, failed=2)
    assert {s: r["outcome"] for s, r in steps.items()} == {
        "ptq": "failed", "error_isolation": "failed", "sweep": "passed", "mixed_precision": "passed"}
    assert "the loss starts at node conv3" in steps["error_isolation"]["message"]
    assert steps["error_isolation"]["kpis"]["sensitive_tensors"][0] == HOSTILE_TENSOR
    assert steps["mixed_precision"]["kpis"]["promoted"] == [HOSTILE_TENSOR]

    # The exported encodings quantize the model to a passing PTQ, through --quantization-overrides.
    exported = _encodings_file(steps)
    again, steps = run_accuracy_suites("--quantization-overrides", str(exported), "--sweep", "off")
    again.assert_outcomes(passed=3, skipped=1)
    assert steps["ptq"]["outcome"] == "passed" and steps["ptq"]["kpis"]["recipe"].endswith("+overrides")
    assert steps["mixed_precision"]["kpis"]["promoted"] == []
    again.stdout.fnmatch_lines(["*SKIPPED*--sweep off: no quantization sweep*"])


def _encodings_file(steps) -> Path:
    kpis = steps["mixed_precision"]["kpis"]
    assert kpis["encodings_of"] == "mixed_precision"
    return Path(kpis["encodings_file"])
