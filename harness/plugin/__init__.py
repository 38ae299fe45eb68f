"""pytest plugin: options, device × model parametrization, step fixtures, KPI records.

Loaded by the repository's conftest.py. It wires things together and holds no onboarding logic:
that lives in harness.pipeline and harness.steps.
"""

from __future__ import annotations

import argparse
import os
import re
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

from harness.errors import DeviceQuarantinedError, DeviceTimeoutError, HarnessError, TransportError, is_infrastructure
from harness.reporting import charts
from harness.reasons import headline, summarize
from harness.steps.table import PASSED, Step, StepOptions, steps

# Fixtures and options of the later onboarding steps live in sibling modules, one per area.
pytest_plugins: list[str] = ["harness.plugin.performance", "harness.plugin.accuracy", "harness.plugin.devices",
                             "harness.plugin.farm",
                             "harness.plugin.validation", "harness.plugin.regression", "harness.plugin.llm",
                             "harness.plugin.history"]

T = TypeVar("T")
SESSION_KEY = pytest.StashKey["HarnessSession"]()
SIGNALS_KEY = pytest.StashKey["SignalGuard"]()
RECORD_PROPERTY = "harness_step_record"
DEFAULT_DEVICE = "sm8650"


class HarnessWarning(UserWarning):
    """A caveat about a step's result (random calibration data, VTCM pressure, ...)."""


def _input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    from harness.models import parse_input_shape

    try:
        return parse_input_shape(text)
    except HarnessError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _freeze_input(text: str) -> tuple[str, object]:
    from harness.models import parse_freeze_input

    try:
        return parse_freeze_input(text)
    except HarnessError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("snapdragon", "Snapdragon onboarding harness")
    group.addoption("--device", action="append", default=[], metavar="ID|SOC",
                    help=f"device id or SoC id from the devices file (repeatable; default {DEFAULT_DEVICE})")
    group.addoption("--devices-file", default=None, metavar="PATH",
                    help="devices file (default: $HARNESS_DEVICES_FILE, else devices.yaml in the rootdir if present, "
                         "else the built-in emulator devices, one per SoC)")
    group.addoption("--model", action="append", default=[], metavar="NAME|PATH",
                    help="built-in model name, ONNX file or model spec YAML (repeatable; default digits_cnn)")
    group.addoption("--input-shape", action="append", default=[], type=_input_shape,
                    metavar="[MODEL:]NAME=D0,D1,...",
                    help="fix the dims of input NAME in every model that has it, or in MODEL only (repeatable)")
    group.addoption("--freeze-input", action="append", default=[], type=_freeze_input,
                    metavar="[MODEL:]NAME=VALUE",
                    help="freeze input NAME to a constant (a number, a comma list or a JSON list) in every model "
                         "that has it, or in MODEL only, before conversion (repeatable)")
    group.addoption("--calib-data", default=None, metavar="DIR", help="directory of .npy/.npz calibration samples")
    group.addoption("--cache-dir", default=None, metavar="DIR",
                    help="artifact cache (default: $HARNESS_CACHE_DIR or ~/.cache/snapdragon-harness)")
    group.addoption("--kpi-json", default=None, metavar="PATH", help="write per-step KPI records as JSON")
    group.addoption("--keep-device-files", action="store_true", help="leave the work directory on devices")


