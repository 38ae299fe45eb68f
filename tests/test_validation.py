"""Step 7, validation: the device runner's soak and concurrency modes, the sustained, energy and
concurrency steps on the emulated device (real HTP simulator, the emulated thermal model), and the
options that select them. The suites on real models and over adb/SSH are in test_plugin.py,
test_suites_remote.py and test_real_models.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.models import Thresholds
from harness.runner.client import DeviceRunner, SoakSpec
from harness.runner.device_runner import percentile, window_stats
from harness.soak import Window, soak_run, stability_kpis
from harness.transports import open_transport

SUITES = Path(__file__).resolve().parent.parent / "suites"
VALIDATION_STEPS = ("validation_accuracy", "sustained", "energy", "concurrency")


@pytest.fixture(scope="module")
def feeds():
    rng = np.random.default_rng(7)
    return [{"input": rng.random((1, 3, 8, 8), dtype=np.float32)} for _ in range(2)]


def _runner(devices, tmp_path: Path, telemetry: dict | None = None, **thermal) -> DeviceRunner:
    """A runner on an emulated sm8650 whose thermal model (and telemetry settings) are overridden."""
    dev = devices.select(["sm8650-emu"])[0]
    if telemetry is not None:
        dev = dev.model_copy(update={"telemetry": dev.telemetry.model_copy(update=telemetry)})
    soc = devices.soc("sm8650")
    if thermal:
        soc = soc.model_copy(update={"thermal": soc.thermal.model_copy(update=thermal)})
    runner = DeviceRunner(open_transport(dev, soc, tmp_path))
    from harness.cooldown import read_temps

    runner.idle_temps_c = read_temps(runner.transport)
    return runner


# --- the runner's statistics (pure) -------------------------------------------------------------------

def test_windows_group_iterations_by_end_time_and_fold_a_short_tail():
    times = [0.1] * 10
    ends = [0.1 * (i + 1) for i in range(10)]  # 1.0 s in all
    windows = window_stats(times, ends, 0.4, 1.0)
    assert [w["index"] for w in windows] == [0, 1]  # 0.2 s left over: folded into the second window
    assert [w["iterations"] for w in windows] == [3, 7]
    assert windows[1]["t_end_s"] == 1.0 and windows[0]["throughput_ips"] == pytest.approx(10.0)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 == float(np.percentile([1, 2, 3, 4], 50))


def test_stability_throttling_onset_and_sustained_to_peak():
    def w(i, p50):
        return Window(i, 5.0 * i, 5.0 * (i + 1), 10, p50, p50, p50, p50, 1000.0 / p50)

    kpis = stability_kpis([w(0, 2.0), w(1, 2.1), w(2, 4.0), w(3, 4.0)], margin=0.15)
    assert kpis["stability_pct"] == pytest.approx(50.0) and kpis["throttling_onset_s"] == 10.0
    assert kpis["sustained_to_peak"] == pytest.approx(0.5)
    steady = stability_kpis([w(0, 2.0), w(1, 2.2)], margin=0.15)
    assert steady["throttling_onset_s"] is None and steady["stability_pct"] == pytest.approx(2.0 / 2.2 * 100)
    noisy = stability_kpis([w(0, 2.0), w(1, 2.6), w(2, 2.0), w(3, 2.1)], margin=0.15)  # one slow window: noise
    assert noisy["throttling_onset_s"] is None
    assert stability_kpis([w(0, 2.0), w(1, 2.1), w(2, 3.0)], margin=0.15)["throttling_onset_s"] == 10.0


# --- the runner's soak and concurrency modes on the emulated device -------------------------------------

def test_soak_samples_the_device_on_the_runners_clock(devices, ctx, feeds, tmp_path):
    runner = _runner(devices, tmp_path)
    run = runner.soak(ctx.model, feeds, SoakSpec(duration_s=3.0, window_s=1.0, telemetry_interval_s=0.25, idle_s=1.0))
    soak = soak_run(run, "emulated")
    assert len(soak.windows) == 3 and sum(w.iterations for w in soak.windows) == len(soak.iteration_s) > 100
    idle, busy = soak.phase("idle"), soak.phase("soak")
    assert len(idle) >= 3 and all(s.t_s < 0 for s in idle) and len(busy) >= 10
    assert busy[-1].t_s == pytest.approx(3.0, abs=0.5)
    assert {"nsphvx-0", "cpuss-0", "sys-therm-0"} <= set(busy[-1].temps_c)
    assert busy[-1].battery_status == "Discharging" and busy[-1].power_w > soak.phase("idle")[0].power_w
    assert any(t.zone == "nsphvx-0" and t.type == "passive" for t in soak.trips)
    statuses = [s.thermal_status for s in soak.samples if s.thermal_status is not None]
    assert 2 <= len(statuses) <= 4 and set(statuses) == {0}  # the emulated device's dumpsys, every 2 s of 4 s
    assert soak.sampler_cpu_s is not None and 0 < soak.sampler_cpu_s < 1.0


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_concurrent_sessions_of_two_models(sm8650_runner, ctx, qdq, feeds, tmp_path, mode):
    from harness.steps.concurrency import ConcurrencyOptions, concurrency

    report = concurrency([("ctx", ctx.model, feeds), ("qdq", qdq, feeds)], sm8650_runner, Thresholds(),
                         ConcurrencyOptions(sessions=3, duration_s=2.0, solo_duration_s=0.5, mode=mode),
                         tmp_path, "sm8650-emu")
    rows = report.tables["sessions"]
    assert [r["model"] for r in rows] == ["ctx", "qdq", "ctx"] and report.kpis["errors"] == 0
    assert all(r["iterations"] > 10 and r["latency_degradation"] > 0 for r in rows)
    assert report.kpis["mode"] == mode and report.kpis["aggregate_throughput_ips"] > 0
    assert report.kpis["latency_source"] == "simulator" and report.artifacts["latency_chart"].is_file()
    assert str(report.limits[0]) == "latency_degradation <= 4.5"  # 1.5 x 3 sessions


# --- the sustained step: throttling found on the emulated device, limits that need readings --------------

def test_sustained_finds_the_emulated_throttling_and_names_the_hottest_zone(devices, ctx, feeds, tmp_path):
    from harness.steps.sustained import SoakOptions, sustained

    # the same model as the catalog's, with a trip point the soak reaches in about 8 s from idle
    runner = _runner(devices, tmp_path / "emu", throttle_trip_c=60.0, throttle_clear_c=52.0)
    report = sustained(ctx, feeds, runner, Thresholds(max_temp_c=30), SoakOptions(duration_s=25.0, cooldown_max_s=5.0,
                       window_s=2.5), tmp_path / "out", "sm8650-emu x tiny")
    k = report.kpis
    assert k["telemetry_source"] == "emulated" and k["latency_source"] == "simulator"
    assert k["cooldown"]["reason"] == "reached" and k["cooldown"]["idle_temp_c"] is not None
    assert k["throttling_onset_s"] is not None and 2.5 <= k["throttling_onset_s"] <= 20
    assert k["thermal_status_max"] >= 2 and k["thermal_status_max_name"] in ("MODERATE", "SEVERE")
    assert k["max_temp_zone"].startswith("nsph") and k["max_temp_c"] >= 60
    assert k["stability_pct"] < 75 and k["sustained_to_peak"] < 0.9
    assert any(t["temp_c"] == 60.0 for t in k["trip_points"])
    problems = report.problems()
    assert any(p.startswith("FAIL: max_temp_c = ") and f"(zone {k['max_temp_zone']}, emulated)" in p
               and "rule max_temp_c <= 30" in p for p in problems), problems
    csv = report.artifacts["samples_csv"].read_text().splitlines()
    assert csv[0].startswith("t_s,unix_time_s,") and "thermal_status" in csv[0] and len(csv) > 40
    assert report.artifacts["soak_chart"].stat().st_size > 10_000


def test_a_device_without_thermal_zones_or_power_leaves_those_limits_not_evaluated(devices, ctx, feeds, tmp_path):
    from harness.steps.energy import EnergyOptions, energy
    from harness.steps.sustained import SoakOptions, sustained

    runner = _runner(devices, tmp_path / "emu", telemetry={"thermal_dir": "/sys/no-such-dir", "power": False})
    report = sustained(ctx, feeds, runner, Thresholds(), SoakOptions(duration_s=5.0, cooldown_max_s=5.0),
                       tmp_path / "out", "bare")
    assert report.passed, report.problems()
    assert report.kpis["max_temp_c"] is None and report.kpis["max_skin_temp_c"] is None
    assert report.kpis["cooldown"]["reason"] == "no thermal zones"
    verdicts = [str(v) for v in report.verdicts]
    assert "NOT EVALUATED: max_temp_c has no value, rule max_temp_c <= 100" in verdicts
    assert any("no thermal zones" in n for n in report.notes)
    report = energy(ctx, feeds, runner, Thresholds(max_energy_per_inference_mj=1.0), EnergyOptions(50, 0.5, 0.1),
                    tmp_path / "energy", "bare")
    assert report.passed and report.kpis["energy_per_inference_mj"] is None
    assert any("no battery current_now" in n for n in report.notes)
    assert str(report.verdicts[0]).startswith("NOT EVALUATED: energy_per_inference_mj")


# --- the energy step ------------------------------------------------------------------------------------

def test_energy_above_idle_is_labelled_and_a_charging_battery_is_unusable(devices, ctx, feeds, tmp_path):
    from harness.steps.energy import EnergyOptions, energy

    runner = _runner(devices, tmp_path / "emu")
    report = energy(ctx, feeds, runner, Thresholds(), EnergyOptions(2000, 1.0, 0.1), tmp_path / "e1", "emu")
    k = report.kpis
    assert k["power_source"] == "emulated" and k["power_usable"] and k["battery_status"] == ["Discharging"], report.notes
    assert k["inferences"] == 2000 and k["idle_samples"] >= 8 and k["run_samples"] >= 5
    assert k["mean_power_w"] > k["idle_power_w"] > 0 and k["energy_per_inference_mj"] > 0
    assert k["inferences_per_joule"] == pytest.approx(1000.0 / k["energy_per_inference_mj"], rel=1e-6)
    assert k["energy_per_inference_total_mj"] > k["energy_per_inference_mj"]
    # the model: (load - idle) x busy time per inference; the run is nearly all inference
    params = devices.soc("sm8650").thermal
    per_inference_s = k["run_duration_s"] / k["inferences"]
    assert k["energy_per_inference_mj"] <= (params.load_power_w - params.idle_power_w) * per_inference_s * 1000 * 1.3
    assert report.artifacts["power_chart"].is_file()

    status = runner.transport.root / "sys/class/power_supply/battery/status"
    status.write_text("Charging\n")
    report = energy(ctx, feeds, runner, Thresholds(max_energy_per_inference_mj=5.0), EnergyOptions(100, 0.5, 0.1),
                    tmp_path / "e2", "emu")
    assert report.kpis["energy_per_inference_mj"] is None and report.kpis["mean_power_w"] is None
    assert any("battery reports 'Charging'" in n for n in report.notes)
    assert report.passed and str(report.verdicts[0]).startswith("NOT EVALUATED")


# --- options and selection ------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--soak-duration", "2"], "--soak-duration 2 is shorter than one 5 s window"),
    (["--concurrency", "0"], "argument --concurrency: '0' is not a number of sessions (1 or more)"),
    (["--soak-duration", "-1"], "'-1' is not a duration in seconds (more than 0)"),
])
def test_bad_validation_options_are_usage_errors(pytester, args, message):
    result = pytester.runpytest_subprocess(str(SUITES), "-p", "no:cacheprovider", "--co", *args)
    assert result.ret == 4
    assert message in result.stderr.str() + result.stdout.str()
    assert "Traceback" not in result.stderr.str()


@pytest.mark.parametrize("args", [["--skip-validation"], ["-m", "not validation"]])
def test_validation_suites_can_be_left_out(pytester, args):
    result = pytester.runpytest_subprocess(str(SUITES), "-p", "no:cacheprovider", "--co", "-q", *args)
    out = result.stdout.str()
    assert result.ret == 0 and "17/22 tests collected (5 deselected)" in out
    assert not any(step in out for step in ("test_sustained", "test_energy", "test_concurrency", "test_genie_stress"))


def test_a_model_spec_with_max_temp_30_fails_sustained_naming_zone_and_temperature(pytester, session_cache_dir):
    from model_builders import conv_classifier

    conv_classifier(pytester.path / "clf.onnx")
    spec = pytester.path / "clf.yaml"
    spec.write_text("path: clf.onnx\nthresholds: {max_temp_c: 30}\n")
    kpi = pytester.path / "kpi.json"
    result = pytester.runpytest_subprocess(str(SUITES / "test_12_sustained.py"), "--model", str(spec),
                                           "--cache-dir", str(session_cache_dir), "--kpi-json", str(kpi),
                                           "--soak-duration", "6", "--cooldown-max-s", "5", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    record = json.loads(kpi.read_text())["records"][0]
    k = record["kpis"]
    assert record["step"] == "sustained" and k["max_temp_c"] > 30 and k["telemetry_source"] == "emulated"
    result.stdout.fnmatch_lines([f"*FAIL: max_temp_c = {k['max_temp_c']:.6g} (zone {k['max_temp_zone']}, emulated), "
                                 "rule max_temp_c <= 30*"])
