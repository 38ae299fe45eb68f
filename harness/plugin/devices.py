"""pytest hooks and fixtures for real devices: telemetry around each step, devices that fail.

* Telemetry: while a step test runs (its setup, where the step is computed, and its call), a
  TelemetrySampler reads the device's thermal zones and power every ``--telemetry-interval``
  seconds. The summary goes into the step's KPIs as ``telemetry`` (source emulated|measured,
  max_temp_c, mean_power_w, samples, per-zone max/mean) and the samples to Allure as CSV.
* Faults: a device its transport lost (disconnected, or not answering after a timeout) is taken
  out of the session and quarantined: the step test that found it errors with "device X was taken
  out of the session after: ...", the device's later tests are skipped naming the reason, and the
  other devices go on.
* The farm (harness.farm): each step test holds its device's lock while it runs; a device is
  health-checked before first use; quarantines go to --farm-state; the terminal summary lists the
  devices used and quarantined, and a table per device x model of each step's outcome and headline KPI.
  A requested step that did not run because its device was out makes the run incomplete: the summary
  names the device and why, and the exit status is not 0 (harness.reporting.summary.run_exit_status).
"""

from __future__ import annotations

import pytest

import os

from harness.errors import HarnessError
from harness.options import bounded, positive_seconds
from harness.plugin import DEVICE_STATE_PROPERTY, SESSION_KEY, SKIPPED_ELSEWHERE_KEY, _KPIS_KEY

DEFAULT_TELEMETRY_INTERVAL_S = 0.5
_SAMPLER_KEY = pytest.StashKey[object]()


_interval = bounded(float, 0, "an interval in seconds (0 turns telemetry off)")


def pytest_addoption(parser: pytest.Parser) -> None:
    from harness.farm.health import DEFAULT_MIN_FREE_MB
    from harness.farm.state import DEFAULT_QUARANTINE_HOURS
    from harness.runner.client import DEFAULT_COMMAND_TIMEOUT_S

    group = parser.getgroup("snapdragon")
    group.addoption("--telemetry-interval", type=_interval, default=DEFAULT_TELEMETRY_INTERVAL_S, metavar="SECONDS",
                    help="sample device temperatures and power every SECONDS while a step runs "
                         f"(default {DEFAULT_TELEMETRY_INTERVAL_S}; 0: off)")
    group.addoption("--farm-state", default=os.environ.get("HARNESS_FARM_STATE"), metavar="PATH",
                    help="farm state file: devices quarantined by this run are written there and skipped by later "
                         "runs until they expire (default $HARNESS_FARM_STATE; none: quarantine lasts this run)")
    group.addoption("--unquarantine", action="append", default=[], metavar="ID",
                    help="take device ID out of the farm state's quarantine before the run (repeatable)")
    group.addoption("--quarantine-hours", type=bounded(float, 0, "a number of hours (0 or more)"),
                    default=DEFAULT_QUARANTINE_HOURS, metavar="H",
                    help=f"how long a quarantine in the farm state lasts (default {DEFAULT_QUARANTINE_HOURS:g})")
    group.addoption("--device-lock-dir", default=None, metavar="DIR",
                    help="where the per-device locks, their queues of waiters and holder records live (default "
                         "$HARNESS_LOCK_DIR, else <tmp>/snapdragon-harness-locks): one host-wide directory per farm")
    group.addoption("--device-lock-timeout", type=bounded(float, 0, "a duration in seconds (0 or more)"),
                    default=1800.0, metavar="SECONDS",
                    help="wait this long for a device another process holds (default 1800); waiters take it in the "
                         "order they asked, and a wait names the holder")
    group.addoption("--command-timeout", type=positive_seconds,
                    default=DEFAULT_COMMAND_TIMEOUT_S, metavar="SECONDS",
                    help=f"stop a device command that runs longer (default {DEFAULT_COMMAND_TIMEOUT_S:g}); the step "
                         "it served is recorded `error`, not `failed`")
    group.addoption("--no-health-check", action="store_true", help="skip the devices' health check before first use")
    group.addoption("--device-min-free-mb", type=bounded(float, 0, "a size in MB (0 or more)"),
                    default=DEFAULT_MIN_FREE_MB, metavar="MB",
                    help=f"health check: free space the work directory needs (default {DEFAULT_MIN_FREE_MB:g})")


def _step_target(item: pytest.Item):  # type: ignore[no-untyped-def]
    """Return the Target of a step test, or None for other tests."""
    callspec = getattr(item, "callspec", None)
    if item.get_closest_marker("step") is None or callspec is None or "target" not in callspec.params:
        return None
    return callspec.params["target"]


def _start_telemetry(item: pytest.Item) -> None:
    from harness.telemetry import TelemetrySampler

    target = _step_target(item)
    interval_s = item.config.getoption("telemetry_interval", DEFAULT_TELEMETRY_INTERVAL_S)
    hs = item.config.stash.get(SESSION_KEY, None)
    if target is None or hs is None or not interval_s or not target.device.telemetry.enabled:
        return
    try:
        runner = hs.pool.runner(target.device, hs.devices)
    except HarnessError:
        return  # the onboarding fixture reports it
    item.stash[_SAMPLER_KEY] = TelemetrySampler(runner.transport, interval_s=interval_s).start()


def _finish_telemetry(item: pytest.Item, attach: bool) -> None:
    sampler = item.stash.get(_SAMPLER_KEY, None)
    if sampler is None:
        return
    item.stash[_SAMPLER_KEY] = None
    summary = sampler.stop()
    if not attach:
        return
    kpis = item.stash.get(_KPIS_KEY, None)
    if kpis is None:
        kpis = item.stash[_KPIS_KEY] = {}
    kpis["telemetry"] = summary.kpis()
    import allure

    step = item.get_closest_marker("step").args[0]
    allure.attach(sampler.csv(), name=f"{step} telemetry ({summary.source})",
                  attachment_type=allure.attachment_type.CSV)


