"""Step 7, energy per inference: the device's idle power, then its power during a fixed number of
inferences of the deployable context binary, both sampled by the runner on the device.

energy_per_inference_mj = the integral of (power - idle power) over the run and a short tail after it
(power readings lag the load: a fuel gauge averages, the emulated battery follows the thermal model's
refresh) / inferences, i.e. the energy the inferences cost above idle; inferences_per_joule is its inverse. Power is |current_now| x
voltage_now of the battery; while the battery reports Charging (or Full, Not charging: a charger is
attached) the charger feeds the device and the reading is not its draw, so power is reported as unusable,
never as a number. Figures are `emulated` on the harness's emulators, `measured` on adb/SSH devices. On an
emulated device the inferences are the modelled HTP's (harness.emulator.device_time: busy back to back, each
inference the modelled latency x the throttle factor), so the figure is (load - idle power) x the modelled
latency, whatever the host's speed; the simulator's own inferences are `simulator_inferences`.
The figure carries a 95 % interval from the spread of the power readings over the run (energy_interval): a
limit fails only when the whole interval is beyond it, and is inconclusive when it straddles it.
Because the readings lag the load by up to POWER_LAG_S, the idle power (the baseline subtracted from every reading)
and the run's spread are taken from each phase after its first POWER_LAG_S (settled): the first idle readings
still show the work before it (the probe inference), the first run readings the ramp up.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.reporting import charts
from harness.data import Feed
from harness.kpi import INTERVALS_KEY, Interval, Limit
from harness.models import Thresholds
from harness.options import EnergyOptions
from harness.repeats import summary
from harness.runner.client import DeviceRunner, SoakSpec
from harness.soak import mean_power_w, note_host_contention, soak_run
from harness.steps.context_binary import ContextBinary
from harness.steps.report import StepReport

CHARGER_STATUSES = ("charging", "full", "not charging")
MIN_RUN_SAMPLES = 5
ENERGY_BLOCKS = 5  # blocks of the run's power readings whose spread gives the energy figure's interval
POWER_LAG_S = 1.0  # how long power readings may lag the load (a fuel gauge's average, the emulated model's refresh)
TAIL_S = 1.5  # sampling after the run, so energy reported late by the power readings is counted


def warm_inference_s(runner: DeviceRunner, model: Path, feed: Feed, iterations: int = 5) -> float:
    """Return the median time of a few warm inferences of model on the device's HTP (a probe run; on an emulated
    device the modelled time, RunResult.emulated_s)."""
    import statistics

    run = runner.run(model, [feed], "htp", warmup=2, min_iterations=iterations)
    times = run.emulated_s if run.emulated_s else run.iteration_s
    return statistics.median(times) if times else 0.0


def size_inferences(inference_s: float, target_s: float, minimum: int = 20, maximum: int = 1_000_000) -> int:
    """Return how many inferences of inference_s seconds fill about target_s (within [minimum, maximum])."""
    fit = int(target_s / inference_s) if inference_s > 0 else maximum
    return max(minimum, min(maximum, fit))


def energy(ctx: ContextBinary, feeds: list[Feed], runner: DeviceRunner, thresholds: Thresholds,
           options: EnergyOptions, out_dir: Path, label: str) -> StepReport:
    """Return the energy report: idle and run power, energy per inference above idle, the power chart, CSV."""
    source = getattr(runner.transport, "telemetry_source", "measured")
    run = runner.soak(ctx.model, feeds[:4], SoakSpec(iterations=options.inferences, window_s=1.0,
                                                    telemetry_interval_s=options.interval_s, idle_s=options.idle_s,
                                                    thermal_status=False, tail_s=TAIL_S))
    soak = soak_run(run, source)
    idle, busy = soak.phase("idle"), soak.phase("soak")
    idle_w, busy_w = mean_power_w(settled(idle)), mean_power_w(busy)
    statuses = sorted({s.battery_status for s in soak.samples if s.battery_status})
    report = StepReport("energy")
    report.kpis = {
        "artifact": ctx.model.name, "power_source": source, "latency_source": soak.latency_source,
        "inferences": soak.iterations, "inferences_reason": options.inferences_reason,
        "run_duration_s": soak.duration_s, "idle_duration_s": options.idle_s,
        "sampling_interval_s": soak.interval_s, "idle_samples": len(idle), "run_samples": len(busy),
        "battery_status": statuses, "idle_power_w": idle_w, "mean_power_w": busy_w,
        "energy_per_inference_mj": None, "energy_per_inference_total_mj": None, "inferences_per_joule": None,
        "power_usable": False,
    }
    unusable = _unusable(statuses, idle_w, busy_w, len(busy))
    if unusable:
        report.kpis.update(idle_power_w=None, mean_power_w=None)
        report.notes.append(unusable)
    else:
        count = max(1, soak.iterations)
        above_j = max(0.0, energy_above_j(busy + soak.phase("tail"), idle_w))
        report.kpis.update(power_usable=True, energy_per_inference_mj=1000.0 * above_j / count,
                           energy_per_inference_total_mj=1000.0 * (above_j + idle_w * soak.duration_s) / count,
                           inferences_per_joule=count / above_j if above_j > 0 else None)
        interval = energy_interval(settled(busy), settled(idle), idle_w, soak.duration_s / count,
                                   report.kpis["energy_per_inference_mj"])
        if interval is not None:  # the blocks are what the regression step compares between sessions
            blocks = energy_blocks_mj(settled(busy), idle_w, soak.duration_s / count)
            report.kpis.update(energy_blocks_mj=blocks, energy_noise_pct=summary(blocks).noise_pct)
            report.kpis[INTERVALS_KEY] = {"energy_per_inference_mj": interval.as_dict()}
    if soak.emulated:
        report.kpis.update(emulated_latency=run.report.get("emulated"), simulator_inferences=len(soak.iteration_s),
                           simulator_duration_s=run.report["soak"].get("simulator_duration_s"))
        note_host_contention(report, soak.host, True, soak.simulator_windows)
    if thresholds.max_energy_per_inference_mj is not None:
        report.limits.append(Limit("energy_per_inference_mj", maximum=thresholds.max_energy_per_inference_mj,
                                   required=False, detail=f"{source} power" if not unusable else unusable[:80]))
    out_dir.mkdir(parents=True, exist_ok=True)
    if not unusable:
        report.artifacts["power_chart"] = charts.power_chart(
            soak.samples, idle_w, f"{label}: power, idle then {count} inferences ({source})", out_dir / "energy.png")
    (out_dir / "energy_samples.csv").write_text(soak.csv())
    report.artifacts["samples_csv"] = out_dir / "energy_samples.csv"
    return report


def settled(samples: list, lag_s: float = POWER_LAG_S) -> list:
    """Return a phase's samples from lag_s after its first one (readings before that still show the load before
    the phase); all of them when fewer than two would be left."""
    if not samples:
        return samples
    kept = [s for s in samples if s.t_s >= samples[0].t_s + lag_s]
    return kept if len(kept) >= 2 else samples


def energy_blocks_mj(busy: list, idle_w: float, seconds_per_inference: float,
                     blocks: int = ENERGY_BLOCKS) -> list[float]:
    """Return the energy per inference (mJ) of each of `blocks` contiguous blocks of the run's power readings: the
    block's mean power above idle x the time per inference ([] with fewer than two readings per block)."""
    powers = np.array([s.power_w for s in busy if s.power_w is not None], dtype=np.float64)
    if len(powers) < 2 * blocks:
        return []
    return [1000.0 * (float(chunk.mean()) - idle_w) * seconds_per_inference for chunk in np.array_split(powers, blocks)]


