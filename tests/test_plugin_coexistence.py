"""The harness beside other pytest plugins (issue 39, item 4): its fixtures are its own whatever else is installed
(labgrid's pytest plugin has a `target` too), and a step test that something other than the harness skipped makes
the run not green (EXIT_SKIPPED_ELSEWHERE), its summary naming the test, the reason and where it was raised."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harness.reporting.records import StepRecord
from harness.reporting.summary import (EXIT_DEVICES_OUT, EXIT_INCONCLUSIVE, EXIT_SKIPPED_ELSEWHERE, SkippedElsewhere,
                                       run_exit_status, skipped_elsewhere_lines)

SUITES = Path(__file__).resolve().parent.parent / "suites"
# cheap steps, and three of the harness's own skips: regression (no --baseline), two LLM suites (not a kind-llm model)
CHEAP = ("-k", "feasibility or conversion or regression")
NOT_RUN = "* was skipped by something other than the harness: *"


def summary_section(text: str) -> list[str]:
    """Return the lines of the harness's terminal summary (its `snapdragon harness` section)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "snapdragon harness" in line and line.startswith("="))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("=")), len(lines))
    return lines[start + 1:end]


def allure_results(directory: Path) -> dict[str, tuple]:
    """Return per test its Allure status, message, labels (but the process's thread and host), parameters and
    attachment names, its steps' included."""
    results = {}
    for path in directory.glob("*-result.json"):
        r = json.loads(path.read_text())
        labels = sorted((label["name"], label["value"]) for label in r.get("labels", [])
                        if label["name"] not in ("thread", "host"))
        steps = [(s["name"], s.get("status"), [a["name"] for a in s.get("attachments", [])])
                 for s in r.get("steps", [])]
        results[r["name"]] = (r["status"], r.get("statusDetails", {}).get("message"), labels,
                              [(p["name"], p["value"]) for p in r.get("parameters", [])],
                              [a["name"] for a in r.get("attachments", [])], steps)
    return results


def test_with_labgrid_installed_the_default_run_is_the_same_as_without_it(pytester, session_cache_dir):
    """labgrid's plugin (entry point `labgrid`) has session fixtures env, target and strategy; its `env` skips
    without --lg-env. Installed beside the harness, it changes nothing: the same outcomes, exit status 0, the same
    summary and Allure results (-vvv: labgrid raises pytest's live-log level with the verbosity)."""
    pytest.importorskip("labgrid.pytestplugin", reason="labgrid is not installed: pip install -e '.[test]' installs it")

    def run(*args: str):
        out = pytester.path / ("without" if args else "with")
        result = pytester.runpytest_subprocess(
            str(SUITES), *CHEAP, "--device", "sm8650", f"--cache-dir={session_cache_dir}", "-p", "no:cacheprovider",
            "-vvv", "-rA", "--kpi-json", str(out / "kpi.json"), "--alluredir", str(out / "allure"), *args)
        records = json.loads((out / "kpi.json").read_text())["records"]
        return result, {r["step"]: (r["outcome"], r["message"]) for r in records}, allure_results(out / "allure")

    with_labgrid, records, allure = run()
    without, records_without, allure_without = run("-p", "no:labgrid")
    text = with_labgrid.stdout.str() + with_labgrid.stderr.str()
    assert with_labgrid.ret == 0, text[-3000:]
    assert without.ret == 0, without.stdout.str()[-3000:]
    assert "missing environment config" not in text
    with_labgrid.stdout.fnmatch_lines(["plugins: *labgrid-*"])  # its plugin was loaded, and -p no:labgrid left it out
    assert "labgrid-" not in without.stdout.str()
    assert with_labgrid.parseoutcomes() | {"seconds": 0} == without.parseoutcomes() | {"seconds": 0}
    with_labgrid.assert_outcomes(passed=2, skipped=3, deselected=len(list(SUITES.glob("test_*.py"))) - 5)
    assert records == records_without and records["feasibility"][0] == records["conversion"][0] == "passed"
    assert summary_section(with_labgrid.stdout.str()) == summary_section(without.stdout.str())
    assert allure == allure_without and allure["test_feasibility[sm8650-emu-digits_cnn]"][0] == "passed"


CLASHING_PLUGIN = '''
"""Another plugin with fixtures of the harness's names, registered before the harness's (-p)."""
import pytest


@pytest.fixture(scope="session")
def target():
    pytest.skip("clashing_plugin's target")


@pytest.fixture(scope="session")
def harness_session():
    pytest.skip("clashing_plugin's harness_session")


@pytest.fixture(scope="session")
def onboarding():
    pytest.skip("clashing_plugin's onboarding")


@pytest.fixture(scope="session")
def feasibility():
    pytest.skip("clashing_plugin's feasibility")


@pytest.fixture
def check():
    pytest.skip("clashing_plugin's check")
'''


def test_another_plugin_s_fixtures_of_the_harness_s_names_do_not_replace_them(pytester, session_cache_dir):
    pytester.makepyfile(clashing_plugin=CLASHING_PLUGIN)
    result = pytester.runpytest_subprocess(
        "--pyargs", "harness.suites", "-k", "feasibility and not llm", "--device", "sm8650", "-p", "clashing_plugin",
        f"--cache-dir={session_cache_dir}", "-p", "no:cacheprovider", "-rA")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=1)
    assert "clashing_plugin's" not in result.stdout.str()


FOREIGN_CONFTESTS = {
    "autouse": ('''
        import pytest


        @pytest.fixture(autouse=True)
        def _not_today(request):
            if request.node.get_closest_marker("step") is not None:
                pytest.skip("the conftest skips every step test")
        ''', "the conftest skips every step test", ["feasibility"]),
    "target": ('''
        import pytest


        @pytest.fixture(scope="session")
        def target(request):
            pytest.skip("the conftest's target has no device")
        ''', "the conftest's target has no device", ["feasibility", "regression"]),
}


