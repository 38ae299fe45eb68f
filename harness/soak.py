"""What a device-side soak run reports, read on the host: per-window latency, the device's own telemetry
samples on the runner's clock, and the KPIs Step 7 holds them to.

The runner (harness/runner/device_runner.py, --soak_duration/--soak_iterations) times every iteration,
groups them into windows, and samples the device's thermal zones, battery and Android thermal status in a
thread on the same clock; its raw sysfs lines are parsed here with the host's own parsers
(harness.telemetry), so a phone, a board and the emulators read alike. On an emulated device the windows,
iterations and latency are the modelled HTP's (`emulated`, harness.emulator.device_time); the HTP simulator's
own wall time is kept as `simulator` figures, and host contention (host_contention) is a labelled note.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from harness.errors import StepError
from harness.runner.base import RunResult
from harness.steps.profile import latency_stats
from harness.steps.report import StepReport
from harness.telemetry import (Sample, TripPoint, parse_battery_status, parse_sample, parse_trips, samples_csv,
                               zone_kind)

ANDROID_THERMAL_STATUS = ("NONE", "LIGHT", "MODERATE", "SEVERE", "CRITICAL", "EMERGENCY", "SHUTDOWN")


@dataclass(frozen=True)
class Window:
    """Latency statistics of the iterations that ended in one window of the soak."""

    index: int
    t_start_s: float
    t_end_s: float
    iterations: int
    p50_ms: float | None
    p90_ms: float | None
    mean_ms: float | None
    max_ms: float | None
    throughput_ips: float | None


@dataclass
class SoakRun:
    """A soak as the host reads it: windows, every iteration, the device's samples and its trip points."""

    windows: list[Window]
    iteration_s: list[float]
    duration_s: float
    samples: list[Sample] = field(default_factory=list)
    trips: list[TripPoint] = field(default_factory=list)
    interval_s: float | None = None
    sampler_cpu_s: float | None = None  # the sampler thread's CPU time
    sampler_children_cpu_s: float | None = None  # its dumpsys processes' CPU time
    errors: list[str] = field(default_factory=list)
    telemetry_source: str = "measured"  # emulated | measured
    latency_source: str = "unknown"  # emulated (the modelled HTP) | simulator | device | ...
    iterations: int = 0  # inferences of the soak: the modelled HTP's on an emulated device
    emulated_summary: dict | None = None  # the modelled HTP's latency over the soak (emulated devices)
    simulator_windows: list[Window] = field(default_factory=list)  # the simulator's windows (emulated devices)
    host: dict = field(default_factory=dict)  # the runner's machine: cpu_count, loadavg_1m at start and end

    @property
    def emulated(self) -> bool:
        """Return whether the soak's figures are an emulated device's modelled time."""
        return self.latency_source == "emulated"

    def latency_ms(self) -> dict[str, float]:
        """Return the soak's latency statistics (the `latency_ms` KPI: min, p50, p90, p99, max, mean, std)."""
        if self.emulated_summary is not None:
            return {k: self.emulated_summary.get(f"{k}_ms") for k in ("min", "p50", "p90", "p99", "max", "mean", "std")}

        return latency_stats(self.iteration_s).as_dict()

    def phase(self, name: str) -> list[Sample]:
        """Return the samples taken in one phase ('idle' or 'soak')."""
        return [s for s in self.samples if s.phase == name]

    def csv(self) -> str:
        """Return the device's samples as CSV (harness.telemetry.samples_csv)."""
        return samples_csv(self.samples)

    def windows_csv(self) -> str:
        """Return the windows as CSV."""
        names = list(Window.__dataclass_fields__)
        rows = [",".join(names)]
        rows += [",".join("" if getattr(w, n) is None else f"{getattr(w, n):.6g}" for n in names) for w in self.windows]
        return "\n".join(rows) + "\n"


def soak_run(run: RunResult, telemetry_source: str) -> SoakRun:
    """Return the SoakRun of a runner result made with DeviceRunner.soak; StepError when it holds no soak."""
    report = run.report
    soak = report.get("soak")
    if not soak:
        raise StepError("the device runner reported no soak (an older runner on the device?)")
    windows = _windows(soak.get("windows"))
    telemetry = report.get("telemetry") or {}
    static = "\n".join(telemetry.get("static") or [])
    samples = []
    for raw in telemetry.get("samples") or []:
        text = f"{static}\n{raw.get('raw', '')}"
        temps, current_ua, voltage_uv = parse_sample(text)
        samples.append(Sample(float(raw["t_s"]), 0.0, temps, current_ua, voltage_uv, phase=raw.get("phase", ""),
                              battery_status=parse_battery_status(raw.get("raw", "")),
                              thermal_status=raw.get("thermal_status")))
    return SoakRun(windows=windows, iteration_s=list(run.iteration_s), duration_s=float(soak.get("duration_s", 0.0)),
                   samples=samples, trips=parse_trips(static), interval_s=telemetry.get("interval_s"),
                   sampler_cpu_s=telemetry.get("sampler_cpu_s"),
                   sampler_children_cpu_s=telemetry.get("sampler_children_cpu_s"), errors=list(telemetry.get("errors") or []),
                   telemetry_source=telemetry_source, latency_source=soak.get("latency_source") or run.latency_source,
                   iterations=int(soak.get("iterations", len(run.iteration_s))),
                   emulated_summary=soak.get("emulated_summary"),
                   simulator_windows=_windows(soak.get("simulator_windows")),
                   host=dict(report.get("host") or {}))


