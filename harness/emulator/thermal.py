"""A thermal and power *model* of a Snapdragon SoC running NPU work, written as device-shaped files.

The emulator devices (the local sandbox transport and the emulated adb device) have no sensors,
so they expose what a phone's kernel and thermal service would, computed from this model, under
their sandbox::

    <sandbox>/sys/class/thermal/thermal_zone<N>/type      e.g. "nsphvx-0"
    <sandbox>/sys/class/thermal/thermal_zone<N>/temp      millidegrees Celsius, e.g. "41250"
    <sandbox>/sys/class/thermal/thermal_zone<N>/trip_point_0_{temp,type}   NPU zones: throttle trip, "passive"
    <sandbox>/sys/class/thermal/thermal_zone<N>/trip_point_1_{temp,type}   NPU zones: shutdown, "critical"
    <sandbox>/sys/class/power_supply/battery/current_now  µA, negative while discharging
    <sandbox>/sys/class/power_supply/battery/voltage_now  µV
    <sandbox>/sys/class/power_supply/battery/status       "Discharging" (written once; never by refresh())
    <sandbox>/system/bin/dumpsys                          `dumpsys thermalservice`, shaped like Android's

The harness reads them with the same code (and the same remote command) it uses on a real
device; every reading taken from them is labelled ``emulated``.

The NPU directory: how the device runner and the model talk
-----------------------------------------------------------
Every command an emulated device runs gets ``HARNESS_EMULATED_NPU_DIR`` (``<sandbox>/dev/harness-npu``)
in its environment. A runner process writes ``busy.<pid>`` there: one float, its cumulative
NPU-busy seconds since it started (atomically, at most every ~0.1 s and once at exit; one process
with several threads sums into one file). The model writes::

    throttle        the HTP slow-down factor now: "1", or throttle_factor (e.g. "2") while throttled
    thermal_status  Android's thermal status now, 0 (NONE) .. 6 (SHUTDOWN)
    zone_status     one line per thermal_zone<N>, in order: "<Android Temperature type> <status>"

The runner keeps the emulated HTP's modelled time (EmulatedNpu in harness/runner/device_runner.py,
harness.emulator.device_time): during a timed loop the modelled HTP is busy back to back on the wall clock,
so it reports the loop's wall time as busy (u = 1 whatever the simulator's speed), and while throttled each
modelled inference takes throttle times as long (modelled time; nothing sleeps). Over a soak's span of
length T at throttle f, T / (latency x f) modelled inferences run and P = idle + (load - idle) / f, so the
energy per inference above idle is (load - idle) x latency, throttled or not.

The model
---------
Each refresh reads every ``busy.*`` file and takes its increase since the last refresh (a file
the model has not seen counts from 0; files present when the model starts count from their value
then, so earlier work is not replayed). Files of processes that no longer exist are removed
once their last value is consumed. The busy fraction over the interval Δt since the last refresh
is ``u = min(1, busy / Δt)``: one NPU is at most fully busy. ``busy`` is the sum of the increases
plus work reported late: a runner reports at most every ~0.1 s (or once per long inference), so
an increase larger than the interval it lands in is carried into the following intervals rather
than cut at u = 1; the carried amount is bounded (see ``BUSY_BACKLOG_MIN_S``), so concurrent
processes cannot bank more than one NPU's work. The SoC power over the interval is::

    P = idle_power_w + (load_power_w - idle_power_w) · u / f     f = throttle_factor while throttled, else 1

(throttled, the HTP runs at lower clocks: the same work spread over f times longer). Commands
that run no NPU work (sha256sum, tar, cat) leave u = 0: they do not heat the device. Two
first-order RC nodes integrate that piecewise-constant power exactly:

* the die: ``C_die dT/dt = P - (T - T_ambient) / R_die``  (time constant R_die·C_die, ~20 s)
* the skin/board: the same with ``R_skin``, ``C_skin``   (time constant ~3 min)

Each thermal zone reads ambient plus a fixed share of one node's rise (the NPU zones the full
die rise, CPU/GPU/DDR less, ``sys-therm-0`` the skin node). After each interval the HTP starts
throttling when the NPU zone reaches ``throttle_trip_c`` and stops below ``throttle_clear_c``
(hysteresis). Android's thermal status comes from the hottest zone: LIGHT from
``status_light_margin_c`` below the trip point, MODERATE while throttled, SEVERE, CRITICAL,
EMERGENCY and SHUTDOWN from ``status_severe_c`` .. ``status_shutdown_c``. The devices refresh
the model before every command and telemetry read, and while at least one command runs
(``begin_load``/``end_load``) a background ticker refreshes it every ``TICK_S``.

The battery is a constant-voltage source with a small internal resistance: ``V = V0 - I·R_int``
and ``P = V·I``. When ``status`` reads "Charging" (a test may write it), a charger supplies
``CHARGER_CURRENT_A`` and current_now is the kernel's positive charging current, the charger's
current minus the load's (``V = V0 + I·R_int``). The parameters live in the SoC catalog
(``thermal:`` in harness/socs.yaml); they are round numbers chosen to look like a phone, **not
measurements**, and neither host CPU work outside the runner's loops nor the simulator's speed heats the model.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from enum import IntEnum
from pathlib import Path
from typing import Any, Callable, Iterator

from harness.files import replacing
from harness.shutdown import pid_alive

logger = logging.getLogger(__name__)

THERMAL_DIR = "sys/class/thermal"
BATTERY_DIR = "sys/class/power_supply/battery"
NPU_DIR = "dev/harness-npu"
DUMPSYS = "system/bin/dumpsys"
NPU_DIR_ENV = "HARNESS_EMULATED_NPU_DIR"
BATTERY_INTERNAL_OHM = 0.12
CHARGER_CURRENT_A = 3.0
TICK_S = 0.25
"""Refresh period of the background ticker while at least one command runs."""
MIN_INTERVAL_S = 0.1
"""Shortest interval the model advances over: runners report busy time every ~0.1 s, so over a shorter one (a
read_command's refresh just after the ticker's) the busy fraction would read 0 and the battery would show idle
power until the next refresh, while the model counted idle for only that instant: the readings lost energy."""
BUSY_BACKLOG_MIN_S = 1.0
"""Least late-reported busy time carried into later intervals (more when one report was larger)."""
_BUSY_FILE = re.compile(r"^busy\.(\d+)(\..+)?$")


class ThermalStatus(IntEnum):
    """Android's thermal status (PowerManager.THERMAL_STATUS_*)."""

    NONE = 0
    LIGHT = 1
    MODERATE = 2
    SEVERE = 3
    CRITICAL = 4
    EMERGENCY = 5
    SHUTDOWN = 6


