"""Step 7, validation: several sessions at once on the device's HTP, without errors and within the
latency degradation allowed."""

import pytest

pytestmark = pytest.mark.validation


@pytest.mark.step("concurrency")
def test_concurrency(concurrency, check):
    report = check(concurrency)
    assert report.kpis["errors"] == 0 and report.kpis["aggregate_throughput_ips"] > 0
