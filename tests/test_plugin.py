"""The pytest plugin end to end: the real suites run through pytester on the emulated device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_builders import conv_classifier, shared_dim_param, with_unsupported_op

SUITES = Path(__file__).resolve().parent.parent / "suites"
SPINE_STEPS = ("feasibility", "conversion", "float_baseline", "ptq")
SPINE = ("-k", f"({' or '.join(SPINE_STEPS)}) and not llm")  # the spine's steps only, to keep these runs short
ALL_STEPS = len(list(SUITES.glob("test_*.py")))


@pytest.fixture
def run_suites(pytester: pytest.Pytester, session_cache_dir: Path):
    """Run the repository's suites in a subprocess with a shared cache; return (result, kpi records)."""
    def _run(*args: str):
        kpi = pytester.path / "kpi.json"
        result = pytester.runpytest_subprocess(str(SUITES), "--cache-dir", str(session_cache_dir),
                                               "--kpi-json", str(kpi), "-p", "no:cacheprovider", "-rA", *args)
        records = json.loads(kpi.read_text())["records"] if kpi.exists() else []
        return result, records
    return _run


def by_step(records):
    return {r["step"]: r for r in records}


def decided_clf(directory: Path) -> Path:
    """conv_classifier's model as a spec whose task-metric-drop limit its random-data evaluation decides: at the
    default 0.02 its 200-sample drop sits on the limit, an inconclusive PTQ (an outcome of its own, see
    test_inconclusive_and_marginal_are_outcomes_of_their_own)."""
    model = conv_classifier(directory / "clf.onnx")
    spec = directory / "clf.yaml"
    spec.write_text(f"name: clf\npath: {model}\nthresholds: {{max_task_metric_drop: 0.2}}\n")
    return spec


SHORT_VALIDATION = ["--soak-duration", "12", "--cooldown-max-s", "20", "--energy-inferences", "20000"]


