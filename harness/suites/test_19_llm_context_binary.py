"""LLM path, Step 4: both graphs compiled into context binaries for the device's SoC (cached)."""

import pytest

pytestmark = pytest.mark.llm


@pytest.mark.step("llm_context_binary")
def test_llm_context_binary(llm_context_binary, check):
    report = check(llm_context_binary)
    assert report.kpis["prefill_context_bytes"] > 0 and report.kpis["decode_context_bytes"] > 0
