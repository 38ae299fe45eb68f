"""Encodings files the real aimet-onnx 2.42 exported (tests/data/aimet, made by its make.py) given to the suites
unchanged with --quantization-overrides: PTQ quantizes with them and runs on the HTP simulator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data" / "aimet"
SUITES = Path(__file__).resolve().parent.parent / "suites"
CNN_EXPORTS = sorted(name for name, info in json.loads((DATA / "manifest.json").read_text()).items()
                     if info["model"] == "cnn.onnx")


@pytest.mark.parametrize("encodings", CNN_EXPORTS)
def test_an_aimet_export_runs_through_ptq_on_the_htp_unchanged(pytester, session_cache_dir, encodings):
    kpi = pytester.path / "kpi.json"
    # a random-weight CNN on random data: its arg-max sits near ties, so on 200 samples about 7 % of them flip
    # between float and any 8-bit form (a decided drop); the test is about the encodings, held to cosine here
    spec = pytester.path / "cnn.yaml"
    spec.write_text(f"name: cnn\npath: {DATA / 'cnn.onnx'}\nthresholds: {{max_task_metric_drop: 0.3}}\n")
    result = pytester.runpytest_subprocess(
        str(SUITES), "--device", "sm8650", "--model", str(spec), "--quantization-overrides",
        str(DATA / encodings), "-k", "ptq and not llm", "--cache-dir", str(session_cache_dir), "--kpi-json", str(kpi),
        "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    ptq = next(r for r in json.loads(kpi.read_text())["records"] if r["step"] == "ptq")["kpis"]
    assert ptq["runtime"] == "htp" and ptq["cosine_similarity"] > 0.99
    assert "+overrides" in ptq["recipe"]
