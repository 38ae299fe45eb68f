"""LLM path, Step 2: both graphs of the pair converted for the HTP, still in Genie's KV convention."""

import pytest

pytestmark = pytest.mark.llm


@pytest.mark.step("llm_conversion")
def test_llm_conversion(llm_conversion, check):
    report = check(llm_conversion)
    assert report.artifacts["prefill"].is_file() and report.artifacts["decode"].is_file()
