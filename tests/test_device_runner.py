"""The device-side runner, through the emulator transport and directly, on the real HTP simulator."""

import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.errors import DeviceLostError, RunnerError, TransportError
from harness.runner.base import latency_source
from harness.runner.client import RUNNER_SOURCE, HtpRefusedError
from harness.steps.inference import run_host
from model_builders import conv_classifier, with_unsupported_op


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    return conv_classifier(tmp_path_factory.mktemp("m") / "clf.onnx")


def feeds(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [{"input": rng.random((1, 3, 8, 8), dtype=np.float32)} for _ in range(n)]


def test_cpu_runtime_matches_host_and_reports_placement(sm8650_runner, classifier):
    data = feeds(3)
    result = sm8650_runner.run(classifier, data, "cpu")
    host = run_host(classifier, data)
    assert len(result.outputs) == 3
    for out, ref in zip(result.outputs, host):
        np.testing.assert_allclose(out["logits"], ref["logits"], rtol=1e-5, atol=1e-6)
    assert {p.ep for p in result.placement} == {"CPUExecutionProvider"}
    assert len(result.inference_s) == 3 and result.load_s > 0


@pytest.mark.parametrize("runtime, machine, label", [
    ("htp", "x86_64", "simulator"), ("htp", "AMD64", "simulator"),  # Linux / Windows on x86-64
    ("htp", "aarch64", "device"), ("htp", "ARM64", "device"),  # Linux board or phone / Snapdragon PC
    ("cpu", "x86_64", "host-cpu"), ("cpu", "aarch64", "device-cpu"), ("cpu", "ARM64", "device-cpu"),
    ("htp", None, "unknown"), ("htp", "", "unknown"), ("htp", "riscv64", "unknown"),
])
def test_latency_source_follows_the_machine_the_runner_ran_on(runtime, machine, label):
    assert latency_source(runtime, machine) == label


def test_htp_runtime_places_every_node_on_htp(sm8650_runner, classifier):
    result = sm8650_runner.run(classifier, feeds(2), "htp")
    assert (result.machine, result.system) == (platform.machine(), platform.system())  # the runner's own
    assert result.latency_source == latency_source("htp", platform.machine())
    assert result.placement and all(p.on_htp for p in result.placement)
    host = run_host(classifier, feeds(2))
    out, ref = result.outputs[0]["logits"], host[0]["logits"]
    assert np.dot(out.ravel(), ref.ravel()) / np.linalg.norm(out) / np.linalg.norm(ref) > 0.99


def test_a_device_lost_while_pulling_stays_a_device_loss(sm8650_runner, classifier, monkeypatch):
    def pull(error):
        def fail(remote, local):
            raise error
        return fail

    lost = DeviceLostError("device sm8650-emu disconnected; it is taken out of this session", device="sm8650-emu")
    monkeypatch.setattr(sm8650_runner.transport, "pull", pull(lost))
    with pytest.raises(DeviceLostError) as caught:
        sm8650_runner.run(classifier, feeds(1), "cpu")
    assert caught.value is lost
    monkeypatch.setattr(sm8650_runner.transport, "pull", pull(TransportError("no such file on device: jobs/x")))
    with pytest.raises(RunnerError, match="runner produced no report: no such file on device"):
        sm8650_runner.run(classifier, feeds(1), "cpu")


def test_unsupported_op_fails_with_fallback_disabled_and_is_found_with_it(sm8650_runner, tmp_path):
    model = with_unsupported_op(tmp_path / "det.onnx")
    data = [{"x": np.ones((2, 3, 3), np.float32)}]
    with pytest.raises(HtpRefusedError, match=r"det\.onnx: 1 node\(s\) cannot run on the Snapdragon 8 Gen 3 \(v75\) "
                                              r"HTP: det1 \(Det\).*CPU fallback is disabled") as refused:
        sm8650_runner.run(model, data, "htp")
    assert [(p.node, p.op_type) for p in refused.value.nodes] == [("det1", "Det")]
    assert isinstance(refused.value, RunnerError)
    placed = sm8650_runner.run(model, None, "htp", allow_cpu_fallback=True, placement_only=True)
    assert {(p.node, p.ep) for p in placed.placement} >= {("det1", "CPUExecutionProvider")}


def test_runner_speaks_qnn_net_run_layout(tmp_path, classifier):
    """Bare paths in model input order, a '#' line naming outputs, Result_N/<output>.raw."""
    data = feeds(2)
    lines = ["#logits"]
    for i, feed in enumerate(data):
        f = tmp_path / f"in{i}.raw"
        feed["input"].tofile(f)
        lines.append(str(f))
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, str(RUNNER_SOURCE), "--model", str(classifier), "--runtime", "cpu",
                           "--input_list", str(tmp_path / "list.txt"), "--output_dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    host = run_host(classifier, data)
    for i in range(2):
        raw = np.fromfile(tmp_path / "out" / f"Result_{i}" / "logits.raw", dtype=np.float32)
        np.testing.assert_allclose(raw, host[i]["logits"].ravel(), rtol=1e-5, atol=1e-6)
    report = json.loads((tmp_path / "out" / "runner_report.json").read_text())
    assert report["outputs"] == [{"name": "logits", "file": "logits.raw", "shape": [1, 10], "dtype": "float32"}]


@pytest.mark.parametrize("line, message", [
    ("nope:=x.raw", "'nope' is not an input of the model"),
    ("input:=missing.raw", "input file not found"),
    ("input:=short.raw", "the model expects shape [1, 3, 8, 8]"),
])
def test_bad_input_lists_are_named(tmp_path, classifier, line, message):
    np.zeros(5, np.float32).tofile(tmp_path / "short.raw")
    (tmp_path / "list.txt").write_text(line + "\n")
    proc = subprocess.run([sys.executable, str(RUNNER_SOURCE), "--model", str(classifier), "--runtime", "cpu",
                           "--input_list", str(tmp_path / "list.txt"), "--output_dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
