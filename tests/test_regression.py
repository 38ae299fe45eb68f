"""Baselines and regression gates: the comparison rules of harness/baseline.py, the regression step's report,
and --save-baseline / --baseline end to end through the real suites on the emulated device."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from harness.baseline import (BaselineError, Evidence, Snapshot, baseline_path, check_save_dir,
                              compare_blocks, compare_absolute, compare_lower, compare_outcome, compare_paired,
                              load_baseline, save_baseline, snapshot)
from harness.data import input_infos
from harness.errors import ConfigError
from harness.evaluation.datasets import labelled_samples
from harness.models import Thresholds, fix_input_shapes, resolve_model
from harness.repeats import median_interval, min_unpaired_p, summary
from harness.versions import toolchain_versions
from harness.reporting.records import StepRecord
from harness.steps.inference import run_host
from harness.steps.regression import regression
from model_builders import conv_classifier
from real_models_helpers import real_model_spec

SUITES = Path(__file__).resolve().parent.parent / "suites"
STEPS = ("-k", "(ptq or context_binary or profile or regression) and not llm")  # PTQ's prerequisites run as fixtures

# ----------------------------------------------------------------------------------- the rules, pure


def _blocks(median: float, n: int = 5, seed: int = 0, spread: float = 0.02) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(np.round(median * (1 + spread * rng.standard_normal(n)), 4))


def _ev(values: list[float] | None, value: float | None = None) -> Evidence:
    """Evidence of a figure from its block values (or a bare value: no blocks, as an old baseline has)."""
    if values is None:
        return Evidence(value)
    return Evidence(float(np.median(values)), values, summary(values).noise_pct)


def _blocks_verdict(base, cur, **kw):
    return compare_blocks("profile", "latency_ms.p50", base, cur, 0.05, 0.10, 3.0, "ms", **kw)


def test_repeats_summarise_blocks_with_their_spread_and_interval():
    r = summary([1.0, 1.1, 0.9, 1.0, 1.02])
    assert r.value == 1.0 and r.blocks == 5 and r.noise_pct == pytest.approx(100 * 1.4826 * 0.02, rel=1e-3)
    assert (r.interval.low, r.interval.high, r.interval.method, r.interval.confidence) == (0.9, 1.1, "repeats", 0.9375)
    assert summary([2.0] * 5).noise_pct == 0.0
    # 9 blocks or more: the 2nd smallest to the 2nd largest still covers the median with at least 95 % (96.1 % on
    # 9), so one outlying block on each side (a round of the concurrency step run beside a burst) moves nothing
    nine = summary([2.0, 2.01, 2.02, 2.03, 2.04, 2.05, 2.06, 1.2, 4.1])
    assert (nine.interval.low, nine.interval.high, nine.interval.confidence) == (2.0, 2.06, 0.9609)
    assert median_interval([1.0] * 12).confidence >= 0.95 and median_interval(range(12)).low == 2.0
    assert min_unpaired_p(5, 5) == pytest.approx(2 / 252) and min_unpaired_p(1, 5) > 0.05


def test_identical_blocks_are_unchanged():
    blocks = _blocks(2.0)
    v = _blocks_verdict(_ev(blocks), _ev(list(blocks)))
    assert (v.verdict, v.delta, v.delta_pct) == ("unchanged", 0.0, 0.0) and "within max(threshold 10%" in v.message()


def test_a_clearly_shifted_set_of_blocks_regresses_with_both_values_and_the_evidence():
    v = _blocks_verdict(_ev(_blocks(2.61)), _ev(_blocks(3.40, seed=1)))
    assert v.verdict == "regressed" and v.p_value < 0.05 and 25 < v.delta_pct < 35
    assert v.baseline == pytest.approx(2.61, rel=0.03) and v.current == pytest.approx(3.40, rel=0.03)
    assert v.message().startswith(f"profile latency_ms.p50 regressed: {v.baseline:.4g} -> {v.current:.4g} ms (+")
    assert "5 vs 5 blocks, Mann-Whitney p=0.0079" in v.message() and "noise floor" in v.message()


def test_a_change_within_k_times_the_noise_floor_is_unchanged():
    noisy = _ev([1.0, 1.3, 0.8, 1.1, 0.9])  # noise floor ~15%: 3 x that is ~44%
    v = _blocks_verdict(noisy, _ev(_blocks(1.3, seed=2)))
    assert v.verdict == "unchanged" and 20 < v.delta_pct < 40 and "3 x noise floor" in v.detail


def test_a_large_change_of_overlapping_blocks_is_inconclusive_not_failed():
    base = _ev([1.0, 3.0, 1.1, 2.8, 1.2])
    cur = _ev([1.3, 3.2, 1.4, 3.5, 1.0])
    v = _blocks_verdict(Evidence(1.2, base.blocks, 5.0), Evidence(1.4, cur.blocks, 5.0))
    assert v.verdict == "inconclusive" and v.p_value > 0.05 and "not significant (5 vs 5 blocks" in v.detail


def test_a_significant_change_that_cannot_decide_is_inconclusive_saying_why():
    v = _blocks_verdict(_ev(_blocks(5.0)), _ev(_blocks(7.0, seed=1)), decides=False, undecidable="host load")
    assert v.verdict == "inconclusive" and v.p_value < 0.05 and v.detail.endswith("; host load")


def test_an_improvement_is_improved():
    v = _blocks_verdict(_ev(_blocks(3.0)), _ev(_blocks(2.0, seed=1)))
    assert v.verdict == "improved" and v.delta_pct < -30


def test_without_blocks_the_threshold_alone_compares_and_beyond_it_is_inconclusive():
    within = _blocks_verdict(_ev(None, 1.0), _ev(_blocks(1.05)), weaker="old baseline")
    assert within.verdict == "unchanged" and "threshold 10%" in within.detail and "old baseline" in within.detail
    beyond = _blocks_verdict(_ev(None, 1.0), _ev(_blocks(2.0)), weaker="old baseline")
    assert beyond.verdict == "inconclusive" and beyond.p_value is None
    assert "the baseline has no blocks: the change cannot be told from run-to-run noise (old baseline)" in beyond.detail
    one = _blocks_verdict(_ev([1.0]), _ev(_blocks(2.0)))
    assert one.verdict == "inconclusive" and "1 block(s) in the baseline and 5 now cannot reach significance" in one.detail


def test_paired_ab_blocks_decide_on_the_ratio_or_ask_for_more():
    a = _blocks(1.0, n=6)
    slow = compare_paired("profile", "latency_ms.p50", a, [x * 1.5 for x in _blocks(1.0, n=6, seed=3)], 0.05, 0.10,
                          3.0, 1.0, "ms", recorded="1 -> 1.2 ms in the two sessions")
    assert slow.verdict == "regressed" and slow.delta_pct > 30 and "A/B 6 pairs, ratio x1.4" in slow.detail
    assert "recorded 1 -> 1.2 ms in the two sessions" in slow.detail and "interleaved A/B" in slow.rule
    same = compare_paired("profile", "latency_ms.p50", a, list(a), 0.05, 0.10, 3.0, 1.0, "ms")
    assert same.verdict == "unchanged" and same.delta_pct == 0
    wild = [1.0, 2.0, 0.5, 1.0, 1.0]
    b = [1.0, 1.0, 1.0, 1.6, 1.7]
    assert compare_paired("profile", "latency_ms.p50", wild, b, 0.05, 0.10, 3.0, 1.0, "ms", final=False) is None
    assert compare_paired("profile", "latency_ms.p50", wild, b, 0.05, 0.10, 3.0, 1.0, "ms").verdict == "inconclusive"


def test_accuracy_is_held_to_an_absolute_tolerance():
    assert compare_absolute("ptq", "task_metric", 0.95, 0.945, 0.01).verdict == "unchanged"
    drop = compare_absolute("ptq", "task_metric", 0.95, 0.90, 0.01)
    assert drop.verdict == "regressed" and drop.delta == pytest.approx(-0.05)
    assert drop.message() == "ptq task_metric regressed: 0.95 -> 0.9 (-0.05, tolerance 0.01)"
    assert compare_absolute("ptq", "sqnr_db", 20.0, 22.0, 1.0, "dB").verdict == "improved"
    assert compare_absolute("ptq", "sqnr_db", float("inf"), float("inf"), 1.0, "dB").verdict == "unchanged"
    rise = compare_absolute("ptq", "task_metric", 0.02, 0.05, 0.01, higher_is_better=False, what="cer")
    assert rise.verdict == "regressed" and rise.rule.endswith("a rise of more than 0.01 regresses (cer: lower is "
                                                              "better)")
    assert compare_absolute("ptq", "task_metric", 0.05, 0.02, 0.01, higher_is_better=False).verdict == "improved"


def test_sizes_are_held_to_a_relative_threshold_lower_is_better():
    assert compare_lower("context_binary", "context_bytes", 1000, 1040, 0.05).verdict == "unchanged"
    grown = compare_lower("context_binary", "context_bytes", 1000, 1100, 0.05, "bytes")
    assert grown.verdict == "regressed" and grown.delta_pct == 10.0
    assert grown.message() == "context_binary context_bytes regressed: 1000 -> 1100 bytes (+10.0%, threshold 5%)"
    assert compare_lower("energy", "energy_per_inference_mj", 2.0, 1.0, 0.15).verdict == "improved"
    assert compare_lower("energy", "energy_per_inference_mj", 0.0, 0.1, 0.15).verdict == "regressed"


def test_one_sided_kpis_are_new_or_missing_and_outcomes_compare():
    assert compare_lower("profile", "peak_rss_mb", None, 100.0, 0.1).verdict == "new"
    assert compare_lower("profile", "peak_rss_mb", 100.0, None, 0.1).verdict == "missing"
    assert compare_lower("profile", "peak_rss_mb", None, None, 0.1) is None
    assert compare_outcome("ptq", "passed", "failed").message() == "ptq outcome regressed: passed -> failed"
    assert compare_outcome("ptq", "failed", "passed").verdict == "improved"
    assert compare_outcome("ptq", "passed", "skipped").verdict == "missing"
    assert compare_outcome("ptq", "skipped", None) is None
    timed_out = compare_outcome("ptq", "passed", "error")  # a device command past its limit: not the model's
    assert timed_out.verdict == "inconclusive" and "test bench" in timed_out.message()
    assert compare_outcome("ptq", "error", "passed").verdict == "inconclusive"
    assert compare_outcome("ptq", "error", "error").verdict == "unchanged"


def _snap(steps: dict[str, tuple[str, dict]], soc: str = "sm8650", sha: str = "a" * 64, model: str = "clf",
          fmt: int = 2) -> Snapshot:
    return Snapshot("sm8650-emu", soc, model, sha,
                    {k: StepRecord("sm8650-emu", soc, model, k, o, kpis) for k, (o, kpis) in steps.items()},
                    "0.1.0", None, fmt)


def _profile(wall: list[float], device: list[float] | None = None, artifact: str = "f" * 64) -> dict:
    """Profile KPIs as the step reports them: simulator wall-time blocks, emulated device-time blocks, the artifact."""
    kpis = {"latency_source": "simulator", "latency_ms": {"p50": float(np.median(wall))}, "latency_blocks_ms": wall,
            "latency_noise_pct": summary(wall).noise_pct, "artifact_sha256": artifact,
            "artifact_path": "/nowhere/model_ctx.onnx"}
    if device is not None:
        kpis.update({"device_latency_ms": float(np.median(device)), "device_latency_blocks_ms": device,
                     "device_latency_noise_pct": summary(device).noise_pct, "device_latency_source": "emulated"})
    return kpis


def _row(report, kpi: str) -> dict:
    (row,) = [r for r in report.kpis["verdicts"] if r["kpi"] == kpi]
    return row


def test_an_unchanged_rerun_on_a_loaded_host_never_fails(tmp_path):
    """The same artifact, its simulator wall time 40% slower (a CPU-bound process beside it), the emulated device
    time unchanged: the device time decides, and the wall time's change is explained, not failed."""
    base = _snap({"profile": ("passed", _profile(_blocks(5.0), [0.1] * 5))})
    cur = _snap({"profile": ("passed", _profile(_blocks(7.0, seed=1), [0.1] * 5))})
    report = regression(base, tmp_path / "clf.json", cur, Thresholds())
    assert report.status == "passed" and not report.failures and report.kpis["regressed"] == []
    assert _row(report, "device_latency_ms")["verdict"] == "unchanged"
    wall = _row(report, "latency_ms.p50")
    assert wall["verdict"] == "unchanged" and wall["delta_pct"] > 30
    # without a device time (a runner that models none), the same change is inconclusive, never failed
    base, cur = (_snap({"profile": ("passed", _profile(w))}) for w in (_blocks(5.0), _blocks(7.0, seed=1)))
    report = regression(base, tmp_path / "clf.json", cur, Thresholds())
    assert report.status == "inconclusive" and not report.failures
    (reason,) = report.inconclusive
    assert reason.startswith("profile latency_ms.p50 inconclusive: ") and "the same artifact as the baseline" in reason


