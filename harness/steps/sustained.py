"""Step 7, sustained performance and thermal stability: a soak of the deployable context binary.

First a cooldown (harness.farm.cooldown), so an earlier step's heat does not skew the run; then one runner
process runs the context binary for the soak duration, timing every iteration, with latency per window
and the device's thermal zones, battery and (on Android) thermal status sampled on the runner's clock
(harness.soak). KPIs after 3DMark's stress test and MLPerf Mobile: stability_pct (worst window's
throughput / best), sustained_to_peak, throttling_onset_s, max_temp_c and its zone, max_skin_temp_c,
thermal_status_max, latency_ms over the soak. Temperatures are `emulated` on the harness's emulators
(harness.emulator.thermal) and `measured` on adb/SSH devices. On an emulated device the windows, stability,
throttling onset and latency are the modelled HTP's (`latency_source: emulated`, harness.emulator.device_time:
busy back to back, each inference the model's modelled latency x the throttle factor), so the host's speed and
load cannot move them; the HTP simulator's wall time is reported beside them as `simulator_latency_ms` and the
`simulator_windows` table, and host contention as the `host_contention` KPI (a note, not a verdict). On a
device whose windows are the simulator's own wall time (an SSH or adb "board" running it), host contention is
noted too, and a stability below its limit on a host busier than its cores is inconclusive, not failed.
"""

from __future__ import annotations

from pathlib import Path

from harness.data import Feed
from harness.farm.cooldown import cool_down
from harness.kpi import Limit
from harness.models import Thresholds
from harness.options import SoakOptions
from harness.reporting import charts
from harness.runner.client import DeviceRunner, SoakSpec
from harness.soak import (
    note_host_contention,
    soak_run,
    stability_kpis,
    thermal_kpis,
)
from harness.steps.context_binary import ContextBinary
from harness.steps.profile import latency_stats
from harness.steps.report import StepReport

SOAK_FEEDS = 4  # inputs cycled through by the soak


MIN_ITERATIONS_PER_WINDOW = 4  # a slow model's windows are widened to hold about this many inferences


def window_for(options: SoakOptions, inference_s: float | None) -> tuple[float, str | None]:
    """Return the window length for a model taking inference_s per inference: options.window_s, or wider so a
    window holds MIN_ITERATIONS_PER_WINDOW inferences (never more than a third of the soak); and why, if widened."""
    if not inference_s or inference_s * MIN_ITERATIONS_PER_WINDOW <= options.window_s:
        return options.window_s, None
    wide = min(max(options.window_s, options.duration_s / 3), inference_s * MIN_ITERATIONS_PER_WINDOW)
    return wide, (f"windows widened from {options.window_s:g} s to {wide:.3g} s: one inference takes "
                  f"{inference_s:.3g} s here, and a window should hold about {MIN_ITERATIONS_PER_WINDOW}")


