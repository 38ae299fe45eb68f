"""The sign-off's inputs: --kpi-json files and Allure results directories of one or several runs, merged
into one record per device x model x step, with the charts the steps attached and each run's environment."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from harness.devices import builtin_catalog_data
from harness.errors import HarnessError
from harness.reporting.names import (DEVICE, ENVIRONMENT_NAMES, INCONCLUSIVE, MARGINAL, MODEL, SOC, STEP_PREFIX,
                                     kpi_attachment, split_soc_parameter, status_text)
from harness.reporting.records import Chart, StepRecord
from harness.reporting.report_cli import read_result_files, result_parameters
from harness.versions import tool_versions

NOT_RUN = "not run"
_ALLURE_STATUS = {"passed": "passed", "failed": "failed", "broken": "error", "skipped": "skipped"}
_ENV_KEYS = {name: key for key, name in ENVIRONMENT_NAMES.items()}


class SignoffInputError(HarnessError):
    """A sign-off input is missing, holds no results, or is not readable as a KPI JSON or Allure results."""


@dataclass(frozen=True)
class DeviceState:
    """A device's farm status as the run's KPI JSON recorded it (healthy, quarantined, unhealthy, unused)."""

    id: str
    soc: str
    transport: str
    status: str
    reason: str
    since: str
    source: str

    @property
    def out_of_service(self) -> bool:
        """Return True for a quarantined or unhealthy device."""
        return self.status in ("quarantined", "unhealthy")


@dataclass(frozen=True)
class RunInfo:
    """One RESULTS argument: what it held, and the versions and times its run recorded."""

    source: str
    kinds: tuple[str, ...]
    environment: dict[str, Any]
    devices: tuple[str, ...]
    records: int


@dataclass
class RunSet:
    """Every input merged: one StepRecord per device x model x step (with its source and charts), the runs, the
    devices' farm states."""

    results: list[StepRecord]
    runs: list[RunInfo]
    devices: list[DeviceState]
    soc_names: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _index: dict[tuple[str, str, str], StepRecord] = field(default_factory=dict, init=False, repr=False)

    def targets(self) -> list[tuple[str, str, str]]:
        """Return the (device, soc, model) triples the results cover, in first-seen order."""
        seen: dict[tuple[str, str], str] = {}
        for r in self.results:
            seen.setdefault((r.device, r.model), r.soc)
        return [(d, soc, m) for (d, m), soc in seen.items()]

    def result(self, device: str, model: str, step: str) -> StepRecord | None:
        """Return the record of device x model x step, or None when there is none."""
        if len(self._index) != len(self.results):
            self._index = {r.key: r for r in self.results}
        return self._index.get((device, model, step))


@dataclass(frozen=True)
class _Loaded:
    records: list[StepRecord]
    environment: dict[str, Any]
    devices: list[DeviceState]
    soc_names: dict[str, str]


def load_runs(paths: Iterable[Path]) -> RunSet:
    """Return the merged RunSet of the given --kpi-json files, --alluredir directories and directories
    holding kpi.json and allure-results/.

    Raises SignoffInputError naming the path that is missing, holds no results or cannot be read (RecordError:
    a KPI JSON record that lacks a key).
    """
    kpi_by_key: dict[tuple[str, str, str], StepRecord] = {}
    allure_by_key: dict[tuple[str, str, str], StepRecord] = {}
    runs: list[RunInfo] = []
    devices: dict[str, DeviceState] = {}
    soc_names: dict[str, str] = {}
    notes: list[str] = []
    for path in paths:
        arg = _load_argument(Path(path))
        runs.append(arg.run)
        _merge_into(kpi_by_key, arg.kpi, notes)
        _merge_into(allure_by_key, arg.allure, notes)
        devices.update({d.id: d for d in arg.devices})
        soc_names.update(arg.soc_names)
    if not runs:
        raise SignoffInputError("no RESULTS given: pass --kpi-json files or --alluredir directories")
    results = [_combine(kpi_by_key.get(key), allure_by_key.get(key)) for key in {**kpi_by_key, **allure_by_key}]
    if not results:
        raise SignoffInputError(f"no step records in {', '.join(r.source for r in runs)}: "
                                "run the suites with --kpi-json PATH or --alluredir DIR")
    return RunSet(results, runs, list(devices.values()), {**_catalog_names(), **soc_names}, notes)


def _merge_into(merged: dict[tuple[str, str, str], StepRecord], records: list[StepRecord], notes: list[str]) -> None:
    """Add records; of one device x model x step in two inputs, the later input's is kept (noted)."""
    for r in records:
        earlier = merged.get(r.key)
        if earlier is not None and earlier.source != r.source:
            notes.append(f"{' / '.join(r.key)} is in {earlier.source} and {r.source}: {r.source}'s is kept")
        merged[r.key] = r


def _combine(kpi: StepRecord | None, allure: StepRecord | None) -> StepRecord:
    """Return the KPI JSON record (the run's own verdict) with the Allure result's charts, or either alone."""
    if kpi is None:
        return allure  # type: ignore[return-value]
    if allure is None:
        return kpi
    return replace(kpi, charts=allure.charts, message=kpi.message or allure.message,
                   kpis=kpi.kpis or allure.kpis, soc=kpi.soc or allure.soc, marginal=kpi.marginal or allure.marginal)


