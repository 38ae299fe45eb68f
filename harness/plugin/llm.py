"""pytest fixtures of the LLM path (models of kind llm): its suites carry the `llm` marker. Suites of the other
kind are skipped for a language model, and the LLM suites for a single-graph model, each saying why."""

from __future__ import annotations

import pytest

from harness.plugin import Outcome, _outcome

LLM_MARKER = "llm"
LLM_STEPS = ("llm_conversion", "llm_feasibility", "llm_accuracy", "llm_context_binary", "genie_runtime", "genie_stress")


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


@pytest.fixture(scope="session")
def llm_conversion(onboarding) -> Outcome:
    """LLM Step 2 outcome: both graphs converted."""
    return _outcome("llm_conversion", onboarding.llm_conversion)


@pytest.fixture(scope="session")
def llm_feasibility(onboarding, llm_conversion) -> Outcome:
    """LLM Step 1 outcome (needs conversion: placement is checked on what ships)."""
    llm_conversion.require()
    return _outcome("llm_feasibility", onboarding.llm_feasibility)


@pytest.fixture(scope="session")
def llm_accuracy(onboarding, llm_feasibility) -> Outcome:
    """LLM Step 3 outcome (needs feasibility)."""
    llm_feasibility.require()
    return _outcome("llm_accuracy", onboarding.llm_accuracy)


@pytest.fixture(scope="session")
def llm_context_binary(onboarding, llm_feasibility) -> Outcome:
    """LLM Step 4 outcome (needs feasibility)."""
    llm_feasibility.require()
    return _outcome("llm_context_binary", onboarding.llm_context_binary)


@pytest.fixture(scope="session")
def genie_runtime(onboarding, llm_context_binary, llm_accuracy) -> Outcome:
    """LLM Step 5 outcome (needs the context binaries, and the float model's tokens from accuracy)."""
    llm_context_binary.require()
    llm_accuracy.require_value()
    return _outcome("genie_runtime", onboarding.genie_runtime)


@pytest.fixture(scope="session")
def genie_stress(onboarding, genie_runtime) -> Outcome:
    """LLM Step 7 outcome (needs Genie to run at all)."""
    genie_runtime.require_value()
    return _outcome("genie_stress", onboarding.genie_stress)
