"""Baselines and regression gates: the comparison rules of harness/baseline.py, the regression step's report,
and --save-baseline / --baseline end to end through the real suites on the emulated device."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness.baseline import (BaselineError, Snapshot, StepResult, baseline_path, check_save_dir, compare_higher,
                              compare_lower, compare_outcome, compare_samples, load_baseline, save_baseline,
                              snapshot)
from harness.errors import ConfigError
from harness.models import Thresholds
from harness.session import StepRecord
from harness.steps.regression import compare, regression
from model_builders import conv_classifier

SUITES = Path(__file__).resolve().parent.parent / "suites"
STEPS = ("-k", "(ptq or context_binary or profile or regression) and not llm")  # PTQ's prerequisites run as fixtures

# ----------------------------------------------------------------------------------- the rules, pure


def _noisy(median: float, n: int = 40, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(np.round(median * (1 + 0.03 * rng.standard_normal(n)), 4))


def test_identical_samples_are_unchanged():
    samples = _noisy(2.0)
    v = compare_samples("profile", "latency_ms.p50", samples, list(samples), 0.05, 0.10)
    assert (v.verdict, v.p_value, v.delta, v.delta_pct) == ("unchanged", 1.0, 0.0, 0.0)
    assert "Mann-Whitney U" in v.rule


def test_a_clearly_shifted_sample_regresses_with_both_values_and_the_p_value():
    v = compare_samples("profile", "latency_ms.p50", _noisy(2.61), _noisy(3.40, seed=1), 0.05, 0.10)
    assert v.verdict == "regressed" and v.p_value < 1e-6 and 25 < v.delta_pct < 35
    assert v.baseline == pytest.approx(2.61, rel=0.02) and v.current == pytest.approx(3.40, rel=0.02)
    assert v.message().startswith(f"profile latency_ms.p50 regressed: {v.baseline:.4g} -> {v.current:.4g} ms (+")
    assert ", Mann-Whitney p=" in v.message()


def test_a_significant_shift_below_the_threshold_is_unchanged():
    base, cur = _noisy(2.0, n=400), _noisy(2.1, n=400, seed=1)  # +5%: significant, under 10%
    v = compare_samples("profile", "latency_ms.p50", base, cur, 0.05, 0.10)
    assert v.p_value < 0.05 and 0 < v.delta_pct < 10 and v.verdict == "unchanged"


def test_a_large_shift_of_a_few_noisy_samples_is_not_significant():
    base = [1.0, 5.0, 1.1, 4.0, 1.2, 3.0]
    cur = [1.3, 4.5, 1.4, 5.5, 1.0, 3.5]  # medians +35%, but the samples overlap
    v = compare_samples("profile", "latency_ms.p50", base, cur, 0.05, 0.10)
    assert v.p_value > 0.05 and v.delta_pct > 10 and v.verdict == "unchanged"


def test_an_improvement_is_improved():
    v = compare_samples("profile", "latency_ms.p50", _noisy(3.0), _noisy(2.0, seed=1), 0.05, 0.10)
    assert v.verdict == "improved" and v.delta_pct < -30


def test_too_few_samples_fall_back_to_the_threshold_and_say_so():
    v = compare_samples("profile", "latency_ms.p50", [1.0, 1.1, 1.0], _noisy(2.0), 0.05, 0.10)
    assert v.verdict == "regressed" and v.p_value is None
    assert "too few samples for the Mann-Whitney U test (3 in the baseline, 40 now, 5 needed on each side)" in v.rule
    assert "relative threshold only: too few samples" in v.message()


def test_accuracy_is_held_to_an_absolute_tolerance():
    assert compare_higher("ptq", "task_metric", 0.95, 0.945, 0.01).verdict == "unchanged"
    drop = compare_higher("ptq", "task_metric", 0.95, 0.90, 0.01)
    assert drop.verdict == "regressed" and drop.delta == pytest.approx(-0.05)
    assert drop.message() == "ptq task_metric regressed: 0.95 -> 0.9 (-0.05, tolerance 0.01)"
    assert compare_higher("ptq", "sqnr_db", 20.0, 22.0, 1.0, "dB").verdict == "improved"
    assert compare_higher("ptq", "sqnr_db", float("inf"), float("inf"), 1.0, "dB").verdict == "unchanged"


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


def _snap(steps: dict[str, tuple[str, dict]], soc: str = "sm8650", sha: str = "a" * 64) -> Snapshot:
    return Snapshot("sm8650-emu", soc, "clf", sha, {k: StepResult(o, kpis) for k, (o, kpis) in steps.items()})


def test_the_report_fails_on_each_regressed_kpi_and_notes_another_model_and_soc(tmp_path):
    base = _snap({"ptq": ("passed", {"task_metric": 0.95, "cosine_similarity": 0.999, "sqnr_db": 30.0}),
                  "profile": ("passed", {"latency_samples_ms": _noisy(2.61), "latency_ms": {"p50": 2.61},
                                         "peak_rss_mb": 100.0}),
                  "runtime": ("passed", {}), "energy": ("passed", {"energy_per_inference_mj": 3.0})})
    cur = _snap({"ptq": ("passed", {"task_metric": 0.95, "cosine_similarity": 0.999, "sqnr_db": 30.2}),
                 "context_binary": ("passed", {"context_bytes": 5000}),
                 "profile": ("passed", {"latency_samples_ms": _noisy(3.40, seed=1), "latency_ms": {"p50": 3.4},
                                        "peak_rss_mb": 101.0}),
                 "runtime": ("failed", {})}, soc="sm8550", sha="b" * 64)
    report = regression(base, tmp_path / "clf.json", cur, Thresholds())
    k = report.kpis
    rows = {(r["step"], r["kpi"]): r for r in k["verdicts"]}
    assert rows[("ptq", "sqnr_db")]["verdict"] == "unchanged"
    assert rows[("context_binary", "context_bytes")]["verdict"] == "new"
    assert rows[("energy", "energy_per_inference_mj")]["verdict"] == "missing"
    assert rows[("runtime", "outcome")]["verdict"] == "regressed"
    assert set(rows[("profile", "latency_ms.p50")]) == {"kpi", "step", "baseline", "current", "delta", "delta_pct",
                                                        "verdict", "p_value", "rule"}
    assert k["regressed"] == ["profile latency_ms.p50", "runtime outcome"]
    assert k["counts"]["regressed"] == 2 and k["counts"]["new"] == 2  # context_binary's size and its outcome
    assert report.tables["verdicts"] == k["verdicts"] and not report.passed
    assert report.failures[0].startswith("profile latency_ms.p50 regressed: ")
    assert "ms (+" in report.failures[0] and ", Mann-Whitney p=" in report.failures[0]
    assert report.failures[1] == "runtime outcome regressed: passed -> failed"
    assert any(f"sha256 {'a' * 64}; this run's is {'b' * 64}" in n for n in report.notes)
    assert any("saved on SoC sm8650, this run is on sm8550" in n for n in report.notes)


def test_latency_without_samples_on_one_side_falls_back_to_p50():
    base = _snap({"profile": ("passed", {"latency_ms": {"p50": 1.0}})})
    cur = _snap({"profile": ("passed", {"latency_samples_ms": _noisy(1.5), "latency_ms": {"p50": 1.5}})})
    (v,) = [v for v in compare(base, cur, Thresholds()) if v.kpi == "latency_ms.p50"]
    assert v.verdict == "regressed" and "the baseline has no latency_samples_ms" in v.rule


def test_a_mistyped_baseline_kpi_is_an_error_naming_the_file(tmp_path):
    base = _snap({"profile": ("passed", {"latency_samples_ms": "fast"})})
    cur = _snap({"profile": ("passed", {"latency_samples_ms": _noisy(1.5)})})
    with pytest.raises(BaselineError, match=r"the baseline .*clf.json: profile KPI 'latency_samples_ms' is "
                                            r"'fast', not a list of numbers"):
        regression(base, tmp_path / "clf.json", cur, Thresholds())


def test_snapshot_leaves_out_the_regression_step_and_saves_atomically(tmp_path):
    records = [StepRecord("sm8650-emu", "sm8650", "clf", "ptq", "passed", {"task_metric": 0.9}),
               StepRecord("sm8650-emu", "sm8650", "other", "ptq", "failed", {}),
               StepRecord("sm8650-emu", "sm8650", "clf", "regression", "passed", {})]
    snap = snapshot(records, "sm8650-emu", "sm8650", "clf", "c" * 64, "0.1.0", "2025-01-01T00:00:00+00:00")
    path = save_baseline(tmp_path / "b", snap)
    assert path == baseline_path(tmp_path / "b", "sm8650-emu", "clf") == tmp_path / "b/sm8650-emu/clf.json"
    assert [p.name for p in path.parent.iterdir()] == ["clf.json"]  # no temporary file left
    data = json.loads(path.read_text())
    assert data == {"format": 1, "device": "sm8650-emu", "soc": "sm8650", "model": "clf", "model_sha256": "c" * 64,
                    "harness_version": "0.1.0", "saved_at": "2025-01-01T00:00:00+00:00",
                    "steps": {"ptq": {"outcome": "passed", "kpis": {"task_metric": 0.9}}}}
    assert load_baseline(path) == snap


@pytest.mark.parametrize("body, message", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "is not a harness baseline: the file holds a JSON list, not an object"),
    ('{"format": 7}', "format is 7, this harness reads format 1"),
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
    data is seeded by the model's name), with the emulator's latency and memory thresholds (see below)."""
    calib = directory / "calib"
    if not calib.is_dir():
        calib.mkdir()
        np.save(calib / "samples.npy", np.random.default_rng(0).standard_normal((16, 1, 3, 8, 8)).astype(np.float32))
    spec = directory / f"{name}.yaml"
    # The HTP simulator on a shared 2-core machine moves a sub-millisecond model's median latency by tens of percent
    # from run to run, and over hundreds of samples the U test calls such a shift significant; and the emulator's
    # peak_rss_mb includes the harness process's own size (the runner's getrusage maxrss survives exec), which
    # grows with the run. Thresholds for that here; a phone's noise is far below the defaults.
    spec.write_text(yaml.safe_dump({"name": name, "path": str(model), "calib_data": str(calib),
                                    "thresholds": {"regression_latency_threshold": 1.0,
                                                   "regression_memory_threshold": 1.0}}))
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


