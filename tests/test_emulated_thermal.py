"""The emulated thermal and power model: NPU busy files drive power, HTP throttling with hysteresis,
Android's thermal status and `dumpsys thermalservice`, trip points, battery status (real files, a fake
clock where the model's time matters; dumpsys through a real EmulatorTransport and the emulated phone); the
emulated HTP's modelled time (harness.emulator.device_time and the runner's EmulatedNpu) against published
figures and the thermal model."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.devices import EmulatorDevice, load_devices_file
from harness.emulator.thermal import (BUSY_BACKLOG_MIN_S, NPU_DIR_ENV, ZONES, EmulatedSensors, ThermalParams,
                                      ThermalStatus, catalog_params)
from harness.emulator.device_time import DISPATCH_MS, modelled_latency
from harness.errors import ConfigError
from harness.runner.device_runner import EmulatedNpu, modelled_count
from harness.transports import open_transport
from servers import ADB, adb_server, emulated_phone

SM8650 = catalog_params("sm8650")
NPU_ZONE = next(i for i, z in enumerate(ZONES) if z.type == "nsphvx-0")
STEP_S = 0.25  # the ticker's period

FAKE_RUNNER = """\
# Stands in for the device runner: NPU-busy the whole time it runs (u = 1), reported every 50 ms.
import os, sys, time
start = time.monotonic()
path = os.path.join(os.environ["HARNESS_EMULATED_NPU_DIR"], "busy.%d" % os.getpid())
def report():
    with open(path + ".part", "w") as f:
        f.write("%.6f\\n" % (time.monotonic() - start))
    os.replace(path + ".part", path)
while time.monotonic() - start < float(sys.argv[1]):
    time.sleep(0.05)
    report()
report()
"""


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def write_busy(sensors: EmulatedSensors, pid: int, busy_s: float) -> None:
    """Write a runner's busy file as the runner does (atomically)."""
    path = sensors.npu_dir / f"busy.{pid}"
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(f"{busy_s:.6f}\n")
    os.replace(tmp, path)


def power_w(root: Path) -> float:
    """Return |current_now| x voltage_now of the sandbox's battery, W."""
    battery = root / "sys/class/power_supply/battery"
    return abs(int((battery / "current_now").read_text())) * int((battery / "voltage_now").read_text()) * 1e-12


def npu_c(root: Path) -> float:
    """Return the nsphvx-0 zone's temperature from sysfs, °C."""
    return int((root / f"sys/class/thermal/thermal_zone{NPU_ZONE}/temp").read_text()) / 1000


def npu_file(sensors: EmulatedSensors, name: str) -> str:
    return (sensors.npu_dir / name).read_text().strip()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def interval_power_w(params: ThermalParams, u: float, factor: float = 1.0) -> float:
    return params.idle_power_w + (params.load_power_w - params.idle_power_w) * u / factor


# --------------------------------------------------------------------------- busy files drive power


def test_a_running_command_without_busy_files_draws_idle_power(tmp_path):
    clock = FakeClock()
    sensors = EmulatedSensors(tmp_path, SM8650, clock)
    idle_c = npu_c(tmp_path)
    with sensors.load():  # e.g. sha256sum or tar: no runner, no busy file
        clock.t += 10
        sensors.refresh()
        assert power_w(tmp_path) == pytest.approx(SM8650.idle_power_w, rel=1e-3)
        assert npu_c(tmp_path) == pytest.approx(idle_c, abs=0.01)


def test_busy_files_drive_power_and_a_new_file_counts_from_zero(tmp_path):
    clock = FakeClock()
    sensors = EmulatedSensors(tmp_path, SM8650, clock)
    me, parent = os.getpid(), os.getppid()
    write_busy(sensors, me, 0.5)
    clock.t += 1
    sensors.refresh()
    assert sensors.model.busy_fraction == pytest.approx(0.5)
    assert power_w(tmp_path) == pytest.approx(interval_power_w(SM8650, 0.5), rel=1e-3)
    write_busy(sensors, me, 0.9)  # the increase counts, not the cumulative value
    clock.t += 1
    sensors.refresh()
    assert sensors.model.busy_fraction == pytest.approx(0.4)
    write_busy(sensors, parent, 0.25)  # a second process appears
    clock.t += 1
    sensors.refresh()
    assert sensors.model.busy_fraction == pytest.approx(0.25)
    assert power_w(tmp_path) == pytest.approx(interval_power_w(SM8650, 0.25), rel=1e-3)


