"""LLM path, Step 3: held-out perplexity on the host and on the HTP within limits, greedy tokens agreeing with the
float model's over the prompts; w8a16 ships, w8a8 and w4a16 in the sweep."""

import pytest

pytestmark = pytest.mark.llm


@pytest.mark.step("llm_accuracy")
def test_llm_accuracy(llm_accuracy, check):
    report = check(llm_accuracy)
    assert report.kpis["perplexity_htp"] > 1 and report.tables["generations"]
