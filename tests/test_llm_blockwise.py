"""Block-wise 4-bit weights (LPBQ): the QDQ pattern the QNN EP turns into BLOCKWISE_EXPANSION weights on the HTP,
written by harness/llm/blockwise.py for the w4a16 recipe when the spec says llm.weight_block_size."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from harness import model_sources
from harness.errors import ConfigError
from harness.llm import blockwise
from harness.quantization import prequantized


def _per_channel_qdq(weight: np.ndarray) -> onnx.ModelProto:
    """x -> MatMul(x, DequantizeLinear(int4 per-channel weight)), as onnxruntime's quantizer names the tensors."""
    k, n = weight.shape
    scale = (np.abs(weight).max(0) / 7).astype(np.float32)
    q = np.clip(np.round(weight / scale), -8, 7).astype(np.int8)
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["w_quantized", "w_scale", "w_zero_point"], ["w_DequantizeLinear_Output"],
                          name="w_DequantizeLinear", axis=1),
         helper.make_node("MatMul", ["x", "w_DequantizeLinear_Output"], ["y"], name="mm")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])],
        [helper.make_tensor("w_quantized", TensorProto.INT4, [k, n], q.ravel().tolist()),
         numpy_helper.from_array(scale, "w_scale"), helper.make_tensor("w_zero_point", TensorProto.INT4, [n], [0] * n)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_lpbq_is_the_ep_s_pattern_and_computes_what_its_encoding_says(tmp_path):
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((128, 48)) * np.exp(rng.standard_normal((128, 1)))).astype(np.float32)
    q, ints, channel = blockwise.lpbq_encode(weight, 32)
    assert q.min() >= -8 and q.max() <= 7 and ints.shape == (4, 48) and channel.shape == (48,)
    assert ints.min() >= 1 and ints.max() <= blockwise.BLOCK_SCALE_MAX  # the HTP reads them as 4 bits
    dequantized = q * np.repeat(ints * channel, 32, axis=0)
    per_channel_error = np.abs(_dequantize_per_channel(weight) - weight).mean()
    assert np.abs(dequantized - weight).mean() < 0.8 * per_channel_error  # blocks follow the rows' magnitudes
    model = _per_channel_qdq(weight)
    assert blockwise.to_lpbq(model, {"w": weight}, 32, "test") == 1
    onnx.checker.check_model(model, full_check=True)
    assert blockwise.lpbq_weights(model) == ["w_DequantizeLinear_Output"]
    scales_dq, weight_dq = model.graph.node[0], model.graph.node[1]
    assert (scales_dq.input[0], weight_dq.input[1]) == ("w_DequantizeLinear_Output_lpbq_int_scales",
                                                          scales_dq.output[0])
    assert {a.name: a.i for a in weight_dq.attribute} == {"axis": 0, "block_size": 32}
    assert not {"w_scale", "w_zero_point"} & {i.name for i in model.graph.initializer}  # the per-channel ones go
    path = tmp_path / "lpbq.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal((2, 128)).astype(np.float32)
    y = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x @ dequantized, rtol=1e-4, atol=1e-4)
    # a model arriving with the pattern: its integers are the weight's block scales, no problem for the HTP
    encodings = prequantized.read_encodings(model)
    assert {e.kind for e in encodings} == {"weight", "block_scale"}
    assert prequantized.htp_problems(encodings) == []
    floats = prequantized.float_form(model)  # its float model: the block-wise weight dequantized
    assert [n.op_type for n in floats.graph.node] == ["MatMul"]
    np.testing.assert_array_equal(numpy_helper.to_array(floats.graph.initializer[0]), dequantized)


def _dequantize_per_channel(weight: np.ndarray) -> np.ndarray:
    scale = np.abs(weight).max(0) / 7
    return np.clip(np.round(weight / scale), -8, 7) * scale


def test_a_block_size_that_does_not_divide_a_weight_names_it_and_the_sizes():
    weight = np.ones((96, 8), np.float32)
    with pytest.raises(ConfigError, match=r"weight_block_size 64 does not divide weight 'w_DequantizeLinear_Output'"
                                          r"'s input dimension 96 \(\[96, 8\]\)"):
        blockwise.to_lpbq(_per_channel_qdq(weight), {"w": weight}, 64, "test")


