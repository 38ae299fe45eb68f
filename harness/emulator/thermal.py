"""A thermal and power *model* of a Snapdragon SoC under load, written as sysfs-shaped files.

The emulator devices (the local sandbox transport and the emulated adb device) have no sensors,
so they expose what a phone's kernel would, computed from this model, under their sandbox::

    <sandbox>/sys/class/thermal/thermal_zone<N>/type      e.g. "nsphvx-0"
    <sandbox>/sys/class/thermal/thermal_zone<N>/temp      millidegrees Celsius, e.g. "41250"
    <sandbox>/sys/class/power_supply/battery/current_now  µA, negative while discharging
    <sandbox>/sys/class/power_supply/battery/voltage_now  µV

The harness reads them with the same code (and the same remote command) it uses on a real
device; every reading taken from them is labelled ``emulated``.

The model
---------
The SoC draws ``idle_power_w`` while no command runs on the device and ``load_power_w`` while
at least one does. Two first-order RC nodes integrate that power (exactly, piecewise constant):

* the die: ``C_die dT/dt = P - (T - T_ambient) / R_die``  (time constant R_die·C_die, ~20 s)
* the skin/board: the same with ``R_skin``, ``C_skin``   (time constant ~3 min)

Each thermal zone reads ambient plus a fixed share of one node's rise (the NPU zones the full
die rise, CPU/GPU/DDR less, ``sys-therm-0`` the skin node). The battery is a constant-voltage
source with a small internal resistance: ``V = V0 - I·R_int`` and ``P = V·I``. The parameters live in the SoC catalog
(``thermal:`` in devices.yaml); they are round numbers chosen to look like a phone, **not
measurements**.
"""

from __future__ import annotations

import math
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator

THERMAL_DIR = "sys/class/thermal"
BATTERY_DIR = "sys/class/power_supply/battery"
BATTERY_INTERNAL_OHM = 0.12


@dataclass(frozen=True)
class ThermalParams:
    """Parameters of the model for one SoC (see the module docstring)."""

    ambient_c: float = 25.0
    idle_power_w: float = 0.9
    load_power_w: float = 5.0
    r_die_c_per_w: float = 9.0
    c_die_j_per_c: float = 2.2
    r_skin_c_per_w: float = 5.0
    c_skin_j_per_c: float = 36.0
    battery_voltage_v: float = 3.87

    @classmethod
    def from_spec(cls, spec: Any) -> "ThermalParams":
        """Return params from a catalog entry's `thermal` (pydantic model, dict or None)."""
        if spec is None:
            return cls()
        data = spec if isinstance(spec, dict) else spec.model_dump() if hasattr(spec, "model_dump") else vars(spec)
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in data.items() if k in names and v is not None})


@dataclass(frozen=True)
class Zone:
    """One emulated thermal zone: its sysfs type and which node (share of its rise) it reads."""

    type: str
    node: str  # "die" or "skin"
    share: float


ZONES: tuple[Zone, ...] = (
    Zone("cpuss-0", "die", 0.80),
    Zone("cpuss-1", "die", 0.78),
    Zone("gpuss-0", "die", 0.65),
    Zone("nsphvx-0", "die", 1.00),
    Zone("nsphmx-0", "die", 0.96),
    Zone("ddr", "die", 0.55),
    Zone("sys-therm-0", "skin", 1.00),
)
"""Zones of the emulated SoC, in thermal_zone<N> order (Qualcomm zone names)."""