@dataclass(frozen=True)
class ThermalParams:
    """Parameters of the model for one SoC (see the module docstring); raises ValueError if inconsistent."""

    ambient_c: float = 25.0
    idle_power_w: float = 1.0
    load_power_w: float = 6.6
    r_die_c_per_w: float = 12.0
    c_die_j_per_c: float = 1.5
    r_skin_c_per_w: float = 4.0
    c_skin_j_per_c: float = 45.0
    battery_voltage_v: float = 3.87
    throttle_trip_c: float = 95.0
    throttle_clear_c: float = 85.0
    throttle_factor: float = 2.0
    status_light_margin_c: float = 5.0
    status_severe_c: float = 100.0
    status_critical_c: float = 110.0
    status_emergency_c: float = 112.0
    status_shutdown_c: float = 115.0

    def __post_init__(self) -> None:
        if not self.throttle_clear_c < self.throttle_trip_c:
            raise ValueError(f"throttle_clear_c ({self.throttle_clear_c}) must be below throttle_trip_c "
                             f"({self.throttle_trip_c})")
        if self.throttle_factor < 1:
            raise ValueError(f"throttle_factor ({self.throttle_factor}) must be >= 1")
        ladder = (self.status_severe_c, self.status_critical_c, self.status_emergency_c, self.status_shutdown_c)
        if list(ladder) != sorted(ladder) or self.status_light_margin_c < 0:
            raise ValueError("status thresholds must rise: severe <= critical <= emergency <= shutdown, "
                             "and status_light_margin_c must be >= 0")

    @classmethod
    def from_spec(cls, spec: Any) -> "ThermalParams":
        """Return params from a catalog entry's `thermal` (pydantic model, dict or None)."""
        if spec is None:
            return cls()
        data = spec if isinstance(spec, dict) else spec.model_dump() if hasattr(spec, "model_dump") else vars(spec)
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in data.items() if k in names and v is not None})

    @property
    def light_c(self) -> float:
        """Return the temperature from which the status is LIGHT, °C."""
        return self.throttle_trip_c - self.status_light_margin_c


