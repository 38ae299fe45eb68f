"""pytest options and fixtures of compilation, profiling and runtime integration (Steps 4-6)."""

from __future__ import annotations

import pytest

from harness.plugin import Outcome, _outcome
from harness.plugin.option_types import bounded, seconds

_count = bounded(int, 1, "a positive whole number of iterations")
_warmup = bounded(int, 0, "a whole number of warm-up runs (0 or more)")
_blocks = bounded(int, 1, "a positive whole number of measurement blocks")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("snapdragon")
    group.addoption("--min-iterations", type=_count, default=None, metavar="N",
                    help="profile step: time at least N iterations (default 20 on the emulator, 100 on devices; "
                         "unset, the HTP simulator times as many as fit 15 s, at least 5)")
    group.addoption("--min-duration", type=seconds, default=None, metavar="SECONDS",
                    help="profile step: and time for at least this long (default 1 s on the emulator, 10 s on devices)")
    group.addoption("--warmup-iterations", type=_warmup, default=None, metavar="N",
                    help="profile step: untimed runs first (default 3 on the emulator, 10 on devices)")
    group.addoption("--latency-blocks", type=_blocks, default=None, metavar="N",
                    help="profile step: time latency in N independent blocks, separate runner invocations that "
                         "share the iterations (default 5); the regression gate compares block medians, so a "
                         "baseline needs at least 4 to test a change")


@pytest.fixture(scope="session")
def context_binary(onboarding, ptq) -> Outcome:
    """Step 4 outcome. Needs a quantized model, so PTQ must have run without error; when PTQ
    missed its accuracy limits the deployable model is still compiled (its size and load time
    are worth knowing), with a note saying so."""
    ptq.require_value()
    outcome = _outcome("context_binary", onboarding.context_binary)
    problems = ptq.value.problems() if ptq.value is not None else []
    if outcome.value is not None and problems:
        outcome.value.notes.append(f"PTQ did not pass ({problems[0]}); compiled the deployable model the "
                                   "pipeline chose (mixed precision's when it met the KPIs, else PTQ's)")
    return outcome


@pytest.fixture(scope="session")
def profile(onboarding, context_binary, pytestconfig: pytest.Config) -> Outcome:
    """Step 5 outcome (needs the compiled context binary)."""
    from harness.steps.profile import PROFILE_BLOCKS, default_rule

    context_binary.require_value()
    opt = pytestconfig.option
    rule = default_rule(onboarding.target.device.transport, opt.min_iterations, opt.min_duration,
                        opt.warmup_iterations)
    blocks = opt.latency_blocks or PROFILE_BLOCKS
    return _outcome("profile", lambda: onboarding.profile(rule, blocks))


@pytest.fixture(scope="session")
def runtime(onboarding, context_binary) -> Outcome:
    """Step 6 outcome (needs the compiled context binary)."""
    context_binary.require_value()
    return _outcome("runtime", onboarding.runtime)
