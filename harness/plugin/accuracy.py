"""pytest options for accuracy analysis and recovery (Step 3, stages 3-5).

Options: `--sweep off|quick|full`, `--precision-budget-s S` (the precision search's time budget), `--quantization-overrides FILE` (a QAIRT/AIMET encodings
JSON) and `--aimet auto|on|off` (the AIMET recovery step: auto runs it when the aimet extra is installed
and PTQ and mixed precision missed the KPI). The overrides file is validated at start-up; its tensor names are checked against the model
when PTQ quantizes with it. They are kept in the run's HarnessSession, and every Onboarding is
created with them, so PTQ already quantizes with the given encodings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.options import AIMET_MODES, PRECISION_BUDGET_S, SWEEP_MODES, AccuracyOptions
from harness.plugin import SESSION_KEY


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("snapdragon")
    group.addoption("--sweep", default="quick", choices=SWEEP_MODES,
                    help="quantization sweep: off, quick (4 candidates, default) or full (the whole matrix)")
    group.addoption("--quantization-overrides", default=None, metavar="FILE",
                    help="an encodings file as AIMET or QAIRT writes it (formats 0.6.1, 1.0.0, 2.x) to quantize with")
    group.addoption("--aimet", default="auto", choices=AIMET_MODES,
                    help="AIMET recovery step (CLE, AdaRound, AMP): auto (default: when the aimet extra is installed "
                         "and PTQ and mixed precision missed the KPI), on (whenever installed) or off")
    group.addoption("--precision-budget-s", type=_budget_s, default=PRECISION_BUDGET_S, metavar="S",
                    help="the precision search's time budget in seconds (mixed precision, FP16 on the HTP); the "
                         f"report names what it left untried (default {PRECISION_BUDGET_S:g})")


def _budget_s(text: str) -> float:
    """Parse --precision-budget-s: a number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise pytest.UsageError(f"--precision-budget-s: '{text}' is not a number of seconds") from None
    if not value > 0:
        raise pytest.UsageError(f"--precision-budget-s: {text} s leaves the precision search no time; give a "
                                f"number of seconds above 0 (default {PRECISION_BUDGET_S:g})")
    return value


@pytest.hookimpl(trylast=True)  # after the core plugin has made the HarnessSession
def pytest_configure(config: pytest.Config) -> None:
    from harness.quantization.encodings import load_encodings

    path = config.getoption("quantization_overrides", None)
    encodings, source = {}, ""
    if path:
        try:
            encodings, source = load_encodings(Path(path)).to_json(), str(Path(path).expanduser().resolve())
        except HarnessError as e:
            raise pytest.UsageError(f"--quantization-overrides: {e}") from None
    config.stash[SESSION_KEY].accuracy = AccuracyOptions(sweep=config.getoption("sweep", "quick"),
                                                         encodings=encodings, encodings_file=source,
                                                         aimet=config.getoption("aimet", "auto"),
                                                         precision_budget_s=config.getoption(
                                                             "precision_budget_s", PRECISION_BUDGET_S))