def test_save_a_baseline_then_gate_on_it(run, pytester):
    model = conv_classifier(pytester.path / "clf.onnx")
    first = pytester.path / "b1"
    # under pytest-xdist: the controller saves the baseline from the records the workers send
    result, records = run("--model", str(_spec(pytester.path, "clf", model)), *STEPS, "--save-baseline", str(first),
                          "-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=3, skipped=1)
    assert "no --baseline DIR given" in records[("clf", "regression")]["message"]
    saved = first / "sm8650-emu" / "clf.json"
    result.stdout.fnmatch_lines([f"saved {saved} (3 steps of sm8650-emu x clf)"])
    data = json.loads(saved.read_text())
    assert (data["format"], data["device"], data["soc"], data["model"]) == (1, "sm8650-emu", "sm8650", "clf")
    assert data["model_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest() and data["saved_at"]
    assert sorted(data["steps"]) == ["context_binary", "profile", "ptq"]
    profile = data["steps"]["profile"]
    assert profile["outcome"] == "passed" and profile["kpis"] == records[("clf", "profile")]["kpis"]
    samples = profile["kpis"]["latency_samples_ms"]
    assert len(samples) == profile["kpis"]["iterations"] and all(round(s, 4) == s for s in samples)

    # The second run's baselines: clf's as saved; for the same model under other names, edited copies.
    second = pytester.path / "b2" / "sm8650-emu"
    second.mkdir(parents=True)

    def variant(name: str, edit) -> None:
        copy = json.loads(saved.read_text())
        copy["model"] = name
        edit(copy)
        (second / f"{name}.json").write_text(json.dumps(copy))

    def faster(b):  # the baseline was 5x faster: this run's latency regressed
        b["steps"]["profile"]["kpis"]["latency_samples_ms"] = [s / 5 for s in samples]

    def more_accurate(b):
        b["steps"]["ptq"]["kpis"]["task_metric"] += 0.05
        b["steps"]["ptq"]["kpis"]["sqnr_db"] += 0.5  # within the 1 dB tolerance

    def other_keys(b):
        del b["steps"]["context_binary"]["kpis"]["context_bytes"]
        b["steps"]["energy"] = {"outcome": "passed", "kpis": {"energy_per_inference_mj": 2.0}}
        b["model_sha256"] = "0" * 64

    (second / "clf.json").write_text(saved.read_text())
    variant("slow", faster)
    variant("acc", more_accurate)
    variant("keys", other_keys)
    (second / "corrupt.json").write_text('{"format": 1, "device": ')
    names = ("clf", "slow", "acc", "keys", "corrupt", "nobase")
    models = [arg for name in names for arg in ("--model", str(_spec(pytester.path, name, model)))]
    result, records = run(*models, *STEPS, "--baseline", str(second.parent))
    out = result.stdout.str()
    assert "Traceback" not in out
    regression_of = {name: records[(name, "regression")] for name in names}
    assert {n: r["outcome"] for n, r in regression_of.items()} == {
        "clf": "passed", "slow": "failed", "acc": "failed", "keys": "passed", "corrupt": "failed",
        "nobase": "skipped"}

    same = {v["kpi"]: v for v in regression_of["clf"]["kpis"]["verdicts"] if v["step"] == "profile"}
    assert same["latency_ms.p50"]["verdict"] in ("unchanged", "improved") and same["latency_ms.p50"]["p_value"] >= 0
    assert regression_of["clf"]["kpis"]["counts"]["regressed"] == 0

    slow = regression_of["slow"]["kpis"]
    assert slow["regressed"] == ["profile latency_ms.p50"]
    (lat,) = [v for v in slow["verdicts"] if v["kpi"] == "latency_ms.p50"]
    assert lat["verdict"] == "regressed" and lat["p_value"] < 1e-6 and lat["delta_pct"] > 100
    assert lat["baseline"] == pytest.approx(float(np.median(samples)) / 5, rel=1e-3)
    result.stdout.fnmatch_lines([f"*profile latency_ms.p50 regressed: {lat['baseline']:.4g} -> {lat['current']:.4g} ms "
                                 f"(+{lat['delta_pct']:.1f}%, Mann-Whitney p=*)*"])

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
