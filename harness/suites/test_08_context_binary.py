"""Step 4, compilation: the quantized model becomes a QNN context binary for the device's SoC."""

import pytest


@pytest.mark.step("context_binary")
def test_context_binary(context_binary, target, check):
    report = check(context_binary)
    assert report.artifacts["context_model"].is_file()
    assert (report.kpis["soc"], report.kpis["soc_model"]) == (target.soc.id, target.soc.soc_model)