@dataclass(frozen=True)
class Zone:
    """One emulated thermal zone: its sysfs type, which node (share of its rise) it reads, its Android type."""

    type: str
    node: str  # "die" or "skin"
    share: float
    android_type: int  # android.os.Temperature.TYPE_*: -1 unknown, 0 CPU, 1 GPU, 3 skin, 9 NPU

    @property
    def npu(self) -> bool:
        """Return whether this is an HTP (NPU) zone, the one that throttles."""
        return self.type.startswith(("nsphvx-", "nsphmx-"))


ZONES: tuple[Zone, ...] = (
    Zone("cpuss-0", "die", 0.80, 0),
    Zone("cpuss-1", "die", 0.78, 0),
    Zone("gpuss-0", "die", 0.65, 1),
    Zone("nsphvx-0", "die", 1.00, 9),
    Zone("nsphmx-0", "die", 0.96, 9),
    Zone("ddr", "die", 0.55, -1),
    Zone("sys-therm-0", "skin", 1.00, 3),
)
"""Zones of the emulated SoC, in thermal_zone<N> order (Qualcomm zone names)."""


class ThermalModel:
    """Die and skin temperatures, HTP throttling, thermal status and battery readings of one SoC over time."""

    def __init__(self, params: ThermalParams, clock: Callable[[], float] = time.monotonic) -> None:
        self.params = params
        self._clock = clock
        self._t = clock()
        self._pending_busy_s = 0.0
        self._backlog_limit_s = BUSY_BACKLOG_MIN_S
        self.throttled = False
        self.busy_fraction = 0.0
        # Start at the idle steady state: the device has been switched on for a while.
        self.power_w = params.idle_power_w
        self.die_c = params.ambient_c + params.idle_power_w * params.r_die_c_per_w
        self.skin_c = params.ambient_c + params.idle_power_w * params.r_skin_c_per_w

    @property
    def throttle(self) -> float:
        """Return the factor by which NPU work takes longer now (1.0 unless throttled)."""
        return self.params.throttle_factor if self.throttled else 1.0

    def interval_power_w(self, busy_fraction: float) -> float:
        """Return the SoC power in watts for an interval with this NPU busy fraction, at the current throttle."""
        p = self.params
        return p.idle_power_w + (p.load_power_w - p.idle_power_w) * busy_fraction / self.throttle

    def advance(self, busy_s: float = 0.0, now: float | None = None, largest_report_s: float | None = None) -> None:
        """Integrate the temperatures up to `now` (monotonic s) with busy_s of newly reported NPU work (less than
        MIN_INTERVAL_S after the last advance: only noted, for the next).

        The throttle state of the interval is the one in effect at its start; it is updated for the
        temperature reached at its end. largest_report_s is the largest single runner's report in
        busy_s (default busy_s); it bounds how much late work may be carried further.
        """
        now = self._clock() if now is None else now
        self._pending_busy_s += max(0.0, busy_s)
        dt = now - self._t
        if dt < MIN_INTERVAL_S:  # too short to say how busy the NPU was: its work waits for the next interval
            self._update_throttle()  # the throttle still follows the temperature as it stands
            return
        report_s = busy_s if largest_report_s is None else largest_report_s
        self._backlog_limit_s = max(BUSY_BACKLOG_MIN_S, report_s, self._backlog_limit_s - dt)
        used_s = min(self._pending_busy_s, dt)
        self._pending_busy_s = min(self._pending_busy_s - used_s, self._backlog_limit_s)
        self.busy_fraction = used_s / dt
        self.power_w = self.interval_power_w(self.busy_fraction)
        p = self.params
        self.die_c = _relax(self.die_c, p.ambient_c + self.power_w * p.r_die_c_per_w, dt,
                            p.r_die_c_per_w * p.c_die_j_per_c)
        self.skin_c = _relax(self.skin_c, p.ambient_c + self.power_w * p.r_skin_c_per_w, dt,
                             p.r_skin_c_per_w * p.c_skin_j_per_c)
        self._t = now
        self._update_throttle()

    def _update_throttle(self) -> None:
        """Start throttling at the trip point, stop below the clear point (hysteresis)."""
        npu_c = self.npu_temp_c()
        if not self.throttled and npu_c >= self.params.throttle_trip_c:
            self.throttled = True
        elif self.throttled and npu_c < self.params.throttle_clear_c:
            self.throttled = False

    def zone_temps_c(self) -> list[tuple[str, float]]:
        """Return (zone type, °C) for every zone in ZONES order."""
        return [(z.type, self._zone_temp_c(z)) for z in ZONES]

    def _zone_temp_c(self, zone: Zone) -> float:
        """Return the temperature of one zone, °C."""
        amb = self.params.ambient_c
        return amb + zone.share * ((self.die_c if zone.node == "die" else self.skin_c) - amb)

    def npu_temp_c(self) -> float:
        """Return the hottest NPU zone's temperature, °C (the one the throttle watches)."""
        return max(self._zone_temp_c(z) for z in ZONES if z.npu)

    def status_at(self, temp_c: float, throttled: bool) -> ThermalStatus:
        """Return the thermal status of a zone at temp_c (throttled: the zone's HTP is throttling)."""
        p = self.params
        for status, threshold_c in ((ThermalStatus.SHUTDOWN, p.status_shutdown_c),
                                    (ThermalStatus.EMERGENCY, p.status_emergency_c),
                                    (ThermalStatus.CRITICAL, p.status_critical_c),
                                    (ThermalStatus.SEVERE, p.status_severe_c)):
            if temp_c >= threshold_c:
                return status
        if throttled:
            return ThermalStatus.MODERATE
        return ThermalStatus.LIGHT if temp_c >= p.light_c else ThermalStatus.NONE

    def zone_statuses(self) -> list[ThermalStatus]:
        """Return the status of every zone in ZONES order (only NPU zones count the throttle)."""
        return [self.status_at(self._zone_temp_c(z), self.throttled and z.npu) for z in ZONES]

    @property
    def thermal_status(self) -> ThermalStatus:
        """Return the device's thermal status: the hottest zone's (Android's THERMAL_STATUS_*)."""
        return max(self.zone_statuses())

    def battery(self, charging: bool = False) -> tuple[int, int]:
        """Return (current_now µA, negative while discharging, positive while charging; voltage_now µV)."""
        v0, r = self.params.battery_voltage_v, BATTERY_INTERNAL_OHM
        # P = V·I with V = V0 - I·R: the smaller root of R·I² - V0·I + P = 0.
        load_a = (v0 - math.sqrt(max(0.0, v0 * v0 - 4 * r * self.power_w))) / (2 * r)
        battery_a = CHARGER_CURRENT_A - load_a if charging else -load_a  # kernel sign: + into the battery
        return round(battery_a * 1e6), round((v0 + battery_a * r) * 1e6)


