"""pytest options of Step 7, validation: end-to-end accuracy, sustained performance and thermals, energy per
inference, concurrency (their fixtures come from the step table, harness.steps.table). Its suites carry the
`validation` marker: `-m "not validation"` or `--skip-validation` leaves them out."""

from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.options import ValidationOptions, bounded, positive_seconds, seconds
from harness.plugin import SESSION_KEY

_sessions = bounded(int, 1, "a number of sessions (1 or more)")
_count = bounded(int, 1, "a positive whole number of inferences")
_tokens = bounded(int, 1, "a number of tokens (1 or more)")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("snapdragon")
    group.addoption("--soak-duration", type=positive_seconds, default=None, metavar="SECONDS",
                    help="sustained step: soak this long (default 60 on emulated devices, 600 on adb/SSH devices; "
                         "at least one 5 s window)")
    group.addoption("--cooldown-max-s", type=seconds, default=None, metavar="SECONDS",
                    help="sustained step: wait at most this long for the device to cool to idle before the soak "
                         "(default 90 emulated, 300 on devices; 0: no wait)")
    group.addoption("--concurrency", type=_sessions, default=2, metavar="N",
                    help="concurrency step: N sessions at once on the HTP (default 2)")
    group.addoption("--concurrency-duration", type=positive_seconds, default=None, metavar="SECONDS",
                    help="concurrency step: run the sessions together this long (default 10 emulated, 60 on devices; "
                         "each model first runs alone for up to 3 / 10 s)")
    group.addoption("--concurrency-mode", choices=["threads", "processes"], default="threads",
                    help="concurrency step: sessions as threads of one runner process (default) or one process each")
    group.addoption("--energy-inferences", type=_count, default=None, metavar="N",
                    help="energy step: inferences to measure (default: about 8 s of them emulated, 30 s on devices)")
    group.addoption("--genie-stress-rounds", type=_sessions, default=2, metavar="N",
                    help="genie_stress step (kind llm): dialogs in sequence per worker (default 2)")
    group.addoption("--genie-stress-concurrent", type=_sessions, default=2, metavar="N",
                    help="genie_stress step (kind llm): dialogs at once, one process each (default 2)")
    group.addoption("--genie-stress-new-tokens", type=_tokens, default=8, metavar="N",
                    help="genie_stress step (kind llm): tokens generated per query (default 8) but the longest "
                         "prompt's, which generates to the context's end (the prompts reach the context)")
    group.addoption("--skip-validation", action="store_true",
                    help='leave out Step 7, validation (the same as -m "not validation")')


@pytest.hookimpl(trylast=True)  # after the core plugin has made the HarnessSession
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "validation: Step 7 (validation) suite; deselect with -m 'not validation'")
    opt = config.option
    try:
        options = ValidationOptions(opt.soak_duration, opt.cooldown_max_s, opt.concurrency, opt.energy_inferences,
                                    opt.concurrency_duration, opt.concurrency_mode, opt.genie_stress_rounds,
                                    opt.genie_stress_concurrent, opt.genie_stress_new_tokens)
    except HarnessError as e:
        raise pytest.UsageError(str(e)) from None
    config.stash[SESSION_KEY].validation = options


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("skip_validation"):
        return
    kept = [item for item in items if item.get_closest_marker("validation") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
