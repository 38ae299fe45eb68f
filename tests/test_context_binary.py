"""Step 4: context binaries compiled on the host for a SoC, cached, and refused on another SoC."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import onnx
import pytest

from harness.errors import ContextMismatchError
from harness.runner.client import RUNNER_SOURCE, check_context_target, context_target
from harness.steps.context_binary import compile_context, context_binary
from perf_helpers import random_feeds


@pytest.fixture(scope="module")
def ctx_sm8550(qdq, cache, devices):
    return compile_context(qdq, devices.soc("sm8550"), cache)


def test_compile_writes_the_epcontext_wrapper_its_binary_and_a_sidecar(ctx, qdq):
    assert sorted(p.name for p in ctx.directory.iterdir()) == [".cache-manifest.json", "context.json", "graph_cost.json",
                                                             "model_ctx.onnx", "model_ctx_qnn.bin"]
    wrapper = onnx.load(str(ctx.model))
    (node,) = wrapper.graph.node
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert node.op_type == "EPContext" and attrs["embed_mode"] == 0 and attrs["ep_cache_context"] == b"model_ctx_qnn.bin"
    sidecar = json.loads((ctx.directory / "context.json").read_text())
    assert (sidecar["soc"], sidecar["htp_arch"], sidecar["soc_model"]) == ("sm8650", 75, 57)
    from harness.files import sha256_file
    assert sidecar["model_sha256"] == sha256_file(qdq)
    props = {p.key: p.value for p in wrapper.metadata_props}
    assert (props["harness.soc"], props["harness.htp_arch"], props["harness.soc_model"]) == ("sm8650", "75", "57")
    assert ctx.context_bytes == sum(p.stat().st_size for p in ctx.files) and ctx.compile_s > 0


def test_a_second_compile_reuses_the_cached_binary(ctx, qdq, cache, devices):
    mtime = (ctx.directory / "model_ctx_qnn.bin").stat().st_mtime_ns
    again = compile_context(qdq, devices.soc("sm8650"), cache)
    assert again.hit and again.directory == ctx.directory
    assert (again.directory / "model_ctx_qnn.bin").stat().st_mtime_ns == mtime
    assert again.compile_s == ctx.compile_s  # the time recorded when it was built


def test_each_soc_gets_its_own_binary(ctx, ctx_sm8550):
    assert ctx_sm8550.directory != ctx.directory
    assert context_target(ctx_sm8550.model).soc == "sm8550"


def test_a_binary_for_another_soc_is_refused_naming_both(ctx_sm8550, sm8650_runner):
    with pytest.raises(ContextMismatchError, match=r"compiled for sm8550 \(Snapdragon 8 Gen 2.*device sm8650-emu is sm8650"):
        sm8650_runner.run(ctx_sm8550.model, random_feeds(1), "htp")
    pushed = sm8650_runner.transport.workdir / "models"
    assert not any(p.name == "model_ctx_qnn.bin" and _same(p, ctx_sm8550.directory / p.name)
                   for p in pushed.rglob("*.bin")), "a mismatched binary was pushed to the device"


def _same(a, b) -> bool:
    return a.read_bytes() == b.read_bytes()


def test_the_metadata_alone_identifies_the_soc(ctx_sm8550, devices, tmp_path):
    for f in ctx_sm8550.files:  # the binary without its sidecar
        shutil.copyfile(f, tmp_path / f.name)
    with pytest.raises(ContextMismatchError, match="sm8550.*sm8650"):
        check_context_target(tmp_path / "model_ctx.onnx", devices.soc("sm8650"), "dev")


def test_the_device_runner_itself_refuses_a_mismatched_binary(ctx_sm8550, tmp_path):
    proc = subprocess.run([sys.executable, str(RUNNER_SOURCE), "--model", str(ctx_sm8550.model), "--runtime", "htp",
                           "--htp_arch", "75", "--soc_model", "57", "--placement_only",
                           "--output_dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "compiled for SoC sm8550" in proc.stderr and "soc_model 57" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_step_reports_size_compile_and_load_times(ctx, qdq, sm8650_runner):
    report = context_binary(ctx, qdq, sm8650_runner)
    k = report.kpis
    assert k["context_bytes"] == ctx.context_bytes and k["compile_s"] == ctx.compile_s
    assert k["load_s"] > 0 and k["jit_load_s"] > 0 and k["load_speedup"] == pytest.approx(k["jit_load_s"] / k["load_s"])
    assert {r["node"]: r["placement"] for r in report.tables["placement"]}["conv"] == "HTP"
    assert report.passed, report.problems()


def test_a_model_the_htp_cannot_run_fails_to_compile_with_a_hint(tmp_path, own_cache, devices):
    from harness.errors import StepError
    from model_builders import with_unsupported_op

    model = with_unsupported_op(tmp_path / "det.onnx")
    with pytest.raises(StepError, match=r"compiling det\.onnx into a context binary for sm8650 \(v75\) failed.*"
                                        r"run the feasibility step"):
        compile_context(model, devices.soc("sm8650"), own_cache)
    assert not list((own_cache.root / "context_binary").glob(".tmp-*")), "a failed compile left a half-written entry"
