"""The device farm end to end, as a user runs it from their own directory with the installed plugin
(`pytest --pyargs harness.suites`): two emulated devices with -n 2, a saved baseline, a re-run on a slowed
device that the regression step catches with both values, a killed emulated adb phone quarantined in the
summary and in the next run, and a sign-off page saying NO-GO and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servers import ADB, adb_server, emulated_phone

STEPS = "-k", "(feasibility or conversion or ptq or context_binary or profile or regression) and not llm"
SMALL = ["--sweep", "off", "--skip-validation", "--min-iterations", "60", "--min-duration", "1", "-p", "no:cacheprovider"]


def _devices(path: Path, entries: list[dict], slow: bool = False) -> Path:
    data: dict = {"devices": entries}
    if slow:  # the same SoC, its emulated HTP always throttled: every inference takes 4 times as long
        data["socs"] = {"sm8650": {"thermal": {"throttle_trip_c": 30, "throttle_clear_c": 20, "throttle_factor": 4}}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.skipif(ADB is None, reason="needs the `adb` binary")
def test_farm_baseline_regression_quarantine_and_signoff(pytester, session_cache_dir, tmp_path):
    from model_builders import conv_classifier

    conv_classifier(pytester.path / "clf.onnx")
    spec = pytester.path / "clf.yaml"  # this shared 2-core machine's simulator latency moves 30-75 % between runs:
    # a gate for a slowed device (2x), not for noise; the emulator's runner memory moves with the host's too
    # random data: a drop limit the evaluation's interval decides (at the default 0.02 it sits on the limit)
    spec.write_text("path: clf.onnx\nthresholds: {regression_latency_threshold: 0.5, regression_memory_threshold: 1.0, "
                    "max_task_metric_drop: 0.2}\n")
    emus = [{"id": "emu-a", "soc": "sm8650", "transport": "emulator"},
            {"id": "emu-b", "soc": "sm8650", "transport": "emulator"}]
    common = ["--pyargs", "harness.suites", "--model", str(spec), *STEPS, *SMALL, "--cache-dir", str(session_cache_dir),
              "--farm-state", str(tmp_path / "farm.json"), "--device-lock-dir", str(tmp_path / "locks")]
    base = tmp_path / "baseline"
    first = pytester.runpytest_subprocess(
        *common, "--devices-file", str(_devices(tmp_path / "d1.yaml", emus)), "--device", "all", "-n", "2",
        "--dist", "loadgroup", "--save-baseline", str(base), "--kpi-json", str(tmp_path / "r1" / "kpi.json"))
    assert first.ret == 0, first.stdout.str()[-3000:]
    assert sorted(p.relative_to(base).as_posix() for p in base.rglob("*.json")) == \
        ["emu-a/clf.json", "emu-b/clf.json"]

    with adb_server(tmp_path / "adbhome") as adb, emulated_phone(adb, "sm8650", tmp_path / "phone") as phone:
        phone_entry = phone.device_entry("phone")
    # the phone is gone (its emulated adbd stopped): connecting fails, so it is quarantined
    second = pytester.runpytest_subprocess(
        *common, "--devices-file", str(_devices(tmp_path / "d2.yaml", [*emus, phone_entry], slow=True)),
        "--device", "all", "-n", "2", "--dist", "loadgroup", "--baseline", str(base),
        "--kpi-json", str(tmp_path / "r2" / "kpi.json"), "--alluredir", str(tmp_path / "r2" / "allure-results"))
    out = second.stdout.str()
    assert second.ret == 1, out[-3000:]
    records = json.loads((tmp_path / "r2" / "kpi.json").read_text())["records"]
    regression = {r["device"]: r for r in records if r["step"] == "regression"}
    assert set(regression) >= {"emu-a", "emu-b"}
    for device in ("emu-a", "emu-b"):
        record = regression[device]
        assert record["outcome"] == "failed" and "latency" in record["message"] and "->" in record["message"], record
        latency = [v for v in record["kpis"]["verdicts"] if "latency" in v["kpi"] and v["verdict"] == "regressed"]
        assert latency and latency[0]["current"] > latency[0]["baseline"]
    assert "device phone (sm8650, adb): quarantined: connecting failed" in out
    state = json.loads((tmp_path / "farm.json").read_text())["devices"]
    assert state["phone"]["reason"].startswith("connecting failed")

    third = pytester.runpytest_subprocess(
        *common, "--devices-file", str(_devices(tmp_path / "d3.yaml", [*emus, phone_entry])), "--device", "phone",
        "-k", "feasibility and not llm")
    third.assert_outcomes(skipped=1)
    assert third.ret == 6  # the only requested device was out: incomplete, not a pass
    third.stdout.fnmatch_lines(["*device phone is quarantined: connecting failed*",
                                "INCOMPLETE: device phone was out (quarantined: connecting failed*): 1 requested step "
                                "test(s) did not run (feasibility); this is not a pass"])

    signoff = subprocess.run([sys.executable, "-m", "harness", "signoff", str(tmp_path / "r2"), "-o",
                              str(tmp_path / "page")], capture_output=True, text=True, timeout=300)
    assert signoff.returncode == 1, signoff.stdout + signoff.stderr
    assert "NO-GO" in signoff.stdout and "regress" in signoff.stdout.lower() and "phone" in signoff.stdout
    html = (tmp_path / "page" / "index.html").read_text()
    assert "NO-GO" in html and "emu-a" in html and "quarantined" in html