@pytest.hookimpl(tryfirst=True)  # a plain hook: before the fixtures are set up, inside the other hooks' wrappers
def pytest_runtest_setup(item: pytest.Item) -> None:
    _take_device_lock(item)
    _start_telemetry(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):  # type: ignore[no-untyped-def]
    try:
        yield
    finally:
        _finish_telemetry(item, attach=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item):  # type: ignore[no-untyped-def]
    _finish_telemetry(item, attach=False)  # setup failed: there was no call phase
    try:
        yield
    finally:
        _release_device_lock(item)


@pytest.hookimpl(tryfirst=True)  # before the session's fixtures are torn down and its devices closed
def pytest_sessionfinish(session: pytest.Session) -> None:
    for item in session.items:  # an interrupted setup never reaches its teardown: its sampler still runs
        _finish_telemetry(item, attach=False)


_LOCK_KEY = pytest.StashKey[object]()


def _take_device_lock(item: pytest.Item) -> None:
    """Hold the step test's device lock from its setup to its teardown (one user per device), in turn with the
    other processes that wait for it, saying live who holds it while waiting; a device another process holds past
    --device-lock-timeout errors the test with one line naming the holder (no traceback)."""
    from harness.errors import FarmError

    target = _step_target(item)
    hs = item.config.stash.get(SESSION_KEY, None)
    if target is not None and hs is not None and hs.locks is not None:
        try:
            item.stash[_LOCK_KEY] = hs.locks.acquire(target.device.id, test=item.nodeid,
                                                     progress=live_line(item.config))
            return
        except FarmError as e:
            message = str(e)
        pytest.fail(message, pytrace=False)  # outside the except: no "During handling of the above exception"


def live_line(config: pytest.Config):  # type: ignore[no-untyped-def]
    """Return a function that shows a line at once, past pytest's output capture: on stderr, after the terminal
    reporter's current line (an xdist worker's stderr reaches the terminal as it is)."""
    import contextlib
    import sys

    capman = config.pluginmanager.get_plugin("capturemanager")
    reporter = None if hasattr(config, "workerinput") else config.pluginmanager.get_plugin("terminalreporter")

    def show(line: str) -> None:
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            if reporter is not None:
                reporter.ensure_newline()
                sys.stdout.flush()
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    return show


def _release_device_lock(item: pytest.Item) -> None:
    lock = item.stash.get(_LOCK_KEY, None)
    if lock is not None:
        item.stash[_LOCK_KEY] = None
        lock.release()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    target = _step_target(item)
    hs = item.config.stash.get(SESSION_KEY, None)
    if target is not None and hs is not None and (report.when == "call" or not report.passed):
        report.user_properties.append((DEVICE_STATE_PROPERTY, hs.pool.state(target.device)))


@pytest.fixture(autouse=True)
def _device_in_session(request: pytest.FixtureRequest) -> None:
    """Error the step test during which its device was taken out of the session, and skip the device's later
    tests naming why (it is quarantined). Function-scoped, so it runs after the session-scoped step
    fixtures have computed the step."""
    target = _step_target(request.node)
    hs = request.config.stash.get(SESSION_KEY, None)
    if target is None or hs is None:
        return
    device_id = target.device.id
    reason = hs.pool.failure(device_id)
    if reason is None and device_id in hs.pool.quarantines:
        pytest.skip(f"device {device_id} is quarantined: {hs.pool.quarantines[device_id]}; "
                    f"`--unquarantine {device_id}` puts it back")
    if reason is None:
        return
    reported = request.config.stash.setdefault(_REPORTED_KEY, set())
    if device_id in reported or reason.startswith("health check failed"):
        pytest.skip(f"device {device_id} is quarantined: {reason}")
    reported.add(device_id)
    pytest.fail(f"device {device_id} was taken out of the session after: {reason}", pytrace=False)


_REPORTED_KEY = pytest.StashKey[set]()


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    """The farm summary (devices used and quarantined, and why), a table per device x model, the inconclusive
    steps and marginal passes, the devices that were out with the steps they kept from running, the step tests
    something other than the harness skipped, and why the exit status is not 0 when no test failed
    (harness.reporting.summary)."""
    from harness.reporting.summary import (EXIT_REASONS, device_lines, incomplete_lines, run_exit_status,
                                           skipped_elsewhere_lines, step_table, verdict_lines)

    hs = config.stash.get(SESSION_KEY, None)
    if hs is None or hasattr(config, "workerinput") or not hs.records:
        return
    verbose = config.get_verbosity()
    devices = hs.device_summary()
    terminalreporter.write_sep("=", "snapdragon harness")
    for line in [*device_lines(devices, hs.released), *step_table(hs.records, verbose)]:
        terminalreporter.write_line(line)
    for line in verdict_lines(hs.records, verbose):
        terminalreporter.write_line(line, yellow=True)
    for line in incomplete_lines(devices, hs.records):
        terminalreporter.write_line(line, red=True)
    skipped_elsewhere = config.stash.get(SKIPPED_ELSEWHERE_KEY, [])
    for line in skipped_elsewhere_lines(skipped_elsewhere):
        terminalreporter.write_line(line, red=True)
    status = run_exit_status(hs.records, devices, skipped_elsewhere) if exitstatus == pytest.ExitCode.OK else 0
    if status:
        terminalreporter.write_line(f"exit status {status}: no test failed, but {EXIT_REASONS[status]}", red=True)
