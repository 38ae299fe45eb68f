"""Step 7, validation: the device runner's soak and concurrency modes, the sustained, energy and
concurrency steps on the emulated device (real HTP simulator, the emulated thermal model), and the
options that select them. The suites on real models and over adb/SSH are in test_plugin.py,
test_suites_remote.py and test_real_models.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.reporting import charts
from harness.emulator.device_time import CONTEXT_SWITCH_MS, DISPATCH_MS, modelled_latency
from harness.kpi import Limit
from harness.models import Thresholds
from harness.options import ConcurrencyOptions, SoakOptions
from harness.runner.client import DeviceRunner, SoakSpec
from harness.runner.device_runner import percentile, segment_windows, weighted_summary, window_stats
from harness.soak import SoakRun, Window, host_contention, soak_run, stability_kpis
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
    from harness.farm.cooldown import read_temps

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
    # the modelled HTP, busy back to back: each 1 s window holds 1 s / the modelled latency, whatever the simulator did
    latency_ms = modelled_latency(ctx.model, devices.soc("sm8650")).latency_ms
    assert soak.latency_source == "emulated" and len(soak.windows) == 3
    for w in soak.windows:  # the last window ends with the simulator's last inference (late on a busy host)
        assert w.iterations == pytest.approx((w.t_end_s - w.t_start_s) * 1000.0 / latency_ms, abs=2)
    assert all(w.p50_ms == pytest.approx(latency_ms) for w in soak.windows)
    assert sum(w.iterations for w in soak.windows) == pytest.approx(soak.iterations, abs=3)
    assert len(run.emulated_s) == len(soak.iteration_s) == sum(w.iterations for w in soak.simulator_windows) > 10
    assert run.emulated_s == [pytest.approx(latency_ms / 1000)] * len(run.emulated_s)
    assert soak.latency_ms()["p50"] == pytest.approx(latency_ms)
    assert soak.host["cpu_count"] >= 1 and len(soak.host["loadavg_1m"]) == 2
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
    from harness.steps.concurrency import concurrency

    report = concurrency([("ctx", ctx.model, feeds), ("qdq", qdq, feeds)], sm8650_runner, Thresholds(),
                         ConcurrencyOptions(sessions=3, duration_s=2.0, solo_duration_s=0.5, mode=mode),
                         tmp_path, "sm8650-emu")
    rows = report.tables["sessions"]
    assert [r["model"] for r in rows] == ["ctx", "qdq", "ctx"] and report.kpis["errors"] == 0
    # three sessions take turns on the one modelled HTP: each waits one round of all three, whatever the host
    soc = sm8650_runner.transport.soc
    solo_ms = {"ctx": modelled_latency(ctx.model, soc).latency_ms, "qdq": modelled_latency(qdq, soc).latency_ms}
    round_ms = 2 * solo_ms["ctx"] + solo_ms["qdq"] + 3 * CONTEXT_SWITCH_MS
    for r in rows:
        assert r["latency_degradation"] == pytest.approx(round_ms / solo_ms[r["model"]], rel=1e-6)
        assert r["simulator_iterations"] > 3 and r["simulator_latency_degradation"] > 0
        assert r["iterations"] == pytest.approx(report.kpis["duration_s"] * 1000 / round_ms, rel=0.02)
    assert 3 < report.kpis["latency_degradation"] < 3.6
    assert report.kpis["mode"] == mode and report.kpis["aggregate_throughput_ips"] > 0
    assert report.kpis["latency_source"] == "emulated" and charts.ready(report.artifacts["latency_chart"])
    assert report.kpis["host_contention"]["source"] == "simulator"
    assert str(report.limits[0]) == "latency_degradation <= 4.5"  # 1.5 x 3 sessions


def test_two_sessions_of_one_model_share_the_modelled_htp(sm8650_runner, ctx, feeds, tmp_path):
    from harness.steps.concurrency import concurrency

    report = concurrency([("ctx", ctx.model, feeds)], sm8650_runner, Thresholds(),
                         ConcurrencyOptions(sessions=2, duration_s=2.0, solo_duration_s=0.5), tmp_path, "emu")
    solo_ms = modelled_latency(ctx.model, sm8650_runner.transport.soc).latency_ms
    assert report.kpis["latency_degradation"] == pytest.approx(2 * (solo_ms + CONTEXT_SWITCH_MS) / solo_ms)
    assert 2.0 < report.kpis["latency_degradation"] < 2.5 and report.passed, report.problems()
    assert report.kpis["emulated"]["shared_latency_ms"] == pytest.approx(2 * (solo_ms + CONTEXT_SWITCH_MS))


# --- the sustained step: throttling found on the emulated device, limits that need readings --------------

def test_sustained_finds_the_emulated_throttling_and_names_the_hottest_zone(devices, ctx, feeds, tmp_path):
    from harness.steps.sustained import sustained

    # the same model as the catalog's, with a trip point the soak reaches in about 8 s from idle
    runner = _runner(devices, tmp_path / "emu", throttle_trip_c=60.0, throttle_clear_c=52.0)
    report = sustained(ctx, feeds, runner, Thresholds(max_temp_c=30), SoakOptions(duration_s=25.0, cooldown_max_s=5.0,
                       window_s=2.5), tmp_path / "out", "sm8650-emu x tiny")
    k = report.kpis
    assert k["telemetry_source"] == "emulated" and k["latency_source"] == "emulated"
    assert k["cooldown"]["reason"] == "reached" and k["cooldown"]["idle_temp_c"] is not None
    assert k["throttling_onset_s"] is not None and 2.5 <= k["throttling_onset_s"] <= 20
    assert k["thermal_status_max"] >= 2 and k["thermal_status_max_name"] in ("MODERATE", "SEVERE")
    assert k["max_temp_zone"].startswith("nsph") and k["max_temp_c"] >= 60
    # throttled, the modelled HTP takes throttle_factor (2) times as long: stability is exactly 1 / 2
    assert k["stability_pct"] == pytest.approx(50.0, abs=0.5) and k["sustained_to_peak"] < 0.9
    windows = report.tables["windows"]
    assert windows[0]["p50_ms"] == pytest.approx(k["emulated_latency"]["latency_ms"])
    assert max(w["p50_ms"] for w in windows) == pytest.approx(2 * k["emulated_latency"]["latency_ms"])
    assert k["simulator_latency_ms"]["p50"] > 0 and report.tables["simulator_windows"]
    assert any(t["temp_c"] == 60.0 for t in k["trip_points"])
    problems = report.problems()
    assert any(p.startswith("FAIL: max_temp_c = ") and f"(zone {k['max_temp_zone']}, emulated)" in p
               and "rule max_temp_c <= 30" in p for p in problems), problems
    csv = report.artifacts["samples_csv"].read_text().splitlines()
    assert csv[0].startswith("t_s,unix_time_s,") and "thermal_status" in csv[0] and len(csv) > 40
    assert charts.ready(report.artifacts["soak_chart"]) and report.artifacts["soak_chart"].stat().st_size > 10_000


def test_a_throttled_device_is_slower_in_modelled_time_from_the_start(devices, ctx, feeds, tmp_path):
    # the devices-file override of issue 19: the idle die (37 °C) is above the trip point, factor 1.5
    runner = _runner(devices, tmp_path, throttle_trip_c=30.0, throttle_clear_c=20.0, throttle_factor=1.5)
    latency_s = modelled_latency(ctx.model, devices.soc("sm8650")).latency_ms / 1000
    run = runner.run(ctx.model, feeds, "htp", warmup=1, min_iterations=20)
    assert len(run.emulated_s) == len(run.iteration_s) >= 20
    assert run.emulated_s == [pytest.approx(1.5 * latency_s)] * len(run.emulated_s)
    assert run.report["emulated"]["throttle_start"] == 1.5
    soak = soak_run(runner.soak(ctx.model, feeds, SoakSpec(duration_s=2.0, window_s=1.0)), "emulated")
    assert [w.p50_ms for w in soak.windows] == [pytest.approx(1500 * latency_s)] * 2
    assert soak.iterations == pytest.approx(2.0 / (1.5 * latency_s), rel=0.02)


def test_a_real_devices_run_has_no_modelled_time(devices, ctx, feeds, tmp_path, monkeypatch):
    runner = _runner(devices, tmp_path)
    assert runner._emulated_argv([ctx.model])[0] == "--emulated_latency_ms"
    # a device with measured telemetry and no NPU directory (as adb/SSH devices): the runner times the device
    monkeypatch.setattr(runner.transport, "telemetry_source", "measured")
    monkeypatch.setattr(runner.transport.sensors, "environment", lambda: {})
    assert runner._emulated_argv([ctx.model]) == []
    run = runner.run(ctx.model, feeds, "htp", min_iterations=5)
    assert run.emulated_s is None and "emulated" not in run.report and len(run.iteration_s) >= 5


def test_modelled_windows_and_weighted_statistics():
    # 2 s at 1 ms, then 1 s throttled at 2 ms: windows of 1 s hold 1000, 1000 and 500 inferences
    segments = [(0.0, 2.0, 0.001), (2.0, 3.0, 0.002)]
    windows = segment_windows(segments, 1.0, 3.0, base_s=0.001)
    assert [w["iterations"] for w in windows] == [1000, 1000, 500]
    assert [w["p50_ms"] for w in windows] == [pytest.approx(1.0), pytest.approx(1.0), pytest.approx(2.0)]
    assert windows[2]["throughput_ips"] == pytest.approx(500.0) and windows[0]["base_ms"] == 1.0
    whole = weighted_summary([(0.001, 2000), (0.002, 500)], 3.0)
    assert whole["iterations"] == 2500 and whole["p50_ms"] == pytest.approx(1.0)
    assert whole["p90_ms"] == pytest.approx(2.0)
    assert whole["mean_ms"] == pytest.approx((2000 * 1.0 + 500 * 2.0) / 2500)


def test_host_contention_is_a_labelled_note():
    quiet = host_contention({"cpu_count": 2, "loadavg_1m": [0.5, 0.9]},
                            [Window(0, 0, 5, 10, 2.0, 2, 2, 2, 500), Window(1, 5, 10, 10, 2.2, 2, 2, 2, 450)])
    assert quiet["detected"] is False and quiet["simulator_window_p50_spread_pct"] == pytest.approx(10.0)
    busy = host_contention({"cpu_count": 2, "loadavg_1m": [2.7, 3.1]})
    assert busy["detected"] and busy["source"] == "simulator" and "3.10 above the host's 2 cores" in busy["reasons"][0]


@pytest.mark.parametrize("load, status", [([0.4, 0.9], "failed"), ([2.7, 11.7], "inconclusive")])
def test_a_simulator_timed_soak_below_its_stability_limit_fails_only_on_a_host_within_its_cores(load, status):
    """Windows timed in the HTP simulator's wall time (an SSH or adb board running it): an unstable soak fails on a
    quiet host; on a host busier than its cores (load average 11.7 on 2, as in a CI run) the host may have slowed
    the windows, so stability is inconclusive with what would decide it, never failed."""
    from harness.steps.report import StepReport
    from harness.steps.sustained import _judge_on_a_contended_host

    windows = [Window(0, 0, 5, 50, 2.0, 2, 2, 2, 500), Window(1, 5, 10, 10, 10.0, 10, 10, 10, 100)]
    soak = SoakRun(windows=windows, iteration_s=[], duration_s=10.0, latency_source="simulator",
                   host={"cpu_count": 2, "loadavg_1m": load})
    report = StepReport("sustained", kpis={**stability_kpis(windows, 0.15)},
                        limits=[Limit("stability_pct", minimum=Thresholds().min_stability_pct)])
    assert report.kpis["stability_pct"] == pytest.approx(20.0) and report.status == "failed"
    _judge_on_a_contended_host(report, soak, Thresholds())
    assert report.status == status and report.kpis["host_contention"]["detected"] is (status == "inconclusive")
    if status == "inconclusive":
        assert "stability_pct 20.0 is below its limit 30" in report.undecided()[0]
        assert "load average 11.70 above the host's 2 cores" in report.undecided()[0]
        assert "re-run the soak on a quiet host or on a device" in report.undecided()[0]
        assert any("simulator's wall time on this host" in n for n in report.notes)


def test_a_device_without_thermal_zones_or_power_leaves_those_limits_not_evaluated(devices, ctx, feeds, tmp_path):
    from harness.steps.energy import EnergyOptions, energy
    from harness.steps.sustained import sustained

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
    latency_ms = modelled_latency(ctx.model, devices.soc("sm8650")).latency_ms
    count = int(2.5 * 1000 / latency_ms)  # 2.5 s of the modelled HTP
    report = energy(ctx, feeds, runner, Thresholds(), EnergyOptions(count, 1.0, 0.1), tmp_path / "e1", "emu")
    k = report.kpis
    assert k["power_source"] == "emulated" and k["power_usable"] and k["battery_status"] == ["Discharging"], report.notes
    assert k["inferences"] == count and k["idle_samples"] >= 8 and k["run_samples"] >= 5
    assert k["latency_source"] == "emulated"
    assert k["run_duration_s"] == pytest.approx(count * latency_ms / 1000, rel=1e-3)
    assert k["simulator_inferences"] >= 1 and k["emulated_latency"]["latency_ms"] == pytest.approx(latency_ms)
    assert k["mean_power_w"] > k["idle_power_w"] > 0 and k["energy_per_inference_mj"] > 0
    assert k["inferences_per_joule"] == pytest.approx(1000.0 / k["energy_per_inference_mj"], rel=1e-6)
    assert k["energy_per_inference_total_mj"] > k["energy_per_inference_mj"]
    # the model: (load - idle power) x the modelled latency of one inference (the HTP busy back to back)
    params = devices.soc("sm8650").thermal
    assert k["energy_per_inference_mj"] == pytest.approx((params.load_power_w - params.idle_power_w) * latency_ms,
                                                         rel=0.1)
    assert charts.ready(report.artifacts["power_chart"])

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


def test_a_real_models_energy_and_concurrency_are_the_modelled_htps(pytester, session_cache_dir):
    """A corpus model (MTCNN's P-Net, a Caffe-era export) through the energy and concurrency steps on the emulated
    sm8650: energy per inference is (load - idle power) x the modelled latency of its graph, and two sessions take
    turns on the modelled HTP, whatever the simulator's speed."""
    from harness.emulator.thermal import catalog_params
    from real_models_helpers import real_model_spec

    spec = real_model_spec("mtcnn_pnet")
    kpi = pytester.path / "kpi.json"
    result = pytester.runpytest_subprocess(str(SUITES / "test_13_energy.py"), str(SUITES / "test_14_concurrency.py"),
                                           "--model", str(spec), "--concurrency-duration", "4", "--aimet", "off",
                                           "--cache-dir", str(session_cache_dir), "--kpi-json", str(kpi),
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    records = {r["step"]: r for r in json.loads(kpi.read_text())["records"]}
    energy, conc = records["energy"]["kpis"], records["concurrency"]["kpis"]
    latency_ms = energy["emulated_latency"]["latency_ms"]
    assert latency_ms > DISPATCH_MS  # the roofline estimate of P-Net's graph (the context binary's graph_cost.json)
    params = catalog_params("sm8650")
    assert energy["latency_source"] == "emulated" and energy["power_source"] == "emulated"
    assert energy["energy_per_inference_mj"] == pytest.approx((params.load_power_w - params.idle_power_w) * latency_ms,
                                                              rel=0.1)
    assert conc["latency_source"] == "emulated" and conc["errors"] == 0
    assert conc["latency_degradation"] == pytest.approx(2 * (latency_ms + CONTEXT_SWITCH_MS) / latency_ms, rel=1e-6)
    assert conc["emulated"]["solo_latency_ms"] and conc["simulator_latency_degradation"] > 0