def test_a_throttled_device_fails_on_its_emulated_latency_naming_both_values_and_the_evidence(tmp_path):
    base = _snap({"profile": ("passed", _profile(_blocks(5.0), [0.1] * 5))})
    cur = _snap({"profile": ("passed", _profile(_blocks(5.1, seed=1), [0.15] * 5))})
    report = regression(base, tmp_path / "clf.json", cur, Thresholds())
    assert report.status == "failed" and report.kpis["regressed"] == ["profile device_latency_ms"]
    assert report.failures == ["profile device_latency_ms regressed: 0.1 -> 0.15 ms (+50.0%, beyond max(threshold "
                               "10%, 3 x noise floor 0%) = 10.0%, 5 vs 5 blocks, Mann-Whitney p=0.004)"]


def test_a_changed_artifact_without_the_baseline_s_in_the_cache_is_inconclusive_saying_how_to_decide(tmp_path):
    base = _snap({"profile": ("passed", _profile(_blocks(5.0), [0.1] * 5, artifact="1" * 64))})
    cur = _snap({"profile": ("passed", _profile(_blocks(7.0, seed=1), [0.1] * 5))}, sha="b" * 64)
    report = regression(base, tmp_path / "clf.json", cur, Thresholds())
    assert report.status == "inconclusive" and not report.failures
    assert "keep the baseline's artifact in this cache so the gate runs an interleaved A/B (no A/B: no device to run " \
           "it on)" in report.inconclusive[0]


