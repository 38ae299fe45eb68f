"""Step 1, architecture feasibility: every node runs on the HTP, shapes are static, memory fits."""

import pytest


@pytest.mark.step("feasibility")
def test_feasibility(feasibility, check):
    report = check(feasibility)
    assert report.kpis["unsupported_ops"] == []
