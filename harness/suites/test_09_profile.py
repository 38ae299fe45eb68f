"""Step 5, profiling: latency statistics, the per-op profile and peak memory on the device's runtime."""

import pytest


@pytest.mark.step("profile")
def test_profile(profile, check):
    report = check(profile)
    assert report.kpis["latency_source"] in ("simulator", "device")
    assert report.kpis["top_ops"] and report.artifacts["latency_histogram"].is_file()