def _relax(value: float, target: float, dt: float, tau_s: float) -> float:
    """Return a first-order system's value after dt seconds heading for target."""
    return target + (value - target) * math.exp(-dt / tau_s)


@dataclass(frozen=True)
class BusyReport:
    """What the runners reported since the last read: total new busy seconds and the largest single report."""

    busy_s: float = 0.0
    largest_s: float = 0.0


class BusyLedger:
    """The runners' ``busy.<pid>`` files in the NPU directory and the value each had at the last read."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._seen_s: dict[str, float] = {}

    def prime(self) -> None:
        """Take the files present now as the baseline (their earlier work is not replayed)."""
        self._seen_s = {}
        self.collect()

    def collect(self) -> BusyReport:
        """Return the increase of every busy file since the last read; remove the dead processes' files."""
        total_s = largest_s = 0.0
        seen: dict[str, float] = {}
        for path, pid in self._files():
            alive = pid_alive(pid)  # before reading: a dead process's value is final
            value_s = _read_float(path)
            if value_s is None:
                continue
            last_s = self._seen_s.get(path.name, 0.0)
            increase_s = value_s - last_s if value_s >= last_s else value_s  # smaller: a new process, same pid
            total_s += increase_s
            largest_s = max(largest_s, increase_s)
            if alive:
                seen[path.name] = value_s
            else:
                path.unlink(missing_ok=True)
        self._seen_s = seen
        return BusyReport(total_s, largest_s)

    def _files(self) -> list[tuple[Path, int]]:
        """Return (path, pid) of every busy file in the directory (removing dead writers' temporary files)."""
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            m = _BUSY_FILE.match(name)
            if m and m.group(2):  # busy.<pid>.<...>: an atomic write's temporary, left if its writer died
                if not pid_alive(int(m.group(1))):
                    (self.directory / name).unlink(missing_ok=True)
            elif m:
                found.append((self.directory / name, int(m.group(1))))
        return found