def sustained(ctx: ContextBinary, feeds: list[Feed], runner: DeviceRunner, thresholds: Thresholds,
              options: SoakOptions, out_dir: Path, label: str, inference_s: float | None = None) -> StepReport:
    """Return the sustained-performance report: cooldown, soak windows, thermal KPIs, charts and CSVs
    (inference_s: the model's cost per inference where known, to size the windows; not on an emulated device,
    whose modelled HTP completes many inferences per window whatever the simulator's speed)."""
    transport = runner.transport
    source = getattr(transport, "telemetry_source", "measured")
    window_s, widened = window_for(options, None if source == "emulated" else inference_s)
    options = SoakOptions(options.duration_s, options.cooldown_max_s, window_s, options.telemetry_interval_s)
    cooldown = cool_down(transport, runner.idle_temps_c, thresholds.cooldown_margin_c, options.cooldown_max_s)
    run = runner.soak(ctx.model, feeds[:SOAK_FEEDS], SoakSpec(duration_s=options.duration_s, window_s=options.window_s,
                                                             telemetry_interval_s=options.telemetry_interval_s))
    soak = soak_run(run, source)
    report = StepReport("sustained")
    stability = stability_kpis(soak.windows, thresholds.throttling_margin)
    thermal = thermal_kpis(soak.phase("soak") or soak.samples)
    report.kpis = {
        "artifact": ctx.model.name, "runtime": "htp", "latency_source": soak.latency_source,
        "telemetry_source": source, "soak_duration_s": soak.duration_s, "window_s": options.window_s,
        "iterations": soak.iterations, "latency_ms": soak.latency_ms(),
        **stability, **thermal, "throttling_margin": thresholds.throttling_margin,
        "cooldown": cooldown.kpis(), "telemetry_interval_s": soak.interval_s, "telemetry_samples": len(soak.samples),
        "sampler_cpu_s": soak.sampler_cpu_s, "sampler_children_cpu_s": soak.sampler_children_cpu_s,
        "trip_points": [{"zone": t.zone, "temp_c": t.temp_c, "type": t.type} for t in soak.trips],
    }
    report.tables["windows"] = [w.__dict__ for w in soak.windows]
    report.limits = [
        Limit("stability_pct", minimum=thresholds.min_stability_pct),
        Limit("max_temp_c", maximum=thresholds.max_temp_c, required=False,
              detail=f"zone {thermal['max_temp_zone']}, {source}" if thermal["max_temp_zone"] else ""),
        Limit("max_skin_temp_c", maximum=thresholds.max_skin_temp_c, required=False,
              detail=f"zone {thermal['max_skin_temp_zone']}, {source}" if thermal["max_skin_temp_zone"] else ""),
    ]
    if soak.emulated:
        report.kpis.update(emulated_latency=run.report.get("emulated"),
                           simulator_latency_ms=latency_stats(soak.iteration_s).as_dict() if soak.iteration_s else None,
                           simulator_iterations=len(soak.iteration_s))
        report.tables["simulator_windows"] = [w.__dict__ for w in soak.simulator_windows]
    if soak.emulated or soak.latency_source == "simulator":  # the simulator's wall time is in the run
        _judge_on_a_contended_host(report, soak, thresholds)
    _notes(report, soak, cooldown, thermal, transport.platform)
    if widened:
        report.notes.append(widened)
    out_dir.mkdir(parents=True, exist_ok=True)
    report.artifacts["soak_chart"] = charts.soak_chart(
        soak.windows, soak.samples, soak.trips,
        f"{label}: latency per {options.window_s:g} s window ({soak.latency_source}) and temperatures ({source})",
        out_dir / "soak.png", onset_s=stability["throttling_onset_s"])
    if any(s.power_w is not None for s in soak.samples):
        report.artifacts["power_chart"] = charts.power_chart(
            soak.samples, None, f"{label}: power during the soak ({source})", out_dir / "soak_power.png")
    (out_dir / "soak_samples.csv").write_text(soak.csv())
    (out_dir / "soak_windows.csv").write_text(soak.windows_csv())
    report.artifacts["samples_csv"] = out_dir / "soak_samples.csv"
    report.artifacts["windows_csv"] = out_dir / "soak_windows.csv"
    return report


def _judge_on_a_contended_host(report: StepReport, soak, thresholds: Thresholds) -> None:
    """Note the host's contention on a run of the HTP simulator. On an emulated device the windows are modelled
    time and nothing else changes; where they are the simulator's wall time (not emulated, not a Snapdragon's)
    and the host was busier than its cores, a stability below its limit is no evidence about the device (the
    host's load slows windows unevenly): that limit is inconclusive, not failed."""
    contention = note_host_contention(report, soak.host, soak.emulated, soak.simulator_windows)
    stability = report.kpis.get("stability_pct")
    if soak.emulated or not contention["detected"] or stability is None or stability >= thresholds.min_stability_pct:
        return
    report.limits = [limit for limit in report.limits if limit.kpi != "stability_pct"]
    report.inconclusive.append(
        f"stability_pct {stability:.1f} is below its limit {thresholds.min_stability_pct:g}, but its windows are the "
        f"HTP simulator's wall time on a host under contention ({'; '.join(contention['reasons'])}): the host's "
        "load, not the device, may have slowed them; re-run the soak on a quiet host or on a device")


def _notes(report: StepReport, soak, cooldown, thermal: dict, platform: str) -> None:
    """Say what could not be read and why, and what the cooldown did."""
    if thermal["max_temp_c"] is None:
        report.notes.append("the device exposes no thermal zones (thermal_dir in its devices.yaml telemetry): "
                            "max_temp_c and max_skin_temp_c are null and their limits not evaluated")
    elif thermal["max_skin_temp_c"] is None:
        report.notes.append("no skin/board zone (skin, sys-therm, quiet-therm, xo-therm) on this device: "
                            "max_skin_temp_c is null and its limit not evaluated")
    if thermal["thermal_status_max"] is None:
        report.notes.append("Android's thermal status is unavailable" + (
            f" ({soak.errors[0]})" if soak.errors else "" if platform == "android" else
            " on a Linux device (it is read with dumpsys thermalservice on Android)"))
    if cooldown.reason == "max_wait":
        report.notes.append(f"the cooldown stopped after {cooldown.max_wait_s:g} s with {cooldown.zone} at "
                            f"{cooldown.end_temp_c:.1f} °C, {cooldown.end_temp_c - cooldown.idle_temp_c:.1f} °C above "
                            "idle: the soak started warm (raise --cooldown-max-s)")
    if len(soak.windows) < 2:
        report.notes.append("the soak held one window only: stability and throttling need a longer --soak-duration")
