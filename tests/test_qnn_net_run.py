"""qnn-net-run as the runner of an adb phone without Python, end to end through the real adb server
and the emulated phone, with a stand-in for Qualcomm's binary (tests/qnn_stub.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from harness.devices import AdbDevice
from harness.errors import RunnerError
from harness.runner.client import DeviceRunner
from harness.runner.qnn_net_run import (QnnContextModel, TensorSpec, job_input_list, match_output_files,
                                        qnn_context_model, read_qnn_results)
from harness.transports import open_transport
from perf_helpers import random_feeds
from qnn_stub import fake_qairt_sdk
from servers import ADB, adb_server, emulated_phone


# --------------------------------------------------------------------------- host side, no device


def test_the_context_binary_and_its_io_come_from_the_wrapper(ctx):
    spec = qnn_context_model(ctx.model, "d")
    assert spec.context_file == ctx.directory / "model_ctx_qnn.bin"
    assert spec.inputs == (TensorSpec("input", (1, 3, 8, 8)),) and spec.outputs == (TensorSpec("logits", (1, 10)),)


def test_models_qnn_net_run_cannot_run_are_refused_with_a_way_out(qdq, ctx, tmp_path):
    with pytest.raises(RunnerError, match=r"\[d\] device d runs Qualcomm's qnn-net-run .* compiled context binaries "
                                          r"only: model.onnx is not one .*QDQ or float.*`python:` entry"):
        qnn_context_model(qdq, "d")
    wrapper = onnx.load(str(ctx.model))
    for attr in wrapper.graph.node[0].attribute:
        if attr.name == "embed_mode":
            attr.i = 1
    onnx.save(wrapper, str(tmp_path / "embedded_ctx.onnx"))
    with pytest.raises(RunnerError, match="embeds its context inside the model"):
        qnn_context_model(tmp_path / "embedded_ctx.onnx", "d")
    onnx.save(onnx.load(str(ctx.model)), str(tmp_path / "alone_ctx.onnx"))  # without its .bin
    with pytest.raises(RunnerError, match="names its context file 'model_ctx_qnn.bin', which is not beside it"):
        qnn_context_model(tmp_path / "alone_ctx.onnx", "d")


def test_input_list_paths_are_relative_to_the_job_directory():
    one = job_input_list([[("input", "inputs/0/input.raw")], [("input", "inputs/1/input.raw")]], "data/ab", "jobs/j1")
    assert one == "../../data/ab/inputs/0/input.raw\n../../data/ab/inputs/1/input.raw\n"
    two = job_input_list([[("a", "inputs/0/a.raw"), ("b:0", "inputs/0/b_0.raw")]], "data/ab", "jobs/j1")
    assert two == "a:=../../data/ab/inputs/0/a.raw b:0:=../../data/ab/inputs/0/b_0.raw\n"


def test_output_files_are_matched_through_sanitised_names(tmp_path):
    result = tmp_path / "Result_0"
    (result / "head").mkdir(parents=True)
    np.arange(6, dtype=np.float32).tofile(result / "_model_boxes_0.raw")
    np.arange(2, dtype=np.float32).tofile(result / "head" / "scores.raw")
    np.arange(3, dtype=np.float32).tofile(result / "plain.raw")
    outputs = (TensorSpec("/model/boxes:0", (2, 3)), TensorSpec("head/scores", (None, 2)), TensorSpec("plain", (3,)))
    files = match_output_files(result, outputs, "d")
    assert {k: v.relative_to(result).as_posix() for k, v in files.items()} == {
        "/model/boxes:0": "_model_boxes_0.raw", "head/scores": "head/scores.raw", "plain": "plain.raw"}
    ctx = QnnContextModel(tmp_path / "m_ctx.onnx", tmp_path / "m.bin", (), outputs, "n")
    (out,) = read_qnn_results(tmp_path, ctx, 1, "d")
    assert out["/model/boxes:0"].shape == (2, 3) and out["head/scores"].shape == (1, 2)
    with pytest.raises(RunnerError, match=r"no file for output\(s\) missing in Result_0/ \(files: "):
        match_output_files(result, (TensorSpec("missing", (1,)),) + outputs, "d")
    with pytest.raises(RunnerError, match="no Result_1/ for input line 2 of 2"):
        read_qnn_results(tmp_path, ctx, 2, "d")
    with pytest.raises(RunnerError, match="holds 3 float32 values, output 'plain' has shape \\[4\\]"):
        read_qnn_results(tmp_path, QnnContextModel(ctx.model, ctx.context_file, (), (TensorSpec("plain", (4,)),),
                                                   "n"), 1, "d")


# --------------------------------------------------------------------------- on the emulated phone


@pytest.fixture(scope="module")
def phone_runner(tmp_path_factory, devices):
    """A DeviceRunner on an emulated adb phone with no `python:` and the fake SDK: it runs qnn-net-run."""
    if ADB is None:
        pytest.skip("the `adb` binary is not installed")
    root = tmp_path_factory.mktemp("qnnphone")
    sdk = fake_qairt_sdk(root / "qairt")
    with adb_server(root / "adbhome") as adb, emulated_phone(adb, "sm8650", root / "phone") as phone:
        entry = AdbDevice(**phone.device_entry("qnn-phone", python=None, qairt_sdk=str(sdk)))
        transport = open_transport(entry, devices.soc("sm8650"), root)
        try:
            yield DeviceRunner(transport, timeout_s=300)
        finally:
            transport.cleanup()
            transport.close()


def test_qnn_net_run_on_the_phone_equals_the_harness_runner(phone_runner, sm8650_runner, ctx):
    """The stub qnn-net-run (a stand-in for Qualcomm's binary speaking its command line and file
    layout, running the context on this host's HTP simulator) gives the harness runner's outputs
    on the same context binary, bit for bit."""
    assert phone_runner.transport.runner_kind == "qnn-net-run"
    feeds = random_feeds(3, seed=7)
    run = phone_runner.run(ctx.model, feeds, "htp")
    reference = sm8650_runner.run(ctx.model, feeds, "htp")
    assert run.runner == "qnn-net-run" and len(run.outputs) == 3
    for got, want in zip(run.outputs, reference.outputs):
        assert got.keys() == want.keys() == {"logits"}
        assert got["logits"].shape == want["logits"].shape == (1, 10)
        np.testing.assert_array_equal(got["logits"], want["logits"])
    assert [(p.op_type, p.on_htp) for p in run.placement] == [("EPContext", True)]
    assert run.machine == "x86_64" and run.latency_source == "simulator" == reference.latency_source
    assert run.inference_s == [] and any("without profiling" in n for n in run.notes)
    left = phone_runner.transport.run(["sh", "-c", "ls jobs 2>/dev/null | wc -l"], timeout_s=20)
    assert left.stdout.strip() == "0"  # the job directory was removed


def test_qnn_net_run_timings_come_from_its_profile(phone_runner, ctx, tmp_path):
    run = phone_runner.run(ctx.model, random_feeds(2), "htp", profiling_level="basic", keep_dir=tmp_path / "keep")
    assert len(run.inference_s) == 2 and all(t > 0 for t in run.inference_s) and not run.notes
    assert run.load_s > 0  # the profile's `QNN (load binary) time`
    assert (tmp_path / "keep" / "qnn_profile.csv").is_file() and (tmp_path / "keep" / "runner_report.json").is_file()


@pytest.mark.parametrize("kwargs, what", [
    ({"runtime": "cpu"}, "the `cpu` runtime"),
    ({"placement_only": True, "feeds": None}, "a placement-only run"),
    ({"min_iterations": 5}, "a warm-up or timed measurement loop"),
], ids=["cpu", "placement_only", "loop"])
def test_what_qnn_net_run_cannot_do_is_refused(phone_runner, ctx, kwargs, what):
    args = {"feeds": random_feeds(1), "runtime": "htp", **kwargs}
    with pytest.raises(RunnerError, match=f"qnn-net-run.*context binaries.*{what}.*`python:` entry"):
        phone_runner.run(ctx.model, args.pop("feeds"), args.pop("runtime"), **args)


def test_a_qdq_model_is_refused_before_anything_runs(phone_runner, qdq):
    with pytest.raises(RunnerError, match=r"compiled context binaries only: model.onnx is not one"):
        phone_runner.run(qdq, random_feeds(1), "htp")


def test_the_runtime_step_runs_on_a_qnn_net_run_phone(phone_runner, ctx):
    from harness.steps.runtime import runtime

    report = runtime(ctx, random_feeds(3), phone_runner)
    assert report.passed, report.problems()
    assert report.kpis["bit_exact"] and report.kpis["htp_nodes"] == 1
    assert report.kpis["executed_on"] == "simulator"  # the emulated phone is this x86-64 host
    assert any("without profiling" in n for n in report.notes)