@dataclass(frozen=True)
class _Argument:
    """What one RESULTS argument held: its run, its KPI JSON and Allure records, device states, SoC names."""

    run: RunInfo
    kpi: list[StepRecord]
    allure: list[StepRecord]
    devices: list[DeviceState]
    soc_names: dict[str, str]


def _load_argument(path: Path) -> _Argument:
    if not path.exists():
        raise SignoffInputError(f"{path}: no such file or directory (expected a --kpi-json file or an "
                                "--alluredir directory)")
    kpi_files, allure_dirs = _sources(path)
    kpi: list[StepRecord] = []
    allure: list[StepRecord] = []
    environment: dict[str, Any] = {}
    states: list[DeviceState] = []
    names: dict[str, str] = {}
    for d in allure_dirs:
        loaded = load_allure_results(d)
        allure += loaded.records
        environment = {**loaded.environment, **environment}
        names.update(loaded.soc_names)
    for f in kpi_files:  # the run's own environment wins over what the Allure results give
        loaded = load_kpi_json(f)
        kpi += loaded.records
        environment = {**environment, **{k: v for k, v in loaded.environment.items() if v not in (None, "")}}
        states += loaded.devices
    environment = _with_qnn_sdk(environment, kpi + allure)
    devices = tuple(dict.fromkeys(r.device for r in kpi + allure))
    kinds = tuple(["kpi-json"] * bool(kpi_files) + ["allure"] * bool(allure_dirs))
    run = RunInfo(_label(path), kinds, environment, devices, len({r.key for r in kpi + allure}))
    return _Argument(run, kpi, allure, states, names)


def _label(path: Path) -> str:
    """Return how the page names an input: as given, or absolute when given as '.' or '..'."""
    return str(path.resolve()) if path.name in ("", ".", "..") else str(path)


def _with_qnn_sdk(environment: dict[str, Any], records: list[StepRecord]) -> dict[str, Any]:
    """Return the environment with the QNN SDK version: as recorded, else the one the run's context binaries
    were built with, else the one this machine's onnxruntime-qnn bundles when the run used that same version."""
    if environment.get("qnn_sdk"):
        return environment
    built = next((str(r.kpis["qnn_sdk"]) for r in records if r.step == "context_binary" and r.kpis.get("qnn_sdk")),
                 None)
    if built is not None:
        return {**environment, "qnn_sdk": f"{built} (context binaries)"}
    local = tool_versions()
    if environment.get("onnxruntime_qnn") and environment["onnxruntime_qnn"] == local["onnxruntime_qnn"] \
            and local["qnn_sdk"]:
        return {**environment, "qnn_sdk": f"{local['qnn_sdk']} (bundled with onnxruntime-qnn)"}
    return environment


def _sources(path: Path) -> tuple[list[Path], list[Path]]:
    """Return the KPI JSON files and Allure results directories an argument stands for."""
    if path.is_file():
        return [path], []
    if _is_allure_dir(path):
        return [], [path]
    kpi = [path / "kpi.json"] if (path / "kpi.json").is_file() else []
    allure = [d for d in sorted(path.iterdir()) if d.is_dir() and _is_allure_dir(d)]
    if not kpi and not allure:
        raise SignoffInputError(f"{path}: no results found: expected *-result.json files (pytest --alluredir), "
                                "or a kpi.json (pytest --kpi-json) and/or an allure-results/ directory in it")
    return kpi, allure


def _is_allure_dir(path: Path) -> bool:
    return any(path.glob("*-result.json"))