def test_an_old_format_baseline_is_compared_by_the_threshold_alone_and_says_so(tmp_path):
    base = _snap({"profile": ("passed", {"latency_ms": {"p50": 5.0}, "latency_samples_ms": [5.0] * 40})}, fmt=1)
    cur = _snap({"profile": ("passed", _profile(_blocks(7.5), [0.1] * 5))})
    report = regression(base, tmp_path / "clf.json", cur, Thresholds())
    assert report.status == "inconclusive" and report.kpis["baseline_format"] == 1
    assert _row(report, "device_latency_ms")["verdict"] == "new"
    assert "the baseline has no blocks: the change cannot be told from run-to-run noise (the baseline is format 1 " \
           "(harness 0.1.0), from before independent blocks and noise floors were recorded, so the threshold alone " \
           "compares it (weaker evidence)" in report.inconclusive[0]
    assert any("is format 1 (harness 0.1.0): it has no independent latency blocks" in n for n in report.notes)
    same = regression(base, tmp_path / "clf.json", _snap({"profile": ("passed", _profile(_blocks(5.1)))}),
                      Thresholds())
    assert same.status == "passed" and "weaker evidence" in _row(same, "latency_ms.p50")["rule"]


def test_a_baseline_without_repeats_cannot_fail_latency(tmp_path):
    one = _profile([5.0], [0.1])
    base = _snap({"profile": ("passed", one)})
    cur = _snap({"profile": ("passed", _profile(_blocks(5.0), [0.2] * 5))})
    report = regression(base, tmp_path / "clf.json", cur, Thresholds())
    assert report.status == "inconclusive" and not report.failures
    assert "1 block(s) in the baseline and 5 now cannot reach significance at 0.05" in report.inconclusive[0]
    assert "save it with at least 4 (--latency-blocks)" in report.inconclusive[0]


