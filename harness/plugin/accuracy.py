"""pytest options and fixtures for accuracy analysis and recovery (Step 3, stages 3-5).

Options: `--sweep off|quick|full`, `--quantization-overrides FILE` (a QAIRT/AIMET encodings
JSON) and `--aimet auto|on|off` (the AIMET recovery step: auto runs it when the aimet extra is installed
and PTQ and mixed precision missed the KPI). The overrides file is validated at start-up; its tensor names are checked against the model
when PTQ quantizes with it. They are kept in the run's HarnessSession, and every Onboarding is
created with them, so PTQ already quantizes with the given encodings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.plugin import SESSION_KEY, _outcome

SWEEP_MODES = ("off", "quick", "full")  # as harness.steps.sweep.SWEEP_MODES (not imported: heavy)
AIMET_MODES = ("auto", "on", "off")  # as harness.steps.aimet_recovery.AIMET_MODES


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("snapdragon")
    group.addoption("--sweep", default="quick", choices=SWEEP_MODES,
                    help="quantization sweep: off, quick (4 candidates, default) or full (the whole matrix)")
    group.addoption("--quantization-overrides", default=None, metavar="FILE",
                    help="an encodings file as AIMET or QAIRT writes it (formats 0.6.1, 1.0.0, 2.x) to quantize with")
    group.addoption("--aimet", default="auto", choices=AIMET_MODES,
                    help="AIMET recovery step (CLE, AdaRound, AMP): auto (default: when the aimet extra is installed "
                         "and PTQ and mixed precision missed the KPI), on (whenever installed) or off")


@pytest.hookimpl(trylast=True)  # after the core plugin has made the HarnessSession
def pytest_configure(config: pytest.Config) -> None:
    from harness.encodings import load_encodings
    from harness.steps.aimet_recovery import RecoveryOptions

    path = config.getoption("quantization_overrides", None)
    encodings, source = {}, ""
    if path:
        try:
            encodings, source = load_encodings(Path(path)).to_json(), str(Path(path).expanduser().resolve())
        except HarnessError as e:
            raise pytest.UsageError(f"--quantization-overrides: {e}") from None
    config.stash[SESSION_KEY].accuracy = RecoveryOptions(sweep=config.getoption("sweep", "quick"),
                                                         encodings=encodings, encodings_file=source,
                                                         aimet=config.getoption("aimet", "auto"))


@pytest.fixture(scope="session")
def accuracy_options(pytestconfig: pytest.Config):
    """The AccuracyOptions of this run."""
    return pytestconfig.stash[SESSION_KEY].accuracy


@pytest.fixture(scope="session")
def error_isolation(onboarding, ptq):
    """Step 3 stage 3 outcome (runs for every model; fails only when PTQ missed its KPI)."""
    ptq.require_value()
    return _outcome("error_isolation", onboarding.error_isolation)


@pytest.fixture(scope="session")
def sweep(onboarding, feasibility, conversion, accuracy_options):
    """Step 3 stage 4 outcome (skipped with --sweep off)."""
    feasibility.require()
    conversion.require()
    if accuracy_options.sweep == "off":
        pytest.skip("--sweep off: no quantization sweep; mixed precision starts from the PTQ recipe")
    return _outcome("sweep", onboarding.sweep)


@pytest.fixture(scope="session")
def mixed_precision(onboarding, error_isolation, accuracy_options, request: pytest.FixtureRequest):
    """Step 3 stage 5 outcome (needs error isolation's ranking, and the sweep unless --sweep off)."""
    error_isolation.require_value()
    if accuracy_options.sweep != "off":
        request.getfixturevalue("sweep").require_value()
    return _outcome("mixed_precision", onboarding.mixed_precision)


@pytest.fixture(scope="session")
def aimet(onboarding, ptq):
    """Step 3 stage 6 outcome: AIMET recovery after mixed precision; skipped saying why when --aimet off, when
    the aimet extra is not installed, or (auto) when PTQ or mixed precision met the KPI."""
    ptq.require_value()
    reason = onboarding.aimet_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return _outcome("aimet", onboarding.aimet)