def energy_interval(busy: list, idle: list, idle_w: float, seconds_per_inference: float,
                    value_mj: float, blocks: int = ENERGY_BLOCKS) -> Interval | None:
    """Return the 95 % interval of energy per inference (mJ) from the spread of the run's power readings: a
    t-interval over energy_blocks_mj, widened by the idle mean's standard error (idle is subtracted from every
    reading), centred on value_mj. None with fewer than two readings per block or in idle."""
    from scipy.stats import t

    per_block = np.array(energy_blocks_mj(busy, idle_w, seconds_per_inference, blocks))
    idle_p = np.array([s.power_w for s in idle if s.power_w is not None], dtype=np.float64)
    if per_block.size == 0 or len(idle_p) < 2:
        return None
    se_blocks = per_block.std(ddof=1) / np.sqrt(blocks)
    se_idle = 1000.0 * idle_p.std(ddof=1) / np.sqrt(len(idle_p)) * seconds_per_inference
    half = float(t.ppf(0.975, blocks - 1)) * float(np.hypot(se_blocks, se_idle))
    samples = sum(1 for s in busy if s.power_w is not None)
    return Interval(max(0.0, value_mj - half), value_mj + half, samples, "power blocks (t)")


def energy_above_j(samples, idle_w: float) -> float:
    """Return the integral, in joules, of (power - idle_w) over samples (trapezoids between their times)."""
    points = [(s.t_s, s.power_w - idle_w) for s in samples if s.power_w is not None]
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(points, points[1:]))


def _unusable(statuses: list[str], idle_w: float | None, busy_w: float | None, run_samples: int) -> str | None:
    """Return why the power readings cannot give an energy figure, or None when they can."""
    charger = [s for s in statuses if s.lower() in CHARGER_STATUSES]
    if charger:
        return (f"power unusable: the battery reports '{charger[0]}', so a charger feeds the device and "
                "current_now is not its draw; unplug it (adb over Wi-Fi, or a USB power monitor) to measure energy")
    if idle_w is None or busy_w is None:
        return ("power unavailable: the device reports no battery current_now/voltage_now (a mains-powered board, "
                "or telemetry power: false in devices.yaml); energy needs a power reading")
    if run_samples < MIN_RUN_SAMPLES:
        return (f"power unusable: only {run_samples} power samples during the run (at least {MIN_RUN_SAMPLES}); "
                "run more inferences (--energy-inferences) or sample faster")
    return None