def test_a_baseline_of_another_model_is_shown_not_gated(tmp_path):
    base = _snap({"ptq": ("passed", {"task_metric": 0.99}), "runtime": ("passed", {})}, model="resnet",
                 sha="0" * 64)
    cur = _snap({"ptq": ("passed", {"task_metric": 0.5}), "runtime": ("failed", {})})
    report = regression(base, tmp_path / "resnet.json", cur, Thresholds())
    assert not report.failures and report.kpis["regressed"] == [] and report.status == "inconclusive"
    assert _row(report, "task_metric")["verdict"] == "inconclusive"
    assert any("is of another model ('resnet', sha256 " + "0" * 64 + "; this run is 'clf'" in n and
               "none is gated" in n for n in report.notes)


def test_the_report_fails_on_each_regressed_kpi_and_notes_another_model_file_and_soc(tmp_path):
    base = _snap({"ptq": ("passed", {"task_metric": 0.95, "cosine_similarity": 0.999, "sqnr_db": 30.0}),
                  "profile": ("passed", {**_profile(_blocks(2.61), [0.1] * 5), "peak_rss_mb": 100.0}),
                  "runtime": ("passed", {}), "energy": ("passed", {"energy_per_inference_mj": 3.0})})
    cur = _snap({"ptq": ("passed", {"task_metric": 0.95, "cosine_similarity": 0.999, "sqnr_db": 30.2}),
                 "context_binary": ("passed", {"context_bytes": 5000}),
                 "profile": ("passed", {**_profile(_blocks(2.7, seed=1), [0.2] * 5), "peak_rss_mb": 101.0}),
                 "runtime": ("failed", {})}, soc="sm8550", sha="b" * 64)
    report = regression(base, tmp_path / "clf.json", cur, Thresholds())
    k = report.kpis
    rows = {(r["step"], r["kpi"]): r for r in k["verdicts"]}
    assert rows[("ptq", "sqnr_db")]["verdict"] == "unchanged"
    assert rows[("context_binary", "context_bytes")]["verdict"] == "new"
    assert rows[("energy", "energy_per_inference_mj")]["verdict"] == "missing"
    assert rows[("runtime", "outcome")]["verdict"] == "regressed"
    assert rows[("profile", "peak_rss_mb")]["verdict"] == "unchanged"  # +1%: within the threshold
    assert set(rows[("profile", "device_latency_ms")]) == {"kpi", "step", "baseline", "current", "delta",
                                                           "delta_pct", "verdict", "p_value", "rule"}
    assert k["regressed"] == ["profile device_latency_ms", "runtime outcome"]
    assert k["counts"]["regressed"] == 2 and k["counts"]["new"] == 2  # context_binary's size and its outcome
    assert report.tables["verdicts"] == k["verdicts"] and not report.passed
    assert report.failures[0].startswith("profile device_latency_ms regressed: 0.1 -> 0.2 ms (+100.0%")
    assert report.failures[1] == "runtime outcome regressed: passed -> failed"
    assert any(f"sha256 {'a' * 64}; this run's is {'b' * 64}" in n for n in report.notes)
    assert any("saved on SoC sm8650, this run is on sm8550" in n for n in report.notes)
    assert not any("toolchain" in n for n in report.notes)  # neither snapshot recorded one


