"""pytest hooks and fixtures for real devices: telemetry around each step, devices that fail.

* Telemetry: while a step test runs (its setup, where the step is computed, and its call), a
  TelemetrySampler reads the device's thermal zones and power every ``--telemetry-interval``
  seconds. The summary goes into the step's KPIs as ``telemetry`` (source emulated|measured,
  max_temp_c, mean_power_w, samples, per-zone max/mean) and the samples to Allure as CSV.
* Faults: a device its transport lost (disconnected, or not answering after a timeout) is taken
  out of the session; that step test and every later one of the device error with "device X was
  taken out of the session after: ...", and the other devices go on.
"""

from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.plugin import SESSION_KEY, _KPIS_KEY
from harness.plugin.option_types import bounded

DEFAULT_TELEMETRY_INTERVAL_S = 0.5
_SAMPLER_KEY = pytest.StashKey[object]()


_interval = bounded(float, 0, "an interval in seconds (0 turns telemetry off)")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("snapdragon")
    group.addoption("--telemetry-interval", type=_interval, default=DEFAULT_TELEMETRY_INTERVAL_S, metavar="SECONDS",
                    help="sample device temperatures and power every SECONDS while a step runs "
                         f"(default {DEFAULT_TELEMETRY_INTERVAL_S}; 0: off)")


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


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item):  # type: ignore[no-untyped-def]
    _start_telemetry(item)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):  # type: ignore[no-untyped-def]
    try:
        yield
    finally:
        _finish_telemetry(item, attach=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item):  # type: ignore[no-untyped-def]
    _finish_telemetry(item, attach=False)  # setup failed: there was no call phase
    yield


@pytest.fixture(autouse=True)
def _device_in_session(request: pytest.FixtureRequest) -> None:
    """Error a step test whose device was taken out of the session, by its own step or an earlier one.

    Function-scoped, so it runs after the session-scoped step fixtures have computed the step.
    """
    target = _step_target(request.node)
    hs = request.config.stash.get(SESSION_KEY, None)
    if target is None or hs is None:
        return
    reason = hs.pool.failure(target.device.id)
    if reason is not None:
        pytest.fail(f"device {target.device.id} was taken out of the session after: {reason}", pytrace=False)