def test_a_block_size_the_htp_gets_wrong_is_refused_by_the_spec(tmp_path):
    from harness.models import resolve_model

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"kind": "llm", "llm": {"checkpoint": "x.gguf", "weight_block_size": 8}}))
    (tmp_path / "x.gguf").write_bytes(b"")
    with pytest.raises(ConfigError, match="weight_block_size"):  # 8 ran on the HTP, with wrong results (-10 dB)
        resolve_model(str(spec), {}, None)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_tiny_gpt_w4a16_in_blocks_of_32_runs_as_lpbq_on_the_htp(tmp_path, cache, devices, sm8650_runner):
    """tiny_gpt's w4a16 pair with llm.weight_block_size 32: every bias-free linear weight (a MatMul's) in the LPBQ
    pattern, every node of both graphs on the HTP with CPU fallback disabled (the EP refuses the pattern's nodes unless it fuses them),
    the HTP's perplexity that of onnxruntime's CPU run of the same QDQ graph (LPBQ's numerics, not another
    form's) and within 2% of float (measured: per channel +0.7%, blocks of 32 +0.6%)."""
    from harness.llm.device import device_generate, device_nll, host_nll
    from harness.llm.pipeline import LlmOnboarding
    from harness.llm import text
    from harness.models import resolve_model
    from harness.target import Target

    files = model_sources.llm_files(resolve_model("tiny_gpt", {}, None), cache)
    device = devices.select(["sm8650-emu"])[0]

    def onboarding(name: str, **llm) -> LlmOnboarding:
        section = {"prefill": str(files.prefill), "decode": str(files.decode), "tokenizer": str(files.tokenizer),
                   "eval_text": str(files.eval_text), "calib_text": str(files.calib_text),
                   "prompts": list(files.prompts[:1]), "max_new_tokens": 4, "stop_token": files.stop_token, **llm}
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(yaml.safe_dump({"name": name, "kind": "llm", "llm": section}))
        target = Target(device, devices.soc(device.soc), resolve_model(str(spec), {}, None))
        return LlmOnboarding(target, sm8650_runner, cache)

    blocks, channels = onboarding("tiny_lpbq", weight_block_size=32), onboarding("tiny_pc")
    lpbq, per_channel = blocks.llm_quantized("w4a16"), channels.llm_quantized("w4a16")
    assert blocks.llm_quantized("w8a16") == channels.llm_quantized("w8a16")  # only w4a16's weights change
    for graph in ("prefill", "decode"):
        model = onnx.load(str(lpbq.graph(graph)))
        before = onnx.load(str(per_channel.graph(graph)))
        types = {i.name: i.data_type for i in before.graph.initializer}
        matmul_weights = {n.input[1] for n in before.graph.node if n.op_type == "MatMul"}
        int4 = [n.output[0] in matmul_weights for n in before.graph.node
                if n.op_type == "DequantizeLinear" and types.get(n.input[0]) == TensorProto.INT4]
        # the LM head; q, k, v, o, fc and proj of the 4 blocks have biases: Gemm after conversion, kept per channel
        assert len(blockwise.lpbq_weights(model)) == sum(int4) == 1 and len(int4) == 4 * 6 + 1
        assert prequantized.htp_problems(prequantized.read_encodings(model)) == []
    ids = text.token_ids(blocks.llm_tokenizer(), text.read_text(files.eval_text, "eval"))
    windows = text.nll_windows(ids, blocks.llm_pair().prefill_ar, 8)
    htp = device_nll(sm8650_runner, lpbq.prefill, windows)
    generated = device_generate(sm8650_runner, lpbq.prefill, lpbq.decode, [tuple(ids[:8].tolist())], 4)
    for report in (htp, generated):
        for session in report["sessions"].values():
            assert session["cpu_fallback_disabled"] and set(session["nodes_by_ep"]) == {"QNNExecutionProvider"}
    assert len(generated["prompts"][0]["generated_ids"]) == 4
    host = host_nll(lpbq.prefill, windows, emulate_qdq=True)["perplexity"]
    assert htp["perplexity"] == pytest.approx(host, rel=0.005)  # measured 0.03% apart over 48 windows
    floats = host_nll(blocks.llm_float_pair().prefill, windows)["perplexity"]
    assert host <= floats * 1.02