def _build_session(config: pytest.Config):
    from harness.cache import DEFAULT_CACHE_DIR, ArtifactCache
    from harness.devices import load_devices_file
    from harness.models import resolve_models
    from harness.target import Target
    from harness.farm.locks import DeviceLocks
    from harness.farm.state import FarmState
    from harness.plugin.farm import farm_settings, open_farm, run_of
    from harness.session import DevicePool, HarnessSession

    opt = config.option
    devices_file = opt.devices_file or os.environ.get("HARNESS_DEVICES_FILE")
    if devices_file is None and (Path(config.rootpath) / "devices.yaml").is_file():
        devices_file = Path(config.rootpath) / "devices.yaml"
    devices = load_devices_file(devices_file)  # None: the built-in emulator devices
    run = run_of(config)
    selectors = opt.device or [os.environ.get("HARNESS_DEVICE", DEFAULT_DEVICE)]
    settings = farm_settings(config, devices)  # a labgrid coordinator's places, or the devices file's devices
    selected = devices.select(selectors) if settings is None else []
    calib = Path(opt.calib_data).expanduser() if opt.calib_data else None
    models = resolve_models(opt.model or ["digits_cnn"], opt.input_shape, opt.freeze_input, calib)
    cache_root = Path(opt.cache_dir or os.environ.get("HARNESS_CACHE_DIR") or DEFAULT_CACHE_DIR).expanduser()
    cache = ArtifactCache(cache_root)
    if settings is not None:  # leased places are one run's alone: no host-wide locks
        selected, farm, released = open_farm(config, devices, settings, selectors, opt.device_lock_timeout, run)
    else:
        farm = FarmState(opt.farm_state, opt.quarantine_hours)
        released = farm.release(opt.unquarantine) if not _is_xdist_worker(config) else []
    targets = [Target(d, devices.soc(d.soc), m) for d in selected for m in models]
    try:  # xdist workers share devices: the controller cleans up once they are done
        pool = DevicePool(cache, keep_files=opt.keep_device_files or _is_xdist_worker(config), farm=farm,
                          health_check=not opt.no_health_check, min_free_mb=opt.device_min_free_mb,
                          command_timeout_s=opt.command_timeout)
    except BaseException:
        getattr(farm, "close", lambda: None)()  # leased places go back
        raise
    return HarnessSession(devices=devices, targets=targets, cache=cache, pool=pool,
                          kpi_json=Path(opt.kpi_json) if opt.kpi_json else None,
                          locks=None if settings is not None else
                          DeviceLocks(Path(opt.device_lock_dir) if opt.device_lock_dir else None,
                                      opt.device_lock_timeout, run=run),
                          released=released)


def pytest_configure(config: pytest.Config) -> None:
    from harness.shutdown import install

    config.stash[SIGNALS_KEY] = install()  # SIGTERM ends the run like Ctrl-C: teardown and device cleanup run
    config.addinivalue_line("markers", "step(name): the onboarding step a suite test checks")
    try:
        session = _build_session(config)
    except HarnessError as e:
        raise pytest.UsageError(str(e)) from None
    config.stash[SESSION_KEY] = session
    config.stash[SKIPPED_ELSEWHERE_KEY] = []
    config.pluginmanager.register(_RecordCollector(session, config.stash[SKIPPED_ELSEWHERE_KEY]), "harness-records")
    # Registered now, after every plugin pytest loads from an entry point, -p or a conftest's pytest_plugins: of the
    # plugins' fixtures of one name pytest uses the one registered last (FixtureManager._register_fixture inserts
    # it after the other plugins'), so target, onboarding, check and the step fixtures are the harness's whatever
    # else is installed (labgrid's pytest plugin has a `target` too). A conftest's fixture still overrides them.
    config.pluginmanager.register(_harness_fixtures(), "harness-fixtures")


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_unconfigure(config: pytest.Config) -> None:
    try:
        _close_session(config)
    finally:
        guard = config.stash.get(SIGNALS_KEY, None)
        if guard is not None:
            guard.restore()


def _close_session(config: pytest.Config) -> None:
    """Clean and close the session's devices (the controller's too under xdist)."""
    charts.wait_all()  # the charts still being drawn on their thread are written before the run ends
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return
    if getattr(config.option, "numprocesses", None) and not _is_xdist_worker(config):
        if not config.option.keep_device_files:
            for t in session.targets:  # connect, so that close() cleans what the workers left
                try:
                    session.pool.runner(t.device, session.devices)
                except HarnessError:  # out of service (the summary said why): its files stay
                    continue
    try:
        session.pool.close()
    finally:
        close_farm = getattr(session.pool.farm, "close", None)  # a labgrid farm: its places are released
        if close_farm is not None:
            close_farm()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames:
        targets = metafunc.config.stash[SESSION_KEY].targets
        metafunc.parametrize("target", targets, ids=[t.id for t in targets], scope="session", indirect=True)


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup scheduling reads the xdist_group markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under pytest-xdist's --dist loadgroup, keep each device (with its models) on one worker: a device's
    # artifacts are built once, its steps run in order, no two workers measure on it at once, and N devices
    # keep N workers busy.
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "target" in callspec.params:
            item.add_marker(pytest.mark.xdist_group(callspec.params["target"].device.id))


