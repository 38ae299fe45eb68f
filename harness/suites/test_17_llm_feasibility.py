"""LLM path, Step 1: both graphs run on the HTP (quantized, CPU fallback disabled and allowed); the KV cache and
the weights fit the memory budget."""

import pytest

pytestmark = pytest.mark.llm


@pytest.mark.step("llm_feasibility")
def test_llm_feasibility(llm_feasibility, check):
    report = check(llm_feasibility)
    assert report.kpis["kv_cache_bytes"] > 0
