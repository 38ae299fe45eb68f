"""Thermal/power telemetry: the emulator model, the sysfs-shaped files, parsing, the background sampler."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import pytest

from harness.devices import AdbDevice, EmulatorDevice, SshDevice, load_devices_file
from harness.emulator.thermal import ZONES, EmulatedSensors, ThermalModel, ThermalParams, catalog_params
from harness.telemetry import (Sample, TelemetryPaths, TelemetrySampler, is_temperature, parse_sample,
                               sample_argv, samples_csv, summarize)
from harness.transports import open_transport
from servers import ADB, SSHD, adb_server, emulated_phone, ssh_server
from test_emulated_thermal import FAKE_RUNNER


@pytest.fixture(scope="module")
def catalog():
    return load_devices_file()


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


# --------------------------------------------------------------------------- the model


def test_model_starts_at_idle_steady_state_and_heats_like_an_rc_circuit():
    p = ThermalParams(ambient_c=25, idle_power_w=1.0, load_power_w=5.0, r_die_c_per_w=8, c_die_j_per_c=2.5,
                      r_skin_c_per_w=4, c_skin_j_per_c=50)
    clock = FakeClock()
    model = ThermalModel(p, clock)
    assert model.die_c == pytest.approx(25 + 1.0 * 8) and model.skin_c == pytest.approx(25 + 1.0 * 4)
    tau_s = 8 * 2.5
    clock.t += tau_s
    model.advance(busy_s=tau_s)  # the NPU busy the whole interval: u = 1
    # After one time constant the die covered 1 - 1/e of the way to its loaded steady state.
    assert model.die_c == pytest.approx(33 + (65 - 33) * (1 - math.exp(-1)), rel=1e-6)
    clock.t += 100 * tau_s
    model.advance(busy_s=100 * tau_s)
    assert model.die_c == pytest.approx(25 + 5 * 8, abs=1e-3)
    clock.t += 100 * 200
    model.advance()  # no busy time reported: idle power
    assert model.die_c == pytest.approx(33, abs=1e-3) and model.skin_c == pytest.approx(29, abs=1e-3)


def test_a_refresh_right_after_another_does_not_show_idle_power_while_the_npu_works():
    """A read_command's refresh 1 ms after the ticker's sees no new busy time (runners report every ~0.1 s): the
    model does not advance over so short an interval, so the battery keeps the last interval's power and the
    work reported later is counted then (before, the battery read idle for a whole tick and energy was lost)."""
    from harness.emulator.thermal import MIN_INTERVAL_S

    clock = FakeClock()
    model = ThermalModel(ThermalParams(idle_power_w=1.0, load_power_w=6.0), clock)
    clock.t += 0.25
    model.advance(busy_s=0.25)
    assert model.power_w == pytest.approx(6.0)
    clock.t += 0.001
    model.advance()
    assert model.power_w == pytest.approx(6.0)
    clock.t += 0.25
    model.advance(busy_s=0.251)  # the instant's work arrives with the next report
    assert model.power_w == pytest.approx(6.0) and MIN_INTERVAL_S >= 0.1


def test_battery_power_matches_the_model_power():
    clock = FakeClock()
    model = ThermalModel(ThermalParams(load_power_w=6.0, battery_voltage_v=3.9), clock)
    clock.t += 1
    model.advance(busy_s=1.0)
    current_ua, voltage_uv = model.battery()
    assert current_ua < 0 < voltage_uv < 3.9e6
    assert abs(current_ua) * voltage_uv * 1e-12 == pytest.approx(6.0, rel=1e-5)


def test_catalog_holds_the_model_parameters(catalog):
    assert catalog.soc("sm8650").thermal is not None
    assert catalog_params("sm8650") == ThermalParams.from_spec(catalog.soc("sm8650").thermal)
    assert catalog_params("qcs6490").idle_power_w != catalog_params("sm8650").idle_power_w
    assert catalog_params("no-such-soc") == ThermalParams()


def test_sensor_files_are_sysfs_shaped(tmp_path):
    clock = FakeClock()
    sensors = EmulatedSensors(tmp_path, ThermalParams(), clock)
    zones = sorted((tmp_path / "sys/class/thermal").glob("thermal_zone*"))
    assert [(z / "type").read_text().strip() for z in sorted(zones, key=lambda z: int(z.name[12:]))] == \
        [z.type for z in ZONES]
    idle = int((zones[0] / "temp").read_text())
    (sensors.npu_dir / f"busy.{os.getpid()}").write_text("30.0\n")  # a runner busy for the 30 s
    clock.t += 30
    sensors.refresh()
    hot = int((zones[0] / "temp").read_text())
    current = int((tmp_path / "sys/class/power_supply/battery/current_now").read_text())
    assert 20_000 < idle < hot < 100_000  # millidegrees
    assert current < 0  # discharging


# --------------------------------------------------------------------------- parsing and summary


SAMPLE_OUTPUT = """\
thermal_zone0/type:cpu-0-0-0
thermal_zone1/type:pm8550-bcl-lvl0
thermal_zone2/type:nsphvx-0
thermal_zone10/type:cpu-0-0-0
thermal_zone3/type:socd
thermal_zone0/temp:41200
thermal_zone1/temp:0
thermal_zone2/temp:55123
thermal_zone10/temp:40100
thermal_zone3/temp:12
current_now:-1250000
voltage_now:3900000
"""


def test_parse_sample_filters_non_temperatures_and_names_duplicates():
    temps, current_ua, voltage_uv = parse_sample(SAMPLE_OUTPUT)
    assert temps == {"cpu-0-0-0@thermal_zone0": 41.2, "nsphvx-0": 55.123, "cpu-0-0-0@thermal_zone10": 40.1}
    assert (current_ua, voltage_uv) == (-1250000, 3900000)
    assert not is_temperature("pmxr2230-bcl-lvl1") and not is_temperature("ibat") and is_temperature("ddr")


def test_summary_and_csv():
    samples = [Sample(0.0, 1000.0, {"a": 40.0, "b": 30.0}, -1_000_000, 4_000_000),
               Sample(0.5, 1000.5, {"a": 44.0, "b": 31.0}, -2_000_000, 4_000_000)]
    summary = summarize(samples, "measured", 0.5)
    assert (summary.max_temp_c, summary.max_temp_zone, summary.samples) == (44.0, "a", 2)
    assert summary.zones["b"].mean_c == pytest.approx(30.5)
    assert summary.mean_power_w == pytest.approx(6.0) and summary.max_power_w == pytest.approx(8.0)
    kpis = summary.kpis()
    assert kpis["source"] == "measured" and kpis["duration_s"] == 0.5
    lines = samples_csv(samples).splitlines()
    assert lines[0] == "t_s,unix_time_s,a_c,b_c,current_ua,voltage_uv,power_w"
    assert lines[2].endswith("-2000000,4000000,8.0000")
    empty = summarize([], "measured", 0.5)
    assert empty.max_temp_c is None and empty.mean_power_w is None


def test_paths_defaults_per_platform(catalog, tmp_path):
    emu = open_transport(EmulatorDevice(id="e", soc="sm8650", transport="emulator"), catalog.soc("sm8650"),
                         tmp_path)
    assert TelemetryPaths.for_transport(emu) == TelemetryPaths("/sys/class/thermal",
                                                               "/sys/class/power_supply/battery")
    no_power = EmulatorDevice(id="e", soc="sm8650", transport="emulator", telemetry={"power": False})
    emu.device = no_power
    assert TelemetryPaths.for_transport(emu).power_supply is None
    assert sample_argv(TelemetryPaths("/t", None))[-2:] == ["/t", ""]
    with pytest.raises(ValueError, match="extra"):
        EmulatorDevice(id="e", soc="sm8650", transport="emulator", telemetry={"colour": 1})


# --------------------------------------------------------------------------- sampling on the emulators


def fake_runner(transport, tmp_path: Path) -> list[str]:
    """Push the stand-in runner (busy the whole time it runs) and return its argv, less the duration."""
    script = tmp_path / "fake_runner.py"
    script.write_text(FAKE_RUNNER)
    transport.push(script, "fake_runner.py")
    return [sys.executable, "fake_runner.py"]


def wait_for_samples(sampler: TelemetrySampler, count: int, timeout_s: float = 30.0) -> None:
    """Return once the sampler holds count samples (a busy host slows each read; a fixed sleep flaked in CI)."""
    deadline = time.monotonic() + timeout_s
    while len(sampler.samples) < count:
        assert time.monotonic() < deadline, f"{len(sampler.samples)} of {count} samples after {timeout_s} s"
        time.sleep(0.02)


def test_sampler_on_the_emulator_sees_the_soc_heat_under_runner_load(catalog, tmp_path):
    transport = open_transport(EmulatorDevice(id="e", soc="sm8650", transport="emulator"), catalog.soc("sm8650"),
                               tmp_path)
    runner = fake_runner(transport, tmp_path)
    with TelemetrySampler(transport, interval_s=0.1) as sampler:
        time.sleep(0.25)
        transport.run(runner + ["1"], timeout_s=10)
    summary = sampler.summary()
    samples = sampler.samples
    assert summary.source == "emulated" and summary.samples >= 4 and not summary.errors  # ~13 on a quiet host
    assert [s.t_s for s in samples] == sorted(s.t_s for s in samples)
    assert all(s.unix_time_s > 1e9 for s in samples)
    npu = [s.temps_c["nsphvx-0"] for s in samples]
    assert npu[-1] > npu[0] + 1.0  # about a second of NPU work at 6.6 W
    params = catalog_params("sm8650")
    assert params.idle_power_w < summary.mean_power_w < params.load_power_w
    assert summary.max_power_w == pytest.approx(params.load_power_w, rel=1e-3)
    assert summary.max_temp_zone == "nsphvx-0"


@pytest.mark.skipif(ADB is None, reason="the `adb` binary is not installed")
def test_sampler_through_adb_on_the_emulated_phone(catalog, tmp_path):
    with adb_server(tmp_path / "adbhome") as adb, emulated_phone(adb, "sm8650", tmp_path / "phone") as phone:
        transport = open_transport(AdbDevice(**phone.device_entry()), catalog.soc("sm8650"), tmp_path)
        try:
            runner = fake_runner(transport, tmp_path)
            sampler = TelemetrySampler(transport, interval_s=0.1).start()
            transport.run(runner + ["0.8"], timeout_s=10)
            summary = sampler.stop()
            time.sleep(0.3)
            idle = TelemetrySampler(transport)
            idle.sample_once()  # takes in the runner's last report (work reported late is carried)
            time.sleep(0.15)  # longer than the model's shortest interval (thermal.MIN_INTERVAL_S)
            idle = idle.sample_once()  # an interval without NPU work: its own shell does not heat
        finally:
            transport.close()
    assert summary.source == "emulated" and summary.samples >= 3 and not summary.errors  # ~9 on a quiet host
    assert set(summary.zones) == {z.type for z in ZONES}
    assert summary.mean_power_w > catalog_params("sm8650").idle_power_w
    # the peak is the load's power, or (as on a phone: current_now and voltage_now are two files, and a refresh at a
    # load change may fall between their reads) at most the load's current times the idle battery's voltage
    params = catalog_params("sm8650")
    model = ThermalModel(params)
    model.power_w = params.load_power_w
    load_ua, _ = model.battery()
    model.power_w = params.idle_power_w
    _, idle_uv = model.battery()
    assert params.load_power_w * (1 - 1e-3) <= summary.max_power_w <= abs(load_ua) * idle_uv / 1e12 * (1 + 1e-3)
    assert idle.power_w == pytest.approx(params.idle_power_w, rel=1e-3)


@pytest.mark.skipif(not Path(SSHD).exists(), reason="openssh-server is not installed")
def test_sampler_over_ssh_reads_configured_paths_and_is_measured(catalog, tmp_path):
    fake = tmp_path / "fake_sys"
    for index, (kind, temp) in enumerate([("cpu-0-0-0", "48000"), ("gpuss-0", "51500")]):
        zone = fake / "thermal" / f"thermal_zone{index}"
        zone.mkdir(parents=True)
        (zone / "type").write_text(kind + "\n")
        (zone / "temp").write_text(temp + "\n")
    supply = fake / "power_supply" / "ina"
    supply.mkdir(parents=True)
    (supply / "current_now").write_text("2000000\n")
    (supply / "voltage_now").write_text("12000000\n")
    with ssh_server(tmp_path / "sshd") as sshd:
        entry = SshDevice(**sshd.device_entry(soc="sm8650", soc_detect="off", telemetry={
            "thermal_dir": str(fake / "thermal"), "power_supply": str(supply)}))
        with open_transport(entry, catalog.soc("sm8650"), tmp_path) as transport:
            with TelemetrySampler(transport, interval_s=0.1) as sampler:
                wait_for_samples(sampler, 3)
            plain = SshDevice(**sshd.device_entry(soc="sm8650", soc_detect="off"))
            transport.device = plain  # defaults: /sys/class/thermal (none on this host), no power on boards
            host = TelemetrySampler(transport, interval_s=0.1)
            host.sample_once()
    summary = sampler.summary()
    assert summary.source == "measured" and summary.samples >= 3
    assert summary.zones["gpuss-0"].max_c == 51.5 and summary.max_temp_zone == "gpuss-0"
    assert summary.mean_power_w == pytest.approx(24.0)
    assert host.paths.power_supply is None and host.samples[0].power_w is None


def test_energy_interval_widens_with_noisy_power_readings_and_decides_a_limit_only_beyond_it():
    import numpy as np

    from harness.kpi import Limit
    from harness.steps.energy import energy_interval

    def samples(powers_w, phase):
        return [Sample(t_s=i * 0.1, unix_time_s=0.0, temps_c={}, current_ua=int(p * 1e6 / 4.0), voltage_uv=4_000_000,
                       phase=phase) for i, p in enumerate(powers_w)]

    rng = np.random.default_rng(0)
    idle = samples(1.0 + rng.normal(0, 0.01, 20), "idle")
    steady = samples(3.0 + rng.normal(0, 0.01, 50), "soak")
    noisy = samples(3.0 + rng.normal(0, 1.0, 50), "soak")
    quiet = energy_interval(steady, idle, 1.0, 0.001, 2.0)  # 2 W above idle x 1 ms = 2 mJ
    loud = energy_interval(noisy, idle, 1.0, 0.001, 2.0)
    assert quiet.low < 2.0 < quiet.high and quiet.high - quiet.low < 0.05
    assert loud.high - loud.low > 10 * (quiet.high - quiet.low)
    limit = Limit("energy_per_inference_mj", maximum=2.2)
    assert limit.check(2.0, quiet).passed and limit.check(2.0, loud).inconclusive
    assert energy_interval(steady[:6], idle, 1.0, 0.001, 2.0) is None  # too few readings for 5 blocks