def test_default_run_onboards_the_zoo_model_and_writes_kpis(run_suites, pytester):
    alluredir = pytester.path / "allure"
    result, records = run_suites("--device", "sm8650", "--alluredir", str(alluredir), *SHORT_VALIDATION)
    # skipped: regression (no --baseline), aimet (PTQ met the KPI), the LLM path's suites (not a kind-llm model)
    llm_steps = len(list(SUITES.glob("test_*_llm_*.py")) + list(SUITES.glob("test_*_genie_*.py")))
    result.assert_outcomes(passed=ALL_STEPS - 2 - llm_steps, skipped=2 + llm_steps)
    steps = by_step(records)
    assert list(steps)[:4] == list(SPINE_STEPS) and len(steps) == ALL_STEPS
    skipped = {"regression", "aimet"} | {s for s in steps if s.startswith(("llm_", "genie_"))}
    assert len(skipped) == 2 + llm_steps
    assert all((r["device"], r["soc"], r["model"], r["outcome"]) == ("sm8650-emu", "sm8650", "digits_cnn", "passed")
               for r in records if r["step"] not in skipped)
    assert steps["regression"]["outcome"] == "skipped" and "--baseline" in steps["regression"]["message"]
    assert steps["aimet"]["outcome"] == "skipped" and "met the KPI" in steps["aimet"]["message"]
    assert all(steps[s]["outcome"] == "skipped" and "kind onnx" in steps[s]["message"] for s in skipped - {"regression", "aimet"})
    feas, ptq = steps["feasibility"]["kpis"], steps["ptq"]["kpis"]
    assert feas["nodes_total"] == feas["nodes_on_htp_float"] == 8 and feas["unsupported_ops"] == []
    # the shipped 8-bit form: the quantizer folds activations into encodings, so those nodes are 'eliminated'
    assert feas["form_checked"] == "quantized" and feas["htp_fraction"] == feas["htp_fraction_quantized"] == 1.0
    assert feas["nodes_on_htp"] + feas["nodes_eliminated"] == 8
    assert ptq["runtime"] == "htp" and ptq["task_metric_name"] == "top1_accuracy"
    assert ptq["float_task_metric"] >= 0.95 and ptq["task_metric"] >= ptq["float_task_metric"] - 0.02
    assert ptq["cosine_similarity"] > 0.98 and ptq["sqnr_db"] > 15
    attached = {(a["name"], a["type"]) for p in alluredir.glob("*-result.json")
                for step in json.loads(p.read_text()).get("steps", []) for a in step.get("attachments", [])}
    assert ("mixed_precision encodings", "application/json") in attached  # the exported QAIRT encodings
    assert ("profile latency_histogram", "image/png") in attached
    assert ("error_isolation KPIs", "application/json") in attached
    # Step 7 on the emulator: the whole labelled evaluation set, a soak with emulated thermals, energy, concurrency
    accuracy, soak = steps["validation_accuracy"]["kpis"], steps["sustained"]["kpis"]
    assert accuracy["samples"] == 360 and accuracy["task_metric_name"] == "top1_accuracy"
    assert accuracy["task_metric_drop"] <= 0.02 and accuracy["deployed_model"] == "ptq"
    assert soak["telemetry_source"] == "emulated" and soak["latency_source"] == "emulated" and soak["windows"] >= 2
    assert soak["max_temp_zone"].startswith("nsph") and soak["thermal_status_max"] is not None
    assert 0 < soak["stability_pct"] <= 100 and soak["cooldown"]["reason"] in ("reached", "settled", "max_wait")
    energy, conc = steps["energy"]["kpis"], steps["concurrency"]["kpis"]
    assert energy["power_source"] == "emulated" and energy["inferences"] == 20000 and energy["energy_per_inference_mj"] > 0
    assert conc["sessions"] == 2 and conc["errors"] == 0 and conc["latency_degradation"] > 0
    assert ("sustained soak_chart", "image/png") in attached and ("sustained samples_csv", "text/csv") in attached
    assert ("energy power_chart", "image/png") in attached and ("concurrency latency_chart", "image/png") in attached

    again, records = run_suites("--device", "sm8650", *SPINE)
    again.assert_outcomes(passed=4, deselected=ALL_STEPS - 4)
    assert by_step(records)["conversion"]["kpis"]["cache_hit"] is True


def test_user_model_with_input_shape_on_two_socs(run_suites, pytester):
    model = shared_dim_param(pytester.path / "dyn.onnx")
    result, records = run_suites("--device", "sm8550", "--device", "sm8650-emu", "--model", str(model),
                                 "--input-shape", "x=1,3,8,8", "--input-shape", "x2=1,3,8,8", *SPINE)
    result.assert_outcomes(passed=8, deselected=2 * (ALL_STEPS - 4))
    result.stdout.fnmatch_lines(["PASSED*test_ptq?sm8550-emu-dyn?", "PASSED*test_ptq?sm8650-emu-dyn?"])
    ptq = [r for r in records if r["step"] == "ptq"]
    assert {r["soc"] for r in ptq} == {"sm8550", "sm8650"}
    assert all(r["kpis"]["task_metric_name"] == "cosine_similarity" for r in ptq)
    result.stdout.fnmatch_lines(["*HarnessWarning: *random data*"])


def test_unsupported_op_fails_feasibility_and_skips_ptq(run_suites, pytester):
    model = with_unsupported_op(pytester.path / "det.onnx")
    result, records = run_suites("--model", str(model), *SPINE)
    result.assert_outcomes(failed=1, passed=2, skipped=1, deselected=ALL_STEPS - 4)
    result.stdout.fnmatch_lines(["*1 node(s) cannot run on the Snapdragon 8 Gen 3 HTP (v75): det1 (Det)*",
                                 "SKIPPED*prerequisite step 'feasibility' did not pass*det1 (Det)*"])
    steps = by_step(records)
    assert steps["feasibility"]["outcome"] == "failed"
    assert steps["feasibility"]["kpis"]["unsupported_ops"] == ["Det"]
    assert steps["ptq"]["outcome"] == "skipped" and "feasibility" in steps["ptq"]["message"]


