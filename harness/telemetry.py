"""Thermal and power telemetry, sampled from a device in the background while a step runs.

One remote command per sample, through the device's transport (the same on a phone, a Linux
board and the emulators, whose sysfs-shaped files come from harness.emulator.thermal)::

    cd <thermal_dir> && grep -s -H "" thermal_zone*/type thermal_zone*/temp     # millidegrees C
    cd <power_supply> && grep -s -H "" current_now voltage_now                  # µA, µV

Power is |current_now| x voltage_now (the sign convention of current_now differs between
drivers). Zones whose type is not a temperature (Qualcomm's ``*-bcl-lvlN``, ``ibat``, ``vbat``,
``socd``) are left out. Every summary says whether its readings are ``emulated`` or ``measured``.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from harness.errors import DeviceLostError, TransportError

if TYPE_CHECKING:
    from harness.transports.base import Transport

logger = logging.getLogger(__name__)

ANDROID_POWER_SUPPLY = "/sys/class/power_supply/battery"
DEFAULT_THERMAL_DIR = "/sys/class/thermal"
DEFAULT_INTERVAL_S = 0.5
MAX_CONSECUTIVE_ERRORS = 3
_NOT_TEMPERATURE = re.compile(r"(bcl|-lvl\d|^ibat|^vbat|^socd)", re.IGNORECASE)
_SAMPLE_SCRIPT = ('if cd "$1" 2>/dev/null; then grep -s -H "" thermal_zone*/type thermal_zone*/temp; fi; '
                  'if [ -n "$2" ] && cd "$2" 2>/dev/null; then grep -s -H "" current_now voltage_now; fi; true')


@dataclass(frozen=True)
class TelemetryPaths:
    """Device paths read for telemetry; power_supply None means power is not read."""

    thermal_dir: str = DEFAULT_THERMAL_DIR
    power_supply: str | None = ANDROID_POWER_SUPPLY

    @classmethod
    def for_transport(cls, transport: "Transport") -> "TelemetryPaths":
        """Return the device entry's telemetry paths, with the defaults of its platform filled in."""
        settings = getattr(transport.device, "telemetry", None)
        thermal_dir = getattr(settings, "thermal_dir", None) or DEFAULT_THERMAL_DIR
        power = getattr(settings, "power_supply", None)
        if power is None and transport.platform == "android":
            power = ANDROID_POWER_SUPPLY
        if settings is not None and not settings.power:
            power = None
        return cls(thermal_dir, power)


@dataclass(frozen=True)
class Sample:
    """One reading: temperatures per zone (°C) and battery current/voltage, with timestamps."""

    t_s: float
    unix_time_s: float
    temps_c: dict[str, float]
    current_ua: int | None = None
    voltage_uv: int | None = None
    phase: str = ""  # a device-side soak's phase: "idle" (model loaded, no inference) or "soak"
    battery_status: str | None = None  # the battery's `status`: Charging, Discharging, Full, Not charging
    thermal_status: int | None = None  # Android's thermal status (dumpsys thermalservice), 0 NONE .. 6 SHUTDOWN

    @property
    def power_w(self) -> float | None:
        """Return |current| x voltage in watts, or None without both readings."""
        if self.current_ua is None or self.voltage_uv is None:
            return None
        return abs(self.current_ua) * self.voltage_uv * 1e-12


@dataclass(frozen=True)
class ZoneStats:
    """Maximum and mean temperature of one zone over the samples."""

    max_c: float
    mean_c: float


@dataclass(frozen=True)
class TelemetrySummary:
    """What the samples of one step came to."""

    source: str
    interval_s: float
    duration_s: float
    samples: int
    zones: dict[str, ZoneStats] = field(default_factory=dict)
    max_temp_c: float | None = None
    max_temp_zone: str | None = None
    mean_power_w: float | None = None
    max_power_w: float | None = None
    errors: list[str] = field(default_factory=list)

    def kpis(self) -> dict[str, Any]:
        """Return the summary as the `telemetry` KPI (plain JSON types, rounded)."""
        return {
            "source": self.source, "samples": self.samples, "interval_s": self.interval_s,
            "duration_s": round(self.duration_s, 3), "max_temp_c": _round(self.max_temp_c, 2),
            "max_temp_zone": self.max_temp_zone, "mean_power_w": _round(self.mean_power_w, 3),
            "max_power_w": _round(self.max_power_w, 3),
            "zones": {name: {"max_c": round(z.max_c, 2), "mean_c": round(z.mean_c, 2)} for name, z in self.zones.items()},
            "errors": list(self.errors),
        }


def sample_argv(paths: TelemetryPaths) -> list[str]:
    """Return the argv of the one remote command that reads a sample."""
    return ["sh", "-c", _SAMPLE_SCRIPT, "sh", paths.thermal_dir, paths.power_supply or ""]