def test_busy_fraction_is_capped_at_one_with_two_busy_processes(tmp_path):
    clock = FakeClock()
    sensors = EmulatedSensors(tmp_path, SM8650, clock)
    for second in range(1, 11):  # two processes each busy the whole time, for 10 s
        write_busy(sensors, os.getpid(), float(second))
        write_busy(sensors, os.getppid(), float(second))
        clock.t += 1
        sensors.refresh()
        assert sensors.model.busy_fraction == 1.0
        assert power_w(tmp_path) == pytest.approx(SM8650.load_power_w, rel=1e-3)
    # They stop: what they could not both run on one NPU is not banked beyond the backlog bound.
    clock.t += 2 * BUSY_BACKLOG_MIN_S
    sensors.refresh()
    assert sensors.model.busy_fraction == pytest.approx(0.5)


def test_a_report_larger_than_its_interval_is_carried_into_the_next(tmp_path):
    clock = FakeClock()
    sensors = EmulatedSensors(tmp_path, SM8650, clock)
    write_busy(sensors, os.getpid(), 3.0)  # one 3 s inference reported at its end
    fractions = []
    for _ in range(4):
        clock.t += 1
        sensors.refresh()
        fractions.append(sensors.model.busy_fraction)
    assert fractions == [1.0, 1.0, 1.0, 0.0]


def test_files_present_at_start_are_not_replayed(tmp_path):
    npu_dir = tmp_path / "dev/harness-npu"
    npu_dir.mkdir(parents=True)
    (npu_dir / f"busy.{os.getpid()}").write_text("500.0\n")  # a previous session's runner
    clock = FakeClock()
    sensors = EmulatedSensors(tmp_path, SM8650, clock)
    clock.t += 1
    sensors.refresh()
    assert sensors.model.busy_fraction == 0.0


def test_a_dead_processes_busy_file_is_removed_after_its_last_value_counts(tmp_path):
    clock = FakeClock()
    sensors = EmulatedSensors(tmp_path, SM8650, clock)
    gone = dead_pid()
    write_busy(sensors, gone, 0.5)
    write_busy(sensors, os.getpid(), 0.25)
    leftover = sensors.npu_dir / f"busy.{gone}.1234.part"  # an interrupted atomic write of the dead process
    leftover.write_text("0.1\n")
    clock.t += 1
    sensors.refresh()
    assert sensors.model.busy_fraction == pytest.approx(0.75)
    assert not (sensors.npu_dir / f"busy.{gone}").exists() and not leftover.exists()
    assert (sensors.npu_dir / f"busy.{os.getpid()}").exists()  # a live process's file stays


