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
    result = pytester.runpytest_subprocess(
        str(SUITES), "--device", "sm8650", "--model", str(DATA / "cnn.onnx"), "--quantization-overrides",
        str(DATA / encodings), "-k", "ptq and not llm", "--cache-dir", str(session_cache_dir), "--kpi-json", str(kpi),
        "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    ptq = next(r for r in json.loads(kpi.read_text())["records"] if r["step"] == "ptq")["kpis"]
    assert ptq["runtime"] == "htp" and ptq["cosine_similarity"] > 0.99
    assert "+overrides" in ptq["recipe"]