def test_a_baseline_saved_on_another_toolchain_is_compared_with_a_note_naming_what_changed(tmp_path):
    base = replace(_snap({"runtime": ("passed", {})}), toolchain={"onnxruntime-qnn": "2.6.0", "qnn-sdk": "2.41.0",
                                                                  "numpy": "2.4.6", "aimet-onnx": None})
    save_baseline(tmp_path, base)
    loaded = load_baseline(baseline_path(tmp_path, "sm8650-emu", "clf"))
    assert loaded.toolchain == base.toolchain  # round trip, None kept
    cur = replace(_snap({"runtime": ("passed", {})}), toolchain={"onnxruntime-qnn": "2.7.0", "qnn-sdk": "2.42.0",
                                                                 "numpy": "2.4.6"})
    report = regression(loaded, tmp_path / "clf.json", cur, Thresholds())
    [note] = [n for n in report.notes if "toolchain" in n]
    assert "another toolchain (onnxruntime-qnn 2.6.0 -> 2.7.0, qnn-sdk 2.41.0 -> 2.42.0)" in note
    assert report.passed and report.kpis["baseline_toolchain"]["qnn-sdk"] == "2.41.0"
    assert set(toolchain_versions()) >= {"onnxruntime", "onnxruntime-qnn", "qnn-sdk", "onnx", "numpy"}
    assert toolchain_versions()["onnxruntime-qnn"] is not None  # installed here: the simulator runs on it


def test_the_gate_holds_cer_to_its_direction_on_a_real_recognizer_s_labelled_lines(tmp_path):
    """ppocrv6_tiny_rec on its labelled set (rendered lines with their strings): its float outputs, and the same
    outputs with noise added to every class score (a stand-in for a worse quantized model: it misreads
    characters). A rise of the CER regresses the gate, its fall improves it, and a baseline that measured
    another metric is not compared by this one's direction."""
    spec = resolve_model(str(real_model_spec("ppocrv6_tiny_rec")), {}, None)
    model = tmp_path / "fixed.onnx"
    onnx.save(fix_input_shapes(onnx.load(str(spec.path)), spec.input_shapes, spec.name), str(model))
    feeds, labels, task = labelled_samples(spec.evaluation, input_infos(onnx.load(str(model))))
    floating = run_host(model, feeds)
    rng = np.random.default_rng(0)
    noisy = [{k: v + rng.normal(0.0, 0.17 * float(np.abs(v).max()), v.shape).astype(v.dtype) for k, v in o.items()}
             for o in floating]
    good, bad = task.compare(floating, floating, labels), task.compare(noisy, floating, labels)
    assert good["task_metric_name"] == "cer" and good["task_metric_higher_is_better"] is False
    assert bad["task_metric"] > good["task_metric"] + 0.05, (good["task_metric"], bad["task_metric"])
    assert bad["task_metric_ratio"] < 0.98 <= good["task_metric_ratio"] == 1.0  # ratio >= min: good enough

    def snap(kpis: dict) -> Snapshot:
        keep = ("task_metric_name", "task_metric", "task_metric_higher_is_better", "task_metric_ratio")
        return _snap({"ptq": ("passed", {k: kpis[k] for k in keep})})

    worse = regression(snap(good), tmp_path / "rec.json", snap(bad), Thresholds())
    row = _row(worse, "task_metric")
    assert worse.status == "failed" and row["verdict"] == "regressed" and "cer: lower is better" in row["rule"]
    assert worse.failures == [f"ptq task_metric regressed: {good['task_metric']:.4g} -> {bad['task_metric']:.4g} "
                              f"(+{bad['task_metric'] - good['task_metric']:.4g}, tolerance 0.01)"]
    better = regression(snap(bad), tmp_path / "rec.json", snap(good), Thresholds())
    assert better.status == "passed" and _row(better, "task_metric")["verdict"] == "improved"
    agreement = _snap({"ptq": ("passed", {"task_metric_name": "top1_agreement", "task_metric": 0.5})})
    other = regression(agreement, tmp_path / "rec.json", snap(bad), Thresholds())
    assert other.status == "inconclusive" and not other.failures
    assert "another task metric: the baseline's is top1_agreement (higher is better), this run's cer (lower is " \
           "better)" in other.inconclusive[0]


def test_a_mistyped_baseline_kpi_is_an_error_naming_the_file(tmp_path):
    base = _snap({"profile": ("passed", {"latency_ms": {"p50": 1.0}, "latency_blocks_ms": "fast"})})
    cur = _snap({"profile": ("passed", _profile(_blocks(1.5)))})
    with pytest.raises(BaselineError, match=r"the baseline .*clf.json: profile KPI 'latency_blocks_ms' is "
                                            r"'fast', not a list of numbers"):
        regression(base, tmp_path / "clf.json", cur, Thresholds())


def _compiled(directory: Path, cache, devices, channels: int, seed: int):
    """conv_classifier (channels, seed) quantized and compiled for sm8650: a context binary in the cache."""
    from harness.steps.context_binary import compile_context
    from harness.steps.ptq import QuantRecipe, quantize
    from perf_helpers import random_feeds

    model = conv_classifier(directory / f"clf_{channels}_{seed}.onnx", channels=channels, seed=seed)
    return compile_context(quantize(model, random_feeds(8, seed=1), QuantRecipe(), cache), devices.soc("sm8650"),
                           cache)


