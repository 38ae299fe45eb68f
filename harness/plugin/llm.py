"""pytest hooks of the LLM path (models of kind llm; its step fixtures come from harness.steps.table): its suites
carry the `llm` marker. Suites of the other kind are skipped for a language model, and the LLM suites for a
single-graph model, each saying why."""

from __future__ import annotations

import pytest

from harness.steps.table import names

LLM_MARKER = "llm"
LLM_STEPS = names("llm")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "llm: an LLM-path suite (models of kind llm: a prefill/decode pair)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "target" not in callspec.params:
            continue
        model = callspec.params["target"].model
        is_llm_suite = item.get_closest_marker(LLM_MARKER) is not None
        if model.is_llm and not is_llm_suite:
            item.add_marker(pytest.mark.skip(reason=f"model '{model.name}' is of kind llm: the LLM suites "
                                                    "(test_16-21) onboard it"))
        elif is_llm_suite and not model.is_llm:
            item.add_marker(pytest.mark.skip(reason=f"model '{model.name}' is of kind {model.kind}: LLM suites are "
                                                    "for kind llm (--model tiny_gpt)"))
