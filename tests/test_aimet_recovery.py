"""The AIMET recovery step: why it is skipped (no AIMET needed), and, marked `aimet`, that it recovers the KPI
on the zoo's digits_imbalanced model on the HTP simulator where PTQ, the sweep and mixed precision miss it.

`pytest tests/test_aimet_recovery.py -m aimet` after `bash scripts/install-aimet.sh`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from harness.models import resolve_model
from harness.options import AccuracyOptions
from harness.pipeline import Onboarding, Target
from harness.steps import aimet_recovery as ar
from harness.steps.ptq import QuantRecipe
from harness.steps.report import StepReport

SUITES = Path(__file__).resolve().parent.parent / "suites"


# ------------------------------------------------------------------------------ without AIMET

def test_skip_reasons_say_why():
    never = lambda: pytest.fail("not asked")  # noqa: E731
    assert "--aimet off" in ar.skip_reason("off", never, missing=never)
    missing = lambda: "the aimet extra is not installed"  # noqa: E731
    assert ar.skip_reason("auto", never, missing=missing) == "the aimet extra is not installed"
    assert "asked for with --aimet on" in ar.skip_reason("on", never, missing=missing)
    installed = lambda: None  # noqa: E731
    reason = ar.skip_reason("auto", lambda: "ptq", missing=installed)
    assert "earlier recovery met the KPI (ptq)" in reason and "--aimet on" in reason
    assert ar.skip_reason("auto", lambda: None, missing=installed) is None  # PTQ and mixed precision missed
    assert ar.skip_reason("on", never, missing=installed) is None  # asked for: runs even when not needed


def test_a_missing_extra_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "aimet_onnx", None)  # as if not installed
    assert "aimet extra is not installed" in ar.aimet_missing()


def test_mode_defaults_to_auto_and_rides_on_the_accuracy_options():
    assert AccuracyOptions().aimet == "auto"
    options = AccuracyOptions(sweep="off", aimet="off")
    assert options.aimet == "off" and options.sweep == "off"


def test_the_recipe_mixed_precision_reached_and_its_sim_config():
    start = QuantRecipe(per_channel=True, weight_type="QInt8", weight_symmetric=True)
    mixed = StepReport("mixed_precision", kpis={"promoted_tensors": ["conv1_out", "relu1_out"]})
    recipe = ar.reached_recipe(start, mixed)
    assert recipe.tensor_overrides == {"conv1_out": [{"quant_type": "QUInt16"}], "relu1_out": [{"quant_type": "QUInt16"}]}
    assert recipe.name == "MinMax-a8-w8s-pc+mp2" and ar.reached_recipe(start, None) == start
    config = ar.sim_config(recipe)["defaults"]
    assert config["per_channel_quantization"] == "True" and config["params"]["is_symmetric"] == "True"
    plain = ar.sim_config(QuantRecipe())["defaults"]  # onnxruntime's default: uint8 asymmetric per-tensor weights
    assert plain["per_channel_quantization"] == "False" and plain["params"]["is_symmetric"] == "False"
    assert ar.amp_precisions(QuantRecipe()) == [(8, 8), (8, 16)]
    w4 = QuantRecipe(tensor_overrides={"fc_w": [{"quant_type": "QInt4", "axis": 0}]})
    assert ar.amp_precisions(w4) == [(4, 8), (8, 8), (8, 16)]


def test_bit_widths_count_both_layouts():
    doc = {"activation_encodings": {"a": [{"bitwidth": 8}], "b": [{"bitwidth": 16}], "c": {"bitwidth": 8}},
           "param_encodings": {"w": [{"bitwidth": 4}, {"bitwidth": 4}]}}
    bits = ar.bit_widths(doc)
    assert bits == {"activations": {"8": 2, "16": 1}, "weights": {"4": 1}, "label": "a8x2 a16x1 w4x1"}


def test_digits_imbalanced_is_the_same_function(tmp_path):
    from harness.zoo import digits_cnn, digits_imbalanced

    weights = digits_cnn.CnnWeights(**{n: np.random.default_rng(i).normal(size=s).astype(np.float32)
                                       for i, (n, s) in enumerate([("conv1_w", (16, 1, 3, 3)), ("conv1_b", (16,)),
                                                                   ("conv2_w", (32, 16, 3, 3)), ("conv2_b", (32,)),
                                                                   ("conv3_w", (32, 32, 3, 3)), ("conv3_b", (32,)),
                                                                   ("fc_w", (10, 512)), ("fc_b", (10,))])})
    model = digits_cnn.export_onnx(weights, tmp_path / "m.onnx")
    skewed = digits_imbalanced.imbalance(model)
    x = {"image": np.random.default_rng(9).random((1, 1, 8, 8), dtype=np.float32)}
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]  # noqa: E731
    np.testing.assert_allclose(run(skewed), run(model), rtol=1e-4, atol=1e-4)
    w2 = onnx.numpy_helper.to_array(next(i for i in skewed.graph.initializer if i.name == "conv2_w"))
    ratio = np.abs(w2[:, :digits_imbalanced.CHANNELS]).mean() / np.abs(w2[:, digits_imbalanced.CHANNELS:]).mean()
    assert ratio > 20  # the imbalance 8-bit weight grids cannot hold


@pytest.mark.parametrize(("mode", "expect"), [("off", "--aimet off: the AIMET recovery step is not run"),
                                              ("auto", "the earlier recovery met the KPI (ptq)")])
def test_the_suite_is_skipped_saying_why(pytester, session_cache_dir, mode, expect):
    result = pytester.runpytest_subprocess(str(SUITES / "test_07b_aimet.py"), "--device", "sm8650", "--aimet", mode,
                                           "--cache-dir", str(session_cache_dir), "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"*{expect}*"])


# ------------------------------------------------------------------------------ with AIMET

@pytest.fixture(scope="module")
def imbalanced(devices, sm8650_runner, cache):
    pytest.importorskip("aimet_onnx")
    dev = devices.select(["sm8650-emu"])[0]
    return Onboarding(Target(dev, devices.soc(dev.soc), resolve_model("digits_imbalanced", {}, None)), sm8650_runner,
                      cache, accuracy=AccuracyOptions(aimet="auto"))


@pytest.mark.aimet
def test_aimet_recovers_the_kpi_where_ptq_the_sweep_and_mixed_precision_miss(imbalanced):
    ob = imbalanced
    assert not ob.ptq().passed and not ob.sweep().kpis["best_meets_kpi"]
    mixed = ob.mixed_precision().kpis  # no quantized configuration met it (FP16 on the HTP, the last resort, may)
    assert not mixed["met_threshold"] or mixed["precision"] == "fp16"
    assert ob.aimet_skip_reason() is None  # auto: the earlier recovery missed
    report = ob.aimet()
    k = report.kpis
    assert report.passed and k["met_threshold"] and k["runtime"] == "htp" and k["latency_source"] == "simulator"
    assert k["met_by"] == "cle" and k["cosine_similarity"] >= 0.98 and k["sqnr_db"] >= 15
    assert k["start_sqnr_db"] < 15  # AIMET's sim of mixed precision's recipe misses too, on the HTP
    techniques = k["techniques"]
    assert list(techniques) == list(ar.TECHNIQUES)
    for name, t in techniques.items():  # each technique's numbers, measured on the HTP
        assert t["error"] is None and t["bits"] and t["aimet_s"] >= 0, name
        assert {"task_metric", "cosine_similarity", "sqnr_db", "sim_sqnr_db"} <= set(t), name
    assert not techniques["bn_fold"]["applied"]  # the digits CNN has no BatchNormalization
    assert techniques["cle"]["sqnr_db"] > techniques["recipe"]["sqnr_db"] + 15
    assert techniques["amp"]["meets_kpi"] and k["final_technique"] == "amp"
    assert k["final_bit_widths"]["weights"] == {"8": 4}
    stages = [r["stage"] for r in report.tables["techniques"]]
    assert stages == ["ptq", "sweep", "mixed_precision", *(f"aimet {t}" for t in ar.TECHNIQUES)]
    assert report.artifacts["per_layer_sensitivity"].read_text().lstrip().lower().startswith("<!doctype html") or \
        "<html" in report.artifacts["per_layer_sensitivity"].read_text().lower()
    assert json.loads(report.artifacts["encodings"].read_text())["activation_encodings"]
    assert ob.deployable_model() == report.artifacts["model"]  # AIMET's model ships


@pytest.mark.aimet
def test_the_suite_recovers_the_kpi_through_aimet(pytester, session_cache_dir):
    pytest.importorskip("aimet_onnx")
    kpi = pytester.path / "kpi.json"
    result = pytester.runpytest_subprocess(str(SUITES / "test_07b_aimet.py"), "--device", "sm8650", "--model",
                                           "digits_imbalanced", "--aimet", "on", "--cache-dir", str(session_cache_dir),
                                           "--kpi-json", str(kpi), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    (record,) = json.loads(kpi.read_text())["records"]
    assert record["step"] == "aimet" and record["kpis"]["met_threshold"]
    assert set(record["kpis"]["techniques"]) == set(ar.TECHNIQUES)