class ThermalModel:
    """Die and skin temperatures and battery readings of one emulated SoC over time."""

    def __init__(self, params: ThermalParams, clock: Callable[[], float] = time.monotonic) -> None:
        self.params = params
        self._clock = clock
        self._busy = 0
        self._t = clock()
        # Start at the idle steady state: the device has been switched on for a while.
        self.die_c = params.ambient_c + params.idle_power_w * params.r_die_c_per_w
        self.skin_c = params.ambient_c + params.idle_power_w * params.r_skin_c_per_w

    @property
    def busy(self) -> bool:
        """Return whether a command is running (the SoC is under load)."""
        return self._busy > 0

    def power_w(self) -> float:
        """Return the SoC power draw now, in watts."""
        return self.params.load_power_w if self.busy else self.params.idle_power_w

    def advance(self, now: float | None = None) -> None:
        """Integrate the temperatures up to `now` (monotonic seconds) at the current power."""
        now = self._clock() if now is None else now
        dt = now - self._t
        if dt <= 0:
            return
        p = self.params
        power = self.power_w()
        self.die_c = _relax(self.die_c, p.ambient_c + power * p.r_die_c_per_w, dt, p.r_die_c_per_w * p.c_die_j_per_c)
        self.skin_c = _relax(self.skin_c, p.ambient_c + power * p.r_skin_c_per_w, dt,
                             p.r_skin_c_per_w * p.c_skin_j_per_c)
        self._t = now

    def begin_load(self) -> None:
        """Mark one more command as running (integrating the idle/busy time before it)."""
        self.advance()
        self._busy += 1

    def end_load(self) -> None:
        """Mark one running command as finished."""
        self.advance()
        self._busy = max(0, self._busy - 1)

    def zone_temps_c(self) -> list[tuple[str, float]]:
        """Return (zone type, °C) for every zone in ZONES order."""
        amb = self.params.ambient_c
        return [(z.type, amb + z.share * ((self.die_c if z.node == "die" else self.skin_c) - amb)) for z in ZONES]

    def battery(self) -> tuple[int, int]:
        """Return (current_now µA, negative while discharging; voltage_now µV)."""
        v0, r, power = self.params.battery_voltage_v, BATTERY_INTERNAL_OHM, self.power_w()
        # P = V·I with V = V0 - I·R: the smaller root of R·I² - V0·I + P = 0.
        current_a = (v0 - math.sqrt(max(0.0, v0 * v0 - 4 * r * power))) / (2 * r)
        voltage_v = v0 - current_a * r
        return -round(current_a * 1e6), round(voltage_v * 1e6)


def _relax(value: float, target: float, dt: float, tau_s: float) -> float:
    """Return a first-order system's value after dt seconds heading for target."""
    return target + (value - target) * math.exp(-dt / tau_s)


class EmulatedSensors:
    """The thermal model of a device plus the sysfs-shaped files under its sandbox.

    Thread-safe. ``with sensors.load(): ...`` around a command; ``refresh()`` before a read. The
    emulated adb device refreshes before it starts each shell and before that shell counts as
    load, so a telemetry read shows the device as the other commands leave it, not itself.
    """

    def __init__(self, sandbox: Path, params: ThermalParams,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(sandbox)
        self.model = ThermalModel(params, clock)
        self._lock = threading.Lock()
        self._write_static()
        self.refresh()

    def _write_static(self) -> None:
        for index, zone in enumerate(ZONES):
            d = self.root / THERMAL_DIR / f"thermal_zone{index}"
            d.mkdir(parents=True, exist_ok=True)
            _write(d / "type", zone.type + "\n")
            _write(d / "mode", "enabled\n")
        battery = self.root / BATTERY_DIR
        battery.mkdir(parents=True, exist_ok=True)
        _write(battery / "type", "Battery\n")
        _write(battery / "status", "Discharging\n")
        _write(battery / "capacity", "80\n")

    def refresh(self) -> None:
        """Advance the model to now and rewrite the temp, current_now and voltage_now files."""
        with self._lock:
            self.model.advance()
            for index, (_zone, temp_c) in enumerate(self.model.zone_temps_c()):
                _write(self.root / THERMAL_DIR / f"thermal_zone{index}" / "temp", f"{round(temp_c * 1000)}\n")
            current_ua, voltage_uv = self.model.battery()
            battery = self.root / BATTERY_DIR
            _write(battery / "current_now", f"{current_ua}\n")
            _write(battery / "voltage_now", f"{voltage_uv}\n")

    def begin_load(self) -> None:
        """A command started on the device (the files change at the next refresh())."""
        with self._lock:
            self.model.begin_load()

    def end_load(self) -> None:
        """A command on the device finished (the files change at the next refresh())."""
        with self._lock:
            self.model.end_load()

    @contextmanager
    def load(self) -> Iterator[None]:
        """Hold the device under load for the duration of the block."""
        self.begin_load()
        try:
            yield
        finally:
            self.end_load()


def _write(path: Path, text: str) -> None:
    """Replace path's content atomically (a reader never sees a half-written value)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def catalog_params(soc_id: str) -> ThermalParams:
    """Return the thermal parameters of soc_id from the harness SoC catalog (defaults if absent)."""
    try:
        from harness.devices import load_catalog

        socs = load_catalog().socs
    except Exception:  # the emulator must run without a readable catalog
        return ThermalParams()
    entry = socs.get(soc_id.lower())
    return ThermalParams.from_spec(getattr(entry, "thermal", None))
