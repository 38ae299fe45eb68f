"""Step 5, profiling: latency statistics (in independent blocks), the per-op profile and peak memory on the device's
runtime."""

import pytest

from harness.reporting import charts


@pytest.mark.step("profile")
def test_profile(profile, check):
    report = check(profile)
    assert report.kpis["latency_source"] in ("simulator", "device")
    assert report.kpis["top_ops"] and charts.ready(report.artifacts["latency_histogram"])
    # latency in independent blocks (one median each) with their spread, and the artifact measured
    assert report.kpis["latency_blocks_ms"] and report.kpis["latency_noise_pct"] >= 0
    assert len(report.kpis["artifact_sha256"]) == 64