def test_the_ab_path_runs_interleaved_blocks_on_the_real_simulator(tmp_path, cache, devices, sm8650_runner):
    """A changed model whose baseline artifact is in the cache: an interleaved A/B on the emulated device decides
    the simulator's wall time, a slower model (16x the conv channels) regressed, an equal one (other weights) not."""
    from harness.latency_ab import AB_PAIRS, Bench
    from harness.steps.profile import context_sha256
    from perf_helpers import random_feeds

    def kpis(ctx, wall: list[float]) -> dict:
        return {**_profile(wall, artifact=context_sha256(ctx)), "artifact_path": str(ctx.model),
                "block_rule": {"min_iterations": 20, "min_duration_s": 0.05, "warmup": 3}}

    base_ctx = _compiled(tmp_path, cache, devices, 4, 0)
    bench = Bench(sm8650_runner, lambda: random_feeds(1)[0], cache.root)
    base = _snap({"profile": ("passed", kpis(base_ctx, _blocks(1.0)))})
    slow_ctx = _compiled(tmp_path, cache, devices, 64, 0)
    slow = regression(base, tmp_path / "clf.json", _snap({"profile": ("passed", kpis(slow_ctx, _blocks(1.0)))},
                                                          sha="b" * 64), Thresholds(), bench)
    row = _row(slow, "latency_ms.p50")
    assert row["verdict"] == "regressed" and "interleaved A/B" in row["rule"] and row["current"] > row["baseline"]
    assert slow.failures[0].startswith(f"profile latency_ms.p50 regressed: {row['baseline']:.4g} -> ")
    assert f"A/B {AB_PAIRS} pairs, ratio x" in slow.failures[0] and "paired t-test p=" in slow.failures[0]
    assert "; recorded 1.0" in slow.failures[0] and " ms in the two sessions)" in slow.failures[0]
    same_ctx = _compiled(tmp_path, cache, devices, 4, 1)  # other weights: another artifact, the same cost
    assert same_ctx.directory != base_ctx.directory
    same = regression(base, tmp_path / "clf.json", _snap({"profile": ("passed", kpis(same_ctx, _blocks(1.5)))},
                                                          sha="b" * 64), Thresholds(), bench)
    row = _row(same, "latency_ms.p50")
    assert row["verdict"] in ("unchanged", "inconclusive") and "interleaved A/B" in row["rule"], row
    assert not same.failures
    # the baseline's artifact changed in the cache since: no A/B, and the step says why
    gone = _snap({"profile": ("passed", {**kpis(base_ctx, _blocks(1.0)), "artifact_sha256": "9" * 64})})
    report = regression(gone, tmp_path / "clf.json", _snap({"profile": ("passed", kpis(slow_ctx, _blocks(2.0)))},
                                                           sha="b" * 64), Thresholds(), bench)
    assert "no A/B: its artifact" in report.inconclusive[0] and "has changed since" in report.inconclusive[0]


def test_snapshot_leaves_out_the_regression_step_and_saves_atomically(tmp_path):
    records = [StepRecord("sm8650-emu", "sm8650", "clf", "ptq", "passed", {"task_metric": 0.9}),
               StepRecord("sm8650-emu", "sm8650", "other", "ptq", "failed", {}),
               StepRecord("sm8650-emu", "sm8650", "clf", "regression", "passed", {})]
    snap = snapshot(records, "sm8650-emu", "sm8650", "clf", "c" * 64, "0.1.0", "2025-01-01T00:00:00+00:00")
    path = save_baseline(tmp_path / "b", snap)
    assert path == baseline_path(tmp_path / "b", "sm8650-emu", "clf") == tmp_path / "b/sm8650-emu/clf.json"
    assert [p.name for p in path.parent.iterdir()] == ["clf.json"]  # no temporary file left
    data = json.loads(path.read_text())
    assert data == {"format": 2, "device": "sm8650-emu", "soc": "sm8650", "model": "clf", "model_sha256": "c" * 64,
                    "harness_version": "0.1.0", "saved_at": "2025-01-01T00:00:00+00:00", "toolchain": {},
                    "steps": {"ptq": {"outcome": "passed", "kpis": {"task_metric": 0.9}}}}
    assert load_baseline(path) == snap


@pytest.mark.parametrize("body, message", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "is not a harness baseline: the file holds a JSON list, not an object"),
    ('{"format": 7}', "format is 7, this harness reads formats 1, 2"),
    ('{"format": 1, "device": "d", "soc": "s", "model": "m"}', "'model_sha256' is missing, not a string"),
    ('{"format": 1, "device": "d", "soc": "s", "model": "m", "model_sha256": "x", "steps": {"ptq": 3}}',
     "steps.ptq is not an object with a string 'outcome' and an object 'kpis'"),
], ids=["not-json", "list", "format", "no-hash", "bad-step"])
def test_a_corrupt_baseline_file_is_named_with_what_is_wrong(tmp_path, body, message):
    path = tmp_path / "clf.json"
    path.write_text(body)
    with pytest.raises(BaselineError) as e:
        load_baseline(path)
    assert str(path) in str(e.value) and message in str(e.value)


def test_an_unwritable_save_directory_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"--save-baseline .*file/b: cannot create it, .*file is a file"):
        check_save_dir(tmp_path / "file" / "b")
    check_save_dir(tmp_path / "new" / "b")  # creatable: fine, and nothing is created yet
    assert not (tmp_path / "new").exists()
    with pytest.raises(BaselineError, match=r"cannot write the baseline .*file/sm8650-emu/clf.json"):
        save_baseline(tmp_path / "file", _snap({}))


