"""`python -m harness signoff`: the release sign-off page, built from real suite runs on the emulated devices.

Four real runs of the spine's first steps are shared by the tests of this module (a module-scoped fixture
runs pytest on the suites in a subprocess, as pytester.runpytest_subprocess does; pytester itself is
function-scoped): a passing run on sm8650 (with error isolation, which attaches a chart, saving a baseline),
the same model on sm8550 in a separate results directory, a run whose PTQ misses an over-strict cosine
threshold, and a run compared with a baseline whose PTQ SQNR was raised, so the regression step fails.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.reporting.report_cli import ReportError, find_allure_cli
from model_builders import conv_classifier

REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "suites"
SPINE3 = "(feasibility or conversion or ptq) and not llm"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--virtual-time-budget=5000"]


@dataclass(frozen=True)
class Run:
    """A real suite run: its directory (kpi.json + allure-results/) and pytest's output."""

    dir: Path
    output: str

    @property
    def kpi(self) -> Path:
        return self.dir / "kpi.json"

    @property
    def allure(self) -> Path:
        return self.dir / "allure-results"


def _run_suites(where: Path, cache: Path, *args: str) -> Run:
    where.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "pytest", str(SUITES), "--cache-dir", str(cache),
                           "--kpi-json", str(where / "kpi.json"), "--alluredir", str(where / "allure-results"),
                           "-p", "no:cacheprovider", "-q", *args],
                          cwd=where, capture_output=True, text=True, timeout=900)
    return Run(where, proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, session_cache_dir: Path) -> dict[str, Run]:
    base = tmp_path_factory.mktemp("signoff-runs")
    onnx_model = conv_classifier(base / "clf.onnx")
    # random data: a drop limit the evaluation's interval decides (at the default 0.02 it may be inconclusive)
    model = base / "clf.yaml"
    model.write_text(f"name: clf\npath: {onnx_model}\nthresholds: {{max_task_metric_drop: 0.2}}\n")
    strict = base / "clf_strict.yaml"
    strict.write_text(f"name: clf_strict\npath: {onnx_model}\n"
                      "thresholds: {min_cosine_similarity: 0.99999, max_task_metric_drop: 0.2}\n")
    out = {
        "go": _run_suites(base / "go", session_cache_dir, "--device", "sm8650", "--model", str(model),
                          "--save-baseline", str(base / "baseline"), "-k", f"{SPINE3} or error_isolation or regression"),
        "sm8550": _run_suites(base / "sm8550", session_cache_dir, "--device", "sm8550", "--model", str(model),
                              "-k", SPINE3),
        "fail": _run_suites(base / "fail", session_cache_dir, "--device", "sm8650", "--model", str(strict),
                            "-k", SPINE3),
    }
    assert "4 passed, 1 skipped" in out["go"].output, out["go"].output  # the regression step: no --baseline
    # a baseline whose PTQ SQNR is far above this run's: the regression step of the next run fails on it
    saved = base / "baseline" / "sm8650-emu" / "clf.json"
    baseline = json.loads(saved.read_text())
    baseline["steps"]["ptq"]["kpis"]["sqnr_db"] += 30
    saved.write_text(json.dumps(baseline))
    out["regressed"] = _run_suites(base / "regressed", session_cache_dir, "--device", "sm8650", "--model",
                                   str(model), "--baseline", str(base / "baseline"), "-k", f"{SPINE3} or regression")
    assert "1 failed, 3 passed" in out["regressed"].output, out["regressed"].output
    assert "3 passed" in out["sm8550"].output, out["sm8550"].output
    assert "1 failed, 2 passed" in out["fail"].output, out["fail"].output
    return out