def _windows(rows: list[dict] | None) -> list[Window]:
    return [Window(**{k: w.get(k) for k in Window.__dataclass_fields__}) for w in rows or []]


CONTENTION_SPREAD_PCT = 50.0  # the simulator's window p50s moving more than this: the host was contended


def host_contention(host: dict, simulator_windows: list[Window] = ()) -> dict[str, Any]:
    """Return the `host_contention` KPI of a run on an emulated device: the host's 1-minute load average against
    its cores and the spread of the simulator's window p50s (max / min - 1, %); detected when the load exceeds
    the cores or the spread exceeds CONTENTION_SPREAD_PCT. A labelled note, never a verdict: the emulated
    figures do not depend on it."""
    loads = [x for x in host.get("loadavg_1m") or [] if x is not None]
    cpus = host.get("cpu_count")
    p50s = [w.p50_ms for w in simulator_windows if w.p50_ms]
    spread = 100.0 * (max(p50s) / min(p50s) - 1.0) if len(p50s) >= 2 else None
    reasons = []
    if loads and cpus and max(loads) > cpus:
        reasons.append(f"load average {max(loads):.2f} above the host's {cpus} cores")
    if spread is not None and spread > CONTENTION_SPREAD_PCT:
        reasons.append(f"the simulator's window p50 moved {spread:.0f} % during the run")
    return {"source": "simulator", "detected": bool(reasons), "reasons": reasons,
            "loadavg_1m_max": max(loads) if loads else None, "cpu_count": cpus,
            "simulator_window_p50_spread_pct": spread}


def contention_notes(contention: dict[str, Any], emulated: bool = True) -> list[str]:
    """Return the note for detected host contention (none when there was none): on an emulated device the
    verdicts' figures are the modelled HTP's, elsewhere the simulator's wall time, which follows the host's load."""
    if not contention.get("detected"):
        return []
    why = "host contention (simulator): " + "; ".join(contention["reasons"])
    if emulated:
        return [why + " - the emulated figures are the modelled HTP's and do not depend on it; the simulator's "
                "wall-time figures do"]
    return [why + " - the figures are the simulator's wall time on this host and follow its load, not an HTP's"]


def note_host_contention(report: StepReport, host: dict, emulated: bool,
                         simulator_windows: list[Window] = ()) -> dict[str, Any]:
    """Return the `host_contention` KPI of a run of the HTP simulator (host_contention), after recording it in
    report's KPIs and, when detected, its note (contention_notes)."""
    contention = host_contention(host, simulator_windows)
    report.kpis["host_contention"] = contention
    report.notes.extend(contention_notes(contention, emulated))
    return contention


def stability_kpis(windows: list[Window], margin: float) -> dict[str, Any]:
    """Return stability_pct (worst window throughput / best, %), sustained_to_peak (first window's p50 /
    last window's: 1.0 keeps its speed, 0.5 runs at half speed at the end) and throttling_onset_s (start of
    the first window whose p50, and the next window's, are more than `margin` above the first window's; a
    last window alone counts; None if none)."""
    timed = [w for w in windows if w.iterations and w.p50_ms]
    if not timed:
        return {"stability_pct": None, "sustained_to_peak": None, "throttling_onset_s": None, "windows": 0}
    rates = [w.throughput_ips for w in timed if w.throughput_ips]
    first, last = timed[0], timed[-1]
    slow = [w.p50_ms > first.p50_ms * (1 + margin) for w in timed]
    # throttling lasts: a window counts as the onset when the next one is slow too (one noisy window is not)
    onset = next((w.t_start_s for k, w in enumerate(timed) if k and slow[k] and (k + 1 == len(timed) or slow[k + 1])),
                 None)
    return {"stability_pct": 100.0 * min(rates) / max(rates) if rates else None,
            "sustained_to_peak": first.p50_ms / last.p50_ms, "throttling_onset_s": onset, "windows": len(timed),
            "first_window_p50_ms": first.p50_ms, "last_window_p50_ms": last.p50_ms}


def thermal_kpis(samples: list[Sample]) -> dict[str, Any]:
    """Return the hottest zone and its temperature, the hottest skin zone, and the highest thermal status
    (None where the device gave no such reading)."""
    hottest = max(((t, z) for s in samples for z, t in s.temps_c.items()), default=None)
    skin = max(((t, z) for s in samples for z, t in s.temps_c.items() if zone_kind(z) == "skin"), default=None)
    statuses = [s.thermal_status for s in samples if s.thermal_status is not None]
    status = max(statuses) if statuses else None
    return {"max_temp_c": hottest[0] if hottest else None, "max_temp_zone": hottest[1] if hottest else None,
            "max_skin_temp_c": skin[0] if skin else None, "max_skin_temp_zone": skin[1] if skin else None,
            "thermal_status_max": status,
            "thermal_status_max_name": ANDROID_THERMAL_STATUS[status] if status is not None and
            0 <= status < len(ANDROID_THERMAL_STATUS) else None}


def mean_power_w(samples: list[Sample]) -> float | None:
    """Return the mean power of the samples that have a reading, or None."""
    powers = [p for p in (s.power_w for s in samples) if p is not None]
    return statistics.fmean(powers) if powers else None
