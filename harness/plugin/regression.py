"""pytest options and hooks of baselines and regression gates (the step's fixture comes from the step table).

* ``--save-baseline DIR``: at the end of the session (on the controller; under pytest-xdist the step
  records arrive there through the test reports) one baseline file per device × model that ran a step,
  ``DIR/<device>/<model>.json`` (harness.baseline).
* ``--baseline DIR``: the regression step (suite test_15_regression.py, run last) compares this run's
  records of its device × model with DIR's file (harness.steps.regression), with an interleaved A/B on the
  device where the baseline's artifact is in the cache (harness.latency_ab); without the option, or without
  a file for the device × model, it is skipped saying why.
"""

from __future__ import annotations


import pytest

from harness.baseline import REGRESSION_STEP
from harness.errors import HarnessError
from harness.plugin import SESSION_KEY
from harness.steps.table import option_dir as _dir

_SAVED_KEY = pytest.StashKey[list]()
_SAVE_ERROR_KEY = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("snapdragon")
    group.addoption("--baseline", default=None, metavar="DIR",
                    help="regression step: compare this run's KPIs with the baselines in DIR "
                         "(DIR/<device>/<model>.json, written by --save-baseline)")
    group.addoption("--save-baseline", default=None, metavar="DIR",
                    help="at the end of the run, save each device x model's step outcomes and KPIs (with the latency "
                         "blocks, noise floors and the artifact measured) as DIR/<device>/<model>.json")


@pytest.hookimpl(trylast=True)  # after the core plugin has made the HarnessSession
def pytest_configure(config: pytest.Config) -> None:
    from harness.baseline import check_baseline_dir, check_save_dir

    baseline, save = _dir(config.option.baseline), _dir(config.option.save_baseline)
    try:
        if baseline is not None:
            check_baseline_dir(baseline)
        if save is not None:
            check_save_dir(save)
    except HarnessError as e:
        raise pytest.UsageError(str(e)) from None


@pytest.hookimpl(trylast=True)  # after pytest's reordering by fixture parameters
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The regression step compares the records of the steps that ran before it: it runs last.
    last = [item for item in items if _is_regression(item)]
    if last:
        items[:] = [item for item in items if not _is_regression(item)] + last


def _is_regression(item: pytest.Item) -> bool:
    marker = item.get_closest_marker("step")
    return marker is not None and bool(marker.args) and marker.args[0] == REGRESSION_STEP


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from harness.baseline import save_baselines

    config = session.config
    root = _dir(config.option.save_baseline)
    hs = config.stash.get(SESSION_KEY, None)
    if root is None or hs is None or hasattr(config, "workerinput"):
        return
    from harness.reporting.summary import EXIT_INCONCLUSIVE

    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, EXIT_INCONCLUSIVE):
        reason = pytest.ExitCode(exitstatus).name.lower().replace("_", " ") if exitstatus in list(pytest.ExitCode) \
            else "devices out"
        config.stash[_SAVE_ERROR_KEY] = (f"no baseline saved in {root}: the run ended with exit status "
                                         f"{int(exitstatus)} ({reason}), so earlier baselines are kept")
        return
    try:
        config.stash[_SAVED_KEY] = save_baselines(root, hs.targets, hs.records, hs.cache)
    except HarnessError as e:
        config.stash[_SAVE_ERROR_KEY] = f"--save-baseline {root}: {e}"
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    """Say which baseline files --save-baseline wrote, and for which device x model none was written, and why."""
    saved, error = config.stash.get(_SAVED_KEY, None), config.stash.get(_SAVE_ERROR_KEY, None)
    if saved is None and error is None:
        return
    terminalreporter.write_sep("=", "baselines")
    for s in saved or []:
        if s.path is not None:
            terminalreporter.write_line(f"saved {s.path} ({s.steps} steps of {s.device} x {s.model})")
        else:
            terminalreporter.write_line(f"not saved for {s.device} x {s.model}: {s.reason}", yellow=True)
    if error is not None:
        terminalreporter.write_line(error, red=True)