@pytest.mark.parametrize("conftest", list(FOREIGN_CONFTESTS))
def test_a_step_test_skipped_by_a_conftest_makes_the_run_not_green(pytester, session_cache_dir, conftest):
    """A conftest's autouse fixture that skips step tests, or its own `target` that skips: each step test it
    skipped is named with the reason and where it was raised, and the exit status is not 0. The harness's own
    skips in the same run (regression without --baseline when the step fixture decides first, the LLM suites for
    a kind-onnx model) are not counted."""
    source, reason, skipped = FOREIGN_CONFTESTS[conftest]
    pytester.makeconftest(textwrap.dedent(source))
    # --cache-dir=DIR as one argument: pytest takes an existing path among the arguments for where the rootdir and
    # the conftest files are, and would not load the conftest of the pytester directory
    result = pytester.runpytest_subprocess(
        "--pyargs", "harness.suites", "-k", "feasibility or regression", "--device", "sm8650",
        f"--cache-dir={session_cache_dir}", "-p", "no:cacheprovider", "-rA")
    out = result.stdout.str()
    assert result.ret == EXIT_SKIPPED_ELSEWHERE, out[-3000:]
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines([
        f"NOT RUN: {len(skipped)} requested step test(s) were skipped by another plugin's or a conftest's fixture or "
        "hook, not by the harness; this is not a pass*",
        *(f"  *test_{step}[[]sm8650-emu-digits_cnn[]] was skipped by something other than the harness: {reason} "
          "(raised at conftest.py:*)" for step in skipped),
        f"exit status {EXIT_SKIPPED_ELSEWHERE}: no test failed, but something other than the harness skipped "
        "requested steps"])
    named = [line for line in out.splitlines() if " was skipped by something other than the harness: " in line]
    assert len(named) == len(skipped) and not any("llm" in line for line in named)


OWN_SKIPS = '''
import pytest


@pytest.mark.step("feasibility")
def test_feasibility(target):
    pytest.skip("the suite decides it does not apply")


@pytest.mark.skip(reason="the suite declares it skipped")
@pytest.mark.step("conversion")
def test_conversion(target):
    pass


@pytest.mark.step("ptq")
def test_ptq(target):
    pass
'''

MARKING_PLUGIN = '''
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if item.name.startswith("test_ptq"):
            item.add_marker(pytest.mark.skip(reason="marking_plugin skips ptq"))
'''


def test_the_suite_s_own_skips_are_not_counted_and_a_plugin_s_skip_mark_is(pytester, session_cache_dir):
    """A skip the suite's module raises or declares is its verdict: exit status 0. A skip mark another plugin adds
    to a step test is not: under pytest-xdist the controller counts what the workers reported."""
    pytester.makepyfile(test_own_skips=OWN_SKIPS, marking_plugin=MARKING_PLUGIN)
    common = ("test_own_skips.py", "--device", "sm8650", f"--cache-dir={session_cache_dir}",
              "--telemetry-interval", "0", "-p", "no:cacheprovider", "-rA")
    own = pytester.runpytest_subprocess(*common)
    assert own.ret == 0, own.stdout.str()[-3000:]
    own.assert_outcomes(passed=1, skipped=2)
    own.stdout.no_fnmatch_line(NOT_RUN)

    marked = pytester.runpytest_subprocess(*common, "-p", "marking_plugin", "-n", "2")
    assert marked.ret == EXIT_SKIPPED_ELSEWHERE, marked.stdout.str()[-3000:]
    marked.assert_outcomes(skipped=3)
    marked.stdout.fnmatch_lines(["  test_own_skips.py::test_ptq[[]sm8650-emu-digits_cnn[]] was skipped by something "
                                 "other than the harness: marking_plugin skips ptq (by a skip mark another plugin or "
                                 "a conftest added)"])
    assert marked.stdout.str().count(" was skipped by something other than the harness: ") == 1


def _record(outcome: str) -> StepRecord:
    return StepRecord("emu", "sm8650", "digits_cnn", "ptq", outcome, {})


def test_exit_status_order_and_the_not_run_lines():
    """Devices out (6) before a step skipped elsewhere (8) before an inconclusive step (7); the summary's lines."""
    skip = SkippedElsewhere("suites/test_04_ptq.py::test_ptq[emu-digits_cnn]", "missing environment config "
                            "(use --lg-env)", "raised at /venv/labgrid/pytestplugin/fixtures.py:66")
    out = [{"id": "emu", "status": "quarantined", "reason": "usb reset"}]
    assert run_exit_status([_record("skipped")], out, [skip]) == EXIT_DEVICES_OUT
    assert run_exit_status([_record("inconclusive")], [], [skip]) == EXIT_SKIPPED_ELSEWHERE
    assert run_exit_status([_record("inconclusive")], [], []) == EXIT_INCONCLUSIVE
    assert run_exit_status([_record("passed"), _record("skipped")], [], []) == 0
    assert skipped_elsewhere_lines([]) == []
    lines = skipped_elsewhere_lines([skip])
    assert lines[0].startswith("NOT RUN: 1 requested step test(s) were skipped by another plugin's or a conftest's")
    assert lines[1] == ("  suites/test_04_ptq.py::test_ptq[emu-digits_cnn] was skipped by something other than the "
                        "harness: missing environment config (use --lg-env) (raised at "
                        "/venv/labgrid/pytestplugin/fixtures.py:66)")
