"""`python -m harness report`: an offline Allure report of a real suite run, with no outside scripts, the
environment, executor and categories files beside the results, and history kept between runs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.reporting.report_cli import (CATEGORIES, ReportError, executor_info, find_allure_cli, report_data,
                                          strip_external_scripts, write_allure_extras)
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



def test_a_table_whose_rows_differ_in_keys_attaches_every_column():
    # llm_accuracy's perplexity_by_recipe: the shipped recipe's row alone carries its greedy agreement, and it need
    # not be the first row
    from harness.reporting.allure import table_csv

    text = table_csv([{"recipe": "w8a16", "perplexity_htp": 60.1}, {"recipe": "w4a16", "greedy_agreement": 0.9}])
    assert text.splitlines() == ["recipe,perplexity_htp,greedy_agreement", "w8a16,60.1,", "w4a16,,0.9"]

def _cli_or_skip():
    try:
        return find_allure_cli()
    except ReportError as e:
        pytest.skip(str(e))


def _suite_run(pytester, cache_dir, model, results):
    run = pytester.runpytest_subprocess(str(SUITES), "--model", str(model), "--cache-dir", str(cache_dir),
                                        "--alluredir", str(results), "-p", "no:cacheprovider",
                                        "-k", "(feasibility or conversion or ptq) and not llm")
    run.assert_outcomes(passed=3)


def _report(results, out, *args):
    return subprocess.run([sys.executable, "-m", "harness", "report", str(results), "-o", str(out), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_report_of_a_suite_run_is_self_contained_counts_the_steps_and_keeps_history(pytester, session_cache_dir):
    _cli_or_skip()
    model = pytester.path / "clf.yaml"  # a drop limit its random-data evaluation decides (0.02 is inconclusive)
    model.write_text(f"name: clf\npath: {conv_classifier(pytester.path / 'clf.onnx')}\n"
                     "thresholds: {max_task_metric_drop: 0.2}\n")
    results, out = pytester.path / "allure-results", pytester.path / "report"
    _suite_run(pytester, session_cache_dir, model, results)
    proc = _report(results, out, "--name", "sm8650 sign-off")
    assert proc.returncode == 0, proc.stderr
    assert "3 tests: 3 passed (3 new); status passed" in proc.stdout  # new: not in the (empty) history
    assert f"report: history {out / 'history.jsonl'} (1 run(s))" in proc.stdout
    assert f"report: wrote environment.properties, executor.json, categories.json into {results}" in proc.stdout
    html = (out / "index.html").read_text()
    assert "googletagmanager" not in html and "gtag(" not in html
    assert not [m for m in ("src=\"http://", "src=\"https://", "src=\"//") if m in html]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stats"] == {"total": 3, "passed": 3, "new": 3} and summary["name"] == "sm8650 sign-off"
    env = {k: v for k, v in (line.split("=", 1) for line in (results / "environment.properties").read_text().splitlines())}
    assert env["devices"] == "sm8650-emu" and env["socs"] == "sm8650 (Snapdragon 8 Gen 3)" and env["onnxruntime"]
    assert [e["name"] for e in report_data(out, "widgets/allure_environment.json")][:3] == [
        "harness", "onnxruntime", "onnxruntime-qnn"]

    # the same run reported again is still one run of the history; a second run makes two
    assert "(1 run(s))" in _report(results, out, "--name", "sm8650 sign-off").stdout
    second = pytester.path / "allure-results-2"
    _suite_run(pytester, session_cache_dir, model, second)
    proc = _report(second, out, "--name", "sm8650 sign-off")
    assert proc.returncode == 0, proc.stderr
    assert "3 tests: 3 passed; status passed" in proc.stdout and "(2 run(s))" in proc.stdout
    assert len((out / "history.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "summary.json").read_text())["stats"] == {"total": 3, "passed": 3}  # none new now
    html = (out / "index.html").read_text()
    first_run = json.loads((out / "history.jsonl").read_text().splitlines()[0])["uuid"]
    assert report_data(out, f"data/history/{first_run}.json")["uuid"] == first_run  # the trend charts' earlier run


def test_extras_are_written_once_and_a_users_own_are_kept(tmp_path):
    result = {"name": "test_ptq[sm8550-emu-m]", "status": "failed", "parameters": [
        {"name": "device", "value": "'sm8550-emu'"}, {"name": "soc", "value": "'sm8550 (Snapdragon 8 Gen 2)'"},
        {"name": "model", "value": "'m'"}]}
    (tmp_path / "a-result.json").write_text(json.dumps(result))
    (tmp_path / "categories.json").write_text('[{"name": "mine", "messageRegex": ".*"}]')
    written = write_allure_extras(tmp_path, "rel-1", versions={"harness_version": "9.9", "python": "3.11.7"},
                                  env={})
    assert written == ["environment.properties", "executor.json"]
    assert (tmp_path / "environment.properties").read_text() == (
        "harness=9.9\npython=3.11.7\ndevices=sm8550-emu\nsocs=sm8550 (Snapdragon 8 Gen 2)\n")
    executor = json.loads((tmp_path / "executor.json").read_text())
    assert executor["type"] == "local" and executor["reportName"] == "rel-1"
    assert json.loads((tmp_path / "categories.json").read_text()) == [{"name": "mine", "messageRegex": ".*"}]
    assert write_allure_extras(tmp_path, "rel-2") == []


def test_executor_names_the_ci_job():
    gh = executor_info("rel", {"GITHUB_RUN_ID": "42", "GITHUB_RUN_NUMBER": "7", "GITHUB_WORKFLOW": "onboard",
                               "GITHUB_SERVER_URL": "https://github.example", "GITHUB_REPOSITORY": "org/repo"})
    assert gh == {"name": "GitHub Actions", "type": "github", "url": "https://github.example/org/repo",
                  "buildName": "onboard #7", "buildUrl": "https://github.example/org/repo/actions/runs/42",
                  "buildOrder": 7, "reportName": "rel"}
    gitlab = executor_info("rel", {"GITLAB_CI": "true", "CI_PIPELINE_ID": "900", "CI_JOB_NAME": "signoff",
                                   "CI_JOB_URL": "https://gitlab.example/j/1"})
    assert gitlab["type"] == "gitlab" and gitlab["buildName"] == "signoff #900"


def test_categories_match_the_harness_failure_messages():
    import re

    def category(status, message):
        for c in CATEGORIES:  # first match, as Allure does (regexes searched, as Allure 3's JavaScript does)
            if status in c["matchedStatuses"] and re.search(c.get("messageRegex", ""), message):
                return c["name"]
        return None

    assert category("failed", "ptq did not pass:\n  cosine_similarity = 0.97, rule cosine_similarity >= 0.98 "
                              "FAILED") == "Accuracy"
    assert category("failed", "regression did not pass: latency_ms.p50 regressed") == "Regression"
    assert category("failed", "feasibility: 2 nodes cannot run on the HTP: det1 (Det)") == "Unsupported op"
    assert category("failed", "device sm8650-emu was taken out of the session after: not answering") == "Device fault"
    assert category("broken", "KeyError: 'x'") == "Device fault"
    assert category("failed", "float_baseline did not pass: max_abs_diff 0.1 > 1e-4") is None
    # what harness.reporting.allure gives an inconclusive step (Allure's status unknown) and a marginal pass
    inconclusive = ("INCONCLUSIVE: ptq: inconclusive: 8 samples cannot resolve a drop of 0.02 (task_metric_drop "
                    "0.125, 95% interval [0.02, 0.47]); about 190 are needed")
    assert category("unknown", inconclusive) == "Inconclusive"
    assert category("passed", "MARGINAL: PASS (marginal): htp_fraction = 0.999, rule htp_fraction >= 0.99") == \
        "Marginal pass"
    assert category("passed", "") is None


def test_missing_results_are_a_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "harness", "report", str(tmp_path / "none")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no Allure results (*-result.json); run pytest with --alluredir" in proc.stderr
    assert "Traceback" not in proc.stderr
