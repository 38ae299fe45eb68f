"""The step table (harness.steps.table): every step declared once, the suites checked against it, and a toy
step added as one entry plus its function reaching the fixtures, the terminal summary, the KPI JSON, Allure and
the sign-off page."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.plugin.llm import LLM_STEPS
from harness.steps import table
from harness.steps.table import GROUPS, PASSED, RAN, Step, names, register, steps

SUITES = Path(__file__).resolve().parent.parent / "suites"


def _suite_tests() -> list[tuple[str, str, tuple[str, ...]]]:
    """Return (module, step marker, the module's other markers) for every test of the shipped suites."""
    found = []
    for path in sorted(SUITES.glob("test_*.py")):
        module = importlib.import_module(f"harness.suites.{path.stem}")
        marks = getattr(module, "pytestmark", [])
        module_marks = tuple(sorted(m.name for m in (marks if isinstance(marks, list) else [marks])))
        for name in dir(module):
            test = getattr(module, name)
            if name.startswith("test_") and callable(test):
                step_marks = [m for m in getattr(test, "pytestmark", []) if m.name == "step"]
                assert len(step_marks) == 1, f"{path.name}::{name} has {len(step_marks)} step markers"
                found.append((path.name, step_marks[0].args[0], module_marks))
    return found


def test_every_step_has_one_suite_test_and_every_suite_test_a_step():
    tests = _suite_tests()
    marked = [step for _, step, _ in tests]
    assert sorted(marked) == sorted(names()), "a suite test's step marker without a table entry, or the reverse"
    assert len(set(marked)) == len(marked)
    # the suites' run order (file names) is the table's order: the sign-off order users see in the suites
    assert marked == list(names())
    for module, step, marks in tests:
        assert marks == tuple(sorted(table.find(step).markers)), f"{module}: markers {marks} are not the table's"


def test_the_table_is_consistent():
    all_steps = steps()
    assert len({s.name for s in all_steps}) == len(all_steps)
    for i, step in enumerate(all_steps):
        assert step.group in GROUPS and step.scope in ("session", "function") and step.doc
        earlier = names()[:i]
        for need in step.requires:  # a prerequisite runs before the step in the sign-off order
            assert need.step in earlier and need.mode in (PASSED, RAN), (step.name, need)
        assert all(rule.step == step.name for rule in step.rules)
        assert step.headline is not None and step.headline({}) is not None
    assert LLM_STEPS == names("llm") and names("validation") == ("validation_accuracy", "sustained", "energy",
                                                                  "concurrency")


def test_register_refuses_a_name_taken_and_an_unknown_group():
    with pytest.raises(ValueError, match="step 'ptq' is declared already"):
        register(Step("ptq", "again"))
    with pytest.raises(ValueError, match="group 'misc' is not one of onboarding, validation, llm"):
        register(Step("toy", "a toy", group="misc"))
    assert "toy" not in names()


# --- a toy step, added as one table entry plus its function, end to end ------------------------------------

TOY_CONFTEST = '''
from harness.kpi import Limit
from harness.steps.report import StepReport
from harness.steps.table import Step, passed, register


def toy(onboarding, options):
    """The toy step: the converted model's size, which must be positive."""
    size = onboarding.converted_model().stat().st_size
    return StepReport("toy", kpis={"model_bytes": size}, limits=[Limit("model_bytes", minimum=1)])


register(Step("toy", "The toy step's outcome (needs conversion).", requires=(passed("conversion"),), run=toy,
              headline=lambda k: f"toy model {k['model_bytes']} bytes", page_kpis=("model_bytes",)))
register(Step("toy_off", "Skipped with --sweep off.", requires=(passed("toy"),), run=toy,
              skip=lambda o: "--sweep off: no toy" if o.option.sweep == "off" else None))
'''

TOY_SUITE = '''
import pytest


@pytest.mark.step("toy")
def test_toy(toy, check):
    assert check(toy).kpis["model_bytes"] > 0


@pytest.mark.step("toy_off")
def test_toy_off(toy_off, check):
    check(toy_off)
'''


def test_a_toy_step_is_one_entry_plus_its_function(pytester: pytest.Pytester, session_cache_dir: Path):
    pytester.makeconftest(TOY_CONFTEST)
    pytester.makepyfile(test_toy=TOY_SUITE)
    run = pytester.path / "run"
    result = pytester.runpytest_subprocess(
        "-p", "harness.plugin", "-p", "no:cacheprovider", "-rA", "--device", "sm8650", "--sweep", "off",
        "--cache-dir", str(session_cache_dir), "--telemetry-interval", "0", "--kpi-json", str(run / "kpi.json"),
        "--alluredir", str(run / "allure-results"))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*snapdragon harness*", "  toy * passed * toy model * bytes",
                                 "  toy_off * skipped * --sweep off: no toy"])

    # the KPI JSON: its record, after the prerequisite it needed (computed, not a test of this run)
    records = {r["step"]: r for r in json.loads((run / "kpi.json").read_text())["records"]}
    assert records["toy"]["outcome"] == "passed" and records["toy"]["kpis"]["model_bytes"] > 0
    assert (records["toy"]["device"], records["toy"]["model"]) == ("sm8650-emu", "digits_cnn")
    assert records["toy_off"]["outcome"] == "skipped" and records["toy_off"]["message"] == "--sweep off: no toy"

    # Allure: the step with its KPIs attached
    allure = {json.loads(p.read_text())["name"].split("[")[0]: json.loads(p.read_text())
              for p in (run / "allure-results").glob("*-result.json")}
    assert allure["test_toy"]["status"] == "passed"
    step = allure["test_toy"]["steps"][0]
    assert step["name"] == "onboarding step: toy" and any(a["name"] == "toy KPIs" for a in step["attachments"])

    # the sign-off page: the toy step in the matrix and its KPI card
    page = pytester.path / "page"
    signoff = subprocess.run([sys.executable, "-m", "harness", "signoff", str(run), "-o", str(page)],
                             capture_output=True, text=True, timeout=300)
    assert signoff.returncode == 0, signoff.stdout + signoff.stderr
    assert signoff.stdout.startswith("signoff: GO")
    html = (page / "index.html").read_text()
    assert '<th class="step" title="toy">toy</th>' in html
    card = html[html.index('<span class="step-name mono">toy</span>'):]
    assert card.index("model_<wbr>bytes") < card.index('<span class="step-name mono">toy_off</span>')


def test_a_failed_prerequisite_skips_a_registered_step(pytester: pytest.Pytester, session_cache_dir: Path):
    from model_builders import with_unsupported_op

    pytester.makeconftest(TOY_CONFTEST.replace('passed("conversion")', 'passed("feasibility")'))
    pytester.makepyfile(test_toy=TOY_SUITE)
    model = with_unsupported_op(pytester.path / "det.onnx")  # its feasibility fails: a node the HTP cannot run
    result = pytester.runpytest_subprocess(
        "-p", "harness.plugin", "-p", "no:cacheprovider", "-rA", "--device", "sm8650", "--model", str(model),
        "--cache-dir", str(session_cache_dir), "--telemetry-interval", "0", "-k", "test_toy and not off")
    result.assert_outcomes(skipped=1, deselected=1)
    result.stdout.fnmatch_lines(["SKIPPED*prerequisite step 'feasibility' did not pass*"])
