"""Step 3, stage 1: the float model on the device's CPU runtime matches the host reference."""

import pytest


@pytest.mark.step("float_baseline")
def test_float_baseline(float_baseline, check):
    report = check(float_baseline)
    assert report.kpis["runtime"] == "cpu"