# tryfirst: the outermost wrapper, so that allure-pytest has set the Allure result's status when it is flagged
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    marker = item.get_closest_marker("step")
    callspec = getattr(item, "callspec", None)
    if marker is None or callspec is None or "target" not in callspec.params:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        from harness.reporting.allure import attach_report, flag_allure_result
        from harness.reporting.records import StepRecord

        target = callspec.params["target"]
        state = "error" if report.when == "setup" and report.failed else report.outcome
        message, marginal = "", []
        verdict = item.stash.get(_VERDICT_KEY, None) if report.when == "call" else None
        if report.skipped and isinstance(report.longrepr, tuple):
            message = str(report.longrepr[2])
        elif report.failed:
            message = str(getattr(report.longrepr, "reprcrash", None) and report.longrepr.reprcrash.message
                          or report.longreprtext.splitlines()[-1:] or "")
        elif verdict is not None:
            state = "inconclusive" if verdict.status == "inconclusive" else state
            message, marginal = verdict.message, verdict.marginal
            flag_allure_result(item.config, state, message, marginal)
        if state == "error":  # the test bench stopped it (_bench_stopped_step, a lost device): Allure's `broken`
            flag_allure_result(item.config, state, message, [])
        record = StepRecord(target.device.id, target.soc.id, target.model.name, marker.args[0], state,
                            item.stash.get(_KPIS_KEY, {}), re.sub(r"^(Failed|Skipped): ", "", message), tuple(marginal))
        if verdict is not None:  # what check() decided goes to Allure and --junitxml from the record (telemetry too)
            if verdict.report is not None and item.config.pluginmanager.getplugin("allure_listener") is not None:
                attach_report(verdict.report, record)  # waits for the step's charts: only when Allure records
            reason = [(f"{record.step}.reason", headline(verdict.message))] if verdict.message else []
            item.user_properties.extend([*record.properties(), (f"{record.step}.status", verdict.status), *reason])
        report.user_properties.append((RECORD_PROPERTY, record.to_json()))
        elsewhere = _skipped_elsewhere(item, call, record.message) if report.skipped else None
        if elsewhere is not None:  # not the harness's verdict: the run is not green (harness.reporting.summary)
            report.user_properties.append((SKIPPED_ELSEWHERE_PROPERTY, elsewhere._asdict()))


# A step test skipped by something other than the harness: a skip raised outside the harness and the test's own
# module (another plugin's or a conftest's fixture or hook), or a skip mark neither its suite nor the harness set.
SKIPPED_ELSEWHERE_PROPERTY = "harness_skipped_elsewhere"
SKIPPED_ELSEWHERE_KEY = pytest.StashKey[list]()
_HARNESS_DIR = Path(__file__).resolve().parent.parent
_PYTEST_SKIP_FILE = Path(pytest.importorskip.__code__.co_filename).resolve()  # _pytest/outcomes.py: skip too
_PYTEST_DIR = _PYTEST_SKIP_FILE.parent


def _skipped_elsewhere(item: pytest.Item, call: pytest.CallInfo, reason: str):  # type: ignore[no-untyped-def]
    """Return the SkippedElsewhere of a step test that something other than the harness skipped, else None (the
    harness's or its suite's own skip, or no skip: an xfail)."""
    from harness.reporting.summary import SkippedElsewhere

    if call.excinfo is None or not call.excinfo.errisinstance(pytest.skip.Exception):
        return None
    origin = _skip_origin(call.excinfo)
    if origin is None or _harness_verdict(item, origin[0]):
        return None
    path, line = origin
    if path.is_relative_to(_PYTEST_DIR):  # pytest skipped it for a mark: a plugin's or a conftest's hook added it
        return SkippedElsewhere(item.nodeid, reason, "by a skip mark another plugin or a conftest added")
    where = path.relative_to(item.config.rootpath) if path.is_relative_to(item.config.rootpath) else path
    return SkippedElsewhere(item.nodeid, reason, f"raised at {where}:{line}")