def test_the_ticker_refreshes_while_a_command_runs_and_stops_after(tmp_path):
    sensors = EmulatedSensors(tmp_path, SM8650)  # the real clock
    idle_c = npu_c(tmp_path)
    start = time.monotonic()
    with sensors.load():
        while time.monotonic() - start < 4 * STEP_S:
            write_busy(sensors, os.getpid(), time.monotonic() - start)
            time.sleep(0.05)
        hot_c = npu_c(tmp_path)  # no refresh() here: the ticker wrote it
    assert hot_c > idle_c + 1.0
    deadline = time.monotonic() + 2
    while any(t.name == "emulated-thermal-ticker" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the ticker did not stop after the last command"
        time.sleep(0.05)


# --------------------------------------------------------------------------- throttling and status


def soak(sensors: EmulatedSensors, clock: FakeClock, u: float, duration_s: float, busy: list[float],
         on_step=None, step_s: float = STEP_S) -> None:
    """Advance the model duration_s at busy fraction u in step_s refreshes; busy[0] is the runner's total."""
    for _ in range(round(duration_s / step_s)):
        busy[0] += u * step_s
        write_busy(sensors, os.getpid(), busy[0])
        clock.t += step_s
        sensors.refresh()
        if on_step is not None:
            on_step(clock.t)


def test_sm8650_soak_trips_the_htp_throttle_and_clears_with_hysteresis(tmp_path):
    clock = FakeClock()
    sensors = EmulatedSensors(tmp_path, SM8650, clock)
    start_s, idle_c, busy = clock.t, npu_c(tmp_path), [0.0]
    assert 35 <= idle_c <= 40 and npu_file(sensors, "throttle") == "1"
    seen: list[tuple[float, ThermalStatus, bool]] = []

    def record(t: float) -> None:
        seen.append((t - start_s, sensors.thermal_status, sensors.throttled))
        if sensors.throttled and len(seen) > 1 and seen[-2][2]:  # a whole interval throttled
            assert power_w(tmp_path) == pytest.approx(
                interval_power_w(SM8650, 1.0, SM8650.throttle_factor), rel=1e-3)

    soak(sensors, clock, 1.0, 60, busy, record)  # the default soak: NPU busy all the time
    trip_s = next(t for t, _status, throttled in seen if throttled)
    assert 30 <= trip_s <= 45
    statuses = [status for t, status, _ in seen if t <= trip_s]
    assert statuses == sorted(statuses)  # NONE -> LIGHT -> MODERATE
    assert {ThermalStatus.NONE, ThermalStatus.LIGHT} <= set(statuses) and statuses[-1] == ThermalStatus.MODERATE
    light_s = next(t for t, status, _ in seen if status == ThermalStatus.LIGHT)
    assert npu_c(tmp_path) < SM8650.status_severe_c and light_s < trip_s
    # Throttled, the same work runs at half the power: the die cools below the clear point and retrips.
    cleared_s = next(t for t, _status, throttled in seen if t > trip_s and not throttled)
    assert cleared_s < 60
    assert max(status for _t, status, _ in seen) == ThermalStatus.MODERATE
    # The soak ends: the die cools, the throttle clears below throttle_clear_c, back to idle within a minute.
    after: list[tuple[float, float, str]] = []
    soak(sensors, clock, 0.0, 90, busy,
         lambda t: after.append((t - start_s - 60, npu_c(tmp_path), npu_file(sensors, "throttle"))))
    assert all(factor == "1" for _t, temp_c, factor in after if temp_c < SM8650.throttle_clear_c)
    assert next(t for t, temp_c, _ in after if temp_c <= idle_c + 3) < 60
    assert sensors.thermal_status == ThermalStatus.NONE and npu_file(sensors, "thermal_status") == "0"


def test_the_throttle_file_holds_the_factor_while_throttled(tmp_path):
    clock = FakeClock()
    sensors = EmulatedSensors(tmp_path, SM8650, clock)
    busy = [0.0]
    soak(sensors, clock, 1.0, 30, busy)
    while not sensors.throttled:
        soak(sensors, clock, 1.0, STEP_S, busy)
    assert npu_file(sensors, "throttle") == "2" and npu_file(sensors, "thermal_status") == "2"
    zone_lines = npu_file(sensors, "zone_status").splitlines()
    assert zone_lines[NPU_ZONE] == "9 2"  # Android TYPE_NPU, MODERATE
    while sensors.throttled:
        soak(sensors, clock, 0.0, STEP_S, busy)
    assert npu_c(tmp_path) < SM8650.throttle_clear_c and npu_file(sensors, "throttle") == "1"


def test_sixty_percent_busy_never_reaches_the_trip_point(tmp_path):
    clock = FakeClock()
    sensors = EmulatedSensors(tmp_path, SM8650, clock)
    hottest = [0.0]
    soak(sensors, clock, 0.6, 600, [0.0], lambda _t: hottest.__setitem__(0, max(hottest[0], npu_c(tmp_path))),
         step_s=2.0)  # ten minutes: the die's steady state
    assert hottest[0] < SM8650.throttle_trip_c - SM8650.status_light_margin_c
    assert not sensors.throttled and sensors.thermal_status == ThermalStatus.NONE


def test_status_thresholds_above_the_throttle(tmp_path):
    model = EmulatedSensors(tmp_path, SM8650, FakeClock()).model
    assert [model.status_at(c, throttled=True) for c in (96, 100, 110, 112, 115)] == [
        ThermalStatus.MODERATE, ThermalStatus.SEVERE, ThermalStatus.CRITICAL, ThermalStatus.EMERGENCY,
        ThermalStatus.SHUTDOWN]
    assert model.status_at(89.9, throttled=False) == ThermalStatus.NONE
    assert model.status_at(90, throttled=False) == ThermalStatus.LIGHT


def test_every_catalog_soc_has_the_same_trip_logic_and_a_sixty_percent_load_stays_below_it():
    for soc in load_devices_file().socs:
        p = catalog_params(soc)
        assert (p.throttle_trip_c, p.throttle_clear_c, p.throttle_factor) == (95, 85, 2)
        steady_c = p.ambient_c + p.r_die_c_per_w * interval_power_w(p, 0.6)
        assert steady_c < p.light_c, soc
        assert 170 <= p.r_skin_c_per_w * p.c_skin_j_per_c <= 190, soc  # the skin's ~3 min


def test_a_devices_file_with_clear_above_trip_is_refused(tmp_path):
    path = tmp_path / "devices.yaml"
    path.write_text("socs:\n  sm8650: {thermal: {throttle_clear_c: 99}}\n")
    with pytest.raises(ConfigError, match="throttle_clear_c"):
        load_devices_file(path)


# --------------------------------------------------------------------------- sysfs trip points, battery


def test_npu_zones_have_passive_and_critical_trip_points(tmp_path):
    EmulatedSensors(tmp_path, SM8650, FakeClock())
    for index, zone in enumerate(ZONES):
        d = tmp_path / f"sys/class/thermal/thermal_zone{index}"
        if zone.type.startswith(("nsphvx-", "nsphmx-")):
            assert (d / "trip_point_0_temp").read_text() == "95000\n"
            assert (d / "trip_point_0_type").read_text() == "passive\n"
            assert (d / "trip_point_1_temp").read_text() == "115000\n"
            assert (d / "trip_point_1_type").read_text() == "critical\n"
        else:
            assert not (d / "trip_point_0_temp").exists()


def test_a_charging_status_is_kept_and_current_turns_positive(tmp_path):
    clock = FakeClock()
    sensors = EmulatedSensors(tmp_path, SM8650, clock)
    battery = tmp_path / "sys/class/power_supply/battery"
    assert (battery / "status").read_text() == "Discharging\n" and int((battery / "current_now").read_text()) < 0
    (battery / "status").write_text("Charging\n")
    clock.t += 1
    sensors.refresh()
    assert (battery / "status").read_text() == "Charging\n"
    charging_ua = int((battery / "current_now").read_text())
    assert charging_ua > 0 and int((battery / "voltage_now").read_text()) > SM8650.battery_voltage_v * 1e6
    write_busy(sensors, os.getpid(), 1.0)  # the load takes its share of the charger's current
    clock.t += 1
    sensors.refresh()
    assert 0 < int((battery / "current_now").read_text()) < charging_ua


# --------------------------------------------------------------------------- through the devices


@pytest.fixture
def emulator(tmp_path):
    catalog = load_devices_file()
    transport = open_transport(EmulatorDevice(id="e", soc="sm8650", transport="emulator"), catalog.soc("sm8650"),
                               tmp_path)
    yield transport
    transport.close()


def hal_temperatures(dumpsys_out: str) -> list[str]:
    lines = dumpsys_out.splitlines()
    start = lines.index("Current temperatures from HAL:") + 1
    return [line for line in lines[start:] if line.startswith("\tTemperature{")]


def test_dumpsys_thermalservice_on_the_emulator_transport(emulator):
    result = emulator.run(["dumpsys", "thermalservice"], timeout_s=10)
    assert result.rc == 0, result.stderr
    assert "Thermal Status: 0" in result.stdout.splitlines()
    temps = hal_temperatures(result.stdout)
    assert len(temps) == len(ZONES)
    assert temps[NPU_ZONE] == "\tTemperature{mValue=37.0, mType=9, mName=nsphvx-0, mStatus=0}"
    other = emulator.run(["dumpsys", "battery"], timeout_s=10)
    assert other.rc == 0 and "Can't find service: battery" in other.stderr
    # Made hot, the model's throttle and status show in dumpsys.
    emulator.sensors.model.die_c = 96.0
    emulator.sensors.refresh()
    hot = emulator.run(["dumpsys", "thermalservice"], timeout_s=10).stdout
    assert "Thermal Status: 2" in hot.splitlines()
    assert "mName=nsphvx-0, mStatus=2}" in hal_temperatures(hot)[NPU_ZONE]
    assert "\tCoolingDevice{mValue=1, mType=5, mName=nsp-throttle}" in hot.splitlines()


def test_emulator_commands_get_the_npu_dir_and_only_runner_work_heats(emulator, tmp_path):
    env = emulator.run(["sh", "-c", f'echo "${NPU_DIR_ENV}"; command -v dumpsys'], timeout_s=10).stdout.split()
    assert env == [str(emulator.root / "dev/harness-npu"), str(emulator.root / "system/bin/dumpsys")]
    idle_c = npu_c(emulator.root)
    emulator.run(["sleep", "0.6"], timeout_s=10)  # a command without runner work
    emulator.read_command(["true"], timeout_s=10)
    assert npu_c(emulator.root) == pytest.approx(idle_c, abs=0.01)
    assert power_w(emulator.root) == pytest.approx(SM8650.idle_power_w, rel=1e-3)
    script = tmp_path / "fake_runner.py"
    script.write_text(FAKE_RUNNER)
    emulator.push(script, "fake_runner.py")
    result = emulator.run([sys.executable, "fake_runner.py", "0.8"], timeout_s=10)
    assert result.rc == 0, result.stderr
    emulator.read_command(["true"], timeout_s=10)
    assert npu_c(emulator.root) > idle_c + 1.5  # ~0.8 s at u = 1 heats the die ~3.7 °C/s
    assert not list((emulator.root / "dev/harness-npu").glob("busy.*"))  # the finished runner's file is gone


@pytest.mark.skipif(ADB is None, reason="the `adb` binary is not installed")
def test_adb_shell_dumpsys_thermalservice_on_the_emulated_phone(tmp_path):
    with adb_server(tmp_path / "adbhome") as adb, emulated_phone(adb, "sm8650", tmp_path / "phone") as phone:
        out = adb.adb("-s", phone.serial, "shell", "dumpsys", "thermalservice").stdout
        npu_dir = adb.adb("-s", phone.serial, "shell", f'echo "${NPU_DIR_ENV}"').stdout.strip()
    assert "Thermal Status: 0" in out.splitlines()
    assert [line.split("mName=")[1].split(",")[0] for line in hal_temperatures(out)] == [z.type for z in ZONES]
    assert npu_dir == str(Path(os.path.realpath(tmp_path / "phone")) / "dev/harness-npu")


# --------------------------------------------------------------------------- the modelled HTP time


def mobilenet_v2(path: Path) -> Path:
    """Write MobileNet-v2 (224x224, width 1.0, batch norm folded: Conv, Clip, Add, pool, Gemm) with random weights."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], [numpy_helper.from_array(np.array(0, np.float32), "zero"),
                        numpy_helper.from_array(np.array(6, np.float32), "six")]

    def conv(x: str, cin: int, cout: int, kernel: int, stride: int, group: int = 1, relu: bool = True) -> str:
        k = len(nodes)
        w = numpy_helper.from_array(rng.standard_normal((cout, cin // group, kernel, kernel)).astype(np.float32) * 0.1,
                                    f"w{k}")
        inits.extend([w, numpy_helper.from_array(np.zeros(cout, np.float32), f"b{k}")])
        nodes.append(helper.make_node("Conv", [x, f"w{k}", f"b{k}"], [f"c{k}"], kernel_shape=[kernel] * 2,
                                      strides=[stride] * 2, pads=[kernel // 2] * 4, group=group))
        if not relu:
            return f"c{k}"
        nodes.append(helper.make_node("Clip", [f"c{k}", "zero", "six"], [f"r{k}"]))
        return f"r{k}"

    x, cin = conv("input", 3, 32, 3, 2), 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            h = x if t == 1 else conv(x, cin, cin * t, 1, 1)
            h = conv(conv(h, cin * t, cin * t, 3, stride, group=cin * t), cin * t, c, 1, 1, relu=False)
            if stride == 1 and cin == c:
                nodes.append(helper.make_node("Add", [x, h], [h + "_add"]))
                h += "_add"
            x, cin = h, c
    x = conv(x, 320, 1280, 1, 1)
    inits += [numpy_helper.from_array(rng.standard_normal((1000, 1280)).astype(np.float32) * 0.01, "fc_w"),
              numpy_helper.from_array(np.zeros(1000, np.float32), "fc_b")]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pool"]), helper.make_node("Flatten", ["pool"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "mobilenet_v2",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_modelled_latency_of_mobilenet_v2_against_ai_hubs_published_figures(tmp_path, cache):
    """The error device_time's docstring states: AI Hub's MobileNet-v2 w8a8 (perf.yaml, QAIRT 2.41, qnn_dlc) is
    0.316 ms on a Galaxy S24 (sm8650), 0.222 ms on a Galaxy S25 (sm8750), 0.458 ms on the QCS8550 proxy (sm8550)."""
    import numpy as np

    from harness.steps.ptq import QuantRecipe, quantize

    rng = np.random.default_rng(0)
    qdq = quantize(mobilenet_v2(tmp_path / "mobilenet_v2.onnx"),
                   [{"input": rng.random((1, 3, 224, 224), dtype=np.float32)} for _ in range(2)], QuantRecipe(), cache)
    catalog = load_devices_file()
    published_ms = {"sm8650": 0.316, "sm8750": 0.222, "sm8550": 0.458}
    error = {soc: modelled_latency(qdq, catalog.soc(soc)).latency_ms / ms - 1 for soc, ms in published_ms.items()}
    assert abs(error["sm8650"]) < 0.10, error  # the SoC DISPATCH_MS is calibrated on
    assert all(abs(e) < 0.35 for e in error.values()), error
    m = modelled_latency(qdq, catalog.soc("sm8650"))
    assert m.dispatch_ms == DISPATCH_MS and m.estimate_ms == pytest.approx(m.latency_ms - DISPATCH_MS)
    assert "memory-bound" in m.basis


def test_the_runners_modelled_htp_is_busy_back_to_back_and_reads_the_throttle(tmp_path):
    npu_dir = tmp_path / "npu"
    npu_dir.mkdir()
    (npu_dir / "throttle").write_text("1.5\n")
    os.environ[NPU_DIR_ENV] = str(npu_dir)
    try:
        npu = EmulatedNpu.from_env(latency_s=0.001)
    finally:
        del os.environ[NPU_DIR_ENV]
    assert npu.factor == 1.5 and npu.modelled_s(5.0) == pytest.approx(0.0015)  # the simulator's 5 s: not used
    npu.account(5.0)  # one inference outside a loop: its modelled time, not the simulator's
    assert npu.busy_s == pytest.approx(0.0015)
    start = time.perf_counter()
    npu.begin()
    time.sleep(0.5)  # a loop whose simulator is slow or starved: the modelled HTP is busy all along
    npu.end()
    wall_s = time.perf_counter() - start
    npu.close()
    assert npu.busy_s == pytest.approx(0.0015 + wall_s, abs=0.02)
    assert float((npu_dir / f"busy.{os.getpid()}").read_text()) == pytest.approx(npu.busy_s, abs=1e-5)
    segments = npu.segments(start, start + wall_s)
    assert modelled_count(segments) == pytest.approx(wall_s / 0.0015, rel=1e-6)
    assert npu.time_of(start, 100) == pytest.approx(start + 0.15, rel=1e-9)
