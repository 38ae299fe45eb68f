"""pytest options of compilation, profiling and runtime integration (Steps 4-6; their fixtures come from the step
table, harness.steps.table)."""

from __future__ import annotations

import pytest

from harness.options import bounded, seconds

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("snapdragon")
    group.addoption("--min-iterations", type=bounded(int, 1, "a positive whole number of iterations"),
                    default=None, metavar="N",
                    help="profile step: time at least N iterations (default 20 on the emulator, 100 on devices; "
                         "unset, the HTP simulator times as many as fit 15 s, at least 5)")
    group.addoption("--min-duration", type=seconds, default=None, metavar="SECONDS",
                    help="profile step: and time for at least this long (default 1 s on the emulator, 10 s on devices)")
    group.addoption("--warmup-iterations", type=bounded(int, 0, "a whole number of warm-up runs (0 or more)"),
                    default=None, metavar="N",
                    help="profile step: untimed runs first (default 3 on the emulator, 10 on devices)")
    group.addoption("--latency-blocks", type=bounded(int, 1, "a positive whole number of measurement blocks"),
                    default=None, metavar="N",
                    help="profile step: time latency in N independent blocks, separate runner invocations that "
                         "share the iterations (default 5); the regression gate compares block medians, so a "
                         "baseline needs at least 4 to test a change")
