"""Session-wide state of a harness run: options, selected targets, open devices, KPI records."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cache import ArtifactCache
from harness.errors import DeviceLostError, HarnessError
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
    """Opens each device's transport once per session and closes (and cleans) them at the end.

    A device that cannot be connected, or whose transport lost it mid-run (DeviceLostError), is
    taken out of the session: failure() says why, and runner() refuses it from then on.
    """

    def __init__(self, cache: ArtifactCache, keep_files: bool = False) -> None:
        self._cache = cache
        self._keep = keep_files
        self._runners: dict[str, DeviceRunner] = {}
        self._failed: dict[str, str] = {}

    def runner(self, device: DeviceSpec, devices: DevicesFile) -> DeviceRunner:
        """Return the runner for device, connecting on first use.

        Raises DeviceLostError for a device taken out of the session, the connect error otherwise.
        """
        reason = self.failure(device.id)
        if reason is not None:
            raise DeviceLostError(f"device {device.id} was taken out of the session after: {reason}",
                                  device=device.id)
        if device.id not in self._runners:
            try:
                transport = open_transport(device, devices.soc(device.soc), self._cache.root / "emulator")
            except HarnessError as e:
                self.mark_failed(device.id, f"connecting failed: {str(e).splitlines()[0]}")
                raise
            runner = DeviceRunner(transport)
            if device.telemetry.enabled:  # the device's idle temperatures, before any work (cooldown's reference)
                from harness.cooldown import read_temps

                runner.idle_temps_c = read_temps(transport)
            self._runners[device.id] = runner
        return self._runners[device.id]

    def mark_failed(self, device_id: str, reason: str) -> None:
        """Take device_id out of the session (the first reason given is kept)."""
        self._failed.setdefault(device_id, reason)

    def failure(self, device_id: str) -> str | None:
        """Return why device_id was taken out of the session, or None while it is in."""
        if device_id in self._failed:
            return self._failed[device_id]
        runner = self._runners.get(device_id)
        lost = getattr(runner.transport, "lost_reason", None) if runner is not None else None
        if lost is not None:
            self._failed[device_id] = lost
        return lost

    def close(self) -> None:
        """Clean up every device's work directory (unless kept or lost) and close the transports."""
        errors: list[str] = []
        for device_id, runner in self._runners.items():
            transport: Transport = runner.transport
            try:
                if not self._keep and self.failure(device_id) is None:
                    transport.cleanup()
            except HarnessError as e:  # one device's cleanup must not stop the others'
                errors.append(f"{device_id}: {e}")
            finally:
                transport.close()
        self._runners.clear()
        if errors:
            warnings.warn("could not clean up the work directory of " + "; ".join(errors), stacklevel=2)


@dataclass
class HarnessSession:
    """What the pytest plugin keeps in config.stash."""

    devices: DevicesFile
    targets: list[Target]
    cache: ArtifactCache
    pool: DevicePool
    kpi_json: Path | None = None
    records: list[StepRecord] = field(default_factory=list)
    accuracy: Any = None  # harness.steps.sweep.AccuracyOptions, set by harness.plugin.accuracy
    validation: Any = None  # harness.validation.ValidationOptions, set by harness.plugin.validation
    onboardings: dict[str, Any] = field(default_factory=dict)

    def onboarding(self, target: Target):  # type: ignore[no-untyped-def]
        """Return the Onboarding pipeline of target (one per target in the session; connects the device)."""
        from harness.pipeline import Onboarding

        if target.id not in self.onboardings:
            runner = self.pool.runner(target.device, self.devices)
            self.onboardings[target.id] = Onboarding(target, runner, self.cache, accuracy=self.accuracy,
                                                     validation=self.validation)
        return self.onboardings[target.id]

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