def _read_float(path: Path) -> float | None:
    """Return the float in a file, or None if it is gone or not a number."""
    try:
        value = float(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


class EmulatedSensors:
    """The thermal model of a device plus the files under its sandbox that show it.

    Thread-safe. ``with sensors.load(): ...`` around a command marks it as running: while at
    least one runs a background ticker refreshes the model and its thermal files every TICK_S, so
    they (the battery readings and the throttle state included) stay current during a long command;
    ``refresh()`` before a command or a read. Power comes only from the busy
    files the runners write, not from how many commands run.
    """

    def __init__(self, sandbox: Path, params: ThermalParams,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(sandbox)
        self.npu_dir = self.root / NPU_DIR
        self.model = ThermalModel(params, clock)
        self._lock = threading.Lock()
        self._running = 0
        self._ticker_stop: threading.Event | None = None
        self._written: dict[Path, str] = {}  # the changing files' last text written (lock held)
        self._ledger = BusyLedger(self.npu_dir)
        self._write_static()
        install_dumpsys(self.root, params)
        self._ledger.prime()
        self.refresh()

    @property
    def thermal_status(self) -> ThermalStatus:
        """Return the device's Android thermal status as of the last refresh."""
        with self._lock:
            return self.model.thermal_status

    @property
    def throttled(self) -> bool:
        """Return whether the emulated HTP is throttling as of the last refresh."""
        with self._lock:
            return self.model.throttled

    def environment(self) -> dict[str, str]:
        """Return the environment variables every command on the device gets (the NPU directory)."""
        return {NPU_DIR_ENV: str(self.npu_dir)}

    def _write_static(self) -> None:
        """Write the files that do not change: zone types and trip points, the battery's identity and status."""
        self.npu_dir.mkdir(parents=True, exist_ok=True)
        p = self.model.params
        for index, zone in enumerate(ZONES):
            d = self.root / THERMAL_DIR / f"thermal_zone{index}"
            d.mkdir(parents=True, exist_ok=True)
            _write(d / "type", zone.type + "\n")
            _write(d / "mode", "enabled\n")
            if zone.npu:
                _write(d / "trip_point_0_temp", f"{round(p.throttle_trip_c * 1000)}\n")
                _write(d / "trip_point_0_type", "passive\n")
                _write(d / "trip_point_1_temp", f"{round(p.status_shutdown_c * 1000)}\n")
                _write(d / "trip_point_1_type", "critical\n")
        battery = self.root / BATTERY_DIR
        battery.mkdir(parents=True, exist_ok=True)
        _write(battery / "type", "Battery\n")
        _write(battery / "status", "Discharging\n")
        _write(battery / "capacity", "80\n")

    def refresh(self, battery: bool = True) -> None:
        """Advance the model to now with the runners' new busy time and rewrite the changing files
        (battery=False leaves current_now/voltage_now alone). The ticker rewrites the battery too: the
        device runner's own sampler reads these files during a long command. As on a phone, current_now
        and voltage_now are two files, so a reader may get them from two refreshes around a load change."""
        with self._lock:
            report = self._ledger.collect()
            self.model.advance(report.busy_s, largest_report_s=report.largest_s)
            self._write_state(battery)

    def _write_state(self, battery: bool) -> None:
        """Write temperatures, throttle, statuses and (if battery) battery readings from the model (lock held)."""
        model = self.model
        for index, (_zone, temp_c) in enumerate(model.zone_temps_c()):
            self._update(self.root / THERMAL_DIR / f"thermal_zone{index}" / "temp", f"{round(temp_c * 1000)}\n")
        self._update(self.npu_dir / "throttle", f"{model.throttle:g}\n")
        self._update(self.npu_dir / "thermal_status", f"{int(model.thermal_status)}\n")
        self._update(self.npu_dir / "zone_status",
                     "".join(f"{z.android_type} {int(s)}\n" for z, s in zip(ZONES, model.zone_statuses())))
        if battery:
            battery_dir = self.root / BATTERY_DIR
            current_ua, voltage_uv = model.battery(charging=_charging(battery_dir))
            self._update(battery_dir / "current_now", f"{current_ua}\n")
            self._update(battery_dir / "voltage_now", f"{voltage_uv}\n")

    def _update(self, path: Path, text: str) -> None:
        """Replace path's content with text unless the last write left it so (lock held): every request and every
        tick refreshes the files, and the throttle and the statuses seldom change."""
        if self._written.get(path) == text:
            return
        _write(path, text)
        self._written[path] = text

    def begin_load(self) -> None:
        """Mark one more command as running (starting the ticker for the first)."""
        with self._lock:
            self._running += 1
            if self._ticker_stop is None:
                self._ticker_stop = threading.Event()
                threading.Thread(target=self._tick, args=(self._ticker_stop,), name="emulated-thermal-ticker",
                                 daemon=True).start()

    def end_load(self) -> None:
        """Mark one running command as finished (stopping the ticker after the last)."""
        with self._lock:
            self._running = max(0, self._running - 1)
            if self._running == 0 and self._ticker_stop is not None:
                self._ticker_stop.set()
                self._ticker_stop = None

    @contextmanager
    def load(self) -> Iterator[None]:
        """Mark a command as running for the duration of the block."""
        self.begin_load()
        try:
            yield
        finally:
            self.end_load()

    def _tick(self, stop: threading.Event) -> None:
        """Refresh every TICK_S until stop is set (a vanished sandbox ends the ticker)."""
        while not stop.wait(TICK_S):
            try:
                self.refresh()
            except OSError as e:
                logger.debug("emulated thermal ticker stopped: %s", e)
                return


def _charging(battery_dir: Path) -> bool:
    """Return whether the battery's status file says "Charging"."""
    try:
        return (battery_dir / "status").read_text().strip() == "Charging"
    except OSError:
        return False


def _write(path: Path, text: str, mode: int | None = None) -> None:
    """Replace path's content atomically (a reader never sees a half-written value), with mode if given."""
    with replacing(path, 0o644 if mode is None else mode) as tmp:  # not fsynced: the ticker writes it often
        tmp.write_text(text)


def dumpsys_script(sandbox: Path, params: ThermalParams) -> str:
    """Return the text of a POSIX sh `dumpsys` for the emulated device whose filesystem is sandbox.

    ``dumpsys thermalservice`` prints Android's layout (``Thermal Status: N``, ``Current
    temperatures from HAL:`` with one ``Temperature{mValue=..., mType=..., mName=..., mStatus=...}``
    per zone, the HTP cooling device and the NPU zones' thresholds) from the files the model
    writes; ``dumpsys`` or ``dumpsys -l`` lists the one service; any other service prints
    "Can't find service" (not emulated) and exits 0, as Android's does.
    """
    npu_zones = [(i, z) for i, z in enumerate(ZONES) if z.npu]
    hot = [math.nan, params.light_c, params.throttle_trip_c, params.status_severe_c, params.status_critical_c,
           params.status_emergency_c, params.status_shutdown_c]
    hot_text = ", ".join("NaN" if math.isnan(v) else f"{v:.1f}" for v in hot)
    thresholds = "".join(
        f"\tTemperatureThreshold{{mType={z.android_type}, mName={z.type}, mHotThrottlingThresholds=[{hot_text}], "
        f"mColdThrottlingThresholds=[{', '.join(['NaN'] * 7)}]}}\\n" for _i, z in npu_zones)
    return (
        "#!/bin/sh\n"
        "# dumpsys of the emulated device (harness.emulator.thermal): only thermalservice, from the model's files\n"
        f"thermal_dir={shlex.quote(str(Path(sandbox) / THERMAL_DIR))}\n"
        f"npu_dir={shlex.quote(str(Path(sandbox) / NPU_DIR))}\n"
        "celsius() {  # millidegrees -> degrees as Java prints a float (41250 -> 41.25, 41000 -> 41.0)\n"
        "  t=$1; sign=\n"
        '  if [ "$t" -lt 0 ]; then sign=-; t=$((-t)); fi\n'
        "  frac=$(printf '%03d' $((t % 1000)))\n"
        '  while [ "${#frac}" -gt 1 ] && [ "${frac%0}" != "$frac" ]; do frac=${frac%0}; done\n'
        "  printf '%s%s.%s' \"$sign\" $((t / 1000)) \"$frac\"\n"
        "}\n"
        "temperatures() {\n"
        "  n=0\n"
        "  while read -r kind status; do\n"
        '    zone="$thermal_dir/thermal_zone$n"\n'
        "    printf '\\tTemperature{mValue=%s, mType=%s, mName=%s, mStatus=%s}\\n' "
        '"$(celsius "$(cat "$zone/temp")")" "$kind" "$(cat "$zone/type")" "$status"\n'
        "    n=$((n + 1))\n"
        '  done < "$npu_dir/zone_status"\n'
        "}\n"
        "thermalservice() {\n"
        "  level=1; [ \"$(cat \"$npu_dir/throttle\")\" = 1 ] && level=0\n"
        "  printf 'IsStatusOverride: false\\n'\n"
        "  printf 'Thermal Status: %s\\n' \"$(cat \"$npu_dir/thermal_status\")\"\n"
        "  printf 'Cached temperatures:\\n'; temperatures\n"
        "  printf 'HAL Ready: true\\nHAL connection:\\n\\tThermalHAL emulated (harness model) connected: yes\\n'\n"
        "  printf 'Current temperatures from HAL:\\n'; temperatures\n"
        "  printf 'Current cooling devices from HAL:\\n'\n"
        "  printf '\\tCoolingDevice{mValue=%s, mType=5, mName=nsp-throttle}\\n' \"$level\"\n"
        f"  printf 'Temperature static thresholds from HAL:\\n{thresholds}'\n"
        "}\n"
        'case "${1-}" in\n'
        "  thermalservice) thermalservice ;;\n"
        "  ''|-l) printf 'Currently running services:\\n  thermalservice\\n' ;;\n"
        "  *) printf \"Can't find service: %s (not emulated; the emulated device has only thermalservice)\\n\" "
        '"$1" >&2 ;;\n'
        "esac\n"
        "exit 0\n"
    )


def install_dumpsys(sandbox: Path, params: ThermalParams) -> Path:
    """Write the executable `<sandbox>/system/bin/dumpsys` (see dumpsys_script) and return its path."""
    path = Path(sandbox) / DUMPSYS
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, dumpsys_script(sandbox, params), mode=0o755)
    return path


def catalog_params(soc_id: str) -> ThermalParams:
    """Return the thermal parameters of soc_id from the harness SoC catalog (defaults if absent)."""
    try:
        from harness.devices import load_catalog

        socs = load_catalog().socs
    except Exception:  # the emulator must run without a readable catalog
        return ThermalParams()
    entry = socs.get(soc_id.lower())
    return ThermalParams.from_spec(getattr(entry, "thermal", None))
