"""Step 6 and the new steps end to end: the context binary on the device vs the host, and the
suites run through pytester with their KPIs in --kpi-json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import ContextMismatchError
from harness.steps.context_binary import compile_context
from harness.steps.runtime import runtime
from model_builders import conv_classifier
from perf_helpers import random_feeds

SUITES = Path(__file__).resolve().parent.parent / "suites"
STEP_SUITES = [str(SUITES / f) for f in ("test_08_context_binary.py", "test_09_profile.py", "test_10_runtime.py")]


def test_the_binary_on_the_device_matches_the_hosts_run_of_it(qdq, cache, devices, sm8650_runner):
    ctx = compile_context(qdq, devices.soc("sm8650"), cache)
    report = runtime(ctx, random_feeds(10), sm8650_runner)
    k = report.kpis
    assert k["samples"] == 8 and k["artifact"] == "model_ctx.onnx"
    assert k["shipped_files"] == ["model_ctx.onnx", "model_ctx_qnn.bin", "context.json"]
    assert k["cosine_similarity"] == pytest.approx(1.0) and k["max_abs_diff"] == 0.0 and k["bit_exact"]
    assert report.passed, report.problems()
    slow = runtime(ctx, random_feeds(10), sm8650_runner, inference_s=28.0)  # FP16's cost on ppocrv5_rec
    assert slow.kpis["samples"] == 2 and "instead of 8" in slow.kpis["samples_reason"] and slow.passed


def test_runtime_refuses_a_binary_for_another_soc(qdq, cache, devices, sm8650_runner):
    ctx = compile_context(qdq, devices.soc("sm8550"), cache)
    with pytest.raises(ContextMismatchError, match="compiled for sm8550.*is sm8650"):
        runtime(ctx, random_feeds(2), sm8650_runner)


def test_suites_record_the_new_steps_kpis(pytester: pytest.Pytester, session_cache_dir: Path):
    conv_classifier(pytester.path / "clf.onnx")
    (pytester.path / "tight.yaml").write_text(  # an impossible budget; PTQ on 8 random samples is not the point
        "name: tight\npath: clf.onnx\nthresholds: {latency_budget_ms: 1.0e-9, max_task_metric_drop: 1.0}\n")
    kpi = pytester.path / "kpi.json"
    result = pytester.runpytest_subprocess(  # only these steps' suites: their fixtures pull in PTQ's
        *STEP_SUITES, "--cache-dir", str(session_cache_dir), "--kpi-json", str(kpi), "-p", "no:cacheprovider",
        "-rA", "--model", str(pytester.path / "clf.onnx"), "--model", str(pytester.path / "tight.yaml"),
        "--min-iterations", "5", "--min-duration", "0.1", "--warmup-iterations", "1",
        "--alluredir", str(pytester.path / "allure"))
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(["*FAIL: budget_latency_ms = *, rule budget_latency_ms <= 1e-09*",
                                 "FAILED*test_profile?sm8650-emu-tight?*"])
    records = {(r["model"], r["step"]): r for r in json.loads(kpi.read_text())["records"]}
    ctx, prof, rt = (records[("clf", s)] for s in ("context_binary", "profile", "runtime"))
    assert all(r["outcome"] == "passed" for r in (ctx, prof, rt))
    assert ctx["kpis"]["context_bytes"] > 0 and ctx["kpis"]["load_s"] > 0 and ctx["kpis"]["jit_load_s"] > 0
    assert ctx["kpis"]["compile_s"] > 0 and ctx["kpis"]["soc"] == "sm8650"
    p = prof["kpis"]
    assert set(p["latency_ms"]) == {"min", "p50", "p90", "p99", "max", "mean", "std"}
    assert p["iterations"] >= 5 and p["duration_s"] >= 0.1 and p["latency_source"] == "simulator"
    assert p["top_ops"] and set(p["top_ops"][0]) == {"node", "op_type", "cycles", "share"}
    assert p["peak_rss_mb"] > 0 and p["estimated_latency_ms"] > 0 and "ESTIMATE" in p["estimated_latency_basis"]
    assert rt["kpis"]["cosine_similarity"] == pytest.approx(1.0) and rt["kpis"]["max_abs_diff"] == 0.0
    assert records[("tight", "profile")]["outcome"] == "failed"
    allure = [json.loads(f.read_text()) for f in (pytester.path / "allure").glob("*-result.json")]
    prof_result = next(r for r in allure if r["name"] == "test_profile[sm8650-emu-clf]")
    attached = {a["name"]: a["type"] for step in prof_result["steps"] for a in step.get("attachments", [])}
    assert attached["profile latency_histogram"] == attached["profile per_op_cycles"] == "image/png"
    assert attached["profile qnn_profile_csv"] == attached["profile per_op"] == "text/csv"
    assert records[("tight", "profile")]["kpis"]["budget_latency_ms"] == records[("tight", "profile")]["kpis"][
        "estimated_latency_ms"]  # on the emulator the budget is held against the estimate


@pytest.mark.parametrize("args, message", [
    (["--min-iterations", "0"], "*--min-iterations*'0' is not a positive whole number*"),
    (["--min-duration", "soon"], "*--min-duration*'soon' is not a duration in seconds*"),
], ids=["iterations", "duration"])
def test_bad_measurement_options_are_usage_errors(pytester: pytest.Pytester, args, message):
    result = pytester.runpytest_subprocess(*STEP_SUITES, "-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