def is_temperature(zone_type: str) -> bool:
    """Return whether a thermal zone of this type reports a temperature."""
    return not _NOT_TEMPERATURE.search(zone_type)


def _grep_lines(stdout: str) -> list[tuple[str, str]]:
    """Return the (name, value) pairs of `grep -H ""` output lines ("name:value")."""
    return [(name, value.strip()) for name, sep, value in (line.partition(":") for line in stdout.splitlines()) if sep]


def zone_keys(types: dict[str, str]) -> dict[str, str]:
    """Return the reported name per thermal_zone directory: its type, or type@zone where types repeat."""
    counts: dict[str, int] = {}
    for zone_type in types.values():
        counts[zone_type] = counts.get(zone_type, 0) + 1
    return {zone: (t if counts[t] <= 1 else f"{t}@{zone}") for zone, t in types.items()}


def parse_sample(stdout: str) -> tuple[dict[str, float], int | None, int | None]:
    """Return (°C per zone name, current_now µA, voltage_now µV) from the sample command's output."""
    types: dict[str, str] = {}
    temps: dict[str, int] = {}
    power: dict[str, int] = {}
    for name, value in _grep_lines(stdout):
        if name.startswith("thermal_zone") and "/" in name:
            zone, _, leaf = name.partition("/")
            if leaf == "type":
                types[zone] = value
            elif leaf == "temp" and _is_int(value):
                temps[zone] = int(value)
        elif name in ("current_now", "voltage_now") and _is_int(value):
            power[name] = int(value)
    keys = zone_keys({zone: types.get(zone, zone) for zone in temps})
    celsius = {keys[zone]: temps[zone] / 1000.0 for zone in sorted(temps, key=_zone_number)
               if is_temperature(types.get(zone, zone))}
    return celsius, power.get("current_now"), power.get("voltage_now")


def parse_battery_status(stdout: str) -> str | None:
    """Return the battery's `status` line (Charging, Discharging, Full, Not charging) from sample output."""
    return next((value for name, value in _grep_lines(stdout) if name == "status" and value), None)


@dataclass(frozen=True)
class TripPoint:
    """A thermal zone's trip point as the kernel reports it (trip_point_N_temp / _type)."""

    zone: str
    temp_c: float
    type: str


def parse_trips(stdout: str) -> list[TripPoint]:
    """Return the trip points in `thermal_zone*/type` and `trip_point_*` lines, zones named as parse_sample."""
    types: dict[str, str] = {}
    trips: dict[tuple[str, str], dict[str, str]] = {}
    for name, value in _grep_lines(stdout):
        zone, _, leaf = name.partition("/")
        if leaf == "type":
            types[zone] = value
        elif (m := re.fullmatch(r"trip_point_(\d+)_(temp|type)", leaf)):
            trips.setdefault((zone, m.group(1)), {})[m.group(2)] = value
    keys = zone_keys({zone: types.get(zone, zone) for zone in {z for z, _ in trips} | set(types)})
    return [TripPoint(keys[zone], int(trip["temp"]) / 1000.0, trip.get("type", ""))
            for (zone, _), trip in sorted(trips.items(), key=lambda kv: (_zone_number(kv[0][0]), int(kv[0][1])))
            if _is_int(trip.get("temp", "")) and is_temperature(types.get(zone, zone))]


_SKIN = re.compile(r"(skin|sys-therm|quiet-therm|xo-therm|back-therm|case)", re.IGNORECASE)


def zone_kind(name: str) -> str:
    """Return 'npu', 'cpu', 'gpu', 'skin' or 'other' for a zone name (Qualcomm's naming)."""
    lowered = name.lower()
    if lowered.startswith("nsp") or "npu" in lowered or lowered.startswith("cdsp"):
        return "npu"
    if lowered.startswith("cpu"):
        return "cpu"
    if lowered.startswith("gpu"):
        return "gpu"
    return "skin" if _SKIN.search(lowered) else "other"


def summarize(samples: list[Sample], source: str, interval_s: float, errors: list[str] | None = None
              ) -> TelemetrySummary:
    """Return the max/mean temperature per zone and the mean/max power of samples."""
    zones: dict[str, list[float]] = {}
    for s in samples:
        for name, temp in s.temps_c.items():
            zones.setdefault(name, []).append(temp)
    stats = {name: ZoneStats(max(v), statistics.fmean(v)) for name, v in zones.items()}
    hottest = max(stats.items(), key=lambda kv: kv[1].max_c, default=None)
    powers = [p for p in (s.power_w for s in samples) if p is not None]
    return TelemetrySummary(
        source=source, interval_s=interval_s,
        duration_s=(samples[-1].t_s - samples[0].t_s) if len(samples) > 1 else 0.0, samples=len(samples),
        zones=stats, max_temp_c=hottest[1].max_c if hottest else None, max_temp_zone=hottest[0] if hottest else None,
        mean_power_w=statistics.fmean(powers) if powers else None, max_power_w=max(powers) if powers else None,
        errors=list(errors or []))


