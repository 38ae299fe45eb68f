"""Cooldown before a measurement (MLPerf Mobile cools the device between runs): wait until the hottest
NPU/CPU zone is back within a margin of its idle temperature, or has stopped cooling, or a maximum wait.

The idle temperature of a device is its first reading in the session (DevicePool takes it when it
connects, before any work); a device that settles above it (a warmer room, a warm start) ends the
cooldown once its temperature stops falling.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from harness.errors import DeviceLostError, DeviceTimeoutError, TransportError
from harness.telemetry import TelemetrySampler, zone_kind

if TYPE_CHECKING:
    from harness.transports.base import Transport

POLL_S = 1.0
SETTLE_WINDOW_S = 10.0  # "stopped cooling": it fell less than SETTLE_DROP_C over this long
SETTLE_DROP_C = 0.2


@dataclass(frozen=True)
class Cooldown:
    """How a cooldown went: the zone watched, its idle reference, temperatures at start and end, the wait."""

    reason: str  # reached | settled | max_wait | no thermal zones
    waited_s: float
    margin_c: float
    max_wait_s: float
    zone: str | None = None
    idle_temp_c: float | None = None
    start_temp_c: float | None = None
    end_temp_c: float | None = None

    def kpis(self) -> dict[str, Any]:
        """Return the cooldown as the `cooldown` KPI."""
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def core_temps(temps_c: dict[str, float]) -> dict[str, float]:
    """Return the NPU and CPU zones of a reading (all zones when it has neither)."""
    core = {z: t for z, t in temps_c.items() if zone_kind(z) in ("npu", "cpu")}
    return core or dict(temps_c)


def read_temps(transport: "Transport") -> dict[str, float]:
    """Return one reading of the device's zones (°C by zone; empty when it has none or cannot be read)."""
    try:
        return TelemetrySampler(transport).sample_once().temps_c
    except (DeviceLostError, DeviceTimeoutError):
        raise
    except TransportError:
        return {}


def _excess(temps: dict[str, float], idle: dict[str, float]) -> tuple[str, float, float]:
    """Return (zone, temperature, its idle reference) of the core zone farthest above its idle temperature."""
    core = core_temps(temps)
    zone = max(core, key=lambda z: core[z] - idle.get(z, core[z]))
    return zone, core[zone], idle.get(zone, core[zone])


def cool_down(transport: "Transport", idle_temps_c: dict[str, float] | None, margin_c: float, max_wait_s: float,
              poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> Cooldown:
    """Wait until every NPU/CPU zone is within margin_c of its idle temperature (reason 'reached'), or the
    hottest has fallen less than SETTLE_DROP_C in SETTLE_WINDOW_S ('settled'), or max_wait_s passed
    ('max_wait'); return what happened. Without an idle reference the first reading is the reference."""
    start = clock()
    temps = read_temps(transport)
    if not temps:
        return Cooldown("no thermal zones", 0.0, margin_c, max_wait_s)
    idle = dict(idle_temps_c or {}) or dict(temps)
    zone, first_c, ref_c = _excess(temps, idle)
    history: list[tuple[float, float]] = [(0.0, first_c)]
    while True:
        zone, now_c, ref_c = _excess(temps, idle)
        waited = clock() - start
        if now_c <= ref_c + margin_c:
            reason = "reached"
        elif waited >= SETTLE_WINDOW_S and _settled(history, waited):
            reason = "settled"
        elif waited >= max_wait_s:
            reason = "max_wait"
        else:
            sleep(min(poll_s, max(0.0, max_wait_s - waited)))
            temps = read_temps(transport) or temps
            history.append((clock() - start, max(core_temps(temps).values())))
            continue
        return Cooldown(reason, waited, margin_c, max_wait_s, zone, ref_c, first_c, now_c)


def _settled(history: list[tuple[float, float]], now_s: float) -> bool:
    """Return whether the hottest core temperature fell less than SETTLE_DROP_C over the last SETTLE_WINDOW_S."""
    earlier = [c for t, c in history if t <= now_s - SETTLE_WINDOW_S]
    return bool(earlier) and earlier[-1] - history[-1][1] < SETTLE_DROP_C
