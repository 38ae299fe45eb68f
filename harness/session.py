"""Session-wide state of a harness run: options, selected targets, open devices, KPI records."""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cache import ArtifactCache
from harness.clock import now_iso
from harness.devices import DevicesFile, DeviceSpec
from harness.errors import DeviceLostError, DeviceQuarantinedError, HarnessError
from harness.farm.cooldown import read_temps
from harness.farm.health import DEFAULT_MIN_FREE_MB, check_health
from harness.farm.state import MAX_TRANSPORT_FAILURES, FarmState, Quarantine
from harness.files import write_text_atomically
from harness.json_values import json_default
from harness.llm.pipeline import LlmOnboarding
from harness.options import AccuracyOptions, ValidationOptions
from harness.pipeline import Onboarding
from harness.reporting.records import StepRecord
from harness.runner.client import DEFAULT_COMMAND_TIMEOUT_S, DeviceRunner
from harness.target import Target
from harness.transports import Transport, open_transport
from harness.transports.emulator import emulator_root
from harness.versions import tool_versions


class DevicePool:
    """Opens each device's transport once per session, checks its health before first use, and closes (and
    cleans) them at the end.

    A device that cannot be connected, fails its health check (harness.farm.health), was lost by its
    transport (DeviceLostError), or whose step tests failed with transport errors MAX_TRANSPORT_FAILURES
    times in a row is quarantined: failure() says why, runner() refuses it from then on, and with a farm
    state file the quarantine is recorded there for later runs.
    """

    def __init__(self, cache: ArtifactCache, keep_files: bool = False, farm: "FarmState | None" = None,
                 health_check: bool = True, min_free_mb: float | None = None,
                 command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S) -> None:
        self._cache = cache
        self._keep = keep_files
        self.farm = farm or FarmState(None)
        self.health_check = health_check
        self.min_free_mb = DEFAULT_MIN_FREE_MB if min_free_mb is None else min_free_mb
        self.command_timeout_s = command_timeout_s
        self._runners: dict[str, DeviceRunner] = {}
        self._failed: dict[str, str] = {}
        self.quarantines: dict[str, "Quarantine"] = dict(self.farm.quarantined())  # from earlier runs
        self.health: dict[str, dict] = {}
        self._transport_failures: dict[str, int] = {}

    def runner(self, device: DeviceSpec, devices: DevicesFile) -> DeviceRunner:
        """Return the runner for device, connecting and health-checking it on first use.

        Raises DeviceQuarantinedError for a quarantined device (an earlier run's, or a failed health check),
        DeviceLostError for a device taken out of the session, the connect error otherwise.
        """
        if device.id in self.quarantines and device.id not in self._failed:
            raise DeviceQuarantinedError(f"device {device.id} is quarantined: {self.quarantines[device.id]}; "
                                         f"`--unquarantine {device.id}` puts it back", device=device.id)
        reason = self.failure(device.id)
        if reason is not None:
            kind = DeviceQuarantinedError if reason.startswith("health check failed") else DeviceLostError
            raise kind(f"device {device.id} was taken out of the session after: {reason}", device=device.id)
        if device.id not in self._runners:
            try:
                transport = open_transport(device, devices.soc(device.soc), emulator_root(self._cache.root))
            except HarnessError as e:
                self.mark_failed(device.id, f"connecting failed: {str(e).splitlines()[0]}")
                raise
            runner = DeviceRunner(transport, timeout_s=self.command_timeout_s)
            if device.telemetry.enabled:  # the device's idle temperatures, before any work (cooldown's reference)
                runner.idle_temps_c = read_temps(transport)
            self._runners[device.id] = runner
            if self.health_check:
                health = check_health(runner, self.min_free_mb)
                self.health[device.id] = health.as_dict()
                if not health.ok:
                    self.mark_failed(device.id, f"health check failed: {health.reason}")
                    raise DeviceQuarantinedError(f"device {device.id} was taken out of the session after: "
                                                 f"health check failed: {health.reason}", device=device.id)
        return self._runners[device.id]

    def mark_failed(self, device_id: str, reason: str) -> None:
        """Take device_id out of the session and quarantine it (the first reason given is kept)."""
        if device_id not in self._failed:
            self._failed[device_id] = reason
            self.quarantines[device_id] = self.farm.quarantine(device_id, reason)

    def failure(self, device_id: str) -> str | None:
        """Return why device_id was taken out of the session, or None while it is in."""
        if device_id in self._failed:
            return self._failed[device_id]
        runner = self._runners.get(device_id)
        lost = getattr(runner.transport, "lost_reason", None) if runner is not None else None
        if lost is not None:
            self.mark_failed(device_id, lost)
        return lost

    def note_step(self, device_id: str, transport_error: str | None) -> None:
        """Count a step test's transport error (None: the step ran without one); quarantine the device after
        MAX_TRANSPORT_FAILURES in a row."""
        if transport_error is None:
            self._transport_failures[device_id] = 0
            return
        count = self._transport_failures.get(device_id, 0) + 1
        self._transport_failures[device_id] = count
        if count >= MAX_TRANSPORT_FAILURES:
            self.mark_failed(device_id, f"{count} step tests in a row failed with transport errors, last: "
                                        f"{transport_error.splitlines()[0]}")

    def state(self, device: DeviceSpec) -> dict[str, Any]:
        """Return the device's farm status: healthy (used), quarantined (and why, since when), or unused."""
        failure = self.failure(device.id)
        quarantine = self.quarantines.get(device.id)
        status = ("quarantined" if quarantine is not None or failure is not None else
                  "healthy" if device.id in self._runners else "unused")
        return {"id": device.id, "soc": device.soc, "transport": device.transport, "status": status,
                "reason": failure or (quarantine.reason if quarantine else None),
                "since": quarantine.since if quarantine else None,
                "expires": quarantine.expires if quarantine else None,
                "health": self.health.get(device.id)}

    def close(self) -> None:
        """Stop every device's persistent runner, clean up its work directory (unless kept or lost) and close
        the transports."""
        errors: list[str] = []
        for device_id, runner in self._runners.items():
            transport: Transport = runner.transport
            try:
                runner.close()
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
    accuracy: AccuracyOptions = field(default_factory=AccuracyOptions)  # set by harness.plugin.accuracy
    validation: ValidationOptions = field(default_factory=ValidationOptions)  # set by harness.plugin.validation
    onboardings: dict[str, Any] = field(default_factory=dict)
    locks: Any = None  # harness.farm.locks.DeviceLocks
    released: list[str] = field(default_factory=list)  # devices --unquarantine took out of the farm state
    device_states: dict[str, dict] = field(default_factory=dict)  # the latest farm status per device
    started_at: str = field(default_factory=now_iso)
    started_monotonic: float = field(default_factory=time.monotonic)

    def onboarding(self, target: Target) -> Onboarding | LlmOnboarding:
        """Return the pipeline of target, by its model's kind: LlmOnboarding for kind llm, else Onboarding (one
        per target in the session; connects the device)."""
        if target.id not in self.onboardings:
            runner = self.pool.runner(target.device, self.devices)
            self.onboardings[target.id] = (
                LlmOnboarding(target, runner, self.cache, validation=self.validation) if target.model.is_llm else
                Onboarding(target, runner, self.cache, accuracy=self.accuracy, validation=self.validation))
        return self.onboardings[target.id]

    def write_kpi_json(self) -> None:
        """Write the records to --kpi-json atomically (no-op without the option)."""
        if self.kpi_json is None:
            return
        payload = {"records": [r.to_json() for r in self.records], "devices": self.device_summary(),
                   "environment": environment(self.started_at, time.monotonic() - self.started_monotonic)}
        write_text_atomically(self.kpi_json, json.dumps(payload, indent=2, default=json_default))

    def device_summary(self) -> list[dict[str, Any]]:
        """Return each selected device's farm status (from this process's pool, or the workers' reports)."""
        seen: dict[str, dict] = {}
        for target in self.targets:
            if target.device.id not in seen:
                state = self.pool.state(target.device)
                reported = self.device_states.get(target.device.id)
                if reported is not None and (state["status"] == "unused" or reported["status"] == "quarantined"):
                    state = {**state, **reported}
                seen[target.device.id] = state
        return list(seen.values())


def environment(started_at: str, duration_s: float) -> dict[str, Any]:
    """Return the versions a sign-off records (harness, onnxruntime, QNN EP and SDK, Python, platform) and the
    run's start time and duration."""
    return {**tool_versions(), "started_at": started_at, "duration_s": round(duration_s, 1)}
