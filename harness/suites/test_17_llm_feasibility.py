"""LLM path, Step 1: both graphs run on the HTP (quantized, CPU fallback disabled and allowed); the weights, the KV
cache and the activations fit the spec's memory budget and (an estimate) the SoC's."""

import pytest

pytestmark = pytest.mark.llm


@pytest.mark.step("llm_feasibility")
def test_llm_feasibility(llm_feasibility, check):
    report = check(llm_feasibility)
    assert report.kpis["kv_cache_bytes"] > 0
