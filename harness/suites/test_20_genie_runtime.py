"""LLM path, Steps 5-6: Genie runs the context binaries on the device; its first tokens are the float model's greedy
choice, and its own profile gives init time, time to first token and tokens per second."""

import pytest

pytestmark = pytest.mark.llm


@pytest.mark.step("genie_runtime")
def test_genie_runtime(genie_runtime, check):
    report = check(genie_runtime)
    assert report.kpis["tokens_per_s"] > 0 and report.kpis["time_to_first_token_ms_max"] > 0
    assert report.kpis["source"] in ("simulator", "device")