def samples_csv(samples: list[Sample]) -> str:
    """Return the samples as CSV: t_s, unix_time_s, one °C column per zone, current_ua, voltage_uv, power_w
    (and phase, battery_status, thermal_status where any sample has them)."""
    zones: list[str] = []
    for s in samples:
        zones.extend(z for z in s.temps_c if z not in zones)
    extra = [name for name in ("phase", "battery_status", "thermal_status")
             if any(getattr(s, name) not in (None, "") for s in samples)]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["t_s", "unix_time_s", *(f"{z}_c" for z in zones), "current_ua", "voltage_uv", "power_w", *extra])
    for s in samples:
        power = s.power_w
        writer.writerow([f"{s.t_s:.3f}", f"{s.unix_time_s:.3f}", *(_cell(s.temps_c.get(z)) for z in zones),
                         _cell(s.current_ua), _cell(s.voltage_uv), "" if power is None else f"{power:.4f}",
                         *(_cell(getattr(s, name)) for name in extra)])
    return buf.getvalue()


class TelemetrySampler:
    """Samples a device's temperatures and power every interval_s in a background thread.

    ``with TelemetrySampler(transport) as sampler: <run the step>`` then ``sampler.summary()``.
    Read errors are recorded, not raised; after MAX_CONSECUTIVE_ERRORS in a row, or once the
    device is lost, sampling stops.
    """

    def __init__(self, transport: "Transport", paths: TelemetryPaths | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S, read_timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.transport = transport
        self.paths = paths or TelemetryPaths.for_transport(transport)
        self.interval_s = interval_s
        self.read_timeout_s = read_timeout_s
        self.source = getattr(transport, "telemetry_source", "measured")
        self._clock = clock
        self._t0 = clock()
        self._samples: list[Sample] = []
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gave_up = False
        self._consecutive_errors = 0

    @property
    def samples(self) -> list[Sample]:
        """Return a copy of the samples taken so far."""
        with self._lock:
            return list(self._samples)

    def sample_once(self) -> Sample:
        """Read one sample now and keep it; raises TransportError when the read fails."""
        result = self.transport.read_command(sample_argv(self.paths), timeout_s=self.read_timeout_s)
        temps, current_ua, voltage_uv = parse_sample(result.stdout)
        sample = Sample(round(self._clock() - self._t0, 4), time.time(), temps, current_ua, voltage_uv)
        with self._lock:
            self._samples.append(sample)
        return sample

    def _try_sample(self) -> bool:
        """Take a sample, recording a failure; return False once sampling should stop."""
        if self._gave_up:
            return False
        try:
            self.sample_once()
            self._consecutive_errors = 0
            return True
        except TransportError as e:
            with self._lock:
                self._errors.append(str(e).splitlines()[0])
            self._consecutive_errors += 1
            if isinstance(e, DeviceLostError) or self._consecutive_errors >= MAX_CONSECUTIVE_ERRORS:
                self._gave_up = True
            return not self._gave_up

    def _loop(self) -> None:
        next_t = self._clock()
        while True:
            if not self._try_sample():
                return
            next_t += self.interval_s
            if self._stop.wait(max(0.0, next_t - self._clock())):
                return

    def start(self) -> "TelemetrySampler":
        """Start sampling in the background (the first sample is taken at once); return self."""
        if self._thread is None:
            self._t0 = self._clock()
            self._thread = threading.Thread(target=self._loop, name=f"telemetry-{self.transport.device_id}",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> TelemetrySummary:
        """Stop sampling, take a last sample, and return the summary."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=self.read_timeout_s + 5)
            self._thread = None
            self._try_sample()
        return self.summary()

    def summary(self) -> TelemetrySummary:
        """Return the summary of the samples so far."""
        with self._lock:
            return summarize(list(self._samples), self.source, self.interval_s, self._errors)

    def csv(self) -> str:
        """Return the samples as CSV (see samples_csv)."""
        return samples_csv(self.samples)

    def __enter__(self) -> "TelemetrySampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _is_int(text: str) -> bool:
    return bool(re.fullmatch(r"-?\d+", text))


def _zone_number(zone: str) -> int:
    digits = zone[len("thermal_zone"):]
    return int(digits) if digits.isdigit() else 1 << 30


def _round(value: float | None, ndigits: int) -> float | None:
    return None if value is None else round(value, ndigits)


def _cell(value: float | int | str | None) -> str:
    return "" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))
