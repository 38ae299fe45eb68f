"""Step 3, stage 2: post-training quantization keeps the task metric on the device's HTP runtime."""

import pytest


@pytest.mark.step("ptq")
def test_ptq(ptq, check):
    report = check(ptq)
    assert report.kpis["runtime"] == "htp"