# ----------------------------------------------------------------------------------- end to end


def _spec(directory: Path, name: str, model: Path) -> Path:
    """A model spec for model under the name `name`, all names calibrated and evaluated on the same samples (random
    data is seeded by the model's name), with the emulator's memory threshold (see below)."""
    calib = directory / "calib"
    if not calib.is_dir():
        calib.mkdir()
        np.save(calib / "samples.npy", np.random.default_rng(0).standard_normal((16, 1, 3, 8, 8)).astype(np.float32))
    spec = directory / f"{name}.yaml"
    # The emulator's peak_rss_mb includes the harness process's own size (the runner's getrusage maxrss survives
    # exec), which grows with the run: a threshold for that here. Latency needs none: it is gated on independent
    # blocks, and the simulator's wall time never regresses on recorded figures alone.
    spec.write_text(yaml.safe_dump({"name": name, "path": str(model), "calib_data": str(calib),
                                    "thresholds": {"regression_memory_threshold": 1.0}}))
    return spec


@pytest.fixture
def run(pytester: pytest.Pytester, session_cache_dir: Path):
    """Run the suites in a subprocess with the shared cache; return (result, {(model, step): KPI record})."""
    def _run(*args: str):
        kpi = pytester.path / "kpi.json"
        kpi.unlink(missing_ok=True)
        result = pytester.runpytest_subprocess(str(SUITES), "--cache-dir", str(session_cache_dir),
                                               "--kpi-json", str(kpi), "-p", "no:cacheprovider", "-rA", *args)
        records = json.loads(kpi.read_text())["records"] if kpi.exists() else []
        return result, {(r["model"], r["step"]): r for r in records}
    return _run


NOT_FAILED = ("passed", "inconclusive")  # an inconclusive regression step is recorded as such, or as a pass


