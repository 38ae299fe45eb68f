"""Step 7, validation: sustained performance and thermal stability over a soak, after a cooldown."""

import pytest

from harness.reporting import charts

pytestmark = pytest.mark.validation


@pytest.mark.step("sustained")
def test_sustained(sustained, check):
    report = check(sustained)
    assert report.kpis["windows"] >= 1 and report.kpis["telemetry_source"] in ("emulated", "measured")
    assert charts.ready(report.artifacts["soak_chart"])
