"""The health check before a device's first use in a session: it connects (the transport checks the SoC against
devices.yaml), has free space in its work directory, the device runner starts there and imports onnxruntime (and
the QNN EP), and its thermal status is below SEVERE (Android's `dumpsys thermalservice`, else the hottest zone
below 100 °C)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from harness.errors import HarnessError, TransportError
from harness.farm.cooldown import read_temps

if TYPE_CHECKING:
    from harness.runner.client import DeviceRunner

DEFAULT_MIN_FREE_MB = 200.0
SEVERE_STATUS = 3  # Android's THERMAL_STATUS_SEVERE
SEVERE_TEMP_C = 100.0  # Qualcomm's thermal HAL: NPU SEVERE


@dataclass(frozen=True)
class Check:
    """One health check: its name, whether it passed, and what it saw."""

    name: str
    ok: bool
    detail: str


@dataclass
class Health:
    """A device's health check before first use."""

    device: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return all(c.ok for c in self.checks)

    @property
    def reason(self) -> str:
        """The failed checks, as one line."""
        return "; ".join(f"{c.name}: {c.detail}" for c in self.checks if not c.ok)

    def as_dict(self) -> dict:
        """Return the checks as plain data."""
        return {"device": self.device, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


_STATUS = re.compile(r"Thermal Status:\s*(\d+)")


def check_health(runner: "DeviceRunner", min_free_mb: float = DEFAULT_MIN_FREE_MB) -> Health:
    """Return the health of runner's (connected) device: free space, runner start-up, thermal status."""
    transport = runner.transport
    health = Health(transport.device_id, [Check("connect", True, f"{transport.device_id} connected, SoC "
                                                 f"{transport.soc.id} as devices.yaml says")])
    health.checks.append(_free_space(transport, min_free_mb))
    health.checks.append(_runner_starts(runner))
    health.checks.append(_thermal(transport))
    return health


def _free_space(transport, min_free_mb: float) -> Check:  # type: ignore[no-untyped-def]
    try:
        result = transport.read_command(["df", "-Pk", "."], timeout_s=30.0)
        fields = result.stdout.strip().splitlines()[-1].split()
        free_mb = int(fields[3]) / 1024.0
    except (TransportError, IndexError, ValueError) as e:
        return Check("free space", False, f"could not read it with `df -Pk` in the work directory: {e}")
    ok = free_mb >= min_free_mb
    return Check("free space", ok, f"{free_mb:.0f} MB free in the work directory"
                 + ("" if ok else f", needs at least {min_free_mb:g} MB"))


def _runner_starts(runner: "DeviceRunner") -> Check:
    if runner.transport.runner_kind == "qnn-net-run":
        return Check("runner", True, "qnn-net-run device: the SDK is pushed and checked at its first run")
    try:
        info = runner.self_check()
    except HarnessError as e:
        return Check("runner", False, f"the device runner does not start: {str(e).splitlines()[0]}")
    if not info.get("qnn_ep"):
        return Check("runner", False, f"the device runner started but the QNN execution provider is missing "
                                      f"({info.get('error') or 'pip install onnxruntime-qnn on the device'})")
    served = f", persistent (pid {info['pid']})" if info.get("pid") else ""
    return Check("runner", True, f"runner {info.get('runner_version')}{served}, onnxruntime {info.get('onnxruntime')}, "
                                 f"onnxruntime-qnn {info.get('onnxruntime_qnn')} on {info.get('machine')}")


def _thermal(transport) -> Check:  # type: ignore[no-untyped-def]
    if transport.platform == "android":
        try:
            out = transport.read_command(["dumpsys", "thermalservice"], timeout_s=30.0).stdout
        except TransportError:
            out = ""
        match = _STATUS.search(out)
        if match:
            status = int(match.group(1))
            return Check("thermal", status < SEVERE_STATUS, f"Android thermal status {status}"
                         + ("" if status < SEVERE_STATUS else " (SEVERE or worse: let it cool down)"))
    temps = read_temps(transport)
    if not temps:
        return Check("thermal", True, "no thermal status or zones to read")
    zone = max(temps, key=temps.get)
    ok = temps[zone] < SEVERE_TEMP_C
    return Check("thermal", ok, f"hottest zone {zone} at {temps[zone]:.1f} °C"
                 + ("" if ok else f" (>= {SEVERE_TEMP_C:g} °C: let it cool down)"))