def _skip_origin(excinfo: pytest.ExceptionInfo) -> tuple[Path, int] | None:
    """Return the file and line (1-based) that raised a skip: its innermost frame outside pytest.skip itself (one
    of pytest's files when pytest skipped the test for a skip mark); None when pytest.skip's are its only frames."""
    for entry in reversed(excinfo.traceback):
        path = Path(str(entry.path)).resolve()
        if path != _PYTEST_SKIP_FILE:
            return path, entry.lineno + 1
    return None


def _harness_verdict(item: pytest.Item, origin: Path) -> bool:
    """Whether a skip raised in origin is the harness's own verdict: raised by the harness (a prerequisite that
    failed, a step's skip condition, a quarantined device) or by the test's module, or pytest's for a skip mark
    of the suite's or of the harness's."""
    if origin.is_relative_to(_HARNESS_DIR) or origin == Path(item.path).resolve():
        return True
    return origin.is_relative_to(_PYTEST_DIR) and _own_skip_mark(item)


def _own_skip_mark(item: pytest.Item) -> bool:
    """Whether a step test's skip mark is the suite's (on its function, class or module) or the harness's: a suite
    of the other kind than the model's (harness.plugin.llm marks those skipped)."""
    from harness.plugin.llm import LLM_MARKER

    for holder in (getattr(item, "module", None), getattr(item, "cls", None), getattr(item, "function", None)):
        marks = getattr(holder, "pytestmark", [])
        if any(mark.name in ("skip", "skipif") for mark in (marks if isinstance(marks, list) else [marks])):
            return True
    model = item.callspec.params["target"].model  # type: ignore[attr-defined]
    return model.is_llm != (item.get_closest_marker(LLM_MARKER) is not None)


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):  # type: ignore[no-untyped-def]
    """An inconclusive step is its own category (I, INCONCLUSIVE), counted apart from passes and failures; a
    marginal pass is a pass shown as M / PASSED (marginal)."""
    if report.when != "call" or not report.passed:
        return None
    record = next((value for name, value in report.user_properties if name == RECORD_PROPERTY), None)
    if record is None:
        return None
    if record["outcome"] == "inconclusive":
        return "inconclusive", "I", ("INCONCLUSIVE", {"yellow": True})
    if record.get("marginal"):
        return "passed", "M", ("PASSED (marginal)", {"green": True})
    return None


@dataclass(frozen=True)
class _StepVerdict:
    """What the check fixture decided: the status (failed, inconclusive, marginal, passed), why (the
    message), the marginal passes and the step report (None when the step raised)."""

    status: str
    message: str
    marginal: list[str]
    report: Any = None


_KPIS_KEY = pytest.StashKey[dict]()
_VERDICT_KEY = pytest.StashKey[_StepVerdict]()


DEVICE_STATE_PROPERTY = "harness_device_state"


class _RecordCollector:
    """Collects step records and device states from test reports (they arrive from xdist workers the same way)."""

    def __init__(self, session, skipped_elsewhere: list) -> None:
        self.session = session
        self.skipped_elsewhere = skipped_elsewhere  # SkippedElsewhere: the step tests something else skipped

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        from harness.reporting.records import StepRecord
        from harness.reporting.summary import SkippedElsewhere

        for name, value in report.user_properties:
            if name == RECORD_PROPERTY:
                self.session.records.append(StepRecord.from_json(value, f"{report.nodeid}'s step record"))
            elif name == DEVICE_STATE_PROPERTY:
                self.session.device_states[value["id"]] = value
            elif name == SKIPPED_ELSEWHERE_PROPERTY:
                self.skipped_elsewhere.append(SkippedElsewhere(**value))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from harness.reporting.summary import run_exit_status

        if hasattr(session.config, "workerinput"):
            return
        self.session.write_kpi_json()
        if session.exitstatus == pytest.ExitCode.OK:  # a failure's exit status (1) stays
            session.exitstatus = run_exit_status(self.session.records, self.session.device_summary(),
                                                 self.skipped_elsewhere)