def test_unfixed_dynamic_dim_fails_conversion_and_skips_dependents(run_suites, pytester):
    model = shared_dim_param(pytester.path / "dyn.onnx")
    cache = pytester.path / "cache"  # its own (the shared one may hold another xdist worker's build in progress)
    result, records = run_suites("--model", str(model), *SPINE, "--cache-dir", str(cache))
    result.assert_outcomes(failed=2, skipped=2, deselected=ALL_STEPS - 4)
    result.stdout.fnmatch_lines(["*input 'x' has dynamic dim(s) 0 ('?'), 2 ('?'), 3 ('?')*--input-shape x=N,3,N,N*",
                                 "SKIPPED*prerequisite step 'conversion' failed*"])
    assert "Traceback" not in result.stdout.str()
    assert not list(cache.rglob(".tmp-*")), "a failed step left a half-written artifact"


@pytest.mark.parametrize("args, message", [
    (["--device", "sm9999"], "*unknown device 'sm9999'*known device ids: *sm8650-emu*known SoCs: *sm8650*"),
    (["--model", "/nonexistent/model.onnx"], "*model '/nonexistent/model.onnx': no such file*"),
    (["--input-shape", "input=1,x"], "*--input-shape 'input=1,x': expected NAME=D0,D1,...*"),
    (["--precision-budget-s", "0"], "*--precision-budget-s: 0 s leaves the precision search no time*above 0*"),
    (["--precision-budget-s", "-5"], "*--precision-budget-s: -5 s leaves the precision search no time*"),
], ids=["unknown-device", "missing-model", "bad-shape", "zero-budget", "negative-budget"])
def test_usage_errors_exit_4_with_a_clear_message(run_suites, args, message):
    result, _ = run_suites(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str()


def test_not_onnx_and_malformed_devices_file(run_suites, pytester):
    junk = pytester.path / "junk.onnx"
    junk.write_text("not a model")
    result, _ = run_suites("--model", str(junk))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*junk.onnx is not an ONNX model*"])
    devices = pytester.path / "devices.yaml"
    devices.write_text("socs: {}\ndevices:\n  - {id: x, soc: sm8650, transport: emulator, colour: red}\n")
    result, _ = run_suites("--devices-file", str(devices))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{devices}: invalid devices file*", "*devices.0.emulator.colour: unknown key*"])


def test_allure_results_carry_parameters_steps_and_attachments(run_suites, pytester):
    model = decided_clf(pytester.path)
    alluredir = pytester.path / "allure"
    result, _ = run_suites("--model", str(model), "--alluredir", str(alluredir), *SPINE)
    result.assert_outcomes(passed=4, deselected=ALL_STEPS - 4)
    results = [json.loads(p.read_text()) for p in alluredir.glob("*-result.json")]
    ptq = next(r for r in results if r["name"].startswith("test_ptq"))
    params = {p["name"]: p["value"] for p in ptq["parameters"]}
    assert params["device"] == "'sm8650-emu'" or params["device"] == "sm8650-emu"
    assert "sm8650" in params["soc"] and "clf" in params["model"]
    step = ptq["steps"][0]
    assert step["name"] == "onboarding step: ptq"
    assert any(a["name"] == "ptq KPIs" for a in step["attachments"])
    assert any(s["name"].startswith("PASS: cosine_similarity") for s in step["steps"])
    feas = next(r for r in results if r["name"].startswith("test_feasibility"))
    table = next(a for a in feas["steps"][0]["attachments"] if a["name"] == "feasibility op_placement")
    assert (alluredir / table["source"]).read_text().startswith("node,op_type,placement")


def test_xdist_keeps_each_target_on_one_worker(run_suites, pytester):
    model = decided_clf(pytester.path)
    result, records = run_suites("--model", str(model), "--model", "digits_cnn", "-n", "2", "--dist", "loadgroup",
                                 "-v", *SPINE)
    result.assert_outcomes(passed=8)
    import re  # one device: all its tests (both models) on one worker, as loadgroup's '@<device>' group says
    workers = set(re.findall(r"\[(gw\d+)\].*PASSED.*@sm8650-emu", result.stdout.str()))
    assert len(workers) == 1, result.stdout.str()[-3000:]
    assert sorted((r["model"], r["step"]) for r in records) == sorted(
        (m, s) for m in ("clf", "digits_cnn") for s in SPINE_STEPS)


def test_htp_without_fp16_checks_placement_on_a_quantized_form(run_suites, pytester):
    """HTP v68 (QCS6490) has no FP16: the float graph is placed as its 8-bit QDQ form."""
    model = decided_clf(pytester.path)
    result, records = run_suites("--device", "qcs6490", "--model", str(model), "-k", "(feasibility or ptq) and not llm")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*HTP (v68) has no FP16: op placement was checked on an 8-bit QDQ form*"])
    feas = by_step(records)["feasibility"]["kpis"]
    # the quantizer folds Relu into the Conv's output encoding, so that node is 'eliminated'
    assert (feas["nodes_total"], feas["nodes_on_htp"], feas["nodes_eliminated"]) == (4, 3, 1)
    assert feas["htp_fraction"] == 1.0 and feas["unsupported_ops"] == []


# --- several models on one command line; the SoC catalog that ships with the package -------------------

PROBE = '''
def test_probe(harness_session):
    for t in harness_session.targets:
        print("TARGET", t.id, t.soc.id, t.soc.vtcm_mb, sorted(t.model.input_shapes.items()),
              sorted(t.model.freeze_inputs.items()))
'''


@pytest.fixture
def probe(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Run the real plugin in a directory without devices.yaml; return (result, TARGET lines)."""
    monkeypatch.delenv("HARNESS_DEVICES_FILE", raising=False)
    pytester.makepyfile(test_probe=PROBE)

    def _run(*args: str):
        result = pytester.runpytest_subprocess("-p", "harness.plugin", "-p", "no:cacheprovider", "-s", "-q",
                                               "test_probe.py", *args)
        return result, [line.split(" ", 1)[1] for line in result.stdout.lines if line.startswith("TARGET ")]
    return _run


def test_each_model_gets_the_shapes_of_its_own_inputs(probe):
    from real_models_helpers import real_model_path

    pnet, rnet, onet = (real_model_path(f"mtcnn_{n}") for n in ("pnet", "rnet", "onet"))
    result, targets = probe("--model", str(pnet), "--model", str(rnet), "--model", str(onet),
                            "--input-shape", "input_1=1,12,12,3", "--input-shape", f"{rnet.stem}:input_2=2,24,24,3",
                            "--input-shape", "input_2=1,24,24,3", "--input-shape", f"{onet}:input_3=1,48,48,3")
    result.assert_outcomes(passed=1)
    assert targets == [f"sm8650-emu-{pnet.stem} sm8650 8.0 [('input_1', (1, 12, 12, 3))] []",
                       f"sm8650-emu-{rnet.stem} sm8650 8.0 [('input_2', (2, 24, 24, 3))] []",  # MODEL:NAME wins
                       f"sm8650-emu-{onet.stem} sm8650 8.0 [('input_3', (1, 48, 48, 3))] []"]


def test_frozen_inputs_and_shapes_route_by_input_name(probe):
    """silero_vad and melspectrogram both have an input named 'input'; only silero_vad has 'sr'."""
    from real_models_helpers import real_model_path

    vad, mel = real_model_path("silero_vad"), real_model_path("melspectrogram")
    result, targets = probe("--model", str(vad), "--model", str(mel), "--input-shape", "input=1,1600",
                            "--input-shape", f"{vad.stem}:input=1,512", "--freeze-input", "sr=16000",
                            "--freeze-input", f"{mel.stem}:input=[[0.5, 0.25]]")
    result.assert_outcomes(passed=1)
    assert targets == [f"sm8650-emu-{vad.stem} sm8650 8.0 [('input', (1, 512))] [('sr', 16000)]",
                       f"sm8650-emu-{mel.stem} sm8650 8.0 [('input', (1, 1600))] [('input', [[0.5, 0.25]])]"]


@pytest.mark.real_models
def test_two_real_exports_convert_with_their_own_shapes(run_suites):
    from real_models_helpers import real_model_path

    pnet, rnet = real_model_path("mtcnn_pnet"), real_model_path("mtcnn_rnet")
    result, records = run_suites("--model", str(pnet), "--model", str(rnet), "--input-shape", "input_1=1,12,12,3",
                                 "--input-shape", "input_2=1,24,24,3", "-k", "conversion and not llm")
    result.assert_outcomes(passed=2, deselected=2 * (ALL_STEPS - 1))
    assert {r["model"]: r["kpis"]["input_shapes"] for r in records} == {
        pnet.stem: {"input_1": [1, 12, 12, 3]}, rnet.stem: {"input_2": [1, 24, 24, 3]}}


@pytest.mark.parametrize("args, message", [
    (["--input-shape", "input_9=1,24,24,3"],
     "*--input-shape 'input_9=...': no model has an input 'input_9'. Inputs per model: {pnet}: input_1; "
     "{rnet}: input_2.*MODEL:NAME=...*"),
    (["--input-shape", "onet:input_3=1,48,48,3"],
     "*no model has an input 'onet:input_3', and 'onet' names no model (models: {pnet}, {rnet})*"),
    (["--input-shape", "{pnet}:input_2=1,24,24,3"], "*model '{pnet}' has no input 'input_2' (its inputs: input_1)*"),
    (["--freeze-input", "sr=16000"], "*--freeze-input 'sr=...': no model has an input 'sr'*"),
    (["--freeze-input", "input_1=zero"], "*--freeze-input 'input_1=zero': expected NAME=VALUE*"),
], ids=["unknown-name", "unknown-model", "model-lacks-input", "unknown-frozen-input", "bad-freeze-value"])
def test_input_selectors_that_match_nothing_are_usage_errors(run_suites, args, message):
    from real_models_helpers import real_model_path

    pnet, rnet = real_model_path("mtcnn_pnet"), real_model_path("mtcnn_rnet")
    names = {"pnet": pnet.stem, "rnet": rnet.stem}
    result, _ = run_suites("--model", str(pnet), "--model", str(rnet), "--co", *(a.format(**names) for a in args))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message.format(**names)])
    assert "Traceback" not in result.stderr.str()


def test_builtin_emulators_without_a_devices_file(probe):
    result, targets = probe("--device", "sm8650", "--device", "qcs6490-emu")
    result.assert_outcomes(passed=1)
    assert targets == ["sm8650-emu-digits_cnn sm8650 8.0 [] []", "qcs6490-emu-digits_cnn qcs6490 2.0 [] []"]


def test_devices_file_with_only_devices_and_a_one_field_soc_override(probe, pytester):
    only_devices = pytester.path / "farm.yaml"
    only_devices.write_text("devices:\n  - {id: lab-8g3, soc: sm8650, transport: emulator}\n")
    result, targets = probe("--devices-file", str(only_devices), "--device", "sm8650")
    result.assert_outcomes(passed=1)
    assert targets == ["lab-8g3-digits_cnn sm8650 8.0 [] []"]

    override = pytester.path / "override.yaml"
    override.write_text("socs:\n  sm8650: {vtcm_mb: 4}\n"
                        "devices:\n  - {id: lab-8g3, soc: sm8650, transport: emulator}\n")
    result, targets = probe("--devices-file", str(override), "--device", "lab-8g3")
    result.assert_outcomes(passed=1)
    assert targets == ["lab-8g3-digits_cnn sm8650 4.0 [] []"]


def test_the_suites_collect_with_a_devices_file_that_lists_only_devices(run_suites, pytester):
    farm = pytester.path / "farm.yaml"
    farm.write_text("devices:\n  - {id: lab-8g3, soc: sm8650, transport: emulator}\n")
    result, _ = run_suites("--devices-file", str(farm), "--device", "sm8650", "--co", "-q")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*test_ptq?lab-8g3-digits_cnn?", f"{ALL_STEPS} tests collected*"])


def test_device_of_an_unknown_soc_is_a_usage_error(run_suites, pytester):
    farm = pytester.path / "farm.yaml"
    farm.write_text("devices:\n  - {id: next-gen, soc: sm9999, transport: emulator}\n")
    result, _ = run_suites("--devices-file", str(farm), "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{farm}: invalid devices file*",
                                 "*devices[[]0] (next-gen): unknown SoC 'sm9999'*known SoCs: qcs6490, sa8295p, "
                                 "sm8450, sm8550, sm8650, sm8750*"])


# --- marginal and inconclusive outcomes; one-line headlines ---------------------------------------------

VERDICTS = '''
import pytest
from harness.kpi import Interval, Limit
from harness.plugin import Outcome
from harness.steps.report import StepReport


@pytest.fixture(scope="session")
def ptq():
    """8 samples: a task_metric_drop of 0.125 whose interval straddles the 0.02 limit."""
    interval = Interval(0.02, 0.47, 8, "bootstrap", needed=190)
    kpis = {"task_metric_drop": 0.125, "cosine_similarity": 0.998,
            "intervals": {"task_metric_drop": interval.as_dict()}}
    return Outcome("ptq", StepReport("ptq", kpis=kpis, limits=[Limit("task_metric_drop", maximum=0.02)]))


@pytest.mark.step("ptq")
def test_ptq(target, check, ptq):
    check(ptq)


@pytest.mark.step("error_isolation")
def test_error_isolation(target, check, ptq):
    ptq.require()  # an inconclusive prerequisite does not stop its dependents
    report = StepReport("error_isolation", kpis={"min_cosine_similarity": 0.9995},
                        limits=[Limit("min_cosine_similarity", minimum=0.999)])
    check(Outcome("error_isolation", report))


@pytest.mark.step("feasibility")
def test_feasibility(target, check):
    nodes = "; ".join(f"If_{i} (If) in If_0/then_branch" for i in range(40))
    report = StepReport("feasibility", kpis={"htp_fraction": 0.5}, limits=[Limit("htp_fraction", minimum=1.0)],
                        failures=[f"40 node(s) cannot run on the HTP: {nodes}"])
    check(Outcome("feasibility", report))
'''


def test_inconclusive_and_marginal_are_outcomes_of_their_own(pytester, session_cache_dir, monkeypatch):
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    pytester.makepyfile(test_verdicts=VERDICTS)
    run = pytester.path / "run"
    result = pytester.runpytest_subprocess(
        "test_verdicts.py", "-k", "not feasibility", "-v", "-rA", "-p", "no:cacheprovider", "--device", "sm8650",
        "--cache-dir", str(session_cache_dir), "--telemetry-interval", "0", "--kpi-json", str(run / "kpi.json"),
        "--junitxml", str(run / "junit.xml"), "--alluredir", str(run / "allure-results"))
    # no test failed, but a step is inconclusive: not a pass, so not exit status 0
    assert result.ret == 7, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([
        "*test_ptq?sm8650-emu-digits_cnn? INCONCLUSIVE*",
        "*test_error_isolation?sm8650-emu-digits_cnn? PASSED (marginal)*",
        "*snapdragon harness*",
        "  ptq * inconclusive * task_metric_drop 0.125 [[]0.02, 0.47[]], n=8",
        "  error_isolation * marginal *",
        "INCONCLUSIVE: 1 step(s): *re-run with more samples",
        "  sm8650-emu x digits_cnn / ptq: INCONCLUSIVE: task_metric_drop = 0.125 [[]0.02, 0.47[]] (95% bootstrap, n=8),"
        " rule task_metric_drop <= 0.02; about 190 samples are needed to resolve it",
        "MARGINAL: 1 step(s) passed close to a limit",
        "  sm8650-emu x digits_cnn / error_isolation: PASS (marginal): min_cosine_similarity = 0.9995, rule *",
        "exit status 7: no test failed, but a step was inconclusive*",
        "*1 passed, 1 deselected, 1 inconclusive*"])
    records = {r["step"]: r for r in json.loads((run / "kpi.json").read_text())["records"]}
    assert records["ptq"]["outcome"] == "inconclusive"
    assert records["ptq"]["message"].startswith("ptq: INCONCLUSIVE: task_metric_drop = 0.125")
    assert records["ptq"]["kpis"]["intervals"]["task_metric_drop"]["samples"] == 8
    assert records["error_isolation"]["outcome"] == "passed"
    assert records["error_isolation"]["marginal"] == [
        "PASS (marginal): min_cosine_similarity = 0.9995, rule min_cosine_similarity >= 0.999"]
    case = ET.parse(run / "junit.xml").getroot().find(".//testcase[@name='test_ptq[sm8650-emu-digits_cnn]']")
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["ptq.status"] == "inconclusive"
    assert properties["ptq.task_metric_drop.interval"] == "[0.02, 0.47] (95% bootstrap, n=8)"
    assert properties["ptq.reason"].startswith("ptq: INCONCLUSIVE") and "about 190 samples" in properties["ptq.reason"]
    allure = {json.loads(p.read_text())["name"].split("[")[0]: json.loads(p.read_text())
              for p in (run / "allure-results").glob("*-result.json")}
    assert allure["test_ptq"]["status"] == "unknown"
    assert allure["test_ptq"]["statusDetails"]["message"].startswith("INCONCLUSIVE: ptq: INCONCLUSIVE")
    assert allure["test_error_isolation"]["status"] == "passed"
    assert allure["test_error_isolation"]["statusDetails"]["message"].startswith("MARGINAL: PASS (marginal)")

    # the sign-off: not GO, but RE-RUN, naming the step and what more it needs
    signoff = subprocess.run([sys.executable, "-m", "harness", "signoff", str(run), "-o", str(pytester.path / "page")],
                             capture_output=True, text=True, timeout=300)
    assert signoff.returncode == 3, signoff.stdout + signoff.stderr
    assert signoff.stdout.startswith("signoff: RE-RUN")
    assert "- inconclusive: sm8650-emu / digits_cnn / ptq: ptq: INCONCLUSIVE" in signoff.stdout
    assert "about 190 samples are needed" in signoff.stdout

    # a failure: one headline line under 200 characters, what failed, the value, the rule; details below it
    monkeypatch.setenv("COLUMNS", "300")  # the short summary's line is not cut to the terminal
    failed = pytester.runpytest_subprocess(
        "test_verdicts.py", "-k", "feasibility", "-p", "no:cacheprovider", "--device", "sm8650",
        "--cache-dir", str(session_cache_dir), "--telemetry-interval", "0", "--kpi-json", str(run / "kpi.json"))
    assert failed.ret == pytest.ExitCode.TESTS_FAILED
    failed.stdout.fnmatch_lines(["FAILED*test_feasibility*feasibility did not pass: 40 node(s) cannot run on the HTP: "
                                 "If_0 (If) in If_0/then_branch;* … (+1 more)"])
    message = json.loads((run / "kpi.json").read_text())["records"][0]["message"]
    head, *details = message.splitlines()
    assert len(head) < 200 and head.startswith("feasibility did not pass: 40 node(s) cannot run on the HTP: If_0 (If)")
    assert head.endswith("(+1 more)")
    assert "If_39 (If)" in details[0] and details[1] == "  - FAIL: htp_fraction = 0.5, rule htp_fraction >= 1"
