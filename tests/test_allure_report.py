"""`python -m harness report`: an offline Allure report of a real suite run, with no outside scripts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.allure_report import ReportError, find_allure_cli, strip_external_scripts
from model_builders import conv_classifier

REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "suites"


def test_external_and_analytics_scripts_are_removed():
    html = ('<head><script src="app.js"></script>\n<script async src="https://www.example.com/gtag/js?id=G-1">'
            '</script>\n<script>\n window.dataLayer = [];\n function gtag(){dataLayer.push(arguments);}\n'
            " gtag('js', new Date());\n</script>\n<script>window.allureReportData = {};</script></head>")
    cleaned, removed = strip_external_scripts(html)
    assert removed == 2
    assert "example.com" not in cleaned and "gtag" not in cleaned
    assert '<script src="app.js"></script>' in cleaned and "allureReportData" in cleaned


def _cli_or_skip():
    try:
        return find_allure_cli()
    except ReportError as e:
        pytest.skip(str(e))


def test_report_of_a_suite_run_is_self_contained_and_counts_the_steps(pytester, session_cache_dir):
    _cli_or_skip()
    model = conv_classifier(pytester.path / "clf.onnx")
    results, out = pytester.path / "allure-results", pytester.path / "report"
    run = pytester.runpytest_subprocess(str(SUITES), "--model", str(model), "--cache-dir", str(session_cache_dir),
                                        "--alluredir", str(results), "-p", "no:cacheprovider",
                                        "-k", "feasibility or conversion or ptq")
    run.assert_outcomes(passed=3)
    proc = subprocess.run([sys.executable, "-m", "harness", "report", str(results), "-o", str(out),
                           "--name", "sm8650 sign-off"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "3 tests: 3 passed; status passed" in proc.stdout
    html = (out / "index.html").read_text()
    assert "googletagmanager" not in html and "gtag(" not in html
    assert not [m for m in ("src=\"http://", "src=\"https://", "src=\"//") if m in html]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stats"] == {"total": 3, "passed": 3} and summary["name"] == "sm8650 sign-off"


def test_missing_results_are_a_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "harness", "report", str(tmp_path / "none")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no Allure results (*-result.json); run pytest with --alluredir" in proc.stderr
    assert "Traceback" not in proc.stderr