def test_save_a_baseline_then_gate_on_it(run, pytester):
    model = conv_classifier(pytester.path / "clf.onnx")
    first = pytester.path / "b1"
    # under pytest-xdist: the controller saves the baseline from the records the workers send
    result, records = run("--model", str(_spec(pytester.path, "clf", model)), *STEPS, "--save-baseline", str(first),
                          "-n", "2", "--dist", "loadgroup")
    assert {step: records[("clf", step)]["outcome"] for step in ("context_binary", "profile", "regression")} == {
        "context_binary": "passed", "profile": "passed", "regression": "skipped"}
    assert records[("clf", "ptq")]["outcome"] in NOT_FAILED  # 16 random samples may not resolve its drop
    assert "no --baseline DIR given" in records[("clf", "regression")]["message"]
    saved = first / "sm8650-emu" / "clf.json"
    result.stdout.fnmatch_lines([f"saved {saved} (3 steps of sm8650-emu x clf)"])
    data = json.loads(saved.read_text())
    assert (data["format"], data["device"], data["soc"], data["model"]) == (2, "sm8650-emu", "sm8650", "clf")
    assert data["model_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest() and data["saved_at"]
    assert sorted(data["steps"]) == ["context_binary", "profile", "ptq"]
    profile = data["steps"]["profile"]
    assert profile["outcome"] == "passed" and profile["kpis"] == records[("clf", "profile")]["kpis"]
    kpis = profile["kpis"]
    assert len(kpis["latency_blocks_ms"]) == 5 and kpis["latency_noise_pct"] >= 0  # independent blocks, noise floor
    assert len(kpis["device_latency_blocks_ms"]) == 5 and kpis["device_latency_source"] == "emulated"
    assert Path(kpis["artifact_path"]).is_file() and len(kpis["artifact_sha256"]) == 64  # the artifact measured

    # The second run's baselines: clf's as saved; for the same model under other names, edited copies.
    second = pytester.path / "b2" / "sm8650-emu"
    second.mkdir(parents=True)

    def variant(name: str, edit) -> None:
        copy = json.loads(saved.read_text())
        copy["model"] = name
        edit(copy)
        (second / f"{name}.json").write_text(json.dumps(copy))

    def faster_device(b):  # the emulated device was 1.5x faster: this run's device latency regressed
        k = b["steps"]["profile"]["kpis"]
        k["device_latency_blocks_ms"] = [t / 1.5 for t in k["device_latency_blocks_ms"]]
        k["device_latency_ms"] /= 1.5

    def more_accurate(b):
        b["steps"]["ptq"]["kpis"]["task_metric"] += 0.05
        b["steps"]["ptq"]["kpis"]["sqnr_db"] += 0.5  # within the 1 dB tolerance

    def other_keys(b):
        del b["steps"]["context_binary"]["kpis"]["context_bytes"]
        b["steps"]["energy"] = {"outcome": "passed", "kpis": {"energy_per_inference_mj": 2.0}}
        b["model_sha256"] = "0" * 64

    def old_format(b):  # an older harness's baseline, 5x faster: no blocks, noise floor or artifact
        b["format"] = 1
        k = b["steps"]["profile"]["kpis"]
        for key in [key for key in k if "blocks" in key or "noise" in key or key.startswith(("artifact", "device"))]:
            del k[key]
        k["latency_ms"]["p50"] /= 5

    def another_model(b):
        b["model"], b["model_sha256"] = "resnet", "1" * 64
        b["steps"]["ptq"]["kpis"]["task_metric"] += 0.05

    (second / "clf.json").write_text(saved.read_text())
    variant("slow", faster_device)
    variant("acc", more_accurate)
    variant("keys", other_keys)
    variant("old", old_format)
    variant("other", another_model)
    (second / "corrupt.json").write_text('{"format": 2, "device": ')
    names = ("clf", "slow", "acc", "keys", "old", "other", "corrupt", "nobase")
    models = [arg for name in names for arg in ("--model", str(_spec(pytester.path, name, model)))]
    result, records = run(*models, *STEPS, "--baseline", str(second.parent))
    out = result.stdout.str()
    assert "Traceback" not in out
    regression_of = {name: records[(name, "regression")] for name in names}
    outcomes = {n: r["outcome"] for n, r in regression_of.items()}
    assert {n: o for n, o in outcomes.items() if o not in NOT_FAILED} == {
        "slow": "failed", "acc": "failed", "corrupt": "failed", "nobase": "skipped"}, outcomes

    same = regression_of["clf"]["kpis"]
    assert same["regressed"] == [] and same["counts"]["regressed"] == 0
    rows = {v["kpi"]: v for v in same["verdicts"] if v["step"] == "profile"}
    assert rows["device_latency_ms"]["verdict"] == "unchanged"
    assert rows["latency_ms.p50"]["verdict"] in ("unchanged", "inconclusive")

    slow = regression_of["slow"]["kpis"]
    assert slow["regressed"] == ["profile device_latency_ms"]
    (lat,) = [v for v in slow["verdicts"] if v["kpi"] == "device_latency_ms"]
    assert lat["verdict"] == "regressed" and lat["p_value"] < 0.05 and lat["delta_pct"] == pytest.approx(50, abs=0.1)
    result.stdout.fnmatch_lines([f"*profile device_latency_ms regressed: {lat['baseline']:.4g} -> {lat['current']:.4g} "
                                 "ms (+50.0%, beyond max(threshold 10%, 3 x noise floor 0%) = 10.0%, 5 vs 5 blocks, "
                                 "Mann-Whitney p=*)*"])

    acc = regression_of["acc"]["kpis"]
    assert acc["regressed"] == ["ptq task_metric"]
    (metric,) = [v for v in acc["verdicts"] if (v["step"], v["kpi"]) == ("ptq", "task_metric")]
    assert metric["delta"] == pytest.approx(-0.05, abs=1e-6)
    result.stdout.fnmatch_lines([f"*ptq task_metric regressed: {metric['baseline']:.4g} -> {metric['current']:.4g} "
                                 "(-0.05, tolerance 0.01)*"])

    keys = {(v["step"], v["kpi"]): v["verdict"] for v in regression_of["keys"]["kpis"]["verdicts"]}
    assert keys[("context_binary", "context_bytes")] == "new"
    assert keys[("energy", "energy_per_inference_mj")] == "missing" and keys[("energy", "outcome")] == "missing"
    current_sha = hashlib.sha256(model.read_bytes()).hexdigest()
    assert regression_of["keys"]["kpis"]["baseline_model_sha256"] == "0" * 64
    assert f"saved from another model file (sha256 {'0' * 64}; this run's is {current_sha})" in out

    old = regression_of["old"]["kpis"]
    old_rows = {v["kpi"]: v for v in old["verdicts"] if v["step"] == "profile"}
    assert old["baseline_format"] == 1 and old["regressed"] == [] and old["inconclusive"] == ["profile latency_ms.p50"]
    assert old_rows["device_latency_ms"]["verdict"] == "new"
    assert "is format 1" in old_rows["latency_ms.p50"]["rule"] and "weaker evidence" in old_rows["latency_ms.p50"]["rule"]

    other = regression_of["other"]["kpis"]
    assert other["regressed"] == [] and "ptq task_metric" in other["inconclusive"]
    assert "is of another model ('resnet'" in out

    corrupt = regression_of["corrupt"]["message"]
    assert f"the baseline {second / 'corrupt.json'} is not valid JSON" in corrupt
    assert f"expected {second / 'nobase.json'}" in regression_of["nobase"]["message"]


def test_a_baseline_directory_that_does_not_exist_is_a_usage_error(pytester, tmp_path):
    (tmp_path / "file").write_text("")
    for args, message in ((["--baseline", str(tmp_path / "nowhere")], f"--baseline {tmp_path / 'nowhere'}: no such "
                                                                        "directory"),
                          (["--save-baseline", str(tmp_path / "file" / "b")], "cannot create it")):
        result = pytester.runpytest_subprocess(str(SUITES), "-p", "no:cacheprovider", "--co", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        assert message in result.stderr.str() and "Traceback" not in result.stderr.str()