def load_kpi_json(path: Path) -> _Loaded:
    """Return the step records, environment and device states of a --kpi-json file.

    Raises SignoffInputError naming the file when it is not JSON or not a KPI JSON, RecordError naming a record
    that lacks a key or holds an unknown outcome.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise SignoffInputError(f"{path}: cannot read the KPI JSON ({e})") from None
    except json.JSONDecodeError as e:
        raise SignoffInputError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                                "re-run pytest with --kpi-json to rewrite it") from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise SignoffInputError(f"{path}: not a KPI JSON: expected an object with a \"records\" list "
                                "(written by pytest --kpi-json)")
    records = [StepRecord.from_json(rec, f"{path}: record {i}", str(path)) for i, rec in enumerate(data["records"])]
    environment = data.get("environment") if isinstance(data.get("environment"), dict) else {}
    devices = [_device_state(path, d) for d in data.get("devices") or [] if isinstance(d, dict) and d.get("id")]
    return _Loaded(records, dict(environment), devices, {})


def _device_state(path: Path, d: dict[str, Any]) -> DeviceState:
    return DeviceState(str(d["id"]), str(d.get("soc") or ""), str(d.get("transport") or ""),
                       str(d.get("status") or "unknown"), str(d.get("reason") or ""), str(d.get("since") or ""),
                       str(path))


def load_allure_results(results: Path) -> _Loaded:
    """Return the step records (outcome, message, KPIs from the '<step> KPIs' attachment, PNG charts) of an
    Allure results directory, the run's times and the environment.properties there.

    Raises SignoffInputError naming a result or attachment file that cannot be read.
    """
    try:
        files = read_result_files(results)
    except HarnessError as e:
        raise SignoffInputError(str(e)) from None
    by_key: dict[tuple[str, str, str], StepRecord] = {}
    names: dict[str, str] = {}
    for path, result in files:
        record = _allure_record(results, path, result, names)
        if record is not None and record.finished_ms >= by_key.get(record.key, record).finished_ms:
            by_key[record.key] = record  # a retry's later result wins
    environment = {**_read_properties(results / "environment.properties"), **_run_times(r for _, r in files)}
    return _Loaded(list(by_key.values()), environment, [], names)


def _allure_record(results: Path, path: Path, result: dict[str, Any], names: dict[str, str]) -> StepRecord | None:
    params = result_parameters(result)
    if not params.get(DEVICE) or not params.get(MODEL):
        return None  # not a harness step test
    soc, soc_name = split_soc_parameter(params.get(SOC, ""))
    if soc_name:
        names[soc] = soc_name
    step = _allure_step(result)
    if step is None:
        return None
    outcome = _ALLURE_STATUS.get(str(result.get("status")), "error")
    message = str((result.get("statusDetails") or {}).get("message") or "")
    marginal: tuple[str, ...] = ()
    if (reasons := status_text(INCONCLUSIVE, message)) is not None and result.get("status") == "unknown":
        outcome, message = "inconclusive", reasons
    elif (verdicts := status_text(MARGINAL, message)) is not None and outcome == "passed":
        marginal, message = tuple(verdicts.splitlines()), ""
    attachments = list(_attachments(result))
    kpis = _kpi_attachment(results, step, attachments)
    charts = tuple(Chart(str(a.get("name") or "chart"), _read_attachment(results, a)) for a in attachments
                   if a.get("type") == "image/png" and _attachment_path(results, a).is_file())
    return StepRecord(params[DEVICE], soc, params[MODEL], step, outcome, kpis, message, marginal, str(path.parent),
                      charts, int(result.get("stop") or result.get("start") or 0))


def _allure_step(result: dict[str, Any]) -> str | None:
    """Return the onboarding step of a result: its 'onboarding step: X' step, else the test's name test_X[...]."""
    for step in result.get("steps") or []:
        name = str(step.get("name", ""))
        if name.startswith(STEP_PREFIX):
            return name[len(STEP_PREFIX):]
    name = str(result.get("name", "")).split("[", 1)[0]
    return name[len("test_"):] if name.startswith("test_") and len(name) > 5 else None


def _attachments(node: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for a in node.get("attachments") or []:
        if isinstance(a, dict) and a.get("source"):
            yield a
    for step in node.get("steps") or []:
        if isinstance(step, dict):
            yield from _attachments(step)


def _attachment_path(results: Path, attachment: dict[str, Any]) -> Path:
    return results / Path(str(attachment["source"])).name  # a file of the results directory, never elsewhere


def _read_attachment(results: Path, attachment: dict[str, Any]) -> bytes:
    path = _attachment_path(results, attachment)
    try:
        return path.read_bytes()
    except OSError as e:
        raise SignoffInputError(f"{path}: cannot read the attachment {attachment.get('name')!r} ({e})") from None


def _kpi_attachment(results: Path, step: str, attachments: list[dict[str, Any]]) -> dict[str, Any]:
    for a in attachments:
        if a.get("name") == kpi_attachment(step) and _attachment_path(results, a).is_file():
            try:
                kpis = json.loads(_read_attachment(results, a).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise SignoffInputError(f"{_attachment_path(results, a)}: the {step} KPIs attachment is not valid "
                                        f"JSON ({e})") from None
            return kpis if isinstance(kpis, dict) else {}
    return {}


def _read_properties(path: Path) -> dict[str, str]:
    """Return the key=value pairs of an environment.properties file (harness's key names mapped back)."""
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line or line[0] in "#!" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.replace("\\", "").strip()
        out[_ENV_KEYS.get(key, key)] = value.replace("\\n", "\n").replace("\\\\", "\\").strip()
    return out


def _run_times(results: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Return started_at (ISO 8601) and duration_s of the results' tests (first start to last stop)."""
    starts, stops = [], []
    for r in results:
        if isinstance(r.get("start"), (int, float)):
            starts.append(int(r["start"]))
        if isinstance(r.get("stop"), (int, float)):
            stops.append(int(r["stop"]))
    if not starts:
        return {}
    start = min(starts)
    started = datetime.fromtimestamp(start / 1000, tz=timezone.utc).isoformat(timespec="seconds")
    return {"started_at": started, "duration_s": round((max(stops or starts) - start) / 1000, 1)}


def _catalog_names() -> dict[str, str]:
    """Return the marketing name of each SoC of the packaged catalog (sm8650 -> Snapdragon 8 Gen 3)."""
    try:
        return {soc: str(spec.get("name")) for soc, spec in builtin_catalog_data().items()
                if isinstance(spec, dict) and spec.get("name")}
    except (HarnessError, OSError, ImportError):
        return {}
