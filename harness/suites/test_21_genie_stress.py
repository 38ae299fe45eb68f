"""LLM path, Step 7: the Genie stress run (genie-to-qnn-stress): dialogs in sequence and at once up to the full
context, no errors, bounded memory growth, token rate over time."""

import pytest

from harness.reporting import charts

pytestmark = [pytest.mark.llm, pytest.mark.validation]


@pytest.mark.step("genie_stress")
def test_genie_stress(genie_stress, check):
    report = check(genie_stress)
    assert report.kpis["queries"] > 0 and charts.ready(report.artifacts["token_rate_chart"])