def signoff(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "signoff", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def cells(html: str) -> dict[str, str]:
    """The matrix's cells of a page: 'device/model/step' -> outcome (rows are device x model)."""
    out = {}
    for row in re.findall(r"<tr><th class=\"dev\".*?</tr>", html, re.S):
        device = re.search(r'<span class="mono">([^<]+)</span>', row).group(1)
        model = re.search(r'<td class="mono model">([^<]+)</td>', row).group(1)
        for outcome, step in re.findall(r'data-outcome="([^"]+)" data-step="([^"]+)"', row):
            out[f"{device}/{model}/{step}"] = outcome
    return out


def test_passing_run_is_go_with_its_kpis_and_chart(runs, tmp_path):
    out = tmp_path / "signoff"
    proc = signoff(runs["go"].dir, "-o", out, "--name", "clf on sm8650")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("signoff: GO - 1 device(s) x 1 model(s) x 4 step(s)")
    html = (out / "index.html").read_text()
    assert 'data-verdict="GO"' in html and "<title>GO · clf on sm8650</title>" in html
    assert cells(html) == {**{f"sm8650-emu/clf/{s}": "passed" for s in ("feasibility", "conversion", "ptq",
                                                                       "error_isolation")},
                           "sm8650-emu/clf/regression": "skipped"}
    assert "skipped on every device × model: regression (no --baseline DIR given" in html  # so not required
    assert "sm8650 (Snapdragon 8 Gen 3)" in html
    assert ">cosine_<wbr>similarity</th>" in html and ">htp_<wbr>fraction</th>" in html  # the steps' KPI tables
    assert re.search(r'<img alt="error_isolation sqnr_plot" src="data:image/png;base64,iVBORw0KGgo', html)
    env = json.loads(runs["go"].kpi.read_text()).get("environment") or {}
    if env.get("onnxruntime_qnn"):
        assert f"<td>{env['onnxruntime_qnn']}</td>" in html


def test_failing_step_is_no_go_naming_it(runs, tmp_path):
    out = tmp_path / "signoff"
    proc = signoff(runs["fail"].kpi, "-o", out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith("signoff: NO-GO")
    reasons = [line for line in proc.stdout.splitlines() if line.startswith("  - ")]
    assert len(reasons) == 1 and reasons[0].startswith("  - failed: sm8650-emu / clf_strict / ptq: ptq did not pass")
    assert "cosine_similarity" in reasons[0] and "0.99999" in reasons[0]
    html = (out / "index.html").read_text()
    assert 'data-verdict="NO-GO"' in html and "Release blocked: 1 failed step." in html
    assert cells(html)["sm8650-emu/clf_strict/ptq"] == "failed"
    assert cells(html)["sm8650-emu/clf_strict/feasibility"] == "passed"


def test_two_runs_merge_into_one_matrix(runs, tmp_path):
    out = tmp_path / "signoff"
    proc = signoff(runs["go"].dir, runs["sm8550"].allure, "-o", out, "--expect-steps", "feasibility,conversion,ptq")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 device(s) x 1 model(s) x 3 step(s)" in proc.stdout
    html = (out / "index.html").read_text()
    matrix = cells(html)
    assert {k for k, v in matrix.items() if v == "passed"} >= {
        f"{d}/clf/{s}" for d in ("sm8650-emu", "sm8550-emu") for s in ("feasibility", "conversion", "ptq")}
    assert "sm8550 (Snapdragon 8 Gen 2)" in html
    # the default rule expects every step that ran on any device x model: sm8550 did not run error isolation
    proc = signoff(runs["go"].kpi, runs["sm8550"].dir, "-o", out)
    assert proc.returncode == 1
    assert "  - not run: sm8550-emu / clf / error_isolation: not run: no record of this step" in proc.stdout
    assert cells((out / "index.html").read_text())["sm8550-emu/clf/error_isolation"] == "not run"


def test_quarantined_device_is_no_go_naming_it(runs, tmp_path):
    data = json.loads(runs["go"].kpi.read_text())
    data["devices"] = [{"id": "sm8650-emu", "soc": "sm8650", "transport": "emulator", "status": "quarantined",
                        "reason": "health check failed: 12 MB free on /data/local/tmp", "since": "2026-01-05T10:00:00Z"}]
    kpi = tmp_path / "kpi.json"
    kpi.write_text(json.dumps(data))
    proc = signoff(kpi, "-o", tmp_path / "signoff")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("  - quarantined: sm8650-emu: quarantined: health check failed: 12 MB free on /data/local/tmp "
            "(since 2026-01-05 10:00:00 UTC)") in proc.stdout
    html = (tmp_path / "signoff" / "index.html").read_text()
    assert '<span class="status quarantined">quarantined</span>' in html


def test_regression_against_the_baseline_is_no_go_listing_the_kpi(runs, tmp_path):
    proc = signoff(runs["regressed"].dir, "-o", tmp_path / "signoff")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    reasons = [line for line in proc.stdout.splitlines() if line.startswith("  - ")]
    assert len(reasons) == 1 and re.fullmatch(
        r"  - regression: sm8650-emu / clf / ptq: sqnr_db: baseline [\d.]+ -> [\d.]+ \(-\d+\.\d%\)", reasons[0])
    html = (tmp_path / "signoff" / "index.html").read_text()
    assert "Release blocked: 1 regressed KPI." in html and "Baseline comparison" in html
    assert re.search(r'<span class="delta regressed">baseline [\d.]+ → [\d.]+, -\d+\.\d% regressed</span>', html)
    assert cells(html)["sm8650-emu/clf/regression"] == "failed"


def test_regressed_kpis_are_listed_with_both_values(runs, tmp_path):
    data = json.loads(runs["go"].kpi.read_text())
    ptq = next(r for r in data["records"] if r["step"] == "ptq")
    verdicts = [{"kpi": "cosine_similarity", "step": "ptq", "baseline": 0.9999, "current": 0.95, "delta": -0.0499,
                 "delta_pct": -4.99, "verdict": "regressed", "p_value": 0.001},
                {"kpi": "sqnr_db", "step": "ptq", "baseline": 30.0, "current": 30.1, "delta": 0.1, "delta_pct": 0.33,
                 "verdict": "unchanged", "p_value": 0.6}]
    data["records"] = [r for r in data["records"] if r["step"] != "regression"] + [
        {**ptq, "step": "regression", "outcome": "failed", "kpis": {"verdicts": verdicts},
         "message": "regression did not pass: 1 KPI regressed against the baseline"}]
    kpi = tmp_path / "kpi.json"
    kpi.write_text(json.dumps(data))
    proc = signoff(kpi, "-o", tmp_path / "signoff")
    assert proc.returncode == 1
    assert ("  - regression: sm8650-emu / clf / ptq: cosine_similarity: baseline 0.9999 -> 0.95 (-5.0%), p=0.001"
            in proc.stdout)
    assert "failed:" not in proc.stdout  # the regression step's failure is listed as its regressions
    html = (tmp_path / "signoff" / "index.html").read_text()
    assert '<span class="delta regressed">baseline 0.9999 → 0.95, -5.0% regressed</span>' in html
    assert '<span class="delta unchanged">baseline 30 → 30.1, +0.3% unchanged</span>' in html


def test_skipped_and_unrecorded_steps_are_not_run(runs, tmp_path):
    data = json.loads(runs["go"].kpi.read_text())
    for r in data["records"]:
        if r["step"] == "error_isolation":
            r.update(outcome="skipped", message="prerequisite step 'ptq' failed: boom")
    kpi = tmp_path / "kpi.json"
    kpi.write_text(json.dumps(data))
    proc = signoff(kpi, "-o", tmp_path / "a", "--expect-steps", "feasibility,conversion,ptq,error_isolation")
    assert proc.returncode == 1
    assert "  - not run: sm8650-emu / clf / error_isolation: skipped: prerequisite step 'ptq' failed: boom" in proc.stdout
    # by default a step skipped on every device x model (the regression step without --baseline, --sweep off)
    # was turned off for the run: not required, and the page says so
    proc = signoff(kpi, "-o", tmp_path / "a")
    assert proc.returncode == 0, proc.stdout
    html = (tmp_path / "a" / "index.html").read_text()
    assert ("skipped on every device × model: error_isolation (prerequisite step &#x27;ptq&#x27; failed: boom)"
            in html)
    proc = signoff(runs["go"].kpi, "-o", tmp_path / "b", "--expect-steps", "all")
    assert proc.returncode == 1
    assert "  - not run: sm8650-emu / clf / float_baseline: not run: no record of this step" in proc.stdout
    assert "  - not run: sm8650-emu / clf / concurrency: not run: no record of this step" in proc.stdout


def test_inconclusive_step_is_a_reason_to_re_run_never_a_pass(runs, tmp_path):
    """A step whose evidence could not decide a limit (as the plugin records it): RE-RUN naming the step and what
    more it needs; beside a failure, one more reason of the NO-GO. A marginal pass passes, flagged."""
    data = json.loads(runs["go"].kpi.read_text())
    for r in data["records"]:
        if r["step"] == "ptq":
            r["kpis"].update(task_metric_drop=0.125, intervals={"task_metric_drop": {
                "low": 0.02, "high": 0.47, "samples": 8, "method": "bootstrap", "confidence": 0.95, "needed": 190}})
            r.update(outcome="inconclusive", message="ptq: inconclusive: 8 samples cannot resolve a drop of 0.02 "
                     "(task_metric_drop 0.125, 95% interval [0.02, 0.47]); about 190 are needed (+1 more)\n"
                     "  - INCONCLUSIVE: top1_agreement = 0.875 [0.53, 0.98] (95% wilson, n=8), rule >= 0.9")
        if r["step"] == "feasibility":
            r["marginal"] = ["PASS (marginal): htp_fraction = 0.991, rule htp_fraction >= 0.99"]
    kpi = tmp_path / "kpi.json"
    kpi.write_text(json.dumps(data))
    proc = signoff(kpi, "-o", tmp_path / "rerun")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("signoff: RE-RUN") and "nothing failed, but 1 step(s) were inconclusive" in lines[1]
    assert lines[2] == ("  - inconclusive: sm8650-emu / clf / ptq: ptq: inconclusive: 8 samples cannot resolve a drop "
                        "of 0.02 (task_metric_drop 0.125, 95% interval [0.02, 0.47]); about 190 are needed (+1 more)")
    html = (tmp_path / "rerun" / "index.html").read_text()
    assert 'data-verdict="RE-RUN"' in html and "Re-run needed: nothing failed, but 1 inconclusive step" in html
    assert cells(html)["sm8650-emu/clf/ptq"] == "inconclusive" and cells(html)["sm8650-emu/clf/feasibility"] == "passed"
    assert "Inconclusive steps: re-run with more samples" in html and "PASS · MARGINAL" in html
    assert "0.125 [0.02, 0.47], n=8" in html  # the KPI with the interval it rests on
    assert '<details class="why"><summary>ptq: inconclusive: 8 samples cannot resolve a drop' in html  # details: a click
    proc = signoff(kpi, runs["fail"].kpi, "-o", tmp_path / "nogo")
    assert proc.returncode == 1 and proc.stdout.startswith("signoff: NO-GO")
    assert "  - inconclusive: sm8650-emu / clf / ptq: ptq: inconclusive: 8 samples" in proc.stdout
    assert "  - failed: sm8650-emu / clf_strict / ptq: ptq did not pass" in proc.stdout


def test_bad_inputs_exit_2_naming_the_file(runs, tmp_path):
    corrupt = tmp_path / "kpi.json"
    corrupt.write_text('{"records": [')
    for args, expected in (([corrupt], f"signoff: {corrupt}: not valid JSON (line 1, column 14"),
                           ([tmp_path / "missing"], f"signoff: {tmp_path / 'missing'}: no such file or directory"),
                           ([runs["go"].kpi, tmp_path / "empty"], f"signoff: {tmp_path / 'empty'}: no results found")):
        (tmp_path / "empty").mkdir(exist_ok=True)
        proc = signoff(*args, "-o", tmp_path / "out")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(expected), proc.stderr
        assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()
    (tmp_path / "other.json").write_text('{"rows": []}')
    proc = signoff(tmp_path / "other.json", "-o", tmp_path / "out")
    assert proc.returncode == 2 and 'not a KPI JSON: expected an object with a "records" list' in proc.stderr


def test_page_requests_nothing_from_outside(runs, tmp_path):
    out = tmp_path / "signoff"
    signoff(runs["go"].dir, runs["fail"].dir, "-o", out)
    html = (out / "index.html").read_text()
    assert "<script" not in html.lower() and "<link" not in html.lower() and "@import" not in html
    assert not re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.IGNORECASE)
    assert not re.findall(r"url\(\s*['\"]?(?:https?:)?//", html, re.IGNORECASE)
    assert all(src.startswith("data:image/png;base64,") for src in re.findall(r'src="([^"]*)"', html))
    assert all(href.startswith("#") for href in re.findall(r'href="([^"]*)"', html))


def test_every_value_is_escaped(runs, tmp_path):
    data = json.loads(runs["fail"].kpi.read_text())
    for r in data["records"]:
        r["model"] = "<b>m&1</b>"
        if r["outcome"] == "failed":
            r["message"] = 'ptq did not pass: <script>alert("x")</script>'
            r["kpis"]["recipe"] = "<img src=x onerror=alert(1)>"
    kpi = tmp_path / "kpi.json"
    kpi.write_text(json.dumps(data))
    assert signoff(kpi, "-o", tmp_path / "signoff").returncode == 1
    html = (tmp_path / "signoff" / "index.html").read_text()
    assert "<script" not in html and "<b>m" not in html and "<img src=x" not in html
    assert "&lt;b&gt;m&amp;1&lt;/b&gt;" in html and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html


def _chromium_or_skip() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if path is None:
        pytest.skip("headless Chromium is not installed (apt-get install -y chromium)")
    return path


def chromium(page: Path, tmp_path: Path, *args: str) -> str:
    """Open page from disk in headless Chromium (scripts run, network cut off); return stdout (--dump-dom)."""
    proc = subprocess.run([_chromium_or_skip(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}", *args,
                           page.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_signoff_page_renders_in_chromium(runs, tmp_path):
    _chromium_or_skip()
    out = tmp_path / "signoff"
    assert signoff(runs["go"].dir, runs["fail"].dir, "-o", out).returncode == 1
    dom = chromium(out / "index.html", tmp_path, "--dump-dom")
    assert re.search(r'<div class="verdict-label" data-verdict="NO-GO">NO-GO</div>', dom)
    assert '<table class="matrix">' in dom
    matrix = cells(dom)
    assert matrix["sm8650-emu/clf_strict/ptq"] == "failed" and matrix["sm8650-emu/clf/ptq"] == "passed"
    assert "Failed steps" in dom and "ptq did not pass" in dom
    shot = tmp_path / "signoff.png"
    chromium(out / "index.html", tmp_path, "--hide-scrollbars", "--window-size=1400,1800", f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_allure_report_renders_in_chromium_with_environment_and_categories(runs, tmp_path):
    _chromium_or_skip()
    try:
        find_allure_cli()
    except ReportError as e:
        pytest.skip(str(e))
    results = tmp_path / "results"
    shutil.copytree(runs["fail"].allure, results)
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "harness", "report", str(results), "-o", str(out),
                           "--name", "clf_strict sign-off"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "3 tests: 2 passed, 1 failed (3 new); status failed" in proc.stdout
    assert "categories: Accuracy 1" in proc.stdout
    dom = chromium(out / "index.html", tmp_path, "--dump-dom")
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
    assert "clf_strict sign-off" in text and "test_04_ptq" in text and "test_01_feasibility" in text
    assert "onnxruntime-qnn" in text and "sm8650-emu" in text  # environment.properties
    assert "local run" in text  # executor.json


def test_a_language_models_perplexity_is_its_task_row_with_a_paired_window_interval():
    """llm_accuracy's perplexity per recipe on the HTP beside float's: the shipped recipe's ratio interval comes
    from a paired bootstrap over the held-out windows (harness.llm.steps.perplexity_intervals)."""
    import numpy as np

    from harness.kpi import INTERVALS_KEY, Interval
    from harness.llm.steps import perplexity_intervals
    from harness.reporting.records import StepRecord
    from harness.signoff.inputs import RunSet
    from harness.signoff.task_table import task_rows

    rng = np.random.default_rng(0)
    floating = [{"nll": float(nll), "count": 31} for nll in rng.uniform(90.0, 130.0, 40)]
    quantized = [{"nll": w["nll"] * 1.03, "count": 31} for w in floating]  # every window 3 % more NLL
    intervals = perplexity_intervals({"windows": floating}, {"windows": quantized})
    increase = Interval.from_dict(intervals["perplexity_increase"])
    total_f, total_q = sum(w["nll"] for w in floating), sum(w["nll"] for w in quantized)
    value = float(np.exp((total_q - total_f) / (31 * 40)) - 1)
    assert increase.samples == 40 and increase.low <= value <= increase.high and increase.high - increase.low < 0.02
    assert perplexity_intervals({"windows": floating}, {}) == {}
    float_ppl, htp_ppl = float(np.exp(total_f / 1240)), float(np.exp(total_q / 1240))
    kpis = {"recipe": "w8a16", "eval_windows": 40, "perplexity_float_host": float_ppl, "perplexity_htp": htp_ppl,
            "sweep": {"w8a16": {"perplexity_htp": htp_ppl}, "w4a16": {"perplexity_htp": htp_ppl * 1.5}},
            INTERVALS_KEY: intervals}
    runs = RunSet([StepRecord("sm8650-emu", "sm8650", "tiny_gpt", "llm_accuracy", "passed", kpis)], [], [])
    shipped, other = task_rows(runs)
    assert (shipped.metric, shipped.precision, shipped.samples, shipped.outcome) == (
        "perplexity", "w8a16 (shipped)", 40, "passed")
    assert shipped.ratio == pytest.approx(float_ppl / htp_ppl) and shipped.float_value == float_ppl
    assert shipped.interval.low == pytest.approx(1 / (1 + increase.high))
    assert shipped.interval.low <= shipped.ratio <= shipped.interval.high
    assert other.precision == "w4a16" and other.interval is None and other.ratio == pytest.approx(float_ppl / htp_ppl / 1.5)
