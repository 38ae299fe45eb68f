"""Session-wide state of a harness run: options, selected targets, open devices, KPI records."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cache import ArtifactCache
from harness.devices import DevicesFile, DeviceSpec
from harness.pipeline import Target
from harness.runner.client import DeviceRunner
from harness.transports import Transport, open_transport


@dataclass(frozen=True)
class StepRecord:
    """One line of --kpi-json: a step's outcome and KPIs for one device × model."""

    device: str
    soc: str
    model: str
    step: str
    outcome: str
    kpis: dict[str, Any]
    message: str = ""


class DevicePool:
    """Opens each device's transport once per session and closes (and cleans) them at the end."""

    def __init__(self, cache: ArtifactCache, keep_files: bool = False) -> None:
        self._cache = cache
        self._keep = keep_files
        self._runners: dict[str, DeviceRunner] = {}

    def runner(self, device: DeviceSpec, devices: DevicesFile) -> DeviceRunner:
        """Return the runner for device, connecting on first use."""
        if device.id not in self._runners:
            transport = open_transport(device, devices.soc(device.soc), self._cache.root / "emulator")
            self._runners[device.id] = DeviceRunner(transport)
        return self._runners[device.id]

    def close(self) -> None:
        """Clean up every device's work directory (unless kept) and close the transports."""
        for runner in self._runners.values():
            transport: Transport = runner.transport
            try:
                if not self._keep:
                    transport.cleanup()
            finally:
                transport.close()
        self._runners.clear()


@dataclass
class HarnessSession:
    """What the pytest plugin keeps in config.stash."""

    devices: DevicesFile
    targets: list[Target]
    cache: ArtifactCache
    pool: DevicePool
    kpi_json: Path | None = None
    records: list[StepRecord] = field(default_factory=list)

    def write_kpi_json(self) -> None:
        """Write the records to --kpi-json atomically (no-op without the option)."""
        if self.kpi_json is None:
            return
        self.kpi_json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"records": [r.__dict__ for r in self.records]}
        fd, tmp = tempfile.mkstemp(dir=self.kpi_json.parent, prefix=".kpi-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2, default=_json_default)
        os.replace(tmp, self.kpi_json)


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def json_safe(value: Any) -> Any:
    """Return value converted to plain JSON types (numpy scalars, paths, tuples)."""
    return json.loads(json.dumps(value, default=_json_default, allow_nan=True))