@dataclass
class Outcome(Generic[T]):
    """A step's result for one target, or the HarnessError message that stopped it (transport_error: it was
    a transport error, which counts toward the device's quarantine; infrastructure: the test bench stopped it,
    not the model, see harness.errors.is_infrastructure)."""

    step: str
    value: T | None = None
    error: str | None = None
    transport_error: bool = False
    infrastructure: bool = False

    def require_value(self) -> T:
        """Return the value for a dependent step, skipping that step when this one raised (a missed
        KPI limit does not stop it: for steps that explain or build on a result either way)."""
        if self.error is not None:
            pytest.skip(f"prerequisite step '{self.step}' {'errored' if self.infrastructure else 'failed'}: "
                        f"{self.error}")
        return self.value

    def require(self) -> T:
        """Return the value for a dependent step, skipping that step when this one failed (an inconclusive
        step does not stop it: its KPIs are there, only the evidence could not decide a limit)."""
        self.require_value()
        problems = getattr(self.value, "problems", lambda: [])()
        if problems:
            pytest.skip(f"prerequisite step '{self.step}' did not pass: {headline(problems[0], 160)}")
        return self.value


def _outcome(step: str, compute) -> Outcome:
    try:
        return Outcome(step, value=compute())
    except HarnessError as e:
        message = str(e)
        if isinstance(e, DeviceTimeoutError):  # what to do first: the headline shows the message's start
            message = f"a device command ran past its time limit (`--command-timeout SECONDS` sets it): {message}"
        return Outcome(step, error=message, transport_error=isinstance(e, TransportError),
                       infrastructure=is_infrastructure(e))


# The harness's fixtures are plain functions here, made fixtures in _harness_fixtures: the plugin holding them is
# registered in pytest_configure, after every other plugin, so that their names resolve to them (see there). The
# autouse fixtures below keep their place in this module: their names are the harness's alone, and their order
# with harness.plugin.devices' _device_in_session stays as it was.
def _harness_session_fixture(pytestconfig: pytest.Config):
    """The run's HarnessSession: devices file, targets, cache and device pool."""
    return pytestconfig.stash[SESSION_KEY]


def _target_fixture(request: pytest.FixtureRequest):
    """The device × model under test (parametrized from --device and --model)."""
    return request.param


def _onboarding_fixture(target, harness_session):
    """The pipeline for this target (LlmOnboarding for a kind-llm model, else Onboarding): memoised artifacts and
    step reports."""
    try:
        return harness_session.onboarding(target)
    except DeviceQuarantinedError as e:
        pytest.skip(str(e))
    except HarnessError as e:
        pytest.fail(summarize(f"device {target.device.id}", [str(e)]), pytrace=False)


def _step_fixture(step: Step):
    """Return the fixture of a table step: the Outcome of its prerequisites required as the table says (each
    failed one skips it), then its skip condition, then its Outcome for the target."""

    def fixture(target, request: pytest.FixtureRequest) -> Outcome:
        # target is a static argument so that pytest parametrizes and caches the fixture per device x model;
        # the prerequisites and the Onboarding are requested as the table says, so a skip can come first
        options = StepOptions(target, request.config.option, request.config.stash[SESSION_KEY],
                              lambda: request.getfixturevalue("onboarding"))
        for need in step.requires:
            if need.when is None or need.when(options):
                outcome = request.getfixturevalue(need.step)
                outcome.require() if need.mode == PASSED else outcome.require_value()
        reason = step.skip(options) if step.skip is not None else None
        if reason is not None:
            pytest.skip(reason)
        onboarding = options.onboarding()
        return _outcome(step.name, lambda: step.call(onboarding, options))

    fixture.__name__ = fixture.__qualname__ = step.name
    fixture.__doc__ = step.doc
    return pytest.fixture(scope=step.scope, name=step.name)(fixture)


def _harness_fixtures() -> types.ModuleType:
    """Return a plugin holding the harness's fixtures: harness_session, target, onboarding, check, and one per step
    of the table (and of the registered steps)."""
    holder = types.ModuleType("harness.plugin.fixtures", "The harness's fixtures, the step fixtures among them.")
    for name, (function, scope) in _FIXTURES.items():
        setattr(holder, name, pytest.fixture(function, scope=scope, name=name))
    for step in steps():
        setattr(holder, step.name, _step_fixture(step))
    return holder


@pytest.fixture(autouse=True)
def _harness_labels(request: pytest.FixtureRequest) -> None:
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "target" in callspec.params:
        from harness.reporting.allure import label_target

        t = callspec.params["target"]
        label_target(t.device.id, t.soc.id, t.soc.name, t.model.name)


@pytest.fixture(autouse=True)
def _bench_stopped_step(request: pytest.FixtureRequest) -> None:
    """Error a step test in its setup, as pytest errors a broken fixture, when the test bench stopped its step
    (a device command past its time limit, a lost device: Outcome.infrastructure): it is an `error` in pytest's
    summary and JUnit's, not a failure of the model. Function-scoped, so the step has been computed."""
    marker = request.node.get_closest_marker("step")
    if marker is None or marker.args[0] not in request.fixturenames:
        return
    outcome = request.getfixturevalue(marker.args[0])
    if not isinstance(outcome, Outcome) or not outcome.infrastructure:
        return
    hs = request.config.stash.get(SESSION_KEY, None)
    callspec = getattr(request.node, "callspec", None)
    if hs is not None and callspec is not None and "target" in callspec.params:
        device_id = callspec.params["target"].device.id
        if hs.pool.failure(device_id) is not None:  # a device taken out: _device_in_session errors or skips the test
            return
        hs.pool.note_step(device_id, outcome.error)
    pytest.fail(summarize(outcome.step, [outcome.error]), pytrace=False)


def _check_fixture(request: pytest.FixtureRequest):
    """check(outcome) -> StepReport: keep the KPIs and the verdict for the step's record (its Allure result and
    JUnit properties follow from it), fail on any broken limit; a step whose evidence cannot decide a limit (and
    breaks none) is not failed but recorded `inconclusive`, and marginal passes are recorded as such. A failure's
    message is a one-line headline over its details."""

    def _check(outcome: Outcome) -> Any:
        hs = request.config.stash.get(SESSION_KEY, None)
        callspec = getattr(request.node, "callspec", None)
        if hs is not None and callspec is not None and "target" in callspec.params:
            hs.pool.note_step(callspec.params["target"].device.id, outcome.error if outcome.transport_error else None)
        if outcome.error is not None:
            message = summarize(outcome.step, [outcome.error])
            request.node.stash[_VERDICT_KEY] = _StepVerdict("failed", message, [])
            pytest.fail(message, pytrace=False)
        report = outcome.value
        request.node.stash[_KPIS_KEY] = dict(report.kpis)  # a copy: telemetry's KPIs join it
        for note in report.notes:
            warnings.warn(HarnessWarning(f"{outcome.step}: {note}"), stacklevel=2)
        problems, undecided = report.problems(), report.undecided()
        message = (summarize(f"{outcome.step} did not pass", problems) if problems else
                   summarize(outcome.step, undecided) if undecided else "")
        request.node.stash[_VERDICT_KEY] = _StepVerdict(report.status, message,
                                                        [str(v) for v in report.verdicts if v.marginal], report)
        if problems:
            pytest.fail(message, pytrace=False)
        return report

    return _check


# name: (function, scope) of the harness's fixtures other than the steps' (_harness_fixtures makes them fixtures)
_FIXTURES = {"harness_session": (_harness_session_fixture, "session"), "target": (_target_fixture, "session"),
             "onboarding": (_onboarding_fixture, "session"), "check": (_check_fixture, "function")}
